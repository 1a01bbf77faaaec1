//! Property tests of the FP8 ops (SPEC.md §8): over random shapes (odd M included),
//! strides, dtypes, element formats, every scaling mode and layout, s_min floors, weight
//! biases, eps and value distributions (special values included), `fp8::cpu` equals
//! `fp8::reference` byte for byte in every output — codes, scales, y_out, the updated
//! residual — and both equal an independent model of the spec written here (f64 where it
//! is exact, the SPEC formulas step by step, the codecs of `common` / `fp8_common`).
//! Outputs are poisoned before each call (two poisons for cpu), stride gaps must stay
//! untouched and layout padding must be 0. `fp8::dequantize` is checked against the
//! model's §8 formula, and the normalised values of every FP8 mode against the FP4 op's
//! `y_out` (§8's first paragraph).
//!
//! The case count defaults to a CI-friendly value; set PROPTEST_CASES to run more.

mod common;
mod fp8_common;

use common::{
    e4m3_oracle, e4m3_value, spec_swizzled_len, spec_swizzled_offset, ue8m0_oracle, Tables,
};
use fp4norm::fp8::{
    self, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scales,
    Fp8ScalesIn, Fp8Scaling,
};
use fp4norm::{
    reference, DType, Element, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef, Options, ScaleOut,
};
use fp8_common::{e5m2_oracle, e5m2_value, fsum, matrix, weights, Dt, E5m2Table};
use half::{bf16, f16};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------

/// Static scales, including ones a caller should not pass (0, negative, NaN, Inf, a
/// subnormal whose inverse overflows): they flow through `inv = RN32(1/s)`.
const S_VALUES: [f32; 14] = [
    1.0,
    0.5,
    2.5,
    1.0 / 448.0,
    1e-3,
    3e-5,
    100.0,
    0.0,
    -2.0,
    f32::NAN,
    f32::INFINITY,
    1e-40,
    1e30,
    1.0 / 57344.0,
];
const S_MIN_VALUES: [f32; 6] = [0.0, 1.0 / (448.0 * 512.0), 1e-3, 1e-40, 1.0, -0.0];
const EPS_VALUES: [f32; 7] = [0.0, 1e-6, 1e-5, 1e-40, 0.5, 1e30, f32::MAX];
const BIAS_VALUES: [f32; 8] = [0.0, -0.0, 1.0, 0.5, -1.0, 1e-3, 33554432.0, -3.0e38];

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    opts: Fp8Options,
    m: usize,
    h: usize,
    x_pad: usize,
    r_pad: usize,
    y_pad: usize,
    tail: usize,
    residual: bool,
    y_out: bool,
    seed: u64,
}

fn pad() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 1 => 1..40usize]
}

/// Scaling modes: per tensor (a value of S_VALUES), or dynamic with any group, f32 (a
/// floor of S_MIN_VALUES) or UE8M0 scales, and a layout (swizzled or packed where allowed).
fn scaling() -> impl Strategy<Value = Fp8Scaling> {
    prop_oneof![
        1 => (0..S_VALUES.len()).prop_map(|i| Fp8Scaling::PerTensor(S_VALUES[i])),
        3 => (0..4usize, any::<bool>(), 0..S_MIN_VALUES.len(), 0..4usize).prop_map(
            |(g, ue8m0, s_min, layout)| Fp8Scaling::Dynamic {
                group: Fp8Group::ALL[g],
                format: if ue8m0 {
                    Fp8ScaleFormat::UE8M0
                } else {
                    Fp8ScaleFormat::F32 { s_min: S_MIN_VALUES[s_min] }
                },
                layout: Fp8ScaleLayout::ALL[layout],
            }
        ),
    ]
}

