//! Every compute path of the CPU backend against the reference, byte for byte.
//!
//! The default path of a machine is what the integration tests exercise; here each path
//! (`Isa::ALL` that the CPU supports) is forced per call, so a path that is not the
//! default still runs on the same inputs: random data and SPEC.md's edge cases (NaN/Inf/
//! zero rows, subnormals, exact E2M1 ties, huge values, rows whose sum of squares needs
//! the exact fallback, per-row global scales of every kind, strided rows, odd M, every
//! format/layout pairing, y_out, no residual), and the FP8 ops' every option set. The SIMD
//! lane functions are also checked
//! against the scalar codecs over every input where that is at most 2^32 values.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::isa::{with_isa, Isa};
use crate::fp8::{
    self, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
    Fp8Scales,
};
use crate::{
    cpu, reference, BlockSize, DType, Element, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef,
    Options, Problem, ScaleFormat, ScaleLayout, ScaleOut,
};

/// The paths this machine can run (Portable always).
fn paths() -> Vec<Isa> {
    let p: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.supported()).collect();
    let missing: Vec<&str> = Isa::ALL
        .into_iter()
        .filter(|i| !i.supported())
        .map(|i| i.name())
        .collect();
    if !missing.is_empty() {
        eprintln!("SKIPPED paths this CPU lacks: {}", missing.join(", "));
    }
    p
}

const FORMATS: [Fp4Format; 4] = [
    Fp4Format::NVFP4,
    Fp4Format::MXFP4,
    Fp4Format {
        block: BlockSize::B16,
        scale: ScaleFormat::UE8M0,
    },
    Fp4Format {
        block: BlockSize::B32,
        scale: ScaleFormat::E4M3,
    },
];
const LAYOUTS: [ScaleLayout; 3] = [
    ScaleLayout::RowMajor,
    ScaleLayout::Swizzled,
    ScaleLayout::Both,
];

#[derive(Clone, Debug)]
enum Gs {
    Uniform(f32),
    PerRow(Vec<f32>),
}

/// One call's inputs, as bits of the dtype; rows `stride` elements apart.
#[derive(Clone, Debug)]
struct Case {
    m: usize,
    h: usize,
    dtype: DType,
    format: Fp4Format,
    layout: ScaleLayout,
    residual: bool,
    y_out: bool,
    stride: usize,
    eps: f32,
    weight_bias: f32,
    x: Vec<u16>,
    r: Vec<u16>,
    w: Vec<u16>,
    gs: Gs,
}

#[derive(Debug, PartialEq)]
struct Outputs {
    q: Vec<u8>,
    row_major: Vec<u8>,
    swizzled: Vec<u8>,
    r: Vec<u16>,
    y_out: Vec<u16>,
}

fn run_as<T: Element>(c: &Case, isa: Option<Isa>) -> Outputs {
    let conv = |v: &[u16]| v.iter().map(|&b| T::from_bits(b)).collect::<Vec<T>>();
    let (x, mut r, w) = (conv(&c.x), conv(&c.r), conv(&c.w));
    let opts = Options {
        format: c.format,
        eps: c.eps,
        weight_bias: c.weight_bias,
    };
    let p = Problem::new(c.m, c.h, c.dtype, c.layout, &opts).unwrap();
    // Outputs start as garbage, so that a byte left unwritten shows.
    let mut q = vec![0xA5u8; p.fp4_len()];
    let mut rm = vec![
        0xA5u8;
        if c.layout.has_row_major() {
            p.row_major_scales_len()
        } else {
            0
        }
    ];
    let mut sw = vec![
        0xA5u8;
        if c.layout.has_swizzled() {
            p.swizzled_scales_len()
        } else {
            0
        }
    ];
    let mut yo = vec![T::from_bits(0x5A5A); if c.y_out { c.x.len() } else { 0 }];
    let scales = match c.layout {
        ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
        ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
        ScaleLayout::Both => ScaleOut::Both {
            row_major: &mut rm[..],
            swizzled: &mut sw[..],
        },
    };
    let out = Fp4Out {
        y_fp4: &mut q,
        scales,
        y_out: c
            .y_out
            .then(|| MatMut::with_stride(&mut yo, c.m, c.h, c.stride).unwrap()),
    };
    let gs = match &c.gs {
        Gs::Uniform(g) => GlobalScale::Uniform(*g),
        Gs::PerRow(g) => GlobalScale::PerRow(g),
    };
    let xv = MatRef::with_stride(&x, c.m, c.h, c.stride).unwrap();
    let call = || match (isa, c.residual) {
        (None, true) => reference::add_rmsnorm_fp4quant(
            xv,
            MatMut::with_stride(&mut r, c.m, c.h, c.stride).unwrap(),
            &w,
            out,
            gs,
            &opts,
        ),
        (None, false) => reference::rmsnorm_fp4quant(xv, &w, out, gs, &opts),
        (Some(_), true) => cpu::add_rmsnorm_fp4quant(
            xv,
            MatMut::with_stride(&mut r, c.m, c.h, c.stride).unwrap(),
            &w,
            out,
            gs,
            &opts,
        ),
        (Some(_), false) => cpu::rmsnorm_fp4quant(xv, &w, out, gs, &opts),
    };
    match isa {
        Some(i) => with_isa(i, call),
        None => call(),
    }
    .unwrap();
    let bits = |v: &[T]| v.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    Outputs {
        q,
        row_major: rm,
        swizzled: sw,
        r: bits(&r),
        y_out: bits(&yo),
    }
}

