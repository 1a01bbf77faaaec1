//! The scalar reference: SPEC.md §1 written out step by step, one row at a time.
//!
//! This is the executable form of the contract. It is slow on purpose — every step is
//! spelled out the way the spec states it — and every other backend is tested against
//! it byte for byte. Use [`crate::cpu`] for speed.

use crate::codec::{e2m1_encode, e4m3_decode, e4m3_encode, ue8m0_ceil_code, ue8m0_inverse};
use crate::layout::swizzled_offset;
use crate::op::{validate_host, OutputsPlan};
use crate::sumsq::{exact_sum_of_squares, rstd_of_sum};
use crate::{Element, Error, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef, Options, ScaleFormat};

/// Residual add + RMSNorm + FP4 quantisation (SPEC.md §1), scalar reference.
/// Same contract as [`crate::cpu::add_rmsnorm_fp4quant`].
pub fn add_rmsnorm_fp4quant<T: Element>(
    input: MatRef<'_, T>,
    residual: MatMut<'_, T>,
    weight: &[T],
    out: Fp4Out<'_, T>,
    global_scale: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    run(input, Some(residual), weight, out, global_scale, opts)
}

/// RMSNorm + FP4 quantisation without a residual, scalar reference.
pub fn rmsnorm_fp4quant<T: Element>(
    input: MatRef<'_, T>,
    weight: &[T],
    out: Fp4Out<'_, T>,
    global_scale: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    run(input, None, weight, out, global_scale, opts)
}

fn run<T: Element>(
    x: MatRef<'_, T>,
    mut residual: Option<MatMut<'_, T>>,
    w: &[T],
    out: Fp4Out<'_, T>,
    gs: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    let p = validate_host(&x, residual.as_ref(), w, &out, &gs, opts)?;
    let OutputsPlan {
        y_fp4,
        mut row_major,
        mut swizzled,
        mut y_out,
    } = OutputsPlan::from(out);
    let (h, b, nb) = (p.h, p.block(), p.n_blocks());
    if let Some(s) = swizzled.as_deref_mut() {
        s.fill(0); // SPEC.md §3: every padding byte is 0.
    }
    let mut hrow = vec![T::default(); h];
    let mut y = vec![0f32; h];
    for row in 0..p.m {
        // 1. h_i = RNdt(RN32(x_i + r_i)); r_i ← h_i.
        let xr = x.row(row);
        match residual.as_mut() {
            Some(r) => {
                let rr = r.row_mut(row);
                for i in 0..h {
                    hrow[i] = T::round_from_f32(xr[i].to_f32() + rr[i].to_f32());
                    rr[i] = hrow[i];
                }
            }
            None => hrow.copy_from_slice(xr),
        }
        // 2. ss = Σ f64(h_i)², each square exact; the sum exact too, rounded once to f64
        //    (the order-free reading of SPEC.md §1.2: see crate::sumsq).
        let ss = exact_sum_of_squares(hrow.iter().map(|v| v.to_f32()));
        // 3. rstd = RN32(1 / sqrt(ss / H + eps)), every step in f64.
        let rstd = rstd_of_sum(ss, h, opts.eps);
        // 4. y_i = RN32(RN32(h_i · rstd) · w_i).
        for i in 0..h {
            y[i] = (hrow[i].to_f32() * rstd) * w[i].to_f32();
        }
        if let Some(yo) = y_out.as_mut() {
            for (o, &v) in yo.row_mut(row).iter_mut().zip(&y) {
                *o = T::round_from_f32(v);
            }
        }
        let g = gs.row(row);
        for blk in 0..nb {
            let yb = &y[blk * b..(blk + 1) * b];
            // 5. amax = max |y_i|, NaN if any y_i is NaN.
            let amax = yb.iter().fold(0f32, |m, v| {
                if m.is_nan() || v.is_nan() {
                    f32::NAN
                } else {
                    m.max(v.abs())
                }
            });
            // 6. the block's scale code and inverse scale.
            let (code, inv) = block_scale(p.format, amax, g);
            // 7. q_i = E2M1(RN32(y_i · inv)); 8. pack two per byte, low nibble first.
            for j in 0..b / 2 {
                let lo = e2m1_encode(yb[2 * j] * inv);
                let hi = e2m1_encode(yb[2 * j + 1] * inv);
                y_fp4[row * (h / 2) + (blk * b) / 2 + j] = lo | (hi << 4);
            }
            if let Some(s) = row_major.as_deref_mut() {
                s[row * nb + blk] = code;
            }
            if let Some(s) = swizzled.as_deref_mut() {
                s[swizzled_offset(row, blk, nb)] = code;
            }
        }
    }
    Ok(())
}

/// SPEC.md §1.6: a block's scale code and the inverse scale its elements are multiplied by.
pub fn block_scale(format: Fp4Format, amax: f32, gs: f32) -> (u8, f32) {
    match format.scale {
        ScaleFormat::E4M3 => {
            let s = (gs * amax) / 6.0;
            let code = e4m3_encode(s);
            let d = e4m3_decode(code);
            let inv = if d == 0.0 { 0.0 } else { gs / d };
            (code, inv)
        }
        ScaleFormat::UE8M0 => {
            let code = ue8m0_ceil_code(amax / 6.0);
            (code, ue8m0_inverse(code))
        }
    }
}
