//! The FP8 ops (SPEC.md §8) under the same hostile decoding as the FP4 op: every element
//! format, scaling (per-tensor static, dynamic per token or per group of 32/64/128, f32
//! with a floor or UE8M0, every scale layout), scale buffers of the wrong kind or length,
//! and the shapes, strides, `eps` and weight biases of the parent module. Each call runs on
//! `fp8::cpu` and `fp8::reference` on identical copies of every buffer, then
//! `fp8::dequantize` and `Fp8Problem::new` get their own hostile calls.
//!
//! Invariants (SPEC.md §5 and §8):
//! * nothing panics;
//! * `Err` leaves every buffer byte-identical, with the same error from both backends;
//! * `Ok` on both backends, byte-identical outputs, nothing written outside the views,
//!   nothing at all for `M = 0`, and every padding position of the column-major and
//!   swizzled scale layouts zero;
//! * `dequantize` writes nothing on `Err` and exactly SPEC.md §8's values on `Ok`;
//! * an accepted `Fp8Problem` answers every size query, its scale positions lie inside
//!   its scale buffer, and `bytes_moved` is SPEC.md §6's figure (saturated).

use fp4norm::codec::ue8m0_decode;
use fp4norm::fp8::{
    self, dequantize, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat,
    Fp8ScaleLayout, Fp8Scales, Fp8ScalesIn, Fp8Scaling,
};
use fp4norm::layout::swizzled_offset;
use fp4norm::{bf16, f16, DType, Element};

use super::{
    bits, decode_len, decode_m, decode_mat, gaps_kept, refused_alike, special_or_bits, views,
    Backend, CallErr, Input, MatSpec, Rng,
};

/// What one [`check_fp8`] exercised, for counting in tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8Outcome {
    /// The fused call returned `Ok` on both backends.
    pub fused_ok: bool,
    /// The call had dynamic scales (f32 or UE8M0).
    pub dynamic: bool,
    /// `dequantize` returned `Ok`.
    pub dequant_ok: bool,
}

/// Which scale buffer variant the call passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleKind {
    /// `Fp8Scales::None`.
    None,
    /// `Fp8Scales::F32`.
    F32,
    /// `Fp8Scales::UE8M0`.
    Ue8m0,
}

/// vLLM's per-token scale floor, `1 / (448 · 512)`.
const VLLM_S_MIN: f32 = 1.0 / (448.0 * 512.0);

/// Valid dynamic scalings that engines use, so that short inputs reach each of them.
const PRESETS: [(Fp8Group, Fp8ScaleFormat, Fp8ScaleLayout); 11] = [
    (
        Fp8Group::PerToken,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::RowMajor,
    ),
    (
        Fp8Group::G128,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::ColumnMajor,
    ),
    (
        Fp8Group::G128,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::RowMajor,
    ),
    (
        Fp8Group::G128,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::ColumnMajor,
    ),
    (
        Fp8Group::G64,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::RowMajor,
    ),
    (
        Fp8Group::G32,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::Swizzled,
    ),
    (
        Fp8Group::G32,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::RowMajor,
    ),
    (
        Fp8Group::G32,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::ColumnMajor,
    ),
    (
        Fp8Group::PerToken,
        Fp8ScaleFormat::F32 { s_min: VLLM_S_MIN },
        Fp8ScaleLayout::RowMajor,
    ),
    (
        Fp8Group::G64,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::ColumnMajor,
    ),
    (
        Fp8Group::G128,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::ColumnMajorPacked,
    ),
];

/// Awkward scale floors: valid ones first.
const S_MIN: [f32; 6] = [
    0.0,
    VLLM_S_MIN,
    f32::MIN_POSITIVE,
    -1.0,
    f32::NAN,
    f32::INFINITY,
];

/// The options of one call: a zero byte gives E4M3 per token with f32 scales, row-major.
fn decode_options(inp: &mut Input<'_>) -> Fp8Options {
    let element = inp.pick(&Fp8Element::ALL);
    let scaling = match inp.byte() % 4 {
        0 => {
            let (group, format, layout) = inp.pick(&PRESETS);
            Fp8Scaling::Dynamic {
                group,
                format,
                layout,
            }
        }
        1 => Fp8Scaling::PerTensor(1.0),
        2 => Fp8Scaling::PerTensor(special_or_bits(inp)),
        _ => {
            // Any combination, valid or not.
            let group = inp.pick(&Fp8Group::ALL);
            let format = match inp.byte() % 3 {
                0 => Fp8ScaleFormat::F32 {
                    s_min: inp.pick(&S_MIN),
                },
                1 => Fp8ScaleFormat::UE8M0,
                _ => Fp8ScaleFormat::F32 {
                    s_min: special_or_bits(inp),
                },
            };
            let layout = inp.pick(&Fp8ScaleLayout::ALL);
            Fp8Scaling::Dynamic {
                group,
                format,
                layout,
            }
        }
    };
    Fp8Options {
        element,
        scaling,
        eps: 1e-6,
        weight_bias: 0.0,
    }
}

