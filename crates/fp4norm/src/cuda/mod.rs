//! The CUDA backend: the same bytes as [`crate::reference`] on NVIDIA GPUs (sm_80 and
//! newer; tuned for Hopper sm_90 and Blackwell sm_100+).
//!
//! * Kernels are CUDA C++ (`src/cuda/kernel/cu/`: a shared header and one file per
//!   kernel) compiled at run time by NVRTC for the device's exact architecture, one
//!   specialisation per configuration, cached in the process and on disk (in
//!   `FP4NORM_CACHE_DIR`, else `$XDG_CACHE_HOME/fp4norm`, else `~/.cache/fp4norm`;
//!   `FP4NORM_CACHE_DIR=off` disables it). No CUDA toolkit is needed to build; at run time
//!   the driver and NVRTC are loaded dynamically.
//! * A call does no host synchronisation, allocation or host read of device memory: it
//!   can be captured in a CUDA graph. The global scale is read by the kernel from device
//!   memory. Compile the specialisation before capture with [`Gpu::prepare`] (or make one
//!   eager call) — compiling is not a stream operation.
//! * [`Gpu::add_rmsnorm_fp4quant`] works on cudarc device memory; [`Gpu::launch_raw`]
//!   takes raw device pointers and a raw stream, for PyTorch or C++ engines.

#[doc(hidden)]
pub mod internal;
mod kernel;
mod knobs;
mod limits;
pub mod nccl;
mod nvrtc;
mod raw;
mod selftest;
mod tuned;

use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DeviceRepr, SyncOnDrop,
};

/// The cudarc this backend is built on: the safe GPU API takes its streams and device
/// buffers, so callers use these types without a cudarc dependency of their own to keep in
/// step.
pub use cudarc;
pub use kernel::GsMode;
use kernel::KernelConfig;
pub use limits::DeviceLimits;
pub use raw::{LaunchOptions, PeerStrategy, RawPeers, TWO_SHOT_MIN_SAVED_BYTES};
pub use selftest::ConversionPath;
pub use tuned::{ShapeClass, TunedRow, TunedTable};

/// A CUDA stream handle of the driver API (`CUstream`, the same as the runtime's
/// `cudaStream_t`), as the raw entry points take it.
pub type RawStream = sys::CUstream;

use crate::raw::{RawBuf, RawCall, RawDequant, RawGlobalScale, RawMat};
use crate::{Element, Error, Options, ScaleOut};

fn driver_err(context: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        context,
        message: e.to_string(),
    }
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only probes for the library.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices (0 when there is no driver).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// The NVRTC target for a compute capability, and whether it has the hardware E2M1
/// conversion (`cvt.rn.satfinite.e2m1x2.f32`, only on the arch-specific `a` targets of
/// Blackwell-class chips). Everything else uses the software encoder.
pub fn arch_for(major: i32, minor: i32) -> (String, bool) {
    match (major, minor) {
        (10, 0) | (10, 3) | (11, 0) | (12, 0) | (12, 1) => (format!("sm_{major}{minor}a"), true),
        _ => (format!("sm_{major}{minor}"), false),
    }
}

/// What [`Gpu::codec_self_check`] found. `*_first`: the lowest failing f32 bit pattern
/// (for E2M1, the first of its group of eight) or E4M3 code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive] // new fast paths bring new counters
pub struct CodecSelfCheck {
    /// f32 bit patterns checked (2^32 when the whole space was covered).
    pub inputs: u64,
    /// Groups of eight values whose fast E2M1 codes differ from the literal encoder's.
    pub e2m1_mismatches: u64,
    /// First input of the lowest such group.
    pub e2m1_first: Option<u32>,
    /// Inputs whose fast E4M3 code differs from the literal encoder's, or whose block
    /// scale code (the division by 6 without a division routine, then the fast encoder)
    /// differs from `E4M3(RN32(x / 6))`.
    pub e4m3_encode_mismatches: u64,
    /// The lowest such input.
    pub e4m3_encode_first: Option<u32>,
    /// E4M3 codes whose fast decode differs from the literal decoder's.
    pub e4m3_decode_mismatches: u64,
    /// The lowest such code.
    pub e4m3_decode_first: Option<u32>,
    /// Block maxima (every f32 from +0 up, and NaN) whose UE8M0 scale code, computed
    /// without a division, differs from the literal `RN32(amax / 6)` rounded up to a power
    /// of two.
    pub ue8m0_code_mismatches: u64,
    /// The lowest such input.
    pub ue8m0_code_first: Option<u32>,
    /// Inputs whose FP8 element codes (E4M3 or E5M2, the hardware pair conversions with
    /// the NaN fix-up) differ from the literal encoders' (SPEC.md §8).
    pub fp8_encode_mismatches: u64,
    /// The lowest such input.
    pub fp8_encode_first: Option<u32>,
    /// Group maxima (every f32 from +0 up, and NaN) whose FP8 UE8M0 scale code, computed
    /// without a division, differs from the literal `RN32(amax / D)` rounded up to a power
    /// of two, for D = 448 (E4M3) or 57344 (E5M2).
    pub fp8_ue8m0_code_mismatches: u64,
    /// The lowest such input.
    pub fp8_ue8m0_code_first: Option<u32>,
    /// Inputs of `[2^-120, 2^120]` whose rsqrt seed (the fused kernel's first step to a
    /// row's rstd) is farther than [`crate::sumsq::RSTD_SEED_MAX_REL_ERROR`] from
    /// `1/sqrt(x)`, the error that kernel's decision margin allows.
    pub rsqrt_seed_mismatches: u64,
    /// The lowest such input.
    pub rsqrt_seed_first: Option<u32>,
}

