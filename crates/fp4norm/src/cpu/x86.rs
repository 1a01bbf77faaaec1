//! x86-64 row kernels: AVX-512 (16 lanes) and AVX2 (8 lanes), byte-identical to
//! [`crate::reference`].
//!
//! Each row takes these steps:
//!
//! 1. `h = RNdt(x + r)` (written back to `r`), widened to f32 and kept in the row buffer,
//!    and the sum of its squares in f64 lanes — the f64 square of an f32 is exact (24-bit
//!    significands), so a fused multiply-add `h·h + acc` rounds exactly as the separate
//!    add would; the lanes' sum has a known depth and goes through [`rstd_if_decided`],
//!    with the exact sum where it cannot decide (SPEC.md §1.2, `crate::sumsq`);
//! 2. `y = RN32(RN32(h · rstd) · w)` (two multiplies, never fused), with `y_out`, and each
//!    block's amax as the integer max of `|y|`'s bits (NaN above +Inf, so NaN propagates);
//! 3. the block scales a vector of blocks at a time, then `E2M1(y · inv)`, packed.
//!
//! The FP8 rows (`fp8::cpu`) take step 1 and the rounding of `y_out` from here too
//! (`fp8_step1`, `fp8_round_row`, rows of any length: a scalar tail).
//!
//! AVX-512 runs steps 2–3 on 16 blocks at a time: one transpose tree reduces their 16
//! amaxes into one vector (`avx512::hmax16`), whose scales are one vector operation; its
//! E2M1 is a table lookup (`avx512::e2m1`). AVX2 reduces each block on its own (the same
//! structure was tried there and gained nothing) and rounds E2M1 with the float adder as
//! `codec::e2m1_encode_non_nan` does.
//!
//! Every lane operation is the IEEE operation or the integer formula of the scalar code
//! it replaces (`crate::codec`, `reference::block_scale`), lane for lane: the same
//! bit-twiddles in vector registers, `vcvtps2ph` (IEEE round to nearest even, with the
//! NaN replaced by the canonical one) for `RNf16`, and `vcvtph2ps` (exact) for the f16
//! widening. The unit tests of `cpu::tests` check each kernel's lane functions against
//! the scalar ones over every input where that is 2^32 values or fewer, and whole calls
//! against the reference on random data and the SPEC's edge cases.
//!
//! Unsafe: the kernels are `#[target_feature]` functions, entered from [`task`] only
//! after [`Isa::supported`] has seen the features; inside, loads and stores go through
//! fixed-size array references (`&[T; N]`) so each pointer access is in bounds by its type.

use core::arch::x86_64::*;

use super::isa::Isa;
use super::lanes_sum;
use super::Task;
use crate::reference::block_scale;
use crate::sumsq::{exact_sum_of_squares, rstd_if_decided, rstd_of_sum};
use crate::{BlockSize, DType, Element, Fp4Format, GlobalScale, MatRef, Problem, ScaleFormat};

/// `_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC`: round to nearest even, whatever MXCSR says.
const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// Row buffers of one task: `y` (H f32), each block's `|y|` max bits and inverse scale.
pub(super) struct Scratch {
    y: Vec<f32>,
    amax: Vec<u32>,
    inv: Vec<f32>,
}

/// The rows of one task on `isa` (AVX2 or AVX-512); `w32` is the weight widened to f32.
pub(super) fn task<T: Element>(
    isa: Isa,
    p: &Problem,
    t: Task<'_, T>,
    x: &MatRef<'_, T>,
    w32: &[f32],
    gs: &GlobalScale<'_>,
) {
    assert!(isa.supported() && isa != Isa::Portable);
    let (h, nb) = (p.h, p.n_blocks());
    let mut s = Scratch {
        y: vec![0f32; h],
        amax: vec![0u32; nb],
        inv: vec![0f32; nb],
    };
    // SAFETY: the features each kernel enables are those `Isa::supported` checked above.
    unsafe {
        match (isa, p.format.block) {
            (Isa::Avx512, BlockSize::B16) => avx512::rows::<T, 16>(p, t, x, w32, gs, &mut s),
            (Isa::Avx512, BlockSize::B32) => avx512::rows::<T, 32>(p, t, x, w32, gs, &mut s),
            (_, BlockSize::B16) => avx2::rows::<T, 16>(p, t, x, w32, gs, &mut s),
            (_, BlockSize::B32) => avx2::rows::<T, 32>(p, t, x, w32, gs, &mut s),
        }
    }
}

/// The `rstd` of a row from its lanes' f64 sum `ss`, whose every square went through at
/// most `depth` rounded additions; the exact sum where that cannot decide.
#[inline(always)]
fn finish_rstd<T: Element>(ss: f64, depth: usize, hrow: &[T], eps: f32) -> f32 {
    let h = hrow.len();
    rstd_if_decided(ss, depth, h, eps).unwrap_or_else(|| {
        rstd_of_sum(
            exact_sum_of_squares(hrow.iter().map(|v| v.to_f32())),
            h,
            eps,
        )
    })
}

/// `s` as consecutive `&[T; N]` (its length is a multiple of `N` wherever this is used).
#[inline(always)]
fn arrays<T, const N: usize>(s: &[T]) -> impl Iterator<Item = &[T; N]> {
    s.chunks_exact(N).map(|c| c.try_into().unwrap())
}

#[inline(always)]
fn arrays_mut<T, const N: usize>(s: &mut [T]) -> impl Iterator<Item = &mut [T; N]> {
    s.chunks_exact_mut(N).map(|c| c.try_into().unwrap())
}

#[inline(always)]
fn is_f16<T: Element>() -> bool {
    T::DTYPE == DType::F16
}

/// The AVX-512 E2M1 lookup tables (`avx512::e2m1`), as two halves of 16 entries each.
#[derive(Clone, Copy)]
struct E2m1Tables {
    interior: [__m512i; 2],
    boundary: [__m512i; 2],
}

/// Per row: what steps 4–8 need besides the data.
struct RowCtx<'a> {
    format: Fp4Format,
    rstd: f32,
    gs: f32,
    tables: &'a E2m1Tables,
    /// The next row's input and residual (null where there is none), `bytes` long each.
    next: [*const u8; 2],
    bytes: usize,
}

/// Prefetches (into L2) the `part`-th of `parts` equal shares of the next row's input
/// and residual lines, while this row is quantised: memory keeps streaming during the
/// compute-only steps, and across the 4 KiB page boundaries where the hardware
/// prefetcher stops. Interleaved A/B at 4096 × 8192 (6 rounds, quiet machine): medians
/// 7–12 % lower; the L1 hint gained half as much.
#[inline(always)]
fn prefetch_share(c: &RowCtx<'_>, part: usize, parts: usize) {
    let lines = c.bytes.div_ceil(64);
    for p in c.next {
        if !p.is_null() {
            for l in part * lines / parts..(part + 1) * lines / parts {
                // SAFETY: a prefetch is only a hint and never faults; the address lies
                // inside the next row, `bytes` long from `p`.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(64 * l).cast()) };
            }
        }
    }
}

