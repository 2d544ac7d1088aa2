// Prototype: the batch-1 trellis GEMV under five candidate codes, to measure which code can
// reach issue 15's trellis targets (4-bit ≥ 2.5×, 2-bit ≥ 3× bf16 at batch 1) on an H200,
// whose integer pipe (not its bandwidth) bounds the committed 1MAD kernel
// (docs/eval/cuda_trellis.md: 4.6 integer instructions per weight, 2.9–3.4 T weights/s).
//
// Not the format: every row is one tail-biting sequence (its first values' windows wrap to
// the row's end), L = 16 (14 for the direct table), f32 activations, raw codes (no scale):
// y[r] = Σ_j code_j · x[j]. py/benches/cuda_trellis_codes.py checks each kernel against the
// same codes computed in torch and times it beside bf16 F.linear.
//
//   CODE 1  1MAD, one value per state (the committed code; its group loop, persistent blocks).
//   CODE 2  pairs, two hashes: x = 34038481·s + 76625530, y = x·0x9E3779B9 + 0x7F4A7C15,
//           values (bytesum(x), bytesum(y)).
//   CODE 3  pairs, one hash, two byte dot products: (bytesum(x), x's bytes · (1, 2, −1, −2)).
//   CODE 4  pairs, a direct table of 2^14 f16 pairs in shared memory indexed by the state
//           (L = 14; 64 KB; lanes' reads conflict at random).
//   CODE 5  pairs, a hashed table of 256 f16 pairs replicated once per bank (32 KB), indexed
//           by the top byte of 34038481·s: conflict-free.
//
// Build: nvcc -cubin -arch=sm_90 -O3 -o .dev/proto/codes.cubin kernels/prototypes/trellis_codes.cu

#include <cuda_fp16.h>
#include <stdint.h>

#define HC_P_ROWS 4  // rows per block step (the committed kernel's HC_TG_R(1))

