// fp4norm CUDA kernels: fused residual add + RMSNorm + FP4 block quantisation,
// bit-exact to SPEC.md. Compiled at run time by NVRTC, one specialisation per
// configuration; the host prepends the FP4_* macros below. No CUDA headers are
// included (NVRTC may lack them): 16-bit floats are handled as raw bits with PTX.
//
// Exactness rules (SPEC.md §1, §7): every float operation is an explicit IEEE
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, __dadd_rn, ...),
// so neither contraction into FMA nor approximate division can change a result;
// the host also compiles with --fmad=false -ftz=false -prec-div=true -prec-sqrt=true.
//
// Configuration macros (all set by the host, see src/cuda/kernel.rs):
//   FP4_KIND         0: the fused kernel, 1: dequantisation, 2: the copy yardstick,
//                    3: the codec self-check (fast encoders against the literal ones),
//                    4: the swizzle pass of a split swizzled write (FP4_SWZ_SPLIT)
//   FP4_F16          0: bf16 elements, 1: f16 elements
//   FP4_H            hidden size (elements per row)
//   FP4_BLOCK        16 or 32 elements per scale block
//   FP4_UE8M0        0: E4M3 scales, 1: UE8M0 scales
//   FP4_ROW_MAJOR    write row-major scales
//   FP4_SWIZZLED     write 128x4 swizzled scales (padding zeroed)
//   FP4_RESIDUAL     add and write back the residual
//   FP4_Y_OUT        write y (the normalised values) in the element dtype
//   FP4_GS           0: global scale 1.0, 1: one value gs[0], 2: one per row gs[row]
//   FP4_HW_E2M1      use cvt.rn.satfinite.e2m1x2.f32 (sm_100a-class targets only)
//   FP4_HW_CANONICAL_NAN  the packed add/cvt already return 0x7FFF for NaN (no fix-up)
//   FP4_G            threads per row (a multiple of 32)
//   FP4_R            rows per CTA
//   FP4_C            CTAs per row: >1 splits each row over a thread-block cluster whose
//                    CTAs exchange partial sums of squares through distributed shared
//                    memory (sm_90+; FP4_R is then 1)
//   FP4_FORCE_EXACT_SUMSQ  1: every row takes the exact sum of squares (a test knob that
//                    runs the rare slow path everywhere; see rstd_checked)
//   FP4_VEC_ALIGNED  1: 16-byte vector loads/stores; 0: element-wise path for
//                    pointers or strides that are not 16-byte aligned
//   FP4_SWZ_SPLIT    1: the swizzled scales are written by a second kernel (FP4_KIND 4):
//                    the fused kernel leaves each row's codes in the swizzled buffer in a
//                    staging layout with coalesced byte stores (or, with row-major scales
//                    also requested, only writes those), and the swizzle pass moves every
//                    128-row x 64-block chunk into the 128x4 layout, in place, with 16-byte
//                    stores, where the direct path's 4-byte stores each hit their own
//                    32-byte sector. The host uses it where the extra launch pays
//                    (src/cuda/kernel.rs, swizzle_split_wanted).
//   FP4_SWZ_KEEP     1 (direct swizzled write only): each 4-byte swizzled word is stored with
//                    an L2 evict-last policy, so that the 32-byte sectors the four row
//                    quarters of a 128-row tile fill piecewise stay in L2 until complete
//                    instead of being written back part-filled while the call streams
//                    tens of MB past them (src/cuda/kernel.rs, swizzle_keep_wanted).
//   FP4_HOLD_IN_REGS 1: each thread keeps its vectors of the row in registers between the
//                    two passes; 0: the second pass re-reads them (KernelConfig::
//                    holds_rows_in_registers)
//   FP4_MIN_CTAS     the fused kernel's launch bound: minimum resident CTAs per SM
//                    (KernelConfig::min_ctas_per_sm)

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define NV (FP4_H / 8)                   // 8-element vectors per row
#define VPB (FP4_BLOCK / 8)              // vectors per scale block
#define NVC (NV / FP4_C)                 // vectors per CTA (a row is split over FP4_C CTAs)
#define VPT ((NVC + FP4_G - 1) / FP4_G)  // vectors per thread
#define NB (FP4_H / FP4_BLOCK)           // blocks per row
#define NK4 (((NB + 3) / 4) * 4)         // blocks per row, padded to the swizzle tile
#define WARPS_PER_ROW (FP4_G / 32)
// Rows held in registers between the two passes; beyond that the second pass
// re-reads h from the residual (or x) it has just written (same thread, same addresses).
// Decided by the host (KernelConfig::holds_rows_in_registers in src/cuda/kernel.rs),
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
    i64 rows_total;     // m, or Mp when the swizzled padding rows must be zeroed
    i64 x_stride;       // elements
    i64 r_stride;
    i64 y_stride;
    float eps;
    unsigned int pf_rows;  // L2 prefetch distance in rows, 0 = none (kernel.rs, l2_prefetch_rows)
};

