//! One call of the op as plain host data (a [`Case`]), what it produces ([`Outputs`]),
//! random inputs, and the byte-for-byte comparison used by `bench` and `verify`.
//!
//! Elements are kept as raw `u16` bits with a [`DType`] tag, so that a backend can
//! upload them as they are (a GPU backend) or view them as `bf16`/`f16` (the CPU).

use fp4norm::layout::{swizzled_col_tiles, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES};
use fp4norm::{bf16, f16, DType, Element, Options, Problem, ScaleLayout};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rayon::prelude::*;

/// Byte every FP4 and scale output buffer holds before a call: bytes a backend forgets
/// to write (swizzle padding included) then differ from the reference, which writes them.
pub const OUT_CANARY: u8 = 0xA5;
/// Bits every `y_out` element holds before a call (and the gaps of strided rows keep).
pub const Y_OUT_CANARY: u16 = 0x5A5A;

/// The global scale of a case.
#[derive(Clone, Debug, PartialEq)]
pub enum Gs {
    /// One value for all rows.
    Uniform(f32),
    /// One value per row.
    PerRow(Vec<f32>),
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
    /// Which scale buffer(s) are written.
    pub layout: ScaleLayout,
    /// Format and eps.
    pub opts: Options,
    /// Input, `m · stride` elements (bits).
    pub x: Vec<u16>,
    /// Residual before the call, `m · stride` elements; `None` for `rmsnorm_fp4quant`.
    pub residual: Option<Vec<u16>>,
    /// Weight, `h` elements.
    pub w: Vec<u16>,
    /// Global scale.
    pub gs: Gs,
    /// Whether `y_out` is written.
    pub y_out: bool,
    /// What is special about this case, for messages.
    pub note: String,
}

impl Case {
    /// A case with contiguous rows, `x` and the residual random, weights around 1,
    /// global scale 1, eps 1e-6, no `y_out`.
    pub fn random(
        m: usize,
        h: usize,
        dtype: DType,
        layout: ScaleLayout,
        opts: Options,
        seed: u64,
    ) -> Case {
        let mut x = vec![0u16; m * h];
        let mut r = vec![0u16; m * h];
        fill_random(&mut x, dtype, seed, -3, 2);
        fill_random(&mut r, dtype, seed ^ 0x9E37_79B9_7F4A_7C15, -3, 2);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5151);
        let w = (0..h)
            .map(|_| to_bits(dtype, rng.random_range(0.5f32..1.5)))
            .collect();
        Case {
            m,
            h,
            stride: h,
            dtype,
            layout,
            opts,
            x,
            residual: Some(r),
            w,
            gs: Gs::Uniform(1.0),
            y_out: false,
            note: String::new(),
        }
    }

    /// The validated problem of this case (an error for invalid shapes or options).
    pub fn problem(&self) -> fp4norm::Result<Problem> {
        let p = Problem::new(self.m, self.h, self.dtype, self.layout, &self.opts)?;
        let p = if self.residual.is_some() {
            p
        } else {
            p.without_residual()
        };
        Ok(p.with_y_out(self.y_out))
    }

    /// A one-line description for messages.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "M={} H={} {} {} {} eps={:e}",
            self.m, self.h, self.opts.format, self.dtype, self.layout, self.opts.eps
        );
        if self.residual.is_none() {
            s.push_str(" no-residual");
        }
        if self.y_out {
            s.push_str(" y_out");
        }
        if self.stride != self.h {
            s.push_str(&format!(" stride={}", self.stride));
        }
        match &self.gs {
            Gs::Uniform(g) if *g == 1.0 => {}
            Gs::Uniform(g) => s.push_str(&format!(" gs={g:e}")),
            Gs::PerRow(_) => s.push_str(" gs=per-row"),
        }
        if !self.note.is_empty() {
            s.push_str(&format!(" [{}]", self.note));
        }
        s
    }

    /// Rows `start .. start + len` as a case of their own (same options and weight).
    pub fn rows(&self, start: usize, len: usize) -> Case {
        let span = start * self.stride..(start + len) * self.stride;
        Case {
            m: len,
            h: self.h,
            stride: self.stride,
            dtype: self.dtype,
            layout: self.layout,
            opts: self.opts,
            x: self.x[span.clone()].to_vec(),
            residual: self.residual.as_ref().map(|r| r[span].to_vec()),
            w: self.w.clone(),
            gs: match &self.gs {
                Gs::Uniform(g) => Gs::Uniform(*g),
                Gs::PerRow(v) => Gs::PerRow(v[start..start + len].to_vec()),
            },
            y_out: self.y_out,
            note: format!("rows {start}..{}", start + len),
        }
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
    /// Packed FP4, `M · H/2` bytes.
    pub y_fp4: Vec<u8>,
    /// Row-major scales, when the layout writes them.
    pub row_major: Option<Vec<u8>>,
    /// Swizzled scales (padding included), when the layout writes them.
    pub swizzled: Option<Vec<u8>>,
    /// The residual after the call (whole strided buffer), when there is one.
    pub residual: Option<Vec<u16>>,
    /// `y_out` (whole strided buffer), when requested.
    pub y_out: Option<Vec<u16>>,
}

