//! The FP8 element encoders of SPEC.md §8 over all 2^32 f32 bit patterns, and their
//! decoders over all 256 codes, against independent formulations (`fp8_common` for E5M2,
//! `common` for E4M3): the reference encoders (`codec::e5m2_encode`, `codec::e4m3_encode`
//! through `Fp8Element::encode`) and the branch-free ones of the CPU fast path
//! (`codec::e4m3_encode_select`, `codec::e5m2_encode_select`), NaN, ±0, ±Inf, subnormals,
//! ties and saturation included. One sweep per format computes the model once and checks
//! every encoder. Run in release.

mod common;
mod fp8_common;

use common::{e4m3_oracle, e4m3_value, Tables};
use fp4norm::codec;
use fp4norm::fp8::Fp8Element;
use fp8_common::{e5m2_oracle, e5m2_value, sweep_all_f32, E5m2Table};

#[test]
fn e5m2_encoders_all_f32() {
    let t = E5m2Table::new();
    sweep_all_f32(
        "e5m2 encoders",
        |b| {
            let v = f32::from_bits(b);
            let want = e5m2_oracle(&t, v);
            codec::e5m2_encode(v) == want
                && codec::e5m2_encode_select(v) == want
                && Fp8Element::E5M2.encode(v) == want
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "e5m2_encode {:#04x}, e5m2_encode_select {:#04x}, Fp8Element {:#04x}; expected {:#04x}",
                codec::e5m2_encode(v),
                codec::e5m2_encode_select(v),
                Fp8Element::E5M2.encode(v),
                e5m2_oracle(&t, v)
            )
        },
    );
}

#[test]
fn e4m3_element_encoders_all_f32() {
    let t = Tables::new();
    sweep_all_f32(
        "e4m3 element encoders",
        |b| {
            let v = f32::from_bits(b);
            let want = e4m3_oracle(&t, v);
            codec::e4m3_encode_select(v) == want && Fp8Element::E4M3.encode(v) == want
        },
        |b| {
            let v = f32::from_bits(b);
            format!(
                "e4m3_encode_select {:#04x}, Fp8Element {:#04x}; expected {:#04x}",
                codec::e4m3_encode_select(v),
                Fp8Element::E4M3.encode(v),
                e4m3_oracle(&t, v)
            )
        },
    );
}

/// All 256 E5M2 codes against `(-1)^s · 2^(e-15) · (1 + m/4)` (normal), `(-1)^s · m · 2^-16`
/// (subnormal), ±Inf for e = 31, m = 0, NaN for e = 31, m ≠ 0; and through `Fp8Element`.
#[test]
fn e5m2_decode_all_codes() {
    for code in 0..=255u8 {
        let (s, e, m) = (code >> 7, ((code >> 2) & 0x1F) as i32, (code & 3) as f64);
        let got = codec::e5m2_decode(code);
        assert_eq!(got.to_bits(), Fp8Element::E5M2.decode(code).to_bits());
        if e == 31 && m != 0.0 {
            assert!(got.is_nan(), "code {code:#04x} must be NaN, got {got}");
            assert!(e5m2_value(code).is_nan());
            continue;
        }
        let mag = match e {
            31 => f64::INFINITY,
            0 => m * 2f64.powi(-16),
            _ => 2f64.powi(e - 15) * (1.0 + m / 4.0),
        };
        let want = if s == 1 { -mag } else { mag } as f32;
        assert_eq!(want as f64, if s == 1 { -mag } else { mag }, "exact in f32");
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "code {code:#04x}: got {got:e}, expected {want:e}"
        );
        assert_eq!(
            got.to_bits(),
            e5m2_value(code).to_bits(),
            "vs the test model"
        );
    }
    assert_eq!(codec::e5m2_decode(0x7B), codec::E5M2_MAX);
    assert_eq!(codec::E5M2_MAX, 57344.0);
    assert_eq!(codec::E5M2_NAN, 0x7F);
    assert_eq!(Fp8Element::E5M2.max(), 57344.0);
    assert_eq!(Fp8Element::E4M3.max(), 448.0);
}

/// All 256 E4M3 codes through `Fp8Element::decode`, against the definition (`common`).
#[test]
fn e4m3_element_decode_all_codes() {
    for code in 0..=255u8 {
        let got = Fp8Element::E4M3.decode(code);
        let want = e4m3_value(code);
        if code & 0x7F == 0x7F {
            assert!(got.is_nan() && want.is_nan(), "code {code:#04x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "code {code:#04x}");
        }
    }
}

/// Every code back through every encoder: finite codes round-trip (−0 included), the
/// E5M2 infinities saturate to ±57344, NaN codes give 0x7F.
#[test]
fn fp8_codes_round_trip() {
    for code in 0..=255u8 {
        let v = codec::e5m2_decode(code);
        let want = match code & 0x7F {
            0x7C => (code & 0x80) | 0x7B,
            c if c > 0x7C => 0x7F,
            _ => code,
        };
        assert_eq!(codec::e5m2_encode(v), want, "e5m2 code {code:#04x}");
        assert_eq!(
            codec::e5m2_encode_select(v),
            want,
            "e5m2 select {code:#04x}"
        );
        let v = codec::e4m3_decode(code);
        let want = if code & 0x7F == 0x7F { 0x7F } else { code };
        assert_eq!(codec::e4m3_encode(v), want, "e4m3 code {code:#04x}");
        assert_eq!(
            codec::e4m3_encode_select(v),
            want,
            "e4m3 select {code:#04x}"
        );
    }
}
