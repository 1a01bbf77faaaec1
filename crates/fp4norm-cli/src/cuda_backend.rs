//! The CUDA backend of the CLI: uploads a [`Case`], runs `fp4norm::cuda` through its raw
//! entry points (as a C++ engine or PyTorch would: `launch_raw` for the FP4 op,
//! `launch_fp8_raw` for the FP8 ops), times with CUDA events, and also as CUDA-graph replay.

use std::sync::Arc;

use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use fp4norm::cuda::{Gpu, LaunchOptions};
use fp4norm::fp8::{Fp8Scaling, RawFp8Call};
use fp4norm::ScaleOut;
use fp4norm::{RawBuf, RawCall, RawGlobalScale, RawMat};

use crate::backend::{median, Backend, CopyBaseline, Prepared};
use crate::case::{
    compare, try_vec, Case, CaseProblem, Fp8ScaleGeom, Gs, Op, OutputLens, Outputs, OUT_CANARY,
    Y_OUT_CANARY,
};
use crate::CliError;

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CliError + '_ {
    move |e| CliError(format!("CUDA error while {what}: {e}"))
}

/// One GPU and a stream of its own.
pub struct CudaBackend {
    gpu: Gpu,
    stream: Arc<CudaStream>,
}

impl CudaBackend {
    /// Opens device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self, CliError> {
        Self::with_gpu(Gpu::new(ordinal).map_err(|e| CliError(e.to_string()))?)
    }

    /// Opens device `ordinal` with the built-in launch table only (what `fp4norm tune`
    /// measures against, whatever table an earlier run wrote).
    pub fn open_untuned(ordinal: usize) -> Result<Self, CliError> {
        let gpu = Gpu::new(ordinal).map_err(|e| CliError(e.to_string()))?;
        Self::with_gpu(fp4norm::cuda::internal::without_tuned_table(gpu))
    }

    fn with_gpu(gpu: Gpu) -> Result<Self, CliError> {
        // Raw pointers are used throughout; cudarc's per-buffer events would only add
        // work to each launch (and get in the way of graph capture).
        unsafe { gpu.context().disable_event_tracking() };
        let stream = gpu
            .context()
            .new_stream()
            .map_err(cuda_err("creating a stream"))?;
        Ok(CudaBackend { gpu, stream })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Compiles and loads the kernels `case` launches, from its call over made-up addresses
    /// ([`made_up_call`]), without allocating.
    fn prepare_kernels(&self, case: &Case) -> Result<(), CliError> {
        match made_up_call(case)? {
            DeviceCall::Fp4(c) => self.gpu.prepare_raw(&c),
            DeviceCall::Fp8(c) => self.gpu.prepare_fp8_raw(&c),
        }
        .map_err(|e| CliError(e.to_string()))
    }

    /// The kernel configuration a tuning call of `op` on `problem` runs, in the shape
    /// forced on this handle (if any).
    pub fn tune_config(
        &self,
        op: &Op,
        problem: &CaseProblem,
    ) -> fp4norm::cuda::internal::KernelConfig {
        tune_config_on(&self.gpu, op, problem)
    }

    /// Compiles the kernels of `op` on `problem` (the tuning's calls of one row count) in
    /// each launch shape of `shapes`, in parallel, into the disk cache (one `Gpu` handle per
    /// thread: a handle's forced shape is its own).
    pub fn precompile_shapes(
        &self,
        op: &Op,
        problem: &CaseProblem,
        shapes: &[(u32, u32, u32)],
    ) -> Result<(), CliError> {
        use fp4norm::cuda::{internal, GsMode};
        use rayon::prelude::*;
        shapes.par_iter().try_for_each(|&shape| {
            let g = internal::with_launch_shape(Gpu::new(self.gpu.ordinal())?, Some(shape));
            match problem {
                CaseProblem::Fp4(p) => g.prepare(p, GsMode::Uniform, true),
                CaseProblem::Fp8(p) => g.prepare_fp8(p, scale_in_memory(op), true),
            }
        })?;
        Ok(())
    }

    /// Times `op` on `m` rows of `h` elements of `dtype` (fresh random data, residual) in
    /// the built-in launch shape and in each of `shapes`, by CUDA-graph replay; checks that
    /// every shape writes the built-in shape's bytes. Returns (built-in shape, seconds per
    /// call) and the fastest (shape, seconds), the built-in one where none beat it.
    #[allow(clippy::type_complexity)]
    pub fn tune_bucket(
        &self,
        m: usize,
        h: usize,
        dtype: fp4norm::DType,
        op: &Op,
        shapes: &[(u32, u32, u32)],
    ) -> Result<(((u32, u32, u32), f64), ((u32, u32, u32), f64)), CliError> {
        use fp4norm::cuda::internal;
        let case = Case::try_random_op(m, h, dtype, *op, 0x7u64 ^ (m * h) as u64)?;
        let problem = case.problem()?;
        let mut prep = CudaPrepared::new(self, &case)?;
        let shape_now = || {
            let c = tune_config_on(&self.gpu, op, &problem);
            (c.threads_per_row, c.rows_per_cta, c.cluster)
        };
        // Seconds per call: enough calls per graph for ~2 ms, the median of 15 replays.
        let time = |prep: &mut CudaPrepared| -> Result<f64, CliError> {
            prep.reset()?;
            let est = {
                let t = prep.time(3, 5)?;
                let mut t = t;
                median(&mut t)
            };
            let per_graph = ((2e-3 / est.max(1e-7)).ceil() as usize).clamp(1, 200);
            let mut t = prep.graph_times(per_graph, 15)?;
            Ok(median(&mut t))
        };
        let bytes_of = |prep: &mut CudaPrepared| -> Result<Outputs, CliError> {
            prep.reset()?;
            prep.launch().map_err(|e| CliError(e.to_string()))?;
            prep.outputs()
        };
        internal::set_launch_shape(&self.gpu, None);
        let builtin_shape = shape_now();
        let want = bytes_of(&mut prep)?;
        let builtin = (builtin_shape, time(&mut prep)?);
        let mut best: Option<((u32, u32, u32), f64)> = None;
        let result = (|| {
            for &shape in shapes {
                internal::set_launch_shape(&self.gpu, Some(shape));
                if shape_now() != shape {
                    continue; // does not fit this call
                }
                if let Some(m) = compare(&case, &want, &bytes_of(&mut prep)?) {
                    return Err(CliError(format!(
                        "launch shape {shape:?} at M={m_rows} H={h} {dtype}: bytes differ from the built-in shape's: {m}",
                        m_rows = case.m
                    )));
                }
                let t = time(&mut prep)?;
                if best.is_none_or(|(_, b)| t < b) {
                    best = Some((shape, t));
                }
            }
            Ok(())
        })();
        internal::set_launch_shape(&self.gpu, None);
        result?;
        // The built-in shape is timed again after the candidates and keeps its faster time:
        // a device still warming up (it launches slower fresh from idle) must not favour
        // the shapes timed later.
        let builtin = (builtin.0, builtin.1.min(time(&mut prep)?));
        // The built-in shape competes too: a tuned row is never one measured slower.
        let best = match best {
            Some(b) if b.1 < builtin.1 => b,
            _ => builtin,
        };
        Ok((builtin, best))
    }

    /// Times graphs of `pairs` × (1 MiB copy kernel, then the op), with the op launched
    /// plainly and then with programmatic dependent launch; seconds per pair.
    fn pdl_pairs(&self, case: &Case) -> Result<(f64, f64), CliError> {
        const PAIRS: usize = 20;
        const COPY: usize = 1 << 20;
        let s = &self.stream;
        let src: CudaSlice<u8> = s
            .clone_htod(&vec![1u8; COPY])
            .map_err(cuda_err("uploading"))?;
        let dst: CudaSlice<u8> = s.alloc_zeros(COPY).map_err(cuda_err("allocating"))?;
        let (sp, dp) = (src.device_ptr(s).0, dst.device_ptr(s).0);
        let prep = CudaPrepared::new(self, case)?;
        let mut result = [0.0; 2];
        for (i, pdl) in [false, true].into_iter().enumerate() {
            let chain = || -> Result<(), CliError> {
                for _ in 0..PAIRS {
                    self.gpu.set_programmatic_dependent_launch(false);
                    unsafe { self.gpu.copy_raw(s.cu_stream(), sp, dp, COPY) }
                        .map_err(|e| CliError(e.to_string()))?;
                    self.gpu.set_programmatic_dependent_launch(pdl);
                    prep.launch().map_err(|e| CliError(e.to_string()))?;
                }
                self.gpu.set_programmatic_dependent_launch(false);
                Ok(())
            };
            let mut times = graph_replay_times(s, 50, chain)?;
            result[i] = median(&mut times) / PAIRS as f64;
        }
        Ok((result[0], result[1]))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        // The conversion self-test settles which encoders the kernels use (run once per
        // device, driver and compiler, then read from the disk cache).
        let conversions = match self.gpu.conversion_path() {
            Ok(p) if p.fast => format!("fast conversions: {}", p.reason),
            Ok(p) => format!("literal encoders: {}", p.reason),
            Err(e) => format!("conversion self-test could not run: {e}"),
        };
        let shapes = match self.gpu.tuned_table() {
            Some(t) => {
                let mut classes: Vec<String> = Vec::new();
                for r in &t.rows {
                    let c = r.class.to_string();
                    if !classes.contains(&c) {
                        classes.push(c);
                    }
                }
                format!(
                    "launch shapes tuned here ({} buckets: {})",
                    t.rows.len(),
                    classes.join(", ")
                )
            }
            None => match self.gpu.tuned_table_refused() {
                Some(why) => format!("built-in launch table; tuned table refused: {why}"),
                None => "built-in launch table".into(),
            },
        };
        format!(
            "{} (cuda:{}, {}, {} SMs, E2M1 {}; {conversions}; {shapes})",
            self.gpu.name(),
            self.gpu.ordinal(),
            self.gpu.arch(),
            self.gpu.sm_count(),
            if self.gpu.hardware_e2m1() {
                "hardware cvt"
            } else {
                "software"
            }
        )
    }

    fn clock(&self) -> &'static str {
        "CUDA events"
    }

    fn prepare<'a>(&'a self, case: &'a Case) -> Result<Box<dyn Prepared + 'a>, CliError> {
        CudaPrepared::new(self, case).map(|p| Box::new(p) as Box<dyn Prepared + 'a>)
    }

    fn warms(&self) -> bool {
        true
    }

    fn warm(&self, cases: &[Case]) {
        use rayon::prelude::*;
        // The conversion self-test once, before the threads: the kernels depend on it.
        if self.gpu.conversion_path().is_err() {
            return;
        }
        cases.par_iter().for_each(|case| {
            let _ = self.prepare_kernels(case);
        });
    }

    fn pdl_chain(&self, case: &Case) -> Option<Result<(f64, f64), CliError>> {
        Some(self.pdl_pairs(case))
    }

    fn launch_floor(&self) -> Option<Result<f64, CliError>> {
        Some((|| {
            // A 16-byte copy: one CTA of the SM copy kernel, nothing to move.
            let s = &self.stream;
            let buf: CudaSlice<u8> = s.alloc_zeros(32).map_err(cuda_err("allocating"))?;
            let p = buf.device_ptr(s).0;
            let per_graph = 500;
            let launches = || {
                (0..per_graph).try_for_each(|_| {
                    unsafe { self.gpu.copy_raw(s.cu_stream(), p, p + 16, 16) }
                        .map_err(|e| CliError(e.to_string()))
                })
            };
            let mut times = graph_replay_times(s, 20, launches)?;
            Ok(median(&mut times) / per_graph as f64)
        })())
    }

    fn keep_busy(&self, seconds: f64) -> Result<(), CliError> {
        // Copies of up to 256 MiB (less where memory is short), in batches of 16 between
        // host checks of the time: the queue empties only for that check.
        let s = &self.stream;
        let mut buffers = None;
        for mib in [256usize, 64, 16] {
            let bytes = mib << 20;
            if let (Ok(src), Ok(dst)) = (s.alloc_zeros::<u8>(bytes), s.alloc_zeros::<u8>(bytes)) {
                buffers = Some((src, dst, bytes));
                break;
            }
        }
        let (src, dst, bytes) =
            buffers.ok_or_else(|| CliError("no device memory to keep the GPU busy with".into()))?;
        let (sp, dp) = (src.device_ptr(s).0, dst.device_ptr(s).0);
        let start = std::time::Instant::now();
        while start.elapsed().as_secs_f64() < seconds {
            for _ in 0..16 {
                unsafe { self.gpu.copy_raw(s.cu_stream(), sp, dp, bytes) }
                    .map_err(|e| CliError(e.to_string()))?;
            }
            s.synchronize().map_err(cuda_err("waiting for the GPU"))?;
        }
        Ok(())
    }

    fn copy_baseline(&self, bytes: usize, reps: usize) -> Result<CopyBaseline, CliError> {
        let bytes = bytes / 16 * 16;
        let s = &self.stream;
        let src: CudaSlice<u8> = s
            .clone_htod(&try_vec(bytes, 0x3Cu8, "the copy baseline's host buffer")?)
            .map_err(cuda_err("uploading"))?;
        let dst: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(cuda_err("allocating"))?;
        let (sp, dp) = (src.device_ptr(s).0, dst.device_ptr(s).0);
        let copy = || {
            unsafe { self.gpu.copy_raw(s.cu_stream(), sp, dp, bytes) }
                .map_err(|e| CliError(e.to_string()))
        };
        for _ in 0..3 {
            copy()?;
        }
        // The yardstick is the faster of our SM copy kernel and the driver's device-to-
        // device memcpy, each the median of `reps` copies.
        let driver_copy = || -> Result<(), CliError> {
            let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dp, sp, bytes, s.cu_stream()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(CliError(format!("cuMemcpyDtoDAsync: {r:?}")));
            }
            Ok(())
        };
        driver_copy()?;
        // Copies shorter than ~2 ms are timed in back-to-back batches (launch gaps
        // amortised, as the op's graph replays are), seconds per copy.
        let batch = (2e-3 / time_events(s, copy)?.max(1e-7))
            .ceil()
            .clamp(1.0, 200.0) as usize;
        let batched = |f: &dyn Fn() -> Result<(), CliError>| -> Result<f64, CliError> {
            Ok(time_events(s, || (0..batch).try_for_each(|_| f()))? / batch as f64)
        };
        let mut kernel_times = Vec::with_capacity(reps);
        let mut driver_times = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            kernel_times.push(batched(&copy)?);
            driver_times.push(batched(&driver_copy)?);
        }
        let (k, d) = (median(&mut kernel_times), median(&mut driver_times));
        let mut times = if k <= d { kernel_times } else { driver_times };
        let median_s = median(&mut times);
        Ok(CopyBaseline {
            buffer_bytes: bytes,
            bytes_per_copy: 2 * bytes,
            reps: times.len(),
            median_s,
            gb_per_s: 2.0 * bytes as f64 / median_s / 1e9,
        })
    }
}

