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
    // w'_i = RN32(f32(w_i) + weight_bias), the weight itself where the bias is ±0 (§8).
    let w: Vec<f32> = w
        .iter()
        .map(|v| crate::fp8::biased_weight(v.to_f32(), opts.weight_bias))
        .collect();
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
        // 4. y_i = RN32(RN32(h_i · rstd) · w'_i).
        for i in 0..h {
            y[i] = (hrow[i].to_f32() * rstd) * w[i];
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

/// SPEC.md §9, the reduction: the ranks' inputs summed element by element in rank order,
/// one f32 rounding per addition, then one rounding to the dtype. Returns the `[M, H]` sum,
/// contiguous. Every rank computes the same bytes from the same inputs, whatever their
/// transport (unlike an all-reduce whose order depends on its algorithm and rank count).
pub fn allreduce_sum<T: Element>(inputs: &[MatRef<'_, T>]) -> Result<Vec<T>, Error> {
    let first = inputs.first().ok_or(Error::NoRankInputs)?;
    let (m, h) = (first.rows(), first.cols());
    for (rank, x) in inputs.iter().enumerate() {
        if x.rows() != m || x.cols() != h {
            return Err(Error::RankShapeMismatch {
                rank,
                rows: m,
                cols: h,
                got_rows: x.rows(),
                got_cols: x.cols(),
            });
        }
    }
    let mut sum = Vec::with_capacity(m.checked_mul(h).ok_or(Error::SizeOverflow)?);
    let mut acc = vec![0f32; h];
    for row in 0..m {
        acc.iter_mut()
            .zip(first.row(row))
            .for_each(|(a, v)| *a = v.to_f32());
        for x in &inputs[1..] {
            for (a, v) in acc.iter_mut().zip(x.row(row)) {
                *a += v.to_f32();
            }
        }
        sum.extend(acc.iter().map(|&a| T::round_from_f32(a)));
    }
    Ok(sum)
}

/// SPEC.md §9: the all-reduce of the ranks' `inputs` ([`allreduce_sum`]) fused in front of
/// [`add_rmsnorm_fp4quant`], with this rank's residual, weight and outputs. Every argument
/// is checked before anything is written.
pub fn allreduce_add_rmsnorm_fp4quant<T: Element>(
    inputs: &[MatRef<'_, T>],
    residual: MatMut<'_, T>,
    weight: &[T],
    out: Fp4Out<'_, T>,
    global_scale: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    let sum = allreduce_sum(inputs)?;
    let x = MatRef::new(&sum, inputs[0].rows(), inputs[0].cols())?;
    add_rmsnorm_fp4quant(x, residual, weight, out, global_scale, opts)
}

/// SPEC.md §9 without a residual: the all-reduce of `inputs`, then [`rmsnorm_fp4quant`].
pub fn allreduce_rmsnorm_fp4quant<T: Element>(
    inputs: &[MatRef<'_, T>],
    weight: &[T],
    out: Fp4Out<'_, T>,
    global_scale: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    let sum = allreduce_sum(inputs)?;
    let x = MatRef::new(&sum, inputs[0].rows(), inputs[0].cols())?;
    rmsnorm_fp4quant(x, weight, out, global_scale, opts)
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
