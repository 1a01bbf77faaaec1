// The fused kernel (FP4_KIND 0), fp4norm_fused: residual add + RMSNorm + FP4 block
// quantisation of whole rows, bit-exact to SPEC.md §1. A group of FP4_G threads owns one
// row (or, with FP4_C > 1, its part of one row in each CTA of a cluster); pass 1 adds the
// residual and sums the squares, pass 2 normalises, computes block scales and writes the
// codes. The configuration macros are listed in common.cuh.

#include "common.cuh"

#if FP4_KIND != 0
#error "fused.cu is the FP4_KIND 0 kernel"
#endif

#define NVC (NV / FP4_C)                 // vectors per CTA (a row is split over FP4_C CTAs)
#define VPT ((NVC + FP4_G - 1) / FP4_G)  // vectors per thread
#define WARPS_PER_ROW (FP4_G / 32)

// Rows held in registers between the two passes; beyond that the second pass
// re-reads h from the residual (or x) it has just written (same thread, same addresses).
// Decided by the host (KernelConfig::holds_rows_in_registers, src/cuda/kernel/config.rs),
// whose L2 prefetch budget depends on it too: one rule, not two copies.
#define HOLD_IN_REGS FP4_HOLD_IN_REGS
#define PASS1_CHUNK (HOLD_IN_REGS ? VPT : 4)
// With few vectors per thread (the latency-bound shapes), the weight and the global
// scale are loaded with x and r, so that no second memory round trip follows the
// reduction; with more, registers are worth more than that latency.
#define PREFETCH_W (HOLD_IN_REGS && VPT <= 2)

// An even number of vectors per thread, blocks of two or more vectors: lanes l and l ^ 1
// hold the same blocks, so for each pair of vectors (k, k + 1) each lane computes one of
// the two block scales and they swap (pass 2): half the scale chains, for two shuffles per
// pair.
#define SHARED_SCALE (VPT % 2 == 0 && VPB >= 2)

// With several warps per row and no cluster, one warp computes the row's rstd for all.
#define RSTD_BY_ONE_WARP (WARPS_PER_ROW > 1 && FP4_C == 1)

// Kernel arguments (one struct, passed by value; the host mirrors it with #[repr(C)]).
struct Fp4NormParams {
    const u16* x;       // [m, x_stride]
    u16* r;             // [m, r_stride], updated in place
    const u16* w;       // [H]
    u8* q;              // [m, H/2] packed E2M1
    u8* sf_row_major;   // [m, NB]
    u8* sf_swizzled;    // [Mp * NK4]
    u16* y_out;         // [m, y_stride]
    const float* gs;    // [1] or [m]
    i64 m;
    i64 rows_total;     // m, or the layout's padded rows when their CTAs zero the padding
    i64 x_stride;       // elements
    i64 r_stride;
    i64 y_stride;
    float eps;
    unsigned int pf_rows;  // L2 prefetch distance in rows, 0 = none (launch_table.rs, l2_prefetch_rows)
#if defined(FP4_WBIAS) || defined(FP8_OUT) || defined(FP4_AR_RANKS)
    float weight_bias;     // nonzero: added to every weight (SPEC.md §8)
#endif
#if defined(FP8_OUT) || defined(FP4_AR_RANKS)
    float s_min;           // the f32 group scales' floor (SPEC.md §8), 0: none
    float static_scale;    // the per-tensor scale where it is not read from memory (FP4_GS 0)
#endif
#if defined(FP4_AR_RANKS)
    const u16* ar_x[8];    // the ranks' inputs, rank order, each [m, x_stride] (x is ar_x[0]);
                           // FP4_AR_PEER: the ranks' buffers as mapped here, [m, ar_stride]
#endif
#if defined(FP4_AR_PEER)
    u32* ar_signal[8];     // the ranks' signal pads as mapped here (u32 words, 0 between calls)
    i64 ar_stride;         // elements between rows of every rank's buffer
    unsigned int ar_rank;  // this rank
    unsigned int ar_copy;  // 1: x (this rank's input) is copied into ar_x[ar_rank] first
#endif
};

#if defined(FP4_AR_RANKS)
#if !FP4_RESIDUAL
#error "the all-reduce kernel writes the ranks' sum into the residual (pass 2 and the redo re-read h there)"
#endif
#if defined(FP4_AR_PEER)
// The ranks' buffers over peer access (symmetric memory): every rank runs the same grid, so
// CTA b of every rank covers the same rows. CTA b copies this rank's rows into its buffer,
// meets CTA b of every rank (ranks_barrier<true>), reads every rank's rows, and meets them
// again at its end (ranks_barrier<false>), so that no rank's next call overwrites a buffer
// that a peer still reads. A meeting is torch symmetric memory's block-pair signal: sender
// k sets word b * RANKS + k of each rank's pad from 0 to 1 (waiting for it to be 0, i.e. the
// last signal taken), the receiver takes it back from 1 to 0, so the pads are 0 after every
// call and CUDA graphs replay it unchanged. System scope: the peers are other GPUs.
// A peer that has not arrived after AR_TIMEOUT_NS (a rank that failed before its launch,
// or launched another call) traps the kernel: the process sees a launch failure instead of
// a GPU that waits forever.
#define AR_TIMEOUT_NS 30000000000ull
__device__ __forceinline__ void ar_wait_or_trap(u64& since) {
    u64 now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (since == 0) since = now;
    else if (now - since > AR_TIMEOUT_NS) __trap();
}
__device__ __forceinline__ void signal_put(u32* at) {
    u32 old;
    u64 since = 0;
    for (;;) {
        asm volatile("atom.release.sys.global.cas.b32 %0, [%1], 0, 1;" : "=r"(old) : "l"(at) : "memory");
        if (old == 0) break;
        ar_wait_or_trap(since);
    }
}
template <bool ACQUIRE>
__device__ __forceinline__ void signal_take(u32* at) {
    u32 old;
    u64 since = 0;
    for (;;) {
        if (ACQUIRE)
            asm volatile("atom.acquire.sys.global.cas.b32 %0, [%1], 1, 0;" : "=r"(old) : "l"(at) : "memory");
        else
            asm volatile("atom.relaxed.sys.global.cas.b32 %0, [%1], 1, 0;" : "=r"(old) : "l"(at) : "memory");
        if (old == 1) break;
        ar_wait_or_trap(since);
    }
}
// Every thread of the CTA calls it. ACQUIRE: the peers' rows written before their signals
// are visible to every thread after it (the CTA barrier after the acquiring takes); else the
// CTA's reads of the peers' rows are done before its signals (the CTA barrier before the
// releasing puts).
template <bool ACQUIRE>
__device__ __forceinline__ void ranks_barrier(const Fp4NormParams& p) {
    __syncthreads();
    if (threadIdx.x < FP4_AR_RANKS) {
        const u32 slot = blockIdx.x * FP4_AR_RANKS;
        signal_put(p.ar_signal[threadIdx.x] + slot + p.ar_rank);
        signal_take<ACQUIRE>(p.ar_signal[p.ar_rank] + slot + threadIdx.x);
    }
    if (ACQUIRE) __syncthreads();
}
// A peer's rows are written during this grid (by its CTA b): weak loads after the acquire,
// not the read-only path.
#define AR_LOAD(at, n) load_vec((at), (n))
#define AR_STRIDE p.ar_stride
#if defined(FP4_AR_TWO_SHOT)
// Two-shot: vector v (8 elements) of every row is summed by rank v mod RANKS alone (the
// reduce-scatter), which keeps that sum, rounded to dt, in place of its own input in its
// buffer; after a second meeting every rank reads each vector's sum from its owner (the
// all-gather) and runs the op. A rank reads 2·H elements of a row over peer access instead
// of RANKS·H; the op's outputs stay its own (each rank's residual is its own, SPEC.md §9).
#define AR_OWNER(v) ((unsigned int)(v) % FP4_AR_RANKS)
#endif
#else
#define AR_LOAD(at, n) load_vec_ro((at), (n))
#define AR_STRIDE p.x_stride
#endif

// x of vector v of a row for SPEC.md §9: the ranks' vectors summed in rank order, one f32
// rounding per addition, then one rounding to dt. All FP4_AR_RANKS loads are issued before
// the first addition.
__device__ __forceinline__ uint4 ar_sum_vec(const Fp4NormParams& p, i64 row, int v) {
    uint4 in[FP4_AR_RANKS];
#pragma unroll
    for (int k = 0; k < FP4_AR_RANKS; ++k) in[k] = AR_LOAD(p.ar_x[k] + row * AR_STRIDE + v * 8, VEC_N(v));
    float acc[8];
    unpack8(in[0], acc);
#pragma unroll
    for (int k = 1; k < FP4_AR_RANKS; ++k) {
        float t[8];
        unpack8(in[k], t);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], t[i]);
    }
    return make_uint4(f32x2_to_elem(acc[0], acc[1]), f32x2_to_elem(acc[2], acc[3]), f32x2_to_elem(acc[4], acc[5]),
                      f32x2_to_elem(acc[6], acc[7]));
}
#if defined(FP4_AR_TWO_SHOT)
// x of vector v: its owner's sum (ar_sum_vec there).
#define LOAD_X(row, v, xrow) AR_LOAD(p.ar_x[AR_OWNER(v)] + (row) * AR_STRIDE + (v) * 8, VEC_N(v))
#else
#define LOAD_X(row, v, xrow) ar_sum_vec(p, (row), (v))
#endif
#else
#define LOAD_X(row, v, xrow) load_vec_ro((xrow) + (v) * 8, VEC_N(v))
#endif

