//! Every f32 bit pattern through every encoder of `fp4norm::codec`, and every code through
//! every decoder, against independent formulations of SPEC.md §2 (see `common`).
//!
//! The 2^32 sweeps are split across cores with rayon; a failure names the first
//! mismatching bit pattern. Run in release: `cargo test --release -p fp4norm --no-default-features`.

mod common;

use common::{e2m1_oracle, e4m3_oracle, rn_bf16, rn_f16, ue8m0_oracle, Tables};
use fp4norm::{codec, Element};
use half::{bf16, f16};
use rayon::prelude::*;

const CHUNK: u64 = 1 << 22;

/// Checks `ok(bits)` for all 2^32 patterns, in parallel. Each chunk first counts failures
/// without branching (so the loop stays tight), and only a failing chunk is rescanned for
/// its first bad pattern. Panics with the smallest failing pattern and `describe` of it.
fn sweep_all_f32(what: &str, ok: impl Fn(u32) -> bool + Sync, describe: impl Fn(u32) -> String) {
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

/// The FPU-rounding encoder of the CPU fast path (and, in CUDA, of the sm_90 kernel)
/// against the oracle for every non-NaN f32.
#[test]
fn e2m1_encode_non_nan_all_f32() {
    let t = Tables::new();
    sweep_all_f32(
        "e2m1_encode_non_nan",
        |b| {
            let v = f32::from_bits(b);
            v.is_nan() || codec::e2m1_encode_non_nan(v) == e2m1_oracle(&t, v)
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {:#x}, expected {:#x}",
                codec::e2m1_encode_non_nan(v),
                e2m1_oracle(&t, v)
            )
        },
    );
}

#[test]
fn e2m1_encode_all_f32() {
    let t = Tables::new();
    sweep_all_f32(
        "e2m1_encode",
        |b| {
            let v = f32::from_bits(b);
            codec::e2m1_encode(v) == e2m1_oracle(&t, v)
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {:#x}, expected {:#x}",
                codec::e2m1_encode(v),
                e2m1_oracle(&t, v)
            )
        },
    );
}

#[test]
fn e4m3_encode_all_f32() {
    let t = Tables::new();
    sweep_all_f32(
        "e4m3_encode",
        |b| {
            let v = f32::from_bits(b);
            codec::e4m3_encode(v) == e4m3_oracle(&t, v)
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {:#04x}, expected {:#04x}",
                codec::e4m3_encode(v),
                e4m3_oracle(&t, v)
            )
        },
    );
}

#[test]
fn ue8m0_ceil_code_all_f32() {
    sweep_all_f32(
        "ue8m0_ceil_code",
        |b| {
            let v = f32::from_bits(b);
            codec::ue8m0_ceil_code(v) == ue8m0_oracle(v)
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {}, expected {}",
                codec::ue8m0_ceil_code(v),
                ue8m0_oracle(v)
            )
        },
    );
}

/// `RNbf16`: the `half` crate's round-to-nearest-even for every non-NaN input, the
/// canonical NaN 0x7FFF for every NaN; through the codec function and the `Element` impl.
#[test]
fn f32_to_bf16_bits_all_f32() {
    sweep_all_f32(
        "f32_to_bf16_bits",
        |b| {
            let v = f32::from_bits(b);
            let want = rn_bf16(v);
            codec::f32_to_bf16_bits(v) == want
                && <bf16 as Element>::round_from_f32(v).to_bits() == want
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {:#06x} (Element: {:#06x}), expected {:#06x}",
                codec::f32_to_bf16_bits(v),
                <bf16 as Element>::round_from_f32(v).to_bits(),
                rn_bf16(v)
            )
        },
    );
}

/// `RNf16`: as for bf16, with IEEE half subnormals and overflow to ±Inf.
#[test]
fn f32_to_f16_bits_all_f32() {
    sweep_all_f32(
        "f32_to_f16_bits",
        |b| {
            let v = f32::from_bits(b);
            let want = rn_f16(v);
            codec::f32_to_f16_bits(v) == want
                && <f16 as Element>::round_from_f32(v).to_bits() == want
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "got {:#06x} (Element: {:#06x}), expected {:#06x}",
                codec::f32_to_f16_bits(v),
                <f16 as Element>::round_from_f32(v).to_bits(),
                rn_f16(v)
            )
        },
    );
}

