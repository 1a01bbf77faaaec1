//! The fast CPU path of the FP8 ops: rows in parallel (rayon), straight-line loops the
//! compiler vectorises (branch-free FP8 encoders), compiled for AVX-512 and AVX2 besides
//! the baseline and chosen at run time as the FP4 path's (`crate::cpu::isa`,
//! `FP4NORM_CPU_ISA`); on those two, step 1 (the residual add, the sum of squares) and
//! `y_out` are the FP4 rows' lane functions (`crate::cpu::x86`), whose hardware f16
//! conversions the compiler does not find in the portable formulas. Byte-identical to
//! [`super::reference`] on every path (tested per path on random data and edge cases).

use rayon::prelude::*;

use super::reference::{f32_group_scale, ue8m0_group_scale};
use super::{
    biased_weight, validate, Fp8Element, Fp8Options, Fp8Out, Fp8Problem, Fp8ScaleFormat,
    Fp8ScaleLayout, Fp8Scales, Fp8Scaling,
};
use crate::codec::{e4m3_encode_select, e5m2_encode_select};
use crate::cpu::isa::Isa;
use crate::cpu::{amax_bits, normalize_row, PlainSteps, RowSteps};
use crate::layout::{swizzled_col_tiles, swizzled_offset, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES};

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
        (Fp8Scaling::PerTensor(s), _) => rows.run(
            &mut [],
            &PerTensor {
                element,
                inv: 1.0 / s,
            },
        ),
        (
            Fp8Scaling::Dynamic {
                format: Fp8ScaleFormat::F32 { s_min },
                ..
            },
            Fp8Scales::F32(buf),
        ) => dynamic(rows, buf, F32Scales { element, s_min }),
        (
            Fp8Scaling::Dynamic {
                format: Fp8ScaleFormat::UE8M0,
                ..
            },
            Fp8Scales::UE8M0(buf),
        ) => dynamic(rows, buf, Ue8m0Scales { element }),
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
    /// scales (`H/G` of them in `rm`) to `quant`; rows in tasks of about 64K elements.
    fn run<Q: RowQuant>(self, rm: &mut [Q::Scale], quant: &Q) {
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
        let tasks: Vec<Task<'_, T, Q::Scale>> = (0..n_tasks)
            .map(|t| Task {
                first_row: t * rows_per_task,
                rows: rows_per_task.min(m - t * rows_per_task),
                residual: residual_chunks.as_mut().and_then(|c| c.next()),
                y_out: y_out_chunks.as_mut().and_then(|c| c.next()),
                q: q_chunks.next().expect("q length checked"),
                scales: rm_chunks.next().unwrap_or_default(),
            })
            .collect();
        let ctx = RowsCtx {
            x: &self.x,
            wb: self.wb,
            eps: p.options.eps,
            n,
        };
        // The path is read here, on the calling thread (a test may have forced one), and
        // handed to the workers.
        let isa = Isa::for_call();
        tasks
            .into_par_iter()
            .for_each(|t| task_on(isa, t, &ctx, quant));
    }
}

/// What every task of a call reads.
struct RowsCtx<'a, 'p, T> {
    x: &'p MatRef<'a, T>,
    wb: &'p [f32],
    eps: f32,
    /// Scales per row (0 for a per-tensor scale).
    n: usize,
}

/// How one row's `y` becomes its codes and its row-major scales.
trait RowQuant: Sync {
    /// A scale as written: f32, or a UE8M0 code (`u8` also for none).
    type Scale: Copy + Default + Send + Sync;
    fn row<S: RowSteps>(&self, y: &[f32], q: &mut [u8], scales: &mut [Self::Scale]);
}

/// One per-tensor scale: `q_i = FP8(RN32(y_i · inv))`.
struct PerTensor {
    element: Fp8Element,
    inv: f32,
}

impl RowQuant for PerTensor {
    type Scale = u8;
    #[inline(always)]
    fn row<S: RowSteps>(&self, y: &[f32], q: &mut [u8], _: &mut [u8]) {
        encode(self.element, y, self.inv, q);
    }
}

