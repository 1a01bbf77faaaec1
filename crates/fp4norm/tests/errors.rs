//! SPEC.md §5: every violation the host API can express is an error, returned before
//! anything is written. One test per rule; each asserts the exact `Error` variant (with
//! its fields) through `reference`, `cpu` and the root re-exports, and that every output
//! buffer and the residual are byte-for-byte unchanged.
//!
//! Not reachable through the host API (so not tested here): dtype mismatch between x, r,
//! w, y_out (one generic `T: Element` for all of them), overlapping buffers (the borrow
//! checker forbids `&` and `&mut` to the same memory), devices and alignment (CUDA only).

mod common;

use fp4norm::layout::{row_major_len, swizzled_len};
use fp4norm::{
    bf16, cpu, dequantize, reference, BlockSize, DType, Error, Fp4Format, Fp4Out, GlobalScale,
    MatMut, MatRef, Options, Problem, ScaleFormat, ScaleIn, ScaleLayout, ScaleOut,
};

#[derive(Clone, Copy, Debug)]
enum Path {
    Reference,
    Cpu,
    Root,
}
const PATHS: [Path; 3] = [Path::Reference, Path::Cpu, Path::Root];

/// A matrix argument: buffer, rows, cols, row stride.
#[derive(Clone, Debug)]
struct Mat {
    data: Vec<bf16>,
    rows: usize,
    cols: usize,
    stride: usize,
}

impl Mat {
    fn filled(rows: usize, cols: usize, bits: u16) -> Self {
        Mat {
            data: vec![bf16::from_bits(bits); rows * cols],
            rows,
            cols,
            stride: cols,
        }
    }
}

/// One call's arguments, valid unless a test breaks one of them.
#[derive(Clone, Debug)]
struct Setup {
    x: Mat,
    residual: Option<Mat>,
    w: Vec<bf16>,
    q: Vec<u8>,
    layout: ScaleLayout,
    rm: Vec<u8>,
    sw: Vec<u8>,
    y_out: Option<Mat>,
    gs: Option<Vec<f32>>,
    opts: Options,
}

impl Setup {
    /// Valid buffers for `m × h`, sized from the SPEC.md formulas (not from `Problem`).
    /// Inputs hold ordinary values; outputs hold sentinels that no correct call leaves.
    fn valid(m: usize, h: usize, format: Fp4Format, layout: ScaleLayout) -> Self {
        let b = format.block_size();
        let nb = h / b;
        let mut x = Mat::filled(m, h, 0x3FC0); // 1.5
        for (i, v) in x.data.iter_mut().enumerate() {
            *v = bf16::from_f32((i % 13) as f32 - 6.0);
        }
        Setup {
            x,
            residual: Some(Mat::filled(m, h, 0x3F00)), // 0.5
            w: vec![bf16::from_bits(0x3F80); h],       // 1.0
            q: vec![0xA5; m * h / 2],
            layout,
            rm: if layout.has_row_major() {
                vec![0xA5; m * nb]
            } else {
                vec![]
            },
            sw: if layout.has_swizzled() {
                vec![0xA5; common::spec_swizzled_len(m, nb)]
            } else {
                vec![]
            },
            y_out: Some(Mat::filled(m, h, 0x5555)),
            gs: None,
            opts: Options::default().with_format(format),
        }
    }

    fn nvfp4() -> Self {
        Self::valid(3, 64, Fp4Format::NVFP4, ScaleLayout::Both)
    }

    fn call(&mut self, path: Path) -> Result<(), Error> {
        let Setup {
            x,
            residual,
            w,
            q,
            layout,
            rm,
            sw,
            y_out,
            gs,
            opts,
        } = self;
        let scales = match layout {
            ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
            ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
            ScaleLayout::Both => ScaleOut::Both {
                row_major: &mut rm[..],
                swizzled: &mut sw[..],
            },
        };
        let y_out = match y_out {
            Some(y) => {
                Some(MatMut::with_stride(&mut y.data, y.rows, y.cols, y.stride).expect("test view"))
            }
            None => None,
        };
        let out = Fp4Out {
            y_fp4: &mut q[..],
            scales,
            y_out,
        };
        let gs = match gs {
            Some(g) => GlobalScale::PerRow(g),
            None => GlobalScale::Uniform(1.0),
        };
        let xv = MatRef::with_stride(&x.data, x.rows, x.cols, x.stride).expect("test view");
        match residual {
            Some(r) => {
                let rv =
                    MatMut::with_stride(&mut r.data, r.rows, r.cols, r.stride).expect("test view");
                match path {
                    Path::Reference => reference::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                    Path::Cpu => cpu::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                    Path::Root => fp4norm::add_rmsnorm_fp4quant(xv, rv, w, out, gs, opts),
                }
            }
            None => match path {
                Path::Reference => reference::rmsnorm_fp4quant(xv, w, out, gs, opts),
                Path::Cpu => cpu::rmsnorm_fp4quant(xv, w, out, gs, opts),
                Path::Root => fp4norm::rmsnorm_fp4quant(xv, w, out, gs, opts),
            },
        }
    }

