//! The CUDA raw-pointer entry points: the device checks a call adds to the one validator
//! ([`crate::raw`]), and the kernel launches.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::kernel::{self, GsMode, KernelConfig, KernelKind};
use super::Gpu;
use crate::layout::{swizzled_col_tiles, swizzled_rows, ScaleLayout};
use crate::raw::{
    check_overlaps, Checked, Range, RawCall, RawDequant, RawGlobalScale, RawMat, RANK_INPUT_NAMES,
};
use crate::{Error, ScaleFormat, ScaleOut};

/// How one raw call is launched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Programmatic dependent launch for this call (sm_90+; ignored before): `None` keeps
    /// the setting of [`Gpu::set_programmatic_dependent_launch`].
    pub pdl: Option<bool>,
    /// The caller has established that every buffer of the call is memory of this GPU
    /// (PyTorch knows each tensor's device): the per-pointer driver query is skipped.
    pub devices_checked: bool,
}

/// Kernel arguments; mirrors `struct Fp4NormParams` in kernel/cu/fused.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FusedParams {
    x: u64,
    r: u64,
    w: u64,
    q: u64,
    sf_row_major: u64,
    sf_swizzled: u64,
    y_out: u64,
    gs: u64,
    m: i64,
    rows_total: i64,
    x_stride: i64,
    r_stride: i64,
    y_stride: i64,
    eps: f32,
    /// L2 prefetch distance in rows, 0 = none ([`kernel::l2_prefetch_rows`]).
    pf_rows: u32,
    /// Added to every weight; declared by the kernel only where it is nonzero
    /// (`FP4_WBIAS`): the driver copies the parameter size the kernel declares.
    weight_bias: f32,
    /// The FP8 kernels' f32 scale floor and per-tensor scale value (declared only by them).
    s_min: f32,
    static_scale: f32,
    /// The ranks' inputs of an all-reduce call, rank order (declared only by those kernels);
    /// over peer access, the ranks' buffers.
    ar_x: [u64; 8],
    /// Over peer access (declared only by those kernels): the ranks' signal pads, the
    /// buffers' row stride, this rank, and whether `x` is copied into its buffer first.
    ar_signal: [u64; 8],
    ar_stride: i64,
    ar_rank: u32,
    ar_copy: u32,
}

/// The ranks of an all-reduce call: none, inputs gathered on this GPU (ranks after the
/// first; `x` is rank 0's), or every rank's buffer over peer access.
#[derive(Clone, Copy)]
pub(crate) enum Ranks<'a> {
    Gathered(&'a [RawMat]),
    Peers(&'a RawPeers<'a>),
}

impl Ranks<'_> {
    fn count(&self) -> usize {
        match self {
            Ranks::Gathered([]) => 0,
            Ranks::Gathered(more) => more.len() + 1,
            Ranks::Peers(p) => p.buffers.len(),
        }
    }
}

/// The ranks of a fused all-reduce that reads their inputs over peer access (SPEC.md §9):
/// each rank's buffer and signal pad as mapped on this GPU, in rank order — a symmetric
/// allocation such as PyTorch's `torch.distributed._symmetric_memory` or CUDA IPC gives.
/// Every rank launches the same call (shape, format, layout, options) with its own `rank`;
/// CTA b of each rank copies its rows of `x` into its buffer (unless `x` is that buffer),
/// meets CTA b of every rank through the pads, sums the ranks' rows in rank order and runs
/// the op, then meets them again so that no buffer is overwritten while a peer reads it.
#[derive(Clone, Copy, Debug)]
pub struct RawPeers<'a> {
    /// Each rank's buffer (`[m, row_stride]` elements of the call's dtype), rank order.
    pub buffers: &'a [u64],
    /// Elements between rows of every buffer (at least `H`).
    pub row_stride: usize,
    /// Each rank's signal pad: u32 words, all 0 before the first call (the kernel leaves them
    /// 0), rank order; [`RawPeers::signal_words_needed`] words each.
    pub signal_pads: &'a [u64],
    /// Words of each signal pad.
    pub signal_pad_words: usize,
    /// This rank (an index into `buffers`).
    pub rank: usize,
    /// How the ranks' rows move: every rank the same.
    pub strategy: PeerStrategy,
}

/// How a call over peer access moves the ranks' rows (docs/tensor-parallel.md). Both give
/// the same bytes (SPEC.md §9); they differ in what crosses the links and in meetings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerStrategy {
    /// Every rank reads every rank's rows and sums them itself: `W·H` elements of a row
    /// read, two meetings of the ranks. For the fewest rows.
    #[default]
    OneShot,
    /// Reduce-scatter, then all-gather: vector `v` (8 elements) of each row is summed by
    /// rank `v mod W` alone, which leaves that sum, rounded to the dtype, in its buffer in
    /// place of its input there; then every rank reads each vector's sum from its owner:
    /// `2·H` elements of a row read, three meetings. The buffers do not keep the inputs.
    TwoShot,
}