/// Runs `work` once (so that its kernels are compiled and loaded), captures it in a CUDA
/// graph on `stream`, replays the graph once to warm up, then times `replays` replays with
/// events: seconds per replay.
fn graph_replay_times(
    stream: &Arc<CudaStream>,
    replays: usize,
    work: impl Fn() -> Result<(), CliError>,
) -> Result<Vec<f64>, CliError> {
    work()?;
    stream
        .synchronize()
        .map_err(cuda_err("waiting for the GPU"))?;
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda_err("starting capture"))?;
    let captured = work();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(cuda_err("ending capture"))?;
    captured?;
    let graph = graph.ok_or_else(|| CliError("graph capture produced no graph".into()))?;
    let replay = || graph.launch().map_err(cuda_err("replaying a graph"));
    replay()?;
    (0..replays).map(|_| time_events(stream, replay)).collect()
}

/// Seconds between two events recorded around `f` on `stream`.
fn time_events(
    stream: &Arc<CudaStream>,
    f: impl FnOnce() -> Result<(), CliError>,
) -> Result<f64, CliError> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream
        .record_event(flags)
        .map_err(cuda_err("recording an event"))?;
    f()?;
    let end = stream
        .record_event(flags)
        .map_err(cuda_err("recording an event"))?;
    end.synchronize().map_err(cuda_err("waiting for the GPU"))?;
    Ok(start.elapsed_ms(&end).map_err(cuda_err("reading events"))? as f64 * 1e-3)
}

