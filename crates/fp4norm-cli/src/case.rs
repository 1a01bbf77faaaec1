//! One call of an op as plain host data (a [`Case`]), what it produces ([`Outputs`]),
//! random inputs, and the byte-for-byte comparison used by `bench` and `verify`.
//!
//! A case calls the FP4 op (SPEC.md §1) or an FP8 op (SPEC.md §8); both share the inputs
//! (x, residual, weight) and the extras (`y_out`, strided rows), and differ in their codes
//! and scales. Elements are kept as raw `u16` bits with a [`DType`] tag, so that a backend
//! can upload them as they are (a GPU backend) or view them as `bf16`/`f16` (the CPU).

use fp4norm::fp8::{Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling};
use fp4norm::layout::{swizzled_col_tiles, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES};
use fp4norm::{bf16, f16, DType, Element, Options, Problem, ScaleLayout};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rayon::prelude::*;

use crate::format::Fp8Format;
use crate::CliError;

/// An empty vector with room for `n` elements, or an error naming `what` where the memory
/// cannot be had (a shape too large for this machine is an error, not an abort).
pub fn try_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>, CliError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        CliError(format!(
            "cannot allocate {} bytes for {what}",
            n as u128 * std::mem::size_of::<T>() as u128
        ))
    })?;
    Ok(v)
}

/// `n` copies of `fill`, or an error naming `what` where the memory cannot be had.
pub fn try_vec<T: Clone>(n: usize, fill: T, what: &str) -> Result<Vec<T>, CliError> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, fill);
    Ok(v)
}

/// A copy of `src`, or an error naming `what` where the memory cannot be had.
pub fn try_copy<T: Clone>(src: &[T], what: &str) -> Result<Vec<T>, CliError> {
    let mut v = try_with_capacity(src.len(), what)?;
    v.extend_from_slice(src);
    Ok(v)
}

/// `a · b`, or an error saying the sizes of `what` overflow.
fn checked_len(a: usize, b: usize, what: &str) -> Result<usize, CliError> {
    a.checked_mul(b)
        .ok_or_else(|| CliError(format!("the size of {what} overflows: check M and H")))
}

/// Byte every code and scale output buffer holds before a call: bytes a backend forgets
/// to write (layout padding included) then differ from the reference, which writes them.
pub const OUT_CANARY: u8 = 0xA5;
/// Bits every `y_out` element holds before a call (and the gaps of strided rows keep).
pub const Y_OUT_CANARY: u16 = 0x5A5A;

/// The global scale of a case (the FP4 op's; FP8 ops do not read it).
#[derive(Clone, Debug, PartialEq)]
pub enum Gs {
    /// One value for all rows.
    Uniform(f32),
    /// One value per row.
    PerRow(Vec<f32>),
}

/// Which op a case calls, with its options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// The FP4 op (SPEC.md §1): format, eps and weight bias, and the scale layout(s) written.
    Fp4 {
        /// Format, eps, weight bias.
        opts: Options,
        /// Which scale buffer(s) are written.
        layout: ScaleLayout,
    },
    /// An FP8 op (SPEC.md §8).
    Fp8 {
        /// Element, scaling, eps, weight bias.
        opts: Fp8Options,
        /// A per-tensor scale passed by address, read when the call runs (what a captured
        /// CUDA graph needs), rather than by value; the host backends read the value.
        scale_in_memory: bool,
    },
}

impl Op {
    /// The FP8 op of `opts`, its per-tensor scale (if any) read from memory.
    pub fn fp8(opts: Fp8Options) -> Op {
        Op::Fp8 {
            opts,
            scale_in_memory: true,
        }
    }

    /// RMSNorm epsilon.
    pub fn eps(&self) -> f32 {
        match self {
            Op::Fp4 { opts, .. } => opts.eps,
            Op::Fp8 { opts, .. } => opts.eps,
        }
    }

    /// Weight bias.
    pub fn weight_bias(&self) -> f32 {
        match self {
            Op::Fp4 { opts, .. } => opts.weight_bias,
            Op::Fp8 { opts, .. } => opts.weight_bias,
        }
    }

    /// The format's name as `--format` writes it.
    pub fn format_name(&self) -> String {
        match self {
            Op::Fp4 { opts, .. } => opts.format.to_string(),
            Op::Fp8 { opts, .. } => Fp8Format::of(opts).to_string(),
        }
    }

    /// The scale layout's name (`none` for a per-tensor FP8 scale).
    pub fn layout_name(&self) -> &'static str {
        match self {
            Op::Fp4 { layout, .. } => layout.name(),
            Op::Fp8 { opts, .. } => Fp8Format::of(opts).layout_name(),
        }
    }
}

/// A case's validated problem: every buffer length and the byte count.
#[derive(Clone, Copy, Debug)]
pub enum CaseProblem {
    /// The FP4 op's.
    Fp4(Problem),
    /// An FP8 op's.
    Fp8(Fp8Problem),
}

impl CaseProblem {
    /// Bytes moved by one call (SPEC.md §6; 1-byte elements for FP8).
    pub fn bytes_moved(&self) -> u64 {
        match self {
            CaseProblem::Fp4(p) => p.bytes_moved(),
            CaseProblem::Fp8(p) => p.bytes_moved(),
        }
    }
}

