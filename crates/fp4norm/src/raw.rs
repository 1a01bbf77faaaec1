//! A call described by addresses and sizes, wherever its memory lives, and the one
//! validator of SPEC.md §5.
//!
//! [`RawCall`] (the fused op) and [`RawDequant`] (dequantisation) hold addresses, shapes,
//! strides and, where the caller knows them, allocation lengths. [`RawCall::validate`] and
//! [`RawDequant::validate`] check everything that can be checked from that description —
//! shapes, lengths, 64-bit extents, pointer alignment, overlaps — before any backend writes
//! a byte. Every front runs them: the safe host API (from its slices), the CUDA raw entry
//! (`cuda::Gpu::launch_raw` with the `cuda` feature, which adds only its device checks), the Python module
//! and the PyTorch operators. [`run_host`] runs a validated call over host memory.

use crate::layout::ScaleLayout;
use crate::{
    bf16, f16, DType, Element, Error, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef, Options,
    Problem, ScaleFormat, ScaleIn, ScaleOut,
};

/// The names errors give the other ranks' inputs of a fused all-reduce (SPEC.md §9): ranks
/// 1 to 7, after `x` (rank 0, "input"); its length bounds their count.
pub const RANK_INPUT_NAMES: [&str; 7] = [
    "inputs[1]",
    "inputs[2]",
    "inputs[3]",
    "inputs[4]",
    "inputs[5]",
    "inputs[6]",
    "inputs[7]",
];

/// A matrix by address: `rows × cols` elements of the call's dtype, row `i` starting at
/// element `i · row_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawMat {
    /// Address of element (0, 0).
    pub ptr: u64,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Elements between row starts.
    pub row_stride: usize,
    /// Elements addressable from `ptr` on, where known (checked when given).
    pub len: Option<usize>,
}

impl RawMat {
    /// A contiguous `rows × cols` matrix at `ptr` whose allocation length is unknown.
    pub fn contiguous(ptr: u64, rows: usize, cols: usize) -> Self {
        RawMat {
            ptr,
            rows,
            cols,
            row_stride: cols,
            len: None,
        }
    }

    /// Elements from the first to one past the last: `(rows − 1) · row_stride + cols`, 0 for
    /// an empty matrix. Refuses a stride shorter than a row (rows would overlap).
    pub fn extent(&self, name: &'static str) -> Result<usize, Error> {
        if self.rows > 1 && self.row_stride < self.cols {
            return Err(Error::StrideTooSmall {
                name,
                stride: self.row_stride,
                cols: self.cols,
            });
        }
        if self.rows == 0 || self.cols == 0 {
            return Ok(0);
        }
        (self.rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|n| n.checked_add(self.cols))
            .ok_or(Error::SizeOverflow)
    }
}

/// A flat buffer by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBuf {
    /// Address of the first element.
    pub ptr: u64,
    /// Elements in the buffer, where known (checked when given).
    pub len: Option<usize>,
}

impl RawBuf {
    /// A buffer of `len` elements at `ptr`.
    pub fn new(ptr: u64, len: usize) -> Self {
        RawBuf {
            ptr,
            len: Some(len),
        }
    }

    /// A buffer at `ptr` whose length the caller does not know.
    pub fn unsized_at(ptr: u64) -> Self {
        RawBuf { ptr, len: None }
    }
}

/// The global scale by address: f32 values (read by the kernel, so a captured CUDA graph
/// sees new values on replay). Ignored by UE8M0 scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawGlobalScale {
    /// No global scale: 1.0.
    None,
    /// One f32 for every row.
    Uniform(RawBuf),
    /// One f32 per row.
    PerRow(RawBuf),
}

impl RawGlobalScale {
    /// `count` f32 at `ptr`: one value for every row when `count` is 1 (also with one row),
    /// else one per row (validation checks that `count` is `M`).
    pub fn from_count(ptr: u64, count: usize) -> Self {
        if count == 1 {
            RawGlobalScale::Uniform(RawBuf::new(ptr, 1))
        } else {
            RawGlobalScale::PerRow(RawBuf::new(ptr, count))
        }
    }
}