    /// Every byte a call could write (and the inputs too), for before/after comparison.
    fn snapshot(&self) -> Vec<u8> {
        let mut s = Vec::new();
        let mut mat = |m: &Option<Mat>| {
            if let Some(m) = m {
                s.extend(m.data.iter().flat_map(|v| v.to_bits().to_le_bytes()));
            }
        };
        mat(&Some(self.x.clone()));
        mat(&self.residual);
        mat(&self.y_out);
        s.extend(self.w.iter().flat_map(|v| v.to_bits().to_le_bytes()));
        s.extend(&self.q);
        s.extend(&self.rm);
        s.extend(&self.sw);
        s
    }

    /// The call fails on every path with an error `pred` accepts, and writes nothing.
    /// Returns the error (of the last path) for further checks.
    fn expect_err(&self, what: &str, pred: impl Fn(&Error) -> bool) -> Error {
        let before = self.snapshot();
        let mut last = None;
        for path in PATHS {
            let mut s = self.clone();
            match s.call(path) {
                Ok(()) => panic!("{what} [{path:?}]: call succeeded, expected an error"),
                Err(e) => {
                    assert!(pred(&e), "{what} [{path:?}]: wrong error {e:?}");
                    assert!(
                        s.snapshot() == before,
                        "{what} [{path:?}]: the failed call wrote to a buffer"
                    );
                    assert_display(&e);
                    last = Some(e);
                }
            }
        }
        last.unwrap()
    }

    /// Sanity: the unbroken setup succeeds on every path.
    fn expect_ok(&self) {
        for path in PATHS {
            self.clone()
                .call(path)
                .unwrap_or_else(|e| panic!("valid setup failed [{path:?}]: {e}"));
        }
    }
}

/// Every message is non-empty.
fn assert_display(e: &Error) {
    let s = e.to_string();
    assert!(!s.trim().is_empty(), "{e:?} has an empty message");
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
    Setup::nvfp4().expect_ok();
    for layout in [
        ScaleLayout::RowMajor,
        ScaleLayout::Swizzled,
        ScaleLayout::Both,
    ] {
        for format in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
            Setup::valid(130, 96, format, layout).expect_ok();
            let mut s = Setup::valid(5, 96, format, layout);
            s.residual = None;
            s.y_out = None;
            s.expect_ok();
        }
    }
}

#[test]
fn hidden_size_zero() {
    for (format, block) in [(Fp4Format::NVFP4, 16), (Fp4Format::MXFP4, 32)] {
        let s = Setup::valid(3, 0, format, ScaleLayout::Both);
        let e = s.expect_err(
            "H = 0",
            |e| matches!(e, Error::ZeroHidden { block: b } if *b == block),
        );
        assert_mentions(&e, &["H", &block.to_string()]);
    }
}

#[test]
fn hidden_size_not_a_multiple_of_the_block() {
    for (format, h) in [
        (Fp4Format::NVFP4, 24usize),
        (Fp4Format::NVFP4, 8),
        (Fp4Format::MXFP4, 48),
        (Fp4Format::MXFP4, 16),
    ] {
        let b = format.block_size();
        // Buffers sized as if the division were exact (rounded down); the H check comes first.
        let mut s = Setup::valid(3, h, Fp4Format::NVFP4, ScaleLayout::Both);
        s.opts = s.opts.with_format(format);
        s.rm = vec![0xA5; 3 * (h / b)];
        let e = s.expect_err("H % B != 0", |e| matches!(e, Error::HiddenNotMultipleOfBlock { h: hh, block } if *hh == h && *block == b));
        assert_mentions(&e, &[&h.to_string(), &b.to_string()]);
    }
}

