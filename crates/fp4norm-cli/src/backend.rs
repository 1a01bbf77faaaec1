//! The backends the CLI can run the op on, behind one small interface.
//!
//! A [`Backend`] is a device (the CPU, or a CUDA GPU in `cuda_backend.rs`). It turns a
//! host [`Case`] (an FP4 or an FP8 call) into a [`Prepared`] call — inputs loaded where the
//! device reads them, outputs allocated — which can be run, timed with the device's own
//! clock, and read back as [`Outputs`]. `bench` and `verify` only talk to these two traits.

use std::time::Instant;

use fp4norm::fp8::{Fp8Options, Fp8Out, Fp8ScaleFormat, Fp8Scales, Fp8Scaling};
use fp4norm::{bf16, f16, Element, Fp4Out, GlobalScale, MatMut, MatRef, Options, ScaleOut};
use half::slice::HalfBitsSliceExt;
use rayon::prelude::*;

use crate::case::{try_vec, try_with_capacity, Case, Gs, Op, Outputs};
use crate::CliError;

/// A device the op can run on.
pub trait Backend {
    /// Short name, as given to `--device` (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// One line about the device (model, threads, ...).
    fn describe(&self) -> String;
    /// How [`Prepared::time`] measures (e.g. "wall clock", "CUDA events").
    fn clock(&self) -> &'static str;
    /// Loads `case`'s inputs where the device reads them and allocates its outputs
    /// (filled as [`Outputs::initial`] says). May fail for a case the device rejects.
    fn prepare<'a>(&'a self, case: &'a Case) -> Result<Box<dyn Prepared + 'a>, CliError>;
    /// Readies what `cases` will need before they run one by one (the GPU's kernels,
    /// compiled in parallel). Best effort: a case that fails here fails again, and is
    /// reported, when it runs.
    fn warm(&self, _cases: &[Case]) {}
    /// Whether [`Backend::warm`] does anything here (it compiles kernels), so that a
    /// caller builds the cases for it only then.
    fn warms(&self) -> bool {
        false
    }
    /// Measures a plain copy of `bytes` bytes on this device (read + written counted),
    /// the yardstick for the op's effective bandwidth.
    fn copy_baseline(&self, bytes: usize, reps: usize) -> Result<CopyBaseline, CliError>;
    /// Seconds per pair "previous kernel -> op" in a CUDA graph, without and with
    /// programmatic dependent launch. `None`: the backend has no such thing.
    fn pdl_chain(&self, _case: &Case) -> Option<Result<(f64, f64), CliError>> {
        None
    }
    /// Keeps the device busy with copies for about `seconds` of wall time before anything
    /// is timed: a GPU fresh from idle launches kernels slower for a while. Nothing to do
    /// where there is no such state (the CPU).
    fn keep_busy(&self, _seconds: f64) -> Result<(), CliError> {
        Ok(())
    }
    /// Seconds per launch of a near-empty kernel replayed from a CUDA graph: the floor
    /// under any graph-replay figure on this device. `None`: no graphs here.
    fn launch_floor(&self) -> Option<Result<f64, CliError>> {
        None
    }
}

/// One call, ready to run on a backend.
pub trait Prepared {
    /// Runs the op once. The residual is updated in place, so repeated runs drift;
    /// [`Prepared::reset`] puts it back.
    fn run_once(&mut self) -> Result<(), fp4norm::Error>;
    /// Restores the residual to the case's values and the outputs to their initial bytes.
    fn reset(&mut self) -> Result<(), CliError>;
    /// Reads every output back to the host.
    fn outputs(&self) -> Result<Outputs, CliError>;
    /// Seconds per call with `per_graph` calls captured in one CUDA graph and replayed
    /// `replays` times (an engine's captured decode step). `None`: no graphs here.
    fn time_graph(
        &mut self,
        _per_graph: usize,
        _replays: usize,
    ) -> Option<Result<Vec<f64>, CliError>> {
        None
    }
    /// Runs `warmup` untimed calls, then `reps` timed ones; seconds per call.
    /// The default times [`Prepared::run_once`] with the wall clock, which is right for
    /// a synchronous backend; an asynchronous one (a GPU) overrides it.
    fn time(&mut self, warmup: usize, reps: usize) -> Result<Vec<f64>, CliError> {
        for _ in 0..warmup {
            self.run_once()?;
        }
        // Grown as it goes: a huge --reps runs long, it does not reserve memory up front.
        let mut times = Vec::with_capacity(reps.min(1 << 16));
        for _ in 0..reps {
            let t = Instant::now();
            self.run_once()?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(times)
    }
}

/// A copy measured on a backend.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CopyBaseline {
    /// Size of the source buffer.
    pub buffer_bytes: usize,
    /// Bytes counted per copy: read + written.
    pub bytes_per_copy: usize,
    /// Timed copies.
    pub reps: usize,
    /// Median seconds per copy.
    pub median_s: f64,
    /// `bytes_per_copy / median_s / 1e9`.
    pub gb_per_s: f64,
}