/// Bytes of peer reads per rank above which [`PeerStrategy::for_call`] takes the two-shot
/// schedule: about a microsecond of NVLink (~450 GB/s each way on Hopper), the price of its
/// third meeting. A model of the link, not yet a measurement (docs/tensor-parallel.md).
pub const TWO_SHOT_MIN_SAVED_BYTES: usize = 512 << 10;

impl PeerStrategy {
    /// The schedule for a call of `m` rows of `h` elements of `dtype` over `ranks` ranks:
    /// two-shot where the bytes it saves each rank, `m·h·size·(W−1)·(W−2)/W` (one-shot
    /// reads `W−1` peers' rows, two-shot twice a `1/W` share of them), reach
    /// [`TWO_SHOT_MIN_SAVED_BYTES`]; one-shot below that and for 1 or 2 ranks (where it reads
    /// no more). Every rank computes the same from the same call.
    pub fn for_call(m: usize, h: usize, dtype: crate::DType, ranks: usize) -> PeerStrategy {
        if ranks < 3 {
            return PeerStrategy::OneShot;
        }
        // (In u128, saturating: no call is that large, but the rule must not overflow.)
        let saved = [h, dtype.size(), ranks - 1, ranks - 2]
            .iter()
            .fold(m as u128, |acc, &f| acc.saturating_mul(f as u128))
            / ranks as u128;
        if saved >= TWO_SHOT_MIN_SAVED_BYTES as u128 {
            PeerStrategy::TwoShot
        } else {
            PeerStrategy::OneShot
        }
    }
}

impl RawPeers<'_> {
    /// Signal-pad words a call of `ctas` CTAs over `ranks` ranks uses: one per CTA and rank.
    pub fn signal_words_needed(ctas: usize, ranks: usize) -> usize {
        ctas * ranks
    }

    /// The checks that need no device: 1 to 8 ranks, a pad per rank, this rank among them
    /// (the launch makes them too, with the addresses' and the pads' size).
    pub fn check_ranks(&self) -> Result<(), Error> {
        let w = self.buffers.len();
        if !(1..=8).contains(&w) {
            return Err(Error::Unsupported(format!(
                "{w} ranks: the fused all-reduce over peer access sums 1 to 8"
            )));
        }
        if self.signal_pads.len() != w {
            return Err(Error::Unsupported(format!(
                "{} signal pads for {w} ranks: one per rank",
                self.signal_pads.len()
            )));
        }
        if self.rank >= w {
            return Err(Error::Unsupported(format!(
                "rank {} of {w} ranks",
                self.rank
            )));
        }
        Ok(())
    }
}

/// Checks the peer ranks of a call on this GPU: 1 to 8 ranks, at most `max_rows` rows (one
/// per SM: the few-row shapes, whose grids are resident at once), buffers and pads
/// aligned, this rank's buffer (written where `x` is copied into it) against the call's
/// ranges. Returns whether `x` is copied.
#[allow(clippy::too_many_arguments)]
fn check_peers(
    dtype: crate::DType,
    x: &RawMat,
    has_residual: bool,
    m: usize,
    h: usize,
    max_rows: usize,
    peers: &RawPeers,
    ranges: &mut Vec<Range>,
    vector_aligned: &mut bool,
) -> Result<bool, Error> {
    peers.check_ranks()?;
    if m > max_rows {
        return Err(Error::Unsupported(format!(
            "{m} rows over peer access: at most {max_rows} (one per SM), where every CTA of a \
             rank's grid is resident at once and so cannot wait for a peer CTA that is not; \
             gather the ranks' inputs for more"
        )));
    }
    if !has_residual {
        return Err(Error::Unsupported(
            "the fused all-reduce on the GPU needs a residual (it keeps the ranks' sum there)"
                .into(),
        ));
    }
    if peers.row_stride < h {
        return Err(Error::Unsupported(format!(
            "the ranks' buffers have rows of {} elements, fewer than H = {h}",
            peers.row_stride
        )));
    }
    let e = dtype.size();
    let bytes = peers
        .row_stride
        .checked_mul(m.saturating_sub(1))
        .and_then(|n| n.checked_add(h))
        .and_then(|n| n.checked_mul(e))
        .ok_or(Error::SizeOverflow)?;
    for &b in peers.buffers {
        check_ptr("a rank's buffer", b, e)?;
        *vector_aligned &= b % 16 == 0;
    }
    // Wrapping, as in `RawCall::validate`: a stride no row uses may be any value.
    *vector_aligned &= peers.row_stride.wrapping_mul(e) % 16 == 0;
    for &s in peers.signal_pads {
        check_ptr("a signal pad", s, 4)?;
    }
    let own = peers.buffers[peers.rank];
    let copy = !(x.ptr == own && (x.row_stride == peers.row_stride || m <= 1));
    if copy {
        // This rank's buffer is written: it must not meet x or an output.
        ranges.push(Range::new("this rank's buffer", own, bytes, true)?);
    }
    // (The other ranks' buffers and every pad are other GPUs' memory, mapped here: not
    // checked against this GPU.)
    check_overlaps(ranges)?;
    Ok(copy)
}