__device__ __forceinline__ uint32_t hc_p_dp4a_us(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The window of the (L-bit) state that ends at bit E of the group's words c[0..K] (c[0]: the
// 32 bits before the group), E counted from c[0]'s bit 0 (E ≥ 32).
template <int E>
__device__ __forceinline__ uint32_t hc_p_win(const uint32_t* c) {
    constexpr int j = (E - 32) / 32, s = (E - 32) % 32;
    if constexpr (s == 0) {
        return c[j];
    } else {
        return __funnelshift_r(c[j], c[j + 1], s);
    }
}

// Step T's two values (or value T's one, CODE 1) as f32, from the group's words.
template <int CODE, int K, int T>
__device__ __forceinline__ void hc_p_code(const uint32_t* c, const __half2* tab, int lane, float& a, float& b) {
    constexpr int S = CODE == 1 ? K : 2 * K;  // bits per step
    const uint32_t win = hc_p_win<32 + (T + 1) * S>(c);
    if constexpr (CODE == 1) {
        const uint32_t s = win >> 16;
        a = __int_as_float(__dp4a(s * 34038481u + 76625530u, 0x01010101u, 0x4B000000u)) - 8388608.f;
        b = 0.f;
    } else if constexpr (CODE == 2) {
        const uint32_t s = win >> 16;
        const uint32_t x = s * 34038481u + 76625530u;
        const uint32_t y = x * 0x9E3779B9u + 0x7F4A7C15u;
        a = __int_as_float(__dp4a(x, 0x01010101u, 0x4B000000u)) - 8388608.f;
        b = __int_as_float(__dp4a(y, 0x01010101u, 0x4B000000u)) - 8388608.f;
    } else if constexpr (CODE == 3) {
        const uint32_t s = win >> 16;
        const uint32_t x = s * 34038481u + 76625530u;
        a = __int_as_float(__dp4a(x, 0x01010101u, 0x4B000000u)) - 8388608.f;
        // bytes · (1, 2, −1, −2) ≥ −765: offset so the f32 trick sees a non-negative sum.
        b = __int_as_float(hc_p_dp4a_us(x, 0xFEFF0201u, 0x4B000000u + 765u)) - 8389373.f;
    } else if constexpr (CODE == 4) {
        const float2 v = __half22float2(tab[win >> 18]);
        a = v.x;
        b = v.y;
    } else {
        const uint32_t s = win >> 16;
        const float2 v = __half22float2(tab[((s * 34038481u) >> 24) * 32 + lane]);
        a = v.x;
        b = v.y;
    }
}

template <int CODE, int K, int T>
__device__ __forceinline__ void hc_p_steps(const uint32_t (&c)[HC_P_ROWS][5], const __half2* tab, int lane,
                                           const float* xg, float (&acc)[HC_P_ROWS]) {
    if constexpr (T < (CODE == 1 ? 32 : 16)) {
        if constexpr (CODE == 1) {
            const float xv = xg[T];
#pragma unroll
            for (int r = 0; r < HC_P_ROWS; r++) {
                float a, b;
                hc_p_code<CODE, K, T>(c[r], tab, lane, a, b);
                acc[r] = fmaf(a, xv, acc[r]);
            }
        } else {
            const float2 xv = *reinterpret_cast<const float2*>(xg + 2 * T);
#pragma unroll
            for (int r = 0; r < HC_P_ROWS; r++) {
                float a, b;
                hc_p_code<CODE, K, T>(c[r], tab, lane, a, b);
                acc[r] = fmaf(a, xv.x, acc[r]);
                acc[r] = fmaf(b, xv.y, acc[r]);
            }
        }
        hc_p_steps<CODE, K, T + 1>(c, tab, lane, xg, acc);
    }
}

// bits: rows × (cols·K/32) words; x: cols f32; y: rows f32. Persistent blocks of 256 threads
// walk row blocks of HC_P_ROWS rows; a thread takes groups of 32 values.
template <int CODE, int K>
__device__ __forceinline__ void hc_p_gemv(const uint32_t* __restrict__ bits, const float* __restrict__ x,
                                          float* __restrict__ y, const __half2* __restrict__ table, int rows,
                                          int cols) {
    extern __shared__ __half2 tab[];
    const int lane = threadIdx.x & 31;
    if constexpr (CODE == 4 || CODE == 5) {
        constexpr int n = CODE == 4 ? (1 << 14) : 256 * 32;
        for (int i = threadIdx.x; i < n; i += blockDim.x) tab[i] = table[CODE == 4 ? i : i >> 5];
        __syncthreads();
    }
    __shared__ float red[HC_P_ROWS][8];
    const int groups = cols >> 5, rw = groups * K;
    for (int r0 = blockIdx.x * HC_P_ROWS; r0 < rows; r0 += gridDim.x * HC_P_ROWS) {
        float acc[HC_P_ROWS];
#pragma unroll
        for (int r = 0; r < HC_P_ROWS; r++) acc[r] = 0.f;
        for (int g = threadIdx.x; g < groups; g += blockDim.x) {
            uint32_t c[HC_P_ROWS][5];
#pragma unroll
            for (int r = 0; r < HC_P_ROWS; r++) {
                const uint32_t* p = bits + (long long)min(r0 + r, rows - 1) * rw;
                c[r][0] = p[g == 0 ? rw - 1 : g * K - 1];
#pragma unroll
                for (int i = 0; i < 4; i++) c[r][i + 1] = i < K ? p[g * K + i] : 0u;
            }
            hc_p_steps<CODE, K, 0>(c, tab, lane, x + 32 * g, acc);
        }
#pragma unroll
        for (int r = 0; r < HC_P_ROWS; r++) {
            float v = acc[r];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[r][threadIdx.x >> 5] = v;
        }
        __syncthreads();
        if (threadIdx.x < HC_P_ROWS && r0 + (int)threadIdx.x < rows) {
            float v = 0.f;
            for (int w = 0; w < 8; w++) v += red[threadIdx.x][w];
            y[r0 + threadIdx.x] = v;
        }
        __syncthreads();
    }
}

#define HC_P_KERNEL(CODE, K)                                                                                   \
    extern "C" __global__ void __launch_bounds__(256) hc_p_code##CODE##_k##K(                                  \
        const uint32_t* bits, const float* x, float* y, const __half2* table, int rows, int cols) {            \
        hc_p_gemv<CODE, K>(bits, x, y, table, rows, cols);                                                     \
    }
HC_P_KERNEL(1, 2)
HC_P_KERNEL(1, 4)
HC_P_KERNEL(2, 2)
HC_P_KERNEL(2, 4)
HC_P_KERNEL(3, 2)
HC_P_KERNEL(3, 4)
HC_P_KERNEL(4, 2)
HC_P_KERNEL(4, 4)
HC_P_KERNEL(5, 2)
HC_P_KERNEL(5, 4)