/// Which device `--device` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// CUDA if a CUDA backend can be opened, else the CPU (saying why on stderr;
    /// FP4NORM_REQUIRE_GPU=1 makes that an error).
    Auto,
    /// The CPU fast path (rayon threads).
    Cpu,
    /// An NVIDIA GPU (an error if it cannot be opened).
    Cuda,
}

/// The environment variable that makes `--device auto` fail rather than fall back to the
/// CPU (set and not `0`), as it makes the GPU tests fail rather than skip.
pub const REQUIRE_GPU_ENV: &str = "FP4NORM_REQUIRE_GPU";

/// Whether `FP4NORM_REQUIRE_GPU` asks for a GPU.
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU_ENV).is_some_and(|v| v != "0")
}

/// The backends to run for `device`: one, or with `with_cpu_too` (verify checks every
/// backend present) CUDA and then the CPU under `auto`. `open_cuda` is called only where
/// CUDA is asked for. Where `auto` runs without
/// CUDA, the second value is the line that says why (for stderr), unless `require_gpu`,
/// which makes it an error.
pub fn select<B>(
    device: Device,
    with_cpu_too: bool,
    require_gpu: bool,
    open_cuda: impl FnOnce() -> Result<B, CliError>,
    cpu: impl Fn() -> B,
) -> Result<(Vec<B>, Option<String>), CliError> {
    match device {
        Device::Cpu => Ok((vec![cpu()], None)),
        Device::Cuda => Ok((vec![open_cuda()?], None)),
        Device::Auto => match open_cuda() {
            Ok(cuda) if with_cpu_too => Ok((vec![cuda, cpu()], None)),
            Ok(cuda) => Ok((vec![cuda], None)),
            Err(e) if require_gpu => Err(CliError(format!(
                "{REQUIRE_GPU_ENV} is set but CUDA cannot be used: {e}"
            ))),
            Err(e) => Ok((vec![cpu()], Some(format!("cuda: not used: {e}")))),
        },
    }
}

/// A bad FP4NORM_DEVICE is an error wherever CUDA would be opened (`auto` included: a
/// device asked for by name must not turn into a quiet fallback).
fn check_device_env(device: Device) -> Result<(), CliError> {
    match device {
        Device::Cpu => Ok(()),
        Device::Auto | Device::Cuda => default_cuda_ordinal().map(|_| ()),
    }
}

/// Opens the backend for `device` (`bench`); under `auto`, says on stderr why CUDA is
/// not used, or fails where FP4NORM_REQUIRE_GPU asks for a GPU.
pub fn open(device: Device) -> Result<Box<dyn Backend>, CliError> {
    check_device_env(device)?;
    let cpu = || Box::new(HostBackend::fast()) as Box<dyn Backend>;
    let (mut v, why) = select(device, false, gpu_required(), open_cuda, cpu)?;
    if let Some(why) = why {
        eprintln!("{why}");
    }
    v.pop()
        .ok_or_else(|| CliError("no backend to run on".into()))
}

/// The backends `verify` checks for `device`: under `auto` every backend that can run
/// here (CUDA first), saying on stderr why CUDA is not among them, or failing where
/// FP4NORM_REQUIRE_GPU asks for a GPU.
pub fn for_verify(device: Device) -> Result<Vec<Box<dyn Backend>>, CliError> {
    check_device_env(device)?;
    let cpu = || Box::new(HostBackend::fast()) as Box<dyn Backend>;
    let (v, why) = select(device, true, gpu_required(), open_cuda, cpu)?;
    if let Some(why) = why {
        eprintln!("{why}");
    }
    Ok(v)
}

