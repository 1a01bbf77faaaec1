//! One validated call: shapes, buffer sizes and the byte count of SPEC.md §6.
//!
//! Every backend builds a [`Problem`] first; it holds all the size arithmetic, so no
//! backend computes a buffer length or offset by itself.

use crate::layout::{self, ScaleLayout};
use crate::{DType, Error, Fp4Format, Options};

/// Shape and options of one call, checked against SPEC.md §5. Built only by
/// [`Problem::new`] (its fields are public to read); the byte counts saturate at
/// `usize::MAX` where a field changed afterwards makes them overflow, so that no buffer
/// fits them and the call fails instead of wrapping.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Problem {
    /// Rows (tokens); leading dimensions already flattened.
    pub m: usize,
    /// Hidden size: elements per row.
    pub h: usize,
    /// Element dtype.
    pub dtype: DType,
    /// Block size and scale format.
    pub format: Fp4Format,
    /// Which scale buffers are written.
    pub layout: ScaleLayout,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Added to every weight (SPEC.md §8; 0: the weight as it is).
    pub weight_bias: f32,
    /// Whether the residual is added (and written back).
    pub has_residual: bool,
    /// Whether `y_out` is written.
    pub has_y_out: bool,
}

impl Problem {
    /// Checks the shape and options: `H` a positive multiple of the block, `eps` finite
    /// and non-negative, `weight_bias` finite, and every size representable in 64 bits.
    pub fn new(
        m: usize,
        h: usize,
        dtype: DType,
        layout: ScaleLayout,
        opts: &Options,
    ) -> Result<Self, Error> {
        let block = opts.format.block_size();
        if h == 0 {
            return Err(Error::ZeroHidden { block });
        }
        if h % block != 0 {
            return Err(Error::HiddenNotMultipleOfBlock { h, block });
        }
        if !opts.eps.is_finite() || opts.eps < 0.0 {
            return Err(Error::InvalidEps(opts.eps));
        }
        if !opts.weight_bias.is_finite() {
            return Err(Error::InvalidWeightBias(opts.weight_bias));
        }
        let p = Problem {
            m,
            h,
            dtype,
            format: opts.format,
            layout,
            eps: opts.eps,
            weight_bias: opts.weight_bias,
            has_residual: true,
            has_y_out: false,
        };
        // Every byte count below must fit; checking once here lets the rest use plain arithmetic.
        let elems = m.checked_mul(h).ok_or(Error::SizeOverflow)?;
        elems.checked_mul(8).ok_or(Error::SizeOverflow)?;
        layout::swizzled_len(m, p.n_blocks())?;
        Ok(p)
    }

    /// The same problem without a residual (`rmsnorm_fp4quant`).
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn without_residual(self) -> Self {
        Problem {
            has_residual: false,
            ..self
        }
    }

    /// The same problem with (or without) `y_out`.
    #[must_use = "returns a new value; the original is unchanged"]
    pub fn with_y_out(self, y_out: bool) -> Self {
        Problem {
            has_y_out: y_out,
            ..self
        }
    }

    /// Elements per block.
    pub fn block(&self) -> usize {
        self.format.block_size()
    }

    /// Blocks per row: `H / B`.
    pub fn n_blocks(&self) -> usize {
        self.h / self.block()
    }

    /// Bytes of `y_fp4`: `M · H / 2`.
    pub fn fp4_len(&self) -> usize {
        self.m.saturating_mul(self.h / 2)
    }

    /// Bytes of the row-major scale buffer: `M · H / B`.
    pub fn row_major_scales_len(&self) -> usize {
        self.m.saturating_mul(self.n_blocks())
    }

    /// Bytes of the swizzled scale buffer: `Mp · nK · 4` (padding included).
    pub fn swizzled_scales_len(&self) -> usize {
        layout::swizzled_len(self.m, self.n_blocks()).unwrap_or(usize::MAX)
    }

    /// Scale bytes written in this problem's layout (both buffers for [`ScaleLayout::Both`]).
    /// Saturates at `usize::MAX` (each buffer fits, their sum may not near the 64-bit limit).
    pub fn scale_bytes_written(&self) -> usize {
        let mut n = 0usize;
        if self.layout.has_row_major() {
            n = n.saturating_add(self.row_major_scales_len());
        }
        if self.layout.has_swizzled() {
            n = n.saturating_add(self.swizzled_scales_len());
        }
        n
    }

    /// Bytes moved through memory by one call (SPEC.md §6), for bandwidth figures:
    /// `M·H·3·e + H·e + M·H/2 + scale bytes (+ M·H·e for y_out)`. Without a residual the
    /// residual's read and write drop out: `M·H·e` read instead of `3·M·H·e`.
    /// Computed in 128 bits and saturated at `u64::MAX`: `Problem::new` accepts sizes up to
    /// the 64-bit limit, whose byte count (about 8.5·M·H with `y_out`) can exceed it.
    pub fn bytes_moved(&self) -> u64 {
        let e = self.dtype.size() as u128;
        let mh = (self.m as u128) * (self.h as u128);
        let io = if self.has_residual { 3 } else { 1 };
        let mut scales = 0u128;
        if self.layout.has_row_major() {
            scales += self.row_major_scales_len() as u128;
        }
        if self.layout.has_swizzled() {
            scales += self.swizzled_scales_len() as u128;
        }
        let mut bytes = mh * io * e + self.h as u128 * e + mh / 2 + scales;
        if self.has_y_out {
            bytes += mh * e;
        }
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// Checks one output buffer's length.
    pub(crate) fn check_len(
        &self,
        name: &'static str,
        got: usize,
        expected: usize,
        what: &str,
    ) -> Result<(), Error> {
        if got != expected {
            return Err(Error::OutputSize {
                name,
                expected,
                got,
                what: what.to_string(),
            });
        }
        Ok(())
    }

    /// Checks the length of `y_fp4` and of the scale buffers the layout writes, each given
    /// with the name errors report it by.
    pub(crate) fn check_output_lens(
        &self,
        y_fp4: usize,
        row_major: Option<(&'static str, usize)>,
        swizzled: Option<(&'static str, usize)>,
    ) -> Result<(), Error> {
        self.check_len(
            "y_fp4",
            y_fp4,
            self.fp4_len(),
            &format!("M·H/2 for M = {}, H = {}", self.m, self.h),
        )?;
        if let Some((name, len)) = row_major {
            self.check_len(
                name,
                len,
                self.row_major_scales_len(),
                &format!("M·H/B for M = {}, H/B = {}", self.m, self.n_blocks()),
            )?;
        }
        if let Some((name, len)) = swizzled {
            self.check_len(
                name,
                len,
                self.swizzled_scales_len(),
                &format!(
                    "the swizzled 128x4 layout: 128·ceil(M/128)·4·ceil((H/B)/4) for M = {}, H/B = {}",
                    self.m,
                    self.n_blocks()
                ),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_moved_matches_spec_section_6() {
        let p = Problem::new(
            1024,
            4096,
            DType::BF16,
            ScaleLayout::RowMajor,
            &Options::nvfp4(),
        )
        .unwrap();
        let mh = 1024u64 * 4096;
        assert_eq!(p.bytes_moved(), mh * 6 + 4096 * 2 + mh / 2 + mh / 16);
        let both = Problem {
            layout: ScaleLayout::Both,
            ..p
        };
        assert_eq!(both.bytes_moved(), p.bytes_moved() + 1024 * 256);
        assert_eq!(
            both.with_y_out(true).bytes_moved(),
            both.bytes_moved() + mh * 2
        );
    }
}