/// All inputs of one call, on the host.
#[derive(Clone, Debug)]
pub struct Case {
    /// Rows.
    pub m: usize,
    /// Hidden size.
    pub h: usize,
    /// Elements between row starts of `x`, the residual and `y_out` (≥ `h`).
    pub stride: usize,
    /// Element type of `x`, the residual, `w` and `y_out`.
    pub dtype: DType,
    /// The op and its options.
    pub op: Op,
    /// Input, `m · stride` elements (bits).
    pub x: Vec<u16>,
    /// Residual before the call, `m · stride` elements; `None` for the variant without one.
    pub residual: Option<Vec<u16>>,
    /// Weight, `h` elements.
    pub w: Vec<u16>,
    /// Global scale (FP4 only).
    pub gs: Gs,
    /// Whether `y_out` is written.
    pub y_out: bool,
    /// What is special about this case, for messages.
    pub note: String,
}

impl Case {
    /// An FP4 case with contiguous rows, `x` and the residual random, weights around 1,
    /// global scale 1, no `y_out`.
    pub fn random(
        m: usize,
        h: usize,
        dtype: DType,
        layout: ScaleLayout,
        opts: Options,
        seed: u64,
    ) -> Case {
        Case::random_op(m, h, dtype, Op::Fp4 { opts, layout }, seed)
    }

    /// A case of `op` with contiguous rows, `x` and the residual random, weights around 1,
    /// global scale 1, no `y_out`. For the small shapes of tests and `verify`: a shape too
    /// large for this machine's memory panics here (`bench` uses [`Case::try_random_op`]).
    pub fn random_op(m: usize, h: usize, dtype: DType, op: Op, seed: u64) -> Case {
        Case::try_random_op(m, h, dtype, op, seed).expect("a small case")
    }

    /// [`Case::random_op`], or an error where the inputs cannot be allocated.
    pub fn try_random_op(
        m: usize,
        h: usize,
        dtype: DType,
        op: Op,
        seed: u64,
    ) -> Result<Case, CliError> {
        let n = checked_len(m, h, "the input x")?;
        let mut x = try_vec(n, 0u16, "the input x")?;
        let mut r = try_vec(n, 0u16, "the residual")?;
        fill_random(&mut x, dtype, seed, -3, 2);
        fill_random(&mut r, dtype, seed ^ 0x9E37_79B9_7F4A_7C15, -3, 2);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5151);
        let mut w = try_vec(h, 0u16, "the weight")?;
        for v in w.iter_mut() {
            *v = to_bits(dtype, rng.random_range(0.5f32..1.5));
        }
        Ok(Case {
            m,
            h,
            stride: h,
            dtype,
            op,
            x,
            residual: Some(r),
            w,
            gs: Gs::Uniform(1.0),
            y_out: false,
            note: String::new(),
        })
    }

    /// The FP4 options, if this is an FP4 case.
    pub fn fp4(&self) -> Option<(&Options, ScaleLayout)> {
        match &self.op {
            Op::Fp4 { opts, layout } => Some((opts, *layout)),
            Op::Fp8 { .. } => None,
        }
    }

    /// The FP8 options, if this is an FP8 case.
    pub fn fp8(&self) -> Option<&Fp8Options> {
        match &self.op {
            Op::Fp8 { opts, .. } => Some(opts),
            Op::Fp4 { .. } => None,
        }
    }

    /// Sets eps, whichever the op.
    pub fn set_eps(&mut self, eps: f32) {
        match &mut self.op {
            Op::Fp4 { opts, .. } => *opts = opts.with_eps(eps),
            Op::Fp8 { opts, .. } => *opts = opts.with_eps(eps),
        }
    }

    /// Sets the weight bias, whichever the op.
    pub fn set_weight_bias(&mut self, bias: f32) {
        match &mut self.op {
            Op::Fp4 { opts, .. } => *opts = opts.with_weight_bias(bias),
            Op::Fp8 { opts, .. } => *opts = opts.with_weight_bias(bias),
        }
    }

    /// The validated problem of this case (an error for invalid shapes or options).
    pub fn problem(&self) -> fp4norm::Result<CaseProblem> {
        match &self.op {
            Op::Fp4 { opts, layout } => {
                let p = Problem::new(self.m, self.h, self.dtype, *layout, opts)?;
                let p = if self.residual.is_some() {
                    p
                } else {
                    p.without_residual()
                };
                Ok(CaseProblem::Fp4(p.with_y_out(self.y_out)))
            }
            Op::Fp8 { opts, .. } => {
                let p = Fp8Problem::new(self.m, self.h, self.dtype, opts)?;
                let p = if self.residual.is_some() {
                    p
                } else {
                    p.without_residual()
                };
                Ok(CaseProblem::Fp8(p.with_y_out(self.y_out)))
            }
        }
    }

    /// A one-line description for messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "M={} H={} {} {} {} eps={:e}",
            self.m,
            self.h,
            self.op.format_name(),
            self.dtype,
            self.op.layout_name(),
            self.op.eps()
        );
        let bias = self.op.weight_bias();
        if bias != 0.0 || bias.is_sign_negative() {
            s.push_str(&format!(" weight_bias={bias:e}"));
        }
        if let Op::Fp8 {
            opts,
            scale_in_memory,
        } = &self.op
        {
            match opts.scaling {
                Fp8Scaling::PerTensor(v) => s.push_str(&format!(
                    " scale={v:e} ({})",
                    if *scale_in_memory {
                        "in memory"
                    } else {
                        "by value"
                    }
                )),
                Fp8Scaling::Dynamic {
                    format: Fp8ScaleFormat::F32 { s_min },
                    ..
                } if s_min != 0.0 => s.push_str(&format!(" s_min={s_min:e}")),
                _ => {}
            }
        }
        if self.residual.is_none() {
            s.push_str(" no-residual");
        }
        if self.y_out {
            s.push_str(" y_out");
        }
        if self.stride != self.h {
            s.push_str(&format!(" stride={}", self.stride));
        }
        if self.fp4().is_some() {
            match &self.gs {
                Gs::Uniform(g) if *g == 1.0 => {}
                Gs::Uniform(g) => s.push_str(&format!(" gs={g:e}")),
                Gs::PerRow(_) => s.push_str(" gs=per-row"),
            }
        }
        if !self.note.is_empty() {
            s.push_str(&format!(" [{}]", self.note));
        }
        s
    }

    /// Rows `start .. start + len` as a case of their own (same options and weight), or
    /// an error where their copy cannot be allocated.
    pub fn rows(&self, start: usize, len: usize) -> Result<Case, CliError> {
        let span = start * self.stride..(start + len) * self.stride;
        Ok(Case {
            m: len,
            h: self.h,
            stride: self.stride,
            dtype: self.dtype,
            op: self.op,
            x: try_copy(&self.x[span.clone()], "a part of the input x")?,
            residual: match &self.residual {
                Some(r) => Some(try_copy(&r[span], "a part of the residual")?),
                None => None,
            },
            w: try_copy(&self.w, "the weight")?,
            gs: match &self.gs {
                Gs::Uniform(g) => Gs::Uniform(*g),
                Gs::PerRow(v) => Gs::PerRow(try_copy(&v[start..start + len], "global scales")?),
            },
            y_out: self.y_out,
            note: format!("rows {start}..{}", start + len),
        })
    }

    /// Bytes of codes per row: `H/2` packed FP4, `H` FP8.
    pub fn q_row_bytes(&self) -> usize {
        match self.op {
            Op::Fp4 { .. } => self.h / 2,
            Op::Fp8 { .. } => self.h,
        }
    }
}