// rstd = RN32(1 / sqrt(ss / H + eps)), each step an IEEE f64 operation (SPEC.md §1.3).
__device__ __forceinline__ double rstd_f64(double ss, float eps) {
#if (FP4_H & (FP4_H - 1)) == 0
    // H a power of two: ss / H is an exact scaling (ss is far from the subnormal range).
    const double mean = __dadd_rn(__dmul_rn(ss, 1.0 / (double)FP4_H), (double)eps);
#else
    const double mean = __dadd_rn(__ddiv_rn(ss, (double)FP4_H), (double)eps);
#endif
    return __ddiv_rn(1.0, __dsqrt_rn(mean));
}

__device__ __forceinline__ float rstd_of(double ss, float eps) {
    return __double2float_rn(rstd_f64(ss, eps));
}

// SPEC.md §1.2's sum is read as the exact sum of the squares rounded once to f64 (the one
// reading under which "the summation order is free" holds: crates/fp4norm/src/sumsq.rs,
// which the CPU backends share). This kernel's f64 sum ss has at most SUM_DEPTH roundings
// on any square's path (the thread's chain, the warp butterfly, the row's warps, the
// cluster's CTAs), so the chain's f64 rstd on the exact sum lies within
// 0.52 SUM_DEPTH + 9 f64 ulps of t = rstd_f64(ss) (sumsq.rs, rstd_if_decided, proves it).
// Where t is farther than SUM_DEPTH + 16 ulps from an f32 rounding midpoint, both round to
// the same f32 and ss decides; otherwise (about 2 (SUM_DEPTH + 16) / 2^29 of rows, under
// 1e-6) the row takes the exact sum (exact_sum_redo). Zero, Inf and NaN sums are the
// same in every order; an f32-subnormal rstd (huge rows) always takes the exact sum.
//
// With the fast conversions (no FP4_LITERAL_CODECS), t comes from a shorter chain on a
// row's latency path: an f32 rsqrt seed refined by one second-order f64 step instead of the
// correctly rounded square root and division. The codec self-check proves the seed within
// 2^-22 of 1/sqrt on every f32 of [2^-120, 2^120]; the step then lands within
// FP4_RSTD_SEED_ULPS of rstd_f64(ss) (sumsq.rs, rstd_by_seed), and the margin grows by as
// much. Outside that range, and for the sums that skip the decision, the IEEE chain runs.
#define SUM_DEPTH (VPT * 8 + 5 + WARPS_PER_ROW + FP4_C)
__device__ __forceinline__ float rstd_checked(double ss, float eps, bool& undecided) {
#if defined(FP4_RSTD_SEED_ULPS)
    // ss / H + eps with one rounding (exactly rstd_f64's mean where H is a power of two).
    const double mean = __fma_rn(ss, 1.0 / (double)FP4_H, (double)eps);
    double t;
    if (ss > 0.0 && mean >= 0x1p-120 && mean <= 0x1p120) {
        float seed;
        asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(seed) : "f"(__double2float_rn(mean)));
        const double r0 = (double)seed;
        // r0 (1 - e)^(-1/2) to second order, e = 1 - mean r0^2 (r0^2 is exact in f64: r0
        // has 24 bits): r0 + r0 e (1/2 + 3e/8).
        const double e = __fma_rn(-mean, __dmul_rn(r0, r0), 1.0);
        t = __fma_rn(__dmul_rn(r0, e), __fma_rn(e, 0.375, 0.5), r0);
    } else {
        t = rstd_f64(ss, eps);
    }
    const long long margin = SUM_DEPTH + 16 + FP4_RSTD_SEED_ULPS;
#else
    const double t = rstd_f64(ss, eps);
    const long long margin = SUM_DEPTH + 16;
#endif
    const double inf = __longlong_as_double(0x7FF0000000000000ll);
    const bool exact_anyway = ss == 0.0 || !(ss < inf);  // 0, +Inf or NaN
    const long long residue = __double_as_longlong(t) & ((1ll << 29) - 1);
    const long long dist = residue > (1ll << 28) ? residue - (1ll << 28) : (1ll << 28) - residue;
    const double f32_normal_floor = __longlong_as_double((long long)(1023 - 125) << 52);  // 2^-125
    const bool decided = t >= f32_normal_floor && t < inf && dist > margin && !FP4_FORCE_EXACT_SUMSQ;
    undecided = !exact_anyway && !decided;
    return __double2float_rn(t);
}

// The exact sum of squares of a row (the rare rows rstd_checked leaves undecided, or every
// row under FP4_FORCE_EXACT_SUMSQ). A finite element is m 2^(e - BIAS) with m an integer of
// MANT_BITS + 1 bits at most and e its biased exponent (1 for subnormals), so its square is
// m^2 2^(2e - 2 BIAS): the row's threads add each m^2 into a shared-memory bucket per e
// (integer adds: exact and order-free), and one thread adds the buckets into a wide integer
// (u32 limbs, least significant first) and rounds that once to f64. crates/fp4norm/src/
// sumsq.rs does the same on the CPU (tested against Python's math.fsum).
#if FP4_F16
#define SQ_BUCKETS 32
#define SQ_EXP_SHIFT 10
#define SQ_FRAC_MASK 0x3FFu
#define SQ_BASE (-50)       // 2 x (15 + 10)
#define SQ_LIMBS 5          // 2 x 30 + 64 bits
typedef u64 sq_bucket_t;    // m^2 < 2^22
#define SQ_RED "red.shared.add.u64 [%0], %1;"
#define SQ_RED_ARG "l"
#define SQ_LD_TYPE "u64"
#else
#define SQ_BUCKETS 256
#define SQ_EXP_SHIFT 7
#define SQ_FRAC_MASK 0x7Fu
#define SQ_BASE (-268)      // 2 x (127 + 7)
#define SQ_LIMBS 19         // 2 x 254 + 64 bits
#if FP4_H < 65536
typedef u32 sq_bucket_t;    // m^2 < 2^16, fewer than 2^16 of them
#define SQ_RED "red.shared.add.u32 [%0], %1;"
#define SQ_RED_ARG "r"
#define SQ_LD_TYPE "u32"
#else
typedef u64 sq_bucket_t;
#define SQ_RED "red.shared.add.u64 [%0], %1;"
#define SQ_RED_ARG "l"
#define SQ_LD_TYPE "u64"
#endif
#endif

// Adds the squares of the eight elements of h to the buckets.
__device__ __forceinline__ void sq_buckets_add(sq_bucket_t* buckets, uint4 h) {
    const u32 w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 bits = (w[i / 2] >> (16 * (i % 2))) & 0x7FFFu;
        const u32 e = bits >> SQ_EXP_SHIFT;
        const u32 m = (bits & SQ_FRAC_MASK) | (e != 0 ? SQ_FRAC_MASK + 1 : 0u);
        if (m != 0 && e < SQ_BUCKETS - 1) {  // (Inf / NaN never get here: their sum decides)
            const sq_bucket_t sq = (sq_bucket_t)(m * m);
            asm volatile(SQ_RED :: "r"(smem_addr(&buckets[max(e, 1u)])), SQ_RED_ARG(sq) : "memory");
        }
    }
}

// Sum of buckets[e] 2^(2e + SQ_BASE), rounded once to f64 (ties to even). One thread;
// the wide integer lives in shared memory (acc, SQ_LIMBS words), not in local memory.
__device__ __forceinline__ double sq_buckets_to_f64(const sq_bucket_t* buckets, u32* acc) {
    for (int i = 0; i < SQ_LIMBS; ++i) acc[i] = 0;
    for (int e = 1; e < SQ_BUCKETS; ++e) {
        const u64 v = buckets[e];
        if (v == 0) continue;
        const int limb = (2 * e) / 32, off = (2 * e) % 32;
        // v << off as three 32-bit words, added with carry propagation.
        const u32 w0 = (u32)(v << off);
        const u32 w1 = (u32)(off ? v >> (32 - off) : v >> 32);
        const u32 w2 = (u32)(off ? v >> (64 - off) : 0);
        u64 t = (u64)acc[limb] + w0;
        acc[limb] = (u32)t;
        t = (u64)acc[limb + 1] + w1 + (t >> 32);
        acc[limb + 1] = (u32)t;
        t = (u64)acc[limb + 2] + w2 + (t >> 32);
        acc[limb + 2] = (u32)t;
        for (int i = limb + 3; (t >> 32) != 0 && i < SQ_LIMBS; ++i) {
            t = (u64)acc[i] + (t >> 32);
            acc[i] = (u32)t;
        }
    }
    int top = SQ_LIMBS - 1;
    while (top > 0 && acc[top] == 0) --top;
    if (acc[top] == 0) return 0.0;
    const int p = 32 * top + 31 - __clz(acc[top]);  // the top bit
    const auto bit = [&](int pos) -> u64 { return pos < 0 ? 0u : (acc[pos / 32] >> (pos % 32)) & 1u; };
    const auto pow2 = [](int k) { return __longlong_as_double((long long)(k + 1023) << 52); };
    if (p < 53) {
        const u64 v = (u64)acc[0] | ((u64)acc[1] << 32);
        return __dmul_rn(__ull2double_rn(v), pow2(SQ_BASE));  // exact
    }
    u64 mant = 0;
    for (int b = p; b >= p - 52; --b) mant = (mant << 1) | bit(b);
    const bool round = bit(p - 53) != 0;
    bool sticky = false;
    for (int b = 0; b < p - 53; ++b) sticky |= bit(b) != 0;
    int exp = p - 52 + SQ_BASE;
    if (round && (sticky || (mant & 1))) {
        if (++mant == (1ull << 53)) {
            mant >>= 1;
            ++exp;
        }
    }
    return __dmul_rn(__ull2double_rn(mant), pow2(exp));  // exact: 53 bits times a power of two
}

