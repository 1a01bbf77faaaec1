//! GPU backend against the CPU contract, byte for byte.
//!
//! Without a CUDA device every test prints `SKIPPED (no CUDA device)` and passes; set
//! `FP4NORM_REQUIRE_GPU=1` (the device script does) to make a missing GPU a failure.
//! `FP4NORM_GPU_SWEEP=small` shrinks the sweep (for compute-sanitizer runs).
//! Fresh random data every run (the seed is printed, and `FP4NORM_SEED` replays it).
#![cfg(feature = "cuda")]

mod gpu_common;
mod sweep;

use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use fp4norm::cuda::{internal, DevFp4Out, DevGlobalScale, DevMat, DevMatMut, Gpu};
use fp4norm::{
    bf16, cpu, f16, reference, DType, Element, Fp4Out, GlobalScale, MatMut, MatRef, Options,
    RawBuf, RawCall, RawGlobalScale, RawMat, ScaleLayout, ScaleOut,
};
use gpu_common::{first_diff, seed, upload};
use rand::{Rng, SeedableRng};
use sweep::{Case, Fill};

const POISON: u8 = 0xAA;

/// Held for writing by a test while it captures a CUDA graph, for reading by tests that
/// open their own `Gpu` on device 0: cudarc synchronises a context when its first stream
/// is created, which a capture in progress on another thread of the same (primary)
/// context forbids — the capture fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and the
/// stream creation with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (seen on the H200 with three
/// test threads).
static CAPTURE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let require = std::env::var_os("FP4NORM_REQUIRE_GPU").is_some_and(|v| v != "0");
        if fp4norm::cuda::device_count() == 0 {
            assert!(
                !require,
                "FP4NORM_REQUIRE_GPU is set but no CUDA device was found"
            );
            return None;
        }
        let g = Gpu::new(0).expect("opening CUDA device 0");
        // Settled here, before any test captures a graph: the self-test opens a stream.
        let path = g
            .conversion_path()
            .expect("the conversion self-test")
            .clone();
        eprintln!(
            "GPU: {} ({}, {} SMs, hw e2m1: {}; conversions: {}, {})",
            g.name(),
            g.arch(),
            g.sm_count(),
            g.hardware_e2m1(),
            if path.fast { "fast" } else { "literal" },
            path.reason
        );
        Some(g)
    })
    .as_ref()
}

macro_rules! require_gpu {
    ($test:expr) => {
        match gpu() {
            Some(g) => g,
            None => {
                skipped($test);
                return;
            }
        }
    };
}

/// Says so on the real stderr (the test harness captures `eprintln!` of passing tests).
fn skipped(what: &str) {
    skipped_because("no CUDA device", what);
}

fn skipped_because(reason: &str, what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED ({reason}): {what}");
}

/// Host data and CPU results of one case.
struct HostCase<T> {
    x: Vec<T>,
    r: Vec<T>,
    w: Vec<T>,
    gs: Vec<f32>,
    // expected outputs (full buffers, including stride gaps)
    r_out: Vec<T>,
    q: Vec<u8>,
    rm: Vec<u8>,
    sw: Vec<u8>,
    y: Vec<T>,
}

fn gen_values<T: Element>(
    rng: &mut rand::rngs::StdRng,
    n: usize,
    fill: Fill,
    scale: f32,
) -> Vec<T> {
    (0..n)
        .map(|i| {
            let v: f32 = match fill {
                Fill::Normal => rng.random_range(-3.0f32..3.0) * scale,
                Fill::Wide => {
                    let e: i32 = rng.random_range(-30..30);
                    rng.random_range(-1.0f32..1.0) * 2f32.powi(e)
                }
                Fill::Special => match rng.random_range(0..12) {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    5 => 1e-40,
                    6 => 65504.0,
                    _ => rng.random_range(-3.0f32..3.0),
                },
                Fill::Ties => {
                    [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, 6.0][i % 10] * scale
                }
                Fill::SumOrder | Fill::RstdEdge => 0.0, // host_case writes the rows
            };
            T::round_from_f32(v)
        })
        .collect()
}

/// Fills `row` (uniform in ±3) so that its rstd on the exact sum lies within
/// `RSTD_EDGE_ULPS` f64 ulps of an f32 rounding midpoint: one element at a time is redrawn
/// until the row's f64 sum lands there (about 2^28 / RSTD_EDGE_ULPS draws, a few ms).
fn rstd_edge_row<T: Element>(row: &mut [T], eps: f32, rng: &mut rand::rngs::StdRng) {
    use fp4norm::sumsq::{exact_sum_of_squares, rstd_f64, ulps_to_f32_midpoint as to_midpoint};
    let h = row.len();
    let draw = |rng: &mut rand::rngs::StdRng| T::round_from_f32(rng.random_range(-3.0f32..3.0));
    loop {
        row.iter_mut().for_each(|v| *v = draw(rng));
        let sq: Vec<f64> = row.iter().map(|v| f64::from(v.to_f32()).powi(2)).collect();
        let s0: f64 = sq.iter().sum();
        for _ in 0..(1usize << 22) {
            let i = rng.random_range(0..h);
            let v = draw(rng);
            let s = s0 - sq[i] + f64::from(v.to_f32()).powi(2);
            if to_midpoint(rstd_f64(s, h, eps)) < sweep::RSTD_EDGE_ULPS {
                row[i] = v;
                let exact = exact_sum_of_squares(row.iter().map(|v| v.to_f32()));
                if to_midpoint(rstd_f64(exact, h, eps)) < 2 * sweep::RSTD_EDGE_ULPS {
                    return;
                }
                break;
            }
        }
    }
}