/// One fused call (SPEC.md §1) by address. `residual: None` is `rmsnorm_fp4quant`.
#[derive(Clone, Copy, Debug)]
pub struct RawCall {
    /// Element dtype of x, residual, weight and y_out.
    pub dtype: DType,
    /// Input `[M, H]`, read only.
    pub x: RawMat,
    /// Residual `[M, H]`, updated in place.
    pub residual: Option<RawMat>,
    /// Weight, `H` elements.
    pub weight: RawBuf,
    /// Packed FP4 output, `M · H/2` bytes.
    pub y_fp4: RawBuf,
    /// Scale output(s) in bytes; the variant picks the layout.
    pub scales: ScaleOut<RawBuf>,
    /// Optional `[M, H]` normalised values in the dtype.
    pub y_out: Option<RawMat>,
    /// The global scale.
    pub global_scale: RawGlobalScale,
    /// Format and eps.
    pub options: Options,
}

/// A byte range one call touches: for the overlap check and the device check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The argument's name.
    pub name: &'static str,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Whether the call writes it.
    pub written: bool,
}

impl Range {
    pub(crate) fn new(
        name: &'static str,
        ptr: u64,
        bytes: usize,
        written: bool,
    ) -> Result<Self, Error> {
        Ok(Range {
            name,
            start: ptr,
            end: ptr
                .checked_add(bytes as u64)
                .ok_or(Error::AddressOverflow {
                    name,
                    address: ptr,
                    bytes,
                })?,
            written,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// What [`RawCall::validate`] found.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Shape, options and byte counts of the call.
    pub problem: Problem,
    /// Every byte range the call reads or writes (empty ones left out).
    pub ranges: Vec<Range>,
    /// Whether the rows, weight and outputs allow 16-byte vector access (rows 16-byte
    /// aligned, `y_fp4` and the swizzled scales 4-byte aligned): the CUDA fast path.
    pub vector_aligned: bool,
}

/// `elems · size` in bytes, refused past `isize::MAX`: no allocation is that large, slices
/// require it, and a wrapped product would make the overlap check compare wrong ranges.
pub(crate) fn byte_len(elems: usize, size: usize) -> Result<usize, Error> {
    elems
        .checked_mul(size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(Error::SizeOverflow)
}

pub(crate) fn check_ptr(name: &'static str, ptr: u64, align: usize) -> Result<(), Error> {
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

/// The fused all-reduce's rule for the other ranks' inputs (SPEC.md §9), for a front that
/// sums them on the host: they are read while the call writes, so none may overlap a
/// buffer written by the call whose validator found `ranges` (the `check_overlaps`
/// rule the GPU entries apply to them too). `ranks` are ranks 1, 2, ... in order.
pub fn check_rank_inputs(ranges: &[Range], dtype: DType, ranks: &[RawMat]) -> Result<(), Error> {
    let mut all = ranges.to_vec();
    for (x, name) in ranks.iter().zip(RANK_INPUT_NAMES) {
        let bytes = x.extent(name)?.saturating_mul(dtype.size());
        all.push(Range::new(name, x.ptr, bytes, false)?);
    }
    all.retain(|r| !r.is_empty());
    check_overlaps(&all)
}

/// Outputs may not overlap inputs or each other (bounding byte ranges, so interleaved
/// strided views of one buffer are refused too); read-only inputs may overlap.
pub(crate) fn check_overlaps(ranges: &[Range]) -> Result<(), Error> {
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if (a.written || b.written) && a.start < b.end && b.start < a.end {
                return Err(Error::Overlap {
                    a: a.name,
                    b: b.name,
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn check_mat(
    name: &'static str,
    mat: &RawMat,
    rows: usize,
    cols: usize,
    elem: usize,
) -> Result<usize, Error> {
    if mat.rows != rows || mat.cols != cols {
        return Err(Error::ShapeMismatch {
            name,
            rows,
            cols,
            got_rows: mat.rows,
            got_cols: mat.cols,
        });
    }
    let extent = mat.extent(name)?;
    if let Some(len) = mat.len {
        if extent > len {
            return Err(Error::ViewOutOfBounds {
                name,
                rows,
                cols,
                stride: mat.row_stride,
                needed: extent,
                len,
            });
        }
    }
    byte_len(extent, elem)
}

fn check_global_scale(gs: &RawGlobalScale, m: usize) -> Result<Option<(RawBuf, usize)>, Error> {
    let (buf, count) = match *gs {
        RawGlobalScale::None => return Ok(None),
        RawGlobalScale::Uniform(b) => (b, 1),
        RawGlobalScale::PerRow(b) => (b, m),
    };
    if let Some(n) = buf.len {
        if n != count {
            return Err(Error::GlobalScaleLength {
                expected: count,
                got: n,
            });
        }
    }
    Ok(Some((buf, count)))
}

/// The names of the scale buffers of a layout, as every front reports them.
fn scale_names(scales: &ScaleOut<RawBuf>) -> (&'static str, &'static str) {
    match scales {
        ScaleOut::Both { .. } => (
            "block_scale_unswizzled (row-major)",
            "block_scale (swizzled)",
        ),
        _ => ("block_scale (row-major)", "block_scale (swizzled)"),
    }
}

impl RawCall {
    /// The scale layout this call writes.
    pub fn layout(&self) -> ScaleLayout {
        self.scales.layout()
    }

    /// Checks the call against every rule of SPEC.md §5 that its description allows:
    /// shapes, allocation lengths, 64-bit extents, null and misaligned pointers (each
    /// buffer aligned to its element), overlaps of written buffers with anything else.
    /// Nothing is read or written. With `M = 0` only shapes and options are checked
    /// (nothing will be touched).
    pub fn validate(&self) -> Result<Checked, Error> {
        let (m, h) = (self.x.rows, self.x.cols);
        let mut p = Problem::new(m, h, self.dtype, self.layout(), &self.options)?;
        p.has_residual = self.residual.is_some();
        p.has_y_out = self.y_out.is_some();
        let e = self.dtype.size();
        let mut ranges = Vec::with_capacity(8);
        ranges.push(Range::new(
            "input",
            self.x.ptr,
            check_mat("input", &self.x, m, h, e)?,
            false,
        )?);
        if let Some(r) = &self.residual {
            ranges.push(Range::new(
                "residual",
                r.ptr,
                check_mat("residual", r, m, h, e)?,
                true,
            )?);
        }
        if let Some(y) = &self.y_out {
            ranges.push(Range::new(
                "y_out",
                y.ptr,
                check_mat("y_out", y, m, h, e)?,
                true,
            )?);
        }
        if let Some(len) = self.weight.len {
            if len != h {
                return Err(Error::WeightLength {
                    expected: h,
                    got: len,
                });
            }
        }
        ranges.push(Range::new(
            "weight",
            self.weight.ptr,
            byte_len(h, e)?,
            false,
        )?);
        let (rm_name, sw_name) = scale_names(&self.scales);
        let (rm, sw) = self.scales.split();
        p.check_output_lens(
            self.y_fp4.len.unwrap_or(p.fp4_len()),
            rm.map(|b| (rm_name, b.len.unwrap_or(p.row_major_scales_len()))),
            sw.map(|b| (sw_name, b.len.unwrap_or(p.swizzled_scales_len()))),
        )?;
        ranges.push(Range::new("y_fp4", self.y_fp4.ptr, p.fp4_len(), true)?);
        if let Some(b) = rm {
            ranges.push(Range::new(rm_name, b.ptr, p.row_major_scales_len(), true)?);
        }
        if let Some(b) = sw {
            ranges.push(Range::new(sw_name, b.ptr, p.swizzled_scales_len(), true)?);
        }
        // UE8M0 scales never read the global scale (SPEC.md §1.6).
        let gs = check_global_scale(&self.global_scale, m)?
            .filter(|_| p.format.scale == ScaleFormat::E4M3);
        if let Some((buf, count)) = gs {
            ranges.push(Range::new(
                "global_scale",
                buf.ptr,
                byte_len(count, 4)?,
                false,
            )?);
        }
        if m == 0 {
            return Ok(Checked {
                problem: p,
                ranges: Vec::new(),
                vector_aligned: true,
            });
        }
        check_ptr("input", self.x.ptr, e)?;
        if let Some(r) = &self.residual {
            check_ptr("residual", r.ptr, e)?;
        }
        if let Some(y) = &self.y_out {
            check_ptr("y_out", y.ptr, e)?;
        }
        check_ptr("weight", self.weight.ptr, e)?;
        check_ptr("y_fp4", self.y_fp4.ptr, 1)?;
        if let Some(b) = rm {
            check_ptr(rm_name, b.ptr, 1)?;
        }
        if let Some(b) = sw {
            check_ptr(sw_name, b.ptr, 1)?;
        }
        if let Some((buf, _)) = gs {
            check_ptr("global_scale", buf.ptr, 4)?;
        }
        ranges.retain(|r| !r.is_empty());
        check_overlaps(&ranges)?;
        // The byte stride mod 16, wrapping: exact (2^64 is a multiple of 16), and a stride no
        // row uses (M <= 1) may be any value, so its product may not fit.
        let rows_aligned =
            |mat: &RawMat| mat.ptr % 16 == 0 && mat.row_stride.wrapping_mul(e) % 16 == 0;
        let vector_aligned = rows_aligned(&self.x)
            && self.residual.as_ref().is_none_or(rows_aligned)
            && self.y_out.as_ref().is_none_or(rows_aligned)
            && self.weight.ptr % 16 == 0
            && self.y_fp4.ptr % 4 == 0
            && sw.is_none_or(|b| b.ptr % 4 == 0);
        Ok(Checked {
            problem: p,
            ranges,
            vector_aligned,
        })
    }

    /// The description of a host call over slices (what the safe API validates).
    pub fn from_host<T: Element>(
        x: &MatRef<'_, T>,
        residual: Option<&MatMut<'_, T>>,
        weight: &[T],
        out: &Fp4Out<'_, T>,
        global_scale: &GlobalScale<'_>,
        options: &Options,
    ) -> Self {
        fn mat<T>(data: *const T, len: usize, rows: usize, cols: usize, stride: usize) -> RawMat {
            RawMat {
                ptr: data as usize as u64,
                rows,
                cols,
                row_stride: stride,
                len: Some(len),
            }
        }
        fn buf<T>(s: &[T]) -> RawBuf {
            RawBuf::new(s.as_ptr() as usize as u64, s.len())
        }
        RawCall {
            dtype: T::DTYPE,
            x: mat(
                x.data().as_ptr(),
                x.data().len(),
                x.rows(),
                x.cols(),
                x.row_stride(),
            ),
            residual: residual.map(|r| {
                let d = r.as_ref().data();
                mat(d.as_ptr(), d.len(), r.rows(), r.cols(), r.row_stride())
            }),
            weight: buf(weight),
            y_fp4: buf(out.y_fp4),
            scales: match &out.scales {
                ScaleOut::RowMajor(r) => ScaleOut::RowMajor(buf(r)),
                ScaleOut::Swizzled(s) => ScaleOut::Swizzled(buf(s)),
                ScaleOut::Both {
                    row_major,
                    swizzled,
                } => ScaleOut::Both {
                    row_major: buf(row_major),
                    swizzled: buf(swizzled),
                },
            },
            y_out: out.y_out.as_ref().map(|y| {
                let d = y.as_ref().data();
                mat(d.as_ptr(), d.len(), y.rows(), y.cols(), y.row_stride())
            }),
            global_scale: match *global_scale {
                // A host scale is a value, not an address: no range to check.
                GlobalScale::Uniform(_) => RawGlobalScale::None,
                GlobalScale::PerRow(g) => RawGlobalScale::PerRow(buf(g)),
            },
            options: *options,
        }
    }
}

/// One dequantisation (SPEC.md §4) by address: packed FP4 and scale codes of one layout
/// (`ScaleOut::Both` is refused) to `M · H` f32.
#[derive(Clone, Copy, Debug)]
pub struct RawDequant {
    /// Rows.
    pub m: usize,
    /// Hidden size.
    pub h: usize,
    /// Block size and scale format.
    pub format: Fp4Format,
    /// Packed FP4, `M · H/2` bytes.
    pub y_fp4: RawBuf,
    /// Scale codes in one layout.
    pub scales: ScaleOut<RawBuf>,
    /// The global scale (E4M3 only).
    pub global_scale: RawGlobalScale,
    /// Output, `M · H` f32.
    pub out: RawBuf,
}

impl RawDequant {
    /// Checks shapes, lengths, pointers and overlaps (as [`RawCall::validate`]).
    pub fn validate(&self) -> Result<Checked, Error> {
        let layout = match self.scales {
            ScaleOut::RowMajor(_) => ScaleLayout::RowMajor,
            ScaleOut::Swizzled(_) => ScaleLayout::Swizzled,
            ScaleOut::Both { .. } => {
                return Err(Error::Unsupported(
                    "dequantize reads one scale layout: pass row-major or swizzled scales".into(),
                ))
            }
        };
        let p = Problem::new(
            self.m,
            self.h,
            DType::BF16,
            layout,
            &Options {
                format: self.format,
                eps: 0.0,
                weight_bias: 0.0,
            },
        )?;
        let (rm, sw) = self.scales.split();
        let (sf, sf_len) = match (rm, sw) {
            (Some(b), _) => (b, p.row_major_scales_len()),
            (_, Some(b)) => (b, p.swizzled_scales_len()),
            (None, None) => unreachable!("one layout"),
        };
        p.check_output_lens(
            self.y_fp4.len.unwrap_or(p.fp4_len()),
            rm.map(|b| ("block_scale (row-major)", b.len.unwrap_or(sf_len))),
            sw.map(|b| ("block_scale (swizzled)", b.len.unwrap_or(sf_len))),
        )?;
        let out_len = self.m.checked_mul(self.h).ok_or(Error::SizeOverflow)?;
        let got = self.out.len.unwrap_or(out_len);
        if got != out_len {
            return Err(Error::F32Length {
                name: "out",
                expected: out_len,
                got,
                what: format!("M·H for M = {}, H = {}", self.m, self.h),
            });
        }
        let gs = check_global_scale(&self.global_scale, self.m)?
            .filter(|_| self.format.scale == ScaleFormat::E4M3);
        if self.m == 0 {
            return Ok(Checked {
                problem: p,
                ranges: Vec::new(),
                vector_aligned: true,
            });
        }
        let mut ranges = vec![
            Range::new("y_fp4", self.y_fp4.ptr, p.fp4_len(), false)?,
            Range::new("block_scale", sf.ptr, sf_len, false)?,
            Range::new("out", self.out.ptr, byte_len(out_len, 4)?, true)?,
        ];
        check_ptr("y_fp4", self.y_fp4.ptr, 1)?;
        check_ptr("block_scale", sf.ptr, 1)?;
        check_ptr("out", self.out.ptr, 4)?;
        if let Some((buf, count)) = gs {
            check_ptr("global_scale", buf.ptr, 4)?;
            ranges.push(Range::new(
                "global_scale",
                buf.ptr,
                byte_len(count, 4)?,
                false,
            )?);
        }
        check_overlaps(&ranges)?;
        Ok(Checked {
            problem: p,
            vector_aligned: self.y_fp4.ptr % 4 == 0,
            ranges,
        })
    }
}

/// Which host implementation runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostEngine {
    /// The fast CPU backend ([`crate::cpu`]).
    Cpu,
    /// The scalar reference ([`crate::reference`]).
    Reference,
}

/// A shared slice over memory the caller vouches for.
///
/// # Safety
/// `ptr` must address `len` readable, initialised `T` (when `len > 0`), not written
/// through another path while the slice lives.
pub(crate) unsafe fn host_slice<'a, T>(ptr: u64, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: non-null and aligned (validated), at most isize::MAX bytes (validated), and
    // the caller guarantees the extent.
    unsafe { std::slice::from_raw_parts(ptr as usize as *const T, len) }
}

/// A mutable slice over memory the caller vouches for.
///
/// # Safety
/// As [`host_slice`], writable, and overlapping no other slice of the call (validated).
pub(crate) unsafe fn host_slice_mut<'a, T>(ptr: u64, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: as host_slice, and exclusive (the overlap check).
    unsafe { std::slice::from_raw_parts_mut(ptr as usize as *mut T, len) }
}

/// # Safety
/// As [`host_slice`], for the matrix's extent.
pub(crate) unsafe fn host_mat<'a, T>(m: &RawMat) -> Result<MatRef<'a, T>, Error> {
    let n = m.extent("input")?;
    // SAFETY: forwarded.
    MatRef::with_stride(
        unsafe { host_slice(m.ptr, n) },
        m.rows,
        m.cols,
        m.row_stride,
    )
}

/// # Safety
/// As [`host_slice_mut`], for the matrix's extent.
pub(crate) unsafe fn host_mat_mut<'a, T>(m: &RawMat) -> Result<MatMut<'a, T>, Error> {
    let n = m.extent("output")?;
    // SAFETY: forwarded.
    MatMut::with_stride(
        unsafe { host_slice_mut(m.ptr, n) },
        m.rows,
        m.cols,
        m.row_stride,
    )
}

/// Validates `call` and runs it on the host with `engine`.
///
/// # Safety
/// Every address of `call` must be host memory holding at least the extent its shape
/// implies, live and used by nobody else for the duration of the call; read-only inputs
/// must be initialised.
pub unsafe fn run_host(call: &RawCall, engine: HostEngine) -> Result<(), Error> {
    let checked = call.validate()?;
    let p = &checked.problem;
    if p.m == 0 {
        return Ok(());
    }
    match call.dtype {
        // SAFETY: forwarded.
        DType::BF16 => unsafe { run_host_typed::<bf16>(call, p, engine) },
        // SAFETY: forwarded.
        DType::F16 => unsafe { run_host_typed::<f16>(call, p, engine) },
    }
}

/// # Safety
/// As [`run_host`]; `call` validated into `p`.
unsafe fn run_host_typed<T: Element>(
    call: &RawCall,
    p: &Problem,
    engine: HostEngine,
) -> Result<(), Error> {
    // SAFETY (every block below): the caller's guarantee; validate() checked pointers,
    // extents and that written buffers overlap nothing else of the call.
    let x = unsafe { host_mat::<T>(&call.x)? };
    let weight = unsafe { host_slice::<T>(call.weight.ptr, p.h) };
    let residual = match &call.residual {
        Some(r) => Some(unsafe { host_mat_mut::<T>(r)? }),
        None => None,
    };
    let y_out = match &call.y_out {
        Some(y) => Some(unsafe { host_mat_mut::<T>(y)? }),
        None => None,
    };
    let y_fp4 = unsafe { host_slice_mut::<u8>(call.y_fp4.ptr, p.fp4_len()) };
    let scales = match call.scales {
        ScaleOut::RowMajor(r) => {
            ScaleOut::RowMajor(unsafe { host_slice_mut(r.ptr, p.row_major_scales_len()) })
        }
        ScaleOut::Swizzled(s) => {
            ScaleOut::Swizzled(unsafe { host_slice_mut(s.ptr, p.swizzled_scales_len()) })
        }
        ScaleOut::Both {
            row_major,
            swizzled,
        } => ScaleOut::Both {
            row_major: unsafe { host_slice_mut(row_major.ptr, p.row_major_scales_len()) },
            swizzled: unsafe { host_slice_mut(swizzled.ptr, p.swizzled_scales_len()) },
        },
    };
    let gs = match call.global_scale {
        RawGlobalScale::None => GlobalScale::Uniform(1.0),
        RawGlobalScale::Uniform(b) => {
            GlobalScale::Uniform(unsafe { host_slice::<f32>(b.ptr, 1) }[0])
        }
        RawGlobalScale::PerRow(b) => GlobalScale::PerRow(unsafe { host_slice::<f32>(b.ptr, p.m) }),
    };
    let gs = if p.format.scale == ScaleFormat::UE8M0 {
        GlobalScale::Uniform(1.0)
    } else {
        gs
    };
    let out = Fp4Out {
        y_fp4,
        scales,
        y_out,
    };
    let opts = &call.options;
    match (engine, residual) {
        (HostEngine::Cpu, r) => crate::cpu::run_checked(p, x, r, weight, out, gs),
        // The reference checks its arguments again, as the spec's own statement of them.
        (HostEngine::Reference, Some(r)) => {
            crate::reference::add_rmsnorm_fp4quant(x, r, weight, out, gs, opts)
        }
        (HostEngine::Reference, None) => {
            crate::reference::rmsnorm_fp4quant(x, weight, out, gs, opts)
        }
    }
}

/// Validates `call` and dequantises on the host.
///
/// # Safety
/// As [`run_host`].
pub unsafe fn dequantize_host(call: &RawDequant) -> Result<(), Error> {
    let checked = call.validate()?;
    let p = &checked.problem;
    if p.m == 0 {
        return Ok(());
    }
    // SAFETY (every block below): the caller's guarantee; validated as in run_host_typed.
    let q = unsafe { host_slice::<u8>(call.y_fp4.ptr, p.fp4_len()) };
    let scales = match call.scales {
        ScaleOut::RowMajor(b) => {
            ScaleIn::RowMajor(unsafe { host_slice(b.ptr, p.row_major_scales_len()) })
        }
        ScaleOut::Swizzled(b) => {
            ScaleIn::Swizzled(unsafe { host_slice(b.ptr, p.swizzled_scales_len()) })
        }
        ScaleOut::Both { .. } => unreachable!("refused by validate"),
    };
    let gs = match call.global_scale {
        _ if call.format.scale == ScaleFormat::UE8M0 => GlobalScale::Uniform(1.0),
        RawGlobalScale::None => GlobalScale::Uniform(1.0),
        RawGlobalScale::Uniform(b) => {
            GlobalScale::Uniform(unsafe { host_slice::<f32>(b.ptr, 1) }[0])
        }
        RawGlobalScale::PerRow(b) => GlobalScale::PerRow(unsafe { host_slice::<f32>(b.ptr, p.m) }),
    };
    let out = unsafe { host_slice_mut::<f32>(call.out.ptr, p.m * p.h) };
    crate::dequantize(p.m, p.h, call.format, q, scales, gs, out)
}
