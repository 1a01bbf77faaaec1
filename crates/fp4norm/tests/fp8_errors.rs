//! Every bad-input rule of the FP8 ops (SPEC.md §5 applied to §8): each is an error
//! returned before anything is written, on the reference, the CPU path and the root
//! re-exports. Each test asserts the exact `Error` variant with its fields, that every
//! buffer (inputs and outputs) is byte for byte unchanged, and that the message says what
//! to change. Buffer sizes here come from the spec's formulas, not from `Fp8Problem`.

use fp4norm::fp8::{
    self, Fp8Element, Fp8Group, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
    Fp8Scales, Fp8ScalesIn,
};
use fp4norm::{bf16, DType, Error, MatMut, MatRef};

#[derive(Clone, Copy, Debug)]
enum Backend {
    Reference,
    Cpu,
    Root,
}

const BACKENDS: [Backend; 3] = [Backend::Reference, Backend::Cpu, Backend::Root];

#[derive(Clone, Debug)]
enum ScaleBuf {
    None,
    F32(Vec<f32>),
    U8(Vec<u8>),
}

/// One call's buffers: valid unless a test breaks one of them.
#[derive(Clone, Debug)]
struct Setup {
    m: usize,
    h: usize,
    x: Vec<bf16>,
    /// Residual buffer and the shape its view claims.
    residual: Option<(Vec<bf16>, usize, usize)>,
    w: Vec<bf16>,
    q: Vec<u8>,
    scales: ScaleBuf,
    y_out: Option<(Vec<bf16>, usize, usize)>,
    opts: Fp8Options,
}

/// The scale buffer length of SPEC.md §8 for `opts` (0 for a per-tensor scale).
fn spec_scales_len(m: usize, h: usize, opts: &Fp8Options) -> usize {
    match opts.scaling {
        fp8::Fp8Scaling::PerTensor(_) => 0,
        fp8::Fp8Scaling::Dynamic { group, layout, .. } => {
            let g = match group {
                Fp8Group::PerToken => h,
                Fp8Group::G32 => 32,
                Fp8Group::G64 => 64,
                Fp8Group::G128 => 128,
            };
            let n = if g > 0 && h % g == 0 { h / g } else { 1 };
            match layout {
                Fp8ScaleLayout::RowMajor => m * n,
                Fp8ScaleLayout::ColumnMajor => 4 * m.div_ceil(4) * n,
                Fp8ScaleLayout::Swizzled => 128 * m.div_ceil(128) * 4 * n.div_ceil(4),
                Fp8ScaleLayout::ColumnMajorPacked => 4 * n.div_ceil(4) * 4 * m.div_ceil(4),
            }
        }
    }
}

fn valid(m: usize, h: usize, opts: Fp8Options) -> Setup {
    let n = spec_scales_len(m, h, &opts);
    let scales = match opts.scaling {
        fp8::Fp8Scaling::PerTensor(_) => ScaleBuf::None,
        fp8::Fp8Scaling::Dynamic {
            format: Fp8ScaleFormat::UE8M0,
            ..
        } => ScaleBuf::U8(vec![0xA5; n]),
        _ => ScaleBuf::F32(vec![f32::from_bits(0xA5A5_A5A5); n]),
    };
    Setup {
        m,
        h,
        x: (0..m * h)
            .map(|i| bf16::from_f32((i % 13) as f32 - 6.0))
            .collect(),
        residual: Some((vec![bf16::from_f32(0.5); m * h], m, h)),
        w: vec![bf16::ONE; h],
        q: vec![0xA5; m * h],
        scales,
        y_out: Some((vec![bf16::from_bits(0x5555); m * h], m, h)),
        opts,
    }
}

fn per_group(g: Fp8Group, f: Fp8ScaleFormat, l: Fp8ScaleLayout) -> Fp8Options {
    Fp8Options::dynamic(Fp8Element::E4M3, g, f, l)
}

