//! Property tests: over random shapes, strides, dtypes, formats, layouts, options and
//! value distributions (special values included), `cpu::` equals `reference::` byte for
//! byte in every output — packed FP4, both scale layouts, y_out, the updated residual —
//! and both equal an independent model of SPEC.md §1 written here (with the `common`
//! codecs, not `fp4norm::codec`). Stride gaps must be left untouched and swizzled padding
//! must be zero; outputs are poisoned before each call, with two different poisons for
//! `cpu`, so every byte must be written.
//!
//! The case count defaults to a CI-friendly value; set PROPTEST_CASES to run more.

mod common;

use common::{
    e2m1_oracle, e2m1_value, e4m3_oracle, e4m3_value, rn_bf16, rn_f16, spec_swizzled_len,
    spec_swizzled_offset, ue8m0_oracle, Tables,
};
use fp4norm::{
    cpu, dequantize, reference, DType, Element, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef,
    Options, ScaleFormat, ScaleIn, ScaleLayout, ScaleOut,
};
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

#[derive(Clone, Copy, Debug)]
enum Gs {
    Uniform(f32),
    PerRow,
}

#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    format: Fp4Format,
    layout: ScaleLayout,
    m: usize,
    h: usize,
    /// Extra elements between rows of x, residual and y_out (stride = h + pad).
    x_pad: usize,
    r_pad: usize,
    y_pad: usize,
    /// Garbage elements after the last row of every matrix buffer.
    tail: usize,
    residual: bool,
    y_out: bool,
    gs: Gs,
    eps: f32,
    /// SPEC.md §8's weight bias (0 of either sign: the weight as it is).
    weight_bias: f32,
    seed: u64,
}

/// Global scales, including ones a caller should not pass (0, negative, NaN, Inf): the
/// backends must still agree byte for byte.
const GS_VALUES: [f32; 14] = [
    1.0,
    0.1,
    2.5,
    1e-3,
    726.48,
    1e-30,
    1e30,
    f32::from_bits(0x3580_0000), // 2^-20
    0.0,
    -1.5,
    f32::NAN,
    f32::INFINITY,
    1e-40,
    448.0,
];
const EPS_VALUES: [f32; 9] = [0.0, 1e-6, 1e-5, 1e-12, 1e-40, 0.5, 3.0, 1e30, f32::MAX];
/// Weight biases: Gemma's 1, its negative, ±0, and values that round or overflow the sum.
const BIAS_VALUES: [f32; 9] = [1.0, -1.0, -0.0, 0.5, 1e-3, -2.5, 1e30, -3e38, 1e-40];

fn pad() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 1 => 1..40usize]
}