/// A dynamic scale from a group's amax: the scale as written and its inverse.
trait GroupScale: Sync {
    type Scale: Copy + Default + Send + Sync;
    fn element(&self) -> Fp8Element;
    fn scale(&self, amax: f32) -> (Self::Scale, f32);
}

/// f32 scales, floored at `s_min` (SPEC.md §8).
struct F32Scales {
    element: Fp8Element,
    s_min: f32,
}

impl GroupScale for F32Scales {
    type Scale = f32;
    #[inline(always)]
    fn element(&self) -> Fp8Element {
        self.element
    }
    #[inline(always)]
    fn scale(&self, amax: f32) -> (f32, f32) {
        f32_group_scale(self.element, self.s_min, amax)
    }
}

/// UE8M0 scale codes (SPEC.md §8).
struct Ue8m0Scales {
    element: Fp8Element,
}

impl GroupScale for Ue8m0Scales {
    type Scale = u8;
    #[inline(always)]
    fn element(&self) -> Fp8Element {
        self.element
    }
    #[inline(always)]
    fn scale(&self, amax: f32) -> (u8, f32) {
        ue8m0_group_scale(self.element, amax)
    }
}

/// Dynamic scales per group of `g` consecutive elements (`g = H` per token).
struct Groups<G> {
    g: usize,
    scale: G,
}

impl<G: GroupScale> RowQuant for Groups<G> {
    type Scale = G::Scale;
    #[inline(always)]
    fn row<S: RowSteps>(&self, y: &[f32], q: &mut [u8], scales: &mut [G::Scale]) {
        // The group sizes of SPEC.md §8 as constants: a loop of a known 32 elements
        // vectorises whole, where one of a run-time length runs in its scalar remainder.
        // Sixteen groups' scales at once gain for groups of 64 and 128; for 32 only where
        // their amaxes come from one vector tree (`RowSteps::AMAX_X16`), else its 16
        // horizontal reductions cost more than the scales save. Groups of 64 and 128 keep
        // one reduction each (`PlainSteps`): the tree measured no faster there.
        match self.g {
            32 if S::AMAX_X16 => quantize_groups_x16::<G, 32, S>(y, q, scales, &self.scale),
            32 => quantize_groups::<G, 32>(y, q, scales, &self.scale),
            64 => quantize_groups_x16::<G, 64, PlainSteps>(y, q, scales, &self.scale),
            128 => quantize_groups_x16::<G, 128, PlainSteps>(y, q, scales, &self.scale),
            g => quantize_row_group(g, y, q, scales, &self.scale),
        }
    }
}

/// One task's rows on `isa`. The SIMD paths are these same loops compiled for AVX-512 or
/// AVX2 (`#[target_feature]`), which the compiler vectorises wider: the same IEEE
/// operations and integer formulas lane for lane (Rust never contracts a multiply and an
/// add into a fused one), so every path writes the same bytes.
fn task_on<T: Element, Q: RowQuant>(
    isa: Isa,
    t: Task<'_, T, Q::Scale>,
    ctx: &RowsCtx<'_, '_, T>,
    quant: &Q,
) {
    match isa {
        // SAFETY: a path is selected only where `Isa::supported` has seen its features.
        #[cfg(all(target_arch = "x86_64", fp4norm_simd))]
        Isa::Avx512 => unsafe { simd::avx512(t, ctx, quant) },
        #[cfg(all(target_arch = "x86_64", fp4norm_simd))]
        Isa::Avx2 => unsafe { simd::avx2(t, ctx, quant) },
        _ => task_rows::<T, Q, PlainSteps>(t, ctx, quant),
    }
}