// ---------------------------------------------------------------------------
// Element conversions (raw bits). RNdt: round to nearest even; NaN becomes the
// canonical NaN 0x7FFF, as the CPU backends write.

__device__ __forceinline__ float elem_to_f32(u32 bits16) {
#if FP4_F16
    float f;
    asm("{ .reg .b16 h; cvt.u16.u32 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(bits16));
    return f;
#else
    return __uint_as_float(bits16 << 16);
#endif
}

#if FP4_F16
#define ELEM_INF_BITS 0x7C00u
#else
#define ELEM_INF_BITS 0x7F80u
#endif

// Any NaN lane of a packed pair becomes the canonical NaN 0x7FFF. Compiled out where the
// hardware is known to produce it already (FP4_HW_CANONICAL_NAN, checked on the device
// by the GPU tests' NaN cases).
__device__ __forceinline__ u32 canonical_nan2(u32 d) {
#if !FP4_HW_CANONICAL_NAN
    if ((d & 0x7FFFu) > ELEM_INF_BITS) d = (d & 0xFFFF0000u) | 0x7FFFu;
    if (((d >> 16) & 0x7FFFu) > ELEM_INF_BITS) d = (d & 0x0000FFFFu) | 0x7FFF0000u;
#endif
    return d;
}

// Two f32 to packed dt (lo in the low 16 bits), RNdt.
__device__ __forceinline__ u32 f32x2_to_elem(float lo, float hi) {
    u32 d;
#if FP4_F16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
    return canonical_nan2(d);
}

// h = RNdt(RN32(x + r)) for a packed pair, as one packed add: for two inputs of p
// significant bits, rounding first to f32 (24 >= 2p + 2 bits) and then to dt gives the
// same result as rounding the exact sum once (double rounding is innocuous), overflow
// to Inf included.
__device__ __forceinline__ u32 add_pair(u32 x, u32 r) {
    u32 d;
#if FP4_F16
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(r));
#else
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(r));
#endif
    return canonical_nan2(d);
}

// ---------------------------------------------------------------------------
// Codecs (SPEC.md §2), written exactly as crates/fp4norm/src/codec.rs.

__device__ __forceinline__ u32 e2m1_encode_sw(float v) {
    const float a = fabsf(v);
    const u32 mag = (u32)(a > 0.25f) + (u32)(a >= 0.75f) + (u32)(a > 1.25f) + (u32)(a >= 1.75f)
                  + (u32)(a > 2.5f) + (u32)(a >= 3.5f) + (u32)(a > 5.0f);
    const u32 sign = (__float_as_uint(v) >> 28) & 0x8u;
    return (v != v) ? 0x7u : (mag | sign);
}

// Byte-wise select (PTX prmt): byte i of the result is chosen by nibble i of sel from the
// eight bytes of {b, a} (a: 0-3, b: 4-7); a nibble with bit 3 set replicates that byte's
// sign bit over the whole result byte.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// The sign bits of eight floats, each at bit 3 of its nibble (nibble i = value i):
// four sign-replicating byte selects gather the even and the odd values' signs, two
// masks place them. One instruction per value instead of a shift and a merge.
__device__ __forceinline__ u32 sign_nibbles8(const float (&p)[8]) {
    const u32 even = prmt(prmt(__float_as_uint(p[0]), __float_as_uint(p[2]), 0x00FBu),
                          prmt(__float_as_uint(p[4]), __float_as_uint(p[6]), 0xFB00u), 0x7610u);
    const u32 odd = prmt(prmt(__float_as_uint(p[1]), __float_as_uint(p[3]), 0x00FBu),
                         prmt(__float_as_uint(p[5]), __float_as_uint(p[7]), 0xFB00u), 0x7610u);
    return (even & 0x08080808u) | (odd & 0x80808080u);
}