/// `max_m`: rows up to this; `max_k`: H = G · k with k < max_k (any H < 8 · max_k for
/// per-token and per-tensor scales).
fn case_strategy(max_m: usize, max_k: usize) -> impl Strategy<Value = Case> {
    (
        (any::<bool>(), any::<bool>(), scaling()),
        prop_oneof![3 => 0..8usize, 2 => 0..max_m],
        1..max_k,
        (pad(), pad(), pad(), 0..4usize),
        (any::<bool>(), any::<bool>()),
        prop_oneof![2 => Just(1e-6f32), 3 => (0..EPS_VALUES.len()).prop_map(|i| EPS_VALUES[i])],
        prop_oneof![2 => Just(0.0f32), 2 => (0..BIAS_VALUES.len()).prop_map(|i| BIAS_VALUES[i])],
        any::<u64>(),
    )
        .prop_map(
            move |(
                (f16_, e5m2, mut scaling),
                m,
                k,
                (x_pad, r_pad, y_pad, tail),
                (residual, y_out),
                eps,
                bias,
                seed,
            )| {
                let element = if e5m2 {
                    Fp8Element::E5M2
                } else {
                    Fp8Element::E4M3
                };
                let h = match scaling {
                    Fp8Scaling::Dynamic {
                        group: Fp8Group::G32,
                        ..
                    } => 32 * k,
                    Fp8Scaling::Dynamic {
                        group: Fp8Group::G64,
                        ..
                    } => 64 * k,
                    Fp8Scaling::Dynamic {
                        group: Fp8Group::G128,
                        ..
                    } => 128 * k,
                    // Any H: odd, tails of the 8-wide sum, and multiples of 32.
                    _ => {
                        if seed % 3 == 0 {
                            32 * k
                        } else {
                            (seed as usize >> 8) % (8 * max_k) + 1
                        }
                    }
                };
                // The swizzled layout needs UE8M0 in groups of 32, the packed one UE8M0 in
                // groups of 32, 64 or 128: elsewhere, column-major.
                if let Fp8Scaling::Dynamic {
                    group,
                    format,
                    layout,
                } = &mut scaling
                {
                    let g = group.size(h);
                    let ue8m0 = *format == Fp8ScaleFormat::UE8M0;
                    if (*layout == Fp8ScaleLayout::Swizzled && (!ue8m0 || g != 32))
                        || (*layout == Fp8ScaleLayout::ColumnMajorPacked
                            && (!ue8m0 || *group == Fp8Group::PerToken))
                    {
                        *layout = Fp8ScaleLayout::ColumnMajor;
                    }
                }
                Case {
                    dtype: if f16_ { DType::F16 } else { DType::BF16 },
                    opts: Fp8Options {
                        element,
                        scaling,
                        eps,
                        weight_bias: bias,
                    },
                    m,
                    h,
                    x_pad,
                    r_pad,
                    y_pad,
                    tail,
                    residual,
                    y_out,
                    seed,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------
// The spec model (SPEC.md §1 steps 1–4, §8) on raw bits
// ---------------------------------------------------------------------------------------

struct Codecs {
    e4m3: Tables,
    e5m2: E5m2Table,
}

impl Codecs {
    fn encode(&self, e: Fp8Element, v: f32) -> u8 {
        match e {
            Fp8Element::E4M3 => e4m3_oracle(&self.e4m3, v),
            Fp8Element::E5M2 => e5m2_oracle(&self.e5m2, v),
        }
    }
}

fn value(e: Fp8Element, code: u8) -> f32 {
    match e {
        Fp8Element::E4M3 => e4m3_value(code),
        Fp8Element::E5M2 => e5m2_value(code),
    }
}

fn fmax(e: Fp8Element) -> f64 {
    match e {
        Fp8Element::E4M3 => 448.0,
        Fp8Element::E5M2 => 57344.0,
    }
}

/// `RN32(a · b)` of two f32: the product is exact in f64 (24 + 24 bits), then rounded once.
fn mul32(a: f32, b: f32) -> f32 {
    (a as f64 * b as f64) as f32
}

/// `RN32(a / b)`: the f64 quotient rounded to f32 is correctly rounded (53 ≥ 2·24 + 2).
fn div32(a: f32, b: f64) -> f32 {
    (a as f64 / b) as f32
}

/// Where scale `(row, g)` goes, from the layout definitions of SPEC.md §8 / §3.
fn scale_at(layout: Fp8ScaleLayout, m: usize, n: usize, row: usize, g: usize) -> usize {
    match layout {
        Fp8ScaleLayout::RowMajor => row * n + g,
        Fp8ScaleLayout::ColumnMajor => g * (4 * m.div_ceil(4)) + row,
        Fp8ScaleLayout::Swizzled => spec_swizzled_offset(row, g, n),
        // Words of four codes, groups 4j .. 4j + 3 of a row in word j · Mp4 + row, byte g % 4.
        Fp8ScaleLayout::ColumnMajorPacked => {
            let word = (g / 4) * (4 * m.div_ceil(4)) + row;
            word * 4 + g % 4
        }
    }
}

fn scales_len(layout: Fp8ScaleLayout, m: usize, n: usize) -> usize {
    match layout {
        Fp8ScaleLayout::RowMajor => m * n,
        Fp8ScaleLayout::ColumnMajor => 4 * m.div_ceil(4) * n,
        Fp8ScaleLayout::Swizzled => spec_swizzled_len(m, n),
        Fp8ScaleLayout::ColumnMajorPacked => n.div_ceil(4) * (4 * m.div_ceil(4)) * 4,
    }
}

/// The group size and count of a case (`None` for a per-tensor scale).
fn groups(c: &Case) -> Option<(usize, usize)> {
    match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => None,
        Fp8Scaling::Dynamic { group, .. } => {
            let g = match group {
                Fp8Group::PerToken => c.h,
                Fp8Group::G32 => 32,
                Fp8Group::G64 => 64,
                Fp8Group::G128 => 128,
            };
            Some((g, c.h / g))
        }
    }
}

#[derive(Debug)]
struct Outputs {
    residual: Vec<u16>,
    y_out: Vec<u16>,
    q: Vec<u8>,
    /// f32 scale bits, or UE8M0 codes widened; empty for a per-tensor scale.
    scales: Vec<u32>,
}

fn model(c: &Case, k: &Codecs, x: &[u16], r0: &[u16], w: &[u16], y0: &[u16]) -> Outputs {
    let dt = Dt(c.dtype);
    let (m, h) = (c.m, c.h);
    let (xs, rs, ys) = (h + c.x_pad, h + c.r_pad, h + c.y_pad);
    let e = c.opts.element;
    let mut residual = r0.to_vec();
    let mut y_out = y0.to_vec();
    let mut q = vec![0u8; m * h];
    let mut scales = match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => Vec::new(),
        Fp8Scaling::Dynamic { layout, .. } => {
            vec![0u32; scales_len(layout, m, groups(c).unwrap().1)]
        }
    };
    // w'_i = RN32(f32(w_i) + bias), the f64 sum rounded once; a zero bias adds nothing
    // (the reading of SPEC.md §8's "also for −0 weights").
    let b = c.opts.weight_bias;
    let wb: Vec<f32> = w
        .iter()
        .map(|&wi| {
            let wf = dt.to_f32(wi);
            if b == 0.0 {
                wf
            } else {
                (wf as f64 + b as f64) as f32
            }
        })
        .collect();
    let mut hv = vec![0u16; h];
    let mut y = vec![0f32; h];
    for row in 0..m {
        // 1. h = RNdt(RN32(x + r)) (the f64 sum of two dtype values is exact); r ← h.
        for i in 0..h {
            let xi = x[row * xs + i];
            hv[i] = if c.residual {
                let s = (dt.to_f32(xi) as f64 + dt.to_f32(residual[row * rs + i]) as f64) as f32;
                let v = dt.rn(s);
                residual[row * rs + i] = v;
                v
            } else {
                xi
            };
        }
        // 2.–3. ss exact (Shewchuk), rstd = RN32(1/sqrt(ss/H + eps)) in f64.
        let ss = fsum(hv.iter().map(|&v| dt.to_f32(v) as f64).map(|v| v * v));
        let rstd = (1.0 / (ss / h as f64 + c.opts.eps as f64).sqrt()) as f32;
        // 4. y = RN32(RN32(h · rstd) · w').
        for i in 0..h {
            y[i] = mul32(mul32(dt.to_f32(hv[i]), rstd), wb[i]);
            if c.y_out {
                y_out[row * ys + i] = dt.rn(y[i]);
            }
        }
        match c.opts.scaling {
            Fp8Scaling::PerTensor(s) => {
                let inv = (1.0 / s as f64) as f32;
                for i in 0..h {
                    q[row * h + i] = k.encode(e, mul32(y[i], inv));
                }
            }
            Fp8Scaling::Dynamic { format, layout, .. } => {
                let (g, n) = groups(c).unwrap();
                for grp in 0..n {
                    let yg = &y[grp * g..(grp + 1) * g];
                    let amax = if yg.iter().any(|v| v.is_nan()) {
                        f32::NAN
                    } else {
                        yg.iter().map(|v| v.abs()).fold(0f32, f32::max)
                    };
                    let v = div32(amax, fmax(e));
                    let (stored, inv) = match format {
                        Fp8ScaleFormat::F32 { s_min } => {
                            let s = if v < s_min { s_min } else { v };
                            let inv = if s == 0.0 {
                                0.0
                            } else {
                                (1.0 / s as f64) as f32
                            };
                            // A NaN scale is written as the canonical 0x7FFFFFFF.
                            let bits = if s.is_nan() { 0x7FFF_FFFF } else { s.to_bits() };
                            (bits, inv)
                        }
                        Fp8ScaleFormat::UE8M0 => {
                            let code = ue8m0_oracle(v);
                            let inv = if code == 255 {
                                f32::NAN
                            } else {
                                2f64.powi(127 - code as i32) as f32
                            };
                            (code as u32, inv)
                        }
                    };
                    scales[scale_at(layout, m, n, row, grp)] = stored;
                    for i in 0..g {
                        q[row * h + grp * g + i] = k.encode(e, mul32(yg[i], inv));
                    }
                }
            }
        }
    }
    Outputs {
        residual,
        y_out,
        q,
        scales,
    }
}

// ---------------------------------------------------------------------------------------
// Running the library
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Backend {
    Reference,
    Cpu,
}

fn run_lib<T: Element>(
    c: &Case,
    be: Backend,
    poison: u8,
    x: &[u16],
    r0: &[u16],
    w: &[u16],
    y0: &[u16],
) -> Outputs {
    let (m, h) = (c.m, c.h);
    let tt = |v: &[u16]| -> Vec<T> { v.iter().map(|&b| T::from_bits(b)).collect() };
    let (x, w, mut r, mut yo) = (tt(x), tt(w), tt(r0), tt(y0));
    let mut q = vec![poison; m * h];
    let n_scales = match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => 0,
        Fp8Scaling::Dynamic { layout, .. } => scales_len(layout, m, groups(c).unwrap().1),
    };
    let mut sf = vec![f32::from_bits(u32::from_ne_bytes([poison; 4])); n_scales];
    let mut su = vec![poison; n_scales];
    let scales = match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => Fp8Scales::None,
        Fp8Scaling::Dynamic {
            format: Fp8ScaleFormat::UE8M0,
            ..
        } => Fp8Scales::UE8M0(&mut su),
        Fp8Scaling::Dynamic { .. } => Fp8Scales::F32(&mut sf),
    };
    let y_out = c
        .y_out
        .then(|| MatMut::with_stride(&mut yo[..], m, h, h + c.y_pad).unwrap());
    let out = Fp8Out {
        q: &mut q,
        scales,
        y_out,
    };
    let xv = MatRef::with_stride(&x, m, h, h + c.x_pad).unwrap();
    let res = if c.residual {
        let rv = MatMut::with_stride(&mut r[..], m, h, h + c.r_pad).unwrap();
        match be {
            Backend::Reference => fp8::reference::add_rmsnorm_fp8quant(xv, rv, &w, out, &c.opts),
            Backend::Cpu => fp8::cpu::add_rmsnorm_fp8quant(xv, rv, &w, out, &c.opts),
        }
    } else {
        match be {
            Backend::Reference => fp8::reference::rmsnorm_fp8quant(xv, &w, out, &c.opts),
            Backend::Cpu => fp8::cpu::rmsnorm_fp8quant(xv, &w, out, &c.opts),
        }
    };
    res.unwrap_or_else(|e| panic!("{be:?} failed on a valid case: {e}"));
    let bits = |v: &[T]| -> Vec<u16> { v.iter().map(|t| t.to_bits()).collect() };
    let scales = match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => Vec::new(),
        Fp8Scaling::Dynamic {
            format: Fp8ScaleFormat::UE8M0,
            ..
        } => su.iter().map(|&b| b as u32).collect(),
        Fp8Scaling::Dynamic { .. } => sf.iter().map(|v| v.to_bits()).collect(),
    };
    Outputs {
        residual: bits(&r),
        y_out: bits(&yo),
        q,
        scales,
    }
}

