// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): INT4 g128 GEMV at
// batch 1 for Hopper (sm_90), measured in docs/eval/cuda_int4_variants.md. Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/tma.cubin kernels/prototypes/tma_int4_gemv.cu
// and time it on a GPU with py/benches/cuda_tma_prototype.py.
//
// Design: codes stored tile-major ([tile of 16 rows][step of 128 columns][h][g][t][16 B], a
// permutation of the .hwz bytes) with each step's 16 scales and 16 offsets beside them
// ([tile][step][2][16] f32, ŵ = s·(q − 8) + lo); a persistent grid of 2 blocks per SM, each
// with 8 consumer warps and one producer warp whose lane 0 streams stages of 8 steps (9 KB)
// into a shared-memory ring with cp.async.bulk, completed on mbarriers; the consumers read
// their fragments from shared memory, so no register holds a load in flight.
#include "../gemv.cu"

#define NCW 8      // consumer warps
#define SPC 8      // steps (128 columns each) per stage
#define STEP_B 1024
#define SO_B 128   // 16 scales + 16 offsets (f32) per step

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(uint64_t* b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(n));
}
__device__ __forceinline__ void mb_expect(uint64_t* b, uint32_t tx) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(tx) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t* b, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(b)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(b))
        : "memory");
}
// The activation row is prepared once per block in fragment order (the two B
// registers of each k-step, per lane column t) with each step's Σx, so a consumer step is
// 6 LDS.128 + 4 LDS + 32 LOP3/24 SHF + 8 HMMA: no PRMT, no Σx mma.
// MATH false: a probe that moves the same bytes (the consumers wait for each stage and
// release it) without the arithmetic; it bounds what the feed alone reaches.
template <int S, bool MATH = true>
__device__ __forceinline__ void tma_gemv2(const uint8_t* __restrict__ codes, const float* __restrict__ so,
                                          const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                          int rows, int cols) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint64_t* full = reinterpret_cast<uint64_t*>(sm);
    uint64_t* empty = full + S;
    float* part = reinterpret_cast<float*>(sm + 256);
    uint8_t* stage = sm + 2048;
    constexpr int STAGE_B = SPC * STEP_B + SPC * SO_B;
    const int steps = cols / 128;
    uint32_t* xf = reinterpret_cast<uint32_t*>(stage + S * STAGE_B);   // [step][t][q][2]
    float* sxs = reinterpret_cast<float*>(xf + steps * 64);            // [step]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = rows / 16, cpt = steps / SPC;
    const int my_tiles = tiles > (int)blockIdx.x ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int total = my_tiles * cpt;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mb_init(&full[s], 1);
            mb_init(&empty[s], NCW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp == NCW) {
        if (lane == 0) {
            for (int i = 0; i < total; i++) {
                const int slot = i % S;
                if (i >= S) mb_wait(&empty[slot], ((i / S) + 1) & 1);
                const long long tile = blockIdx.x + (long long)(i / cpt) * gridDim.x;
                const long long st0 = tile * steps + (long long)(i % cpt) * SPC;
                uint8_t* dst = stage + slot * STAGE_B;
                mb_expect(&full[slot], STAGE_B);
                bulk(dst, codes + st0 * STEP_B, SPC * STEP_B, &full[slot]);
                bulk(dst + SPC * STEP_B, so + st0 * 32, SPC * SO_B, &full[slot]);
            }
        }
        return;
    }
    // Fragment-order activations: entry (s, t, q) with q = 2k + j holds
    // b0 = (x[c + 2j], x[c + 2j + 4]), b1 = (x[c + 2j + 1], x[c + 2j + 5]), c = 128s + 32t + 8k.
    const uint32_t* xw = reinterpret_cast<const uint32_t*>(x);
    for (int e = threadIdx.x; e < steps * 32; e += NCW * 32) {
        const int s = e >> 5, t = (e >> 3) & 3, q = e & 7, k = q >> 1, j = q & 1;
        const int c = 128 * s + 32 * t + 8 * k;
        const uint32_t lo = xw[(c >> 1) + j], hi = xw[(c >> 1) + j + 2];
        xf[e * 2] = __byte_perm(lo, hi, 0x5410);
        xf[e * 2 + 1] = __byte_perm(lo, hi, 0x7632);
    }
    for (int s = warp; s < steps; s += NCW) {
        const uint32_t w0 = xw[s * 64 + lane], w1 = xw[s * 64 + 32 + lane];
        float v = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w0 & 0xFFFF))) +
                  __bfloat162float(__ushort_as_bfloat16((unsigned short)(w0 >> 16))) +
                  __bfloat162float(__ushort_as_bfloat16((unsigned short)(w1 & 0xFFFF))) +
                  __bfloat162float(__ushort_as_bfloat16((unsigned short)(w1 >> 16)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sxs[s] = v;
    }
    asm volatile("bar.sync 1, %0;\n" ::"r"(NCW * 32) : "memory");
    const int g = lane >> 2, t = lane & 3;
    constexpr uint32_t MASK = 0x000F000Fu, MAGIC = 0x43004300u;
    float acc0 = 0.f, acc2 = 0.f;
    for (int i = 0; i < total; i++) {
        const int slot = i % S;
        const int step = (i % cpt) * SPC + warp;
        const uint4* xp = reinterpret_cast<const uint4*>(xf + (step * 4 + t) * 16);
        const uint4 x0 = xp[0], x1 = xp[1], x2 = xp[2], x3 = xp[3];
        const uint32_t xb[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                                 x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        const float sx = sxs[step];
        mb_wait(&full[slot], (i / S) & 1);
        if (!MATH) {
            __syncwarp();
            if (lane == 0) mb_arrive(&empty[slot]);
            continue;
        }
        const uint8_t* st = stage + slot * STAGE_B;
        const uint4 w0 = *reinterpret_cast<const uint4*>(st + warp * STEP_B + lane * 16);
        const uint4 w1 = *reinterpret_cast<const uint4*>(st + warp * STEP_B + 512 + lane * 16);
        const float* sop = reinterpret_cast<const float*>(st + SPC * STEP_B + warp * SO_B);
        const float s0 = sop[g], s1 = sop[g + 8], o0 = sop[16 + g], o1 = sop[16 + g + 8];
        __syncwarp();
        if (lane == 0) mb_arrive(&empty[slot]);
        const uint32_t wa[4] = {w0.x, w0.y, w0.z, w0.w}, wb[4] = {w1.x, w1.y, w1.z, w1.w};
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int i0 = 2 * j, i1 = 2 * j + 1, q = 2 * k + j;
                hc_mma16816<true>(c, hc_lop3_and_or(wa[k] >> (4 * i0), MASK, MAGIC), hc_lop3_and_or(wb[k] >> (4 * i0), MASK, MAGIC),
                    hc_lop3_and_or(wa[k] >> (4 * i1), MASK, MAGIC), hc_lop3_and_or(wb[k] >> (4 * i1), MASK, MAGIC), xb[2 * q],
                    xb[2 * q + 1]);
            }
        acc0 = fmaf(s0, c[0], fmaf(o0 - s0 * 136.f, sx, acc0));
        acc2 = fmaf(s1, c[2], fmaf(o1 - s1 * 136.f, sx, acc2));
        if (i % cpt == cpt - 1) {
            const int tile = blockIdx.x + (i / cpt) * gridDim.x;
            float* p = part + ((i / cpt) & 1) * NCW * 16;
            if (t == 0) {
                p[warp * 16 + g] = acc0;
                p[warp * 16 + g + 8] = acc2;
            }
            asm volatile("bar.sync 1, %0;\n" ::"r"(NCW * 32) : "memory");
            if (warp == 0 && lane < 16) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < NCW; w++) v += p[w * 16 + lane];
                y[tile * 16 + lane] = __float2bfloat16(v);
            }
            acc0 = acc2 = 0.f;
        }
    }
}
#define K2(S)                                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * (NCW + 1)) hc_tma2_s##S(                              \
        const uint8_t* codes, const float* so, const __nv_bfloat16* x, __nv_bfloat16* y, int rows, int cols) { \
        tma_gemv2<S>(codes, so, x, y, rows, cols);                                                          \
    }
K2(2)
K2(4)
K2(6)
extern "C" __global__ void __launch_bounds__(32 * (NCW + 1)) hc_tma2_move_s4(
    const uint8_t* codes, const float* so, const __nv_bfloat16* x, __nv_bfloat16* y, int rows, int cols) {
    tma_gemv2<4, false>(codes, so, x, y, rows, cols);
}
