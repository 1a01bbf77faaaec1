// The dequantisation kernel (FP4_KIND 1), fp4norm_dequant: packed E2M1 codes and their
// block scales back to f32 (SPEC.md §4), one thread per 8 elements. The configuration
// macros are listed in common.cuh.

#include "common.cuh"

#if FP4_KIND != 1
#error "dequant.cu is the FP4_KIND 1 kernel"
#endif

struct Fp4DequantParams {
    const u8* q;
    const u8* sf;
    const float* gs;
    float* out;
    i64 m;
};

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
