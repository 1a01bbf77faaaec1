// The copy kernel (FP4_KIND 2), fp4norm_copy: a plain SM copy (16 bytes per access,
// grid-stride), the bandwidth yardstick the benchmarks compare the fused kernel with
// (SPEC.md §6). The configuration macros are listed in common.cuh.

#include "common.cuh"

#if FP4_KIND != 2
#error "copy.cu is the FP4_KIND 2 kernel"
#endif

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