impl CodecSelfCheck {
    /// Whether every input was checked and none differed.
    pub fn passed(&self) -> bool {
        self.inputs == 1u64 << 32
            && self.e2m1_mismatches == 0
            && self.e4m3_encode_mismatches == 0
            && self.e4m3_decode_mismatches == 0
            && self.ue8m0_code_mismatches == 0
            && self.fp8_encode_mismatches == 0
            && self.fp8_ue8m0_code_mismatches == 0
            && self.rsqrt_seed_mismatches == 0
    }
}

/// One GPU: its context (the primary context, shared with PyTorch and other users of the
/// runtime API), its architecture and its compiled kernels.
///
/// `Gpu` is `Send + Sync`: one handle (in an `Arc`) serves every thread, and calls from
/// several threads at once are safe — each launches on the stream it is given, kernels are
/// compiled once per configuration under a lock, and its settings are atomics.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    arch: String,
    hw_e2m1: bool,
    /// What the device allows a launch; the launch shapes are derived from it.
    limits: DeviceLimits,
    kernels: kernel::KernelCache,
    pdl: std::sync::atomic::AtomicBool,
    hw_canonical_nan: bool,
    /// Programmatic dependent launch (sm_90+).
    pdl_capable: bool,
    /// The launch shape forced by `FP4NORM_TUNE_SHAPE` (read by `Gpu::new`) or by
    /// `with_launch_shape` / `set_launch_shape`, where it fits (0: none; see `pack_shape`).
    tune_shape: std::sync::atomic::AtomicU64,
    /// The launch shapes `fp4norm tune` measured on this device, if it wrote a table.
    tuned: Option<TunedTable>,
    /// Why the table `fp4norm tune` wrote for this device is not in use, where it is not
    /// readable or does not parse.
    tuned_refused: Option<String>,
    /// The conversions the kernels use, settled by the self-test before the first kernel
    /// that depends on them (see [`Gpu::conversion_path`]).
    conversions: std::sync::OnceLock<ConversionPath>,
}

// The promise of `Gpu`'s documentation, checked at compile time.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Gpu>();
};

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .finish()
    }
}

/// A launch shape in one word (0: none), so that a shared `Gpu` can change it atomically.
fn pack_shape(shape: Option<(u32, u32, u32)>) -> u64 {
    shape.map_or(0, |(g, r, c)| {
        1 << 63 | (g as u64 & 0xFFFFF) << 40 | (r as u64 & 0xFFFFF) << 20 | (c as u64 & 0xFFFFF)
    })
}

fn unpack_shape(v: u64) -> Option<(u32, u32, u32)> {
    (v >> 63 == 1).then_some((
        (v >> 40 & 0xFFFFF) as u32,
        (v >> 20 & 0xFFFFF) as u32,
        (v & 0xFFFFF) as u32,
    ))
}