fn host_case<T: Element>(c: &Case, rng: &mut rand::rngs::StdRng) -> HostCase<T> {
    let (m, h) = (c.m, c.h);
    let xs = c.x_stride();
    let rs = c.r_stride();
    let ys = c.y_stride();
    let mut x: Vec<T> = gen_values(rng, m.saturating_sub(1) * xs + h, c.fill, 1.0);
    let mut r: Vec<T> = gen_values(rng, m.saturating_sub(1) * rs + h, c.fill, 1.0);
    if m == 0 {
        x.clear();
        r.clear();
    }
    if matches!(c.fill, Fill::SumOrder) {
        assert!(h == 4096 && T::DTYPE == DType::BF16 && !c.special_rows);
        let pattern = [17179869184.0f32, 96468992.0, 468992.0];
        for row in 0..m {
            for i in 0..h {
                x[row * xs + i] = T::round_from_f32(181.0);
            }
            for (j, &v) in pattern.iter().enumerate() {
                x[row * xs + (row * 37 + j) % h] = T::round_from_f32(v);
            }
        }
        r.iter_mut().for_each(|v| *v = T::round_from_f32(0.0));
    }
    if matches!(c.fill, Fill::RstdEdge) {
        use rayon::prelude::*;
        assert!(!c.special_rows);
        let seeds: Vec<u64> = (0..m).map(|_| rng.random()).collect();
        x.par_chunks_mut(xs).zip(seeds).for_each(|(row, seed)| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            rstd_edge_row(&mut row[..h], c.eps, &mut rng);
        });
        r.iter_mut().for_each(|v| *v = T::round_from_f32(0.0));
    }
    // Rows with special content: a zero row, a NaN row, an Inf row (SPEC.md edge cases).
    if c.special_rows && m >= 4 {
        for i in 0..h {
            x[i] = T::round_from_f32(0.0);
            r[i] = T::round_from_f32(0.0);
            x[xs + i] = T::round_from_f32(1.0);
            x[2 * xs + i] = T::round_from_f32(-2.0);
        }
        x[xs + h / 3] = T::round_from_f32(f32::NAN);
        x[2 * xs + h / 2] = T::round_from_f32(f32::INFINITY);
        x[3 * xs] = T::round_from_f32(f32::NEG_INFINITY);
    }
    let w: Vec<T> = (0..h)
        .map(|_| match c.fill {
            Fill::SumOrder => T::round_from_f32(1.0),
            _ => T::round_from_f32(rng.random_range(0.25f32..2.0)),
        })
        .collect();
    let gs: Vec<f32> = if c.per_row_gs {
        (0..m).map(|_| rng.random_range(0.5f32..3000.0)).collect()
    } else {
        vec![c.gs]
    };
    let p = c.problem(T::DTYPE);
    let mut r_out = r.clone();
    let mut q = vec![POISON; p.fp4_len()];
    let mut rm = vec![
        POISON;
        if p.layout.has_row_major() {
            p.row_major_scales_len()
        } else {
            0
        }
    ];
    let mut sw = vec![
        POISON;
        if p.layout.has_swizzled() {
            p.swizzled_scales_len()
        } else {
            0
        }
    ];
    let mut y = vec![
        T::from_bits(0xAAAA);
        if c.y_out {
            m.saturating_sub(1) * ys + h
        } else {
            0
        }
    ];
    if m == 0 {
        y.clear();
    }
    {
        let scales = match p.layout {
            ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
            ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
            ScaleLayout::Both => ScaleOut::Both {
                row_major: &mut rm[..],
                swizzled: &mut sw[..],
            },
        };
        let y_out = c
            .y_out
            .then(|| MatMut::with_stride(&mut y, m, h, ys).unwrap());
        let out = Fp4Out {
            y_fp4: &mut q,
            scales,
            y_out,
        };
        let gsv = if c.per_row_gs {
            GlobalScale::PerRow(&gs)
        } else {
            GlobalScale::Uniform(c.gs)
        };
        let opts = Options {
            format: c.format,
            eps: c.eps,
            weight_bias: c.weight_bias,
        };
        let xv = MatRef::with_stride(&x, m, h, xs).unwrap();
        // Small cases through the scalar reference itself; large ones through the parallel
        // CPU path, which the CPU suite proves byte-identical to it.
        let small = m * h <= 1 << 20;
        let res = if c.residual {
            let rv = MatMut::with_stride(&mut r_out, m, h, rs).unwrap();
            if small {
                reference::add_rmsnorm_fp4quant(xv, rv, &w, out, gsv, &opts)
            } else {
                cpu::add_rmsnorm_fp4quant(xv, rv, &w, out, gsv, &opts)
            }
        } else if small {
            reference::rmsnorm_fp4quant(xv, &w, out, gsv, &opts)
        } else {
            cpu::rmsnorm_fp4quant(xv, &w, out, gsv, &opts)
        };
        res.expect("CPU reference accepts the case");
    }
    HostCase {
        x,
        r,
        w,
        gs,
        r_out,
        q,
        rm,
        sw,
        y,
    }
}