/// Mirrors `struct Fp4SwizzleParams` in kernel/cu/swizzle.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SwizzleParams {
    sf_row_major: u64,
    sf_swizzled: u64,
    m: i64,
}

/// Mirrors `struct Fp8ColumnScalesParams` in kernel/cu/column_scales.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ColumnScalesParams {
    sf: u64,
    m: i64,
}

/// Mirrors `struct Fp4DequantParams` in kernel/cu/dequant.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DequantParams {
    q: u64,
    sf: u64,
    gs: u64,
    out: u64,
    m: i64,
}

/// Launches `f` on `stream`, with programmatic dependent launch when the GPU's setting
/// asks for it (sm_90+).
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    grid: u32,
    block: u32,
    pdl: bool,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
    what: &'static str,
) -> Result<(), Error> {
    // SAFETY: forwarded; no cluster.
    unsafe { launch_clustered(gpu, f, grid, block, 1, pdl, stream, args, what) }
}

/// As [`launch`], in thread-block clusters of `cluster` CTAs when `cluster > 1`
/// (`grid` must be a multiple of it), with programmatic dependent launch when `pdl`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_clustered(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    grid: u32,
    block: u32,
    cluster: u32,
    pdl: bool,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
    what: &'static str,
) -> Result<(), Error> {
    gpu.ctx.bind_to_thread().map_err(|e| Error::Cuda {
        context: "binding the context",
        message: e.to_string(),
    })?;
    // SAFETY: zeroed attributes are valid plain-data values; only the members named by
    // each id are set.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if pdl {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if cluster > 1 {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim.x = cluster;
        attrs[n].value.clusterDim.y = 1;
        attrs[n].value.clusterDim.z = 1;
        n += 1;
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: if n > 0 {
            attrs.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        numAttrs: n as u32,
    };
    // SAFETY: the caller passes arguments matching the kernel's signature.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Cuda {
            context: what,
            message: format!("{r:?}"),
        });
    }
    Ok(())
}

fn check_ptr(name: &'static str, ptr: u64, align: usize) -> Result<(), Error> {
    if ptr == 0 {
        return Err(Error::NullPointer { name });
    }
    if ptr % align as u64 != 0 {
        return Err(Error::Misaligned {
            name,
            address: ptr,
            required: align,
        });
    }
    Ok(())
}

/// Refuses a buffer that is not memory of `gpu`, naming it.
fn check_device(gpu: &Gpu, name: &'static str, ptr: u64) -> Result<(), Error> {
    let mut ordinal: i32 = -1;
    // SAFETY: an out-parameter of the attribute's documented type (int).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ordinal != gpu.ordinal() as i32 {
        return Err(Error::DeviceMismatch {
            name,
            expected: format!("cuda:{}", gpu.ordinal()),
            got: if r == sys::CUresult::CUDA_SUCCESS {
                format!("cuda:{ordinal}")
            } else {
                "host or unknown memory".into()
            },
        });
    }
    Ok(())
}

/// The one validator, then the device checks of a call: every buffer on this GPU.
fn validate_on(gpu: &Gpu, checked: Checked, opts: &LaunchOptions) -> Result<Checked, Error> {
    check_devices(gpu, &checked.ranges, opts)?;
    Ok(checked)
}

/// The device check of every range of a validated call (unless the caller did it).
fn check_devices(gpu: &Gpu, ranges: &[Range], opts: &LaunchOptions) -> Result<(), Error> {
    if !opts.devices_checked {
        for r in ranges {
            check_device(gpu, r.name, r.start)?;
        }
    }
    Ok(())
}

fn gs_mode(g: RawGlobalScale) -> (GsMode, u64) {
    match g {
        RawGlobalScale::None => (GsMode::None, 0),
        RawGlobalScale::Uniform(b) => (GsMode::Uniform, b.ptr),
        RawGlobalScale::PerRow(b) => (GsMode::PerRow, b.ptr),
    }
}

pub(crate) unsafe fn launch_fused(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &RawCall,
    opts: &LaunchOptions,
) -> Result<(), Error> {
    // SAFETY: forwarded.
    unsafe { launch_fused_with_ranks(gpu, stream, c, Ranks::Gathered(&[]), opts) }
}

/// `cfg` for a call over `ranks`: how many are summed, over peer access or not, and the
/// peer schedule (the FP4 and FP8 launches alike).
fn with_ranks(cfg: KernelConfig, ranks: Ranks) -> KernelConfig {
    // (The all-reduce kernels write column-major scales directly.)
    let fp8 = cfg.fp8.map(|f| crate::cuda::kernel::Fp8Spec {
        split_scales: f.split_scales && ranks.count() == 0,
        ..f
    });
    KernelConfig {
        fp8,
        ar_ranks: ranks.count() as u32,
        ar_peer: matches!(ranks, Ranks::Peers(_)),
        ar_two_shot: matches!(ranks, Ranks::Peers(p) if p.strategy == PeerStrategy::TwoShot),
        ..cfg
    }
}

