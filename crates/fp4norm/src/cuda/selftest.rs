//! The conversion self-test: before a device's first kernel, fp4norm checks the fast
//! conversions its kernels rely on against the literal SPEC.md encoders, and the fused
//! kernel against the CPU reference, on that device. A GPU fp4norm has never run on (a new
//! Blackwell part, a new driver or compiler) then either proves the fast path or gets the
//! literal one, with the same bytes either way, instead of wrong bytes.
//!
//! What runs: the codec self-check kernel on every f32 input and every E4M3 code (the
//! E2M1 encoders, incl. the hardware `cvt.rn.satfinite.e2m1x2.f32` on sm_100a-class
//! targets; the E4M3 hardware encode and decode; the division-free block scales; the FP8
//! element pair conversions, E4M3 and E5M2; NaN, ±0, ±Inf, subnormals and every tie are
//! among those inputs; and the rsqrt seed of the rstd decision, against the error its
//! margin allows: `sumsq::rstd_by_seed`), then fused calls in both formats and both
//! element dtypes, both scale layouts, and FP8 calls (MXFP8, per-token E5M2, a per-tensor scale), on rows that
//! reach saturated, subnormal and NaN blocks, compared byte for byte with the reference. The packed
//! bf16/f16 conversions and the NaN fix-up are exercised by those calls, not exhaustively.
//!
//! The verdict is kept on disk per device name, compute capability, driver, NVRTC and
//! kernel source (`<cache dir>/selftest/<hash>.txt`), and in memory per process and device.
//! On a failure a warning says so once and every kernel on that device is compiled with the
//! literal encoders (`FP4_LITERAL_CODECS`) and the IEEE rstd chain. `FP4NORM_SELFTEST`
//! forces either path or a new run (see `knobs::selftest_mode`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::{bf16, f16};

use super::{kernel, knobs, nvrtc, Gpu, LaunchOptions};
use crate::fp8::{run_host_fp8, Fp8Element, Fp8Options, RawFp8Call};
use crate::raw::{run_host, HostEngine, RawBuf, RawCall, RawGlobalScale, RawMat};
use crate::{DType, Error, Fp4Format, Options, Problem, ScaleLayout, ScaleOut};

/// How `FP4NORM_SELFTEST` asks for the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The cached verdict, else a run (the default).
    Auto,
    /// A run, whatever is cached.
    Rerun,
    /// No run: the hardware conversions.
    Hardware,
    /// No run: the literal encoders.
    Literal,
}

/// Which conversions a device's kernels use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversionPath {
    /// The fast conversions (hardware instructions, division-free scales) where true; the
    /// literal SPEC.md encoders where false. The bytes are the same.
    pub fast: bool,
    /// Why: the self-test's outcome (and whether it was read from the cache), or the
    /// `FP4NORM_SELFTEST` setting.
    pub reason: String,
}

/// Verdicts of this process, by device ordinal.
fn memo() -> &'static Mutex<HashMap<usize, ConversionPath>> {
    static MEMO: OnceLock<Mutex<HashMap<usize, ConversionPath>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

/// The path already known for `gpu`'s device without running anything on it: forced by
/// `FP4NORM_SELFTEST`, this process's verdict, or (in `auto` mode) the disk cache's.
pub(crate) fn known_path(gpu: &Gpu) -> Option<ConversionPath> {
    let mode = knobs::selftest_mode();
    match mode {
        Mode::Hardware => {
            return Some(ConversionPath {
                fast: true,
                reason: "FP4NORM_SELFTEST=hardware: not tested".into(),
            })
        }
        Mode::Literal => {
            return Some(ConversionPath {
                fast: false,
                reason: "FP4NORM_SELFTEST=literal: the literal encoders".into(),
            })
        }
        Mode::Rerun => return None,
        Mode::Auto => {}
    }
    let mut memo = memo().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = memo.get(&gpu.ordinal()) {
        return Some(v.clone());
    }
    let v = verdict_file(gpu).and_then(|f| read_verdict(&f))?;
    memo.insert(gpu.ordinal(), v.clone());
    Some(v)
}

