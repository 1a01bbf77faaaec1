// The swizzle pass (FP4_KIND 4), fp4norm_swizzle: the second kernel of a split swizzled
// write (FP4_SWZ_SPLIT in the fused kernel), one CTA per 128-row tile and chunk of
// SWZ_CHUNK blocks. It reads the chunk's codes (from the staging layout in the
// swizzled buffer itself, or from the row-major scales when those were written too; rows
// past m and blocks past NB read as 0: the layout's padding), then writes the chunk's
// 128x4 form over the same bytes with 16-byte stores. Launched right after the fused
// kernel, with programmatic dependent launch where the GPU has it. The configuration
// macros are listed in common.cuh.

#include "common.cuh"

#if FP4_KIND != 4
#error "swizzle.cu is the FP4_KIND 4 kernel"
#endif

struct Fp4SwizzleParams {
    const u8* sf_row_major;  // [m, NB], or null: the staging layout in sf_swizzled
    u8* sf_swizzled;         // [Mp * NK4]
    i64 m;
};

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
