//! SPEC.md §5: every violation is an error, returned before anything is written. One
//! function per rule, run by `backend_tests!` on every front a user reaches (the scalar
//! reference, the CPU backend and its root re-exports, the raw host entry of the Python
//! binding and PyTorch operators, the CUDA raw entry); each asserts the exact `Error`
//! variant (with its fields) and that every output buffer and the residual are byte for
//! byte unchanged. Rules only the raw entries can meet (aliasing, null and misaligned
//! pointers, memory of another device) run on those.
//!
//! Not reachable through the host API: dtype mismatch between x, r, w, y_out (one generic
//! `T: Element` for all of them); on the raw entries it is one `dtype` field.

mod backends;
mod common;

use backends::{Backend, Buffers, Gs, Mat};
use fp4norm::layout::{row_major_len, swizzled_len};
use fp4norm::{
    bf16, dequantize, BlockSize, DType, Error, Fp4Format, GlobalScale, MatMut, MatRef, Options,
    Problem, ScaleFormat, ScaleIn, ScaleLayout,
};

/// One call's buffers, valid unless a test breaks one of them.
type Setup = Buffers<bf16>;

/// Valid buffers for `m × h`, sized from the SPEC.md formulas (not from `Problem`).
/// Inputs hold ordinary values; outputs hold sentinels that no correct call leaves.
fn valid(m: usize, h: usize, format: Fp4Format, layout: ScaleLayout) -> Setup {
    let b = format.block_size();
    let nb = h / b;
    let mut x = Mat::filled(m, h, 0x3FC0); // 1.5
    for (i, v) in x.data.iter_mut().enumerate() {
        *v = bf16::from_f32((i % 13) as f32 - 6.0);
    }
    Buffers {
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
        gs: Gs::Uniform(1.0),
        opts: Options::default().with_format(format),
    }
}

fn nvfp4() -> Setup {
    valid(3, 64, Fp4Format::NVFP4, ScaleLayout::Both)
}

/// Every byte a call could write (and the inputs too), for before/after comparison.
fn snapshot(s: &Setup) -> Vec<u8> {
    let mut v = Vec::new();
    let mut mat = |m: Option<&Mat<bf16>>| {
        if let Some(m) = m {
            v.extend(m.data.iter().flat_map(|e| e.to_bits().to_le_bytes()));
        }
    };
    mat(Some(&s.x));
    mat(s.residual.as_ref());
    mat(s.y_out.as_ref());
    v.extend(s.w.iter().flat_map(|e| e.to_bits().to_le_bytes()));
    v.extend(&s.q);
    v.extend(&s.rm);
    v.extend(&s.sw);
    v
}

/// The call fails on `backend` with an error `pred` accepts, and writes nothing. Returns
/// the error for further checks.
fn expect_err(s: &Setup, backend: Backend, what: &str, pred: impl Fn(&Error) -> bool) -> Error {
    expect_err_edited(s, backend, what, |_| {}, pred)
}

/// As [`expect_err`], with the raw entries' [`fp4norm::RawCall`] edited first.
fn expect_err_edited(
    s: &Setup,
    backend: Backend,
    what: &str,
    edit: impl FnOnce(&mut fp4norm::RawCall),
    pred: impl Fn(&Error) -> bool,
) -> Error {
    let before = snapshot(s);
    let mut t = s.clone();
    match t.run_edited(backend, edit) {
        Ok(()) => panic!("{what} [{backend:?}]: call succeeded, expected an error"),
        Err(e) => {
            assert!(pred(&e), "{what} [{backend:?}]: wrong error {e:?}");
            assert!(
                snapshot(&t) == before,
                "{what} [{backend:?}]: the failed call wrote to a buffer"
            );
            assert_display(&e);
            e
        }
    }
}

/// Sanity: the unbroken setup succeeds on `backend`.
fn expect_ok(s: &Setup, backend: Backend) {
    s.clone()
        .run(backend)
        .unwrap_or_else(|e| panic!("valid setup failed [{backend:?}]: {e}"));
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

fn valid_setups_succeed(backend: Backend) {
    expect_ok(&nvfp4(), backend);
    for layout in [
        ScaleLayout::RowMajor,
        ScaleLayout::Swizzled,
        ScaleLayout::Both,
    ] {
        for format in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
            expect_ok(&valid(130, 96, format, layout), backend);
            let mut s = valid(5, 96, format, layout);
            s.residual = None;
            s.y_out = None;
            expect_ok(&s, backend);
        }
    }
}

fn hidden_size_zero(backend: Backend) {
    for (format, block) in [(Fp4Format::NVFP4, 16), (Fp4Format::MXFP4, 32)] {
        let s = valid(3, 0, format, ScaleLayout::Both);
        let e = expect_err(
            &s,
            backend,
            "H = 0",
            |e| matches!(e, Error::ZeroHidden { block: b } if *b == block),
        );
        assert_mentions(&e, &["H", &block.to_string()]);
    }
}

