//! Golden vectors of the FP8 ops (SPEC.md §8), worked out by hand. Every expected byte is
//! a literal (or a formula written from the spec text: a sign flip, an exponent step) with
//! the arithmetic in a comment; nothing is computed by the code under test. Whole-op cases
//! run through `fp8::reference`, `fp8::cpu` and the root re-exports, on bf16 and f16.
//!
//! Most rows are built so that steps 1–4 are exact: `x + r = ±2^k` everywhere in a row and
//! `eps = 0`, so `ss / H = 4^k`, `rstd = 2^-k` and `h · rstd = ±1`: `y = ±w'` exactly.

use fp4norm::codec::{e5m2_decode, e5m2_encode};
use fp4norm::fp8::{
    self, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
    Fp8Scales, Fp8ScalesIn, Fp8Scaling,
};
use fp4norm::{DType, Element, MatMut, MatRef};
use half::{bf16, f16};

#[derive(Clone, Copy, Debug)]
enum Backend {
    Reference,
    Cpu,
    Root,
}

const BACKENDS: [Backend; 3] = [Backend::Reference, Backend::Cpu, Backend::Root];

/// f32 → dtype, asserting the value is exact (NaN allowed).
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

/// RNdt bits of exact values (NaN → canonical 0x7FFF), what y_out holds when y = w.
fn dt_bits<T: Element>(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| {
            if x.is_nan() {
                0x7FFF
            } else {
                to_dt::<T>(x).to_bits()
            }
        })
        .collect()
}

fn rep<X: Clone>(row: &[X], n: usize) -> Vec<X> {
    row.iter().cloned().cycle().take(row.len() * n).collect()
}

/// What one call wrote: codes, scales (f32 bits or UE8M0 codes), y_out bits, residual bits.
#[derive(Debug, PartialEq)]
struct Got {
    q: Vec<u8>,
    scales: Vec<u32>,
    y_out: Vec<u16>,
    residual: Vec<u16>,
}

struct Call<'a> {
    m: usize,
    h: usize,
    /// Row values of x and r (`m · h` each); `r = None` is rmsnorm_fp8quant.
    x: &'a [f32],
    r: Option<&'a [f32]>,
    w: &'a [f32],
    opts: Fp8Options,
}

impl Call<'_> {
    /// Runs on `backend` with outputs poisoned (0xAA), sized by the spec's formulas.
    fn run<T: Element>(&self, backend: Backend) -> Got {
        let (m, h) = (self.m, self.h);
        let x = vals::<T>(self.x);
        let mut r = self.r.map(vals::<T>).unwrap_or_default();
        let w = vals::<T>(self.w);
        let mut q = vec![0xAAu8; m * h];
        let mut yo = vec![T::from_bits(0xAAAA); m * h];
        let n = match self.opts.scaling {
            Fp8Scaling::PerTensor(_) => 0,
            Fp8Scaling::Dynamic { group, layout, .. } => {
                let n = h / group.size(h);
                match layout {
                    Fp8ScaleLayout::RowMajor => m * n,
                    Fp8ScaleLayout::ColumnMajor => 4 * m.div_ceil(4) * n,
                    Fp8ScaleLayout::Swizzled => 128 * m.div_ceil(128) * 4 * n.div_ceil(4),
                    Fp8ScaleLayout::ColumnMajorPacked => 4 * n.div_ceil(4) * 4 * m.div_ceil(4),
                }
            }
        };
        let mut sf = vec![f32::from_bits(0xAAAA_AAAA); n];
        let mut su = vec![0xAAu8; n];
        let ue8m0 = matches!(
            self.opts.scaling,
            Fp8Scaling::Dynamic {
                format: Fp8ScaleFormat::UE8M0,
                ..
            }
        );
        let scales = match self.opts.scaling {
            Fp8Scaling::PerTensor(_) => Fp8Scales::None,
            _ if ue8m0 => Fp8Scales::UE8M0(&mut su),
            _ => Fp8Scales::F32(&mut sf),
        };
        let out = Fp8Out {
            q: &mut q,
            scales,
            y_out: Some(MatMut::new(&mut yo, m, h).unwrap()),
        };
        let xv = MatRef::new(&x, m, h).unwrap();
        let o = &self.opts;
        let res = match (self.r.is_some(), backend) {
            (true, be) => {
                let rv = MatMut::new(&mut r, m, h).unwrap();
                match be {
                    Backend::Reference => fp8::reference::add_rmsnorm_fp8quant(xv, rv, &w, out, o),
                    Backend::Cpu => fp8::cpu::add_rmsnorm_fp8quant(xv, rv, &w, out, o),
                    Backend::Root => fp4norm::add_rmsnorm_fp8quant(xv, rv, &w, out, o),
                }
            }
            (false, Backend::Reference) => fp8::reference::rmsnorm_fp8quant(xv, &w, out, o),
            (false, Backend::Cpu) => fp8::cpu::rmsnorm_fp8quant(xv, &w, out, o),
            (false, Backend::Root) => fp4norm::rmsnorm_fp8quant(xv, &w, out, o),
        };
        res.unwrap();
        Got {
            q,
            scales: if ue8m0 {
                su.iter().map(|&c| c as u32).collect()
            } else {
                sf.iter().map(|v| v.to_bits()).collect()
            },
            y_out: yo.iter().map(|v| v.to_bits()).collect(),
            residual: r.iter().map(|v| v.to_bits()).collect(),
        }
    }

    /// Runs on every backend and both dtypes (bf16 only where `bf16_only`) and compares
    /// codes, scales and, where given, y_out (as f32 values of y) and the residual.
    fn check(
        &self,
        name: &str,
        want_q: &[u8],
        want_scales: &[u32],
        y: Option<&[f32]>,
        bf16_only: bool,
    ) {
        for be in BACKENDS {
            self.check_dt::<bf16>(name, be, want_q, want_scales, y);
            if !bf16_only {
                self.check_dt::<f16>(name, be, want_q, want_scales, y);
            }
        }
    }

    fn check_dt<T: Element>(
        &self,
        name: &str,
        be: Backend,
        want_q: &[u8],
        want_scales: &[u32],
        y: Option<&[f32]>,
    ) {
        let got = self.run::<T>(be);
        let ctx = format!("{name} [{be:?}, {}]", T::DTYPE);
        assert_eq!(hex8(&got.q), hex8(want_q), "{ctx}: q");
        assert_eq!(got.scales, want_scales, "{ctx}: scales");
        if let Some(y) = y {
            assert_eq!(got.y_out, dt_bits::<T>(y), "{ctx}: y_out");
        }
        if let Some(r) = self.r {
            let h: Vec<f32> = self.x.iter().zip(r).map(|(a, b)| a + b).collect();
            assert_eq!(
                got.residual,
                dt_bits::<T>(&h),
                "{ctx}: residual (sums exact here)"
            );
        }
    }
}