// Eight E2M1 codes, nibble i = p[i], for values none of which is NaN, by rounding with the
// FPU: the E2M1 grid has spacing s = 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]; adding
// C = s * 2^23 makes the f32 adder round a = |p[i]| to a multiple of s, ties to even (an
// even multiple is an even code). C is the binade of max(a, 1) times 2^22, taken from its
// exponent bits, plus 6 ulps: the result t then holds 6 + k in its low bits (k the grid
// steps; 6 is even, so ties still go to an even k) and 2 (E + 22) in t >> 22, so
// t + (t >> 22) is k + 2 (E - 127) + 304, the code plus 19 x 16: its low nibble is the
// code. Byte selects gather the eight low bytes; one select of nibbles packs them.
// a is clamped to 6 first (every value from 6 up encodes as 6: code 7) unless BELOW_7: the
// caller knows that every |p[i]| < 7 (e2m1_pack8), where the rounding alone gives code 7 on
// [6, 7). Five instructions per value and two per value to pack. Both forms are checked
// against e2m1_encode_sw on every f32 they are used for by the codec self-check kernel
// (FP4_KIND 3), and their arithmetic on the host by scripts/e2m1-below7-check.c.
template <bool BELOW_7>
__device__ __forceinline__ u32 e2m1_pack8_fast(const float (&p)[8]) {
    u32 u[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = BELOW_7 ? fabsf(p[i]) : fminf(fabsf(p[i]), 6.0f);
        const u32 e = __float_as_uint(fmaxf(a, 1.0f)) & 0x7F800000u;
        const u32 t = __float_as_uint(__fadd_rn(a, __uint_as_float(e + ((22u << 23) + 6u))));
        u[i] = t + (t >> 22);
    }
    const u32 even = prmt(prmt(u[0], u[2], 0x0040u), prmt(u[4], u[6], 0x4000u), 0x7610u);
    const u32 odd = prmt(prmt(u[1], u[3], 0x0040u), prmt(u[5], u[7], 0x4000u), 0x7610u);
    return (even & 0x0F0F0F0Fu) | ((odd << 4) & 0xF0F0F0F0u) | sign_nibbles8(p);
}

// Eight products y[i] * inv to eight E2M1 codes, nibble i at bits 4i.
// A product can be NaN only when inv is NaN, when inv is infinite and some y is 0, or
// when inv is 0 (a tiny global scale can round gs / d to 0) and some y is infinite:
// block-uniform conditions (amax is the block's), handled by the spec-literal encoder;
// every other block takes a fast one. inv is never negative (gs / d has the sign of
// gs^2, or inv is +0), so every |p[i]| is at most pmax = RN32(amax inv) (rounding is
// monotone): where pmax < 7 (every block with a finite amax and a normal E4M3 scale, whose
// rounding keeps pmax within about 6 (1 + 2^-4); every UE8M0 block with a finite amax;
// NaN compares false) the encoder needs no clamp; subnormal or saturated E4M3 scales and
// infinite products take the clamped one.
__device__ __forceinline__ u32 e2m1_pack8(const float (&y)[8], float inv, float amax) {
    float p[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = __fmul_rn(y[i], inv);
    const bool inv_finite = (__float_as_uint(inv) & 0x7F800000u) != 0x7F800000u;
    const bool amax_finite = (__float_as_uint(amax) & 0x7F800000u) != 0x7F800000u;
#if FP4_HW_E2M1
    if (inv_finite && (inv != 0.0f || amax_finite)) {
        // cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the high nibble, b in the low one.
        u32 out = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 b;
            asm("{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, %1, %2; cvt.u32.u8 %0, t; }"
                : "=r"(b) : "f"(p[2 * j + 1]), "f"(p[2 * j]));
            out |= b << (8 * j);
        }
        return out;
    }
#else
    if (__fmul_rn(amax, fabsf(inv)) < 7.0f) return e2m1_pack8_fast<true>(p);
    if (inv_finite && (inv != 0.0f || amax_finite)) return e2m1_pack8_fast<false>(p);
#endif
    u32 out = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) out |= e2m1_encode_sw(p[i]) << (4 * i);
    return out;
}

__device__ __forceinline__ u32 e4m3_encode(float s) {
    const u32 bits = __float_as_uint(s);
    const u32 sign = (bits >> 24) & 0x80u;
    const u32 abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return 0x7Fu;
    const float a = __uint_as_float(abs_bits);
    if (a >= 448.0f) return sign | 0x7Eu;
    if (abs_bits < 0x3C800000u) {
        // below 2^-6: multiples of 2^-9, round half to even (exact scaling by 2^9)
        return sign | (u32)__float2int_rn(__fmul_rn(a, 512.0f));
    }
    const u32 rebiased = abs_bits - ((127u - 7u) << 23);
    const u32 rounded = (rebiased + 0x7FFFFu + ((rebiased >> 20) & 1u)) >> 20;
    return sign | min(rounded, 0x7Eu);
}

__device__ __forceinline__ float e4m3_decode(u32 code) {
    const u32 exp = (code >> 3) & 0xFu;
    const u32 mant = code & 0x7u;
    float mag;
    if ((code & 0x7Fu) == 0x7Fu) {
        mag = __uint_as_float(0x7FFFFFFFu);
    } else if (exp == 0) {
        mag = __fmul_rn((float)mant, 1.0f / 512.0f);
    } else {
        // (1 + m/8) * 2^(exp-7), assembled directly as f32 bits
        mag = __uint_as_float(((exp - 7u + 127u) << 23) | (mant << 20));
    }
    return (code & 0x80u) ? -mag : mag;
}