/// Valid setups of every kind: per tensor, per token, groups, column-major, MXFP8.
fn kinds() -> Vec<Setup> {
    vec![
        valid(3, 64, Fp8Options::per_tensor(Fp8Element::E5M2, 0.5)),
        valid(3, 64, Fp8Options::per_token(Fp8Element::E4M3)),
        valid(
            5,
            128,
            per_group(
                Fp8Group::G64,
                Fp8ScaleFormat::F32_NO_FLOOR,
                Fp8ScaleLayout::ColumnMajor,
            ),
        ),
        valid(
            5,
            128,
            per_group(
                Fp8Group::G128,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::RowMajor,
            ),
        ),
        valid(3, 64, Fp8Options::mxfp8()),
    ]
}

impl Setup {
    fn run(&mut self, backend: Backend) -> Result<(), Error> {
        let x = MatRef::new(&self.x, self.m, self.h)?;
        let scales = match &mut self.scales {
            ScaleBuf::None => Fp8Scales::None,
            ScaleBuf::F32(s) => Fp8Scales::F32(s),
            ScaleBuf::U8(s) => Fp8Scales::UE8M0(s),
        };
        let y_out = match &mut self.y_out {
            Some((d, r, c)) => Some(MatMut::new(d, *r, *c)?),
            None => None,
        };
        let out = Fp8Out {
            q: &mut self.q,
            scales,
            y_out,
        };
        let (w, o) = (&self.w, &self.opts);
        match &mut self.residual {
            Some((d, r, c)) => {
                let rv = MatMut::new(d, *r, *c)?;
                match backend {
                    Backend::Reference => fp8::reference::add_rmsnorm_fp8quant(x, rv, w, out, o),
                    Backend::Cpu => fp8::cpu::add_rmsnorm_fp8quant(x, rv, w, out, o),
                    Backend::Root => fp4norm::add_rmsnorm_fp8quant(x, rv, w, out, o),
                }
            }
            None => match backend {
                Backend::Reference => fp8::reference::rmsnorm_fp8quant(x, w, out, o),
                Backend::Cpu => fp8::cpu::rmsnorm_fp8quant(x, w, out, o),
                Backend::Root => fp4norm::rmsnorm_fp8quant(x, w, out, o),
            },
        }
    }

    /// Every byte a call could write, and the inputs too.
    fn snapshot(&self) -> Vec<u8> {
        let mut v: Vec<u8> = Vec::new();
        let b16 = |v: &mut Vec<u8>, d: &[bf16]| {
            v.extend(d.iter().flat_map(|e| e.to_bits().to_le_bytes()))
        };
        b16(&mut v, &self.x);
        if let Some((d, ..)) = &self.residual {
            b16(&mut v, d);
        }
        if let Some((d, ..)) = &self.y_out {
            b16(&mut v, d);
        }
        b16(&mut v, &self.w);
        v.extend(&self.q);
        match &self.scales {
            ScaleBuf::None => {}
            ScaleBuf::F32(s) => v.extend(s.iter().flat_map(|f| f.to_bits().to_le_bytes())),
            ScaleBuf::U8(s) => v.extend(s),
        }
        v
    }
}

/// The call fails on every backend with an error `pred` accepts, and writes nothing;
/// returns the error (of the last backend) for message checks.
fn expect_err(s: &Setup, what: &str, pred: impl Fn(&Error) -> bool) -> Error {
    let before = s.snapshot();
    let mut last = None;
    for be in BACKENDS {
        let mut t = s.clone();
        match t.run(be) {
            Ok(()) => panic!("{what} [{be:?}]: call succeeded, expected an error"),
            Err(e) => {
                assert!(pred(&e), "{what} [{be:?}]: wrong error {e:?}");
                assert!(
                    t.snapshot() == before,
                    "{what} [{be:?}]: the failed call wrote to a buffer"
                );
                assert!(!e.to_string().trim().is_empty());
                last = Some(e);
            }
        }
    }
    last.unwrap()
}

