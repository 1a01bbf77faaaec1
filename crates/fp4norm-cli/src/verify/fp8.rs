//! The FP8 case groups of `fp4norm verify` (SPEC.md §8): every element format, scaling,
//! group, scale format and layout through the edge cases the FP4 op's groups use, plus what
//! only the FP8 ops have: per-tensor static scales (by value and read from memory), f32
//! scale floors, column-major padding, rows of any length for per-tensor and per-token
//! scales.

// The case builders index x and the residual with the same element index.
#![allow(clippy::needless_range_loop)]

use fp4norm::fp8::{
    Fp8Element, Fp8Group, Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling,
};
use fp4norm::DType;
use rand::rngs::StdRng;
use rand::Rng;

use super::{
    bias_weights, fill_mixed, huge_rows, huge_weights, pick, pow2_weights, special_rows,
    special_weights, subnormal_rows, tie_rows, with_stride, zero_and_tiny_rows, DTYPES, EPSILONS,
    WEIGHT_BIASES,
};
use crate::case::{to_bits, to_f32, Case, Op};

/// vLLM's per-token scale floor, `1 / (448 · 512)`.
const VLLM_S_MIN: f32 = 1.0 / (448.0 * 512.0);
const F32: Fp8ScaleFormat = Fp8ScaleFormat::F32_NO_FLOOR;
const F32_FLOOR: Fp8ScaleFormat = Fp8ScaleFormat::F32 { s_min: VLLM_S_MIN };
const UE8M0: Fp8ScaleFormat = Fp8ScaleFormat::UE8M0;
const ROW: Fp8ScaleLayout = Fp8ScaleLayout::RowMajor;
const COL: Fp8ScaleLayout = Fp8ScaleLayout::ColumnMajor;
const SWZ: Fp8ScaleLayout = Fp8ScaleLayout::Swizzled;
const PACKED: Fp8ScaleLayout = Fp8ScaleLayout::ColumnMajorPacked;

fn dynamic(group: Fp8Group, format: Fp8ScaleFormat, layout: Fp8ScaleLayout) -> Fp8Scaling {
    Fp8Scaling::Dynamic {
        group,
        format,
        layout,
    }
}

fn mxfp8() -> Fp8Scaling {
    Fp8Options::mxfp8().scaling
}

/// Every scaling: per tensor; per token and groups of 32, 64 and 128, each with f32 scales
/// (without and with vLLM's floor) and UE8M0 codes, row- and column-major; MXFP8's
/// swizzled layout; UE8M0 codes of groups packed column-major (DeepGEMM's).
fn all_scalings() -> Vec<Fp8Scaling> {
    let mut v = vec![Fp8Scaling::PerTensor(0.37)];
    for group in Fp8Group::ALL {
        for format in [F32, F32_FLOOR, UE8M0] {
            for layout in [ROW, COL] {
                v.push(dynamic(group, format, layout));
            }
        }
    }
    v.push(mxfp8());
    for group in [Fp8Group::G32, Fp8Group::G64, Fp8Group::G128] {
        v.push(dynamic(group, UE8M0, PACKED));
    }
    v
}

/// One of each kind, for the edge-case groups: per tensor; per token f32 row-major and
/// UE8M0 column-major; groups of 32 f32 row-major, 64 UE8M0 column-major, 128 f32
/// column-major with the floor (DeepSeek-style); MXFP8; groups of 128 UE8M0 packed
/// (DeepGEMM's SM100 scales).
fn some_scalings() -> [Fp8Scaling; 8] {
    [
        Fp8Scaling::PerTensor(0.5),
        dynamic(Fp8Group::PerToken, F32, ROW),
        dynamic(Fp8Group::PerToken, UE8M0, COL),
        dynamic(Fp8Group::G32, F32, ROW),
        dynamic(Fp8Group::G64, UE8M0, COL),
        dynamic(Fp8Group::G128, F32_FLOOR, COL),
        mxfp8(),
        dynamic(Fp8Group::G128, UE8M0, PACKED),
    ]
}

/// The unit H is a multiple of: the group for groups of 32, 64, 128; else 8, the CUDA
/// kernels' vector (the groups that take any H have cases of their own for that).
fn unit(s: &Fp8Scaling) -> usize {
    match s {
        Fp8Scaling::Dynamic { group, .. } if *group != Fp8Group::PerToken => group.size(0),
        _ => 8,
    }
}