impl Gpu {
    /// Opens device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        if !driver_present() {
            return Err(Error::CudaUnavailable(
                "libcuda.so (the NVIDIA driver) was not found".into(),
            ));
        }
        let n = device_count();
        if ordinal >= n {
            return Err(Error::CudaUnavailable(format!(
                "device {ordinal} requested but {n} CUDA device(s) present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("opening the device"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("reading the compute capability"))?;
        if major < 8 {
            return Err(Error::Unsupported(format!(
                "compute capability {major}.{minor}: fp4norm needs sm_80 or newer"
            )));
        }
        let (mut arch, mut hw_e2m1) = arch_for(major, minor);
        if knobs::software_e2m1() {
            arch = format!("sm_{major}{minor}");
            hw_e2m1 = false;
        }
        let limits = DeviceLimits::of(&ctx)?;
        Ok(Gpu {
            ctx,
            arch,
            hw_e2m1,
            limits,
            kernels: Default::default(),
            pdl: Default::default(),
            // sm_90's packed add/cvt return 0x7FFF for NaN: checked on an H200 by the
            // GPU tests' NaN cases with the fix-up compiled out. Other targets keep the
            // fix-up until seen (FP4NORM_ASSUME_HW_CANONICAL_NAN=1/0 overrides, for checks).
            hw_canonical_nan: knobs::assume_hw_canonical_nan().unwrap_or((major, minor) == (9, 0)),
            pdl_capable: major >= 9,
            tune_shape: std::sync::atomic::AtomicU64::new(pack_shape(knobs::tune_shape())),
            tuned: None,
            tuned_refused: None,
            conversions: std::sync::OnceLock::new(),
        }
        .with_tuned_table())
    }

    /// Reads the table `fp4norm tune` wrote for this device, if any; one that cannot be
    /// read or parsed is refused whole, with a warning once per process.
    fn with_tuned_table(mut self) -> Self {
        match tuned::load(&self) {
            Ok(t) => self.tuned = t,
            Err(e) => {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("fp4norm: {e}; the built-in launch table runs");
                }
                self.tuned_refused = Some(e.to_string());
            }
        }
        self
    }

    /// The launch shapes `fp4norm tune` measured on this device and this `Gpu` uses before
    /// the built-in table's (`FP4NORM_TUNED=off` ignores them), if there are any.
    pub fn tuned_table(&self) -> Option<&TunedTable> {
        self.tuned.as_ref()
    }

    /// Why the table `fp4norm tune` wrote for this device is not in use, where the file is
    /// there but cannot be read or does not parse (the built-in table runs instead).
    pub fn tuned_table_refused(&self) -> Option<&str> {
        self.tuned_refused.as_deref()
    }

    /// Which conversions this device's kernels use: the fast ones (hardware instructions,
    /// division-free block scales) where the conversion self-test passed on this device,
    /// driver and compiler, else the literal SPEC.md encoders (same bytes). The first call
    /// per process and device reads the cached verdict or runs the test (well under a
    /// second on an H200, plus the compile of a few kernels the first time); the kernel
    /// entry points call it before their first launch. See `FP4NORM_SELFTEST` in
    /// docs/gpu.md to force a path.
    pub fn conversion_path(&self) -> Result<&ConversionPath, Error> {
        if let Some(p) = self.conversions.get() {
            return Ok(p);
        }
        // The test runs on a second handle of the same device whose path is preset to the
        // fast one: the path under test, without recursing into this method.
        let probe = internal::with_conversion_path(Gpu::new(self.ordinal())?, true);
        let path = selftest::conversion_path(&probe)?;
        Ok(self.conversions.get_or_init(|| path))
    }

    /// Settles the conversion path before a launch on `stream`. The self-test allocates,
    /// opens a stream and synchronises, which a CUDA graph capture forbids: during a
    /// capture only a verdict already known (this process's, the disk cache's or
    /// `FP4NORM_SELFTEST`'s) settles it, and until one does the launches use the literal
    /// encoders (correct bytes, slower; a warning says so once).
    pub(crate) fn settle_conversions(&self, stream: sys::CUstream) -> Result<(), Error> {
        if self.conversions.get().is_some() {
            return Ok(());
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `stream` is the caller's live stream handle; one out-pointer.
        let r = unsafe { sys::cuStreamIsCapturing(stream, &mut status) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Cuda {
                context: "asking whether the stream is capturing",
                message: format!("{r:?}"),
            });
        }
        if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return self.conversion_path().map(|_| ());
        }
        match selftest::known_path(self) {
            Some(path) => {
                let _ = self.conversions.set(path);
            }
            None => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "fp4norm: the first launch on {} is inside a CUDA graph capture, where \
                         the conversion self-test cannot run: the captured kernels use the \
                         literal encoders (same bytes, slower). Make one call, or \
                         Gpu::prepare, before capturing.",
                        self.name()
                    )
                });
            }
        }
        Ok(())
    }

    /// Whether kernels are compiled with the literal encoders: until the self-test has
    /// passed on this device (or `FP4NORM_SELFTEST=hardware`), they are.
    fn literal_codecs(&self) -> bool {
        self.conversions.get().is_none_or(|p| !p.fast)
    }

    /// Forces the launch shape (threads per row, rows per CTA, CTAs per row) of every fused
    /// call on this `Gpu` where it fits the problem (elsewhere the launch table's shape
    /// runs), as the measurement knob `FP4NORM_TUNE_SHAPE=G,R,C` does; `None` restores the
    /// table. For measuring launch-shape tables, and for testing at small sizes the shapes
    /// the table picks only for large calls: the bytes written never depend on the shape.
    pub(crate) fn with_launch_shape(self, shape: Option<(u32, u32, u32)>) -> Self {
        self.set_launch_shape(shape);
        self
    }

    /// As [`Gpu::with_launch_shape`], on a shared `Gpu` (for `fp4norm tune`, which times
    /// candidate shapes in turn); calls already enqueued keep their shape.
    pub(crate) fn set_launch_shape(&self, shape: Option<(u32, u32, u32)>) {
        self.tune_shape
            .store(pack_shape(shape), std::sync::atomic::Ordering::Relaxed);
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    /// The NVRTC target used for this device (e.g. `sm_90`, `sm_100a`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Whether kernels use the hardware E2M1 conversion (the target has it and the
    /// literal encoders are not in use).
    pub fn hardware_e2m1(&self) -> bool {
        self.hw_e2m1 && !self.literal_codecs()
    }

    /// Multiprocessors on the device.
    pub fn sm_count(&self) -> u32 {
        self.limits.sm_count
    }

    /// What the device allows a launch (read from its attributes when it was opened).
    pub fn limits(&self) -> &DeviceLimits {
        &self.limits
    }

    /// Launch kernels with programmatic dependent launch (sm_90+): a call may start while
    /// the previous kernel on its stream finishes, and waits (`griddepcontrol.wait`)
    /// only before reading its inputs. Off by default.
    pub fn set_programmatic_dependent_launch(&self, enabled: bool) {
        self.pdl.store(
            enabled
                && self
                    .ctx
                    .compute_capability()
                    .is_ok_and(|(major, _)| major >= 9),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether a call launches with programmatic dependent launch: `request` where given
    /// (honoured on sm_90+ only), else this GPU's setting.
    pub(crate) fn pdl_for(&self, request: Option<bool>) -> bool {
        match request {
            Some(on) => on && self.pdl_capable,
            None => self.pdl.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Specialisations requested so far.
    pub fn kernels_loaded(&self) -> usize {
        self.kernels.len()
    }

    /// Specialisations built (compiled or read from the disk cache) and loaded so far:
    /// each once, however many threads asked for it at the same time.
    pub fn kernel_builds(&self) -> usize {
        self.kernels.builds()
    }

    /// The kernel specialisation a call with these parameters uses on this device.
    pub(crate) fn config(
        &self,
        problem: &crate::Problem,
        gs: GsMode,
        aligned: bool,
    ) -> KernelConfig {
        self.config_with(problem, gs, aligned, true)
    }

    /// [`Gpu::config`]; without `measured_shapes`, the built-in launch table's shape even
    /// where a tuned table or a forced shape says otherwise (the peer-access all-reduce:
    /// every rank must launch the same grid, and tables and knobs are per process).
    pub(crate) fn config_with(
        &self,
        problem: &crate::Problem,
        gs: GsMode,
        aligned: bool,
        measured_shapes: bool,
    ) -> KernelConfig {
        let mut cfg = KernelConfig::fused(problem, gs, aligned, self.hw_e2m1, &self.limits);
        cfg.hw_canonical_nan = self.hw_canonical_nan;
        if self.literal_codecs() {
            cfg.literal_codecs = true;
            cfg.hw_e2m1 = false;
            cfg.hw_canonical_nan = false;
        }
        cfg.force_exact_sumsq = knobs::force_exact_sumsq();
        if !measured_shapes {
            return cfg;
        }
        self.measured_launch_shape(&mut cfg, problem.dtype, problem.m);
        cfg
    }

    /// `cfg`'s launch shape for a call of `m` rows of `dtype`: the one forced by
    /// FP4NORM_TUNE_SHAPE or `with_launch_shape`, where valid; else the tuned table's for
    /// its class (candidate shapes only: `tuned::candidates_only`), where it has one that
    /// fits; else the built-in one it has.
    fn measured_launch_shape(&self, cfg: &mut KernelConfig, dtype: crate::DType, m: usize) {
        let forced = unpack_shape(self.tune_shape.load(std::sync::atomic::Ordering::Relaxed));
        if forced.is_none() {
            if let Some(shape) = self
                .tuned
                .as_ref()
                .and_then(|t| t.lookup(cfg.shape_class(), dtype, cfg.h, m))
            {
                cfg.try_launch_shape(shape, &self.limits);
            }
        }
        self.force_launch_shape(cfg, forced);
    }

    /// The launch shape forced by FP4NORM_TUNE_SHAPE or `with_launch_shape` (`forced`),
    /// where it fits `cfg`; a warning, once per process, where it does not.
    fn force_launch_shape(&self, cfg: &mut KernelConfig, forced: Option<(u32, u32, u32)>) {
        if let Some(shape) = forced {
            if !cfg.try_launch_shape(shape, &self.limits) {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "fp4norm: FP4NORM_TUNE_SHAPE {shape:?} does not fit H={} (block {}); the default shape runs",
                        cfg.h, cfg.block
                    );
                }
            }
        }
    }

    /// The kernel specialisation an FP8 call uses on this device (`scale_in_memory`: a
    /// per-tensor scale read from device memory).
    pub(crate) fn fp8_config(
        &self,
        problem: &crate::fp8::Fp8Problem,
        scale_in_memory: bool,
        aligned: bool,
    ) -> KernelConfig {
        self.fp8_config_with(problem, scale_in_memory, aligned, true)
    }

    /// [`Gpu::fp8_config`]; without `measured_shapes`, the built-in shape (as in
    /// [`Gpu::config_with`]).
    pub(crate) fn fp8_config_with(
        &self,
        problem: &crate::fp8::Fp8Problem,
        scale_in_memory: bool,
        aligned: bool,
        measured_shapes: bool,
    ) -> KernelConfig {
        let mut cfg = KernelConfig::fp8(problem, scale_in_memory, aligned, &self.limits);
        // The split column-major write's second kernel waits for the first in
        // griddepcontrol.wait: only where PDL overlaps its launch.
        if let Some(f) = cfg.fp8.as_mut() {
            f.split_scales &= self.pdl_capable;
        }
        cfg.hw_canonical_nan = self.hw_canonical_nan;
        if self.literal_codecs() {
            cfg.literal_codecs = true;
            cfg.hw_canonical_nan = false;
        }
        cfg.force_exact_sumsq = knobs::force_exact_sumsq();
        if !measured_shapes {
            return cfg;
        }
        self.measured_launch_shape(&mut cfg, problem.dtype, problem.m);
        cfg
    }

    /// Compiles and loads the kernel an FP8 call with these parameters will use, so that
    /// the call itself can be captured in a CUDA graph.
    pub fn prepare_fp8(
        &self,
        problem: &crate::fp8::Fp8Problem,
        scale_in_memory: bool,
        aligned: bool,
    ) -> Result<(), Error> {
        self.conversion_path()?;
        self.load_kernels(&self.fp8_config(problem, scale_in_memory, aligned))
    }

    /// Compiles and loads the kernels a call with these parameters will use, so that the
    /// call itself can be captured in a CUDA graph.
    pub fn prepare(
        &self,
        problem: &crate::Problem,
        gs: GsMode,
        aligned: bool,
    ) -> Result<(), Error> {
        self.conversion_path()?;
        self.load_kernels(&self.config(problem, gs, aligned))
    }

    /// Compiles and loads the kernel of `cfg` and of its second pass, if any. The
    /// conversion path must be settled first: the configuration depends on it.
    pub(crate) fn load_kernels(&self, cfg: &KernelConfig) -> Result<(), Error> {
        self.kernels.get(&self.ctx, &self.arch, cfg)?;
        if let Some(pass) = cfg.second_pass() {
            self.kernels.get(&self.ctx, &self.arch, &pass)?;
        }
        Ok(())
    }

    /// Compiles and loads the kernels that [`Gpu::launch_raw`] launches for `call`, so
    /// that a later launch finds them ready (a CUDA graph capture, say). Only the host-side
    /// checks run: nothing is read or written, so the addresses need not be live yet, only
    /// laid out (alignment, strides) as the launch's will be. Errors as the launch's
    /// validator gives them.
    pub fn prepare_raw(&self, call: &RawCall) -> Result<(), Error> {
        raw::prepare_fused(self, call)
    }

    /// [`Gpu::prepare_raw`] for [`Gpu::launch_fp8_raw`]'s calls.
    pub fn prepare_fp8_raw(&self, call: &crate::fp8::RawFp8Call) -> Result<(), Error> {
        raw::prepare_fused_fp8(self, call)
    }

    /// Residual add + RMSNorm + FP4 quantisation (SPEC.md §1) on `stream`, over raw device
    /// pointers. Checks every argument (shapes, alignment, overlap, device) before
    /// launching; enqueues the kernel (two, for a split swizzled write of many rows) and
    /// returns without synchronising.
    ///
    /// # Safety
    /// Every pointer must be valid device memory of this GPU (or null where optional)
    /// holding at least the bytes the call's shape implies, and stay valid until the
    /// kernel has run; `stream` must be a live stream of this device's context.
    pub unsafe fn launch_raw(&self, stream: sys::CUstream, call: &RawCall) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_fused(self, stream, call, &LaunchOptions::default()) }
    }

    /// [`Gpu::launch_raw`] with per-call launch options.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw`]; with `opts.devices_checked`, the caller has also made
    /// sure that every buffer is memory of this GPU.
    pub unsafe fn launch_raw_with(
        &self,
        stream: sys::CUstream,
        call: &RawCall,
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_fused(self, stream, call, opts) }
    }

    /// The all-reduce fused in front of the op (SPEC.md §9) over inputs on this GPU: the
    /// ranks' inputs are `call.x` (rank 0) and `other_ranks` (ranks 1, 2, ..., each of
    /// `call.x`'s shape and row stride), summed in rank order with one f32 rounding per
    /// addition and one rounding to the dtype, then the op with `call`'s residual (required),
    /// weight and outputs, in one kernel. With the ranks' inputs gathered onto each GPU (an
    /// all-gather), every rank writes identical bytes. 1 to 8 ranks.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`], for every rank's input too.
    pub unsafe fn launch_allreduce_raw(
        &self,
        stream: sys::CUstream,
        call: &RawCall,
        other_ranks: &[crate::RawMat],
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe {
            raw::launch_fused_with_ranks(
                self,
                stream,
                call,
                raw::Ranks::Gathered(other_ranks),
                opts,
            )
        }
    }

    /// The all-reduce fused in front of the op (SPEC.md §9) over peer access: `call.x` is
    /// this rank's input, `peers` every rank's buffer and signal pad as mapped on this GPU
    /// (symmetric memory). Every rank makes the same call with its own `peers.rank`; the
    /// ranks' CTAs meet through the pads (no host synchronisation, CUDA-graph safe: the
    /// pads are 0 again after each call), sum the ranks' rows in rank order and run the op
    /// with this rank's residual (required), weight and outputs: with the same residual on
    /// every rank, every rank writes identical bytes. 1 to 8 ranks; the pads need
    /// [`RawPeers::signal_words_needed`] words for the call's CTAs (the error says how many).
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`]; every buffer and pad of `peers` must be mapped on
    /// this GPU and hold the call's rows, and every rank must make the matching call on its
    /// GPU (otherwise the CTAs wait for each other forever).
    pub unsafe fn launch_allreduce_peer_raw(
        &self,
        stream: sys::CUstream,
        call: &RawCall,
        peers: &RawPeers,
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_fused_with_ranks(self, stream, call, raw::Ranks::Peers(peers), opts) }
    }

    /// [`Gpu::launch_allreduce_peer_raw`] in front of the FP8 op (SPEC.md §9, then §8).
    ///
    /// # Safety
    /// As for [`Gpu::launch_allreduce_peer_raw`].
    pub unsafe fn launch_fp8_allreduce_peer_raw(
        &self,
        stream: sys::CUstream,
        call: &crate::fp8::RawFp8Call,
        peers: &RawPeers,
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_fused_fp8(self, stream, call, raw::Ranks::Peers(peers), opts) }
    }

    /// Residual add + RMSNorm + FP8 quantisation (SPEC.md §8) on `stream`, over raw device
    /// pointers: the FP8 sibling of [`Gpu::launch_raw_with`]. Checks every argument
    /// ([`crate::fp8::RawFp8Call::validate`] and the device checks) before launching;
    /// enqueues one kernel and returns without synchronising. A per-tensor scale given by
    /// address is read by the kernel (graph-safe).
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`].
    pub unsafe fn launch_fp8_raw(
        &self,
        stream: sys::CUstream,
        call: &crate::fp8::RawFp8Call,
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_fused_fp8(self, stream, call, raw::Ranks::Gathered(&[]), opts) }
    }

    /// The all-reduce fused in front of the FP8 op (SPEC.md §9, then §8), as
    /// [`Gpu::launch_allreduce_raw`] is in front of the FP4 op: `call.x` (rank 0) and
    /// `other_ranks` summed in rank order, then the op with `call`'s residual (required),
    /// weight and outputs, in one kernel. 1 to 8 ranks.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`], for every rank's input too.
    pub unsafe fn launch_fp8_allreduce_raw(
        &self,
        stream: sys::CUstream,
        call: &crate::fp8::RawFp8Call,
        other_ranks: &[crate::RawMat],
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe {
            raw::launch_fused_fp8(self, stream, call, raw::Ranks::Gathered(other_ranks), opts)
        }
    }

    /// Dequantisation (SPEC.md §4) over raw device pointers.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw`].
    pub unsafe fn dequantize_raw(
        &self,
        stream: sys::CUstream,
        call: &RawDequant,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_dequant(self, stream, call, &LaunchOptions::default()) }
    }

    /// [`Gpu::dequantize_raw`] with per-call launch options.
    ///
    /// # Safety
    /// As for [`Gpu::launch_raw_with`].
    pub unsafe fn dequantize_raw_with(
        &self,
        stream: sys::CUstream,
        call: &RawDequant,
        opts: &LaunchOptions,
    ) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { raw::launch_dequant(self, stream, call, opts) }
    }

    /// Copies `bytes` (a multiple of 16, both pointers 16-byte aligned) with a plain SM
    /// copy kernel on `stream`: the bandwidth yardstick of the benchmarks (SPEC.md §6).
    ///
    /// # Safety
    /// `src` and `dst` must be valid, non-overlapping device allocations of this GPU of at
    /// least `bytes` bytes.
    pub unsafe fn copy_raw(
        &self,
        stream: sys::CUstream,
        src: u64,
        dst: u64,
        bytes: usize,
    ) -> Result<(), Error> {
        raw::launch_copy(self, stream, src, dst, bytes)
    }

    /// Runs the fused kernel's fast codec paths (the FPU-rounding E2M1 encoder, the
    /// hardware E4M3 conversions, the block scales' division by 6 and UE8M0 code, and the
    /// FP8 groups' UE8M0 code, without division routines) against the literal SPEC.md
    /// encoders on every f32 input and every E4M3 code, and its rsqrt seed against the
    /// error its rstd decision allows, on this device; synchronises
    /// `stream`. A check for tests and `fp4norm verify`, not for inference: well under a
    /// second on an H200, the kernel's load or compilation included.
    pub fn codec_self_check(&self, stream: &Arc<CudaStream>) -> Result<CodecSelfCheck, Error> {
        self.check_stream(stream)?;
        let r = raw::run_codec_check(self, stream)?;
        let first = |v: u32| (v != u32::MAX).then_some(v);
        Ok(CodecSelfCheck {
            inputs: r[6] as u64 * 8,
            e2m1_mismatches: r[0] as u64,
            e2m1_first: first(r[1]),
            e4m3_encode_mismatches: r[2] as u64,
            e4m3_encode_first: first(r[3]),
            e4m3_decode_mismatches: r[4] as u64,
            e4m3_decode_first: first(r[5]),
            ue8m0_code_mismatches: r[7] as u64,
            ue8m0_code_first: first(r[8]),
            fp8_encode_mismatches: r[9] as u64,
            fp8_encode_first: first(r[10]),
            fp8_ue8m0_code_mismatches: r[11] as u64,
            fp8_ue8m0_code_first: first(r[12]),
            rsqrt_seed_mismatches: r[13] as u64,
            rsqrt_seed_first: first(r[14]),
        })
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<(), Error> {
        if stream.context().ordinal() != self.ordinal() {
            return Err(Error::DeviceMismatch {
                name: "stream",
                expected: format!("cuda:{}", self.ordinal()),
                got: format!("cuda:{}", stream.context().ordinal()),
            });
        }
        Ok(())
    }

    /// Residual add + RMSNorm + FP4 quantisation on cudarc device memory, enqueued on
    /// `stream`. Same contract as [`crate::cpu::add_rmsnorm_fp4quant`]; the bytes are
    /// identical.
    #[allow(clippy::too_many_arguments)] // the op's tensors, as in FlashInfer's signature
    pub fn add_rmsnorm_fp4quant<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        input: DevMat<'_, T>,
        residual: DevMatMut<'_, T>,
        weight: &CudaView<'_, T>,
        out: DevFp4Out<'_, T>,
        global_scale: DevGlobalScale<'_>,
        opts: &Options,
    ) -> Result<(), Error> {
        self.run_safe(
            stream,
            input,
            Some(residual),
            weight,
            out,
            global_scale,
            opts,
        )
    }

    /// RMSNorm + FP4 quantisation without a residual, on cudarc device memory.
    pub fn rmsnorm_fp4quant<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        input: DevMat<'_, T>,
        weight: &CudaView<'_, T>,
        out: DevFp4Out<'_, T>,
        global_scale: DevGlobalScale<'_>,
        opts: &Options,
    ) -> Result<(), Error> {
        self.run_safe(stream, input, None, weight, out, global_scale, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_safe<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: DevMat<'_, T>,
        mut residual: Option<DevMatMut<'_, T>>,
        w: &CudaView<'_, T>,
        mut out: DevFp4Out<'_, T>,
        gs: DevGlobalScale<'_>,
        opts: &Options,
    ) -> Result<(), Error> {
        self.check_stream(stream)?;
        let mut uses = Uses::new(stream);
        let x_raw = uses.mat(&x);
        let residual_raw = residual.as_mut().map(|r| uses.mat_mut(r));
        let weight = uses.view(w);
        let y_fp4 = uses.view_mut(&mut out.y_fp4);
        let y_out = out.y_out.as_mut().map(|y| uses.mat_mut(y));
        let scales = match &mut out.scales {
            ScaleOut::RowMajor(r) => ScaleOut::RowMajor(uses.view_mut(r)),
            ScaleOut::Swizzled(s) => ScaleOut::Swizzled(uses.view_mut(s)),
            ScaleOut::Both {
                row_major,
                swizzled,
            } => ScaleOut::Both {
                row_major: uses.view_mut(row_major),
                swizzled: uses.view_mut(swizzled),
            },
        };
        let global_scale = uses.global_scale(&gs);
        let call = RawCall {
            dtype: T::DTYPE,
            x: x_raw,
            residual: residual_raw,
            weight,
            y_fp4,
            scales,
            y_out,
            global_scale,
            options: *opts,
        };
        // SAFETY: every pointer comes from a live cudarc allocation whose length is passed
        // along and checked; the views borrow them until after the launch.
        let result = unsafe {
            raw::launch_fused(self, stream.cu_stream(), &call, &LaunchOptions::default())
        };
        drop(uses);
        result
    }

    /// Residual add + RMSNorm + FP8 quantisation (SPEC.md §8) on cudarc device memory,
    /// enqueued on `stream`. Same contract as [`crate::fp8::cpu::add_rmsnorm_fp8quant`];
    /// the bytes are identical. `static_scale`, for a per-tensor scale, is one f32 in
    /// device memory that the kernel reads when it runs (a captured CUDA graph sees new
    /// values on replay); `None` takes the scale in `opts`.
    #[allow(clippy::too_many_arguments)] // the op's tensors, as in FlashInfer's signature
    pub fn add_rmsnorm_fp8quant<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        input: DevMat<'_, T>,
        residual: DevMatMut<'_, T>,
        weight: &CudaView<'_, T>,
        out: DevFp8Out<'_, T>,
        static_scale: Option<&CudaView<'_, f32>>,
        opts: &crate::fp8::Fp8Options,
    ) -> Result<(), Error> {
        self.run_fp8_safe(
            stream,
            input,
            Some(residual),
            weight,
            out,
            static_scale,
            opts,
        )
    }

    /// RMSNorm + FP8 quantisation without a residual, on cudarc device memory.
    pub fn rmsnorm_fp8quant<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        input: DevMat<'_, T>,
        weight: &CudaView<'_, T>,
        out: DevFp8Out<'_, T>,
        static_scale: Option<&CudaView<'_, f32>>,
        opts: &crate::fp8::Fp8Options,
    ) -> Result<(), Error> {
        self.run_fp8_safe(stream, input, None, weight, out, static_scale, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_fp8_safe<T: Element + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: DevMat<'_, T>,
        mut residual: Option<DevMatMut<'_, T>>,
        w: &CudaView<'_, T>,
        mut out: DevFp8Out<'_, T>,
        static_scale: Option<&CudaView<'_, f32>>,
        opts: &crate::fp8::Fp8Options,
    ) -> Result<(), Error> {
        self.check_stream(stream)?;
        // The raw call carries no buffer kinds: the scales' kind is checked here, as the
        // host API's validator does, so f32 scales never receive UE8M0 codes.
        let p = crate::fp8::Fp8Problem::new(x.rows, x.cols, T::DTYPE, opts)?;
        let expected = DevFp8Scales::kind_for(p.scale_format());
        let got = out.scales.kind();
        if got != expected {
            return Err(Error::Fp8ScaleKind { expected, got });
        }
        let mut uses = Uses::new(stream);
        let call = crate::fp8::RawFp8Call {
            dtype: T::DTYPE,
            x: uses.mat(&x),
            residual: residual.as_mut().map(|r| uses.mat_mut(r)),
            weight: uses.view(w),
            q: uses.view_mut(&mut out.q),
            scales: match &mut out.scales {
                DevFp8Scales::None => None,
                DevFp8Scales::F32(s) => Some(uses.view_mut(s)),
                DevFp8Scales::UE8M0(s) => Some(uses.view_mut(s)),
            },
            static_scale: static_scale.map(|v| uses.view(v)),
            y_out: out.y_out.as_mut().map(|y| uses.mat_mut(y)),
            options: *opts,
        };
        // SAFETY: every pointer comes from a live cudarc allocation whose length is passed
        // along and checked; the views borrow them until after the launch.
        let result = unsafe {
            raw::launch_fused_fp8(
                self,
                stream.cu_stream(),
                &call,
                raw::Ranks::Gathered(&[]),
                &LaunchOptions::default(),
            )
        };
        drop(uses);
        result
    }

    /// Dequantisation of packed FP4 and its scales (SPEC.md §4) to f32, on cudarc device
    /// memory, enqueued on `stream`: the bytes of [`crate::dequantize`].
    #[allow(clippy::too_many_arguments)] // the host function's arguments and the stream
    pub fn dequantize(
        &self,
        stream: &CudaStream,
        m: usize,
        h: usize,
        format: crate::Fp4Format,
        y_fp4: &CudaView<'_, u8>,
        scales: DevScaleIn<'_>,
        global_scale: DevGlobalScale<'_>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), Error> {
        self.check_stream(stream)?;
        let mut uses = Uses::new(stream);
        let call = RawDequant {
            m,
            h,
            format,
            y_fp4: uses.view(y_fp4),
            scales: match &scales {
                DevScaleIn::RowMajor(v) => ScaleOut::RowMajor(uses.view(v)),
                DevScaleIn::Swizzled(v) => ScaleOut::Swizzled(uses.view(v)),
            },
            global_scale: uses.global_scale(&global_scale),
            out: uses.view_mut(out),
        };
        // SAFETY: as in `run_safe`.
        let result = unsafe {
            raw::launch_dequant(self, stream.cu_stream(), &call, &LaunchOptions::default())
        };
        drop(uses);
        result
    }
}