fn run(c: &Case, isa: Option<Isa>) -> Outputs {
    match c.dtype {
        DType::BF16 => run_as::<bf16>(c, isa),
        DType::F16 => run_as::<f16>(c, isa),
    }
}

/// The first differing index of two slices, with both values.
fn first_diff<X: PartialEq + std::fmt::Debug + Copy>(a: &[X], b: &[X]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} vs {}", a.len(), b.len()));
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y)?;
    Some(format!("at {i}: got {:?}, want {:?}", a[i], b[i]))
}

/// The outputs that differ, each with its first difference.
fn differences<const N: usize>(parts: [(&str, Option<String>); N]) -> String {
    let d: Vec<String> = parts
        .into_iter()
        .filter_map(|(n, e)| e.map(|e| format!("{n} {e}")))
        .collect();
    d.join("; ")
}

fn check(c: &Case, what: &str) {
    let want = run(c, None);
    for isa in paths() {
        let got = run(c, Some(isa));
        if got != want {
            let d = differences([
                ("y_fp4", first_diff(&got.q, &want.q)),
                ("row-major", first_diff(&got.row_major, &want.row_major)),
                ("swizzled", first_diff(&got.swizzled, &want.swizzled)),
                ("residual", first_diff(&got.r, &want.r)),
                ("y_out", first_diff(&got.y_out, &want.y_out)),
            ]);
            panic!(
                "{} differs from the reference on {what} (M {} H {} {} {} {} residual {} y_out {} stride {} eps {} gs {:?}): {}",
                isa.name(),
                c.m,
                c.h,
                c.dtype,
                c.format,
                c.layout,
                c.residual,
                c.y_out,
                c.stride,
                c.eps,
                match &c.gs {
                    Gs::Uniform(g) => format!("{g}"),
                    Gs::PerRow(_) => "per row".into(),
                },
                d
            );
        }
    }
}

/// Value distributions of one row, as dtype bits.
#[derive(Clone, Copy, Debug)]
enum Dist {
    /// Moderate values around 1 (typical activations).
    Normal,
    /// Any finite bit pattern.
    AnyFinite,
    /// Subnormals and zeros of both signs.
    Subnormal,
    /// Mostly moderate with NaN, ±Inf, ±0, max and min sprinkled in.
    Specials,
    /// All zeros (of random sign).
    Zero,
    /// Near the dtype's largest values (x + r overflows to Inf often).
    Huge,
    /// One large value and many just below it: sums of squares whose low bits differ
    /// between orders, so that rows take the exact sum.
    NearTie,
}

const DISTS: [Dist; 7] = [
    Dist::Normal,
    Dist::AnyFinite,
    Dist::Subnormal,
    Dist::Specials,
    Dist::Zero,
    Dist::Huge,
    Dist::NearTie,
];

fn max_finite(dt: DType) -> u16 {
    match dt {
        DType::BF16 => 0x7F7F,
        DType::F16 => 0x7BFF,
    }
}

fn from_f32(dt: DType, v: f32) -> u16 {
    match dt {
        DType::BF16 => bf16::round_from_f32(v).to_bits(),
        DType::F16 => f16::round_from_f32(v).to_bits(),
    }
}