/// Elements that share a scale, for row and weight patterns: the group, or 32 where one
/// scale covers the row or the tensor.
fn block(s: &Fp8Scaling, h: usize) -> usize {
    match s {
        Fp8Scaling::Dynamic { group, .. } if *group != Fp8Group::PerToken => group.size(h),
        _ => 32.min(h).max(1),
    }
}

/// A random case of one FP8 op; a per-tensor scale is read from memory or passed by value
/// at random.
fn fp8_case(
    rng: &mut StdRng,
    m: usize,
    h: usize,
    dtype: DType,
    element: Fp8Element,
    scaling: Fp8Scaling,
) -> Case {
    let opts = Fp8Options {
        element,
        scaling,
        eps: 1e-6,
        weight_bias: 0.0,
    };
    let op = Op::Fp8 {
        opts,
        scale_in_memory: rng.random_bool(0.5),
    };
    Case::random_op(m, h, dtype, op, rng.random())
}

/// The options of an FP8 case, to change.
fn opts_mut(c: &mut Case) -> &mut Fp8Options {
    match &mut c.op {
        Op::Fp8 { opts, .. } => opts,
        Op::Fp4 { .. } => unreachable!("FP8 groups build FP8 cases"),
    }
}

/// Sets the per-tensor scale, where the case has one.
fn set_static_scale(c: &mut Case, s: f32) {
    let o = opts_mut(c);
    if let Fp8Scaling::PerTensor(_) = o.scaling {
        o.scaling = Fp8Scaling::PerTensor(s);
    }
}

/// A random per-tensor scale `[1, 2) · 2^k` with `k` in `-4..=3`: normalised rows of the
/// random cases land in the middle of both element formats' ranges.
fn random_static_scale(rng: &mut StdRng) -> f32 {
    rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-4..=3))
}

pub(super) fn scalings(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let ms = [1, 3, 4, 5, 127, 129, 130, 257];
    let mut v = Vec::new();
    for element in Fp8Element::ALL {
        for scaling in all_scalings() {
            for dtype in DTYPES {
                for residual in [true, false] {
                    for y_out in [false, true] {
                        let m = ms[v.len() % ms.len()];
                        let u = unit(&scaling);
                        let h = u * rng.random_range(1..=(1024 / u).min(40));
                        let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                        let s = random_static_scale(rng);
                        set_static_scale(&mut c, s);
                        c.y_out = y_out;
                        if !residual {
                            c.residual = None;
                        }
                        if v.len() % 3 == 2 {
                            c.set_weight_bias(1.0);
                        }
                        v.push(c);
                    }
                }
            }
        }
    }
    v
}

pub(super) fn odd_m(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let groups = Fp8Group::ALL;
    let formats = [F32, UE8M0, F32_FLOOR];
    let mut v = Vec::new();
    for m in [
        0, 1, 2, 3, 4, 5, 7, 31, 32, 33, 127, 128, 129, 255, 256, 257, 300,
    ] {
        for kind in 0..5 {
            let i = v.len();
            let scaling = match kind {
                0 => Fp8Scaling::PerTensor(0.25),
                1 => dynamic(groups[i % 4], formats[i % 3], ROW),
                2 => dynamic(groups[(i / 4) % 4], formats[(i / 3) % 3], COL),
                3 => mxfp8(),
                _ => dynamic(groups[1 + (i / 5) % 3], UE8M0, PACKED),
            };
            // 1, 3, 5 and 8 groups per row: partial and whole 4-group swizzle columns (and
            // packed words).
            let n = [1, 3, 5, 8][i % 4];
            let h = n * unit(&scaling);
            let element = Fp8Element::ALL[i % 2];
            let dtype = DTYPES[(i / 2) % 2];
            let mut c = fp8_case(rng, m, h, dtype, element, scaling);
            c.y_out = i % 3 == 0;
            if i % 5 == 4 {
                c.residual = None;
            }
            v.push(c);
        }
    }
    v
}

pub(super) fn special_values(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (28, 256);
    let mut v = Vec::new();
    for scaling in some_scalings() {
        for element in Fp8Element::ALL {
            for dtype in DTYPES {
                for eps in [1e-6f32, 0.0] {
                    let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                    c.set_eps(eps);
                    c.y_out = v.len() % 3 == 0;
                    let b = block(&scaling, h);
                    special_rows(&mut c, rng, b);
                    if v.len() % 3 == 1 {
                        special_weights(&mut c, rng, b);
                    }
                    if v.len() % 2 == 1 {
                        c.residual = None;
                    }
                    v.push(c);
                }
            }
        }
    }
    v
}

