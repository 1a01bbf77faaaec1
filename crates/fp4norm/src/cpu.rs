//! The fast CPU backend: rows in parallel (rayon), each row computed with explicit SIMD
//! where the CPU has it (AVX-512 or AVX2 on x86-64, chosen at run time: `isa`, `x86`),
//! else with straight-line loops the compiler vectorises (the portable path, below).
//! Every path is byte-identical to [`crate::reference`] (tested per path in `cpu::tests`,
//! on random data and edge cases, and lane functions over every input).

use rayon::prelude::*;

pub(crate) mod isa;
#[cfg(test)]
mod tests;
// Compiled only where build.rs saw Rust 1.89+ (AVX-512 intrinsics), whatever the
// workspace's rust-version admits.
#[cfg(all(target_arch = "x86_64", fp4norm_simd))]
#[clippy::msrv = "1.89"]
pub(crate) mod x86;

use isa::Isa;

use crate::codec::{e2m1_encode, e2m1_encode_non_nan};
use crate::layout::{swizzled_col_tiles, swizzled_offset, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES};
use crate::op::{validate_host, OutputsPlan};
use crate::reference::block_scale;
use crate::sumsq::{exact_sum_of_squares, rstd_if_decided, rstd_of_sum};
use crate::{
    BlockSize, Element, Error, Fp4Format, Fp4Out, GlobalScale, MatMut, MatRef, Options, Problem,
};

/// The CPU row kernels of the FP4 and FP8 ops on this CPU: `"avx512"`, `"avx2"` or
/// `"portable"` — the best this CPU supports, capped by `FP4NORM_CPU_ISA` (every path
/// writes the same bytes; tools print it so that a figure or a check names the code that
/// ran).
pub fn simd_path() -> &'static str {
    Isa::selected().name()
}

/// Residual add + RMSNorm + FP4 quantisation (SPEC.md §1) on the CPU.
///
/// `residual ← input + residual` (rounded to the dtype), then the normalised, weighted
/// row is quantised to packed FP4 with one scale per block, written to `out`.
/// Every argument is checked before anything is written.
///
/// ```
/// use fp4norm::{cpu, Fp4Out, GlobalScale, MatMut, MatRef, Options, ScaleOut};
/// use half::bf16;
/// let (m, h) = (2, 32);
/// let x: Vec<bf16> = (0..m * h).map(|i| bf16::from_f32(i as f32 / 7.0)).collect();
/// let mut r = vec![bf16::from_f32(0.5); m * h];
/// let w = vec![bf16::ONE; h];
/// let mut q = vec![0u8; m * h / 2];
/// let mut sf = vec![0u8; m * h / 16];
/// cpu::add_rmsnorm_fp4quant(
///     MatRef::new(&x, m, h)?,
///     MatMut::new(&mut r, m, h)?,
///     &w,
///     Fp4Out { y_fp4: &mut q, scales: ScaleOut::RowMajor(&mut sf), y_out: None },
///     GlobalScale::Uniform(1.0),
///     &Options::nvfp4(),
/// )?;
/// assert_eq!(r[1], bf16::from_f32(x[1].to_f32() + 0.5)); // residual updated in place
/// # Ok::<(), fp4norm::Error>(())
/// ```
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

/// RMSNorm + FP4 quantisation without a residual (`h = input`) on the CPU.
pub fn rmsnorm_fp4quant<T: Element>(
    input: MatRef<'_, T>,
    weight: &[T],
    out: Fp4Out<'_, T>,
    global_scale: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    run(input, None, weight, out, global_scale, opts)
}

/// One group of consecutive rows and the parts of every output that belong to them.
struct Task<'a, T> {
    first_row: usize,
    rows: usize,
    residual: Option<MatMut<'a, T>>,
    y_out: Option<MatMut<'a, T>>,
    y_fp4: &'a mut [u8],
    row_major: &'a mut [u8],
}