/// The conversion path for the device `probe` runs on; `probe` must use the fast path
/// (the path under test).
pub(crate) fn conversion_path(probe: &Gpu) -> Result<ConversionPath, Error> {
    if let Some(v) = known_path(probe) {
        return Ok(v);
    }
    // One run per process and device at a time; a second caller finds the first's verdict.
    static RUNNING: Mutex<()> = Mutex::new(());
    let _one = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    if knobs::selftest_mode() == Mode::Auto {
        if let Some(v) = known_path(probe) {
            return Ok(v);
        }
    }
    let failure = run(probe)?;
    let path = ConversionPath {
        fast: failure.is_none(),
        reason: match &failure {
            None => format!("self-test passed on {}", probe.name()),
            Some(why) => format!("self-test failed on {}: {why}", probe.name()),
        },
    };
    if let Some(why) = &failure {
        eprintln!(
            "fp4norm: the conversion self-test failed on {} ({why}); its kernels use the \
             literal SPEC.md encoders (same bytes, slower). FP4NORM_SELFTEST=hardware \
             overrides.",
            probe.name()
        );
    }
    if let Some(f) = verdict_file(probe) {
        write_verdict(&f, &path);
    }
    memo()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(probe.ordinal(), path.clone());
    Ok(path)
}

/// Where the verdict for `gpu`'s device, driver, compiler and source is kept.
pub(crate) fn verdict_file(gpu: &Gpu) -> Option<std::path::PathBuf> {
    let key = cache_key(gpu);
    knobs::cache_dir().map(|d| d.join("selftest").join(format!("{key:016x}.txt")))
}

/// What identifies a verdict: the device, its driver, the compiler and the kernel source.
fn cache_key(gpu: &Gpu) -> u64 {
    let mut driver = 0i32;
    // SAFETY: an out-pointer to one int; the driver is loaded (a context exists).
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    let nvrtc = nvrtc::version().unwrap_or((0, 0));
    let text = format!(
        "v1|{}|{}|{}|{driver}|{nvrtc:?}|{:016x}|{}",
        gpu.name(),
        gpu.arch(),
        gpu.hw_e2m1,
        kernel::source_fingerprint(),
        env!("CARGO_PKG_VERSION"),
    );
    kernel::fnv1a(text.as_bytes())
}

fn read_verdict(file: &std::path::Path) -> Option<ConversionPath> {
    let text = std::fs::read_to_string(file).ok()?;
    let (head, reason) = text.split_once('\n')?;
    let fast = match head {
        "fast" => true,
        "literal" => false,
        _ => return None,
    };
    Some(ConversionPath {
        fast,
        reason: format!("{} (cached)", reason.trim_end()),
    })
}

/// Stores the verdict through a temporary file and a rename; a cache that cannot be
/// written only means the test runs again in the next process.
fn write_verdict(file: &std::path::Path, v: &ConversionPath) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let head = if v.fast { "fast" } else { "literal" };
    if std::fs::write(&tmp, format!("{head}\n{}\n", v.reason)).is_ok() {
        let _ = std::fs::rename(&tmp, file);
    }
    let _ = std::fs::remove_file(&tmp);
}

/// Runs the checks on `probe`'s device; `Some(why)` on the first mismatch.
pub(crate) fn run(probe: &Gpu) -> Result<Option<String>, Error> {
    let stream = probe
        .ctx
        .new_stream()
        .map_err(super::driver_err("creating the self-test's stream"))?;
    let codec = probe.codec_self_check(&stream)?;
    if !codec.passed() {
        return Ok(Some(format!("codec check: {codec:?}")));
    }
    for dtype in [DType::BF16, DType::F16] {
        for format in [Fp4Format::NVFP4, Fp4Format::MXFP4] {
            if let Some(why) = fused_case(probe, &stream, dtype, format)? {
                return Ok(Some(why));
            }
        }
        for opts in [
            Fp8Options::mxfp8(),
            Fp8Options::per_token(Fp8Element::E5M2),
            Fp8Options::per_tensor(Fp8Element::E4M3, 0.03),
        ] {
            if let Some(why) = fp8_case(probe, &stream, dtype, &opts)? {
                return Ok(Some(why));
            }
        }
    }
    Ok(None)
}