fn fill(rng: &mut StdRng, dt: DType, d: Dist, out: &mut [u16]) {
    let sign = |rng: &mut StdRng| if rng.random::<bool>() { 0x8000u16 } else { 0 };
    let mant_bits = match dt {
        DType::BF16 => 7,
        DType::F16 => 10,
    };
    let big = rng.random_range(0x1A00u16..max_finite(dt));
    for v in out.iter_mut() {
        *v = match d {
            Dist::Normal => from_f32(dt, (rng.random::<f32>() - 0.5) * 4.0),
            Dist::AnyFinite => rng.random_range(0..=max_finite(dt)) | sign(rng),
            Dist::Subnormal => rng.random_range(0..1u16 << mant_bits) | sign(rng),
            Dist::Zero => sign(rng),
            Dist::Huge => (max_finite(dt) - rng.random_range(0..64)) | sign(rng),
            Dist::NearTie => (big - rng.random_range(0..0x1A00u16.min(big))) | sign(rng),
            Dist::Specials => {
                let inf = match dt {
                    DType::BF16 => 0x7F80,
                    DType::F16 => 0x7C00,
                };
                match rng.random_range(0..24) {
                    0 => inf | 1 | rng.random_range(0..64), // NaN, various payloads
                    1 => inf | sign(rng),
                    2 => sign(rng),
                    3 => max_finite(dt) | sign(rng),
                    4 => 1 | sign(rng),
                    _ => from_f32(dt, (rng.random::<f32>() - 0.5) * 8.0),
                }
            }
        };
    }
}

fn weights(rng: &mut StdRng, dt: DType, h: usize) -> Vec<u16> {
    let mut w = vec![0u16; h];
    match rng.random_range(0..4) {
        0 => w.iter_mut().for_each(|v| *v = from_f32(dt, 1.0)),
        1 => fill(rng, dt, Dist::Normal, &mut w),
        2 => fill(rng, dt, Dist::Specials, &mut w),
        _ => fill(rng, dt, Dist::AnyFinite, &mut w),
    }
    w
}

const SPECIAL_GS: [f32; 10] = [
    1.0,
    -1.0,
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NAN,
    1e-30,
    3e38,
    f32::from_bits(1),
    2688.0,
];

fn random_case(rng: &mut StdRng, m: usize, h: usize, dt: DType) -> Case {
    let format = FORMATS[rng.random_range(0..4)];
    let h = h.div_ceil(format.block_size()) * format.block_size();
    Case {
        format,
        ..random_rows(rng, m, h, dt)
    }
}

/// Random rows of any `H` with random options (the FP4 format NVFP4; callers set theirs).
fn random_rows(rng: &mut StdRng, m: usize, h: usize, dt: DType) -> Case {
    let stride = h + if rng.random_range(0..3) == 0 {
        rng.random_range(1..40)
    } else {
        0
    };
    let len = if m == 0 { 0 } else { (m - 1) * stride + h };
    let mut x = vec![0u16; len];
    let mut r = vec![0u16; len];
    for row in 0..m {
        let (dx, dr) = (DISTS[rng.random_range(0..7)], DISTS[rng.random_range(0..7)]);
        fill(rng, dt, dx, &mut x[row * stride..row * stride + h]);
        fill(rng, dt, dr, &mut r[row * stride..row * stride + h]);
    }
    // Padding between rows is garbage that must not be read into results.
    for (i, v) in x.iter_mut().enumerate() {
        if i % stride >= h {
            *v = 0x7FC1;
        }
    }
    let gs = match rng.random_range(0..4) {
        0 => Gs::Uniform(SPECIAL_GS[rng.random_range(0..SPECIAL_GS.len())]),
        1 => Gs::PerRow(
            (0..m)
                .map(|_| match rng.random_range(0..3) {
                    0 => SPECIAL_GS[rng.random_range(0..SPECIAL_GS.len())],
                    1 => f32::from_bits(rng.random()),
                    _ => rng.random::<f32>() * 1000.0,
                })
                .collect(),
        ),
        _ => Gs::Uniform(1.0),
    };
    Case {
        m,
        h,
        dtype: dt,
        format: Fp4Format::NVFP4,
        layout: LAYOUTS[rng.random_range(0..3)],
        residual: rng.random_range(0..4) != 0,
        y_out: rng.random::<bool>(),
        stride,
        eps: [1e-6, 0.0, 1e-2, 1e-6][rng.random_range(0..4)],
        weight_bias: [0.0, 0.0, 1.0, -0.0, 0.5, -1.0][rng.random_range(0..6)],
        w: weights(rng, dt, h),
        x,
        r,
        gs,
    }
}

#[test]
fn every_path_equals_the_reference_on_random_cases() {
    let mut rng = StdRng::seed_from_u64(0x5EED_C0DE);
    let shapes = [
        (1, 16),
        (1, 32),
        (3, 48),
        (2, 80),
        (5, 144),
        (7, 1040),
        (1, 4096),
        (129, 64),
        (130, 96),
        (33, 2048),
        (2, 5120),
        (1, 8208),
    ];
    for _ in 0..12 {
        for &(m, h) in &shapes {
            for dt in [DType::BF16, DType::F16] {
                let c = random_case(&mut rng, m, h, dt);
                check(&c, "a random case");
            }
        }
    }
}

