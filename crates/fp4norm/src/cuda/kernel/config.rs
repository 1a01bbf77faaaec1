//! What one kernel specialisation is: [`KernelConfig`], every compile-time constant of a
//! kernel, and the `FP4_*` defines it hands the CUDA source (listed in `cu/common.cuh`).

use super::launch_table::{
    column_demote_distance, column_scales_demote_rows, column_scales_keep_wanted,
    column_scales_reduce_wanted, column_scales_split_wanted, demote_distance, fp8_launch_shape,
    launch_shape, pad_ctas_wanted, pad_spread_wanted, shape_fits, swizzle_demote_tiles,
    swizzle_keep_wanted, swizzle_split_wanted,
};
use crate::cuda::{DeviceLimits, ShapeClass};
use crate::{DType, Problem, ScaleFormat};

/// Which kernel: one file of `cu/` each (`FP4_KIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// `fp4norm_fused` (`fused.cu`): the op.
    Fused = 0,
    /// `fp4norm_dequant` (`dequant.cu`): SPEC.md §4.
    Dequant = 1,
    /// `fp4norm_copy` (`copy.cu`): a 16-byte SM copy, the benchmarks' bandwidth yardstick.
    Copy = 2,
    /// `fp4norm_codec_check` (`codec_check.cu`): the fused kernel's fast encoders against
    /// the literal ones on every input (see [`crate::cuda::Gpu::codec_self_check`]).
    CodecCheck = 3,
    /// `fp4norm_swizzle` (`swizzle.cu`): the second kernel of a split swizzled write
    /// ([`KernelConfig::swizzle_split`]); `row_major` says where it reads the codes.
    Swizzle = 4,
    /// `fp8_column_scales` (`column_scales.cu`): the second kernel of a split column-major
    /// FP8 scale write ([`Fp8Spec::split_scales`]).
    ColumnScales = 5,
}

/// How the global scale reaches the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GsMode {
    /// No global scale: 1.0 (and UE8M0, which does not use it).
    None,
    /// One value in device memory.
    Uniform,
    /// One value per row in device memory.
    PerRow,
}

/// How an FP8 kernel finds the factor `inv` its values are multiplied by (SPEC.md §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8KernelScaling {
    /// One per-tensor scale `s` (from memory, or a parameter): `inv = RN32(1/s)`.
    PerTensor,
    /// Dynamic group scales written as f32 (with the floor `s_min`).
    F32,
    /// Dynamic group scales written as UE8M0 codes.
    UE8M0,
}

/// The FP8 output of the fused kernel (`FP8_*` defines, SPEC.md §8). The group size is the
/// configuration's `block` (32, 64, 128; the row for per-token scales).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8Spec {
    /// E5M2 elements (else E4M3).
    pub e5m2: bool,
    /// How `inv` is found.
    pub scaling: Fp8KernelScaling,
    /// One dynamic scale per row: the row's threads reduce the amax together.
    pub per_token: bool,
    /// Column-major scales `[H/G, Mp4]` (the `row_major` flag is the row-major layout;
    /// `swizzled` MXFP8's 128×4).
    pub column_major: bool,
    /// Column-major UE8M0 codes packed four to a 32-bit word, `[ceil(H/G/4), Mp4]` words
    /// (`FP8_COL_PACKED`, with `column_major`; DeepGEMM's packed scales). Defined only when
    /// set, so other cubins are unchanged.
    pub packed: bool,
    /// Column-major group scales stored with an L2 evict-last policy (`FP8_COL_KEEP`;
    /// `column_scales_keep_wanted`). Defined only when set, so other cubins are unchanged.
    pub keep_scales: bool,
    /// Column-major f32 group scales staged by tiles of 8 rows and put in place by a second
    /// kernel, [`KernelKind::ColumnScales`] (`FP8_COL_SPLIT`; `column_scales_split_wanted`).
    /// Defined only when set, so other cubins are unchanged.
    pub split_scales: bool,
    /// Kept column-major scales handed back to L2's normal eviction this many rows behind
    /// each row (`FP8_COL_DEMOTE_ROWS`; `column_scales_demote_rows`; 0: never), by the
    /// direct write only: defined only when nonzero and not `split_scales`, so other
    /// cubins are unchanged.
    pub demote_rows: u32,
    /// Column-major group scales written as one reduction each, from their old bytes loaded
    /// at the kernel's start (`FP8_COL_RED`; `column_scales_reduce_wanted`), by the direct
    /// write only: defined only when set and not `split_scales`, so other cubins are
    /// unchanged.
    pub reduce_scales: bool,
}

impl Fp8Spec {
    /// The demotion distance the kernel gets: `demote_rows` where the fused kernel writes
    /// the scales itself, 0 where the split pass does.
    pub fn direct_demote_rows(&self) -> u32 {
        if self.split_scales {
            0
        } else {
            self.demote_rows
        }
    }

    /// Whether the kernel writes its scales as reductions: `reduce_scales` where the fused
    /// kernel writes them itself, not where the split pass does.
    pub fn direct_reduce_scales(&self) -> bool {
        self.reduce_scales && !self.split_scales
    }
}

