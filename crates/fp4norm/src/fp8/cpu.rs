//! The fast CPU path of the FP8 ops: rows in parallel (rayon), straight-line loops the
//! compiler vectorises (branch-free FP8 encoders). Byte-identical to
//! [`super::reference`] (tested on random data and edge cases).

use rayon::prelude::*;

use super::reference::{f32_group_scale, ue8m0_group_scale};
use super::{
    biased_weight, validate, Fp8Element, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat,
    Fp8ScaleLayout, Fp8Scales, Fp8Scaling,
};
use crate::codec::{e4m3_encode_select, e5m2_encode_select};
use crate::layout::{swizzled_col_tiles, swizzled_offset, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES};
use crate::sumsq::{exact_sum_of_squares, rstd_if_decided, rstd_of_sum};
use crate::{Element, Error, MatMut, MatRef};

/// Residual add + RMSNorm + FP8 quantisation (SPEC.md §8) on the CPU.
///
/// `residual ← input + residual` (rounded to the dtype), then the normalised row times
/// the (biased) weight is quantised to FP8 codes with the options' scaling, written to
/// `out`. Every argument is checked ([`super::validate`]) before anything is written.
///
/// ```
/// use fp4norm::fp8::{self, Fp8Element, Fp8Options, Fp8Out, Fp8Scales};
/// use fp4norm::{bf16, MatMut, MatRef};
/// let (m, h) = (1, 32);
/// let x = vec![bf16::from_f32(1.5); m * h];
/// let mut r = vec![bf16::from_f32(0.5); m * h];
/// let w = vec![bf16::from_f32(0.5); h];
/// let mut q = vec![0u8; m * h];
/// // Static scale 0.5 and a Gemma weight bias: y = 1 · (0.5 + 1) = 1.5, q = E4M3(1.5 / 0.5) = 3.0.
/// let opts = Fp8Options::per_tensor(Fp8Element::E4M3, 0.5).with_eps(0.0).with_weight_bias(1.0);
/// fp8::cpu::add_rmsnorm_fp8quant(
///     MatRef::new(&x, m, h)?,
///     MatMut::new(&mut r, m, h)?,
///     &w,
///     Fp8Out { q: &mut q, scales: Fp8Scales::None, y_out: None },
///     &opts,
/// )?;
/// assert_eq!(r[0], bf16::from_f32(2.0));
/// assert_eq!(q[0], 0x44); // 3.0 = 2^1 · 1.5: exponent field 8, mantissa 4
/// # Ok::<(), fp4norm::Error>(())
/// ```
pub fn add_rmsnorm_fp8quant<T: Element>(
    input: MatRef<'_, T>,
    residual: MatMut<'_, T>,
    weight: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    run(input, Some(residual), weight, out, opts)
}

/// RMSNorm + FP8 quantisation without a residual (`h = input`) on the CPU.
pub fn rmsnorm_fp8quant<T: Element>(
    input: MatRef<'_, T>,
    weight: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    run(input, None, weight, out, opts)
}

fn run<T: Element>(
    x: MatRef<'_, T>,
    residual: Option<MatMut<'_, T>>,
    w: &[T],
    out: Fp8Out<'_, T>,
    opts: &Fp8Options,
) -> Result<(), Error> {
    let p = validate(&x, residual.as_ref(), w, &out, opts)?;
    if p.m == 0 {
        return Ok(());
    }
    let wb: Vec<f32> = w
        .iter()
        .map(|v| biased_weight(v.to_f32(), opts.weight_bias))
        .collect();
    let Fp8Out { q, scales, y_out } = out;
    let rows = Rows {
        p: &p,
        x,
        residual,
        wb: &wb,
        q,
        y_out,
    };
    let element = opts.element;
    match (opts.scaling, scales) {
        (Fp8Scaling::PerTensor(s), _) => {
            let inv = 1.0 / s;
            rows.run::<u8>(&mut [], |y, q, _| encode(element, y, inv, q));
        }
        (
            Fp8Scaling::Dynamic {
                format: Fp8ScaleFormat::F32 { s_min },
                ..
            },
            Fp8Scales::F32(buf),
        ) => dynamic(rows, buf, |amax| f32_group_scale(element, s_min, amax)),
        (
            Fp8Scaling::Dynamic {
                format: Fp8ScaleFormat::UE8M0,
                ..
            },
            Fp8Scales::UE8M0(buf),
        ) => dynamic(rows, buf, |amax| ue8m0_group_scale(element, amax)),
        _ => unreachable!("scale kind checked by validate"),
    }
    Ok(())
}

