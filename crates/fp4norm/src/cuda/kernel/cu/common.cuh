// fp4norm CUDA kernels, the shared part: element conversions, the codecs (SPEC.md §2),
// memory access and small PTX helpers. Every kernel file (fused.cu, swizzle.cu,
// dequant.cu, copy.cu, codec_check.cu) includes it; the host compiles one kernel file per
// specialisation with NVRTC, prepending the FP4_* defines below and handing this header
// over by name (src/cuda/kernel/source.rs). No CUDA headers are included (NVRTC may lack
// them): 16-bit floats are handled as raw bits with PTX.
//
// Exactness rules (SPEC.md §1, §7): every float operation is an explicit IEEE
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, __dadd_rn, ...),
// so neither contraction into FMA nor approximate division can change a result;
// the host also compiles with --fmad=false -ftz=false -prec-div=true -prec-sqrt=true.
//
// Configuration macros, every one set for every kernel by the host
// (KernelConfig::defines, src/cuda/kernel/config.rs):
//   FP4_KIND         which kernel: 0 fused.cu, 1 dequant.cu, 2 copy.cu, 3 codec_check.cu,
//                    4 swizzle.cu, 5 column_scales.cu (each file checks that it is
//                    compiled as its own kind)
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
//   FP4_WBIAS        (defined or not) a nonzero weight bias is added to every weight
//   FP4_PAD_SPREAD   (defined or not) the swizzled padding rows of the last 128-row tile
//                    zeroed by every thread of the grid after its row, coalesced;
//                    else by CTAs of their own
//   FP4_SWZ_DEMOTE_TILES  (defined or not) kept swizzled words handed back to L2's normal
//                    eviction this many 128-row tiles behind each row
//   FP4_AR_RANKS     (defined or not) the ranks' inputs summed in front (SPEC.md §9)
//   FP4_AR_PEER      (defined or not) ... read over peer access from the ranks' buffers,
//                    with signal pads between the ranks' CTAs (fused.cu, ranks_barrier)
//   FP4_LITERAL_CODECS    (defined or not) every E2M1, E4M3 and UE8M0 code from the literal
//                    encoders, no hardware conversion: where the self-test failed
//   FP4_RSTD_SEED_ULPS    (defined or not; fused kernel) rows decided by rstd from an rsqrt
//                    seed, within this many f64 ulps of the IEEE chain's (rstd_checked in
//                    fused.cu); the host sets it where the self-test passed
//   FP4_G            threads per row (a multiple of 32)
//   FP4_R            rows per CTA
//   FP4_C            CTAs per row: >1 splits each row over a thread-block cluster whose
//                    CTAs exchange partial sums of squares through distributed shared
//                    memory (sm_90+; FP4_R is then 1)
//   FP4_FORCE_EXACT_SUMSQ  1: every row takes the exact sum of squares (a test knob that
//                    runs the rare slow path everywhere; see rstd_checked in fused.cu)
//   FP4_VEC_ALIGNED  1: 16-byte vector loads/stores; 0: element-wise path for
//                    pointers or strides that are not 16-byte aligned
//   FP4_SWZ_SPLIT    1: the swizzled scales are written by a second kernel (swizzle.cu):
//                    the fused kernel leaves each row's codes in the swizzled buffer in a
//                    staging layout with coalesced byte stores (or, with row-major scales
//                    also requested, only writes those), and the swizzle pass moves every
//                    128-row x 64-block chunk into the 128x4 layout, in place, with 16-byte
//                    stores, where the direct path's 4-byte stores each hit their own
//                    32-byte sector. The host uses it where the extra launch pays
//                    (swizzle_split_wanted, src/cuda/kernel/launch_table.rs).
//   FP4_SWZ_KEEP     1 (direct swizzled write only): each 4-byte swizzled word is stored with
//                    an L2 evict-last policy, so that the 32-byte sectors the four row
//                    quarters of a 128-row tile fill piecewise stay in L2 until complete
//                    instead of being written back part-filled while the call streams
//                    tens of MB past them (swizzle_keep_wanted, launch_table.rs).
//   FP4_HOLD_IN_REGS 1: each thread keeps its vectors of the row in registers between the
//                    two passes; 0: the second pass re-reads them (KernelConfig::
//                    holds_rows_in_registers)
//   FP4_MIN_CTAS     the fused kernel's launch bound: minimum resident CTAs per SM
//                    (KernelConfig::min_ctas_per_sm)
//
// FP8 outputs (SPEC.md §8; defined only for the FP8 kernels, so FP4 sources are unchanged):
//   FP8_OUT          (defined or not) the fused kernel writes FP8 codes [m, H], one byte each
//   FP8_E5M2         0: E4M3 elements, 1: E5M2
//   FP8_SCALING      0: one per-tensor scale s (FP4_GS 1: gs[0] from memory, 0: a parameter),
//                    1: dynamic f32 group scales, 2: dynamic UE8M0 group scales
//   FP8_PER_TOKEN    1: one dynamic scale per row (FP4_BLOCK = H; the row's threads reduce
//                    its amax together, over a cluster by st.async), 0: groups of FP4_BLOCK
//   FP8_COL_MAJOR    1: scales column-major [H/G, Mp4] (FP4_ROW_MAJOR: row-major [M, H/G];
//                    FP4_SWIZZLED: MXFP8's 128x4 layout of UE8M0 codes, G = 32)
//   FP8_COL_KEEP     (defined or not) column-major scales stored with an L2 evict-last
//                    policy (column_scales_keep_wanted, launch_table.rs)
//   FP8_COL_DEMOTE_ROWS  (defined or not) kept column-major scales handed back to L2's
//                    normal eviction this many rows behind each row
//                    (column_scales_demote_rows, launch_table.rs)
//   FP8_COL_SPLIT    (defined or not) column-major f32 scales written by a second kernel
//                    (column_scales.cu): the fused kernel stores the scales of each
//                    8-row x COL_TILE_G-group tile in a staging order, each warp's groups of
//                    a row one coalesced store, and the pass reorders every tile in place
//                    (column_scales_split_wanted, launch_table.rs)

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// FP8_TAIL (FP8 per-tensor and per-token kernels only): H % 8 when that is not 0. The row's
// last vector then holds FP8_TAIL elements: its loads read the others as 0 (a 0 adds
// nothing to the sum of squares, and y = 0 changes no amax) and its stores skip them. Only
// the element-wise kernels have one (FP4_VEC_ALIGNED 0: such rows are never 16-byte aligned).
#ifndef FP8_TAIL
#define FP8_TAIL 0
#endif
#if FP8_TAIL && FP4_VEC_ALIGNED
#error "rows with a partial last vector take the element-wise kernel"
#endif
#define NV ((FP4_H + 7) / 8)             // 8-element vectors per row (the last partial with FP8_TAIL)
// Elements of vector v of a row.
#define VEC_N(v) ((FP8_TAIL != 0 && (v) == NV - 1) ? FP8_TAIL : 8)
#define VPB (FP4_BLOCK / 8)              // vectors per scale block
#define NB (FP4_H / FP4_BLOCK)           // blocks per row
#define NK4 (((NB + 3) / 4) * 4)         // blocks per row, padded to the swizzle tile
#define COL_TILE_G (32 / VPB)           // FP8_COL_SPLIT: groups per staging tile (one warp's)