pub(super) fn subnormals(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (33, 512);
    // Per-tensor scales that put subnormal rows' codes in the elements' subnormal range,
    // or beyond f32 (a subnormal scale: inv = +Inf).
    let statics = [1.0f32, 2f32.powi(-20), 2f32.powi(-60), 1e-40];
    let mut v = Vec::new();
    for scaling in some_scalings() {
        for element in Fp8Element::ALL {
            for dtype in DTYPES {
                for eps in [0.0f32, 1e-40] {
                    let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                    c.set_eps(eps);
                    set_static_scale(&mut c, statics[v.len() % statics.len()]);
                    subnormal_rows(&mut c, rng);
                    // Weights 2^k per group, k down to -40: y, and with it the scales, reach
                    // FP8 subnormals, zero and f32-subnormal scales, UE8M0's smallest code.
                    pow2_weights(&mut c, rng, block(&scaling, h), -40);
                    c.y_out = v.len() % 2 == 0;
                    v.push(c);
                }
            }
        }
    }
    v
}

/// The midpoint of two neighbouring finite FP8 values, or a value itself: `code` and
/// `code + 1` must both be finite.
fn fp8_mid_or_value(element: Fp8Element, code: u8, mid: bool) -> f32 {
    let a = element.decode(code);
    if mid {
        0.5 * (a + element.decode(code + 1))
    } else {
        a
    }
}

/// Ties. Rows are ±c (y = ±w exactly, as in the FP4 `ties` group); each group's weights
/// then put its scale on a power of two (f32: amax = FMAX·2^k; UE8M0: amax = FMAX·2^k or
/// the next dtype value above, the round-up boundary; per tensor: s = 2^k), so `y · inv`
/// is exact and lands on FP8 midpoints (ties to even) or FP8 values.
pub(super) fn ties(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (16, 256);
    let mut v = Vec::new();
    for scaling in some_scalings() {
        for element in Fp8Element::ALL {
            for dtype in DTYPES {
                let residual = v.len() % 4 != 1;
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                tie_rows(&mut c, rng, residual);
                let fmax = element.max();
                // 2^k keeps FMAX·2^k finite in f16 for E5M2 (57344 ≤ 65504).
                let k_hi = if dtype == DType::F16 && element == Fp8Element::E5M2 {
                    0
                } else {
                    3
                };
                let static_k = rng.random_range(-3..=k_hi);
                set_static_scale(&mut c, 2f32.powi(static_k));
                let exact = |w: f32| to_f32(dtype, to_bits(dtype, w)) == w;
                let last_code: u8 = match element {
                    Fp8Element::E4M3 => 0x7D,
                    Fp8Element::E5M2 => 0x7A,
                };
                // One amax per scale: the whole row per token.
                let b = match scaling {
                    Fp8Scaling::Dynamic {
                        group: Fp8Group::PerToken,
                        ..
                    } => h,
                    _ => block(&scaling, h),
                };
                for ws in c.w.chunks_mut(b) {
                    let sgn = |rng: &mut StdRng| if rng.random_bool(0.5) { 1.0f32 } else { -1.0 };
                    let k = rng.random_range(-3..=k_hi);
                    // The scale the group's codes are divided by, and its amax element.
                    let (scale, amax) = match scaling {
                        Fp8Scaling::PerTensor(_) => (2f32.powi(static_k), None),
                        Fp8Scaling::Dynamic {
                            format: Fp8ScaleFormat::UE8M0,
                            ..
                        } if rng.random_bool(0.5) => {
                            // Just above FMAX·2^k: the code rounds up to 2^(k+1).
                            let above = to_bits(dtype, fmax * 2f32.powi(k)) + 1;
                            (2f32.powi(k + 1), Some(above))
                        }
                        _ => (2f32.powi(k), Some(to_bits(dtype, fmax * 2f32.powi(k)))),
                    };
                    for w in ws.iter_mut() {
                        // A midpoint (or a value) times the scale, exact in the dtype.
                        *w = 0;
                        for _ in 0..20 {
                            let code = rng.random_range(0..=last_code);
                            let t = sgn(rng)
                                * fp8_mid_or_value(element, code, rng.random_bool(0.75))
                                * scale;
                            if exact(t) {
                                *w = to_bits(dtype, t);
                                break;
                            }
                        }
                    }
                    if let Some(a) = amax {
                        let at = rng.random_range(0..ws.len());
                        ws[at] = a | if rng.random_bool(0.5) { 0x8000 } else { 0 };
                    }
                }
                if !residual {
                    c.residual = None;
                }
                c.y_out = v.len() % 2 == 0;
                v.push(c);
            }
        }
    }
    v
}