/// Everything but the scales of one validated call.
struct Rows<'a, 'p, T> {
    p: &'p Fp8Problem,
    x: MatRef<'a, T>,
    residual: Option<MatMut<'a, T>>,
    wb: &'p [f32],
    q: &'a mut [u8],
    y_out: Option<MatMut<'a, T>>,
}

/// One group of consecutive rows and the parts of every output that belong to them.
struct Task<'a, T, S> {
    first_row: usize,
    rows: usize,
    residual: Option<MatMut<'a, T>>,
    y_out: Option<MatMut<'a, T>>,
    q: &'a mut [u8],
    /// Row-major scales of these rows (empty for a per-tensor scale).
    scales: &'a mut [S],
}

impl<T: Element> Rows<'_, '_, T> {
    /// Normalises every row (steps 1–4) and hands `y`, the row's codes and its row-major
    /// scales (`H/G` of them in `rm`) to `quantize`; rows in tasks of about 64K elements.
    fn run<S: Send>(self, rm: &mut [S], quantize: impl Fn(&[f32], &mut [u8], &mut [S]) + Sync) {
        let p = self.p;
        let (m, h, n) = (p.m, p.h, p.n_groups());
        let rows_per_task = (65536 / h).clamp(1, 256);
        let n_tasks = m.div_ceil(rows_per_task);
        let mut residual_chunks = self
            .residual
            .map(|r| r.into_row_chunks(rows_per_task).into_iter());
        let mut y_out_chunks = self
            .y_out
            .map(|y| y.into_row_chunks(rows_per_task).into_iter());
        let mut q_chunks = self.q.chunks_mut(rows_per_task * h);
        let mut rm_chunks = rm.chunks_mut((rows_per_task * n).max(1));
        let tasks: Vec<Task<'_, T, S>> = (0..n_tasks)
            .map(|t| Task {
                first_row: t * rows_per_task,
                rows: rows_per_task.min(m - t * rows_per_task),
                residual: residual_chunks.as_mut().and_then(|c| c.next()),
                y_out: y_out_chunks.as_mut().and_then(|c| c.next()),
                q: q_chunks.next().expect("q length checked"),
                scales: rm_chunks.next().unwrap_or_default(),
            })
            .collect();
        let (x, wb, eps) = (&self.x, self.wb, p.options.eps);
        tasks.into_par_iter().for_each(|mut t| {
            let mut y = vec![0f32; h];
            for i in 0..t.rows {
                normalize_row(
                    x.row(t.first_row + i),
                    t.residual.as_mut().map(|r| r.row_mut(i)),
                    wb,
                    eps,
                    &mut y,
                    t.y_out.as_mut().map(|o| o.row_mut(i)),
                );
                let scales = if n == 0 {
                    &mut [][..]
                } else {
                    &mut t.scales[i * n..(i + 1) * n]
                };
                quantize(&y, &mut t.q[i * h..(i + 1) * h], scales);
            }
        });
    }
}

/// Dynamic group scales of type `S` (f32 or UE8M0 codes): rows write row-major scales
/// (into `buf` itself for the row-major layout, else into scratch), and the column-major or
/// swizzled layout is filled from them afterwards, in parallel, padding zeroed.
fn dynamic<T: Element, S: Copy + Default + Send + Sync>(
    rows: Rows<'_, '_, T>,
    buf: &mut [S],
    scale: impl Fn(f32) -> (S, f32) + Sync,
) {
    let p = *rows.p;
    let (m, n) = (p.m, p.n_groups());
    let g = p.group().expect("dynamic scaling");
    let element = p.options.element;
    let layout = p.layout().expect("dynamic scaling");
    let mut scratch = Vec::new();
    let (rm, target): (&mut [S], Option<&mut [S]>) = match layout {
        Fp8ScaleLayout::RowMajor => (buf, None),
        _ => {
            scratch.resize(m * n, S::default());
            (&mut scratch[..], Some(buf))
        }
    };
    rows.run::<S>(rm, |y, q, s| quantize_groups(element, g, y, q, s, &scale));
    let rm: &[S] = rm;
    match (layout, target) {
        (Fp8ScaleLayout::ColumnMajor, Some(t)) => {
            // Columns are Mp4 scales: at decode sizes a task per column costs more in
            // scheduling than the copy, so each task takes at least 4096 scales.
            let mp4 = p.scale_rows();
            let columns_per_task = 4096usize.div_ceil(mp4.max(1));
            t.par_chunks_mut(mp4)
                .enumerate()
                .with_min_len(columns_per_task)
                .for_each(|(grp, col)| {
                    for (row, c) in col[..m].iter_mut().enumerate() {
                        *c = rm[row * n + grp];
                    }
                    col[m..].fill(S::default()); // padding rows M..Mp4
                });
        }
        (Fp8ScaleLayout::Swizzled, Some(t)) => {
            let tile_bytes = swizzled_col_tiles(n) * SWIZZLE_TILE_BYTES;
            t.par_chunks_mut(tile_bytes)
                .enumerate()
                .for_each(|(ti, tile)| {
                    tile.fill(S::default()); // padding rows and columns
                    let first = ti * SWIZZLE_ROWS;
                    for r in 0..SWIZZLE_ROWS.min(m - first) {
                        let codes = &rm[(first + r) * n..(first + r + 1) * n];
                        for (grp, &c) in codes.iter().enumerate() {
                            tile[swizzled_offset(r, grp, n)] = c;
                        }
                    }
                });
        }
        _ => {}
    }
}