/// `H`: mostly a multiple of the group (or of 16 for per-tensor and per-token scaling),
/// sometimes 0, a non-multiple, or absurd.
fn decode_h(inp: &mut Input<'_>, opts: &Fp8Options) -> usize {
    let g = match opts.scaling {
        Fp8Scaling::Dynamic { group, .. } if group != Fp8Group::PerToken => group.size(0),
        _ => 16,
    };
    match inp.sel(7) {
        0 => g * (1 + inp.below(8)),
        1 => 0,
        2 => 16 * (1 + inp.below(16)),
        3 => g * (1 + inp.below(8)) + 1 + inp.below(g - 1),
        4 => inp.pick(&[usize::MAX, usize::MAX - 31, 1 << 62, 1 << 40, 1 << 31]),
        5 => inp.u64() as usize,
        _ => 1 + inp.below(100),
    }
}

/// The scale buffer's length for `opts` at `m × h`, if those are valid.
fn expected_scales(m: usize, h: usize, opts: &Fp8Options) -> Option<usize> {
    Fp8Problem::new(m, h, DType::BF16, opts)
        .ok()
        .map(|p| p.scales_len())
}

/// The variant the options ask for.
fn right_kind(opts: &Fp8Options) -> ScaleKind {
    match opts.scaling {
        Fp8Scaling::PerTensor(_) => ScaleKind::None,
        Fp8Scaling::Dynamic {
            format: Fp8ScaleFormat::F32 { .. },
            ..
        } => ScaleKind::F32,
        Fp8Scaling::Dynamic { .. } => ScaleKind::Ue8m0,
    }
}

/// A scale buffer variant: mostly the right one.
fn decode_kind(inp: &mut Input<'_>, opts: &Fp8Options) -> ScaleKind {
    match inp.sel(4) {
        0 => right_kind(opts),
        1 => ScaleKind::None,
        2 => ScaleKind::F32,
        _ => ScaleKind::Ue8m0,
    }
}

/// One FP8 call, decoded from bytes.
#[derive(Clone, Debug)]
pub struct Fp8Spec {
    /// f16 (else bf16).
    pub f16: bool,
    /// Element format, scaling, eps and weight bias.
    pub opts: Fp8Options,
    /// `M`.
    pub m: usize,
    /// `H`.
    pub h: usize,
    pub x: MatSpec,
    pub residual: Option<MatSpec>,
    pub y_out: Option<MatSpec>,
    pub w_len: usize,
    pub q_len: usize,
    pub kind: ScaleKind,
    /// Scale buffer length in elements (f32 values or bytes).
    pub scales_len: usize,
    pub seed: u64,
}

impl Fp8Spec {
    /// Decodes one call (valid when every byte read is zero).
    pub fn decode(inp: &mut Input<'_>) -> Self {
        let f16 = inp.byte() & 1 == 1;
        let mut opts = decode_options(inp);
        let with_residual = inp.byte() & 1 == 0;
        let with_y_out = inp.byte() & 1 == 1;
        let m = decode_m(inp);
        let h = decode_h(inp, &opts);
        let x = decode_mat(inp, m, h, false);
        let residual = with_residual.then(|| decode_mat(inp, m, h, true));
        let y_out = with_y_out.then(|| decode_mat(inp, m, h, true));
        let w_len = decode_len(inp, Some(h));
        let q_len = decode_len(inp, m.checked_mul(h));
        let kind = decode_kind(inp, &opts);
        let scales_len = match kind {
            ScaleKind::None => 0,
            _ => decode_len(inp, expected_scales(m, h, &opts)),
        };
        opts.eps = match inp.sel(3) {
            0 => 1e-6,
            _ => special_or_bits(inp),
        };
        opts.weight_bias = match inp.sel(3) {
            0 => 0.0,
            _ => special_or_bits(inp),
        };
        let seed = inp.u64();
        Fp8Spec {
            f16,
            opts,
            m,
            h,
            x,
            residual,
            y_out,
            w_len,
            q_len,
            kind,
            scales_len,
            seed,
        }
    }
}