/// The device call a [`CudaPrepared`] launches.
pub(crate) enum DeviceCall {
    Fp4(RawCall),
    Fp8(RawFp8Call),
}

/// The device addresses of a case's buffers: live allocations, or (for
/// [`Backend::warm`]) addresses laid out as the allocator's would be, which is all that
/// the validator reads.
struct Addrs {
    x: u64,
    residual: Option<u64>,
    w: u64,
    /// The FP4 global scale(s), or an FP8 per-tensor scale passed by address.
    scale: Option<u64>,
    q: u64,
    row_major: Option<u64>,
    swizzled: Option<u64>,
    fp8_scales: Option<u64>,
    y_out: Option<u64>,
}

/// The scale values a case passes by address: the FP4 global scale(s), or an FP8
/// per-tensor scale read from memory.
fn scale_host(case: &Case) -> Option<Vec<f32>> {
    match &case.op {
        Op::Fp4 { .. } => Some(match &case.gs {
            Gs::Uniform(g) => vec![*g],
            Gs::PerRow(v) if v.is_empty() => vec![0.0],
            Gs::PerRow(v) => v.clone(),
        }),
        Op::Fp8 {
            opts,
            scale_in_memory: true,
        } => match opts.scaling {
            Fp8Scaling::PerTensor(v) => Some(vec![v]),
            Fp8Scaling::Dynamic { .. } => None,
        },
        Op::Fp8 { .. } => None,
    }
}