fn run<T: Element>(
    x: MatRef<'_, T>,
    residual: Option<MatMut<'_, T>>,
    w: &[T],
    out: Fp4Out<'_, T>,
    gs: GlobalScale<'_>,
    opts: &Options,
) -> Result<(), Error> {
    let p = validate_host(&x, residual.as_ref(), w, &out, &gs, opts)?;
    run_checked(&p, x, residual, w, out, gs)
}

/// [`run`] after validation: `p` is what [`validate_host`] returned for these arguments.
pub(crate) fn run_checked<T: Element>(
    p: &Problem,
    x: MatRef<'_, T>,
    residual: Option<MatMut<'_, T>>,
    w: &[T],
    out: Fp4Out<'_, T>,
    gs: GlobalScale<'_>,
) -> Result<(), Error> {
    let p = *p;
    if p.m == 0 {
        return Ok(());
    }
    let OutputsPlan {
        y_fp4,
        row_major,
        swizzled,
        y_out,
    } = OutputsPlan::from(out);
    // Rows are quantised in tasks of about 64K elements (enough to amortise scheduling)
    // that write row-major codes; a swizzled layout is filled from them afterwards, tile by
    // tile in parallel, so few rows still use every core. Without a row-major output the
    // codes go to a scratch buffer of M·H/B bytes.
    let rows_per_task = (65536 / p.h).clamp(1, 256);
    let n_tasks = p.m.div_ceil(rows_per_task);
    let nb = p.n_blocks();
    let mut scratch = Vec::new();
    let row_major: &mut [u8] = match row_major {
        Some(r) => r,
        None => {
            scratch.resize(p.row_major_scales_len(), 0u8);
            &mut scratch
        }
    };

    let mut residual_chunks = residual.map(|r| r.into_row_chunks(rows_per_task).into_iter());
    let mut y_out_chunks = y_out.map(|y| y.into_row_chunks(rows_per_task).into_iter());
    let mut fp4_chunks = y_fp4.chunks_mut(rows_per_task * p.h / 2);
    let mut rm_chunks = row_major.chunks_mut(rows_per_task * nb);
    let tasks: Vec<Task<'_, T>> = (0..n_tasks)
        .map(|t| Task {
            first_row: t * rows_per_task,
            rows: rows_per_task.min(p.m - t * rows_per_task),
            residual: residual_chunks.as_mut().and_then(|c| c.next()),
            y_out: y_out_chunks.as_mut().and_then(|c| c.next()),
            y_fp4: fp4_chunks.next().expect("y_fp4 length checked"),
            row_major: rm_chunks.next().expect("row-major length checked"),
        })
        .collect();

    // The path is read here, on the calling thread (a test may have forced one), and
    // handed to the workers.
    let isa = Isa::for_call();
    // The weight widened to f32 once per call, with the weight bias (SPEC.md §8) added.
    let w32: Vec<f32> = w
        .iter()
        .map(|v| crate::fp8::biased_weight(v.to_f32(), p.weight_bias))
        .collect();
    if isa == Isa::Portable {
        let run_task = match p.format.block {
            BlockSize::B16 => {
                process_task::<T, 16>
                    as fn(&Problem, Task<'_, T>, &MatRef<'_, T>, &[f32], &GlobalScale<'_>)
            }
            BlockSize::B32 => process_task::<T, 32>,
        };
        tasks
            .into_par_iter()
            .for_each(|t| run_task(&p, t, &x, &w32, &gs));
    } else {
        tasks
            .into_par_iter()
            .for_each(|t| simd_task(isa, &p, t, &x, &w32, &gs));
    }
    if let Some(sw) = swizzled {
        let tile_bytes = swizzled_col_tiles(nb) * SWIZZLE_TILE_BYTES;
        sw.par_chunks_mut(tile_bytes)
            .enumerate()
            .for_each(|(t, tile)| {
                tile.fill(0); // padding rows and columns
                let first = t * SWIZZLE_ROWS;
                for r in 0..SWIZZLE_ROWS.min(p.m - first) {
                    let codes = &row_major[(first + r) * nb..(first + r + 1) * nb];
                    // Blocks 4k..4k+3 of a row are 4 consecutive bytes of the tile, 512
                    // bytes after those of blocks 4k-4..4k-1 (SPEC.md §3).
                    let at = swizzled_offset(r, 0, nb);
                    for (k, c) in codes.chunks(4).enumerate() {
                        let o = at + k * SWIZZLE_TILE_BYTES;
                        tile[o..o + c.len()].copy_from_slice(c);
                    }
                }
            });
    }
    Ok(())
}

/// One task on a SIMD path (`isa` is supported and not `Portable`).
fn simd_task<T: Element>(
    isa: Isa,
    p: &Problem,
    t: Task<'_, T>,
    x: &MatRef<'_, T>,
    w32: &[f32],
    gs: &GlobalScale<'_>,
) {
    #[cfg(all(target_arch = "x86_64", fp4norm_simd))]
    x86::task(isa, p, t, x, w32, gs);
    #[cfg(not(all(target_arch = "x86_64", fp4norm_simd)))]
    {
        let _ = (p, t, x, w32, gs);
        unreachable!("{isa:?} is never selected on this architecture");
    }
}

fn process_task<T: Element, const B: usize>(
    p: &Problem,
    mut t: Task<'_, T>,
    x: &MatRef<'_, T>,
    w: &[f32],
    gs: &GlobalScale<'_>,
) {
    let (h, nb) = (p.h, p.n_blocks());
    let mut y = vec![0f32; h];
    for i in 0..t.rows {
        let row = t.first_row + i;
        normalize_row::<T, PlainSteps>(
            x.row(row),
            t.residual.as_mut().map(|r| r.row_mut(i)),
            w,
            p.eps,
            &mut y,
            t.y_out.as_mut().map(|o| o.row_mut(i)),
        );
        quantize_row::<B>(
            p.format,
            &y,
            gs.row(row),
            &mut t.y_fp4[i * h / 2..(i + 1) * h / 2],
            &mut t.row_major[i * nb..(i + 1) * nb],
        );
    }
}

/// How a path runs the dtype-bound parts of a row: step 1 (`h`, the residual written
/// back, the sum of squares) and the rounding of `y_out`.
pub(crate) trait RowSteps {
    /// `h = RNdt(x + r)` (written back to `r`; `h = x` without one) as f32 into `y`; the
    /// sum of `h`'s squares and its depth (the most roundings any square went through).
    fn step1<T: Element>(x: &[T], r: Option<&mut [T]>, y: &mut [f32]) -> (f64, usize);
    /// `out = RNdt(y)`.
    fn round_row<T: Element>(y: &[f32], out: &mut [T]);
    /// Whether [`RowSteps::amax_x16`] gathers 16 groups' amaxes in one vector tree (then
    /// groups of 32 take their scales 16 at a time too).
    const AMAX_X16: bool = false;
    /// The amaxes of 16 consecutive groups of `G` elements of `y` (`16·G` long), as `|y|`'s
    /// bits (NaN above every number): group `j`'s in element `j`.
    #[inline(always)]
    fn amax_x16<const G: usize>(y: &[f32]) -> [u32; 16] {
        let mut am = [0u32; 16];
        for (a, g) in am.iter_mut().zip(y.chunks_exact(G)) {
            *a = amax_bits(g);
        }
        am
    }
}

/// The largest `|y|` as its bits: `|y|` as bits orders like the value, and every NaN is
/// above +Inf, so an integer max is the amax with NaN propagating, and it vectorises.
#[inline(always)]
pub(crate) fn amax_bits(y: &[f32]) -> u32 {
    y.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF))
}

