//! The FP8 GPU cases (SPEC.md §8), shared by the GPU tests (tests/gpu_fp8.rs) and the CI
//! kernel compile check (tests/kernels_compile.rs): every element format, scaling, group,
//! scale format and layout, over hidden sizes that take each kernel path (a per-token row
//! of one group, of one warp, of several warps; groups within one CTA and over a cluster),
//! with and without residual, `y_out`, weight bias, unaligned views and special rows.

use fp4norm::cuda::internal::KernelConfig;
use fp4norm::cuda::DeviceLimits;
use fp4norm::fp8::{
    Fp8Element, Fp8Group, Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling,
};
use fp4norm::DType;

/// The GPU tests run every this-many-th FP8 case again on the literal-encoder path.
pub const LITERAL_EVERY: usize = 7;

/// vLLM's per-token floor, `1 / (448 · 512)`.
pub const VLLM_S_MIN: f32 = 1.0 / (448.0 * 512.0);

/// One FP8 GPU case.
#[derive(Clone, Copy, Debug)]
pub struct Fp8Case {
    pub dtype: DType,
    pub m: usize,
    pub h: usize,
    pub options: Fp8Options,
    pub residual: bool,
    pub y_out: bool,
    /// A per-tensor scale read from device memory (else passed by value).
    pub scale_in_memory: bool,
    /// Element buffers one element into their allocation (the element-wise kernel).
    pub misaligned: bool,
    /// The scale buffer one element into its allocation, the others aligned (the vector
    /// kernels with scales that are not 16-byte aligned).
    pub scales_misaligned: bool,
    /// Rows 0..4: a zero row, a row with NaN, one with +Inf, one with -Inf; values over
    /// 2^±30 elsewhere.
    pub special: bool,
}

impl Fp8Case {
    /// The case's problem.
    pub fn problem(&self) -> Fp8Problem {
        Fp8Problem::new(self.m, self.h, self.dtype, &self.options)
            .expect("valid FP8 case")
            .with_y_out(self.y_out)
            .pipe(|p| {
                if self.residual {
                    p
                } else {
                    p.without_residual()
                }
            })
    }

    /// Elements the scale buffer starts into its allocation.
    pub fn scale_offset(&self) -> usize {
        (self.misaligned || self.scales_misaligned) as usize
    }

    /// The kernel the case runs on a device with `limits`.
    pub fn config(&self, limits: &DeviceLimits) -> KernelConfig {
        KernelConfig::fp8(
            &self.problem(),
            self.scale_in_memory,
            !self.misaligned,
            limits,
        )
    }
}

trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}

/// Every scaling the FP8 ops offer: per-tensor, per-token (f32 with and without the floor,
/// UE8M0), groups of 32, 64, 128 with f32 or UE8M0 scales, row- or column-major, MXFP8.
pub fn scalings() -> Vec<Fp8Scaling> {
    let dynamic = |group, format, layout| Fp8Scaling::Dynamic {
        group,
        format,
        layout,
    };
    let mut v = vec![
        Fp8Scaling::PerTensor(0.37),
        dynamic(
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::RowMajor,
        ),
        dynamic(
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32 { s_min: VLLM_S_MIN },
            Fp8ScaleLayout::ColumnMajor,
        ),
        dynamic(
            Fp8Group::PerToken,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::RowMajor,
        ),
    ];
    for group in [Fp8Group::G32, Fp8Group::G64, Fp8Group::G128] {
        for format in [Fp8ScaleFormat::F32_NO_FLOOR, Fp8ScaleFormat::UE8M0] {
            for layout in [Fp8ScaleLayout::RowMajor, Fp8ScaleLayout::ColumnMajor] {
                v.push(dynamic(group, format, layout));
            }
        }
    }
    v.push(dynamic(
        Fp8Group::G128,
        Fp8ScaleFormat::F32 { s_min: VLLM_S_MIN },
        Fp8ScaleLayout::RowMajor,
    ));
    v.push(Fp8Options::mxfp8().scaling);
    // Packed column-major UE8M0 (DeepGEMM's): words gathered (32, 64) or bytes (128).
    for group in [Fp8Group::G32, Fp8Group::G64, Fp8Group::G128] {
        v.push(dynamic(
            group,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::ColumnMajorPacked,
        ));
    }
    v
}

/// A plain case: residual add, no `y_out`, no weight bias, aligned, a per-tensor scale in
/// memory, random rows.
pub fn base(dtype: DType, m: usize, h: usize, element: Fp8Element, scaling: Fp8Scaling) -> Fp8Case {
    Fp8Case {
        dtype,
        m,
        h,
        options: Fp8Options {
            element,
            scaling,
            eps: 1e-6,
            weight_bias: 0.0,
        },
        residual: true,
        y_out: false,
        scale_in_memory: true,
        misaligned: false,
        scales_misaligned: false,
        special: false,
    }
}