/// The kernel's rank parameters: (ar_x, ar_signal, ar_stride, ar_rank), `x` being rank 0's
/// input where the ranks are gathered.
fn rank_params(x: &RawMat, ranks: Ranks) -> ([u64; 8], [u64; 8], i64, u32) {
    let (mut ar_x, mut ar_signal) = ([0u64; 8], [0u64; 8]);
    match ranks {
        Ranks::Gathered(more) => {
            if !more.is_empty() {
                ar_x[0] = x.ptr;
                for (slot, x) in ar_x[1..].iter_mut().zip(more) {
                    *slot = x.ptr;
                }
            }
            (ar_x, ar_signal, 0, 0)
        }
        Ranks::Peers(p) => {
            ar_x[..p.buffers.len()].copy_from_slice(p.buffers);
            ar_signal[..p.signal_pads.len()].copy_from_slice(p.signal_pads);
            (ar_x, ar_signal, p.row_stride as i64, p.rank as u32)
        }
    }
}

/// The peer ranks' signal pads hold a word per CTA and rank of the launch (`grid` CTAs).
fn check_signal_words(ranks: Ranks, grid: usize) -> Result<(), Error> {
    if let Ranks::Peers(p) = ranks {
        let need = RawPeers::signal_words_needed(grid, p.buffers.len());
        if p.signal_pad_words < need {
            return Err(Error::Unsupported(format!(
                "signal pads of {} words: this call's {grid} CTAs over {} ranks need {need}",
                p.signal_pad_words,
                p.buffers.len()
            )));
        }
    }
    Ok(())
}

/// The fused kernel's grid over `rows_total` rows of a call of `m`: rows per CTA, CTAs per
/// row, then the padding CTAs ([`kernel::pad_cta_count`]).
fn fused_grid(rows_total: usize, m: usize, cfg: &KernelConfig) -> usize {
    rows_total.div_ceil(cfg.rows_per_cta as usize) * cfg.cluster as usize
        + kernel::pad_cta_count(cfg, m)
}

/// The ranks of an all-reduce call (SPEC.md §9) of `m` rows of `h` with input `x`, for the
/// FP4 and FP8 calls alike: gathered ranks ([`check_rank_mats`]) or peers
/// ([`check_peers`]), their byte ranges joining the call's for the overlap and device
/// checks. Returns whether a peer call copies `x` into its buffer.
#[allow(clippy::too_many_arguments)]
fn check_ranks(
    gpu: &Gpu,
    dtype: crate::DType,
    x: &RawMat,
    has_residual: bool,
    m: usize,
    h: usize,
    ranks: Ranks,
    ranges: &mut Vec<Range>,
    vector_aligned: &mut bool,
) -> Result<bool, Error> {
    match ranks {
        Ranks::Gathered([]) => Ok(false),
        Ranks::Gathered(more) => {
            check_rank_mats(dtype, x, has_residual, m, more, ranges, vector_aligned)?;
            Ok(false)
        }
        Ranks::Peers(peers) => check_peers(
            dtype,
            x,
            has_residual,
            m,
            h,
            gpu.limits.sm_count as usize,
            peers,
            ranges,
            vector_aligned,
        ),
    }
}

/// The ranks after the first of an all-reduce call (SPEC.md §9), each like `x` (rank 0's
/// input, `m` its rows: shape and stride), read only.
fn check_rank_mats(
    dtype: crate::DType,
    x0: &RawMat,
    has_residual: bool,
    m: usize,
    more: &[RawMat],
    ranges: &mut Vec<Range>,
    vector_aligned: &mut bool,
) -> Result<(), Error> {
    if more.len() > RANK_INPUT_NAMES.len() {
        return Err(Error::Unsupported(format!(
            "{} ranks: the fused all-reduce sums 2 to 8",
            more.len() + 1
        )));
    }
    if !has_residual {
        return Err(Error::Unsupported(
            "the fused all-reduce on the GPU needs a residual (it keeps the ranks' sum there)"
                .into(),
        ));
    }
    let e = dtype.size();
    for (x, name) in more.iter().zip(RANK_INPUT_NAMES) {
        if x.row_stride != x0.row_stride && x.rows > 1 {
            return Err(Error::Unsupported(format!(
                "{name}: row stride {} differs from inputs[0]'s {}; the ranks' inputs share one stride",
                x.row_stride, x0.row_stride
            )));
        }
        let bytes = crate::raw::check_mat(name, x, x0.rows, x0.cols, e)?;
        if m > 0 {
            check_ptr(name, x.ptr, e)?;
        }
        *vector_aligned &= x.ptr % 16 == 0;
        ranges.push(Range::new(name, x.ptr, bytes, false)?);
    }
    ranges.retain(|r| r.start != r.end);
    check_overlaps(ranges)
}

/// The checks of an FP4 call that need no ranks (the validator, then the device checks),
/// for a transport that reads `x` before the kernel's launch checks it. Returns `(M, H)`.
pub(crate) fn precheck(
    gpu: &Gpu,
    c: &RawCall,
    opts: &LaunchOptions,
) -> Result<(usize, usize), Error> {
    let checked = c.validate()?;
    check_devices(gpu, &checked.ranges, opts)?;
    Ok((checked.problem.m, checked.problem.h))
}

