//! The GPU test sweep, shared by the GPU tests (tests/gpu.rs) and the CI kernel compile
//! check (tests/kernels_compile.rs), so that CI compiles exactly what the GPU runs.
#![allow(dead_code)]

pub mod allreduce;
pub mod fp8;

use fp4norm::cuda::GsMode;
use fp4norm::{DType, Fp4Format, Options, Problem, ScaleLayout};

/// How input values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Uniform in ±3.
    Normal,
    /// Random magnitudes over 2^±30.
    Wide,
    /// NaN, ±Inf, ±0, subnormals, the dtype's max, mixed in.
    Special,
    /// Values that land on E2M1 ties.
    Ties,
    /// bf16, H = 4096: every row the row of scripts/order-case.py (f64 summation orders
    /// disagree on its rstd; only the exact sum is order-free), rotated by its row index so
    /// that each row's large values sit in other threads; residual 0, weight 1. Use with
    /// `gs = ORDER_CASE_GS`.
    SumOrder,
    /// Every row's rstd (SPEC.md §1.3, on the exact sum) within `RSTD_EDGE_ULPS` f64 ulps of
    /// an f32 rounding midpoint: about a quarter inside the kernels' decision margin (the
    /// exact sum), the rest just outside it, where the f64 sum (and, on the fast path, the
    /// rsqrt seed's Newton step: `sumsq::rstd_by_seed`) decides. Residual 0.
    RstdEdge,
}

/// How near an f32 rounding midpoint `Fill::RstdEdge` puts each row's rstd, in f64 ulps: a
/// few times the kernels' margin (`fused.cu`, `rstd_checked`: the sum's depth + 16 +
/// `sumsq::RSTD_SEED_MARGIN_ULPS`, 35 to about 80 ulps in these shapes).
pub const RSTD_EDGE_ULPS: u64 = 256;

/// The global scale of the order case (0.09961094707...): with it, the element-order sum's
/// rstd and the exact sum's give different block scales (0x39 / 0x38).
pub const ORDER_CASE_GS: f32 = f32::from_bits(0x3DCC_00D3);

/// One GPU test case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub dtype: DType,
    pub m: usize,
    pub h: usize,
    pub format: Fp4Format,
    pub layout: ScaleLayout,
    pub residual: bool,
    pub y_out: bool,
    pub gs: f32,
    /// Pass no global scale at all (the kernel uses 1.0).
    pub gs_none: bool,
    pub per_row_gs: bool,
    pub eps: f32,
    /// SPEC.md §8's weight bias (0: none).
    pub weight_bias: f32,
    pub fill: Fill,
    /// Rows 0..4 hold a zero row, a row with NaN, one with +Inf and one with -Inf.
    pub special_rows: bool,
    /// Extra elements between rows of x, residual and y_out (views into wider buffers).
    pub x_pad: usize,
    pub r_pad: usize,
    pub y_pad: usize,
    /// Start the element buffers this many elements into their allocation (not 16-byte
    /// aligned: the element-wise kernel).
    pub misalign_elems: usize,
    /// Start the swizzled scales this many bytes into their allocation (the API allows any
    /// alignment), with the element views still 16-byte aligned.
    pub sw_offset: usize,
}

impl Case {
    pub fn new(dtype: DType, m: usize, h: usize, format: Fp4Format, layout: ScaleLayout) -> Self {
        Case {
            dtype,
            m,
            h,
            format,
            layout,
            residual: true,
            y_out: false,
            gs: 1.0,
            gs_none: false,
            per_row_gs: false,
            eps: 1e-6,
            weight_bias: 0.0,
            fill: Fill::Normal,
            special_rows: false,
            x_pad: 0,
            r_pad: 0,
            y_pad: 0,
            misalign_elems: 0,
            sw_offset: 0,
        }
    }
    pub fn x_stride(&self) -> usize {
        self.h + self.x_pad
    }
    pub fn r_stride(&self) -> usize {
        self.h + self.r_pad
    }
    pub fn y_stride(&self) -> usize {
        self.h + self.y_pad
    }
    pub fn problem(&self, dtype: DType) -> Problem {
        let p = Problem::new(
            self.m,
            self.h,
            dtype,
            self.layout,
            &Options {
                format: self.format,
                eps: self.eps,
                weight_bias: self.weight_bias,
            },
        )
        .expect("valid case")
        .with_y_out(self.y_out);
        if self.residual {
            p
        } else {
            p.without_residual()
        }
    }
    pub fn gs_mode(&self) -> GsMode {
        if self.per_row_gs {
            GsMode::PerRow
        } else if self.misalign_elems == 0 && self.gs_none && self.gs == 1.0 {
            GsMode::None
        } else {
            GsMode::Uniform
        }
    }
    /// Whether the 16-byte vector kernel runs (strides and pointers 16-byte aligned).
    pub fn aligned(&self) -> bool {
        self.misalign_elems == 0
            && self.sw_offset % 4 == 0
            && [self.x_stride(), self.r_stride(), self.y_stride()]
                .iter()
                .all(|s| s % 8 == 0)
    }
}