/// The FP8 GPU cases (about a hundred).
pub fn fp8_cases() -> Vec<Fp8Case> {
    let mut out = Vec::new();
    let rows = [1usize, 7, 130, 300];
    let mut i = 0usize;
    let mut vary = |mut c: Fp8Case| {
        // Options spread over the cases by index: each appears with every kind of scaling.
        c.residual = i % 5 != 3;
        c.y_out = i % 4 == 1;
        c.options.weight_bias = if i % 3 == 2 { 1.0 } else { 0.0 };
        c.special = i % 3 == 0;
        c.scale_in_memory = i % 2 == 0;
        c.misaligned = i % 11 == 5;
        i += 1;
        c
    };
    for element in Fp8Element::ALL {
        for (k, scaling) in scalings().into_iter().enumerate() {
            for (j, h) in [128usize, 5120].into_iter().enumerate() {
                let m = rows[(k + 2 * j + element as usize) % rows.len()];
                out.push(vary(base(DType::BF16, m, h, element, scaling)));
            }
        }
    }
    for (k, scaling) in scalings().into_iter().enumerate() {
        let m = rows[k % rows.len()];
        out.push(vary(base(DType::F16, m, 2048, Fp8Element::E4M3, scaling)));
    }
    // Long rows: groups over a cluster at few rows, per-token rows of several warps, MXFP8
    // with its padding, at one and at many rows.
    let s = scalings();
    for (m, pick) in [(1usize, [0usize, 1, 13, 16]), (300, [0, 2, 9, 16])] {
        for k in pick {
            out.push(vary(base(DType::BF16, m, 16384, Fp8Element::E4M3, s[k])));
        }
    }
    // Per-token rows of several warps sharing a CTA (many rows of H = 768 and 1024: two rows
    // of 64 threads), an odd M leaving the last CTA's second row past M: each row waits at
    // a named barrier of its own.
    for (m, h, k) in [(301usize, 1024usize, 1usize), (401, 768, 3), (301, 1024, 2)] {
        out.push(vary(base(DType::BF16, m, h, Fp8Element::E4M3, s[k])));
    }
    // The smallest rows: one vector (per-tensor, per-token) and per-token rows that are
    // one group of 4 or 8 vectors (H = 32, 64).
    for (h, k) in [(8usize, 0usize), (8, 1), (32, 3), (64, 1), (64, 4)] {
        out.push(vary(base(DType::BF16, 5, h, Fp8Element::E5M2, s[k])));
    }
    // Rows whose last vector is partial (H not a multiple of 8, per-tensor and per-token
    // scales: the element-wise kernel): one element, FlashInfer's 111 and 500, a row of 8
    // vectors split over a cluster (57), rows of several warps at decode (candidate) and
    // at many rows (second reduction); every per-token scaling, both elements and dtypes.
    for (j, (m, h)) in [
        (3usize, 1usize),
        (5, 7),
        (130, 111),
        (1, 57),
        (300, 500),
        (16, 4099),
        (1, 16387),
    ]
    .into_iter()
    .enumerate()
    {
        for (k, &scaling) in s[..4].iter().enumerate() {
            let element = if (j + k) % 3 == 2 {
                Fp8Element::E5M2
            } else {
                Fp8Element::E4M3
            };
            let dtype = if (j + k) % 2 == 1 {
                DType::F16
            } else {
                DType::BF16
            };
            out.push(vary(base(dtype, m, h, element, scaling)));
        }
    }
    // Column-major group scales, f32 and UE8M0 (dtypes alternating over the list).
    for (j, (m, h, k)) in [
        // Many rows (stored evict-last in L2): the layout's padding rows among the last
        // four (M not a multiple of 4), rows of one CTA of several warps, of a cluster
        // (H = 8192, 16384), several rows per CTA (H = 1024).
        (301usize, 8192usize, 5usize),
        (1027, 4096, 15),
        (134, 1024, 11),
        (502, 16384, 7),
        (300, 2048, 13),
        (1000, 1024, 9),
        // Decode rows (16 to 131): the rule writes f32 scales in groups of 32 and 64 there
        // as reductions (16 x 4096); with the reductions forced (`gpu-check.sh tests`)
        // every case does: over clusters (H = 4096, 8192, 16384), four rows per CTA (131
        // rows of 256), UE8M0 padding rows sharing a 32-bit word with the last rows
        // (M = 17, 19, 131).
        (16, 4096, 5),
        (17, 8192, 7),
        (64, 16384, 11),
        (131, 256, 7),
        (130, 1024, 13),
        (19, 4096, 15),
    ]
    .into_iter()
    .enumerate()
    {
        let dtype = if j % 2 == 1 { DType::F16 } else { DType::BF16 };
        out.push(vary(base(dtype, m, h, Fp8Element::E4M3, s[k])));
    }
    // Packed column-major UE8M0 codes (s[18..21]: groups of 32, 64, 128): a last word part
    // padding (H = 2880: 90 and 45 groups; H = 384: 3 groups of 128), padding rows (M not a
    // multiple of 4), rows over clusters (H = 16384 at few rows), many rows kept in L2.
    for (j, (m, h, k)) in [
        (1usize, 2880usize, 18usize),
        (5, 2880, 19),
        (301, 2880, 18),
        (7, 384, 20),
        (1, 16384, 18),
        (3, 16384, 20),
        (1027, 4096, 19),
        (502, 7168, 20),
        (130, 8192, 18),
    ]
    .into_iter()
    .enumerate()
    {
        let dtype = if j % 2 == 1 { DType::F16 } else { DType::BF16 };
        out.push(vary(base(dtype, m, h, Fp8Element::E4M3, s[k])));
    }
    // Packed codes on the element-wise kernel (bytes, not gathered words): rows one element
    // off their 16-byte alignment (groups of 32, a partial last word), and a scale buffer
    // one byte off its 4-byte alignment.
    let mut c = base(DType::BF16, 7, 2880, Fp8Element::E4M3, s[18]);
    c.misaligned = true;
    out.push(c);
    let mut c = base(DType::F16, 130, 4096, Fp8Element::E4M3, s[19]);
    c.scales_misaligned = true;
    out.push(c);
    // Special per-tensor scales: 0 (inv = +Inf) and a NaN scale, by value and from memory.
    for (scale, in_memory) in [(0.0f32, true), (f32::NAN, false), (1e-30, true)] {
        let mut c = base(
            DType::BF16,
            9,
            256,
            Fp8Element::E4M3,
            Fp8Scaling::PerTensor(scale),
        );
        c.scale_in_memory = in_memory;
        c.special = true;
        out.push(c);
    }
    // M = 0 writes nothing.
    out.push(base(DType::BF16, 0, 1024, Fp8Element::E4M3, s[1]));
    out
}

