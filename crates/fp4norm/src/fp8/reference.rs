//! The scalar reference of the FP8 ops: SPEC.md §1 steps 1–4 and §8 written out step by
//! step, one row at a time. Slow on purpose; [`super::cpu`] is tested against it byte for
//! byte.

use super::{
    biased_weight, validate, Fp8Element, Fp8Options, Fp8Out, Fp8ScaleFormat, Fp8Scales, Fp8Scaling,
};
use crate::codec::{ue8m0_ceil_code, ue8m0_inverse};
use crate::sumsq::{exact_sum_of_squares, rstd_of_sum};
use crate::{Element, Error, MatMut, MatRef};

/// Residual add + RMSNorm + FP8 quantisation (SPEC.md §8), scalar reference.
/// Same contract as [`super::cpu::add_rmsnorm_fp8quant`].
pub fn add_rmsnorm_fp8quant<T: Element>(
    input: MatRef<'_, T>,
    residual: MatMut<'_, T>,
    weight: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    run(input, Some(residual), weight, out, opts)
}

/// SPEC.md §9 in front of §8: the ranks' `inputs` summed in rank order
/// ([`crate::reference::allreduce_sum`]), then [`add_rmsnorm_fp8quant`] on the sum.
pub fn allreduce_add_rmsnorm_fp8quant<T: Element>(
    inputs: &[MatRef<'_, T>],
    residual: MatMut<'_, T>,
    weight: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    let sum = crate::reference::allreduce_sum(inputs)?;
    let x = MatRef::new(&sum, inputs[0].rows(), inputs[0].cols())?;
    add_rmsnorm_fp8quant(x, residual, weight, out, opts)
}

/// RMSNorm + FP8 quantisation without a residual, scalar reference.
pub fn rmsnorm_fp8quant<T: Element>(
    input: MatRef<'_, T>,
    weight: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    run(input, None, weight, out, opts)
}

/// SPEC.md §8, f32 group scales: `s = RN32(amax / FMAX)`, floored at `s_min` (a NaN `s`
/// stays NaN: `NaN < s_min` is false); `inv = 0` if `s == 0`, else `RN32(1 / s)`.
/// Returns `(s, inv)`; a NaN `s` is the canonical `0x7FFFFFFF` (what SPEC.md §4 writes
/// for NaN f32 results), so the bytes written do not depend on the input's NaN payload.
#[inline(always)]
pub fn f32_group_scale(element: Fp8Element, s_min: f32, amax: f32) -> (f32, f32) {
    let mut s = amax / element.max();
    if s < s_min {
        s = s_min;
    }
    if s.is_nan() {
        s = f32::from_bits(0x7FFF_FFFF);
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    (s, inv)
}

/// SPEC.md §8, UE8M0 group scales: `v = RN32(amax / FMAX)`, then §1.6's UE8M0 rule.
/// Returns `(code, inv)`.
#[inline(always)]
pub fn ue8m0_group_scale(element: Fp8Element, amax: f32) -> (u8, f32) {
    let code = ue8m0_ceil_code(amax / element.max());
    (code, ue8m0_inverse(code))
}

fn run<T: Element>(
    x: MatRef<'_, T>,
    mut residual: Option<MatMut<'_, T>>,
    w: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    let p = validate(&x, residual.as_ref(), w, &out, opts)?;
    let Fp8Out {
        q,
        mut scales,
        mut y_out,
    } = out;
    // Padding (column-major rows M..Mp4, swizzled rows and columns) is 0.
    match &mut scales {
        Fp8Scales::None => {}
        Fp8Scales::F32(s) => s.fill(0.0),
        Fp8Scales::UE8M0(s) => s.fill(0),
    }
    let h = p.h;
    let element = opts.element;
    // w'_i = RN32(f32(w_i) + weight_bias).
    let wb: Vec<f32> = w
        .iter()
        .map(|v| biased_weight(v.to_f32(), opts.weight_bias))
        .collect();
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
        // 2. ss = Σ f64(h_i)², the exact sum rounded once to f64 (crate::sumsq).
        let ss = exact_sum_of_squares(hrow.iter().map(|v| v.to_f32()));
        // 3. rstd = RN32(1 / sqrt(ss / H + eps)), every step in f64.
        let rstd = rstd_of_sum(ss, h, opts.eps);
        // 4. y_i = RN32(RN32(h_i · rstd) · w'_i).
        for i in 0..h {
            y[i] = (hrow[i].to_f32() * rstd) * wb[i];
        }
        if let Some(yo) = y_out.as_mut() {
            for (o, &v) in yo.row_mut(row).iter_mut().zip(&y) {
                *o = T::round_from_f32(v);
            }
        }
        let qrow = &mut q[row * h..(row + 1) * h];
        match opts.scaling {
            Fp8Scaling::PerTensor(s) => {
                // inv = RN32(1 / s); q_i = FP8(RN32(y_i · inv)).
                let inv = 1.0 / s;
                for i in 0..h {
                    qrow[i] = element.encode(y[i] * inv);
                }
            }
            Fp8Scaling::Dynamic { format, .. } => {
                let g = p.group().expect("dynamic");
                for grp in 0..p.n_groups() {
                    let yg = &y[grp * g..(grp + 1) * g];
                    // amax = max |y_i| over the group, NaN if any y_i is NaN.
                    let amax = yg.iter().fold(0f32, |m, v| {
                        if m.is_nan() || v.is_nan() {
                            f32::NAN
                        } else {
                            m.max(v.abs())
                        }
                    });
                    let at = p.scale_index(row, grp);
                    let inv = match (format, &mut scales) {
                        (Fp8ScaleFormat::F32 { s_min }, Fp8Scales::F32(sf)) => {
                            let (s, inv) = f32_group_scale(element, s_min, amax);
                            sf[at] = s;
                            inv
                        }
                        (Fp8ScaleFormat::UE8M0, Fp8Scales::UE8M0(sf)) => {
                            let (code, inv) = ue8m0_group_scale(element, amax);
                            sf[at] = code;
                            inv
                        }
                        _ => unreachable!("scale kind checked by validate"),
                    };
                    // q_i = FP8(RN32(y_i · inv)).
                    for (i, &v) in yg.iter().enumerate() {
                        qrow[grp * g + i] = element.encode(v * inv);
                    }
                }
            }
        }
    }
    Ok(())
}