/// [`precheck`] for an FP8 call.
pub(crate) fn precheck_fp8(
    gpu: &Gpu,
    c: &crate::fp8::RawFp8Call,
    opts: &LaunchOptions,
) -> Result<(usize, usize), Error> {
    let checked = c.validate()?;
    check_devices(gpu, &checked.ranges, opts)?;
    Ok((checked.problem.m, checked.problem.h))
}

/// The fused op, with `more` ranks' inputs summed in front of `c.x` (SPEC.md §9) where
/// `more` is not empty.
pub(crate) unsafe fn launch_fused_with_ranks(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &RawCall,
    ranks: Ranks,
    opts: &LaunchOptions,
) -> Result<(), Error> {
    let mut checked = c.validate()?;
    let (m, h) = (checked.problem.m, checked.problem.h);
    let copy = check_ranks(
        gpu,
        c.dtype,
        &c.x,
        c.residual.is_some(),
        m,
        h,
        ranks,
        &mut checked.ranges,
        &mut checked.vector_aligned,
    )?;
    let checked = validate_on(gpu, checked, opts)?;
    let (p, aligned) = (checked.problem, checked.vector_aligned);
    if p.m == 0 {
        return Ok(());
    }
    gpu.settle_conversions(stream)?;
    let pdl = gpu.pdl_for(opts.pdl);
    let (cfg, gs_ptr) = fused_config(gpu, c, &p, aligned, ranks);
    let (ar_x, ar_signal, ar_stride, ar_rank) = rank_params(&c.x, ranks);
    // Rows the fused kernel covers: with directly written swizzled scales whose padding is
    // not spread over the call's threads, the last 128-row tile's padding rows too (their
    // CTAs zero those scales); a split write's swizzle pass zeroes them instead.
    let rows_total = if p.layout.has_swizzled() && !cfg.swizzle_split && !cfg.pad_spread {
        swizzled_rows(p.m)
    } else {
        p.m
    };
    let (rm, sw) = c.scales.split();
    let (rm, sw) = (rm.map_or(0, |b| b.ptr), sw.map_or(0, |b| b.ptr));
    let mut params = FusedParams {
        x: c.x.ptr,
        r: c.residual.map_or(0, |r| r.ptr),
        w: c.weight.ptr,
        q: c.y_fp4.ptr,
        sf_row_major: rm,
        sf_swizzled: sw,
        y_out: c.y_out.map_or(0, |y| y.ptr),
        gs: gs_ptr,
        m: p.m as i64,
        rows_total: rows_total as i64,
        x_stride: c.x.row_stride as i64,
        r_stride: c.residual.map_or(0, |r| r.row_stride as i64),
        y_stride: c.y_out.map_or(0, |y| y.row_stride as i64),
        eps: p.eps,
        // (The prefetch would fetch the first rank's rows only: none for an all-reduce.)
        pf_rows: if cfg.ar_ranks == 0 {
            kernel::l2_prefetch_rows(&cfg, p.m, p.h, &gpu.limits)
        } else {
            0
        },
        weight_bias: p.weight_bias,
        s_min: 0.0,
        static_scale: 0.0,
        ar_x,
        ar_signal,
        ar_stride,
        ar_rank,
        ar_copy: copy as u32,
    };
    check_signal_words(ranks, fused_grid(rows_total, p.m, &cfg))?;
    let f = gpu.kernels.get(&gpu.ctx, &gpu.arch, &cfg)?;
    let pass = load_second_pass(gpu, &cfg)?;
    // SAFETY: the parameters' pointers were checked above; the caller guarantees the
    // memory is live.
    unsafe {
        launch_fused_kernel(
            gpu,
            stream,
            &f,
            &cfg,
            pdl,
            &mut params,
            "launching fp4norm_fused",
        )?
    };
    let Some(pass) = pass else {
        return Ok(());
    };
    let tiles = swizzled_rows(p.m) / 128;
    // One CTA per 128-row tile and 64-block chunk (16 column groups): fp4norm_swizzle's grid.
    let chunks = swizzled_col_tiles(p.n_blocks()).div_ceil(16);
    let mut params = SwizzleParams {
        sf_row_major: if p.layout.has_row_major() { rm } else { 0 },
        sf_swizzled: sw,
        m: p.m as i64,
    };
    // SAFETY: one struct by value, matching fp4norm_swizzle; its pointers are the call's
    // scale buffers, checked above.
    unsafe {
        launch_second_pass(
            gpu,
            stream,
            &pass,
            tiles * chunks,
            p.m,
            &mut params,
            "launching fp4norm_swizzle",
        )
    }
}

/// The second kernel of `cfg`'s split scale write, if it has one: loaded before the fused
/// kernel is launched, so that a failure to build it cannot leave the first's staging
/// behind.
fn load_second_pass(
    gpu: &Gpu,
    cfg: &KernelConfig,
) -> Result<Option<(KernelConfig, cudarc::driver::CudaFunction)>, Error> {
    match cfg.second_pass() {
        Some(pass) => Ok(Some((pass, gpu.kernels.get(&gpu.ctx, &gpu.arch, &pass)?))),
        None => Ok(None),
    }
}