/// The call `case` makes over buffers at `a`, of the lengths `init` gives.
fn device_call(case: &Case, init: &OutputLens, a: &Addrs) -> Result<DeviceCall, CliError> {
    let mat = |ptr: u64, len: usize| RawMat {
        ptr,
        rows: case.m,
        cols: case.h,
        row_stride: case.stride,
        len: Some(len),
    };
    let y_out = a.y_out.map(|y| mat(y, init.y_out.unwrap_or(0)));
    // Each buffer with its own length: a short residual must reach the validator as such.
    let residual = a
        .residual
        .zip(case.residual.as_ref())
        .map(|(r, host)| mat(r, host.len()));
    let weight = RawBuf::new(a.w, case.w.len());
    Ok(match &case.op {
        Op::Fp4 { opts, .. } => {
            let (rm, sw) = (init.row_major.unwrap_or(0), init.swizzled.unwrap_or(0));
            let scales = match (a.row_major, a.swizzled) {
                (Some(r), Some(s)) => ScaleOut::Both {
                    row_major: RawBuf::new(r, rm),
                    swizzled: RawBuf::new(s, sw),
                },
                (Some(r), None) => ScaleOut::RowMajor(RawBuf::new(r, rm)),
                (None, Some(s)) => ScaleOut::Swizzled(RawBuf::new(s, sw)),
                (None, None) => return Err(CliError("a case needs a scale layout".into())),
            };
            let gs = a
                .scale
                .ok_or_else(|| CliError("an FP4 case needs a global scale".into()))?;
            DeviceCall::Fp4(RawCall {
                dtype: case.dtype,
                x: mat(a.x, case.x.len()),
                residual,
                weight,
                y_fp4: RawBuf::new(a.q, init.q),
                scales,
                y_out,
                global_scale: match &case.gs {
                    Gs::Uniform(_) => RawGlobalScale::Uniform(RawBuf::new(gs, 1)),
                    Gs::PerRow(v) => RawGlobalScale::PerRow(RawBuf::new(gs, v.len())),
                },
                options: *opts,
            })
        }
        Op::Fp8 { opts, .. } => {
            // Scale lengths are in elements: f32 values or UE8M0 bytes.
            let geom = Fp8ScaleGeom::of(case.m, case.h, opts);
            DeviceCall::Fp8(RawFp8Call {
                dtype: case.dtype,
                x: mat(a.x, case.x.len()),
                residual,
                weight,
                q: RawBuf::new(a.q, init.q),
                scales: a.fp8_scales.zip(geom).map(|(b, g)| RawBuf::new(b, g.len)),
                static_scale: a.scale.map(|b| RawBuf::new(b, 1)),
                y_out,
                options: *opts,
            })
        }
    })
}