// ---------------------------------------------------------------------------
// The kernel's passes. Thread t of a row's group handles 8-element vectors t, t+G, t+2G,
// ... so every warp access is contiguous. The vectors of one scale block sit in VPB
// neighbouring lanes, which combine their block maximum with one or two shuffles.

// Pass 2 of one 8-element vector, part 1: y = RN32(RN32(h rstd) w) (and y_out), and the
// maximum of |y| over the vector's scale block (the block's VPB lanes combine theirs by
// shuffles, so every lane of the warp must call this). Lanes past the row get y = 0.
__device__ __forceinline__ void normalise_vector(const Fp4NormParams& p, i64 row, int v, bool in_row, uint4 h,
                                                 uint4 w, float rstd, float (&y)[8], float& amax) {
    amax = 0.0f;
    if (in_row) {
        float hf[8], wf[8];
        unpack8(h, hf);
        unpack8(w, wf);
#if defined(FP4_WBIAS)
#pragma unroll
        for (int i = 0; i < 8; ++i) wf[i] = __fadd_rn(wf[i], p.weight_bias);  // w' = RN32(w + bias)
#endif
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            y[i] = __fmul_rn(__fmul_rn(hf[i], rstd), wf[i]);
            amax = fmax_nan(amax, fabsf(y[i]));
        }
#if FP4_Y_OUT
        uint4 yo;
        yo.x = f32x2_to_elem(y[0], y[1]);
        yo.y = f32x2_to_elem(y[2], y[3]);
        yo.z = f32x2_to_elem(y[4], y[5]);
        yo.w = f32x2_to_elem(y[6], y[7]);
        store_vec(p.y_out + row * p.y_stride + v * 8, yo);
#endif
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = 0.0f;
    }
#pragma unroll
    for (int o = 1; o < VPB; o <<= 1) amax = fmax_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
}

// Pass 2 of one vector, part 2: its E2M1 codes and, from the block's first lane, the block's
// scale code(s), at q_at, sf_at and sw_at (pass2_row computes them). Every lane of the warp
// calls it (the swizzled word is gathered by shuffles).
__device__ __forceinline__ void emit_vector(const Fp4NormParams& p, i64 row, int v, bool in_row, const float (&y)[8],
                                            float amax, u32 code, float inv, u8* q_at, u8* sf_at, u8* sw_at) {
#if FP4_SWIZZLED && !FP4_SWZ_SPLIT
    // Four consecutive blocks are four consecutive swizzled bytes: the lanes holding them
    // (VPB apart, in one warp) hand their codes to the first, which writes one 32-bit word:
    // two shuffles, pairs then pairs of pairs. Lanes past the row give 0: the column padding.
    u32 word = in_row ? code : 0u;
    word |= __shfl_down_sync(0xFFFFFFFFu, word, VPB) << 8;        // blocks b, b + 1
    word |= __shfl_down_sync(0xFFFFFFFFu, word, 2 * VPB) << 16;   // and b + 2, b + 3
#endif
    if (!in_row) return;
    store_q(q_at, e2m1_pack8(y, inv, amax));
    if (v % VPB == 0) {
        const int b = v / VPB;
#if FP4_ROW_MAJOR && FP4_SWIZZLED && FP4_SWZ_SPLIT
        store_u8_keep_in_l2(sf_at, code);  // the pass reads it
#elif FP4_ROW_MAJOR
        *sf_at = (u8)code;
#endif
#if FP4_SWIZZLED && FP4_SWZ_SPLIT && !FP4_ROW_MAJOR
        store_u8_keep_in_l2(p.sf_swizzled + swizzle_stage_offset(row, b), code);
#elif FP4_SWIZZLED && !FP4_SWZ_SPLIT
        if (b % 4 == 0) store_sf4(sw_at, word);
#endif
    }
}

// h = RNdt(x + r) (written back to r) for vector v; adds its squares to ss.
__device__ __forceinline__ uint4 residual_add(const Fp4NormParams& p, i64 row, int v, uint4 x, uint4 r, double& ss) {
#if FP4_RESIDUAL
    uint4 h;
    h.x = add_pair(x.x, r.x);
    h.y = add_pair(x.y, r.y);
    h.z = add_pair(x.z, r.z);
    h.w = add_pair(x.w, r.w);
    // Stored right away: nothing later waits for it (the cluster exchange has no GPU-scope
    // fence, which would wait for these stores: see fp4norm_fused).
    store_vec(p.r + row * p.r_stride + v * 8, h, VEC_N(v));
#else
    const uint4 h = x;
#endif
    float hf[8];
    unpack8(h, hf);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const double d = (double)hf[i];
        ss = __fma_rn(d, d, ss);  // the square is exact in f64, so fma == mul + add
    }
    return h;
}

// Row `row` of h after pass 1: the residual it was written back to, or x without one.
__device__ __forceinline__ const u16* h_row(const Fp4NormParams& p, i64 row) {
    return FP4_RESIDUAL ? (const u16*)(p.r + row * p.r_stride) : p.x + row * p.x_stride;
}

#if !defined(FP8_OUT)
// Pass 2 of one row: y, block scales, E2M1 codes, from rstd. FROM_MEMORY: h and w
// re-read from memory (the redo of a row whose exact sum of squares changed rstd);
// otherwise as pass 1 left them (hv, wv: registers once inlined, constant indices).
template <bool FROM_MEMORY>
__device__ __forceinline__ void pass2_row(const Fp4NormParams& p, i64 row, int lane, int v0, float rstd, float gs,
                                          const uint4* hv, const uint4* wv) {

    // h as held in registers, or re-read from the residual (or x) this thread wrote in
    // pass 1; w as prefetched, or loaded.
    const u16* hrow = h_row(p, row);
    // Where this lane's stores go: its first vector's code word, scale byte and swizzled
    // scale word (the last two used by lanes whose vector starts a block, a 4-block group),
    // computed once per row; vector k's are a constant offset further (G is a multiple of
    // 32, so k G vectors are k G / VPB whole blocks and k G / (4 VPB) whole 512-byte
    // swizzled groups). Each pointer goes through an empty asm so that ptxas keeps it in
    // registers: otherwise it recomputes the 64-bit row and lane arithmetic at every store
    // after the row's barrier, where pass 2 is issue-bound.
    u8* q_lane = p.q + row * (FP4_H / 2) + (v0 + lane) * 4;
    asm volatile("" : "+l"(q_lane));
#if FP4_ROW_MAJOR
    u8* sf_lane = p.sf_row_major + row * NB + (v0 + lane) / VPB;
    asm volatile("" : "+l"(sf_lane));
#define SF_AT(k) (sf_lane + (k) * (FP4_G / VPB))
#else
#define SF_AT(k) nullptr
#endif
#if FP4_SWIZZLED && !FP4_SWZ_SPLIT
    u8* sw_lane = p.sf_swizzled + swizzled_offset(row, ((v0 + lane) / VPB) & ~3);
    asm volatile("" : "+l"(sw_lane));
#define SW_AT(k) (sw_lane + (k) * (FP4_G / (4 * VPB)) * 512)
#else
#define SW_AT(k) nullptr
#endif
#define Q_AT(k) (q_lane + (k) * FP4_G * 4)
#define PASS2_H(k, v) ((HOLD_IN_REGS && !FROM_MEMORY) ? hv[k] : load_vec(hrow + (v) * 8))
#define PASS2_W(k, v) ((PREFETCH_W && !FROM_MEMORY) ? wv[k] : load_weight(p.w + (v) * 8))
    // Pass 2: y, block scales, E2M1 codes. With SHARED_SCALE, the y and block maxima
    // of both vectors come first, then each lane computes one of its pair's two
    // block scales; otherwise vector by vector (y of one vector live at a time).
    // The two loops repeat the few lines that load a vector's h and w on purpose: folding
    // them into one lambda changes the generated code of many specialisations.
    if constexpr (SHARED_SCALE && !FROM_MEMORY) {  // (the redo goes vector by vector: fewer registers)
#pragma unroll
    for (int k0 = 0; k0 < VPT; k0 += 2) {
        float y[2][8], amax[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int k = k0 + j;
            const int v = v0 + lane + k * FP4_G;
            const bool in_row = lane + k * FP4_G < NVC;  // lanes past the part still join the shuffles
            uint4 h = make_uint4(0, 0, 0, 0), w = h;
            if (in_row) {
                h = PASS2_H(k, v);
                w = PASS2_W(k, v);
            }
            normalise_vector(p, row, v, in_row, h, w, rstd, y[j], amax[j]);
        }
        u32 code[2];
        float inv[2];
        {
            // Lanes l and l ^ 1 hold the same two blocks (vectors k0 and k0 + 1):
            // each computes one block's scale and they swap the results.
            const bool odd = (lane & 1) != 0;
            u32 mine_code;
            float mine_inv;
            block_scale(odd ? amax[1] : amax[0], gs, mine_code, mine_inv);
            const u32 other_code = __shfl_xor_sync(0xFFFFFFFFu, mine_code, 1);
            const float other_inv = __shfl_xor_sync(0xFFFFFFFFu, mine_inv, 1);
            code[0] = odd ? other_code : mine_code;
            code[1] = odd ? mine_code : other_code;
            inv[0] = odd ? other_inv : mine_inv;
            inv[1] = odd ? mine_inv : other_inv;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
            emit_vector(p, row, v0 + lane + (k0 + j) * FP4_G, lane + (k0 + j) * FP4_G < NVC, y[j], amax[j], code[j], inv[j],
                        Q_AT(k0 + j), SF_AT(k0 + j), SW_AT(k0 + j));
    }
    } else {
#pragma unroll (FROM_MEMORY ? 1 : 1024)  // the redo: one vector at a time
    for (int k = 0; k < VPT; ++k) {
        const int v = v0 + lane + k * FP4_G;
        const bool in_row = lane + k * FP4_G < NVC;  // lanes past the part still join the shuffles
        uint4 h = make_uint4(0, 0, 0, 0), w = h;
        if (in_row) {
            h = PASS2_H(k, v);
            w = PASS2_W(k, v);
        }
        float y[8], amax;
        normalise_vector(p, row, v, in_row, h, w, rstd, y, amax);
        u32 code;
        float inv;
        block_scale(amax, gs, code, inv);
        emit_vector(p, row, v, in_row, y, amax, code, inv, Q_AT(k), SF_AT(k), SW_AT(k));
    }
    }
#undef PASS2_H
#undef PASS2_W
#undef Q_AT
#undef SF_AT
#undef SW_AT
}

#else  // FP8_OUT: pass 2 writes FP8 codes (SPEC.md §8)

#if FP8_E5M2
#define FP8_MAX 57344.0f
#else
#define FP8_MAX 448.0f
#endif
#if defined(FP4_LITERAL_CODECS)
#define FP8_FAST false
#else
#define FP8_FAST true
#endif
#if FP8_TAIL && !(FP8_SCALING == 0 || FP8_PER_TOKEN)
#error "a partial last vector only in per-tensor and per-token rows (groups are whole vectors)"
#endif
#if FP8_PER_TOKEN && WARPS_PER_ROW > 1 && FP4_R > 15
#error "per-token FP8 scales take one named barrier per row: at most 15 rows of several warps per CTA"
#endif

// y = RN32(RN32(h rstd) w') for one vector (and y_out; 0 past the row), and max |y|
// (NaN-propagating) over it.
__device__ __forceinline__ float normalise8(const Fp4NormParams& p, i64 row, int v, bool in_row, uint4 h, uint4 w,
                                            float rstd, float (&y)[8], bool store_y) {
    float amax = 0.0f;
    if (!in_row) {
#pragma unroll
        for (int i = 0; i < 8; ++i) y[i] = 0.0f;
        return amax;
    }
    float hf[8], wf[8];
    unpack8(h, hf);
    unpack8(w, wf);
#if defined(FP4_WBIAS)
#pragma unroll
    for (int i = 0; i < 8; ++i) wf[i] = __fadd_rn(wf[i], p.weight_bias);  // w' = RN32(w + bias)
#endif
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        y[i] = __fmul_rn(__fmul_rn(hf[i], rstd), wf[i]);
        amax = fmax_nan(amax, fabsf(y[i]));
    }
#if FP4_Y_OUT
    if (store_y) {
        uint4 yo;
        yo.x = f32x2_to_elem(y[0], y[1]);
        yo.y = f32x2_to_elem(y[2], y[3]);
        yo.z = f32x2_to_elem(y[4], y[5]);
        yo.w = f32x2_to_elem(y[6], y[7]);
        store_vec(p.y_out + row * p.y_stride + v * 8, yo, VEC_N(v));
    }
#endif
    return amax;
}

