//! What a fused call launches, by its size: the launch shape (the table of many-row
//! cluster splits and the rules around it), the form of the swizzled write, and the L2
//! prefetch distance. None of it changes the bytes a call writes, only its speed; every
//! rule was measured on the H200, and the figures behind each are in BENCHMARKS.md.

use super::config::{Fp8KernelScaling, KernelConfig, KernelKind};
use crate::cuda::{knobs, DeviceLimits};
use crate::DType;

/// One row of [`MANY_ROWS`]: calls of rows of `h` elements (of `dtype`, or any dtype)
/// with more than `above` and at most `up_to` rows per SM take `ctas` CTAs per row holding
/// `vectors` vectors per thread.
struct Split {
    h: usize,
    dtype: Option<DType>,
    above: usize,
    up_to: usize,
    ctas: usize,
    vectors: usize,
}

const fn split(
    h: usize,
    dtype: Option<DType>,
    above: usize,
    up_to: usize,
    ctas: usize,
    vectors: usize,
) -> Split {
    Split {
        h,
        dtype,
        above,
        up_to,
        ctas,
        vectors,
    }
}

const ANY: Option<DType> = None;
const F16: Option<DType> = Some(DType::F16);
const BF16: Option<DType> = Some(DType::BF16);
const ALL: usize = usize::MAX;

/// The launch table of many rows (more than the SMs) on GPUs with thread-block clusters:
/// the first row that matches a call gives its CTAs per row (one cluster) and vectors per
/// thread, as long as each CTA then owns whole groups of four scale blocks; a call that no
/// row matches keeps the default shape of [`launch_shape`]. Splitting a row shortens the
/// last wave of a call and keeps long rows in registers, which the L2 prefetch needs.
#[rustfmt::skip]
const MANY_ROWS: &[Split] = &[
    //    H      dtype rows/SM   CTAs vectors
    split(8192,  ANY,  1,  ALL,  2,   2), // two CTAs of 256 beat one CTA at every row count
    split(5120,  ANY,  1,  64,   2,   2), // two CTAs of 160 beat one of 160 holding four
    split(5120,  ANY,  64, ALL,  1,   2), // then one CTA of 320: fewer registers than 160 x 4
    split(7168,  ANY,  16, 64,   2,   2), // two CTAs of 224 win only from 16 to 64 rows/SM
    split(32768, F16,  16, ALL,  2,   4), // f16: two CTAs of 512 beat eight of 256 from 16
    split(16384, F16,  32, ALL,  1,   4), // f16: one CTA of 512 beats four of 256 from 32
    split(16384, ANY,  1,  64,   4,   2), // four CTAs of 256 beat one of 512
    split(32768, ANY,  1,  64,   8,   2), // eight CTAs of 256 hold the row; one of 512 re-reads
    split(32768, ANY,  64, ALL,  2,   4), // then two CTAs of 512: still held, fewer CTAs
];

/// The FP8 calls' own rows, consulted before [`MANY_ROWS`] (same columns).
#[rustfmt::skip]
const FP8_MANY_ROWS: &[Split] = &[
    //    H      dtype rows/SM   CTAs vectors
    split(8192,  ANY,  16, ALL,  1,   2), // one CTA of 512 beats two of 256: no cluster exchange
    split(16384, BF16, 64, ALL,  4,   2), // bf16: four CTAs of 256 beyond 64 too; one of 512 lost
];

/// Threads per row, rows per CTA and CTAs per row for `m` rows of `h` elements in blocks
/// of `block`, on a device with the `limits` given (its SM count, its largest cluster and
/// CTA). Each thread handles 8-element (16-byte) vectors.
///
/// * Many rows (more than SMs) are throughput-bound: two vectors per thread up to H = 4096,
///   four up to H = 16384, one row per CTA (short rows share a CTA, so that CTAs stay at
///   least 128 threads wide) and every row held in registers; longer rows take one CTA of
///   512 threads that re-reads its row from L2 in its second pass. With clusters, the
///   `MANY_ROWS` table splits rows over CTAs where that measured faster.
/// * Few rows (at most the SMs) are latency-bound: each row is spread over up to `SMs / M`
///   CTAs (at most a cluster's, 8, each on its own SM) with one vector per thread, so that
///   the rows together cover the SMs; fewer CTAs where that gives CTAs of whole warps
///   (down to half as many). Beyond 512 threads per CTA a thread takes more vectors,
///   except that a whole row of 2048 vectors or more in one CTA takes 1024 threads.
/// * A device's smaller CTAs or clusters cap the shape: more vectors per thread, fewer
///   CTAs per row.
pub fn launch_shape(
    h: usize,
    block: usize,
    m: usize,
    dtype: DType,
    limits: &DeviceLimits,
) -> (u32, u32, u32) {
    shape_from(&[MANY_ROWS], h, block, m, dtype, limits)
}

/// [`launch_shape`] of an FP8 call: the rows of `FP8_MANY_ROWS` first, then the same table.
pub fn fp8_launch_shape(
    h: usize,
    block: usize,
    m: usize,
    dtype: DType,
    limits: &DeviceLimits,
) -> (u32, u32, u32) {
    shape_from(&[FP8_MANY_ROWS, MANY_ROWS], h, block, m, dtype, limits)
}