/// Launches the second kernel of a split scale write (`pass`, as [`load_second_pass`] gives
/// it) over `ctas` CTAs (for a call of `m` rows) with `params` as its one argument; with programmatic dependent launch wherever
/// the GPU has it (sm_90+; splits are only chosen there, unless forced by a knob), so that
/// it waits for the fused kernel in griddepcontrol.wait and its launch overlaps that
/// kernel's tail.
///
/// # Safety
/// `params` is the kernel's parameter struct, by value, and its pointers are valid device
/// memory of `gpu`, live until the kernel completes.
unsafe fn launch_second_pass<P>(
    gpu: &Gpu,
    stream: sys::CUstream,
    pass: &(KernelConfig, cudarc::driver::CudaFunction),
    ctas: usize,
    m: usize,
    params: &mut P,
    what: &'static str,
) -> Result<(), Error> {
    let grid = u32::try_from(ctas)
        .map_err(|_| Error::Unsupported(format!("{m} rows exceed the grid limit")))?;
    let mut args = [params as *mut P as *mut c_void];
    // SAFETY: as the caller guarantees.
    unsafe {
        launch_clustered(
            gpu,
            &pass.1,
            grid,
            pass.0.block_threads(),
            1,
            gpu.pdl_capable,
            stream,
            &mut args,
            what,
        )
    }
}

pub(crate) unsafe fn launch_dequant(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &RawDequant,
    opts: &LaunchOptions,
) -> Result<(), Error> {
    let checked = validate_on(gpu, c.validate()?, opts)?;
    let p = checked.problem;
    if p.m == 0 {
        return Ok(());
    }
    gpu.settle_conversions(stream)?;
    // The kernel reads the packed codes as 32-bit words.
    check_ptr("y_fp4", c.y_fp4.ptr, 4)?;
    let (layout, sf) = match c.scales {
        ScaleOut::Swizzled(b) => (ScaleLayout::Swizzled, b.ptr),
        ScaleOut::RowMajor(b) | ScaleOut::Both { row_major: b, .. } => {
            (ScaleLayout::RowMajor, b.ptr)
        }
    };
    let global_scale = if c.format.scale == ScaleFormat::UE8M0 {
        RawGlobalScale::None
    } else {
        c.global_scale
    };
    let (gs, gs_ptr) = gs_mode(global_scale);
    let cfg = KernelConfig {
        h: p.h,
        block: p.block(),
        ue8m0: c.format.scale == ScaleFormat::UE8M0,
        row_major: layout == ScaleLayout::RowMajor,
        swizzled: layout == ScaleLayout::Swizzled,
        gs,
        literal_codecs: gpu.literal_codecs(),
        ..KernelConfig::shapeless(KernelKind::Dequant)
    };
    let f = gpu.kernels.get(&gpu.ctx, &gpu.arch, &cfg)?;
    let mut params = DequantParams {
        q: c.y_fp4.ptr,
        sf,
        gs: gs_ptr,
        out: c.out.ptr,
        m: p.m as i64,
    };
    let vectors = p.m * (p.h / 8);
    let grid = u32::try_from(vectors.div_ceil(256))
        .map_err(|_| Error::Unsupported("tensor too large for dequantize".into()))?;
    let mut args = [&mut params as *mut DequantParams as *mut c_void];
    // SAFETY: as in launch_fused.
    unsafe {
        launch(
            gpu,
            &f,
            grid,
            256,
            gpu.pdl_for(opts.pdl),
            stream,
            &mut args,
            "launching fp4norm_dequant",
        )
    }
}

