//! The all-reduce fused in front of the op (SPEC.md §9) on the GPU, W ranks simulated by W
//! input buffers on one device, against the host reference byte for byte: codes, scales in
//! every layout with their padding, the residual; outputs poisoned first.
//!
//! Without a CUDA device every test prints `SKIPPED (no CUDA device)` and passes; set
//! `FP4NORM_REQUIRE_GPU=1` (the device script does) to make a missing GPU a failure.
#![cfg(feature = "cuda")]

mod gpu_common;
mod sweep;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fp4norm::cuda::{Gpu, LaunchOptions, PeerStrategy, RawPeers};
use fp4norm::{
    bf16, f16, reference, DType, Element, Fp4Out, GlobalScale, MatMut, MatRef, Options, RawBuf,
    RawCall, RawGlobalScale, RawMat, ScaleFormat, ScaleLayout, ScaleOut,
};
use gpu_common::{first_diff, seed, upload, SimRanks, POISON, STRATEGIES};
use rand::{Rng, SeedableRng};
use sweep::allreduce::{allreduce_cases, peer_cases, ArCase};

const GS: f32 = 1.7;

/// The ranks' inputs: values of ±3 whose later ranks partly cancel the first (so the sum's
/// rounding order matters), and NaN, ±Inf in one rank's rows 1..4 where the case asks.
fn rank_inputs<T: Element>(c: &ArCase, rng: &mut rand::rngs::StdRng) -> Vec<Vec<T>> {
    let n = c.m * c.h;
    let first: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    let mut ranks: Vec<Vec<T>> = (0..c.ranks)
        .map(|k| {
            (0..n)
                .map(|i| {
                    let v = if k > 0 && i % 3 == 0 {
                        -first[i] / (c.ranks - 1) as f32 + rng.random_range(-1e-3f32..1e-3)
                    } else if k == 0 {
                        first[i]
                    } else {
                        rng.random_range(-3.0f32..3.0)
                    };
                    T::round_from_f32(v)
                })
                .collect()
        })
        .collect();
    if c.special {
        let k = c.ranks - 1;
        for (row, v) in [
            (1usize, f32::NAN),
            (2, f32::INFINITY),
            (3, f32::NEG_INFINITY),
        ] {
            if row < c.m {
                let col = rng.random_range(0..c.h);
                ranks[k][row * c.h + col] = T::round_from_f32(v);
            }
        }
    }
    ranks
}

/// A case's host data and the reference's bytes.
struct RefCase<T> {
    ranks: Vec<Vec<T>>,
    r: Vec<T>,
    w: Vec<T>,
    q: Vec<u8>,
    rm: Vec<u8>,
    sw: Vec<u8>,
    r_ref: Vec<T>,
}

