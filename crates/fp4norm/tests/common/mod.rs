//! Independent formulations of the SPEC.md §2 codecs, shared by the integration tests.
//!
//! Nothing here calls `fp4norm::codec`: the tables are built from the format definitions
//! and encoding is a nearest-value search over them in f64, so a test comparing the
//! library against these functions compares two separate readings of the spec.
#![allow(dead_code)]

/// The value of E2M1 magnitude code `c` (0..=7) from the format definition:
/// 2 exponent bits `e`, 1 mantissa bit `m`, bias 1; `e == 0` is subnormal (`m · 0.5`).
pub fn e2m1_magnitude(c: u8) -> f64 {
    let (e, m) = ((c >> 1) & 3, (c & 1) as f64);
    if e == 0 {
        m * 0.5
    } else {
        2f64.powi(e as i32 - 1) * (1.0 + m / 2.0)
    }
}

/// The value of E4M3 (fn) magnitude code `c` (0..=0x7E) from the format definition:
/// 4 exponent bits, 3 mantissa bits, bias 7; `e == 0` is subnormal (`m · 2^-9`).
pub fn e4m3_magnitude(c: u8) -> f64 {
    assert!(c <= 0x7E, "code {c:#x} is not a finite E4M3 magnitude");
    let (e, m) = ((c >> 3) & 0xF, (c & 7) as f64);
    if e == 0 {
        m * 2f64.powi(-9)
    } else {
        2f64.powi(e as i32 - 7) * (1.0 + m / 8.0)
    }
}

/// Sorted magnitude tables, padded with +Inf so that a fixed-step binary search never
/// reads past the end.
pub struct Tables {
    pub e2m1: [f64; 8],
    pub e4m3: [f64; 128],
}

impl Tables {
    pub fn new() -> Self {
        let mut e2m1 = [0.0; 8];
        for (c, v) in e2m1.iter_mut().enumerate() {
            *v = e2m1_magnitude(c as u8);
        }
        let mut e4m3 = [f64::INFINITY; 128];
        for (c, v) in e4m3.iter_mut().enumerate().take(0x7F) {
            *v = e4m3_magnitude(c as u8);
        }
        for w in e4m3[..0x7F].windows(2) {
            assert!(w[0] < w[1], "E4M3 table must be increasing");
        }
        Tables { e2m1, e4m3 }
    }
}

impl Default for Tables {
    fn default() -> Self {
        Self::new()
    }
}

/// Of two neighbouring codes `lo` and `lo + 1` with values `a` and `b` around `x`
/// (`a <= x <= b`), the nearest, ties to the even code. The differences are computed in
/// f64; `(a + b) / 2` is exactly representable, so rounding cannot flip a comparison.
#[inline(always)]
fn nearest_of_two(x: f64, lo: u8, a: f64, b: f64) -> u8 {
    let (da, db) = (x - a, b - x);
    if da < db {
        lo
    } else if db < da {
        lo + 1
    } else if lo % 2 == 0 {
        lo
    } else {
        lo + 1
    }
}

/// SPEC.md §2 E2M1: NaN → 0x7; |v| > 6 or ±Inf → magnitude 7 with the sign of v;
/// otherwise the nearest magnitude (linear search), ties to the even code; the sign bit
/// is the sign bit of v, zero results included.
#[inline(always)]
pub fn e2m1_oracle(t: &Tables, v: f32) -> u8 {
    if v.is_nan() {
        return 0x7;
    }
    let sign = if v.is_sign_negative() { 0x8 } else { 0 };
    let a = (v as f64).abs();
    if a > 6.0 {
        return sign | 7;
    }
    // Nearest-value search over all eight magnitudes; on equal distance keep the even code.
    let mut best = 0u8;
    let mut best_d = a;
    for c in 1..8u8 {
        let d = (a - t.e2m1[c as usize]).abs();
        if d < best_d || (d == best_d && c % 2 == 0) {
            best = c;
            best_d = d;
        }
    }
    sign | best
}