/// The FP8 rows' step 1 and `y_out` rounding on a path of `$n` f32 lanes, built from that
/// path's lane functions (`load_dt`, `widen`, `round`, `add_squares`, …, in scope where it is
/// invoked), its f32 vector add and its f64 vector store:
///
/// - `fp8_step1`: `h = RNdt(x + r)` written back to `r` (or `h = x`) as f32 into `y`, for a
///   row of any length; the sum of its squares in `$n` f64 lanes (element `$n·j + k` in lane
///   `k`, the tail's in lanes 0..) and that sum's depth ([`lanes_sum`]);
/// - `fp8_round_row`: `out = RNdt(y)`, for a row of any length.
macro_rules! fp8_row_steps {
    ($features:literal, $n:literal, $add_ps:path, $zero_pd:expr, $store_pd:path) => {
        #[inline]
        #[target_feature(enable = $features)]
        pub(crate) fn fp8_step1<T: Element>(
            x: &[T],
            r: Option<&mut [T]>,
            y: &mut [f32],
        ) -> (f64, usize) {
            let len = y.len();
            let n = len / $n * $n;
            let mut acc = [$zero_pd; 2];
            let mut tail = [0f32; $n];
            match r {
                Some(r) => {
                    for ((xa, ra), ya) in arrays::<T, $n>(&x[..n])
                        .zip(arrays_mut::<T, $n>(&mut r[..n]))
                        .zip(arrays_mut::<f32, $n>(&mut y[..n]))
                    {
                        let (hb, hv) =
                            round::<T>($add_ps(widen::<T>(load_dt(xa)), widen::<T>(load_dt(ra))));
                        store_dt(ra, hb);
                        store_f32(ya, hv);
                        add_squares(hv, &mut acc);
                    }
                    for i in n..len {
                        let hv = T::round_from_f32(x[i].to_f32() + r[i].to_f32());
                        r[i] = hv;
                        y[i] = hv.to_f32();
                        tail[i - n] = y[i];
                    }
                }
                None => {
                    for (xa, ya) in arrays::<T, $n>(&x[..n]).zip(arrays_mut::<f32, $n>(&mut y[..n]))
                    {
                        let hv = widen::<T>(load_dt(xa));
                        store_f32(ya, hv);
                        add_squares(hv, &mut acc);
                    }
                    for i in n..len {
                        y[i] = x[i].to_f32();
                        tail[i - n] = y[i];
                    }
                }
            }
            let mut l = [0f64; $n];
            // SAFETY: two vectors of $n / 2 f64 into an [f64; $n]; acc[0] holds the low half
            // of each chunk's elements.
            unsafe {
                $store_pd(l.as_mut_ptr(), acc[0]);
                $store_pd(l.as_mut_ptr().add($n / 2), acc[1]);
            }
            lanes_sum(l, &tail[..len - n], len)
        }

        #[inline]
        #[target_feature(enable = $features)]
        pub(crate) fn fp8_round_row<T: Element>(y: &[f32], out: &mut [T]) {
            let n = y.len() / $n * $n;
            for (ya, oa) in arrays::<f32, $n>(&y[..n]).zip(arrays_mut::<T, $n>(&mut out[..n])) {
                store_dt(oa, round::<T>(load_f32(ya)).0);
            }
            for (o, &v) in out[n..].iter_mut().zip(&y[n..]) {
                *o = T::round_from_f32(v);
            }
        }
    };
}

/// The first table entry: `|v| >> 21` of every `|v| < 0.25` is at most this.
const E2M1_FIRST: u32 = (0.25f32.to_bits() >> 21) - 1;

/// The codes of `|v| >> 21 = r` for `r` in `E2M1_FIRST .. E2M1_FIRST + 32`, at `r % 32`:
/// inside the interval `[r << 21, (r + 1) << 21)` and on its lower end.
fn e2m1_table_entries() -> ([u32; 32], [u32; 32]) {
    let (mut interior, mut boundary) = ([0u32; 32], [0u32; 32]);
    for r in E2M1_FIRST..E2M1_FIRST + 32 {
        let at = (r % 32) as usize;
        boundary[at] = u32::from(crate::codec::e2m1_encode(f32::from_bits(r << 21)));
        interior[at] = u32::from(crate::codec::e2m1_encode(f32::from_bits((r << 21) | 1)));
    }
    (interior, boundary)
}

/// The 4×4 transpose of an index below 16: `4k + q` ↔ `4q + k`.
#[inline(always)]
const fn transpose4(s: usize) -> usize {
    (s % 4) * 4 + s / 4
}

/// Scalar `block_scale` for the blocks a vector does not cover.
#[inline(always)]
fn scales_tail(format: Fp4Format, amax: &[u32], gs: f32, codes: &mut [u8], inv: &mut [f32]) {
    for ((&a, c), i) in amax.iter().zip(codes.iter_mut()).zip(inv.iter_mut()) {
        (*c, *i) = block_scale(format, f32::from_bits(a), gs);
    }
}

pub(crate) mod avx512 {
    //! 16 f32 lanes; one NVFP4 block per vector.
    use super::*;

    fp8_row_steps!(
        "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
        16,
        _mm512_add_ps,
        _mm512_setzero_pd(),
        _mm512_storeu_pd
    );

    macro_rules! kernel {
        ($($item:item)*) => {$(
            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            $item
        )*};
    }