/// The call `case` makes over made-up addresses laid out as the allocator's would be: each
/// buffer 4 KiB-aligned (cudaMalloc's 256 B alignment or more: the same vector-access
/// verdict) and apart from the others. What the validator reads, with no device.
pub(crate) fn made_up_call(case: &Case) -> Result<DeviceCall, CliError> {
    let init = OutputLens::of(case)?;
    let mut next = 1u64 << 40;
    let mut at = |bytes: usize| {
        let a = next;
        next += (bytes.max(1) as u64).next_multiple_of(4096);
        a
    };
    let addrs = Addrs {
        x: at(2 * case.x.len()),
        residual: case.residual.as_ref().map(|r| at(2 * r.len())),
        w: at(2 * case.w.len()),
        scale: scale_host(case).map(|v| at(4 * v.len())),
        q: at(init.q),
        row_major: init.row_major.map(&mut at),
        swizzled: init.swizzled.map(&mut at),
        fp8_scales: init.fp8_scales.map(&mut at),
        y_out: init.y_out.map(|n| at(2 * n)),
    };
    device_call(case, &init, &addrs)
}

struct CudaPrepared<'a> {
    be: &'a CudaBackend,
    case: &'a Case,
    _x: CudaSlice<u16>,
    residual: Option<CudaSlice<u16>>,
    _w: CudaSlice<u16>,
    /// The FP4 global scale(s), or an FP8 per-tensor scale passed by address.
    _scale: Option<CudaSlice<f32>>,
    q: CudaSlice<u8>,
    row_major: Option<CudaSlice<u8>>,
    swizzled: Option<CudaSlice<u8>>,
    fp8_scales: Option<CudaSlice<u8>>,
    y_out: Option<CudaSlice<u16>>,
    call: DeviceCall,
}