/// The exact widening `f32(x)` of every bf16 and f16 pattern (SPEC.md §1.1), against the
/// definitions: bf16 is the top half of an f32; f16 is `(-1)^s · 2^(e-15) · (1 + m/1024)`,
/// subnormals `m · 2^-24`. NaNs must stay NaN with their sign.
#[test]
fn element_to_f32_all_16_bit_patterns() {
    for bits in 0..=u16::MAX {
        let got = <bf16 as Element>::from_bits(bits).to_f32();
        let want = f32::from_bits((bits as u32) << 16);
        if want.is_nan() {
            assert!(
                got.is_nan() && got.is_sign_negative() == want.is_sign_negative(),
                "bf16 {bits:#06x} → {got}"
            );
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "bf16 {bits:#06x}");
        }

        let got = <f16 as Element>::from_bits(bits).to_f32();
        let (s, e, m) = (
            bits >> 15,
            ((bits >> 10) & 0x1F) as i32,
            (bits & 0x3FF) as f64,
        );
        let sign = if s == 1 { -1.0 } else { 1.0 };
        let want = match e {
            31 if m == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            0 => sign * m * 2f64.powi(-24),
            _ => sign * 2f64.powi(e - 15) * (1.0 + m / 1024.0),
        } as f32;
        if want.is_nan() {
            assert!(
                got.is_nan() && got.is_sign_negative() == (s == 1),
                "f16 {bits:#06x} → {got}"
            );
        } else {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "f16 {bits:#06x}: got {got:e}, expected {want:e}"
            );
        }
        // And it agrees with the `half` crate.
        let h = f16::from_bits(bits).to_f32();
        assert!(
            h.to_bits() == got.to_bits() || (h.is_nan() && got.is_nan()),
            "f16 {bits:#06x} vs half"
        );
    }
}

/// All 16 E2M1 codes, values written from the format definition (SPEC.md §2); the high
/// nibble of the argument is ignored.
#[test]
fn e2m1_decode_all_codes() {
    const WANT: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, //
        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    for code in 0u8..16 {
        assert_eq!(
            codec::e2m1_decode(code).to_bits(),
            WANT[code as usize].to_bits(),
            "code {code:#x}"
        );
        assert_eq!(
            codec::e2m1_decode(code | 0xA0).to_bits(),
            WANT[code as usize].to_bits(),
            "code {code:#x} | 0xA0"
        );
    }
    assert_eq!(
        codec::E2M1_MAGNITUDES,
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    );
    assert_eq!(codec::E2M1_MAX, 6.0);
}

/// All 256 E4M3 codes against `(-1)^s · 2^(e-7) · (1 + m/8)` (normal), `(-1)^s · m · 2^-9`
/// (subnormal), NaN for `0x7F`/`0xFF`.
#[test]
fn e4m3_decode_all_codes() {
    for code in 0..=255u8 {
        let (s, e, m) = (code >> 7, ((code >> 3) & 0xF) as i32, (code & 7) as f64);
        let got = codec::e4m3_decode(code);
        if e == 15 && m == 7.0 {
            assert!(got.is_nan(), "code {code:#04x} must be NaN, got {got}");
            continue;
        }
        let mag = if e == 0 {
            m * 2f64.powi(-9)
        } else {
            2f64.powi(e - 7) * (1.0 + m / 8.0)
        };
        let want = if s == 1 { -mag } else { mag } as f32;
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "code {code:#04x}: got {got:e}, expected {want:e}"
        );
    }
    assert_eq!(codec::e4m3_decode(0x7E), codec::E4M3_MAX);
    assert_eq!(codec::E4M3_NAN, 0x7F);
}

/// All 256 UE8M0 codes: `2^(c-127)` and its reciprocal `2^(127-c)`, exact in f32
/// (2^-127 is an f32 subnormal); 255 is NaN for both.
#[test]
fn ue8m0_decode_and_inverse_all_codes() {
    for code in 0..=255u8 {
        let (d, inv) = (codec::ue8m0_decode(code), codec::ue8m0_inverse(code));
        if code == 255 {
            assert!(d.is_nan() && inv.is_nan(), "code 255 must decode to NaN");
            continue;
        }
        let want = 2f64.powi(code as i32 - 127) as f32;
        let want_inv = 2f64.powi(127 - code as i32) as f32;
        assert_eq!(
            want as f64,
            2f64.powi(code as i32 - 127),
            "2^(c-127) exact in f32"
        );
        assert_eq!(d.to_bits(), want.to_bits(), "decode({code})");
        assert_eq!(inv.to_bits(), want_inv.to_bits(), "inverse({code})");
    }
    assert_eq!(codec::UE8M0_NAN, 255);
}
