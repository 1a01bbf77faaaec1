//! Golden vectors worked out by hand from SPEC.md. Every expected byte is a literal (or
//! a formula written from the spec text) with the arithmetic in a comment; nothing here
//! is computed by the code under test. Whole-op cases run through `fp4norm::reference`,
//! `fp4norm::cpu` and the root re-exports.

mod backends;
mod common;

use backends::{Backend, Buffers, Elem, Gs, Mat};
use fp4norm::codec::{
    e2m1_encode, e4m3_encode, f32_to_bf16_bits, f32_to_f16_bits, ue8m0_ceil_code, ue8m0_decode,
    ue8m0_inverse,
};
use fp4norm::{
    cpu, dequantize, reference, BlockSize, DType, Element, Fp4Format, Fp4Out, GlobalScale, MatMut,
    MatRef, Options, Problem, ScaleFormat, ScaleIn, ScaleLayout, ScaleOut,
};
use half::{bf16, f16};

// ---------------------------------------------------------------------------------------
// Codecs (SPEC.md §2)
// ---------------------------------------------------------------------------------------

/// Next f32 up / down (positive finite inputs).
fn up(v: f32) -> f32 {
    f32::from_bits(v.to_bits() + 1)
}
fn down(v: f32) -> f32 {
    f32::from_bits(v.to_bits() - 1)
}

#[test]
fn e2m1_golden() {
    // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 are codes 0..7; bit 3 is the sign.
    let cases: &[(f32, u8)] = &[
        // Exact values.
        (0.0, 0x0),
        (0.5, 0x1),
        (1.0, 0x2),
        (1.5, 0x3),
        (2.0, 0x4),
        (3.0, 0x5),
        (4.0, 0x6),
        (6.0, 0x7),
        // Every tie goes to the even code:
        (0.25, 0x0), // 0 (code 0) vs 0.5 (code 1)  → 0
        (0.75, 0x2), // 0.5 (1) vs 1.0 (2)          → 1.0
        (1.25, 0x2), // 1.0 (2) vs 1.5 (3)          → 1.0
        (1.75, 0x4), // 1.5 (3) vs 2.0 (4)          → 2.0
        (2.5, 0x4),  // 2.0 (4) vs 3.0 (5)          → 2.0
        (3.5, 0x6),  // 3.0 (5) vs 4.0 (6)          → 4.0
        (5.0, 0x6),  // 4.0 (6) vs 6.0 (7)          → 4.0
        (-0.25, 0x8),
        (-0.75, 0xA),
        (-1.25, 0xA),
        (-1.75, 0xC),
        (-2.5, 0xC),
        (-3.5, 0xE),
        (-5.0, 0xE),
        // One ulp either side of a tie leaves it.
        (up(0.25), 0x1),
        (down(0.75), 0x1),
        (up(1.25), 0x3),
        (down(5.0), 0x6),
        (up(5.0), 0x7),
        // Signed zeros and negative values rounding to zero keep the sign bit.
        (-0.0, 0x8),
        (-0.1, 0x8),
        (0.1, 0x0),
        (-f32::from_bits(1), 0x8), // -2^-149
        // Saturation: |v| > 6 and ±Inf → magnitude 7 with the sign.
        (6.0001, 0x7),
        (-6.0001, 0xF),
        (1e30, 0x7),
        (f32::INFINITY, 0x7),
        (f32::NEG_INFINITY, 0xF),
        (-6.0, 0xF),
        // NaN → 0x7 (+6) whatever its sign.
        (f32::NAN, 0x7),
        (-f32::NAN, 0x7),
        (f32::from_bits(0x7F80_0001), 0x7),
    ];
    for &(v, want) in cases {
        assert_eq!(
            e2m1_encode(v),
            want,
            "e2m1_encode({v:e}) [bits {:#010x}]",
            v.to_bits()
        );
    }
}

#[test]
fn e4m3_golden() {
    let p = |e: i32| 2f32.powi(e);
    let cases: &[(f32, u8)] = &[
        (1.0, 0x38),      // 2^0: exponent field 0+7 = 7 → 0b0_0111_000
        (2.0, 0x40),      // exponent field 8
        (1.5, 0x3C),      // 1.5 = 2^0 · (1 + 4/8)
        (0.171875, 0x23), // 2^-3 · (1 + 3/8): exponent field 4, mantissa 3
        (240.0, 0x77),    // 2^7 · 1.875: exponent field 14, mantissa 7
        // Subnormals: multiples of 2^-9, exponent field 0.
        (p(-9), 0x01),         // smallest subnormal
        (p(-10), 0x00),        // tie between 0 and 2^-9 → even code 0
        (up(p(-10)), 0x01),    // just above the tie
        (3.0 * p(-10), 0x02),  // 1.5 · 2^-9: tie between code 1 (2^-9) and code 2 (2·2^-9) → 2
        (5.0 * p(-10), 0x02),  // 2.5 · 2^-9: tie between codes 2 and 3 → 2
        (7.0 * p(-10), 0x04),  // 3.5 · 2^-9: tie between codes 3 and 4 → 4
        (7.0 * p(-9), 0x07),   // largest subnormal 7·2^-9
        (15.0 * p(-10), 0x08), // 7.5 · 2^-9: tie between 0x07 (7·2^-9) and 0x08 (2^-6) → 8
        (p(-6), 0x08),         // smallest normal 2^-6
        (p(-20), 0x00),        // far below half the smallest subnormal
        (f32::from_bits(1), 0x00),
        // Normal ties: 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39) → 0x38;
        // 1.1875 between 1.125 (0x39) and 1.25 (0x3A) → 0x3A.
        (1.0625, 0x38),
        (1.1875, 0x3A),
        // Top of the range: 416 = 2^8·1.625 (0x7D), 448 = 2^8·1.75 (0x7E) is the maximum;
        // 432 is the tie 416/448 → even code 0x7E; above 448 saturates.
        (416.0, 0x7D),
        (432.0, 0x7E),
        (447.0, 0x7E),
        (448.0, 0x7E),
        (464.0, 0x7E), // would be the 448/480 tie, but 480 is not finite E4M3: saturate
        (480.0, 0x7E),
        (1e9, 0x7E),
        (f32::MAX, 0x7E),
        (f32::INFINITY, 0x7E),
        (-448.0, 0xFE),
        (-1e9, 0xFE),
        (f32::NEG_INFINITY, 0xFE),
        (-1.0, 0xB8),
        (-p(-9), 0x81),
        // Signed zero keeps its sign bit (E4M3 has -0 = 0x80).
        (0.0, 0x00),
        (-0.0, 0x80),
        (-p(-11), 0x80),
        // NaN → 0x7F, whatever its sign or payload.
        (f32::NAN, 0x7F),
        (-f32::NAN, 0x7F),
        (f32::from_bits(0xFF80_0001), 0x7F),
    ];
    for &(v, want) in cases {
        assert_eq!(
            e4m3_encode(v),
            want,
            "e4m3_encode({v:e}) [bits {:#010x}]",
            v.to_bits()
        );
    }
}

#[test]
fn ue8m0_golden() {
    let cases: &[(f32, u8)] = &[
        (1.0, 127),     // 2^0 ≥ 1: e = 0
        (up(1.0), 128), // 1 + 2^-23 needs 2^1
        (1.5, 128),
        (2.0, 128),
        (0.75, 127),
        (0.5, 126),
        (6.0, 130),                       // 2^3 = 8 ≥ 6 > 4
        (0.16666667, 125),                // ≈1/6: 2^-2 ≥ v > 2^-3
        (f32::from_bits(0x0080_0000), 1), // 2^-126, the smallest normal: e = -126
        (f32::from_bits(0x0080_0001), 2), // just above: e = -125
        (f32::from_bits(0x0040_0000), 0), // 2^-127 (subnormal): e = -127 → code 0
        (f32::from_bits(0x0040_0001), 1), // slightly above 2^-127: e = -126
        (f32::from_bits(0x0020_0000), 0), // 2^-128: e = -128 → clamped to 0
        (f32::from_bits(1), 0),           // 2^-149
        (0.0, 0),
        (-0.0, 0),
        (2f32.powi(127), 254),     // e = 127
        (up(2f32.powi(127)), 254), // e = 128 → 255, clamped to 254
        (f32::MAX, 254),
        (f32::INFINITY, 254),
        (f32::NAN, 255),
    ];
    for &(v, want) in cases {
        assert_eq!(
            ue8m0_ceil_code(v),
            want,
            "ue8m0_ceil_code({v:e}) [bits {:#010x}]",
            v.to_bits()
        );
    }
    // Decode 2^(c-127) and inverse 2^(127-c), as f32 bits.
    for (c, d, inv) in [
        (0u8, 0x0040_0000u32, 0x7F00_0000u32), // 2^-127 (subnormal), 2^127
        (1, 0x0080_0000, 0x7E80_0000),         // 2^-126, 2^126
        (127, 0x3F80_0000, 0x3F80_0000),       // 1, 1
        (128, 0x4000_0000, 0x3F00_0000),       // 2, 0.5
        (254, 0x7F00_0000, 0x0040_0000),       // 2^127, 2^-127
    ] {
        assert_eq!(ue8m0_decode(c).to_bits(), d, "ue8m0_decode({c})");
        assert_eq!(ue8m0_inverse(c).to_bits(), inv, "ue8m0_inverse({c})");
    }
    assert!(ue8m0_decode(255).is_nan() && ue8m0_inverse(255).is_nan());
}