fn reference_case<T: Element>(
    c: &ArCase,
    rng: &mut rand::rngs::StdRng,
) -> Result<RefCase<T>, String> {
    let (m, h) = (c.m, c.h);
    let p = c.problem();
    let ranks = rank_inputs::<T>(c, rng);
    let r: Vec<T> = (0..m * h)
        .map(|_| T::round_from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let w: Vec<T> = (0..h)
        .map(|_| T::round_from_f32(rng.random_range(-2.0f32..2.0)))
        .collect();
    let opts = Options::default().with_format(c.format);
    let mut r_ref = r.clone();
    let mut q = vec![0u8; p.fp4_len()];
    let mut rm = vec![0u8; p.row_major_scales_len()];
    let mut sw = vec![0u8; p.swizzled_scales_len()];
    let scales = match c.layout {
        ScaleLayout::RowMajor => ScaleOut::RowMajor(&mut rm[..]),
        ScaleLayout::Swizzled => ScaleOut::Swizzled(&mut sw[..]),
        ScaleLayout::Both => ScaleOut::Both {
            row_major: &mut rm[..],
            swizzled: &mut sw[..],
        },
    };
    let inputs: Vec<MatRef<'_, T>> = ranks
        .iter()
        .map(|x| MatRef::new(x, m, h).unwrap())
        .collect();
    reference::allreduce_add_rmsnorm_fp4quant(
        &inputs,
        MatMut::new(&mut r_ref, m, h).unwrap(),
        &w,
        Fp4Out {
            y_fp4: &mut q,
            scales,
            y_out: None,
        },
        GlobalScale::Uniform(if c.format.scale == ScaleFormat::E4M3 {
            GS
        } else {
            1.0
        }),
        &opts,
    )
    .map_err(|e| format!("reference: {e}"))?;
    Ok(RefCase {
        ranks,
        r,
        w,
        q,
        rm,
        sw,
        r_ref,
    })
}

fn run_case<T: Element + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    stream: &Arc<CudaStream>,
    c: &ArCase,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let (m, h) = (c.m, c.h);
    let p = c.problem();
    let opts = Options::default().with_format(c.format);
    let RefCase {
        ranks,
        r,
        w,
        q,
        rm,
        sw,
        r_ref,
    } = reference_case::<T>(c, rng)?;
    // The GPU, buffers poisoned; unaligned views one element in.
    let off = c.misaligned as usize;
    let pad = |v: &[T]| -> Vec<T> {
        let mut out = vec![T::from_bits(0x5555); off];
        out.extend_from_slice(v);
        out
    };
    let xs: Vec<CudaSlice<T>> = ranks.iter().map(|x| upload(stream, &pad(x))).collect();
    let r_d = upload(stream, &pad(&r));
    let w_d = upload(stream, &w);
    let gs_d = upload(stream, &[GS]);
    let q_d = upload(stream, &vec![POISON; q.len()]);
    let rm_d = upload(stream, &vec![POISON; rm.len()]);
    let sw_d = upload(stream, &vec![POISON; sw.len()]);
    let e = T::DTYPE.size() as u64;
    let mat = |s: &CudaSlice<T>| RawMat {
        ptr: s.device_ptr(stream).0 + off as u64 * e,
        rows: m,
        cols: h,
        row_stride: h,
        len: Some(m * h),
    };
    let bp = |s: &CudaSlice<u8>, n: usize| RawBuf::new(s.device_ptr(stream).0, n);
    let call = RawCall {
        dtype: T::DTYPE,
        x: mat(&xs[0]),
        residual: Some(mat(&r_d)),
        weight: RawBuf::new(w_d.device_ptr(stream).0, h),
        y_fp4: bp(&q_d, q.len()),
        scales: match c.layout {
            ScaleLayout::RowMajor => ScaleOut::RowMajor(bp(&rm_d, rm.len())),
            ScaleLayout::Swizzled => ScaleOut::Swizzled(bp(&sw_d, sw.len())),
            ScaleLayout::Both => ScaleOut::Both {
                row_major: bp(&rm_d, rm.len()),
                swizzled: bp(&sw_d, sw.len()),
            },
        },
        y_out: None,
        global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(stream).0, 1)),
        options: opts,
    };
    let others: Vec<RawMat> = xs[1..].iter().map(mat).collect();
    // SAFETY: every buffer is a live allocation of this device holding the extents given.
    unsafe {
        g.launch_allreduce_raw(
            stream.cu_stream(),
            &call,
            &others,
            &LaunchOptions::default(),
        )
    }
    .map_err(|e| format!("launch failed: {e}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("kernel failed: {e}"))?;
    first_diff("y_fp4", &stream.clone_dtoh(&q_d).unwrap(), &q, h / 2)?;
    if c.layout.has_row_major() {
        first_diff(
            "row-major scales",
            &stream.clone_dtoh(&rm_d).unwrap(),
            &rm,
            p.n_blocks(),
        )?;
    }
    if c.layout.has_swizzled() {
        first_diff(
            "swizzled scales",
            &stream.clone_dtoh(&sw_d).unwrap(),
            &sw,
            512,
        )?;
    }
    let bits = |v: &[T]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    let got_r: Vec<T> = stream.clone_dtoh(&r_d).unwrap();
    first_diff("residual", &bits(&got_r[off..]), &bits(&r_ref), h)?;
    for (k, (x, d)) in ranks.iter().zip(&xs).enumerate() {
        let got: Vec<T> = stream.clone_dtoh(d).unwrap();
        if bits(&got[off..]) != bits(x) {
            return Err(format!("rank {k}'s input was written"));
        }
    }
    Ok(())
}

#[test]
fn gpu_allreduce_simulated_ranks_match_the_reference() {
    let _gpu = gpu_common::shared();
    let g = require_gpu!("gpu_allreduce_simulated_ranks_match_the_reference");
    let stream = g.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0xa11);
    let cases = allreduce_cases();
    let mut failures = Vec::new();
    for c in &cases {
        let res = match c.dtype {
            DType::BF16 => run_case::<bf16>(g, &stream, c, &mut rng),
            DType::F16 => run_case::<f16>(g, &stream, c, &mut rng),
        };
        if let Err(e) = res {
            failures.push(format!("{c:?}: {e}"));
        }
    }
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "all-reduce: {} cases, {} failed",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Case `c` over peer access: W ranks as W grids on W streams of one GPU, each with its own
/// buffer, signal pad, residual and outputs (poisoned), reading the others' buffers. Round
/// 0 copies each rank's input into its buffer; round 1 passes the buffer as the input (no
/// copy), after round 0 left the pads at 0. Every rank's bytes against the reference.
fn run_peer_case<T: Element + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    main: &Arc<CudaStream>,
    streams: &[Arc<CudaStream>],
    c: &ArCase,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let (m, h, nr) = (c.m, c.h, c.ranks);
    let p = c.problem();
    let opts = Options::default().with_format(c.format);
    let rc = reference_case::<T>(c, rng)?;
    let off = c.misaligned as usize;
    let pad = |v: &[T]| -> Vec<T> {
        let mut out = vec![T::from_bits(0x5555); off];
        out.extend_from_slice(v);
        out
    };
    let e = T::DTYPE.size() as u64;
    let w_d = upload(main, &rc.w);
    let gs_d = upload(main, &[GS]);
    let xs: Vec<CudaSlice<T>> = rc.ranks.iter().map(|x| upload(main, &pad(x))).collect();
    let mut sim = SimRanks::new(main, nr, m, h, T::from_bits(0x5555));
    let bits = |v: &[T]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    for (strategy, zero_copy) in STRATEGIES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let round = format!(
            "{strategy:?}, {}",
            if zero_copy { "zero copy" } else { "copied in" }
        );
        if zero_copy {
            sim.fill(main, &rc.ranks);
        } else {
            sim.repoison(main);
        }
        let rs: Vec<CudaSlice<T>> = (0..nr).map(|_| upload(main, &pad(&rc.r))).collect();
        let qs: Vec<CudaSlice<u8>> = (0..nr)
            .map(|_| upload(main, &vec![POISON; rc.q.len()]))
            .collect();
        let rms: Vec<CudaSlice<u8>> = (0..nr)
            .map(|_| upload(main, &vec![POISON; rc.rm.len()]))
            .collect();
        let sws: Vec<CudaSlice<u8>> = (0..nr)
            .map(|_| upload(main, &vec![POISON; rc.sw.len()]))
            .collect();
        main.synchronize().map_err(|e| format!("uploads: {e}"))?;
        let mat = |ptr: u64| RawMat {
            ptr,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        };
        let bp = |s: &CudaSlice<u8>, n: usize| RawBuf::new(s.device_ptr(main).0, n);
        sim.run(streams, &round, strategy, |k, stream, peers| {
            let x = if zero_copy {
                mat(sim.buf_ptrs[k])
            } else {
                mat(xs[k].device_ptr(main).0 + off as u64 * e)
            };
            let call = RawCall {
                dtype: T::DTYPE,
                x,
                residual: Some(mat(rs[k].device_ptr(main).0 + off as u64 * e)),
                weight: RawBuf::new(w_d.device_ptr(main).0, h),
                y_fp4: bp(&qs[k], rc.q.len()),
                scales: match c.layout {
                    ScaleLayout::RowMajor => ScaleOut::RowMajor(bp(&rms[k], rc.rm.len())),
                    ScaleLayout::Swizzled => ScaleOut::Swizzled(bp(&sws[k], rc.sw.len())),
                    ScaleLayout::Both => ScaleOut::Both {
                        row_major: bp(&rms[k], rc.rm.len()),
                        swizzled: bp(&sws[k], rc.sw.len()),
                    },
                },
                y_out: None,
                global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(main).0, 1)),
                options: opts,
            };
            // SAFETY: every buffer is a live allocation of this device holding the
            // extents given, and every rank's call is made (the same case) before any
            // is awaited.
            unsafe { g.launch_allreduce_peer_raw(stream, &call, peers, &LaunchOptions::default()) }
        })?;
        for k in 0..nr {
            let at = |what: &str| format!("{round}, rank {k}: {what}");
            first_diff(
                &at("y_fp4"),
                &main.clone_dtoh(&qs[k]).unwrap(),
                &rc.q,
                h / 2,
            )?;
            if c.layout.has_row_major() {
                first_diff(
                    &at("row-major scales"),
                    &main.clone_dtoh(&rms[k]).unwrap(),
                    &rc.rm,
                    p.n_blocks(),
                )?;
            }
            if c.layout.has_swizzled() {
                first_diff(
                    &at("swizzled scales"),
                    &main.clone_dtoh(&sws[k]).unwrap(),
                    &rc.sw,
                    512,
                )?;
            }
            let got_r: Vec<T> = main.clone_dtoh(&rs[k]).unwrap();
            first_diff(&at("residual"), &bits(&got_r[off..]), &bits(&rc.r_ref), h)?;
            sim.check_buffer(main, k, &rc.ranks, m, h, strategy)
                .map_err(|e| at(&e))?;
            let got_x: Vec<T> = main.clone_dtoh(&xs[k]).unwrap();
            if bits(&got_x[off..]) != bits(&rc.ranks[k]) {
                return Err(at("its input was written"));
            }
            sim.pad_at_zero(main, k).map_err(|e| at(&e))?;
        }
    }
    Ok(())
}

