//! The tensor-parallel handle over NCCL (`fp4norm::cuda::nccl`, SPEC.md §9) against the
//! host reference byte for byte, outputs poisoned first: every transport (the all-gather,
//! peer access one-shot and two-shot, auto) for the FP4 and FP8 ops. One rank on device 0
//! runs wherever there is a GPU and NCCL; one thread per GPU (real NCCL ranks, peer access
//! between the GPUs) runs where there are several.
//!
//! Without a CUDA device or NCCL the tests print `SKIPPED (...)` and pass; set
//! `FP4NORM_REQUIRE_GPU=1` and `FP4NORM_REQUIRE_NCCL=1` to make those failures.
#![cfg(feature = "cuda")]

mod gpu_common;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fp4norm::cuda::nccl::{nccl_version, NcclRanks, Transport, UniqueId};
use fp4norm::cuda::{Gpu, LaunchOptions, PeerStrategy};
use fp4norm::fp8::RawFp8Call;
use fp4norm::{
    bf16, reference, DType, Element, Fp4Format, Fp4Out, Fp8Options, Fp8Problem, Fp8Scales,
    GlobalScale, MatMut, MatRef, Options, Problem, RawBuf, RawCall, RawGlobalScale, RawMat,
    ScaleLayout, ScaleOut,
};
use gpu_common::{first_diff, seed, upload, POISON};
use rand::{Rng, SeedableRng};

const GS: f32 = 1.3;

/// NCCL's version, or a visible skip (a failure with `FP4NORM_REQUIRE_NCCL=1`).
fn require_nccl(test: &str) -> bool {
    match nccl_version() {
        Ok(v) => {
            eprintln!("NCCL {v}");
            true
        }
        Err(e) => {
            let require = std::env::var_os("FP4NORM_REQUIRE_NCCL").is_some_and(|v| v != "0");
            assert!(
                !require,
                "FP4NORM_REQUIRE_NCCL is set but NCCL is missing: {e}"
            );
            gpu_common::skipped_because(&format!("no NCCL: {e}"), test);
            false
        }
    }
}

/// Two-shot first: each case's first peer call finds the last case's data in the
/// buffers, and one-shot then finds two-shot's sums in part of them, so a copy-in that
/// went missing would show.
const TRANSPORTS: [Transport; 4] = [
    Transport::Peer(PeerStrategy::TwoShot),
    Transport::Gather,
    Transport::Peer(PeerStrategy::OneShot),
    Transport::Auto,
];

/// A case: rows, H, an FP8 op (else NVFP4 swizzled), strided input rows.
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    h: usize,
    fp8: bool,
    strided: bool,
}

const CASES: [Case; 6] = [
    Case {
        m: 1,
        h: 4096,
        fp8: false,
        strided: false,
    },
    Case {
        m: 16,
        h: 7168,
        fp8: false,
        strided: true,
    },
    Case {
        m: 128,
        h: 8192,
        fp8: false,
        strided: false,
    },
    Case {
        m: 5,
        h: 2048,
        fp8: true,
        strided: false,
    },
    Case {
        m: 64,
        h: 4096,
        fp8: true,
        strided: true,
    },
    // More rows than SMs: the all-gather (auto), peer access refused before any write.
    Case {
        m: 300,
        h: 1024,
        fp8: false,
        strided: false,
    },
];

fn fp8_options() -> Fp8Options {
    Fp8Options::mxfp8()
}

/// The host data of a case over `world` ranks and every rank's expected bytes (the same
/// on every rank: one residual): (inputs, residual, weight, codes, scales, residual after).
struct Host {
    xs: Vec<Vec<bf16>>,
    r: Vec<bf16>,
    w: Vec<bf16>,
    q: Vec<u8>,
    s: Vec<u8>,
    r_ref: Vec<bf16>,
}