    kernel! {
        /// 16 elements of dtype `T` (their bits).
        fn load_dt<T: Element>(a: &[T; 16]) -> __m256i {
            // SAFETY: 16 two-byte elements are the 32 bytes read (unaligned load).
            unsafe { _mm256_loadu_si256(a.as_ptr().cast()) }
        }

        fn store_dt<T: Element>(a: &mut [T; 16], v: __m256i) {
            // SAFETY: as load_dt; T is bf16 or f16, any 16 bits are a valid value.
            unsafe { _mm256_storeu_si256(a.as_mut_ptr().cast(), v) }
        }

        fn load_f32(a: &[f32; 16]) -> __m512 {
            // SAFETY: 64 bytes in bounds by the type.
            unsafe { _mm512_loadu_ps(a.as_ptr()) }
        }

        fn store_f32(a: &mut [f32; 16], v: __m512) {
            // SAFETY: 64 bytes in bounds by the type.
            unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) }
        }

        /// Exact widening to f32 (`Element::to_f32`).
        fn widen<T: Element>(v: __m256i) -> __m512 {
            if is_f16::<T>() {
                _mm512_cvtph_ps(v)
            } else {
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
            }
        }

        /// `RNdt` of 16 f32 (`Element::round_from_f32`): the bits, and their value as f32.
        fn round<T: Element>(s: __m512) -> (__m256i, __m512) {
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(s, s);
            if is_f16::<T>() {
                // IEEE round to nearest even (subnormals and overflow to Inf included);
                // NaN payloads differ from the canonical NaN, which replaces them.
                let ph = _mm512_cvtps_ph::<RNE>(s);
                let ph = _mm256_mask_blend_epi16(nan, ph, _mm256_set1_epi16(0x7FFF));
                (ph, _mm512_cvtph_ps(ph))
            } else {
                // f32_to_bf16_bits: (b + 0x7FFF + lsb) >> 16, NaN → 0x7FFF.
                let b = _mm512_castps_si512(s);
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
                let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
                let r = _mm512_srli_epi32::<16>(r);
                let r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FFF));
                (
                    _mm512_cvtepi32_epi16(r),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(r)),
                )
            }
        }

        /// Adds the squares of `h`'s 16 lanes to two f64 accumulators of 8 lanes.
        fn add_squares(h: __m512, acc: &mut [__m512d; 2]) {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(h));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(h),
            )));
            // The square is exact in f64, so the fused add rounds once, as `acc + h²` does.
            acc[0] = _mm512_fmadd_pd(lo, lo, acc[0]);
            acc[1] = _mm512_fmadd_pd(hi, hi, acc[1]);
        }

        /// The 16 f64 lanes' sum: 1 + 3 rounded additions after the lanes' own.
        fn sum_lanes(acc: [__m512d; 2]) -> f64 {
            let mut l = [0f64; 8];
            // SAFETY: 64 bytes into an [f64; 8].
            unsafe { _mm512_storeu_pd(l.as_mut_ptr(), _mm512_add_pd(acc[0], acc[1])) };
            ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
        }

        /// `e2m1_encode` of 16 lanes by table: every E2M1 decision boundary (0.25, 0.75,
        /// 1.25, 1.75, 2.5, 3.5, 5) starts a quarter of a binade, so the bits of
        /// `min(|v|, 8)` above the low 21 — exponent and two mantissa bits — pick the code of
        /// the interval's interior, and an exact boundary (low 21 bits zero) the code of the
        /// boundary itself, where the tie rule applies. Every `|v| < 0.25` lands on entry 499
        /// (code 0), `|v| ≥ 8` and NaN (`vminps` returns its second operand) on 520 (code 7);
        /// the sign bit is added where `v` is not NaN.
        fn e2m1(v: __m512, t: &E2m1Tables) -> __m512i {
            let bits = _mm512_castps_si512(v);
            let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
            let a = _mm512_castps_si512(_mm512_min_ps(_mm512_castsi512_ps(abs), _mm512_set1_ps(8.0)));
            let idx = _mm512_max_epu32(_mm512_srli_epi32::<21>(a), _mm512_set1_epi32(E2M1_FIRST as i32));
            let exact = _mm512_testn_epi32_mask(a, _mm512_set1_epi32(0x1F_FFFF));
            let c = _mm512_permutex2var_epi32(t.interior[0], idx, t.interior[1]);
            let c = _mm512_mask_mov_epi32(c, exact, _mm512_permutex2var_epi32(t.boundary[0], idx, t.boundary[1]));
            let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
            // c | ((bits >> 28) & 8) where ordered: (A | (B & C)) is 0xF8.
            _mm512_mask_ternarylogic_epi32::<0xF8>(c, ord, _mm512_srli_epi32::<28>(bits), _mm512_set1_epi32(8))
        }

        fn e2m1_tables() -> E2m1Tables {
            let (interior, boundary) = e2m1_table_entries();
            // SAFETY: 64-byte loads from [u32; 32] halves.
            let ld = |t: &[u32; 32], k: usize| unsafe { _mm512_loadu_si512(t[16 * k..].as_ptr().cast()) };
            E2m1Tables {
                interior: [ld(&interior, 0), ld(&interior, 1)],
                boundary: [ld(&boundary, 0), ld(&boundary, 1)],
            }
        }

        /// Lane j of the result: the max over the lanes of `v[s]` where `s` is `j`'s 4×4
        /// transpose (`j = 4q + k` ↔ `s = 4k + q`): a tree of 15 lane shuffles and maxima in
        /// place of 16 horizontal reductions. Callers put block `transpose4(s)` in `v[s]`.
        fn hmax16(v: &[__m512i; 16]) -> __m512i {
            let mut l1 = [_mm512_setzero_si512(); 8];
            for i in 0..8 {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                // 128-bit quarters: [a0 a1 b0 b1] vs [a2 a3 b2 b3]: a in the low half, b high.
                l1[i] = _mm512_max_epu32(_mm512_shuffle_i32x4::<0x44>(a, b), _mm512_shuffle_i32x4::<0xEE>(a, b));
            }
            let mut l2 = [_mm512_setzero_si512(); 4];
            for i in 0..4 {
                let (a, b) = (l1[2 * i], l1[2 * i + 1]);
                // [a0 a2 b0 b2] vs [a1 a3 b1 b3]: quarter q holds v[4i + q].
                l2[i] = _mm512_max_epu32(_mm512_shuffle_i32x4::<0x88>(a, b), _mm512_shuffle_i32x4::<0xDD>(a, b));
            }
            let mut l3 = [_mm512_setzero_si512(); 2];
            for i in 0..2 {
                let (a, b) = (l2[2 * i], l2[2 * i + 1]);
                // Quarter q: two lanes of v[8i + q], two of v[8i + 4 + q].
                l3[i] = _mm512_max_epu32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
            }
            let (a, b) = (_mm512_castsi512_ps(l3[0]), _mm512_castsi512_ps(l3[1]));
            // Quarter q: [v[q], v[4 + q], v[8 + q], v[12 + q]].
            _mm512_max_epu32(
                _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(a, b)),
                _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(a, b)),
            )
        }

        /// The FP8 rows' amaxes of 16 consecutive groups of `G` elements (a multiple of 16)
        /// of `y` (`16·G` long) as `|y|`'s bits, group `j`'s in element `j`: each group's
        /// lane-wise max, then one `hmax16` tree for all 16, in place of 16 horizontal
        /// reductions.
        pub(crate) fn fp8_amax_x16<const G: usize>(y: &[f32]) -> [u32; 16] {
            let abs = _mm512_set1_epi32(0x7FFF_FFFF);
            let mut m = [_mm512_setzero_si512(); 16];
            for (slot, v) in m.iter_mut().enumerate() {
                let g = &y[transpose4(slot) * G..(transpose4(slot) + 1) * G];
                let mut acc = _mm512_setzero_si512();
                for a in arrays::<f32, 16>(g) {
                    let bits = _mm512_and_si512(_mm512_castps_si512(load_f32(a)), abs);
                    acc = _mm512_max_epu32(acc, bits);
                }
                *v = acc;
            }
            let mut out = [0u32; 16];
            // SAFETY: 64 bytes into a [u32; 16] (unaligned store).
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), hmax16(&m)) };
            out
        }

        /// 16 codes (one per u32 lane) packed two per byte, element 2j in the low nibble.
        fn pack_nibbles(c: __m512i) -> __m128i {
            // Per u64 lane: c[2j] | c[2j+1] << 32 → low byte c[2j] | c[2j+1] << 4.
            let t = _mm512_or_si512(c, _mm512_srli_epi64::<28>(c));
            _mm512_cvtepi64_epi8(t)
        }

        /// E4M3 block scales of 16 amaxes (bits): `reference::block_scale`, lane for lane.
        fn e4m3_scales(amax: __m512i, gs: f32) -> (__m512i, __m512) {
            let g = _mm512_set1_ps(gs);
            let s = _mm512_div_ps(_mm512_mul_ps(g, _mm512_castsi512_ps(amax)), _mm512_set1_ps(6.0));
            // e4m3_encode(s)
            let bits = _mm512_castps_si512(s);
            let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(bits), _mm512_set1_epi32(0x80));
            let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
            let a = _mm512_castsi512_ps(abs);
            let reb = _mm512_sub_epi32(abs, _mm512_set1_epi32((127 - 7) << 23));
            let odd = _mm512_and_si512(_mm512_srli_epi32::<20>(reb), _mm512_set1_epi32(1));
            let rounded = _mm512_add_epi32(_mm512_add_epi32(reb, _mm512_set1_epi32(0x7FFFF)), odd);
            let normal = _mm512_min_epu32(_mm512_srli_epi32::<20>(rounded), _mm512_set1_epi32(0x7E));
            let sub = _mm512_cvt_roundps_epi32::<RNE>(_mm512_mul_ps(a, _mm512_set1_ps(512.0)));
            let is_sub = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(0x3C80_0000));
            let code = _mm512_mask_blend_epi32(is_sub, normal, sub);
            let big = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(448.0));
            let code = _mm512_mask_blend_epi32(big, code, _mm512_set1_epi32(0x7E));
            let code = _mm512_or_si512(code, sign);
            let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
            let code = _mm512_mask_blend_epi32(nan, code, _mm512_set1_epi32(0x7F));
            // d = e4m3_decode(code), exactly; inv = 0 if d == 0 else gs / d.
            let exp = _mm512_and_si512(_mm512_srli_epi32::<3>(code), _mm512_set1_epi32(0xF));
            let mant = _mm512_and_si512(code, _mm512_set1_epi32(7));
            let normal_d = _mm512_or_si512(
                _mm512_slli_epi32::<23>(_mm512_add_epi32(exp, _mm512_set1_epi32(127 - 7))),
                _mm512_slli_epi32::<20>(mant),
            );
            let sub_d = _mm512_castps_si512(_mm512_mul_ps(
                _mm512_cvtepi32_ps(mant),
                _mm512_set1_ps(1.0 / 512.0),
            ));
            let exp0 = _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512());
            let mag = _mm512_mask_blend_epi32(exp0, normal_d, sub_d);
            let dnan = _mm512_cmpeq_epi32_mask(
                _mm512_and_si512(code, _mm512_set1_epi32(0x7F)),
                _mm512_set1_epi32(0x7F),
            );
            let mag = _mm512_mask_blend_epi32(dnan, mag, _mm512_set1_epi32(0x7FC0_0000));
            let dsign = _mm512_slli_epi32::<24>(_mm512_and_si512(code, _mm512_set1_epi32(0x80)));
            let d = _mm512_castsi512_ps(_mm512_or_si512(mag, dsign));
            let zero = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(d, _mm512_setzero_ps());
            let inv = _mm512_maskz_div_ps(!zero, g, d);
            (code, inv)
        }

        /// UE8M0 block scales of 16 amaxes (bits): `ue8m0_ceil_code(amax / 6)` and its inverse.
        fn ue8m0_scales(amax: __m512i) -> (__m512i, __m512) {
            let v = _mm512_div_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(6.0));
            let bits = _mm512_castps_si512(v);
            let exp = _mm512_srli_epi32::<23>(bits);
            let mant = _mm512_and_si512(bits, _mm512_set1_epi32(0x7F_FFFF));
            let mant_nz = _mm512_test_epi32_mask(mant, mant);
            let up = _mm512_mask_add_epi32(exp, mant_nz, exp, _mm512_set1_epi32(1));
            let normal = _mm512_min_epu32(up, _mm512_set1_epi32(254));
            let subn = _mm512_maskz_set1_epi32(
                _mm512_cmpgt_epu32_mask(mant, _mm512_set1_epi32(0x40_0000)),
                1,
            );
            let exp0 = _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512());
            let code = _mm512_mask_blend_epi32(exp0, normal, subn);
            let zero_or_neg = _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512())
                | _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
            let code = _mm512_mask_blend_epi32(zero_or_neg, code, _mm512_setzero_si512());
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let code = _mm512_mask_blend_epi32(nan, code, _mm512_set1_epi32(255));
            // ue8m0_inverse: 2^(127 - code); 254 → 2^-127 (subnormal), 255 → NaN.
            let inv = _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_set1_epi32(254), code));
            let inv = _mm512_mask_blend_epi32(
                _mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(254)),
                inv,
                _mm512_set1_epi32(1 << 22),
            );
            let inv = _mm512_mask_blend_epi32(nan, inv, _mm512_set1_epi32(0x7FC0_0000));
            (code, _mm512_castsi512_ps(inv))
        }

        fn scales_x16(format: Fp4Format, amax: __m512i, gs: f32) -> (__m512i, __m512) {
            match format.scale {
                ScaleFormat::E4M3 => e4m3_scales(amax, gs),
                ScaleFormat::UE8M0 => ue8m0_scales(amax),
            }
        }

        /// The block scales of a row's blocks: codes and inverse scales from the amaxes.
        fn scales(format: Fp4Format, amax: &[u32], gs: f32, codes: &mut [u8], inv: &mut [f32]) {
            let n = amax.len() / 16 * 16;
            for ((a, c), i) in arrays::<u32, 16>(amax)
                .zip(arrays_mut::<u8, 16>(codes))
                .zip(arrays_mut::<f32, 16>(inv))
            {
                // SAFETY: 64 bytes from an [u32; 16].
                let av = unsafe { _mm512_loadu_si512(a.as_ptr().cast()) };
                let (cv, iv) = scales_x16(format, av, gs);
                // SAFETY: 16 bytes into an [u8; 16], 64 into an [f32; 16].
                unsafe {
                    _mm_storeu_si128(c.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(cv));
                    _mm512_storeu_ps(i.as_mut_ptr(), iv);
                }
            }
            scales_tail(format, &amax[n..], gs, &mut codes[n..], &mut inv[n..]);
        }

        /// Every row of one task.
        pub(in super::super) fn rows<T: Element, const B: usize>(
            p: &Problem,
            mut t: Task<'_, T>,
            x: &MatRef<'_, T>,
            w32: &[f32],
            gs: &GlobalScale<'_>,
            s: &mut Scratch,
        ) {
            let (h, nb) = (p.h, p.n_blocks());
            // 16 f64 lanes, each summing H/16 squares, then 4 levels.
            let depth = h / 16 + 4;
            let tables = e2m1_tables();
            for i in 0..t.rows {
                let row = t.first_row + i;
                let xr = x.row(row);
                // Pass 1: h, written back; squares.
                // Pass 1: h (written back), kept as f32 in the row buffer; its squares.
                let mut acc = [_mm512_setzero_pd(); 2];
                let hrow: &[T] = match t.residual.as_mut() {
                    Some(r) => {
                        let rr = r.row_mut(i);
                        for ((xa, ra), ya) in arrays::<T, 16>(xr)
                            .zip(arrays_mut::<T, 16>(rr))
                            .zip(arrays_mut::<f32, 16>(&mut s.y))
                        {
                            let sum = _mm512_add_ps(widen::<T>(load_dt(xa)), widen::<T>(load_dt(ra)));
                            let (hb, hv) = round::<T>(sum);
                            store_dt(ra, hb);
                            store_f32(ya, hv);
                            add_squares(hv, &mut acc);
                        }
                        rr
                    }
                    None => {
                        for (xa, ya) in arrays::<T, 16>(xr).zip(arrays_mut::<f32, 16>(&mut s.y)) {
                            let hv = widen::<T>(load_dt(xa));
                            store_f32(ya, hv);
                            add_squares(hv, &mut acc);
                        }
                        xr
                    }
                };
                let rstd = finish_rstd(sum_lanes(acc), depth, hrow, p.eps);
                let codes = &mut t.row_major[i * nb..(i + 1) * nb];
                let q = &mut t.y_fp4[i * h / 2..(i + 1) * h / 2];
                let has_next = i + 1 < t.rows;
                let next = [
                    if has_next { x.row(row + 1).as_ptr().cast() } else { std::ptr::null() },
                    match t.residual.as_ref() {
                        Some(r) if has_next => r.row(i + 1).as_ptr().cast(),
                        _ => std::ptr::null(),
                    },
                ];
                let ctx = RowCtx {
                    next,
                    bytes: 2 * h,
                    format: p.format,
                    rstd,
                    gs: gs.row(row),
                    tables: &tables,
                };
                match t.y_out.as_mut() {
                    Some(o) => quantize_row::<T, B, true>(&ctx, w32, o.row_mut(i), s, codes, q),
                    None => quantize_row::<T, B, false>(&ctx, w32, &mut [], s, codes, q),
                }
            }
        }

        /// y for one block's `B / 16` vectors, from `h` (f32) in `y`, in place (and to
        /// `y_out` if `YO`); returns the lane-wise max of `|y|`'s bits.
        fn block_y<T: Element, const B: usize, const YO: bool>(
            rv: __m512,
            w: &[f32],
            y: &mut [f32],
            y_out: &mut [T],
        ) -> __m512i {
            let mut m = _mm512_setzero_si512();
            for k in 0..B / 16 {
                let r = k * 16..k * 16 + 16;
                let hv = load_f32(y[r.clone()].try_into().unwrap());
                let yv = _mm512_mul_ps(_mm512_mul_ps(hv, rv), load_f32(w[r.clone()].try_into().unwrap()));
                store_f32((&mut y[r.clone()]).try_into().unwrap(), yv);
                if YO {
                    store_dt((&mut y_out[r]).try_into().unwrap(), round::<T>(yv).0);
                }
                m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(yv), _mm512_set1_epi32(0x7FFF_FFFF)));
            }
            m
        }

        /// E2M1 codes of one block's `y · inv`, packed into `q` (`B / 2` bytes).
        fn block_q<const B: usize>(iv: __m512, y: &[f32], q: &mut [u8], t: &E2m1Tables) {
            for k in 0..B / 16 {
                let yv = load_f32(y[k * 16..k * 16 + 16].try_into().unwrap());
                let packed = pack_nibbles(e2m1(_mm512_mul_ps(yv, iv), t));
                let dst: &mut [u8; 8] = (&mut q[k * 8..k * 8 + 8]).try_into().unwrap();
                // SAFETY: 8 bytes into an [u8; 8].
                unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast(), packed) };
            }
        }

        /// 64 codes (four vectors of u32 lanes, consecutive elements) packed into 32 bytes.
        fn pack_nibbles4(c: [__m512i; 4]) -> __m256i {
            // Lane k's dword: bytes c0[k] c1[k] c2[k] c3[k] (each code < 16).
            let u = _mm512_ternarylogic_epi32::<0xFE>(
                c[0],
                _mm512_slli_epi32::<8>(c[1]),
                _mm512_slli_epi32::<16>(c[2]),
            );
            let u = _mm512_or_si512(u, _mm512_slli_epi32::<24>(c[3]));
            // 64-bit lane j: the low dword's byte i becomes packed byte j of vector i.
            let u = _mm512_or_si512(u, _mm512_srli_epi64::<28>(u));
            // In each 128-bit lane (j = 2L, 2L + 1): word i = vector i's bytes j, j + 1.
            let pairs = _mm512_set4_epi32(
                -1,
                -1,
                0x0B03_0A02_u32 as i32,
                0x0901_0800_u32 as i32,
            );
            let w = _mm512_shuffle_epi8(u, pairs);
            // Word 8L + i → output word 4i + L.
            let idx = _mm512_set_epi16(
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // high half unused
                27, 19, 11, 3, 26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0,
            );
            _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, w))
        }

        /// Steps 4–8 of one row: 16 blocks at a time, the amaxes of all 16 reduced by one
        /// tree (`hmax16`) and their scales computed as one vector; the remaining
        /// `nb % 16` blocks one by one. `s.y` holds h (f32) on entry.
        fn quantize_row<T: Element, const B: usize, const YO: bool>(
            c: &RowCtx<'_>,
            w32: &[f32],
            y_out: &mut [T],
            s: &mut Scratch,
            codes: &mut [u8],
            q: &mut [u8],
        ) {
            let nb = w32.len() / B;
            let rv = _mm512_set1_ps(c.rstd);
            let (n16, sb) = (nb / 16 * 16, 16 * B);
            if nb < 16 {
                prefetch_share(c, 0, 1);
            }
            for g in 0..nb / 16 {
                prefetch_share(c, g, nb / 16);
                let r = g * sb..(g + 1) * sb;
                let (w, y) = (&w32[r.clone()], &mut s.y[r.clone()]);
                let yo: &mut [T] = if YO { &mut y_out[r] } else { &mut [] };
                let mut m = [_mm512_setzero_si512(); 16];
                for (slot, mv) in m.iter_mut().enumerate() {
                    let j = transpose4(slot) * B;
                    let yo_j: &mut [T] = if YO { &mut yo[j..j + B] } else { &mut [] };
                    *mv = block_y::<T, B, YO>(rv, &w[j..j + B], &mut y[j..j + B], yo_j);
                }
                let (cv, inv) = scales_x16(c.format, hmax16(&m), c.gs);
                let dst: &mut [u8; 16] = (&mut codes[g * 16..g * 16 + 16]).try_into().unwrap();
                // SAFETY: 16 bytes into an [u8; 16].
                unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(cv)) };
                let qg = &mut q[g * sb / 2..(g + 1) * sb / 2];
                // Four vectors (64 elements) at a time; vector v belongs to block v / (B / 16).
                for v4 in 0..B / 4 {
                    let cs: [__m512i; 4] = std::array::from_fn(|u| {
                        let v = 4 * v4 + u;
                        let iv = _mm512_permutexvar_ps(_mm512_set1_epi32((v / (B / 16)) as i32), inv);
                        let yv = load_f32(y[16 * v..16 * v + 16].try_into().unwrap());
                        e2m1(_mm512_mul_ps(yv, iv), c.tables)
                    });
                    let dst: &mut [u8; 32] = (&mut qg[32 * v4..32 * v4 + 32]).try_into().unwrap();
                    // SAFETY: 32 bytes into an [u8; 32].
                    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), pack_nibbles4(cs)) };
                }
            }
            for b in n16..nb {
                let r = b * B..(b + 1) * B;
                let yo: &mut [T] = if YO { &mut y_out[r.clone()] } else { &mut [] };
                let m = block_y::<T, B, YO>(rv, &w32[r.clone()], &mut s.y[r], yo);
                s.amax[b] = _mm512_reduce_max_epu32(m);
            }
            scales(c.format, &s.amax[n16..nb], c.gs, &mut codes[n16..], &mut s.inv[n16..nb]);
            for b in n16..nb {
                let iv = _mm512_set1_ps(s.inv[b]);
                block_q::<B>(iv, &s.y[b * B..(b + 1) * B], &mut q[b * B / 2..(b + 1) * B / 2], c.tables);
            }
        }
    }

    #[cfg(test)]
    pub(crate) mod lanes {
        //! The lane functions one value at a time, for the exhaustive unit tests
        //! (callers check `Isa::Avx512.supported()` first).
        use super::*;

        kernel! {
            pub(crate) fn e2m1_x16(v: &[f32; 16], out: &mut [u8; 16]) {
                // SAFETY: 16 bytes into an [u8; 16].
                let c = e2m1(load_f32(v), &e2m1_tables());
                unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(c)) }
            }
            pub(crate) fn pack_x16(c: &[u8; 16]) -> [u8; 8] {
                // SAFETY: 16 bytes from an [u8; 16]; 8 into an [u8; 8].
                let v = unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(c.as_ptr().cast())) };
                let mut out = [0u8; 8];
                unsafe { _mm_storel_epi64(out.as_mut_ptr().cast(), pack_nibbles(v)) };
                out
            }
            pub(crate) fn pack_x64(c: &[u8; 64]) -> [u8; 32] {
                // SAFETY: 4 × 16 bytes from an [u8; 64]; 32 into an [u8; 32].
                let v: [__m512i; 4] = std::array::from_fn(|k| unsafe {
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(c[16 * k..].as_ptr().cast()))
                });
                let mut out = [0u8; 32];
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), pack_nibbles4(v)) };
                out
            }
            pub(crate) fn round_x16<T: Element>(v: &[f32; 16], out: &mut [T; 16], back: &mut [f32; 16]) {
                let (b, f) = round::<T>(load_f32(v));
                store_dt(out, b);
                store_f32(back, f);
            }
            pub(crate) fn widen_x16<T: Element>(v: &[T; 16], out: &mut [f32; 16]) {
                store_f32(out, widen::<T>(load_dt(v)));
            }
            pub(crate) fn scales_x16(format: Fp4Format, amax: &[u32; 16], gs: f32, codes: &mut [u8; 16], inv: &mut [f32; 16]) {
                scales(format, amax, gs, codes, inv);
            }
        }
    }
}