fn first_diff<X: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[X],
    want: &[X],
) -> Result<(), TestCaseError> {
    if got.len() != want.len() {
        return Err(TestCaseError::fail(format!(
            "{what}: length {} vs {}",
            got.len(),
            want.len()
        )));
    }
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        return Err(TestCaseError::fail(format!(
            "{what}: first difference at index {i}: got {:x?}, expected {:x?}",
            got[i], want[i]
        )));
    }
    Ok(())
}

fn compare(tag: &str, got: &Outputs, want: &Outputs) -> Result<(), TestCaseError> {
    first_diff(&format!("{tag}: residual"), &got.residual, &want.residual)?;
    first_diff(&format!("{tag}: y_out"), &got.y_out, &want.y_out)?;
    first_diff(&format!("{tag}: q"), &got.q, &want.q)?;
    first_diff(&format!("{tag}: scales"), &got.scales, &want.scales)?;
    Ok(())
}

struct Inputs {
    x: Vec<u16>,
    r0: Vec<u16>,
    w: Vec<u16>,
    y0: Vec<u16>,
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = StdRng::seed_from_u64(c.seed);
    let dt = Dt(c.dtype);
    let x = matrix(&mut rng, dt, c.m, c.h, c.x_pad, c.tail);
    let r0 = if c.residual {
        matrix(&mut rng, dt, c.m, c.h, c.r_pad, c.tail)
    } else {
        Vec::new()
    };
    let w = weights(&mut rng, dt, c.h);
    let y0 = if c.y_out {
        let mut y = matrix(&mut rng, dt, c.m, c.h, c.y_pad, c.tail);
        for row in 0..c.m {
            let s = row * (c.h + c.y_pad);
            y[s..s + c.h].fill(0xAAAA);
        }
        y
    } else {
        Vec::new()
    };
    Inputs { x, r0, w, y0 }
}