fn small() -> bool {
    std::env::var("FP4NORM_GPU_SWEEP").is_ok_and(|v| v == "small")
}

/// Both presets and the mixed pairings × all layouts × M in {0, 1, 7, 127, 128, 129,
/// 1000, 16384} × H from 16 to 32768 (non-powers of two included), with residual,
/// y_out, per-row scales, strides, eps and value distributions varied across cases.
pub fn sweep(dtype: DType) -> Vec<Case> {
    let ms: &[usize] = if small() {
        &[0, 1, 7, 129]
    } else {
        &[0, 1, 7, 127, 128, 129, 1000, 16384]
    };
    let hs: &[usize] = if small() {
        &[16, 32, 96, 2880, 4096]
    } else {
        &[
            16, 32, 48, 64, 96, 160, 2048, 2880, 4096, 5120, 7168, 8192, 13824, 16384, 32768,
        ]
    };
    let mut out = Vec::new();
    let mut idx = 0usize;
    for (fi, &format) in Fp4Format::ALL.iter().enumerate() {
        for (li, &layout) in ScaleLayout::ALL.iter().enumerate() {
            for (mi, &m) in ms.iter().enumerate() {
                for j in 0..2 {
                    let mut h = hs[(fi * 5 + li * 3 + mi * 7 + j * 11) % hs.len()];
                    if h % format.block_size() != 0 {
                        h *= 2;
                    }
                    // Keep the CPU side of the biggest cases affordable.
                    while m * h > (1 << 26) {
                        h /= 2;
                    }
                    h = h.max(format.block_size());
                    let mut c = Case::new(dtype, m, h, format, layout);
                    c.residual = idx % 5 != 4;
                    c.y_out = idx % 3 == 0;
                    c.per_row_gs = idx % 4 == 1;
                    c.gs = [1.0, 2688.0, 0.37, 1.0e4][idx % 4];
                    c.gs_none = idx % 9 == 0;
                    c.eps = if idx % 7 == 3 { 0.0 } else { 1e-6 };
                    // Gemma's (1 + w), and a bias that rounds the sum, on a tenth of the
                    // cases each (each is a kernel specialisation of its own).
                    c.weight_bias = match idx % 20 {
                        1 | 11 => 1.0,
                        6 => -0.3,
                        _ => 0.0,
                    };
                    c.fill = [
                        Fill::Normal,
                        Fill::Normal,
                        Fill::Wide,
                        Fill::Special,
                        Fill::Ties,
                    ][idx % 5];
                    c.special_rows = idx % 6 == 5;
                    if idx % 8 == 2 {
                        c.x_pad = 8;
                        c.r_pad = 24;
                        c.y_pad = 16;
                    }
                    if idx % 16 == 7 {
                        // strides that break 16-byte alignment: the element-wise kernel
                        c.x_pad = 3;
                        c.r_pad = 1;
                    }
                    out.push(c);
                    idx += 1;
                }
            }
        }
    }
    out
}

