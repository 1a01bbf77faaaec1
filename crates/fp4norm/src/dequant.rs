//! Dequantisation (SPEC.md §4): packed FP4 and block scales back to f32.

use rayon::prelude::*;

use crate::codec::{e2m1_decode, e4m3_decode, ue8m0_decode};
use crate::layout::{swizzled_offset, ScaleLayout};
use crate::raw::{RawBuf, RawDequant, RawGlobalScale};
use crate::{Error, Fp4Format, GlobalScale, ScaleFormat, ScaleOut};

/// Block scales to read, in one layout.
#[derive(Clone, Copy, Debug)]
pub enum ScaleIn<'a> {
    /// Row-major `[M, H/B]`.
    RowMajor(&'a [u8]),
    /// Swizzled 128×4.
    Swizzled(&'a [u8]),
}

/// `value(row, i) = e2m1(q_i) · scale_b` (SPEC.md §4): for E4M3 `RN32(RN32(e2m1 · d) / gs)`
/// with `d` the decoded scale, for UE8M0 `e2m1 · 2^(code - 127)`. Writes `M · H` f32 to `out`.
///
/// ```
/// use fp4norm::{dequantize, Fp4Format, GlobalScale, ScaleIn};
/// // One NVFP4 block: codes 0x2 (1.0) and 0xF (-6.0) repeated, scale 2.0 (E4M3 0x40).
/// let q = [0xF2u8; 8];
/// let sf = [0x40u8];
/// let mut out = [0f32; 16];
/// dequantize(1, 16, Fp4Format::NVFP4, &q, ScaleIn::RowMajor(&sf), GlobalScale::Uniform(1.0), &mut out)?;
/// assert_eq!(&out[..2], &[2.0, -12.0]);
/// # Ok::<(), fp4norm::Error>(())
/// ```
pub fn dequantize(
    m: usize,
    h: usize,
    format: Fp4Format,
    y_fp4: &[u8],
    scales: ScaleIn<'_>,
    global_scale: GlobalScale<'_>,
    out: &mut [f32],
) -> Result<(), Error> {
    let (layout, sf) = match scales {
        ScaleIn::RowMajor(s) => (ScaleLayout::RowMajor, s),
        ScaleIn::Swizzled(s) => (ScaleLayout::Swizzled, s),
    };
    let buf = |s: &[u8]| RawBuf::new(s.as_ptr() as usize as u64, s.len());
    let call = RawDequant {
        m,
        h,
        format,
        y_fp4: buf(y_fp4),
        scales: match layout {
            ScaleLayout::Swizzled => ScaleOut::Swizzled(buf(sf)),
            _ => ScaleOut::RowMajor(buf(sf)),
        },
        global_scale: match global_scale {
            // A host scale is a value, not an address: no range to check.
            GlobalScale::Uniform(_) => RawGlobalScale::None,
            GlobalScale::PerRow(g) => {
                RawGlobalScale::PerRow(RawBuf::new(g.as_ptr() as usize as u64, g.len()))
            }
        },
        out: RawBuf::new(out.as_mut_ptr() as usize as u64, out.len()),
    };
    let p = call.validate()?.problem;
    if m == 0 {
        return Ok(());
    }
    let (b, nb) = (p.block(), p.n_blocks());
    out.par_chunks_mut(h)
        .zip(y_fp4.par_chunks(h / 2))
        .enumerate()
        .for_each(|(row, (o, q))| {
            let gs = global_scale.row(row);
            for blk in 0..nb {
                let code = match layout {
                    ScaleLayout::Swizzled => sf[swizzled_offset(row, blk, nb)],
                    _ => sf[row * nb + blk],
                };
                for i in blk * b..(blk + 1) * b {
                    let nibble = (q[i / 2] >> (4 * (i % 2))) & 0xF;
                    let e = e2m1_decode(nibble);
                    let v = match format.scale {
                        ScaleFormat::E4M3 => (e * e4m3_decode(code)) / gs,
                        ScaleFormat::UE8M0 => e * ue8m0_decode(code),
                    };
                    // NaN as the canonical 0x7FFFFFFF, what the GPU's f32 arithmetic
                    // returns, so that every backend writes the same bytes.
                    o[i] = if v.is_nan() {
                        f32::from_bits(0x7FFF_FFFF)
                    } else {
                        v
                    };
                }
            }
        });
    Ok(())
}