fn check_case(c: &Case) -> Result<(), TestCaseError> {
    let k = Codecs {
        e4m3: Tables::new(),
        e5m2: E5m2Table::new(),
    };
    let Inputs { x, r0, w, y0 } = inputs(c);
    let want = model(c, &k, &x, &r0, &w, &y0);
    let run = |be, poison| match c.dtype {
        DType::BF16 => run_lib::<bf16>(c, be, poison, &x, &r0, &w, &y0),
        DType::F16 => run_lib::<f16>(c, be, poison, &x, &r0, &w, &y0),
    };
    let reference = run(Backend::Reference, 0xAA);
    let cpu_a = run(Backend::Cpu, 0xAA);
    let cpu_b = run(Backend::Cpu, 0x55);
    compare("cpu (poison 0xAA) vs reference", &cpu_a, &reference)?;
    compare("cpu (poison 0x55) vs reference", &cpu_b, &reference)?;
    compare("reference vs spec model", &reference, &want)?;

    // Padding is 0 (the model writes 0 there too; spelled out for clarity).
    if let (Fp8Scaling::Dynamic { layout, .. }, Some((_, n))) = (c.opts.scaling, groups(c)) {
        let mut used = vec![false; want.scales.len()];
        for row in 0..c.m {
            for g in 0..n {
                used[scale_at(layout, c.m, n, row, g)] = true;
            }
        }
        for (i, (&v, &u)) in cpu_a.scales.iter().zip(&used).enumerate() {
            prop_assert!(u || v == 0, "scale padding {i} is {v:#x}");
        }
    }

    // Dequantisation: RN32(fp8_value(q) · scale), the static s for a per-tensor scale;
    // NaN as 0x7FFFFFFF.
    let mut deq = vec![0f32; c.m * c.h];
    let sf: Vec<f32> = want.scales.iter().map(|&b| f32::from_bits(b)).collect();
    let su: Vec<u8> = want.scales.iter().map(|&b| b as u8).collect();
    let scales_in = match c.opts.scaling {
        Fp8Scaling::PerTensor(_) => Fp8ScalesIn::None,
        Fp8Scaling::Dynamic {
            format: Fp8ScaleFormat::UE8M0,
            ..
        } => Fp8ScalesIn::UE8M0(&su),
        Fp8Scaling::Dynamic { .. } => Fp8ScalesIn::F32(&sf),
    };
    fp8::dequantize(c.m, c.h, &c.opts, &want.q, scales_in, &mut deq).unwrap();
    for (i, d) in deq.iter().enumerate() {
        let (row, col) = (i / c.h, i % c.h);
        let scale = match (c.opts.scaling, groups(c)) {
            (Fp8Scaling::PerTensor(s), _) => s,
            (Fp8Scaling::Dynamic { format, layout, .. }, Some((g, n))) => {
                let stored = want.scales[scale_at(layout, c.m, n, row, col / g)];
                match format {
                    Fp8ScaleFormat::F32 { .. } => f32::from_bits(stored),
                    Fp8ScaleFormat::UE8M0 if stored == 255 => f32::NAN,
                    Fp8ScaleFormat::UE8M0 => 2f64.powi(stored as i32 - 127) as f32,
                }
            }
            _ => unreachable!(),
        };
        let v = mul32(value(c.opts.element, want.q[i]), scale);
        let v = if v.is_nan() { 0x7FFF_FFFF } else { v.to_bits() };
        prop_assert_eq!(d.to_bits(), v, "dequantize at {}", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), max_shrink_iters: 512, ..ProptestConfig::default() })]

    /// The broad property: M < 300 (several tasks, swizzled row tiles, odd M), H = G · k
    /// (k < 40), any H < 320 for per-token and per-tensor scales.
    #[test]
    fn fp8_cpu_equals_reference_equals_spec(c in case_strategy(300, 40)) {
        check_case(&c)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(512), max_shrink_iters: 1024, ..ProptestConfig::default() })]

    /// Many small cases: M < 8 mostly, H ≤ 4 groups, where special values dominate rows.
    #[test]
    fn fp8_small_shapes_cpu_equals_reference_equals_spec(c in case_strategy(20, 5)) {
        check_case(&c)?;
    }
}