/// The x86-64 instances of [`task_rows`].
#[cfg(all(target_arch = "x86_64", fp4norm_simd))]
#[clippy::msrv = "1.89"]
mod simd {
    use super::*;
    use crate::cpu::x86::{avx2, avx512};

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn avx512<T: Element, Q: RowQuant>(
        t: Task<'_, T, Q::Scale>,
        ctx: &RowsCtx<'_, '_, T>,
        quant: &Q,
    ) {
        task_rows::<T, Q, Avx512Steps>(t, ctx, quant)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn avx2<T: Element, Q: RowQuant>(
        t: Task<'_, T, Q::Scale>,
        ctx: &RowsCtx<'_, '_, T>,
        quant: &Q,
    ) {
        task_rows::<T, Q, Avx2Steps>(t, ctx, quant)
    }

    /// Step 1 and `y_out` by the FP4 rows' AVX-512 lane functions (hardware f16
    /// conversions, f64 squares in vector lanes).
    struct Avx512Steps;

    impl RowSteps for Avx512Steps {
        #[inline(always)]
        fn step1<T: Element>(x: &[T], r: Option<&mut [T]>, y: &mut [f32]) -> (f64, usize) {
            // SAFETY: used only by `avx512`, entered where its features are supported.
            unsafe { avx512::fp8_step1(x, r, y) }
        }
        #[inline(always)]
        fn round_row<T: Element>(y: &[f32], out: &mut [T]) {
            // SAFETY: as step1.
            unsafe { avx512::fp8_round_row(y, out) }
        }
        const AMAX_X16: bool = true;
        #[inline(always)]
        fn amax_x16<const G: usize>(y: &[f32]) -> [u32; 16] {
            // SAFETY: as step1.
            unsafe { avx512::fp8_amax_x16::<G>(y) }
        }
    }

    /// The same by the FP4 rows' AVX2 lane functions.
    struct Avx2Steps;

    impl RowSteps for Avx2Steps {
        #[inline(always)]
        fn step1<T: Element>(x: &[T], r: Option<&mut [T]>, y: &mut [f32]) -> (f64, usize) {
            // SAFETY: used only by `avx2`, entered where its features are supported.
            unsafe { avx2::fp8_step1(x, r, y) }
        }
        #[inline(always)]
        fn round_row<T: Element>(y: &[f32], out: &mut [T]) {
            // SAFETY: as step1.
            unsafe { avx2::fp8_round_row(y, out) }
        }
    }
}

/// Every row of one task: steps 1–4 (their dtype-bound parts by `S`), then `quant`.
#[inline(always)]
fn task_rows<T: Element, Q: RowQuant, S: RowSteps>(
    mut t: Task<'_, T, Q::Scale>,
    ctx: &RowsCtx<'_, '_, T>,
    quant: &Q,
) {
    let (h, n) = (ctx.wb.len(), ctx.n);
    let mut y = vec![0f32; h];
    for i in 0..t.rows {
        normalize_row::<T, S>(
            ctx.x.row(t.first_row + i),
            t.residual.as_mut().map(|r| r.row_mut(i)),
            ctx.wb,
            ctx.eps,
            &mut y,
            t.y_out.as_mut().map(|o| o.row_mut(i)),
        );
        let scales = if n == 0 {
            &mut [][..]
        } else {
            &mut t.scales[i * n..(i + 1) * n]
        };
        quant.row::<S>(&y, &mut t.q[i * h..(i + 1) * h], scales);
    }
}

/// Dynamic group scales (`G::Scale`: f32 or UE8M0 codes): rows write row-major scales
/// (into `buf` itself for the row-major layout, else into scratch), and the column-major or
/// swizzled layout is filled from them afterwards, in parallel, padding zeroed.
fn dynamic<T: Element, G: GroupScale>(rows: Rows<'_, '_, T>, buf: &mut [G::Scale], scale: G) {
    let p = *rows.p;
    let (m, n) = (p.m, p.n_groups());
    let g = p.group().expect("dynamic scaling");
    let layout = p.layout().expect("dynamic scaling");
    let mut scratch = Vec::new();
    let (rm, target): (&mut [G::Scale], Option<&mut [G::Scale]>) = match layout {
        Fp8ScaleLayout::RowMajor => (buf, None),
        _ => {
            scratch.resize(m * n, G::Scale::default());
            (&mut scratch[..], Some(buf))
        }
    };
    rows.run(rm, &Groups { g, scale });
    let rm: &[G::Scale] = rm;
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
                    col[m..].fill(G::Scale::default()); // padding rows M..Mp4
                });
        }
        (Fp8ScaleLayout::ColumnMajorPacked, Some(t)) => {
            // A column of words holds groups 4j..4j + 3 of every row: 4 · Mp4 codes.
            let mp4 = p.scale_rows();
            let columns_per_task = 1024usize.div_ceil(mp4.max(1));
            t.par_chunks_mut(4 * mp4)
                .enumerate()
                .with_min_len(columns_per_task)
                .for_each(|(j, col)| {
                    col.fill(G::Scale::default()); // padding rows and groups past H/G
                    for (row, word) in col.chunks_mut(4).take(m).enumerate() {
                        for (b, c) in word.iter_mut().enumerate() {
                            if 4 * j + b < n {
                                *c = rm[row * n + 4 * j + b];
                            }
                        }
                    }
                });
        }
        (Fp8ScaleLayout::Swizzled, Some(t)) => {
            let tile_bytes = swizzled_col_tiles(n) * SWIZZLE_TILE_BYTES;
            t.par_chunks_mut(tile_bytes)
                .enumerate()
                .for_each(|(ti, tile)| {
                    tile.fill(G::Scale::default()); // padding rows and columns
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

/// One row of `y` in groups of `G`, sixteen groups at a time: their amaxes (`R`'s
/// [`RowSteps::amax_x16`]; a last chunk of fewer groups one by one), then their scales and
/// inverses (one loop over sixteen lanes, which vectorises), then their codes.
#[inline(always)]
fn quantize_groups_x16<S: GroupScale, const G: usize, R: RowSteps>(
    y: &[f32],
    q: &mut [u8],
    scales: &mut [S::Scale],
    scale: &S,
) {
    for ((yc, qc), sc) in y
        .chunks(16 * G)
        .zip(q.chunks_mut(16 * G))
        .zip(scales.chunks_mut(16))
    {
        let mut am = [0f32; 16];
        if yc.len() == 16 * G {
            for (a, bits) in am.iter_mut().zip(R::amax_x16::<G>(yc)) {
                *a = f32::from_bits(bits);
            }
        } else {
            for (a, yg) in am.iter_mut().zip(yc.chunks_exact(G)) {
                *a = amax(yg);
            }
        }
        let mut inv = [0f32; 16];
        let mut sv = [S::Scale::default(); 16];
        for k in 0..16 {
            (sv[k], inv[k]) = scale.scale(am[k]);
        }
        sc.copy_from_slice(&sv[..sc.len()]);
        for ((yg, qg), &i) in yc.chunks_exact(G).zip(qc.chunks_exact_mut(G)).zip(&inv) {
            let yg: &[f32; G] = yg.try_into().expect("chunks of G");
            let qg: &mut [u8; G] = qg.try_into().expect("chunks of G");
            encode(scale.element(), yg, i, qg);
        }
    }
}

/// One row of `y` in groups of `G`, one group after another: amax, scale, codes.
#[inline(always)]
fn quantize_groups<S: GroupScale, const G: usize>(
    y: &[f32],
    q: &mut [u8],
    scales: &mut [S::Scale],
    scale: &S,
) {
    for ((yg, qg), s) in y
        .chunks_exact(G)
        .zip(q.chunks_exact_mut(G))
        .zip(scales.iter_mut())
    {
        let yg: &[f32; G] = yg.try_into().expect("chunks of G");
        let qg: &mut [u8; G] = qg.try_into().expect("chunks of G");
        let (sv, inv) = scale.scale(amax(yg));
        *s = sv;
        encode(scale.element(), yg, inv, qg);
    }
}

/// A row of `y` as one group of any length (per-token scales: `g = H`).
#[inline(always)]
fn quantize_row_group<S: GroupScale>(
    g: usize,
    y: &[f32],
    q: &mut [u8],
    scales: &mut [S::Scale],
    scale: &S,
) {
    for ((yg, qg), s) in y
        .chunks_exact(g)
        .zip(q.chunks_exact_mut(g))
        .zip(scales.iter_mut())
    {
        let (sv, inv) = scale.scale(amax(yg));
        *s = sv;
        encode(scale.element(), yg, inv, qg);
    }
}

/// The largest `|y|`, NaN propagating ([`amax_bits`]).
#[inline(always)]
fn amax(y: &[f32]) -> f32 {
    f32::from_bits(amax_bits(y))
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
