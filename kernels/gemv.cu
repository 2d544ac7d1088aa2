// hypercodec GEMV kernels: y = x·Wᵀ (+ b) on the stored form of W, for batches of up to
// HC_MAX_M activation rows, and decoders to a dense weight for larger batches (then cuBLAS).
//
// Layouts (the same bytes as the `.hwz` streams, so nothing is re-encoded at load):
// - affine: codes of `bits` bits, LSB-first, row after row (value (r, j) at bit
//   (r·cols + j)·bits); scales and offsets as f32, `srs` per row (0: one for the tensor),
//   the group of column j being j / glen. ŵ = s·(qmul·q − qbias) + lo (lo = 0 without offsets).
// - E8 fixed-rate: `words` words of `bits` bytes per row, symbol i of a word at bits
//   [i·bits, (i+1)·bits) (see `hypercodec_lattice::Lattice::decode_word_fixed`), dotted against
//   x' = RHT(x) (zero-padded to 8·words) and multiplied by the row's scale.
// Every kernel runs one warp per weight row unless its comment says otherwise.
#include "common.cuh"

// ---------------------------------------------------------------------------------------
// Activation RHT: out[m, :] = RHT(x[m, :cols]) in f32, zero-padded to `width`.
// Grid (cols / tile, M), block min(tile, 1024) threads, tile·4 bytes of dynamic shared memory.
extern "C" __global__ void hc_rht(const void* __restrict__ x, int xdtype, float* __restrict__ out,
                                  int cols, int width, int tile, unsigned long long seed) {
    extern __shared__ float s[];
    const int m = blockIdx.y;
    const long long t0 = (long long)blockIdx.x * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        long long j = t0 + i;
        float v = hc_load(x, xdtype, (long long)m * cols + j);
        s[i] = hc_rht_neg(seed, j) ? -v : v;
    }
    __syncthreads();
    for (int h = 1; h < tile; h <<= 1) {
        for (int k = threadIdx.x; k < tile / 2; k += blockDim.x) {
            int i = (k / h) * 2 * h + (k % h);
            float a = s[i], b = s[i + h];
            s[i] = a + b;
            s[i + h] = a - b;
        }
        __syncthreads();
    }
    const float norm = rsqrtf((float)tile);
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        out[(long long)m * width + t0 + i] = s[i] * norm;
    }
    if (blockIdx.x == 0) {
        for (int j = cols + threadIdx.x; j < width; j += blockDim.x) out[(long long)m * width + j] = 0.f;
    }
}

// ---------------------------------------------------------------------------------------
// Affine GEMV.

struct AffineArgs {
    const uint8_t* codes;
    const float* scales;
    const float* offsets;  // null when symmetric
    const void* x;
    void* y;
    const float* bias;  // null when none
    long long n_code_bytes;
    int xdtype, ydtype;
    int M, rows, cols, bits, glen, srs;
    float qmul, qbias;
};

__device__ __forceinline__ void hc_affine_finish(const AffineArgs& a, int r, float* acc) {
    const int lane = threadIdx.x & 31;
    float b = a.bias ? a.bias[r] : 0.f;
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) {
        if (m < a.M) {
            float v = hc_warp_sum(acc[m]);
            if (lane == 0) hc_store(a.y, a.ydtype, (long long)m * a.rows + r, v + b);
        }
    }
}