/// The shape of an FP8 case's scale buffer, from the plain formulas (so that it also
/// describes an invalid case, whose buffers still reach the backend, which must reject it).
#[derive(Clone, Copy, Debug)]
pub struct Fp8ScaleGeom {
    /// Scales per row, `H / G`.
    pub n: usize,
    /// Where they go.
    pub layout: Fp8ScaleLayout,
    /// Bytes per scale: 4 (f32) or 1 (UE8M0).
    pub bytes: usize,
    /// Rows of the layout, padding included (`M`, `Mp4` or `Mp`).
    pub rows: usize,
    /// Scale elements, padding included.
    pub len: usize,
}

impl Fp8ScaleGeom {
    /// The scale buffer of `opts` at `m` × `h`; `None` for a per-tensor scale.
    pub fn of(m: usize, h: usize, opts: &Fp8Options) -> Option<Fp8ScaleGeom> {
        let Fp8Scaling::Dynamic {
            group,
            format,
            layout,
        } = opts.scaling
        else {
            return None;
        };
        let n = h / group.size(h).max(1);
        let rows = match layout {
            Fp8ScaleLayout::RowMajor => m,
            Fp8ScaleLayout::ColumnMajor | Fp8ScaleLayout::ColumnMajorPacked => m.div_ceil(4) * 4,
            Fp8ScaleLayout::Swizzled => m.div_ceil(SWIZZLE_ROWS) * SWIZZLE_ROWS,
        };
        let len = match layout {
            Fp8ScaleLayout::Swizzled => fp4norm::layout::swizzled_len(m, n).unwrap_or(0),
            // Words of four codes: groups 4j .. 4j + 3 of a row in word j · Mp4 + row.
            Fp8ScaleLayout::ColumnMajorPacked => rows * 4 * n.div_ceil(4),
            _ => rows * n,
        };
        let bytes = match format {
            Fp8ScaleFormat::F32 { .. } => 4,
            Fp8ScaleFormat::UE8M0 => 1,
        };
        Some(Fp8ScaleGeom {
            n,
            layout,
            bytes,
            rows,
            len,
        })
    }

    /// Row and group of scale element `i`, and whether it is padding.
    pub fn locate(&self, i: usize, m: usize) -> (usize, usize, bool) {
        let n = self.n.max(1);
        let (row, g) = match self.layout {
            Fp8ScaleLayout::RowMajor => (i / n, i % n),
            Fp8ScaleLayout::ColumnMajor => (i % self.rows.max(1), i / self.rows.max(1)),
            Fp8ScaleLayout::Swizzled => swizzled_inverse(i, self.n),
            Fp8ScaleLayout::ColumnMajorPacked => {
                let (word, byte) = (i / 4, i % 4);
                let rows = self.rows.max(1);
                (word % rows, 4 * (word / rows) + byte)
            }
        };
        (row, g, row >= m || g >= self.n)
    }
}