// FP8_COL_SPLIT's staging order inside one tile of 8 rows x COL_TILE_G groups of the
// column-major f32 scales [H/G, mp4]: the tile's COL_TILE_G lines of 8 scales (32 bytes
// each) hold its scales row after row, so that the COL_TILE_G scales of one row (a warp's
// groups) are contiguous. The word of (row r, group j) of the tile, as an offset from the
// tile's first word: the column_scales.cu pass reads it back from there.
__device__ __forceinline__ i64 col_staged_offset(int r, int j, i64 mp4) {
    const int k = r * COL_TILE_G + j;
    return (i64)(k / 8) * mp4 + k % 8;
}

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
#elif __CUDA_ARCH__ >= 900
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(x), "r"(r));
#else
    // No packed bf16 add before sm_90: the f32 sums rounded to bf16 are the same values.
    return f32x2_to_elem(elem_to_f32(x & 0xFFFFu) + elem_to_f32(r & 0xFFFFu),
                         elem_to_f32(x >> 16) + elem_to_f32(r >> 16));
#endif
    return canonical_nan2(d);
}

__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = elem_to_f32(w[i] & 0xFFFFu);
        f[2 * i + 1] = elem_to_f32(w[i] >> 16);
    }
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
// (codec_check.cu), and their arithmetic on the host by scripts/e2m1-below7-check.c.
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
#if defined(FP4_LITERAL_CODECS)
    (void)inv_finite;
    (void)amax_finite;