fn expect_ok(s: &Setup, what: &str) {
    for be in BACKENDS {
        s.clone()
            .run(be)
            .unwrap_or_else(|e| panic!("{what} [{be:?}]: valid setup failed: {e}"));
    }
}

/// `e`'s message contains every one of `words`.
fn assert_mentions(e: &Error, words: &[&str]) {
    let s = e.to_string();
    for w in words {
        assert!(s.contains(w), "message of {e:?} should mention {w:?}: {s}");
    }
}

#[test]
fn valid_setups_succeed() {
    for s in kinds() {
        expect_ok(&s, &format!("{:?}", s.opts));
        let mut t = s.clone();
        t.residual = None;
        t.y_out = None;
        expect_ok(&t, "no residual, no y_out");
    }
    // Per token with H = 32 is a group of 32: the swizzled layout is allowed.
    expect_ok(
        &valid(
            3,
            32,
            per_group(
                Fp8Group::PerToken,
                Fp8ScaleFormat::UE8M0,
                Fp8ScaleLayout::Swizzled,
            ),
        ),
        "per-token MXFP8 with H = 32",
    );
    // Per-token and per-tensor scales take any H, odd too.
    expect_ok(
        &valid(3, 7, Fp8Options::per_token(Fp8Element::E5M2)),
        "per-token H = 7",
    );
    expect_ok(
        &valid(3, 7, Fp8Options::per_tensor(Fp8Element::E4M3, 2.0)),
        "per-tensor H = 7",
    );
    // -0.0 counts as 0 for eps and s_min.
    let neg0 = Fp8Options::dynamic(
        Fp8Element::E4M3,
        Fp8Group::G32,
        Fp8ScaleFormat::F32 { s_min: -0.0 },
        Fp8ScaleLayout::RowMajor,
    )
    .with_eps(-0.0);
    expect_ok(&valid(2, 64, neg0), "eps and s_min -0.0");
    // M = 0 writes nothing and needs empty buffers.
    for s in kinds() {
        expect_ok(&valid(0, s.h, s.opts), "M = 0");
    }
}

/// `fp8::validate` returns the call's own problem: with or without the residual and
/// `y_out`, and SPEC.md §6's byte count for exactly those buffers (1-byte codes, 2-byte
/// bf16, 4-byte f32 scales here: per token, one scale a row).
#[test]
fn validate_returns_the_calls_problem() {
    let (m, h) = (5usize, 64usize);
    let opts = Fp8Options::per_token(Fp8Element::E4M3);
    let x = vec![bf16::ONE; m * h];
    let w = vec![bf16::ONE; h];
    for (with_residual, with_y_out) in [(true, false), (false, false), (true, true), (false, true)]
    {
        let mut r = vec![bf16::ONE; m * h];
        let mut y = vec![bf16::ZERO; m * h];
        let mut q = vec![0u8; m * h];
        let mut sc = vec![0f32; m];
        let residual = with_residual.then(|| MatMut::new(&mut r, m, h).unwrap());
        let out = Fp8Out {
            q: &mut q,
            scales: Fp8Scales::F32(&mut sc),
            y_out: with_y_out.then(|| MatMut::new(&mut y, m, h).unwrap()),
        };
        let x = MatRef::new(&x, m, h).unwrap();
        let p = fp8::validate(&x, residual.as_ref(), &w, &out, &opts).unwrap();
        assert_eq!((p.has_residual, p.has_y_out), (with_residual, with_y_out));
        let mh = (m * h) as u64;
        let io = if with_residual { 3 } else { 1 };
        let want =
            mh * io * 2 + h as u64 * 2 + mh + 4 * m as u64 + if with_y_out { mh * 2 } else { 0 };
        assert_eq!(
            p.bytes_moved(),
            want,
            "residual {with_residual}, y_out {with_y_out}"
        );
    }
}

