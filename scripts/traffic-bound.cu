// The memory-traffic bound of the fused op: kernels that move exactly the bytes of
// fp4norm's call (SPEC.md §6: read x and r, write r, the packed FP4 codes and the
// row-major scale bytes, read w) in fp4norm's launch shape (one CTA per row, 16-byte
// vectors, two per thread), but compute next to nothing. If these kernels reach only about
// what fp4norm reaches, the remaining gap to the copy is the access pattern's, not the
// math's. It prints GB/s and its own 2 GiB copy figure, from a plain grid-stride copy that
// runs a few % below `fp4norm bench`'s (four loads in flight per thread); BENCHMARKS.md
// compares both programs against fp4norm's copy measured in the same run.
// `traffic-bound curve`: bandwidth of row+barrier against d rounds of the pass-2 stand-in.
// `traffic-bound occupancy`: the same with 4-6 resident CTAs per SM (16384 x 4096); k = 60 is
// six CTAs with as much dynamic shared memory per SM as the capped runs (the L1 split alike).
// `traffic-bound neighbour`: row+barrier after a kernel holding ~200 KB of shared memory per
// SM (as GEMMs do), with no carve-out preference and with the largest L1 preferred.
// Build and run on the GPU machine (nvcc 13.0 there; nothing here links fp4norm):
//   nvcc -O3 -arch=sm_90 -o /tmp/traffic-bound scripts/traffic-bound.cu && /tmp/traffic-bound
//
// Kernels (each timed as the median per call of CUDA-graph replays of 20 launches; the
// last column a 16-byte copy kernel moving the call's own byte count, half read, half written):
//   row            one CTA per row: load x, r; store h = x + r (integer add: only the bytes
//                  matter), then codes and scale bytes derived from h; no barrier
//   row+barrier    row + fp4norm's phase structure: r stored, then a block-wide sum (warp
//                  shuffles, shared memory, __syncthreads) before the codes are stored, and
//                  w (16 bytes per vector, L2-resident) read after it
//   row+bar+busy   row+barrier + ~448 FMAs per thread standing in for pass 2's arithmetic
//   tmaS(+busy)    persistent CTAs, each row's x and r brought into one of S shared-memory
//                  stages by bulk copies (cp.async.bulk) issued S - 1 rows ahead
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef unsigned int u32;

__device__ __forceinline__ uint4 add4(uint4 a, uint4 b) {
    return make_uint4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ u32 fold(uint4 h) { return h.x ^ (h.y << 1) ^ (h.z << 2) ^ (h.w << 3); }

// One CTA per row; nv = H / 8 vectors per row; VPT vectors per thread.
// Stand-in for pass 2's arithmetic: DELAY rounds of eight independent FMA chains per vector
// (16 DELAY FMAs per thread at two vectors), folded into the code so it is not removed.
__device__ __forceinline__ u32 busy(uint4 h, int delay) {
    if (delay == 0) return 0;
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = __uint_as_float(((&h.x)[i / 2] >> (16 * (i & 1))) & 0x3FFFu) ;
#pragma unroll 1
    for (int d = 0; d < delay; ++d)
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = fmaf(a[i], 1.0001f, 0.5f);
    u32 f = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) f ^= __float_as_uint(a[i]);
    return f;
}

template <int VPT, bool BARRIER>
__global__ void traffic_row(const uint4* __restrict__ x, uint4* __restrict__ r,
                            const uint4* __restrict__ w, u32* __restrict__ q,
                            unsigned char* __restrict__ sf, int nv, int delay) {
    const long row = blockIdx.x;
    const uint4* xr = x + row * nv;
    uint4* rr = r + row * nv;
    uint4 h[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int v = threadIdx.x + k * blockDim.x;
        h[k] = add4(xr[v], rr[v]);
    }
    u32 s = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int v = threadIdx.x + k * blockDim.x;
        rr[v] = h[k];
        s += fold(h[k]);
    }
    if (BARRIER) {
        __shared__ u32 part[32];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
        __syncthreads();
        u32 t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += part[i];
        s = t;
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int v = threadIdx.x + k * blockDim.x;
        uint4 hv = h[k];
        if (BARRIER) hv = add4(hv, w[v]);
        const u32 code = fold(hv) ^ s ^ busy(hv, delay);
        q[row * nv + v] = code;
        // one scale byte per 16 elements: the even lane of each vector pair writes it
        const u32 other = __shfl_xor_sync(0xffffffffu, code, 1);
        if ((v & 1) == 0) sf[row * (nv / 2) + v / 2] = (unsigned char)(code ^ other);
    }
}