#[test]
fn bf16_and_f16_rounding_golden() {
    // bf16: 7 stored mantissa bits, ulp at 1.0 is 2^-7.
    let p = |e: i32| 2f32.powi(e);
    for (v, want) in [
        (1.0f32, 0x3F80u16),
        (1.0 + p(-8), 0x3F80),       // tie 1.0 (even) / 1+2^-7 → 1.0
        (1.0 + 3.0 * p(-8), 0x3F82), // tie 1+2^-7 (odd) / 1+2^-6 (even) → 1+2^-6
        (1.0 + p(-8) + p(-20), 0x3F81),
        (-1.0 - p(-8), 0xBF80),
        (f32::MAX, 0x7F80), // rounds past the largest bf16: +Inf
        (-f32::MAX, 0xFF80),
        (f32::INFINITY, 0x7F80),
        (f32::from_bits(1), 0x0000), // 2^-149 → 0 (bf16's smallest subnormal is 2^-133)
        (f32::from_bits(0x8001_0000), 0x8001),
        (f32::NAN, 0x7FFF),
        (-f32::NAN, 0x7FFF),
        (f32::from_bits(0x7F80_0001), 0x7FFF), // signalling NaN → canonical NaN
    ] {
        assert_eq!(f32_to_bf16_bits(v), want, "bf16({v:e})");
    }
    // f16: 10 mantissa bits, max 65504, subnormal step 2^-24.
    for (v, want) in [
        (1.0f32, 0x3C00u16),
        (65504.0, 0x7BFF),
        (65519.0, 0x7BFF),
        (65520.0, 0x7C00), // tie 65504 (odd mantissa) / 65536 (= Inf) → Inf
        (1e6, 0x7C00),
        (-1e6, 0xFC00),
        (p(-14), 0x0400),       // smallest normal
        (p(-24), 0x0001),       // smallest subnormal
        (p(-25), 0x0000),       // tie 0 / 2^-24 → 0
        (3.0 * p(-25), 0x0002), // tie 2^-24 (odd) / 2^-23 → 2^-23
        (-p(-26), 0x8000),
        (1e-8, 0x0000),
        (f32::NAN, 0x7FFF),
        (f32::NEG_INFINITY, 0xFC00),
    ] {
        assert_eq!(f32_to_f16_bits(v), want, "f16({v:e})");
    }
}

// ---------------------------------------------------------------------------------------
// Whole op (SPEC.md §1, §3)
// ---------------------------------------------------------------------------------------

/// f32 → dtype bits through the `half` crate, asserting the value is exact (or NaN given as bits).
fn to_dt<T: Element>(v: f32) -> T {
    let bits = match T::DTYPE {
        DType::BF16 => bf16::from_f32(v).to_bits(),
        DType::F16 => f16::from_f32(v).to_bits(),
    };
    let t = T::from_bits(bits);
    assert!(
        v.is_nan() || t.to_f32() == v,
        "{v:e} is not exact in {}",
        T::DTYPE
    );
    t
}

fn vals<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| to_dt(x)).collect()
}

fn bits_of<T: Element>(v: &[T]) -> Vec<u16> {
    v.iter().map(|t| t.to_bits()).collect()
}

/// Bits of `v` in the dtype (`half`, exact values only).
fn dt_bits<T: Element>(v: &[f32]) -> Vec<u16> {
    bits_of(&vals::<T>(v))
}

/// What one call wrote.
#[derive(Debug, PartialEq)]
struct Out {
    residual: Option<Vec<u16>>,
    y_fp4: Vec<u8>,
    row_major: Option<Vec<u8>>,
    swizzled: Option<Vec<u8>>,
    y_out: Option<Vec<u16>>,
}

struct Call<'a, T> {
    m: usize,
    h: usize,
    x: &'a [T],
    residual: Option<&'a [T]>,
    w: &'a [T],
    layout: ScaleLayout,
    gs: GlobalScale<'a>,
    opts: Options,
    y_out: bool,
}

impl<T: Elem> Call<'_, T> {
    /// Runs the op on `backend`, outputs poisoned with 0xAA first.
    fn run(&self, backend: Backend) -> Out {
        let (m, h) = (self.m, self.h);
        let p = Problem::new(m, h, T::DTYPE, self.layout, &self.opts).unwrap();
        let mut b = Buffers {
            x: Mat::new(self.x.to_vec(), m, h),
            residual: self.residual.map(|r| Mat::new(r.to_vec(), m, h)),
            w: self.w.to_vec(),
            q: vec![0xAAu8; p.fp4_len()],
            layout: self.layout,
            rm: vec![0xAAu8; p.row_major_scales_len()],
            sw: vec![0xAAu8; p.swizzled_scales_len()],
            y_out: self
                .y_out
                .then(|| Mat::new(vec![T::from_bits(0xAAAA); m * h], m, h)),
            gs: match self.gs {
                GlobalScale::Uniform(g) => Gs::Uniform(g),
                GlobalScale::PerRow(g) => Gs::PerRow(g.to_vec()),
            },
            opts: self.opts,
        };
        b.run(backend).unwrap();
        Out {
            residual: b.residual.map(|r| bits_of(&r.data)),
            y_fp4: b.q,
            row_major: self.layout.has_row_major().then_some(b.rm),
            swizzled: self.layout.has_swizzled().then_some(b.sw),
            y_out: b.y_out.map(|y| bits_of(&y.data)),
        }
    }

    /// Runs on `backend` and compares every output that `want` names.
    fn check(&self, backend: Backend, name: &str, want: &Want) {
        {
            let got = self.run(backend);
            let ctx = format!(
                "{name} [{backend:?}, {}, {}, {}]",
                T::DTYPE,
                self.opts.format,
                self.layout
            );
            if let Some(r) = &want.residual {
                assert_eq!(
                    hex16(got.residual.as_ref().unwrap()),
                    hex16(r),
                    "{ctx}: residual"
                );
            }
            assert_eq!(hex8(&got.y_fp4), hex8(&want.y_fp4), "{ctx}: y_fp4");
            // A layout writes only its own buffer(s); `want` may list both.
            if let (Some(s), Some(g)) = (&want.row_major, &got.row_major) {
                assert_eq!(hex8(g), hex8(s), "{ctx}: row-major scales");
            }
            if let (Some(s), Some(g)) = (&want.swizzled, &got.swizzled) {
                assert_eq!(hex8(g), hex8(s), "{ctx}: swizzled scales");
            }
            if let Some(y) = &want.y_out {
                assert_eq!(hex16(got.y_out.as_ref().unwrap()), hex16(y), "{ctx}: y_out");
            }
        }
    }
}

#[derive(Default)]
struct Want {
    residual: Option<Vec<u16>>,
    y_fp4: Vec<u8>,
    row_major: Option<Vec<u8>>,
    swizzled: Option<Vec<u8>>,
    y_out: Option<Vec<u16>>,
}

fn hex8(v: &[u8]) -> String {
    v.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}