/// The raw descriptions of the safe API's device views, and cudarc's guards that record
/// each buffer's use on the stream when dropped (after the launch).
struct Uses<'g> {
    stream: &'g CudaStream,
    guards: Vec<SyncOnDrop<'g>>,
}

impl<'g> Uses<'g> {
    fn new(stream: &'g CudaStream) -> Self {
        Uses {
            stream,
            guards: Vec::new(),
        }
    }

    fn view<T>(&mut self, v: &'g CudaView<'_, T>) -> RawBuf {
        let (ptr, guard) = v.device_ptr(self.stream);
        self.guards.push(guard);
        RawBuf::new(ptr, v.len())
    }

    fn view_mut<T>(&mut self, v: &'g mut CudaViewMut<'_, T>) -> RawBuf {
        let len = v.len();
        let (ptr, guard) = v.device_ptr_mut(self.stream);
        self.guards.push(guard);
        RawBuf::new(ptr, len)
    }

    fn mat<T>(&mut self, m: &'g DevMat<'_, T>) -> RawMat {
        let b = self.view(&m.view);
        RawMat {
            ptr: b.ptr,
            rows: m.rows,
            cols: m.cols,
            row_stride: m.row_stride,
            len: b.len,
        }
    }

    fn mat_mut<T>(&mut self, m: &'g mut DevMatMut<'_, T>) -> RawMat {
        let b = self.view_mut(&mut m.view);
        RawMat {
            ptr: b.ptr,
            rows: m.rows,
            cols: m.cols,
            row_stride: m.row_stride,
            len: b.len,
        }
    }