impl<'a> CudaPrepared<'a> {
    fn new(be: &'a CudaBackend, case: &'a Case) -> Result<Self, CliError> {
        let s = &be.stream;
        let up16 = |v: &[u16]| -> Result<CudaSlice<u16>, CliError> {
            if v.is_empty() {
                s.alloc_zeros(1).map_err(cuda_err("allocating"))
            } else {
                s.clone_htod(v).map_err(cuda_err("uploading"))
            }
        };
        let up8 = |n: usize, fill: u8| -> Result<CudaSlice<u8>, CliError> {
            s.clone_htod(&try_vec(n.max(1), fill, "an output's initial bytes")?)
                .map_err(cuda_err("uploading"))
        };
        let init = OutputLens::of(case)?;
        let x = up16(&case.x)?;
        let residual = case.residual.as_deref().map(up16).transpose()?;
        let w = up16(&case.w)?;
        let q = up8(init.q, OUT_CANARY)?;
        let canaries = |n: Option<usize>| n.map(|n| up8(n, OUT_CANARY)).transpose();
        let row_major = canaries(init.row_major)?;
        let swizzled = canaries(init.swizzled)?;
        let fp8_scales = canaries(init.fp8_scales)?;
        let y_out = init
            .y_out
            .map(|n| up16(&try_vec(n, Y_OUT_CANARY, "y_out's initial bytes")?))
            .transpose()?;
        let scale = scale_host(case)
            .map(|v| s.clone_htod(&v).map_err(cuda_err("uploading")))
            .transpose()?;
        let ptr16 = |b: &CudaSlice<u16>| b.device_ptr(s).0;
        let ptr8 = |b: &CudaSlice<u8>| b.device_ptr(s).0;
        let addrs = Addrs {
            x: ptr16(&x),
            residual: residual.as_ref().map(ptr16),
            w: ptr16(&w),
            scale: scale.as_ref().map(|b| b.device_ptr(s).0),
            q: ptr8(&q),
            row_major: row_major.as_ref().map(ptr8),
            swizzled: swizzled.as_ref().map(ptr8),
            fp8_scales: fp8_scales.as_ref().map(ptr8),
            y_out: y_out.as_ref().map(ptr16),
        };
        let call = device_call(case, &init, &addrs)?;
        // Compile and load the FP8 kernel now, so that timing and graph capture find it
        // ready; a call the library refuses is left to `launch` to report, as the FP4 path
        // does.
        if let DeviceCall::Fp8(c) = &call {
            if c.validate().is_ok() {
                be.gpu.prepare_fp8_raw(c)?;
            }
        }
        Ok(CudaPrepared {
            be,
            case,
            _x: x,
            residual,
            _w: w,
            _scale: scale,
            q,
            row_major,
            swizzled,
            fp8_scales,
            y_out,
            call,
        })
    }