/// Every format × layout × dtype × residual × y_out on one set of mixed rows.
#[test]
fn every_path_every_pairing() {
    let mut rng = StdRng::seed_from_u64(7);
    for dt in [DType::BF16, DType::F16] {
        let base = random_case(&mut rng, 131, 224, dt);
        for format in FORMATS {
            for layout in LAYOUTS {
                for (residual, y_out) in
                    [(true, false), (true, true), (false, false), (false, true)]
                {
                    let c = Case {
                        format,
                        layout,
                        residual,
                        y_out,
                        gs: Gs::Uniform(1.0),
                        ..base.clone()
                    };
                    check(&c, "a pairing");
                }
            }
        }
    }
}

/// Rows built so that `y` lands exactly on E2M1 ties, block maxima and scale boundaries:
/// with eps 0 and a row of ±2^k, rstd is 2^-k exactly and `y = ±w`; the weights are the
/// E2M1 midpoints (and their neighbours) next to a block maximum of 6 · 2^j.
#[test]
fn every_path_on_exact_ties() {
    let ties = [
        0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.0, 0.5, 4.0, 7.0,
    ];
    for dt in [DType::BF16, DType::F16] {
        for format in FORMATS {
            let b = format.block_size();
            let h = b * 12;
            for k in [-8i32, 0, 3] {
                for j in [-2i32, 0, 1] {
                    let mut w = vec![0u16; h];
                    for (i, v) in w.iter_mut().enumerate() {
                        let blk = i / b;
                        let t = if i % b == 0 {
                            6.0
                        } else {
                            ties[(i + blk) % ties.len()]
                        };
                        let s = if (i / 3) % 2 == 0 { 1.0 } else { -1.0 };
                        *v = from_f32(dt, s * t * 2f32.powi(j));
                    }
                    let m = 3;
                    let x: Vec<u16> = (0..m * h)
                        .map(|i| from_f32(dt, if i % 5 == 0 { -1.0 } else { 1.0 } * 2f32.powi(k)))
                        .collect();
                    for layout in LAYOUTS {
                        let c = Case {
                            m,
                            h,
                            dtype: dt,
                            format,
                            layout,
                            residual: false,
                            y_out: true,
                            stride: h,
                            eps: 0.0,
                            weight_bias: 0.0,
                            x: x.clone(),
                            r: vec![0; m * h],
                            w: w.clone(),
                            gs: Gs::PerRow(vec![1.0, 0.5, 3.0]),
                        };
                        check(&c, "exact ties");
                    }
                }
            }
        }
    }
}

/// Whole rows of one special kind, each in its own call, every format.
#[test]
fn every_path_on_special_rows() {
    let mut rng = StdRng::seed_from_u64(99);
    for dt in [DType::BF16, DType::F16] {
        let inf = match dt {
            DType::BF16 => 0x7F80u16,
            DType::F16 => 0x7C00,
        };
        let rows: Vec<(&str, Vec<u16>)> = vec![
            ("zero row", vec![0; 64]),
            ("negative zero row", vec![0x8000; 64]),
            ("NaN row", vec![inf | 1; 64]),
            (
                "one NaN",
                (0..64)
                    .map(|i| if i == 17 { inf | 3 } else { 0x3C00 })
                    .collect(),
            ),
            (
                "+Inf",
                (0..64)
                    .map(|i| if i == 40 { inf } else { 0x3800 })
                    .collect(),
            ),
            (
                "±Inf",
                (0..64)
                    .map(|i| {
                        if i % 31 == 0 {
                            inf | ((i as u16 & 1) << 15)
                        } else {
                            1
                        }
                    })
                    .collect(),
            ),
            ("smallest subnormals", vec![1; 64]),
            ("max", vec![max_finite(dt); 64]),
        ];
        for (what, row) in rows {
            for format in FORMATS {
                for eps in [0.0, 1e-6] {
                    for residual in [false, true] {
                        let h = 64;
                        let m = 2;
                        let mut x = row.clone();
                        x.extend(&row);
                        let mut r = vec![0u16; m * h];
                        if residual {
                            fill(&mut rng, dt, Dist::Specials, &mut r[h..]);
                        }
                        let c = Case {
                            m,
                            h,
                            dtype: dt,
                            format,
                            layout: ScaleLayout::Both,
                            residual,
                            y_out: true,
                            stride: h,
                            eps,
                            weight_bias: if residual { 1.0 } else { 0.0 },
                            x,
                            r,
                            w: weights(&mut rng, dt, h),
                            gs: Gs::PerRow(vec![1.0, -2.0]),
                        };
                        check(&c, what);
                    }
                }
            }
        }
    }
}

/// More rows than one task holds, so several tasks run in parallel, and M not a
/// multiple of 128 (swizzle padding).
#[test]
fn every_path_on_many_rows() {
    let mut rng = StdRng::seed_from_u64(3);
    for dt in [DType::BF16, DType::F16] {
        let c = random_case(&mut rng, 301, 1024, dt);
        check(&c, "many rows");
    }
}