/// Every launch shape `fp4norm tune` may pick for an FP8 call, each with one call of its
/// class: per tensor, per token (f32 row-major, and UE8M0 column-major), groups of 32, 64
/// and 128 (column-major f32, swizzled MXFP8, row-major UE8M0, packed UE8M0), at 300 rows of 2048 and
/// 5120 (per token and per tensor at 16384 too), special rows included.
pub fn tune_candidate_cases(limits: &DeviceLimits) -> Vec<(Fp8Case, (u32, u32, u32))> {
    use fp4norm::cuda::internal::tune_candidates;
    let dynamic = |group, format, layout| Fp8Scaling::Dynamic {
        group,
        format,
        layout,
    };
    let f32s = Fp8ScaleFormat::F32_NO_FLOOR;
    let ue8m0 = Fp8ScaleFormat::UE8M0;
    let scalings = [
        (Fp8Scaling::PerTensor(0.75), true),
        (
            dynamic(Fp8Group::PerToken, f32s, Fp8ScaleLayout::RowMajor),
            true,
        ),
        (
            dynamic(Fp8Group::PerToken, ue8m0, Fp8ScaleLayout::ColumnMajor),
            false,
        ),
        (
            dynamic(Fp8Group::G32, f32s, Fp8ScaleLayout::ColumnMajor),
            false,
        ),
        (
            dynamic(Fp8Group::G32, ue8m0, Fp8ScaleLayout::Swizzled),
            false,
        ),
        (
            dynamic(Fp8Group::G64, f32s, Fp8ScaleLayout::ColumnMajor),
            false,
        ),
        (
            dynamic(Fp8Group::G128, ue8m0, Fp8ScaleLayout::RowMajor),
            false,
        ),
        (
            dynamic(Fp8Group::G32, ue8m0, Fp8ScaleLayout::ColumnMajorPacked),
            false,
        ),
    ];
    let mut out = Vec::new();
    for (scaling, long_rows) in scalings {
        let hs: &[usize] = if long_rows {
            &[2048, 5120, 16384]
        } else {
            &[2048, 5120]
        };
        for &h in hs {
            let mut c = base(DType::BF16, 300, h, Fp8Element::E4M3, scaling);
            c.special = true;
            // The class and block `fp4norm tune` takes from the call's kernel.
            let cfg = c.config(limits);
            for shape in tune_candidates(cfg.shape_class(), h, cfg.shape_block(), limits) {
                out.push((c, shape));
            }
        }
    }
    out
}