#[test]
fn residual_shape_mismatch() {
    let base = Setup::nvfp4();
    for (rows, cols) in [(4usize, 64usize), (2, 64), (3, 48), (3, 80), (0, 64)] {
        let mut s = base.clone();
        s.residual = Some(Mat::filled(rows, cols, 0x3F00));
        let e = s.expect_err("residual shape", |e| {
            matches!(e, Error::ShapeMismatch { name: "residual", rows: 3, cols: 64, got_rows, got_cols }
                if *got_rows == rows && *got_cols == cols)
        });
        assert_mentions(&e, &["residual", &format!("[{rows}, {cols}]"), "[3, 64]"]);
    }
}

#[test]
fn weight_length_mismatch() {
    for len in [63usize, 65, 0, 128] {
        let mut s = Setup::nvfp4();
        s.w = vec![bf16::ONE; len];
        let e = s.expect_err(
            "weight length",
            |e| matches!(e, Error::WeightLength { expected: 64, got } if *got == len),
        );
        assert_mentions(&e, &["weight", &len.to_string(), "64"]);
        // Same rule without a residual, and with M = 0.
        s.residual = None;
        s.expect_err("weight length, no residual", |e| {
            matches!(e, Error::WeightLength { .. })
        });
        let mut s = Setup::valid(0, 64, Fp4Format::NVFP4, ScaleLayout::Both);
        s.w = vec![bf16::ONE; len];
        s.expect_err("weight length, M = 0", |e| {
            matches!(e, Error::WeightLength { .. })
        });
    }
}

#[test]
fn y_fp4_wrong_size() {
    // M·H/2 = 96.
    for len in [95usize, 97, 0, 192] {
        let mut s = Setup::nvfp4();
        s.q = vec![0xA5; len];
        let e = s.expect_err("y_fp4 size", |e| {
            matches!(e, Error::OutputSize { name: "y_fp4", expected: 96, got, .. } if *got == len)
        });
        assert_mentions(&e, &["y_fp4", "96", &len.to_string()]);
        s.residual = None;
        s.expect_err("y_fp4 size, no residual", |e| {
            matches!(e, Error::OutputSize { name: "y_fp4", .. })
        });
    }
}

#[test]
fn row_major_scales_wrong_size() {
    // NVFP4, M = 3, H = 64: M·H/B = 12.
    for layout in [ScaleLayout::RowMajor, ScaleLayout::Both] {
        for len in [11usize, 13, 0, 6] {
            let mut s = Setup::valid(3, 64, Fp4Format::NVFP4, layout);
            s.rm = vec![0xA5; len];
            // With both layouts the row-major buffer is FlashInfer's block_scale_unswizzled.
            let name = match layout {
                ScaleLayout::Both => "block_scale_unswizzled (row-major)",
                _ => "block_scale (row-major)",
            };
            let e = s.expect_err("row-major size", |e| {
                matches!(e, Error::OutputSize { name: n, expected: 12, got, .. } if *n == name && *got == len)
            });
            assert_mentions(&e, &["row-major", "12"]);
        }
    }
    // MXFP4: M·H/B = 6.
    let mut s = Setup::valid(3, 64, Fp4Format::MXFP4, ScaleLayout::RowMajor);
    s.rm = vec![0xA5; 12];
    s.expect_err("row-major size mxfp4", |e| {
        matches!(
            e,
            Error::OutputSize {
                expected: 6,
                got: 12,
                ..
            }
        )
    });
}

#[test]
fn swizzled_scales_wrong_size() {
    // M = 3, H = 64 NVFP4 → 4 blocks: Mp = 128, nK = 1 → 512 bytes. The unpadded size
    // M·H/B = 12 (a likely mistake) is rejected, and so is one byte more or less.
    for layout in [ScaleLayout::Swizzled, ScaleLayout::Both] {
        for len in [12usize, 511, 513, 0, 1024] {
            let mut s = Setup::valid(3, 64, Fp4Format::NVFP4, layout);
            s.sw = vec![0xA5; len];
            let e = s.expect_err("swizzled size", |e| {
                matches!(e, Error::OutputSize { name: "block_scale (swizzled)", expected: 512, got, .. } if *got == len)
            });
            assert_mentions(&e, &["swizzled", "512"]);
        }
    }
    // M = 130, H = 80 → 5 blocks: Mp = 256, nK = 2 → 2048 bytes.
    let mut s = Setup::valid(130, 80, Fp4Format::NVFP4, ScaleLayout::Swizzled);
    assert_eq!(s.sw.len(), 2048);
    s.sw = vec![0xA5; 130 * 5];
    s.expect_err("swizzled size 130x5", |e| {
        matches!(
            e,
            Error::OutputSize {
                expected: 2048,
                got: 650,
                ..
            }
        )
    });
}