/// The FP8 ops' outputs of one call: codes, scales (f32 bits or UE8M0 codes, padding
/// included), the updated residual and y_out.
#[derive(Debug, PartialEq)]
struct Fp8Outputs {
    q: Vec<u8>,
    scales: Vec<u32>,
    r: Vec<u16>,
    y_out: Vec<u16>,
}

fn fp8_run_as<T: Element>(c: &Case, opts: &Fp8Options, isa: Option<Isa>) -> Fp8Outputs {
    let conv = |v: &[u16]| v.iter().map(|&b| T::from_bits(b)).collect::<Vec<T>>();
    let (x, mut r, w) = (conv(&c.x), conv(&c.r), conv(&c.w));
    let p = Fp8Problem::new(c.m, c.h, c.dtype, opts).unwrap();
    // Outputs start as garbage, so that a byte left unwritten shows.
    let mut q = vec![0xA5u8; p.q_len()];
    let mut sf = vec![f32::from_bits(0x7FA5_A5A5); p.scales_len()];
    let mut su = vec![0xA5u8; p.scales_len()];
    let mut yo = vec![T::from_bits(0x5A5A); if c.y_out { c.x.len() } else { 0 }];
    let scales = match p.scale_format() {
        None => Fp8Scales::None,
        Some(Fp8ScaleFormat::F32 { .. }) => Fp8Scales::F32(&mut sf),
        Some(Fp8ScaleFormat::UE8M0) => Fp8Scales::UE8M0(&mut su),
    };
    let out = Fp8Out {
        q: &mut q,
        scales,
        y_out: c
            .y_out
            .then(|| MatMut::with_stride(&mut yo, c.m, c.h, c.stride).unwrap()),
    };
    let xv = MatRef::with_stride(&x, c.m, c.h, c.stride).unwrap();
    let call = || match (isa, c.residual) {
        (None, true) => fp8::reference::add_rmsnorm_fp8quant(
            xv,
            MatMut::with_stride(&mut r, c.m, c.h, c.stride).unwrap(),
            &w,
            out,
            opts,
        ),
        (None, false) => fp8::reference::rmsnorm_fp8quant(xv, &w, out, opts),
        (Some(_), true) => fp8::cpu::add_rmsnorm_fp8quant(
            xv,
            MatMut::with_stride(&mut r, c.m, c.h, c.stride).unwrap(),
            &w,
            out,
            opts,
        ),
        (Some(_), false) => fp8::cpu::rmsnorm_fp8quant(xv, &w, out, opts),
    };
    match isa {
        Some(i) => with_isa(i, call),
        None => call(),
    }
    .unwrap();
    let bits = |v: &[T]| v.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    Fp8Outputs {
        q,
        scales: match p.scale_format() {
            None => Vec::new(),
            Some(Fp8ScaleFormat::F32 { .. }) => sf.iter().map(|v| v.to_bits()).collect(),
            Some(Fp8ScaleFormat::UE8M0) => su.iter().map(|&v| u32::from(v)).collect(),
        },
        r: bits(&r),
        y_out: bits(&yo),
    }
}

fn fp8_run(c: &Case, opts: &Fp8Options, isa: Option<Isa>) -> Fp8Outputs {
    match c.dtype {
        DType::BF16 => fp8_run_as::<bf16>(c, opts, isa),
        DType::F16 => fp8_run_as::<f16>(c, opts, isa),
    }
}

/// Every path of `fp8::cpu` against `fp8::reference` on one case and option set.
fn fp8_check(c: &Case, opts: &Fp8Options, what: &str) {
    let want = fp8_run(c, opts, None);
    for isa in paths() {
        let got = fp8_run(c, opts, Some(isa));
        if got != want {
            let d = differences([
                ("q", first_diff(&got.q, &want.q)),
                ("scales", first_diff(&got.scales, &want.scales)),
                ("residual", first_diff(&got.r, &want.r)),
                ("y_out", first_diff(&got.y_out, &want.y_out)),
            ]);
            panic!(
                "fp8 {} differs from the reference on {what} (M {} H {} {} {opts:?} residual {} y_out {} stride {}): {}",
                isa.name(),
                c.m,
                c.h,
                c.dtype,
                c.residual,
                c.y_out,
                c.stride,
                d
            );
        }
    }
}

/// Static scales that exercise the formula's corners: ordinary, tiny, huge, 0 (inv = Inf),
/// NaN, Inf, a subnormal.
const FP8_STATIC: [f32; 8] = [1.0, 0.5, 3e-3, 1e30, 0.0, f32::NAN, f32::INFINITY, 1e-40];