// Eight codes FP8(RN32(y inv)), byte i = element i. A product is NaN only where y is NaN,
// inv is NaN, or one of them is infinite and the other 0; where the caller knows none of
// that can happen (a finite group amax and a finite inv) the NaN fix-up is skipped.
__device__ __forceinline__ uint2 fp8_encode8(const float (&y)[8], float inv) {
    float q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __fmul_rn(y[i], inv);
    u32 c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = fp8x2_encode<FP8_E5M2, FP8_FAST>(q[2 * j], q[2 * j + 1]);
    return make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
}

// The codes of a vector of n elements (VEC_N).
__device__ __forceinline__ void store_q8(u8* at, uint2 v, int n = 8) {
#if FP4_VEC_ALIGNED
    asm volatile("st.global.v2.u32 [%0], {%1,%2};" :: "l"(at), "r"(v.x), "r"(v.y) : "memory");
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (i < n) at[i] = (u8)(v.x >> (8 * i));
        if (4 + i < n) at[4 + i] = (u8)(v.y >> (8 * i));
    }
#endif
}

// A dynamic scale from its group's amax (SPEC.md §8): the code or f32 bits written, and inv.
__device__ __forceinline__ void fp8_group_scale(const Fp4NormParams& p, float amax, u32& written, float& inv) {
#if FP8_SCALING == 1
    float s = __fdiv_rn(amax, FP8_MAX);
    if (s < p.s_min) s = p.s_min;  // (a NaN s stays NaN)
    inv = (s == 0.0f) ? 0.0f : __fdiv_rn(1.0f, s);
    written = (s != s) ? 0x7FFFFFFFu : __float_as_uint(s);
#else
    // The UE8M0 code from amax's bits (FP8_MAX = 1.75 2^8 or 1.75 2^15), no division
    // routine on the path to the codes; the literal codecs divide.
    written = FP8_FAST ? ue8m0_code_of_quotient<FP8_E5M2 ? 15 : 8, 0x600000u>(amax)
                       : ue8m0_ceil_code(__fdiv_rn(amax, FP8_MAX));
    inv = ue8m0_inverse(written);
#endif
}

#if defined(FP8_COL_RED)
#if !FP8_COL_MAJOR || defined(FP8_COL_SPLIT) || !FP4_VEC_ALIGNED || FP8_PER_TOKEN || FP8_SCALING == 0
#error "FP8_COL_RED: column-major group scales written directly, aligned buffers"
#endif
// Column-major scales written as one reduction each (launch_table.rs,
// column_scales_reduce_wanted): the scale's old bytes, loaded at the kernel's start off
// the row's path, are replaced by adding (new - old) to its aligned 32-bit word. The L2
// merges reductions from the rows that share a sector, arriving at once, where partial
// stores wait on each other. Exact: no other thread writes the scale, and the sum leaves
// the word's other bytes (other rows' UE8M0 codes, which change the same way) alone. Every
// access to such a word is a strong 32-bit operation, so none races.
__device__ __forceinline__ u32* col_scale_word(const Fp4NormParams& p, i64 row, int g, u32& shift) {
    const i64 at = (i64)g * ((p.m + 3) & ~3ll) + row;
#if FP8_SCALING == 1
    shift = 0;
    return reinterpret_cast<u32*>(p.sf_row_major) + at;
#else
    const u64 b = (u64)(p.sf_row_major + at);
    shift = 8 * (u32)(b & 3);
    return reinterpret_cast<u32*>(b & ~(u64)3);
#endif
}
__device__ __forceinline__ u32 load_old_scale(const Fp4NormParams& p, i64 row, int g) {
    u32 shift, v;
    const u32* a = col_scale_word(p, row, g, shift);
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return FP8_SCALING == 1 ? v : (v >> shift) & 0xFFu;
}
__device__ __forceinline__ void reduce_scale(const Fp4NormParams& p, i64 row, int g, u32 written, u32 old) {
    u32 shift;
    u32* a = col_scale_word(p, row, g, shift);
    const u32 d = (written - old) << shift;
#if defined(FP8_COL_KEEP)
    asm volatile("red.relaxed.gpu.global.add.L2::cache_hint.u32 [%0], %1, %2;" :: "l"(a), "r"(d), "l"(l2_evict_last_policy()) : "memory");
#else
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(a), "r"(d) : "memory");
#endif
}
#endif

// Scale (row, g) at its place in a row-major or column-major layout.
__device__ __forceinline__ void store_group_scale(const Fp4NormParams& p, i64 row, int g, u32 written) {
#if FP8_COL_MAJOR
    const i64 mp4 = (p.m + 3) & ~3ll;
#if defined(FP8_COL_PACKED)
    // Four UE8M0 codes to a 32-bit word: code (row, g) is byte g % 4 of word (g / 4) Mp4 + row.
    i64 at = 4 * ((i64)(g >> 2) * mp4 + row) + (g & 3);
#else
    i64 at = (i64)g * mp4 + row;
#endif
#if defined(FP8_COL_SPLIT)
    // Rows of whole 8-row tiles go to their tile's staging order (column_scales.cu puts
    // them in place); the last rows of an M not a multiple of 8 are written in place.
    static_assert(FP8_SCALING == 1 && NB % COL_TILE_G == 0, "FP8_COL_SPLIT: f32 scales, whole tiles");
    if (row < (p.m & ~7ll))
        at = (i64)(g - g % COL_TILE_G) * mp4 + (row & ~7ll) + col_staged_offset((int)(row & 7), g % COL_TILE_G, mp4);
#endif
#else
    const i64 at = row * NB + g;
#endif
#if defined(FP8_COL_RED) && FP8_SCALING != 1
    // (The padding rows and the exact-sum redo: a UE8M0 code shares its word with other
    // rows' reductions.)
    reduce_scale(p, row, g, written, load_old_scale(p, row, g));
    return;
#endif
#if defined(FP8_COL_KEEP) && FP8_SCALING == 1
    // Kept in L2 until the eight rows of its sector are in (launch_table.rs,
    // column_scales_keep_wanted).
    store_u32_keep_in_l2(reinterpret_cast<u32*>(p.sf_row_major) + at, written);
#elif defined(FP8_COL_KEEP)
    store_u8_keep_in_l2(p.sf_row_major + at, written);
#elif FP8_SCALING == 1
    reinterpret_cast<u32*>(p.sf_row_major)[at] = written;
#else
    p.sf_row_major[at] = (u8)written;
#endif
}