fn host(c: Case, world: usize, rng: &mut rand::rngs::StdRng) -> Host {
    let n = c.m * c.h;
    let xs: Vec<Vec<bf16>> = (0..world)
        .map(|_| {
            (0..n)
                .map(|_| bf16::round_from_f32(rng.random_range(-3.0f32..3.0)))
                .collect()
        })
        .collect();
    let r: Vec<bf16> = (0..n)
        .map(|_| bf16::round_from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    let w: Vec<bf16> = (0..c.h)
        .map(|_| bf16::round_from_f32(rng.random_range(-2.0f32..2.0)))
        .collect();
    let inputs: Vec<MatRef<'_, bf16>> = xs
        .iter()
        .map(|x| MatRef::new(x, c.m, c.h).unwrap())
        .collect();
    let mut r_ref = r.clone();
    let (q, s) = if c.fp8 {
        let p = Fp8Problem::new(c.m, c.h, DType::BF16, &fp8_options()).unwrap();
        let mut q = vec![0u8; p.q_len()];
        let mut s = vec![0u8; p.scales_len()];
        fp4norm::fp8::reference::allreduce_add_rmsnorm_fp8quant(
            &inputs,
            MatMut::new(&mut r_ref, c.m, c.h).unwrap(),
            &w,
            fp4norm::Fp8Out {
                q: &mut q,
                scales: Fp8Scales::UE8M0(&mut s),
                y_out: None,
            },
            &fp8_options(),
        )
        .unwrap();
        (q, s)
    } else {
        let opts = Options::default().with_format(Fp4Format::NVFP4);
        let p = Problem::new(c.m, c.h, DType::BF16, ScaleLayout::Swizzled, &opts).unwrap();
        let mut q = vec![0u8; p.fp4_len()];
        let mut s = vec![0u8; p.swizzled_scales_len()];
        reference::allreduce_add_rmsnorm_fp4quant(
            &inputs,
            MatMut::new(&mut r_ref, c.m, c.h).unwrap(),
            &w,
            Fp4Out {
                y_fp4: &mut q,
                scales: ScaleOut::Swizzled(&mut s),
                y_out: None,
            },
            GlobalScale::Uniform(GS),
            &opts,
        )
        .unwrap();
        (q, s)
    };
    Host {
        xs,
        r,
        w,
        q,
        s,
        r_ref,
    }
}

/// Rank `k`'s call of case `c` under transport `t` on its GPU: inputs uploaded (strided
/// where the case says), outputs poisoned; the bytes against `hc`. A refusal comes back as
/// `Ok(Err(message))` after checking that nothing was written.
fn run_rank(
    g: &Gpu,
    ranks: &mut NcclRanks,
    stream: &Arc<CudaStream>,
    c: Case,
    t: Transport,
    hc: &Host,
) -> Result<Result<Transport, String>, String> {
    let k = ranks.rank();
    let (m, h) = (c.m, c.h);
    let stride = if c.strided { h + 64 } else { h };
    let mut xpad = vec![bf16::from_bits(0x5555); m * stride];
    for i in 0..m {
        xpad[i * stride..i * stride + h].copy_from_slice(&hc.xs[k][i * h..(i + 1) * h]);
    }
    let x_d = upload(stream, &xpad);
    let r_d = upload(stream, &hc.r);
    let w_d = upload(stream, &hc.w);
    let q_d: CudaSlice<u8> = upload(stream, &vec![POISON; hc.q.len()]);
    let s_d: CudaSlice<u8> = upload(stream, &vec![POISON; hc.s.len()]);
    let gs_d = upload(stream, &[GS]);
    stream.synchronize().unwrap();
    let ptr = |p: u64| p;
    let x = RawMat {
        ptr: ptr(x_d.device_ptr(stream).0),
        rows: m,
        cols: h,
        row_stride: stride,
        len: Some(m * stride),
    };
    let r = RawMat {
        ptr: r_d.device_ptr(stream).0,
        rows: m,
        cols: h,
        row_stride: h,
        len: Some(m * h),
    };
    let weight = RawBuf::new(w_d.device_ptr(stream).0, h);
    let q = RawBuf::new(q_d.device_ptr(stream).0, hc.q.len());
    let s = RawBuf::new(s_d.device_ptr(stream).0, hc.s.len());
    let res = if c.fp8 {
        let call = RawFp8Call {
            dtype: DType::BF16,
            x,
            residual: Some(r),
            weight,
            q,
            scales: Some(s),
            static_scale: None,
            y_out: None,
            options: fp8_options(),
        };
        // SAFETY: live allocations of this GPU holding the extents given; every rank
        // makes the same call.
        unsafe {
            ranks.allreduce_add_rmsnorm_fp8quant_raw(
                g,
                stream.cu_stream(),
                &call,
                t,
                &LaunchOptions::default(),
            )
        }
    } else {
        let call = RawCall {
            dtype: DType::BF16,
            x,
            residual: Some(r),
            weight,
            y_fp4: q,
            scales: ScaleOut::Swizzled(s),
            y_out: None,
            global_scale: RawGlobalScale::Uniform(RawBuf::new(gs_d.device_ptr(stream).0, 1)),
            options: Options::default().with_format(Fp4Format::NVFP4),
        };
        // SAFETY: as above.
        unsafe {
            ranks.allreduce_add_rmsnorm_fp4quant_raw(
                g,
                stream.cu_stream(),
                &call,
                t,
                &LaunchOptions::default(),
            )
        }
    };
    stream
        .synchronize()
        .map_err(|e| format!("kernel failed: {e}"))?;
    let got_q: Vec<u8> = stream.clone_dtoh(&q_d).unwrap();
    let got_s: Vec<u8> = stream.clone_dtoh(&s_d).unwrap();
    let got_r: Vec<bf16> = stream.clone_dtoh(&r_d).unwrap();
    let bits = |v: &[bf16]| v.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    match res {
        Err(e) => {
            if got_q.iter().any(|&b| b != POISON)
                || got_s.iter().any(|&b| b != POISON)
                || bits(&got_r) != bits(&hc.r)
            {
                return Err(format!("refused ({e}) after writing"));
            }
            Ok(Err(e.to_string()))
        }
        Ok(taken) => {
            first_diff("codes", &got_q, &hc.q, if c.fp8 { h } else { h / 2 })?;
            first_diff("scales", &got_s, &hc.s, 64)?;
            first_diff("residual", &bits(&got_r), &bits(&hc.r_ref), h)?;
            Ok(Ok(taken))
        }
    }
}

/// What a case under a transport must do: the bytes, or a refusal (explicit peer access
/// with more rows than SMs), and auto's choice.
fn expect(g: &Gpu, c: Case, t: Transport, got: &Result<Transport, String>) -> Result<(), String> {
    let too_many = c.m > g.sm_count() as usize;
    match (t, got) {
        (Transport::Peer(_), Err(e)) if too_many && e.contains("one per SM") => Ok(()),
        (_, Err(e)) => Err(format!("refused: {e}")),
        (Transport::Auto, Ok(Transport::Gather)) if too_many => Ok(()),
        (Transport::Auto, Ok(Transport::Peer(_))) if !too_many => Ok(()),
        (Transport::Auto, Ok(other)) => Err(format!("auto took {other:?}")),
        (_, Ok(taken)) if *taken == t => Ok(()),
        (_, Ok(taken)) => Err(format!("took {taken:?}")),
    }
}

#[test]
fn gpu_nccl_one_rank_every_transport_matches_the_reference() {
    let _gpu = gpu_common::exclusive();
    let g = require_gpu!("gpu_nccl_one_rank_every_transport_matches_the_reference");
    if !require_nccl("gpu_nccl_one_rank_every_transport_matches_the_reference") {
        return;
    }
    let _watch = gpu_common::watchdog("the one-rank NCCL cases", 120);
    let id = UniqueId::new().expect("ncclGetUniqueId");
    let mut ranks = NcclRanks::new(g, &id, 0, 1).expect("a one-rank communicator");
    let stream = g.context().new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x9cc1);
    let mut failures = Vec::new();
    let mut runs = 0;
    for c in CASES {
        let hc = host(c, 1, &mut rng);
        for t in TRANSPORTS {
            runs += 1;
            let res = run_rank(g, &mut ranks, &stream, c, t, &hc)
                .and_then(|got| expect(g, c, t, &got).map(|()| got));
            match res {
                Ok(got) => eprintln!("{c:?}, {t:?}: {got:?}"),
                Err(e) => failures.push(format!("{c:?}, {t:?}: {e}")),
            }
        }
    }
    assert_eq!(
        ranks.peers_mapped(),
        Some(true),
        "one rank maps its own workspace"
    );
    report(&format!("NCCL, one rank: {runs} calls"), &failures);
}