fn hex8(v: &[u8]) -> String {
    v.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn p2(e: i32) -> f32 {
    2f32.powi(e)
}

/// `rows` rows of H elements: row `i` has `x + r = signs[i] · 2^k` (x = 0.25·s·2^k, r = 0.75·s·2^k).
fn exact_rows(h: usize, signs: &[f32], k: i32) -> (Vec<f32>, Vec<f32>) {
    let x = signs
        .iter()
        .flat_map(|&s| vec![0.25 * s * p2(k); h])
        .collect();
    let r = signs
        .iter()
        .flat_map(|&s| vec![0.75 * s * p2(k); h])
        .collect();
    (x, r)
}

/// Codes of row 0 with the sign bit flipped, NaN (0x7F) kept: the codes of `y = -w`.
fn negated(codes: &[u8]) -> Vec<u8> {
    codes
        .iter()
        .map(|&c| if c == 0x7F { 0x7F } else { c ^ 0x80 })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Per-tensor static scale
// ---------------------------------------------------------------------------------------

/// 32 weights and, for `y = w` and the static scale s = 0.5 (inv = RN32(1/0.5) = 2), the
/// E4M3 and E5M2 codes of `2w`.
/// E4M3: code = sign | (e + 7) << 3 | m for 2^e · (1 + m/8); subnormals m · 2^-9.
/// E5M2: code = sign | (e + 15) << 2 | m for 2^e · (1 + m/4); subnormals m · 2^-16.
#[rustfmt::skip]
const STATIC_TABLE: [(f32, u8, u8); 32] = [
    //  w               2w               E4M3                              E5M2
    (0.5,            0x38, 0x3C), // 1.0:    e=0 → 0x38                  e=0 → 15<<2 = 0x3C
    (0.53125,        0x38, 0x3C), // 1.0625: E4M3 tie 1.0/1.125 → even 0x38; E5M2 below 1.125 → 1.0
    (0.59375,        0x3A, 0x3D), // 1.1875: E4M3 tie 1.125/1.25 → 0x3A; E5M2 above 1.125 → 1.25
    (224.0,          0x7E, 0x5F), // 448 = 1.75·2^8: E4M3 max; E5M2 (23<<2)|3 = 0x5F
    (240.0,          0x7E, 0x60), // 480: E4M3 saturates; E5M2 tie 448 (0x5F) / 512 (0x60) → even 0x60
    (32768.0,        0x7E, 0x7B), // 65536: both saturate (E5M2 max 57344)
    (0.0009765625,   0x01, 0x18), // 2^-9: E4M3 smallest subnormal; E5M2 e=-9 → 6<<2
    (0.00048828125,  0x00, 0x14), // 2^-10: E4M3 tie 0 / 2^-9 → 0; E5M2 5<<2
    (-1.0 / 4096.0,  0x80, 0x90), // -2^-11: E4M3 rounds to -0; E5M2 -(4<<2)
    (0.0,            0x00, 0x00), // +0
    (-0.0,           0x80, 0x80), // -0 weight, bias 0: y = -0 keeps its sign
    (15.0 / 2048.0,  0x08, 0x24), // 15·2^-11 → 7.5·2^-9: E4M3 tie 0x07/0x08 → 0x08;
                                  //   E5M2 1.875·2^-7 tie (8<<2)|3 / 9<<2 → even 0x24
    (-1.5,           0xC4, 0xC2), // -3 = -1.5·2: E4M3 0x80|(8<<3)|4; E5M2 0x80|(16<<2)|2
    (120.0,          0x77, 0x5C), // 240 = 1.875·2^7: E4M3 (14<<3)|7; E5M2 tie 0x5B/0x5C → 0x5C
    (208.0,          0x7D, 0x5E), // 416 = 1.625·2^8: E4M3 (15<<3)|5; E5M2 tie 0x5E/0x5F → 0x5E
    (216.0,          0x7E, 0x5F), // 432: E4M3 tie 416/448 → 0x7E; E5M2 1.6875 → 1.75 (0x5F)
    (232.0,          0x7E, 0x5F), // 464: E4M3 saturates; E5M2 1.8125·2^8 → 1.75 (0x5F)
    (f32::NAN,       0x7F, 0x7F), // NaN weight → y NaN → NaN code
    (f32::INFINITY,  0x7E, 0x7B), // +Inf → saturates
    (f32::NEG_INFINITY, 0xFE, 0xFB),
    (1.0 / 131072.0, 0x00, 0x01), // 2^-17 → 2^-16: E4M3 far below 2^-10 → 0; E5M2 smallest subnormal
    (1.0 / 262144.0, 0x00, 0x00), // 2^-18 → 2^-17: E5M2 tie 0 / 2^-16 → 0
    (3.0 / 262144.0, 0x00, 0x02), // 3·2^-18 → 3·2^-17: E5M2 tie codes 1 / 2 → 2
    (28672.0,        0x7E, 0x7B), // 57344: E5M2 max
    (30720.0,        0x7E, 0x7B), // 61440: above 57344 → saturates (no 65536)
    (-0.5,           0xB8, 0xBC), // -1
    (0.25,           0x30, 0x38), // 0.5 = 2^-1: E4M3 6<<3; E5M2 14<<2
    (1.0,            0x40, 0x40), // 2: E4M3 8<<3; E5M2 16<<2
    (3.0,            0x4C, 0x46), // 6 = 1.5·4: E4M3 (9<<3)|4; E5M2 (17<<2)|2
    (-224.0,         0xFE, 0xDF), // -448
    (0.0078125,      0x08, 0x24), // 2^-6: E4M3 smallest normal 1<<3; E5M2 9<<2
    (1.5,            0x44, 0x42), // 3
];

#[test]
fn per_tensor_static_scale_both_elements() {
    let h = 32;
    let w: Vec<f32> = STATIC_TABLE.iter().map(|t| t.0).collect();
    // Row 0: x + r = 1; row 1: x + r = -2 (rstd 1/2): y = w and y = -w.
    let (x, r) = exact_rows(h, &[1.0, -2.0], 0);
    let y: Vec<f32> = w.iter().copied().chain(w.iter().map(|v| -v)).collect();
    for (element, col) in [(Fp8Element::E4M3, 1), (Fp8Element::E5M2, 2)] {
        let row0: Vec<u8> = STATIC_TABLE
            .iter()
            .map(|t| if col == 1 { t.1 } else { t.2 })
            .collect();
        let q = [row0.clone(), negated(&row0)].concat();
        // The weight bias 0 of either sign adds nothing: the -0 weight stays -0.
        for bias in [0.0, -0.0] {
            let call = Call {
                m: 2,
                h,
                x: &x,
                r: Some(&r),
                w: &w,
                opts: Fp8Options::per_tensor(element, 0.5)
                    .with_eps(0.0)
                    .with_weight_bias(bias),
            };
            call.check(
                &format!("static 0.5 {element} bias {bias}"),
                &q,
                &[],
                Some(&y),
                false,
            );
            // Without the residual, h = x: rows of 0.25 and -0.5, still rstd · h = ±1.
            let call = Call { r: None, ..call };
            call.check(
                &format!("static 0.5 {element} no residual"),
                &q,
                &[],
                Some(&y),
                false,
            );
        }
    }
}

/// Scales a caller should not pass flow through `inv = RN32(1/s)` (read like `gs`,
/// SPEC.md §5). H = 5: per-tensor scales accept any H. y = w = [1, -1, 0, -0, 0.5].
#[test]
fn per_tensor_odd_scales_flow_through() {
    let w = [1.0, -1.0, 0.0, -0.0, 0.5];
    let (x, r) = exact_rows(5, &[1.0], 1); // x + r = 2, rstd = 1/2
    let cases: [(f32, [u8; 5]); 6] = [
        // s = 0: inv = +Inf: ±Inf saturate to ±448; 0 · Inf = NaN → 0x7F.
        (0.0, [0x7E, 0xFE, 0x7F, 0x7F, 0x7E]),
        // s = 1e-40 (subnormal): 1/s = 1e40 overflows f32: inv = +Inf, as for 0.
        (1e-40, [0x7E, 0xFE, 0x7F, 0x7F, 0x7E]),
        // s = NaN: inv NaN: every code NaN.
        (f32::NAN, [0x7F; 5]),
        // s = -0.5: inv = -2: -2 → 0xC0, 2 → 0x40, 0·-2 = -0 → 0x80, -0·-2 = +0 → 0x00, -1 → 0xB8.
        (-0.5, [0xC0, 0x40, 0x80, 0x00, 0xB8]),
        // s = +Inf: inv = 0: 1·0 = 0, -1·0 = -0, 0, -0·0 = -0, 0.
        (f32::INFINITY, [0x00, 0x80, 0x00, 0x80, 0x00]),
        // s = 2: inv = 0.5: 0.5 → 0x30, -0.5 → 0xB0, 0, -0, 0.25 → 5<<3 = 0x28.
        (2.0, [0x30, 0xB0, 0x00, 0x80, 0x28]),
    ];
    for (s, q) in cases {
        let call = Call {
            m: 1,
            h: 5,
            x: &x,
            r: Some(&r),
            w: &w,
            opts: Fp8Options::per_tensor(Fp8Element::E4M3, s).with_eps(0.0),
        };
        call.check(&format!("static s = {s}"), &q, &[], Some(&w), false);
    }
}

// ---------------------------------------------------------------------------------------
// Dynamic scales
// ---------------------------------------------------------------------------------------

/// Per token, f32 scales, E4M3; M = 3 (column-major pads to Mp4 = 4):
///   row 0: y = w, amax 448 → s = RN32(448/448) = 1, inv = 1: codes E4M3(w);
///   row 1: y = -w (x + r = -4, rstd 1/4), s = 1: codes with the sign flipped;
///   row 2: a zero row with eps = 0: ss = 0, rstd = 1/sqrt(0) = +Inf, y = 0 · Inf = NaN:
///          amax NaN → s NaN (written 0x7FFFFFFF), every code 0x7F.
#[test]
fn per_token_f32_scales_nan_row_and_column_major_padding() {
    let h = 32;
    let mut w = vec![1.0f32; h];
    let head = [
        448.0,
        1.0625,
        1.1875,
        -3.0,
        0.25,
        0.0,
        -0.0,
        p2(-9),
        p2(-10),
        15.0 * p2(-10),
    ];
    w[..head.len()].copy_from_slice(&head);
    // 448 → 0x7E; 1.0625 tie → 0x38; 1.1875 tie → 0x3A; -3 → 0xC4; 0.25 = 2^-2 → 5<<3 = 0x28;
    // 0 → 0x00; -0 → 0x80; 2^-9 → 0x01; 2^-10 tie → 0x00; 7.5·2^-9 tie → 0x08; 1.0 → 0x38.
    let mut row0 = vec![0x38u8; h];
    row0[..10].copy_from_slice(&[0x7E, 0x38, 0x3A, 0xC4, 0x28, 0x00, 0x80, 0x01, 0x00, 0x08]);
    let q = [row0.clone(), negated(&row0), vec![0x7F; h]].concat();
    let (mut x, mut r) = exact_rows(h, &[1.0, -1.0], 2);
    x.extend(vec![0.0; h]);
    r.extend(vec![0.0; h]);
    let y: Vec<f32> = w
        .iter()
        .copied()
        .chain(w.iter().map(|v| -v))
        .chain(std::iter::repeat_n(f32::NAN, h))
        .collect();
    let one = 1.0f32.to_bits();
    const NAN: u32 = 0x7FFF_FFFF;
    for (layout, scales) in [
        (Fp8ScaleLayout::RowMajor, vec![one, one, NAN]),
        // [H/G = 1, Mp4 = 4]: rows 0..3 then one padding row of +0.0.
        (Fp8ScaleLayout::ColumnMajor, vec![one, one, NAN, 0]),
    ] {
        // The floor changes nothing here: 1 ≥ 2^-10, and NaN stays NaN.
        for s_min in [0.0, p2(-10)] {
            let call = Call {
                m: 3,
                h,
                x: &x,
                r: Some(&r),
                w: &w,
                opts: Fp8Options::dynamic(
                    Fp8Element::E4M3,
                    Fp8Group::PerToken,
                    Fp8ScaleFormat::F32 { s_min },
                    layout,
                )
                .with_eps(0.0),
            };
            call.check(
                &format!("per-token {layout:?} s_min {s_min}"),
                &q,
                &scales,
                Some(&y),
                false,
            );
        }
    }
}

/// Per token, E5M2: amax 57344 → s = 1, inv = 1.
///   57344 → 0x7B; 1.125 tie 1.0 (0x3C) / 1.25 (0x3D) → 0x3C; 1.375 tie 0x3D / 0x3E → 0x3E;
///   -3 → 0xC2; 2^-16 → 0x01; 0 → 0x00; -0 → 0x80; 1.0 → 0x3C.
#[test]
fn per_token_e5m2() {
    let h = 32;
    let mut w = vec![1.0f32; h];
    w[..7].copy_from_slice(&[57344.0, 1.125, 1.375, -3.0, p2(-16), 0.0, -0.0]);
    let mut q = vec![0x3Cu8; h];
    q[..7].copy_from_slice(&[0x7B, 0x3C, 0x3E, 0xC2, 0x01, 0x00, 0x80]);
    let (x, r) = exact_rows(h, &[1.0], -3);
    let call = Call {
        m: 1,
        h,
        x: &x,
        r: Some(&r),
        w: &w,
        opts: Fp8Options::per_token(Fp8Element::E5M2).with_eps(0.0),
    };
    call.check("per-token e5m2", &q, &[1.0f32.to_bits()], Some(&w), false);
}

/// The floor: y = w with amax 112 → s = RN32(112/448) = 0.25.
///   s_min 0 or 0.25: s = 0.25, inv = 4: 112 → 448 (0x7E), 1 → 4 (9<<3 = 0x48), -0.5 → -2 (0xC0),
///     0.25 → 1 (0x38).
///   s_min 0.5: s = 0.5, inv = 2: 112 → 224 = 1.75·2^7 ((14<<3)|6 = 0x76), 1 → 2 (0x40),
///     -0.5 → -1 (0xB8), 0.25 → 0.5 (0x30).
#[test]
fn s_min_floor() {
    let h = 32;
    let mut w = vec![0.25f32; h];
    w[..3].copy_from_slice(&[112.0, 1.0, -0.5]);
    let (x, r) = exact_rows(h, &[1.0], 0);
    for (s_min, s, head, rest) in [
        (0.0, 0.25f32, [0x7E, 0x48, 0xC0], 0x38),
        (0.25, 0.25, [0x7E, 0x48, 0xC0], 0x38),
        (0.5, 0.5, [0x76, 0x40, 0xB8], 0x30),
    ] {
        let mut q = vec![rest; h];
        q[..3].copy_from_slice(&head);
        let call = Call {
            m: 1,
            h,
            x: &x,
            r: Some(&r),
            w: &w,
            opts: Fp8Options::dynamic(
                Fp8Element::E4M3,
                Fp8Group::PerToken,
                Fp8ScaleFormat::F32 { s_min },
                Fp8ScaleLayout::RowMajor,
            )
            .with_eps(0.0),
        };
        call.check(
            &format!("s_min {s_min}"),
            &q,
            &[s.to_bits()],
            Some(&w),
            false,
        );
    }
}

/// A zero row with eps = 1e-6: rstd is finite, y = (0 · rstd) · w = ±0 with the sign of
/// w (alternating 1, -1), amax = 0.
///   f32, s_min 0: s = 0 → inv = 0: codes ±0 (0x00, 0x80), scale +0.0.
///   f32, s_min 2^-10: s = 2^-10 (bits 0x3A800000), inv = 2^10: codes ±0 again.
///   UE8M0: v = 0 → code 0 (2^-127), inv = 2^127: ±0 · 2^127 = ±0.
#[test]
fn zero_row_with_eps() {
    let h = 64;
    let w: Vec<f32> = (0..h)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let q = rep(&[0x00u8, 0x80], h / 2);
    let y: Vec<f32> = w.iter().map(|&v| 0.0 * v).collect();
    let zeros = vec![0.0f32; h];
    for (format, scales) in [
        (Fp8ScaleFormat::F32 { s_min: 0.0 }, vec![0u32]),
        (Fp8ScaleFormat::F32 { s_min: p2(-10) }, vec![0x3A80_0000]),
        (Fp8ScaleFormat::UE8M0, vec![0]),
    ] {
        for element in Fp8Element::ALL {
            let call = Call {
                m: 1,
                h,
                x: &zeros,
                r: Some(&zeros),
                w: &w,
                opts: Fp8Options::dynamic(
                    element,
                    Fp8Group::PerToken,
                    format,
                    Fp8ScaleLayout::RowMajor,
                )
                .with_eps(1e-6),
            };
            call.check(
                &format!("zero row {format:?} {element}"),
                &q,
                &scales,
                Some(&y),
                false,
            );
        }
    }
}

/// A 32-element pattern with amax FMAX, and its codes (E4M3, E5M2). Scaled by 2^-k every
/// nonzero value stays normal: the code's exponent field drops by k (E4M3: code - 8k,
/// E5M2: code - 4k, sign kept).
#[rustfmt::skip]
const P_E4M3: [(f32, u8); 8] = [
    (448.0, 0x7E), (-448.0, 0xFE), (1.0, 0x38), (-1.0, 0xB8),
    (0.5, 0x30), (2.0, 0x40), (3.0, 0x44), (-6.0, 0xCC), // 6 = 1.5·4: (9<<3)|4 = 0x4C
];
#[rustfmt::skip]
const P_E5M2: [(f32, u8); 8] = [
    (57344.0, 0x7B), (-57344.0, 0xFB), (1.0, 0x3C), (-1.0, 0xBC),
    (0.5, 0x38), (2.0, 0x40), (3.0, 0x42), (-6.0, 0xC6), // 6: (17<<2)|2 = 0x46
];

/// The pattern (8 values then 24 zeros) and its codes, scaled by 2^-k.
fn pattern(element: Fp8Element, k: i32) -> (Vec<f32>, Vec<u8>) {
    let (p, step) = match element {
        Fp8Element::E4M3 => (&P_E4M3, 8u8),
        Fp8Element::E5M2 => (&P_E5M2, 4u8),
    };
    let mut v = vec![0.0f32; 32];
    let mut c = vec![0u8; 32];
    for (i, &(val, code)) in p.iter().enumerate() {
        v[i] = val * p2(-k);
        c[i] = code - step * k as u8;
    }
    (v, c)
}

/// Groups of 32, 64, 128 and per token, H = 128, M = 5 (rows x + r = +1, -1, +1, -1, +1):
/// weights are the pattern scaled by 2^-j in the j-th 32 elements (j = 0..3), so with
/// `y = ±w`:
///   G = 32:  group j has amax FMAX·2^-j → s = 2^-j, inv = 2^j: every group's codes are P's.
///   G = 64:  group j' (elements 64j'..) has amax FMAX·2^-2j' → s = 2^-2j': codes P, P·2^-1.
///   G = 128 and per token: amax FMAX → s = 1: codes P·2^-j in the j-th 32 elements.
///   UE8M0: v = s = 2^-e exactly → code 127 - e, inv 2^e: the same codes.
/// Odd rows have the sign bit flipped. Layouts: row-major, column-major ([H/G, Mp4 = 8]:
/// rows 5..7 are padding 0), for UE8M0 with G = 32 swizzled (MXFP8: nK = 1, Mp = 128,
/// (row, g) at row·16 + g for row < 32; every other byte 0), and for UE8M0 in groups packed
/// column-major (one column of 8 words, 32 bytes: (row, g) at byte 4·row + g for row < 5;
/// rows 5..7 and the bytes of groups past H/G 0: G = 32 fills bytes 0..3 of a word with
/// codes 127, 126, 125, 124; G = 64 bytes 0..1 with 127, 125; G = 128 byte 0 with 127).
#[test]
fn groups_layouts_and_mxfp8() {
    let (h, m) = (128, 5);
    let signs = [1.0, -1.0, 1.0, -1.0, 1.0];
    let (x, r) = exact_rows(h, &signs, 0);
    for element in Fp8Element::ALL {
        let w: Vec<f32> = (0..4).flat_map(|j| pattern(element, j).0).collect();
        for group in Fp8Group::ALL {
            let (g_exp, code_k): (Vec<i32>, [i32; 4]) = match group {
                Fp8Group::G32 => (vec![0, 1, 2, 3], [0, 0, 0, 0]),
                Fp8Group::G64 => (vec![0, 2], [0, 1, 0, 1]),
                Fp8Group::G128 | Fp8Group::PerToken => (vec![0], [0, 1, 2, 3]),
            };
            let n = g_exp.len();
            let row0: Vec<u8> = code_k.iter().flat_map(|&k| pattern(element, k).1).collect();
            let q: Vec<u8> = (0..m)
                .flat_map(|row| {
                    if row % 2 == 0 {
                        row0.clone()
                    } else {
                        negated(&row0)
                    }
                })
                .collect();
            let y: Vec<f32> = (0..m)
                .flat_map(|row| w.iter().map(move |&v| signs[row] * v))
                .collect();
            for format in [Fp8ScaleFormat::F32_NO_FLOOR, Fp8ScaleFormat::UE8M0] {
                // The scale of group g: f32 2^-e (exponent field 127 - e), or UE8M0 code 127 - e.
                let s = |g: usize| -> u32 {
                    let e = g_exp[g] as u32;
                    match format {
                        Fp8ScaleFormat::UE8M0 => 127 - e,
                        _ => (127 - e) << 23,
                    }
                };
                let mut layouts = vec![
                    (
                        Fp8ScaleLayout::RowMajor,
                        (0..m).flat_map(|_| (0..n).map(s)).collect::<Vec<u32>>(),
                    ),
                    (Fp8ScaleLayout::ColumnMajor, {
                        let mut v = vec![0u32; n * 8];
                        for g in 0..n {
                            for row in 0..m {
                                v[g * 8 + row] = s(g);
                            }
                        }
                        v
                    }),
                ];
                if format == Fp8ScaleFormat::UE8M0 && group == Fp8Group::G32 {
                    let mut v = vec![0u32; 512];
                    for row in 0..m {
                        for g in 0..n {
                            v[row * 16 + g] = s(g);
                        }
                    }
                    layouts.push((Fp8ScaleLayout::Swizzled, v));
                }
                if format == Fp8ScaleFormat::UE8M0 && group != Fp8Group::PerToken {
                    let mut v = vec![0u32; 32];
                    for row in 0..m {
                        for g in 0..n {
                            v[4 * row + g] = s(g);
                        }
                    }
                    layouts.push((Fp8ScaleLayout::ColumnMajorPacked, v));
                }
                for (layout, scales) in layouts {
                    let call = Call {
                        m,
                        h,
                        x: &x,
                        r: Some(&r),
                        w: &w,
                        opts: Fp8Options::dynamic(element, group, format, layout).with_eps(0.0),
                    };
                    let name = format!("{element} {group:?} {format:?} {layout:?}");
                    call.check(&name, &q, &scales, Some(&y), false);
                }
            }
        }
    }
    // Fp8Options::mxfp8() is that last case.
    assert_eq!(
        Fp8Options::mxfp8(),
        Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G32,
            Fp8ScaleFormat::UE8M0,
            Fp8ScaleLayout::Swizzled
        )
    );
}

/// UE8M0 rounds the scale up from amax / FMAX (SPEC.md §8 with §1.6's rule):
///   E4M3, amax 452: v = RN32(452/448) > 1 → e = 1, code 128, inv 1/2: 452 → 226, between
///     224 (0x76) and 240 (0x77), nearer 224 → 0x76 (not saturated); 1 → 0.5 (0x30).
///   E4M3, amax 2: v = RN32(2/448) = 2^-8 · 1.142… → e = -7, code 120, inv 2^7: 2 → 256 = 2^8
///     (15<<3 = 0x78), 1 → 128 (14<<3 = 0x70): the group's max lands at 256, not 448.
///   E5M2, amax 2: v = 2/57344 = 2^-15 · 1.142… → e = -14, code 113, inv 2^14: 2 → 2^15
///     (30<<2 = 0x78), 1 → 2^14 (29<<2 = 0x74).
///   A NaN in the group: code 255, inv NaN, every code 0x7F; the other group is unaffected.
#[test]
fn ue8m0_rounds_up_and_nan_groups() {
    let h = 64;
    let (x, r) = exact_rows(h, &[1.0], 0);
    for (element, top, q_top, code, nan_second) in [
        (Fp8Element::E4M3, 452.0, 0x76u8, 128u32, false),
        (Fp8Element::E4M3, 2.0, 0x78, 120, true),
        (Fp8Element::E5M2, 2.0, 0x78, 113, true),
    ] {
        let q_one = match (element, code) {
            (Fp8Element::E4M3, 128) => 0x30,
            (Fp8Element::E4M3, _) => 0x70,
            _ => 0x74,
        };
        let mut w = vec![1.0f32; h];
        w[0] = top;
        w[32] = top;
        let mut q0 = vec![q_one; 32];
        q0[0] = q_top;
        let (q1, c1) = if nan_second {
            w[40] = f32::NAN;
            (vec![0x7F; 32], 255)
        } else {
            (q0.clone(), code)
        };
        let q = [q0, q1].concat();
        let y = w.clone();
        let call = Call {
            m: 1,
            h,
            x: &x,
            r: Some(&r),
            w: &w,
            opts: Fp8Options::dynamic(
                element,
                Fp8Group::G32,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::RowMajor,
            )
            .with_eps(0.0),
        };
        call.check(
            &format!("ue8m0 {element} amax {top}"),
            &q,
            &[code, c1],
            Some(&y),
            false,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Weight bias (Gemma)
// ---------------------------------------------------------------------------------------

/// weight_bias = 1, per-tensor s = 1 (inv 1), E4M3. Rows x + r = +1 and -1:
///   w 0.5 → w' 1.5 → ±1.5: 0x3C / 0xBC;   w -1 → w' = -1 + 1 = +0 → y = +0 / -0: 0x00 / 0x80;
///   w -2 → w' -1 → 0xB8 / 0x38;   w 0 and -0 → w' 1 → 0x38 / 0xB8;   w 3 → 4 → 0x48 / 0xC8.
#[test]
fn weight_bias_one() {
    let h = 32;
    let mut w = vec![3.0f32; h];
    w[..5].copy_from_slice(&[0.5, -1.0, -2.0, 0.0, -0.0]);
    let mut row0 = vec![0x48u8; h];
    row0[..5].copy_from_slice(&[0x3C, 0x00, 0xB8, 0x38, 0x38]);
    let q = [row0.clone(), negated(&row0)].concat();
    let wp: Vec<f32> = w.iter().map(|&v| v + 1.0).collect(); // -1 + 1 = +0
    let y: Vec<f32> = wp.iter().copied().chain(wp.iter().map(|v| -v)).collect();
    let (x, r) = exact_rows(h, &[1.0, -1.0], 0);
    let call = Call {
        m: 2,
        h,
        x: &x,
        r: Some(&r),
        w: &w,
        opts: Fp8Options::per_tensor(Fp8Element::E4M3, 1.0)
            .with_eps(0.0)
            .with_weight_bias(1.0),
    };
    call.check("weight bias 1", &q, &[], Some(&y), false);
}

/// Where `w' = RN32(w + 1)` rounds: w = 17·2^21 (bf16: 17 needs 5 bits), w + 1 = 17·2^21 + 1
/// needs 26 bits; the f32 ulp there is 4, so w' = 17·2^21. With s = 2^25 (inv 2^-25) and
/// y = w', y · inv = 17/16 = 1.0625, the E4M3 tie 1.0 / 1.125 → even 0x38. Unrounded,
/// 1.0625 + 2^-25 would give 0x39. y_out = RNbf16(17·2^21) (exact). bf16 only (f16's max
/// is 65504).
#[test]
fn weight_bias_rounding_matters() {
    let h = 32;
    let w = vec![17.0 * p2(21); h];
    let q = vec![0x38u8; h];
    let (x, r) = exact_rows(h, &[1.0], 0);
    let call = Call {
        m: 1,
        h,
        x: &x,
        r: Some(&r),
        w: &w,
        opts: Fp8Options::per_tensor(Fp8Element::E4M3, p2(25))
            .with_eps(0.0)
            .with_weight_bias(1.0),
    };
    call.check("w' rounding", &q, &[], Some(&w), true);
}

// ---------------------------------------------------------------------------------------
// Sizes (SPEC.md §6, §8) and dequantisation
// ---------------------------------------------------------------------------------------

#[test]
fn problem_sizes_by_hand() {
    let dyn_ = |g, f, l| Fp8Options::dynamic(Fp8Element::E4M3, g, f, l);
    let f32s = Fp8ScaleFormat::F32_NO_FLOOR;
    // M = 5, H = 128, bf16, with residual: M·H·3·2 + H·2 + M·H = 3840 + 256 + 640 = 4736.
    let base = 4736u64;
    for (opts, len, bytes) in [
        (Fp8Options::per_tensor(Fp8Element::E5M2, 1.0), 0usize, 0u64),
        // Per token, row-major: 5 f32 = 20 bytes.
        (Fp8Options::per_token(Fp8Element::E4M3), 5, 20),
        // G = 32 column-major: H/G = 4, Mp4 = 8: 32 f32 = 128 bytes.
        (
            dyn_(Fp8Group::G32, f32s, Fp8ScaleLayout::ColumnMajor),
            32,
            128,
        ),
        // G = 64 row-major UE8M0: 5 · 2 = 10 bytes.
        (
            dyn_(
                Fp8Group::G64,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::RowMajor,
            ),
            10,
            10,
        ),
        // MXFP8: Mp = 128, nK = ceil(4/4) = 1: 128 · 4 = 512 bytes.
        (Fp8Options::mxfp8(), 512, 512),
        // G = 128 column-major UE8M0: 1 · 8 = 8 bytes.
        (
            dyn_(
                Fp8Group::G128,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::ColumnMajor,
            ),
            8,
            8,
        ),
    ] {
        let p = Fp8Problem::new(5, 128, DType::BF16, &opts).unwrap();
        assert_eq!(p.q_len(), 640);
        assert_eq!(p.scales_len(), len, "{opts:?}");
        assert_eq!(p.scale_bytes_written(), bytes as usize, "{opts:?}");
        assert_eq!(p.bytes_moved(), base + bytes, "{opts:?}");
        // Without a residual M·H·2 replaces M·H·6; y_out adds M·H·2.
        assert_eq!(p.without_residual().bytes_moved(), base + bytes - 2560);
        assert_eq!(p.with_y_out(true).bytes_moved(), base + bytes + 1280);
    }
    // Column-major offsets: (row, g) at g · Mp4 + row; M = 5 → Mp4 = 8.
    let p = Fp8Problem::new(
        5,
        128,
        DType::F16,
        &dyn_(Fp8Group::G32, f32s, Fp8ScaleLayout::ColumnMajor),
    )
    .unwrap();
    assert_eq!(
        (p.scale_rows(), p.scale_index(4, 3), p.scale_index(0, 1)),
        (8, 28, 8)
    );
    // M = 0: nothing to write, every length 0.
    let p = Fp8Problem::new(
        0,
        128,
        DType::F16,
        &dyn_(Fp8Group::G32, f32s, Fp8ScaleLayout::ColumnMajor),
    )
    .unwrap();
    assert_eq!((p.q_len(), p.scales_len()), (0, 0));
}

/// `value = RN32(fp8_value(q) · scale)` by hand, NaN as 0x7FFFFFFF.
#[test]
fn dequantize_by_hand() {
    const NAN: u32 = 0x7FFF_FFFF;
    // Per tensor, E4M3, s = 0.5: 0x38 (1) → 0.5; 0x7E (448) → 224; 0xC4 (-3) → -1.5;
    // 0x80 (-0) → -0; 0x7F → NaN; 0x01 (2^-9) → 2^-10.
    let q = [0x38u8, 0x7E, 0xC4, 0x80, 0x7F, 0x01];
    let mut out = [0f32; 6];
    let opts = Fp8Options::per_tensor(Fp8Element::E4M3, 0.5);
    fp8::dequantize(1, 6, &opts, &q, Fp8ScalesIn::None, &mut out).unwrap();
    let want = [0.5f32, 224.0, -1.5, -0.0, f32::from_bits(NAN), p2(-10)];
    assert_eq!(out.map(f32::to_bits), want.map(f32::to_bits));

    // Per token, E5M2, f32 scales [2, NaN], two rows of 2: row 0 0x3C (1) → 2, 0x7C (+Inf,
    // a code the encoder never writes, decoded anyway) → +Inf; row 1 → NaN whatever q.
    let q = [0x3C, 0x7C, 0x3C, 0x00];
    let mut out = [0f32; 4];
    let opts = Fp8Options::per_token(Fp8Element::E5M2);
    fp8::dequantize(
        2,
        2,
        &opts,
        &q,
        Fp8ScalesIn::F32(&[2.0, f32::NAN]),
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out.map(f32::to_bits),
        [2.0f32.to_bits(), f32::INFINITY.to_bits(), NAN, NAN]
    );

    // UE8M0, G = 32, column-major, M = 1 (Mp4 = 4), H = 64: codes [0 (2^-127), pad ×3,
    // 255 (NaN), pad ×3]. Element 0 = 0x38 (1.0) → 2^-127 (f32 subnormal 0x00400000);
    // element 32 = 0x38 → NaN.
    let mut q = vec![0u8; 64];
    q[0] = 0x38;
    q[32] = 0x38;
    let sf = [0u8, 0, 0, 0, 255, 0, 0, 0];
    let mut out = vec![0f32; 64];
    let opts = Fp8Options::dynamic(
        Fp8Element::E4M3,
        Fp8Group::G32,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::ColumnMajor,
    );
    fp8::dequantize(1, 64, &opts, &q, Fp8ScalesIn::UE8M0(&sf), &mut out).unwrap();
    assert_eq!(out[0].to_bits(), 0x0040_0000);
    assert_eq!(out[1].to_bits(), 0); // code 0 · 2^-127
    assert_eq!(out[32].to_bits(), NAN);
    assert_eq!(out[33].to_bits(), NAN); // 0 · NaN

    // The E5M2 codec on a few values by hand (the exhaustive sweep covers the rest).
    assert_eq!(e5m2_encode(-57344.0), 0xFB);
    assert_eq!(e5m2_encode(-0.0), 0x80);
    assert_eq!(e5m2_decode(0x04), p2(-14)); // smallest normal
    assert_eq!(e5m2_decode(0x03), 3.0 * p2(-16)); // largest subnormal
}