/// Runs one case on the GPU (through the safe cudarc API, or the raw API for the
/// unaligned variant) and compares every output byte with the CPU.
fn run_case<T: Element + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    stream: &Arc<CudaStream>,
    c: &Case,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let hc = host_case::<T>(c, rng);
    let p = c.problem(T::DTYPE);
    let (m, h) = (c.m, c.h);
    let off = c.misalign_elems;
    // Misaligned views start `off` elements into their allocation.
    let pad = |v: &[T]| -> Vec<T> {
        let mut out = vec![T::from_bits(0x5555); off];
        out.extend_from_slice(v);
        out
    };
    let x_d = upload(stream, &pad(&hc.x));
    let mut r_d = upload(stream, &pad(&hc.r));
    let w_d = upload(stream, &hc.w);
    let gs_d = upload(stream, &hc.gs);
    let mut q_d = upload(stream, &vec![POISON; p.fp4_len() + off]);
    let mut rm_d = upload(stream, &vec![POISON; hc.rm.len().max(1)]);
    let sw_off = c.sw_offset;
    let mut sw_d = upload(stream, &vec![POISON; hc.sw.len().max(1) + sw_off]);
    let mut y_d = upload(stream, &pad(&vec![T::from_bits(0xAAAA); hc.y.len()]));
    let opts = Options {
        format: c.format,
        eps: c.eps,
        weight_bias: c.weight_bias,
    };
    let result = if off == 0 && sw_off == 0 {
        let scales = match p.layout {
            ScaleLayout::RowMajor => ScaleOut::RowMajor(rm_d.slice_mut(..hc.rm.len())),
            ScaleLayout::Swizzled => ScaleOut::Swizzled(sw_d.slice_mut(..hc.sw.len())),
            ScaleLayout::Both => ScaleOut::Both {
                row_major: rm_d.slice_mut(..hc.rm.len()),
                swizzled: sw_d.slice_mut(..hc.sw.len()),
            },
        };
        let out = DevFp4Out {
            y_fp4: q_d.slice_mut(..p.fp4_len()),
            scales,
            y_out: c
                .y_out
                .then(|| DevMatMut::with_stride(y_d.slice_mut(..hc.y.len()), m, h, c.y_stride())),
        };
        let gsv = if c.per_row_gs {
            DevGlobalScale::PerRow(gs_d.slice(..hc.gs.len()))
        } else if c.gs == 1.0 && c.gs_none {
            DevGlobalScale::None
        } else {
            DevGlobalScale::Uniform(gs_d.slice(..1))
        };
        let xv = DevMat::with_stride(x_d.slice(..hc.x.len()), m, h, c.x_stride());
        let w = w_d.slice(..h);
        if c.residual {
            let rv = DevMatMut::with_stride(r_d.slice_mut(..hc.r.len()), m, h, c.r_stride());
            g.add_rmsnorm_fp4quant(stream, xv, rv, &w, out, gsv, &opts)
        } else {
            g.rmsnorm_fp4quant(stream, xv, &w, out, gsv, &opts)
        }
    } else {
        // The raw entry point with element pointers `off` elements in: not 16-byte
        // aligned, so the element-wise kernel runs.
        let e = T::DTYPE.size() as u64;
        let ptr = |s: &CudaSlice<T>| s.device_ptr(stream).0 + off as u64 * e;
        let bptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
        let call = RawCall {
            dtype: T::DTYPE,
            x: RawMat {
                ptr: ptr(&x_d),
                rows: m,
                cols: h,
                row_stride: c.x_stride(),
                len: Some(hc.x.len()),
            },
            residual: c.residual.then(|| RawMat {
                ptr: ptr(&r_d),
                rows: m,
                cols: h,
                row_stride: c.r_stride(),
                len: Some(hc.r.len()),
            }),
            weight: RawBuf::new(w_d.device_ptr(stream).0, h),
            y_fp4: RawBuf::new(bptr(&q_d) + off as u64, p.fp4_len()),
            scales: match p.layout {
                ScaleLayout::RowMajor => ScaleOut::RowMajor(RawBuf::new(bptr(&rm_d), hc.rm.len())),
                ScaleLayout::Swizzled => {
                    ScaleOut::Swizzled(RawBuf::new(bptr(&sw_d) + sw_off as u64, hc.sw.len()))
                }
                ScaleLayout::Both => ScaleOut::Both {
                    row_major: RawBuf::new(bptr(&rm_d), hc.rm.len()),
                    swizzled: RawBuf::new(bptr(&sw_d) + sw_off as u64, hc.sw.len()),
                },
            },
            y_out: c.y_out.then(|| RawMat {
                ptr: ptr(&y_d),
                rows: m,
                cols: h,
                row_stride: c.y_stride(),
                len: Some(hc.y.len()),
            }),
            global_scale: RawGlobalScale::from_count(gs_d.device_ptr(stream).0, hc.gs.len()),
            options: opts,
        };
        unsafe { g.launch_raw(stream.cu_stream(), &call) }
    };
    result.map_err(|e| format!("launch failed: {e}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("kernel failed: {e}"))?;
    let got_q: Vec<u8> = stream.clone_dtoh(&q_d).unwrap();
    let row_bytes = h / 2;
    first_diff("y_fp4", &got_q[off..off + p.fp4_len()], &hc.q, row_bytes)?;
    if p.layout.has_row_major() {
        let got: Vec<u8> = stream.clone_dtoh(&rm_d).unwrap();
        first_diff(
            "row-major scales",
            &got[..hc.rm.len()],
            &hc.rm,
            p.n_blocks(),
        )?;
    }
    if p.layout.has_swizzled() {
        let got: Vec<u8> = stream.clone_dtoh(&sw_d).unwrap();
        first_diff(
            "swizzled scales",
            &got[sw_off..sw_off + hc.sw.len()],
            &hc.sw,
            512,
        )?;
    }
    let bits = |v: &[T]| v.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    let got_r: Vec<T> = stream.clone_dtoh(&r_d).unwrap();
    let want_r = if c.residual { &hc.r_out } else { &hc.r };
    first_diff(
        "residual",
        &bits(&got_r[off..off + want_r.len()]),
        &bits(want_r),
        c.r_stride(),
    )?;
    if c.y_out {
        let got: Vec<T> = stream.clone_dtoh(&y_d).unwrap();
        first_diff(
            "y_out",
            &bits(&got[off..off + hc.y.len()]),
            &bits(&hc.y),
            c.y_stride(),
        )?;
    }
    Ok(())
}

/// Runs `cases` on `g` (one stream), returning the failures.
fn run_cases_on(g: &Gpu, cases: &[&Case], seed_mix: u64) -> Vec<String> {
    let stream = g.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ seed_mix);
    let mut failures = Vec::new();
    for c in cases {
        let res = match c.dtype {
            DType::BF16 => run_case::<bf16>(g, &stream, c, &mut rng),
            DType::F16 => run_case::<f16>(g, &stream, c, &mut rng),
        };
        if let Err(e) = res {
            failures.push(format!("device {} {c:?}: {e}", g.ordinal()));
        }
    }
    failures
}