/// Every FP8 option set valid at `h` (a multiple of 128 admits them all).
fn fp8_option_sets(h: usize) -> Vec<Fp8Options> {
    let mut v = Vec::new();
    for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
        for s in FP8_STATIC {
            v.push(Fp8Options::per_tensor(element, s));
        }
        for group in [
            Fp8Group::PerToken,
            Fp8Group::G32,
            Fp8Group::G64,
            Fp8Group::G128,
        ] {
            for format in [
                Fp8ScaleFormat::F32_NO_FLOOR,
                Fp8ScaleFormat::F32 {
                    s_min: 1.0 / (448.0 * 512.0),
                },
                Fp8ScaleFormat::UE8M0,
            ] {
                for layout in Fp8ScaleLayout::ALL {
                    let o = Fp8Options::dynamic(element, group, format, layout);
                    if Fp8Problem::new(1, h, DType::BF16, &o).is_ok() {
                        v.push(o);
                    }
                }
            }
        }
    }
    v
}

/// Every FP8 option set, dtype, residual and y_out on random rows (every value
/// distribution), M not a multiple of 4 or 128 (layout padding); rows of 1056 and 1536
/// hold whole chunks of 16 groups (the AVX-512 amax tree) and a shorter last one.
#[test]
fn fp8_every_path_every_option_set() {
    let mut rng = StdRng::seed_from_u64(0xF8);
    for dt in [DType::BF16, DType::F16] {
        for (m, h) in [(5, 128), (130, 384), (5, 1056), (3, 1536)] {
            let sets = fp8_option_sets(h);
            assert!(sets.len() > 40, "{} option sets", sets.len());
            for opts in sets {
                let mut c = random_rows(&mut rng, m, h, dt);
                let opts = Fp8Options {
                    eps: c.eps,
                    weight_bias: c.weight_bias,
                    ..opts
                };
                fp8_check(&c, &opts, "an option set");
                c.residual = !c.residual;
                c.y_out = !c.y_out;
                fp8_check(&c, &opts, "an option set, the other residual and y_out");
            }
        }
    }
}

/// Shapes of models and odd ones: H not a multiple of 16 (per-token and per-tensor scales
/// take any H), one row, more rows than a task holds.
#[test]
fn fp8_every_path_on_random_shapes() {
    let mut rng = StdRng::seed_from_u64(0xF8F8);
    let shapes = [
        (1, 7),
        (3, 100),
        (2, 1000),
        (1, 4096),
        (16, 7168),
        (33, 2048),
        (301, 1024),
    ];
    for &(m, h) in &shapes {
        for dt in [DType::BF16, DType::F16] {
            let sets = fp8_option_sets(h);
            for _ in 0..3 {
                let c = random_rows(&mut rng, m, h, dt);
                let opts = sets[rng.random_range(0..sets.len())];
                let opts = Fp8Options {
                    eps: c.eps,
                    weight_bias: c.weight_bias,
                    ..opts
                };
                fp8_check(&c, &opts, "a random shape");
            }
        }
    }
}

/// A few small calls through every path, FP4 and FP8: strided rows, tails shorter than a
/// vector, every FP8 group and layout once. Small enough for Miri, which runs it with the
/// AVX2 path's target features enabled (RELIABILITY.md) to check its `unsafe` seams; Miri
/// cannot execute F16C's conversions, so there it takes bf16 rows only.
#[test]
fn every_path_on_small_cases() {
    let dtypes: &[DType] = if cfg!(miri) {
        &[DType::BF16]
    } else {
        &[DType::BF16, DType::F16]
    };
    let mut rng = StdRng::seed_from_u64(0x5A11);
    for (m, h) in [(3, 48), (2, 80)] {
        for &dt in dtypes {
            let c = random_rows(&mut rng, m, h, dt);
            check(&c, "a small case");
        }
    }
    let fp8 = [
        (1, 7, Fp8Options::per_tensor(Fp8Element::E4M3, 0.5)),
        (3, 100, Fp8Options::per_token(Fp8Element::E5M2)),
        (
            5,
            128,
            Fp8Options::dynamic(
                Fp8Element::E4M3,
                Fp8Group::G128,
                Fp8ScaleFormat::F32_NO_FLOOR,
                Fp8ScaleLayout::ColumnMajor,
            ),
        ),
        (
            2,
            128,
            Fp8Options::dynamic(
                Fp8Element::E4M3,
                Fp8Group::G64,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::RowMajor,
            ),
        ),
        (3, 96, Fp8Options::mxfp8()),
    ];
    for (m, h, opts) in fp8 {
        for &dt in dtypes {
            let c = random_rows(&mut rng, m, h, dt);
            let opts = Fp8Options {
                eps: c.eps,
                weight_bias: c.weight_bias,
                ..opts
            };
            fp8_check(&c, &opts, "a small case");
        }
    }
}