/// One specialisation: everything that is a compile-time constant of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    /// Which kernel.
    pub kind: KernelKind,
    /// Element dtype.
    pub dtype: DType,
    /// Hidden size.
    pub h: usize,
    /// Block size (16 or 32).
    pub block: usize,
    /// UE8M0 (true) or E4M3 scales.
    pub ue8m0: bool,
    /// Write row-major scales.
    pub row_major: bool,
    /// Write swizzled scales.
    pub swizzled: bool,
    /// Residual add (false: `rmsnorm_fp4quant`).
    pub residual: bool,
    /// Write `y_out`.
    pub y_out: bool,
    /// Global-scale source.
    pub gs: GsMode,
    /// Hardware E2M1 conversion (sm_100a-class targets).
    pub hw_e2m1: bool,
    /// Trust the packed add/cvt to return the canonical NaN 0x7FFF (no fix-up code).
    pub hw_canonical_nan: bool,
    /// A nonzero weight bias is added to every weight (`FP4_WBIAS`; SPEC.md §8). Defined
    /// only when set, so the usual source, and its cubins, are unchanged.
    pub weight_bias: bool,
    /// Every code from the literal SPEC.md encoders (`FP4_LITERAL_CODECS`): the path of a
    /// device whose conversion self-test failed (see `cuda::selftest`). Defined only when
    /// set, so the usual source, and its cubins, are unchanged.
    pub literal_codecs: bool,
    /// Every row takes the exact sum of squares, the path the kernel otherwise takes only
    /// for the rare rows whose f64 sum cannot decide rstd (the test knob
    /// `FP4NORM_FORCE_EXACT_SUMSQ=1`; the bytes are the same either way).
    pub force_exact_sumsq: bool,
    /// Threads per row.
    pub threads_per_row: u32,
    /// Rows per CTA.
    pub rows_per_cta: u32,
    /// CTAs per row (a thread-block cluster); 1 = one CTA holds whole rows.
    pub cluster: u32,
    /// 16-byte vector accesses (false: the element-wise fallback).
    pub aligned: bool,
    /// Swizzled scales written by a second kernel, [`KernelKind::Swizzle`] (see
    /// `swizzle_split_wanted`): the fused kernel stages the codes with coalesced stores.
    pub swizzle_split: bool,
    /// The direct swizzled write's 4-byte words stored with an L2 evict-last policy (see
    /// `swizzle_keep_wanted`); only where `swizzled && aligned && !swizzle_split`.
    pub swizzle_keep: bool,
    /// The padding rows of a direct swizzled write's last 128-row tile zeroed by every
    /// thread of the grid rather than by CTAs of their own (`FP4_PAD_SPREAD`, see
    /// `pad_spread_wanted`); only where the fused kernel writes swizzled scales.
    pub pad_spread: bool,
    /// With `pad_spread`, that padding zeroed by CTAs added after the rows' (`FP4_PAD_CTAS`,
    /// see `pad_ctas_wanted`).
    pub pad_ctas: bool,
    /// Kept swizzled words handed back to L2's normal eviction this many 128-row tiles
    /// behind each row (`FP4_SWZ_DEMOTE_TILES`, see `swizzle_demote_tiles`; 0: never);
    /// only with `swizzle_keep`. Defined only when nonzero, so other cubins are unchanged.
    pub swizzle_demote_tiles: u32,
    /// FP8 codes instead of FP4 (SPEC.md §8); `None` for the FP4 op. Defines are emitted
    /// only when set, so the FP4 source, and its cubins, are unchanged.
    pub fp8: Option<Fp8Spec>,
    /// The ranks' inputs summed in front (SPEC.md §9, `FP4_AR_RANKS`): 2 to 8, 0 for the
    /// plain op. Defined only when set, so other sources, and their cubins, are unchanged.
    pub ar_ranks: u32,
    /// The ranks' inputs read over peer access from their buffers, with signal pads between
    /// the ranks' CTAs (`FP4_AR_PEER`; with `ar_ranks` 1 to 8).
    pub ar_peer: bool,
    /// With `ar_peer`, the two-shot schedule (`FP4_AR_TWO_SHOT`): each rank sums a share of
    /// every row's vectors, then every rank reads the shares' sums (docs/tensor-parallel.md).
    pub ar_two_shot: bool,
}

impl KernelConfig {
    /// The fused kernel's configuration for `p`, with the launch shape the launch table
    /// gives a device with `limits`.
    pub fn fused(
        p: &Problem,
        gs: GsMode,
        aligned: bool,
        hw_e2m1: bool,
        limits: &DeviceLimits,
    ) -> Self {
        let clusters = limits.clusters();
        let (g, r, c) = launch_shape(p.h, p.block(), p.m, p.dtype, limits);
        // The swizzle pass moves 4-byte words: only for the vector kernel, whose
        // `aligned` implies 4-byte aligned scale pointers (any alignment is allowed).
        let swizzle_split = p.layout.has_swizzled() && aligned && swizzle_split_wanted(clusters);
        let mut cfg = KernelConfig {
            kind: KernelKind::Fused,
            dtype: p.dtype,
            h: p.h,
            block: p.block(),
            ue8m0: p.format.scale == ScaleFormat::UE8M0,
            row_major: p.layout.has_row_major(),
            swizzled: p.layout.has_swizzled(),
            residual: p.has_residual,
            y_out: p.has_y_out,
            gs: if p.format.scale == ScaleFormat::UE8M0 {
                GsMode::None
            } else {
                gs
            },
            hw_e2m1,
            hw_canonical_nan: false,
            weight_bias: p.weight_bias != 0.0,
            literal_codecs: false,
            force_exact_sumsq: false,
            threads_per_row: g,
            rows_per_cta: r,
            cluster: c,
            aligned,
            swizzle_split,
            swizzle_keep: p.layout.has_swizzled()
                && aligned
                && !swizzle_split
                && swizzle_keep_wanted(p.m, p.h),
            pad_spread: p.layout.has_swizzled() && !swizzle_split && pad_spread_wanted(),
            pad_ctas: p.layout.has_swizzled()
                && !swizzle_split
                && pad_spread_wanted()
                && pad_ctas_wanted(p.m, limits),
            swizzle_demote_tiles: 0,
            fp8: None,
            ar_ranks: 0,
            ar_peer: false,
            ar_two_shot: false,
        };
        cfg.swizzle_demote_tiles = swizzle_demote_tiles(&cfg, p.m, limits);
        cfg
    }