#if defined(FP8_COL_PACKED)
#if FP8_SCALING != 2 || FP8_PER_TOKEN || defined(FP8_COL_SPLIT) || defined(FP8_COL_RED)
#error "FP8_COL_PACKED: UE8M0 group scales written directly"
#endif
// Words of the packed layout: groups 4j .. 4j + 3 of a row gathered by two shuffles (their
// lanes are VPB apart in one warp where 4 VPB <= 32, and the buffer is 4-byte aligned), one
// 32-bit store from the first; else (groups of 128) a byte per group.
#define FP8_PACK_WORDS (VPB <= 8 && FP4_VEC_ALIGNED)
__device__ __forceinline__ void store_packed_word(const Fp4NormParams& p, i64 row, int j, u32 word) {
    u32* at = reinterpret_cast<u32*>(p.sf_row_major) + (i64)j * ((p.m + 3) & ~3ll) + row;
#if defined(FP8_COL_KEEP)
    store_u32_keep_in_l2(at, word);
#else
    *at = word;
#endif
}
// The bytes of groups NB .. 4 ceil(NB / 4) in the row's last word: 0, from the lane that
// writes group NB - 1 (byte stores only; a gathered word carries them).
__device__ __forceinline__ void zero_packed_tail(const Fp4NormParams& p, i64 row) {
#pragma unroll
    for (int g = NB; g % 4 != 0; ++g) store_group_scale(p, row, g, 0u);
}
#endif

#if FP8_PER_TOKEN
// A barrier of the threads of row `group` of the CTA: the CTA's barrier where the CTA is
// one row, else named barrier 1 + group (rows past M skip pass 2, so not __syncthreads).
// Each id is an immediate: an id in a register makes ptxas reserve all 16 of the CTA's
// barriers, which caps an SM at four resident CTAs.
__device__ __forceinline__ void row_barrier(int group) {
#if FP4_R == 1
    __syncthreads();
#else
#define ROW_BARRIER(i) \
    if ((i) < FP4_R && group == (i)) asm volatile("bar.sync %0, %1;" :: "n"((i) + 1), "n"(FP4_G) : "memory");
    ROW_BARRIER(0) ROW_BARRIER(1) ROW_BARRIER(2) ROW_BARRIER(3) ROW_BARRIER(4)
    ROW_BARRIER(5) ROW_BARRIER(6) ROW_BARRIER(7) ROW_BARRIER(8) ROW_BARRIER(9)
    ROW_BARRIER(10) ROW_BARRIER(11) ROW_BARRIER(12) ROW_BARRIER(13) ROW_BARRIER(14)
#undef ROW_BARRIER
#endif
}

// The maximum over the row's FP4_G threads (every one calls it; FP4_G is whole warps):
// one redux.sync per warp, then the row's warps through shared memory and the row's
// barrier. v is a maximum of |y| by fmax_nan, so +0 or more, or the canonical NaN
// 0x7FFFFFFF (sign bit clear): such bits order as u32 the way the values do, NaN above
// +Inf, and the integer maximum is max.NaN's. One instruction instead of five
// shuffle-and-max steps on the row's critical path at decode sizes.
__device__ __forceinline__ float row_max(float v, int lane, int group) {
    u32 bits;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(bits) : "r"(__float_as_uint(v)));
    v = __uint_as_float(bits);
#if WARPS_PER_ROW > 1
    // (Used once per row; the exact-sum redo that calls pass 2 again follows CTA barriers.)
    __shared__ float warp_max[FP4_R][WARPS_PER_ROW];
    if ((lane & 31) == 0) warp_max[group][lane >> 5] = v;
    row_barrier(group);
    v = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS_PER_ROW; ++i) v = fmax_nan(v, warp_max[group][i]);
#endif
    return v;
}

#if FP4_C > 1
// A per-token row split over a cluster: each CTA pushes its part's amax into slot `rank`
// of every CTA with st.async, which completes bytes on the receiver's fp8_amax_bar (set up
// with the cluster's start, beside the sum-of-squares barrier, for FP4_C parts); each then
// waits for its FP4_C slots. The same one-way exchange as the row's sum of squares, with
// the same exit rule (a CTA leaves only after every part addressed to it has landed).
__shared__ __align__(8) u64 fp8_amax_bar;
__shared__ float fp8_amax_parts[FP4_C];

// The maximum over the cluster's CTAs of v (the same in every thread of a CTA). REDO: the
// rare exact-sum redo, where every CTA of the cluster is here again and the barrier above
// is spent: the parts go through each CTA's own slot and two cluster barriers.
template <bool REDO>
__device__ __forceinline__ float cluster_max(float v) {
    u32 rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (!REDO) {
        if (threadIdx.x < FP4_C) {
            u32 slot, bar;
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"(smem_addr(&fp8_amax_parts[rank])), "r"(threadIdx.x));
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_addr(&fp8_amax_bar)), "r"(threadIdx.x));
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                         :: "r"(slot), "r"(__float_as_uint(v)), "r"(bar) : "memory");
        }
        u32 done = 0;
        while (!done) {
            asm volatile("{ .reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
                         "selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(smem_addr(&fp8_amax_bar)) : "memory");
        }
    } else {
        if (threadIdx.x == 0) fp8_amax_parts[rank] = v;
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        for (u32 r = 0; r < FP4_C; ++r) {
            if (r == rank) continue;
            u32 remote;
            float part;
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(&fp8_amax_parts[r])), "r"(r));
            asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(part) : "r"(remote) : "memory");
            v = fmax_nan(v, part);
        }
        // No CTA leaves (or writes its slot again) while a peer still reads it.
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        return v;
    }
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < FP4_C; ++r) m = fmax_nan(m, fp8_amax_parts[r]);
    return m;
}
#endif
#endif