#[cfg(all(target_arch = "x86_64", fp4norm_simd))]
mod lanes {
    //! The SIMD lane functions against the scalar codecs, over every input.
    use super::*;
    use crate::codec::e2m1_encode;
    use crate::cpu::x86::{avx2, avx512};
    use crate::reference::block_scale;
    use rayon::prelude::*;

    /// The lane functions of one path, as plain function pointers.
    struct Lanes {
        isa: Isa,
        e2m1: unsafe fn(&[f32; 16], &mut [u8; 16]),
        pack: unsafe fn(&[u8; 16]) -> [u8; 8],
        round_bf16: unsafe fn(&[f32; 16], &mut [bf16; 16], &mut [f32; 16]),
        round_f16: unsafe fn(&[f32; 16], &mut [f16; 16], &mut [f32; 16]),
        widen_bf16: unsafe fn(&[bf16; 16], &mut [f32; 16]),
        widen_f16: unsafe fn(&[f16; 16], &mut [f32; 16]),
        scales: unsafe fn(Fp4Format, &[u32; 16], f32, &mut [u8; 16], &mut [f32; 16]),
    }

    fn simd_paths() -> Vec<Lanes> {
        let mut v = Vec::new();
        macro_rules! lanes {
            ($isa:expr, $m:ident) => {
                Lanes {
                    isa: $isa,
                    e2m1: $m::lanes::e2m1_x16,
                    pack: $m::lanes::pack_x16,
                    round_bf16: $m::lanes::round_x16::<bf16>,
                    round_f16: $m::lanes::round_x16::<f16>,
                    widen_bf16: $m::lanes::widen_x16::<bf16>,
                    widen_f16: $m::lanes::widen_x16::<f16>,
                    scales: $m::lanes::scales_x16,
                }
            };
        }
        for isa in paths() {
            match isa {
                Isa::Avx512 => v.push(lanes!(Isa::Avx512, avx512)),
                Isa::Avx2 => v.push(lanes!(Isa::Avx2, avx2)),
                Isa::Portable => {}
            }
        }
        v
    }

    /// Runs `f` on every 16-value chunk of `0..n` (bit patterns), in parallel.
    fn sweep(n: u64, f: impl Fn(u32) + Sync) {
        (0..n / 16).into_par_iter().for_each(|c| f((c * 16) as u32));
    }

    #[test]
    fn e2m1_every_f32() {
        let ls = simd_paths();
        sweep(1 << 32, |base| {
            let v: [f32; 16] = std::array::from_fn(|i| f32::from_bits(base + i as u32));
            let want: [u8; 16] = std::array::from_fn(|i| e2m1_encode(v[i]));
            for l in &ls {
                let mut got = [0u8; 16];
                // SAFETY: simd_paths lists supported paths only.
                unsafe { (l.e2m1)(&v, &mut got) };
                assert_eq!(got, want, "{} e2m1 of {base:#x}..+16", l.isa.name());
            }
        });
    }

    #[test]
    fn nibble_packing() {
        for l in simd_paths() {
            for lo in 0u8..16 {
                for hi in 0u8..16 {
                    for pos in 0..8 {
                        let mut c: [u8; 16] = std::array::from_fn(|i| ((i * 7 + pos) % 16) as u8);
                        c[2 * pos] = lo;
                        c[2 * pos + 1] = hi;
                        // SAFETY: supported path.
                        let got = unsafe { (l.pack)(&c) };
                        let want: [u8; 8] = std::array::from_fn(|j| c[2 * j] | (c[2 * j + 1] << 4));
                        assert_eq!(got, want, "{}", l.isa.name());
                    }
                }
            }
        }
    }