/// The variable that picks the CLI's CUDA device.
pub const DEVICE_ENV: &str = "FP4NORM_DEVICE";

/// The CUDA device the CLI uses: `FP4NORM_DEVICE` (unset or empty: 0); an error naming
/// the variable where it is not an ordinal.
pub fn default_cuda_ordinal() -> Result<usize, CliError> {
    match std::env::var(DEVICE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(0),
        Ok(v) if v.trim().is_empty() => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            CliError(format!(
                "{DEVICE_ENV}={v:?} is not a CUDA device ordinal (0, 1, ...; unset for device 0)"
            ))
        }),
        Err(std::env::VarError::NotUnicode(v)) => Err(CliError(format!(
            "{DEVICE_ENV}={v:?} is not a CUDA device ordinal (0, 1, ...; unset for device 0)"
        ))),
    }
}

/// The CUDA backend on device 0 (`FP4NORM_DEVICE` picks another ordinal).
#[cfg(feature = "cuda")]
pub fn open_cuda() -> Result<Box<dyn Backend>, CliError> {
    Ok(Box::new(crate::cuda_backend::CudaBackend::open(
        default_cuda_ordinal()?,
    )?))
}

/// The CUDA backend: not in this build.
#[cfg(not(feature = "cuda"))]
pub fn open_cuda() -> Result<Box<dyn Backend>, CliError> {
    Err(CliError(
        "CUDA backend not available: this fp4norm CLI was built without the `cuda` feature. Use --device cpu.".into(),
    ))
}

/// The host implementations: the fast CPU path (a user-visible backend) or the scalar
/// reference (the oracle every backend is compared with).
pub struct HostBackend {
    reference: bool,
}

impl HostBackend {
    /// `fp4norm::cpu`, the fast CPU path.
    pub fn fast() -> Self {
        HostBackend { reference: false }
    }
    /// `fp4norm::reference`, the executable spec.
    pub fn reference() -> Self {
        HostBackend { reference: true }
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        if self.reference {
            "reference"
        } else {
            "cpu"
        }
    }

    fn describe(&self) -> String {
        if self.reference {
            "fp4norm::reference (scalar, one thread)".into()
        } else {
            format!(
                "fp4norm::cpu fast path, {} row kernels, {} rayon threads",
                fp4norm::cpu::simd_path(),
                rayon::current_num_threads()
            )
        }
    }

    fn clock(&self) -> &'static str {
        "wall clock"
    }

    fn prepare<'a>(&'a self, case: &'a Case) -> Result<Box<dyn Prepared + 'a>, CliError> {
        let out = Outputs::initial(case)?;
        Ok(Box::new(HostPrepared {
            case,
            reference: self.reference,
            f32_scales: f32_scales_of(case, &out)?,
            out,
        }))
    }

    fn copy_baseline(&self, bytes: usize, reps: usize) -> Result<CopyBaseline, CliError> {
        const CHUNK: usize = 1 << 20;
        let what = "the copy baseline's buffers (--copy-mib)";
        let mut src = try_vec(bytes, 0u8, what)?;
        src.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, c)| c.fill(i as u8 | 1));
        let mut dst = try_vec(bytes, 0u8, what)?;
        let copy = |dst: &mut [u8]| {
            dst.par_chunks_mut(CHUNK)
                .zip(src.par_chunks(CHUNK))
                .for_each(|(d, s)| d.copy_from_slice(s));
        };
        copy(&mut dst); // fault the pages in
        let mut times: Vec<f64> = (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                copy(&mut dst);
                t.elapsed().as_secs_f64()
            })
            .collect();
        if dst.get(bytes / 2) != src.get(bytes / 2) {
            return Err(CliError("copy baseline: the copy did not copy".into()));
        }
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

/// The median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

struct HostPrepared<'a> {
    case: &'a Case,
    reference: bool,
    out: Outputs,
    /// FP8 f32 scales while the op writes them (`out.fp8_scales` holds their bytes once
    /// read back): the host API takes `&mut [f32]`, which a byte buffer cannot lend.
    f32_scales: Option<Vec<f32>>,
}