#[test]
fn hidden_size_zero() {
    for s in kinds() {
        let s = valid(3, 0, s.opts);
        let e = expect_err(&s, "H = 0", |e| matches!(e, Error::Fp8ZeroHidden));
        assert_mentions(&e, &["H is 0", "H > 0"]);
    }
}

#[test]
fn hidden_not_multiple_of_group() {
    for (g, h, group) in [
        (Fp8Group::G32, 48, 32),
        (Fp8Group::G64, 96, 64),
        (Fp8Group::G128, 192, 128),
    ] {
        for format in [Fp8ScaleFormat::F32_NO_FLOOR, Fp8ScaleFormat::UE8M0] {
            let s = valid(2, h, per_group(g, format, Fp8ScaleLayout::RowMajor));
            let e = expect_err(
                &s,
                "H % G",
                |e| matches!(e, Error::HiddenNotMultipleOfGroup { h: hh, group: gg } if *hh == h && *gg == group),
            );
            assert_mentions(&e, &[&h.to_string(), &group.to_string(), "per-token"]);
        }
    }
}

#[test]
fn group_size_from_number() {
    assert_eq!(Fp8Group::try_from(32).unwrap(), Fp8Group::G32);
    assert_eq!(Fp8Group::try_from(64).unwrap(), Fp8Group::G64);
    assert_eq!(Fp8Group::try_from(128).unwrap(), Fp8Group::G128);
    for g in [0usize, 16, 33, 256] {
        let e = Fp8Group::try_from(g).unwrap_err();
        assert!(matches!(e, Error::InvalidGroupSize(x) if x == g), "{e:?}");
        assert_mentions(&e, &["32, 64 or 128"]);
    }
}

#[test]
fn swizzled_needs_ue8m0_in_groups_of_32() {
    for (g, format, h, name, group) in [
        (Fp8Group::G32, Fp8ScaleFormat::F32_NO_FLOOR, 64, "f32", 32),
        (Fp8Group::G64, Fp8ScaleFormat::UE8M0, 128, "ue8m0", 64),
        (Fp8Group::G128, Fp8ScaleFormat::UE8M0, 128, "ue8m0", 128),
        (Fp8Group::PerToken, Fp8ScaleFormat::UE8M0, 64, "ue8m0", 64),
        (
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32 { s_min: 0.0 },
            32,
            "f32",
            32,
        ),
    ] {
        let mut s = valid(3, h, per_group(g, format, Fp8ScaleLayout::Swizzled));
        // A buffer of the swizzled size: the layout itself is refused.
        s.scales = match format {
            Fp8ScaleFormat::UE8M0 => ScaleBuf::U8(vec![0xA5; 512]),
            _ => ScaleBuf::F32(vec![0.0; 512]),
        };
        let e = expect_err(
            &s,
            "swizzled",
            |e| matches!(e, Error::SwizzledNeedsMxfp8 { format: f, group: gg } if *f == name && *gg == group),
        );
        assert_mentions(&e, &["UE8M0", "G = 32", "row-major", "column-major"]);
    }
}

#[test]
fn packed_column_major_needs_ue8m0_in_groups() {
    for (g, format, h, group) in [
        (Fp8Group::G32, Fp8ScaleFormat::F32_NO_FLOOR, 64, "32"),
        (
            Fp8Group::G128,
            Fp8ScaleFormat::F32 { s_min: 0.0 },
            128,
            "128",
        ),
        (
            Fp8Group::PerToken,
            Fp8ScaleFormat::UE8M0,
            64,
            "the row (per token)",
        ),
        (
            Fp8Group::PerToken,
            Fp8ScaleFormat::F32_NO_FLOOR,
            32,
            "the row (per token)",
        ),
    ] {
        let mut s = valid(
            3,
            h,
            per_group(g, format, Fp8ScaleLayout::ColumnMajorPacked),
        );
        // A buffer of the packed size (one word column of Mp4 = 4 rows): the layout itself
        // is refused.
        s.scales = match format {
            Fp8ScaleFormat::UE8M0 => ScaleBuf::U8(vec![0xA5; 16]),
            _ => ScaleBuf::F32(vec![0.0; 16]),
        };
        let e = expect_err(
            &s,
            "packed",
            |e| matches!(e, Error::PackedNeedsUe8m0Groups { format: f, group: gg } if *f == format.name() && gg == group),
        );
        assert_mentions(&e, &["UE8M0", "32, 64 or 128", "row-major", "column-major"]);
    }
}