/// Every failure, then the summary, then the assertion.
fn report(summary: &str, failures: &[String]) {
    for f in failures {
        eprintln!("FAIL {f}");
    }
    eprintln!("{summary}, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How many ranks one per GPU this machine runs (its GPUs, up to 8), or None after saying
/// why the test skips: fewer than two GPUs, or no NCCL.
fn ranks_one_per_gpu(test: &str) -> Option<usize> {
    let n = fp4norm::cuda::device_count().min(8);
    if n < 2 {
        gpu_common::skipped_because(
            &format!("{n} CUDA device: ranks one per GPU need 2 or more"),
            test,
        );
        return None;
    }
    require_nccl(test).then_some(n)
}

/// One thread per GPU (up to 8), each a real NCCL rank on its own device: every rank's
/// bytes under every transport equal the reference over all ranks' inputs.
#[test]
fn gpu_nccl_one_thread_per_gpu_every_transport_matches_the_reference() {
    let _gpu = gpu_common::exclusive();
    let test = "gpu_nccl_one_thread_per_gpu_every_transport_matches_the_reference";
    let _g = require_gpu!(test);
    let Some(n) = ranks_one_per_gpu(test) else {
        return;
    };
    let _watch = gpu_common::watchdog("the NCCL ranks, one per GPU", 300);
    let id = UniqueId::new().expect("ncclGetUniqueId");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed() ^ 0x9cc2);
    let hosts: Arc<Vec<Host>> = Arc::new(CASES.iter().map(|&c| host(c, n, &mut rng)).collect());
    let workers: Vec<_> = (0..n)
        .map(|k| {
            let hosts = hosts.clone();
            std::thread::spawn(move || rank_of(k, n, &id, &hosts).1)
        })
        .collect();
    let failures: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a rank panicked"))
        .collect();
    report(&format!("NCCL, {n} ranks one thread per GPU"), &failures);
}

/// One process per GPU (up to 8), the deployment engines run: the test binary starts
/// itself once per rank (`FP4NORM_NCCL_CHILD` tells a child its rank, the world, the
/// communicator's id and the seed), and every child checks its bytes under every
/// transport; peers of other processes are mapped through CUDA IPC handles.
#[test]
fn gpu_nccl_one_process_per_gpu_every_transport_matches_the_reference() {
    let test = "gpu_nccl_one_process_per_gpu_every_transport_matches_the_reference";
    if let Ok(spec) = std::env::var("FP4NORM_NCCL_CHILD") {
        let (calls, failures) = child_rank(&spec);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        // The parent looks for this line: a child whose filter ran no test has none.
        println!("{CHILD_DONE} {calls} calls");
        return;
    }
    let _gpu = gpu_common::exclusive();
    let _g = require_gpu!(test);
    let Some(n) = ranks_one_per_gpu(test) else {
        return;
    };
    let id = UniqueId::new().expect("ncclGetUniqueId");
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().expect("the test binary");
    let children: Vec<_> = (0..n)
        .map(|k| {
            std::process::Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env("FP4NORM_NCCL_CHILD", format!("{k},{n},{hex},{}", seed()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starting a rank")
        })
        .collect();
    let _watch = gpu_common::watchdog("the NCCL ranks, one process per GPU", 300);
    let mut failed = Vec::new();
    for (k, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("a rank's output");
        if !String::from_utf8_lossy(&out.stdout).contains(CHILD_DONE) {
            failed.push(format!(
                "rank {k} ({}) did not run its calls:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        } else if !out.status.success() {
            failed.push(format!(
                "rank {k} ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    report(&format!("NCCL, {n} ranks one process per GPU"), &failed);
}

/// What a child of the one-process-per-GPU test prints once its calls ran.
const CHILD_DONE: &str = "fp4norm NCCL child: done,";

/// A child of the one-process-per-GPU test: its rank's calls, the failures.
fn child_rank(spec: &str) -> (usize, Vec<String>) {
    let f: Vec<&str> = spec.split(',').collect();
    let (k, n): (usize, usize) = (f[0].parse().unwrap(), f[1].parse().unwrap());
    let bytes: Vec<u8> = (0..128)
        .map(|i| u8::from_str_radix(&f[2][2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let id = UniqueId::from_bytes(bytes.try_into().unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(f[3].parse::<u64>().unwrap() ^ 0x9cc3);
    let hosts: Vec<Host> = CASES.iter().map(|&c| host(c, n, &mut rng)).collect();
    rank_of(k, n, &id, &hosts)
}

/// Rank `k` of `n` on GPU `k`: joins the communicator, then every case under every
/// transport. Returns the calls made and the failures.
fn rank_of(k: usize, n: usize, id: &UniqueId, hosts: &[Host]) -> (usize, Vec<String>) {
    let g = Gpu::new(k).expect("opening the rank's GPU");
    let mut ranks = NcclRanks::new(&g, id, k, n).expect("joining the communicator");
    let stream = g.context().new_stream().unwrap();
    let (mut failures, mut calls) = (Vec::new(), 0);
    for (c, hc) in CASES.iter().zip(hosts) {
        for t in TRANSPORTS {
            calls += 1;
            let res = run_rank(&g, &mut ranks, &stream, *c, t, hc)
                .and_then(|got| expect(&g, *c, t, &got));
            if let Err(e) = res {
                failures.push(format!("rank {k}, {c:?}, {t:?}: {e}"));
            }
        }
    }
    (calls, failures)
}