/// `RNdt(v)` as raw bits (the library's rounding: nearest even, overflow to ±Inf).
pub fn to_bits(dtype: DType, v: f32) -> u16 {
    match dtype {
        DType::BF16 => Element::to_bits(<bf16 as Element>::round_from_f32(v)),
        DType::F16 => Element::to_bits(<f16 as Element>::round_from_f32(v)),
    }
}

/// The exact f32 value of raw bits.
pub fn to_f32(dtype: DType, bits: u16) -> f32 {
    match dtype {
        DType::BF16 => <bf16 as Element>::from_bits(bits).to_f32(),
        DType::F16 => <f16 as Element>::from_bits(bits).to_f32(),
    }
}

/// A random non-zero f32 from the random bits `u`: random sign, mantissa in [1, 2),
/// exponent in `lo..=hi` (clamped to the normal range -126..=127).
#[inline]
pub fn random_value(u: u64, lo: i32, hi: i32) -> f32 {
    let (lo, hi) = (lo.clamp(-126, 127), hi.clamp(-126, 127));
    let span = (hi.max(lo) - lo + 1) as u64;
    let e = lo + ((u >> 32) % span) as i32;
    let sign = ((u >> 63) as u32) << 31;
    f32::from_bits(sign | (((e + 127) as u32) << 23) | (u as u32 & 0x007F_FFFF))
}

/// Fills `buf` with random non-zero values of `dtype` (magnitudes 2^lo .. 2^(hi+1)),
/// in parallel; the same seed gives the same data whatever the thread count.
pub fn fill_random(buf: &mut [u16], dtype: DType, seed: u64, lo: i32, hi: i32) {
    const CHUNK: usize = 1 << 16;
    buf.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = StdRng::seed_from_u64(
                seed.wrapping_add((i as u64).wrapping_mul(0xD134_2543_DE82_EF95)),
            );
            for v in chunk.iter_mut() {
                let mut b = to_bits(dtype, random_value(rng.next_u64(), lo, hi));
                if b & 0x7FFF == 0 {
                    b |= 1; // never zero, even if a tiny value rounded away
                }
                *v = b;
            }
        });
}

/// What one call writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    /// Codes: packed FP4, `M · H/2` bytes, or FP8, `M · H` bytes.
    pub q: Vec<u8>,
    /// FP4 row-major scales, when the layout writes them.
    pub row_major: Option<Vec<u8>>,
    /// FP4 swizzled scales (padding included), when the layout writes them.
    pub swizzled: Option<Vec<u8>>,
    /// FP8 dynamic scales as memory holds them (f32 little-endian, or UE8M0 codes) in the
    /// options' layout, padding included; `None` for a per-tensor scale.
    pub fp8_scales: Option<Vec<u8>>,
    /// The residual after the call (whole strided buffer), when there is one.
    pub residual: Option<Vec<u16>>,
    /// `y_out` (whole strided buffer), when requested.
    pub y_out: Option<Vec<u16>>,
}

/// The lengths of a case's output buffers (elements; `None`: the buffer is not written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLens {
    /// Code bytes.
    pub q: usize,
    /// FP4 row-major scale bytes.
    pub row_major: Option<usize>,
    /// FP4 swizzled scale bytes, padding included.
    pub swizzled: Option<usize>,
    /// FP8 scale bytes, padding included.
    pub fp8_scales: Option<usize>,
    /// `y_out` elements (the whole strided buffer).
    pub y_out: Option<usize>,
}

impl OutputLens {
    /// The buffers of `case`: from the problem when the case is valid, otherwise from the
    /// plain formulas (so an invalid case still reaches the backend, which must reject
    /// it); an error where those overflow.
    pub fn of(case: &Case) -> Result<OutputLens, CliError> {
        let overflow = || CliError("output sizes overflow: check M and H".into());
        let (q, rm, sw, f8) = match &case.op {
            Op::Fp4 { opts, layout } => {
                let nb = case.h / opts.format.block_size();
                let (q, rm, sw) = match case.problem() {
                    Ok(CaseProblem::Fp4(p)) => (
                        p.fp4_len(),
                        p.row_major_scales_len(),
                        p.swizzled_scales_len(),
                    ),
                    _ => (
                        case.m.checked_mul(case.h / 2).ok_or_else(overflow)?,
                        case.m.checked_mul(nb).ok_or_else(overflow)?,
                        fp4norm::layout::swizzled_len(case.m, nb).unwrap_or(0),
                    ),
                };
                (
                    q,
                    layout.has_row_major().then_some(rm),
                    layout.has_swizzled().then_some(sw),
                    None,
                )
            }
            Op::Fp8 { opts, .. } => {
                let scales = match Fp8ScaleGeom::of(case.m, case.h, opts) {
                    Some(g) => Some(g.len.checked_mul(g.bytes).ok_or_else(overflow)?),
                    None => None,
                };
                (
                    case.m.checked_mul(case.h).ok_or_else(overflow)?,
                    None,
                    None,
                    scales,
                )
            }
        };
        let y_out = match case.y_out {
            true => Some(case.m.checked_mul(case.stride).ok_or_else(overflow)?),
            false => None,
        };
        Ok(OutputLens {
            q,
            row_major: rm,
            swizzled: sw,
            fp8_scales: f8,
            y_out,
        })
    }
}