fn hex16(v: &[u16]) -> String {
    v.iter()
        .map(|b| format!("{b:04x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `row` repeated `n` times.
fn rep<X: Clone>(row: &[X], n: usize) -> Vec<X> {
    row.iter().cloned().cycle().take(row.len() * n).collect()
}

fn cat<X: Clone>(parts: &[&[X]]) -> Vec<X> {
    parts.concat()
}

/// A swizzled buffer for `m` rows and `nb` blocks holding `code(row, b)` and zero padding,
/// placed with the SPEC.md §3 formula.
fn swizzled_from(m: usize, nb: usize, code: impl Fn(usize, usize) -> u8) -> Vec<u8> {
    let mut s = vec![0u8; common::spec_swizzled_len(m, nb)];
    for row in 0..m {
        for b in 0..nb {
            s[common::spec_swizzled_offset(row, b, nb)] = code(row, b);
        }
    }
    s
}

/// Weights of the "exact rows" cases. Block 0 (16 values) holds every E2M1 tie and its
/// negative; block 1 holds values that are E2M1 values times 2, and zeros.
const W_EXACT: [f32; 32] = [
    6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
    -6.0, //
    12.0, 1.0, 3.0, 0.5, -0.5, 7.0, -12.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
];

/// Two rows, H = 32, eps = 0, every element equal per row:
///   row 0: x = 1.5, r = 0.5 → h = 2;  row 1: x = -3, r = 1 → h = -2.
///   ss = 32 · 4 = 128; ss/H = 4; sqrt = 2; rstd = 1/2 = 0.5 exactly.
///   y = RN32(RN32(±2 · 0.5) · w) = ±w exactly (row 1: -w, and -1 · 0 = -0).
fn exact_rows<T: Elem>(backend: Backend) {
    let (m, h) = (2, 32);
    let x = vals::<T>(&cat(&[&[1.5; 32], &[-3.0; 32]]));
    let r = vals::<T>(&cat(&[&[0.5; 32], &[1.0; 32]]));
    let w = vals::<T>(&W_EXACT);
    let neg_w: Vec<f32> = W_EXACT.iter().map(|v| -v).collect(); // -0.0 for the zeros
    let residual = dt_bits::<T>(&cat(&[&[2.0; 32], &[-2.0; 32]]));
    let y_out = cat(&[&dt_bits::<T>(&W_EXACT), &dt_bits::<T>(&neg_w)]);
    assert_eq!(y_out[32 + 23], 0x8000, "row 1 y_out of a zero weight is -0");

    // ---- 16-element blocks (NVFP4 and B16 + UE8M0): same codes, only the scale bytes differ.
    // Row 0 block 0: amax 6. E4M3: s = RN32(1·6)/6 = 1 → 0x38, inv = 1/1 = 1.
    //   UE8M0: v = 6/6 = 1 → e = 0 → 127, inv = 2^0 = 1. Codes = E2M1(w):
    //   6→7 .25→0 .75→2 1.25→2 1.75→4 2.5→4 3.5→6 5→6 | -.25→8 -.75→A -1.25→A -1.75→C -2.5→C -3.5→E -5→E -6→F
    //   bytes (low nibble = even element): 07 22 44 66 a8 ca ec fe
    // Row 0 block 1: amax 12. E4M3: s = 12/6 = 2 → 0x40, inv = 1/2. UE8M0: v = 2 → e = 1 → 128, inv 2^-1.
    //   w/2 = 6 .5 1.5 .25 -.25 3.5 -6 0×9 → 7 1 3 0 8 6 F 0×9 → bytes 17 03 68 0f 00 00 00 00
    // Row 1 block 0 (y = -w): F 8 A A C C E E 0 2 2 4 4 6 6 7 → 8f aa cc ee 20 42 64 76
    // Row 1 block 1: -w/2 = -6 -.5 -1.5 -.25 .25 -3.5 6 -0×9 → F 9 B 8 0 E 7 8×9 → 9f 8b e0 87 88 88 88 88
    let q16: Vec<u8> = vec![
        0x07, 0x22, 0x44, 0x66, 0xa8, 0xca, 0xec, 0xfe, 0x17, 0x03, 0x68, 0x0f, 0x00, 0x00, 0x00,
        0x00, //
        0x8f, 0xaa, 0xcc, 0xee, 0x20, 0x42, 0x64, 0x76, 0x9f, 0x8b, 0xe0, 0x87, 0x88, 0x88, 0x88,
        0x88,
    ];
    // ---- 32-element blocks (MXFP4 and B32 + E4M3): one block, amax 12.
    // E4M3: s = 2 → 0x40, inv 0.5. UE8M0: v = 2 → 128 (0x80), inv 0.5.
    // Row 0 first half, w/2 = 3 .125 .375 .625 .875 1.25 1.75 2.5 and negatives:
    //   3→5 .125→0 .375→1 .625→1 .875→2 1.25→2 (tie) 1.75→4 (tie) 2.5→4 (tie) | 8 9 9 A A C C D
    //   → 05 11 22 44 98 a9 ca dc; second half as block 1 above: 17 03 68 0f 00 00 00 00
    // Row 1 (negated): D 8 9 9 A A C C 0 1 1 2 2 4 4 5 → 8d 99 aa cc 10 21 42 54; then 9f 8b e0 87 88 88 88 88
    let q32: Vec<u8> = vec![
        0x05, 0x11, 0x22, 0x44, 0x98, 0xa9, 0xca, 0xdc, 0x17, 0x03, 0x68, 0x0f, 0x00, 0x00, 0x00,
        0x00, //
        0x8d, 0x99, 0xaa, 0xcc, 0x10, 0x21, 0x42, 0x54, 0x9f, 0x8b, 0xe0, 0x87, 0x88, 0x88, 0x88,
        0x88,
    ];
    // UE8M0 ignores the global scale: 0.1 must give the same bytes as 1.0.
    let cases: [(Fp4Format, &[u8], &Vec<u8>, f32); 4] = [
        (Fp4Format::NVFP4, &[0x38, 0x40, 0x38, 0x40], &q16, 1.0),
        (
            Fp4Format::new(BlockSize::B16, ScaleFormat::UE8M0),
            &[0x7F, 0x80, 0x7F, 0x80],
            &q16,
            0.1,
        ),
        (Fp4Format::MXFP4, &[0x80, 0x80], &q32, 0.1),
        (
            Fp4Format::new(BlockSize::B32, ScaleFormat::E4M3),
            &[0x40, 0x40],
            &q32,
            1.0,
        ),
    ];
    for (format, rm, q, gs) in cases {
        let nb = h / format.block_size();
        // Swizzled: one 128-row tile group, nK = 1; (row, b) sits at row·16 + b; the rest is 0.
        let mut sw = vec![0u8; 512];
        for row in 0..m {
            for b in 0..nb {
                sw[row * 16 + b] = rm[row * nb + b];
            }
        }
        for layout in [
            ScaleLayout::RowMajor,
            ScaleLayout::Swizzled,
            ScaleLayout::Both,
        ] {
            for gs in [GlobalScale::Uniform(gs), GlobalScale::PerRow(&[gs, gs])] {
                let call = Call {
                    m,
                    h,
                    x: &x,
                    residual: Some(&r),
                    w: &w,
                    layout,
                    gs,
                    opts: Options::default().with_format(format).with_eps(0.0),
                    y_out: true,
                };
                let want = Want {
                    residual: Some(residual.clone()),
                    y_fp4: q.clone(),
                    row_major: Some(rm.to_vec()),
                    swizzled: Some(sw.clone()),
                    y_out: Some(y_out.clone()),
                };
                call.check(backend, "exact rows", &want);
            }
        }
    }
}

fn exact_rows_bf16(backend: Backend) {
    exact_rows::<bf16>(backend);
}

fn exact_rows_f16(backend: Backend) {
    exact_rows::<f16>(backend);
}

/// The default eps 1e-6 with h = 1 everywhere (x = 0.5, r = 0.5), w = 1, H = 32:
///   ε = f64(1e-6f32) = 9.99999997475e-7; 1/sqrt(1 + ε) = 1 - ε/2 + 3ε²/8 ≈ 1 - 4.99999998e-7
///   = 1 - 8.3886 · 2^-24 → RN32 → 1 - 8 · 2^-24 = 1 - 2^-21 (bits 0x3F7FFFF8), so y = 1 - 2^-21.
/// NVFP4: s = RN32(y/6) ≈ 0.1666666; E4M3 neighbours 0.15625 (0x22), 0.171875 (0x23), midpoint
///   0.1640625 → 0x23; inv = RN32(1/0.171875) ≈ 5.8181820; y·inv ≈ 5.81818 > 5 → E2M1 6 (7).
/// MXFP4: v ≈ 0.1666666, 2^-3 < v ≤ 2^-2 → e = -2 → code 125 (0x7D); inv = 4; y·4 = 4 - 2^-19
///   → E2M1 4.0 (6).
/// y_out = RNdt(1 - 2^-21) = 1.0 (bf16 ulp below 1 is 2^-8, f16's 2^-11).
fn default_eps<T: Elem>(backend: Backend) {
    let (m, h) = (1, 32);
    let x = vals::<T>(&[0.5; 32]);
    let r = x.clone();
    let w = vals::<T>(&[1.0; 32]);
    let one = dt_bits::<T>(&[1.0; 32]);
    for (format, q, rm) in [
        (Fp4Format::NVFP4, vec![0x77u8; 16], vec![0x23u8, 0x23]),
        (Fp4Format::MXFP4, vec![0x66u8; 16], vec![0x7Du8]),
    ] {
        let call = Call {
            m,
            h,
            x: &x,
            residual: Some(&r),
            w: &w,
            layout: ScaleLayout::RowMajor,
            gs: GlobalScale::Uniform(1.0),
            opts: Options::default().with_format(format),
            y_out: true,
        };
        let want = Want {
            residual: Some(one.clone()),
            y_fp4: q,
            row_major: Some(rm),
            y_out: Some(one.clone()),
            ..Default::default()
        };
        call.check(backend, "default eps", &want);
    }
}

fn default_eps_bf16(backend: Backend) {
    default_eps::<bf16>(backend);
}

fn default_eps_f16(backend: Backend) {
    default_eps::<f16>(backend);
}

/// eps = 3 with h = 1 (no residual: x = 1), w = 1, H = 32: ss/H + eps = 1 + 3 = 4, sqrt = 2,
/// rstd = 0.5, y = 0.5 everywhere.
/// NVFP4: s = RN32(0.5/6) ≈ 0.0833333; E4M3 neighbours 0.078125 (0x1A) and 0.0859375 (0x1B),
///   midpoint 0.08203125 → 0x1B; inv = RN32(128/11) ≈ 11.636; y·inv ≈ 5.818 → 7.
/// MXFP4: v ≈ 0.0833333, 2^-4 < v ≤ 2^-3 → code 124 (0x7C), inv = 8, y·8 = 4 → 6.
fn eps_three<T: Elem>(backend: Backend) {
    let x = vals::<T>(&[1.0; 32]);
    let w = x.clone();
    let half = dt_bits::<T>(&[0.5; 32]);
    for (format, q, rm) in [
        (Fp4Format::NVFP4, vec![0x77u8; 16], vec![0x1Bu8, 0x1B]),
        (Fp4Format::MXFP4, vec![0x66u8; 16], vec![0x7Cu8]),
    ] {
        let call = Call {
            m: 1,
            h: 32,
            x: &x,
            residual: None,
            w: &w,
            layout: ScaleLayout::RowMajor,
            gs: GlobalScale::Uniform(1.0),
            opts: Options::default().with_format(format).with_eps(3.0),
            y_out: true,
        };
        call.check(
            backend,
            "eps 3",
            &Want {
                y_fp4: q,
                row_major: Some(rm),
                y_out: Some(half.clone()),
                ..Default::default()
            },
        );
    }
}

fn eps_three_both_dtypes(backend: Backend) {
    eps_three::<bf16>(backend);
    eps_three::<f16>(backend);
}

/// All-zero rows, H = 32, w = 1. Row 0: x = +0, r = +0 → h = +0. Row 1: x = -0, r = -0 →
/// h = -0 (RN(-0 + -0) = -0). ss = 0 in both.
///
/// eps = 0: ss/H + 0 = 0, sqrt(0) = 0, 1/0 = +Inf → rstd = +Inf; y = RN32(±0 · Inf) = NaN.
///   Every block's amax is NaN → E4M3 code 0x7F / UE8M0 code 255; inv is NaN, so every
///   element encodes NaN → E2M1 0x7 → bytes 0x77. y_out = RNdt(NaN) = 0x7FFF.
/// eps = 1e-6: rstd = RN32(1/sqrt(9.99999997e-7)) = RN32(1000.0000013) = 1000 (ulp there is
///   2^-14·... ≈ 6e-5); y = ±0 · 1000 · 1 = ±0 → amax 0.
///   E4M3: s = 1 · 0 / 6 = 0 → code 0x00, d = 0 → inv = 0 → q = E2M1(±0 · 0) = E2M1(±0).
///   UE8M0: v = 0 → code 0, inv = 2^127, q = E2M1(±0 · 2^127) = E2M1(±0).
///   Row 0 (+0): scale 0x00 and codes 0x0 → bytes 0x00. Row 1 (-0): scale 0x00, but every
///   E2M1 code is 0x8 (negative zero, SPEC.md §2) → bytes 0x88.
fn zero_rows<T: Elem>(backend: Backend) {
    let (m, h) = (2, 32);
    let x = vals::<T>(&cat(&[&[0.0; 32], &[-0.0; 32]]));
    let r = x.clone();
    let w = vals::<T>(&[1.0; 32]);
    let residual = cat(&[&[0x0000u16; 32][..], &[0x8000u16; 32][..]]);
    for format in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
        let nb = h / format.block_size();
        let nan_code = if format.scale == ScaleFormat::E4M3 {
            0x7F
        } else {
            0xFF
        };
        let opts = Options::default().with_format(format);
        let sw_nan = swizzled_from(m, nb, |_, _| nan_code);
        let sw_zero = swizzled_from(m, nb, |_, _| 0);
        for (eps, want) in [
            (
                0.0,
                Want {
                    residual: Some(residual.clone()),
                    y_fp4: vec![0x77; 32],
                    row_major: Some(vec![nan_code; m * nb]),
                    swizzled: Some(sw_nan),
                    y_out: Some(vec![0x7FFF; 64]),
                },
            ),
            (
                1e-6,
                Want {
                    residual: Some(residual.clone()),
                    y_fp4: cat(&[&[0x00u8; 16][..], &[0x88u8; 16][..]]),
                    row_major: Some(vec![0x00; m * nb]),
                    swizzled: Some(sw_zero),
                    y_out: Some(residual.clone()),
                },
            ),
        ] {
            let call = Call {
                m,
                h,
                x: &x,
                residual: Some(&r),
                w: &w,
                layout: ScaleLayout::Both,
                gs: GlobalScale::Uniform(1.0),
                opts: opts.with_eps(eps),
                y_out: true,
            };
            call.check(backend, &format!("zero rows eps={eps}"), &want);
        }
    }
}

fn zero_rows_bf16(backend: Backend) {
    zero_rows::<bf16>(backend);
}

fn zero_rows_f16(backend: Backend) {
    zero_rows::<f16>(backend);
}

/// Rows with NaN and infinities, H = 32, w = 1, r = 0 unless stated, x = 1 elsewhere,
/// default eps.
///   row 0: x[0] = +Inf. h[0] = Inf; ss = Inf → rstd = RN32(1/Inf) = 0. y[0] = Inf · 0 = NaN,
///          every other y = 1 · 0 · 1 = +0. NVFP4: block 0 amax NaN → 0x7F, all codes 7 (inv NaN);
///          block 1 amax 0 → 0x00, codes 0. MXFP4: the one block is NaN → 0xFF, codes 7.
///   row 1: x[17] = -Inf: the same with the blocks swapped (h[17] = -Inf).
///   row 2: x[5] = NaN (payload 0x..41/0x..01, not canonical): h[5] = RNdt(NaN + 0) = the
///          canonical NaN 0x7FFF; ss = NaN → rstd = NaN → every y NaN → every block NaN.
///   row 3: x[0] = +Inf, r[0] = -Inf: h[0] = RNdt(Inf - Inf) = NaN → as row 2.
fn specials<T: Elem>(backend: Backend) {
    let (m, h) = (4, 32);
    let (inf, ninf, nan_in) = match T::DTYPE {
        DType::BF16 => (0x7F80u16, 0xFF80u16, 0x7FC1u16),
        DType::F16 => (0x7C00, 0xFC00, 0x7E01),
    };
    let one = dt_bits::<T>(&[1.0])[0];
    let mut x = vec![one; m * h];
    let mut r = vec![0u16; m * h];
    x[0] = inf;
    x[h + 17] = ninf;
    x[2 * h + 5] = nan_in;
    x[3 * h] = inf;
    r[3 * h] = ninf;
    let xt: Vec<T> = x.iter().map(|&b| T::from_bits(b)).collect();
    let rt: Vec<T> = r.iter().map(|&b| T::from_bits(b)).collect();
    let w = vals::<T>(&[1.0; 32]);

    let mut residual = vec![one; m * h];
    residual[0] = inf;
    residual[h + 17] = ninf;
    residual[2 * h + 5] = 0x7FFF;
    residual[3 * h] = 0x7FFF;
    let mut y_out = vec![0x0000u16; m * h];
    y_out[0] = 0x7FFF;
    y_out[h + 17] = 0x7FFF;
    y_out[2 * h..].fill(0x7FFF);

    let nan_blk = [0x77u8; 8];
    let zero_blk = [0x00u8; 8];
    // NVFP4 (two blocks per row).
    let q16 = cat(&[
        &nan_blk, &zero_blk, &zero_blk, &nan_blk, &nan_blk, &nan_blk, &nan_blk, &nan_blk,
    ]);
    let rm16 = vec![0x7F, 0x00, 0x00, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F];
    // MXFP4 (one block per row): every row has a NaN y.
    let q32 = vec![0x77u8; 64];
    let rm32 = vec![0xFF; 4];
    for (format, q, rm) in [(Fp4Format::NVFP4, q16, rm16), (Fp4Format::MXFP4, q32, rm32)] {
        let nb = h / format.block_size();
        let sw = swizzled_from(m, nb, |row, b| rm[row * nb + b]);
        let call = Call {
            m,
            h,
            x: &xt,
            residual: Some(&rt),
            w: &w,
            layout: ScaleLayout::Both,
            gs: GlobalScale::Uniform(1.0),
            opts: Options::default().with_format(format),
            y_out: true,
        };
        let want = Want {
            residual: Some(residual.clone()),
            y_fp4: q,
            row_major: Some(rm.clone()),
            swizzled: Some(sw),
            y_out: Some(y_out.clone()),
        };
        call.check(backend, "NaN / Inf rows", &want);
    }
}

fn specials_bf16(backend: Backend) {
    specials::<bf16>(backend);
}

fn specials_f16(backend: Backend) {
    specials::<f16>(backend);
}

/// Special weights, h = 1 (x = 1, no residual), eps = 0 → rstd = 1, y = w (exact):
///   w = 1 except w[3] = +Inf and w[20] = NaN, H = 32.
///   16-blocks: block 0 amax = Inf. E4M3: s = Inf/6 = Inf → saturates to 0x7E (448),
///     inv = RN32(1/448) ≈ 0.00223; y·inv: Inf → Inf → 7, 1 · 0.00223 → 0.
///     UE8M0: v = Inf → 254 (0xFE), inv = 2^-127: Inf → 7, 2^-127 → 0.
///     Codes 0 0 0 7 0 … → bytes 00 70 00 00 00 00 00 00.
///     Block 1 has a NaN: 0x7F (E4M3) / 0xFF (UE8M0), codes all 7.
///   MXFP4: the single block has the NaN → 0xFF, codes 7.
fn special_weights<T: Elem>(backend: Backend) {
    let x = vals::<T>(&[1.0; 32]);
    let mut wb = dt_bits::<T>(&[1.0; 32]);
    wb[3] = dt_bits::<T>(&[f32::INFINITY])[0];
    wb[20] = 0x7FFF;
    let w: Vec<T> = wb.iter().map(|&b| T::from_bits(b)).collect();
    let blk0 = [0x00u8, 0x70, 0, 0, 0, 0, 0, 0];
    let nan_blk = [0x77u8; 8];
    for (format, q, rm) in [
        (Fp4Format::NVFP4, cat(&[&blk0, &nan_blk]), vec![0x7E, 0x7F]),
        (
            Fp4Format::new(BlockSize::B16, ScaleFormat::UE8M0),
            cat(&[&blk0, &nan_blk]),
            vec![0xFE, 0xFF],
        ),
        (Fp4Format::MXFP4, vec![0x77; 16], vec![0xFF]),
    ] {
        let call = Call {
            m: 1,
            h: 32,
            x: &x,
            residual: None,
            w: &w,
            layout: ScaleLayout::RowMajor,
            gs: GlobalScale::Uniform(1.0),
            opts: Options::default().with_format(format).with_eps(0.0),
            y_out: true,
        };
        call.check(
            backend,
            "special weights",
            &Want {
                y_fp4: q,
                row_major: Some(rm),
                y_out: Some(wb.clone()),
                ..Default::default()
            },
        );
    }
}

/// SPEC.md §8's weight bias on the FP4 op: y = w' = RN32(w + bias) with h = 1 (x = 1, no
/// residual), eps = 0 → rstd = 1; NVFP4, gs = 1, H = 16, one block.
///   Gemma's bias 1: w = [0 ×4, 0.5 ×4, -1 ×4, 2 ×4] → w' = [1 ×4, 1.5 ×4, +0 ×4, 3 ×4].
///     amax 3 → s = 3/6 = 0.5 = E4M3 0x30, inv 2 → y·inv = 2, 3, 0, 6 → codes 4, 5, 0, 7
///     → bytes 44 44 55 55 00 00 77 77.
///   Bias ±0 leaves the weight: w = [-0 ×8, 1 ×8] → y = [-0 ×8, 1 ×8], amax 1 →
///     s = RN(1/6) = 0.171875 = 0x23, inv = 5.818..: -0 → code 8, 1 → 5.8 → code 7
///     → bytes 88 88 88 88 77 77 77 77; y_out -0 = 0x8000.
///   A nonzero bias as small as 1e-40 does add: -0 + 1e-40 = 1e-40 (a positive
///     subnormal), 1 + 1e-40 = 1 → codes 0 and 7 → bytes 00 00 00 00 77 77 77 77;
///     y_out 1e-40 = bf16 0x0001 (its top 16 bits, 0x000116C2 rounding down), f16 +0.
fn weight_bias<T: Elem>(backend: Backend) {
    let x = vals::<T>(&[1.0; 16]);
    let is_bf16 = T::DTYPE == DType::BF16;
    let one = dt_bits::<T>(&[1.0])[0];
    let mut wgemma = vec![0.0f32; 4];
    wgemma.extend([0.5; 4]);
    wgemma.extend([-1.0; 4]);
    wgemma.extend([2.0; 4]);
    let mut wz = vec![-0.0f32; 8];
    wz.extend([1.0; 8]);
    let mut yo_gemma = dt_bits::<T>(&[1.0; 4]);
    yo_gemma.extend(dt_bits::<T>(&[1.5; 4]));
    yo_gemma.extend([0u16; 4]);
    yo_gemma.extend(dt_bits::<T>(&[3.0; 4]));
    let mut yo_zero = vec![0x8000u16; 8];
    yo_zero.extend([one; 8]);
    let mut yo_tiny = vec![if is_bf16 { 0x0001u16 } else { 0x0000 }; 8];
    yo_tiny.extend([one; 8]);
    for (bias, w, q, code, yo, what) in [
        (
            1.0f32,
            &wgemma,
            vec![0x44u8, 0x44, 0x55, 0x55, 0, 0, 0x77, 0x77],
            0x30u8,
            &yo_gemma,
            "bias 1",
        ),
        (
            0.0,
            &wz,
            vec![0x88, 0x88, 0x88, 0x88, 0x77, 0x77, 0x77, 0x77],
            0x23,
            &yo_zero,
            "bias +0",
        ),
        (
            -0.0,
            &wz,
            vec![0x88, 0x88, 0x88, 0x88, 0x77, 0x77, 0x77, 0x77],
            0x23,
            &yo_zero,
            "bias -0",
        ),
        (
            1e-40,
            &wz,
            vec![0, 0, 0, 0, 0x77, 0x77, 0x77, 0x77],
            0x23,
            &yo_tiny,
            "bias 1e-40",
        ),
    ] {
        let w = vals::<T>(w);
        let call = Call {
            m: 1,
            h: 16,
            x: &x,
            residual: None,
            w: &w,
            layout: ScaleLayout::RowMajor,
            gs: GlobalScale::Uniform(1.0),
            opts: Options::nvfp4().with_eps(0.0).with_weight_bias(bias),
            y_out: true,
        };
        call.check(
            backend,
            what,
            &Want {
                y_fp4: q,
                row_major: Some(vec![code]),
                y_out: Some(yo.clone()),
                ..Default::default()
            },
        );
    }
}

fn weight_bias_both_dtypes(backend: Backend) {
    weight_bias::<bf16>(backend);
    weight_bias::<f16>(backend);
}

fn special_weights_both_dtypes(backend: Backend) {
    special_weights::<bf16>(backend);
    special_weights::<f16>(backend);
}

/// rstd overflowing f32 (eps = 0, bf16, H = 16): x[0] = 2^-133 (bf16 0x0001), everything
/// else 0. ss = 2^-266, /16 = 2^-270, sqrt = 2^-135, 1/that = 2^135 > f32::MAX → RN32 = +Inf.
/// y[0] = 2^-133 · Inf = Inf; y[i] = 0 · Inf = NaN. amax NaN → 0x7F, every code 7;
/// y_out = [Inf 0x7F80, NaN 0x7FFF × 15].
fn rstd_overflows_to_inf(backend: Backend) {
    let mut xb = [0u16; 16];
    xb[0] = 0x0001;
    let x: Vec<bf16> = xb.iter().map(|&b| bf16::from_bits(b)).collect();
    let w = vals::<bf16>(&[1.0; 16]);
    let mut y_out = vec![0x7FFFu16; 16];
    y_out[0] = 0x7F80;
    let call = Call {
        m: 1,
        h: 16,
        x: &x,
        residual: None,
        w: &w,
        layout: ScaleLayout::RowMajor,
        gs: GlobalScale::Uniform(1.0),
        opts: Options::nvfp4().with_eps(0.0),
        y_out: true,
    };
    call.check(
        backend,
        "rstd = Inf",
        &Want {
            y_fp4: vec![0x77; 8],
            row_major: Some(vec![0x7F]),
            y_out: Some(y_out),
            ..Default::default()
        },
    );
}

/// Per-row global scales (NVFP4, H = 16, eps = 0, x = 1.5, r = 0.5 → h = 2, rstd = 0.5, y = w
/// with w = block 0 of W_EXACT, amax 6).
///   gs = 1:     s = 1 → 0x38, inv 1 → 07 22 44 66 a8 ca ec fe (every tie to even).
///   gs = 0.1:   RN32(0.1f · 6) = 0.6f (0.60000002), /6 → RN32 = 0.1f (0.10000000149);
///               E4M3 neighbours 0.09375 (0x1C), 0.1015625 (0x1D), midpoint 0.09765625 → 0x1D;
///               inv = RN32(0.1f / 0.1015625) ≈ 0.984615; y·inv = 5.908 .246 .738 1.231 1.723
///               2.462 3.446 4.923 → 7 0 1 2 3 4 5 6 (no tie any more), negatives 8 9 A B C D E F
///               → bytes 07 21 43 65 98 ba dc fe.
///   gs = 1000:  s = 6000/6 = 1000 → saturates to 448 (0x7E); inv = RN32(1000/448) ≈ 2.2321;
///               y·inv = 13.4 .558 1.674 2.790 3.906 5.580 7.8 11.2 → 7 1 3 5 6 7 7 7,
///               negatives 9 B D E F F F F → bytes 17 53 76 77 b9 ed ff ff.
///   gs = 2^-20: s = 2^-20 (exact) → below half of 2^-9 → E4M3 0x00; d = 0 → inv = 0 →
///               E2M1(±0): 0 for positive y, 0x8 for negative → bytes 00 00 00 00 88 88 88 88.
fn per_row_global_scale<T: Elem>(backend: Backend) {
    let (m, h) = (4, 16);
    let x = vals::<T>(&[1.5; 64]);
    let r = vals::<T>(&[0.5; 64]);
    let w = vals::<T>(&W_EXACT[..16]);
    let gs = [1.0f32, 0.1, 1000.0, 2f32.powi(-20)];
    let q: Vec<u8> = vec![
        0x07, 0x22, 0x44, 0x66, 0xa8, 0xca, 0xec, 0xfe, //
        0x07, 0x21, 0x43, 0x65, 0x98, 0xba, 0xdc, 0xfe, //
        0x17, 0x53, 0x76, 0x77, 0xb9, 0xed, 0xff, 0xff, //
        0x00, 0x00, 0x00, 0x00, 0x88, 0x88, 0x88, 0x88,
    ];
    let rm = vec![0x38, 0x1D, 0x7E, 0x00];
    let y_out = rep(&dt_bits::<T>(&W_EXACT[..16]), 4);
    let call = Call {
        m,
        h,
        x: &x,
        residual: Some(&r),
        w: &w,
        layout: ScaleLayout::Both,
        gs: GlobalScale::PerRow(&gs),
        opts: Options::nvfp4().with_eps(0.0),
        y_out: true,
    };
    let sw = swizzled_from(m, 1, |row, _| rm[row]);
    let want = Want {
        residual: Some(dt_bits::<T>(&[2.0; 64])),
        y_fp4: q.clone(),
        row_major: Some(rm.clone()),
        swizzled: Some(sw),
        y_out: Some(y_out),
    };
    call.check(backend, "per-row global scale", &want);
    // Each value as a uniform scale gives that row's bytes.
    for (i, &g) in gs.iter().enumerate() {
        let call = Call {
            m: 1,
            h,
            x: &x[..16],
            residual: Some(&r[..16]),
            gs: GlobalScale::Uniform(g),
            layout: ScaleLayout::RowMajor,
            ..call
        };
        call.check(
            backend,
            &format!("uniform gs {g:e}"),
            &Want {
                y_fp4: q[i * 8..i * 8 + 8].to_vec(),
                row_major: Some(vec![rm[i]]),
                ..Default::default()
            },
        );
    }
}

fn per_row_global_scale_both_dtypes(backend: Backend) {
    per_row_global_scale::<bf16>(backend);
    per_row_global_scale::<f16>(backend);
}

/// The swizzled layout with padding: M = 130 (not a multiple of 128), H = 80 → 5 NVFP4
/// blocks (not a multiple of 4). Mp = 256, nK = 2, buffer 256 · 2 · 4 = 2048 bytes.
/// h = 1 (no-residual variant x = 1, or x = 0.5 + r = 0.5), eps = 0 → rstd = 1, y = w,
/// w = 6 · 2^-b in block b; per-row gs = 2^-(row % 4).
///   s = RN32(gs · 6 · 2^-b)/6 = 2^k with k = -(b + row % 4) ∈ [-7, 0] (exact);
///   E4M3(2^k): 2^0 0x38, 2^-1 0x30, 2^-2 0x28, 2^-3 0x20, 2^-4 0x18, 2^-5 0x10, 2^-6 0x08,
///   2^-7 = 4 · 2^-9 → subnormal 0x04. inv = RN32(gs / 2^k) = 2^b; y · inv = 6 → code 7.
fn swizzled_padding_nvfp4(backend: Backend, with_residual: bool) {
    let (m, h, nb) = (130usize, 80usize, 5usize);
    const K2C: [u8; 8] = [0x38, 0x30, 0x28, 0x20, 0x18, 0x10, 0x08, 0x04];
    let code = |row: usize, b: usize| K2C[b + row % 4];
    let wv: Vec<f32> = (0..h)
        .map(|i| 6.0 * 2f32.powi(-((i / 16) as i32)))
        .collect();
    let w = vals::<bf16>(&wv);
    let (x, r) = if with_residual {
        (
            vals::<bf16>(&vec![0.5; m * h]),
            Some(vals::<bf16>(&vec![0.5; m * h])),
        )
    } else {
        (vals::<bf16>(&vec![1.0; m * h]), None)
    };
    let gs: Vec<f32> = (0..m).map(|row| 2f32.powi(-((row % 4) as i32))).collect();
    let rm: Vec<u8> = (0..m * nb).map(|i| code(i / nb, i % nb)).collect();
    let sw = swizzled_from(m, nb, code);
    assert_eq!(sw.len(), 2048);
    // Spot checks of the formula (row/128)·nK·512 + (b/4)·512 + (row%32)·16 + ((row%128)/32)·4 + b%4:
    assert_eq!(sw[0], 0x38); //             row 0, b 0: k = 0
    assert_eq!(sw[512], 0x18); //           row 0, b 4: second column tile, k = -4
    assert_eq!(sw[16 + 4 + 1], 0x28); //    row 33, b 1: k = -(1 + 1)
    assert_eq!(sw[511], 0x08); //           row 127, b 3: 31·16 + 3·4 + 3, k = -(3 + 3)
    assert_eq!(sw[512 + 3 * 16], 0x04); //  row 3, b 4: k = -7, subnormal E4M3
    assert_eq!(sw[1024 + 512 + 16], 0x10); // row 129, b 4: k = -(4 + 1)
    assert_eq!(&sw[513..516], &[0, 0, 0]); // row 0, blocks 5..7: column padding
    assert_eq!(sw[1024 + 2 * 16], 0); //    row 130, b 0: row padding
    assert!(sw[1024 + 512..]
        .iter()
        .enumerate()
        .all(|(i, &c)| c == 0 || (i % 16 == 0 && i < 32)));
    for layout in [ScaleLayout::Swizzled, ScaleLayout::Both] {
        let call = Call {
            m,
            h,
            x: &x,
            residual: r.as_deref(),
            w: &w,
            layout,
            gs: GlobalScale::PerRow(&gs),
            opts: Options::nvfp4().with_eps(0.0),
            y_out: true,
        };
        let want = Want {
            residual: r.as_ref().map(|_| dt_bits::<bf16>(&vec![1.0; m * h])),
            y_fp4: vec![0x77; m * h / 2],
            row_major: Some(rm.clone()),
            swizzled: Some(sw.clone()),
            y_out: Some(rep(&dt_bits::<bf16>(&wv), m)),
        };
        call.check(backend, "swizzled padding nvfp4", &want);
    }
}

fn swizzled_padding_nvfp4_with_residual(backend: Backend) {
    swizzled_padding_nvfp4(backend, true);
}

fn swizzled_padding_nvfp4_without_residual(backend: Backend) {
    swizzled_padding_nvfp4(backend, false);
}

/// MXFP4 swizzled with padding: M = 3, H = 96 → 3 blocks; Mp = 128, nK = 1, 512 bytes.
/// x = 1 (no residual), eps = 0 → y = w, w = 6 · 2^-b in block b: v = 2^-b → code 127 - b;
/// inv = 2^b; y · inv = 6 → 7. (row, b) is at row·16 + b; column 3 and rows 3.. are zero.
fn swizzled_padding_mxfp4(backend: Backend) {
    let (m, h) = (3, 96);
    let wv: Vec<f32> = (0..h)
        .map(|i| 6.0 * 2f32.powi(-((i / 32) as i32)))
        .collect();
    let x = vals::<f16>(&vec![1.0; m * h]);
    let w = vals::<f16>(&wv);
    let mut sw = vec![0u8; 512];
    for row in 0..3 {
        sw[row * 16..row * 16 + 3].copy_from_slice(&[0x7F, 0x7E, 0x7D]);
    }
    let call = Call {
        m,
        h,
        x: &x,
        residual: None,
        w: &w,
        layout: ScaleLayout::Both,
        gs: GlobalScale::Uniform(1.0),
        opts: Options::mxfp4().with_eps(0.0),
        y_out: false,
    };
    let want = Want {
        y_fp4: vec![0x77; m * h / 2],
        row_major: Some(rep(&[0x7F, 0x7E, 0x7D], 3)),
        swizzled: Some(sw),
        ..Default::default()
    };
    call.check(backend, "swizzled padding mxfp4", &want);
}

/// M = 0: nothing is written. Every output is empty (Mp = 0), and the residual and y_out
/// views of zero rows leave their (non-empty) buffers untouched.
fn zero_rows_m0_writes_nothing(backend: Backend) {
    let h = 64;
    for layout in [
        ScaleLayout::RowMajor,
        ScaleLayout::Swizzled,
        ScaleLayout::Both,
    ] {
        let p = Problem::new(0, h, DType::BF16, layout, &Options::nvfp4()).unwrap();
        assert_eq!(
            (
                p.fp4_len(),
                p.row_major_scales_len(),
                p.swizzled_scales_len()
            ),
            (0, 0, 0)
        );
        let view = |v: f32| Mat {
            data: vals::<bf16>(&[v; 64]),
            rows: 0,
            cols: h,
            stride: h,
        };
        let mut b = Buffers {
            x: view(1.0),
            residual: Some(view(3.0)),
            w: vals::<bf16>(&[1.0; 64]),
            q: vec![],
            layout,
            rm: vec![],
            sw: vec![],
            y_out: Some(view(5.0)),
            gs: Gs::PerRow(vec![]),
            opts: Options::nvfp4(),
        };
        let before = b.clone();
        b.run(backend).unwrap();
        assert_eq!(
            b.residual, before.residual,
            "{backend:?}: residual written with M = 0"
        );
        assert_eq!(
            b.y_out, before.y_out,
            "{backend:?}: y_out written with M = 0"
        );
    }
}

backend_tests!(
    exact_rows_bf16,
    exact_rows_f16,
    default_eps_bf16,
    default_eps_f16,
    eps_three_both_dtypes,
    zero_rows_bf16,
    zero_rows_f16,
    specials_bf16,
    specials_f16,
    special_weights_both_dtypes,
    weight_bias_both_dtypes,
    per_row_global_scale_both_dtypes,
    swizzled_padding_nvfp4_with_residual,
    swizzled_padding_nvfp4_without_residual,
    rstd_overflows_to_inf,
    swizzled_padding_mxfp4,
    zero_rows_m0_writes_nothing,
);

// ---------------------------------------------------------------------------------------
// Dequantisation (SPEC.md §4)
// ---------------------------------------------------------------------------------------

/// Codes 0..15 in order, two per byte, low nibble first.
const ALL_CODES: [u8; 8] = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE];

fn deq(
    m: usize,
    h: usize,
    format: Fp4Format,
    q: &[u8],
    scales: ScaleIn<'_>,
    gs: GlobalScale<'_>,
) -> Vec<u32> {
    let mut out = vec![f32::from_bits(0xDEAD_BEEF); m * h];
    dequantize(m, h, format, q, scales, gs, &mut out).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn dequantize_e4m3_golden() {
    // Scale 0x3C = 1.5, gs = 0.5: RN32(RN32(e · 1.5) / 0.5) = 3e, exact; -0 stays -0.
    let want = [
        0.0, 1.5, 3.0, 4.5, 6.0, 9.0, 12.0, 18.0, -0.0, -1.5, -3.0, -4.5, -6.0, -9.0, -12.0, -18.0,
    ];
    let got = deq(
        1,
        16,
        Fp4Format::NVFP4,
        &ALL_CODES,
        ScaleIn::RowMajor(&[0x3C]),
        GlobalScale::Uniform(0.5),
    );
    assert_eq!(got, f32_bits(&want));

    // Scale 0x38 = 1.0, gs = 3: e / 3 rounded: 0.5/3 = 1/6 → 0x3E2AAAAB (1.0101…₂ · 2^-3,
    // the 24th bit onwards 1010… rounds up), 1/3 → 0x3EAAAAAB, 1.5/3 = 0.5, 2/3 → 0x3F2AAAAB,
    // 3/3 = 1, 4/3 → 0x3FAAAAAB, 6/3 = 2.
    let got = deq(
        1,
        16,
        Fp4Format::NVFP4,
        &ALL_CODES,
        ScaleIn::RowMajor(&[0x38]),
        GlobalScale::Uniform(3.0),
    );
    let pos = [
        0x0000_0000u32,
        0x3E2A_AAAB,
        0x3EAA_AAAB,
        0x3F00_0000,
        0x3F2A_AAAB,
        0x3F80_0000,
        0x3FAA_AAAB,
        0x4000_0000,
    ];
    let neg: Vec<u32> = pos.iter().map(|b| b | 0x8000_0000).collect();
    assert_eq!(got, cat(&[&pos[..], &neg[..]]));

    // Scale code 0x7F is NaN → every value NaN; scale 0x00 (zero) → ±0.
    let got = deq(
        1,
        16,
        Fp4Format::NVFP4,
        &ALL_CODES,
        ScaleIn::RowMajor(&[0x7F]),
        GlobalScale::Uniform(1.0),
    );
    assert!(got.iter().all(|&b| f32::from_bits(b).is_nan()));
    let got = deq(
        1,
        16,
        Fp4Format::NVFP4,
        &ALL_CODES,
        ScaleIn::RowMajor(&[0x00]),
        GlobalScale::Uniform(1.0),
    );
    assert_eq!(got, cat(&[&[0u32; 8][..], &[0x8000_0000u32; 8][..]]));

    // Per-row gs and B32 + E4M3: two rows of 32 elements, every code 2 (1.0); row 0 scale
    // 0x40 (2.0) / gs 4 = 0.5, row 1 scale 0x30 (0.5) / gs 0.25 = 2.
    let f = Fp4Format::new(BlockSize::B32, ScaleFormat::E4M3);
    let got = deq(
        2,
        32,
        f,
        &[0x22; 32],
        ScaleIn::RowMajor(&[0x40, 0x30]),
        GlobalScale::PerRow(&[4.0, 0.25]),
    );
    assert_eq!(
        got,
        cat(&[&f32_bits(&[0.5; 32])[..], &f32_bits(&[2.0; 32])[..]])
    );
}

#[test]
fn dequantize_ue8m0_golden() {
    // Code 125 = 2^-2: e / 4, exact.
    let want = [
        0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.5, -0.0, -0.125, -0.25, -0.375, -0.5, -0.75,
        -1.0, -1.5,
    ];
    let both = cat(&[&ALL_CODES[..], &ALL_CODES[..]]);
    let got = deq(
        1,
        32,
        Fp4Format::MXFP4,
        &both,
        ScaleIn::RowMajor(&[125]),
        GlobalScale::Uniform(7.0),
    ); // gs unused
    assert_eq!(got, f32_bits(&cat(&[&want[..], &want[..]])));
    // Code 0 = 2^-127: 0.5 · 2^-127 = 2^-128 (0x00200000), 1 → 0x00400000, 1.5 → 0x00600000,
    // 2 → 2^-126 (0x00800000), 3 → 1.5·2^-126 (0x00C00000), 4 → 2^-125 (0x01000000),
    // 6 → 1.5·2^-125 (0x01400000).
    let pos = [
        0u32,
        0x0020_0000,
        0x0040_0000,
        0x0060_0000,
        0x0080_0000,
        0x00C0_0000,
        0x0100_0000,
        0x0140_0000,
    ];
    let neg: Vec<u32> = pos.iter().map(|b| b | 0x8000_0000).collect();
    let got = deq(
        1,
        32,
        Fp4Format::MXFP4,
        &both,
        ScaleIn::RowMajor(&[0]),
        GlobalScale::Uniform(1.0),
    );
    assert_eq!(got, cat(&[&pos[..], &neg[..], &pos[..], &neg[..]]));
    // Code 254 = 2^127: 0.5 → 2^126 (0x7E800000), 1 → 2^127 (0x7F000000), 1.5 → 0x7F400000,
    // 2 → 2^128 overflows → +Inf, and so do 3, 4, 6.
    let pos = [
        0u32,
        0x7E80_0000,
        0x7F00_0000,
        0x7F40_0000,
        0x7F80_0000,
        0x7F80_0000,
        0x7F80_0000,
        0x7F80_0000,
    ];
    let neg: Vec<u32> = pos.iter().map(|b| b | 0x8000_0000).collect();
    let got = deq(
        1,
        32,
        Fp4Format::MXFP4,
        &both,
        ScaleIn::RowMajor(&[254]),
        GlobalScale::Uniform(1.0),
    );
    assert_eq!(got, cat(&[&pos[..], &neg[..], &pos[..], &neg[..]]));
    // Code 255 is NaN.
    let got = deq(
        1,
        32,
        Fp4Format::MXFP4,
        &both,
        ScaleIn::RowMajor(&[255]),
        GlobalScale::Uniform(1.0),
    );
    assert!(got.iter().all(|&b| f32::from_bits(b).is_nan()));
}

/// Swizzled scales are read from the SPEC.md §3 offsets (and padding is never read).
#[test]
fn dequantize_swizzled_golden() {
    // NVFP4, M = 2, H = 80 → 5 blocks, nK = 2: 128 · 2 · 4 = 1024 bytes. Every element code
    // 2 (1.0), gs = 1, so value = the block's scale. (row, b) → offset:
    //   (0,0..3) → 0..3, (0,4) → 512, (1,0..3) → 16..19, (1,4) → 528. Padding is 0xEE garbage.
    let mut sw = vec![0xEEu8; 1024];
    sw[0..4].copy_from_slice(&[0x38, 0x40, 0x48, 0x50]); // 1 2 4 8
    sw[512] = 0x58; // 16
    sw[16..20].copy_from_slice(&[0x30, 0x28, 0x20, 0x18]); // 0.5 0.25 0.125 0.0625
    sw[528] = 0x01; // 2^-9
    let got = deq(
        2,
        80,
        Fp4Format::NVFP4,
        &[0x22; 80],
        ScaleIn::Swizzled(&sw),
        GlobalScale::Uniform(1.0),
    );
    let row = |v: [f32; 5]| -> Vec<f32> { v.iter().flat_map(|&s| [s; 16]).collect() };
    let want = cat(&[
        &row([1.0, 2.0, 4.0, 8.0, 16.0])[..],
        &row([0.5, 0.25, 0.125, 0.0625, 2f32.powi(-9)])[..],
    ]);
    assert_eq!(got, f32_bits(&want));

    // MXFP4, M = 1, H = 128 → 4 blocks, one 512-byte tile; (0, b) at offset b.
    // Codes 127 (1), 128 (2), 126 (0.5), 255 (NaN); every element code 3 (1.5).
    let mut sw = vec![0xEEu8; 512];
    sw[..4].copy_from_slice(&[127, 128, 126, 255]);
    let got = deq(
        1,
        128,
        Fp4Format::MXFP4,
        &[0x33; 64],
        ScaleIn::Swizzled(&sw),
        GlobalScale::Uniform(1.0),
    );
    assert_eq!(&got[..96], &f32_bits(&row4([1.5, 3.0, 0.75]))[..]);
    assert!(got[96..].iter().all(|&b| f32::from_bits(b).is_nan()));

    // Row 129 of a 130-row NVFP4 tensor with H = 16 (1 block, nK = 1, Mp = 256): offset
    // (129/128)·512 + 0 + (129%32)·16 + ((129%128)/32)·4 = 512 + 16 = 528.
    let mut sw = vec![0xEEu8; 256 * 4];
    for row in 0..130 {
        sw[(row / 128) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4] = 0x38;
        // 1.0
    }
    sw[528] = 0x40; // row 129 → 2.0
    let got = deq(
        130,
        16,
        Fp4Format::NVFP4,
        &[0x22; 130 * 8],
        ScaleIn::Swizzled(&sw),
        GlobalScale::Uniform(1.0),
    );
    assert_eq!(&got[..129 * 16], &f32_bits(&vec![1.0; 129 * 16])[..]);
    assert_eq!(&got[129 * 16..], &f32_bits(&[2.0; 16])[..]);
}

fn row4(v: [f32; 3]) -> Vec<f32> {
    v.iter().flat_map(|&s| [s; 32]).collect()
}

// ---------------------------------------------------------------------------------------
// Bytes moved (SPEC.md §6)
// ---------------------------------------------------------------------------------------

/// `bytes = M·H·3·e + H·e + M·H/2 + scale bytes (+ M·H·e for y_out)`, e = 2; without a
/// residual M·H·e replaces M·H·3·e.
/// M = 3, H = 64, NVFP4: 3·64·3·2 = 1152, 64·2 = 128, 3·64/2 = 96; row-major scales
/// 3·64/16 = 12, swizzled 128·1·4 = 512; y_out 3·64·2 = 384.
#[test]
fn bytes_moved_spec_section_6() {
    let o = Options::nvfp4();
    for (layout, scales) in [
        (ScaleLayout::RowMajor, 12u64),
        (ScaleLayout::Swizzled, 512),
        (ScaleLayout::Both, 524),
    ] {
        let p = Problem::new(3, 64, DType::BF16, layout, &o).unwrap();
        assert_eq!(p.scale_bytes_written() as u64, scales);
        assert_eq!(p.bytes_moved(), 1152 + 128 + 96 + scales, "{layout}");
        assert_eq!(
            p.with_y_out(true).bytes_moved(),
            1152 + 128 + 96 + scales + 384,
            "{layout} + y_out"
        );
        // Without a residual, M·H·e = 384 replaces M·H·3·e.
        assert_eq!(
            p.without_residual().bytes_moved(),
            384 + 128 + 96 + scales,
            "{layout}, no residual"
        );
    }
    // MXFP4, M = 130, H = 96, f16: 130·96·6 = 74880, 96·2 = 192, 130·48 = 6240,
    // row-major 130·3 = 390, swizzled 256·1·4 = 1024.
    let p = Problem::new(130, 96, DType::F16, ScaleLayout::Both, &Options::mxfp4()).unwrap();
    assert_eq!(p.bytes_moved(), 74880 + 192 + 6240 + 390 + 1024);
}

// ---------------------------------------------------------------------------------------
// The sum of squares (SPEC.md §1.2, read as the exact sum rounded once: src/sumsq.rs)
// ---------------------------------------------------------------------------------------

/// Against Python's `math.fsum` (correctly rounded), an oracle independent of this crate:
/// `scripts/sumsq-vectors.py` wrote the file (ties, near-ties, subnormals, wide and narrow
/// ranges, the order case below).
#[test]
fn exact_sum_of_squares_matches_math_fsum() {
    let text = include_str!("data/sumsq_vectors.txt");
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let dtype = f.next().unwrap();
        let want = u64::from_str_radix(f.next().unwrap(), 16).unwrap();
        let mut row = Vec::new();
        for run in f {
            let (bits, count) = run.split_once('*').unwrap();
            let bits = u16::from_str_radix(bits, 16).unwrap();
            let v = match dtype {
                "bf16" => bf16::from_bits(bits).to_f32(),
                "f16" => f16::from_bits(bits).to_f32(),
                other => panic!("unknown dtype {other}"),
            };
            row.extend(std::iter::repeat_n(v, count.parse().unwrap()));
        }
        let got = fp4norm::sumsq::exact_sum_of_squares(row.iter().copied());
        assert_eq!(
            got.to_bits(),
            want,
            "{line:.80}: got {got:e}, fsum {:e}",
            f64::from_bits(want)
        );
        n += 1;
    }
    assert!(n > 100, "only {n} vectors");
}

/// The row on which f64 summation orders disagree (scripts/order-case.py): bf16, H = 4096,
/// x = 2^34, 96468992, 468992, then 4093 × 181; residual 0, w = 1, eps = 1e-6,
/// gs = f32 0x3DCC00D3 (0.09961094707…).
///   Exact sum (math.fsum): 0x1.0002110333e3ep+68; element order in f64 gives
///   0x1.0002110333640p+68. rstd of the exact sum: RN32(1/sqrt(ss/4096 + 1e-6f)) =
///   3.725231456641609e-09 (the element-order sum: 3.725231678686214e-09, one f32 ulp up).
///   y_0 = RN32(2^34 · rstd) = 63.99898910522461 (the block's amax) → RN32(gs · y_0) =
///   6.375 → s = RN32(6.375 / 6) = 1.0625, the midpoint of E4M3 1.0 (0x38) and 1.125 (0x39): ties to even → 0x38 (the element
///   order's rstd gives y_0 = 63.998992919921875, s = 1.0625001 → 0x39: the byte this row used to differ in).
#[test]
fn order_case_takes_the_exact_sum() {
    let h = 4096;
    let mut xs = vec![181.0f32; h];
    xs[0] = 17179869184.0;
    xs[1] = 96468992.0;
    xs[2] = 468992.0;
    let x = vals::<bf16>(&xs);
    let w = vals::<bf16>(&vec![1.0; h]);
    let opts = Options::nvfp4();
    let gs = GlobalScale::Uniform(f32::from_bits(0x3DCC_00D3));
    let mut outs = Vec::new();
    for backend in ["reference", "cpu"] {
        let mut r = vals::<bf16>(&vec![0.0; h]);
        let mut q = vec![0xAAu8; h / 2];
        let mut sf = vec![0xAAu8; h / 16];
        let out = Fp4Out {
            y_fp4: &mut q,
            scales: ScaleOut::RowMajor(&mut sf),
            y_out: None,
        };
        let (xm, rm) = (
            MatRef::new(&x, 1, h).unwrap(),
            MatMut::new(&mut r, 1, h).unwrap(),
        );
        match backend {
            "reference" => reference::add_rmsnorm_fp4quant(xm, rm, &w, out, gs, &opts),
            _ => cpu::add_rmsnorm_fp4quant(xm, rm, &w, out, gs, &opts),
        }
        .unwrap();
        assert_eq!(sf[0], 0x38, "{backend}: block 0 scale");
        outs.push((q, sf));
    }
    assert_eq!(outs[0], outs[1], "reference and cpu bytes");
}