/// Specific edge cases: misaligned pointers, very long rows, zero/NaN/Inf rows, eps 0,
/// swizzle padding in both directions. `FP4NORM_GPU_SWEEP=small` (compute-sanitizer
/// runs) leaves out the cases of more than 2^25 elements (8200 x 5120).
pub fn edge_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for (i, &format) in Fp4Format::ALL.iter().enumerate() {
            // (300, 16384): long rows in the throughput regime, rotated row starts
            // (FP4_ROTATE) in every layout, element-wise and without residual too.
            for (m, h) in [
                (1usize, 64usize),
                (129, 2880),
                (5, 65536),
                (200, 96),
                (300, 16384),
            ] {
                let h = if h % format.block_size() == 0 {
                    h
                } else {
                    h * 2
                };
                let mut c = Case::new(dtype, m, h, format, ScaleLayout::ALL[i % 3]);
                c.special_rows = m >= 4;
                c.y_out = true;
                out.push(c);
                let mut c2 = c;
                c2.misalign_elems = 1 + i;
                c2.layout = ScaleLayout::Both;
                out.push(c2);
                let mut c3 = c;
                c3.eps = 0.0;
                c3.fill = Fill::Special;
                c3.residual = false;
                c3.per_row_gs = true;
                out.push(c3);
            }
            // Swizzled scales 4 bytes off 16-byte alignment, with the element views
            // aligned (the vector kernel).
            for (m, h) in [(300usize, 4096usize), (100, 2048)] {
                let mut c5 = Case::new(dtype, m, h, format, ScaleLayout::Swizzled);
                c5.sw_offset = 4;
                c5.special_rows = true;
                out.push(c5);
            }
            // Enough rows for the split swizzled write of 16-element blocks (a second
            // kernel), not a multiple of 128; with 32-element blocks (direct write),
            // 90 blocks: a partial last 4-block group. (FP4NORM_SWIZZLE_SPLIT=1 runs
            // every swizzled case through the split write.)
            for layout in [ScaleLayout::Swizzled, ScaleLayout::Both] {
                let mut c6 = Case::new(dtype, 8300, 2880, format, layout);
                c6.special_rows = true;
                c6.per_row_gs = layout == ScaleLayout::Both;
                out.push(c6);
                // The same with swizzled scales one byte off alignment: the split write
                // (4-byte words) must not be chosen; the vector kernel is not either.
                let mut c7 = c6;
                c7.sw_offset = 1;
                out.push(c7);
            }
            // Many rows split over a two-CTA cluster (H = 5120 up to 64 rows per SM, on a
            // GPU of 129+ SMs) with both scale layouts: the split swizzled write (8192+ rows
            // of 16-element blocks) or the direct one, fed by clustered CTAs.
            let mut c8 = Case::new(dtype, 8200, 5120, format, ScaleLayout::Both);
            c8.special_rows = true;
            c8.per_row_gs = i % 2 == 1;
            out.push(c8);
            // The same split at a size the sanitizer runs (H = 8192: two CTAs per row for
            // any row count above the SM count), a strided view, with and without residual.
            let mut c9 = Case::new(dtype, 300, 8192, format, ScaleLayout::ALL[i % 3]);
            c9.special_rows = true;
            c9.residual = i % 2 == 0;
            c9.x_pad = 8;
            out.push(c9);
            // Pass 2's shared block scales (lanes l and l ^ 1 swap them) with two rows per
            // CTA (H = 1024: 64 threads x 2 rows, two vectors per thread), and with six
            // vectors per thread re-read from L2 (H = 24576: one CTA of 512 per row).
            for (m, h) in [(300usize, 1024usize), (200, 24576)] {
                let mut c10 = Case::new(dtype, m, h, format, ScaleLayout::ALL[(i + 1) % 3]);
                c10.special_rows = true;
                c10.per_row_gs = i % 2 == 0;
                out.push(c10);
            }
            // The summation-order case (SPEC.md §1.2; src/sumsq.rs) in every launch regime:
            // one row over a cluster, 16 rows, 300 and 2000 rows of one CTA each.
            if dtype == DType::BF16 && i == 0 {
                for (m, residual) in [(1usize, true), (16, false), (300, true), (2000, true)] {
                    let mut c11 = Case::new(dtype, m, 4096, format, ScaleLayout::Both);
                    c11.fill = Fill::SumOrder;
                    c11.gs = ORDER_CASE_GS;
                    c11.residual = residual;
                    out.push(c11);
                }
            }
            // Rows whose rstd sits next to an f32 rounding midpoint, in every launch regime:
            // one row over a cluster, 16 rows, 130 rows (one CTA of several warps each) and
            // 300 rows of several per CTA; H a power of two and not (the seed path's mean
            // is one fma).
            // NVFP4 in bf16, MXFP4 in f16: the decision does not depend on the format.
            if (dtype == DType::BF16) == (i == 0) {
                for (m, h, residual) in [
                    (1usize, 4096usize, true),
                    (16, 8192, false),
                    (130, 7168, true),
                    (300, 2048, true),
                ] {
                    let mut c12 = Case::new(dtype, m, h, format, ScaleLayout::Both);
                    c12.fill = Fill::RstdEdge;
                    c12.residual = residual;
                    out.push(c12);
                }
            }
            // A global scale so small that gs / d rounds to 0 next to ±Inf values:
            // Inf · 0 = NaN products, which must encode as 0x7.
            let mut c4 = Case::new(dtype, 33, 128, format, ScaleLayout::Both);
            c4.gs = 1e-45;
            c4.fill = Fill::Special;
            c4.special_rows = true;
            out.push(c4);
        }
    }
    if small() {
        out.retain(|c| c.m * c.h <= 1 << 25);
    }
    out
}