pub(crate) mod avx2 {
    //! 8 f32 lanes; two (NVFP4) or four (MXFP4) vectors per block.
    use super::*;

    fp8_row_steps!(
        "avx2,f16c",
        8,
        _mm256_add_ps,
        _mm256_setzero_pd(),
        _mm256_storeu_pd
    );

    macro_rules! kernel {
        ($($item:item)*) => {$(
            #[inline]
            #[target_feature(enable = "avx2,f16c")]
            $item
        )*};
    }

    kernel! {
        fn load_dt<T: Element>(a: &[T; 8]) -> __m128i {
            // SAFETY: 8 two-byte elements are the 16 bytes read (unaligned load).
            unsafe { _mm_loadu_si128(a.as_ptr().cast()) }
        }

        fn store_dt<T: Element>(a: &mut [T; 8], v: __m128i) {
            // SAFETY: as load_dt; T is bf16 or f16, any 16 bits are a valid value.
            unsafe { _mm_storeu_si128(a.as_mut_ptr().cast(), v) }
        }

        fn load_f32(a: &[f32; 8]) -> __m256 {
            // SAFETY: 32 bytes in bounds by the type.
            unsafe { _mm256_loadu_ps(a.as_ptr()) }
        }

        fn store_f32(a: &mut [f32; 8], v: __m256) {
            // SAFETY: 32 bytes in bounds by the type.
            unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) }
        }

        fn set1(v: i32) -> __m256i {
            _mm256_set1_epi32(v)
        }

        /// Lanes of `a` where `mask` (all ones / zeros per 32-bit lane) is set, else `b`.
        fn select(mask: __m256i, a: __m256i, b: __m256i) -> __m256i {
            _mm256_blendv_epi8(b, a, mask)
        }

        fn is_nan(v: __m256) -> __m256i {
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
        }

        fn widen<T: Element>(v: __m128i) -> __m256 {
            if is_f16::<T>() {
                _mm256_cvtph_ps(v)
            } else {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
            }
        }

        fn round<T: Element>(s: __m256) -> (__m128i, __m256) {
            let nan = is_nan(s);
            if is_f16::<T>() {
                let ph = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s);
                let nan16 = _mm_packs_epi32(
                    _mm256_castsi256_si128(nan),
                    _mm256_extracti128_si256::<1>(nan),
                );
                let ph = _mm_blendv_epi8(ph, _mm_set1_epi16(0x7FFF), nan16);
                (ph, _mm256_cvtph_ps(ph))
            } else {
                let b = _mm256_castps_si256(s);
                let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), set1(1));
                let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(b, set1(0x7FFF)), lsb));
                let r = select(nan, set1(0x7FFF), r);
                (
                    _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r)),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(r)),
                )
            }
        }

        /// Adds the squares of `h`'s 8 lanes to two f64 accumulators of 4 lanes.
        fn add_squares(h: __m256, acc: &mut [__m256d; 2]) {
            let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(h));
            let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(h));
            acc[0] = _mm256_add_pd(acc[0], _mm256_mul_pd(lo, lo));
            acc[1] = _mm256_add_pd(acc[1], _mm256_mul_pd(hi, hi));
        }

        /// The 8 f64 lanes' sum: 1 + 2 rounded additions after the lanes' own.
        fn sum_lanes(acc: [__m256d; 2]) -> f64 {
            let mut l = [0f64; 4];
            // SAFETY: 32 bytes into an [f64; 4].
            unsafe { _mm256_storeu_pd(l.as_mut_ptr(), _mm256_add_pd(acc[0], acc[1])) };
            (l[0] + l[1]) + (l[2] + l[3])
        }


        fn e2m1(v: __m256) -> __m256i {
            let bits = _mm256_castps_si256(v);
            let abs = _mm256_and_si256(bits, set1(0x7FFF_FFFF));
            let a = _mm256_min_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(8.0));
            let ab = _mm256_castps_si256(a);
            let e = _mm256_max_epu32(_mm256_srli_epi32::<23>(ab), set1(127));
            let c = _mm256_slli_epi32::<23>(_mm256_add_epi32(e, set1(22)));
            let sum = _mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(c)));
            // a + C < 2C: the sum keeps C's exponent, so the grid steps above C are its
            // mantissa bits (the scalar code's `sum - C`), without a subtraction that
            // LLVM would fold with 2 (e - 127) into a slow vpmulld.
            let steps = _mm256_and_si256(sum, set1(0x7F_FFFF));
            let e2 = _mm256_sub_epi32(_mm256_slli_epi32::<1>(e), set1(254));
            let code = _mm256_min_epu32(_mm256_add_epi32(steps, e2), set1(7));
            let sign = _mm256_and_si256(_mm256_srli_epi32::<28>(bits), set1(8));
            select(is_nan(v), set1(7), _mm256_or_si256(code, sign))
        }

        /// 16 codes (u32 lanes of `c0`: elements 0..8, `c1`: 8..16) as 8 packed bytes.
        fn pack_nibbles(c0: __m256i, c1: __m256i) -> __m128i {
            let odd = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
            // Per 128-bit lane: [c0 pairs | c1 pairs] → bytes P0 P1 Q0 Q1 | P2 P3 Q2 Q3.
            let sums = _mm256_hadd_epi32(_mm256_sllv_epi32(c0, odd), _mm256_sllv_epi32(c1, odd));
            let ordered = _mm256_permutevar8x32_epi32(sums, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
            let lo = _mm256_castsi256_si128(ordered);
            let hi = _mm256_extracti128_si256::<1>(ordered);
            let w = _mm_packus_epi32(lo, hi);
            _mm_packus_epi16(w, w)
        }

        fn e4m3_scales(amax: __m256i, gs: f32) -> (__m256i, __m256) {
            let g = _mm256_set1_ps(gs);
            let s = _mm256_div_ps(_mm256_mul_ps(g, _mm256_castsi256_ps(amax)), _mm256_set1_ps(6.0));
            let bits = _mm256_castps_si256(s);
            let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), set1(0x80));
            let abs = _mm256_and_si256(bits, set1(0x7FFF_FFFF));
            let a = _mm256_castsi256_ps(abs);
            let reb = _mm256_sub_epi32(abs, set1((127 - 7) << 23));
            let odd = _mm256_and_si256(_mm256_srli_epi32::<20>(reb), set1(1));
            let rounded = _mm256_add_epi32(_mm256_add_epi32(reb, set1(0x7FFFF)), odd);
            let normal = _mm256_min_epu32(_mm256_srli_epi32::<20>(rounded), set1(0x7E));
            let sub = _mm256_cvttps_epi32(_mm256_round_ps::<RNE>(_mm256_mul_ps(a, _mm256_set1_ps(512.0))));
            // abs < 2^31 in every lane, so signed compares order it as unsigned.
            let code = select(_mm256_cmpgt_epi32(set1(0x3C80_0000), abs), sub, normal);
            let big = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(448.0)));
            let code = _mm256_or_si256(select(big, set1(0x7E), code), sign);
            let code = select(_mm256_cmpgt_epi32(abs, set1(0x7F80_0000)), set1(0x7F), code);
            let exp = _mm256_and_si256(_mm256_srli_epi32::<3>(code), set1(0xF));
            let mant = _mm256_and_si256(code, set1(7));
            let normal_d = _mm256_or_si256(
                _mm256_slli_epi32::<23>(_mm256_add_epi32(exp, set1(127 - 7))),
                _mm256_slli_epi32::<20>(mant),
            );
            let sub_d = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_set1_ps(1.0 / 512.0)));
            let mag = select(_mm256_cmpeq_epi32(exp, _mm256_setzero_si256()), sub_d, normal_d);
            let dnan = _mm256_cmpeq_epi32(_mm256_and_si256(code, set1(0x7F)), set1(0x7F));
            let mag = select(dnan, set1(0x7FC0_0000), mag);
            let dsign = _mm256_slli_epi32::<24>(_mm256_and_si256(code, set1(0x80)));
            let d = _mm256_castsi256_ps(_mm256_or_si256(mag, dsign));
            let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(d, _mm256_setzero_ps());
            let inv = _mm256_andnot_ps(zero, _mm256_div_ps(g, d));
            (code, inv)
        }

        fn ue8m0_scales(amax: __m256i) -> (__m256i, __m256) {
            let v = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(6.0));
            let bits = _mm256_castps_si256(v);
            let exp = _mm256_srli_epi32::<23>(bits);
            let mant = _mm256_and_si256(bits, set1(0x7F_FFFF));
            let zero = _mm256_setzero_si256();
            // exp + (mant != 0) = exp + 1 + (mant == 0 ? -1 : 0)
            let up = _mm256_add_epi32(_mm256_add_epi32(exp, set1(1)), _mm256_cmpeq_epi32(mant, zero));
            let normal = _mm256_min_epu32(up, set1(254));
            let subn = _mm256_and_si256(_mm256_cmpgt_epi32(mant, set1(0x40_0000)), set1(1));
            let code = select(_mm256_cmpeq_epi32(exp, zero), subn, normal);
            let zero_or_neg = _mm256_or_si256(_mm256_cmpeq_epi32(bits, zero), _mm256_cmpgt_epi32(zero, bits));
            let code = _mm256_andnot_si256(zero_or_neg, code);
            let nan = is_nan(v);
            let code = select(nan, set1(255), code);
            let inv = _mm256_slli_epi32::<23>(_mm256_sub_epi32(set1(254), code));
            let inv = select(_mm256_cmpeq_epi32(code, set1(254)), set1(1 << 22), inv);
            let inv = select(nan, set1(0x7FC0_0000), inv);
            (code, _mm256_castsi256_ps(inv))
        }

        fn scales(format: Fp4Format, amax: &[u32], gs: f32, codes: &mut [u8], inv: &mut [f32]) {
            let n = amax.len() / 8 * 8;
            for ((a, c), i) in arrays::<u32, 8>(amax)
                .zip(arrays_mut::<u8, 8>(codes))
                .zip(arrays_mut::<f32, 8>(inv))
            {
                // SAFETY: 32 bytes from an [u32; 8].
                let av = unsafe { _mm256_loadu_si256(a.as_ptr().cast()) };
                let (cv, iv) = match format.scale {
                    ScaleFormat::E4M3 => e4m3_scales(av, gs),
                    ScaleFormat::UE8M0 => ue8m0_scales(av),
                };
                // Codes ≤ 255: the saturating packs keep them.
                let w = _mm_packus_epi32(_mm256_castsi256_si128(cv), _mm256_extracti128_si256::<1>(cv));
                // SAFETY: 8 bytes into an [u8; 8], 32 into an [f32; 8].
                unsafe {
                    _mm_storel_epi64(c.as_mut_ptr().cast(), _mm_packus_epi16(w, w));
                    _mm256_storeu_ps(i.as_mut_ptr(), iv);
                }
            }
            scales_tail(format, &amax[n..], gs, &mut codes[n..], &mut inv[n..]);
        }

        fn hmax_epu32(v: __m256i) -> u32 {
            let m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
            let m = _mm_max_epu32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
            _mm_cvtsi128_si32(m) as u32
        }

        pub(in super::super) fn rows<T: Element, const B: usize>(
            p: &Problem,
            mut t: Task<'_, T>,
            x: &MatRef<'_, T>,
            w32: &[f32],
            gs: &GlobalScale<'_>,
            s: &mut Scratch,
        ) {
            let (h, nb) = (p.h, p.n_blocks());
            // 8 f64 lanes, each summing H/8 squares, then 3 levels.
            let depth = h / 8 + 3;
            for i in 0..t.rows {
                let row = t.first_row + i;
                let xr = x.row(row);
                let mut acc = [_mm256_setzero_pd(); 2];
                let hrow: &[T] = match t.residual.as_mut() {
                    Some(r) => {
                        let rr = r.row_mut(i);
                        for (xa, ra) in arrays::<T, 8>(xr).zip(arrays_mut::<T, 8>(rr)) {
                            let sum = _mm256_add_ps(widen::<T>(load_dt(xa)), widen::<T>(load_dt(ra)));
                            let (hb, hv) = round::<T>(sum);
                            store_dt(ra, hb);
                            add_squares(hv, &mut acc);
                        }
                        rr
                    }
                    None => {
                        for xa in arrays::<T, 8>(xr) {
                            add_squares(widen::<T>(load_dt(xa)), &mut acc);
                        }
                        xr
                    }
                };
                let rstd = finish_rstd(sum_lanes(acc), depth, hrow, p.eps);
                let rv = _mm256_set1_ps(rstd);
                let mut y_out = t.y_out.as_mut().map(|o| o.row_mut(i));
                let abs = set1(0x7FFF_FFFF);
                for (b, amax) in s.amax.iter_mut().enumerate() {
                    let mut m = _mm256_setzero_si256();
                    for k in 0..B / 8 {
                        let at = b * B + k * 8;
                        let hv = widen::<T>(load_dt(hrow[at..at + 8].try_into().unwrap()));
                        let wv = load_f32(w32[at..at + 8].try_into().unwrap());
                        let yv = _mm256_mul_ps(_mm256_mul_ps(hv, rv), wv);
                        store_f32((&mut s.y[at..at + 8]).try_into().unwrap(), yv);
                        if let Some(o) = y_out.as_deref_mut() {
                            store_dt((&mut o[at..at + 8]).try_into().unwrap(), round::<T>(yv).0);
                        }
                        m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(yv), abs));
                    }
                    *amax = hmax_epu32(m);
                }
                let codes = &mut t.row_major[i * nb..(i + 1) * nb];
                scales(p.format, &s.amax, gs.row(row), codes, &mut s.inv);
                let q = &mut t.y_fp4[i * h / 2..(i + 1) * h / 2];
                for (b, &inv) in s.inv.iter().enumerate() {
                    let iv = _mm256_set1_ps(inv);
                    for k in 0..B / 16 {
                        let at = b * B + k * 16;
                        let y0 = load_f32(s.y[at..at + 8].try_into().unwrap());
                        let y1 = load_f32(s.y[at + 8..at + 16].try_into().unwrap());
                        let packed = pack_nibbles(
                            e2m1(_mm256_mul_ps(y0, iv)),
                            e2m1(_mm256_mul_ps(y1, iv)),
                        );
                        let dst: &mut [u8; 8] = (&mut q[at / 2..at / 2 + 8]).try_into().unwrap();
                        // SAFETY: 8 bytes into an [u8; 8].
                        unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast(), packed) };
                    }
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) mod lanes {
        //! The lane functions for the exhaustive unit tests (callers check
        //! `Isa::Avx2.supported()` first).
        use super::*;

        kernel! {
            pub(crate) fn e2m1_x16(v: &[f32; 16], out: &mut [u8; 16]) {
                let c0 = e2m1(load_f32(v[..8].try_into().unwrap()));
                let c1 = e2m1(load_f32(v[8..].try_into().unwrap()));
                let w = _mm256_packus_epi32(c0, c1); // lanes: c0 0..4, c1 0..4, c0 4..8, c1 4..8
                let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(w);
                let b = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
                // SAFETY: 16 bytes into an [u8; 16].
                unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), b) }
            }
            pub(crate) fn pack_x16(c: &[u8; 16]) -> [u8; 8] {
                // SAFETY: 8 + 8 bytes from an [u8; 16]; 8 into an [u8; 8].
                let (c0, c1) = unsafe {
                    (
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(c.as_ptr().cast())),
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(c.as_ptr().add(8).cast())),
                    )
                };
                let mut out = [0u8; 8];
                unsafe { _mm_storel_epi64(out.as_mut_ptr().cast(), pack_nibbles(c0, c1)) };
                out
            }
            pub(crate) fn round_x16<T: Element>(v: &[f32; 16], out: &mut [T; 16], back: &mut [f32; 16]) {
                for k in 0..2 {
                    let (b, f) = round::<T>(load_f32(v[8 * k..8 * k + 8].try_into().unwrap()));
                    store_dt((&mut out[8 * k..8 * k + 8]).try_into().unwrap(), b);
                    store_f32((&mut back[8 * k..8 * k + 8]).try_into().unwrap(), f);
                }
            }
            pub(crate) fn widen_x16<T: Element>(v: &[T; 16], out: &mut [f32; 16]) {
                for k in 0..2 {
                    let f = widen::<T>(load_dt(v[8 * k..8 * k + 8].try_into().unwrap()));
                    store_f32((&mut out[8 * k..8 * k + 8]).try_into().unwrap(), f);
                }
            }
            pub(crate) fn scales_x16(format: Fp4Format, amax: &[u32; 16], gs: f32, codes: &mut [u8; 16], inv: &mut [f32; 16]) {
                scales(format, amax, gs, codes, inv);
            }
        }
    }
}