fn run_sweep(name: &str, cases: &[Case]) {
    let g = require_gpu!(name);
    let cases: Vec<&Case> = cases.iter().collect();
    let failures = run_cases_on(g, &cases, cases.len() as u64);
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!("{} cases, {} failed", cases.len(), failures.len());
    assert!(
        failures.is_empty(),
        "{} of {} GPU cases differ from the CPU:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn gpu_sweep_bf16() {
    run_sweep("gpu_sweep_bf16", &sweep::sweep(DType::BF16));
}

#[test]
fn gpu_sweep_f16() {
    run_sweep("gpu_sweep_f16", &sweep::sweep(DType::F16));
}

#[test]
fn gpu_edge_cases() {
    run_sweep("gpu_edge_cases", &sweep::edge_cases());
}

/// The launch table's many-row shapes (split rows held in registers, four vectors per
/// thread, ...) that only calls of thousands of rows take, forced at 300 rows on a `Gpu` of
/// their own: byte for byte against the CPU like the sweep. (The device script also runs
/// this with the L2 prefetch of the next row forced, as those calls prefetch.)
#[test]
fn gpu_many_row_shapes_at_300_rows() {
    let g0 = require_gpu!("gpu_many_row_shapes_at_300_rows");
    let _no_capture_meanwhile = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    let cases = sweep::many_row_shape_cases(g0.limits());
    let mut shapes: Vec<(u32, u32, u32)> = cases.iter().map(|&(_, s)| s).collect();
    shapes.sort_unstable();
    shapes.dedup();
    let mut failures = Vec::new();
    for &shape in &shapes {
        let g =
            internal::with_launch_shape(Gpu::new(0).expect("opening CUDA device 0"), Some(shape));
        let of_shape: Vec<&Case> = cases
            .iter()
            .filter(|(_, s)| *s == shape)
            .map(|(c, _)| c)
            .collect();
        for c in &of_shape {
            let cfg = internal::config(&g, &c.problem(c.dtype), c.gs_mode(), c.aligned());
            assert_eq!(
                (cfg.threads_per_row, cfg.rows_per_cta, cfg.cluster),
                shape,
                "{c:?}: the forced shape must run"
            );
        }
        failures.extend(run_cases_on(&g, &of_shape, 0x5a + shape.0 as u64));
    }
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "{} cases over {} many-row shapes {shapes:?}, {} failed",
        cases.len(),
        shapes.len(),
        failures.len()
    );
    assert!(
        !cases.is_empty(),
        "the launch table has many-row shapes to test"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every candidate shape `fp4norm tune` measures, forced (as a tuned table would pick it):
/// byte for byte against the CPU. The bytes never depend on the launch shape, so a table
/// tuned on any machine can only change the speed.
#[test]
fn gpu_every_tune_candidate_writes_the_reference_bytes() {
    let g0 = require_gpu!("gpu_every_tune_candidate_writes_the_reference_bytes");
    let _no_capture_meanwhile = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    let cases = sweep::tune_candidate_cases(g0.limits());
    let g = Gpu::new(0).expect("opening CUDA device 0");
    let mut failures = Vec::new();
    for (c, shape) in &cases {
        internal::set_launch_shape(&g, Some(*shape));
        let cfg = internal::config(&g, &c.problem(c.dtype), c.gs_mode(), c.aligned());
        assert_eq!(
            (cfg.threads_per_row, cfg.rows_per_cta, cfg.cluster),
            *shape,
            "{c:?}: the candidate must run"
        );
        failures.extend(run_cases_on(
            &g,
            &[c],
            0x7a + shape.0 as u64 * 16 + shape.2 as u64,
        ));
    }
    internal::set_launch_shape(&g, None);
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "tune candidates: {} cases, {} failed",
        cases.len(),
        failures.len()
    );
    assert!(!cases.is_empty());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `Gpu::prepare_raw` builds every kernel `launch_raw` then launches, from the call alone
/// (NVFP4 into both layouts, MXFP4 row-major); a call the validator refuses it refuses
/// with the launch's error.
#[test]
fn gpu_prepare_raw_builds_what_the_launch_uses() {
    let shared = require_gpu!("gpu_prepare_raw_builds_what_the_launch_uses");
    // A handle of its own, so that its count of kernels built is this test's.
    let g = Gpu::new(shared.ordinal()).expect("a second handle of the device");
    let stream = g.context().new_stream().unwrap();
    for (m, h, opts, layout) in [
        (300usize, 4096usize, Options::nvfp4(), ScaleLayout::Both),
        (7, 2048, Options::mxfp4(), ScaleLayout::RowMajor),
    ] {
        let p = fp4norm::Problem::new(m, h, DType::BF16, layout, &opts).unwrap();
        let x_d = stream.alloc_zeros::<bf16>(m * h).unwrap();
        let r_d = stream.alloc_zeros::<bf16>(m * h).unwrap();
        let w_d = stream.clone_htod(&vec![bf16::ONE; h]).unwrap();
        let gs_d = stream.clone_htod(&[1.0f32]).unwrap();
        let q_d = stream.clone_htod(&vec![POISON; p.fp4_len()]).unwrap();
        let rm_d = stream
            .clone_htod(&vec![POISON; p.row_major_scales_len().max(1)])
            .unwrap();
        let sw_d = stream
            .clone_htod(&vec![POISON; p.swizzled_scales_len().max(1)])
            .unwrap();
        let dp = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
        let bp = |s: &CudaSlice<u8>| s.device_ptr(&stream).0;
        let mat = |ptr| RawMat {
            ptr,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        };
        let row_major = RawBuf::new(bp(&rm_d), p.row_major_scales_len());
        let call = RawCall {
            dtype: DType::BF16,
            x: mat(dp(&x_d)),
            residual: Some(mat(dp(&r_d))),
            weight: RawBuf::new(dp(&w_d), h),
            y_fp4: RawBuf::new(bp(&q_d), p.fp4_len()),
            scales: match layout {
                ScaleLayout::Both => ScaleOut::Both {
                    row_major,
                    swizzled: RawBuf::new(bp(&sw_d), p.swizzled_scales_len()),
                },
                _ => ScaleOut::RowMajor(row_major),
            },
            y_out: None,
            global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(&stream).0, 1)),
            options: opts,
        };
        let kernels = {
            let cfg = internal::config(&g, &p, fp4norm::cuda::GsMode::Uniform, true);
            1 + usize::from(cfg.second_pass().is_some())
        };
        // One code byte short: refused.
        let short = RawCall {
            y_fp4: RawBuf::new(bp(&q_d), p.fp4_len() - 1),
            ..call
        };
        let cu = stream.cu_stream();
        gpu_common::check_prepared(
            &g,
            &format!("prepare_raw, {m} x {h}"),
            kernels,
            || g.prepare_raw(&call),
            // SAFETY: live allocations of this device, extents as given.
            || unsafe { g.launch_raw(cu, &call) }.map(|()| stream.synchronize().unwrap()),
            || g.prepare_raw(&short),
            // SAFETY: as above; the call is refused before anything is launched.
            || unsafe { g.launch_raw(cu, &short) },
        );
        assert!(
            stream
                .clone_dtoh(&q_d)
                .unwrap()
                .iter()
                .all(|&b| b != POISON),
            "{m} x {h}: every code written"
        );
    }
}

