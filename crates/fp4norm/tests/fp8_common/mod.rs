//! Independent formulations for the FP8 tests (SPEC.md §8), shared by `tests/fp8_*.rs`.
//!
//! Nothing here calls `fp4norm::codec` or `fp4norm::fp8`: the E5M2 table is built from the
//! format definition and encoding is a nearest-value search over it in f64, so a test
//! comparing the library against these functions compares two separate readings of the
//! spec. (E4M3 and UE8M0 come from `tests/common`, the FP4 tests' models.)
#![allow(dead_code)]

use rayon::prelude::*;

/// The value of E5M2 magnitude code `c` (0..=0x7B) from the format definition: 5 exponent
/// bits, 2 mantissa bits, bias 15; `e == 0` is subnormal (`m · 2^-16`).
pub fn e5m2_magnitude(c: u8) -> f64 {
    assert!(c <= 0x7B, "code {c:#x} is not a finite E5M2 magnitude");
    let (e, m) = ((c >> 2) & 0x1F, (c & 3) as f64);
    if e == 0 {
        m * 2f64.powi(-16)
    } else {
        2f64.powi(e as i32 - 15) * (1.0 + m / 4.0)
    }
}

/// Sorted finite E5M2 magnitudes (codes 0..=0x7B), padded with +Inf to 128 entries so a
/// fixed-step binary search never reads past the end.
pub struct E5m2Table(pub [f64; 128]);

impl E5m2Table {
    pub fn new() -> Self {
        let mut t = [f64::INFINITY; 128];
        for (c, v) in t.iter_mut().enumerate().take(0x7C) {
            *v = e5m2_magnitude(c as u8);
        }
        for w in t[..0x7C].windows(2) {
            assert!(w[0] < w[1], "E5M2 table must be increasing");
        }
        assert_eq!(t[0x7B], 57344.0);
        E5m2Table(t)
    }
}

impl Default for E5m2Table {
    fn default() -> Self {
        Self::new()
    }
}