/// Every buffer of one FP8 call.
#[derive(Clone, Debug)]
struct Buffers<T> {
    x: Vec<T>,
    residual: Vec<T>,
    y_out: Vec<T>,
    w: Vec<T>,
    q: Vec<u8>,
    f32_scales: Vec<f32>,
    ue8m0_scales: Vec<u8>,
}

impl<T: Element> Buffers<T> {
    fn new(s: &Fp8Spec) -> Self {
        let mut rng = Rng(s.seed);
        let f16 = T::DTYPE == DType::F16;
        let mut elems =
            |n: usize| -> Vec<T> { (0..n).map(|_| T::from_bits(rng.elem(f16))).collect() };
        let x = elems(s.x.len);
        let residual = elems(s.residual.map_or(0, |r| r.len));
        let w = elems(s.w_len);
        let y_out = elems(s.y_out.map_or(0, |y| y.len));
        let mut rng = Rng(s.seed ^ 0x5555);
        let q = rng.bytes(s.q_len);
        let (f32_len, ue8m0_len) = match s.kind {
            ScaleKind::None => (0, 0),
            ScaleKind::F32 => (s.scales_len, 0),
            ScaleKind::Ue8m0 => (0, s.scales_len),
        };
        Buffers {
            x,
            residual,
            y_out,
            w,
            q,
            f32_scales: (0..f32_len)
                .map(|_| f32::from_bits(rng.next() as u32))
                .collect(),
            ue8m0_scales: rng.bytes(ue8m0_len),
        }
    }

    /// Byte equality (NaN payloads included).
    fn same_bytes(&self, o: &Self) -> bool {
        let f32_bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        bits(&self.x) == bits(&o.x)
            && bits(&self.residual) == bits(&o.residual)
            && bits(&self.y_out) == bits(&o.y_out)
            && bits(&self.w) == bits(&o.w)
            && self.q == o.q
            && f32_bits(&self.f32_scales) == f32_bits(&o.f32_scales)
            && self.ue8m0_scales == o.ue8m0_scales
    }

    /// Whether scale element `i` is zero (f32 `+0.0` bits, or code 0).
    fn scale_is_zero(&self, kind: ScaleKind, i: usize) -> bool {
        match kind {
            ScaleKind::F32 => self.f32_scales[i].to_bits() == 0,
            ScaleKind::Ue8m0 => self.ue8m0_scales[i] == 0,
            ScaleKind::None => true,
        }
    }
}

fn invoke<T: Element>(s: &Fp8Spec, b: &mut Buffers<T>, be: Backend) -> Result<(), CallErr> {
    let Buffers {
        x,
        residual,
        y_out,
        w,
        q,
        f32_scales,
        ue8m0_scales,
    } = b;
    let (xv, rv, yv) = views(
        x,
        &s.x,
        residual,
        s.residual.as_ref(),
        y_out,
        s.y_out.as_ref(),
    )?;
    let scales = match s.kind {
        ScaleKind::None => Fp8Scales::None,
        ScaleKind::F32 => Fp8Scales::F32(&mut f32_scales[..]),
        ScaleKind::Ue8m0 => Fp8Scales::UE8M0(&mut ue8m0_scales[..]),
    };
    let out = Fp8Out {
        q: &mut q[..],
        scales,
        y_out: yv,
    };
    let w = &w[..];
    let o = &s.opts;
    let r = match (be, rv) {
        (Backend::Cpu, Some(r)) => fp8::cpu::add_rmsnorm_fp8quant(xv, r, w, out, o),
        (Backend::Cpu, None) => fp8::cpu::rmsnorm_fp8quant(xv, w, out, o),
        (Backend::Reference, Some(r)) => fp8::reference::add_rmsnorm_fp8quant(xv, r, w, out, o),
        (Backend::Reference, None) => fp8::reference::rmsnorm_fp8quant(xv, w, out, o),
    };
    r.map_err(CallErr::Op)
}

/// Runs one FP8 call on both backends and checks the invariants.
pub fn run_fp8_spec(s: &Fp8Spec) -> Fp8Outcome {
    let fused_ok = if s.f16 {
        run_fused::<f16>(s)
    } else {
        run_fused::<bf16>(s)
    };
    Fp8Outcome {
        fused_ok,
        dynamic: s.kind != ScaleKind::None,
        dequant_ok: false,
    }
}