// Pass 2 of one row for FP8: y, the scale(s), the codes. Arguments as the FP4 pass2_row's,
// and old_scale: FP8_COL_RED's old scale bytes, one per vector that starts a group.
template <bool FROM_MEMORY>
__device__ __forceinline__ void pass2_row(const Fp4NormParams& p, i64 row, int lane, int v0, float rstd, float gs,
                                          const uint4* hv, const uint4* wv, const u32* old_scale = nullptr) {
    const u16* hrow = h_row(p, row);
    u8* q_lane = p.q + row * (i64)FP4_H + (v0 + lane) * 8;
    asm volatile("" : "+l"(q_lane));
#define Q_AT(k) (q_lane + (k) * FP4_G * 8)
#define PASS2_H(k, v) ((HOLD_IN_REGS && !FROM_MEMORY) ? hv[k] : load_vec(hrow + (v) * 8, VEC_N(v)))
#define PASS2_W(k, v) ((PREFETCH_W && !FROM_MEMORY) ? wv[k] : load_weight(p.w + (v) * 8, VEC_N(v)))
#if FP8_SCALING == 0
    // One static scale: inv = RN32(1 / s) (gs carries s, read from memory or the parameter).
    const float s = FP4_GS == 1 ? gs : p.static_scale;
    const float inv = __fdiv_rn(1.0f, s);
#pragma unroll (FROM_MEMORY ? 1 : 1024)
    for (int k = 0; k < VPT; ++k) {
        const int v = v0 + lane + k * FP4_G;
        if (lane + k * FP4_G >= NVC) continue;
        float y[8];
        normalise8(p, row, v, true, PASS2_H(k, v), PASS2_W(k, v), rstd, y, true);
        store_q8(Q_AT(k), fp8_encode8(y, inv), VEC_N(v));
    }
#elif FP8_PER_TOKEN
    // The row's amax first (y_out written on the way), then y again and the codes: y is a
    // pure function of h, rstd and w, so recomputing it gives the same values.
    float amax = 0.0f;
#pragma unroll (FROM_MEMORY ? 1 : 1024)
    for (int k = 0; k < VPT; ++k) {
        const int v = v0 + lane + k * FP4_G;
        if (lane + k * FP4_G >= NVC) continue;
        float y[8];
        amax = fmax_nan(amax, normalise8(p, row, v, true, PASS2_H(k, v), PASS2_W(k, v), rstd, y, true));
    }
    amax = row_max(amax, lane, threadIdx.x / FP4_G);
#if FP4_C > 1
    amax = cluster_max<FROM_MEMORY>(amax);
#endif
    u32 written;
    float inv;
    fp8_group_scale(p, amax, written, inv);
    if (lane == 0 && v0 == 0) store_group_scale(p, row, 0, written);
#pragma unroll (FROM_MEMORY ? 1 : 1024)
    for (int k = 0; k < VPT; ++k) {
        const int v = v0 + lane + k * FP4_G;
        if (lane + k * FP4_G >= NVC) continue;
        float y[8];
        normalise8(p, row, v, true, PASS2_H(k, v), PASS2_W(k, v), rstd, y, false);
        store_q8(Q_AT(k), fp8_encode8(y, inv), VEC_N(v));
    }
#else
    // Groups of VPB vectors in neighbouring lanes: their amax by shuffles, the group's
    // first lane writes its scale (MXFP8: four groups' codes gathered into one word, as
    // the FP4 op's swizzled write).
#if FP4_SWIZZLED
    u8* sw_lane = p.sf_swizzled + swizzled_offset(row, ((v0 + lane) / VPB) & ~3);
    asm volatile("" : "+l"(sw_lane));
#endif
#pragma unroll (FROM_MEMORY ? 1 : 1024)
    for (int k = 0; k < VPT; ++k) {
        const int v = v0 + lane + k * FP4_G;
        const bool in_row = lane + k * FP4_G < NVC;  // lanes past the part still join the shuffles
        uint4 h = make_uint4(0, 0, 0, 0), w = h;
        if (in_row) {
            h = PASS2_H(k, v);
            w = PASS2_W(k, v);
        }
        float y[8];
        float amax = normalise8(p, row, v, in_row, h, w, rstd, y, true);
#pragma unroll
        for (int o = 1; o < VPB; o <<= 1) amax = fmax_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
        u32 written;
        float inv;
        fp8_group_scale(p, amax, written, inv);
#if FP4_SWIZZLED || (defined(FP8_COL_PACKED) && FP8_PACK_WORDS)
        // Lanes past the row give 0: the column padding.
        u32 word = in_row ? written : 0u;
        word |= __shfl_down_sync(0xFFFFFFFFu, word, VPB) << 8;
        word |= __shfl_down_sync(0xFFFFFFFFu, word, 2 * VPB) << 16;
#endif
        if (!in_row) continue;
        store_q8(Q_AT(k), fp8_encode8(y, inv), VEC_N(v));
        if (v % VPB == 0) {
#if FP4_SWIZZLED
            if ((v / VPB) % 4 == 0) store_sf4(sw_lane + k * (FP4_G / (4 * VPB)) * 512, word);
#elif defined(FP8_COL_PACKED) && FP8_PACK_WORDS
            if ((v / VPB) % 4 == 0) store_packed_word(p, row, v / VPB / 4, word);
#elif defined(FP8_COL_PACKED)
            store_group_scale(p, row, v / VPB, written);
            if (NB % 4 != 0 && v / VPB == NB - 1) zero_packed_tail(p, row);
#elif defined(FP8_COL_RED)
            if (FROM_MEMORY)
                store_group_scale(p, row, v / VPB, written);
            else
                reduce_scale(p, row, v / VPB, written, old_scale[k]);
#else
            store_group_scale(p, row, v / VPB, written);
#endif
        }
    }
#endif
#undef Q_AT
#undef PASS2_H
#undef PASS2_W
}
#endif  // FP8_OUT

// Where this thread works: its lane in the row's thread group, its group (row) in the CTA,
// the row, and (clusters split a row over CTAs) the CTA's rank and first vector of the row.
// One definition for the kernel and for exact_sum_redo, which recomputes it rather than
// take it as arguments (registers: see there).
struct RowPlace {
    int lane, group;
    i64 row;
    u32 rank;
    int v0;
};
__device__ __forceinline__ RowPlace row_place() {
    RowPlace at;
    at.lane = threadIdx.x % FP4_G;
    at.group = threadIdx.x / FP4_G;
#if FP4_C > 1
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(at.rank));
    at.row = (i64)blockIdx.x / FP4_C;
    at.v0 = (int)at.rank * NVC;
#else
    at.rank = 0;
    at.row = (i64)blockIdx.x * FP4_R + at.group;
    at.v0 = 0;
#endif
    return at;
}

// The rare row (fewer than one in 10^6) whose f64 sum cannot decide rstd (rstd_checked): its
// exact sum of squares, and pass 2 again, from memory, where that changes rstd. Called
// after pass 2 by every thread of the CTA (FP4_C == 1 with several warps per row), of the
// row's warp (one warp per row), or of the cluster (FP4_C > 1), which sync inside. Out of
// line and with few arguments, so that it leaves the fast path's registers and schedule
// alone: the parameters by address (__grid_constant__: no copy), the row's place
// recomputed here rather than passed or copied to shared memory.
__device__ __noinline__ void exact_sum_redo(const Fp4NormParams* params, float rstd, float gs, bool live,
                                            bool mine_undecided) {
    const Fp4NormParams& p = *params;  // the kernel's own parameters (__grid_constant__)
    const RowPlace at = row_place();
    const int lane = at.lane, group = at.group, v0 = at.v0;
    const i64 row = at.row;
#if WARPS_PER_ROW == 1 && FP4_C == 1
#define SQ_SYNC() __syncwarp()
#else
#define SQ_SYNC() __syncthreads()
#endif
    __shared__ sq_bucket_t sq_buckets[FP4_R][SQ_BUCKETS];
    __shared__ float rstd_exact_row[FP4_R];
    sq_bucket_t* buckets = sq_buckets[group];
    for (int i = lane; i < SQ_BUCKETS; i += FP4_G) buckets[i] = 0;
    SQ_SYNC();
    if (live && mine_undecided) {
        // h re-read from memory (this thread's own pass-1 stores, or x), in a loop
        // that is not unrolled: registers stay with the fast path.
        const u16* hrow_again = h_row(p, row);
#pragma unroll 1
        for (int lv = lane; lv < NVC; lv += FP4_G)
            sq_buckets_add(buckets, load_vec(hrow_again + (v0 + lv) * 8, VEC_N(v0 + lv)));
    }
#if FP4_C == 1
    SQ_SYNC();  // every thread's squares are in before one thread reads the buckets
#else
    // Each CTA holds the buckets of its part of the row: after a cluster barrier
    // every CTA adds all parts' buckets (integer adds, any order) into its totals,
    // and a second barrier keeps every CTA until no peer reads its buckets.
    __shared__ sq_bucket_t sq_totals[SQ_BUCKETS];
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#pragma unroll 1
    for (int i = lane; i < SQ_BUCKETS; i += FP4_G) {
        sq_bucket_t total = 0;
#pragma unroll 1
        for (int r = 0; r < FP4_C; ++r) {
            u32 remote;
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(&buckets[i])), "r"(r));
            sq_bucket_t v;
            asm volatile("ld.shared::cluster." SQ_LD_TYPE " %0, [%1];" : "=" SQ_RED_ARG(v) : "r"(remote) : "memory");
            total += v;
        }
        sq_totals[i] = total;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    buckets = sq_totals;
#endif
    __shared__ u32 sq_limbs[FP4_R][SQ_LIMBS];
    if (lane == 0 && live && mine_undecided) rstd_exact_row[group] = rstd_of(sq_buckets_to_f64(buckets, sq_limbs[group]), p.eps);
    SQ_SYNC();
    // (Under FP4_FORCE_EXACT_SUMSQ pass 2 ran with a wrong rstd: the redo always runs, so
    // the tests see it rewrite every byte.)
    if (live && mine_undecided && (FP4_FORCE_EXACT_SUMSQ || __float_as_uint(rstd_exact_row[group]) != __float_as_uint(rstd)))
        pass2_row<true>(p, row, lane, v0, rstd_exact_row[group], gs, nullptr, nullptr);
#undef SQ_SYNC
}

#if defined(FP4_PAD_SPREAD) && FP4_SWIZZLED && !FP4_SWZ_SPLIT
// The last 128-row tile's swizzled scales in 16-byte pieces: each holds four blocks of
// rows c, c + 32, c + 64 and c + 96 (c its index mod 32); those of rows past m are zero.
#define PAD_UNITS ((NK4 / 4) * 32)
// Share `t` of `n` of the padding, written as zero by every thread of the grid after its
// row (FP4_PAD_SPREAD): consecutive threads take consecutive pieces, one coalesced run per
// warp, and no CTA exists for padding alone (at M = 1 the 127 padding rows' CTAs, or
// clusters, were most of the grid). Not inlined, so that it runs on the registers the
// row's work leaves (an inlined form failed the every-kernel compile check).
__device__ __noinline__ void zero_swizzled_padding(const Fp4NormParams* pp, i64 t, i64 n) {
    u8* const sf = pp->sf_swizzled;
    const i64 m = pp->m;
    const int first = (int)(m & 127);  // rows of the last tile that are the call's
    if (first == 0) return;
    u8* tile = sf + (m >> 7) * (i64)(NK4 / 4) * 512;
    const bool whole_v4 = FP4_VEC_ALIGNED && ((u64)sf & 15) == 0;
    for (i64 q = t; q < PAD_UNITS; q += n) {
        u8* at = tile + q * 16;
        const int c = (int)(q & 31);
        if (whole_v4 && c >= first) {
            asm volatile("st.global.v4.u32 [%0], {%1,%1,%1,%1};" :: "l"(at), "r"(0u) : "memory");
            continue;
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            if (c + 32 * g < first) continue;
#if FP4_VEC_ALIGNED
            *reinterpret_cast<u32*>(at + 4 * g) = 0u;  // (the buffer is 4-byte aligned)
#else
#pragma unroll
            for (int i = 0; i < 4; ++i) at[4 * g + i] = 0;
#endif
        }
    }
}
#endif