/// Column-major f32 group scales of calls the launch table writes in two kernels (staged by
/// 8-row tiles, then reordered: `column_scales_split_wanted`): groups of 32 and 64, M not a
/// multiple of 8 (the last rows and the padding written directly), rows of one CTA and of
/// a cluster, the floor, special rows, a scale buffer that is not 16-byte aligned.
pub fn split_column_scale_cases() -> Vec<Fp8Case> {
    let col = |group, format| Fp8Scaling::Dynamic {
        group,
        format,
        layout: Fp8ScaleLayout::ColumnMajor,
    };
    let floored = Fp8ScaleFormat::F32 { s_min: VLLM_S_MIN };
    let mut a = base(
        DType::BF16,
        4101,
        8192,
        Fp8Element::E4M3,
        col(Fp8Group::G32, Fp8ScaleFormat::F32_NO_FLOOR),
    );
    a.special = true;
    let mut b = base(
        DType::F16,
        4096,
        8192,
        Fp8Element::E5M2,
        col(Fp8Group::G64, floored),
    );
    b.y_out = true;
    b.options.weight_bias = 1.0;
    let mut c = base(
        DType::BF16,
        2058,
        16384,
        Fp8Element::E4M3,
        col(Fp8Group::G32, floored),
    );
    c.residual = false;
    c.scales_misaligned = true;
    let mut d = base(
        DType::BF16,
        1030,
        32768,
        Fp8Element::E4M3,
        col(Fp8Group::G64, Fp8ScaleFormat::F32_NO_FLOOR),
    );
    d.scale_in_memory = false;
    vec![a, b, c, d]
}

/// The FP8 op behind the fused all-reduce (SPEC.md §9 then §8): 2 to 8 ranks (simulated by
/// input buffers on one GPU), every kind of scaling, decode rows over a cluster and many
/// rows, both dtypes; the case's `x` is rank 0's input. Shared by tests/gpu_fp8.rs and the
/// CI kernel compile check.
pub fn allreduce_fp8_cases() -> Vec<(usize, Fp8Case)> {
    let shapes = [(1usize, 4096usize), (16, 8192), (130, 2048), (300, 4096)];
    let ranks = [2usize, 3, 8, 4];
    scalings()
        .into_iter()
        .enumerate()
        .map(|(k, scaling)| {
            let (m, h) = shapes[k % shapes.len()];
            let mut c = base(
                if k % 3 == 1 { DType::F16 } else { DType::BF16 },
                m,
                h,
                if k % 5 == 4 {
                    Fp8Element::E5M2
                } else {
                    Fp8Element::E4M3
                },
                scaling,
            );
            c.y_out = k % 4 == 2;
            c.options.weight_bias = if k % 3 == 2 { 1.0 } else { 0.0 };
            c.scale_in_memory = k % 2 == 0;
            c.misaligned = k % 7 == 5;
            (ranks[k % ranks.len()], c)
        })
        .collect()
}

/// The FP8 op behind the all-reduce over peer access: [`allreduce_fp8_cases`]' scalings at
/// decode rows (W ranks run as W grids on one GPU, all resident at once), 1 to 8 ranks.
pub fn peer_fp8_cases() -> Vec<(usize, Fp8Case)> {
    // (5001: rows ending in a partial vector, where the scaling allows any H.)
    let shapes = [(1usize, 4096usize), (16, 2048), (3, 8192), (1, 5001)];
    let ranks = [2usize, 4, 8, 1, 3];
    allreduce_fp8_cases()
        .into_iter()
        .enumerate()
        .map(|(k, (_, mut c))| {
            (c.m, c.h) = shapes[k % shapes.len()];
            // (Rows of any H only for per-tensor and per-token scales.)
            if Fp8Problem::new(c.m, c.h, c.dtype, &c.options).is_err() {
                c.h = 4096;
            }
            (ranks[k % ranks.len()], c)
        })
        .collect()
}

/// The kernel of an all-reduce case of [`allreduce_fp8_cases`] on a device with `limits`.
pub fn allreduce_fp8_config(ranks: usize, c: &Fp8Case, limits: &DeviceLimits) -> KernelConfig {
    KernelConfig {
        ar_ranks: ranks as u32,
        ..c.config(limits)
    }
}