/// Capture one call in a CUDA graph, change the global scale in device memory, replay:
/// the replay must use the new scale (it is read by the kernel, not baked in).
#[test]
fn gpu_graph_capture_and_replay_with_new_global_scale() {
    let g = require_gpu!("gpu_graph_capture_and_replay_with_new_global_scale");
    let (m, h) = (300usize, 4096usize);
    let opts = Options::nvfp4();
    let p = fp4norm::Problem::new(m, h, DType::BF16, ScaleLayout::Both, &opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x9a);
    let x: Vec<bf16> = gen_values(&mut rng, m * h, Fill::Normal, 1.0);
    let r: Vec<bf16> = gen_values(&mut rng, m * h, Fill::Normal, 1.0);
    let w: Vec<bf16> = gen_values(&mut rng, h, Fill::Normal, 1.0);
    let stream = g.context().new_stream().unwrap();
    let x_d = stream.clone_htod(&x).unwrap();
    let mut r_d = stream.clone_htod(&r).unwrap();
    let w_d = stream.clone_htod(&w).unwrap();
    let mut gs_d = stream.clone_htod(&[1.0f32]).unwrap();
    let q_d = stream.clone_htod(&vec![POISON; p.fp4_len()]).unwrap();
    let rm_d = stream
        .clone_htod(&vec![POISON; p.row_major_scales_len()])
        .unwrap();
    let sw_d = stream
        .clone_htod(&vec![POISON; p.swizzled_scales_len()])
        .unwrap();
    let dp = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
    let bp = |s: &CudaSlice<u8>| s.device_ptr(&stream).0;
    let call = RawCall {
        dtype: DType::BF16,
        x: RawMat {
            ptr: dp(&x_d),
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        },
        residual: Some(RawMat {
            ptr: dp(&r_d),
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        }),
        weight: RawBuf::new(dp(&w_d), h),
        y_fp4: RawBuf::new(bp(&q_d), p.fp4_len()),
        scales: ScaleOut::Both {
            row_major: RawBuf::new(bp(&rm_d), p.row_major_scales_len()),
            swizzled: RawBuf::new(bp(&sw_d), p.swizzled_scales_len()),
        },
        y_out: None,
        global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(&stream).0, 1)),
        options: opts,
    };
    stream.synchronize().unwrap();
    g.prepare(&p, fp4norm::cuda::GsMode::Uniform, true).unwrap();
    let capturing = CAPTURE.write().unwrap_or_else(|e| e.into_inner());
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    unsafe { g.launch_raw(stream.cu_stream(), &call) }.unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    drop(capturing);
    for gs in [1.0f32, 37.5, 2688.0] {
        stream.memcpy_htod(&[gs], &mut gs_d).unwrap();
        stream.memcpy_htod(&r, &mut r_d).unwrap();
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let mut r_cpu = r.clone();
        let mut q = vec![0u8; p.fp4_len()];
        let mut rm = vec![0u8; p.row_major_scales_len()];
        let mut sw = vec![0u8; p.swizzled_scales_len()];
        cpu::add_rmsnorm_fp4quant(
            MatRef::new(&x, m, h).unwrap(),
            MatMut::new(&mut r_cpu, m, h).unwrap(),
            &w,
            Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::Both {
                    row_major: &mut rm,
                    swizzled: &mut sw,
                },
                y_out: None,
            },
            GlobalScale::Uniform(gs),
            &opts,
        )
        .unwrap();
        let got_q: Vec<u8> = stream.clone_dtoh(&q_d).unwrap();
        let got_rm: Vec<u8> = stream.clone_dtoh(&rm_d).unwrap();
        let got_sw: Vec<u8> = stream.clone_dtoh(&sw_d).unwrap();
        let got_r: Vec<bf16> = stream.clone_dtoh(&r_d).unwrap();
        assert!(got_q == q, "graph replay with gs {gs}: y_fp4 differs");
        assert!(
            got_rm == rm && got_sw == sw,
            "graph replay with gs {gs}: scales differ"
        );
        assert!(
            got_r == r_cpu,
            "graph replay with gs {gs}: residual differs"
        );
    }
    eprintln!("graph replay: 3 global scales, bytes identical to the CPU");
}

/// `Gpu::dequantize` (SPEC.md §4) against `fp4norm::dequantize`, f32 bits compared, over a
/// poisoned output: random codes and scale bytes (every E2M1 nibble, E4M3 and UE8M0 codes
/// including NaN and the extremes), each layout, NVFP4 with a uniform and per-row global
/// scale, MXFP4.
#[test]
fn gpu_dequantize_matches_the_host() {
    let g = require_gpu!("gpu_dequantize_matches_the_host");
    let stream = g.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0xDE0);
    let formats = [fp4norm::Fp4Format::NVFP4, fp4norm::Fp4Format::MXFP4];
    for (m, h) in [(1, 64), (3, 4096), (130, 2048), (257, 7168)] {
        for format in formats {
            for swizzled in [false, true] {
                for per_row in [false, true] {
                    let p = fp4norm::Problem::new(
                        m,
                        h,
                        DType::BF16,
                        ScaleLayout::Both,
                        &Options::default().with_format(format),
                    )
                    .unwrap();
                    let q: Vec<u8> = (0..p.fp4_len()).map(|_| rng.random()).collect();
                    let n = if swizzled {
                        p.swizzled_scales_len()
                    } else {
                        p.row_major_scales_len()
                    };
                    let sf: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                    let gs: Vec<f32> = (0..if per_row { m } else { 1 })
                        .map(|_| rng.random_range(0.01f32..100.0))
                        .collect();
                    let host_gs = if per_row {
                        GlobalScale::PerRow(&gs)
                    } else {
                        GlobalScale::Uniform(gs[0])
                    };
                    let mut want = vec![0f32; m * h];
                    let scales_in = if swizzled {
                        fp4norm::ScaleIn::Swizzled(&sf)
                    } else {
                        fp4norm::ScaleIn::RowMajor(&sf)
                    };
                    fp4norm::dequantize(m, h, format, &q, scales_in, host_gs, &mut want).unwrap();

                    let q_d = upload(&stream, &q);
                    let sf_d = upload(&stream, &sf);
                    let gs_d = upload(&stream, &gs);
                    let mut out_d = upload(&stream, &vec![f32::from_bits(0xAAAA_AAAA); m * h]);
                    let scales = if swizzled {
                        fp4norm::cuda::DevScaleIn::Swizzled(sf_d.slice(..))
                    } else {
                        fp4norm::cuda::DevScaleIn::RowMajor(sf_d.slice(..))
                    };
                    let dev_gs = if per_row {
                        DevGlobalScale::PerRow(gs_d.slice(..))
                    } else {
                        DevGlobalScale::Uniform(gs_d.slice(..))
                    };
                    g.dequantize(
                        &stream,
                        m,
                        h,
                        format,
                        &q_d.slice(..),
                        scales,
                        dev_gs,
                        &mut out_d.slice_mut(..),
                    )
                    .unwrap();
                    let got: Vec<f32> = stream.clone_dtoh(&out_d).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                    first_diff("dequantized", &bits(&got), &bits(&want), h).unwrap_or_else(|e| {
                        panic!("{m} x {h} {format} swizzled {swizzled} per-row gs {per_row}: {e}")
                    });
                }
            }
        }
    }
}