/// The f32 view of `out`'s FP8 scales when the case writes f32 scales.
fn f32_scales_of(case: &Case, out: &Outputs) -> Result<Option<Vec<f32>>, CliError> {
    match (&case.op, &out.fp8_scales) {
        (
            Op::Fp8 {
                opts:
                    Fp8Options {
                        scaling:
                            Fp8Scaling::Dynamic {
                                format: Fp8ScaleFormat::F32 { .. },
                                ..
                            },
                        ..
                    },
                ..
            },
            Some(bytes),
        ) => {
            let mut v = try_with_capacity(bytes.len().div_ceil(4), "the FP8 f32 scales")?;
            v.extend(bytes.chunks(4).map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                f32::from_le_bytes(w)
            }));
            Ok(Some(v))
        }
        _ => Ok(None),
    }
}

impl Prepared for HostPrepared<'_> {
    fn run_once(&mut self) -> Result<(), fp4norm::Error> {
        let (c, o) = (self.case, &mut self.out);
        let residual = o.residual.as_deref_mut();
        let y_out = o.y_out.as_deref_mut();
        macro_rules! go {
            ($t:ty) => {{
                let x = c.x.reinterpret_cast::<$t>();
                let w = c.w.reinterpret_cast::<$t>();
                let residual = residual.map(|r| r.reinterpret_cast_mut::<$t>());
                let y_out = y_out.map(|y| y.reinterpret_cast_mut::<$t>());
                match &c.op {
                    Op::Fp4 { opts, .. } => call::<$t>(
                        self.reference,
                        c,
                        opts,
                        x,
                        w,
                        residual,
                        &mut o.q,
                        o.row_major.as_deref_mut(),
                        o.swizzled.as_deref_mut(),
                        y_out,
                    ),
                    Op::Fp8 { opts, .. } => {
                        let scales =
                            match (self.f32_scales.as_deref_mut(), o.fp8_scales.as_deref_mut()) {
                                (Some(f), _) => Fp8Scales::F32(f),
                                (None, Some(b)) => Fp8Scales::UE8M0(b),
                                (None, None) => Fp8Scales::None,
                            };
                        call_fp8::<$t>(
                            self.reference,
                            c,
                            opts,
                            x,
                            w,
                            residual,
                            &mut o.q,
                            scales,
                            y_out,
                        )
                    }
                }
            }};
        }
        match c.dtype {
            fp4norm::DType::BF16 => go!(bf16),
            fp4norm::DType::F16 => go!(f16),
        }
    }

    fn reset(&mut self) -> Result<(), CliError> {
        self.out = Outputs::initial(self.case)?;
        self.f32_scales = f32_scales_of(self.case, &self.out)?;
        Ok(())
    }

    fn outputs(&self) -> Result<Outputs, CliError> {
        let mut out = self.out.try_clone()?;
        if let (Some(f), Some(b)) = (&self.f32_scales, out.fp8_scales.as_mut()) {
            for (d, v) in b.chunks_mut(4).zip(f) {
                d.copy_from_slice(&v.to_le_bytes()[..d.len()]);
            }
        }
        Ok(out)
    }
}

#[allow(clippy::too_many_arguments)]
fn call<T: Element>(
    reference: bool,
    c: &Case,
    opts: &Options,
    x: &[T],
    w: &[T],
    residual: Option<&mut [T]>,
    y_fp4: &mut [u8],
    row_major: Option<&mut [u8]>,
    swizzled: Option<&mut [u8]>,
    y_out: Option<&mut [T]>,
) -> Result<(), fp4norm::Error> {
    let x = MatRef::with_stride(x, c.m, c.h, c.stride)?;
    let scales = match (row_major, swizzled) {
        (Some(row_major), Some(swizzled)) => ScaleOut::Both {
            row_major,
            swizzled,
        },
        (Some(r), None) => ScaleOut::RowMajor(r),
        (None, Some(s)) => ScaleOut::Swizzled(s),
        (None, None) => return Err(fp4norm::Error::Unsupported("no scale buffer".into())),
    };
    let y_out = match y_out {
        Some(y) => Some(MatMut::with_stride(y, c.m, c.h, c.stride)?),
        None => None,
    };
    let out = Fp4Out {
        y_fp4,
        scales,
        y_out,
    };
    let gs = match &c.gs {
        Gs::Uniform(g) => GlobalScale::Uniform(*g),
        Gs::PerRow(v) => GlobalScale::PerRow(v),
    };
    match residual {
        Some(r) => {
            let r = MatMut::with_stride(r, c.m, c.h, c.stride)?;
            if reference {
                fp4norm::reference::add_rmsnorm_fp4quant(x, r, w, out, gs, opts)
            } else {
                fp4norm::cpu::add_rmsnorm_fp4quant(x, r, w, out, gs, opts)
            }
        }
        None if reference => fp4norm::reference::rmsnorm_fp4quant(x, w, out, gs, opts),
        None => fp4norm::cpu::rmsnorm_fp4quant(x, w, out, gs, opts),
    }
}

