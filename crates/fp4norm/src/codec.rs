//! The number formats of SPEC.md §2, bit for bit: E2M1 (the FP4 element), E4M3 and
//! UE8M0 (block scales), and the input dtypes' round-to-nearest-even conversions.
//!
//! Every backend encodes through these rules. The CPU backends call these functions;
//! the CUDA kernels implement the same rules and are tested byte for byte against them.

/// E2M1 magnitudes for codes 0..=7 (bit 3 is the sign).
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// The largest finite E4M3 (fn) magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The E4M3 NaN code (`0xFF` is NaN too; the encoder only produces `0x7F`).
pub const E4M3_NAN: u8 = 0x7F;

/// The UE8M0 NaN code.
pub const UE8M0_NAN: u8 = 0xFF;

/// Canonical NaN stored for bf16 and f16 results (`RNdt(NaN)`): positive, all mantissa
/// bits set. This is what NVIDIA's `cvt.rn.{bf16,f16}.f32` produces for any NaN, so the
/// CPU backends write it too and every backend stores identical NaN bytes.
pub const CANONICAL_NAN_16: u16 = 0x7FFF;

/// Encodes an f32 as E2M1 (SPEC.md §2): NaN → `0x7`; `|v| > 6` or infinite → magnitude
/// 7 with the sign of `v`; otherwise round `|v|` to the nearest magnitude, ties to the
/// even code. The sign bit is the sign bit of `v`, also for zero results.
///
/// ```
/// use fp4norm::codec::e2m1_encode;
/// assert_eq!(e2m1_encode(0.25), 0x0); // tie between 0 and 0.5 goes to the even code 0
/// assert_eq!(e2m1_encode(0.75), 0x2); // tie between 0.5 and 1.0 goes to code 2 (1.0)
/// assert_eq!(e2m1_encode(-0.1), 0x8); // negative zero keeps its sign
/// assert_eq!(e2m1_encode(f32::NAN), 0x7);
/// assert_eq!(e2m1_encode(-1e9), 0xF);
/// ```
#[inline(always)]
pub fn e2m1_encode(v: f32) -> u8 {
    let a = v.abs();
    // Each comparison is one decision boundary between neighbouring magnitudes; strict
    // `>` where the tie goes down (to the even code), `>=` where it goes up.
    let mag = (a > 0.25) as u8
        + (a >= 0.75) as u8
        + (a > 1.25) as u8
        + (a >= 1.75) as u8
        + (a > 2.5) as u8
        + (a >= 3.5) as u8
        + (a > 5.0) as u8;
    let sign = ((v.to_bits() >> 28) & 0x8) as u8;
    if v.is_nan() {
        0x7
    } else {
        mag | sign
    }
}

/// E2M1 of a value that is **not NaN**, by letting the FPU round: the E2M1 grid has spacing
/// `s = 0.5` on [0, 2), 1 on [2, 4) and 2 on [4, 8); adding `C = s · 2^23` makes the f32
/// adder round `|v|` to a multiple of `s`, ties to even (an even multiple is an even code),
/// and the ulps above `C` count grid steps. `|v|` is first clamped to 8 (codes above 7
/// saturate). Branch-free; the CUDA kernel uses the same algorithm. Equal to
/// [`e2m1_encode`] for every non-NaN f32 (checked over all 2^32 patterns in
/// `tests/codec_exhaustive.rs`); for NaN it returns 7 with the sign of `v`, so callers
/// must route NaN elsewhere.
#[inline(always)]
pub fn e2m1_encode_non_nan(v: f32) -> u8 {
    let a = v.abs().min(8.0);
    let e = (a.to_bits() >> 23).max(127);
    let c_bits = (e + 22) << 23;
    let steps = (a + f32::from_bits(c_bits)).to_bits().wrapping_sub(c_bits);
    let code = steps.wrapping_add(2 * (e - 127)).min(7) as u8;
    code | ((v.to_bits() >> 28) & 0x8) as u8
}

/// Decodes a 4-bit E2M1 code (the high nibble of `code` is ignored).
#[inline(always)]
pub fn e2m1_decode(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 0x7) as usize];
    if code & 0x8 != 0 {
        -m
    } else {
        m
    }
}