/// Two streams running different configurations at the same time.
#[test]
fn gpu_two_streams_at_once() {
    let g = require_gpu!("gpu_two_streams_at_once");
    let a = Case::new(
        DType::BF16,
        2048,
        4096,
        fp4norm::Fp4Format::NVFP4,
        ScaleLayout::Swizzled,
    );
    let b = Case::new(
        DType::BF16,
        1000,
        7168,
        fp4norm::Fp4Format::MXFP4,
        ScaleLayout::Both,
    );
    let s1 = g.context().new_stream().unwrap();
    let s2 = g.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x25);
    let t1 = std::thread::scope(|sc| {
        let h1 = sc.spawn(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x26);
            (0..4)
                .map(|_| run_case::<bf16>(g, &s1, &a, &mut rng))
                .collect::<Result<Vec<_>, _>>()
        });
        let r2 = (0..4)
            .map(|_| run_case::<bf16>(g, &s2, &b, &mut rng))
            .collect::<Result<Vec<_>, _>>();
        (h1.join().unwrap(), r2)
    });
    t1.0.expect("stream 1");
    t1.1.expect("stream 2");
}

/// Many threads, each with its own stream, calling at once with many configurations on
/// one GPU whose compile cache starts empty (a fresh `Gpu`): every result byte-identical
/// to the CPU, and every specialisation built exactly once although several threads asked
/// for it at the same moment (they start together, half of them on the same case). Run
/// with an empty `FP4NORM_CACHE_DIR` (the device script's `concurrency` step), the builds
/// are NVRTC compiles racing on the disk cache, also from a second process.
#[test]
fn gpu_many_threads_many_specialisations() {
    let _ = require_gpu!("gpu_many_threads_many_specialisations");
    let _no_capture_meanwhile = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    let g = Gpu::new(0).expect("opening CUDA device 0");
    let cases: Vec<Case> = sweep::sweep(DType::BF16)
        .into_iter()
        .chain(sweep::sweep(DType::F16))
        .chain(sweep::edge_cases())
        .filter(|c| c.m * c.h <= 1 << 18)
        .collect();
    let threads = 12usize;
    let barrier = std::sync::Barrier::new(threads);
    let started = std::time::Instant::now();
    let failures: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (g, cases, barrier) = (&g, &cases, &barrier);
                sc.spawn(move || {
                    // Even threads all start at case 0; odd ones at their own offset.
                    let start = if t % 2 == 0 {
                        0
                    } else {
                        t * cases.len() / threads
                    };
                    let order: Vec<&Case> = (0..cases.len())
                        .map(|i| &cases[(start + i) % cases.len()])
                        .collect();
                    barrier.wait();
                    run_cases_on(g, &order, 0x700 + t as u64)
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker thread panicked"))
            .collect()
    });
    // M = 0 launches nothing, so it builds nothing.
    // Each case's kernel, and its swizzle pass where the swizzled write is split.
    let distinct: std::collections::BTreeSet<String> = cases
        .iter()
        .filter(|c| c.m > 0)
        .flat_map(|c| {
            let cfg = internal::config(&g, &c.problem(c.dtype), c.gs_mode(), c.aligned());
            [Some(cfg), cfg.second_pass()]
        })
        .flatten()
        .map(|cfg| cfg.describe())
        .collect();
    eprintln!(
        "{threads} threads x {} cases ({} specialisations) in {:.1} s: {} failed; {} built",
        cases.len(),
        distinct.len(),
        started.elapsed().as_secs_f64(),
        failures.len(),
        g.kernel_builds()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        g.kernels_loaded(),
        distinct.len(),
        "specialisations requested"
    );
    assert_eq!(
        g.kernel_builds(),
        distinct.len(),
        "each specialisation built once"
    );
}