/// Plain loops the compiler vectorises (the portable path).
pub(crate) struct PlainSteps;

impl RowSteps for PlainSteps {
    #[inline(always)]
    fn step1<T: Element>(x: &[T], r: Option<&mut [T]>, y: &mut [f32]) -> (f64, usize) {
        match r {
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
        // Sixteen independent f64 accumulators, so that the loop vectorises.
        let mut acc = [0f64; 16];
        let chunks = y.chunks_exact(16);
        let tail = chunks.remainder();
        for c in chunks {
            let c: &[f32; 16] = c.try_into().expect("chunks of 16");
            for k in 0..16 {
                let v = c[k] as f64;
                acc[k] += v * v;
            }
        }
        lanes_sum(acc, tail, y.len())
    }

    #[inline(always)]
    fn round_row<T: Element>(y: &[f32], out: &mut [T]) {
        for (oi, &yi) in out.iter_mut().zip(y) {
            *oi = T::round_from_f32(yi);
        }
    }
}

/// Steps 1–4 of SPEC.md §1 for one row of the FP4 or FP8 ops, with the biased weights `wb`
/// (SPEC.md §8): `y ← (h · rstd) · w'` as f32, for any `H` (FP8 per-token and per-tensor
/// scales allow any).
/// Where the sum of squares cannot decide the f32 rstd of the exact sum (crate::sumsq),
/// the exact sum decides.
#[inline(always)]
pub(crate) fn normalize_row<T: Element, S: RowSteps>(
    x: &[T],
    residual: Option<&mut [T]>,
    wb: &[f32],
    eps: f32,
    y: &mut [f32],
    y_out: Option<&mut [T]>,
) {
    let (ss, depth) = S::step1(x, residual, y);
    let h = y.len();
    let rstd = rstd_if_decided(ss, depth, h, eps)
        .unwrap_or_else(|| rstd_of_sum(exact_sum_of_squares(y.iter().copied()), h, eps));
    for (yi, &wi) in y.iter_mut().zip(wb) {
        *yi = (*yi * rstd) * wi;
    }
    if let Some(o) = y_out {
        S::round_row(y, o);
    }
}

/// The end of a row's sum of squares in `L` f64 lanes (element `L·j + k` in lane `k`), for
/// a row of `h` elements: the tail's squares (fewer than `L`) into lanes 0.., then log2(L)
/// levels of pairwise sums. With each lane's own additions, every square goes through at
/// most ceil(h/L) + log2(L) roundings: the sum and that depth, for `rstd_if_decided`.
#[inline(always)]
fn lanes_sum<const L: usize>(mut l: [f64; L], tail: &[f32], h: usize) -> (f64, usize) {
    for (a, &v) in l.iter_mut().zip(tail) {
        *a += f64::from(v) * f64::from(v);
    }
    let (mut width, mut levels) = (L, 0);
    while width > 1 {
        width /= 2;
        for k in 0..width {
            l[k] += l[k + width];
        }
        levels += 1;
    }
    (l[0], h.div_ceil(L) + levels)
}

/// Steps 5–8 of SPEC.md §1 for one row of `y`: packed codes and one scale code per block.
#[inline(always)]
fn quantize_row<const B: usize>(
    format: Fp4Format,
    y: &[f32],
    gs: f32,
    q: &mut [u8],
    codes: &mut [u8],
) {
    for ((yb, qb), code) in y
        .chunks_exact(B)
        .zip(q.chunks_exact_mut(B / 2))
        .zip(codes.iter_mut())
    {
        // |y| as bits orders like the value, and every NaN is above +Inf: an integer
        // max is the block's amax with NaN propagating, and it vectorises.
        let mut amax_bits = 0u32;
        for v in yb {
            amax_bits = amax_bits.max(v.to_bits() & 0x7FFF_FFFF);
        }
        let (c, inv) = block_scale(format, f32::from_bits(amax_bits), gs);
        *code = c;
        let amax = f32::from_bits(amax_bits);
        if inv.is_finite() && (inv != 0.0 || amax.is_finite()) {
            // No product can be NaN: y is NaN only where amax, hence inv, is; 0 · Inf needs
            // an infinite inv, or inv = 0 (a tiny global scale can round gs / d to 0) with
            // an infinite y. The branch-free encoder applies and vectorises.
            for (j, qj) in qb.iter_mut().enumerate() {
                *qj = e2m1_encode_non_nan(yb[2 * j] * inv)
                    | (e2m1_encode_non_nan(yb[2 * j + 1] * inv) << 4);
            }
        } else {
            for (j, qj) in qb.iter_mut().enumerate() {
                *qj = e2m1_encode(yb[2 * j] * inv) | (e2m1_encode(yb[2 * j + 1] * inv) << 4);
            }
        }
    }
}