    fn global_scale(&mut self, gs: &'g DevGlobalScale<'_>) -> RawGlobalScale {
        match gs {
            DevGlobalScale::None => RawGlobalScale::None,
            DevGlobalScale::Uniform(v) => RawGlobalScale::Uniform(self.view(v)),
            DevGlobalScale::PerRow(v) => RawGlobalScale::PerRow(self.view(v)),
        }
    }
}

/// A read-only `rows × cols` device matrix; row `i` starts at element `i · row_stride`.
#[derive(Debug)]
pub struct DevMat<'a, T> {
    view: CudaView<'a, T>,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> DevMat<'a, T> {
    /// A contiguous matrix over `view`.
    pub fn new(view: CudaView<'a, T>, rows: usize, cols: usize) -> Self {
        DevMat {
            view,
            rows,
            cols,
            row_stride: cols,
        }
    }
    /// A matrix whose rows are `row_stride` elements apart.
    pub fn with_stride(view: CudaView<'a, T>, rows: usize, cols: usize, row_stride: usize) -> Self {
        DevMat {
            view,
            rows,
            cols,
            row_stride,
        }
    }
    /// A contiguous matrix over a whole allocation.
    pub fn from_slice(slice: &'a CudaSlice<T>, rows: usize, cols: usize) -> Self {
        Self::new(slice.as_view(), rows, cols)
    }
}