/// One FP8 call (residual, the options' scaling) on the device and on the reference;
/// `Some(why)` where any byte differs.
fn fp8_case(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    dtype: DType,
    opts: &Fp8Options,
) -> Result<Option<String>, Error> {
    let (m, h) = (130, 2048);
    let p = crate::fp8::Fp8Problem::new(m, h, dtype, opts)?;
    let x = test_rows(m, h, dtype, 0x5eed_0004);
    let mut r_host = test_rows(m, h, dtype, 0x5eed_0005);
    let w: Vec<u16> = test_rows(1, h, dtype, 0x5eed_0006);
    let sf_bytes = p.scales_len() * p.scale_element_bytes();
    let mut q_host = vec![0u8; p.q_len()];
    // Scale bytes as u32 words (f32 scales need their alignment; UE8M0 uses the bytes).
    let mut sf_host = vec![0u32; sf_bytes.div_ceil(4)];
    let dev = |e: cudarc::driver::DriverError| Error::Cuda {
        context: "the self-test's buffers",
        message: e.to_string(),
    };
    let x_d = stream.clone_htod(&x).map_err(dev)?;
    let mut r_d = stream.clone_htod(&r_host).map_err(dev)?;
    let w_d = stream.clone_htod(&w).map_err(dev)?;
    let mut q_d = stream.clone_htod(&vec![0xA5u8; p.q_len()]).map_err(dev)?;
    let mut sf_d = stream
        .clone_htod(&vec![0xA5A5_A5A5u32; sf_bytes.div_ceil(4).max(1)])
        .map_err(dev)?;
    let call = |x: u64, r: u64, w: u64, q: u64, sf: u64| RawFp8Call {
        dtype,
        x: RawMat::contiguous(x, m, h),
        residual: Some(RawMat::contiguous(r, m, h)),
        weight: RawBuf::new(w, h),
        q: RawBuf::new(q, p.q_len()),
        scales: p.scale_format().map(|_| RawBuf::new(sf, p.scales_len())),
        static_scale: None,
        y_out: None,
        options: *opts,
    };
    {
        let (xp, _gx) = x_d.device_ptr(stream);
        let (rp, _gr) = r_d.device_ptr_mut(stream);
        let (wp, _gw) = w_d.device_ptr(stream);
        let (qp, _gq) = q_d.device_ptr_mut(stream);
        let (sfp, _gsf) = sf_d.device_ptr_mut(stream);
        let c = call(xp, rp, wp, qp, sfp);
        // SAFETY: every pointer is a live allocation of this stream's device with the
        // length given; the guards keep them until after the launch.
        unsafe { gpu.launch_fp8_raw(stream.cu_stream(), &c, &LaunchOptions::default())? };
    }
    let host = call(
        x.as_ptr() as u64,
        r_host.as_mut_ptr() as u64,
        w.as_ptr() as u64,
        q_host.as_mut_ptr() as u64,
        sf_host.as_mut_ptr() as u64,
    );
    // SAFETY: host vectors of the lengths given, alive until the call returns.
    unsafe { run_host_fp8(&host, HostEngine::Reference)? };
    let back = |e: cudarc::driver::DriverError| Error::Cuda {
        context: "reading the self-test's outputs",
        message: e.to_string(),
    };
    let got_q: Vec<u8> = stream.clone_dtoh(&q_d).map_err(back)?;
    let got_sf: Vec<u32> = stream.clone_dtoh(&sf_d).map_err(back)?;
    let r_back: Vec<u16> = stream.clone_dtoh(&r_d).map_err(back)?;
    let bytes = |v: &[u32]| -> Vec<u8> {
        v.iter()
            .flat_map(|w| w.to_le_bytes())
            .take(sf_bytes)
            .collect()
    };
    let name = format!("{dtype} FP8 {} {:?}", opts.element, opts.scaling);
    for (what, got, want) in [
        ("codes", got_q, q_host),
        ("scales", bytes(&got_sf), bytes(&sf_host)),
    ] {
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            return Ok(Some(format!(
                "fused {name}: {what} byte {i} is {:#04x}, the reference {:#04x}",
                got[i], want[i]
            )));
        }
    }
    if let Some(i) = (0..r_host.len()).find(|&i| r_back[i] != r_host[i]) {
        return Ok(Some(format!("fused {name}: residual element {i} differs")));
    }
    Ok(None)
}

/// Rows of the self-test's fused calls: random values at magnitudes from 2^-30 to 2^14
/// (subnormal, normal and saturated block scales), and rows with NaN, ±Inf, -0 and zeros.
fn test_rows(m: usize, h: usize, dtype: DType, seed: u64) -> Vec<u16> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let enc = |v: f32| match dtype {
        DType::BF16 => bf16::from_f32(v).to_bits(),
        DType::F16 => f16::from_f32(v).to_bits(),
    };
    let mut out = Vec::with_capacity(m * h);
    for row in 0..m {
        let exp = (row % 45) as i32 - 30;
        for col in 0..h {
            let r = next();
            let unit = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let v = match (row % 9, col % 61) {
                (0, 0) => f32::NAN,
                (1, 3) => f32::INFINITY,
                (2, 5) => f32::NEG_INFINITY,
                (3, _) => -0.0,
                (4, _) if col % 2 == 0 => 0.0,
                _ => unit * (2.0f32).powi(exp),
            };
            out.push(enc(v));
        }
    }
    out
}