    fn launch(&self) -> Result<(), fp4norm::Error> {
        let stream = self.be.stream.cu_stream();
        // SAFETY: every pointer of the call is a live allocation of this GPU made in `new`
        // with the length the call gives (the buffers live as long as `self`), and the
        // stream belongs to the GPU's context.
        unsafe {
            match &self.call {
                DeviceCall::Fp4(c) => self.be.gpu.launch_raw(stream, c),
                DeviceCall::Fp8(c) => {
                    self.be
                        .gpu
                        .launch_fp8_raw(stream, c, &LaunchOptions::default())
                }
            }
        }
    }

    /// Seconds per call when `per_graph` calls are captured in one CUDA graph and the
    /// graph is replayed `replays` times (launch overhead mostly gone, as in an engine
    /// that captures its decode step).
    fn graph_times(&mut self, per_graph: usize, replays: usize) -> Result<Vec<f64>, CliError> {
        let calls =
            || (0..per_graph).try_for_each(|_| self.launch().map_err(|e| CliError(e.to_string())));
        let times = graph_replay_times(&self.be.stream, replays, calls)?;
        Ok(times.into_iter().map(|t| t / per_graph as f64).collect())
    }
}

impl Prepared for CudaPrepared<'_> {
    fn run_once(&mut self) -> Result<(), fp4norm::Error> {
        self.launch()
    }

    fn reset(&mut self) -> Result<(), CliError> {
        let s = &self.be.stream;
        if let (Some(d), Some(h)) = (self.residual.as_mut(), self.case.residual.as_ref()) {
            if !h.is_empty() {
                s.memcpy_htod(h, d).map_err(cuda_err("uploading"))?;
            }
        }
        let poison = |b: &mut CudaSlice<u8>| unsafe {
            sys::cuMemsetD8Async(b.device_ptr(s).0, OUT_CANARY, b.len(), s.cu_stream())
        };
        for b in [
            Some(&mut self.q),
            self.row_major.as_mut(),
            self.swizzled.as_mut(),
            self.fp8_scales.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            let r = poison(b);
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(CliError(format!("cuMemsetD8Async: {r:?}")));
            }
        }
        if let Some(y) = self.y_out.as_mut() {
            let r = unsafe {
                sys::cuMemsetD16Async(y.device_ptr(s).0, Y_OUT_CANARY, y.len(), s.cu_stream())
            };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(CliError(format!("cuMemsetD16Async: {r:?}")));
            }
        }
        Ok(())
    }

    fn outputs(&self) -> Result<Outputs, CliError> {
        let s = &self.be.stream;
        let init = OutputLens::of(self.case)?;
        // Read into buffers allocated here (fallibly), then cut to the host lengths (the
        // device buffers hold at least one element).
        let down8 = |b: &CudaSlice<u8>, n: usize| -> Result<Vec<u8>, CliError> {
            let mut v = try_vec(b.len(), 0u8, "an output read back")?;
            s.memcpy_dtoh(b, &mut v).map_err(cuda_err("downloading"))?;
            s.synchronize().map_err(cuda_err("downloading"))?;
            v.truncate(n);
            Ok(v)
        };
        let down16 = |b: &CudaSlice<u16>, n: usize| -> Result<Vec<u16>, CliError> {
            let mut v = try_vec(b.len(), 0u16, "an output read back")?;
            s.memcpy_dtoh(b, &mut v).map_err(cuda_err("downloading"))?;
            s.synchronize().map_err(cuda_err("downloading"))?;
            v.truncate(n);
            Ok(v)
        };
        Ok(Outputs {
            q: down8(&self.q, init.q)?,
            row_major: match (&self.row_major, init.row_major) {
                (Some(b), Some(n)) => Some(down8(b, n)?),
                _ => None,
            },
            swizzled: match (&self.swizzled, init.swizzled) {
                (Some(b), Some(n)) => Some(down8(b, n)?),
                _ => None,
            },
            fp8_scales: match (&self.fp8_scales, init.fp8_scales) {
                (Some(b), Some(n)) => Some(down8(b, n)?),
                _ => None,
            },
            residual: match (&self.residual, &self.case.residual) {
                (Some(b), Some(v)) => Some(down16(b, v.len())?),
                _ => None,
            },
            y_out: match (&self.y_out, init.y_out) {
                (Some(b), Some(n)) => Some(down16(b, n)?),
                _ => None,
            },
        })
    }

    fn time(&mut self, warmup: usize, reps: usize) -> Result<Vec<f64>, CliError> {
        let s = self.be.stream.clone();
        for _ in 0..warmup {
            self.launch().map_err(|e| CliError(e.to_string()))?;
        }
        let mut times = Vec::with_capacity(reps.min(1 << 16));
        for _ in 0..reps {
            times.push(time_events(&s, || {
                self.launch().map_err(|e| CliError(e.to_string()))
            })?);
        }
        Ok(times)
    }

    fn time_graph(
        &mut self,
        per_graph: usize,
        replays: usize,
    ) -> Option<Result<Vec<f64>, CliError>> {
        Some(self.graph_times(per_graph, replays))
    }
}

// The device buffers (x, w and the scale included) live as long as the call that points at them;
// wait for queued work before they are freed.
impl Drop for CudaPrepared<'_> {
    fn drop(&mut self) {
        let _ = self.be.stream.synchronize();
    }
}

/// The kernel configuration `op` on `problem` runs on `gpu` (the tuning's calls: aligned
/// rows; an FP4 call with its global scale in memory).
fn tune_config_on(
    gpu: &Gpu,
    op: &Op,
    problem: &CaseProblem,
) -> fp4norm::cuda::internal::KernelConfig {
    use fp4norm::cuda::{internal, GsMode};
    match problem {
        CaseProblem::Fp4(p) => internal::config(gpu, p, GsMode::Uniform, true),
        CaseProblem::Fp8(p) => internal::fp8_config(gpu, p, scale_in_memory(op), true),
    }
}

/// Whether an FP8 op reads its per-tensor scale from device memory (`Op::fp8`'s default).
fn scale_in_memory(op: &Op) -> bool {
    !matches!(
        op,
        Op::Fp8 {
            scale_in_memory: false,
            ..
        }
    )
}