#[test]
fn invalid_scale_floor() {
    for s_min in [
        -1e-3f32,
        -f32::MIN_POSITIVE,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        let opts = per_group(
            Fp8Group::G32,
            Fp8ScaleFormat::F32 { s_min },
            Fp8ScaleLayout::RowMajor,
        );
        let s = valid(2, 64, opts);
        let e = expect_err(
            &s,
            "s_min",
            |e| matches!(e, Error::InvalidScaleFloor(v) if v.to_bits() == s_min.to_bits()),
        );
        assert_mentions(&e, &["s_min", "finite and ≥ 0"]);
    }
}

#[test]
fn invalid_eps() {
    for s in kinds() {
        for eps in [-1e-6f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let s = valid(s.m, s.h, s.opts.with_eps(eps));
            let e = expect_err(
                &s,
                "eps",
                |e| matches!(e, Error::InvalidEps(v) if v.to_bits() == eps.to_bits()),
            );
            assert_mentions(&e, &["eps"]);
        }
    }
}

#[test]
fn invalid_weight_bias() {
    for s in kinds() {
        for b in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let s = valid(s.m, s.h, s.opts.with_weight_bias(b));
            let e = expect_err(
                &s,
                "weight_bias",
                |e| matches!(e, Error::InvalidWeightBias(v) if v.to_bits() == b.to_bits()),
            );
            assert_mentions(&e, &["weight_bias", "finite"]);
        }
    }
}

#[test]
fn residual_and_y_out_shape_mismatch() {
    for s in kinds() {
        let (m, h) = (s.m, s.h);
        for (rows, cols) in [(m + 1, h), (m - 1, h), (m, h - 32)] {
            let mut t = s.clone();
            t.residual = Some((vec![bf16::ZERO; rows * cols], rows, cols));
            expect_err(&t, "residual shape", |e| {
                matches!(e, Error::ShapeMismatch { name: "residual", rows: r, cols: c, got_rows, got_cols }
                    if (*r, *c, *got_rows, *got_cols) == (m, h, rows, cols))
            });
            let mut t = s.clone();
            t.y_out = Some((vec![bf16::ZERO; rows * cols], rows, cols));
            expect_err(&t, "y_out shape", |e| {
                matches!(e, Error::ShapeMismatch { name: "y_out", got_rows, got_cols, .. }
                    if (*got_rows, *got_cols) == (rows, cols))
            });
        }
    }
}

#[test]
fn weight_length() {
    for s in kinds() {
        for len in [s.h - 1, s.h + 1, 0] {
            let mut t = s.clone();
            t.w = vec![bf16::ONE; len];
            let h = s.h;
            expect_err(
                &t,
                "weight length",
                |e| matches!(e, Error::WeightLength { expected, got } if (*expected, *got) == (h, len)),
            );
        }
    }
}

#[test]
fn q_length() {
    for s in kinds() {
        let want = s.m * s.h;
        // Too short, too long, and the FP4 op's M·H/2.
        for len in [want - 1, want + 1, want / 2] {
            let mut t = s.clone();
            t.q = vec![0xA5; len];
            let e = expect_err(
                &t,
                "q length",
                |e| matches!(e, Error::OutputSize { name: "q", expected, got, .. } if (*expected, *got) == (want, len)),
            );
            assert_mentions(&e, &["M·H"]);
        }
    }
}