#[test]
fn y_out_shape_mismatch() {
    for (rows, cols) in [(2usize, 64usize), (4, 64), (3, 32), (0, 0)] {
        let mut s = Setup::nvfp4();
        s.y_out = Some(Mat::filled(rows, cols, 0x5555));
        let e = s.expect_err("y_out shape", |e| {
            matches!(e, Error::ShapeMismatch { name: "y_out", rows: 3, cols: 64, got_rows, got_cols }
                if *got_rows == rows && *got_cols == cols)
        });
        assert_mentions(&e, &["y_out"]);
    }
}

#[test]
fn per_row_global_scale_wrong_length() {
    for len in [2usize, 4, 0, 1] {
        let mut s = Setup::nvfp4();
        s.gs = Some(vec![1.0; len]);
        let e = s.expect_err(
            "gs length",
            |e| matches!(e, Error::GlobalScaleLength { expected: 3, got } if *got == len),
        );
        assert_mentions(&e, &["global_scale", "M = 3", &len.to_string()]);
    }
    // The right length passes; UE8M0 (which ignores gs) still checks the length.
    let mut s = Setup::nvfp4();
    s.gs = Some(vec![1.0; 3]);
    s.expect_ok();
    let mut s = Setup::valid(3, 64, Fp4Format::MXFP4, ScaleLayout::RowMajor);
    s.gs = Some(vec![1.0; 2]);
    s.expect_err("gs length mxfp4", |e| {
        matches!(
            e,
            Error::GlobalScaleLength {
                expected: 3,
                got: 2
            }
        )
    });
}

#[test]
fn eps_negative_nan_or_infinite() {
    for eps in [
        -1e-6f32,
        -1.0,
        -f32::MIN_POSITIVE,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        let mut s = Setup::nvfp4();
        s.opts = s.opts.with_eps(eps);
        let e = s.expect_err(
            "eps",
            |e| matches!(e, Error::InvalidEps(v) if v.to_bits() == eps.to_bits()),
        );
        assert_mentions(&e, &["eps"]);
        let r = Problem::new(3, 64, DType::BF16, ScaleLayout::RowMajor, &s.opts);
        assert!(matches!(r, Err(Error::InvalidEps(_))));
    }
    // The boundary values are accepted.
    for eps in [0.0f32, f32::from_bits(1), f32::MAX] {
        let mut s = Setup::nvfp4();
        s.opts = s.opts.with_eps(eps);
        s.expect_ok();
    }
}

#[test]
fn stride_smaller_than_h() {
    let mut data = vec![bf16::ONE; 256];
    let e = MatRef::with_stride(&data, 2, 64, 63).unwrap_err();
    assert!(
        matches!(
            e,
            Error::StrideTooSmall {
                stride: 63,
                cols: 64,
                ..
            }
        ),
        "{e:?}"
    );
    assert_mentions(&e, &["stride", "63", "64"]);
    let e = MatMut::with_stride(&mut data, 3, 64, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::StrideTooSmall {
                stride: 0,
                cols: 64,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(data.iter().all(|v| *v == bf16::ONE));
    // A stride ≥ H is fine, and so is any stride for a single row.
    assert!(MatRef::with_stride(&data, 2, 64, 64).is_ok());
    assert!(MatRef::with_stride(&data, 1, 64, 0).is_ok());
}

#[test]
fn view_out_of_bounds() {
    let mut data = vec![bf16::ONE; 3 * 80 - 17]; // rows 3, cols 64, stride 80 need 2·80 + 64 = 224
    assert_eq!(data.len(), 223);
    let e = MatRef::with_stride(&data, 3, 64, 80).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ViewOutOfBounds {
                rows: 3,
                cols: 64,
                stride: 80,
                needed: 224,
                len: 223,
                ..
            }
        ),
        "{e:?}"
    );
    assert_mentions(&e, &["224", "223"]);
    let e = MatMut::with_stride(&mut data, 3, 64, 80).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ViewOutOfBounds {
                needed: 224,
                len: 223,
                ..
            }
        ),
        "{e:?}"
    );
    let e = MatRef::new(&data[..191], 3, 64).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ViewOutOfBounds {
                needed: 192,
                len: 191,
                ..
            }
        ),
        "{e:?}"
    );
    let e = MatMut::new(&mut data[..191], 3, 64).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ViewOutOfBounds {
                needed: 192,
                len: 191,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(data.iter().all(|v| *v == bf16::ONE));
    assert!(MatRef::with_stride(&data[..224 - 1], 3, 64, 80).is_err());
    let full = vec![bf16::ONE; 224];
    assert!(MatRef::with_stride(&full, 3, 64, 80).is_ok());
}