/// One row of `y` in groups of `g`: each group's amax, scale and inverse, then its codes.
#[inline(always)]
fn quantize_groups<S>(
    element: Fp8Element,
    g: usize,
    y: &[f32],
    q: &mut [u8],
    scales: &mut [S],
    scale: &impl Fn(f32) -> (S, f32),
) {
    for ((yg, qg), s) in y
        .chunks_exact(g)
        .zip(q.chunks_exact_mut(g))
        .zip(scales.iter_mut())
    {
        // |y| as bits orders like the value, and every NaN is above +Inf: an integer
        // max is the group's amax with NaN propagating, and it vectorises.
        let mut amax_bits = 0u32;
        for v in yg {
            amax_bits = amax_bits.max(v.to_bits() & 0x7FFF_FFFF);
        }
        let (sv, inv) = scale(f32::from_bits(amax_bits));
        *s = sv;
        encode(element, yg, inv, qg);
    }
}

/// `q_i = FP8(RN32(y_i · inv))` with the branch-free encoders (equal to the reference's
/// for every f32, NaN included).
#[inline(always)]
fn encode(element: Fp8Element, y: &[f32], inv: f32, q: &mut [u8]) {
    match element {
        Fp8Element::E4M3 => {
            for (qi, &yi) in q.iter_mut().zip(y) {
                *qi = e4m3_encode_select(yi * inv);
            }
        }
        Fp8Element::E5M2 => {
            for (qi, &yi) in q.iter_mut().zip(y) {
                *qi = e5m2_encode_select(yi * inv);
            }
        }
    }
}

/// Steps 1–4 of SPEC.md §1 for one row, with the biased weights `wb` (SPEC.md §8):
/// `y ← (h · rstd) · w'` as f32. The FP4 CPU path's `normalize_row` (private to
/// `crate::cpu`), with f32 weights and a tail for `H` not a multiple of 8 (per-token and
/// per-tensor scales allow any `H`).
#[inline(always)]
fn normalize_row<T: Element>(
    x: &[T],
    residual: Option<&mut [T]>,
    wb: &[f32],
    eps: f32,
    y: &mut [f32],
    y_out: Option<&mut [T]>,
) {
    match residual {
        Some(r) => {
            for ((yi, xi), ri) in y.iter_mut().zip(x).zip(r.iter_mut()) {
                let hv = T::round_from_f32(xi.to_f32() + ri.to_f32());
                *ri = hv;
                *yi = hv.to_f32();
            }
        }
        None => {
            for (yi, xi) in y.iter_mut().zip(x) {
                *yi = xi.to_f32();
            }
        }
    }
    // Eight independent f64 accumulators, so that the loop vectorises; each gets at most
    // ceil(H/8) additions, then three levels of pairwise sums: depth ceil(H/8) + 3. Where
    // that sum cannot decide the f32 rstd of the exact sum (crate::sumsq), the exact sum
    // decides.
    let mut acc = [0f64; 8];
    let chunks = y.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            let v = c[k] as f64;
            acc[k] += v * v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        let v = v as f64;
        *a += v * v;
    }
    let ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    let h = y.len();
    let rstd = rstd_if_decided(ss, h.div_ceil(8) + 3, h, eps)
        .unwrap_or_else(|| rstd_of_sum(exact_sum_of_squares(y.iter().copied()), h, eps));
    for (yi, &wi) in y.iter_mut().zip(wb) {
        *yi = (*yi * rstd) * wi;
    }
    if let Some(o) = y_out {
        for (oi, &yi) in o.iter_mut().zip(y.iter()) {
            *oi = T::round_from_f32(yi);
        }
    }
}