/// The launch table's many-row shapes that the sweep's sizes never reach (calls of 17 to
/// 128 rows per SM: up to 2^31 elements), each with a case of 300 rows to run it forced
/// (`internal::with_launch_shape`): bf16 and f16, both presets, every layout in turn, H = 2048
/// to 32768, with and without residual and `y_out`. The CI compile check builds the same.
pub fn many_row_shape_cases(limits: &fp4norm::cuda::DeviceLimits) -> Vec<(Case, (u32, u32, u32))> {
    use fp4norm::cuda::internal::launch_shape;
    let sms = limits.sm_count;
    let mut out: Vec<(Case, (u32, u32, u32))> = Vec::new();
    let mut idx = 0usize;
    for dtype in [DType::BF16, DType::F16] {
        for &format in Fp4Format::ALL.iter() {
            for h in [2048usize, 4096, 5120, 7168, 8192, 16384, 32768] {
                let block = format.block_size();
                let small = launch_shape(h, block, 300, dtype, limits);
                for rows_per_sm in [17usize, 65, 128] {
                    let shape = launch_shape(h, block, rows_per_sm * sms as usize, dtype, limits);
                    if shape == small
                        || out.iter().any(|(c, s)| {
                            *s == shape && c.h == h && c.dtype == dtype && c.format == format
                        })
                    {
                        continue;
                    }
                    let mut c = Case::new(
                        dtype,
                        300,
                        h,
                        format,
                        ScaleLayout::ALL[idx % ScaleLayout::ALL.len()],
                    );
                    c.special_rows = true;
                    c.residual = idx % 3 != 2;
                    c.y_out = idx % 2 == 0;
                    c.per_row_gs = idx % 4 == 1;
                    c.fill = [Fill::Normal, Fill::Ties, Fill::Wide][idx % 3];
                    out.push((c, shape));
                    idx += 1;
                }
            }
        }
    }
    out
}

/// Every generic candidate shape `fp4norm tune` measures (`internal::tune_candidates`) on
/// a device with `limits`, each with a case to run it forced: bf16, both presets, the
/// swizzled layout (the 4-byte scale words each CTA owns), H = 2048, 5120 and 16384, 300
/// rows with the special rows. A tuned table can only hold such shapes, so none of them
/// may change a byte. The CI compile check builds the same.
pub fn tune_candidate_cases(limits: &fp4norm::cuda::DeviceLimits) -> Vec<(Case, (u32, u32, u32))> {
    use fp4norm::cuda::{internal::tune_candidates, ShapeClass};
    let mut out = Vec::new();
    for &format in [Fp4Format::NVFP4, Fp4Format::MXFP4].iter() {
        for h in [2048usize, 5120, 16384] {
            for shape in tune_candidates(ShapeClass::Fp4, h, format.block_size(), limits) {
                let mut c = Case::new(DType::BF16, 300, h, format, ScaleLayout::Swizzled);
                c.special_rows = true;
                c.fill = Fill::Ties;
                out.push((c, shape));
            }
        }
    }
    out
}

/// Every case of every GPU test.
pub fn all_cases() -> Vec<Case> {
    let mut v = sweep(DType::BF16);
    v.extend(sweep(DType::F16));
    v.extend(edge_cases());
    v
}

/// The cases the GPU tests run on the literal-encoder path (the fallback of a device whose
/// conversion self-test failed): every edge case and every eighth case of each sweep.
pub fn literal_path_cases() -> Vec<Case> {
    let mut v: Vec<Case> = sweep(DType::BF16).into_iter().step_by(8).collect();
    v.extend(sweep(DType::F16).into_iter().step_by(8));
    v.extend(edge_cases());
    v
}
