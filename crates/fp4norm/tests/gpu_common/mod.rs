//! What the GPU test files share: device 0 (or a visible skip), the run's seed, uploads of
//! host data and the first differing byte of two outputs.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::{CudaSlice, CudaStream};
use fp4norm::cuda::Gpu;

/// The byte every output buffer holds before a kernel runs: a byte it does not write shows.
pub const POISON: u8 = 0xAA;

/// Device 0, its conversion path settled (printed once); `None` without a CUDA device,
/// which `FP4NORM_REQUIRE_GPU=1` makes a failure.
pub fn gpu() -> Option<&'static Gpu> {
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
        let path = g
            .conversion_path()
            .expect("the conversion self-test")
            .clone();
        eprintln!(
            "GPU: {} ({}; conversions: {}, {})",
            g.name(),
            g.arch(),
            if path.fast { "fast" } else { "literal" },
            path.reason
        );
        Some(g)
    })
    .as_ref()
}

/// Says on the real stderr (the harness captures `eprintln!` of passing tests) that `what`
/// did not run for want of a GPU.
pub fn skipped(what: &str) {
    skipped_because("no CUDA device", what);
}

/// A visible skip for `why`: written to stderr itself, which the test harness does not
/// capture (it captures `eprintln!`), so that a skip shows without `--nocapture`.
pub fn skipped_because(why: &str, what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED ({why}): {what}");
}

/// The GPU, or a visible skip and return.
#[macro_export]
macro_rules! require_gpu {
    ($test:expr) => {
        match gpu_common::gpu() {
            Some(g) => g,
            None => {
                gpu_common::skipped($test);
                return;
            }
        }
    };
}

/// Fresh random data every run: the seed is printed, and `FP4NORM_SEED` replays it.
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let s = std::env::var("FP4NORM_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(7)
            });
        eprintln!("FP4NORM_SEED={s}");
        s
    })
}

/// `v` on the device (one zeroed element where `v` is empty: a valid pointer).
pub fn upload<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    v: &[T],
) -> CudaSlice<T> {
    if v.is_empty() {
        return stream.alloc_zeros::<T>(1).expect("alloc");
    }
    stream.clone_htod(v).expect("upload")
}

/// `Err` naming the first difference of `got` and `want` (row and column by `row_len`)
/// and how many differ.
pub fn first_diff<T: PartialEq + std::fmt::Debug>(
    name: &str,
    got: &[T],
    want: &[T],
    row_len: usize,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{name}: length {} vs {}", got.len(), want.len()));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        return Err(format!(
            "{name}: {n} differ; first at index {i} (row {}, col {}): gpu {:?} reference {:?}",
            i / row_len.max(1),
            i % row_len.max(1),
            got[i],
            want[i]
        ));
    }
    Ok(())
}

/// The GPU among a test binary's tests: they share it (`shared`), except a test whose
/// kernels wait for each other across grids (simulated ranks on streams), which needs
/// every CTA of its grids resident at once and so runs alone (`exclusive`): another test's
/// kernels taking the SMs could leave a rank's CTAs waiting for peers never scheduled.
static GPU_USE: RwLock<()> = RwLock::new(());

pub fn shared() -> RwLockReadGuard<'static, ()> {
    GPU_USE.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    GPU_USE.write().unwrap_or_else(|e| e.into_inner())
}

/// Aborts the test process, with a FAIL line naming `what`, unless the returned guard is
/// dropped within `secs`: a kernel whose CTAs wait for each other across grids hangs
/// rather than fails, and a hang is a failure.
pub fn watchdog(what: &'static str, secs: u64) -> Watchdog {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        if !seen.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("FAIL {what} did not finish in {secs} s (ranks waiting for each other)");
            std::process::abort();
        }
    });
    Watchdog(done)
}

