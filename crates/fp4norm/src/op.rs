//! The host backends' entry: their calls are checked by the one validator (SPEC.md §5,
//! [`crate::raw`]) before any backend writes a byte.

use crate::raw::RawCall;
use crate::{Element, Error, Fp4Out, GlobalScale, MatMut, MatRef, Options, Problem};

/// Checks one host call with the one validator ([`RawCall::validate`]) and returns its
/// [`Problem`]. Safe Rust borrows already rule out overlapping outputs, so in practice only
/// shapes, lengths and options can fail here.
pub(crate) fn validate_host<T: Element>(
    x: &MatRef<'_, T>,
    residual: Option<&MatMut<'_, T>>,
    w: &[T],
    out: &Fp4Out<'_, T>,
    gs: &GlobalScale<'_>,
    opts: &Options,
) -> Result<Problem, Error> {
    Ok(RawCall::from_host(x, residual, w, out, gs, opts)
        .validate()?
        .problem)
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