/// A mutable `rows × cols` device matrix; row `i` starts at element `i · row_stride`.
#[derive(Debug)]
pub struct DevMatMut<'a, T> {
    view: CudaViewMut<'a, T>,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T> DevMatMut<'a, T> {
    /// A contiguous matrix over `view`.
    pub fn new(view: CudaViewMut<'a, T>, rows: usize, cols: usize) -> Self {
        DevMatMut {
            view,
            rows,
            cols,
            row_stride: cols,
        }
    }
    /// A matrix whose rows are `row_stride` elements apart.
    pub fn with_stride(
        view: CudaViewMut<'a, T>,
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Self {
        DevMatMut {
            view,
            rows,
            cols,
            row_stride,
        }
    }
    /// A contiguous matrix over a whole allocation.
    pub fn from_slice(slice: &'a mut CudaSlice<T>, rows: usize, cols: usize) -> Self {
        Self::new(slice.as_view_mut(), rows, cols)
    }
}

/// Where the outputs of one GPU call go.
#[derive(Debug)]
pub struct DevFp4Out<'a, T> {
    /// Packed FP4, `M · H/2` bytes.
    pub y_fp4: CudaViewMut<'a, u8>,
    /// Block-scale codes in the chosen layout(s).
    pub scales: ScaleOut<CudaViewMut<'a, u8>>,
    /// Optional `[M, H]` normalised values in the input dtype.
    pub y_out: Option<DevMatMut<'a, T>>,
}