    /// The fused kernel's configuration for an FP8 call (SPEC.md §8) `p`, with the launch
    /// shape the launch table gives the FP4 op of the same rows: FP8 moves the same input
    /// bytes per row. `scale_in_memory`: a per-tensor scale read from device memory (else a
    /// kernel parameter). Rows of an `H` that is not a multiple of 8 (per-tensor and
    /// per-token scales only) end in a partial vector, which only the element-wise kernel
    /// has: `aligned` is then ignored.
    pub fn fp8(
        p: &crate::fp8::Fp8Problem,
        scale_in_memory: bool,
        aligned: bool,
        limits: &DeviceLimits,
    ) -> Self {
        use crate::fp8::{Fp8Element, Fp8ScaleFormat, Fp8ScaleLayout};
        let nv = p.h / 8;
        let group = p.group();
        // A per-token group of 4, 8 or 16 vectors (H = 32, 64, 128) is one group of the
        // per-group kernel: its lanes reduce the amax by shuffles, no barrier.
        let per_token =
            group == Some(p.h) && !(p.h % 8 == 0 && nv.is_power_of_two() && (4..=16).contains(&nv));
        let aligned = aligned && p.h % 8 == 0;
        let block = match group {
            None => 8,
            Some(_) if per_token => p.h,
            Some(g) => g,
        };
        let shape_block = if per_token || group.is_none() {
            8
        } else {
            block
        };
        let (g, mut r, c) = fp8_launch_shape(p.h, shape_block, p.m, p.dtype, limits);
        if per_token && g > 32 {
            r = r.min(15); // one named barrier per row of several warps (fused.cu, row_max)
        }
        let layout = p.layout();
        let swizzled = layout == Some(Fp8ScaleLayout::Swizzled);
        let packed = layout == Some(Fp8ScaleLayout::ColumnMajorPacked);
        let column_major = layout == Some(Fp8ScaleLayout::ColumnMajor) || packed;
        let split = column_major
            && !packed
            && aligned
            && !per_token
            && column_scales_split_wanted(p, limits);
        let mut cfg = KernelConfig {
            kind: KernelKind::Fused,
            dtype: p.dtype,
            h: p.h,
            block,
            ue8m0: p.scale_format() == Some(Fp8ScaleFormat::UE8M0),
            row_major: layout == Some(Fp8ScaleLayout::RowMajor),
            swizzled,
            residual: p.has_residual,
            y_out: p.has_y_out,
            gs: if group.is_none() && scale_in_memory {
                GsMode::Uniform
            } else {
                GsMode::None
            },
            hw_e2m1: false,
            hw_canonical_nan: false,
            weight_bias: p.options.weight_bias != 0.0,
            literal_codecs: false,
            force_exact_sumsq: false,
            threads_per_row: g,
            rows_per_cta: r,
            cluster: c,
            aligned,
            swizzle_split: false,
            swizzle_keep: swizzled && aligned && swizzle_keep_wanted(p.m, p.h),
            pad_spread: swizzled && pad_spread_wanted(),
            pad_ctas: swizzled && pad_spread_wanted() && pad_ctas_wanted(p.m, limits),
            swizzle_demote_tiles: 0,
            fp8: Some(Fp8Spec {
                e5m2: p.options.element == Fp8Element::E5M2,
                scaling: match p.scale_format() {
                    None => Fp8KernelScaling::PerTensor,
                    Some(Fp8ScaleFormat::F32 { .. }) => Fp8KernelScaling::F32,
                    Some(Fp8ScaleFormat::UE8M0) => Fp8KernelScaling::UE8M0,
                },
                per_token,
                column_major,
                packed,
                keep_scales: column_major
                    && aligned
                    && !per_token
                    && column_scales_keep_wanted(p.scale_bytes_written() as u64, split, limits),
                split_scales: split,
                demote_rows: 0,
                reduce_scales: column_major
                    && aligned
                    && !per_token
                    && !split
                    && !packed
                    && column_scales_reduce_wanted(
                        p.m,
                        matches!(p.scale_format(), Some(Fp8ScaleFormat::F32 { .. })) && block <= 64,
                        limits,
                    ),
            }),
            ar_ranks: 0,
            ar_peer: false,
            ar_two_shot: false,
        };
        // MXFP8's scales are an eighth of its codes' rows, as NVFP4's: the same demotion.
        cfg.swizzle_demote_tiles = swizzle_demote_tiles(&cfg, p.m, limits);
        let demote_rows = column_scales_demote_rows(&cfg, p.scale_bytes_written() as u64, limits);
        if let Some(f) = cfg.fp8.as_mut() {
            f.demote_rows = demote_rows;
        }
        cfg
    }

    /// The block a launch shape must line up with (`shape_fits`): the scale block, but 8
    /// (one vector) for a per-token FP8 row, one block of H that its CTAs split by vectors.
    pub fn shape_block(&self) -> usize {
        if self.fp8.is_some_and(|f| f.per_token) {
            8
        } else {
            self.block
        }
    }

    /// The class of calls whose tuned shapes this kernel takes (`fp4norm tune`).
    pub fn shape_class(&self) -> ShapeClass {
        match self.fp8 {
            None => ShapeClass::Fp4,
            Some(f) if f.per_token => ShapeClass::Fp8PerToken,
            Some(f) if f.scaling == Fp8KernelScaling::PerTensor => ShapeClass::Fp8PerTensor,
            Some(_) => ShapeClass::Fp8Group(self.block),
        }
    }