    /// The AVX-512 packer of four vectors: every nibble pair at every position.
    #[test]
    fn nibble_packing_x64() {
        if !Isa::Avx512.supported() {
            return eprintln!("SKIPPED: no AVX-512");
        }
        for lo in 0u8..16 {
            for hi in 0u8..16 {
                for pos in 0..32 {
                    let mut c: [u8; 64] =
                        std::array::from_fn(|i| ((i * 5 + pos + lo as usize) % 16) as u8);
                    c[2 * pos] = lo;
                    c[2 * pos + 1] = hi;
                    // SAFETY: AVX-512 checked above.
                    let got = unsafe { avx512::lanes::pack_x64(&c) };
                    let want: [u8; 32] = std::array::from_fn(|j| c[2 * j] | (c[2 * j + 1] << 4));
                    assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn dtype_rounding_every_f32() {
        let ls = simd_paths();
        sweep(1 << 32, |base| {
            let v: [f32; 16] = std::array::from_fn(|i| f32::from_bits(base + i as u32));
            let wb: [bf16; 16] = std::array::from_fn(|i| bf16::round_from_f32(v[i]));
            let wh: [f16; 16] = std::array::from_fn(|i| f16::round_from_f32(v[i]));
            let wbb: [f32; 16] = std::array::from_fn(|i| wb[i].to_f32());
            let whb: [f32; 16] = std::array::from_fn(|i| Element::to_f32(wh[i]));
            for l in &ls {
                let (mut b, mut bb) = ([bf16::ZERO; 16], [0f32; 16]);
                let (mut h, mut hb) = ([f16::ZERO; 16], [0f32; 16]);
                // SAFETY: supported path.
                unsafe {
                    (l.round_bf16)(&v, &mut b, &mut bb);
                    (l.round_f16)(&v, &mut h, &mut hb);
                }
                let n = l.isa.name();
                assert!(
                    b.iter().zip(&wb).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{n} bf16 {base:#x}"
                );
                assert!(
                    h.iter().zip(&wh).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{n} f16 {base:#x}"
                );
                assert!(
                    bb.iter().zip(&wbb).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{n} bf16 value {base:#x}"
                );
                assert!(
                    hb.iter().zip(&whb).all(|(g, w)| g.to_bits() == w.to_bits()),
                    "{n} f16 value {base:#x}"
                );
            }
        });
    }

    /// Widening is exact; a NaN may come back with another payload (`vcvtph2ps` quiets
    /// signalling NaNs), which no output can show: every use of a NaN `h` (the sum of
    /// squares, `y`, amax, the codes) depends only on its being NaN, and `RNdt` writes
    /// the canonical NaN.
    #[test]
    fn widening_every_value() {
        for l in simd_paths() {
            for base in (0..=u16::MAX).step_by(16) {
                let b: [bf16; 16] = std::array::from_fn(|i| bf16::from_bits(base + i as u16));
                let h: [f16; 16] = std::array::from_fn(|i| f16::from_bits(base + i as u16));
                let (mut fb, mut fh) = ([0f32; 16], [0f32; 16]);
                // SAFETY: supported path.
                unsafe {
                    (l.widen_bf16)(&b, &mut fb);
                    (l.widen_f16)(&h, &mut fh);
                }
                for i in 0..16 {
                    for (got, want) in [(fb[i], b[i].to_f32()), (fh[i], Element::to_f32(h[i]))] {
                        if want.is_nan() {
                            assert!(got.is_nan(), "{} {:#x}", l.isa.name(), base + i as u16);
                        } else {
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} {:#x}",
                                l.isa.name(),
                                base + i as u16
                            );
                        }
                    }
                }
            }
        }
    }

    /// The scalar scales of 16 amaxes, checked against every path.
    fn check_scales(ls: &[Lanes], format: Fp4Format, gs: f32, amax: &[u32; 16]) {
        let want: [(u8, f32); 16] =
            std::array::from_fn(|i| block_scale(format, f32::from_bits(amax[i]), gs));
        for l in ls {
            let (mut codes, mut inv) = ([0u8; 16], [0f32; 16]);
            // SAFETY: supported path.
            unsafe { (l.scales)(format, amax, gs, &mut codes, &mut inv) };
            for i in 0..16 {
                let (c, v) = want[i];
                let same_inv = v.to_bits() == inv[i].to_bits() || (v.is_nan() && inv[i].is_nan());
                assert!(
                    codes[i] == c && same_inv,
                    "{} {format} gs {gs}: amax {:#x} gives ({:#x}, {:e}), want ({c:#x}, {v:e})",
                    l.isa.name(),
                    amax[i],
                    codes[i],
                    inv[i]
                );
            }
        }
    }

    /// Every amax (|y|'s bits: every nonnegative f32 and NaN) for both scale formats at
    /// gs = 1; other global scales on a strided sweep of every exponent and on every
    /// amax whose scale `gs · amax / 6` lands in E4M3's subnormal-to-normal range.
    #[test]
    fn block_scales_every_amax() {
        let ls = simd_paths();
        for format in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
            sweep(1 << 31, |base| {
                check_scales(&ls, format, 1.0, &std::array::from_fn(|i| base + i as u32));
            });
        }
        let gss = [
            -1.0,
            0.0,
            -0.0,
            2.0,
            0.37,
            1e-30,
            3e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            448.0 * 6.0,
            1.0 / 2688.0,
        ];
        for gs in gss {
            sweep(1 << 27, |c| {
                // A chunk of 16 consecutive amaxes every 2^9 patterns across the range.
                let base = c << 4;
                check_scales(
                    &ls,
                    Fp4Format::NVFP4,
                    gs,
                    &std::array::from_fn(|i| base + i as u32),
                );
            });
        }
    }
}