#if defined(FP4_SWZ_DEMOTE_TILES) && FP4_SWIZZLED && !FP4_SWZ_SPLIT && FP4_SWZ_KEEP && FP4_VEC_ALIGNED
// The kept words of the tile FP4_SWZ_DEMOTE_TILES behind `row`'s (complete: a resident wave
// and more ago) go back to L2's normal eviction, this row's share of the tile's 128-byte
// lines; else they stay evict-last for the rest of the call and crowd out the prefetch
// (launch_table.rs, swizzle_demote_tiles). A hint only. Not inlined, so that it runs on the
// registers the row's work leaves (inlined, kernels under a tight launch bound spill).
__device__ __noinline__ void demote_kept_tile(const u8* sf_swizzled, i64 row, int lane) {
    const u64 tile0 = (u64)(sf_swizzled + ((row >> 7) - FP4_SWZ_DEMOTE_TILES) * (i64)(128 * NK4));
    const u64 tile1 = tile0 + 128 * (u64)NK4;
    for (u64 a = ((tile0 + 127) & ~(u64)127) + 128 * (u64)((row & 127) + 128 * lane); a + 128 <= tile1;
         a += 128 * 128 * (u64)FP4_G) {
        asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(a) : "memory");
    }
}
#endif

#if defined(FP8_COL_DEMOTE_ROWS) && defined(FP8_COL_KEEP) && !defined(FP8_COL_SPLIT)
// The kept column-major scales of the row FP8_COL_DEMOTE_ROWS behind `row` (a resident wave
// and two lines of rows ago: their 128-byte lines are complete) go back to L2's normal
// eviction: each of this part's groups whose line starts at that row's scale, so that
// every line is demoted once. Else they stay evict-last for the rest of the call and
// crowd out the L2 prefetch (launch_table.rs, column_scales_demote_rows). A hint only;
// not inlined, as demote_kept_tile.
__device__ __noinline__ void demote_kept_column_scales(const Fp4NormParams* p, i64 row, int lane, int v0) {
#if defined(FP8_COL_PACKED)
    // Columns of words, four groups each (the CTA's part holds whole words).
    constexpr u64 bytes = 4;
    const int first = v0 / VPB / 4, end = ((v0 + NVC) / VPB + 3) / 4;
#else
    constexpr u64 bytes = FP8_SCALING == 1 ? 4 : 1;
    const int first = v0 / VPB, end = (v0 + NVC) / VPB;
#endif
    const i64 mp4 = (p->m + 3) & ~3ll;
    const i64 done = row - FP8_COL_DEMOTE_ROWS;
    for (int g = first + lane; g < end; g += FP4_G) {
        const u64 a = (u64)p->sf_row_major + (u64)((i64)g * mp4 + done) * bytes;
        if ((a & 127) < bytes) asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(a & ~(u64)127) : "memory");
    }
}
#endif

// The launch bound's minimum of resident CTAs per SM: decided by the host
// (KernelConfig::min_ctas_per_sm, src/cuda/kernel/config.rs), which also sizes the L2
// prefetch's resident wave from it. Before sm_90 (no packed bf16 arithmetic) the same rows
// need more registers: at most as many CTAs as leave 64 registers a thread, or they spill.
#if __CUDA_ARCH__ < 900 && FP4_MIN_CTAS * FP4_G * FP4_R > 1024
#define MIN_CTAS_PER_SM (1024 / (FP4_G * FP4_R))
#else
#define MIN_CTAS_PER_SM FP4_MIN_CTAS
#endif
extern "C" __global__ void __launch_bounds__(FP4_G * FP4_R, MIN_CTAS_PER_SM)
fp4norm_fused(const __grid_constant__ Fp4NormParams p) {
    const RowPlace at = row_place();
    const int lane = at.lane, group = at.group, v0 = at.v0;
    const i64 row = at.row;
#if FP4_C > 1
    const u32 rank = at.rank;
#endif

#if __CUDA_ARCH__ >= 900
    // Programmatic dependent launch: when launched with it, this grid may start while the
    // previous kernel finishes; wait here until that kernel's writes (x, r, gs) are
    // visible. A no-op for a normal launch.
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(FP4_PAD_CTAS) && defined(PAD_UNITS)
    // The CTAs after the rows' zero the swizzled padding, on SMs the rows leave idle: whole
    // clusters of their own (the host rounds their count), which leave before any cluster
    // or rank barrier, so no row's CTA waits for them.
    {
        const i64 row_ctas = ((p.m + FP4_R - 1) / FP4_R) * FP4_C;
        if ((i64)blockIdx.x >= row_ctas) {
            zero_swizzled_padding(&p, ((i64)blockIdx.x - row_ctas) * blockDim.x + threadIdx.x,
                                  ((i64)gridDim.x - row_ctas) * blockDim.x);
            return;
        }
    }
#endif

#if WARPS_PER_ROW > 1
    __shared__ double partial[FP4_R][WARPS_PER_ROW];
#endif
#if FP4_C > 1
    // The cluster's exchange of partial sums of squares (see below): each CTA's
    // cluster_parts[r] receives CTA r's sum by st.async, which signals cluster_bar with its
    // bytes. The barrier expects all FP4_C parts from the start; the cluster barrier that
    // makes its initialisation visible to the peers overlaps pass 1's loads (init, then
    // fence.mbarrier_init.release.cluster, then a relaxed arrive: the PTX ISA's pattern
    // for publishing an mbarrier to the cluster). The barrier is used once (phase 0).
    __shared__ __align__(8) u64 cluster_bar;
    __shared__ double cluster_parts[FP4_C];
    if (threadIdx.x == 0) {
#if defined(FP8_OUT) && FP8_PER_TOKEN
        // (The per-token amax exchange's barrier, published by the fence below.)
        asm volatile("{ .reg .b64 st;\n\t"
                     "mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
                     "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                     :: "r"(smem_addr(&fp8_amax_bar)), "r"(FP4_C * 4) : "memory");
#endif
        asm volatile("{ .reg .b64 st;\n\t"
                     "mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
                     "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t"
                     "fence.mbarrier_init.release.cluster; }"
                     :: "r"(smem_addr(&cluster_bar)), "r"(FP4_C * 8) : "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
#if PREFETCH_W
    // The weight does not depend on the row: loaded once per CTA.
    uint4 wv[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k)
        if (lane + k * FP4_G < NVC) wv[k] = load_weight(p.w + (v0 + lane + k * FP4_G) * 8, VEC_N(v0 + lane + k * FP4_G));
#endif
#if defined(FP4_AR_PEER)
    // This rank's rows into its buffer (the vectors each thread reads below), then the
    // ranks meet.
    if (p.ar_copy && row < p.m) {
        const u16* xrow = p.x + row * p.x_stride;
        u16* own = const_cast<u16*>(p.ar_x[p.ar_rank]) + row * p.ar_stride;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int lv = lane + k * FP4_G;
            if (lv < NVC) store_vec(own + (v0 + lv) * 8, load_vec_ro(xrow + (v0 + lv) * 8, VEC_N(v0 + lv)), VEC_N(v0 + lv));
        }
    }
    ranks_barrier<true>(p);
#if defined(FP4_AR_TWO_SHOT)
    // The reduce-scatter: this rank's vectors of the row, summed over the ranks, replace its
    // input there (until the next meeting a peer reads only its own vectors of this buffer);
    // then the ranks meet again, and LOAD_X reads every vector from its owner.
    if (row < p.m) {
        u16* own = const_cast<u16*>(p.ar_x[p.ar_rank]) + row * p.ar_stride;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int lv = lane + k * FP4_G;
            const int v = v0 + lv;
            if (lv < NVC && AR_OWNER(v) == p.ar_rank) store_vec(own + v * 8, ar_sum_vec(p, row, v), VEC_N(v));
        }
    }
    ranks_barrier<true>(p);
#endif
#endif
    {
        const bool live = row < p.m;
        uint4 hv[HOLD_IN_REGS ? VPT : 1];
        double ss = 0.0;
        float gs = 1.0f;
        if (live) {
#if FP4_GS == 1
            gs = p.gs[0];
#elif FP4_GS == 2
            gs = p.gs[row];
#endif
            const u16* xrow = p.x + row * p.x_stride;
#if FP4_RESIDUAL
            const u16* rrow = p.r + row * p.r_stride;
#endif
            // Loads first, so up to PASS1_CHUNK (x2) 16-byte loads per thread are in flight.
#pragma unroll
            for (int k0 = 0; k0 < VPT; k0 += PASS1_CHUNK) {
                uint4 xc[PASS1_CHUNK], rc[PASS1_CHUNK];
#pragma unroll
                for (int c = 0; c < PASS1_CHUNK; ++c) {
                    const int lv = lane + (k0 + c) * FP4_G;
                    if (k0 + c < VPT && lv < NVC) {
                        xc[c] = LOAD_X(row, v0 + lv, xrow);
#if FP4_RESIDUAL
                        rc[c] = load_vec(rrow + (v0 + lv) * 8, VEC_N(v0 + lv));
#endif
                    }
                }
#pragma unroll
                for (int c = 0; c < PASS1_CHUNK; ++c) {
                    const int k = k0 + c;
                    const int lv = lane + k * FP4_G;
                    if (k < VPT && lv < NVC) {
                        const uint4 h = residual_add(p, row, v0 + lv, xc[c], rc[c], ss);
#if HOLD_IN_REGS
                        hv[k] = h;
#endif
                    }
                }
            }
        }

#if defined(FP8_COL_RED)
        // The old bytes of the scales this thread writes (see reduce_scale).
        u32 old_scale[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int lv = lane + k * FP4_G;
            old_scale[k] = (live && lv < NVC && (v0 + lv) % VPB == 0) ? load_old_scale(p, row, (v0 + lv) / VPB) : 0u;
        }
#define PASS2_OLD_SCALE , old_scale
#else
#define PASS2_OLD_SCALE
#endif
#if __CUDA_ARCH__ >= 900
        // This CTA's first loads are issued: let the next kernel (if launched with PDL) get
        // scheduled. It still waits for this grid's completion before it reads anything.
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif

#if FP4_VEC_ALIGNED && __CUDA_ARCH__ >= 900 && VPT >= 2
        // With many rows, x and r of the row pf_rows ahead (which a CTA of a later wave will
        // read) are prefetched into L2, one bulk prefetch each for this CTA's part of it:
        // DRAM keeps streaming while this SM's CTAs are past their loads, in the row sum and
        // pass 2, and the later CTA's loads find L2. A hint without side effects; placed
        // after this row's loads so that it never delays them (the host chooses pf_rows, 0
        // where it does not pay: l2_prefetch_rows, src/cuda/kernel/launch_table.rs). Not
        // compiled into the one-vector-per-thread kernels: only the latency shapes (M up to
        // the SM count) have them, where it never runs and would only lengthen the row's chain.
        if (lane == 0 && p.pf_rows != 0 && row + p.pf_rows < p.m) {
            const i64 ahead = row + p.pf_rows;
            prefetch_l2(p.x + ahead * p.x_stride + v0 * 8, NVC * 16);
#if FP4_RESIDUAL
            prefetch_l2(p.r + ahead * p.r_stride + v0 * 8, NVC * 16);
#endif
        }
#endif

        // Row sum of squares: warp shuffles, then across the row's warps through shared memory.
        ss = warp_sum(ss);
#if WARPS_PER_ROW > 1
        if ((lane & 31) == 0) partial[group][lane >> 5] = ss;
        __syncthreads();
#if RSTD_BY_ONE_WARP
        // The row's first warp alone adds the partial sums and computes rstd (~50 f64
        // instructions that every warp would otherwise repeat); the others wait at the
        // barrier, leaving their issue slots to the SM's other CTAs.
        __shared__ float rstd_of_row[FP4_R];
        __shared__ bool undecided_row[FP4_R];
        if (lane < 32) {
            ss = 0.0;
#pragma unroll
            for (int i = 0; i < WARPS_PER_ROW; ++i) ss = __dadd_rn(ss, partial[group][i]);
            bool undecided;
            const float r = rstd_checked(ss, p.eps, undecided);
            if (lane == 0) {
                rstd_of_row[group] = r;
                undecided_row[group] = undecided;
            }
        }
        __syncthreads();
#else
        ss = 0.0;
#pragma unroll
        for (int i = 0; i < WARPS_PER_ROW; ++i) ss = __dadd_rn(ss, partial[group][i]);
#endif
#endif
#if FP4_C > 1
        // The row's other parts live in the cluster's other CTAs. Every CTA pushes its sum
        // into slot `rank` of every CTA (thread t sends to CTA t) with st.async, which
        // completes bytes on the receiver's mbarrier; each then waits for its FP4_C slots and
        // adds them in rank order (the same rstd everywhere). One one-way DSMEM hop and no
        // GPU-scope fence on the row's critical path (the cluster wait below finds the
        // start barrier long complete), and no barrier at exit: a CTA leaves only after
        // every part addressed to it has landed (its phase needs tx-count 0), and every
        // part it sent is awaited by a CTA that cannot have left; st.async stores a
        // register value, so its sender need not stay. This holds only while every CTA of
        // the cluster reaches this point (no early return above it: a peer would write
        // into an exited CTA and wait forever for its part) and sends exactly one 8-byte
        // part to each CTA. (The PTX ISA's st.async, mbarrier and barrier.cluster
        // sections; Dao-AILab quack's cluster RMSNorm reduction works the same way.)
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // peers' mbarriers are initialised
        if (threadIdx.x < FP4_C) {
            u32 slot, bar;
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(slot) : "r"(smem_addr(&cluster_parts[rank])), "r"(threadIdx.x));
            asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_addr(&cluster_bar)), "r"(threadIdx.x));
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                         :: "r"(slot), "l"(__double_as_longlong(ss)), "r"(bar) : "memory");
        }
        // A relaxed wait and a cluster acquire fence restricted to shared memory, rather
        // than an acquiring wait: the PTX ISA's pattern for reading shared memory that
        // peers filled through the mbarrier: its sm_90 SASS has no L1 invalidate
        // (CCTL.IVALL) after the wait. Both are PTX ISA 8.6 (NVRTC 12.8+); older NVRTC keeps
        // the acquiring wait.
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8)
#define FP4_RELAXED_CLUSTER_WAIT 1
#define FP4_CLUSTER_WAIT_SEM "relaxed"
#else
#define FP4_RELAXED_CLUSTER_WAIT 0
#define FP4_CLUSTER_WAIT_SEM "acquire"
#endif
        {
            const u32 bar = smem_addr(&cluster_bar);
            u32 done = 0;
            while (!done) {
                asm volatile("{ .reg .pred p;\n\t"
                             "mbarrier.try_wait.parity." FP4_CLUSTER_WAIT_SEM ".cluster.shared::cta.b64 p, [%1], 0;\n\t"
                             "selp.u32 %0, 1, 0, p; }"
                             : "=r"(done) : "r"(bar) : "memory");
            }
        }