#[test]
fn gpu_allreduce_peer_ranks_on_streams_match_the_reference() {
    let _gpu = gpu_common::exclusive();
    let g = require_gpu!("gpu_allreduce_peer_ranks_on_streams_match_the_reference");
    // A rank whose peers never arrive waits forever: the watchdog makes that a failure.
    let _watch = gpu_common::watchdog("the peer-access cases", 120);
    let main = g.context().new_stream().unwrap();
    let streams: Vec<Arc<CudaStream>> = (0..8).map(|_| g.context().new_stream().unwrap()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x9ee7);
    let cases = peer_cases();
    let mut failures = Vec::new();
    for c in &cases {
        let res = match c.dtype {
            DType::BF16 => run_peer_case::<bf16>(g, &main, &streams, c, &mut rng),
            DType::F16 => run_peer_case::<f16>(g, &main, &streams, c, &mut rng),
        };
        if let Err(e) = res {
            failures.push(format!("{c:?}: {e}"));
        }
    }
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "all-reduce over peer access: {} cases (both strategies, copied in and zero copy), {} failed",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gpu_allreduce_peer_refuses_bad_ranks_before_writing() {
    let _gpu = gpu_common::shared();
    let g = require_gpu!("gpu_allreduce_peer_refuses_bad_ranks_before_writing");
    let stream = g.context().new_stream().unwrap();
    let (m, h) = (4usize, 64usize);
    let x0 = upload(&stream, &vec![bf16::ONE; m * h]);
    let b0 = upload(&stream, &vec![bf16::ONE; m * h]);
    let b1 = upload(&stream, &vec![bf16::ONE; m * h]);
    let r_d = upload(&stream, &vec![bf16::ONE; m * h]);
    let w_d = upload(&stream, &vec![bf16::ONE; h]);
    let q_d = upload(&stream, &vec![POISON; m * h / 2]);
    let rm_d = upload(&stream, &vec![POISON; m * h / 16]);
    let s0 = upload(&stream, &vec![0u32; 64]);
    let s1 = upload(&stream, &vec![0u32; 64]);
    let ptr = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
    let mat = |p: u64| RawMat {
        ptr: p,
        rows: m,
        cols: h,
        row_stride: h,
        len: Some(m * h),
    };
    let call = RawCall {
        dtype: DType::BF16,
        x: mat(ptr(&x0)),
        residual: Some(mat(ptr(&r_d))),
        weight: RawBuf::new(w_d.device_ptr(&stream).0, h),
        y_fp4: RawBuf::new(q_d.device_ptr(&stream).0, m * h / 2),
        scales: ScaleOut::RowMajor(RawBuf::new(rm_d.device_ptr(&stream).0, m * h / 16)),
        y_out: None,
        global_scale: RawGlobalScale::None,
        options: Options::nvfp4(),
    };
    let bufs = [ptr(&b0), ptr(&b1)];
    let sigs = [s0.device_ptr(&stream).0, s1.device_ptr(&stream).0];
    let peers = RawPeers {
        buffers: &bufs,
        row_stride: h,
        signal_pads: &sigs,
        signal_pad_words: 64,
        rank: 0,
        strategy: PeerStrategy::OneShot,
    };
    let nine = [bufs[0]; 9];
    let nine_pads = [sigs[0]; 9];
    let r_as_own = [ptr(&r_d), bufs[1]];
    let bad: [(&str, RawPeers, RawCall); 7] = [
        (
            "nine ranks",
            RawPeers {
                buffers: &nine,
                signal_pads: &nine_pads,
                ..peers
            },
            call,
        ),
        (
            "a pad missing",
            RawPeers {
                signal_pads: &sigs[..1],
                ..peers
            },
            call,
        ),
        ("rank 2 of 2", RawPeers { rank: 2, ..peers }, call),
        (
            "rows shorter than H",
            RawPeers {
                row_stride: h - 8,
                ..peers
            },
            call,
        ),
        (
            "pads too small",
            RawPeers {
                signal_pad_words: 1,
                ..peers
            },
            call,
        ),
        (
            "its buffer is the residual",
            RawPeers {
                buffers: &r_as_own,
                ..peers
            },
            call,
        ),
        (
            "no residual",
            peers,
            RawCall {
                residual: None,
                ..call
            },
        ),
    ];
    for (what, peers, call) in bad {
        // SAFETY: live allocations; every case is refused before anything is launched.
        let res = unsafe {
            g.launch_allreduce_peer_raw(
                stream.cu_stream(),
                &call,
                &peers,
                &LaunchOptions::default(),
            )
        };
        assert!(res.is_err(), "{what}: accepted");
        eprintln!("{what}: {}", res.unwrap_err());
    }
    stream.synchronize().unwrap();
    assert!(stream
        .clone_dtoh(&q_d)
        .unwrap()
        .iter()
        .all(|&b| b == POISON));
    assert!(stream
        .clone_dtoh(&rm_d)
        .unwrap()
        .iter()
        .all(|&b| b == POISON));
    let r: Vec<bf16> = stream.clone_dtoh(&r_d).unwrap();
    assert!(
        r.iter().all(|&v| v == bf16::ONE),
        "the residual was written"
    );
    // More rows than SMs: refused (the ranks' grids could not all be resident).
    let many = g.sm_count() as usize + 1;
    let x_m = upload(&stream, &vec![bf16::ONE; many * h]);
    let r_m = upload(&stream, &vec![bf16::ONE; many * h]);
    let b_m = [
        upload(&stream, &vec![bf16::ONE; many * h]),
        upload(&stream, &vec![bf16::ONE; many * h]),
    ];
    let q_m = upload(&stream, &vec![POISON; many * h / 2]);
    let rm_m = upload(&stream, &vec![POISON; many * h / 16]);
    let mat_m = |p: u64| RawMat {
        ptr: p,
        rows: many,
        cols: h,
        row_stride: h,
        len: Some(many * h),
    };
    let call_m = RawCall {
        x: mat_m(ptr(&x_m)),
        residual: Some(mat_m(ptr(&r_m))),
        y_fp4: RawBuf::new(q_m.device_ptr(&stream).0, many * h / 2),
        scales: ScaleOut::RowMajor(RawBuf::new(rm_m.device_ptr(&stream).0, many * h / 16)),
        ..call
    };
    let bufs_m = [ptr(&b_m[0]), ptr(&b_m[1])];
    let big_pads = [s0.device_ptr(&stream).0, s1.device_ptr(&stream).0];
    let peers_m = RawPeers {
        buffers: &bufs_m,
        signal_pads: &big_pads,
        ..peers
    };
    // SAFETY: live allocations; refused before anything is launched.
    let res = unsafe {
        g.launch_allreduce_peer_raw(
            stream.cu_stream(),
            &call_m,
            &peers_m,
            &LaunchOptions::default(),
        )
    };
    let e = res.expect_err("more rows than SMs: accepted");
    assert!(e.to_string().contains("one per SM"), "{e}");
    eprintln!("{many} rows: {e}");
    assert!(stream
        .clone_dtoh(&q_m)
        .unwrap()
        .iter()
        .all(|&b| b == POISON));
}

#[test]
fn gpu_allreduce_refuses_bad_rank_inputs_before_writing() {
    let _gpu = gpu_common::shared();
    let g = require_gpu!("gpu_allreduce_refuses_bad_rank_inputs_before_writing");
    let stream = g.context().new_stream().unwrap();
    let (m, h) = (4usize, 64usize);
    let x0 = upload(&stream, &vec![bf16::ONE; m * h]);
    let x1 = upload(&stream, &vec![bf16::ONE; m * h]);
    let r_d = upload(&stream, &vec![bf16::ONE; m * h]);
    let w_d = upload(&stream, &vec![bf16::ONE; h]);
    let q_d = upload(&stream, &vec![POISON; m * h / 2]);
    let rm_d = upload(&stream, &vec![POISON; m * h / 16]);
    let mat = |s: &CudaSlice<bf16>, rows| RawMat {
        ptr: s.device_ptr(&stream).0,
        rows,
        cols: h,
        row_stride: h,
        len: Some(m * h),
    };
    let call = RawCall {
        dtype: DType::BF16,
        x: mat(&x0, m),
        residual: Some(mat(&r_d, m)),
        weight: RawBuf::new(w_d.device_ptr(&stream).0, h),
        y_fp4: RawBuf::new(q_d.device_ptr(&stream).0, m * h / 2),
        scales: ScaleOut::RowMajor(RawBuf::new(rm_d.device_ptr(&stream).0, m * h / 16)),
        y_out: None,
        global_scale: RawGlobalScale::None,
        options: Options::nvfp4(),
    };
    let bad: [(&str, Vec<RawMat>, RawCall); 4] = [
        ("a rank of another shape", vec![mat(&x1, m - 1)], call),
        ("nine ranks", vec![mat(&x1, m); 8], call),
        ("a rank aliasing the residual", vec![mat(&r_d, m)], call),
        (
            "no residual",
            vec![mat(&x1, m)],
            RawCall {
                residual: None,
                ..call
            },
        ),
    ];
    for (what, others, c) in bad {
        // SAFETY: live allocations of this device.
        let r = unsafe {
            g.launch_allreduce_raw(stream.cu_stream(), &c, &others, &LaunchOptions::default())
        };
        assert!(r.is_err(), "{what}: accepted");
        stream.synchronize().unwrap();
        let got: Vec<u8> = stream.clone_dtoh(&q_d).unwrap();
        assert!(got.iter().all(|&b| b == POISON), "{what}: bytes written");
    }
}