fn shape_from(
    tables: &[&[Split]],
    h: usize,
    block: usize,
    m: usize,
    dtype: DType,
    limits: &DeviceLimits,
) -> (u32, u32, u32) {
    // (8-element vectors; the last partial where H is not a multiple of 8: FP8 rows.)
    let nv = h.div_ceil(8).max(1);
    let vpb = (block / 8).max(1);
    let sms = limits.sm_count.max(1) as usize;
    let clusters = limits.clusters();
    let max_cluster = limits.max_cluster.clamp(1, 8) as usize;
    // The kernel's CTAs are whole warps, 32 to 1024 threads.
    let max_threads = (limits.max_threads_per_block.clamp(32, 1024) / 32 * 32) as usize;
    let latency = m <= sms;
    // Each CTA must own whole groups of four scale blocks (one 32-bit swizzled store).
    let fits = |c: usize| nv % c == 0 && (nv / c) % (4 * vpb) == 0;
    let (mut c, mut vectors_per_thread) = if latency {
        ((sms / m.max(1)).clamp(1, max_cluster), 1)
    } else if nv <= 512 {
        (1, 2)
    } else if nv <= 2048 {
        (1, 4)
    } else {
        (1, nv.div_ceil(512))
    };
    if clusters && !latency {
        let rows_per_sm_in = |above: usize, up_to: usize| {
            m > above.saturating_mul(sms) && m <= up_to.saturating_mul(sms)
        };
        let row = tables.iter().flat_map(|t| t.iter()).find(|s| {
            nv == s.h / 8 && s.dtype.is_none_or(|d| d == dtype) && rows_per_sm_in(s.above, s.up_to)
        });
        if let Some(s) = row {
            if s.ctas == 1 || (s.ctas <= max_cluster && fits(s.ctas)) {
                (c, vectors_per_thread) = (s.ctas, s.vectors);
            }
        }
    }
    if !clusters {
        c = 1;
    }
    while c > 1 && !fits(c) {
        c -= 1;
    }
    if latency {
        // Fewer CTAs of whole warps beat more CTAs with a ragged last warp, down to half
        // the CTAs (not measured further).
        if let Some(whole) = (1..=c)
            .rev()
            .find(|&k| 2 * k >= c && fits(k) && (nv / k) % 32 == 0)
        {
            c = whole;
        }
    }
    let nvc = nv / c;
    if latency {
        let most = if c == 1 && nvc >= 2048 { 1024 } else { 512 };
        vectors_per_thread = nvc.div_ceil(most.min(max_threads));
    }
    // A device's smaller CTAs: more vectors per thread.
    vectors_per_thread = vectors_per_thread.max(nvc.div_ceil(max_threads));
    let g = (nvc.div_ceil(vectors_per_thread).div_ceil(32).clamp(1, 32) * 32) as u32;
    let r = if c > 1 { 1 } else { (128 / g).max(1) };
    (g, r, c as u32)
}

/// Whether the kernel supports launch shape `(g, r, c)` for rows of `h` elements in
/// blocks of `block` on a device with `limits`: whole warps, at most 1024 threads (and the
/// device's CTA), a cluster of at most 8 CTAs (and the device's) that each own whole
/// groups of four scale blocks, one row per clustered CTA, and the kernel's launch bound
/// satisfiable (its minimum of resident CTAs fits the SM's threads).
pub fn shape_fits(h: usize, block: usize, shape: (u32, u32, u32), limits: &DeviceLimits) -> bool {
    let (g, r, c) = (shape.0 as usize, shape.1 as usize, shape.2 as usize);
    let nv = h.div_ceil(8);
    let vpb = (block / 8).max(1);
    let threads = g * r;
    g >= 32
        && g % 32 == 0
        && r >= 1
        && threads <= 1024
        && threads <= limits.max_threads_per_block as usize
        && threads * KernelConfig::min_ctas_for(threads as u32, true) as usize
            <= limits.max_threads_per_sm as usize
        && (1..=8).contains(&c)
        && c <= limits.max_cluster as usize
        && (c == 1 || (r == 1 && nv % c == 0 && (nv / c) % (4 * vpb) == 0))
}

/// Whether a call writes its swizzled scales in two kernels (the fused kernel staging
/// codes with coalesced stores kept in L2, then the swizzle pass; `FP4_SWZ_SPLIT` in the
/// kernel source): never by default. Its staged codes stay in L2 until the whole call is
/// done, a third of the L2 at 16 MiB of scales, which the L2 prefetch needs: the direct
/// write with its words handed back to L2 once their tile is complete
/// ([`swizzle_demote_tiles`]) is faster at every size measured. The knob
/// `FP4NORM_SWIZZLE_SPLIT=1` (on GPUs with programmatic dependent launch) still selects it.
pub fn swizzle_split_wanted(pdl_capable: bool) -> bool {
    pdl_capable && knobs::swizzle_split().unwrap_or(false)
}

/// Whether the direct swizzled write of a call of `m` rows of `h` stores its 4-byte words
/// with an L2 evict-last policy (`FP4_SWZ_KEEP` in the kernel source): from 2^24 elements.
/// The 128 x 4 layout fills each 32-byte sector from eight rows (four row quarters of a
/// 128-row tile, two rows each), so plain stores leave it part-filled in L2 while a large
/// call streams through; a smaller call's bytes mostly stay in L2 anyway, and there the
/// policy costs more than it saves. The knob `FP4NORM_SWIZZLE_KEEP` overrides the rule.
pub fn swizzle_keep_wanted(m: usize, h: usize) -> bool {
    knobs::swizzle_keep().unwrap_or(m.saturating_mul(h) >= 1 << 24)
}

/// How many 128-row tiles behind its own row a CTA of a direct swizzled write with kept
/// words ([`swizzle_keep_wanted`]) hands a share of the kept words back to L2's normal
/// eviction (`FP4_SWZ_DEMOTE_TILES`; 0: never): one resident wave of rows, in tiles, plus
/// two ([`demote_distance`]), so that the tile is complete (every sector full) when its
/// lines are demoted. Only where the call's scales take an eighth of the L2 or more:
/// evict-last lines otherwise stay for the rest of the call, and beyond, crowding out the
/// L2 prefetch (16 MiB at 16384 x 16384 NVFP4); smaller, they cost the prefetch little and,
/// left in L2, take the next call's rewrite of the same buffer without a trip to DRAM. The
/// knob `FP4NORM_SWIZZLE_DEMOTE=0|1` turns it off, or on wherever words are kept.
pub fn swizzle_demote_tiles(cfg: &KernelConfig, m: usize, limits: &DeviceLimits) -> u32 {
    if !cfg.swizzle_keep || cfg.kind != KernelKind::Fused {
        return 0;
    }
    let scale_bytes = m as u64 * (cfg.h / cfg.block.max(1)) as u64;
    if !knobs::swizzle_demote().unwrap_or(scale_bytes * 8 >= limits.l2_bytes) {
        return 0;
    }
    demote_distance(cfg, limits)
}