/// Two GPUs at once, where present: one thread per device runs the bf16 sweep's small
/// cases concurrently, every result byte-identical to the CPU.
#[test]
fn gpu_two_devices_at_once() {
    let g0 = require_gpu!("gpu_two_devices_at_once");
    if fp4norm::cuda::device_count() < 2 {
        skipped_because("one CUDA device", "gpu_two_devices_at_once");
        return;
    }
    let g1 = Gpu::new(1).expect("opening CUDA device 1");
    let all = sweep::sweep(DType::BF16);
    let cases: Vec<&Case> = all.iter().filter(|c| c.m * c.h <= 1 << 22).collect();
    let started = std::time::Instant::now();
    let failures: Vec<String> = std::thread::scope(|sc| {
        let a = sc.spawn(|| run_cases_on(g0, &cases, 0x2d0));
        let b = sc.spawn(|| run_cases_on(&g1, &cases, 0x2d1));
        let mut f = a.join().expect("device 0 thread");
        f.extend(b.join().expect("device 1 thread"));
        f
    });
    eprintln!(
        "two devices at once: {} cases on each in {:.1} s, {} failed",
        cases.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A second device, where present.
#[test]
fn gpu_second_device() {
    let _ = require_gpu!("gpu_second_device");
    if fp4norm::cuda::device_count() < 2 {
        skipped_because("one CUDA device", "gpu_second_device");
        return;
    }
    let g1 = Gpu::new(1).unwrap();
    let stream = g1.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x2d);
    let c = Case::new(
        DType::BF16,
        513,
        5120,
        fp4norm::Fp4Format::NVFP4,
        ScaleLayout::Both,
    );
    run_case::<bf16>(&g1, &stream, &c, &mut rng).unwrap();
    // Memory of device 1 handed to device 0 is refused before launch.
    let g0 = gpu().unwrap();
    let s0 = g0.context().new_stream().unwrap();
    let x_d = stream.clone_htod(&vec![bf16::ONE; 64]).unwrap();
    let ptr = x_d.device_ptr(&stream).0;
    let call = RawCall {
        dtype: DType::BF16,
        x: RawMat {
            ptr,
            rows: 1,
            cols: 64,
            row_stride: 64,
            len: None,
        },
        residual: None,
        weight: RawBuf::unsized_at(ptr),
        y_fp4: RawBuf::unsized_at(ptr + 1024),
        scales: ScaleOut::RowMajor(RawBuf::unsized_at(ptr + 2048)),
        y_out: None,
        global_scale: RawGlobalScale::None,
        options: Options::nvfp4(),
    };
    let err = unsafe { g0.launch_raw(s0.cu_stream(), &call) }.unwrap_err();
    assert!(
        matches!(err, fp4norm::Error::DeviceMismatch { .. }),
        "{err}"
    );
}

/// M·H ≥ 2^31 elements (64-bit offsets everywhere): 65536 × 32768 bf16, NVFP4, both
/// layouts. The bulk of x and r is a constant; rows 0, 1, M-2 and M-1 get random data
/// and are compared byte for byte with the CPU reference (FP4 bytes, both scale layouts,
/// the residual). Needs ~10 GiB of device memory: runs only with FP4NORM_GPU_HUGE=1.
#[test]
fn gpu_huge_tensor_spot_rows() {
    let g = require_gpu!("gpu_huge_tensor_spot_rows");
    if std::env::var_os("FP4NORM_GPU_HUGE").is_none() {
        skipped_because("set FP4NORM_GPU_HUGE=1", "gpu_huge_tensor_spot_rows");
        return;
    }
    let (m, h) = (65536usize, 32768usize);
    assert!((m * h) as u64 >= 1 << 31);
    let opts = Options::nvfp4();
    let p = fp4norm::Problem::new(m, h, DType::BF16, ScaleLayout::Both, &opts).unwrap();
    let stream = g.context().new_stream().unwrap();
    let s = stream.cu_stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x4a6e);
    let x_d = unsafe { stream.alloc::<u16>(m * h) }.unwrap();
    let r_d = unsafe { stream.alloc::<u16>(m * h) }.unwrap();
    let q_d = unsafe { stream.alloc::<u8>(p.fp4_len()) }.unwrap();
    let rm_d = unsafe { stream.alloc::<u8>(p.row_major_scales_len()) }.unwrap();
    let sw_d = unsafe { stream.alloc::<u8>(p.swizzled_scales_len()) }.unwrap();
    let w: Vec<bf16> = gen_values(&mut rng, h, Fill::Normal, 1.0);
    let w_d = stream.clone_htod(&w).unwrap();
    let gs_d = stream.clone_htod(&[2.5f32]).unwrap();
    let (xp, rp) = (x_d.device_ptr(&stream).0, r_d.device_ptr(&stream).0);
    let (qp, rmp, swp) = (
        q_d.device_ptr(&stream).0,
        rm_d.device_ptr(&stream).0,
        sw_d.device_ptr(&stream).0,
    );
    let (cx, cr) = (bf16::from_f32(0.75), bf16::from_f32(-1.5));
    unsafe {
        assert_eq!(
            sys::cuMemsetD16Async(xp, cx.to_bits(), m * h, s),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemsetD16Async(rp, cr.to_bits(), m * h, s),
            sys::CUresult::CUDA_SUCCESS
        );
        for (ptr, len) in [
            (qp, p.fp4_len()),
            (rmp, p.row_major_scales_len()),
            (swp, p.swizzled_scales_len()),
        ] {
            assert_eq!(
                sys::cuMemsetD8Async(ptr, POISON, len, s),
                sys::CUresult::CUDA_SUCCESS
            );
        }
    }
    let spot = [0usize, 1, m - 2, m - 1];
    let mut rows_x: Vec<Vec<bf16>> = Vec::new();
    let mut rows_r: Vec<Vec<bf16>> = Vec::new();
    for &row in &spot {
        let (xr, rr) = if row == 1 {
            (vec![cx; h], vec![cr; h])
        } else {
            (
                gen_values::<bf16>(&mut rng, h, Fill::Normal, 1.0),
                gen_values::<bf16>(&mut rng, h, Fill::Normal, 1.0),
            )
        };
        let off = (row * h * 2) as u64;
        unsafe {
            assert_eq!(
                sys::cuMemcpyHtoDAsync_v2(xp + off, xr.as_ptr() as *const _, h * 2, s),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                sys::cuMemcpyHtoDAsync_v2(rp + off, rr.as_ptr() as *const _, h * 2, s),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        stream.synchronize().unwrap();
        rows_x.push(xr);
        rows_r.push(rr);
    }
    let call = RawCall {
        dtype: DType::BF16,
        x: RawMat {
            ptr: xp,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        },
        residual: Some(RawMat {
            ptr: rp,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        }),
        weight: RawBuf::new(w_d.device_ptr(&stream).0, h),
        y_fp4: RawBuf::new(qp, p.fp4_len()),
        scales: ScaleOut::Both {
            row_major: RawBuf::new(rmp, p.row_major_scales_len()),
            swizzled: RawBuf::new(swp, p.swizzled_scales_len()),
        },
        y_out: None,
        global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(&stream).0, 1)),
        options: opts,
    };
    unsafe { g.launch_raw(s, &call) }.unwrap();
    stream.synchronize().unwrap();
    let sw_all: Vec<u8> = stream.clone_dtoh(&sw_d).unwrap();
    let nb = p.n_blocks();
    for (i, &row) in spot.iter().enumerate() {
        let mut r_cpu = rows_r[i].clone();
        let mut q = vec![0u8; h / 2];
        let mut rm = vec![0u8; nb];
        cpu::add_rmsnorm_fp4quant(
            MatRef::new(&rows_x[i], 1, h).unwrap(),
            MatMut::new(&mut r_cpu, 1, h).unwrap(),
            &w,
            Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::RowMajor(&mut rm),
                y_out: None,
            },
            GlobalScale::Uniform(2.5),
            &opts,
        )
        .unwrap();
        let mut got_q = vec![0u8; h / 2];
        let mut got_rm = vec![0u8; nb];
        let mut got_r = vec![bf16::ZERO; h];
        unsafe {
            sys::cuMemcpyDtoH_v2(
                got_q.as_mut_ptr() as *mut _,
                qp + (row * h / 2) as u64,
                h / 2,
            )
            .result()
            .unwrap();
            sys::cuMemcpyDtoH_v2(got_rm.as_mut_ptr() as *mut _, rmp + (row * nb) as u64, nb)
                .result()
                .unwrap();
            sys::cuMemcpyDtoH_v2(
                got_r.as_mut_ptr() as *mut _,
                rp + (row * h * 2) as u64,
                h * 2,
            )
            .result()
            .unwrap();
        }
        assert!(got_q == q, "row {row}: y_fp4 differs");
        assert!(got_rm == rm, "row {row}: row-major scales differ");
        assert!(got_r == r_cpu, "row {row}: residual differs");
        for (b, &code) in rm.iter().enumerate() {
            assert_eq!(
                sw_all[fp4norm::layout::swizzled_offset(row, b, nb)],
                code,
                "row {row} block {b}: swizzled scale"
            );
        }
    }
    eprintln!("huge tensor: M·H = 2^31, rows {spot:?} byte-identical to the CPU");
}