/// Encodes an f32 as E4M3 (fn variant, SPEC.md §2): NaN → `0x7F`; round to nearest, ties
/// to even, over all finite E4M3 values including subnormals; magnitudes above 448 and
/// ±Inf saturate to ±448 (`0x7E`/`0xFE`).
///
/// ```
/// use fp4norm::codec::{e4m3_encode, e4m3_decode};
/// assert_eq!(e4m3_encode(448.0), 0x7E);
/// assert_eq!(e4m3_encode(f32::INFINITY), 0x7E);
/// assert_eq!(e4m3_encode(-1000.0), 0xFE);
/// assert_eq!(e4m3_encode(2f32.powi(-9)), 0x01); // smallest subnormal
/// assert_eq!(e4m3_decode(e4m3_encode(1.0)), 1.0);
/// ```
#[inline(always)]
pub fn e4m3_encode(s: f32) -> u8 {
    let bits = s.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs_bits = bits & 0x7FFF_FFFF;
    if abs_bits > 0x7F80_0000 {
        return E4M3_NAN;
    }
    let a = f32::from_bits(abs_bits);
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    if abs_bits < 0x3C80_0000 {
        // Below 2^-6, the smallest normal: multiples of 2^-9. Scaling by 2^9 is exact
        // and rounding ties to even gives the subnormal code; 8 is the code of 2^-6.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Normal: rebias the exponent (127 → 7) and keep 3 mantissa bits, rounding the 20
    // dropped bits to nearest even. A carry out of the mantissa bumps the exponent, as it should.
    let rebiased = abs_bits - ((127 - 7) << 23);
    let rounded = (rebiased + 0x7FFFF + ((rebiased >> 20) & 1)) >> 20;
    sign | rounded.min(0x7E) as u8
}

/// Decodes an E4M3 (fn) code exactly; `0x7F` and `0xFF` are NaN.
#[inline(always)]
pub fn e4m3_decode(code: u8) -> f32 {
    let exp = ((code >> 3) & 0xF) as i32;
    let mant = (code & 0x7) as f32;
    let mag = if code & 0x7F == 0x7F {
        f32::NAN
    } else if exp == 0 {
        mant * (1.0 / 512.0)
    } else {
        (1.0 + mant / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// The UE8M0 block-scale code for `v = amax / 6` (SPEC.md §1.6): `255` if `v` is NaN,
/// `0` if `v` is zero (or negative), otherwise `clamp(e + 127, 0, 254)` where `e` is the
/// smallest integer with `2^e ≥ v` — the scale is rounded up, so the block never overflows.
///
/// ```
/// use fp4norm::codec::ue8m0_ceil_code;
/// assert_eq!(ue8m0_ceil_code(1.0), 127);
/// assert_eq!(ue8m0_ceil_code(1.5), 128);
/// assert_eq!(ue8m0_ceil_code(0.0), 0);
/// assert_eq!(ue8m0_ceil_code(f32::INFINITY), 254);
/// assert_eq!(ue8m0_ceil_code(f32::NAN), 255);
/// ```
#[inline(always)]
pub fn ue8m0_ceil_code(v: f32) -> u8 {
    let bits = v.to_bits();
    if v.is_nan() {
        return UE8M0_NAN;
    }
    if bits == 0 || bits & 0x8000_0000 != 0 {
        return 0;
    }
    let exp = bits >> 23;
    let mant = bits & 0x7F_FFFF;
    if exp == 0 {
        // Subnormal: v = mant · 2^-149 ≤ 2^-126. Only v > 2^-127 needs e = -126 (code 1);
        // every smaller v has e ≤ -127 and clamps to 0.
        return (mant > 0x40_0000) as u8;
    }
    // Normal (and +Inf, exp 255): e = exp - 127, plus one if v is not a power of two.
    (exp + (mant != 0) as u32).min(254) as u8
}

/// Decodes a UE8M0 code: `2^(code - 127)`, NaN for 255. Code 0 is `2^-127`, an f32 subnormal.
#[inline(always)]
pub fn ue8m0_decode(code: u8) -> f32 {
    match code {
        0 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        c => f32::from_bits((c as u32) << 23),
    }
}

/// `2^(127 - code)`, the reciprocal of a UE8M0 scale, exact in f32 (NaN for 255).
#[inline(always)]
pub fn ue8m0_inverse(code: u8) -> f32 {
    match code {
        254 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        c => f32::from_bits((254 - c as u32) << 23),
    }
}

/// `RNbf16(v)`: round an f32 to bf16, nearest even, overflow to ±Inf, NaN → canonical NaN.
/// Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if v.is_nan() {
        CANONICAL_NAN_16
    } else {
        rounded
    }
}

/// `RNf16(v)`: round an f32 to IEEE half, nearest even (subnormals kept), overflow to
/// ±Inf, NaN → canonical NaN.
#[inline(always)]
pub fn f32_to_f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let u = bits & 0x7FFF_FFFF;
    let out = if u > 0x7F80_0000 {
        return CANONICAL_NAN_16;
    } else if u >= 0x4780_0000 {
        // |v| ≥ 65536 (or Inf): beyond the rounding range of the largest half.
        0x7C00
    } else if u < 0x3880_0000 {
        // Below 2^-14: a half subnormal or zero. Adding 0.5 aligns the value's bits so
        // that the f32 adder itself rounds to a multiple of 2^-24, ties to even.
        const MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
        (f32::from_bits(u) + f32::from_bits(MAGIC))
            .to_bits()
            .wrapping_sub(MAGIC) as u16
    } else {
        // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even;
        // a carry into the exponent is the correct result (up to Inf).
        let odd = (u >> 13) & 1;
        (u.wrapping_sub((127 - 15) << 23).wrapping_add(0xFFF + odd) >> 13) as u16
    };
    out | sign
}

/// The largest finite E5M2 magnitude (SPEC.md §8): `1.75 · 2^15`.
pub const E5M2_MAX: f32 = 57344.0;

/// The NaN code the E5M2 encoder writes (`0x7D`–`0x7F` and `0xFD`–`0xFF` are all NaN).
pub const E5M2_NAN: u8 = 0x7F;

/// Encodes an f32 as E5M2 (SPEC.md §8: bias 15, 2 mantissa bits, min normal 2^-14,
/// subnormal step 2^-16): NaN → `0x7F`; round to nearest, ties to even, over all finite
/// E5M2 values including subnormals; magnitudes above 57344 and ±Inf saturate to ±57344
/// (`0x7B`/`0xFB`), so the encoder never writes the infinity codes `0x7C`/`0xFC`. The sign
/// bit is the sign bit of `v`, also when the result is zero (`-0.0 → 0x80`).
///
/// ```
/// use fp4norm::codec::{e5m2_decode, e5m2_encode};
/// assert_eq!(e5m2_encode(1.0), 0x3C);
/// assert_eq!(e5m2_encode(57344.0), 0x7B);
/// assert_eq!(e5m2_encode(f32::NEG_INFINITY), 0xFB); // saturates, never -Inf
/// assert_eq!(e5m2_encode(2f32.powi(-16)), 0x01); // smallest subnormal
/// assert_eq!(e5m2_encode(f32::NAN), 0x7F);
/// assert_eq!(e5m2_decode(e5m2_encode(1.25)), 1.25);
/// ```
#[inline(always)]
pub fn e5m2_encode(v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs_bits = bits & 0x7FFF_FFFF;
    if abs_bits > 0x7F80_0000 {
        return E5M2_NAN;
    }
    let a = f32::from_bits(abs_bits);
    if a >= E5M2_MAX {
        return sign | 0x7B;
    }
    if abs_bits < 0x3880_0000 {
        // Below 2^-14, the smallest normal: multiples of 2^-16. Scaling by 2^16 is exact
        // and rounding ties to even gives the subnormal code; 4 is the code of 2^-14.
        return sign | (a * 65536.0).round_ties_even() as u8;
    }
    // Normal: rebias the exponent (127 → 15) and keep 2 mantissa bits, rounding the 21
    // dropped bits to nearest even; a carry bumps the exponent. Above the largest finite
    // value (57344 < a < 61440 rounds to it anyway) the code saturates.
    let rebiased = abs_bits - ((127 - 15) << 23);
    let rounded = (rebiased + 0xF_FFFF + ((rebiased >> 21) & 1)) >> 21;
    sign | rounded.min(0x7B) as u8
}

/// Decodes an E5M2 code exactly: `0x7C`/`0xFC` are ±Inf, `0x7D`–`0x7F` and `0xFD`–`0xFF` NaN.
#[inline(always)]
pub fn e5m2_decode(code: u8) -> f32 {
    // E5M2 is the top byte of an IEEE half: widening is exact.
    let h = (code as u32) << 8;
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1F;
    let mant = (h & 0x3FF) as f32;
    let mag = if exp == 0x1F {
        if mant == 0.0 {
            f32::INFINITY
        } else {
            f32::NAN
        }
    } else if exp == 0 {
        mant * f32::from_bits((127 - 24) << 23) // 2^-24
    } else {
        (1.0 + mant / 1024.0) * f32::from_bits((exp + 127 - 15) << 23)
    };
    f32::from_bits(mag.to_bits() | sign)
}

/// The shared body of [`e4m3_encode_select`] and [`e5m2_encode_select`]: an FP8 format of
/// `MB` mantissa bits and exponent bias `BIAS`, saturating at code `MAX_CODE`, NaN written
/// as `0x7F`. Every path is computed and the result selected, so loops over it vectorise.
/// Subnormals: adding `C = step · 2^23` (step = 2^(1 - BIAS - MB)) makes the f32 adder
/// round `|v|` to a multiple of the step, ties to even, and the ulps above `C` are the
/// code. Normals: rebias and round the dropped mantissa bits to nearest even (integer).
#[inline(always)]
fn fp8_encode_select<const MB: u32, const BIAS: u32, const MAX_CODE: u32>(v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs_bits = bits & 0x7FFF_FFFF;
    let magic_bits = (127 + 24 - BIAS - MB) << 23;
    let sub = (f32::from_bits(abs_bits) + f32::from_bits(magic_bits))
        .to_bits()
        .wrapping_sub(magic_bits);
    let drop = 23 - MB;
    let rebiased = abs_bits.wrapping_sub((127 - BIAS) << 23);
    let normal = rebiased.wrapping_add((1 << (drop - 1)) - 1 + ((rebiased >> drop) & 1)) >> drop;
    let min_normal_bits = (127 + 1 - BIAS) << 23;
    let code = if abs_bits < min_normal_bits {
        sub
    } else {
        normal
    };
    let out = sign | code.min(MAX_CODE);
    if abs_bits > 0x7F80_0000 {
        0x7F
    } else {
        out as u8
    }
}

/// [`e4m3_encode`] without branches, for vectorised loops (the CPU fast path of the FP8
/// ops): the same code for every f32, NaN included (checked over all 2^32 patterns in
/// `tests/fp8_codec_exhaustive.rs`).
#[inline(always)]
pub fn e4m3_encode_select(v: f32) -> u8 {
    fp8_encode_select::<3, 7, 0x7E>(v)
}

/// [`e5m2_encode`] without branches, for vectorised loops: the same code for every f32,
/// NaN included (checked over all 2^32 patterns in `tests/fp8_codec_exhaustive.rs`).
#[inline(always)]
pub fn e5m2_encode_select(v: f32) -> u8 {
    fp8_encode_select::<2, 15, 0x7B>(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_magnitudes_round_trip() {
        for code in 0u8..16 {
            let v = e2m1_decode(code);
            // -0.0 encodes as 0x8, so every code round-trips.
            assert_eq!(e2m1_encode(v), code, "code {code:#x} value {v}");
        }
    }

    #[test]
    fn e4m3_codes_round_trip() {
        for code in 0u8..=255 {
            let v = e4m3_decode(code);
            if code & 0x7F == 0x7F {
                assert!(v.is_nan());
                assert_eq!(e4m3_encode(v), E4M3_NAN);
            } else {
                assert_eq!(e4m3_encode(v), code, "code {code:#x} value {v}");
            }
        }
    }

    #[test]
    fn ue8m0_decode_and_inverse_are_reciprocal() {
        for code in 0u8..255 {
            let d = ue8m0_decode(code) as f64;
            let inv = ue8m0_inverse(code) as f64;
            assert_eq!(d, 2f64.powi(code as i32 - 127));
            assert_eq!(d * inv, 1.0, "code {code}");
            assert_eq!(ue8m0_ceil_code(d as f32), code);
        }
        assert!(ue8m0_decode(255).is_nan());
        assert!(ue8m0_inverse(255).is_nan());
    }
}