// E4M3 encode and decode by the hardware conversions (sm_89+): cvt.rn.satfinite rounds to
// nearest even and saturates to +-448 (infinities included), as SPEC.md §2; only NaN
// differs (the hardware keeps the sign: 0xFF for a negative NaN; SPEC.md says 0x7F).
// A handful of instructions where the literal versions above take ~30 with branches.
// Both are checked against the literal ones on every input by the codec self-check
// kernel (FP4_KIND 3).
__device__ __forceinline__ u32 e4m3_encode_fast(float s) {
#if __CUDA_ARCH__ >= 890
    u32 d;
    asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; cvt.u32.u16 %0, t; }"
        : "=r"(d) : "f"(0.0f), "f"(s));
    return (s != s) ? 0x7Fu : (d & 0xFFu);
#else
    return e4m3_encode(s);
#endif
}

__device__ __forceinline__ float e4m3_decode_fast(u32 code) {
#if __CUDA_ARCH__ >= 890
    float f;
    asm("{ .reg .b16 c, lo, hi; .reg .b32 pair;\n\t"
        "cvt.u16.u32 c, %1;\n\t"
        "cvt.rn.f16x2.e4m3x2 pair, c;\n\t"
        "mov.b32 {lo, hi}, pair;\n\t"
        "cvt.f32.f16 %0, lo; }"
        : "=f"(f) : "r"(code));
    return f;
#else
    return e4m3_decode(code);
#endif
}

__device__ __forceinline__ u32 ue8m0_ceil_code(float v) {
    const u32 bits = __float_as_uint(v);
    if (v != v) return 0xFFu;
    if (bits == 0 || (bits & 0x80000000u)) return 0;
    const u32 exp = bits >> 23;
    const u32 mant = bits & 0x7FFFFFu;
    if (exp == 0) return mant > 0x400000u ? 1u : 0u;
    return min(exp + (mant != 0 ? 1u : 0u), 254u);
}

__device__ __forceinline__ float ue8m0_inverse(u32 code) {
    if (code == 254u) return __uint_as_float(1u << 22);
    if (code == 255u) return __uint_as_float(0x7FFFFFFFu);
    return __uint_as_float((254u - code) << 23);
}

// ---------------------------------------------------------------------------
// Memory access. The aligned path moves 16 bytes per access; the fallback moves
// one element at a time, for views whose pointers or strides are not 16-byte aligned.

// Eight elements, one 16-bit load each (the fallback for unaligned views).
__device__ __forceinline__ uint4 load_elems(const u16* p) {
    u32 e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = p[i];
    return make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16), e[6] | (e[7] << 16));
}

__device__ __forceinline__ uint4 load_vec_ro(const u16* p) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_elems(p);
#endif
}

__device__ __forceinline__ uint4 load_vec(const u16* p) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_elems(p);
#endif
}

__device__ __forceinline__ uint4 load_weight(const u16* p) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_vec(p);
#endif
}

__device__ __forceinline__ void store_vec(u16* p, uint4 v) {
#if FP4_VEC_ALIGNED
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        p[2 * i] = (u16)(w[i] & 0xFFFFu);
        p[2 * i + 1] = (u16)(w[i] >> 16);
    }
#endif
}

__device__ __forceinline__ void store_q(u8* p, u32 v) {
#if FP4_VEC_ALIGNED
    asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = (u8)(v >> (8 * i));
#endif
}

// An L2 evict-last policy (fraction 1.0): lines stored with it stay in L2 ahead of the
// streamed data. Used for the split write's staged codes and FP4_SWZ_KEEP's words.
__device__ __forceinline__ u64 l2_evict_last_policy() {
    u64 policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// Four swizzled scale codes (byte i = block 4k + i) at a 4-byte aligned offset.
__device__ __forceinline__ void store_sf4(u8* p, u32 word) {
#if FP4_VEC_ALIGNED && FP4_SWZ_KEEP
    asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" :: "l"(p), "r"(word), "l"(l2_evict_last_policy()) : "memory");
#elif FP4_VEC_ALIGNED
    asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(word) : "memory");
#else
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = (u8)(word >> (8 * i));
#endif
}

__device__ __forceinline__ i64 swizzled_offset(i64 row, int b) {
    return (row >> 7) * (i64)(NK4 / 4) * 512 + (i64)(b >> 2) * 512 + (row & 31) * 16
         + ((row & 127) >> 5) * 4 + (b & 3);
}

// The staging layout of a split swizzled write: per 128-row tile (the swizzled tile's
// 128 * NK4 bytes) and per chunk of SWZ_CHUNK blocks [b0, b0 + w), the chunk's 128 rows
// row-major with row stride w, at the chunk's own swizzled byte range [128 b0, 128 (b0 + w)):
// so each chunk moves into its 128x4 form in place, independently of the others.
#define SWZ_CHUNK 64
__device__ __forceinline__ i64 swizzle_stage_offset(i64 row, int b) {
    const int b0 = b / SWZ_CHUNK * SWZ_CHUNK;
    const int w = min(SWZ_CHUNK, NK4 - b0);
    return (row >> 7) * (i64)(128 * NK4) + (i64)b0 * 128 + (row & 127) * w + (b - b0);
}