/// `max_m`: rows up to this; `max_k`: H = block · k with k < max_k; `big`: allow H = 2880, 5120.
fn case_strategy(max_m: usize, max_k: usize, big: bool) -> impl Strategy<Value = Case> {
    let h_sel = if big {
        prop_oneof![12 => (1..max_k).prop_map(Some), 1 => Just(None)].boxed()
    } else {
        (1..max_k).prop_map(Some).boxed()
    };
    (
        (any::<bool>(), 0..4usize, 0..3usize),
        prop_oneof![3 => 0..8usize, 2 => 0..max_m],
        (h_sel, any::<bool>()),
        (pad(), pad(), pad(), 0..4usize),
        (any::<bool>(), any::<bool>()),
        prop_oneof![
            2 => Just(Gs::Uniform(1.0)),
            2 => (0..GS_VALUES.len()).prop_map(|i| Gs::Uniform(GS_VALUES[i])),
            1 => Just(Gs::PerRow)
        ],
        prop_oneof![2 => Just(1e-6f32), 3 => (0..EPS_VALUES.len()).prop_map(|i| EPS_VALUES[i])],
        prop_oneof![3 => Just(0.0f32), 2 => (0..BIAS_VALUES.len()).prop_map(|i| BIAS_VALUES[i])],
        any::<u64>(),
    )
        .prop_map(
            |(
                (f16_, fmt, lay),
                m,
                (k, big_sel),
                (x_pad, r_pad, y_pad, tail),
                (residual, y_out),
                gs,
                eps,
                weight_bias,
                seed,
            )| {
                let format = Fp4Format::ALL[fmt];
                let h = match k {
                    Some(k) => k * format.block_size(),
                    None => {
                        if big_sel {
                            5120
                        } else {
                            2880
                        }
                    }
                };
                Case {
                    dtype: if f16_ { DType::F16 } else { DType::BF16 },
                    format,
                    layout: ScaleLayout::ALL[lay],
                    m,
                    h,
                    x_pad,
                    r_pad,
                    y_pad,
                    tail,
                    residual,
                    y_out,
                    gs,
                    eps,
                    weight_bias,
                    seed,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------

/// The dtype's helpers, as raw bits.
#[derive(Clone, Copy)]
struct Dt(DType);

impl Dt {
    fn to_f32(self, b: u16) -> f32 {
        match self.0 {
            DType::BF16 => bf16::from_bits(b).to_f32(),
            DType::F16 => f16::from_bits(b).to_f32(),
        }
    }
    /// RNdt (the `half` crate, NaN → canonical 0x7FFF).
    fn rn(self, v: f32) -> u16 {
        match self.0 {
            DType::BF16 => rn_bf16(v),
            DType::F16 => rn_f16(v),
        }
    }
    fn max_exp_field(self) -> u16 {
        match self.0 {
            DType::BF16 => 0xFE,
            DType::F16 => 0x1E,
        }
    }
    fn mant_bits(self) -> u32 {
        match self.0 {
            DType::BF16 => 7,
            DType::F16 => 10,
        }
    }
    fn inf(self) -> u16 {
        match self.0 {
            DType::BF16 => 0x7F80,
            DType::F16 => 0x7C00,
        }
    }
    /// Any finite value: every exponent (subnormals included) equally likely.
    fn any_finite(self, rng: &mut StdRng) -> u16 {
        let mb = self.mant_bits();
        let e = rng.random_range(0..=self.max_exp_field());
        let m = rng.random_range(0..(1u16 << mb));
        let s = if rng.random_bool(0.5) { 0x8000 } else { 0 };
        s | (e << mb) | m
    }
    fn special(self, rng: &mut StdRng) -> u16 {
        let mb = self.mant_bits();
        let nan = self.inf() | rng.random_range(1..(1u16 << mb));
        let sign = if rng.random_bool(0.5) { 0x8000 } else { 0 };
        match rng.random_range(0..7) {
            0 => nan | sign,
            1 => self.inf() | sign,
            2 => sign,                    // ±0
            3 => (self.inf() - 1) | sign, // ±max finite
            4 => 1 | sign,                // ±smallest subnormal
            5 => (1u16 << mb) - 1,        // largest subnormal
            _ => self.rn(6.0) | sign,     // an exact E2M1 maximum
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Dist {
    Narrow,
    Wide,
    Full,
    Zero,
    Const,
    Ties,
    Specials,
    RawBits,
}

fn pick_dist(rng: &mut StdRng) -> Dist {
    match rng.random_range(0..100) {
        0..30 => Dist::Narrow,
        30..50 => Dist::Wide,
        50..60 => Dist::Full,
        60..65 => Dist::Zero,
        65..70 => Dist::Const,
        70..82 => Dist::Ties,
        82..95 => Dist::Specials,
        _ => Dist::RawBits,
    }
}

/// Fills `out` (one row) with values of distribution `d`.
fn fill_row(rng: &mut StdRng, dt: Dt, d: Dist, out: &mut [u16]) {
    let sign = |rng: &mut StdRng| if rng.random_bool(0.5) { -1.0f32 } else { 1.0 };
    match d {
        Dist::Narrow => out
            .iter_mut()
            .for_each(|o| *o = dt.rn(sign(rng) * rng.random_range(0.25f32..4.0))),
        Dist::Wide => out.iter_mut().for_each(|o| {
            *o = dt.rn(sign(rng)
                * 2f32.powi(rng.random_range(-30..30))
                * rng.random_range(1.0f32..2.0))
        }),
        Dist::Full => out.iter_mut().for_each(|o| *o = dt.any_finite(rng)),
        Dist::Zero => out
            .iter_mut()
            .for_each(|o| *o = if rng.random_bool(0.8) { 0 } else { 0x8000 }),
        Dist::Const => {
            let v = dt
                .rn(sign(rng) * 2f32.powi(rng.random_range(-8..8)) * rng.random_range(1.0f32..2.0));
            out.fill(v);
        }
        Dist::Ties => {
            const T: [f32; 14] = [
                0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0,
            ];
            let scale = 2f32.powi(rng.random_range(-3..3));
            out.iter_mut()
                .for_each(|o| *o = dt.rn(sign(rng) * T[rng.random_range(0..T.len())] * scale));
        }
        Dist::Specials => {
            fill_row(rng, dt, Dist::Narrow, out);
            let n = rng.random_range(1..=3usize.min(out.len()));
            for _ in 0..n {
                let i = rng.random_range(0..out.len());
                out[i] = dt.special(rng);
            }
        }
        Dist::RawBits => out.iter_mut().for_each(|o| *o = rng.random()),
    }
}

/// A matrix buffer with `rows` rows of `h` at stride `h + pad`, `tail` extra elements,
/// gaps full of random bits, rows drawn row by row from random distributions.
fn matrix(rng: &mut StdRng, dt: Dt, rows: usize, h: usize, pad: usize, tail: usize) -> Vec<u16> {
    let stride = h + pad;
    let len = if rows == 0 {
        tail
    } else {
        (rows - 1) * stride + h + tail
    };
    let mut buf: Vec<u16> = (0..len).map(|_| rng.random()).collect();
    for row in 0..rows {
        let d = pick_dist(rng);
        fill_row(rng, dt, d, &mut buf[row * stride..row * stride + h]);
    }
    buf
}

fn weights(rng: &mut StdRng, dt: Dt, h: usize) -> Vec<u16> {
    let mut w = vec![0u16; h];
    match rng.random_range(0..10) {
        0..3 => w.fill(dt.rn(1.0)),
        3..6 => w
            .iter_mut()
            .for_each(|o| *o = dt.rn(rng.random_range(0.5f32..1.5))),
        6 => fill_row(rng, dt, Dist::Wide, &mut w),
        7 => fill_row(rng, dt, Dist::Specials, &mut w),
        8 => fill_row(rng, dt, Dist::Ties, &mut w),
        _ => fill_row(rng, dt, Dist::Full, &mut w),
    }
    w
}

fn row_scales(rng: &mut StdRng, m: usize) -> Vec<f32> {
    (0..m)
        .map(|_| {
            if rng.random_bool(0.7) {
                2f32.powf(rng.random_range(-7.0f32..7.0))
            } else {
                GS_VALUES[rng.random_range(0..GS_VALUES.len())]
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The spec model (SPEC.md §1, §3) on raw bits
// ---------------------------------------------------------------------------------------

struct Outputs {
    residual: Vec<u16>,
    y_out: Vec<u16>,
    y_fp4: Vec<u8>,
    row_major: Vec<u8>,
    swizzled: Vec<u8>,
}

#[allow(clippy::too_many_arguments)]
fn model(
    c: &Case,
    t: &Tables,
    x: &[u16],
    r0: &[u16],
    w: &[u16],
    gs: &[f32],
    y0: &[u16],
) -> Outputs {
    let dt = Dt(c.dtype);
    let (m, h, b) = (c.m, c.h, c.format.block_size());
    let nb = h / b;
    let (xs, rs, ys) = (h + c.x_pad, h + c.r_pad, h + c.y_pad);
    let mut residual = r0.to_vec();
    let mut y_out = y0.to_vec();
    let mut y_fp4 = vec![0u8; m * h / 2];
    let mut row_major = vec![0u8; m * nb];
    let mut swizzled = vec![0u8; spec_swizzled_len(m, nb)];
    let mut hv = vec![0u16; h];
    let mut y = vec![0f32; h];
    for row in 0..m {
        // 1. h = RNdt(RN32(x + r)); r ← h.
        for i in 0..h {
            let xi = x[row * xs + i];
            hv[i] = if c.residual {
                let v = dt.rn(dt.to_f32(xi) + dt.to_f32(residual[row * rs + i]));
                residual[row * rs + i] = v;
                v
            } else {
                xi
            };
        }
        // 2.–3. ss = the exact sum of the squares rounded once (SPEC.md §1.2), here by
        // Shewchuk's algorithm (fsum_model) rather than the
        // crate's integer limbs; rstd = RN32(1/sqrt(ss/H + eps)).
        let ss = fsum_model(hv.iter().map(|&v| dt.to_f32(v) as f64).map(|v| v * v));
        let rstd = (1.0 / (ss / h as f64 + c.eps as f64).sqrt()) as f32;
        // 4. y = RN32(RN32(h · rstd) · w'), w' = RN32(w + bias), or w for a bias of ±0.
        for i in 0..h {
            let wi = dt.to_f32(w[i]);
            let wb = if c.weight_bias == 0.0 {
                wi
            } else {
                wi + c.weight_bias
            };
            y[i] = (dt.to_f32(hv[i]) * rstd) * wb;
            if c.y_out {
                y_out[row * ys + i] = dt.rn(y[i]);
            }
        }
        let g = gs[row];
        for blk in 0..nb {
            let yb = &y[blk * b..(blk + 1) * b];
            // 5. amax, NaN if any NaN.
            let amax = if yb.iter().any(|v| v.is_nan()) {
                f32::NAN
            } else {
                yb.iter().fold(0f32, |a, v| a.max(v.abs()))
            };
            // 6. scale code and inverse.
            let (code, inv) = match c.format.scale {
                ScaleFormat::E4M3 => {
                    let s = (g * amax) / 6.0;
                    let code = e4m3_oracle(t, s);
                    let d = e4m3_value(code);
                    (code, if d == 0.0 { 0.0 } else { g / d })
                }
                ScaleFormat::UE8M0 => {
                    let code = ue8m0_oracle(amax / 6.0);
                    (
                        code,
                        if code == 255 {
                            f32::NAN
                        } else {
                            2f64.powi(127 - code as i32) as f32
                        },
                    )
                }
            };
            // 7.–8. quantise and pack, low nibble first.
            for j in 0..b / 2 {
                let lo = e2m1_oracle(t, yb[2 * j] * inv);
                let hi = e2m1_oracle(t, yb[2 * j + 1] * inv);
                y_fp4[row * h / 2 + blk * b / 2 + j] = lo | (hi << 4);
            }
            row_major[row * nb + blk] = code;
            swizzled[spec_swizzled_offset(row, blk, nb)] = code;
        }
    }
    Outputs {
        residual,
        y_out,
        y_fp4,
        row_major,
        swizzled,
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

/// Runs one backend on copies of the inputs; scale buffers the layout does not write are
/// returned empty.
#[allow(clippy::too_many_arguments)]
fn run_lib<T: Element>(
    c: &Case,
    be: Backend,
    poison: u8,
    x: &[u16],
    r0: &[u16],
    w: &[u16],
    gs: &[f32],
    y0: &[u16],
) -> Outputs {
    let (m, h) = (c.m, c.h);
    let nb = h / c.format.block_size();
    let tt = |v: &[u16]| -> Vec<T> { v.iter().map(|&b| T::from_bits(b)).collect() };
    let x = tt(x);
    let w = tt(w);
    let mut r = tt(r0);
    let mut yo = tt(y0);
    let mut q = vec![poison; m * h / 2];
    let mut rm = vec![poison; if c.layout.has_row_major() { m * nb } else { 0 }];
    let mut sw = vec![
        poison;
        if c.layout.has_swizzled() {
            spec_swizzled_len(m, nb)
        } else {
            0
        }
    ];
    let scales = match c.layout {
        ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
        ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
        ScaleLayout::Both => ScaleOut::Both {
            row_major: &mut rm[..],
            swizzled: &mut sw[..],
        },
    };
    let y_out = c
        .y_out
        .then(|| MatMut::with_stride(&mut yo[..], m, h, h + c.y_pad).unwrap());
    let out = Fp4Out {
        y_fp4: &mut q,
        scales,
        y_out,
    };
    let gsv = match c.gs {
        Gs::Uniform(g) => GlobalScale::Uniform(g),
        Gs::PerRow => GlobalScale::PerRow(gs),
    };
    let xv = MatRef::with_stride(&x, m, h, h + c.x_pad).unwrap();
    let opts = Options::default()
        .with_format(c.format)
        .with_eps(c.eps)
        .with_weight_bias(c.weight_bias);
    let res = if c.residual {
        let rv = MatMut::with_stride(&mut r[..], m, h, h + c.r_pad).unwrap();
        match be {
            Backend::Reference => reference::add_rmsnorm_fp4quant(xv, rv, &w, out, gsv, &opts),
            Backend::Cpu => cpu::add_rmsnorm_fp4quant(xv, rv, &w, out, gsv, &opts),
        }
    } else {
        match be {
            Backend::Reference => reference::rmsnorm_fp4quant(xv, &w, out, gsv, &opts),
            Backend::Cpu => cpu::rmsnorm_fp4quant(xv, &w, out, gsv, &opts),
        }
    };
    res.unwrap_or_else(|e| panic!("{be:?} failed on a valid case: {e}"));
    let bits = |v: &[T]| -> Vec<u16> { v.iter().map(|t| t.to_bits()).collect() };
    Outputs {
        residual: bits(&r),
        y_out: bits(&yo),
        y_fp4: q,
        row_major: rm,
        swizzled: sw,
    }
}

/// First differing index, for a readable failure.
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
            "{what}: first difference at index {i}: got {:?}, expected {:?}",
            got[i], want[i]
        )));
    }
    Ok(())
}

fn compare(tag: &str, c: &Case, got: &Outputs, want: &Outputs) -> Result<(), TestCaseError> {
    first_diff(
        &format!("{tag}: residual buffer"),
        &got.residual,
        &want.residual,
    )?;
    first_diff(&format!("{tag}: y_out buffer"), &got.y_out, &want.y_out)?;
    first_diff(&format!("{tag}: y_fp4"), &got.y_fp4, &want.y_fp4)?;
    if c.layout.has_row_major() {
        first_diff(
            &format!("{tag}: row-major scales"),
            &got.row_major,
            &want.row_major,
        )?;
    }
    if c.layout.has_swizzled() {
        first_diff(
            &format!("{tag}: swizzled scales"),
            &got.swizzled,
            &want.swizzled,
        )?;
    }
    Ok(())
}

fn check_case(c: &Case) -> Result<(), TestCaseError> {
    let t = Tables::new();
    let mut rng = StdRng::seed_from_u64(c.seed);
    let dt = Dt(c.dtype);
    let x = matrix(&mut rng, dt, c.m, c.h, c.x_pad, c.tail);
    let r0 = if c.residual {
        matrix(&mut rng, dt, c.m, c.h, c.r_pad, c.tail)
    } else {
        Vec::new()
    };
    let w = weights(&mut rng, dt, c.h);
    let y0: Vec<u16> = if c.y_out {
        // Gaps hold random garbage, the view itself a poison value.
        let mut y: Vec<u16> = matrix(&mut rng, dt, c.m, c.h, c.y_pad, c.tail);
        for row in 0..c.m {
            let s = row * (c.h + c.y_pad);
            y[s..s + c.h].fill(0xAAAA);
        }
        y
    } else {
        Vec::new()
    };
    let gs = match c.gs {
        Gs::Uniform(g) => vec![g; c.m],
        Gs::PerRow => row_scales(&mut rng, c.m),
    };

    let want = model(c, &t, &x, &r0, &w, &gs, &y0);
    let run = |be, poison| match c.dtype {
        DType::BF16 => run_lib::<bf16>(c, be, poison, &x, &r0, &w, &gs, &y0),
        DType::F16 => run_lib::<f16>(c, be, poison, &x, &r0, &w, &gs, &y0),
    };
    let reference = run(Backend::Reference, 0xAA);
    let cpu_a = run(Backend::Cpu, 0xAA);
    let cpu_b = run(Backend::Cpu, 0x55);
    // cpu vs reference first: that is the contract between backends.
    compare("cpu (poison 0xAA) vs reference", c, &cpu_a, &reference)?;
    compare("cpu (poison 0x55) vs reference", c, &cpu_b, &reference)?;
    compare("reference vs spec model", c, &reference, &want)?;

    // Stride gaps and tails untouched (also implied by the model comparison, which never
    // writes them): spelled out for clarity.
    let nb = c.h / c.format.block_size();
    for (name, got, orig, pad, on) in [
        ("residual", &cpu_a.residual, &r0, c.r_pad, c.residual),
        ("y_out", &cpu_a.y_out, &y0, c.y_pad, c.y_out),
    ] {
        if !on {
            continue;
        }
        let stride = c.h + pad;
        for (i, (g, o)) in got.iter().zip(orig.iter()).enumerate() {
            let in_view = i / stride < c.m && i % stride < c.h;
            prop_assert!(in_view || g == o, "{name}: gap element {i} changed");
        }
    }
    // Swizzled padding is zero.
    if c.layout.has_swizzled() {
        let mut used = vec![false; cpu_a.swizzled.len()];
        for row in 0..c.m {
            for blk in 0..nb {
                used[spec_swizzled_offset(row, blk, nb)] = true;
            }
        }
        for (i, (&v, &u)) in cpu_a.swizzled.iter().zip(&used).enumerate() {
            prop_assert!(u || v == 0, "swizzled padding byte {i} is {v:#04x}");
        }
    }
    // Dequantising from either layout gives the same values, and they follow SPEC.md §4.
    if c.m > 0 {
        let mut from_rm = vec![0f32; c.m * c.h];
        let mut from_sw = vec![0f32; c.m * c.h];
        let gsv = match c.gs {
            Gs::Uniform(g) => GlobalScale::Uniform(g),
            Gs::PerRow => GlobalScale::PerRow(&gs),
        };
        dequantize(
            c.m,
            c.h,
            c.format,
            &want.y_fp4,
            ScaleIn::RowMajor(&want.row_major),
            gsv,
            &mut from_rm,
        )
        .unwrap();
        dequantize(
            c.m,
            c.h,
            c.format,
            &want.y_fp4,
            ScaleIn::Swizzled(&want.swizzled),
            gsv,
            &mut from_sw,
        )
        .unwrap();
        let b = c.format.block_size();
        for i in 0..c.m * c.h {
            let (row, col) = (i / c.h, i % c.h);
            let nib = (want.y_fp4[i / 2] >> (4 * (i % 2))) & 0xF;
            let code = want.row_major[row * nb + col / b];
            let e = e2m1_value(nib);
            let v = match c.format.scale {
                ScaleFormat::E4M3 => (e * e4m3_value(code)) / gs[row],
                ScaleFormat::UE8M0 => {
                    e * if code == 255 {
                        f32::NAN
                    } else {
                        2f64.powi(code as i32 - 127) as f32
                    }
                }
            };
            let same = |a: f32| a.to_bits() == v.to_bits() || (a.is_nan() && v.is_nan());
            prop_assert!(
                same(from_rm[i]),
                "dequantize (row-major) at {i}: {} vs {}",
                from_rm[i],
                v
            );
            prop_assert!(
                same(from_sw[i]),
                "dequantize (swizzled) at {i}: {} vs {}",
                from_sw[i],
                v
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(192), max_shrink_iters: 512, ..ProptestConfig::default() })]

    /// The broad property: M < 300, H = block · k (k < 80) or 2880 / 5120.
    #[test]
    fn cpu_equals_reference_equals_spec(c in case_strategy(300, 80, true)) {
        check_case(&c)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), max_shrink_iters: 1024, ..ProptestConfig::default() })]

    /// Many small cases: M < 8 (mostly), H ≤ 8 blocks, where special values dominate rows.
    #[test]
    fn small_shapes_cpu_equals_reference_equals_spec(c in case_strategy(140, 9, false)) {
        check_case(&c)?;
    }
}

/// The correctly rounded sum of nonnegative finite f64 terms (or NaN / +Inf if any term is),
/// by Shewchuk's exact partials with round-half-even across them: CPython's `math.fsum`,
/// an algorithm independent of the crate's `sumsq::exact_sum_of_squares`.
fn fsum_model(terms: impl Iterator<Item = f64>) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    let mut special = 0.0f64;
    for mut x in terms {
        if !x.is_finite() {
            special += x; // NaN stays NaN, Inf + Inf = Inf
            continue;
        }
        let mut i = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        partials.truncate(i);
        partials.push(x);
    }
    if special != 0.0 || special.is_nan() {
        return special;
    }
    let mut n = partials.len();
    if n == 0 {
        return 0.0;
    }
    n -= 1;
    let mut hi = partials[n];
    let mut lo = 0.0;
    while n > 0 {
        let x = hi;
        n -= 1;
        let y = partials[n];
        hi = x + y;
        let yr = hi - x;
        lo = y - yr;
        if lo != 0.0 {
            break;
        }
    }
    if n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0)) {
        let y = lo * 2.0;
        let x = hi + y;
        if y == x - hi {
            hi = x;
        }
    }
    hi
}

/// The model's sum itself, on sums worked out by hand: a tie to even, a tie broken by a
/// later tiny term, a tie to the odd neighbour's even side, and exact small sums.
#[test]
fn fsum_model_rounds_once() {
    let p60 = 2f64.powi(60);
    assert_eq!(fsum_model([p60, 64.0, 64.0].into_iter()), p60);
    assert_eq!(
        fsum_model([p60, 64.0, 64.0, 2f64.powi(-120)].into_iter()),
        p60 + 256.0
    );
    assert_eq!(
        fsum_model([p60, 256.0, 64.0, 64.0].into_iter()),
        p60 + 512.0
    );
    assert_eq!(fsum_model([0.25, 1.0, 4.0].into_iter()), 5.25);
    assert_eq!(fsum_model(std::iter::empty()), 0.0);
    assert!(fsum_model([1.0, f64::NAN].into_iter()).is_nan());
    assert_eq!(fsum_model([1.0, f64::INFINITY].into_iter()), f64::INFINITY);
    // Element order drops each 64 on its own; the model does not.
    assert_eq!([p60, 64.0, 64.0, 2f64.powi(-120)].iter().sum::<f64>(), p60);
}