pub(super) fn huge(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (20, 128);
    let mut kinds: Vec<Fp8Scaling> = [1.0f32, 1e30, f32::MAX, 1e-30, 1e-45]
        .into_iter()
        .map(Fp8Scaling::PerTensor)
        .collect();
    kinds.extend([
        dynamic(Fp8Group::PerToken, F32, ROW),
        dynamic(Fp8Group::PerToken, UE8M0, COL),
        dynamic(Fp8Group::G32, UE8M0, ROW),
        dynamic(Fp8Group::G128, F32_FLOOR, COL),
        mxfp8(),
    ]);
    let mut v = Vec::new();
    for scaling in kinds {
        for element in Fp8Element::ALL {
            for dtype in DTYPES {
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                huge_rows(&mut c, rng);
                if v.len() % 2 == 0 {
                    huge_weights(&mut c, rng);
                }
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

pub(super) fn eps(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (9, 256);
    let kinds = [
        Fp8Scaling::PerTensor(1.0),
        dynamic(Fp8Group::PerToken, F32, ROW),
        dynamic(Fp8Group::G64, UE8M0, COL),
        mxfp8(),
    ];
    let mut v = Vec::new();
    for scaling in kinds {
        for dtype in DTYPES {
            for e in EPSILONS {
                let element = Fp8Element::ALL[v.len() % 2];
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                c.set_eps(e);
                zero_and_tiny_rows(&mut c);
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

pub(super) fn weight_bias(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (7, 256);
    let kinds = [
        Fp8Scaling::PerTensor(0.5),
        dynamic(Fp8Group::PerToken, F32, ROW),
        dynamic(Fp8Group::G128, F32, COL),
        mxfp8(),
    ];
    let mut v = Vec::new();
    for scaling in kinds {
        for dtype in DTYPES {
            for bias in WEIGHT_BIASES {
                let element = Fp8Element::ALL[v.len() % 2];
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                c.set_weight_bias(bias);
                bias_weights(&mut c);
                c.y_out = true;
                v.push(c);
            }
        }
    }
    v
}

/// Per-tensor scales of every kind, from memory and by value: 0 (inv = +Inf), -0,
/// negative, tiny (inv = +Inf), huge, ±Inf (inv = ±0), NaN, the elements' extremes.
pub(super) fn static_scale(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (37, 64);
    let specials = [
        1.0f32,
        0.0,
        -0.0,
        -1.0,
        0.5,
        1e-30,
        1e-45,
        1e30,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        2688.0,
        3.0,
        2f32.powi(-9),
        448.0,
    ];
    let mut v = Vec::new();
    for s in specials {
        for in_memory in [true, false] {
            for element in Fp8Element::ALL {
                let dtype = DTYPES[v.len() % 2];
                let mut c = fp8_case(rng, m, h, dtype, element, Fp8Scaling::PerTensor(s));
                if let Op::Fp8 {
                    scale_in_memory, ..
                } = &mut c.op
                {
                    *scale_in_memory = in_memory;
                }
                if v.len() % 3 == 0 {
                    special_rows(&mut c, rng, 32);
                }
                c.y_out = v.len() % 2 == 0;
                v.push(c);
            }
        }
    }
    v
}

/// f32 scale floors: vLLM's, the smallest subnormal, around the normal boundary, and floors
/// above every group's amax / FMAX (every scale the floor).
pub(super) fn scale_floor(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let (m, h) = (9, 256);
    let floors = [
        VLLM_S_MIN,
        1e-45,
        1e-38,
        f32::MIN_POSITIVE,
        1e-3,
        1.0,
        1e30,
        f32::MAX,
    ];
    let kinds = [
        (Fp8Group::PerToken, ROW),
        (Fp8Group::PerToken, COL),
        (Fp8Group::G32, ROW),
        (Fp8Group::G128, COL),
    ];
    let mut v = Vec::new();
    for s_min in floors {
        for (group, layout) in kinds {
            let i = v.len();
            let scaling = dynamic(group, Fp8ScaleFormat::F32 { s_min }, layout);
            let (element, dtype) = (Fp8Element::ALL[i % 2], DTYPES[(i / 2) % 2]);
            let mut c = fp8_case(rng, m, h, dtype, element, scaling);
            // Groups of tiny weights (zero in f16) make tiny and zero scales the floor lifts.
            pow2_weights(&mut c, rng, block(&scaling, h), -60);
            zero_and_tiny_rows(&mut c);
            c.y_out = i % 2 == 0;
            v.push(c);
        }
    }
    v
}

pub(super) fn strided_rows(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let all = all_scalings();
    let mut v = Vec::new();
    for _ in 0..2 {
        for pad in [1usize, 2, 7, 16, 64, 0] {
            for m in [1usize, 2, 7, 129] {
                let i = v.len();
                let scaling = all[i % all.len()];
                let (element, dtype) = (Fp8Element::ALL[i % 2], DTYPES[(i / 2) % 2]);
                let h = unit(&scaling) * rng.random_range(1..=12);
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                let pad = if pad == 0 { h } else { pad }; // 0 stands for stride 2H
                c = with_stride(c, h + pad, rng);
                if i % 5 == 4 {
                    c.residual = None;
                }
                c.y_out = i % 3 != 2;
                v.push(c);
            }
        }
    }
    v
}

/// H from 1 (per-tensor and per-token scales take any H) to 32768, each scaling that fits.
pub(super) fn narrow_wide(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let kinds = [
        Fp8Scaling::PerTensor(0.7),
        dynamic(Fp8Group::PerToken, F32, ROW),
        dynamic(Fp8Group::PerToken, UE8M0, COL),
        // Per token with H = 32 is one group of 32: the swizzled layout takes it.
        dynamic(Fp8Group::PerToken, UE8M0, SWZ),
        dynamic(Fp8Group::G32, F32, COL),
        dynamic(Fp8Group::G64, UE8M0, ROW),
        dynamic(Fp8Group::G128, F32, ROW),
        mxfp8(),
        dynamic(Fp8Group::G32, UE8M0, PACKED),
    ];
    let mut v = Vec::new();
    for h in [
        1usize, 2, 3, 7, 8, 16, 24, 32, 40, 64, 96, 128, 192, 384, 5120, 16384, 32768,
    ] {
        for scaling in kinds {
            let opts = Fp8Options {
                scaling,
                ..Fp8Options::mxfp8()
            };
            if Fp8Problem::new(1, h, DType::BF16, &opts).is_err() {
                continue;
            }
            for m in [1usize, 3, 130] {
                if h * m > 1 << 20 {
                    continue;
                }
                let i = v.len();
                let (element, dtype) = (Fp8Element::ALL[i % 2], DTYPES[(i / 2) % 2]);
                let mut c = fp8_case(rng, m, h, dtype, element, scaling);
                c.y_out = i % 2 == 1;
                v.push(c);
            }
        }
    }
    v
}

pub(super) fn random_cases(rng: &mut StdRng, n: usize) -> Vec<Case> {
    let all = all_scalings();
    (0..n)
        .map(|_| {
            let element = pick(rng, &Fp8Element::ALL);
            let mut scaling = pick(rng, &all);
            let dtype = pick(rng, &DTYPES);
            let m = match rng.random_range(0..10) {
                0 => 0,
                1..=3 => rng.random_range(1..8),
                4..=7 => rng.random_range(1..200),
                _ => rng.random_range(120..300),
            };
            let u = unit(&scaling);
            let any_h = matches!(
                scaling,
                Fp8Scaling::PerTensor(_)
                    | Fp8Scaling::Dynamic {
                        group: Fp8Group::PerToken,
                        ..
                    }
            );
            let h = if any_h && rng.random_bool(0.15) {
                rng.random_range(1..=300)
            } else if rng.random_bool(0.1) {
                u * rng.random_range(64..=512)
            } else {
                u * rng.random_range(1..=64)
            };
            let m = if m * h > 1 << 20 { 3 } else { m };
            // Scale values: the per-tensor scale, and the floor of f32 scales.
            match &mut scaling {
                Fp8Scaling::PerTensor(s) => {
                    *s = match rng.random_range(0..4) {
                        0 => 1.0,
                        1 => random_static_scale(rng),
                        2 => 2f32.powf(rng.random_range(-30.0f32..30.0)),
                        _ => pick(rng, &[0.0f32, -1.0, f32::INFINITY, f32::NAN, 1e-40]),
                    }
                }
                Fp8Scaling::Dynamic {
                    format: Fp8ScaleFormat::F32 { s_min },
                    ..
                } => {
                    *s_min = match rng.random_range(0..4) {
                        0 | 1 => 0.0,
                        2 => VLLM_S_MIN,
                        _ => 2f32.powf(rng.random_range(-140.0f32..10.0)),
                    }
                }
                _ => {}
            }
            let mut c = fp8_case(rng, m, h, dtype, element, scaling);
            fill_mixed(rng, dtype, &mut c.x, c.residual.as_mut());
            if rng.random_bool(0.2) && h >= 8 {
                pow2_weights(&mut c, rng, block(&scaling, h), -30);
            }
            let any_eps = rng.random_range(0.0f32..1.0);
            c.set_eps(pick(rng, &[1e-6f32, 1e-5, 0.0, any_eps]));
            c.set_weight_bias(pick(rng, &[0.0f32, 0.0, 1.0, -0.5]));
            c.y_out = rng.random_bool(0.3);
            if rng.random_bool(0.2) {
                c.residual = None;
            }
            if rng.random_bool(0.15) {
                let pad = rng.random_range(1..40);
                c = with_stride(c, h + pad, rng);
            }
            c
        })
        .collect()
}

pub(super) fn bad_input(rng: &mut StdRng, _: usize) -> Vec<Case> {
    let token = dynamic(Fp8Group::PerToken, F32, ROW);
    let tensor = Fp8Scaling::PerTensor(1.0);
    let mut v: Vec<Case> = Vec::new();
    for dtype in DTYPES {
        let bad = |rng: &mut StdRng, scaling: Fp8Scaling, h: usize, note: &str| {
            let element = Fp8Element::ALL[h % 2];
            let mut c = fp8_case(rng, 5, h, dtype, element, scaling);
            c.note = note.into();
            c
        };
        v.push(bad(rng, token, 0, "H = 0"));
        v.push(bad(rng, tensor, 0, "H = 0"));
        v.push(bad(
            rng,
            dynamic(Fp8Group::G128, F32, COL),
            192,
            "H not a multiple of 128",
        ));
        v.push(bad(
            rng,
            dynamic(Fp8Group::G64, UE8M0, ROW),
            96,
            "H not a multiple of 64",
        ));
        v.push(bad(rng, mxfp8(), 48, "H not a multiple of 32"));
        v.push(bad(
            rng,
            dynamic(Fp8Group::G32, F32, SWZ),
            64,
            "swizzled with f32 scales",
        ));
        v.push(bad(
            rng,
            dynamic(Fp8Group::G64, UE8M0, SWZ),
            128,
            "swizzled with groups of 64",
        ));
        v.push(bad(
            rng,
            dynamic(Fp8Group::PerToken, UE8M0, SWZ),
            64,
            "swizzled per token with H = 64",
        ));
        for s_min in [f32::NAN, -1e-6, f32::INFINITY] {
            let f = Fp8ScaleFormat::F32 { s_min };
            v.push(bad(
                rng,
                dynamic(Fp8Group::PerToken, f, ROW),
                64,
                "invalid s_min",
            ));
        }
        for e in [-1e-6f32, f32::NAN, f32::INFINITY] {
            let mut c = bad(rng, mxfp8(), 64, "invalid eps");
            c.set_eps(e);
            v.push(c);
        }
        for b in [f32::NAN, f32::NEG_INFINITY] {
            let mut c = bad(rng, tensor, 64, "invalid weight bias");
            c.set_weight_bias(b);
            v.push(c);
        }
        for len in [63usize, 80] {
            let mut c = bad(rng, dynamic(Fp8Group::G32, F32, COL), 64, "");
            c.w.resize(len, 0x3F80);
            c.note = format!("weight of {len} for H = 64");
            v.push(c);
        }
        let mut c = bad(rng, token, 64, "input buffer one element short");
        c.x.pop();
        v.push(c);
        let mut c = bad(rng, mxfp8(), 64, "residual buffer one element short");
        if let Some(r) = c.residual.as_mut() {
            r.pop();
        }
        v.push(c);
        let mut c = bad(rng, tensor, 64, "row stride smaller than H");
        c.stride = 48;
        v.push(c);
    }
    v
}