/// One fused call (residual, both scale layouts, a global scale for NVFP4) on the device
/// and on the reference; `Some(why)` where any byte differs.
fn fused_case(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    dtype: DType,
    format: Fp4Format,
) -> Result<Option<String>, Error> {
    let (m, h) = (130, 2048);
    let opts = Options::default().with_format(format);
    let p = Problem::new(m, h, dtype, ScaleLayout::Both, &opts)?;
    let x = test_rows(m, h, dtype, 0x5eed_0001 ^ h as u64);
    let mut r_host = test_rows(m, h, dtype, 0x5eed_0002);
    let w: Vec<u16> = test_rows(1, h, dtype, 0x5eed_0003);
    let gs = [2.5f32];
    let (q_len, rm_len, sw_len) = (m * h / 2, m * p.n_blocks(), p.swizzled_scales_len());
    let mut q_host = vec![0u8; q_len];
    let mut rm_host = vec![0u8; rm_len];
    let mut sw_host = vec![0u8; sw_len];

    let dev = |e: cudarc::driver::DriverError| Error::Cuda {
        context: "the self-test's buffers",
        message: e.to_string(),
    };
    let x_d = stream.clone_htod(&x).map_err(dev)?;
    let mut r_d = stream.clone_htod(&r_host).map_err(dev)?;
    let w_d = stream.clone_htod(&w).map_err(dev)?;
    let gs_d = stream.clone_htod(&gs).map_err(dev)?;
    // Poisoned outputs: a byte the kernel does not write shows.
    let mut q_d = stream.clone_htod(&vec![0xA5u8; q_len]).map_err(dev)?;
    let mut rm_d = stream.clone_htod(&vec![0xA5u8; rm_len]).map_err(dev)?;
    let mut sw_d = stream.clone_htod(&vec![0xA5u8; sw_len]).map_err(dev)?;

    let call = |x: u64, r: u64, w: u64, q: u64, rm: u64, sw: u64, g: u64| RawCall {
        dtype,
        x: RawMat {
            ptr: x,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        },
        residual: Some(RawMat {
            ptr: r,
            rows: m,
            cols: h,
            row_stride: h,
            len: Some(m * h),
        }),
        weight: RawBuf::new(w, h),
        y_fp4: RawBuf::new(q, q_len),
        scales: ScaleOut::Both {
            row_major: RawBuf::new(rm, rm_len),
            swizzled: RawBuf::new(sw, sw_len),
        },
        y_out: None,
        global_scale: RawGlobalScale::Uniform(RawBuf::new(g, 1)),
        options: opts,
    };
    {
        let (xp, _gx) = x_d.device_ptr(stream);
        let (rp, _gr) = r_d.device_ptr_mut(stream);
        let (wp, _gw) = w_d.device_ptr(stream);
        let (qp, _gq) = q_d.device_ptr_mut(stream);
        let (rmp, _grm) = rm_d.device_ptr_mut(stream);
        let (swp, _gsw) = sw_d.device_ptr_mut(stream);
        let (gp, _gg) = gs_d.device_ptr(stream);
        let c = call(xp, rp, wp, qp, rmp, swp, gp);
        // SAFETY: every pointer is a live allocation of this stream's device with the
        // length given; the guards keep them until after the launch.
        unsafe { gpu.launch_raw_with(stream.cu_stream(), &c, &LaunchOptions::default())? };
    }
    let host = call(
        x.as_ptr() as u64,
        r_host.as_mut_ptr() as u64,
        w.as_ptr() as u64,
        q_host.as_mut_ptr() as u64,
        rm_host.as_mut_ptr() as u64,
        sw_host.as_mut_ptr() as u64,
        gs.as_ptr() as u64,
    );
    // SAFETY: host vectors of the lengths given, alive until the call returns.
    unsafe { run_host(&host, HostEngine::Reference)? };
    let back = |e: cudarc::driver::DriverError| Error::Cuda {
        context: "reading the self-test's outputs",
        message: e.to_string(),
    };
    let checks = [
        ("y_fp4", stream.clone_dtoh(&q_d).map_err(back)?, q_host),
        (
            "row-major scales",
            stream.clone_dtoh(&rm_d).map_err(back)?,
            rm_host,
        ),
        (
            "swizzled scales",
            stream.clone_dtoh(&sw_d).map_err(back)?,
            sw_host,
        ),
    ];
    let r_back: Vec<u16> = stream.clone_dtoh(&r_d).map_err(back)?;
    let name = format!("{dtype} {}", format.name());
    for (what, got, want) in checks {
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            return Ok(Some(format!(
                "fused {name}: {what} byte {i} is {:#04x}, the reference {:#04x}",
                got[i], want[i]
            )));
        }
    }
    if let Some(i) = (0..r_host.len()).find(|&i| r_back[i] != r_host[i]) {
        return Ok(Some(format!("fused {name}: residual element {i} differs")));
    }
    Ok(None)
}