/// One resident wave of `cfg`'s rows on a device with `limits`, in 128-row tiles, plus two:
/// the distance of [`swizzle_demote_tiles`].
pub fn demote_distance(cfg: &KernelConfig, limits: &DeviceLimits) -> u32 {
    let wave = resident_wave_rows(cfg, limits);
    u32::try_from(wave.div_ceil(128) + 2).unwrap_or(u32::MAX)
}

/// Whether an FP8 call of `m` rows, whose fused kernel writes its column-major group scales
/// itself, writes each as one reduction (`FP8_COL_RED` in the kernel source): adding (new -
/// old) to the bytes it loaded at its start. With f32 scales in groups of 32 or 64
/// (`f32_small_groups`), from 16 rows up to one row per SM: there the eight rows that
/// share a 32-byte sector run at once on different SMs and their partial stores wait on
/// each other in L2, which merges reductions instead. With fewer rows a sector has fewer
/// writers and the extra load costs what it saves; with many rows (a row's CTA a wave
/// after its neighbours') the reductions cost more than the stores; groups of 128 (fewer
/// scales a row) and UE8M0 codes (four rows to a 32-bit word) measured even or slower at
/// 16 rows of 8192. The knob `FP4NORM_FP8_SCALES_REDUCE` overrides the rule.
pub fn column_scales_reduce_wanted(
    m: usize,
    f32_small_groups: bool,
    limits: &DeviceLimits,
) -> bool {
    knobs::fp8_scales_reduce()
        .unwrap_or(f32_small_groups && m >= 16 && m <= limits.sm_count.max(1) as usize)
}

/// Whether an FP8 call's column-major group scales (`scale_bytes` of them, padding
/// included) are stored with an L2 evict-last policy (`FP8_COL_KEEP` in the kernel
/// source): up to a quarter of the L2, and at any size where the fused kernel writes them
/// itself (`split` false), since from an eighth of the L2 it hands them back to normal
/// eviction a wave behind ([`column_scales_demote_rows`]). A 32-byte sector of that layout
/// holds one group of eight consecutive rows, each row's scale a store of its own from
/// another CTA, so plain stores leave sectors part-filled in L2 while the call's rows
/// stream through it, as the swizzled FP4 write does ([`swizzle_keep_wanted`]); kept, they
/// fill first. Kept to the end of the call (the split write's staged scales, or with the
/// demotion turned off), more than a quarter of the L2 crowds out the L2 prefetch instead.
/// The knob `FP4NORM_FP8_SCALES_KEEP` overrides the rule.
pub fn column_scales_keep_wanted(scale_bytes: u64, split: bool, limits: &DeviceLimits) -> bool {
    knobs::fp8_scales_keep().unwrap_or(
        scale_bytes.saturating_mul(4) <= limits.l2_bytes
            || (!split && column_scales_demoted(scale_bytes, limits)),
    )
}

/// Whether kept column-major scales of `scale_bytes` are handed back to normal eviction
/// behind the rows: from an eighth of the L2 (the knob `FP4NORM_FP8_SCALES_DEMOTE=0|1`
/// overrides the size).
fn column_scales_demoted(scale_bytes: u64, limits: &DeviceLimits) -> bool {
    knobs::fp8_scales_demote().unwrap_or(scale_bytes.saturating_mul(8) >= limits.l2_bytes)
}

/// How many rows behind its own row a CTA of an FP8 call with kept column-major scales
/// ([`column_scales_keep_wanted`]) hands the kept scales' lines back to L2's normal eviction
/// (`FP8_COL_DEMOTE_ROWS`; 0: never): one resident wave of rows plus two 128-byte lines of
/// rows (32 rows of f32 scales or packed words, 128 of UE8M0 codes), by when every line
/// there is complete.
/// Only where the scales take an eighth of the L2 or more, as [`swizzle_demote_tiles`] and
/// for the same reason: evict-last lines otherwise stay for the rest of the call, and
/// beyond, crowding out the L2 prefetch. Decided whether or not the write is split, since
/// the split can be turned off later (no PDL, the all-reduce); only the direct write
/// demotes (`KernelConfig::defines`). The knob `FP4NORM_FP8_SCALES_DEMOTE=0|1` turns it
/// off, or on wherever the direct write keeps scales.
pub fn column_scales_demote_rows(
    cfg: &KernelConfig,
    scale_bytes: u64,
    limits: &DeviceLimits,
) -> u32 {
    let Some(f) = cfg.fp8 else { return 0 };
    if !f.keep_scales || cfg.kind != KernelKind::Fused {
        return 0;
    }
    if !column_scales_demoted(scale_bytes, limits) {
        return 0;
    }
    column_demote_distance(cfg, limits)
}

/// One resident wave of `cfg`'s rows on a device with `limits` plus two 128-byte lines of
/// its column-major scales in rows: the distance of [`column_scales_demote_rows`].
pub fn column_demote_distance(cfg: &KernelConfig, limits: &DeviceLimits) -> u32 {
    // 4-byte elements (f32 scales, packed words of four UE8M0 codes) or UE8M0 bytes.
    let words = cfg
        .fp8
        .is_some_and(|f| f.scaling == Fp8KernelScaling::F32 || f.packed);
    let line_rows = if words { 32 } else { 128 };
    let wave = resident_wave_rows(cfg, limits);
    u32::try_from(wave + 2 * line_rows).unwrap_or(u32::MAX)
}

