//! The raw-pointer entry points: argument checks (SPEC.md §5) and kernel launches.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::kernel::{self, GsMode, KernelConfig, KernelKind};
use super::Gpu;
use crate::layout::{swizzled_col_tiles, swizzled_rows, ScaleLayout};
use crate::{DType, Error, Fp4Format, Options, Problem, ScaleFormat, ScaleOut};

/// A device matrix by raw pointer: `rows × cols` elements, rows `row_stride` elements apart.
#[derive(Clone, Copy, Debug)]
pub struct RawMat {
    /// Device address of element (0, 0).
    pub ptr: u64,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Elements between row starts.
    pub row_stride: usize,
    /// Elements in the allocation from `ptr` on, where known (checked if given).
    pub len: Option<usize>,
}

/// The global scale by raw pointer (f32 in device memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawGlobalScale {
    /// No global scale: 1.0.
    None,
    /// One f32.
    Uniform(u64),
    /// One f32 per row.
    PerRow(u64),
}

/// One fused call by raw device pointers. `residual: None` is `rmsnorm_fp4quant`.
#[derive(Clone, Copy, Debug)]
pub struct RawCall {
    /// Element dtype of x, residual, weight and y_out.
    pub dtype: DType,
    /// Input `[M, H]`.
    pub x: RawMat,
    /// Residual `[M, H]`, updated in place.
    pub residual: Option<RawMat>,
    /// Weight `[H]`.
    pub weight: u64,
    /// Elements of the weight allocation, where known.
    pub weight_len: Option<usize>,
    /// Packed FP4 output, `M · H/2` bytes.
    pub y_fp4: u64,
    /// Bytes of the `y_fp4` allocation, where known.
    pub y_fp4_len: Option<usize>,
    /// Scale output(s); the variant picks the layout.
    pub scales: ScaleOut<u64>,
    /// Bytes of the (row-major, swizzled) scale allocations, where known.
    pub scale_lens: (Option<usize>, Option<usize>),
    /// Optional `y_out` `[M, H]`.
    pub y_out: Option<RawMat>,
    /// The global scale.
    pub global_scale: RawGlobalScale,
    /// f32 values in the global-scale allocation, where known.
    pub global_scale_len: Option<usize>,
    /// Format and eps.
    pub options: Options,
}

/// One dequantisation by raw device pointers.
#[derive(Clone, Copy, Debug)]
pub struct RawDequant {
    /// Rows.
    pub m: usize,
    /// Hidden size.
    pub h: usize,
    /// Block size and scale format.
    pub format: Fp4Format,
    /// Packed FP4 `M · H/2` bytes (4-byte aligned).
    pub y_fp4: u64,
    /// Scale codes; `Both` is not accepted (pass one layout).
    pub scales: ScaleOut<u64>,
    /// The global scale (E4M3 only).
    pub global_scale: RawGlobalScale,
    /// Output `M · H` f32.
    pub out: u64,
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
}