    /// Replaces the launch shape (threads per row, rows per CTA, CTAs per row) with `shape`
    /// if the kernel supports it for this configuration's rows on a device with `limits`
    /// (`shape_fits`), and says whether it did.
    pub fn try_launch_shape(&mut self, shape: (u32, u32, u32), limits: &DeviceLimits) -> bool {
        // A per-token FP8 row's threads meet at one named barrier per row (fused.cu,
        // row_max), 15 rows at most.
        let per_token = self.fp8.is_some_and(|f| f.per_token);
        let fits = shape_fits(self.h, self.shape_block(), shape, limits)
            && !(per_token && shape.0 > 32 && shape.1 > 15);
        if fits {
            (self.threads_per_row, self.rows_per_cta, self.cluster) = shape;
            // The wave, and so the demotion's distance, changes with the shape.
            if self.swizzle_demote_tiles > 0 {
                self.swizzle_demote_tiles = demote_distance(self, limits);
            }
            if self.fp8.is_some_and(|f| f.demote_rows > 0) {
                let rows = column_demote_distance(self, limits);
                if let Some(f) = self.fp8.as_mut() {
                    f.demote_rows = rows;
                }
            }
        }
        fits
    }

    /// The second kernel that completes a fused call of this configuration, if its scale
    /// write is split: the swizzle pass of FP4 swizzled scales, or the column-scales pass
    /// of FP8 column-major ones.
    pub fn second_pass(&self) -> Option<KernelConfig> {
        if self.kind != KernelKind::Fused {
            return None;
        }
        if self.swizzle_split {
            return Some(KernelConfig {
                h: self.h,
                block: self.block,
                row_major: self.row_major,
                swizzled: true,
                ..KernelConfig::shapeless(KernelKind::Swizzle)
            });
        }
        self.fp8
            .is_some_and(|f| f.split_scales)
            .then(|| KernelConfig {
                h: self.h,
                block: self.block,
                ..KernelConfig::shapeless(KernelKind::ColumnScales)
            })
    }

    /// The configuration of a kernel that has no launch shape of its own (the copy
    /// yardstick, the codec self-check; the dequantisation and swizzle kernels set their
    /// format fields over it).
    pub fn shapeless(kind: KernelKind) -> Self {
        KernelConfig {
            kind,
            dtype: DType::BF16,
            h: 16,
            block: 16,
            ue8m0: false,
            row_major: false,
            swizzled: false,
            residual: false,
            y_out: false,
            gs: GsMode::None,
            hw_e2m1: false,
            hw_canonical_nan: false,
            weight_bias: false,
            literal_codecs: false,
            force_exact_sumsq: false,
            threads_per_row: 32,
            rows_per_cta: 1,
            cluster: 1,
            aligned: true,
            swizzle_split: false,
            swizzle_keep: false,
            pad_spread: false,
            pad_ctas: false,
            swizzle_demote_tiles: 0,
            fp8: None,
            ar_ranks: 0,
            ar_peer: false,
            ar_two_shot: false,
        }
    }