/// Whether an FP8 call's column-major f32 group scales are written in two kernels
/// (`FP8_COL_SPLIT`): the fused kernel stores each row's scales of a warp's groups
/// (`32 / (G / 8)` of them) as one coalesced run into its 8-row tile, in a staging order,
/// and `fp8_column_scales` then reorders every tile in place. The direct write is one
/// 4-byte store per scale, each to a sector of its own (eight rows fill a sector), and
/// those L2 requests, not the layout's bytes, are what it costs at many rows
/// (docs/fp8-misses.md). Wanted for groups of 32 and 64 from 2^25 elements: the second
/// kernel costs about a microsecond, which below that the fewer requests do not make up
/// for; groups of 128 store a quarter as many scales as groups of 32 and gain nothing. Needs
/// whole tiles (H / G a multiple of the tile's groups, at least 8 rows; the last rows of
/// an M not a multiple of 8 are written directly). Only on GPUs whose DRAM streams at
/// least [`SPLIT_MIN_DRAM_BYTES_PER_S`] (or does not say how fast): on slower DRAM the
/// requests hide behind the rows' bytes and the direct write is the faster. The knob
/// `FP4NORM_FP8_SCALES_SPLIT` overrides the size, group and bandwidth rule (not the
/// layout's needs); the host splits only on GPUs with programmatic dependent launch.
pub fn column_scales_split_wanted(p: &crate::fp8::Fp8Problem, limits: &DeviceLimits) -> bool {
    use crate::fp8::{Fp8Group, Fp8ScaleFormat, Fp8ScaleLayout, Fp8Scaling};
    let Fp8Scaling::Dynamic {
        group,
        format: Fp8ScaleFormat::F32 { .. },
        layout: Fp8ScaleLayout::ColumnMajor,
    } = p.options.scaling
    else {
        return false;
    };
    let g = group.size(p.h);
    // A tile's groups are a warp's: 32 lanes of 8 elements.
    let possible = group != Fp8Group::PerToken && p.h % 256 == 0 && p.m >= 8;
    let fast_dram =
        limits.dram_bytes_per_s == 0 || limits.dram_bytes_per_s >= SPLIT_MIN_DRAM_BYTES_PER_S;
    possible
        && knobs::fp8_scales_split()
            .unwrap_or(fast_dram && g <= 64 && p.m.saturating_mul(p.h) >= 1 << 25)
}

/// The DRAM bandwidth from which the split column-major write pays
/// ([`column_scales_split_wanted`]): between the H100's 3.35 TB/s, where the direct write
/// with the current launch shapes is the faster at every size the split would take, and
/// the H200's 4.8 TB/s, where the split was measured the faster (docs/fp8-kernels.md).
pub const SPLIT_MIN_DRAM_BYTES_PER_S: u64 = 4_000_000_000_000;

/// Whether the zero scales of the swizzled layout's padding rows (the last 128-row tile's
/// rows past M, in a direct write) are written by every thread of the call's rows in
/// coalesced 16-byte pieces (`FP4_PAD_SPREAD`), rather than by CTAs of their own, which at
/// decode sizes are most of the grid (127 rows' CTAs, or clusters, for one row). FP8
/// column-major scales keep their padding rows' CTAs (at most three rows; there the spread
/// measured slower, docs/swizzled-scales.md). The knob
/// `FP4NORM_PAD_SPREAD=0` gives the swizzled padding rows their CTAs back. The bytes are
/// the same.
pub fn pad_spread_wanted() -> bool {
    knobs::pad_spread().unwrap_or(true)
}

/// Whether the spread padding (`pad_spread_wanted`) of a call of `m` rows is zeroed by CTAs
/// added after the rows' (`FP4_PAD_CTAS`: on SMs the rows leave idle, off the rows'
/// critical path) rather than by the rows' threads after their row: with few rows (at
/// most one per SM), where the rows leave SMs idle and the padding is most of the tile
/// (docs/swizzled-scales.md); with more, the rows' shapes hold long rows in registers that
/// the extra branch would spill. The knob `FP4NORM_PAD_CTAS=0` keeps the padding on the
/// rows' threads.
pub fn pad_ctas_wanted(m: usize, limits: &DeviceLimits) -> bool {
    m <= limits.sm_count as usize && knobs::pad_ctas().unwrap_or(true)
}

/// The padding CTAs a call of `m` rows adds (`FP4_PAD_CTAS`): enough for four 16-byte
/// pieces of the last tile per thread, whole clusters (no row's cluster holds one); none
/// where the last tile has no padding.
pub fn pad_cta_count(cfg: &KernelConfig, m: usize) -> usize {
    if !cfg.pad_ctas || m % 128 == 0 {
        return 0;
    }
    let nk4 = (cfg.h / cfg.block).div_ceil(4) * 4;
    let pieces = nk4 / 4 * 32;
    let ctas = pieces.div_ceil(cfg.block_threads() as usize * 4);
    let c = cfg.cluster.max(1) as usize;
    ctas.div_ceil(c) * c
}

/// Resident CTAs per SM of an aligned fused kernel: the minimum its launch bound asks for
/// ([`KernelConfig::min_ctas_per_sm`]), or, for CTA sizes it does not bound, what 64
/// registers per thread allow.
fn resident_ctas_per_sm(cfg: &KernelConfig) -> u32 {
    match cfg.min_ctas_per_sm() {
        1 => (65536 / (64 * cfg.block_threads().max(1))).max(1),
        bound => bound,
    }
}

/// The rows one resident wave of `cfg`'s CTAs holds on a device with `limits`: what the L2
/// prefetch looks ahead by and the demotions look behind by.
fn resident_wave_rows(cfg: &KernelConfig, limits: &DeviceLimits) -> u64 {
    limits.sm_count as u64 * resident_ctas_per_sm(cfg) as u64 * cfg.rows_per_cta as u64
        / cfg.cluster.max(1) as u64
}