#elif FP4_HW_E2M1
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
// kernel (codec_check.cu).
__device__ __forceinline__ u32 e4m3_encode_fast(float s) {
#if __CUDA_ARCH__ >= 890 && !defined(FP4_LITERAL_CODECS)
    u32 d;
    asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; cvt.u32.u16 %0, t; }"
        : "=r"(d) : "f"(0.0f), "f"(s));
    return (s != s) ? 0x7Fu : (d & 0xFFu);
#else
    return e4m3_encode(s);
#endif
}

__device__ __forceinline__ float e4m3_decode_fast(u32 code) {
#if __CUDA_ARCH__ >= 890 && !defined(FP4_LITERAL_CODECS)
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

// E5M2 (SPEC.md §8), written exactly as crates/fp4norm/src/codec.rs: bias 15, max 57344
// (saturating, infinities included), subnormal step 2^-16, NaN -> 0x7F.
__device__ __forceinline__ u32 e5m2_encode(float s) {
    const u32 bits = __float_as_uint(s);
    const u32 sign = (bits >> 24) & 0x80u;
    const u32 abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return 0x7Fu;
    const float a = __uint_as_float(abs_bits);
    if (a >= 57344.0f) return sign | 0x7Bu;
    if (abs_bits < 0x38800000u) {
        // below 2^-14: multiples of 2^-16, round half to even (exact scaling by 2^16)
        return sign | (u32)__float2int_rn(__fmul_rn(a, 65536.0f));
    }
    const u32 rebiased = abs_bits - ((127u - 15u) << 23);
    const u32 rounded = (rebiased + 0xFFFFFu + ((rebiased >> 21) & 1u)) >> 21;
    return sign | min(rounded, 0x7Bu);
}

// Two FP8 element codes (SPEC.md §8: round to nearest even, saturating, NaN -> 0x7F), lo in
// bits 0-7 and hi in bits 8-15, E5M2 or E4M3. FAST: the hardware conversion
// cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (sm_89+), which rounds and saturates as SPEC.md
// says but keeps a NaN's sign, so NaN inputs get 0x7F here; two values per instruction
// where the literal encoders take ~15 instructions each. Checked against the literal
// encoders on every f32 by the codec self-check kernel (codec_check.cu).
template <bool E5M2, bool FAST>
__device__ __forceinline__ u32 fp8x2_encode(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    if (FAST) {
        u32 d;
        if (E5M2) {
            asm("{ .reg .b16 t; cvt.rn.satfinite.e5m2x2.f32 t, %1, %2; cvt.u32.u16 %0, t; }" : "=r"(d) : "f"(hi), "f"(lo));
        } else {
            asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; cvt.u32.u16 %0, t; }" : "=r"(d) : "f"(hi), "f"(lo));
        }
        if (lo != lo) d = (d & 0xFF00u) | 0x7Fu;
        if (hi != hi) d = (d & 0x00FFu) | 0x7F00u;
        return d;
    }
#endif
    return E5M2 ? (e5m2_encode(lo) | (e5m2_encode(hi) << 8)) : (e4m3_encode(lo) | (e4m3_encode(hi) << 8));
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

// ue8m0_ceil_code(RN32(amax / D)) without the division, for a divisor
// D = (1 + T 2^-23) 2^K whose mantissa keeps every quotient off the powers of two it does
// not equal: for amax = M 2^E (M in [1, 2)), amax / D = (M / D') 2^(E - K) with D' = D 2^-K.
// With M > D' it lies strictly between 2^(E - K) and 2^(E - K + 1) (rounding cannot reach
// 2^(E - K)); with M = D' it is 2^(E - K); with M < D' it lies in [2^(E - K - 1), 2^(E - K))
// (rounding cannot reach 2^(E - K)). So the smallest e with 2^e >= RN32(amax / D) is
// E - K + [M > D'], and the code is that plus 127, clamped at 0. One exception: in the
// subnormal range the quotient of M = D' + 2^-23 at E = K - 127 rounds down to 2^-127
// (code 0), hence the threshold one higher there. amax is +0 or more, or NaN (a maximum of
// absolute values). The FP4 blocks divide by 6 (K = 2, T = 2^22); FP8 groups by 448 (8,
// 3 2^21) or 57344 (15, 3 2^21). Checked against ue8m0_ceil_code(__fdiv_rn(amax, D)) on
// every such f32 by the codec self-check kernel (codec_check.cu).
template <u32 K, u32 T>
__device__ __forceinline__ u32 ue8m0_code_of_quotient(float amax) {
    const u32 b = __float_as_uint(amax) & 0x7FFFFFFFu;
    if (b >= 0x7F800000u) return b == 0x7F800000u ? 254u : 255u;
    const u32 e = b >> 23;
    const int c = (int)e - (int)K + (int)((b & 0x7FFFFFu) > T + (e == K ? 1u : 0u));
    return (u32)max(c, 0);
}

// The UE8M0 code of an FP4 block, ue8m0_ceil_code(RN32(amax / 6)).
__device__ __forceinline__ u32 ue8m0_code_of_amax(float amax) { return ue8m0_code_of_quotient<2, 0x400000u>(amax); }

// E4M3(RN32(x / 6)) without the division routine (FCHK, a branch to a slow path): with
// c = RN32(1/6), q = RN32(a c) is within an ulp of a / 6 and r = a - 6 q is exact, so
// RN32(q + r c) is RN32(a / 6) wherever nothing underflows; below that (|x| < 2^-125) the
// quotient differs in its last bits but every E4M3 code is the same (0). |x| is clamped
// to 2^30 first (every |x| from 2688 up saturates to 448; Inf - Inf would give NaN) and
// the sign put back (-0 / 6 = -0: code 0x80). Checked on all 2^32 inputs against
// E4M3(__fdiv_rn(x, 6)) by the codec self-check kernel (codec_check.cu).
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
// With FP4_LITERAL_CODECS (the host sets it where the conversion self-test failed, or when
// asked to) every code comes from the literal SPEC.md encoders and a true division.
__device__ __forceinline__ void block_scale(float amax, float gs, u32& code, float& inv) {
#if FP4_UE8M0 && defined(FP4_LITERAL_CODECS)
    code = ue8m0_ceil_code(__fdiv_rn(amax, 6.0f));
    inv = ue8m0_inverse(code);
#elif FP4_UE8M0
    code = ue8m0_code_of_amax(amax);
    inv = ue8m0_inverse(code);
#elif defined(FP4_LITERAL_CODECS)
    code = e4m3_encode(__fdiv_rn(__fmul_rn(gs, amax), 6.0f));
    const float d = e4m3_decode(code);
    inv = (d == 0.0f) ? 0.0f : __fdiv_rn(gs, d);
#else
    code = e4m3_encode_fast(div6_for_e4m3(__fmul_rn(gs, amax)));
    const float d = e4m3_decode_fast(code);
    inv = (d == 0.0f) ? 0.0f : __fdiv_rn(gs, d);
#endif
}

// ---------------------------------------------------------------------------
// Memory access. The aligned path moves 16 bytes per access; the fallback moves
// one element at a time, for views whose pointers or strides are not 16-byte aligned.

// Eight elements, one 16-bit load each (the fallback for unaligned views); the n first of
// them (VEC_N), the others 0.
__device__ __forceinline__ uint4 load_elems(const u16* p, int n = 8) {
    u32 e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = i < n ? p[i] : 0u;
    return make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16), e[6] | (e[7] << 16));
}