#[test]
fn unknown_names_from_str() {
    let e = "diagonal".parse::<ScaleLayout>().unwrap_err();
    assert!(
        matches!(&e, Error::UnknownLayout(s) if s == "diagonal"),
        "{e:?}"
    );
    assert_mentions(&e, &["diagonal", "row-major", "swizzled", "both"]);

    let e = "e5m2".parse::<ScaleFormat>().unwrap_err();
    assert!(
        matches!(&e, Error::UnknownScaleFormat(s) if s == "e5m2"),
        "{e:?}"
    );
    assert_mentions(&e, &["e5m2", "e4m3", "ue8m0"]);

    let e = "fp32".parse::<DType>().unwrap_err();
    assert!(
        matches!(&e, Error::UnsupportedDType(s) if s == "fp32"),
        "{e:?}"
    );
    assert_mentions(&e, &["fp32", "bf16", "f16"]);

    for bad in ["nvfp8", "", "b16", "x16-e4m3", "b-e4m3", "bxx-e4m3"] {
        let e = bad.parse::<Fp4Format>().unwrap_err();
        assert!(
            matches!(&e, Error::UnknownFormat(s) if s == bad),
            "{bad:?}: {e:?}"
        );
        assert_mentions(&e, &["nvfp4", "mxfp4"]);
    }
    // A well-formed pairing with a bad part reports that part.
    let e = "b8-e4m3".parse::<Fp4Format>().unwrap_err();
    assert!(matches!(e, Error::InvalidBlockSize(8)), "{e:?}");
    let e = "b16-e5m2".parse::<Fp4Format>().unwrap_err();
    assert!(
        matches!(&e, Error::UnknownScaleFormat(s) if s == "e5m2"),
        "{e:?}"
    );

    // The accepted names parse.
    assert_eq!(
        "row-major".parse::<ScaleLayout>().unwrap(),
        ScaleLayout::RowMajor
    );
    assert_eq!(
        "SWIZZLED".parse::<ScaleLayout>().unwrap(),
        ScaleLayout::Swizzled
    );
    assert_eq!("both".parse::<ScaleLayout>().unwrap(), ScaleLayout::Both);
    assert_eq!("nvfp4".parse::<Fp4Format>().unwrap(), Fp4Format::NVFP4);
    assert_eq!("MXFP4".parse::<Fp4Format>().unwrap(), Fp4Format::MXFP4);
    assert_eq!(
        "b32-e4m3".parse::<Fp4Format>().unwrap(),
        Fp4Format::new(BlockSize::B32, ScaleFormat::E4M3)
    );
    assert_eq!(
        "b16-ue8m0".parse::<Fp4Format>().unwrap(),
        Fp4Format::new(BlockSize::B16, ScaleFormat::UE8M0)
    );
    assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
    assert_eq!("f16".parse::<DType>().unwrap(), DType::F16);
    // Names round-trip through Display.
    for f in [
        Fp4Format::NVFP4,
        Fp4Format::MXFP4,
        Fp4Format::new(BlockSize::B16, ScaleFormat::UE8M0),
        Fp4Format::new(BlockSize::B32, ScaleFormat::E4M3),
    ] {
        assert_eq!(f.to_string().parse::<Fp4Format>().unwrap(), f);
    }
    for l in [
        ScaleLayout::RowMajor,
        ScaleLayout::Swizzled,
        ScaleLayout::Both,
    ] {
        assert_eq!(l.to_string().parse::<ScaleLayout>().unwrap(), l);
    }
}