/// One FP8 call (SPEC.md §8) on the host; a per-tensor scale is the options' value.
#[allow(clippy::too_many_arguments)]
fn call_fp8<T: Element>(
    reference: bool,
    c: &Case,
    opts: &Fp8Options,
    x: &[T],
    w: &[T],
    residual: Option<&mut [T]>,
    q: &mut [u8],
    scales: Fp8Scales<'_>,
    y_out: Option<&mut [T]>,
) -> Result<(), fp4norm::Error> {
    use fp4norm::fp8::{cpu, reference as spec};
    let x = MatRef::with_stride(x, c.m, c.h, c.stride)?;
    let y_out = match y_out {
        Some(y) => Some(MatMut::with_stride(y, c.m, c.h, c.stride)?),
        None => None,
    };
    let out = Fp8Out { q, scales, y_out };
    match residual {
        Some(r) => {
            let r = MatMut::with_stride(r, c.m, c.h, c.stride)?;
            if reference {
                spec::add_rmsnorm_fp8quant(x, r, w, out, opts)
            } else {
                cpu::add_rmsnorm_fp8quant(x, r, w, out, opts)
            }
        }
        None if reference => spec::rmsnorm_fp8quant(x, w, out, opts),
        None => cpu::rmsnorm_fp8quant(x, w, out, opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_cuda() -> Result<&'static str, CliError> {
        Err(CliError("libcuda.so was not found".into()))
    }

    #[test]
    fn auto_says_why_cuda_is_not_used_or_fails_where_a_gpu_is_required() {
        let cpu = || "cpu";
        // Without CUDA: the CPU, and the reason on a line of its own.
        let (v, why) = select(Device::Auto, true, false, no_cuda, cpu).unwrap();
        assert_eq!(v, ["cpu"]);
        assert_eq!(
            why.as_deref(),
            Some("cuda: not used: libcuda.so was not found")
        );
        let (v, why) = select(Device::Auto, false, false, no_cuda, cpu).unwrap();
        assert_eq!((v, why.is_some()), (vec!["cpu"], true));
        // FP4NORM_REQUIRE_GPU: an error that names the variable and the reason.
        let e = select(Device::Auto, true, true, no_cuda, cpu).unwrap_err();
        assert!(
            e.0.contains("FP4NORM_REQUIRE_GPU") && e.0.contains("libcuda.so was not found"),
            "{e}"
        );
        // --device cuda: the reason as the error, required or not.
        let e = select(Device::Cuda, true, false, no_cuda, cpu).unwrap_err();
        assert_eq!(e.0, "libcuda.so was not found");
        // --device cpu: CUDA is not even opened, and a required GPU does not apply.
        let opened = std::cell::Cell::new(false);
        let spy = || {
            opened.set(true);
            no_cuda()
        };
        let (v, why) = select(Device::Cpu, true, true, spy, cpu).unwrap();
        assert_eq!((v, why, opened.get()), (vec!["cpu"], None, false));
        // With CUDA: verify checks both (CUDA first), bench runs on CUDA; nothing to say.
        let cuda = || Ok("cuda");
        assert_eq!(
            select(Device::Auto, true, true, cuda, cpu).unwrap(),
            (vec!["cuda", "cpu"], None)
        );
        assert_eq!(
            select(Device::Auto, false, false, cuda, cpu).unwrap(),
            (vec!["cuda"], None)
        );
        assert_eq!(
            select(Device::Cuda, true, false, cuda, cpu).unwrap(),
            (vec!["cuda"], None)
        );
    }
}