// ---------------------------------------------------------------------------------------
// One y across the family (SPEC.md §8, first paragraph)
// ---------------------------------------------------------------------------------------

/// The FP4 reference's `y_out` and updated residual for the same inputs, with weights `w`.
fn fp4_y_out<T: Element>(
    c: &Case,
    fp4: Fp4Format,
    x: &[u16],
    r0: &[u16],
    w: &[u16],
) -> (Vec<u16>, Vec<u16>) {
    let (m, h) = (c.m, c.h);
    let tt = |v: &[u16]| -> Vec<T> { v.iter().map(|&b| T::from_bits(b)).collect() };
    let (x, w, mut r) = (tt(x), tt(w), tt(r0));
    let mut yo = vec![T::from_bits(0xAAAA); m * h];
    let mut q = vec![0u8; m * h / 2];
    let mut sf = vec![0u8; m * (h / fp4.block_size())];
    let out = Fp4Out {
        y_fp4: &mut q,
        scales: ScaleOut::RowMajor(&mut sf),
        y_out: Some(MatMut::new(&mut yo, m, h).unwrap()),
    };
    let xv = MatRef::with_stride(&x, m, h, h + c.x_pad).unwrap();
    let opts = Options::default().with_format(fp4).with_eps(c.opts.eps);
    if c.residual {
        let rv = MatMut::with_stride(&mut r[..], m, h, h + c.r_pad).unwrap();
        reference::add_rmsnorm_fp4quant(xv, rv, &w, out, GlobalScale::Uniform(1.0), &opts).unwrap();
    } else {
        reference::rmsnorm_fp4quant(xv, &w, out, GlobalScale::Uniform(1.0), &opts).unwrap();
    }
    let bits = |v: &[T]| -> Vec<u16> { v.iter().map(|t| t.to_bits()).collect() };
    (bits(&yo), bits(&r))
}