#[test]
fn scale_buffer_of_another_kind() {
    let none = "Fp8Scales::None";
    let f32s = "Fp8Scales::F32";
    let ue8m0 = "Fp8Scales::UE8M0";
    for s in kinds() {
        let n = spec_scales_len(s.m, s.h, &s.opts);
        let (right, wrongs) = match &s.scales {
            ScaleBuf::None => (
                none,
                vec![ScaleBuf::F32(vec![0.0; 3]), ScaleBuf::U8(vec![0; 3])],
            ),
            ScaleBuf::F32(_) => (f32s, vec![ScaleBuf::None, ScaleBuf::U8(vec![0; n])]),
            ScaleBuf::U8(_) => (ue8m0, vec![ScaleBuf::None, ScaleBuf::F32(vec![0.0; n])]),
        };
        for wrong in wrongs {
            let mut t = s.clone();
            t.scales = wrong;
            let e = expect_err(
                &t,
                "scale kind",
                |e| matches!(e, Error::Fp8ScaleKind { expected, .. } if expected.starts_with(right)),
            );
            assert_mentions(&e, &[right]);
        }
    }
}

#[test]
fn scale_buffer_length() {
    for s in kinds() {
        let n = spec_scales_len(s.m, s.h, &s.opts);
        if n == 0 {
            continue;
        }
        for len in [n - 1, n + 1, 0] {
            let mut t = s.clone();
            t.scales = match &s.scales {
                ScaleBuf::F32(_) => ScaleBuf::F32(vec![0.0; len]),
                ScaleBuf::U8(_) => ScaleBuf::U8(vec![0; len]),
                ScaleBuf::None => unreachable!(),
            };
            let e = expect_err(&t, "scales length", |e| match e {
                Error::F32Length {
                    name: "scales",
                    expected,
                    got,
                    ..
                }
                | Error::OutputSize {
                    name: "scales",
                    expected,
                    got,
                    ..
                } => (*expected, *got) == (n, len),
                _ => false,
            });
            assert!(
                matches!(
                    (&s.scales, &e),
                    (ScaleBuf::F32(_), Error::F32Length { .. })
                        | (ScaleBuf::U8(_), Error::OutputSize { .. })
                ),
                "{e:?}"
            );
        }
    }
    // A buffer sized for another layout is refused: M = 5, H = 128, G = 32 (n = 4):
    // row-major 20, column-major 32 (Mp4 = 8), swizzled 512, packed 32 (one word column).
    for (layout, wrong) in [
        (Fp8ScaleLayout::ColumnMajor, 20usize),
        (Fp8ScaleLayout::RowMajor, 32),
        (Fp8ScaleLayout::Swizzled, 20),
        (Fp8ScaleLayout::ColumnMajorPacked, 512),
    ] {
        let mut t = valid(
            5,
            128,
            per_group(Fp8Group::G32, Fp8ScaleFormat::UE8M0, layout),
        );
        t.scales = ScaleBuf::U8(vec![0xA5; wrong]);
        let e = expect_err(
            &t,
            "scales of another layout",
            |e| matches!(e, Error::OutputSize { name: "scales", got, .. } if *got == wrong),
        );
        assert_mentions(&e, &[layout.name()]);
    }
}

#[test]
fn sizes_overflow() {
    let opts = Fp8Options::per_token(Fp8Element::E4M3);
    for (m, h) in [(usize::MAX, 2), (usize::MAX / 4, 4), (1 << 62, 1)] {
        let e = Fp8Problem::new(m, h, DType::BF16, &opts).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow), "{e:?}");
    }
    // Column-major rounds M up to Mp4: M = usize::MAX - 1 overflows there.
    let cm = per_group(
        Fp8Group::G32,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::ColumnMajor,
    );
    assert!(matches!(
        Fp8Problem::new(usize::MAX - 1, 32, DType::BF16, &cm),
        Err(Error::SizeOverflow)
    ));
    // Fields changed after `Fp8Problem::new`: lengths saturate, nothing divides by zero.
    let mut p = Fp8Problem::new(4, 64, DType::BF16, &cm).unwrap();
    p.m = usize::MAX;
    assert_eq!(p.q_len(), usize::MAX);
    assert_eq!(p.scales_len(), usize::MAX);
    assert_eq!(p.scale_bytes_written(), usize::MAX);
    let mut p = Fp8Problem::new(4, 64, DType::BF16, &opts).unwrap();
    p.h = 0;
    assert_eq!((p.n_groups(), p.q_len()), (0, 0));
}