/// SPEC.md §2 E4M3: NaN → 0x7F; otherwise round to the nearest finite E4M3 value, ties
/// to the even code; magnitudes above 448 and ±Inf saturate to ±448. The sign bit is the
/// sign bit of the input (so `-0.0` and negative values rounding to zero give `0x80`).
#[inline(always)]
pub fn e4m3_oracle(t: &Tables, v: f32) -> u8 {
    if v.is_nan() {
        return 0x7F;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = (v as f64).abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    // Largest code whose value is <= a (table[0] = 0 <= a always; table[127] = Inf).
    let mut lo = 0usize;
    let mut step = 64;
    while step > 0 {
        if t.e4m3[lo + step] <= a {
            lo += step;
        }
        step >>= 1;
    }
    sign | nearest_of_two(a, lo as u8, t.e4m3[lo], t.e4m3[lo + 1])
}

/// `2^e` as f64, exactly, for -1022 <= e <= 1023.
#[inline(always)]
pub fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// SPEC.md §1.6 UE8M0 code for `v = amax / 6`: 255 for NaN, 0 for zero, otherwise
/// `clamp(e + 127, 0, 254)` with `e` the smallest integer such that `2^e >= v` (+Inf →
/// 254). A negative `v` (outside the spec's domain, since amax >= 0) has no smallest
/// such `e`; it clamps to 0.
#[inline(always)]
pub fn ue8m0_oracle(v: f32) -> u8 {
    if v.is_nan() {
        return 255;
    }
    if v <= 0.0 {
        return 0;
    }
    if v.is_infinite() {
        return 254;
    }
    // Every positive f32 (subnormals included) is a normal f64: v = 2^k · (1 + f).
    let x = v as f64;
    let k = ((x.to_bits() >> 52) as i32) - 1023;
    let e = if x.to_bits() & ((1u64 << 52) - 1) == 0 {
        k
    } else {
        k + 1
    };
    // The defining property, checked on the exact powers of two.
    assert!(
        pow2(e) >= x && pow2(e - 1) < x,
        "ue8m0 oracle: e = {e} wrong for {v:e}"
    );
    (e + 127).clamp(0, 254) as u8
}

/// `RNbf16(v)` as bits: the `half` crate (round to nearest even), NaN → 0x7FFF.
#[inline(always)]
pub fn rn_bf16(v: f32) -> u16 {
    if v.is_nan() {
        0x7FFF
    } else {
        half::bf16::from_f32(v).to_bits()
    }
}

/// `RNf16(v)` as bits: the `half` crate (round to nearest even), NaN → 0x7FFF.
#[inline(always)]
pub fn rn_f16(v: f32) -> u16 {
    if v.is_nan() {
        0x7FFF
    } else {
        half::f16::from_f32(v).to_bits()
    }
}

/// E4M3 decoded from its definition, as f32 (exact); NaN for 0x7F/0xFF.
pub fn e4m3_value(code: u8) -> f32 {
    if code & 0x7F == 0x7F {
        return f32::NAN;
    }
    let m = e4m3_magnitude(code & 0x7F) as f32;
    if code & 0x80 != 0 {
        -m
    } else {
        m
    }
}

/// E2M1 decoded from its definition, as f32 (exact).
pub fn e2m1_value(code: u8) -> f32 {
    let m = e2m1_magnitude(code & 7) as f32;
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// SPEC.md §3 swizzled offset, written out from the spec text.
pub fn spec_swizzled_offset(row: usize, b: usize, n_blocks: usize) -> usize {
    let nk = n_blocks.div_ceil(4);
    (row / 128) * nk * 512 + (b / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + (b % 4)
}

/// SPEC.md §3 swizzled buffer length `Mp · nK · 4`.
pub fn spec_swizzled_len(m: usize, n_blocks: usize) -> usize {
    128 * m.div_ceil(128) * 4 * n_blocks.div_ceil(4)
}
