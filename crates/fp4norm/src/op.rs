//! Argument checks shared by the host backends (SPEC.md §5): every rule is checked here,
//! before any backend writes a byte.

use crate::{Element, Error, Fp4Out, GlobalScale, MatMut, MatRef, Options, Problem};

/// Checks one host call and returns its [`Problem`]. Safe Rust borrows already rule out
/// overlapping inputs and outputs, so only shapes, lengths and options are checked.
pub(crate) fn validate_host<T: Element>(
    x: &MatRef<'_, T>,
    residual: Option<&MatMut<'_, T>>,
    w: &[T],
    out: &Fp4Out<'_, T>,
    gs: &GlobalScale<'_>,
    opts: &Options,
) -> Result<Problem, Error> {
    let (m, h) = (x.rows(), x.cols());
    let mut p = Problem::new(m, h, T::DTYPE, out.scales.layout(), opts)?;
    p.has_residual = residual.is_some();
    p.has_y_out = out.y_out.is_some();
    let same_shape = |name, rows: usize, cols: usize| {
        if rows != m || cols != h {
            Err(Error::ShapeMismatch {
                name,
                rows: m,
                cols: h,
                got_rows: rows,
                got_cols: cols,
            })
        } else {
            Ok(())
        }
    };
    if let Some(r) = residual {
        same_shape("residual", r.rows(), r.cols())?;
    }
    if w.len() != h {
        return Err(Error::WeightLength {
            expected: h,
            got: w.len(),
        });
    }
    let (rm, sw) = match &out.scales {
        crate::ScaleOut::RowMajor(r) => (Some(r.len()), None),
        crate::ScaleOut::Swizzled(s) => (None, Some(s.len())),
        crate::ScaleOut::Both {
            row_major,
            swizzled,
        } => (Some(row_major.len()), Some(swizzled.len())),
    };
    p.check_output_lens(out.y_fp4.len(), rm, sw)?;
    if let Some(y) = &out.y_out {
        same_shape("y_out", y.rows(), y.cols())?;
    }
    gs.check(m)?;
    Ok(p)
}

/// The outputs of one call, unpacked.
pub(crate) struct OutputsPlan<'a, T> {
    pub y_fp4: &'a mut [u8],
    pub row_major: Option<&'a mut [u8]>,
    pub swizzled: Option<&'a mut [u8]>,
    pub y_out: Option<MatMut<'a, T>>,
}

impl<'a, T> From<Fp4Out<'a, T>> for OutputsPlan<'a, T> {
    fn from(out: Fp4Out<'a, T>) -> Self {
        let (row_major, swizzled) = out.scales.split();
        OutputsPlan {
            y_fp4: out.y_fp4,
            row_major,
            swizzled,
            y_out: out.y_out,
        }
    }
}