// Codes of 2, 4 or 8 bits whose rows and groups hold whole 16-byte chunks (cols and glen
// multiples of VALS = 128 / BITS): each lane takes a chunk at a time.
template <int BITS>
__device__ __forceinline__ void hc_affine_aligned(const AffineArgs& a) {
    constexpr int VALS = 128 / BITS;
    constexpr int PER_WORD = 32 / BITS;
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= a.rows) return;
    const int r = warp;
    const int chunks = a.cols / VALS;
    const uint4* row = reinterpret_cast<const uint4*>(a.codes + (long long)r * a.cols * BITS / 8);
    float acc[HC_MAX_M];
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) acc[m] = 0.f;
    for (int c = lane; c < chunks; c += 32) {
        const uint4 q4 = row[c];
        const uint32_t w[4] = {q4.x, q4.y, q4.z, q4.w};
        const int j0 = c * VALS;
        const int si = a.srs ? r * a.srs + j0 / a.glen : 0;
        const float sc = a.scales[si];
        const float lo = a.offsets ? a.offsets[si] : 0.f;
#pragma unroll
        for (int m = 0; m < HC_MAX_M; m++) {
            if (m < a.M) {
                float dq = 0.f, sx = 0.f;
#pragma unroll
                for (int k = 0; k < VALS / 8; k++) {
                    float xv[8];
                    hc_load8(a.x, a.xdtype, (long long)m * a.cols + j0 + 8 * k, xv);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const int v = 8 * k + i;
                        const uint32_t q = (w[v / PER_WORD] >> (BITS * (v % PER_WORD))) & MASK;
                        dq = fmaf((float)q, xv[i], dq);
                        sx += xv[i];
                    }
                }
                acc[m] += sc * (a.qmul * dq - a.qbias * sx) + lo * sx;
            }
        }
    }
    hc_affine_finish(a, r, acc);
}

// Any bits (1..8) and any alignment: values read from the bit stream one at a time.
__device__ __forceinline__ void hc_affine_generic(const AffineArgs& a) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= a.rows) return;
    const int r = warp;
    const uint32_t mask = (1u << a.bits) - 1;
    float acc[HC_MAX_M];
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) acc[m] = 0.f;
    for (int j = lane; j < a.cols; j += 32) {
        const long long off = ((long long)r * a.cols + j) * a.bits;
        const long long b = off >> 3;
        uint32_t v = a.codes[b];
        if (b + 1 < a.n_code_bytes) v |= (uint32_t)a.codes[b + 1] << 8;
        const float q = (float)((v >> (off & 7)) & mask);
        const int si = a.srs ? r * a.srs + j / a.glen : 0;
        const float sc = a.scales[si];
        const float lo = a.offsets ? a.offsets[si] : 0.f;
        const float wv = sc * (a.qmul * q - a.qbias) + lo;
#pragma unroll
        for (int m = 0; m < HC_MAX_M; m++) {
            if (m < a.M) acc[m] = fmaf(wv, hc_load(a.x, a.xdtype, (long long)m * a.cols + j), acc[m]);
        }
    }
    hc_affine_finish(a, r, acc);
}

// `path`: 0 generic, 2/4/8 the aligned kernel of that many bits (chosen by the host).
extern "C" __global__ void hc_affine_gemv(AffineArgs a, int path) {
    switch (path) {
        case 2: hc_affine_aligned<2>(a); break;
        case 4: hc_affine_aligned<4>(a); break;
        case 8: hc_affine_aligned<8>(a); break;
        default: hc_affine_generic(a); break;
    }
}

// The dense weight ŵ (rows × cols, `odtype`), one thread per value.
extern "C" __global__ void hc_affine_decode(AffineArgs a, void* __restrict__ out, int odtype) {
    const long long n = (long long)a.rows * a.cols;
    const uint32_t mask = (1u << a.bits) - 1;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(k / a.cols), j = (int)(k % a.cols);
        const long long off = k * a.bits;
        const long long b = off >> 3;
        uint32_t v = a.codes[b];
        if (b + 1 < a.n_code_bytes) v |= (uint32_t)a.codes[b + 1] << 8;
        const float q = (float)((v >> (off & 7)) & mask);
        const int si = a.srs ? r * a.srs + j / a.glen : 0;
        const float lo = a.offsets ? a.offsets[si] : 0.f;
        hc_store(out, odtype, k, a.scales[si] * (a.qmul * q - a.qbias) + lo);
    }
}

// ---------------------------------------------------------------------------------------
// Fixed-rate E8.

struct E8Args {
    const uint8_t* packed;
    const float* row_scales;  // the stored row scale divided by α
    const float* xr;          // RHT(x), M × 8·words, f32
    void* y;
    const float* bias;
    int ydtype;
    int M, rows, words, bits;
};