impl Outputs {
    /// Output buffers for `case` as they are before a call: canaries everywhere and the
    /// residual as the case gives it, sized as [`OutputLens::of`] says; an error where
    /// they cannot be allocated.
    pub fn initial(case: &Case) -> Result<Outputs, CliError> {
        let n = OutputLens::of(case)?;
        let canaries = |len: Option<usize>, what: &str| match len {
            Some(len) => try_vec(len, OUT_CANARY, what).map(Some),
            None => Ok(None),
        };
        Ok(Outputs {
            q: try_vec(n.q, OUT_CANARY, "the codes")?,
            row_major: canaries(n.row_major, "the row-major scales")?,
            swizzled: canaries(n.swizzled, "the swizzled scales")?,
            fp8_scales: canaries(n.fp8_scales, "the FP8 scales")?,
            residual: match &case.residual {
                Some(r) => Some(try_copy(r, "the residual")?),
                None => None,
            },
            y_out: match n.y_out {
                Some(len) => Some(try_vec(len, Y_OUT_CANARY, "y_out")?),
                None => None,
            },
        })
    }

    /// A copy of these outputs, or an error where the memory cannot be had.
    pub fn try_clone(&self) -> Result<Outputs, CliError> {
        let opt8 = |v: &Option<Vec<u8>>, what: &str| match v {
            Some(v) => try_copy(v, what).map(Some),
            None => Ok(None),
        };
        let opt16 = |v: &Option<Vec<u16>>, what: &str| match v {
            Some(v) => try_copy(v, what).map(Some),
            None => Ok(None),
        };
        Ok(Outputs {
            q: try_copy(&self.q, "the codes")?,
            row_major: opt8(&self.row_major, "the row-major scales")?,
            swizzled: opt8(&self.swizzled, "the swizzled scales")?,
            fp8_scales: opt8(&self.fp8_scales, "the FP8 scales")?,
            residual: opt16(&self.residual, "the residual")?,
            y_out: opt16(&self.y_out, "y_out")?,
        })
    }

    /// The part of these outputs that belongs to rows `start .. start + len` of `case`,
    /// laid out as the outputs of `case.rows(start, len)` would be. With a swizzled
    /// layout, `start` must be a multiple of 128 and `len` too unless the range ends at M;
    /// with an FP8 column-major layout, multiples of 4 likewise.
    pub fn rows(&self, case: &Case, start: usize, len: usize) -> Result<Outputs, CliError> {
        let qb = case.q_row_bytes();
        // Whole 128-row tiles of the swizzled layout, `n` scales of `bytes` per row.
        let tiles = |s: &[u8], n: usize, bytes: usize| {
            let tile_row_bytes = swizzled_col_tiles(n) * SWIZZLE_TILE_BYTES * bytes;
            let (t0, t1) = (start / SWIZZLE_ROWS, (start + len).div_ceil(SWIZZLE_ROWS));
            try_copy(
                &s[t0 * tile_row_bytes..t1 * tile_row_bytes],
                "a part of the scales",
            )
        };
        let nb = case
            .fp4()
            .map_or(0, |(o, _)| case.h / o.format.block_size());
        let fp8 = case.fp8().and_then(|o| Fp8ScaleGeom::of(case.m, case.h, o));
        let fp8_scales = |s: &Vec<u8>| -> Result<Vec<u8>, CliError> {
            let Some(g) = fp8 else {
                return Err(CliError("FP8 scales without FP8 options".into()));
            };
            let (n, b) = (g.n, g.bytes);
            match g.layout {
                Fp8ScaleLayout::RowMajor => try_copy(
                    &s[start * n * b..(start + len) * n * b],
                    "a part of the FP8 scales",
                ),
                // Each group's column holds the part's rows and, at the end of the
                // tensor, the padding rows up to a multiple of 4.
                Fp8ScaleLayout::ColumnMajor => {
                    let part_rows = len.div_ceil(4) * 4;
                    let mut v = try_with_capacity(n * part_rows * b, "a part of the FP8 scales")?;
                    for gi in 0..n {
                        let at = (gi * g.rows + start) * b;
                        v.extend_from_slice(&s[at..at + part_rows * b]);
                    }
                    Ok(v)
                }
                Fp8ScaleLayout::Swizzled => tiles(s, n, b),
                // The same by columns of words (four codes each).
                Fp8ScaleLayout::ColumnMajorPacked => {
                    let part_rows = len.div_ceil(4) * 4;
                    let words = n.div_ceil(4);
                    let mut v =
                        try_with_capacity(words * part_rows * 4, "a part of the FP8 scales")?;
                    for j in 0..words {
                        let at = (j * g.rows + start) * 4;
                        v.extend_from_slice(&s[at..at + part_rows * 4]);
                    }
                    Ok(v)
                }
            }
        };
        let span = start * case.stride..(start + len) * case.stride;
        Ok(Outputs {
            q: try_copy(
                &self.q[start * qb..(start + len) * qb],
                "a part of the codes",
            )?,
            row_major: match &self.row_major {
                Some(s) => Some(try_copy(
                    &s[start * nb..(start + len) * nb],
                    "a part of the row-major scales",
                )?),
                None => None,
            },
            swizzled: self
                .swizzled
                .as_ref()
                .map(|s| tiles(s, nb, 1))
                .transpose()?,
            fp8_scales: self.fp8_scales.as_ref().map(fp8_scales).transpose()?,
            residual: match &self.residual {
                Some(r) => Some(try_copy(&r[span.clone()], "a part of the residual")?),
                None => None,
            },
            y_out: match &self.y_out {
                Some(y) => Some(try_copy(&y[span], "a part of y_out")?),
                None => None,
            },
        })
    }
}