#[test]
fn block_size_other_than_16_or_32() {
    for b in [8usize, 0, 1, 17, 31, 64, usize::MAX] {
        let e = BlockSize::try_from(b).unwrap_err();
        assert!(matches!(e, Error::InvalidBlockSize(v) if v == b), "{e:?}");
        assert_mentions(&e, &[&b.to_string(), "16", "32"]);
    }
    assert_eq!(BlockSize::try_from(16).unwrap(), BlockSize::B16);
    assert_eq!(BlockSize::try_from(32).unwrap(), BlockSize::B32);
}

#[test]
fn size_overflow() {
    let o = Options::nvfp4();
    for (m, h) in [
        (usize::MAX, 16usize),
        (1usize << 60, 16),
        (1usize << 58, 16),
        (16, 1usize << 62),
    ] {
        let e = Problem::new(m, h, DType::BF16, ScaleLayout::Swizzled, &o).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow), "M = {m}, H = {h}: {e:?}");
        assert_mentions(&e, &["M", "H"]);
    }
    assert!(matches!(
        row_major_len(usize::MAX, 2),
        Err(Error::SizeOverflow)
    ));
    assert!(matches!(
        swizzled_len(usize::MAX, 1),
        Err(Error::SizeOverflow)
    ));
    assert!(matches!(
        swizzled_len(usize::MAX / 4, 8),
        Err(Error::SizeOverflow)
    ));
    // A view whose extent overflows.
    let data = vec![bf16::ONE; 64];
    assert!(matches!(
        MatRef::with_stride(&data, 3, 16, usize::MAX),
        Err(Error::SizeOverflow)
    ));
    // dequantize checks sizes before touching its output.
    let mut out = vec![7.0f32; 16];
    let e = dequantize(
        usize::MAX,
        16,
        Fp4Format::NVFP4,
        &[0; 8],
        ScaleIn::RowMajor(&[0]),
        GlobalScale::Uniform(1.0),
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, Error::SizeOverflow), "{e:?}");
    assert!(out.iter().all(|&v| v == 7.0));
    // SPEC.md §5: sizes are 64-bit, M·H ≥ 2^31 is fine (no buffers needed to check the sizes).
    let p = Problem::new(1 << 20, 1 << 12, DType::BF16, ScaleLayout::Both, &o).unwrap();
    assert_eq!(p.fp4_len(), 1 << 31);
    assert_eq!(p.row_major_scales_len(), 1 << 28);
    assert_eq!(p.swizzled_scales_len(), 1 << 28);
    let p = Problem::new((1 << 31) + 1, 16, DType::BF16, ScaleLayout::Swizzled, &o).unwrap();
    assert_eq!(p.swizzled_scales_len(), ((1usize << 31) + 128) * 4);
}