// A byte store marked evict-last in L2: the staged codes of a split swizzled write stay in
// L2 for the swizzle pass instead of going to DRAM and back while the fused kernel
// streams hundreds of MB past them.
__device__ __forceinline__ void store_u8_keep_in_l2(u8* p, u32 v) {
    asm volatile("st.global.L2::cache_hint.u8 [%0], %1, %2;" :: "l"(p), "r"(v), "l"(l2_evict_last_policy()) : "memory");
}

__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = elem_to_f32(w[i] & 0xFFFFu);
        f[2 * i + 1] = elem_to_f32(w[i] >> 16);
    }
}

// max that propagates NaN (SPEC.md §1.5: a NaN anywhere makes amax NaN).
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

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
#define SUM_DEPTH (VPT * 8 + 5 + WARPS_PER_ROW + FP4_C)
#ifndef FP4_FORCE_EXACT_SUMSQ
#define FP4_FORCE_EXACT_SUMSQ 0
#endif
__device__ __forceinline__ float rstd_checked(double ss, float eps, bool& undecided) {
    const double t = rstd_f64(ss, eps);
    const double inf = __longlong_as_double(0x7FF0000000000000ll);
    const bool exact_anyway = ss == 0.0 || !(ss < inf);  // 0, +Inf or NaN
    const long long residue = __double_as_longlong(t) & ((1ll << 29) - 1);
    const long long dist = residue > (1ll << 28) ? residue - (1ll << 28) : (1ll << 28) - residue;
    const double f32_normal_floor = __longlong_as_double((long long)(1023 - 125) << 52);  // 2^-125
    const bool decided = t >= f32_normal_floor && t < inf && dist > SUM_DEPTH + 16 && !FP4_FORCE_EXACT_SUMSQ;
    undecided = !exact_anyway && !decided;
    return __double2float_rn(t);
}

// The UE8M0 code of a block, ue8m0_ceil_code(RN32(amax / 6)), without the division: for
// amax = M 2^E (M in [1, 2)), amax / 6 = (M / 1.5) 2^(E - 2). With M > 1.5 it lies strictly
// between 2^(E - 2) and 2^(E - 1) (rounding cannot reach 2^(E - 1)); with M = 1.5 it is
// 2^(E - 2); with M < 1.5 it lies in [2^(E - 3), 2^(E - 2)) (rounding cannot reach 2^(E - 2)).
// So the smallest e with 2^e >= RN32(amax / 6) is E - 2 + [M > 1.5], and the code is that
// plus 127, clamped at 0. One exception: in the subnormal range the quotient of
// M = 1.5 + 2^-23 at E = -125 rounds down to 2^-127 (code 0), hence the threshold one
// higher there. amax is +0 or more, or NaN (a maximum of absolute values). Checked against
// ue8m0_ceil_code(__fdiv_rn(amax, 6)) on every such f32 by the codec self-check kernel.
__device__ __forceinline__ u32 ue8m0_code_of_amax(float amax) {
    const u32 b = __float_as_uint(amax) & 0x7FFFFFFFu;
    if (b >= 0x7F800000u) return b == 0x7F800000u ? 254u : 255u;
    const u32 e = b >> 23;
    const int c = (int)e - 2 + (int)((b & 0x7FFFFFu) > 0x400000u + (e == 2u ? 1u : 0u));
    return (u32)max(c, 0);
}

// E4M3(RN32(x / 6)) without the division routine (FCHK, a branch to a slow path): with
// c = RN32(1/6), q = RN32(a c) is within an ulp of a / 6 and r = a - 6 q is exact, so
// RN32(q + r c) is RN32(a / 6) wherever nothing underflows; below that (|x| < 2^-125) the
// quotient differs in its last bits but every E4M3 code is the same (0). |x| is clamped
// to 2^30 first (every |x| from 2688 up saturates to 448; Inf - Inf would give NaN) and
// the sign put back (-0 / 6 = -0: code 0x80). Checked on all 2^32 inputs against
// E4M3(__fdiv_rn(x, 6)) by the codec self-check kernel (FP4_KIND 3).
__device__ __forceinline__ float div6_for_e4m3(float x) {
    float a;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(a) : "f"(fabsf(x)), "f"(1073741824.0f));
    const float c = 0.16666667163372039795f;  // RN32(1/6)
    const float q = __fmul_rn(a, c);
    const float r = __fmaf_rn(-q, 6.0f, a);
    const float s = __fmaf_rn(r, c, q);
    return __uint_as_float(__float_as_uint(s) | (__float_as_uint(x) & 0x80000000u));
}