/// The first difference between two sets of outputs, located in the tensor.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// Which buffer.
    pub buffer: &'static str,
    /// Where in it (index and tensor coordinates).
    pub at: String,
    /// Expected (reference) value.
    pub expected: String,
    /// Value the backend wrote.
    pub got: String,
    /// How many bytes or elements of that buffer differ.
    pub count: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: expected {}, got {} ({} differ{})",
            self.buffer,
            self.at,
            self.expected,
            self.got,
            self.count,
            if self.count == 1 { "s" } else { "" }
        )
    }
}

/// Compares `got` with `expected` (the reference) buffer by buffer, byte for byte.
pub fn compare(case: &Case, expected: &Outputs, got: &Outputs) -> Option<Mismatch> {
    let stride = case.stride.max(1);
    let elems = |i: usize| {
        let (row, col) = (i / stride, i % stride);
        if col < case.h {
            format!("element {i} (row {row}, col {col})")
        } else {
            format!("element {i} (row {row}, gap col {col} of a strided row: must stay untouched)")
        }
    };
    let hex8 = |v: u8| format!("{v:#04x}");
    // Codes and scales of the case's op; the other op's scale buffers must be absent.
    let (codes, foreign) = match &case.op {
        Op::Fp4 { opts, .. } => (
            compare_fp4(case, opts, expected, got),
            vec![("FP8 scales", &expected.fp8_scales, &got.fp8_scales)],
        ),
        Op::Fp8 { opts, .. } => (
            compare_fp8(case, opts, expected, got),
            vec![
                ("FP4 row-major scales", &expected.row_major, &got.row_major),
                ("FP4 swizzled scales", &expected.swizzled, &got.swizzled),
            ],
        ),
    };
    if codes.is_some() {
        return codes;
    }
    for (name, e, g) in foreign {
        if let Some(m) = diff_opt(name, e, g, |i| format!("byte {i}"), hex8) {
            return Some(m);
        }
    }
    let hex16 = |v: u16| format!("{v:#06x} ({})", to_f32(case.dtype, v));
    if let Some(m) = diff_opt("residual", &expected.residual, &got.residual, elems, hex16) {
        return Some(m);
    }
    diff_opt("y_out", &expected.y_out, &got.y_out, elems, hex16)
}

/// Packed FP4 codes and block scales.
fn compare_fp4(case: &Case, opts: &Options, e: &Outputs, g: &Outputs) -> Option<Mismatch> {
    let nb = (case.h / opts.format.block_size().max(1)).max(1);
    let hb = (case.h / 2).max(1);
    let hex8 = |v: u8| format!("{v:#04x}");
    if let Some(m) = diff_elems(
        "y_fp4",
        &e.q,
        &g.q,
        |i| {
            format!(
                "byte {i} (row {}, elements {}..={})",
                i / hb,
                2 * (i % hb),
                2 * (i % hb) + 1
            )
        },
        hex8,
    ) {
        return Some(m);
    }
    if let Some(m) = diff_opt(
        "row-major scales",
        &e.row_major,
        &g.row_major,
        |i| format!("byte {i} (row {}, block {})", i / nb, i % nb),
        hex8,
    ) {
        return Some(m);
    }
    diff_opt(
        "swizzled scales",
        &e.swizzled,
        &g.swizzled,
        |i| {
            let (row, blk) = swizzled_inverse(i, nb);
            if row < case.m && blk < nb {
                format!("byte {i} (row {row}, block {blk})")
            } else {
                format!("byte {i} (padding: row {row}, block {blk}; must be 0)")
            }
        },
        hex8,
    )
}

/// FP8 codes and dynamic scales (f32 compared as 32-bit words, shown with their values).
fn compare_fp8(case: &Case, opts: &Fp8Options, e: &Outputs, g: &Outputs) -> Option<Mismatch> {
    let h = case.h.max(1);
    let element = opts.element;
    let show_code = |v: u8| format!("{v:#04x} ({})", element.decode(v));
    if let Some(m) = diff_elems(
        "q",
        &e.q,
        &g.q,
        |i| format!("byte {i} (row {}, col {})", i / h, i % h),
        show_code,
    ) {
        return Some(m);
    }
    let geom = Fp8ScaleGeom::of(case.m, case.h, opts)?;
    let at = |i: usize| {
        let (row, grp, pad) = geom.locate(i, case.m);
        if pad {
            format!(
                "scale {i} ({} padding: row {row}, group {grp}; must be 0)",
                geom.layout.name()
            )
        } else {
            format!("scale {i} ({}: row {row}, group {grp})", geom.layout.name())
        }
    };
    if geom.bytes == 4 {
        if let (Some(es), Some(gs)) = (&e.fp8_scales, &g.fp8_scales) {
            if es.len() == gs.len() && es.len() % 4 == 0 {
                let show = |w: u32| format!("{w:#010x} ({:e})", f32::from_bits(w));
                return diff_elems("FP8 f32 scales", &words(es), &words(gs), at, show);
            }
        }
        // A buffer absent, or lengths that differ: said in bytes.
        let hex8 = |v: u8| format!("{v:#04x}");
        diff_opt(
            "FP8 f32 scales",
            &e.fp8_scales,
            &g.fp8_scales,
            |i| format!("byte {i}"),
            hex8,
        )
    } else {
        let show = |c: u8| match c {
            255 => "0xff (NaN)".to_string(),
            c => format!("{c:#04x} (2^{})", c as i32 - 127),
        };
        diff_opt("FP8 UE8M0 scales", &e.fp8_scales, &g.fp8_scales, at, show)
    }
}