#if FP4_RELAXED_CLUSTER_WAIT
        asm volatile("fence.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory");
#endif
        ss = 0.0;
#pragma unroll
        for (int r = 0; r < FP4_C; ++r) ss = __dadd_rn(ss, cluster_parts[r]);
#endif

#if RSTD_BY_ONE_WARP
        const float rstd = rstd_of_row[group];
        const bool mine_undecided = undecided_row[group];
        bool any_undecided = false;  // CTA-uniform: the slow path's barriers are the CTA's
#pragma unroll
        for (int i = 0; i < FP4_R; ++i) any_undecided |= undecided_row[i];
#else
        bool mine_undecided;
        const float rstd = rstd_checked(ss, p.eps, mine_undecided);
        // Uniform over the threads that sync below: the row's one warp (FP4_C == 1), or the
        // whole cluster (one row, the same ss in every CTA).
        const bool any_undecided = mine_undecided;
#endif

        if (live) {
            // FP4_FORCE_EXACT_SUMSQ (a test knob): pass 2 writes bytes from a wrong rstd
            // (1.5 x) wherever the exact path will run, so that a redo which misses a byte
            // fails the tests. Constant-folded away otherwise.
            const float rstd_pass2 = (FP4_FORCE_EXACT_SUMSQ && mine_undecided) ? __fmul_rn(rstd, 1.5f) : rstd;
#if PREFETCH_W
            pass2_row<false>(p, row, lane, v0, rstd_pass2, gs, hv, wv PASS2_OLD_SCALE);
#else
            pass2_row<false>(p, row, lane, v0, rstd_pass2, gs, hv, nullptr PASS2_OLD_SCALE);
#endif
#if defined(FP4_SWZ_DEMOTE_TILES) && FP4_SWIZZLED && !FP4_SWZ_SPLIT && FP4_SWZ_KEEP && FP4_VEC_ALIGNED
            if (v0 == 0 && row >= 128 * (i64)FP4_SWZ_DEMOTE_TILES) demote_kept_tile(p.sf_swizzled, row, lane);
#endif
#if defined(FP8_COL_DEMOTE_ROWS) && defined(FP8_COL_KEEP) && !defined(FP8_COL_SPLIT)
            if (row >= FP8_COL_DEMOTE_ROWS) demote_kept_column_scales(&p, row, lane, v0);
#endif
        }
#if defined(FP8_OUT) && FP8_COL_MAJOR
        else if (row < p.rows_total && v0 == 0) {
            // Rows m..Mp4 of column-major FP8 scales: padding, written as zero.
#if defined(FP8_COL_PACKED)
            for (int g = lane; g < NK4; g += FP4_G) store_group_scale(p, row, g, 0u);
#else
            for (int g = lane; g < NB; g += FP4_G) store_group_scale(p, row, g, 0u);
#endif
        }
#endif
#if !defined(FP4_PAD_SPREAD) && FP4_SWIZZLED && !FP4_SWZ_SPLIT
        else if (row < p.rows_total && v0 == 0) {
            // Rows m..Mp of the last 128-row tile: scale padding, written as zero.
            for (int j = lane; j < NK4; j += FP4_G) p.sf_swizzled[swizzled_offset(row, j)] = 0;
        }
#endif
#if defined(PAD_UNITS) && !defined(FP4_PAD_CTAS)
        // Only the grid's first PAD_UNITS threads hold a share; the others skip the call.
        if ((i64)blockIdx.x * blockDim.x < PAD_UNITS)
            zero_swizzled_padding(&p, (i64)blockIdx.x * blockDim.x + threadIdx.x, (i64)gridDim.x * blockDim.x);
#endif
        if (any_undecided) {
            exact_sum_redo(&p, rstd, gs, live, mine_undecided);
        }
    }
#if defined(FP4_AR_PEER)
    ranks_barrier<false>(p);
#endif
}