// A block's scale code and the inverse scale its values are multiplied by (SPEC.md §1.6).
__device__ __forceinline__ void block_scale(float amax, float gs, u32& code, float& inv) {
#if FP4_UE8M0
    code = ue8m0_code_of_amax(amax);
    inv = ue8m0_inverse(code);
#else
    code = e4m3_encode_fast(div6_for_e4m3(__fmul_rn(gs, amax)));
    const float d = e4m3_decode_fast(code);
    inv = (d == 0.0f) ? 0.0f : __fdiv_rn(gs, d);
#endif
}

#if __CUDA_ARCH__ >= 900
// Fetches `bytes` (a multiple of 16) from the 16-byte aligned `src` into L2 (sm_90+).
__device__ __forceinline__ void prefetch_l2(const void* src, u32 bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src), "r"(bytes) : "memory");
}
#endif

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}


#if FP4_KIND == 0
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

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

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
// The fused kernel. A group of FP4_G threads owns one row; thread t of the group
// handles 8-element vectors t, t+G, t+2G, ... so every warp access is contiguous.
// The vectors of one scale block sit in VPB neighbouring lanes, which combine
// their block maximum with one or two shuffles.


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
    store_vec(p.r + row * p.r_stride + v * 8, h);
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
        for (int lv = lane; lv < NVC; lv += FP4_G) sq_buckets_add(buckets, load_vec(hrow_again + (v0 + lv) * 8));
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

// The launch bound's minimum of resident CTAs per SM: decided by the host
// (KernelConfig::min_ctas_per_sm in src/cuda/kernel.rs), which also sizes the L2
// prefetch's resident wave from it.
#define MIN_CTAS_PER_SM FP4_MIN_CTAS
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
        if (lane + k * FP4_G < NVC) wv[k] = load_weight(p.w + (v0 + lane + k * FP4_G) * 8);
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
                        xc[c] = load_vec_ro(xrow + (v0 + lv) * 8);
#if FP4_RESIDUAL
                        rc[c] = load_vec(rrow + (v0 + lv) * 8);
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
        // after this row's loads so that it never delays them (the host chooses pf_rows,
        // 0 where it does not pay: src/cuda/kernel.rs, l2_prefetch_rows). Not compiled into
        // the one-vector-per-thread kernels: only the latency shapes (M up to the SM
        // count) have them, where it never runs and would only lengthen the row's chain.
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
            pass2_row<false>(p, row, lane, v0, rstd_pass2, gs, hv, wv);
#else
            pass2_row<false>(p, row, lane, v0, rstd_pass2, gs, hv, nullptr);
#endif
        }
#if FP4_SWIZZLED && !FP4_SWZ_SPLIT
        else if (row < p.rows_total && v0 == 0) {
            // Rows m..Mp of the last 128-row tile: scale padding, written as zero.
            for (int j = lane; j < NK4; j += FP4_G) p.sf_swizzled[swizzled_offset(row, j)] = 0;
        }
#endif
        if (any_undecided) {
            exact_sum_redo(&p, rstd, gs, live, mine_undecided);
        }
    }
}

#endif  // FP4_KIND == 0

// ---------------------------------------------------------------------------
// Dequantisation (SPEC.md §4): one thread per 8 elements.

struct Fp4DequantParams {
    const u8* q;
    const u8* sf;
    const float* gs;
    float* out;
    i64 m;
};

#if FP4_KIND == 1
extern "C" __global__ void __launch_bounds__(256) fp4norm_dequant(const Fp4DequantParams p) {
#if __CUDA_ARCH__ >= 900
    // Launched with programmatic dependent launch when the Gpu's PDL is on: wait for the
    // previous kernel (typically the fused one, which lets dependents start early).
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;  // vector index
    if (idx >= p.m * NV) return;
    const i64 row = idx / NV;
    const int v = (int)(idx % NV);
    const int b = v / VPB;
#if FP4_SWIZZLED
    const u32 code = p.sf[swizzled_offset(row, b)];
#else
    const u32 code = p.sf[row * NB + b];
#endif
#if FP4_UE8M0
    const float scale = (code == 0u) ? __uint_as_float(1u << 22)
                      : (code == 255u) ? __uint_as_float(0x7FFFFFFFu) : __uint_as_float(code << 23);
#else
    const float d = e4m3_decode(code);
#if FP4_GS == 0
    const float gs = 1.0f;
#elif FP4_GS == 1
    const float gs = p.gs[0];
#else
    const float gs = p.gs[row];
#endif
#endif
    const u32 packed = *(const u32*)(p.q + row * (FP4_H / 2) + v * 4);
    const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float* o = p.out + row * FP4_H + v * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 c = (packed >> (4 * i)) & 0xFu;
        const float e = (c & 8u) ? -mags[c & 7u] : mags[c & 7u];
#if FP4_UE8M0
        o[i] = __fmul_rn(e, scale);
#else
        o[i] = __fdiv_rn(__fmul_rn(e, d), gs);
#endif
    }
}
#endif  // FP4_KIND == 1