/// SPEC.md §8 E5M2: NaN → 0x7F; |v| ≥ 57344 and ±Inf → ±57344 (0x7B/0xFB); otherwise the
/// nearest finite value, ties to the even code; the sign bit is the sign bit of `v`.
#[inline(always)]
pub fn e5m2_oracle(t: &E5m2Table, v: f32) -> u8 {
    if v.is_nan() {
        return 0x7F;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = (v as f64).abs();
    if a >= 57344.0 {
        return sign | 0x7B;
    }
    // Largest code whose value is <= a (t[0] = 0 <= a; t[127] = Inf).
    let mut lo = 0usize;
    let mut step = 64;
    while step > 0 {
        if t.0[lo + step] <= a {
            lo += step;
        }
        step >>= 1;
    }
    let (x, y) = (t.0[lo], t.0[lo + 1]);
    let (dx, dy) = (a - x, y - a); // exact: neighbours and a are close in f64
    let code = if dx < dy || (dx == dy && lo % 2 == 0) {
        lo
    } else {
        lo + 1
    };
    sign | code as u8
}

/// E5M2 decoded from its definition: ±Inf for 0x7C/0xFC, NaN for 0x7D..0x7F/0xFD..0xFF.
pub fn e5m2_value(code: u8) -> f32 {
    let mag = match code & 0x7F {
        0x7C => f64::INFINITY,
        c if c > 0x7C => return f32::NAN,
        c => e5m2_magnitude(c),
    } as f32;
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

const CHUNK: u64 = 1 << 22;

/// Checks `ok(bits)` for all 2^32 f32 patterns in parallel; panics with the smallest
/// failing pattern and `describe` of it. (As `tests/codec_exhaustive.rs`.)
pub fn sweep_all_f32(
    what: &str,
    ok: impl Fn(u32) -> bool + Sync,
    describe: impl Fn(u32) -> String,
) {
    let chunks = (1u64 << 32) / CHUNK;
    let first_bad = (0..chunks).into_par_iter().find_map_first(|c| {
        let start = (c * CHUNK) as u32;
        let end = start.wrapping_add((CHUNK - 1) as u32);
        let mut bad = 0u32;
        for b in start..=end {
            bad += (!ok(b)) as u32;
        }
        if bad == 0 {
            None
        } else {
            (start..=end).find(|&b| !ok(b))
        }
    });
    if let Some(b) = first_bad {
        panic!(
            "{what}: first mismatch at f32 bits {b:#010x} ({:e}): {}",
            f32::from_bits(b),
            describe(b)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Random inputs (the distributions of tests/properties.rs, on raw dtype bits)
// ---------------------------------------------------------------------------------------

use fp4norm::DType;
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;

/// The dtype's helpers, as raw bits.
#[derive(Clone, Copy, Debug)]
pub struct Dt(pub DType);

impl Dt {
    /// Exact widening (the `half` crate).
    pub fn to_f32(self, b: u16) -> f32 {
        match self.0 {
            DType::BF16 => bf16::from_bits(b).to_f32(),
            DType::F16 => f16::from_bits(b).to_f32(),
        }
    }
    /// RNdt (the `half` crate, NaN → canonical 0x7FFF).
    pub fn rn(self, v: f32) -> u16 {
        if v.is_nan() {
            return 0x7FFF;
        }
        match self.0 {
            DType::BF16 => bf16::from_f32(v).to_bits(),
            DType::F16 => f16::from_f32(v).to_bits(),
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
            _ => self.rn(448.0) | sign,   // the E4M3 maximum
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Dist {
    Narrow,
    Wide,
    Full,
    Zero,
    Const,
    Ties,
    Specials,
    RawBits,
}

pub fn pick_dist(rng: &mut StdRng) -> Dist {
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
pub fn fill_row(rng: &mut StdRng, dt: Dt, d: Dist, out: &mut [u16]) {
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
            // FP8 midpoints and values (E4M3 1.0625, 1.1875; E5M2 1.125, 1.375), scaled.
            const T: [f32; 12] = [
                1.0625, 1.1875, 1.125, 1.375, 1.0, 1.25, 1.5, 1.75, 0.5, 2.0, 3.0, 7.0,
            ];
            let scale = 2f32.powi(rng.random_range(-4..4));
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
pub fn matrix(
    rng: &mut StdRng,
    dt: Dt,
    rows: usize,
    h: usize,
    pad: usize,
    tail: usize,
) -> Vec<u16> {
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

pub fn weights(rng: &mut StdRng, dt: Dt, h: usize) -> Vec<u16> {
    let mut w = vec![0u16; h];
    match rng.random_range(0..10) {
        0..3 => w.fill(dt.rn(1.0)),
        3..6 => w
            .iter_mut()
            .for_each(|o| *o = dt.rn(rng.random_range(-1.5f32..1.5))),
        6 => fill_row(rng, dt, Dist::Wide, &mut w),
        7 => fill_row(rng, dt, Dist::Specials, &mut w),
        8 => fill_row(rng, dt, Dist::Ties, &mut w),
        _ => fill_row(rng, dt, Dist::Full, &mut w),
    }
    // Signed zeros now and then: -0 weights are where a weight bias of 0 must not add.
    if rng.random_bool(0.2) {
        for _ in 0..h.div_ceil(4) {
            let i = rng.random_range(0..h);
            w[i] = if rng.random_bool(0.5) { 0x8000 } else { 0 };
        }
    }
    w
}

/// The correctly rounded sum of nonnegative f64 terms (NaN / +Inf if any term is), by
/// Shewchuk's exact partials with round-half-even across them (CPython's `math.fsum`):
/// independent of the crate's integer-limb `sumsq::exact_sum_of_squares`.
pub fn fsum(terms: impl Iterator<Item = f64>) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    let mut special = 0.0f64;
    for mut x in terms {
        if !x.is_finite() {
            special += x;
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