/// Runs `fp4norm_codec_check` over every f32 input and returns its counters (see the
/// kernel's comment for their meaning); synchronises `stream`.
pub(crate) fn run_codec_check(
    gpu: &Gpu,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> Result<[u32; 15], Error> {
    let f = gpu.kernels.get(
        &gpu.ctx,
        &gpu.arch,
        &KernelConfig::shapeless(KernelKind::CodecCheck),
    )?;
    let init: [u32; 15] = [
        0,
        u32::MAX,
        0,
        u32::MAX,
        0,
        u32::MAX,
        0,
        0,
        u32::MAX,
        0,
        u32::MAX,
        0,
        u32::MAX,
        0,
        u32::MAX,
    ];
    let result = stream
        .clone_htod(&init)
        .map_err(super::driver_err("uploading the self-check counters"))?;
    let (mut ptr, _guard) = {
        use cudarc::driver::DevicePtr;
        result.device_ptr(stream)
    };
    let mut args = [&mut ptr as *mut u64 as *mut c_void];
    // SAFETY: one argument matching fp4norm_codec_check's signature, a live allocation of
    // fifteen u32 on this device.
    unsafe {
        launch(
            gpu,
            &f,
            gpu.limits.sm_count * 8,
            256,
            gpu.pdl_for(None),
            stream.cu_stream(),
            &mut args,
            "launching fp4norm_codec_check",
        )?;
    }
    drop(_guard);
    let got = stream
        .clone_dtoh(&result)
        .map_err(super::driver_err("reading the self-check counters"))?;
    got.try_into()
        .map_err(|_| Error::Unsupported("self-check returned a wrong count".into()))
}

pub(crate) unsafe fn launch_copy(
    gpu: &Gpu,
    stream: sys::CUstream,
    src: u64,
    dst: u64,
    bytes: usize,
) -> Result<(), Error> {
    check_ptr("src", src, 16)?;
    check_ptr("dst", dst, 16)?;
    if bytes % 16 != 0 {
        return Err(Error::Unsupported(format!(
            "copy of {bytes} bytes: use a multiple of 16"
        )));
    }
    check_overlaps(&[
        Range::new("src", src, bytes, false)?,
        Range::new("dst", dst, bytes, true)?,
    ])?;
    let f = gpu.kernels.get(
        &gpu.ctx,
        &gpu.arch,
        &KernelConfig::shapeless(KernelKind::Copy),
    )?;
    let mut n = (bytes / 16) as i64;
    let (mut s, mut d) = (src, dst);
    // Four CTAs per SM for large copies; no more CTAs than 512-thread groups of vectors.
    let grid = (gpu.limits.sm_count as i64 * 4).min((n + 511) / 512).max(1) as u32;
    let mut args = [
        &mut s as *mut u64 as *mut c_void,
        &mut d as *mut u64 as *mut c_void,
        &mut n as *mut i64 as *mut c_void,
    ];
    // SAFETY: three arguments matching fp4norm_copy's signature; pointers checked above.
    unsafe {
        launch(
            gpu,
            &f,
            grid,
            512,
            gpu.pdl_for(None),
            stream,
            &mut args,
            "launching fp4norm_copy",
        )
    }
}

/// The kernel configuration of a validated FP4 call over `ranks`, and the address of its
/// global scale (none for UE8M0 scales, which never read it).
fn fused_config(
    gpu: &Gpu,
    c: &RawCall,
    p: &crate::Problem,
    aligned: bool,
    ranks: Ranks,
) -> (KernelConfig, u64) {
    let global_scale = if p.format.scale == ScaleFormat::UE8M0 {
        RawGlobalScale::None
    } else {
        c.global_scale
    };
    let (gs, gs_ptr) = gs_mode(global_scale);
    let peer = matches!(ranks, Ranks::Peers(_));
    (
        with_ranks(gpu.config_with(p, gs, aligned, !peer), ranks),
        gs_ptr,
    )
}

/// The kernel configuration of a validated FP8 call over `ranks`.
fn fused_fp8_config(
    gpu: &Gpu,
    c: &crate::fp8::RawFp8Call,
    p: &crate::fp8::Fp8Problem,
    aligned: bool,
    ranks: Ranks,
) -> KernelConfig {
    let peer = matches!(ranks, Ranks::Peers(_));
    with_ranks(
        gpu.fp8_config_with(p, c.static_scale.is_some(), aligned, !peer),
        ranks,
    )
}

/// What [`Gpu::prepare_raw`] does: the validator's verdict alone picks the kernels (its
/// host checks read no memory), so the addresses need not be live.
pub(crate) fn prepare_fused(gpu: &Gpu, c: &RawCall) -> Result<(), Error> {
    let checked = c.validate()?;
    if checked.problem.m == 0 {
        return Ok(());
    }
    gpu.conversion_path()?;
    let (p, aligned) = (checked.problem, checked.vector_aligned);
    let (cfg, _) = fused_config(gpu, c, &p, aligned, Ranks::Gathered(&[]));
    gpu.load_kernels(&cfg)
}

/// [`prepare_fused`] for an FP8 call.
pub(crate) fn prepare_fused_fp8(gpu: &Gpu, c: &crate::fp8::RawFp8Call) -> Result<(), Error> {
    let checked = c.validate()?;
    if checked.problem.m == 0 {
        return Ok(());
    }
    gpu.conversion_path()?;
    let (p, aligned) = (checked.problem, checked.vector_aligned);
    let cfg = fused_fp8_config(gpu, c, &p, aligned, Ranks::Gathered(&[]));
    gpu.load_kernels(&cfg)
}

/// The FP8 op; with `more` ranks' inputs (ranks 1, 2, ...) the all-reduce in front of it
/// (SPEC.md §9), `c.x` being rank 0's.
pub(crate) unsafe fn launch_fused_fp8(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &crate::fp8::RawFp8Call,
    ranks: Ranks,
    opts: &LaunchOptions,
) -> Result<(), Error> {
    use crate::fp8::{Fp8ScaleLayout, Fp8Scaling};
    let mut checked = c.validate()?;
    let (m, h) = (checked.problem.m, checked.problem.h);
    let copy = check_ranks(
        gpu,
        c.dtype,
        &c.x,
        c.residual.is_some(),
        m,
        h,
        ranks,
        &mut checked.ranges,
        &mut checked.vector_aligned,
    )?;
    let p = checked.problem;
    check_devices(gpu, &checked.ranges, opts)?;
    let aligned = checked.vector_aligned;
    if p.m == 0 {
        return Ok(());
    }
    gpu.settle_conversions(stream)?;
    let pdl = gpu.pdl_for(opts.pdl);
    let cfg = fused_fp8_config(gpu, c, &p, aligned, ranks);
    let (ar_x, ar_signal, ar_stride, ar_rank) = rank_params(&c.x, ranks);
    // Rows the kernel covers: with column-major scales, or swizzled ones whose padding is
    // not spread over the call's threads, the layout's padding rows too (their CTAs zero
    // them).
    let rows_total = if cfg.pad_spread {
        p.m
    } else {
        p.scale_rows().max(p.m)
    };
    let (rm, sw) = match (p.layout(), c.scales) {
        (Some(Fp8ScaleLayout::Swizzled), Some(b)) => (0, b.ptr),
        (Some(_), Some(b)) => (b.ptr, 0),
        _ => (0, 0),
    };
    let (static_ptr, static_value) = match (c.static_scale, p.options.scaling) {
        (Some(b), _) => (b.ptr, 0.0),
        (None, Fp8Scaling::PerTensor(s)) => (0, s),
        (None, _) => (0, 0.0),
    };
    let s_min = match p.scale_format() {
        Some(crate::fp8::Fp8ScaleFormat::F32 { s_min }) => s_min,
        _ => 0.0,
    };
    let mut params = FusedParams {
        x: c.x.ptr,
        r: c.residual.map_or(0, |r| r.ptr),
        w: c.weight.ptr,
        q: c.q.ptr,
        sf_row_major: rm,
        sf_swizzled: sw,
        y_out: c.y_out.map_or(0, |y| y.ptr),
        gs: static_ptr,
        m: p.m as i64,
        rows_total: rows_total as i64,
        x_stride: c.x.row_stride as i64,
        r_stride: c.residual.map_or(0, |r| r.row_stride as i64),
        y_stride: c.y_out.map_or(0, |y| y.row_stride as i64),
        eps: p.options.eps,
        // (The prefetch would fetch the first rank's rows only: none for an all-reduce.)
        pf_rows: if cfg.ar_ranks == 0 {
            kernel::l2_prefetch_rows(&cfg, p.m, p.h, &gpu.limits)
        } else {
            0
        },
        weight_bias: p.options.weight_bias,
        s_min,
        static_scale: static_value,
        ar_x,
        ar_signal,
        ar_stride,
        ar_rank,
        ar_copy: copy as u32,
    };
    check_signal_words(ranks, fused_grid(rows_total, p.m, &cfg))?;
    let f = gpu.kernels.get(&gpu.ctx, &gpu.arch, &cfg)?;
    let pass = load_second_pass(gpu, &cfg)?;
    // SAFETY: the parameters' pointers were checked above; the caller guarantees the
    // memory is live.
    unsafe {
        launch_fused_kernel(
            gpu,
            stream,
            &f,
            &cfg,
            pdl,
            &mut params,
            "launching fp4norm_fused (FP8)",
        )?
    };
    let Some(pass) = pass else {
        return Ok(());
    };
    // One thread per 8-row line of each group (fp8_column_scales): every group of the
    // tiles of 8 rows.
    let lines = (p.m / 8) * p.n_groups();
    let mut params = ColumnScalesParams {
        sf: rm,
        m: p.m as i64,
    };
    // SAFETY: one struct by value, matching fp8_column_scales; its pointer is the call's
    // column-major scale buffer, checked above.
    unsafe {
        launch_second_pass(
            gpu,
            stream,
            &pass,
            lines.div_ceil(pass.0.block_threads() as usize),
            p.m,
            &mut params,
            "launching fp8_column_scales",
        )
    }
}

/// Launches the fused kernel `f` of configuration `cfg` over `params.rows_total` rows: its
/// grid (rows per CTA, CTAs per row) and cluster from `cfg`.
///
/// # Safety
/// `f` is the fused kernel compiled for `cfg`, and every pointer in `params` is valid
/// device memory of `gpu` for the call it describes, live until the kernel completes.
unsafe fn launch_fused_kernel(
    gpu: &Gpu,
    stream: sys::CUstream,
    f: &cudarc::driver::CudaFunction,
    cfg: &KernelConfig,
    pdl: bool,
    params: &mut FusedParams,
    what: &'static str,
) -> Result<(), Error> {
    let rows_total = params.rows_total as usize;
    let grid = fused_grid(rows_total, params.m as usize, cfg);
    let grid = u32::try_from(grid)
        .map_err(|_| Error::Unsupported(format!("{rows_total} rows exceed the grid limit")))?;
    let mut args = [params as *mut FusedParams as *mut c_void];
    // SAFETY: the arguments match the kernel's signature (one struct by value); the
    // caller guarantees its pointers.
    unsafe {
        launch_clustered(
            gpu,
            f,
            grid,
            cfg.block_threads(),
            cfg.cluster,
            pdl,
            stream,
            &mut args,
            what,
        )
    }
}