/// The fused kernel's fast codec paths (FPU-rounding E2M1 encoder, hardware E4M3
/// conversions, the block scale's division-free E4M3 division by 6 and UE8M0 code, the FP8
/// groups' division-free UE8M0 code) equal the literal SPEC.md encoders on all 2^32 f32
/// inputs and all 256 E4M3 codes, on this device. The sweep checks the kernel against the
/// CPU on drawn data; this covers every input the encoders can see.
#[test]
fn gpu_codec_fast_paths_match_the_literal_encoders_on_every_input() {
    let g = require_gpu!("gpu_codec_fast_paths_match_the_literal_encoders_on_every_input");
    let stream = g.context().new_stream().unwrap();
    let started = std::time::Instant::now();
    let r = g.codec_self_check(&stream).expect("codec self-check");
    eprintln!(
        "codec self-check on {}: {} inputs in {:.1} ms: {r:?}",
        g.arch(),
        r.inputs,
        started.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(r.inputs, 1u64 << 32, "not every input was checked");
    assert!(
        r.passed(),
        "fast codec paths differ from the literal encoders: {r:?}"
    );
}

/// The conversion self-test passes on this device (a failure here is a finding: the fast
/// conversions differ from SPEC.md's encoders on this GPU, driver or compiler), takes well
/// under a second once its kernels are compiled, and its verdict is on disk, so a second
/// process reads it instead of testing again.
#[test]
fn gpu_selftest_passes_and_is_cached() {
    let g = require_gpu!("gpu_selftest_passes_and_is_cached");
    let _no_capture_meanwhile = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    let path = g.conversion_path().expect("conversion path");
    let forced = std::env::var("FP4NORM_SELFTEST").is_ok_and(|v| v == "literal" || v == "hardware");
    if forced {
        skipped_because(
            "FP4NORM_SELFTEST forces the path",
            "gpu_selftest_passes_and_is_cached",
        );
        return;
    }
    assert!(
        path.fast,
        "the self-test failed on this device: {}",
        path.reason
    );
    assert_eq!(
        g.hardware_e2m1(),
        g.arch().ends_with('a'),
        "the target's E2M1 path is in use"
    );
    // Run again, timed (the kernels are compiled and cached by now).
    let started = std::time::Instant::now();
    let again = internal::run_selftest(g).expect("self-test run");
    eprintln!(
        "conversion self-test on {}: {:?} in {:.1} ms ({})",
        g.arch(),
        again,
        started.elapsed().as_secs_f64() * 1e3,
        path.reason
    );
    assert_eq!(again, None, "a second run of the self-test failed");
    match internal::selftest_verdict_file(g) {
        Some(f) => {
            let text = std::fs::read_to_string(&f)
                .unwrap_or_else(|e| panic!("verdict file {}: {e}", f.display()));
            assert!(text.starts_with("fast\n"), "{}: {text:?}", f.display());
        }
        None => skipped_because("FP4NORM_CACHE_DIR=off", "the cached verdict check"),
    }
}

/// The fallback path a device whose self-test failed takes (every code from the literal
/// SPEC.md encoders, `FP4_LITERAL_CODECS`), forced on this device: every edge case and an
/// eighth of each sweep, byte for byte against the CPU.
#[test]
fn gpu_literal_codecs_path() {
    require_gpu!("gpu_literal_codecs_path");
    let _no_capture_meanwhile = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    let g = internal::with_conversion_path(Gpu::new(0).expect("opening CUDA device 0"), false);
    assert!(!g.hardware_e2m1());
    let cases = sweep::literal_path_cases();
    for c in &cases {
        let cfg = internal::config(&g, &c.problem(c.dtype), c.gs_mode(), c.aligned());
        assert!(cfg.literal_codecs, "{c:?}: the literal encoders must run");
    }
    let refs: Vec<&Case> = cases.iter().collect();
    let failures = run_cases_on(&g, &refs, 0x117e);
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "literal path: {} cases, {} failed",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