impl Outputs {
    /// Output buffers for `case` as they are before a call: canaries everywhere and the
    /// residual as the case gives it. Sizes come from [`Problem`] when the case is
    /// valid, otherwise from the plain formulas (so an invalid case still reaches the
    /// backend, which must reject it).
    pub fn initial(case: &Case) -> Outputs {
        let b = case.opts.format.block_size();
        let nb = case.h / b;
        let (fp4, rm, sw) = match case.problem() {
            Ok(p) => (
                p.fp4_len(),
                p.row_major_scales_len(),
                p.swizzled_scales_len(),
            ),
            Err(_) => (
                case.m * case.h / 2,
                case.m * nb,
                fp4norm::layout::swizzled_len(case.m, nb).unwrap_or(0),
            ),
        };
        Outputs {
            y_fp4: vec![OUT_CANARY; fp4],
            row_major: case.layout.has_row_major().then(|| vec![OUT_CANARY; rm]),
            swizzled: case.layout.has_swizzled().then(|| vec![OUT_CANARY; sw]),
            residual: case.residual.clone(),
            y_out: case.y_out.then(|| vec![Y_OUT_CANARY; case.m * case.stride]),
        }
    }

    /// The part of these outputs that belongs to rows `start .. start + len` of `case`,
    /// laid out as the outputs of `case.rows(start, len)` would be. With a swizzled
    /// layout, `start` must be a multiple of 128 and `len` too unless the range ends at M.
    pub fn rows(&self, case: &Case, start: usize, len: usize) -> Outputs {
        let nb = case.h / case.opts.format.block_size();
        let tile_row_bytes = swizzled_col_tiles(nb) * SWIZZLE_TILE_BYTES;
        let (t0, t1) = (start / SWIZZLE_ROWS, (start + len).div_ceil(SWIZZLE_ROWS));
        Outputs {
            y_fp4: self.y_fp4[start * case.h / 2..(start + len) * case.h / 2].to_vec(),
            row_major: self
                .row_major
                .as_ref()
                .map(|s| s[start * nb..(start + len) * nb].to_vec()),
            swizzled: self
                .swizzled
                .as_ref()
                .map(|s| s[t0 * tile_row_bytes..t1 * tile_row_bytes].to_vec()),
            residual: self
                .residual
                .as_ref()
                .map(|r| r[start * case.stride..(start + len) * case.stride].to_vec()),
            y_out: self
                .y_out
                .as_ref()
                .map(|y| y[start * case.stride..(start + len) * case.stride].to_vec()),
        }
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
    let nb = case.h / case.opts.format.block_size().max(1);
    let hb = (case.h / 2).max(1);
    let stride = case.stride.max(1);
    let elems = |i: usize| {
        let (row, col) = (i / stride, i % stride);
        if col < case.h {
            format!("element {i} (row {row}, col {col})")
        } else {
            format!("element {i} (row {row}, gap col {col} of a strided row: must stay untouched)")
        }
    };
    if let Some(m) = diff_bytes("y_fp4", &expected.y_fp4, &got.y_fp4, |i| {
        format!(
            "byte {i} (row {}, elements {}..={})",
            i / hb,
            2 * (i % hb),
            2 * (i % hb) + 1
        )
    }) {
        return Some(m);
    }
    if let Some(m) = diff_opt(
        "row-major scales",
        &expected.row_major,
        &got.row_major,
        |i| format!("byte {i} (row {}, block {})", i / nb.max(1), i % nb.max(1)),
    ) {
        return Some(m);
    }
    if let Some(m) = diff_opt("swizzled scales", &expected.swizzled, &got.swizzled, |i| {
        let (row, blk) = swizzled_inverse(i, nb);
        if row < case.m && blk < nb {
            format!("byte {i} (row {row}, block {blk})")
        } else {
            format!("byte {i} (padding: row {row}, block {blk}; must be 0)")
        }
    }) {
        return Some(m);
    }
    let hex16 = |v: u16| format!("{v:#06x} ({})", to_f32(case.dtype, v));
    if let Some(m) = diff_opt16("residual", &expected.residual, &got.residual, elems, hex16) {
        return Some(m);
    }
    diff_opt16("y_out", &expected.y_out, &got.y_out, elems, hex16)
}

/// Row and block of byte `o` of the swizzled layout (SPEC.md §3, inverted).
pub fn swizzled_inverse(o: usize, n_blocks: usize) -> (usize, usize) {
    let tile_row_bytes = swizzled_col_tiles(n_blocks).max(1) * SWIZZLE_TILE_BYTES;
    let (tr, rem) = (o / tile_row_bytes, o % tile_row_bytes);
    let (kt, r) = (rem / SWIZZLE_TILE_BYTES, rem % SWIZZLE_TILE_BYTES);
    let row = tr * 128 + ((r % 16) / 4) * 32 + r / 16;
    (row, kt * 4 + r % 4)
}

fn diff_bytes(
    buffer: &'static str,
    e: &[u8],
    g: &[u8],
    at: impl Fn(usize) -> String,
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
        expected: format!("{:#04x}", e[first]),
        got: format!("{:#04x}", g[first]),
        count: e.iter().zip(g).filter(|(a, b)| a != b).count(),
    })
}

fn diff_opt(
    buffer: &'static str,
    e: &Option<Vec<u8>>,
    g: &Option<Vec<u8>>,
    at: impl Fn(usize) -> String,
) -> Option<Mismatch> {
    match (e, g) {
        (Some(e), Some(g)) => diff_bytes(buffer, e, g, at),
        (None, None) => None,
        (e, g) => Some(presence(buffer, e.is_some(), g.is_some())),
    }
}

fn diff_opt16(
    buffer: &'static str,
    e: &Option<Vec<u16>>,
    g: &Option<Vec<u16>>,
    at: impl Fn(usize) -> String,
    show: impl Fn(u16) -> String,
) -> Option<Mismatch> {
    match (e, g) {
        (Some(e), Some(g)) => {
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

    #[test]
    fn random_values_are_never_zero() {
        let mut buf = vec![0u16; 100_000];
        for dtype in [DType::BF16, DType::F16] {
            fill_random(&mut buf, dtype, 7, -3, 2);
            assert!(buf.iter().all(|&b| b & 0x7FFF != 0));
        }
    }
}