// ⟨point, x'⟩ of one word given its symbols' bit field `v` (B bits per symbol).
template <int B>
__device__ __forceinline__ float hc_e8_word_dot(unsigned long long v, const float* xw) {
    constexpr unsigned long long MASK = (1ull << B) - 1;
    constexpr int H = 1 << (B - 1);
    const int s0 = (int)(v & MASK);
    const float half = (s0 & 1) ? 0.5f : 0.f;
    int p = 0;
    float d = 0.f, sx = 0.f;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        const int s = (int)((v >> (i * B)) & MASK) - H;
        p += s;
        d = fmaf((float)s, xw[i - 1], d);
        sx += xw[i - 1];
    }
    const int last = (s0 & ~1) - H + (p & 1);
    d = fmaf((float)last, xw[7], d);
    sx += xw[7];
    return fmaf(half, sx, d);
}

template <int B>
__device__ __forceinline__ void hc_e8_gemv_t(const E8Args& a) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= a.rows) return;
    const int r = warp;
    const long long width = 8ll * a.words;
    const uint8_t* row = a.packed + (long long)r * a.words * B;
    float acc[HC_MAX_M];
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) acc[m] = 0.f;
    if (B == 4 && (a.words & 3) == 0) {
        // Four words (16 bytes) per lane and step.
        const uint4* row4 = reinterpret_cast<const uint4*>(row);
        for (int c = lane; c < a.words / 4; c += 32) {
            const uint4 q = row4[c];
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int m = 0; m < HC_MAX_M; m++) {
                if (m < a.M) {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float4* xp = reinterpret_cast<const float4*>(a.xr + m * width + 8ll * (4 * c + k));
                        const float4 x0 = xp[0], x1 = xp[1];
                        const float xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                        acc[m] += hc_e8_word_dot<B>(w[k], xw);
                    }
                }
            }
        }
    } else {
        for (int wi = lane; wi < a.words; wi += 32) {
            unsigned long long v = 0;
#pragma unroll
            for (int i = 0; i < B; i++) v |= (unsigned long long)row[(long long)wi * B + i] << (8 * i);
#pragma unroll
            for (int m = 0; m < HC_MAX_M; m++) {
                if (m < a.M) {
                    const float4* xp = reinterpret_cast<const float4*>(a.xr + m * width + 8ll * wi);
                    const float4 x0 = xp[0], x1 = xp[1];
                    const float xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    acc[m] += hc_e8_word_dot<B>(v, xw);
                }
            }
        }
    }
    const float sc = a.row_scales[r];
    const float b = a.bias ? a.bias[r] : 0.f;
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) {
        if (m < a.M) {
            float v = hc_warp_sum(acc[m]);
            if (lane == 0) hc_store(a.y, a.ydtype, (long long)m * a.rows + r, sc * v + b);
        }
    }
}

extern "C" __global__ void hc_e8_gemv(E8Args a) {
    switch (a.bits) {
        case 2: hc_e8_gemv_t<2>(a); break;
        case 3: hc_e8_gemv_t<3>(a); break;
        case 4: hc_e8_gemv_t<4>(a); break;
        case 5: hc_e8_gemv_t<5>(a); break;
        case 6: hc_e8_gemv_t<6>(a); break;
        case 7: hc_e8_gemv_t<7>(a); break;
        default: hc_e8_gemv_t<8>(a); break;
    }
}

// The scaled lattice points in the rotated domain (rows × 8·words, `odtype`): y = x'·outᵀ.
// One thread per word.
extern "C" __global__ void hc_e8_decode(E8Args a, void* __restrict__ out, int odtype) {
    const long long n = (long long)a.rows * a.words;
    const int B = a.bits;
    const unsigned long long mask = (1ull << B) - 1;
    const int h = 1 << (B - 1);
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(k / a.words);
        unsigned long long v = 0;
        for (int i = 0; i < B; i++) v |= (unsigned long long)a.packed[k * B + i] << (8 * i);
        const int s0 = (int)(v & mask);
        const float half = (s0 & 1) ? 0.5f : 0.f;
        const float sc = a.row_scales[r];
        int p = 0;
        for (int i = 1; i < 8; i++) {
            const int s = (int)((v >> (i * B)) & mask) - h;
            p += s;
            hc_store(out, odtype, 8 * k + i - 1, sc * ((float)s + half));
        }
        hc_store(out, odtype, 8 * k + 7, sc * ((float)((s0 & ~1) - h + (p & 1)) + half));
    }
}