// ---------------------------------------------------------------------------
// A plain SM copy (16 bytes per access, grid-stride): the bandwidth yardstick the
// benchmarks compare the fused kernel with (SPEC.md §6).
#if FP4_KIND == 2
extern "C" __global__ void __launch_bounds__(512) fp4norm_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, i64 n) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    // Four independent 16-byte loads in flight per thread, then four stores.
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const i64 i = base + k * stride;
            if (i < n)
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(src + i));
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const i64 i = base + k * stride;
            if (i < n)
                asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
                             :: "l"(dst + i), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w) : "memory");
        }
    }
}
#endif  // FP4_KIND == 2

// ---------------------------------------------------------------------------
// Codec self-check: the fast encoders of the fused kernel against the literal ones, on
// every f32 bit pattern (and every E4M3 code for the decoder). The literal encoders are
// SPEC.md §2 line by line (and checked against the CPU reference by the GPU tests);
// this proves the fast ones equal them everywhere, not just on the data the tests draw.
// result: [0] E2M1 mismatches (groups of eight, as drawn and with mixed signs), [1] lowest
// mismatching group's first input, [2] E4M3 encode mismatches (e4m3_encode_fast(x) against
// e4m3_encode(x), and the block scale's e4m3_encode_fast(div6_for_e4m3(x)) against
// e4m3_encode(__fdiv_rn(x, 6))), [3] lowest mismatching input, [4] E4M3 decode mismatches, [5] lowest mismatching code,
// [6] inputs checked / 8, [7] UE8M0 block-code mismatches (ue8m0_code_of_amax against
// ue8m0_ceil_code(__fdiv_rn(x, 6)), on every x >= +0 and NaN: what a block maximum can be),
// [8] lowest mismatching input. The host zeroes [0], [2], [4], [6], [7] and sets [1], [3],
// [5], [8] to ~0.
#if FP4_KIND == 3
// One group of eight values (none NaN) through both fast E2M1 encoders against the literal
// one: the clamped encoder on the values as given, the unclamped one on those below 7 (the
// others as +0, as it is never used on them). A mismatch counts in result[0], the group's
// first input in result[1].
__device__ __forceinline__ void check_e2m1_group(const float (&p)[8], u64 base, u32* result) {
    float below7[8];
    u32 want = 0, want7 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        below7[i] = (fabsf(p[i]) < 7.0f) ? p[i] : 0.0f;
        want |= e2m1_encode_sw(p[i]) << (4 * i);
        want7 |= e2m1_encode_sw(below7[i]) << (4 * i);
    }
    if (e2m1_pack8_fast<false>(p) != want || e2m1_pack8_fast<true>(below7) != want7) {
        atomicAdd(&result[0], 1u);
        atomicMin(&result[1], (u32)base);
    }
}