fn hidden_size_not_a_multiple_of_the_block(backend: Backend) {
    for (format, h) in [
        (Fp4Format::NVFP4, 24usize),
        (Fp4Format::NVFP4, 8),
        (Fp4Format::MXFP4, 48),
        (Fp4Format::MXFP4, 16),
    ] {
        let b = format.block_size();
        // Buffers sized as if the division were exact (rounded down); the H check comes first.
        let mut s = valid(3, h, Fp4Format::NVFP4, ScaleLayout::Both);
        s.opts = s.opts.with_format(format);
        s.rm = vec![0xA5; 3 * (h / b)];
        let e = expect_err(
            &s,
            backend,
            "H % B != 0",
            |e| matches!(e, Error::HiddenNotMultipleOfBlock { h: hh, block } if *hh == h && *block == b),
        );
        assert_mentions(&e, &[&h.to_string(), &b.to_string()]);
    }
}

fn residual_shape_mismatch(backend: Backend) {
    let base = nvfp4();
    for (rows, cols) in [(4usize, 64usize), (2, 64), (3, 48), (3, 80), (0, 64)] {
        let mut s = base.clone();
        s.residual = Some(Mat::filled(rows, cols, 0x3F00));
        let e = expect_err(&s, backend, "residual shape", |e| {
            matches!(e, Error::ShapeMismatch { name: "residual", rows: 3, cols: 64, got_rows, got_cols }
                if *got_rows == rows && *got_cols == cols)
        });
        assert_mentions(&e, &["residual", &format!("[{rows}, {cols}]"), "[3, 64]"]);
    }
}

fn weight_length_mismatch(backend: Backend) {
    for len in [63usize, 65, 0, 128] {
        let mut s = nvfp4();
        s.w = vec![bf16::ONE; len];
        let e = expect_err(
            &s,
            backend,
            "weight length",
            |e| matches!(e, Error::WeightLength { expected: 64, got } if *got == len),
        );
        assert_mentions(&e, &["weight", &len.to_string(), "64"]);
        // Same rule without a residual, and with M = 0.
        s.residual = None;
        expect_err(&s, backend, "weight length, no residual", |e| {
            matches!(e, Error::WeightLength { .. })
        });
        let mut s = valid(0, 64, Fp4Format::NVFP4, ScaleLayout::Both);
        s.w = vec![bf16::ONE; len];
        expect_err(&s, backend, "weight length, M = 0", |e| {
            matches!(e, Error::WeightLength { .. })
        });
    }
}

fn y_fp4_wrong_size(backend: Backend) {
    // M·H/2 = 96.
    for len in [95usize, 97, 0, 192] {
        let mut s = nvfp4();
        s.q = vec![0xA5; len];
        let e = expect_err(
            &s,
            backend,
            "y_fp4 size",
            |e| matches!(e, Error::OutputSize { name: "y_fp4", expected: 96, got, .. } if *got == len),
        );
        assert_mentions(&e, &["y_fp4", "96", &len.to_string()]);
        s.residual = None;
        expect_err(&s, backend, "y_fp4 size, no residual", |e| {
            matches!(e, Error::OutputSize { name: "y_fp4", .. })
        });
    }
}