fn run_fused<T: Element>(s: &Fp8Spec) -> bool {
    let before = Buffers::<T>::new(s);
    let mut a = before.clone();
    let mut b = before.clone();
    let ra = invoke(s, &mut a, Backend::Cpu);
    let rb = invoke(s, &mut b, Backend::Reference);
    match (&ra, &rb) {
        (Err(ea), Err(eb)) => {
            refused_alike(ea, eb, a.same_bytes(&before), b.same_bytes(&before), s);
            false
        }
        (Ok(()), Ok(())) => {
            assert!(a.same_bytes(&b), "cpu and reference outputs differ\n{s:?}");
            gaps_kept(&before.residual, &a.residual, s.residual.as_ref());
            gaps_kept(&before.y_out, &a.y_out, s.y_out.as_ref());
            if s.m == 0 {
                assert!(a.same_bytes(&before), "M = 0 wrote something\n{s:?}");
            } else {
                // Every scale position that no (row, group) owns is padding: zero.
                let p = Fp8Problem::new(s.m, s.h, T::DTYPE, &s.opts).expect("accepted call");
                let mut real = vec![false; p.scales_len()];
                for row in 0..s.m {
                    for g in 0..p.n_groups() {
                        real[scale_pos(&s.opts, s.m, s.h, row, g)] = true;
                    }
                }
                for (i, &r) in real.iter().enumerate() {
                    assert!(
                        r || a.scale_is_zero(s.kind, i),
                        "scale padding element {i} is not zero\n{s:?}"
                    );
                }
            }
            true
        }
        _ => panic!("cpu returned {ra:?} but reference returned {rb:?}\n{s:?}"),
    }
}

/// Where SPEC.md §8 puts scale `(row, g)`, written out from its layout definitions (not
/// through `Fp8Problem::scale_index`, which this checks).
fn scale_pos(opts: &Fp8Options, m: usize, h: usize, row: usize, g: usize) -> usize {
    let Fp8Scaling::Dynamic { group, layout, .. } = opts.scaling else {
        return 0;
    };
    let n = h / group.size(h);
    match layout {
        Fp8ScaleLayout::RowMajor => row * n + g,
        Fp8ScaleLayout::ColumnMajor => g * (4 * m.div_ceil(4)) + row,
        Fp8ScaleLayout::Swizzled => swizzled_offset(row, g, n),
        // Byte g % 4 of word (g / 4) · Mp4 + row.
        Fp8ScaleLayout::ColumnMajorPacked => 4 * ((g / 4) * (4 * m.div_ceil(4)) + row) + g % 4,
    }
}

/// SPEC.md §8's dequantised value, with the canonical NaN.
fn dequant_value(element: Fp8Element, code: u8, scale: f32) -> u32 {
    let v = element.decode(code) * scale;
    if v.is_nan() {
        0x7FFF_FFFF
    } else {
        v.to_bits()
    }
}