#[test]
fn dequantize_bad_inputs() {
    let (m, h) = (3, 64);
    let opts = per_group(
        Fp8Group::G32,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::ColumnMajor,
    );
    let q = vec![0x38u8; m * h];
    let sf = vec![1.0f32; 2 * 4]; // H/G = 2, Mp4 = 4
    let mut out = vec![7.0f32; m * h];
    let untouched =
        |out: &[f32]| assert!(out.iter().all(|&v| v == 7.0), "dequantize wrote on error");
    // Valid first.
    let mut ok = out.clone();
    fp8::dequantize(m, h, &opts, &q, Fp8ScalesIn::F32(&sf), &mut ok).unwrap();
    assert!(ok.iter().all(|&v| v == 1.0));
    // q length.
    let e = fp8::dequantize(m, h, &opts, &q[1..], Fp8ScalesIn::F32(&sf), &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutputSize {
                name: "q",
                expected: 192,
                got: 191,
                ..
            }
        ),
        "{e:?}"
    );
    // Scale kind and length.
    let e = fp8::dequantize(m, h, &opts, &q, Fp8ScalesIn::UE8M0(&[0; 8]), &mut out).unwrap_err();
    assert!(matches!(e, Error::Fp8ScaleKind { .. }), "{e:?}");
    let e = fp8::dequantize(m, h, &opts, &q, Fp8ScalesIn::None, &mut out).unwrap_err();
    assert!(matches!(e, Error::Fp8ScaleKind { .. }), "{e:?}");
    let e = fp8::dequantize(m, h, &opts, &q, Fp8ScalesIn::F32(&sf[..6]), &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::F32Length {
                name: "scales",
                expected: 8,
                got: 6,
                ..
            }
        ),
        "{e:?}"
    );
    // Output length.
    let e = fp8::dequantize(m, h, &opts, &q, Fp8ScalesIn::F32(&sf), &mut out[1..]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::F32Length {
                name: "out",
                expected: 192,
                got: 191,
                ..
            }
        ),
        "{e:?}"
    );
    // Options: H not a multiple of G; swizzled without UE8M0.
    let e = fp8::dequantize(
        m,
        48,
        &opts,
        &q[..m * 48],
        Fp8ScalesIn::F32(&sf),
        &mut out[..m * 48],
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::HiddenNotMultipleOfGroup { h: 48, group: 32 }),
        "{e:?}"
    );
    let sw = per_group(
        Fp8Group::G32,
        Fp8ScaleFormat::F32_NO_FLOOR,
        Fp8ScaleLayout::Swizzled,
    );
    let e = fp8::dequantize(m, h, &sw, &q, Fp8ScalesIn::F32(&[0.0; 512]), &mut out).unwrap_err();
    assert!(matches!(e, Error::SwizzledNeedsMxfp8 { .. }), "{e:?}");
    untouched(&out);
    // eps, weight bias and s_min are the quantising call's: dequantize does not check them.
    let odd = Fp8Options::dynamic(
        Fp8Element::E4M3,
        Fp8Group::G32,
        Fp8ScaleFormat::F32 { s_min: f32::NAN },
        Fp8ScaleLayout::ColumnMajor,
    )
    .with_eps(f32::NAN)
    .with_weight_bias(f32::INFINITY);
    fp8::dequantize(m, h, &odd, &q, Fp8ScalesIn::F32(&sf), &mut ok).unwrap();
}