/// Little-endian 32-bit words of `b` (a multiple of 4 bytes).
fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Row and block of byte `o` of the swizzled layout (SPEC.md §3, inverted).
pub fn swizzled_inverse(o: usize, n_blocks: usize) -> (usize, usize) {
    let tile_row_bytes = swizzled_col_tiles(n_blocks).max(1) * SWIZZLE_TILE_BYTES;
    let (tr, rem) = (o / tile_row_bytes, o % tile_row_bytes);
    let (kt, r) = (rem / SWIZZLE_TILE_BYTES, rem % SWIZZLE_TILE_BYTES);
    let row = tr * 128 + ((r % 16) / 4) * 32 + r / 16;
    (row, kt * 4 + r % 4)
}

fn diff_elems<T: PartialEq + Copy>(
    buffer: &'static str,
    e: &[T],
    g: &[T],
    at: impl Fn(usize) -> String,
    show: impl Fn(T) -> String,
) -> Option<Mismatch> {
    if e.len() != g.len() {
        return Some(Mismatch {
            buffer,
            at: "length".into(),
            expected: e.len().to_string(),
            got: g.len().to_string(),
            count: 1,
        });
    }
    let first = e.iter().zip(g).position(|(a, b)| a != b)?;
    Some(Mismatch {
        buffer,
        at: at(first),
        expected: show(e[first]),
        got: show(g[first]),
        count: e.iter().zip(g).filter(|(a, b)| a != b).count(),
    })
}

fn diff_opt<T: PartialEq + Copy>(
    buffer: &'static str,
    e: &Option<Vec<T>>,
    g: &Option<Vec<T>>,
    at: impl Fn(usize) -> String,
    show: impl Fn(T) -> String,
) -> Option<Mismatch> {
    match (e, g) {
        (Some(e), Some(g)) => diff_elems(buffer, e, g, at, show),
        (None, None) => None,
        (e, g) => Some(presence(buffer, e.is_some(), g.is_some())),
    }
}