// Persistent CTAs fed by bulk copies (TMA, cp.async.bulk) into S shared-memory stages: the
// loads of the CTA's next S - 1 rows are in flight while it works on one, and they hold no
// registers. Thread 0 issues; an mbarrier per stage counts the bytes in.
__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bulk_row(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wait_phase(u32 bar, u32 phase) {
    u32 done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(phase) : "memory");
}

template <int VPT, int S>
__global__ void traffic_tma(const uint4* __restrict__ x, uint4* __restrict__ r,
                            const uint4* __restrict__ w, u32* __restrict__ q,
                            unsigned char* __restrict__ sf, int nv, long rows, int delay) {
    extern __shared__ __align__(128) uint4 stage[];  // S x (x row, r row)
    __shared__ __align__(8) unsigned long long bar[S];
    __shared__ u32 part[32];
    const u32 row_bytes = nv * 16;
    auto issue = [&](long row, int st) {
        const u32 b = smem_u32(&bar[st]);
        expect_bytes(b, 2 * row_bytes);
        bulk_row(smem_u32(stage + (long)st * 2 * nv), x + row * nv, row_bytes, b);
        bulk_row(smem_u32(stage + (long)st * 2 * nv + nv), r + row * nv, row_bytes, b);
    };
    if (threadIdx.x == 0) {
        for (int st = 0; st < S; ++st)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&bar[st])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int st = 0; st < S; ++st) {
            const long row = blockIdx.x + (long)st * gridDim.x;
            if (row < rows) issue(row, st);
        }
    }
    __syncthreads();
    int it = 0;
    for (long row = blockIdx.x; row < rows; row += gridDim.x, ++it) {
        const int st = it % S;
        wait_phase(smem_u32(&bar[st]), (u32)((it / S) & 1));
        const uint4* xs = stage + (long)st * 2 * nv;
        const uint4* rs = xs + nv;
        uint4* rr = r + row * nv;
        uint4 h[VPT];
        u32 s = 0;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int v = threadIdx.x + k * blockDim.x;
            h[k] = add4(xs[v], rs[v]);
            rr[v] = h[k];
            s += fold(h[k]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
        __syncthreads();  // stage st is read by every thread, and part[] is complete
        u32 t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += part[i];
        if (threadIdx.x == 0) {
            const long next = row + (long)S * gridDim.x;
            // the generic reads of stage st come before the async proxy's writes into it
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            if (next < rows) issue(next, st);
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int v = threadIdx.x + k * blockDim.x;
            const uint4 hv = add4(h[k], w[v]);
            const u32 code = fold(hv) ^ t ^ busy(hv, delay);
            q[row * nv + v] = code;
            const u32 other = __shfl_xor_sync(0xffffffffu, code, 1);
            if ((v & 1) == 0) sf[row * (nv / 2) + v / 2] = (unsigned char)(code ^ other);
        }
        __syncthreads();  // part[] is read before the next row overwrites it
    }
}

// A kernel that takes most of each SM's unified L1 / shared storage as shared memory, as
// cuBLAS GEMMs do: the `neighbour` mode runs it before every row kernel.
__global__ void smem_hog(float* out) {
    extern __shared__ float sm[];
    sm[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = sm[blockDim.x - 1];
}

__global__ void copy16(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

// Median per launch (µs) of graph replays: a graph of `per` launches, replayed `reps` times.
template <class F>
static double time_graph(cudaStream_t s, F launch, int per = 20, int reps = 15) {
    for (int i = 0; i < 3; ++i) launch();
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per; ++i) launch();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    CK(cudaGraphLaunch(ge, s));
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f / per);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t[t.size() / 2];
}