/// Where the outputs of one FP8 GPU call go.
#[derive(Debug)]
pub struct DevFp8Out<'a, T> {
    /// FP8 codes, `M · H` bytes, row by row.
    pub q: CudaViewMut<'a, u8>,
    /// Group scales in the options' layout (or none for a per-tensor scale).
    pub scales: DevFp8Scales<'a>,
    /// Optional `[M, H]` normalised values in the input dtype.
    pub y_out: Option<DevMatMut<'a, T>>,
}

/// The scale output of an FP8 GPU call, as [`crate::fp8::Fp8Scales`] on the host.
#[derive(Debug)]
pub enum DevFp8Scales<'a> {
    /// A per-tensor static scale writes no scales.
    None,
    /// f32 scales, [`crate::fp8::Fp8Problem::scales_len`] values in the options' layout.
    F32(CudaViewMut<'a, f32>),
    /// UE8M0 codes, [`crate::fp8::Fp8Problem::scales_len`] bytes in the options' layout.
    UE8M0(CudaViewMut<'a, u8>),
}

impl DevFp8Scales<'_> {
    const KIND_NONE: &'static str =
        "DevFp8Scales::None (a per-tensor static scale writes no scales)";
    const KIND_F32: &'static str = "DevFp8Scales::F32 (f32 scales)";
    const KIND_UE8M0: &'static str = "DevFp8Scales::UE8M0 (UE8M0 codes)";

    /// What this output is called in errors.
    fn kind(&self) -> &'static str {
        match self {
            DevFp8Scales::None => Self::KIND_NONE,
            DevFp8Scales::F32(_) => Self::KIND_F32,
            DevFp8Scales::UE8M0(_) => Self::KIND_UE8M0,
        }
    }

    /// The output a call's scale format needs, as [`DevFp8Scales::kind`] names it.
    fn kind_for(format: Option<crate::fp8::Fp8ScaleFormat>) -> &'static str {
        match format {
            None => Self::KIND_NONE,
            Some(crate::fp8::Fp8ScaleFormat::F32 { .. }) => Self::KIND_F32,
            Some(crate::fp8::Fp8ScaleFormat::UE8M0) => Self::KIND_UE8M0,
        }
    }
}

/// The scales a GPU dequantisation reads, in one layout.
#[derive(Debug)]
pub enum DevScaleIn<'a> {
    /// Row-major `[M, H/B]` codes.
    RowMajor(CudaView<'a, u8>),
    /// Swizzled 128×4 codes.
    Swizzled(CudaView<'a, u8>),
}

/// The global scale, in device memory so the kernel reads it at run time (graph replays
/// see new values). Ignored by UE8M0 scales.
#[derive(Debug)]
pub enum DevGlobalScale<'a> {
    /// No global scale (1.0).
    None,
    /// One f32 in device memory.
    Uniform(CudaView<'a, f32>),
    /// One f32 per row in device memory.
    PerRow(CudaView<'a, f32>),
}