fn presence(buffer: &'static str, e: bool, g: bool) -> Mismatch {
    let word = |p: bool| if p { "present" } else { "absent" }.to_string();
    Mismatch {
        buffer,
        at: "buffer".into(),
        expected: word(e),
        got: word(g),
        count: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp4norm::layout::swizzled_offset;

    #[test]
    fn swizzled_inverse_inverts_the_layout() {
        for nb in [1, 4, 5, 17] {
            for row in 0..300 {
                for blk in 0..nb {
                    assert_eq!(
                        swizzled_inverse(swizzled_offset(row, blk, nb), nb),
                        (row, blk)
                    );
                }
            }
        }
    }

    use crate::backend::{Backend, HostBackend};
    use fp4norm::fp8::{Fp8Element, Fp8Group};

    /// The reference's outputs of `case`.
    fn reference(case: &Case) -> Outputs {
        let r = HostBackend::reference();
        let mut p = r.prepare(case).unwrap();
        p.run_once().unwrap();
        p.outputs().unwrap()
    }

    fn fp8_kinds() -> Vec<Fp8Options> {
        use Fp8ScaleLayout::*;
        let d = |g, f, l| Fp8Options::dynamic(Fp8Element::E4M3, g, f, l);
        vec![
            Fp8Options::per_tensor(Fp8Element::E5M2, 0.25),
            Fp8Options::per_token(Fp8Element::E4M3),
            d(Fp8Group::PerToken, Fp8ScaleFormat::UE8M0, ColumnMajor),
            d(Fp8Group::G32, Fp8ScaleFormat::F32_NO_FLOOR, ColumnMajor),
            d(Fp8Group::G64, Fp8ScaleFormat::UE8M0, RowMajor),
            d(
                Fp8Group::G128,
                Fp8ScaleFormat::F32 { s_min: 1e-3 },
                ColumnMajor,
            ),
            Fp8Options::mxfp8(),
            d(Fp8Group::G32, Fp8ScaleFormat::UE8M0, ColumnMajorPacked),
            d(Fp8Group::G128, Fp8ScaleFormat::UE8M0, ColumnMajorPacked),
        ]
    }

    /// The plain formulas every invalid case's buffers come from agree with the library's
    /// sizes wherever the library accepts the case.
    #[test]
    fn fp8_scale_geometry_matches_the_problem() {
        for opts in fp8_kinds() {
            for m in [0, 1, 3, 4, 5, 127, 128, 129, 300] {
                for h in [32, 128, 384, 4096] {
                    let Ok(p) = Fp8Problem::new(m, h, DType::F16, &opts) else {
                        continue; // H = 32 with groups of 64 or 128
                    };
                    match Fp8ScaleGeom::of(m, h, &opts) {
                        None => assert_eq!(p.scales_len(), 0),
                        Some(g) => {
                            assert_eq!(g.len, p.scales_len(), "{opts:?} {m}x{h}");
                            assert_eq!(g.bytes, p.scale_element_bytes());
                            assert_eq!(g.rows, p.scale_rows());
                            for row in 0..m {
                                for grp in 0..p.n_groups() {
                                    let at = p.scale_index(row, grp);
                                    assert_eq!(g.locate(at, m), (row, grp, false));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// What `bench` relies on to check a large shape in parts: the outputs of whole
    /// 128-row tiles, cut out of a call's outputs, are the outputs of those rows run alone
    /// (column-major columns and swizzled tiles included, padding only at the end).
    #[test]
    fn outputs_of_row_ranges_are_the_outputs_of_those_rows() {
        let mut ops: Vec<Op> = fp8_kinds().into_iter().map(Op::fp8).collect();
        ops.push(Op::Fp4 {
            opts: Options::nvfp4(),
            layout: ScaleLayout::Both,
        });
        for (k, op) in ops.into_iter().enumerate() {
            let mut case = Case::random_op(301, 256, DType::BF16, op, k as u64);
            case.y_out = true;
            let whole = reference(&case);
            for (start, len) in [(0, 128), (128, 128), (256, 45), (128, 173), (0, 301)] {
                assert_eq!(
                    whole.rows(&case, start, len).unwrap(),
                    reference(&case.rows(start, len).unwrap()),
                    "{} rows {start}..{}",
                    case.describe(),
                    start + len
                );
            }
        }
    }

    #[test]
    fn fp8_mismatches_name_the_buffer_the_row_the_group_and_padding() {
        // Groups of 128 of H = 256, column-major: [2, Mp4 = 8] f32, rows 5..8 padding.
        let opts = Fp8Options::dynamic(
            Fp8Element::E4M3,
            Fp8Group::G128,
            Fp8ScaleFormat::F32_NO_FLOOR,
            Fp8ScaleLayout::ColumnMajor,
        );
        let case = Case::random_op(5, 256, DType::BF16, Op::fp8(opts), 3);
        let want = reference(&case);
        let differs = |f: &dyn Fn(&mut Outputs)| {
            let mut got = want.clone();
            f(&mut got);
            compare(&case, &want, &got)
                .expect("a difference")
                .to_string()
        };
        assert_eq!(
            compare(&case, &want, &want.clone()).map(|m| m.to_string()),
            None
        );
        let m = differs(&|o| o.q[256 + 3] ^= 0x01);
        assert!(m.starts_with("q byte 259 (row 1, col 3)"), "{m}");
        // Scale (row 2, group 1) is element 1·8 + 2: bytes 40..44.
        let m = differs(&|o| o.fp8_scales.as_mut().unwrap()[41] ^= 0x10);
        assert!(
            m.starts_with("FP8 f32 scales scale 10 (column-major: row 2, group 1)")
                && m.ends_with("(1 differs)"),
            "{m}"
        );
        let m = differs(&|o| o.fp8_scales.as_mut().unwrap()[6 * 4] = 1);
        assert!(
            m.contains("column-major padding: row 6, group 0; must be 0"),
            "{m}"
        );
        let m = differs(&|o| o.fp8_scales = None);
        assert!(m.contains("expected present, got absent"), "{m}");
        let m = differs(&|o| o.row_major = Some(vec![0; 10]));
        assert!(m.starts_with("FP4 row-major scales buffer"), "{m}");

        // MXFP8 at M = 3, H = 64: one swizzled tile, everything past (row 2, group 1) padding.
        let case = Case::random_op(3, 64, DType::F16, Op::fp8(Fp8Options::mxfp8()), 4);
        let want = reference(&case);
        let mut got = want.clone();
        got.fp8_scales.as_mut().unwrap()[fp4norm::layout::swizzled_offset(3, 1, 2)] = 0x7F;
        let m = compare(&case, &want, &got).unwrap().to_string();
        assert!(
            m.contains("swizzled padding: row 3, group 1; must be 0")
                && m.contains("got 0x7f (2^0)"),
            "{m}"
        );
        let mut got = want.clone();
        got.fp8_scales.as_mut().unwrap()[fp4norm::layout::swizzled_offset(2, 1, 2)] = 0xFF;
        let m = compare(&case, &want, &got).unwrap().to_string();
        assert!(
            m.contains("(swizzled: row 2, group 1)") && m.contains("got 0xff (NaN)"),
            "{m}"
        );
    }

    #[test]
    fn random_values_are_never_zero() {
        let mut buf = vec![0u16; 100_000];
        for dtype in [DType::BF16, DType::F16] {
            fill_random(&mut buf, dtype, 7, -3, 2);
            assert!(buf.iter().all(|&b| b & 0x7FFF != 0));
        }
    }
}