// The op's buffers for an M x H bf16 call (x, r, w, codes, row-major scale bytes) and its
// SPEC.md §6 byte count (NVFP4, row-major scales).
struct Buffers {
    long m, hh;
    int nv;
    uint4 *x, *r, *w;
    u32* q;
    unsigned char* sf;
    Buffers(long m_, long h_) : m(m_), hh(h_), nv((int)(h_ / 8)) {
        const size_t n = (size_t)m * hh;
        CK(cudaMalloc(&x, n * 2)); CK(cudaMalloc(&r, n * 2)); CK(cudaMalloc(&w, hh * 2));
        CK(cudaMalloc(&q, n / 2)); CK(cudaMalloc(&sf, n / 16));
        CK(cudaMemset(x, 0x11, n * 2)); CK(cudaMemset(r, 0x22, n * 2)); CK(cudaMemset(w, 0x33, hh * 2));
    }
    ~Buffers() { cudaFree(x); cudaFree(r); cudaFree(w); cudaFree(q); cudaFree(sf); }
    double bytes() const {
        const double n = (double)m * hh;
        return n * 3.0 * 2 + hh * 2.0 + n / 2.0 + n / 16.0;
    }
    // row+barrier with d rounds of the stand-in, one CTA of nv / 2 threads per row.
    void row(cudaStream_t s, int d, int smem = 0) const {
        traffic_row<2, true><<<m, nv / 2, smem, s>>>(x, r, w, q, sf, nv, d);
    }
};