/// How many rows ahead each row's CTA prefetches x and r into L2 (the kernel's `pf_rows`;
/// 0: none): at most one resident wave of rows, and at most the budget
/// ([`l2_prefetch_budget_mib`]) of x and r in flight ahead. Only the 16-byte vector kernels
/// of two or more vectors per thread prefetch (the one-vector kernels are the latency
/// shapes, M up to the SM count). The knobs `FP4NORM_L2_PREFETCH_ROWS` (the distance) and
/// `FP4NORM_L2_PREFETCH_MIB` (the budget) override the rule.
pub fn l2_prefetch_rows(cfg: &KernelConfig, m: usize, h: usize, limits: &DeviceLimits) -> u32 {
    if !cfg.aligned || cfg.kind != KernelKind::Fused {
        return 0;
    }
    if let Some(rows) = knobs::l2_prefetch_rows() {
        return rows;
    }
    let budget_mib = knobs::l2_prefetch_mib()
        .unwrap_or_else(|| l2_prefetch_budget_mib(m, h, cfg.holds_rows_in_registers()));
    let wave = resident_wave_rows(cfg, limits);
    let row_bytes = (h as u64 * 2) * if cfg.residual { 2 } else { 1 };
    // Rows ahead stay within half the L2, so that they are still there when read.
    let budget = (budget_mib << 20).min(limits.l2_bytes / 2);
    let rows = wave.min(budget / row_bytes.max(1));
    u32::try_from(rows).unwrap_or(u32::MAX)
}