/// `dequantize` checks y_fp4, the scale buffer, `out` and the per-row global scale before
/// writing `out`.
#[test]
fn dequantize_errors_write_nothing() {
    let (m, h) = (3usize, 64usize);
    let f = Fp4Format::NVFP4;
    let q = vec![0x22u8; m * h / 2];
    let rm = vec![0x38u8; m * h / 16];
    let sw = vec![0x38u8; 512];
    type Case<'a> = (
        &'a str,
        usize,
        usize,
        &'a [u8],
        ScaleIn<'a>,
        usize,
        GlobalScale<'a>,
        fn(&Error) -> bool,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "H = 0",
            m,
            0,
            &q[..0],
            ScaleIn::RowMajor(&rm[..0]),
            0,
            GlobalScale::Uniform(1.0),
            |e| matches!(e, Error::ZeroHidden { block: 16 }),
        ),
        (
            "H = 24",
            m,
            24,
            &q[..36],
            ScaleIn::RowMajor(&rm[..3]),
            m * 24,
            GlobalScale::Uniform(1.0),
            |e| matches!(e, Error::HiddenNotMultipleOfBlock { h: 24, block: 16 }),
        ),
        (
            "y_fp4",
            m,
            h,
            &q[..95],
            ScaleIn::RowMajor(&rm),
            m * h,
            GlobalScale::Uniform(1.0),
            |e| {
                matches!(
                    e,
                    Error::OutputSize {
                        name: "y_fp4",
                        expected: 96,
                        got: 95,
                        ..
                    }
                )
            },
        ),
        (
            "row-major",
            m,
            h,
            &q,
            ScaleIn::RowMajor(&rm[..11]),
            m * h,
            GlobalScale::Uniform(1.0),
            |e| {
                matches!(
                    e,
                    Error::OutputSize {
                        name: "block_scale (row-major)",
                        expected: 12,
                        got: 11,
                        ..
                    }
                )
            },
        ),
        (
            "swizzled",
            m,
            h,
            &q,
            ScaleIn::Swizzled(&rm),
            m * h,
            GlobalScale::Uniform(1.0),
            |e| {
                matches!(
                    e,
                    Error::OutputSize {
                        name: "block_scale (swizzled)",
                        expected: 512,
                        got: 12,
                        ..
                    }
                )
            },
        ),
        (
            "out",
            m,
            h,
            &q,
            ScaleIn::Swizzled(&sw),
            m * h - 1,
            GlobalScale::Uniform(1.0),
            |e| {
                matches!(
                    e,
                    Error::OutputSize {
                        name: "out",
                        expected: 192,
                        got: 191,
                        ..
                    }
                )
            },
        ),
        (
            "gs",
            m,
            h,
            &q,
            ScaleIn::RowMajor(&rm),
            m * h,
            GlobalScale::PerRow(&[1.0, 1.0]),
            |e| {
                matches!(
                    e,
                    Error::GlobalScaleLength {
                        expected: 3,
                        got: 2
                    }
                )
            },
        ),
    ];
    for (what, m, h, q, s, out_len, gs, pred) in cases {
        let mut out = vec![-3.25f32; out_len];
        let e = dequantize(m, h, f, q, s, gs, &mut out).unwrap_err();
        assert!(pred(&e), "{what}: {e:?}");
        assert_display(&e);
        assert!(out.iter().all(|&v| v == -3.25), "{what}: out was written");
    }
}

/// One instance of every variant the host API produces, with the words a user needs.
#[test]
fn display_messages_name_the_thing_to_change() {
    let mut s = Setup::nvfp4();
    s.w.pop();
    let weight = s.clone().call(Path::Cpu).unwrap_err();
    let mut s = Setup::nvfp4();
    s.q.pop();
    let y_fp4 = s.clone().call(Path::Cpu).unwrap_err();
    let data = vec![bf16::ONE; 8];
    let cases: Vec<(Error, &[&str])> = vec![
        (
            Problem::new(1, 0, DType::BF16, ScaleLayout::RowMajor, &Options::nvfp4()).unwrap_err(),
            &["H", "16"],
        ),
        (
            Problem::new(1, 40, DType::BF16, ScaleLayout::RowMajor, &Options::nvfp4()).unwrap_err(),
            &["H = 40", "16"],
        ),
        (BlockSize::try_from(8).unwrap_err(), &["8", "16", "32"]),
        ("x".parse::<ScaleFormat>().unwrap_err(), &["e4m3", "ue8m0"]),
        ("x".parse::<ScaleLayout>().unwrap_err(), &["row-major"]),
        ("x".parse::<DType>().unwrap_err(), &["bf16"]),
        ("x".parse::<Fp4Format>().unwrap_err(), &["nvfp4"]),
        (weight, &["weight", "63", "64"]),
        (y_fp4, &["y_fp4", "95", "96"]),
        (
            MatRef::with_stride(&data, 2, 4, 3).unwrap_err(),
            &["stride", "3", "4"],
        ),
        (MatRef::new(&data, 3, 4).unwrap_err(), &["12", "8"]),
        (
            Problem::new(
                1,
                16,
                DType::BF16,
                ScaleLayout::RowMajor,
                &Options::nvfp4().with_eps(-1.0),
            )
            .unwrap_err(),
            &["eps"],
        ),
        (
            Problem::new(
                usize::MAX,
                16,
                DType::BF16,
                ScaleLayout::RowMajor,
                &Options::nvfp4(),
            )
            .unwrap_err(),
            &["M", "H"],
        ),
    ];
    for (e, words) in cases {
        assert_display(&e);
        assert_mentions(&e, words);
        // Errors are std errors, so `?` into Box<dyn Error> works.
        let _: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    }
}