/// See [`watchdog`].
pub struct Watchdog(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Words of each simulated rank's signal pad.
pub const PAD_WORDS: usize = 1 << 14;

/// W ranks of the peer-access all-reduce simulated on one GPU (SPEC.md §9): each rank's
/// buffer (filled with `poison`) and signal pad (zero), as `RawPeers` sees them.
pub struct SimRanks<T: cudarc::driver::DeviceRepr> {
    pub bufs: Vec<CudaSlice<T>>,
    pads: Vec<CudaSlice<u32>>,
    pub buf_ptrs: Vec<u64>,
    pad_ptrs: Vec<u64>,
    row_stride: usize,
    poison: T,
}

/// Both schedules of the peer-access all-reduce, each run by every peer test.
pub const STRATEGIES: [fp4norm::cuda::PeerStrategy; 2] = [
    fp4norm::cuda::PeerStrategy::OneShot,
    fp4norm::cuda::PeerStrategy::TwoShot,
];

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy> SimRanks<T> {
    pub fn new(main: &Arc<CudaStream>, ranks: usize, m: usize, h: usize, poison: T) -> Self {
        use cudarc::driver::DevicePtr;
        let bufs: Vec<CudaSlice<T>> = (0..ranks)
            .map(|_| upload(main, &vec![poison; m * h]))
            .collect();
        let pads: Vec<CudaSlice<u32>> = (0..ranks)
            .map(|_| upload(main, &vec![0u32; PAD_WORDS]))
            .collect();
        let buf_ptrs = bufs.iter().map(|b| b.device_ptr(main).0).collect();
        let pad_ptrs = pads.iter().map(|b| b.device_ptr(main).0).collect();
        SimRanks {
            bufs,
            pads,
            buf_ptrs,
            pad_ptrs,
            row_stride: h,
            poison,
        }
    }

    /// Every buffer poisoned again, so that a round that copies its inputs in shows a
    /// vector it did not copy (the last round left the same inputs there).
    pub fn repoison(&mut self, main: &Arc<CudaStream>) {
        for b in &mut self.bufs {
            let n = b.len();
            main.memcpy_htod(&vec![self.poison; n], b).unwrap();
        }
        main.synchronize().unwrap();
    }

    /// Each rank's input written into its buffer, as a producer of a zero-copy call does.
    pub fn fill(&mut self, main: &Arc<CudaStream>, inputs: &[Vec<T>]) {
        for (b, x) in self.bufs.iter_mut().zip(inputs) {
            main.memcpy_htod(x, b).unwrap();
        }
        main.synchronize().unwrap();
    }

    /// Every rank's call of round `round` under `strategy`: `launch(k, its stream, its
    /// peers)` for every rank, all before any is awaited (each waits for the others), then
    /// every stream awaited.
    pub fn run(
        &self,
        streams: &[Arc<CudaStream>],
        round: &str,
        strategy: fp4norm::cuda::PeerStrategy,
        mut launch: impl FnMut(
            usize,
            cudarc::driver::sys::CUstream,
            &fp4norm::cuda::RawPeers,
        ) -> Result<(), fp4norm::Error>,
    ) -> Result<(), String> {
        let n = self.bufs.len();
        for (k, s) in streams[..n].iter().enumerate() {
            let peers = fp4norm::cuda::RawPeers {
                buffers: &self.buf_ptrs,
                row_stride: self.row_stride,
                signal_pads: &self.pad_ptrs,
                signal_pad_words: PAD_WORDS,
                rank: k,
                strategy,
            };
            launch(k, s.cu_stream(), &peers)
                .map_err(|e| format!("{round}, rank {k}: launch failed: {e}"))?;
        }
        for (k, s) in streams[..n].iter().enumerate() {
            s.synchronize()
                .map_err(|e| format!("{round}, rank {k}: kernel failed: {e}"))?;
        }
        Ok(())
    }

    /// Rank `k`'s buffer after a call under `strategy`: its input (one-shot), or its
    /// input with the vectors it owns (`v mod W = k`) replaced by the ranks' sum (two-shot).
    pub fn check_buffer(
        &self,
        main: &Arc<CudaStream>,
        k: usize,
        inputs: &[Vec<T>],
        m: usize,
        h: usize,
        strategy: fp4norm::cuda::PeerStrategy,
    ) -> Result<(), String>
    where
        T: fp4norm::Element,
    {
        let mut want = inputs[k].clone();
        if strategy == fp4norm::cuda::PeerStrategy::TwoShot {
            let mats: Vec<fp4norm::MatRef<'_, T>> = inputs
                .iter()
                .map(|x| fp4norm::MatRef::new(x, m, h).unwrap())
                .collect();
            let sum = fp4norm::reference::allreduce_sum(&mats).unwrap();
            let w = inputs.len();
            for (i, v) in want.iter_mut().enumerate() {
                if (i % h) / 8 % w == k {
                    *v = sum[i];
                }
            }
        }
        let got: Vec<T> = main.clone_dtoh(&self.bufs[k]).unwrap();
        let bits = |v: &[T]| v.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
        first_diff(
            &format!("its buffer ({strategy:?})"),
            &bits(&got),
            &bits(&want),
            h,
        )
    }

    /// Rank `k`'s pad is all 0 again (the kernel takes back every signal it got).
    pub fn pad_at_zero(&self, main: &Arc<CudaStream>, k: usize) -> Result<(), String> {
        let got: Vec<u32> = main.clone_dtoh(&self.pads[k]).unwrap();
        match got.iter().position(|&w| w != 0) {
            Some(i) => Err(format!("signal word {i} left at {}", got[i])),
            None => Ok(()),
        }
    }
}

/// The checks of a `Gpu::prepare_*raw` entry against its launch, on a handle of the
/// test's own: `prepare` builds `kernels` kernels, `launch` (run, then synchronised by
/// the caller's closure) builds none more, and for a call the validator refuses,
/// `prepare_refused` and `launch_refused` give the same error and build nothing.
pub fn check_prepared(
    g: &Gpu,
    what: &str,
    kernels: usize,
    prepare: impl FnOnce() -> Result<(), fp4norm::Error>,
    launch: impl FnOnce() -> Result<(), fp4norm::Error>,
    prepare_refused: impl FnOnce() -> Result<(), fp4norm::Error>,
    launch_refused: impl FnOnce() -> Result<(), fp4norm::Error>,
) {
    let before = g.kernel_builds();
    prepare().unwrap();
    let built = g.kernel_builds();
    assert_eq!(built - before, kernels, "{what}: kernels prepared");
    launch().unwrap();
    assert_eq!(
        g.kernel_builds(),
        built,
        "{what}: the launch built nothing more"
    );
    let prepared = prepare_refused().unwrap_err().to_string();
    assert_eq!(
        prepared,
        launch_refused().unwrap_err().to_string(),
        "{what}"
    );
    assert_eq!(
        g.kernel_builds(),
        built,
        "{what}: a refused call builds nothing"
    );
    eprintln!("{what}: {kernels} kernel(s) ready before the launch");
}