// The vector loads and stores take n, the vector's elements (VEC_N), for the element-wise
// path; the 16-byte path always has 8.
__device__ __forceinline__ uint4 load_vec_ro(const u16* p, int n = 8) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_elems(p, n);
#endif
}

__device__ __forceinline__ uint4 load_vec(const u16* p, int n = 8) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_elems(p, n);
#endif
}

__device__ __forceinline__ uint4 load_weight(const u16* p, int n = 8) {
#if FP4_VEC_ALIGNED
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return load_vec(p, n);
#endif
}

__device__ __forceinline__ void store_vec(u16* p, uint4 v, int n = 8) {
#if FP4_VEC_ALIGNED
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (2 * i < n) p[2 * i] = (u16)(w[i] & 0xFFFFu);
        if (2 * i + 1 < n) p[2 * i + 1] = (u16)(w[i] >> 16);
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

// Its 4-byte twin (4-byte aligned `p`): FP8_COL_KEEP's f32 scales.
__device__ __forceinline__ void store_u32_keep_in_l2(u32* p, u32 v) {
    asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" :: "l"(p), "r"(v), "l"(l2_evict_last_policy()) : "memory");
}

#if __CUDA_ARCH__ >= 900
// Fetches `bytes` (a multiple of 16) from the 16-byte aligned `src` into L2 (sm_90+).
__device__ __forceinline__ void prefetch_l2(const void* src, u32 bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(src), "r"(bytes) : "memory");
}
#endif

// ---------------------------------------------------------------------------
// Reductions and shared-memory addresses.

// max that propagates NaN (SPEC.md §1.5: a NaN anywhere makes amax NaN).
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