/// The FP8 ops' `y_out` (contiguous here) and residual equal the FP4 op's, for every
/// FP8 mode and both backends: with weight bias 0 on the same weights, and with weight
/// bias 1 against the FP4 op on `w + 1` (weights k/8 whose `w + 1` is exact in the dtype).
fn check_family(c: &Case) -> Result<(), TestCaseError> {
    let c = Case {
        y_pad: 0,
        ..c.clone()
    };
    let Inputs { x, r0, mut w, .. } = inputs(&c);
    let dt = Dt(c.dtype);
    let y0 = vec![0xAAAAu16; c.m * c.h];
    let fp4 = if c.seed % 2 == 0 {
        Fp4Format::NVFP4
    } else {
        Fp4Format::MXFP4
    };
    let mut w_fp4 = w.clone();
    if c.opts.weight_bias != 0.0 {
        let mut rng = StdRng::seed_from_u64(c.seed ^ 0x5EED);
        for (wi, wf) in w.iter_mut().zip(w_fp4.iter_mut()) {
            let k = rng.random_range(-16i32..=16) as f32 / 8.0;
            *wi = dt.rn(k);
            *wf = dt.rn(k + 1.0);
            prop_assert_eq!(dt.to_f32(*wf), k + 1.0);
        }
    }
    let opts = Fp8Options {
        weight_bias: if c.opts.weight_bias != 0.0 {
            1.0
        } else {
            c.opts.weight_bias
        },
        ..c.opts
    };
    let c = Case {
        opts,
        y_out: true,
        ..c
    };
    let (want_y, want_r) = match c.dtype {
        DType::BF16 => fp4_y_out::<bf16>(&c, fp4, &x, &r0, &w_fp4),
        DType::F16 => fp4_y_out::<f16>(&c, fp4, &x, &r0, &w_fp4),
    };
    for be in [Backend::Reference, Backend::Cpu] {
        let got = match c.dtype {
            DType::BF16 => run_lib::<bf16>(&c, be, 0x33, &x, &r0, &w, &y0),
            DType::F16 => run_lib::<f16>(&c, be, 0x33, &x, &r0, &w, &y0),
        };
        first_diff(&format!("{be:?}: y_out vs FP4 {fp4}"), &got.y_out, &want_y)?;
        first_diff(
            &format!("{be:?}: residual vs FP4 {fp4}"),
            &got.residual,
            &want_r,
        )?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), max_shrink_iters: 512, ..ProptestConfig::default() })]

    /// H a multiple of 32 (what both FP4 formats accept; the group modes already are),
    /// every FP8 mode.
    #[test]
    fn fp8_y_equals_fp4_y_out(c in case_strategy(140, 12)) {
        let h = c.h.div_ceil(32) * 32;
        check_family(&Case { h, ..c })?;
    }
}