/// The default L2 prefetch budget of a call of `m` rows of `h` elements whose kernel holds
/// its rows in registers (`held`), in MiB (0: none; `u64::MAX >> 20`: one resident wave):
/// one wave ahead from 2^25 elements where rows are held, none otherwise. Where the second
/// pass re-reads its row from L2, the prefetched rows evict it; below 2^25 elements a call
/// mostly stays in L2 anyway, and the prefetch gains in some shapes what it loses in others.
fn l2_prefetch_budget_mib(m: usize, h: usize, held: bool) -> u64 {
    if held && m.saturating_mul(h) >= 1 << 25 {
        u64::MAX >> 20
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::bf16_nvfp4_problem;
    use super::super::config::GsMode;
    use super::*;

    const H200: DeviceLimits = DeviceLimits::H200;
    const NO_CLUSTERS: DeviceLimits = DeviceLimits {
        max_cluster: 1,
        ..DeviceLimits::H200
    };

    #[test]
    fn swizzled_writes_are_direct_unless_the_knob_splits_them() {
        if std::env::var_os("FP4NORM_SWIZZLE_SPLIT").is_some() {
            return; // the knob overrides the rule
        }
        assert!(!swizzle_split_wanted(true));
        assert!(!swizzle_split_wanted(false));
    }

    #[test]
    fn kept_words_are_demoted_a_wave_and_two_tiles_behind() {
        if std::env::var_os("FP4NORM_SWIZZLE_DEMOTE").is_some()
            || std::env::var_os("FP4NORM_SWIZZLE_KEEP").is_some()
            || std::env::var_os("FP4NORM_SWIZZLE_SPLIT").is_some()
        {
            return; // knobs override the rule
        }
        let opts = crate::Options::nvfp4();
        let cfg = |m: usize, h: usize, layout: crate::ScaleLayout| {
            let p = crate::Problem::new(m, h, crate::DType::BF16, layout, &opts).expect("valid");
            KernelConfig::fused(&p, GsMode::Uniform, true, false, &H200)
        };
        // 16384 x 16384: one CTA of 512 per row, two per SM: 264 rows a wave, 3 tiles + 2.
        let c = cfg(16384, 16384, crate::ScaleLayout::Swizzled);
        assert!(c.swizzle_keep && !c.swizzle_split);
        assert_eq!(c.swizzle_demote_tiles, 5, "{}", c.describe());
        // Both layouts keep and demote too; row-major and small calls (no kept words) never.
        assert!(cfg(16384, 16384, crate::ScaleLayout::Both).swizzle_demote_tiles > 0);
        assert_eq!(
            cfg(16384, 16384, crate::ScaleLayout::RowMajor).swizzle_demote_tiles,
            0
        );
        assert_eq!(
            cfg(1024, 4096, crate::ScaleLayout::Swizzled).swizzle_demote_tiles,
            0
        );
        // Kept words, but 4 MiB of scales, under an eighth of the H200's L2: left kept.
        assert!(cfg(16384, 4096, crate::ScaleLayout::Swizzled).swizzle_keep);
        assert_eq!(
            cfg(16384, 4096, crate::ScaleLayout::Swizzled).swizzle_demote_tiles,
            0
        );
        assert_eq!(
            cfg(8192, 8192, crate::ScaleLayout::Swizzled).swizzle_demote_tiles,
            0
        );
        // Never closer than a resident wave of rows.
        for (m, h) in [(16384, 8192), (8192, 16384), (4096, 32768), (16384, 32768)] {
            let c = cfg(m, h, crate::ScaleLayout::Swizzled);
            let wave =
                H200.sm_count as u64 * resident_ctas_per_sm(&c) as u64 * c.rows_per_cta as u64
                    / c.cluster as u64;
            assert!(
                u64::from(c.swizzle_demote_tiles) * 128 >= wave + 256,
                "{}",
                c.describe()
            );
        }
    }

    #[test]
    fn swizzled_words_kept_in_l2_from_2_to_the_24_elements() {
        if std::env::var_os("FP4NORM_SWIZZLE_KEEP").is_some() {
            return; // the knob overrides the rule
        }
        assert!(swizzle_keep_wanted(4096, 4096));
        assert!(swizzle_keep_wanted(2048, 8192));
        assert!(swizzle_keep_wanted(8192, 2048));
        assert!(!swizzle_keep_wanted(4096, 2048));
        assert!(!swizzle_keep_wanted(1024, 8192));
        assert!(!swizzle_keep_wanted(usize::MAX, 0));
    }

    #[test]
    fn l2_prefetch_one_wave_ahead_from_2_to_the_25_elements_with_rows_held() {
        if std::env::var_os("FP4NORM_L2_PREFETCH_ROWS").is_some()
            || std::env::var_os("FP4NORM_L2_PREFETCH_MIB").is_some()
        {
            return; // the knobs override the rule
        }
        let rows = |m: usize, h: usize, aligned: bool| {
            let p = bf16_nvfp4_problem(m, h);
            let cfg = KernelConfig::fused(&p, GsMode::Uniform, aligned, false, &H200);
            l2_prefetch_rows(&cfg, m, h, &H200)
        };
        // One resident wave: 132 SMs x 5 CTAs of 256 threads (one row each) ...
        assert_eq!(rows(16384, 4096, true), 660);
        assert_eq!(rows(8192, 4096, true), 660);
        // ... of two-CTA clusters (H = 8192), of 512-thread CTAs (two per SM), of 224-thread
        // CTAs (four per SM at 64 registers), of 8-CTA clusters (2048 x 32768).
        assert_eq!(rows(16384, 8192, true), 330);
        assert_eq!(rows(16384, 16384, true), 264);
        assert_eq!(rows(16384, 7168, true), 528);
        assert_eq!(rows(2048, 32768, true), 82);
        // ... of two-CTA clusters of 512 threads (16384 x 32768: four vectors per thread).
        assert_eq!(rows(16384, 32768, true), 132);
        // None below 2^25 elements, where the second pass re-reads its row (one CTA of 512
        // at H = 32768, without clusters), or without 16-byte vectors.
        assert_eq!(rows(4096, 4096, true), 0);
        assert_eq!(rows(1024, 8192, true), 0);
        assert_eq!(rows(16384, 4096, false), 0);
        let p = bf16_nvfp4_problem(16384, 32768);
        let unclustered = KernelConfig::fused(&p, GsMode::Uniform, true, false, &NO_CLUSTERS);
        assert_eq!(
            l2_prefetch_rows(&unclustered, 16384, 32768, &NO_CLUSTERS),
            0
        );
    }

    #[test]
    fn launch_table_is_the_measured_one() {
        // BENCHMARKS.md (H200): (H, M) -> (G, R, C).
        for (h, m, want) in [
            (1024, 65536, (64, 2, 1)),
            (2048, 32768, (128, 1, 1)),
            (4096, 16384, (256, 1, 1)),
            (5120, 8192, (160, 1, 2)),
            (5120, 16384, (320, 1, 1)),
            (7168, 16384, (224, 1, 1)),
            (8192, 8192, (256, 1, 2)),
            (8192, 1024, (256, 1, 2)),
            (16384, 1024, (256, 1, 4)),
            (16384, 4096, (256, 1, 4)),
            (16384, 16384, (512, 1, 1)),
            (7168, 8192, (224, 1, 2)),
            (7168, 2048, (224, 1, 1)),
            (32768, 2048, (256, 1, 8)),
            (32768, 8192, (256, 1, 8)),
            (32768, 16384, (512, 1, 2)), // four vectors per thread, held
            (32768, 4096 * 64, (512, 1, 2)),
            (4096, 1, (64, 1, 8)),
            (8192, 16, (128, 1, 8)),
            (5120, 1, (128, 1, 5)),
            (7168, 16, (128, 1, 7)),
            (2816, 1, (96, 1, 4)), // whole warps only at 1 CTA: the ragged 4 stay
            (8192, 128, (512, 1, 1)),
            (16384, 128, (1024, 1, 1)), // one CTA, 2048 vectors: 1024 threads
            (32768, 100, (1024, 1, 1)),
            (32768, 64, (512, 1, 2)), // split rows keep 512-thread CTAs
        ] {
            assert_eq!(
                launch_shape(h, 16, m, DType::BF16, &H200),
                want,
                "H={h} M={m}"
            );
        }
        // The limits of the many-row splits (132 SMs): 64 rows per SM at H = 5120, 16384
        // and 32768, 16 to 64 at H = 7168; just above the SM count the splits already apply.
        assert_eq!(
            launch_shape(5120, 16, 8448, DType::BF16, &H200),
            (160, 1, 2)
        );
        assert_eq!(
            launch_shape(5120, 16, 8449, DType::BF16, &H200),
            (320, 1, 1)
        );
        assert_eq!(
            launch_shape(5120, 32, 16384, DType::F16, &H200),
            (320, 1, 1)
        );
        // Without clusters, four vectors in 160 threads at every M beyond the SMs.
        assert_eq!(
            launch_shape(5120, 16, 16384, DType::BF16, &NO_CLUSTERS),
            (160, 1, 1)
        );
        assert_eq!(
            launch_shape(7168, 16, 2112, DType::BF16, &H200),
            (224, 1, 1)
        );
        assert_eq!(
            launch_shape(7168, 16, 2113, DType::BF16, &H200),
            (224, 1, 2)
        );
        assert_eq!(
            launch_shape(7168, 16, 8448, DType::BF16, &H200),
            (224, 1, 2)
        );
        assert_eq!(
            launch_shape(7168, 16, 8449, DType::BF16, &H200),
            (224, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 16, 8448, DType::BF16, &H200),
            (256, 1, 4)
        );
        assert_eq!(
            launch_shape(16384, 16, 8449, DType::BF16, &H200),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(32768, 16, 8448, DType::BF16, &H200),
            (256, 1, 8)
        );
        assert_eq!(
            launch_shape(32768, 16, 8449, DType::BF16, &H200),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 32, 8449, DType::BF16, &H200),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 16, 133, DType::BF16, &H200),
            (256, 1, 8)
        );
        // Without clusters (pre-Hopper) a row is never split, and many rows keep the
        // single-CTA shape.
        assert_eq!(launch_shape(4096, 16, 1, DType::BF16, &NO_CLUSTERS).2, 1);
        assert_eq!(
            launch_shape(8192, 16, 8192, DType::BF16, &NO_CLUSTERS),
            (256, 1, 1)
        );
        assert_eq!(
            launch_shape(32768, 32, 2048, DType::BF16, &NO_CLUSTERS),
            (512, 1, 1)
        );
        // f16 rows of 32768 take the two CTAs of 512 from 16 rows per SM; bf16 from 64.
        assert_eq!(
            launch_shape(32768, 16, 2112, DType::F16, &H200),
            (256, 1, 8)
        );
        assert_eq!(
            launch_shape(32768, 16, 2113, DType::F16, &H200),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 32, 8192, DType::F16, &H200),
            (512, 1, 2)
        );
        assert_eq!(
            launch_shape(32768, 16, 8192, DType::BF16, &H200),
            (256, 1, 8)
        );
        // f16 rows of 16384 take one CTA of 512 from 32 rows per SM; bf16 from 64.
        assert_eq!(
            launch_shape(16384, 16, 4224, DType::F16, &H200),
            (256, 1, 4)
        );
        assert_eq!(
            launch_shape(16384, 16, 4225, DType::F16, &H200),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 32, 8192, DType::F16, &H200),
            (512, 1, 1)
        );
        assert_eq!(
            launch_shape(16384, 16, 8192, DType::BF16, &H200),
            (256, 1, 4)
        );
        // MXFP4's blocks split the same way.
        assert_eq!(
            launch_shape(5120, 32, 4096, DType::BF16, &H200),
            (160, 1, 2)
        );
    }

    #[test]
    fn fp8_calls_take_their_own_rows_first() {
        // H = 8192 beyond 16 rows per SM: one CTA of 512 for FP8 (every dtype, block), two
        // CTAs of 256 for FP4; at 16 rows per SM and below, and at other H, the FP4 table.
        for (block, dtype) in [(8, DType::BF16), (32, DType::F16), (128, DType::BF16)] {
            for m in [2113, 4096, 16384, 1 << 20] {
                assert_eq!(
                    fp8_launch_shape(8192, block, m, dtype, &H200),
                    (512, 1, 1),
                    "M={m}"
                );
                assert_eq!(
                    launch_shape(8192, block, m, dtype, &H200),
                    (256, 1, 2),
                    "M={m}"
                );
            }
            for (h, m) in [
                (8192, 2112),
                (8192, 133),
                (8192, 16),
                (16384, 4096),
                (16384, 8448),
                (4096, 4096),
            ] {
                assert_eq!(
                    fp8_launch_shape(h, block, m, dtype, &H200),
                    launch_shape(h, block, m, dtype, &H200),
                    "H={h} M={m}"
                );
            }
            // Without clusters no table row applies to either.
            assert_eq!(
                fp8_launch_shape(8192, block, 4096, dtype, &NO_CLUSTERS),
                launch_shape(8192, block, 4096, dtype, &NO_CLUSTERS)
            );
        }
        // H = 16384 beyond 64 rows per SM: four CTAs of 256 for bf16 FP8 rows, one CTA of
        // 512 for FP4 and for f16 rows.
        for block in [8, 32, 128] {
            for m in [8449, 16384, 1 << 20] {
                assert_eq!(
                    fp8_launch_shape(16384, block, m, DType::BF16, &H200),
                    (256, 1, 4)
                );
                assert_eq!(
                    launch_shape(16384, block, m, DType::BF16, &H200),
                    (512, 1, 1)
                );
                assert_eq!(
                    fp8_launch_shape(16384, block, m, DType::F16, &H200),
                    launch_shape(16384, block, m, DType::F16, &H200)
                );
            }
        }
    }

    #[test]
    fn every_chosen_shape_is_one_the_kernel_supports() {
        for h in (16..=65536usize)
            .step_by(16)
            .filter(|h| h % 160 == 0 || h.is_power_of_two())
        {
            for block in [16, 32] {
                if h % block != 0 {
                    continue;
                }
                for m in [1, 2, 7, 16, 66, 128, 132, 133, 1000, 16384] {
                    for limits in [H200, NO_CLUSTERS] {
                        for dtype in [DType::BF16, DType::F16] {
                            for s in [
                                launch_shape(h, block, m, dtype, &limits),
                                fp8_launch_shape(h, block, m, dtype, &limits),
                            ] {
                                assert!(
                                    shape_fits(h, block, s, &limits),
                                    "H={h} B={block} M={m} {dtype:?}: {s:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The launch table's choices on every part `DeviceLimits::part` knows (Blackwell
    /// sm_100a / sm_103a / sm_120a / sm_121a, an A100 without clusters), and on the same
    /// parts with smaller clusters and CTAs than any has: every shape fits the part (its
    /// CTA and cluster sizes, the kernel's launch bound within its threads per SM), covers
    /// every row, and the L2 prefetch keeps within half the part's L2. (The registers a
    /// shape needs are fixed by the launch bound at compile time, and the compile check
    /// builds the kernels for these targets without spills.)
    #[test]
    fn the_table_launches_on_every_known_part_and_on_smaller_limits() {
        let mut devices = Vec::new();
        for name in DeviceLimits::PARTS {
            let (_, l) = DeviceLimits::part(name).expect("known part");
            devices.push((name.to_string(), l));
            for (cluster, threads) in [(4, 1024), (2, 1024), (1, 1024), (8, 512), (2, 256)] {
                let smaller = DeviceLimits {
                    max_cluster: cluster,
                    max_threads_per_block: threads,
                    ..l
                };
                devices.push((
                    format!("{name} with clusters of {cluster}, CTAs of {threads}"),
                    smaller,
                ));
            }
        }
        let mut checked = 0usize;
        for (name, limits) in &devices {
            for h in [64, 2048, 2816, 4096, 5120, 7168, 8192, 16384, 32768, 65536] {
                for block in [16, 32] {
                    for m in [1, 2, 16, 100, 128, 200, 1024, 4096, 16384, 65536] {
                        for dtype in [DType::BF16, DType::F16] {
                            let (g, r, c) = launch_shape(h, block, m, dtype, limits);
                            let what =
                                format!("{name}: H={h} B={block} M={m} {dtype:?}: {:?}", (g, r, c));
                            assert!(shape_fits(h, block, (g, r, c), limits), "{what}");
                            assert!(g * r <= limits.max_threads_per_block, "{what}");
                            assert!(c <= limits.max_cluster, "{what}");
                            // Every vector of a row has a thread.
                            let per_cta = (h / 8) / c as usize;
                            let vpt = per_cta.div_ceil(g as usize);
                            assert!(vpt * g as usize >= per_cta, "{what}");
                            let p = crate::Problem::new(
                                m,
                                h,
                                dtype,
                                crate::ScaleLayout::Swizzled,
                                &crate::Options::nvfp4().with_format(if block == 16 {
                                    crate::Fp4Format::NVFP4
                                } else {
                                    crate::Fp4Format::MXFP4
                                }),
                            )
                            .expect("valid problem");
                            let cfg = KernelConfig::fused(&p, GsMode::Uniform, true, false, limits);
                            let ahead = l2_prefetch_rows(&cfg, m, h, limits) as u64;
                            assert!(
                                ahead * (h as u64) * 4 <= limits.l2_bytes / 2,
                                "{what}: {ahead} rows ahead"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn shape_fits_refuses_what_the_kernel_cannot_run() {
        assert!(!shape_fits(4096, 16, (48, 1, 1), &H200)); // not whole warps
        assert!(!shape_fits(4096, 16, (512, 4, 1), &H200)); // 2048 threads
        assert!(!shape_fits(4096, 16, (64, 2, 8), &H200)); // clustered CTAs own one row
        assert!(!shape_fits(4096, 16, (64, 1, 8), &NO_CLUSTERS)); // no clusters on this device
        assert!(!shape_fits(5120, 16, (64, 1, 3), &H200)); // 640 vectors do not split in 3
        assert!(!shape_fits(4096, 16, (32, 1, 16), &H200)); // at most 8 CTAs per cluster
        let small = DeviceLimits {
            max_cluster: 4,
            max_threads_per_block: 256,
            ..H200
        };
        assert!(!shape_fits(4096, 16, (64, 1, 8), &small)); // the device's clusters are smaller
        assert!(!shape_fits(4096, 16, (512, 1, 1), &small)); // ... and its CTAs
        assert!(shape_fits(4096, 16, (64, 1, 4), &small));
        assert!(shape_fits(4096, 16, (64, 1, 8), &H200));
    }

    #[test]
    fn column_scales_split_for_groups_of_32_and_64_from_2_to_the_25_elements_on_fast_dram() {
        if std::env::var_os("FP4NORM_FP8_SCALES_SPLIT").is_some() {
            return; // the knob overrides the rule
        }
        use crate::fp8::{
            Fp8Element, Fp8Group, Fp8Options, Fp8Problem, Fp8ScaleFormat, Fp8ScaleLayout,
        };
        let split = |m: usize, h: usize, group, format, layout| {
            let o = Fp8Options::dynamic(Fp8Element::E4M3, group, format, layout);
            let p = Fp8Problem::new(m, h, DType::BF16, &o).expect("valid");
            let wanted = column_scales_split_wanted(&p, &H200);
            // The configuration carries the rule (aligned rows).
            let cfg = KernelConfig::fp8(&p, false, true, &H200);
            assert_eq!(cfg.fp8.map(|f| f.split_scales), Some(wanted));
            assert_eq!(cfg.second_pass().is_some(), wanted);
            assert_eq!(cfg.defines().contains("#define FP8_COL_SPLIT 1\n"), wanted);
            wanted
        };
        let (f32s, ue8m0) = (Fp8ScaleFormat::F32_NO_FLOOR, Fp8ScaleFormat::UE8M0);
        let (col, row) = (Fp8ScaleLayout::ColumnMajor, Fp8ScaleLayout::RowMajor);
        let floored = Fp8ScaleFormat::F32 { s_min: 1e-6 };
        assert!(split(4096, 8192, Fp8Group::G32, f32s, col));
        assert!(split(2048, 16384, Fp8Group::G64, floored, col));
        assert!(split(16385, 16384, Fp8Group::G32, f32s, col));
        // Below 2^25 elements the second kernel costs more than it saves.
        assert!(!split(4095, 8192, Fp8Group::G32, f32s, col));
        assert!(!split(4096, 4096, Fp8Group::G64, f32s, col));
        assert!(!split(16, 8192, Fp8Group::G64, f32s, col));
        // Groups of 128 gain nothing; other layouts and UE8M0 codes have no split.
        assert!(!split(4096, 8192, Fp8Group::G128, f32s, col));
        assert!(!split(4096, 8192, Fp8Group::G32, f32s, row));
        assert!(!split(4096, 8192, Fp8Group::G32, ue8m0, col));
        assert!(!split(4096, 8192, Fp8Group::PerToken, f32s, col));
        // Only whole tiles: H / G a multiple of the tile's groups (8 for groups of 32).
        assert!(!split(8192, 4128, Fp8Group::G32, f32s, col));
        // The element-wise kernel (unaligned rows) writes directly.
        let o = Fp8Options::dynamic(Fp8Element::E4M3, Fp8Group::G32, f32s, col);
        let p = Fp8Problem::new(4096, 8192, DType::BF16, &o).expect("valid");
        let cfg = KernelConfig::fp8(&p, false, false, &H200);
        assert_eq!(cfg.fp8.map(|f| f.split_scales), Some(false));
        // Slower DRAM (an H100's) hides the direct write's requests; a device that does not
        // report its bandwidth keeps the split.
        let h100 = DeviceLimits {
            l2_bytes: 50 << 20,
            dram_bytes_per_s: 3_350_000_000_000,
            ..H200
        };
        let unknown = DeviceLimits {
            dram_bytes_per_s: 0,
            ..H200
        };
        for (m, h, group) in [(4096, 8192, Fp8Group::G32), (16384, 16384, Fp8Group::G64)] {
            let o = Fp8Options::dynamic(Fp8Element::E4M3, group, f32s, col);
            let p = Fp8Problem::new(m, h, DType::BF16, &o).expect("valid");
            assert!(!column_scales_split_wanted(&p, &h100));
            let cfg = KernelConfig::fp8(&p, false, true, &h100);
            assert_eq!(cfg.fp8.map(|f| f.split_scales), Some(false));
            assert!(cfg.second_pass().is_none());
            assert!(column_scales_split_wanted(&p, &unknown));
        }
    }
}