    /// The kernel's entry point.
    pub fn function_name(&self) -> &'static str {
        match self.kind {
            KernelKind::Fused => "fp4norm_fused",
            KernelKind::Dequant => "fp4norm_dequant",
            KernelKind::Copy => "fp4norm_copy",
            KernelKind::CodecCheck => "fp4norm_codec_check",
            KernelKind::Swizzle => "fp4norm_swizzle",
            KernelKind::ColumnScales => "fp8_column_scales",
        }
    }

    /// Threads per CTA.
    pub fn block_threads(&self) -> u32 {
        match self.kind {
            KernelKind::Fused => self.threads_per_row * self.rows_per_cta,
            KernelKind::Dequant => 256,
            KernelKind::Copy => 512,
            KernelKind::CodecCheck => 256,
            KernelKind::Swizzle => 256,
            KernelKind::ColumnScales => 256,
        }
    }

    /// The `#define`s that specialise the source: every `FP4_*` macro, for every kind.
    pub fn defines(&self) -> String {
        let b = |v: bool| v as u32;
        format!(
            "#define FP4_KIND {}\n#define FP4_F16 {}\n#define FP4_H {}\n#define FP4_BLOCK {}\n#define FP4_UE8M0 {}\n\
             #define FP4_ROW_MAJOR {}\n#define FP4_SWIZZLED {}\n#define FP4_RESIDUAL {}\n\
             #define FP4_Y_OUT {}\n#define FP4_GS {}\n#define FP4_HW_E2M1 {}\n#define FP4_HW_CANONICAL_NAN {}\n#define FP4_FORCE_EXACT_SUMSQ {}\n#define FP4_G {}\n\
             #define FP4_R {}\n#define FP4_C {}\n#define FP4_VEC_ALIGNED {}\n#define FP4_SWZ_SPLIT {}\n#define FP4_SWZ_KEEP {}\n\
             #define FP4_HOLD_IN_REGS {}\n#define FP4_MIN_CTAS {}\n",
            self.kind as u32,
            b(self.dtype == DType::F16),
            self.h,
            self.block,
            b(self.ue8m0),
            b(self.row_major),
            b(self.swizzled),
            b(self.residual),
            b(self.y_out),
            match self.gs {
                GsMode::None => 0,
                GsMode::Uniform => 1,
                GsMode::PerRow => 2,
            },
            b(self.hw_e2m1),
            b(self.hw_canonical_nan),
            b(self.force_exact_sumsq),
            self.threads_per_row,
            self.rows_per_cta,
            self.cluster,
            b(self.aligned),
            b(self.swizzle_split),
            b(self.swizzle_keep),
            b(self.holds_rows_in_registers()),
            self.min_ctas_per_sm(),
        ) + &if self.literal_codecs {
            "#define FP4_LITERAL_CODECS 1\n".to_string()
        } else if self.kind == KernelKind::Fused {
            // The fast path's rstd (fused.cu, rstd_checked): the seed the codec self-check
            // proves, and the margin that covers its second-order step.
            format!(
                "#define FP4_RSTD_SEED_ULPS {}\n",
                crate::sumsq::RSTD_SEED_MARGIN_ULPS
            )
        } else {
            String::new()
        } + if self.weight_bias {
            "#define FP4_WBIAS 1\n"
        } else {
            ""
        } + if self.pad_spread {
            "#define FP4_PAD_SPREAD 1\n"
        } else {
            ""
        } + if self.pad_ctas {
            "#define FP4_PAD_CTAS 1\n"
        } else {
            ""
        } + &if self.swizzle_demote_tiles > 0 {
            format!("#define FP4_SWZ_DEMOTE_TILES {}\n", self.swizzle_demote_tiles)
        } else {
            String::new()
        } + &if self.ar_ranks > 0 {
            format!("#define FP4_AR_RANKS {}\n", self.ar_ranks)
        } else {
            String::new()
        } + if self.ar_peer {
            "#define FP4_AR_PEER 1\n"
        } else {
            ""
        } + if self.ar_two_shot {
            "#define FP4_AR_TWO_SHOT 1\n"
        } else {
            ""
        } + &match self.fp8 {
            None => String::new(),
            Some(f) => format!(
                "#define FP8_OUT 1\n#define FP8_E5M2 {}\n#define FP8_SCALING {}\n#define FP8_PER_TOKEN {}\n#define FP8_COL_MAJOR {}\n",
                b(f.e5m2),
                match f.scaling {
                    Fp8KernelScaling::PerTensor => 0,
                    Fp8KernelScaling::F32 => 1,
                    Fp8KernelScaling::UE8M0 => 2,
                },
                b(f.per_token),
                b(f.column_major),
            ) + if f.packed {
                "#define FP8_COL_PACKED 1\n"
            } else {
                ""
            } + if f.keep_scales {
                "#define FP8_COL_KEEP 1\n"
            } else {
                ""
            } + &if f.direct_demote_rows() > 0 {
                format!("#define FP8_COL_DEMOTE_ROWS {}\n", f.direct_demote_rows())
            } else {
                String::new()
            } + if f.split_scales {
                "#define FP8_COL_SPLIT 1\n"
            } else {
                ""
            } + if f.direct_reduce_scales() {
                "#define FP8_COL_RED 1\n"
            } else {
                ""
            } + &if self.h % 8 != 0 {
                format!("#define FP8_TAIL {}\n", self.h % 8)
            } else {
                String::new()
            },
        }
    }

    /// Vectors (8 elements, 16 bytes; the last one partial where `H` is not a multiple of
    /// 8) per thread of the fused kernel: a row's vectors over its CTAs, then over each
    /// CTA's threads per row (the kernel's `VPT`).
    pub fn vectors_per_thread(&self) -> usize {
        let vectors_per_cta = self.h.div_ceil(8) / self.cluster.max(1) as usize;
        vectors_per_cta.div_ceil(self.threads_per_row.max(1) as usize)
    }

    /// Whether the fused kernel keeps each row in registers between its two passes rather
    /// than re-reading it from L2 in the second (`FP4_HOLD_IN_REGS`): up to four vectors
    /// per thread, or eight in CTAs of at most 256 threads. Only rows held in registers
    /// get the L2 prefetch by default (`l2_prefetch_rows`): one rule for both.
    pub fn holds_rows_in_registers(&self) -> bool {
        let vpt = self.vectors_per_thread();
        vpt <= 4 || (vpt <= 8 && self.block_threads() <= 256)
    }

    /// The minimum of resident CTAs per SM that the fused kernel's launch bound asks for
    /// (`FP4_MIN_CTAS`; 1 = none beyond the CTA size): two CTAs of 512 threads, five of
    /// 256, ten of 128 (eight for per-token FP8 rows sharing a CTA), which caps them at 64
    /// or 48 registers.
    ///
    /// Without an explicit minimum, ptxas trades registers for occupancy and sinks some of
    /// pass 1's loads below the first arithmetic, so fewer loads are in flight; the bound
    /// is chosen where no kernel spills (the CI compile check). The element-wise fallback
    /// (unaligned rows) is not bounded: at 64 registers some of its kernels spill.
    pub fn min_ctas_per_sm(&self) -> u32 {
        // The fused all-reduce keeps every rank's vectors in flight: under the bound its
        // kernels spill (the compile check), so it has none.
        if self.ar_ranks > 1 {
            return 1;
        }
        // Per-token FP8 rows of several warps sharing a CTA of 128 threads (each row with
        // its own barrier and amax slots) spill under 48 registers: eight CTAs, 64.
        let per_token = self.fp8.is_some_and(|f| f.per_token);
        if per_token && self.aligned && self.rows_per_cta > 1 && self.block_threads() == 128 {
            return 8;
        }
        Self::min_ctas_for(self.block_threads(), self.aligned)
    }

    /// [`KernelConfig::min_ctas_per_sm`] of a fused kernel of `threads` per CTA.
    pub fn min_ctas_for(threads: u32, aligned: bool) -> u32 {
        if !aligned {
            return 1;
        }
        match threads {
            512 => 2,
            256 => 5,
            128 => 10,
            _ => 1,
        }
    }

    /// A one-line description for logs and errors.
    pub fn describe(&self) -> String {
        format!(
            "{:?} {} H={} B={} {} rm={} sw={} res={} y_out={} gs={:?} hw_e2m1={} hw_nan={} wbias={} literal={} exact_ss={} G={} R={} C={} aligned={} swz_split={} swz_keep={} pad_spread={} swz_demote={}",
            self.kind,
            self.dtype,
            self.h,
            self.block,
            if self.ue8m0 { "ue8m0" } else { "e4m3" },
            self.row_major,
            self.swizzled,
            self.residual,
            self.y_out,
            self.gs,
            self.hw_e2m1,
            self.hw_canonical_nan,
            self.weight_bias,
            self.literal_codecs,
            self.force_exact_sumsq,
            self.threads_per_row,
            self.rows_per_cta,
            self.cluster,
            self.aligned,
            self.swizzle_split,
            self.swizzle_keep,
            self.pad_spread,
            self.swizzle_demote_tiles
        ) + &match self.fp8 {
            None => String::new(),
            Some(f) => format!(
                " fp8={} {:?} per_token={} col_major={}{}{}{}{}{}",
                if f.e5m2 { "e5m2" } else { "e4m3" },
                f.scaling,
                f.per_token,
                f.column_major,
                if f.packed { " packed" } else { "" },
                if f.keep_scales { " keep_scales" } else { "" },
                if f.split_scales { " split_scales" } else { "" },
                if f.direct_reduce_scales() {
                    " reduce_scales"
                } else {
                    ""
                },
                if f.direct_demote_rows() > 0 {
                    format!(" demote_rows={}", f.direct_demote_rows())
                } else {
                    String::new()
                }
            ),
        } + &if self.ar_ranks > 0 {
            format!(" ar_ranks={}", self.ar_ranks)
        } else {
            String::new()
        } + if self.ar_peer {
            " ar_peer"
        } else {
            ""
        } + if self.ar_two_shot {
            " two_shot"
        } else {
            ""
        } + if self.pad_ctas {
            " pad_ctas"
        } else {
            ""
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: DeviceLimits = DeviceLimits::H200;

    #[test]
    fn each_kernel_takes_the_tuned_shapes_of_its_class() {
        use crate::fp8::{
            Fp8Element, Fp8Group, Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
        };
        let fp4 = KernelConfig::fused(
            &super::super::bf16_nvfp4_problem(16, 4096),
            GsMode::Uniform,
            true,
            false,
            &H200,
        );
        assert_eq!(
            (fp4.shape_class(), fp4.shape_block()),
            (ShapeClass::Fp4, 16)
        );
        let fp8 = |h: usize, o: Fp8Options| {
            let p = Fp8Problem::new(16, h, DType::BF16, &o).expect("valid");
            let cfg = KernelConfig::fp8(&p, false, true, &H200);
            (cfg.shape_class(), cfg.shape_block())
        };
        let f32s = Fp8ScaleFormat::F32_NO_FLOOR;
        let dynamic =
            |group, format, layout| Fp8Options::dynamic(Fp8Element::E4M3, group, format, layout);
        let rows = Fp8ScaleLayout::RowMajor;
        assert_eq!(
            fp8(4096, Fp8Options::per_tensor(Fp8Element::E4M3, 1.0)),
            (ShapeClass::Fp8PerTensor, 8)
        );
        assert_eq!(
            fp8(4096, dynamic(Fp8Group::PerToken, f32s, rows)),
            (ShapeClass::Fp8PerToken, 8)
        );
        // A per-token row of 8 vectors is one group of the group kernel.
        assert_eq!(
            fp8(64, dynamic(Fp8Group::PerToken, f32s, rows)),
            (ShapeClass::Fp8Group(64), 64)
        );
        assert_eq!(
            fp8(
                4096,
                dynamic(Fp8Group::G128, f32s, Fp8ScaleLayout::ColumnMajor)
            ),
            (ShapeClass::Fp8Group(128), 128)
        );
        assert_eq!(
            fp8(4096, Fp8Options::mxfp8()),
            (ShapeClass::Fp8Group(32), 32)
        );
    }

    #[test]
    fn the_kernel_takes_its_register_hold_and_launch_bound_from_the_host() {
        let p = super::super::bf16_nvfp4_problem(16384, 32768);
        let shaped = |shape: (u32, u32, u32), aligned: bool| {
            let mut cfg = KernelConfig::fused(&p, GsMode::Uniform, aligned, false, &H200);
            assert!(cfg.try_launch_shape(shape, &H200), "{shape:?}");
            cfg
        };
        // (vectors per thread, held, launch bound) per shape of a row of 4096 vectors.
        for (shape, vpt, held, min_ctas) in [
            ((256, 1, 8), 2, true, 5),  // eight CTAs of 256
            ((512, 1, 2), 4, true, 2),  // two CTAs of 512
            ((256, 1, 2), 8, true, 5),  // eight vectors in a CTA of 256 still held
            ((512, 1, 1), 8, false, 2), // ... not in one of 512: the re-reading CTA
            ((1024, 1, 1), 4, true, 1), // no launch bound beyond the size
            ((224, 1, 1), 19, false, 1),
        ] {
            let cfg = shaped(shape, true);
            assert_eq!(cfg.vectors_per_thread(), vpt, "{shape:?}");
            assert_eq!(cfg.holds_rows_in_registers(), held, "{shape:?}");
            assert_eq!(cfg.min_ctas_per_sm(), min_ctas, "{shape:?}");
            let defines = cfg.defines();
            assert!(defines.contains(&format!("#define FP4_HOLD_IN_REGS {}\n", held as u32)));
            assert!(defines.contains(&format!("#define FP4_MIN_CTAS {min_ctas}\n")));
        }
        // The element-wise fallback (unaligned rows) is never bounded.
        assert_eq!(shaped((512, 1, 1), false).min_ctas_per_sm(), 1);
    }

    fn fp8_config(m: usize, h: usize, opts: &crate::fp8::Fp8Options) -> KernelConfig {
        let p = crate::fp8::Fp8Problem::new(m, h, DType::BF16, opts).expect("valid");
        KernelConfig::fp8(&p, false, true, &H200)
    }

    #[test]
    fn padding_rows_are_spread_only_for_direct_swizzled_writes() {
        if std::env::var_os("FP4NORM_PAD_SPREAD").is_some() {
            return; // the knob overrides the rule
        }
        use crate::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout};
        let fp4 = |layout| {
            let p = Problem::new(1, 4096, DType::BF16, layout, &crate::Options::nvfp4())
                .expect("valid");
            KernelConfig::fused(&p, GsMode::Uniform, true, false, &H200).pad_spread
        };
        assert!(fp4(crate::ScaleLayout::Swizzled));
        assert!(fp4(crate::ScaleLayout::Both));
        assert!(!fp4(crate::ScaleLayout::RowMajor));
        assert!(fp8_config(1, 4096, &Fp8Options::mxfp8()).pad_spread);
        let g128 = Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        assert!(!fp8_config(1, 4096, &g128).pad_spread); // its padding rows keep their CTAs
        assert!(!fp8_config(1, 4096, &Fp8Options::per_token(Fp8Element::E4M3)).pad_spread);
    }

    #[test]
    fn padding_ctas_only_for_few_rows_in_whole_clusters() {
        if std::env::var_os("FP4NORM_PAD_SPREAD").is_some()
            || std::env::var_os("FP4NORM_PAD_CTAS").is_some()
        {
            return; // the knobs override the rule
        }
        use super::super::launch_table::pad_cta_count;
        let fp4 = |m: usize, h: usize| {
            let p = Problem::new(
                m,
                h,
                DType::BF16,
                crate::ScaleLayout::Swizzled,
                &crate::Options::nvfp4(),
            )
            .expect("valid");
            KernelConfig::fused(&p, GsMode::Uniform, true, false, &H200)
        };
        // 1 x 4096 NVFP4: 64 groups of four blocks x 32 pieces, four a thread, over CTAs of
        // the row's cluster size.
        let c = fp4(1, 4096);
        assert!(c.pad_ctas);
        let n = pad_cta_count(&c, 1);
        assert!(
            n > 0 && n % c.cluster as usize == 0,
            "{n} CTAs, clusters of {}",
            c.cluster
        );
        assert!(n * c.block_threads() as usize * 4 >= 64 * 32);
        // No padding in a whole tile; none of these CTAs beyond one row per SM.
        assert_eq!(pad_cta_count(&fp4(128, 4096), 128), 0);
        assert!(!fp4(133, 4096).pad_ctas);
        assert!(!fp4(4096, 4096).pad_ctas);
        assert!(fp8_config(16, 4096, &crate::fp8::Fp8Options::mxfp8()).pad_ctas);
    }

    #[test]
    fn column_major_group_scales_kept_in_l2_up_to_a_quarter_of_it_or_where_demoted() {
        if std::env::var_os("FP4NORM_FP8_SCALES_KEEP").is_some() {
            return; // the knob overrides the rule
        }
        use crate::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout};
        let groups =
            |group, format, layout| Fp8Options::dynamic(Fp8Element::E4M3, group, format, layout);
        let f32_col = |group| {
            groups(
                group,
                Fp8ScaleFormat::F32_NO_FLOOR,
                Fp8ScaleLayout::ColumnMajor,
            )
        };
        let kept = |m, h, o: &Fp8Options| {
            let c = fp8_config(m, h, o);
            let on = c.fp8.is_some_and(|f| f.keep_scales);
            assert_eq!(on, c.defines().contains("#define FP8_COL_KEEP 1\n"));
            on
        };
        // The H200's 60 MiB of L2: up to 15 MiB of scales, and more where the fused kernel
        // writes them (it demotes them from 7.5 MiB), not where the split pass does.
        assert!(kept(4096, 8192, &f32_col(Fp8Group::G32))); // 4 MiB
        assert!(kept(16384, 8192, &f32_col(Fp8Group::G64))); // 8 MiB
        assert!(kept(16384, 16384, &f32_col(Fp8Group::G128))); // 8 MiB
        assert!(!kept(16384, 8192, &f32_col(Fp8Group::G32))); // 16 MiB, split
        assert!(!kept(16384, 16384, &f32_col(Fp8Group::G64))); // 16 MiB, split
        assert!(kept(16384, 32768, &f32_col(Fp8Group::G128))); // 16 MiB, direct
        assert!(kept(32768, 32768, &f32_col(Fp8Group::G128))); // 32 MiB, direct
        let ue8m0_col = groups(
            Fp8Group::G32,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::ColumnMajor,
        );
        assert!(kept(16384, 16384, &ue8m0_col)); // 8 MiB of bytes
                                                 // Decode rows too; only column-major group scales.
        assert!(kept(1, 4096, &f32_col(Fp8Group::G128)));
        let g32_row = groups(
            Fp8Group::G32,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::RowMajor,
        );
        assert!(!kept(4096, 8192, &g32_row));
        assert!(!kept(4096, 8192, &Fp8Options::mxfp8()));
        let token_col = groups(
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        assert!(!kept(4096, 8192, &token_col));
    }

    #[test]
    fn column_major_f32_group_scales_are_reductions_from_16_rows_to_one_row_per_sm() {
        if std::env::var_os("FP4NORM_FP8_SCALES_REDUCE").is_some() {
            return; // the knob overrides the rule
        }
        use crate::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout};
        let groups =
            |group, format, layout| Fp8Options::dynamic(Fp8Element::E4M3, group, format, layout);
        let reduced = |m, h, o: &Fp8Options| {
            let c = fp8_config(m, h, o);
            let on = c.fp8.is_some_and(|f| f.reduce_scales);
            assert_eq!(on, c.defines().contains("#define FP8_COL_RED 1\n"));
            assert_eq!(on, c.describe().contains(" reduce_scales"));
            on
        };
        let f32_col = groups(
            Fp8Group::G32,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let f32_g64_col = groups(
            Fp8Group::G64,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let f32_g128_col = groups(
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let ue8m0_col = groups(
            Fp8Group::G32,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::ColumnMajor,
        );
        // The H200's 132 SMs: 16 to 132 rows, f32 scales in groups of 32 or 64 only.
        assert!(reduced(16, 8192, &f32_g64_col));
        assert!(!reduced(16, 8192, &f32_g128_col));
        assert!(!reduced(1, 4096, &f32_col));
        assert!(!reduced(15, 4096, &f32_col));
        assert!(reduced(16, 4096, &f32_col));
        assert!(reduced(132, 8192, &f32_col));
        assert!(!reduced(133, 8192, &f32_col));
        assert!(!reduced(4096, 8192, &f32_col));
        for m in [1, 16, 132, 4096] {
            assert!(!reduced(m, 4096, &ue8m0_col));
        }
        // Only column-major group scales.
        let row = groups(
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::RowMajor,
        );
        assert!(!reduced(16, 4096, &row));
        assert!(!reduced(16, 4096, &Fp8Options::mxfp8()));
        assert!(!reduced(16, 4096, &Fp8Options::per_token(Fp8Element::E4M3)));
        let token_col = groups(
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        assert!(!reduced(16, 4096, &token_col));
    }

    #[test]
    fn kept_column_major_scales_are_demoted_from_an_eighth_of_the_l2() {
        if std::env::var_os("FP4NORM_FP8_SCALES_KEEP").is_some()
            || std::env::var_os("FP4NORM_FP8_SCALES_DEMOTE").is_some()
            || std::env::var_os("FP4NORM_FP8_SCALES_SPLIT").is_some()
        {
            return; // knobs override the rule
        }
        use crate::fp8::{Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout};
        let col = |group, format| {
            Fp8Options::dynamic(Fp8Element::E4M3, group, format, Fp8ScaleLayout::ColumnMajor)
        };
        // The distance the kernel gets, checked against its define: 0 where it has none.
        let demoted = |c: &KernelConfig| -> u32 {
            let rows = c.fp8.map_or(0, |f| f.direct_demote_rows());
            let define = format!("#define FP8_COL_DEMOTE_ROWS {rows}\n");
            assert_eq!(rows > 0, c.defines().contains(&define), "{}", c.describe());
            assert_eq!(
                rows > 0,
                c.describe().contains(&format!("demote_rows={rows}"))
            );
            rows
        };
        let f32_g128 = col(Fp8Group::G128, Fp8ScaleFormat::F32_NO_FLOOR);
        // 16384 x 16384 in groups of 128: 8 MiB of f32 scales, kept and at least an eighth
        // of the H200's L2. Four CTAs of 256 per row, five per SM: a wave of 165 rows, then
        // two lines of 32 rows.
        let c = fp8_config(16384, 16384, &f32_g128);
        assert!(c.fp8.is_some_and(|f| f.keep_scales && !f.split_scales));
        assert_eq!((c.threads_per_row, c.cluster), (256, 4), "{}", c.describe());
        assert_eq!(demoted(&c), 165 + 64, "{}", c.describe());
        // UE8M0 codes in groups of 32 (8 MiB of bytes): lines of 128 rows.
        let c = fp8_config(16384, 16384, &col(Fp8Group::G32, Fp8ScaleFormat::UE8M0));
        assert_eq!(demoted(&c), 165 + 256, "{}", c.describe());
        // The same codes packed four to a word (8 MiB of words): lines of 32 rows.
        let packed = Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G32,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::ColumnMajorPacked,
        );
        let c = fp8_config(16384, 16384, &packed);
        assert!(c
            .fp8
            .is_some_and(|f| f.packed && f.keep_scales && !f.split_scales));
        assert!(c.defines().contains("#define FP8_COL_PACKED 1\n"));
        assert_eq!(demoted(&c), 165 + 64, "{}", c.describe());
        // Kept but under an eighth of the L2 (4 MiB and 1 MiB): left kept.
        assert_eq!(demoted(&fp8_config(16384, 8192, &f32_g128)), 0);
        assert_eq!(demoted(&fp8_config(4096, 8192, &f32_g128)), 0);
        // Not kept (16 MiB staged for the split pass): never. Kept past a quarter of the L2
        // by the direct write (16 MiB): demoted.
        let g32 = col(Fp8Group::G32, Fp8ScaleFormat::F32_NO_FLOOR);
        assert_eq!(demoted(&fp8_config(16384, 8192, &g32)), 0);
        assert!(demoted(&fp8_config(16384, 32768, &f32_g128)) > 0);
        // Written by the split pass (8 MiB in groups of 64): not demoted there, but the
        // distance stands for a direct write, where the split is turned off (no PDL, the
        // all-reduce).
        let c = fp8_config(
            16384,
            8192,
            &col(Fp8Group::G64, Fp8ScaleFormat::F32_NO_FLOOR),
        );
        assert!(c.fp8.is_some_and(|f| f.split_scales && f.demote_rows > 0));
        assert_eq!(demoted(&c), 0);
        let direct = KernelConfig {
            fp8: c.fp8.map(|f| Fp8Spec {
                split_scales: false,
                ..f
            }),
            ..c
        };
        assert!(demoted(&direct) > 0);
        // A forced shape changes the wave, and so the distance: four CTAs of 256 per row,
        // five per SM, 165 rows a wave.
        let mut c = fp8_config(16384, 16384, &f32_g128);
        assert!(c.try_launch_shape((256, 1, 4), &H200));
        assert_eq!(demoted(&c), 165 + 64, "{}", c.describe());
    }

    #[test]
    fn a_forced_shape_fits_per_token_rows_by_vectors_and_their_barrier_limit() {
        let opts = crate::fp8::Fp8Options::per_token(crate::fp8::Fp8Element::E4M3);
        let mut cfg = fp8_config(1, 4096, &opts);
        // 512 vectors over a cluster of 4: a group of H elements, split by vectors.
        assert!(cfg.try_launch_shape((128, 1, 4), &H200));
        assert_eq!(
            (cfg.threads_per_row, cfg.rows_per_cta, cfg.cluster),
            (128, 1, 4)
        );
        // Rows of several warps meet at one named barrier each: 15 rows per CTA at most.
        let mut cfg = fp8_config(4096, 4096, &opts);
        assert!(cfg.try_launch_shape((64, 15, 1), &H200));
        assert!(!cfg.try_launch_shape((64, 16, 1), &H200));
        assert!(cfg.try_launch_shape((32, 16, 1), &H200)); // one warp per row: shuffles only
    }
}