fn row_major_scales_wrong_size(backend: Backend) {
    // NVFP4, M = 3, H = 64: M·H/B = 12.
    for layout in [ScaleLayout::RowMajor, ScaleLayout::Both] {
        for len in [11usize, 13, 0, 6] {
            let mut s = valid(3, 64, Fp4Format::NVFP4, layout);
            s.rm = vec![0xA5; len];
            // With both layouts the row-major buffer is FlashInfer's block_scale_unswizzled.
            let name = match layout {
                ScaleLayout::Both => "block_scale_unswizzled (row-major)",
                _ => "block_scale (row-major)",
            };
            let e = expect_err(
                &s,
                backend,
                "row-major size",
                |e| matches!(e, Error::OutputSize { name: n, expected: 12, got, .. } if *n == name && *got == len),
            );
            assert_mentions(&e, &["row-major", "12"]);
        }
    }
    // MXFP4: M·H/B = 6.
    let mut s = valid(3, 64, Fp4Format::MXFP4, ScaleLayout::RowMajor);
    s.rm = vec![0xA5; 12];
    expect_err(&s, backend, "row-major size mxfp4", |e| {
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

fn swizzled_scales_wrong_size(backend: Backend) {
    // M = 3, H = 64 NVFP4 → 4 blocks: Mp = 128, nK = 1 → 512 bytes. The unpadded size
    // M·H/B = 12 (a likely mistake) is rejected, and so is one byte more or less.
    for layout in [ScaleLayout::Swizzled, ScaleLayout::Both] {
        for len in [12usize, 511, 513, 0, 1024] {
            let mut s = valid(3, 64, Fp4Format::NVFP4, layout);
            s.sw = vec![0xA5; len];
            let e = expect_err(
                &s,
                backend,
                "swizzled size",
                |e| matches!(e, Error::OutputSize { name: "block_scale (swizzled)", expected: 512, got, .. } if *got == len),
            );
            assert_mentions(&e, &["swizzled", "512"]);
        }
    }
    // M = 130, H = 80 → 5 blocks: Mp = 256, nK = 2 → 2048 bytes.
    let mut s = valid(130, 80, Fp4Format::NVFP4, ScaleLayout::Swizzled);
    assert_eq!(s.sw.len(), 2048);
    s.sw = vec![0xA5; 130 * 5];
    expect_err(&s, backend, "swizzled size 130x5", |e| {
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

fn y_out_shape_mismatch(backend: Backend) {
    for (rows, cols) in [(2usize, 64usize), (4, 64), (3, 32), (0, 0)] {
        let mut s = nvfp4();
        s.y_out = Some(Mat::filled(rows, cols, 0x5555));
        let e = expect_err(&s, backend, "y_out shape", |e| {
            matches!(e, Error::ShapeMismatch { name: "y_out", rows: 3, cols: 64, got_rows, got_cols }
                if *got_rows == rows && *got_cols == cols)
        });
        assert_mentions(&e, &["y_out"]);
    }
}

fn per_row_global_scale_wrong_length(backend: Backend) {
    for len in [2usize, 4, 0, 1] {
        let mut s = nvfp4();
        s.gs = Gs::PerRow(vec![1.0; len]);
        let e = expect_err(
            &s,
            backend,
            "gs length",
            |e| matches!(e, Error::GlobalScaleLength { expected: 3, got } if *got == len),
        );
        assert_mentions(&e, &["global_scale", "M = 3", &len.to_string()]);
    }
    // The right length passes; UE8M0 (which ignores gs) still checks the length.
    let mut s = nvfp4();
    s.gs = Gs::PerRow(vec![1.0; 3]);
    expect_ok(&s, backend);
    let mut s = valid(3, 64, Fp4Format::MXFP4, ScaleLayout::RowMajor);
    s.gs = Gs::PerRow(vec![1.0; 2]);
    expect_err(&s, backend, "gs length mxfp4", |e| {
        matches!(
            e,
            Error::GlobalScaleLength {
                expected: 3,
                got: 2
            }
        )
    });
}

fn eps_negative_nan_or_infinite(backend: Backend) {
    for eps in [
        -1e-6f32,
        -1.0,
        -f32::MIN_POSITIVE,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        let mut s = nvfp4();
        s.opts = s.opts.with_eps(eps);
        let e = expect_err(
            &s,
            backend,
            "eps",
            |e| matches!(e, Error::InvalidEps(v) if v.to_bits() == eps.to_bits()),
        );
        assert_mentions(&e, &["eps"]);
        let r = Problem::new(3, 64, DType::BF16, ScaleLayout::RowMajor, &s.opts);
        assert!(matches!(r, Err(Error::InvalidEps(_))));
    }
    // The boundary values are accepted.
    for eps in [0.0f32, f32::from_bits(1), f32::MAX] {
        let mut s = nvfp4();
        s.opts = s.opts.with_eps(eps);
        expect_ok(&s, backend);
    }
}

fn weight_bias_nan_or_infinite(backend: Backend) {
    for bias in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut s = nvfp4();
        s.opts = s.opts.with_weight_bias(bias);
        let e = expect_err(
            &s,
            backend,
            "weight bias",
            |e| matches!(e, Error::InvalidWeightBias(v) if v.to_bits() == bias.to_bits()),
        );
        assert_mentions(&e, &["weight"]);
    }
    // Every finite bias is accepted, ±0 and the extremes included.
    for bias in [0.0f32, -0.0, 1.0, -f32::MAX, f32::from_bits(1)] {
        let mut s = nvfp4();
        s.opts = s.opts.with_weight_bias(bias);
        expect_ok(&s, backend);
    }
}

fn strided_views_that_do_not_fit(backend: Backend) {
    // A row stride shorter than H.
    let mut s = nvfp4();
    s.x.stride = 63;
    expect_err(&s, backend, "stride < H", |e| {
        matches!(
            e,
            Error::StrideTooSmall {
                stride: 63,
                cols: 64,
                ..
            }
        )
    });
    // Rows of the residual, 80 apart, running past the end of its buffer (needs 224).
    let mut s = nvfp4();
    let r = s.residual.as_mut().unwrap();
    r.stride = 80;
    r.data = vec![bf16::from_bits(0x3F00); 223];
    expect_err(&s, backend, "view out of bounds", |e| {
        matches!(
            e,
            Error::ViewOutOfBounds {
                needed: 224,
                len: 223,
                ..
            }
        )
    });
    // The same view with room for it is fine, and so are strided y_out rows.
    let mut s = nvfp4();
    let r = s.residual.as_mut().unwrap();
    r.stride = 80;
    r.data = vec![bf16::from_bits(0x3F00); 224];
    let y = s.y_out.as_mut().unwrap();
    y.stride = 70;
    y.data = vec![bf16::from_bits(0x5555); 2 * 70 + 64];
    expect_ok(&s, backend);
}

backend_tests!(
    valid_setups_succeed,
    hidden_size_zero,
    hidden_size_not_a_multiple_of_the_block,
    residual_shape_mismatch,
    weight_length_mismatch,
    y_fp4_wrong_size,
    row_major_scales_wrong_size,
    swizzled_scales_wrong_size,
    y_out_shape_mismatch,
    per_row_global_scale_wrong_length,
    eps_negative_nan_or_infinite,
    weight_bias_nan_or_infinite,
    strided_views_that_do_not_fit,
);

/// Outputs may not overlap inputs or each other (SPEC.md §5): each pair the raw entries can
/// be given, by pointing one buffer at another.
fn aliased_buffers_are_refused(backend: Backend) {
    let s = nvfp4();
    type Edit = fn(&mut fp4norm::RawCall);
    let cases: [(&str, &str, Edit); 6] = [
        ("input", "residual", |c| {
            c.residual.as_mut().unwrap().ptr = c.x.ptr
        }),
        ("residual", "y_out", |c| {
            c.y_out.as_mut().unwrap().ptr = c.residual.unwrap().ptr
        }),
        ("input", "y_out", |c| {
            c.y_out.as_mut().unwrap().ptr = c.x.ptr + 2
        }),
        ("weight", "y_fp4", |c| c.y_fp4.ptr = c.weight.ptr),
        ("y_fp4", "block_scale", |c| {
            if let fp4norm::ScaleOut::Both { row_major, .. } = &mut c.scales {
                row_major.ptr = c.y_fp4.ptr + 90; // the last 6 of y_fp4's 96 bytes
            }
        }),
        ("block_scale", "block_scale", |c| {
            if let fp4norm::ScaleOut::Both {
                row_major,
                swizzled,
            } = &mut c.scales
            {
                swizzled.ptr = row_major.ptr;
            }
        }),
    ];
    for (a, b, edit) in cases {
        let e = expect_err_edited(&s, backend, &format!("{a} / {b} alias"), edit, |e| {
            matches!(e, Error::Overlap { .. })
        });
        assert_mentions(&e, &[a, b, "overlap"]);
    }
    // Read-only inputs may overlap each other: x and weight from one buffer is fine.
    let mut t = s.clone();
    t.run_edited(backend, |c| c.weight.ptr = c.x.ptr)
        .unwrap_or_else(|e| panic!("[{backend:?}] read-only inputs overlapping: {e}"));
}

fn null_and_misaligned_pointers_are_refused(backend: Backend) {
    let s = nvfp4();
    expect_err_edited(
        &s,
        backend,
        "null weight",
        |c| c.weight.ptr = 0,
        |e| matches!(e, Error::NullPointer { name: "weight" }),
    );
    expect_err_edited(
        &s,
        backend,
        "null y_fp4",
        |c| c.y_fp4.ptr = 0,
        |e| matches!(e, Error::NullPointer { name: "y_fp4" }),
    );
    // bf16 rows at an odd address (the buffer is long enough for the shifted view).
    let mut t = s.clone();
    t.x.data.push(bf16::ONE);
    expect_err_edited(
        &t,
        backend,
        "odd input address",
        |c| c.x.ptr += 1,
        |e| {
            matches!(
                e,
                Error::Misaligned {
                    name: "input",
                    required: 2,
                    ..
                }
            )
        },
    );
    // A buffer ending past the 64-bit address space is named as such, not as a size error.
    expect_err_edited(
        &s,
        backend,
        "y_fp4 at the top of the address space",
        |c| c.y_fp4.ptr = u64::MAX - 15,
        |e| matches!(e, Error::AddressOverflow { name: "y_fp4", .. }),
    );
    let mut t = s.clone();
    t.gs = Gs::PerRow(vec![1.0; 4]);
    expect_err_edited(
        &t,
        backend,
        "global scale not 4-byte aligned",
        |c| {
            if let fp4norm::RawGlobalScale::PerRow(b) = &mut c.global_scale {
                b.ptr += 2;
                b.len = Some(3);
            }
        },
        |e| {
            matches!(
                e,
                Error::Misaligned {
                    name: "global_scale",
                    required: 4,
                    ..
                }
            )
        },
    );
}

backend_tests!(raw: aliased_buffers_are_refused, null_and_misaligned_pointers_are_refused);

/// Host memory given to the CUDA raw entry is refused, naming the buffer.
#[test]
fn cuda_raw_refuses_host_memory() {
    if backends::cuda_missing("cuda_raw_refuses_host_memory") {
        return;
    }
    let s = nvfp4();
    let host = vec![bf16::ONE; 3 * 64];
    let addr = host.as_ptr() as usize as u64;
    let e = expect_err_edited(
        &s,
        Backend::CudaRaw,
        "host weight",
        |c| c.weight.ptr = addr,
        |e| matches!(e, Error::DeviceMismatch { name: "weight", .. }),
    );
    assert_mentions(&e, &["weight", "host"]);
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
    // A problem's fields are public to read; one changed after `Problem::new` makes its
    // lengths saturate (so no buffer matches them) instead of wrapping or panicking.
    let mut p = Problem::new(4, 64, DType::BF16, ScaleLayout::Both, &o).unwrap();
    p.m = usize::MAX;
    assert_eq!(p.fp4_len(), usize::MAX);
    assert_eq!(p.row_major_scales_len(), usize::MAX);
    assert_eq!(p.swizzled_scales_len(), usize::MAX);
    assert_eq!(p.scale_bytes_written(), usize::MAX);
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
                    Error::F32Length {
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
    let mut s = nvfp4();
    s.w.pop();
    let weight = s.clone().run(Backend::Cpu).unwrap_err();
    let mut s = nvfp4();
    s.q.pop();
    let y_fp4 = s.clone().run(Backend::Cpu).unwrap_err();
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

/// The raw validator's own rules, without an engine behind it. The host engine rebuilds
/// safe views after validating (their constructors repeat the stride rule), so only the
/// CUDA raw entry relies on these checks, and its tests need a GPU: here they run alone.
#[test]
fn raw_validator_rules_without_an_engine() {
    use fp4norm::{RawBuf, RawCall, RawGlobalScale, RawMat, ScaleOut};
    let (m, h) = (2usize, 64usize);
    let x = vec![bf16::ONE; m * h];
    let w = vec![bf16::ONE; h];
    let mut q = vec![0u8; m * h / 2];
    let mut rm = vec![0u8; m * h / 16];
    let addr = |p: *const u8| p as usize as u64;
    let (xa, wa) = (addr(x.as_ptr().cast()), addr(w.as_ptr().cast()));
    let (qa, rma) = (addr(q.as_mut_ptr()), addr(rm.as_mut_ptr()));
    let mat = |ptr, rows, stride| RawMat {
        ptr,
        rows,
        cols: h,
        row_stride: stride,
        len: Some(m * h),
    };
    let call = |x: RawMat, q: RawBuf, rm: RawBuf| RawCall {
        dtype: DType::BF16,
        residual: None,
        weight: RawBuf::new(wa, h),
        scales: ScaleOut::RowMajor(rm),
        y_out: None,
        global_scale: RawGlobalScale::from_count(wa, 1),
        options: Options::nvfp4(),
        x,
        y_fp4: q,
    };
    let rows = |r: usize| (RawBuf::new(qa, r * h / 2), RawBuf::new(rma, r * h / 16));
    // Rows closer than a row's length: refused, naming the stride.
    let (qb, rb) = rows(2);
    let e = call(mat(xa, 2, h - 1), qb, rb).validate().unwrap_err();
    assert!(
        matches!(
            e,
            Error::StrideTooSmall {
                name: "input",
                stride: 63,
                cols: 64
            }
        ),
        "{e:?}"
    );
    // One row: its stride is never used, so any stride is accepted.
    for stride in [0, 1, h - 1, usize::MAX] {
        let (qb, rb) = rows(1);
        call(mat(xa, 1, stride), qb, rb).validate().unwrap();
    }
    // No rows: empty views may point anywhere, inside another argument's bytes too.
    call(
        mat(wa + 16, 0, h),
        RawBuf::new(wa + 32, 0),
        RawBuf::new(wa + 48, 0),
    )
    .validate()
    .unwrap();
    // One global scale for every row; more is one per row (and must be M).
    assert!(matches!(
        RawGlobalScale::from_count(wa, 1),
        RawGlobalScale::Uniform(_)
    ));
    assert!(matches!(
        RawGlobalScale::from_count(wa, 2),
        RawGlobalScale::PerRow(_)
    ));
    let (qb, rb) = rows(2);
    let mut c = call(mat(xa, 2, h), qb, rb);
    c.global_scale = RawGlobalScale::from_count(wa, 3);
    assert!(c.validate().is_err(), "3 global scales for 2 rows");
    // Other ranks' inputs (the fused all-reduce) may share bytes with this call's inputs,
    // not with what it writes.
    let (qb, rb) = rows(2);
    let checked = call(mat(xa, 2, h), qb, rb).validate().unwrap();
    let rank = |ptr| RawMat::contiguous(ptr, m, h);
    let x2 = vec![bf16::ONE; m * h];
    let x2a = addr(x2.as_ptr().cast());
    fp4norm::raw::check_rank_inputs(&checked.ranges, DType::BF16, &[rank(xa), rank(x2a)]).unwrap();
    let e = fp4norm::raw::check_rank_inputs(&checked.ranges, DType::BF16, &[rank(xa), rank(qa)])
        .unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e:?}");
}

/// A change to one buffer or stride of a raw call `C`, named, with the vector-access verdict
/// the validator must then give.
type Shift<C> = (&'static str, fn(&mut C), bool);

/// The shifts of the row views and the weight with the verdict each must give, alike for
/// both raw calls (their fields of these names have the same types): a row start or stride
/// off 16 bytes, or the weight's start, takes vector access away.
macro_rules! row_view_shifts {
    ($call:ty) => {{
        let shifts: [Shift<$call>; 8] = [
            ("input 2 bytes off", |c| c.x.ptr += 2, false),
            (
                "input stride 16 bytes longer",
                |c| c.x.row_stride += 8,
                true,
            ),
            (
                "input stride 2 bytes longer",
                |c| c.x.row_stride += 1,
                false,
            ),
            (
                "residual 2 bytes off",
                |c| c.residual.as_mut().unwrap().ptr += 2,
                false,
            ),
            (
                "residual stride 2 bytes longer",
                |c| c.residual.as_mut().unwrap().row_stride += 1,
                false,
            ),
            (
                "y_out 2 bytes off",
                |c| c.y_out.as_mut().unwrap().ptr += 2,
                false,
            ),
            (
                "y_out stride 2 bytes longer",
                |c| c.y_out.as_mut().unwrap().row_stride += 1,
                false,
            ),
            ("weight 2 bytes off", |c| c.weight.ptr += 2, false),
        ];
        shifts
    }};
}

/// Disjoint, 4 KiB-aligned homes for the buffers of a raw call that is only validated,
/// never run; a test shifts one of them off its alignment.
fn home(k: u64) -> u64 {
    0x10_0000 + k * 0x1000
}

/// Rows and row length of [`raw_fp8_call`].
const FP8_M: usize = 2;
const FP8_H: usize = 64;

/// A valid per-token FP8 raw call of `FP8_M × FP8_H` bf16 rows, every buffer in its own
/// [`home`] (16-byte aligned: vector access), with or without a residual and `y_out`.
fn raw_fp8_call(residual: bool, y_out: bool) -> fp4norm::fp8::RawFp8Call {
    use fp4norm::fp8::{Fp8Element, Fp8Options, RawFp8Call};
    use fp4norm::{RawBuf, RawMat};
    let (m, h) = (FP8_M, FP8_H);
    RawFp8Call {
        dtype: DType::BF16,
        x: RawMat::contiguous(home(0), m, h),
        residual: residual.then(|| RawMat::contiguous(home(1), m, h)),
        weight: RawBuf::new(home(2), h),
        q: RawBuf::new(home(3), m * h),
        scales: Some(RawBuf::new(home(4), m)),
        static_scale: None,
        y_out: y_out.then(|| RawMat::contiguous(home(5), m, h)),
        options: Fp8Options::per_token(Fp8Element::E4M3),
    }
}

/// The validator's verdict on vector access, the one flag only the CUDA entry reads (its
/// fast path loads 16-byte vectors and stores 4-byte scale words): true exactly when every
/// row start, row stride, the weight, `y_fp4` (4 bytes) and swizzled scales (4 bytes) allow
/// it. Row-major scales are stored byte by byte, so their alignment does not matter. The
/// addresses are never dereferenced.
#[test]
fn raw_validator_says_which_calls_take_vector_access() {
    use fp4norm::{RawBuf, RawCall, RawGlobalScale, RawMat, ScaleOut};
    let (m, h) = (2usize, 64usize);
    let mat = |ptr| RawMat::contiguous(ptr, m, h);
    let aligned = || RawCall {
        dtype: DType::BF16,
        x: mat(home(0)),
        residual: Some(mat(home(1))),
        weight: RawBuf::new(home(2), h),
        y_fp4: RawBuf::new(home(3), m * h / 2),
        scales: ScaleOut::Both {
            row_major: RawBuf::new(home(4), m * h / 16),
            swizzled: RawBuf::new(home(5), swizzled_len(m, h / 16).unwrap()),
        },
        y_out: Some(mat(home(6))),
        global_scale: RawGlobalScale::from_count(home(7), 1),
        options: Options::nvfp4(),
    };
    let verdict = |c: RawCall| c.validate().unwrap().vector_aligned;
    let mut cases = row_view_shifts!(RawCall).to_vec();
    cases.extend::<[Shift<RawCall>; 5]>([
        ("y_fp4 2 bytes off", |c| c.y_fp4.ptr += 2, false),
        ("y_fp4 4 bytes off", |c| c.y_fp4.ptr += 4, true),
        (
            "row-major scales 1 byte off",
            |c| {
                if let ScaleOut::Both { row_major, .. } = &mut c.scales {
                    row_major.ptr += 1;
                }
            },
            true,
        ),
        (
            "swizzled scales 2 bytes off",
            |c| {
                if let ScaleOut::Both { swizzled, .. } = &mut c.scales {
                    swizzled.ptr += 2;
                }
            },
            false,
        ),
        (
            "no residual, no y_out",
            |c| (c.residual, c.y_out) = (None, None),
            true,
        ),
    ]);
    vector_access_verdicts(aligned, verdict, &cases);
}

/// Written buffers may touch but not share a byte, in either order of the validator's
/// list: `y_fp4` right before or right after the scales of one allocation is a valid call,
/// one byte of overlap is refused.
#[test]
fn raw_validator_lets_buffers_touch() {
    use fp4norm::{RawBuf, RawCall, RawGlobalScale, RawMat, ScaleOut};
    let (m, h) = (2usize, 64usize);
    let (q_len, s_len) = (m * h / 2, m * h / 16);
    let base = 0x20_0000u64;
    let call = |q: u64, s: u64| RawCall {
        dtype: DType::BF16,
        x: RawMat::contiguous(0x10_0000, m, h),
        residual: None,
        weight: RawBuf::new(0x18_0000, h),
        y_fp4: RawBuf::new(q, q_len),
        scales: ScaleOut::RowMajor(RawBuf::new(s, s_len)),
        y_out: None,
        global_scale: RawGlobalScale::from_count(0x1C_0000, 1),
        options: Options::nvfp4(),
    };
    let (q_len, s_len) = (q_len as u64, s_len as u64);
    call(base, base + q_len)
        .validate()
        .expect("scales right after y_fp4");
    call(base + s_len, base)
        .validate()
        .expect("y_fp4 right after the scales");
    for (q, s) in [(base, base + q_len - 1), (base + s_len - 1, base)] {
        let e = call(q, s).validate().unwrap_err();
        assert!(matches!(e, Error::Overlap { .. }), "{e:?}");
    }
}

/// `RawDequant::validate`'s rules that only the CUDA entry relies on (the host entry
/// rebuilds safe views, whose constructors repeat them): no rows check nothing else; with
/// rows, `out` may not overlap the codes, the global scale is checked only where the scales
/// use it (E4M3), and vector access needs `y_fp4` 4-byte aligned. Never dereferenced.
#[test]
fn raw_dequant_validator_rules_without_an_engine() {
    use fp4norm::{RawBuf, RawDequant, RawGlobalScale, ScaleOut};
    let h = 64usize;
    let call = |m: usize, format: Fp4Format, q: u64, out: u64, gs: u64| RawDequant {
        m,
        h,
        format,
        y_fp4: RawBuf::new(q, m * h / 2),
        scales: ScaleOut::RowMajor(RawBuf::new(0x30_0000, m * h / format.block_size())),
        global_scale: RawGlobalScale::from_count(gs, 1),
        out: RawBuf::new(out, m * h),
    };
    let (q, out, gs) = (0x10_0000u64, 0x20_0000u64, 0x40_0000u64);
    // No rows: an empty call, whatever its (empty) buffers share.
    let c = call(0, Fp4Format::NVFP4, q, q, gs).validate().unwrap();
    assert!(c.ranges.is_empty() && c.vector_aligned);
    // Rows: out over the codes is refused.
    let e = call(2, Fp4Format::NVFP4, q, q, gs).validate().unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e:?}");
    // A misaligned global scale: refused for NVFP4, ignored by MXFP4 (UE8M0 scales).
    let e = call(2, Fp4Format::NVFP4, q, out, gs + 2)
        .validate()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Misaligned {
                name: "global_scale",
                ..
            }
        ),
        "{e:?}"
    );
    call(2, Fp4Format::MXFP4, q, out, gs + 2)
        .validate()
        .unwrap();
    // Vector access: y_fp4 at 4 bytes, not 2.
    assert!(
        call(2, Fp4Format::NVFP4, q + 4, out, gs)
            .validate()
            .unwrap()
            .vector_aligned
    );
    assert!(
        !call(2, Fp4Format::NVFP4, q + 2, out, gs)
            .validate()
            .unwrap()
            .vector_aligned
    );
}

/// The raw validators' verdict on vector access for `aligned()` (which must allow it) and
/// for each case, which shifts one buffer or stride of it and says what the verdict must be.
fn vector_access_verdicts<C>(
    aligned: impl Fn() -> C,
    verdict: impl Fn(C) -> bool,
    cases: &[Shift<C>],
) {
    assert!(verdict(aligned()), "every buffer aligned");
    for (what, shift, want) in cases {
        let mut c = aligned();
        shift(&mut c);
        assert_eq!(verdict(c), *want, "{what}");
    }
}

/// The FP8 validator's verdict on vector access, the flag only the CUDA entry reads: true
/// exactly when every row start and stride and the weight allow 16-byte vectors, `q` 8-byte
/// stores and the dynamic scales 4-byte ones. The addresses are never dereferenced.
#[test]
fn raw_fp8_validator_says_which_calls_take_vector_access() {
    use fp4norm::fp8::{
        Fp8Element, Fp8Group, Fp8Options, Fp8ScaleFormat, Fp8ScaleLayout, RawFp8Call,
    };
    use fp4norm::RawBuf;
    let aligned = || raw_fp8_call(true, true);
    let verdict = |c: RawFp8Call| c.validate().unwrap().vector_aligned;
    let mut cases = row_view_shifts!(RawFp8Call).to_vec();
    cases.extend::<[Shift<RawFp8Call>; 4]>([
        ("q 4 bytes off", |c| c.q.ptr += 4, false),
        ("q 8 bytes off", |c| c.q.ptr += 8, true),
        (
            "scales 4 bytes off",
            |c| c.scales.as_mut().unwrap().ptr += 4,
            true,
        ),
        (
            "no residual, no y_out",
            |c| (c.residual, c.y_out) = (None, None),
            true,
        ),
    ]);
    vector_access_verdicts(aligned, verdict, &cases);
    // UE8M0 scales are bytes: the kernel stores them in 4-byte words, so one byte off is not
    // vector access (f32 scales cannot be one byte off: the validator refuses them).
    let mut c = aligned();
    c.options = Fp8Options::dynamic(
        Fp8Element::E4M3,
        Fp8Group::PerToken,
        Fp8ScaleFormat::UE8M0,
        Fp8ScaleLayout::RowMajor,
    );
    c.scales = Some(RawBuf::new(home(4) + 1, FP8_M));
    assert!(!verdict(c), "UE8M0 scales 1 byte off");
}

/// `RawFp8Call::validate`'s rules that only the CUDA entry relies on (the host entry
/// rebuilds safe views, whose constructors repeat them): the problem it returns carries the
/// call's residual and y_out (the kernel's configuration and §6's byte count follow them),
/// a static scale by address is one f32, and written buffers may touch but not overlap
/// anything. Never dereferenced.
#[test]
fn raw_fp8_validator_rules_without_an_engine() {
    use fp4norm::fp8::{Fp8Element, Fp8Options, RawFp8Call};
    use fp4norm::RawBuf;
    let (m, h) = (FP8_M, FP8_H);
    let call = raw_fp8_call;
    for (residual, y_out) in [(false, false), (true, false), (false, true), (true, true)] {
        let p = call(residual, y_out).validate().unwrap().problem;
        assert_eq!((p.has_residual, p.has_y_out), (residual, y_out));
        let mh = (m * h) as u64;
        let want = mh * if residual { 6 } else { 2 }
            + 2 * h as u64
            + mh
            + 4 * m as u64
            + if y_out { 2 * mh } else { 0 };
        assert_eq!(p.bytes_moved(), want, "residual {residual}, y_out {y_out}");
    }
    // A static scale by address: one f32 (a per-tensor call).
    let per_tensor = |len: Option<usize>| RawFp8Call {
        scales: None,
        static_scale: Some(RawBuf { ptr: home(6), len }),
        options: Fp8Options::per_tensor(Fp8Element::E4M3, 1.0),
        ..call(true, false)
    };
    per_tensor(Some(1)).validate().unwrap();
    per_tensor(None).validate().unwrap();
    let e = per_tensor(Some(2)).validate().unwrap_err();
    assert!(
        matches!(
            e,
            Error::GlobalScaleLength {
                expected: 1,
                got: 2
            }
        ),
        "{e:?}"
    );
    // Codes over the input: refused; codes right before or after the scales: accepted.
    let mut c = call(true, false);
    c.q.ptr = home(0);
    let e = c.validate().unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e:?}");
    let (q_len, s_len) = ((m * h) as u64, 4 * m as u64);
    for (q, s) in [(home(3), home(3) + q_len), (home(3) + s_len, home(3))] {
        let mut c = call(true, false);
        (c.q.ptr, c.scales.as_mut().unwrap().ptr) = (q, s);
        c.validate().unwrap();
    }
}