int main(int argc, char** argv) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // The copy reference: 2 GiB moved (1 GiB read + 1 GiB written), best of an SM copy and
    // cudaMemcpyAsync.
    const size_t cbytes = 1ull << 30;
    uint4 *ca, *cb;
    CK(cudaMalloc(&ca, cbytes));
    CK(cudaMalloc(&cb, cbytes));
    CK(cudaMemset(ca, 1, cbytes));
    const size_t cn = cbytes / 16;
    const double t_sm = time_graph(s, [&] { copy16<<<sms * 32, 512, 0, s>>>(ca, cb, cn); }, 5, 11);
    const double t_dma = time_graph(s, [&] { CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, s)); }, 5, 11);
    const double copy_gbs = 2.0 * cbytes / (std::min(t_sm, t_dma) * 1e3);
    printf("copy 2 GiB: SM kernel %.1f GB/s, cudaMemcpyAsync %.1f GB/s -> reference %.1f GB/s\n",
           2.0 * cbytes / (t_sm * 1e3), 2.0 * cbytes / (t_dma * 1e3), copy_gbs);

    if (argc > 1 && std::string(argv[1]) == "curve") {
        // Bandwidth against arithmetic: row+barrier with d rounds of the stand-in
        // (16 d FMAs per thread, 8 independent chains per vector, ~22 d SASS per thread).
        printf("row+barrier+busy(d): d, FMAs per thread, us, GB/s, %% of the copy reference\n");
        const int shapes2[][2] = {{16384, 4096}, {16384, 8192}};
        for (auto& sh : shapes2) {
            const Buffers B(sh[0], sh[1]);
            for (int d : {0, 2, 4, 6, 8, 10, 12, 16, 20, 28}) {
                const double t = time_graph(s, [&] { B.row(s, d); });
                printf("%6ld %6ld d=%2d fma=%4d %8.2f us %6.0f GB/s %5.1f%%\n", B.m, B.hh, d, 16 * d, t,
                       B.bytes() / (t * 1e3), 100.0 * B.bytes() / (t * 1e3) / copy_gbs);
            }
        }
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "neighbour") {
        // row+barrier after a kernel holding ~200 KB of shared memory per SM: with no
        // carve-out preference, then preferring the largest L1 (carve-out 0).
        const Buffers B(16384, 4096);
        const double bytes = B.bytes();
        float* hog_out;
        CK(cudaMalloc(&hog_out, sms * 4));
        const int hog_smem = 200 * 1024;
        CK(cudaFuncSetAttribute(smem_hog, cudaFuncAttributeMaxDynamicSharedMemorySize, hog_smem));
        auto kern = traffic_row<2, true>;
        auto hog = [&] { smem_hog<<<sms, 256, hog_smem, s>>>(hog_out); };
        const double t_hog = time_graph(s, hog);
        printf("smem_hog (200 KB shared per CTA, one per SM): %.2f us\n", t_hog);
        for (int pref : {-1, 0}) {
            if (pref >= 0) CK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, pref));
            for (int d : {0, 16}) {
                const double alone = time_graph(s, [&] { B.row(s, d); });
                const double pair = time_graph(s, [&] { hog(); B.row(s, d); });
                const double chain = pair - t_hog;
                printf("carveout %2d d=%2d: alone %8.2f us (%5.1f%%), after smem_hog %8.2f us (%5.1f%%)\n", pref, d,
                       alone, 100.0 * bytes / (alone * 1e3) / copy_gbs, chain, 100.0 * bytes / (chain * 1e3) / copy_gbs);
            }
        }
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "occupancy") {
        // row+barrier with resident CTAs per SM capped by unused dynamic shared memory
        // (fp4norm's 256-thread kernels hold five at 47-48 registers; this one six at 40).
        printf("row+barrier+busy(d) with k resident CTAs per SM: k, d, us, GB/s, %% of the copy reference\n");
        const Buffers B(16384, 4096);
        const double bytes = B.bytes();
        const int threads = B.nv / 2;
        auto kern = traffic_row<2, true>;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        // k = 60: six CTAs with dynamic shared memory too (the L1 / shared split as for k <= 5).
        for (int k : {4, 5, 6, 60}) {
            int smem = k == 6 ? 0 : (228 * 1024) / (k == 60 ? 6 : k) - 2048, got = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kern, threads, smem));
            for (int d : {0, 16}) {
                const double t = time_graph(s, [&] { B.row(s, d, smem); });
                printf("%6ld %6ld k=%d (occupancy API: %d) d=%2d %8.2f us %6.0f GB/s %5.1f%%\n", B.m, B.hh, k, got, d, t,
                       bytes / (t * 1e3), 100.0 * bytes / (t * 1e3) / copy_gbs);
            }
        }
        return 0;
    }
    printf("times: median us per call of graph replays; GB/s over SPEC.md 6 bytes\n");
    printf("%6s %6s %8s | %-18s %-18s %-18s %-18s %-18s %-18s %-18s\n", "M", "H", "MB", "row", "row+barrier",
           "row+bar+busy", "tma3", "tma2+busy", "tma3+busy", "copy-same");
    const int shapes[][2] = {{16384, 2048}, {16384, 4096}, {16384, 8192}, {8192, 8192}, {16384, 16384}, {4096, 8192}};
    for (auto& sh : shapes) {
        const Buffers B(sh[0], sh[1]);
        const long m = B.m, hh = B.hh;
        const int nv = B.nv, threads = nv / 2;
        uint4 *x = B.x, *r = B.r, *w = B.w;
        u32* q = B.q;
        unsigned char* sf = B.sf;
        const double bytes = B.bytes();
        const int BUSY = 28;  // 448 FMAs per thread: about pass 2's instruction count
        const double t_row = time_graph(s, [&] { traffic_row<2, false><<<m, threads, 0, s>>>(x, r, w, q, sf, nv, 0); });
        const double t_bar = time_graph(s, [&] { B.row(s, 0); });
        const double t_busy = time_graph(s, [&] { B.row(s, BUSY); });
        auto tma = [&](auto kern, int S, int delay) {
            const int smem = S * 2 * nv * 16;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            int per_sm = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
            const long grid = std::min<long>(m, (long)sms * per_sm);
            return time_graph(s, [&] { kern<<<grid, threads, smem, s>>>(x, r, w, q, sf, nv, m, delay); });
        };
        const double t_tma3 = tma(traffic_tma<2, 3>, 3, 0);
        const double t_tma2b = tma(traffic_tma<2, 2>, 2, BUSY);
        const double t_tma3b = tma(traffic_tma<2, 3>, 3, BUSY);
        CK(cudaGetLastError());
        const size_t same_n = (size_t)(bytes / 2) / 16;
        uint4 *sa, *sb;
        CK(cudaMalloc(&sa, same_n * 16));
        CK(cudaMalloc(&sb, same_n * 16));
        const double t_same = time_graph(s, [&] { copy16<<<sms * 16, 256, 0, s>>>(sa, sb, same_n); });
        CK(cudaDeviceSynchronize());
        auto cell = [&](double t) {
            static char buf[8][64];
            static int i = 0;
            char* b = buf[i++ & 7];
            snprintf(b, 64, "%7.2f %6.0f", t, bytes / (t * 1e3));
            return b;
        };
        printf("%6ld %6ld %8.1f | %-18s %-18s %-18s %-18s %-18s %-18s %-18s\n", m, hh, bytes / 1e6, cell(t_row), cell(t_bar),
               cell(t_busy), cell(t_tma3), cell(t_tma2b), cell(t_tma3b), cell(t_same));
        CK(cudaFree(sa)); CK(cudaFree(sb));
    }
    return 0;
}