fn run_dequant(inp: &mut Input<'_>) -> bool {
    let mut opts = decode_options(inp);
    // Dequantisation ignores eps, weight bias and the floor, even when they are invalid.
    if inp.byte() & 1 == 1 {
        opts.eps = special_or_bits(inp);
        opts.weight_bias = special_or_bits(inp);
    }
    let m = decode_m(inp);
    let h = decode_h(inp, &opts);
    let q_len = decode_len(inp, m.checked_mul(h));
    let kind = decode_kind(inp, &opts);
    let neutral = Fp8Options {
        eps: 0.0,
        weight_bias: 0.0,
        scaling: match opts.scaling {
            Fp8Scaling::Dynamic {
                group,
                format: Fp8ScaleFormat::F32 { .. },
                layout,
            } => Fp8Scaling::Dynamic {
                group,
                format: Fp8ScaleFormat::F32_NO_FLOOR,
                layout,
            },
            other => other,
        },
        ..opts
    };
    let scales_len = match kind {
        ScaleKind::None => 0,
        _ => decode_len(inp, expected_scales(m, h, &neutral)),
    };
    let out_len = decode_len(inp, m.checked_mul(h));
    let mut rng = Rng(inp.u64());
    let q = rng.bytes(q_len);
    let f32_scales: Vec<f32> = (0..if kind == ScaleKind::F32 {
        scales_len
    } else {
        0
    })
        .map(|_| f32::from_bits(rng.next() as u32))
        .collect();
    let ue8m0_scales = rng.bytes(if kind == ScaleKind::Ue8m0 {
        scales_len
    } else {
        0
    });
    let before: Vec<u32> = (0..out_len).map(|_| rng.next() as u32).collect();
    let mut out: Vec<f32> = before.iter().map(|&b| f32::from_bits(b)).collect();
    let scales = match kind {
        ScaleKind::None => Fp8ScalesIn::None,
        ScaleKind::F32 => Fp8ScalesIn::F32(&f32_scales),
        ScaleKind::Ue8m0 => Fp8ScalesIn::UE8M0(&ue8m0_scales),
    };
    let after = |out: &[f32]| out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    match dequantize(m, h, &opts, &q, scales, &mut out) {
        Err(e) => {
            assert_eq!(
                after(&out),
                before,
                "fp8 dequantize wrote before returning {e:?}"
            );
            false
        }
        Ok(()) => {
            let p = Fp8Problem::new(m, h, DType::BF16, &neutral).expect("accepted call");
            let g = p.group().unwrap_or(h);
            for row in 0..m {
                for i in 0..h {
                    let at = scale_pos(&opts, m, h, row, i / g);
                    let scale = match (opts.scaling, kind) {
                        (Fp8Scaling::PerTensor(s), _) => s,
                        (_, ScaleKind::F32) => f32_scales[at],
                        (_, ScaleKind::Ue8m0) => ue8m0_decode(ue8m0_scales[at]),
                        (_, ScaleKind::None) => panic!("dynamic scaling accepted no scales"),
                    };
                    let want = dequant_value(opts.element, q[row * h + i], scale);
                    assert_eq!(
                        out[row * h + i].to_bits(),
                        want,
                        "fp8 dequantize ({row}, {i})"
                    );
                }
            }
            true
        }
    }
}

/// `Fp8Problem::new` on any sizes and options: never panics; an accepted problem answers
/// every query consistently.
pub fn run_fp8_problem(inp: &mut Input<'_>) {
    let mut opts = decode_options(inp);
    let m = decode_m(inp);
    let h = decode_h(inp, &opts);
    let dtype = if inp.byte() & 1 == 1 {
        DType::F16
    } else {
        DType::BF16
    };
    if inp.sel(3) != 0 {
        opts.eps = special_or_bits(inp);
    }
    let Ok(p) = Fp8Problem::new(m, h, dtype, &opts) else {
        return;
    };
    let n = p.n_groups();
    assert_eq!(p.q_len() as u128, m as u128 * h as u128);
    assert!(p.scales_len() as u128 >= m as u128 * n as u128);
    assert!(p.layout().is_none() || p.scale_rows() >= m);
    if m > 0 && n > 0 {
        for (row, g) in [(0, 0), (m - 1, n - 1), (m - 1, 0), (0, n - 1)] {
            assert_eq!(p.scale_index(row, g), scale_pos(&opts, m, h, row, g));
            assert!(
                p.scale_index(row, g) < p.scales_len(),
                "scale ({row}, {g}) outside the buffer: {p:?}"
            );
        }
    }
    for p in [
        p,
        p.without_residual(),
        p.with_y_out(true),
        p.without_residual().with_y_out(true),
    ] {
        let (mh, e) = (m as u128 * h as u128, dtype.size() as u128);
        let io = if p.has_residual { 3 } else { 1 };
        let yo = if p.has_y_out { mh * e } else { 0 };
        let scale = p.scales_len() as u128 * p.scale_element_bytes() as u128;
        let want = mh * io * e + h as u128 * e + mh + scale + yo;
        let got = p.bytes_moved();
        assert!(
            got as u128 == want || (want > u64::MAX as u128 && got == u64::MAX),
            "bytes_moved {got} for {p:?}, SPEC.md §6 gives {want}"
        );
    }
}

/// Decodes `data` into one FP8 call, one FP8 `dequantize` call and one `Fp8Problem::new`,
/// runs them and asserts the invariants above (panicking on a violation).
pub fn check_fp8(data: &[u8]) -> Fp8Outcome {
    let mut inp = Input::new(data);
    let spec = Fp8Spec::decode(&mut inp);
    let mut outcome = run_fp8_spec(&spec);
    outcome.dequant_ok = run_dequant(&mut inp);
    run_fp8_problem(&mut inp);
    outcome
}