extern "C" __global__ void __launch_bounds__(256) fp4norm_codec_check(u32* result) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // as in fp4norm_dequant
#endif
    const u64 first = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    const u64 stride = (u64)gridDim.x * blockDim.x * 8;
    u32 groups = 0;
    for (u64 base = first; base < (1ull << 32); base += stride) {
        ++groups;
        float p[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 bits = (u32)(base + i);
            const float v = __uint_as_float(bits);
            // E4M3, NaN included.
            if (e4m3_encode_fast(v) != e4m3_encode(v)
                || e4m3_encode_fast(div6_for_e4m3(v)) != e4m3_encode(__fdiv_rn(v, 6.0f))) {
                atomicAdd(&result[2], 1u);
                atomicMin(&result[3], bits);
            }
            if (((bits >> 31) == 0 || v != v) && ue8m0_code_of_amax(v) != ue8m0_ceil_code(__fdiv_rn(v, 6.0f))) {
                atomicAdd(&result[7], 1u);
                atomicMin(&result[8], bits);
            }
            // E2M1: the fast encoders are only used on values that are not NaN (NaN lanes
            // of a group are checked as +0 instead).
            p[i] = (v != v) ? 0.0f : v;
        }
        check_e2m1_group(p, base, result);
        // The same values with mixed signs (a pattern varying from group to group: the
        // eight patterns of a group share their sign bit), for the sign packing.
        const u32 flips = ((u32)(base >> 3) * 0x9E3779B9u) >> 24;
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = __uint_as_float(__float_as_uint(p[i]) ^ (((flips >> i) & 1u) << 31));
        check_e2m1_group(p, base, result);
        // Groups of eight independent values: the groups above hold neighbouring bit
        // patterns, almost all of one code, so they would not see codes packed into the
        // wrong nibbles. Each position takes one of 16 values, with its own sign, chosen by a
        // hash of the group: every code and every tie below 7, and two values from 7 up
        // (the unclamped encoder sees those as +0).
        const u32 pick = ((u32)(base >> 3) ^ 0x5BD1E995u) * 0x9E3779B9u;
        const u32 pick_signs = (pick * 0x85EBCA6Bu) ^ (pick >> 13);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const u32 k = (pick >> (4 * i)) & 15u;
            const float mag = k == 0 ? 0.0f : k == 1 ? 0.25f : k == 2 ? 0.2500001f : k == 3 ? 0.75f
                            : k == 4 ? 0.7499999f : k == 5 ? 1.25f : k == 6 ? 1.5f : k == 7 ? 1.75f
                            : k == 8 ? 7.0f : k == 9 ? 2.5f : k == 10 ? 3.0f : k == 11 ? 3.5f
                            : k == 12 ? 1.0e30f : k == 13 ? 5.0f : k == 14 ? 5.0000005f : 6.9999995f;
            p[i] = ((pick_signs >> i) & 1u) ? -mag : mag;
        }
        check_e2m1_group(p, base, result);
    }
    atomicAdd(&result[6], groups);
    if (first == 0) {
        for (u32 code = 0; code < 256; ++code) {
            const float a = e4m3_decode_fast(code), b = e4m3_decode(code);
            const bool same = (a != a) ? (b != b) : (__float_as_uint(a) == __float_as_uint(b));
            if (!same) {
                atomicAdd(&result[4], 1u);
                atomicMin(&result[5], code);
            }
        }
    }
}
#endif  // FP4_KIND == 3

// ---------------------------------------------------------------------------
// The swizzle pass of a split swizzled write (FP4_SWZ_SPLIT): one CTA per 128-row tile and
// chunk of SWZ_CHUNK blocks. It reads the chunk's codes (from the staging layout in the
// swizzled buffer itself, or from the row-major scales when those were written too; rows
// past m and blocks past NB read as 0: the layout's padding), then writes the chunk's
// 128x4 form over the same bytes with 16-byte stores. Launched right after the fused
// kernel, with programmatic dependent launch where the GPU has it.
struct Fp4SwizzleParams {
    const u8* sf_row_major;  // [m, NB], or null: the staging layout in sf_swizzled
    u8* sf_swizzled;         // [Mp * NK4]
    i64 m;
};

#if FP4_KIND == 4
extern "C" __global__ void __launch_bounds__(256) fp4norm_swizzle(const Fp4SwizzleParams p) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    constexpr int chunks = (NK4 + SWZ_CHUNK - 1) / SWZ_CHUNK;
    const i64 tile = blockIdx.x / chunks;
    const int b0 = (int)(blockIdx.x % chunks) * SWZ_CHUNK;
    const int wq = min(SWZ_CHUNK, NK4 - b0) / 4;  // 4-block words per row of the chunk
    const i64 live_rows = min((i64)128, p.m - tile * 128);
    u8* tile_base = p.sf_swizzled + tile * (i64)(128 * NK4);
    __shared__ u32 words[128][SWZ_CHUNK / 4 + 1];  // +1: conflict-free column reads

    for (int i = threadIdx.x; i < 128 * wq; i += blockDim.x) {
        const int r = i / wq, c = i % wq;
        const int b = b0 + 4 * c;
        u32 word = 0;
        if (r < live_rows) {
#if FP4_ROW_MAJOR
            const u8* src = p.sf_row_major + (tile * 128 + r) * (i64)NB + b;
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (b + k < NB) word |= (u32)src[k] << (8 * k);
#else
            word = *(const u32*)(tile_base + (i64)b0 * 128 + r * (4 * wq) + 4 * c);
            const int valid = NB - b;  // blocks of this word inside the row (>= 1)
            if (valid < 4) word &= (1u << (8 * valid)) - 1u;
#endif
        }
        words[r][c] = word;
    }
    __syncthreads();
    const bool aligned16 = ((u64)p.sf_swizzled & 15u) == 0;
    for (int i = threadIdx.x; i < 32 * wq; i += blockDim.x) {
        const int c = i / 32, r = i % 32;
        u8* dst = tile_base + (i64)(b0 / 4 + c) * 512 + r * 16;
        const u32 w0 = words[r][c], w1 = words[r + 32][c], w2 = words[r + 64][c], w3 = words[r + 96][c];
        if (aligned16) {
            asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
                         :: "l"(dst), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
        } else {
            *(u32*)dst = w0;
            *(u32*)(dst + 4) = w1;
            *(u32*)(dst + 8) = w2;
            *(u32*)(dst + 12) = w3;
        }
    }
}
#endif  // FP4_KIND == 4