/// Mirrors `struct Fp4SwizzleParams` in kernel/cu/swizzle.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SwizzleParams {
    sf_row_major: u64,
    sf_swizzled: u64,
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
unsafe fn launch(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    args: &mut [*mut c_void],
    what: &'static str,
) -> Result<(), Error> {
    // SAFETY: forwarded; no cluster.
    unsafe { launch_clustered(gpu, f, grid, block, 1, gpu.pdl(), stream, args, what) }
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

/// A byte range one call touches, for the overlap check.
struct Range {
    name: &'static str,
    start: u64,
    end: u64,
    written: bool,
}

fn mat_range(name: &'static str, m: &RawMat, elem: usize, written: bool) -> Result<Range, Error> {
    let extent = if m.rows == 0 {
        0
    } else {
        (m.rows - 1)
            .checked_mul(m.row_stride)
            .and_then(|n| n.checked_add(m.cols))
            .and_then(|n| n.checked_mul(elem))
            .ok_or(Error::SizeOverflow)?
    };
    Ok(Range {
        name,
        start: m.ptr,
        end: m
            .ptr
            .checked_add(extent as u64)
            .ok_or(Error::SizeOverflow)?,
        written,
    })
}

fn check_overlaps(ranges: &[Range]) -> Result<(), Error> {
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if (a.written || b.written)
                && a.start < b.end
                && b.start < a.end
                && a.start != a.end
                && b.start != b.end
            {
                return Err(Error::Overlap {
                    a: a.name,
                    b: b.name,
                });
            }
        }
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

fn check_view(name: &'static str, m: &RawMat, rows: usize, cols: usize) -> Result<(), Error> {
    if m.rows != rows || m.cols != cols {
        return Err(Error::ShapeMismatch {
            name,
            rows,
            cols,
            got_rows: m.rows,
            got_cols: m.cols,
        });
    }
    if m.rows > 1 && m.row_stride < m.cols {
        return Err(Error::StrideTooSmall {
            name,
            stride: m.row_stride,
            cols: m.cols,
        });
    }
    if let Some(len) = m.len {
        let needed = if rows == 0 {
            0
        } else {
            (rows - 1) * m.row_stride + cols
        };
        if needed > len {
            return Err(Error::ViewOutOfBounds {
                name,
                rows,
                cols,
                stride: m.row_stride,
                needed,
                len,
            });
        }
    }
    Ok(())
}

/// The device that owns `ptr`, or an error naming the buffer.
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

/// Checks a fused call (SPEC.md §5) and returns its problem and whether the 16-byte
/// vector path applies.
pub(crate) fn validate_fused(gpu: &Gpu, c: &RawCall) -> Result<(Problem, bool), Error> {
    let (m, h) = (c.x.rows, c.x.cols);
    let layout = match c.scales {
        ScaleOut::RowMajor(_) => ScaleLayout::RowMajor,
        ScaleOut::Swizzled(_) => ScaleLayout::Swizzled,
        ScaleOut::Both { .. } => ScaleLayout::Both,
    };
    let p = Problem::new(m, h, c.dtype, layout, &c.options)?.with_y_out(c.y_out.is_some());
    let p = if c.residual.is_some() {
        p
    } else {
        p.without_residual()
    };
    check_view("input", &c.x, m, h)?;
    if let Some(r) = &c.residual {
        check_view("residual", r, m, h)?;
    }
    if let Some(y) = &c.y_out {
        check_view("y_out", y, m, h)?;
    }
    if let Some(len) = c.weight_len {
        if len != h {
            return Err(Error::WeightLength {
                expected: h,
                got: len,
            });
        }
    }
    p.check_output_lens(
        c.y_fp4_len.unwrap_or(p.fp4_len()),
        c.scale_lens.0,
        c.scale_lens.1,
    )?;
    match (c.global_scale, c.global_scale_len) {
        (RawGlobalScale::PerRow(_), Some(n)) if n != m => {
            return Err(Error::GlobalScaleLength {
                expected: m,
                got: n,
            })
        }
        (RawGlobalScale::Uniform(_), Some(n)) if n != 1 => {
            return Err(Error::GlobalScaleLength {
                expected: 1,
                got: n,
            });
        }
        _ => {}
    }
    if m == 0 {
        return Ok((p, true)); // nothing will be written or read
    }
    let e = c.dtype.size();
    check_ptr("input", c.x.ptr, e)?;
    check_ptr("weight", c.weight, e)?;
    check_ptr("y_fp4", c.y_fp4, 1)?;
    if let Some(r) = &c.residual {
        check_ptr("residual", r.ptr, e)?;
    }
    if let Some(y) = &c.y_out {
        check_ptr("y_out", y.ptr, e)?;
    }
    let (rm, sw) = match c.scales {
        ScaleOut::RowMajor(r) => (Some(r), None),
        ScaleOut::Swizzled(s) => (None, Some(s)),
        ScaleOut::Both {
            row_major,
            swizzled,
        } => (Some(row_major), Some(swizzled)),
    };
    if let Some(r) = rm {
        check_ptr("block_scale (row-major)", r, 1)?;
    }
    if let Some(s) = sw {
        check_ptr("block_scale (swizzled)", s, 1)?;
    }
    let uses_gs = p.format.scale == ScaleFormat::E4M3;
    let (gs_ptr, gs_count) = match c.global_scale {
        RawGlobalScale::None => (None, 0),
        RawGlobalScale::Uniform(g) => (Some(g), 1),
        RawGlobalScale::PerRow(g) => (Some(g), m),
    };
    if let (Some(g), true) = (gs_ptr, uses_gs) {
        check_ptr("global_scale", g, 4)?;
    }

    // Overlap: outputs may not alias inputs or each other (bounding byte ranges).
    let mut ranges = vec![
        mat_range("input", &c.x, e, false)?,
        Range {
            name: "weight",
            start: c.weight,
            end: c.weight + (h * e) as u64,
            written: false,
        },
        Range {
            name: "y_fp4",
            start: c.y_fp4,
            end: c.y_fp4 + p.fp4_len() as u64,
            written: true,
        },
    ];
    if let Some(r) = &c.residual {
        ranges.push(mat_range("residual", r, e, true)?);
    }
    if let Some(y) = &c.y_out {
        ranges.push(mat_range("y_out", y, e, true)?);
    }
    if let Some(r) = rm {
        ranges.push(Range {
            name: "block_scale (row-major)",
            start: r,
            end: r + p.row_major_scales_len() as u64,
            written: true,
        });
    }
    if let Some(s) = sw {
        ranges.push(Range {
            name: "block_scale (swizzled)",
            start: s,
            end: s + p.swizzled_scales_len() as u64,
            written: true,
        });
    }
    if let (Some(g), true) = (gs_ptr, uses_gs) {
        ranges.push(Range {
            name: "global_scale",
            start: g,
            end: g + 4 * gs_count as u64,
            written: false,
        });
    }
    check_overlaps(&ranges)?;
    for r in &ranges {
        check_device(gpu, r.name, r.start)?;
    }

    // The 16-byte path needs every element row 16-byte aligned and y_fp4 and the swizzled
    // scales 4-byte aligned;
    // anything else takes the element-wise kernel (correct, slower).
    let vec_ok = |mat: &RawMat| mat.ptr % 16 == 0 && (mat.row_stride * e) % 16 == 0;
    let aligned = vec_ok(&c.x)
        && c.weight % 16 == 0
        && c.residual.as_ref().is_none_or(vec_ok)
        && c.y_out.as_ref().is_none_or(vec_ok)
        && c.y_fp4 % 4 == 0
        && sw.is_none_or(|s| s % 4 == 0);
    Ok((p, aligned))
}

fn gs_mode(g: RawGlobalScale) -> (GsMode, u64) {
    match g {
        RawGlobalScale::None => (GsMode::None, 0),
        RawGlobalScale::Uniform(p) => (GsMode::Uniform, p),
        RawGlobalScale::PerRow(p) => (GsMode::PerRow, p),
    }
}

pub(crate) unsafe fn launch_fused(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &RawCall,
) -> Result<(), Error> {
    let (p, aligned) = validate_fused(gpu, c)?;
    if p.m == 0 {
        return Ok(());
    }
    let (gs, gs_ptr) = gs_mode(c.global_scale);
    let cfg = gpu.config(&p, gs, aligned);
    // Rows the fused kernel covers: with directly written swizzled scales, the padding rows
    // of the last 128-row tile too (it zeroes their scales); a split write's swizzle pass
    // zeroes them instead.
    let rows_total = if p.layout.has_swizzled() && !cfg.swizzle_split {
        swizzled_rows(p.m)
    } else {
        p.m
    };
    let (rm, sw) = match c.scales {
        ScaleOut::RowMajor(r) => (r, 0),
        ScaleOut::Swizzled(s) => (0, s),
        ScaleOut::Both {
            row_major,
            swizzled,
        } => (row_major, swizzled),
    };
    let mut params = FusedParams {
        x: c.x.ptr,
        r: c.residual.map_or(0, |r| r.ptr),
        w: c.weight,
        q: c.y_fp4,
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
        pf_rows: kernel::l2_prefetch_rows(&cfg, p.m, p.h, gpu.sm_count),
    };
    let f = gpu.kernels.get(&gpu.ctx, &gpu.arch, &cfg)?;
    // Both kernels of a split swizzled write are loaded before either is launched, so
    // that a failure to build the second cannot leave the first's staging behind.
    let pass = match cfg.swizzle_pass() {
        Some(pass) => Some((pass, gpu.kernels.get(&gpu.ctx, &gpu.arch, &pass)?)),
        None => None,
    };
    let grid = rows_total.div_ceil(cfg.rows_per_cta as usize) * cfg.cluster as usize;
    let grid = u32::try_from(grid)
        .map_err(|_| Error::Unsupported(format!("{rows_total} rows exceed the grid limit")))?;
    let mut args = [&mut params as *mut FusedParams as *mut c_void];
    // SAFETY: the arguments match the kernel's signature (one struct by value) and every
    // pointer in it was checked above; the caller guarantees the memory is live.
    unsafe {
        launch_clustered(
            gpu,
            &f,
            grid,
            cfg.block_threads(),
            cfg.cluster,
            gpu.pdl(),
            stream,
            &mut args,
            "launching fp4norm_fused",
        )?;
    }
    let Some((pass, f)) = pass else {
        return Ok(());
    };
    let tiles = swizzled_rows(p.m) / 128;
    // One CTA per 128-row tile and 64-block chunk (16 column groups): fp4norm_swizzle's grid.
    let chunks = swizzled_col_tiles(p.n_blocks()).div_ceil(16);
    let grid = u32::try_from(tiles * chunks)
        .map_err(|_| Error::Unsupported(format!("{} rows exceed the grid limit", p.m)))?;
    let mut params = SwizzleParams {
        sf_row_major: if p.layout.has_row_major() { rm } else { 0 },
        sf_swizzled: sw,
        m: p.m as i64,
    };
    let mut args = [&mut params as *mut SwizzleParams as *mut c_void];
    // SAFETY: one struct by value, matching fp4norm_swizzle; its pointers are the call's
    // scale buffers, checked above. With programmatic dependent launch wherever the GPU
    // has it (sm_90+; the split is only chosen there, unless forced by the knob): the
    // pass waits for the fused kernel in griddepcontrol.wait, and its launch overlaps
    // that kernel's tail.
    unsafe {
        launch_clustered(
            gpu,
            &f,
            grid,
            pass.block_threads(),
            1,
            gpu.clusters,
            stream,
            &mut args,
            "launching fp4norm_swizzle",
        )
    }
}

pub(crate) unsafe fn launch_dequant(
    gpu: &Gpu,
    stream: sys::CUstream,
    c: &RawDequant,
) -> Result<(), Error> {
    let (layout, sf) = match c.scales {
        ScaleOut::RowMajor(r) => (ScaleLayout::RowMajor, r),
        ScaleOut::Swizzled(s) => (ScaleLayout::Swizzled, s),
        ScaleOut::Both { .. } => {
            return Err(Error::Unsupported(
                "dequantize reads one scale layout: pass RowMajor or Swizzled".into(),
            ))
        }
    };
    let p = Problem::new(
        c.m,
        c.h,
        DType::BF16,
        layout,
        &Options {
            format: c.format,
            eps: 0.0,
        },
    )?;
    if c.m == 0 {
        return Ok(());
    }
    check_ptr("y_fp4", c.y_fp4, 4)?;
    check_ptr("block_scale", sf, 1)?;
    check_ptr("out", c.out, 4)?;
    let (gs, gs_ptr) = gs_mode(c.global_scale);
    let gs = if c.format.scale == ScaleFormat::UE8M0 {
        GsMode::None
    } else {
        gs
    };
    if gs != GsMode::None {
        check_ptr("global_scale", gs_ptr, 4)?;
    }
    let sf_len = if layout == ScaleLayout::Swizzled {
        p.swizzled_scales_len()
    } else {
        p.row_major_scales_len()
    };
    check_overlaps(&[
        Range {
            name: "y_fp4",
            start: c.y_fp4,
            end: c.y_fp4 + p.fp4_len() as u64,
            written: false,
        },
        Range {
            name: "block_scale",
            start: sf,
            end: sf + sf_len as u64,
            written: false,
        },
        Range {
            name: "out",
            start: c.out,
            end: c.out + (p.m * p.h * 4) as u64,
            written: true,
        },
    ])?;
    let cfg = KernelConfig {
        h: p.h,
        block: p.block(),
        ue8m0: c.format.scale == ScaleFormat::UE8M0,
        row_major: layout == ScaleLayout::RowMajor,
        swizzled: layout == ScaleLayout::Swizzled,
        gs,
        ..KernelConfig::shapeless(KernelKind::Dequant)
    };
    let f = gpu.kernels.get(&gpu.ctx, &gpu.arch, &cfg)?;
    let mut params = DequantParams {
        q: c.y_fp4,
        sf,
        gs: gs_ptr,
        out: c.out,
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
) -> Result<[u32; 9], Error> {
    let f = gpu.kernels.get(
        &gpu.ctx,
        &gpu.arch,
        &KernelConfig::shapeless(KernelKind::CodecCheck),
    )?;
    let init: [u32; 9] = [0, u32::MAX, 0, u32::MAX, 0, u32::MAX, 0, 0, u32::MAX];
    let result = stream
        .clone_htod(&init)
        .map_err(super::driver_err("uploading the self-check counters"))?;
    let (mut ptr, _guard) = {
        use cudarc::driver::DevicePtr;
        result.device_ptr(stream)
    };
    let mut args = [&mut ptr as *mut u64 as *mut c_void];
    // SAFETY: one argument matching fp4norm_codec_check's signature, a live allocation of
    // nine u32 on this device.
    unsafe {
        launch(
            gpu,
            &f,
            gpu.sm_count * 8,
            256,
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
        Range {
            name: "src",
            start: src,
            end: src + bytes as u64,
            written: false,
        },
        Range {
            name: "dst",
            start: dst,
            end: dst + bytes as u64,
            written: true,
        },
    ])?;
    let f = gpu.kernels.get(
        &gpu.ctx,
        &gpu.arch,
        &KernelConfig::shapeless(KernelKind::Copy),
    )?;
    let mut n = (bytes / 16) as i64;
    let (mut s, mut d) = (src, dst);
    // Four CTAs per SM for large copies; no more CTAs than 512-thread groups of vectors.
    let grid = (gpu.sm_count as i64 * 4).min((n + 511) / 512).max(1) as u32;
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
            stream,
            &mut args,
            "launching fp4norm_copy",
        )
    }
}
