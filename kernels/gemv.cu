// hypercodec GEMV kernels: y = x·Wᵀ (+ b) on the stored form of W, for batches of up to
// HC_MAX_M activation rows, and decoders to a dense weight for larger batches (then cuBLAS).
//
// Layouts (the same bytes as the `.hwz` streams, so nothing is re-encoded at load):
// - affine: codes of `bits` bits, LSB-first, row after row (value (r, j) at bit
//   (r·cols + j)·bits); scales and offsets of type `sdtype` (f32, or f16/bf16 as stored),
//   `srs` per row in tiles of 16 rows (hc_si; 0: one for the tensor), the group of column j
//   being j / glen. ŵ = s·(qmul·q − qbias) + lo (lo = 0 without offsets).
// - E8 fixed-rate: `words` words of `bits` bytes per row, symbol i of a word at bits
//   [i·bits, (i+1)·bits) (see `hypercodec_lattice::Lattice::decode_word_fixed`), dotted against
//   x' = RHT(x) (zero-padded to 8·words) and multiplied by the row's scale.
// Every kernel runs one warp per weight row unless its comment says otherwise.
#include "common.cuh"
#include "affine.cuh"
#include <type_traits>

// ---------------------------------------------------------------------------------------
// Activation RHT: out[m, :] = RHT(x[m, :cols]) in f32, zero-padded to `width`, and the same in
// f16 into `out16` unless it is null (what the trellis tensor-core kernel reads).
// Grid (cols / tile, M), block min(tile, 1024) threads, tile·4 bytes of dynamic shared memory.
extern "C" __global__ void hc_rht(const void* __restrict__ x, int xdtype, float* __restrict__ out,
                                  int cols, int width, int tile, unsigned long long seed, void* __restrict__ out16) {
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
        if (out16) hc_store(out16, HC_F16, (long long)m * width + t0 + i, s[i] * norm);
    }
    if (blockIdx.x == 0) {
        for (int j = cols + threadIdx.x; j < width; j += blockDim.x) {
            out[(long long)m * width + j] = 0.f;
            if (out16) hc_store(out16, HC_F16, (long long)m * width + j, 0.f);
        }
    }
}

// The RHT's signs of 8 values from position j0 (a multiple of 8: one splitmix64 word).
__device__ __forceinline__ void hc_signs8(float* v, unsigned long long seed, long long j0) {
    const unsigned long long w = hc_mix64(seed + (unsigned long long)(j0 / 64 + 1) * 0x9E3779B97F4A7C15ull);
#pragma unroll
    for (int k = 0; k < 8; k++)
        if ((w >> ((j0 + k) % 64)) & 1ull) v[k] = -v[k];
}

// The unnormalized Walsh–Hadamard butterflies of N values held in registers (all log2 N stages).
template <int N>
__device__ __forceinline__ void hc_fwht_regs(float* v) {
#pragma unroll
    for (int h = 1; h < N; h <<= 1)
#pragma unroll
        for (int k = 0; k < N; k++)
            if (!(k & h)) {
                const float a = v[k], b = v[k + h];
                v[k] = a + b;
                v[k + h] = a - b;
            }
}

// The unnormalized Walsh–Hadamard butterflies of 8 values per lane over tiles of `tile`
// values, as far as a warp reaches (tiles up to 256): 3 stages in registers, the rest across
// lanes (every lane of the warp takes part).
__device__ __forceinline__ void hc_fwht8_warp(float* v, int tile, int lane) {
    hc_fwht_regs<8>(v);
#pragma unroll
    for (int b = 0; b < 5; b++) {
        if ((8 << b) >= tile) break;
        const bool upper = (lane >> b) & 1;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[k], 1 << b);
            v[k] = upper ? o - v[k] : v[k] + o;
        }
    }
}

// The last log2(G) butterfly stages of a tile of 256·G values (G = 2..16) whose first 8 stages
// are done, in shared memory `s`: the G values s[p + 256·g] of each p < 256 combine in
// registers (G = 16: two lanes of a warp hold 8 each, the last stage across them), after one
// barrier, and go straight to `out` (f32) and `out16` (f16 unless null) at `base + index`.
template <int G>
__device__ __forceinline__ void hc_rht_tail(const float* s, int t, float norm, float* out, void* out16,
                                            long long base) {
    if constexpr (G <= 8) {
#pragma unroll
        for (int j = 0; j < 8 / G; j++) {
            const int p = t + 32 * G * j;
            float v[G];
#pragma unroll
            for (int g = 0; g < G; g++) v[g] = s[p + 256 * g];
            hc_fwht_regs<G>(v);
#pragma unroll
            for (int g = 0; g < G; g++) {
                out[base + p + 256 * g] = v[g] * norm;
                if (out16) hc_store(out16, HC_F16, base + p + 256 * g, v[g] * norm);
            }
        }
    } else {
        static_assert(G == 16, "tiles of 512..4096 values");
        const int lane = t & 31, half = lane >> 4, p = (lane & 15) + 16 * (t >> 5);
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s[p + 256 * (8 * half + i)];
        hc_fwht_regs<8>(v);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[i], 16);
            const float r = (half ? o - v[i] : v[i] + o) * norm;
            out[base + p + 256 * (8 * half + i)] = r;
            if (out16) hc_store(out16, HC_F16, base + p + 256 * (8 * half + i), r);
        }
    }
}

// The same for tiles of 256..4096 values and 16-byte aligned activations: tile / 8 threads per
// block, each holding 8 values: the first 3 butterfly stages in registers, the next 5 across
// the warp's lanes (shuffles), the rest (tiles above 256 only) after one barrier in registers
// again (hc_rht_tail).
extern "C" __global__ void hc_rht_fast(const void* __restrict__ x, int xdtype, float* __restrict__ out,
                                       int cols, int width, int tile, unsigned long long seed,
                                       void* __restrict__ out16) {
    extern __shared__ float s[];
    const int m = blockIdx.y, t = threadIdx.x, lane = t & 31;
    const long long t0 = (long long)blockIdx.x * tile;
    const long long j0 = t0 + 8 * t;
    float v[8];
    hc_load8(x, xdtype, (long long)m * cols + j0, v);
    hc_signs8(v, seed, j0);
    hc_fwht8_warp(v, tile, lane);
    const float norm = rsqrtf((float)tile);
    if (tile == 256) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] *= norm;
        hc_store8(out, HC_F32, (long long)m * width + j0, v, 8, true);
        if (out16)
            hc_store8(out16, HC_F16, (long long)m * width + j0, v, 8, hc_aligned16(out16) && (width & 7) == 0);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) s[8 * t + k] = v[k];
        __syncthreads();
        const long long base = (long long)m * width + t0;
        switch (tile) {
            case 512: hc_rht_tail<2>(s, t, norm, out, out16, base); break;
            case 1024: hc_rht_tail<4>(s, t, norm, out, out16, base); break;
            case 2048: hc_rht_tail<8>(s, t, norm, out, out16, base); break;
            default: hc_rht_tail<16>(s, t, norm, out, out16, base); break;
        }
    }
    if (blockIdx.x == 0) {
        for (int j = cols + t; j < width; j += blockDim.x) {
            out[(long long)m * width + j] = 0.f;
            if (out16) hc_store(out16, HC_F16, (long long)m * width + j, 0.f);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Affine GEMV.

// Weight rows a warp of the GEMVs computes at once (the activation is loaded once for them):
// 4 for a single activation row, 2 for batch tiles of 4 (the registers hold R × M sums).
#define HC_R(M) ((M) == 1 ? 4 : 2)

// A code of up to 23 bits as f32 without the quarter-rate I2F: 2^23 + q is exact, then
// subtracting 2^23 is exact too.
__device__ __forceinline__ float hc_u2f(uint32_t q) {
    return __int_as_float(0x4B000000u | q) - 8388608.f;
}

// The 32 codes of one chunk (4·BITS bytes) as BITS 32-bit words.
template <int BITS>
__device__ __forceinline__ void hc_load_chunk(const uint8_t* p, uint32_t* w) {
    if (BITS == 2) {
        uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x; w[1] = v.y;
    } else if (BITS == 4) {
        uint4 v = *reinterpret_cast<const uint4*>(p);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if (BITS == 8) {
        uint4 v = reinterpret_cast<const uint4*>(p)[0], u = reinterpret_cast<const uint4*>(p)[1];
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        w[4] = u.x; w[5] = u.y; w[6] = u.z; w[7] = u.w;
    } else {
        // 1, 3, 5, 6 or 7 bits: a chunk is BITS words, 4-byte aligned (rows of whole chunks).
#pragma unroll
        for (int k = 0; k < BITS; k++) w[k] = reinterpret_cast<const uint32_t*>(p)[k];
    }
}

// Code i of a chunk of 32 (BITS bits each, least significant first, as the format packs them):
// where it straddles two words (3, 5, 6 or 7 bits), a funnel shift joins them. `i` is a
// constant in every unrolled caller, so the branch and the word indices resolve at compile time.
template <int BITS>
__device__ __forceinline__ uint32_t hc_chunk_code(const uint32_t* w, int i) {
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int s = BITS * i, k = s >> 5, sh = s & 31;
    if (sh + BITS <= 32) return (w[k] >> sh) & MASK;
    return __funnelshift_r(w[k], w[k + 1], sh) & MASK;
}

// Sums acc[R][MT] over the block (warp shuffles, then shared memory) and stores row r0 + r of
// output m as sc[r]·sum + bias (rows past `rows` and batch rows past `M` are skipped).
template <int R, int MT>
__device__ __forceinline__ void hc_block_store(float (&acc)[R][MT], const float* sc, int r0, int rows, int M,
                                               const float* bias, void* y, int ydtype) {
    __shared__ float part[8][R * MT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const float v = hc_warp_sum(acc[r][m]);
            if (lane == 0) part[warp][r * MT + m] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * MT) {
        const int r = threadIdx.x / MT, m = threadIdx.x % MT;
        if (r0 + r < rows && m < M) {
            float v = 0.f;
            for (int w = 0; w < warps; w++) v += part[w][threadIdx.x];
            hc_store(y, ydtype, (long long)m * rows + r0 + r, sc[r] * v + (bias ? bias[r0 + r] : 0.f));
        }
    }
}

// Codes of 1 to 8 bits whose rows and groups hold whole chunks of 32 values (cols and glen
// multiples of 32): a block computes HC_R(MT) rows, its threads splitting the columns a chunk
// (BITS words) at a time; a chunk's activations are loaded once for all those rows.
template <int BITS, int MT>
__device__ __forceinline__ void hc_affine_rows(const AffineArgs& a) {
    constexpr int R = HC_R(MT);
    const int r0 = blockIdx.x * R;
    const int chunks = a.cols >> 5;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        const int j0 = c << 5;
        const int g = a.srs ? (a.glen_log2 >= 0 ? j0 >> a.glen_log2 : j0 / a.glen) : 0;
        uint32_t w[R][BITS];
        float sc[R], lo[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < a.rows) {
                hc_load_chunk<BITS>(a.codes + (r0 + r) * row_bytes + (long long)c * 4 * BITS, w[r]);
                const long long si = hc_si(a, r0 + r, g);
                sc[r] = hc_sval(a, a.scales, si);
                lo[r] = a.offsets ? hc_sval(a, a.offsets, si) : 0.f;
            } else {
#pragma unroll
                for (int k = 0; k < BITS; k++) w[r][k] = 0;
                sc[r] = 0.f;
                lo[r] = 0.f;
            }
        }
        if (MT == 1) {
            float xv[32];
#pragma unroll
            for (int k = 0; k < 4; k++) hc_load8(a.x, a.xdtype, j0 + 8 * k, xv + 8 * k);
            float sx = 0.f;
#pragma unroll
            for (int i = 0; i < 32; i++) sx += xv[i];
#pragma unroll
            for (int r = 0; r < R; r++) {
                float dq = 0.f;
#pragma unroll
                for (int i = 0; i < 32; i++) dq = fmaf(hc_u2f(hc_chunk_code<BITS>(w[r], i)), xv[i], dq);
                acc[r][0] += sc[r] * (a.qmul * dq - a.qbias * sx) + lo[r] * sx;
            }
        } else {
            // Several activation rows: each code is decoded once, to the weight itself, and each
            // activation loaded once for the block's rows.
            float wv[R][32];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < 32; i++)
                    wv[r][i] = fmaf(sc[r], fmaf(a.qmul, hc_u2f(hc_chunk_code<BITS>(w[r], i)), -a.qbias), lo[r]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (m < a.M) {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        float xv[8];
                        hc_load8(a.x, a.xdtype, (long long)m * a.cols + j0 + 8 * k, xv);
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int i = 0; i < 8; i++) acc[r][m] = fmaf(wv[r][8 * k + i], xv[i], acc[r][m]);
                    }
                }
            }
        }
    }
    float ones[R];
#pragma unroll
    for (int r = 0; r < R; r++) ones[r] = 1.f;
    hc_block_store<R, MT>(acc, ones, r0, a.rows, a.M, a.bias, a.y, a.ydtype);
}

// Any bits (1..8) and any alignment: a block per row, values read from the bit stream one at
// a time.
__device__ __forceinline__ void hc_affine_generic(const AffineArgs& a) {
    const int r = blockIdx.x;
    const uint32_t mask = (1u << a.bits) - 1;
    float acc[1][HC_MAX_M];
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) acc[0][m] = 0.f;
    for (int j = threadIdx.x; j < a.cols; j += blockDim.x) {
        const long long off = ((long long)r * a.cols + j) * a.bits;
        const long long b = off >> 3;
        uint32_t v = a.codes[b];
        if (b + 1 < a.n_code_bytes) v |= (uint32_t)a.codes[b + 1] << 8;
        const float q = (float)((v >> (off & 7)) & mask);
        const long long si = hc_si(a, r, j / a.glen);
        const float sc = hc_sval(a, a.scales, si);
        const float lo = a.offsets ? hc_sval(a, a.offsets, si) : 0.f;
        const float wv = sc * (a.qmul * q - a.qbias) + lo;
#pragma unroll
        for (int m = 0; m < HC_MAX_M; m++) {
            if (m < a.M) acc[0][m] = fmaf(wv, hc_load(a.x, a.xdtype, (long long)m * a.cols + j), acc[0][m]);
        }
    }
    const float one[1] = {1.f};
    hc_block_store<1, HC_MAX_M>(acc, one, r, a.rows, a.M, a.bias, a.y, a.ydtype);
}

// One kernel per (bits, batch tile) so each gets its own register allocation:
// hc_affine_gemv_b{1..8}_m{1,4} (aligned, HC_R(M) rows per warp) and
// hc_affine_gemv_generic (one row per warp), as the host chooses.
#define HC_AFFINE(B, M) \
    extern "C" __global__ void __launch_bounds__(256) hc_affine_gemv_b##B##_m##M(AffineArgs a) { hc_affine_rows<B, M>(a); }
#define HC_AFFINE_M(B) HC_AFFINE(B, 1) HC_AFFINE(B, 4)
HC_AFFINE_M(2)
HC_AFFINE_M(4)
HC_AFFINE_M(8)
// The widths whose codes straddle words (and 1 bit), after every other kernel in the host's
// table (kernels-cuda `affine_gemv`); the generic kernel, one code at a time from bytes, ran
// them 3.5-8x slower than bf16 at batch 1 on an H200.
HC_AFFINE_M(1)
HC_AFFINE_M(3)
HC_AFFINE_M(5)
HC_AFFINE_M(6)
HC_AFFINE_M(7)

extern "C" __global__ void __launch_bounds__(256) hc_affine_gemv_generic(AffineArgs a) { hc_affine_generic(a); }

// Pieces the decoders give each thread: a block takes HC_DEC_U·blockDim consecutive pieces,
// thread t the pieces t, t + blockDim, …, so each load and store instruction of a warp stays
// coalesced while a thread has HC_DEC_U loads in flight (one per thread left the decoders
// bound by load latency at ~2.6 TB/s of stores on an H200). The host launches
// ceil(pieces / HC_DEC_U) threads.
#ifndef HC_DEC_U
#define HC_DEC_U 4
#endif

// The dense weight ŵ of codes of 1 to 8 bits (cols a multiple of 32, the GEMV's alignment),
// 8 values per piece: consecutive threads load consecutive BITS-byte pieces (1, 3, 5, 6 and
// 7 bits byte by byte) and store
// consecutive 16-byte runs, the row found by a 32-bit division where the index fits (a 64-bit
// one costs ~70 instructions per piece).
template <int BITS, int U>
__device__ __forceinline__ void hc_affine_decode_pieces(const AffineArgs& a, void* __restrict__ out, int odtype) {
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int pieces = a.cols >> 3;
    const long long n = (long long)a.rows * pieces;
    const bool narrow = n < (1ll << 32);
    const long long span = (long long)U * blockDim.x;
    for (long long base = blockIdx.x * span + threadIdx.x; base < n; base += gridDim.x * span) {
        uint32_t w0[U], w1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long long k = base + (long long)u * blockDim.x;
            w0[u] = w1[u] = 0;
            if (k < n) {
                if (BITS == 2) {
                    w0[u] = reinterpret_cast<const uint16_t*>(a.codes)[k];
                } else if (BITS == 4) {
                    w0[u] = reinterpret_cast<const uint32_t*>(a.codes)[k];
                } else if (BITS == 8) {
                    const uint2 v = reinterpret_cast<const uint2*>(a.codes)[k];
                    w0[u] = v.x;
                    w1[u] = v.y;
                } else {
                    const uint8_t* p = a.codes + k * BITS;
#pragma unroll
                    for (int i = 0; i < BITS; i++) {
                        if (i < 4) w0[u] |= (uint32_t)p[i] << (8 * i);
                        else w1[u] |= (uint32_t)p[i] << (8 * (i - 4));
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long long k = base + (long long)u * blockDim.x;
            if (k >= n) break;
            const int r = narrow ? (int)((uint32_t)k / (uint32_t)pieces) : (int)(k / pieces);
            const int j0 = (int)(k - (long long)r * pieces) << 3;
            const int g = a.srs ? (a.glen_log2 >= 0 ? j0 >> a.glen_log2 : j0 / a.glen) : 0;
            const long long si = hc_si(a, r, g);
            const float sc = hc_sval(a, a.scales, si), lo = a.offsets ? hc_sval(a, a.offsets, si) : 0.f;
            const float mul = sc * a.qmul, add = lo - sc * a.qbias;
            float v8[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t q;
                if (BITS == 2 || BITS == 4 || BITS == 8) {
                    const uint32_t word = (BITS == 8 && i >= 4) ? w1[u] : w0[u];
                    q = (word >> (BITS == 8 ? 8 * (i & 3) : BITS * i)) & MASK;
                } else {
                    const uint32_t two[2] = {w0[u], w1[u]};
                    q = hc_chunk_code<BITS>(two, i);
                }
                v8[i] = fmaf(mul, hc_u2f(q), add);
            }
            hc_store8(out, odtype, (long long)r * a.cols + j0, v8, 8, true);
        }
    }
}

extern "C" __global__ void hc_affine_decode_b2(AffineArgs a, void* __restrict__ out, int odtype) {
    hc_affine_decode_pieces<2, HC_DEC_U>(a, out, odtype);
}
extern "C" __global__ void hc_affine_decode_b4(AffineArgs a, void* __restrict__ out, int odtype) {
    hc_affine_decode_pieces<4, HC_DEC_U>(a, out, odtype);
}
extern "C" __global__ void hc_affine_decode_b8(AffineArgs a, void* __restrict__ out, int odtype) {
    hc_affine_decode_pieces<8, HC_DEC_U>(a, out, odtype);
}
#define HC_AFFINE_DECODE(B) \
    extern "C" __global__ void hc_affine_decode_b##B(AffineArgs a, void* __restrict__ out, int odtype) { \
        hc_affine_decode_pieces<B, HC_DEC_U>(a, out, odtype);                                              \
    }
HC_AFFINE_DECODE(1)
HC_AFFINE_DECODE(3)
HC_AFFINE_DECODE(5)
HC_AFFINE_DECODE(6)
HC_AFFINE_DECODE(7)

// The dense weight ŵ (rows × cols, `odtype`), one thread per 8 values of a row.
extern "C" __global__ void hc_affine_decode(AffineArgs a, void* __restrict__ out, int odtype) {
    const int c8 = (a.cols + 7) >> 3;
    const long long n = (long long)a.rows * c8;
    const bool narrow = n < (1ll << 32);  // a 32-bit division where the index fits
    const uint32_t mask = (1u << a.bits) - 1;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const int r = narrow ? (int)((uint32_t)k / (uint32_t)c8) : (int)(k / c8);
        const int j0 = (int)(k - (long long)r * c8) * 8;
        float v8[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int j = min(j0 + i, a.cols - 1);
            const long long off = ((long long)r * a.cols + j) * a.bits;
            const long long b = off >> 3;
            uint32_t v = a.codes[b];
            if (b + 1 < a.n_code_bytes) v |= (uint32_t)a.codes[b + 1] << 8;
            const float q = hc_u2f((v >> (off & 7)) & mask);
            const int g = a.glen_log2 >= 0 ? j >> a.glen_log2 : j / a.glen;
            const long long si = hc_si(a, r, g);
            const float lo = a.offsets ? hc_sval(a, a.offsets, si) : 0.f;
            v8[i] = hc_sval(a, a.scales, si) * (a.qmul * q - a.qbias) + lo;
        }
        hc_store8(out, odtype, (long long)r * a.cols + j0, v8, min(8, a.cols - j0), (a.cols & 7) == 0 && hc_aligned16(out));
    }
}

// ---------------------------------------------------------------------------------------
// Affine GEMV / small GEMM on tensor cores: batches of up to 16 rows of bf16 or f16
// activations, codes of 2 or 4 bits (and 8 bits with f16 activations).
//
// A block computes 16·HC_MMA_R weight rows (tiles of the mma's M = 16) for every activation
// row (the mma's N: one or two tiles of 8); its HC_MMA_WARPS warps split the columns, each
// loading the next step's codes and scales while it computes one. A macro step covers
// 4·CW·PER columns (PER = 32 / BITS codes per 32-bit word): lane (g, t) = (lane / 4,
// lane % 4) loads CW words of rows g and g + 8 at columns [t·CW·PER, (t + 1)·CW·PER) of the
// step, so the four lanes of a row read one contiguous run of 16·CW bytes. The dot product
// over a k-step does not depend on which columns sit in which of the mma's 16 k slots, as long
// as the weight and the activation fragments agree: a word's codes i and i + PER/2 (bits
// BITS·i and BITS·i + 16) become the two halves of one fragment register in a single LOP3
// with the exponent of MAGIC (bf16 128 or f16 1024: the half then holds MAGIC + q exactly),
// and the activations are paired the same way with PRMT. The weight fragment thus holds
// MAGIC + q, the products are exact and the mma accumulates them in f32; a second mma of the
// same activations against ones gives Σx, and per macro step (groups never straddle one)
//   Σ ŵ·x = s·qmul·Σ(MAGIC + q)·x + (lo − s·qbias − MAGIC·s·qmul)·Σx.
// Instructions per weight (4-bit, M ≤ 8): about 5 integer ops and 2.5 others per 8 codes
// of a lane, then the two mmas; the codes are read once, the activations from L1/L2.
#define HC_MMA_WARPS 8


// Row tiles of 16 one warp of the tensor-core kernel computes (their activation fragments are
// loaded once): 2 when the batch takes two mma tiles (the activations then outweigh the codes).
#define HC_MMA_R(NT) ((NT) == 2 ? 2 : 1)
// Whether a warp loads the next step's codes before computing one: with two batch tiles
// (measured on an H200; with one tile more warps per SM, at about 60 registers, beat it).
#define HC_MMA_AHEAD(NT) ((NT) == 2)

// One macro step's codes (rows g and g + 8 of each row tile), its group's scale terms and the
// lane's activations (loaded a step ahead too: their latency, L1 or L2, was the bottleneck).
template <int CW, int R, int NT, int XW>
struct HcMmaStep {
    uint32_t w[R][2][CW];
    float mul[R][2], add[R][2];
    // This lane's activations (batch row g, PER per word) for one batch tile; two tiles load
    // theirs in the step (registers).
    uint32_t x[NT == 1 ? CW : 1][XW];
};

// The lane's PER activations of batch row m at column j: zeros past the batch, or with CLAMP
// the batch's last row (M >= 1), whose products land in output columns that are never stored.
// CLAMP spares the two-tile kernel a predicated load and a zeroing branch (3-5 % faster at
// batch 16 on an H200); the one-tile kernel measured no faster with it.
template <int XW, bool CLAMP = false>
__device__ __forceinline__ void hc_mma_x(const AffineArgs& a, int m, long long j, uint32_t (&xv)[XW]) {
    if (CLAMP || m < a.M) {
        const uint16_t* px = static_cast<const uint16_t*>(a.x) + (long long)(CLAMP ? min(m, a.M - 1) : m) * a.cols + j;
        hc_load_words<(XW >= 4 ? 4 : XW)>(px, xv);
        if (XW == 8) hc_load_words<4>(px + 8, xv + 4);
    } else {
#pragma unroll
        for (int i = 0; i < XW; i++) xv[i] = 0;
    }
}

// The step's scale terms from what hc_mma_load read: ŵ = s·qmul·(MAGIC + q) + (lo − s·qbias −
// MAGIC·s·qmul) for rows g and g + 8 of each row tile.
template <int CW, int R, int NT, int XW>
__device__ __forceinline__ void hc_mma_terms(const AffineArgs& a, float fmagic, HcMmaStep<CW, R, NT, XW>& st) {
#pragma unroll
    for (int ti = 0; ti < R; ti++) {
        float2 sc, lo;
        if (!a.srs) {
            sc.x = sc.y = hc_sval(a, a.scales, 0);
            lo.x = lo.y = a.offsets ? hc_sval(a, a.offsets, 0) : 0.f;
        } else if (a.sdtype == 0) {
            sc = make_float2(st.mul[ti][0], st.mul[ti][1]);
            lo = make_float2(st.add[ti][0], st.add[ti][1]);
        } else {
            sc = hc_spair16(a.sdtype, __float_as_uint(st.mul[ti][0]));
            lo = hc_spair16(a.sdtype, __float_as_uint(st.add[ti][0]));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float s_ = h ? sc.y : sc.x, l_ = h ? lo.y : lo.x;
            st.mul[ti][h] = s_ * a.qmul;
            st.add[ti][h] = l_ - s_ * a.qbias - fmagic * st.mul[ti][h];
        }
    }
}

template <int BITS, int CW, int R, int NT>
__device__ __forceinline__ void hc_mma_load(const AffineArgs& a, int s, int r0, int g, int t, float fmagic,
                                            HcMmaStep<CW, R, NT, 16 / BITS>& st) {
    constexpr int PER = 32 / BITS;
    constexpr int XW = PER / 2;
    constexpr int MC = 4 * CW * PER;
    if (NT == 1)
#pragma unroll
        for (int k = 0; k < CW; k++) hc_mma_x<XW>(a, g, s * MC + t * CW * PER + k * PER, st.x[k]);
    const long long row_bytes = (long long)a.cols * BITS / 8;
    const int grp = a.srs ? (a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen) : 0;
#pragma unroll
    for (int ti = 0; ti < R; ti++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // Two batch tiles read the weight's last row for rows past it (their sums are never
            // stored); one tile keeps the predicate (see hc_mma_x).
            const int r = NT == 2 ? min(r0 + 16 * ti + g + 8 * h, a.rows - 1) : r0 + 16 * ti + g + 8 * h;
            if (NT == 2 || r < a.rows) {
                hc_load_words<CW>(a.codes + (long long)r * row_bytes + (long long)s * MC * BITS / 8 + t * CW * 4,
                                  st.w[ti][h]);
            } else {
#pragma unroll
                for (int k = 0; k < CW; k++) st.w[ti][h][k] = 0;
            }
        }
        // Rows g and g + 8 side by side (hc_si; zeros past the weight's last row), loaded as
        // they are held: mul holds the scale pair and add the offset pair, as f32 or as one
        // word of two 16-bit values in [0] (hc_mma_terms turns them into the step's terms
        // where it runs, so a load ahead holds no more registers than the terms).
        uint2 sraw = make_uint2(0, 0), oraw = make_uint2(0, 0);
        if (a.srs) {
            // Two batch tiles: a second row tile past the weight reads the last tile's terms
            // (the tiled array holds ⌈rows/16⌉ tiles; those sums are never stored).
            const int rt = NT == 2 ? min(r0 + 16 * ti, (a.rows - 1) & ~15) : r0 + 16 * ti;
            const long long si = hc_si(a, rt + g, grp);
            if (a.sdtype == 0) {
                sraw = *reinterpret_cast<const uint2*>(static_cast<const float*>(a.scales) + si);
                if (a.offsets) oraw = *reinterpret_cast<const uint2*>(static_cast<const float*>(a.offsets) + si);
            } else {
                sraw.x = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(a.scales) + si);
                if (a.offsets) oraw.x = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(a.offsets) + si);
            }
        }
        st.mul[ti][0] = __uint_as_float(sraw.x);
        st.mul[ti][1] = __uint_as_float(sraw.y);
        st.add[ti][0] = __uint_as_float(oraw.x);
        st.add[ti][1] = __uint_as_float(oraw.y);
    }
    // Without a load ahead the terms are due now (fewer registers than converting later).
    if (!HC_MMA_AHEAD(NT)) hc_mma_terms(a, fmagic, st);
}

// The scale terms of a step's second group (G = 2 in hc_mma_step): rows g and g + 8.
struct HcHalfTerms {
    float mul[2], add[2];
};

// One macro step of the tensor-core kernel: its k-steps' mmas, then the group's scale terms.
// G = 2 (one tile, one batch tile): the step holds two groups, every lane's words k < CW/2
// in the first (`cur`'s terms) and the others in the second (`second`'s): the sums of the two
// halves of the word loop are kept apart.
template <int BITS, int CW, int NT, int R, bool BF16, int G = 1>
__device__ __forceinline__ void hc_mma_step(const AffineArgs& a, int s, int g, int t,
                                            const HcMmaStep<CW, R, NT, 16 / BITS>& cur, float (&acc)[R][NT][4],
                                            const HcHalfTerms* second = nullptr) {
    static_assert(G == 1 || (G == 2 && NT == 1 && R == 1 && CW % 2 == 0), "two groups a step: one tile, one batch tile");
    constexpr int PER = 32 / BITS;
    constexpr int XW = PER / 2;
    constexpr uint32_t MASK = ((1u << BITS) - 1) * 0x00010001u;
    constexpr uint32_t MAGIC = BF16 ? 0x43004300u : 0x64006400u;
    constexpr uint32_t ONES = BF16 ? 0x3F803F80u : 0x3C003C00u;
    float c[R][NT][4], sx[NT][4], c1[4] = {0.f, 0.f, 0.f, 0.f}, sx1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sx[n][i] = 0.f;
#pragma unroll
            for (int ti = 0; ti < R; ti++) c[ti][n][i] = 0.f;
        }
#pragma unroll
    for (int k = 0; k < CW; k++) {
        // (G = 2: the first half's words sum into c1, sx1; k is a constant once unrolled.)
        const bool first = G == 2 && k < CW / 2;
        uint32_t xv[NT][XW];
        if (NT == 1) {
#pragma unroll
            for (int i = 0; i < XW; i++) xv[0][i] = cur.x[NT == 1 ? k : 0][i];
        } else {
#pragma unroll
            for (int n = 0; n < NT; n++) hc_mma_x<XW, true>(a, g + 8 * n, s * 4 * CW * PER + t * CW * PER + k * PER, xv[n]);
        }
#pragma unroll
        for (int j = 0; j < PER / 4; j++) {
            // k-step j of the word: pairs 2j (slots 2t, 2t+1) and 2j + 1 (slots 2t+8, 2t+9).
            const int i0 = 2 * j, i1 = 2 * j + 1;
            uint32_t b0[NT], b1[NT];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                b0[n] = __byte_perm(xv[n][i0 / 2], xv[n][i0 / 2 + PER / 4], (i0 & 1) ? 0x7632 : 0x5410);
                b1[n] = __byte_perm(xv[n][i1 / 2], xv[n][i1 / 2 + PER / 4], (i1 & 1) ? 0x7632 : 0x5410);
                if (first) hc_mma16816<BF16>(sx1, ONES, ONES, ONES, ONES, b0[n], b1[n]);
                else hc_mma16816<BF16>(sx[n], ONES, ONES, ONES, ONES, b0[n], b1[n]);
            }
#pragma unroll
            for (int ti = 0; ti < R; ti++) {
                const uint32_t a0 = hc_lop3_and_or(cur.w[ti][0][k] >> (BITS * i0), MASK, MAGIC);
                const uint32_t a1 = hc_lop3_and_or(cur.w[ti][1][k] >> (BITS * i0), MASK, MAGIC);
                const uint32_t a2 = hc_lop3_and_or(cur.w[ti][0][k] >> (BITS * i1), MASK, MAGIC);
                const uint32_t a3 = hc_lop3_and_or(cur.w[ti][1][k] >> (BITS * i1), MASK, MAGIC);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    if (first) hc_mma16816<BF16>(c1, a0, a1, a2, a3, b0[n], b1[n]);
                    else hc_mma16816<BF16>(c[ti][n], a0, a1, a2, a3, b0[n], b1[n]);
                }
            }
        }
    }
    if constexpr (G == 2) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[0][0][i] = fmaf(cur.mul[0][i >> 1], c1[i],
                                fmaf(cur.add[0][i >> 1], sx1[i],
                                     fmaf(second->mul[i >> 1], c[0][0][i],
                                          fmaf(second->add[i >> 1], sx[0][i], acc[0][0][i]))));
    } else {
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[ti][n][i] =
                        fmaf(cur.mul[ti][i >> 1], c[ti][n][i], fmaf(cur.add[ti][i >> 1], sx[n][i], acc[ti][n][i]));
    }
}

template <int BITS, int CW, int NT, bool BF16>
__device__ __forceinline__ void hc_affine_mma(const AffineArgs& a) {
    constexpr int PER = 32 / BITS;          // codes per word
    constexpr int TC = CW * PER;            // columns a lane covers per macro step
    constexpr int MC = 4 * TC;              // columns per macro step
    constexpr int XW = PER / 2;             // activation words (2 values) per code word
    constexpr int R = HC_MMA_R(NT);
    constexpr float FMAGIC = BF16 ? 128.f : 1024.f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16 * R;
    const uint16_t* x = static_cast<const uint16_t*>(a.x);
    const int steps = a.cols / MC;
    float acc[R][NT][4] = {};
    // One step in registers; with two batch tiles the next step's codes load while one
    // computes (HC_MMA_AHEAD).
    HcMmaStep<CW, R, NT, 16 / BITS> next;
    if (warp < steps) hc_mma_load<BITS, CW, R, NT>(a, warp, r0, g, t, FMAGIC, next);
    for (int s = warp; s < steps; s += HC_MMA_WARPS) {
        HcMmaStep<CW, R, NT, 16 / BITS> cur = next;
        if (HC_MMA_AHEAD(NT)) hc_mma_terms(a, FMAGIC, cur);
        const bool more = s + HC_MMA_WARPS < steps;
        if (HC_MMA_AHEAD(NT) && more) hc_mma_load<BITS, CW, R, NT>(a, s + HC_MMA_WARPS, r0, g, t, FMAGIC, next);
        hc_mma_step<BITS, CW, NT, R, BF16>(a, s, g, t, cur, acc);
        if (!HC_MMA_AHEAD(NT) && more) hc_mma_load<BITS, CW, R, NT>(a, s + HC_MMA_WARPS, r0, g, t, FMAGIC, next);
    }
    // The warps' partial sums: part[warp][row][batch row].
    __shared__ float part[HC_MMA_WARPS][16 * R][8 * NT];
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) part[warp][16 * ti + g + 8 * (i >> 1)][8 * n + 2 * t + (i & 1)] = acc[ti][n][i];
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * R * 8 * NT; e += blockDim.x) {
        const int r = e / (8 * NT), m = e % (8 * NT);
        if (r0 + r < a.rows && m < a.M) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < HC_MMA_WARPS; w++) v += part[w][r][m];
            hc_store(a.y, a.ydtype, (long long)m * a.rows + r0 + r, v + (a.bias ? a.bias[r0 + r] : 0.f));
        }
    }
}

// hc_affine_mma_b{BITS}_w{CW}_n{NT}_{bf16,f16}: one kernel per (bits, words per lane and
// step, batch tiles of 8, activation type); 8-bit codes only with f16 (bf16 holds 7 bits).
#define HC_MMA(B, W, N, T, BF)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * HC_MMA_WARPS) hc_affine_mma_b##B##_w##W##_n##N##_##T( \
        AffineArgs a) {                                                                              \
        hc_affine_mma<B, W, N, BF>(a);                                                               \
    }
#define HC_MMA_W(B, N, T, BF) HC_MMA(B, 1, N, T, BF) HC_MMA(B, 2, N, T, BF) HC_MMA(B, 4, N, T, BF)
#define HC_MMA_N(B, T, BF) HC_MMA_W(B, 1, T, BF) HC_MMA_W(B, 2, T, BF)
HC_MMA_N(2, bf16, true)
HC_MMA_N(4, bf16, true)
HC_MMA_N(2, f16, false)
HC_MMA_N(4, f16, false)
HC_MMA_N(8, f16, false)

// ---------------------------------------------------------------------------------------
// Batch 1 on tensor cores, fed by cp.async: the math of hc_affine_mma (4 code words per lane
// and step, one batch tile, hc_mma_step), but each warp streams its steps through a ring of
// HC_CPA_STAGES stages in shared memory that every lane fills with its own `cp.async` copies
// (codes as stored, 16 bytes a row, or two 8-byte pieces for groups of half a step; the scale
// pairs of the tiled layout; the step's activations), so the bytes in flight cost no registers. A lane reads its warp's stage
// after `cp.async.wait_group` and `__syncwarp`: no block-wide barrier until the final sum.
#define HC_CPA_WARPS 8
#define HC_CPA_STAGES 3

// One warp step in shared memory: codes [h][g][t][word] (rows g + 8h of the tile), the scale
// pairs [group][g] of its G groups (scale of rows g, g + 8, then their offsets: 16 bytes of
// f32, or the first 8 bytes holding the 16-bit pairs as stored) and each lane's activations.
template <int BITS, int G = 1>
struct HcCpaStage {
    uint32_t w[2][8][4][4];
    float so[G][8][4];
    uint32_t x[4][4 * (16 / BITS)];
};
// The host sizes the dynamic shared memory from these (kernels-cuda `affine_cpa_shared`).
static_assert(sizeof(HcCpaStage<4>) == 1408 && sizeof(HcCpaStage<2>) == 1664, "HcCpaStage size");
static_assert(sizeof(HcCpaStage<4, 2>) == 1536, "HcCpaStage size");

// G = 2: groups of half a step (64 columns at 4 bits). A lane then takes its words from both
// halves: words 0, 1 from the first group's columns [16t, 16t + 16) and 2, 3 from the second's,
// each half 8 bytes of a row's codes (where G = 1 takes the 16 bytes of columns [32t, 32t + 32)),
// with the activations to match; lanes t = 2, 3 copy the second group's scale pairs. Every mma
// then stays inside one group (hc_mma_step's G). A first form that kept G = 1's words and split
// each mma by lanes (two more mmas a k-step) ran slower than the plain tensor-core kernel.
template <int BITS, bool BF16, int NW = HC_CPA_WARPS, int S = HC_CPA_STAGES, int G = 1>
__device__ __forceinline__ void hc_affine_cpa(const AffineArgs& a, int tile) {
    constexpr int CW = 4, PER = 32 / BITS, XW = PER / 2, MC = 4 * CW * PER;
    constexpr float FMAGIC = BF16 ? 128.f : 1024.f;
    extern __shared__ __align__(16) uint8_t hc_cpa_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = tile * 16;
    HcCpaStage<BITS, G>* ring = reinterpret_cast<HcCpaStage<BITS, G>*>(hc_cpa_sm) + warp * S;
    float* part = reinterpret_cast<float*>(hc_cpa_sm + sizeof(HcCpaStage<BITS, G>) * NW * S);
    const int steps = a.cols / MC;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    // Rows past the weight read its last row (their sums are never stored).
    const uint8_t* ca = a.codes + min(r0 + g, a.rows - 1) * row_bytes + t * 16 / G;
    const uint8_t* cb = a.codes + min(r0 + g + 8, a.rows - 1) * row_bytes + t * 16 / G;
    const void* so_src = (t & 1) == 0 ? a.scales : a.offsets;
    const int s_bytes = a.sdtype ? 2 : 4;
    const uint16_t* xr = static_cast<const uint16_t*>(a.x) + t * CW * PER / G;
    const int mine = warp < steps ? (steps - 1 - warp) / NW + 1 : 0;
    auto issue = [&](int i) {
        const int s = warp + i * NW;
        HcCpaStage<BITS, G>& st = ring[i % S];
        if (G == 1) {
            hc_cp16(&st.w[0][g][t][0], ca + (long long)s * 64);
            hc_cp16(&st.w[1][g][t][0], cb + (long long)s * 64);
        } else {
            // (8-byte copies exist only through L1.)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                hc_cp8_l1(&st.w[0][g][t][2 * h], ca + (long long)s * 64 + 32 * h);
                hc_cp8_l1(&st.w[1][g][t][2 * h], cb + (long long)s * 64 + 32 * h);
            }
        }
        if (a.srs && (G == 2 || t < 2) && so_src) {
            // The pair of rows g, g + 8: 8 bytes of f32 or 4 of a 16-bit type (kept raw).
            const int half = G == 2 ? t >> 1 : 0;
            const int grp = (a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen) + half;
            const uint8_t* src = static_cast<const uint8_t*>(so_src) + hc_si(a, r0 + g, grp) * s_bytes;
            if (s_bytes == 4) hc_cp8_l1(&st.so[half][g][2 * (t & 1)], src);
            else hc_cp4_l1(&st.so[half][g][t & 1], src);
        }
        if (g == 0) {
            // The lane's words' activations, 8 a copy: with G = 2 the first half's from the
            // first group's columns, the second half's MC/2 columns on.
            constexpr int Q = CW * XW / 4;
#pragma unroll
            for (int q = 0; q < Q; q++)
                hc_cp16_l1(&st.x[t][4 * q], xr + (long long)s * MC + (G == 2 && q >= Q / 2 ? MC / 2 - 4 * Q : 0) + 8 * q);
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < mine) issue(i);
        hc_cp_commit();
    }
    const float sc0 = a.srs ? 0.f : hc_sval(a, a.scales, 0), lo0 = a.srs || !a.offsets ? 0.f : hc_sval(a, a.offsets, 0);
    float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
    for (int i = 0; i < mine; i++) {
        if (i + S - 1 < mine) issue(i + S - 1);
        hc_cp_commit();
        hc_cp_wait<S - 1>();
        __syncwarp();
        const HcCpaStage<BITS, G>& st = ring[i % S];
        HcMmaStep<CW, 1, 1, XW> cur;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 v = *reinterpret_cast<const uint4*>(&st.w[h][g][t][0]);
            cur.w[0][h][0] = v.x;
            cur.w[0][h][1] = v.y;
            cur.w[0][h][2] = v.z;
            cur.w[0][h][3] = v.w;
        }
#pragma unroll
        for (int q = 0; q < CW * XW / 4; q++) {
            const uint4 v = *reinterpret_cast<const uint4*>(&st.x[t][4 * q]);
            const int k = 4 * q / XW, i0 = 4 * q % XW;
            cur.x[k][i0] = v.x;
            cur.x[k][i0 + 1] = v.y;
            cur.x[k][i0 + 2] = v.z;
            cur.x[k][i0 + 3] = v.w;
        }
        float4 so[G];
#pragma unroll
        for (int q = 0; q < G; q++) {
            so[q] = make_float4(sc0, sc0, lo0, lo0);
            if (a.srs) {
                if (a.sdtype == 0) {
                    so[q] = *reinterpret_cast<const float4*>(&st.so[q][g][0]);
                } else {
                    const uint2 v = *reinterpret_cast<const uint2*>(&st.so[q][g][0]);
                    const float2 sp = hc_spair16(a.sdtype, v.x), op = hc_spair16(a.sdtype, v.y);
                    so[q] = make_float4(sp.x, sp.y, op.x, op.y);
                }
                if (!a.offsets) so[q].z = so[q].w = 0.f;
            }
        }
        __syncwarp();  // every lane has read the slot before any lane refills it
        HcHalfTerms second;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float sc = h ? so[0].y : so[0].x, lo = h ? so[0].w : so[0].z;
            cur.mul[0][h] = sc * a.qmul;
            cur.add[0][h] = lo - sc * a.qbias - FMAGIC * cur.mul[0][h];
            if constexpr (G == 2) {
                const float sc2 = h ? so[1].y : so[1].x, lo2 = h ? so[1].w : so[1].z;
                second.mul[h] = sc2 * a.qmul;
                second.add[h] = lo2 - sc2 * a.qbias - FMAGIC * second.mul[h];
            }
        }
        // Every lane holds the activations (not only batch row g = 0): the other columns of
        // the mma repeat row 0's sums and are never stored.
        hc_mma_step<BITS, CW, 1, 1, BF16, G>(a, warp + i * NW, g, t, cur, acc, &second);
    }
    hc_cp_wait<0>();
    if (t == 0) {
        part[warp * 16 + g] = acc[0][0][0];
        part[warp * 16 + g + 8] = acc[0][0][2];
    }
    __syncthreads();
    if (threadIdx.x < 16 && r0 + (int)threadIdx.x < a.rows) {
        const int r = r0 + threadIdx.x;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) v += part[w * 16 + threadIdx.x];
        hc_store(a.y, a.ydtype, r, v + (a.bias ? a.bias[r] : 0.f));
    }
}

// hc_affine_cpa_b{2,4}_{bf16,f16}: batch 1, rows of whole steps (4 words per lane), groups of
// whole steps; dynamic shared memory HC_CPA_WARPS · (HC_CPA_STAGES · stage + 64) bytes.
#define HC_CPA(B, T, BF)                                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * HC_CPA_WARPS) hc_affine_cpa_b##B##_##T(AffineArgs a) { \
        hc_affine_cpa<B, BF>(a, blockIdx.x);                                                                  \
    }
HC_CPA(2, bf16, true)
HC_CPA(4, bf16, true)
HC_CPA(2, f16, false)
HC_CPA(4, f16, false)

// hc_affine_cpa_halves_b4_{bf16,f16}: the same for groups of half a step (64 columns at 4 bits:
// `int4-g64`, `int4-g64-sym`); dynamic shared memory as above with stages of two groups' scale
// pairs. At 2 bits (groups of 128, `int2`) the plain tensor-core kernel ran 1.3× faster on an
// H100, so none is compiled (docs/eval/cuda_int4_variants.md).
#define HC_CPA_HALVES(B, T, BF)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * HC_CPA_WARPS) hc_affine_cpa_halves_b##B##_##T( \
        AffineArgs a) {                                                                            \
        hc_affine_cpa<B, BF, HC_CPA_WARPS, HC_CPA_STAGES, 2>(a, blockIdx.x);                       \
    }
HC_CPA_HALVES(4, bf16, true)
HC_CPA_HALVES(4, f16, false)

// Several layers that read one activation row (a block's q, k and v projections; gate and up)
// in one launch of the batch-1 kernel: the grid is the layers' row tiles end to end, and each
// block runs hc_affine_cpa on its layer. At batch 1 a launch of a 4096-wide layer costs a few
// µs beyond its bytes, so q, k and v of a Llama block run 1.7× faster as one launch.
#define HC_GROUP_MAX 4
struct AffineGroupArgs {
    AffineArgs a[HC_GROUP_MAX];
    int first[HC_GROUP_MAX + 1];  // row tiles before layer l; first[n] is the grid
    int n;
};
template <int BITS, bool BF16>
__device__ __forceinline__ void hc_affine_cpa_group(const AffineGroupArgs& g) {
    const int b = blockIdx.x;
    // A constant index per layer: a dynamic one would copy the parameters to local memory.
#pragma unroll
    for (int l = 0; l < HC_GROUP_MAX; l++) {
        if (l < g.n && b >= g.first[l] && b < g.first[l + 1]) {
            hc_affine_cpa<BITS, BF16>(g.a[l], b - g.first[l]);
            return;
        }
    }
}
// Blocks an SM: 3, as the one-layer 4-bit kernel gets at 74 registers (unbounded, the four
// inlined bodies take 86, 2 blocks); 2 at 2 bits (bounded to 3 blocks it spills).
#define HC_CPA_GROUP(B, T, BF, MINB)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * HC_CPA_WARPS, MINB)                        \
        hc_affine_cpa_group_b##B##_##T(AffineGroupArgs g) {                                      \
        hc_affine_cpa_group<B, BF>(g);                                                           \
    }
HC_CPA_GROUP(2, bf16, true, 2)
HC_CPA_GROUP(4, bf16, true, 3)
HC_CPA_GROUP(2, f16, false, 2)
HC_CPA_GROUP(4, f16, false, 3)

#include "gemm_mma.cuh"

// hc_affine_gemm_b{2,4}_r{R}_n{NT}_{bf16,f16}: S stages (4 with one row tile per warp, 3 with
// two: measured on an H200), dynamic shared memory S · stage bytes (kernels-cuda
// `affine_gemm_shared`).
#define HC_GEMM(B, R, N, S, T, BF)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * HC_GEMM_WARPS) hc_affine_gemm_b##B##_r##R##_n##N##_##T( \
        AffineArgs a) {                                                                                     \
        hc_affine_gemm<B, BF, R, N, S>(a);                                                                  \
    }
#define HC_GEMM_RN(B, T, BF) HC_GEMM(B, 1, 4, 4, T, BF) HC_GEMM(B, 1, 8, 4, T, BF) HC_GEMM(B, 2, 4, 3, T, BF) HC_GEMM(B, 2, 8, 3, T, BF)
HC_GEMM_RN(2, bf16, true)
HC_GEMM_RN(4, bf16, true)
HC_GEMM_RN(2, f16, false)
HC_GEMM_RN(4, f16, false)

// ---------------------------------------------------------------------------------------
// Fixed-rate E8.

struct E8Args {
    const uint8_t* packed;
    const float* row_scales;  // the stored row scale divided by α
    const float* xr;          // RHT(x), M × 8·words, f32
    const float* half;        // ½·Σ of each word's 8 coordinates of xr, M × words
    void* y;
    const float* bias;
    int ydtype;
    int M, rows, words, bits;
};

// half[k] = ½·Σ xr[8k .. 8k+8], one thread per word (of all M rows).
extern "C" __global__ void hc_e8_halves(const float* __restrict__ xr, float* __restrict__ half, long long n) {
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const float4* p = reinterpret_cast<const float4*>(xr + 8 * k);
        const float4 u = p[0], v = p[1];
        half[k] = 0.5f * ((u.x + u.y) + (u.z + u.w) + (v.x + v.y) + (v.z + v.w));
    }
}

// ⟨point, x'⟩ of one word from its symbols' bit field `v` (B bits per symbol), its 8
// activations and their half sum: Σ_{i=1..7} sym_i·x_{i−1} + ((s0 & ~1) + parity)·x_7
// + (c − 2h)·half, h = 2^(B−1) (see `hypercodec_lattice::Lattice::decode_word_fixed`).
template <int B, typename W>
__device__ __forceinline__ float hc_e8_word(W v, const float* xw, float hf) {
    constexpr W MASK = (W(1) << B) - 1;
    constexpr int H = 1 << (B - 1);
    W lsbs = 0;
#pragma unroll
    for (int i = 1; i < 8; i++) lsbs |= W(1) << (i * B);
    const uint32_t s0 = (uint32_t)(v & MASK);
    float d = 0.f;
#pragma unroll
    for (int i = 1; i < 8; i++) d = fmaf(hc_u2f((uint32_t)((v >> (i * B)) & MASK)), xw[i - 1], d);
    const uint32_t par = (sizeof(W) == 8 ? __popcll((unsigned long long)(v & lsbs)) : __popc((uint32_t)(v & lsbs))) & 1;
    d = fmaf(hc_u2f((s0 & ~1u) + par), xw[7], d);
    return fmaf((s0 & 1) ? (1.f - 2.f * H) : (-2.f * H), hf, d);
}

// The 8 coordinates of one word's lattice point (unscaled).
template <int B, typename W>
__device__ __forceinline__ void hc_e8_point(W v, float* p) {
    constexpr W MASK = (W(1) << B) - 1;
    constexpr int H = 1 << (B - 1);
    const int s0 = (int)(v & MASK);
    const float half = (s0 & 1) ? 0.5f : 0.f;
    int par = 0;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        const int q = (int)((v >> (i * B)) & MASK);
        par += q;
        p[i - 1] = (float)(q - H) + half;
    }
    p[7] = (float)((s0 & ~1) - H + (par & 1)) + half;
}

// Four consecutive words of a row (4·B bytes, 4-byte aligned) as B 32-bit words, and word k
// of them.
template <int B>
__device__ __forceinline__ void hc_e8_load4(const uint8_t* p, uint32_t* g) {
    if (B == 2) {
        uint2 v = *reinterpret_cast<const uint2*>(p);
        g[0] = v.x; g[1] = v.y;
    } else if (B == 4) {
        uint4 v = *reinterpret_cast<const uint4*>(p);
        g[0] = v.x; g[1] = v.y; g[2] = v.z; g[3] = v.w;
    } else if (B == 8) {
        uint4 v = reinterpret_cast<const uint4*>(p)[0], u = reinterpret_cast<const uint4*>(p)[1];
        g[0] = v.x; g[1] = v.y; g[2] = v.z; g[3] = v.w;
        g[4] = u.x; g[5] = u.y; g[6] = u.z; g[7] = u.w;
    } else {
#pragma unroll
        for (int i = 0; i < B; i++) g[i] = reinterpret_cast<const uint32_t*>(p)[i];
    }
}

template <int B, typename W>
__device__ __forceinline__ W hc_e8_word_of(const uint32_t* g, int k) {
    constexpr int BITS = 8 * B;
    const int s = BITS * k;
    if (B == 4) return (W)g[k];
    if (B == 8) return (W)(((unsigned long long)g[2 * k + 1] << 32) | g[2 * k]);
    if (B == 7) {
        // A 56-bit field may span three 32-bit words.
        const int i = s >> 5, sh = s & 31;
        unsigned long long lo = ((unsigned long long)g[i + 1] << 32) | g[i];
        unsigned long long v = lo >> sh;
        if (sh + BITS > 64) v |= (unsigned long long)g[i + 2] << (64 - sh);
        return (W)(v & ((1ull << BITS) - 1));
    }
    const int i = s >> 5, sh = s & 31;
    const unsigned long long hi = (i + 1 < B) ? g[i + 1] : 0u;
    const unsigned long long v = ((hi << 32) | g[i]) >> sh;
    return (W)(v & ((1ull << BITS) - 1));
}

// A block computes R rows (see hc_e8_gemv_b{B}_m{M} below), its threads splitting the columns
// in groups of 4 words (the host sends rows of another word count to ..._any); a group's
// activations are loaded once for all those rows.
template <int B, int MT, int R = HC_R(MT)>
__device__ __forceinline__ void hc_e8_rows(const E8Args& a) {
    typedef typename std::conditional<(B <= 4), uint32_t, unsigned long long>::type W;
    const int r0 = blockIdx.x * R;
    const long long width = 8ll * a.words;
    const long long row_bytes = (long long)a.words * B;
    const int groups = a.words >> 2;
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = 0.f;
    for (int gi = threadIdx.x; gi < groups; gi += blockDim.x) {
        uint32_t g[R][B];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < a.rows) {
                hc_e8_load4<B>(a.packed + (r0 + r) * row_bytes + (long long)gi * 4 * B, g[r]);
            } else {
#pragma unroll
                for (int i = 0; i < B; i++) g[r][i] = 0;
            }
        }
        if (MT == 1) {
            const float4 hf4 = *reinterpret_cast<const float4*>(a.half + 4 * gi);
            const float hf[4] = {hf4.x, hf4.y, hf4.z, hf4.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4* xp = reinterpret_cast<const float4*>(a.xr + 8ll * (4 * gi + k));
                const float4 x0 = xp[0], x1 = xp[1];
                const float xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][0] += hc_e8_word<B, W>(hc_e8_word_of<B, W>(g[r], k), xw, hf[k]);
            }
        } else {
            // Several activation rows: each word is decoded once, to its 8 coordinates.
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float p[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) hc_e8_point<B, W>(hc_e8_word_of<B, W>(g[r], k), p[r]);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    if (m < a.M) {
                        const float4* xp = reinterpret_cast<const float4*>(a.xr + m * width + 8ll * (4 * gi + k));
                        const float4 x0 = xp[0], x1 = xp[1];
                        const float xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            float d = 0.f;
#pragma unroll
                            for (int i = 0; i < 8; i++) d = fmaf(p[r][i], xw[i], d);
                            acc[r][m] += d;
                        }
                    }
                }
            }
        }
    }
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) sc[r] = r0 + r < a.rows ? a.row_scales[r0 + r] : 0.f;
    hc_block_store<R, MT>(acc, sc, r0, a.rows, a.M, a.bias, a.y, a.ydtype);
}

// Rows whose word count is not a multiple of 4 (or unaligned words): a block per row, one word
// per thread at a time, up to HC_MAX_M activation rows.
template <int B>
__device__ __forceinline__ void hc_e8_any(const E8Args& a) {
    typedef typename std::conditional<(B <= 4), uint32_t, unsigned long long>::type W;
    const int r = blockIdx.x;
    const long long width = 8ll * a.words;
    const uint8_t* row = a.packed + (long long)r * a.words * B;
    float acc[1][HC_MAX_M];
#pragma unroll
    for (int m = 0; m < HC_MAX_M; m++) acc[0][m] = 0.f;
    for (int wi = threadIdx.x; wi < a.words; wi += blockDim.x) {
        W v = 0;
#pragma unroll
        for (int i = 0; i < B; i++) v |= (W)row[(long long)wi * B + i] << (8 * i);
#pragma unroll
        for (int m = 0; m < HC_MAX_M; m++) {
            if (m < a.M) {
                const float* xp = a.xr + m * width + 8ll * wi;
                float xw[8];
#pragma unroll
                for (int i = 0; i < 8; i++) xw[i] = xp[i];
                acc[0][m] += hc_e8_word<B, W>(v, xw, a.half[(long long)m * a.words + wi]);
            }
        }
    }
    const float sc[1] = {a.row_scales[r]};
    hc_block_store<1, HC_MAX_M>(acc, sc, r, a.rows, a.M, a.bias, a.y, a.ydtype);
}

extern "C" __global__ void __launch_bounds__(256) hc_e8_gemv_any(E8Args a) {
    switch (a.bits) {
        case 2: hc_e8_any<2>(a); break;
        case 3: hc_e8_any<3>(a); break;
        case 4: hc_e8_any<4>(a); break;
        case 5: hc_e8_any<5>(a); break;
        case 6: hc_e8_any<6>(a); break;
        case 7: hc_e8_any<7>(a); break;
        default: hc_e8_any<8>(a); break;
    }
}

// hc_e8_gemv_b{2..8}_m{1,2,4}: one kernel per (bits, pass of up to 1, 2 or 4 activation rows).
// Above one row the activations (f32, after the RHT) are read once per block of R weight rows
// and their L2 traffic bounds the kernel: R = 8 for passes of 4 rows (2.2x faster than 2 rows
// per block at batch 4, 8192x8192 on an H200), R = 4 for passes of 2 (1.7x faster than 2,
// 1.1x faster than 8).
#define HC_E8(B, M, R) \
    extern "C" __global__ void __launch_bounds__(256) hc_e8_gemv_b##B##_m##M(E8Args a) { hc_e8_rows<B, (M) == 1 ? 1 : 4, R>(a); }
#define HC_E8_M(B) HC_E8(B, 1, 4) HC_E8(B, 2, 4) HC_E8(B, 4, 8)
HC_E8_M(2)
HC_E8_M(3)
HC_E8_M(4)
HC_E8_M(5)
HC_E8_M(6)
HC_E8_M(7)
HC_E8_M(8)

// The scaled lattice points in the rotated domain (rows × 8·words, `odtype`): y = x'·outᵀ.
// 8 values (one word, one 16- or 32-byte store) per piece,
// HC_DEC_U pieces per thread as the affine decoders: a word of 2, 4 or 8 bytes in one load,
// others byte by byte; the row by a 32-bit division where the index fits.
template <int U>
__device__ __forceinline__ void hc_e8_decode_pieces(const E8Args& a, void* __restrict__ out, int odtype) {
    const long long n = (long long)a.rows * a.words;
    const bool narrow = n < (1ll << 32);
    const int B = a.bits;
    const unsigned long long mask = (1ull << B) - 1;
    const int h = 1 << (B - 1);
    const bool aligned = hc_aligned16(out);
    const long long span = (long long)U * blockDim.x;
    for (long long base = blockIdx.x * span + threadIdx.x; base < n; base += gridDim.x * span) {
        unsigned long long vs[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long long k = base + (long long)u * blockDim.x;
            unsigned long long v = 0;
            if (k < n) {
                if (B == 2) {
                    v = reinterpret_cast<const uint16_t*>(a.packed)[k];
                } else if (B == 4) {
                    v = reinterpret_cast<const uint32_t*>(a.packed)[k];
                } else if (B == 8) {
                    v = reinterpret_cast<const unsigned long long*>(a.packed)[k];
                } else {
                    for (int i = 0; i < B; i++) v |= (unsigned long long)a.packed[k * B + i] << (8 * i);
                }
            }
            vs[u] = v;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long long k = base + (long long)u * blockDim.x;
            if (k >= n) break;
            const int r = narrow ? (int)((uint32_t)k / (uint32_t)a.words) : (int)(k / a.words);
            const unsigned long long v = vs[u];
            const int s0 = (int)(v & mask);
            const float half = (s0 & 1) ? 0.5f : 0.f;
            const float sc = a.row_scales[r];
            int p = 0;
            float v8[8];
#pragma unroll
            for (int i = 1; i < 8; i++) {
                const int s = (int)((v >> (i * B)) & mask) - h;
                p += s;
                v8[i - 1] = sc * ((float)s + half);
            }
            v8[7] = sc * ((float)((s0 & ~1) - h + (p & 1)) + half);
            hc_store8(out, odtype, 8 * k, v8, 8, aligned);
        }
    }
}
extern "C" __global__ void hc_e8_decode(E8Args a, void* __restrict__ out, int odtype) {
    hc_e8_decode_pieces<HC_DEC_U>(a, out, odtype);
}

// ---------------------------------------------------------------------------------------
// Bitshift trellis (`hypercodec_trellis`): row r's bits start at byte r·row_bytes; the row is
// cut into tail-biting sequences of `seq` values (a multiple of 8; the last one takes the
// rest); value t of a sequence of n values is c1·sum(state) + c0 with state the L bits of the
// sequence's circular n·K-bit stream that end with value t's K bits (read little-endian), and
// sum the byte sum of 34038481·state + 76625530 (mod 2^32) — QTIP's 1MAD code. With pairs
// (v = 2) a state codes two values, 2K bits a step: values 2i and 2i+1 of a sequence share the
// state that ends with value 2i+1's bits, the first taking the byte sum of x = 34038481·state +
// 76625530, the second that of 0x9E3779B9·x + 0x7F4A7C15. Dotted against RHT(x) (f32, cols per
// row) and multiplied by the row's scale.

struct TrellisArgs {
    const uint8_t* bits;
    const float* row_scales;
    const float* xr;
    void* y;
    const float* bias;
    long long n_bytes;
    long long row_bytes;
    int ydtype;
    int M, rows, cols, l, k, seq;
    float c1, c0;
    int v;  // values per state: 1 (1MAD) or 2 (pairs)
    const uint16_t* xr16;  // RHT(x) in f16 (the tensor-core kernel; null: converted from xr)
};

// `n` (≤ 16) bits of a byte stream from bit `bit`, little-endian; bytes past `n_bytes` read 0.
__device__ __forceinline__ uint32_t hc_bits(const uint8_t* p, long long bit, int n, long long n_bytes) {
    const long long b = bit >> 3;
    uint32_t v = p[b];
    if (b + 1 < n_bytes) v |= (uint32_t)p[b + 1] << 8;
    if (b + 2 < n_bytes) v |= (uint32_t)p[b + 2] << 16;
    return (v >> (bit & 7)) & ((1u << n) - 1);
}

// The code's byte sum for value j of row r (bits of the row from `row`, the row's byte offset
// `row_off` bounds the reads).
__device__ __forceinline__ uint32_t hc_trellis_sum(const TrellisArgs& a, long long row_off, int j) {
    const int m = max(1, a.cols / a.seq);
    const int q = min(j / a.seq, m - 1);
    const int s = q * a.seq;
    const int n = (q == m - 1 ? a.cols : s + a.seq) - s;
    const int t = j - s;
    const long long base = (row_off + (long long)s * a.k / 8) * 8;  // the sequence's first bit
    // A pair's state ends with its second value's bits.
    const int end = ((a.v == 2 ? t | 1 : t) + 1) * a.k;
    uint32_t state;
    if (end >= a.l) {
        state = hc_bits(a.bits, base + end - a.l, a.l, a.n_bytes);
    } else {
        // The window wraps: the stream's last L − end bits, then its first `end` bits.
        const int tail = a.l - end;
        const uint32_t lo = hc_bits(a.bits, base + (long long)n * a.k - tail, tail, a.n_bytes);
        const uint32_t hi = hc_bits(a.bits, base, end, a.n_bytes);
        state = lo | (hi << tail);
    }
    uint32_t x = hc_code_hash(state);
    if (a.v == 2 && (t & 1)) x = hc_pair_second(x);
    return __dp4a(x, 0x01010101u, 0u);
}

// Where chunk c (values 8c .. 8c+8 of a row) lies, the same for every row: its value count,
// and, when the fast path applies (K ≤ 6, a whole chunk inside one sequence, its history
// bits inside the sequence or the sequence's tail-biting wrap), the bit offsets from the
// row's first bit of its codes and of the L−K history bits before them.
struct HcChunk {
    int j0, cnt;
    bool fast;
    long long cb, hb;
};

__device__ __forceinline__ HcChunk hc_trellis_geom(const TrellisArgs& a, int c) {
    HcChunk g;
    g.j0 = c * 8;
    const int m = max(1, a.cols / a.seq);
    const int q = min(g.j0 / a.seq, m - 1);
    const int s = q * a.seq;
    const int n = (q == m - 1 ? a.cols : s + a.seq) - s;
    const int t0 = g.j0 - s;
    const int hist = a.l - a.k;
    g.cnt = min(8, a.cols - g.j0);
    g.fast = a.k <= 6 && g.cnt == 8 && t0 + 8 <= n && (t0 == 0 || t0 * a.k >= hist);
    const long long base = (long long)s * a.k;  // the sequence's first bit (a byte boundary)
    g.cb = base + (long long)t0 * a.k;
    g.hb = t0 == 0 ? base + (long long)n * a.k - hist : g.cb - hist;
    return g;
}

// The byte sums of chunk `g`'s values in the row whose bits start at byte `row_off`: from one
// composite word (the history bits, then the chunk's 8·K bits) on the fast path, value by
// value otherwise. K is a template argument where it is known (0: read from `a`).
template <int KT>
__device__ __forceinline__ void hc_trellis_sums(const TrellisArgs& a, const HcChunk& g, long long row_off, uint32_t* sums) {
    const int k = KT ? KT : a.k;
    if (g.fast) {
        const int hist = a.l - k;
        const long long rb = row_off * 8;
        const uint8_t* p = a.bits + ((rb + g.cb) >> 3);
        unsigned long long chunk = 0;
#pragma unroll
        for (int i = 0; i < (KT ? KT : 6); i++)
            if (KT || i < k) chunk |= (unsigned long long)p[i] << (8 * i);
        const unsigned long long w = (unsigned long long)hc_bits(a.bits, rb + g.hb, hist, a.n_bytes) | (chunk << hist);
        const uint32_t lmask = (1u << a.l) - 1;
        if (a.v == 2) {
            // The chunk starts a pair (sequences are whole chunks of 8, or end the row).
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                const uint32_t x = hc_code_hash((uint32_t)(w >> ((i + 1) * k)) & lmask);
                sums[i] = __dp4a(x, 0x01010101u, 0u);
                sums[i + 1] = __dp4a(hc_pair_second(x), 0x01010101u, 0u);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t state = (uint32_t)(w >> (i * k)) & lmask;
            sums[i] = __dp4a(hc_code_hash(state), 0x01010101u, 0u);
        }
        return;
    }
    for (int i = 0; i < g.cnt; i++) sums[i] = hc_trellis_sum(a, row_off, g.j0 + i);
}

// The trellis GEMVs' end: row value = scale·(c1·Σ sum·x' + c0·Σ x'), summed over the block.
template <int R, int MT>
__device__ __forceinline__ void hc_trellis_store(const TrellisArgs& a, float (&acc)[R][MT], const float* sx, int r0) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MT; m++) acc[r][m] = a.c1 * acc[r][m] + a.c0 * sx[m];
    float sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) sc[r] = r0 + r < a.rows ? a.row_scales[r0 + r] : 0.f;
    hc_block_store<R, MT>(acc, sc, r0, a.rows, a.M, a.bias, a.y, a.ydtype);
}

template <int MT, int KT>
__device__ __forceinline__ void hc_trellis_rows(const TrellisArgs& a) {
    constexpr int R = HC_R(MT);
    const int r0 = blockIdx.x * R;
    // Per (row, activation): Σ sum·x'; per activation: Σ x' (the offset c0 multiplies it).
    float acc[R][MT], sx[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        sx[m] = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][m] = 0.f;
    }
    const int chunks = (a.cols + 7) >> 3;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        const HcChunk g = hc_trellis_geom(a, c);
        uint32_t sums[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < a.rows) {
                hc_trellis_sums<KT>(a, g, (long long)(r0 + r) * a.row_bytes, sums[r]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) sums[r][i] = 510;
            }
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
            if (MT == 1 || m < a.M) {
                const float* xp = a.xr + (long long)m * a.cols + 8 * c;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (i < g.cnt) {
                        const float xv = xp[i];
#pragma unroll
                        for (int r = 0; r < R; r++) acc[r][m] = fmaf(hc_u2f(sums[r][i]), xv, acc[r][m]);
                        sx[m] += xv;
                    }
                }
            }
        }
    }
    hc_trellis_store<R, MT>(a, acc, sx, r0);
}

// hc_trellis_gemv_m{1,4}_k{0,1,2,3,4}: one kernel per (batch tile, K); k0 reads K at run time.
#define HC_TRELLIS(M, K) \
    extern "C" __global__ void __launch_bounds__(256) hc_trellis_gemv_m##M##_k##K(TrellisArgs a) { hc_trellis_rows<M, K>(a); }
#define HC_TRELLIS_K(M) HC_TRELLIS(M, 0) HC_TRELLIS(M, 1) HC_TRELLIS(M, 2) HC_TRELLIS(M, 3) HC_TRELLIS(M, 4)
HC_TRELLIS_K(1)
HC_TRELLIS_K(4)

// The group path of the trellis GEMV and decoder, for rows of whole groups of 32 values
// (cols a multiple of 32, K ≤ 4, rows starting on 4K-byte boundaries) cut into sequences of
// whole groups (seq a multiple of 32) or of 16 values (seq = 16: calibrated rows). A group's
// bits are K 32-bit words; each half of 16 values decodes from its own small word array — the
// 32 bits of the stream before the half (its history: the L − K ≤ 15 bits its first values
// need, at the top of the word), then the half's 16·K bits — so every value's bit position is
// a compile-time constant: its state is the top L bits of the 32-bit window that ends with its
// bits. The history of a sequence's first half is the sequence's own end (tail-biting). The
// code comes out of __dp4a as the f32 2^23 + sum (an addend of 0x4B000000), so a value costs a
// funnel shift, a shift, the multiply-add, the byte sum and one FADD (− 2^23, exact) — no
// conversion and no mask — then an FFMA per activation row.

// The 32-bit window of a half that ends at bit E (its top L bits: the state whose value ends
// there); `c`: the history word, then the half's words.
template <int E>
__device__ __forceinline__ uint32_t hc_tg_win(const uint32_t (&c)[3]) {
    constexpr int j = E / 32, s = E % 32;
    if constexpr (s == 0) {
        return c[j];
    } else {
        return __funnelshift_r(c[j], c[j + 1], s);
    }
}

// Value I (0..15) of a half, one value per state, as ADD + its byte sum (`__dp4a`'s addend:
// 0x4B000000 gives the f32 2^23 + sum, 0x6400 the f16 1024 + sum); `sh` = 32 − L.
template <int K, int I, uint32_t ADD>
__device__ __forceinline__ uint32_t hc_tg_sum(const uint32_t (&c)[3], int sh) {
    return __dp4a(hc_code_hash(hc_tg_win<(I + 1) * K>(c) >> sh), 0x01010101u, ADD);
}

// Pair P (0..7) of a half (values 2P and 2P+1) as ADD + their byte sums: the state is the top L
// bits of the 32-bit window that ends with the pair's 2K bits.
template <int K, int P, uint32_t ADD>
__device__ __forceinline__ void hc_tg_sums2(const uint32_t (&c)[3], int sh, uint32_t& v0, uint32_t& v1) {
    const uint32_t x = hc_code_hash(hc_tg_win<(P + 1) * 2 * K>(c) >> sh);
    v0 = __dp4a(x, 0x01010101u, ADD);
    v1 = __dp4a(hc_pair_second(x), 0x01010101u, ADD);
}

// Value I as the f32 2^23 + its byte sum.
template <int K, int I>
__device__ __forceinline__ float hc_tg_code(const uint32_t (&c)[3], int sh) {
    return __int_as_float(hc_tg_sum<K, I, 0x4B000000u>(c, sh));
}

// Pair P as the f32 2^23 + their byte sums.
template <int K, int P>
__device__ __forceinline__ void hc_tg_pair(const uint32_t (&c)[3], int sh, float& f0, float& f1) {
    uint32_t v0, v1;
    hc_tg_sums2<K, P, 0x4B000000u>(c, sh, v0, v1);
    f0 = __int_as_float(v0);
    f1 = __int_as_float(v1);
}

// Values 4Q .. 4Q+3 of a half as their byte sums (f32, exact: 2^23 + sum − 2^23), under one
// value per state (V = 1) or pairs (V = 2).
template <int K, int V, int Q>
__device__ __forceinline__ void hc_tg_four(const uint32_t (&c)[3], int sh, float (&f)[4]) {
    if constexpr (V == 2) {
        hc_tg_pair<K, 2 * Q>(c, sh, f[0], f[1]);
        hc_tg_pair<K, 2 * Q + 1>(c, sh, f[2], f[3]);
    } else {
        f[0] = hc_tg_code<K, 4 * Q + 0>(c, sh);
        f[1] = hc_tg_code<K, 4 * Q + 1>(c, sh);
        f[2] = hc_tg_code<K, 4 * Q + 2>(c, sh);
        f[3] = hc_tg_code<K, 4 * Q + 3>(c, sh);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] -= 8388608.f;
}

// The two halves' word arrays of a group of words `w` whose preceding stream word is `h`
// (unused when `seq16`: each half is then its own sequence).
template <int K>
__device__ __forceinline__ void hc_tg_halves(const uint32_t (&w)[4], uint32_t h, bool seq16, uint32_t (&a)[3],
                                             uint32_t (&b)[3]) {
    // The 32 bits that end where the first half ends (bit 16·K of the group).
    const uint32_t a_end = K % 2 == 0 ? w[K / 2 - 1] : w[K / 2] << 16;
    a[0] = seq16 ? a_end : h;
    b[0] = seq16 ? w[K - 1] : a_end;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        a[j + 1] = w[j];
        // The second half's words start at bit 16·K.
        if constexpr (K % 2 == 0) {
            b[j + 1] = K / 2 + j < K ? w[K / 2 + j] : 0u;
        } else {
            const uint32_t lo = K / 2 + j < K ? w[K / 2 + j] : 0u, hi = K / 2 + j + 1 < K ? w[K / 2 + j + 1] : 0u;
            b[j + 1] = __funnelshift_r(lo, hi, 16);
        }
    }
}

// Group g's words (and the stream word before it) of the row whose words start at `p`.
template <int K>
__device__ __forceinline__ void hc_tg_load(const TrellisArgs& a, const uint32_t* p, int g, uint32_t (&w)[4],
                                           uint32_t& h) {
    const uint32_t* q = p + (long long)g * K;
    if constexpr (K == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(q);
        w[0] = v.x; w[1] = v.y; w[2] = w[3] = 0u;
    } else if constexpr (K == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(q);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = i < K ? q[i] : 0u;
    }
    h = 0u;
    if (a.seq != 16) {
        // The word before the group, or for a sequence's first group the sequence's last word.
        const int groups = a.cols >> 5, gs = a.seq >> 5, nseq = max(1, a.cols / a.seq);
        const int s = min(g / gs, nseq - 1), first = s * gs;
        const int last = s == nseq - 1 ? groups - 1 : first + gs - 1;
        h = p[g == first ? (long long)last * K + K - 1 : (long long)g * K - 1];
    }
}

template <int K, int V, int R, int MT, int U>
__device__ __forceinline__ void hc_tg_quad(const uint32_t (&c)[R][2][3], int sh, const float* xg, int cols, int M,
                                           float (&acc)[R][MT], float* sx) {
    // The byte sums, each decoded once for every batch row.
    float f[R][4];
#pragma unroll
    for (int r = 0; r < R; r++) hc_tg_four<K, V, U % 4>(c[r][U / 4], sh, f[r]);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        // Batch rows past M read the last one (no branch, so the loads can be issued early);
        // their sums are never stored.
        const int mm = MT == 1 ? 0 : min(m, M - 1);
        const float4 x4 = *reinterpret_cast<const float4*>(xg + (long long)mm * cols + 4 * U);
        const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sx[m] += xv[i];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][m] = fmaf(f[r][i], xv[i], acc[r][m]);
        }
    }
}

template <int MT, int K, int V, int R>
__device__ __forceinline__ void hc_trellis_groups(const TrellisArgs& a) {
    const int r0 = blockIdx.x * R;
    const int groups = a.cols >> 5;
    const int sh = 32 - a.l;
    const bool seq16 = a.seq == 16;
    const long long rw = a.row_bytes >> 2;  // words per row
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(a.bits);
    float acc[R][MT], sx[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        sx[m] = 0.f;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][m] = 0.f;
    }
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        uint32_t c[R][2][3];
#pragma unroll
        for (int r = 0; r < R; r++) {
            // Rows past the weight read the last row; their sums are never stored.
            uint32_t w[4], h;
            hc_tg_load<K>(a, bits + (long long)min(r0 + r, a.rows - 1) * rw, g, w, h);
            hc_tg_halves<K>(w, h, seq16, c[r][0], c[r][1]);
        }
        const float* xg = a.xr + 32ll * g;
        hc_tg_quad<K, V, R, MT, 0>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 1>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 2>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 3>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 4>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 5>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 6>(c, sh, xg, a.cols, a.M, acc, sx);
        hc_tg_quad<K, V, R, MT, 7>(c, sh, xg, a.cols, a.M, acc, sx);
    }
    hc_trellis_store<R, MT>(a, acc, sx, r0);
}

// hc_trellis_groups_m{1,2,4}_k{1,2,3,4}: the group path, HC_TG_R(M) rows per block. Each
// activation value a thread loads serves the block's rows, so more rows per block mean fewer
// loads per weight; on the H200, batch 2 and 4 ran 1.6-1.7x faster with 8 rows than with 4
// (4 B of activations per weight from L1 was the limit), batch 1 4-8 % slower.
#define HC_TG_R(M) ((M) == 1 ? 4 : 8)
#define HC_TG(M, K) \
    extern "C" __global__ void __launch_bounds__(256) hc_trellis_groups_m##M##_k##K(TrellisArgs a) { \
        hc_trellis_groups<M, K, 1, HC_TG_R(M)>(a); \
    }
HC_TG(1, 1) HC_TG(1, 2) HC_TG(1, 3) HC_TG(1, 4)
HC_TG(2, 1) HC_TG(2, 2) HC_TG(2, 3) HC_TG(2, 4)
HC_TG(4, 1) HC_TG(4, 2) HC_TG(4, 3) HC_TG(4, 4)
// hc_trellis_groups_m{1,2,4}_k{1,2,3,4}_v2: the same under the pair code.
#define HC_TG2(M, K) \
    extern "C" __global__ void __launch_bounds__(256) hc_trellis_groups_m##M##_k##K##_v2(TrellisArgs a) { \
        hc_trellis_groups<M, K, 2, HC_TG_R(M)>(a); \
    }
HC_TG2(1, 1) HC_TG2(1, 2) HC_TG2(1, 3) HC_TG2(1, 4)
HC_TG2(2, 1) HC_TG2(2, 2) HC_TG2(2, 3) HC_TG2(2, 4)
HC_TG2(4, 1) HC_TG2(4, 2) HC_TG2(4, 3) HC_TG2(4, 4)

// The group path's decoder: the scaled values in the rotated domain, a thread per group.
template <int K, int V, int U>
__device__ __forceinline__ void hc_tg_decode_quad(const uint32_t (&c)[2][3], int sh, float c1, float c0, float* v) {
    float f[4];
    hc_tg_four<K, V, U % 4>(c[U / 4], sh, f);
#pragma unroll
    for (int i = 0; i < 4; i++) v[4 * U + i] = fmaf(c1, f[i], c0);
}

// A thread decodes a group; its warp's 32 groups (consecutive in the output, since groups tile
// the rows) pass through shared memory so that each store instruction writes 256 consecutive
// values. Rows of 36 floats keep both sides free of bank conflicts.
template <int K, int V>
__device__ __forceinline__ void hc_trellis_decode_groups(const TrellisArgs& a, void* __restrict__ out, int odtype) {
    __shared__ __align__(16) float stage[8][32 * 36];
    float* st = stage[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
    const int groups = a.cols >> 5;
    const long long n = (long long)a.rows * groups;
    const long long rw = a.row_bytes >> 2;
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(a.bits);
    const bool aligned = hc_aligned16(out);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i0 = (long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31); i0 < n; i0 += stride) {
        const long long i = i0 + lane;
        if (i < n) {
            const int r = (int)(i / groups), g = (int)(i - (long long)r * groups);
            uint32_t w[4], h, c[2][3];
            hc_tg_load<K>(a, bits + r * rw, g, w, h);
            hc_tg_halves<K>(w, h, a.seq == 16, c[0], c[1]);
            float v[32];
            hc_tg_decode_quad<K, V, 0>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 1>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 2>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 3>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 4>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 5>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 6>(c, 32 - a.l, a.c1, a.c0, v);
            hc_tg_decode_quad<K, V, 7>(c, 32 - a.l, a.c1, a.c0, v);
            const float sc = a.row_scales[r];
#pragma unroll
            for (int j = 0; j < 8; j++)
                *reinterpret_cast<float4*>(st + lane * 36 + 4 * j) =
                    make_float4(sc * v[4 * j], sc * v[4 * j + 1], sc * v[4 * j + 2], sc * v[4 * j + 3]);
        }
        __syncwarp();
        // Values 32·i0 + 256·j + 8·lane ..: group 8j + lane/4 of the warp, from value 8·(lane % 4).
        const long long vals = 32 * (n - i0);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int v0 = 256 * j + 8 * lane;
            if (v0 < vals) {
                const float* p = st + (8 * j + lane / 4) * 36 + 8 * (lane % 4);
                const float4 lo = *reinterpret_cast<const float4*>(p), hi = *reinterpret_cast<const float4*>(p + 4);
                const float v8[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                hc_store8(out, odtype, 32 * i0 + v0, v8, 8, aligned);
            }
        }
        __syncwarp();
    }
}

// hc_trellis_decode_groups_k{1,2,3,4}.
#define HC_TGD(K) \
    extern "C" __global__ void __launch_bounds__(256) hc_trellis_decode_groups_k##K(TrellisArgs a, void* __restrict__ out, int odtype) { \
        hc_trellis_decode_groups<K, 1>(a, out, odtype); \
    }
HC_TGD(1) HC_TGD(2) HC_TGD(3) HC_TGD(4)
// hc_trellis_decode_groups_k{1,2,3,4}_v2.
#define HC_TGD2(K) \
    extern "C" __global__ void __launch_bounds__(256) hc_trellis_decode_groups_k##K##_v2(TrellisArgs a, void* __restrict__ out, int odtype) { \
        hc_trellis_decode_groups<K, 2>(a, out, odtype); \
    }
HC_TGD2(1) HC_TGD2(2) HC_TGD2(3) HC_TGD2(4)

// The group path through the tensor cores (bf16/f16 outputs, batches up to 8·NT): a block of
// HC_TM_WARPS warps computes 16 weight rows, its warps taking turns at steps of 128 columns
// (four groups of 32). In a step, lane (g, t) = (lane / 4, lane % 4) decodes group 4·step + t
// of rows g and g + 8 — the group path's words, history and halves, so every value's bit
// position is a compile-time constant — and feeds it to 8 mmas m16n8k16, one per 4 values:
// values 4u, 4u+1 take the lane's k slots 2t, 2t+1 and values 4u+2, 4u+3 slots 2t+8, 2t+9;
// the activations (batch row 8n + g in f16: the RHT's f16 copy `xr16`, else converted from
// `xr`) take the same slots, so the dot product is unchanged. A code comes out of __dp4a as the f16 bits of 1024 + sum (an addend
// of 0x6400: exact, sums are at most 1020) and two of them pair in one PRMT: no conversion, no
// FADD and no FFMA per weight. A second mma against ones gives Σx, and
//   y = s_r·(c1·Σ(1024 + sum)·x + (c0 − 1024·c1)·Σx).
// Activations above f16's range give a non-finite sum; those outputs are recomputed in f32
// value by value (slow, but exact). Rotated activations below 2^-14 in magnitude keep f16's
// subnormal precision (2^-24 absolute).
#define HC_TM_WARPS 8
// Row tiles of 16 a warp computes (the activation fragments serve them all): on the H200 two
// ran 1.15-1.8x faster than one; 4 or 16 warps a block, or loading the next step's words
// ahead, were faster on some shapes and slower on others (py/benches/cuda_trellis.py
// --variant, 2026-12-03).
#define HC_TM_R 2

// Values 4Q .. 4Q+3 of a half as two words of two f16 (1024 + sum): (4Q, 4Q+1), (4Q+2, 4Q+3).
template <int K, int V, int Q>
__device__ __forceinline__ void hc_tm_four(const uint32_t (&c)[3], int sh, uint32_t (&p)[2]) {
    uint32_t v[4];
    if constexpr (V == 2) {
        hc_tg_sums2<K, 2 * Q, 0x6400u>(c, sh, v[0], v[1]);
        hc_tg_sums2<K, 2 * Q + 1, 0x6400u>(c, sh, v[2], v[3]);
    } else {
        v[0] = hc_tg_sum<K, 4 * Q + 0, 0x6400u>(c, sh);
        v[1] = hc_tg_sum<K, 4 * Q + 1, 0x6400u>(c, sh);
        v[2] = hc_tg_sum<K, 4 * Q + 2, 0x6400u>(c, sh);
        v[3] = hc_tg_sum<K, 4 * Q + 3, 0x6400u>(c, sh);
    }
    p[0] = __byte_perm(v[0], v[1], 0x5410);
    p[1] = __byte_perm(v[2], v[3], 0x5410);
}

// Two f32 as one word of two f16 (round to nearest): lo in the low half.
__device__ __forceinline__ uint32_t hc_f16x2(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// The word before group g of a row (its history), as an index from the row's first word: the
// sequence's last word for its first group (tail-biting). Unused with sequences of 16.
template <int K>
__device__ __forceinline__ long long hc_tg_hist(const TrellisArgs& a, int g) {
    if (a.seq == 16) return 0;
    const int groups = a.cols >> 5, gs = a.seq >> 5, nseq = max(1, a.cols / a.seq);
    const int s = min(g / gs, nseq - 1), first = s * gs;
    const int last = s == nseq - 1 ? groups - 1 : first + gs - 1;
    return g == first ? (long long)last * K + K - 1 : (long long)g * K - 1;
}

// k-step U (0..7) of a lane's group: values 4U .. 4U+3 of rows g and g + 8 of each row tile
// (`c[tile][row][half]`) against the group's activations `xg[n]` of its batch row in each
// batch tile, zeros where `live` is false.
// X16: the activations are read as f16 (`xg` then points at f16 values).
template <int K, int V, int NT, int R, bool X16, int U>
__device__ __forceinline__ void hc_tm_step(const uint32_t (&c)[R][2][2][3], int sh, const void* const (&xg)[NT],
                                           bool live, float (&acc)[R][NT][4], float (&sx)[NT][4]) {
    constexpr uint32_t ONES = 0x3C003C00u;
    uint32_t b0[NT], b1[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (X16) {
            const uint2 v = reinterpret_cast<const uint2*>(xg[n])[U];
            b0[n] = live ? v.x : 0u;
            b1[n] = live ? v.y : 0u;
        } else {
            const float4 x4 = reinterpret_cast<const float4*>(xg[n])[U];
            b0[n] = live ? hc_f16x2(x4.x, x4.y) : 0u;
            b1[n] = live ? hc_f16x2(x4.z, x4.w) : 0u;
        }
        hc_mma16816<false>(sx[n], ONES, ONES, ONES, ONES, b0[n], b1[n]);
    }
#pragma unroll
    for (int ti = 0; ti < R; ti++) {
        uint32_t p0[2], p1[2];
        hc_tm_four<K, V, U % 4>(c[ti][0][U / 4], sh, p0);
        hc_tm_four<K, V, U % 4>(c[ti][1][U / 4], sh, p1);
#pragma unroll
        for (int n = 0; n < NT; n++) hc_mma16816<false>(acc[ti][n], p0[0], p1[0], p0[1], p1[1], b0[n], b1[n]);
    }
}

// A step's words: group gi (clamped to the row) of the lane's rows and the word before each.
template <int K, int R>
struct HcTmWords {
    uint32_t w[R][2][K], hist[R][2];
    int gi;
    bool live;
};

// Loads step group gi of the lane's rows (`rp`). Groups past the row (the last step of rows
// of 32·(4q + r) values) read its last group and count as zeros.
template <int K, int R>
__device__ __forceinline__ void hc_tm_load(const TrellisArgs& a, const uint32_t* const (&rp)[R][2], int gi,
                                           HcTmWords<K, R>& s) {
    const int groups = a.cols >> 5;
    s.live = gi < groups;
    s.gi = gi = min(gi, groups - 1);
    const long long hi = hc_tg_hist<K>(a, gi);
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t* q = rp[ti][h] + (long long)gi * K;
            if constexpr (K == 2) {
                const uint2 v = *reinterpret_cast<const uint2*>(q);
                s.w[ti][h][0] = v.x; s.w[ti][h][1] = v.y;
            } else if constexpr (K == 4) {
                const uint4 v = *reinterpret_cast<const uint4*>(q);
                s.w[ti][h][0] = v.x; s.w[ti][h][1] = v.y; s.w[ti][h][2] = v.z; s.w[ti][h][3] = v.w;
            } else {
#pragma unroll
                for (int i = 0; i < K; i++) s.w[ti][h][i] = q[i];
            }
            s.hist[ti][h] = a.seq == 16 ? 0u : rp[ti][h][hi];
        }
}

// One step of 128 columns: the loaded group against its 32 activations of the lane's batch
// row in each tile (`xm[n]`, the batch row's first value, f32 or with X16 f16).
template <int K, int V, int NT, int R, bool X16>
__device__ __forceinline__ void hc_tm_group(const TrellisArgs& a, const HcTmWords<K, R>& s,
                                            const void* const (&xm)[NT], int sh, float (&acc)[R][NT][4],
                                            float (&sx)[NT][4]) {
    const int gi = s.gi;
    const bool live = s.live;
    uint32_t c[R][2][2][3];
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) w[i] = i < K ? s.w[ti][h][i < K ? i : 0] : 0u;
            hc_tg_halves<K>(w, s.hist[ti][h], a.seq == 16, c[ti][h][0], c[ti][h][1]);
        }
    const void* xg[NT];
#pragma unroll
    for (int n = 0; n < NT; n++)
        xg[n] = X16 ? (const void*)(static_cast<const uint16_t*>(xm[n]) + 32ll * gi)
                    : (const void*)(static_cast<const float*>(xm[n]) + 32ll * gi);
    hc_tm_step<K, V, NT, R, X16, 0>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 1>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 2>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 3>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 4>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 5>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 6>(c, sh, xg, live, acc, sx);
    hc_tm_step<K, V, NT, R, X16, 7>(c, sh, xg, live, acc, sx);
}

template <int K, int V, int NT, int R>
__device__ __forceinline__ void hc_trellis_mma(const TrellisArgs& a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16 * R;
    const int steps = ((a.cols >> 5) + 3) >> 2;
    const int sh = 32 - a.l;
    const long long rw = a.row_bytes >> 2;
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(a.bits);
    // Rows past the weight read its last row, batch rows past M the last batch row: their
    // sums are never stored.
    const uint32_t* rp[R][2];
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int h = 0; h < 2; h++) rp[ti][h] = bits + (long long)min(r0 + 16 * ti + g + 8 * h, a.rows - 1) * rw;
    const void* xm[NT];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const long long off = (long long)min(g + 8 * n, a.M - 1) * a.cols;
        xm[n] = a.xr16 ? (const void*)(a.xr16 + off) : (const void*)(a.xr + off);
    }
    float acc[R][NT][4], sx[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sx[n][i] = 0.f;
#pragma unroll
            for (int ti = 0; ti < R; ti++) acc[ti][n][i] = 0.f;
        }
    for (int st = warp; st < steps; st += HC_TM_WARPS) {
        HcTmWords<K, R> cur;
        hc_tm_load<K, R>(a, rp, 4 * st + t, cur);
        if (a.xr16) {
            hc_tm_group<K, V, NT, R, true>(a, cur, xm, sh, acc, sx);
        } else {
            hc_tm_group<K, V, NT, R, false>(a, cur, xm, sh, acc, sx);
        }
    }
    // The warps' partial sums, c1·acc + (c0 − 1024·c1)·Σx: part[warp][row][batch row].
    __shared__ float part[HC_TM_WARPS][16 * R][8 * NT];
    const float off = a.c0 - 1024.f * a.c1;
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                part[warp][16 * ti + g + 8 * (i >> 1)][8 * n + 2 * t + (i & 1)] = fmaf(a.c1, acc[ti][n][i], off * sx[n][i]);
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * R * 8 * NT; e += blockDim.x) {
        const int r = e / (8 * NT), m = e % (8 * NT), row = r0 + r;
        if (row < a.rows && m < a.M) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < HC_TM_WARPS; w++) v += part[w][r][m];
            if (!isfinite(v)) {
                // f16 overflowed (or x holds a NaN or an infinity): the exact sum in f32.
                const float* xr = a.xr + (long long)m * a.cols;
                v = 0.f;
                for (int j = 0; j < a.cols; j++)
                    v = fmaf(fmaf(a.c1, (float)hc_trellis_sum(a, (long long)row * a.row_bytes, j), a.c0), xr[j], v);
            }
            hc_store(a.y, a.ydtype, (long long)m * a.rows + row, a.row_scales[row] * v + (a.bias ? a.bias[row] : 0.f));
        }
    }
}

// hc_trellis_mma_k{1,2,3,4}_v{1,2}_n{1,2}.
#define HC_TM(K, V, N) \
    extern "C" __global__ void __launch_bounds__(32 * HC_TM_WARPS) hc_trellis_mma_k##K##_v##V##_n##N(TrellisArgs a) { \
        hc_trellis_mma<K, V, N, HC_TM_R>(a); \
    }
#define HC_TM_K(V, N) HC_TM(1, V, N) HC_TM(2, V, N) HC_TM(3, V, N) HC_TM(4, V, N)
HC_TM_K(1, 1) HC_TM_K(1, 2) HC_TM_K(2, 1) HC_TM_K(2, 2)


// The scaled values in the rotated domain (rows × cols, `odtype`), one thread per chunk of 8.
extern "C" __global__ void hc_trellis_decode(TrellisArgs a, void* __restrict__ out, int odtype) {
    const int chunks = (a.cols + 7) >> 3;
    const long long n = (long long)a.rows * chunks;
    const bool narrow = n < (1ll << 32);  // a 32-bit division where the index fits
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const int r = narrow ? (int)((uint32_t)k / (uint32_t)chunks) : (int)(k / chunks);
        const int c = (int)(k - (long long)r * chunks);
        uint32_t sums[8];
        const HcChunk g = hc_trellis_geom(a, c);
        hc_trellis_sums<0>(a, g, (long long)r * a.row_bytes, sums);
        const int cnt = g.cnt;
        const float sc = a.row_scales[r];
        float v8[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v8[i] = sc * fmaf(a.c1, hc_u2f(sums[i]), a.c0);
        hc_store8(out, odtype, (long long)r * a.cols + 8 * c, v8, cnt, (a.cols & 7) == 0 && hc_aligned16(out));
    }
}

// ---------------------------------------------------------------------------------------
// KV-cache vectors (`hypercodec_lattice::kv`, E8 without dither): per vector of d values
// (8 ≤ d ≤ 256, whole words), y = RHT(x) in tiles of `tile` (0: no rotation), u = y·α/RMS(y),
// the box-constrained E8 point of each word at `bits` bits per symbol, and one bf16 scale
// c = ⟨y, p⟩ / ⟨p, p⟩; decoding gives x̂ = RHT⁻¹(c·p). One warp per vector, lane w holding
// word w (8 values): the first 3 butterfly stages in registers, the rest across lanes.

struct KvArgs {
    const void* x;        // encode: vectors, `dtype`, vector v at x + v·d
    void* out;            // decode: vector (row, t) at out + row·out_row + t·d, `dtype`
    uint8_t* codes;       // vector (row, t) at codes + row·codes_row + t·code_bytes
    uint16_t* scales;     // bf16 bits, vector (row, t) at scales + row·scales_row + t
    long long out_row, codes_row, scales_row;
    int dtype, rows, toks, d, bits, code_bytes, tile;
    float alpha;
    unsigned long long seed;
};

// y ← H·y/√tile per tile over the warp's words (8 values per lane, tiles up to 256), in place.
__device__ __forceinline__ void hc_kv_fwht(float* v, int tile, int lane) {
    hc_fwht8_warp(v, tile, lane);
    const float norm = rsqrtf((float)tile);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] *= norm;
}

// y ← the inverse RHT of the warp's words (`hc_kv_fwht`, then the signs), finite where y is.
// The butterflies sum up to `tile` values, so a vector whose largest value passes f32's largest
// over the tile is transformed scaled down by 1/tile (a power of two: exact) and scaled back,
// clamped to f32's range (its sums overflowed to inf − inf = NaN), as the host's `unrotate`.
// A NaN stays NaN. Every lane of the warp takes part.
__device__ __forceinline__ void hc_kv_unrotate(float* y, int tile, unsigned long long seed, int lane, bool on) {
    float big = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) big = fmaxf(big, fabsf(y[k]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, o));
    const bool scaled = big > 3.4028234663852886e38f / (float)tile;  // warp-uniform
    if (scaled) {
        const float down = 1.f / (float)tile;
#pragma unroll
        for (int k = 0; k < 8; k++) y[k] *= down;
    }
    hc_kv_fwht(y, tile, lane);
    if (on) hc_signs8(y, seed, 8 * lane);
    if (scaled) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float v = y[k] * (float)tile;
            y[k] = fabsf(v) > 3.4028234663852886e38f ? copysignf(3.4028234663852886e38f, v) : v;
        }
    }
}

// The nearest point of D8 (parity even) or Z8 within [lo, hi]^8 (`nearest_box`), and its
// squared distance.
__device__ __forceinline__ float hc_box8(const float* u, int lo, int hi, int* r) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        r[i] = min(max((int)rintf(u[i]), lo), hi);
        sum += r[i];
    }
    if (sum & 1) {
        float best = 3.0e38f;
        int bi = 0, ba = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float base = (u[i] - r[i]) * (u[i] - r[i]);
#pragma unroll
            for (int s = -1; s <= 1; s += 2) {
                const int alt = r[i] + s;
                if (alt >= lo && alt <= hi) {
                    const float cost = (u[i] - alt) * (u[i] - alt) - base;
                    if (cost < best) {
                        best = cost;
                        bi = i;
                        ba = alt;
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i == bi) r[i] = ba;
    }
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) d += (u[i] - r[i]) * (u[i] - r[i]);
    return d;
}

// This lane's 8 values of a vector at `x + at` (`dtype`; zeros for lanes past d/8), rotated by
// codec `c`'s RHT (every lane of the warp takes part).
__device__ __forceinline__ void hc_kv_rotated(const void* x, int dtype, long long at, const KvArgs& c, int lane,
                                              float* y) {
    const bool on = lane < (c.d >> 3);
    if (on) {
        hc_load8(x, dtype, at, y);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) y[k] = 0.f;
    }
    if (c.tile > 0) {
        if (on) hc_signs8(y, c.seed, 8 * lane);
        hc_kv_fwht(y, c.tile, lane);
    }
}

extern "C" __global__ void hc_kv_e8_encode(KvArgs a) {
    const int lane = threadIdx.x & 31;
    const long long v = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (v >= (long long)a.rows * a.toks) return;  // whole warps leave together
    const int row = (int)(v / a.toks), t = (int)(v - (long long)row * a.toks);
    const int nw = a.d >> 3;
    const bool on = lane < nw;
    float y[8];
    hc_kv_rotated(a.x, a.dtype, v * a.d + 8 * lane, a, lane, y);
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < 8; k++) ss += (double)y[k] * y[k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    uint8_t* code = a.codes + row * a.codes_row + (long long)t * a.code_bytes;
    uint16_t* scale = a.scales + row * a.scales_row + t;
    const double ms = ss / a.d;
    if (ms == 0.0) {
        if (on)
            for (int i = 0; i < a.bits; i++) code[lane * a.bits + i] = 0;
        if (lane == 0) *scale = 0;
        return;
    }
    const float kf = a.alpha / (float)sqrt(ms);
    const int h = 1 << (a.bits - 1);
    float u[8], b8[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u[k] = fminf(fmaxf(y[k] * kf, -2097152.f), 2097152.f);
        b8[k] = u[k] - 0.5f;
    }
    int re[8], ro[8];
    const float de = hc_box8(u, -h, h - 1, re);
    const float dd = hc_box8(b8, -h, h - 1, ro);
    const bool pick = dd < de;
    int s[8];
#pragma unroll
    for (int k = 0; k < 8; k++) s[k] = pick ? ro[k] : re[k];
    const int par = (s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6]) & 1;
    const int tt = (s[7] - par) >> 1;
    // Symbols, then the point they decode to (decode_word_fixed).
    unsigned long long word = (unsigned long long)(2 * (tt + h / 2) + (pick ? 1 : 0));
#pragma unroll
    for (int i = 0; i < 7; i++) word |= (unsigned long long)(s[i] + h) << ((i + 1) * a.bits);
    const float half = pick ? 0.5f : 0.f;
    double dot = 0.0, pp = 0.0;
    if (on) {
        int p7 = 0;
#pragma unroll
        for (int i = 0; i < 7; i++) {
            const float p = (float)s[i] + half;
            p7 += s[i];
            dot += (double)y[i] * p;
            pp += (double)p * p;
        }
        const float p = (float)(2 * tt + (p7 & 1)) + half;
        dot += (double)y[7] * p;
        pp += (double)p * p;
        for (int i = 0; i < a.bits; i++) code[lane * a.bits + i] = (uint8_t)(word >> (8 * i));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        dot += __shfl_xor_sync(0xffffffffu, dot, o);
        pp += __shfl_xor_sync(0xffffffffu, pp, o);
    }
    if (lane == 0) {
        const float c = pp > 0.0 ? (float)(dot / pp) : 0.f;
        const __nv_bfloat16 cb = __float2bfloat16_rn(c);
        *scale = *reinterpret_cast<const uint16_t*>(&cb);
    }
}

// The scaled E8 point of vector (row, t) in the rotated domain: this lane's 8 values (zeros
// for lanes past d/8).
__device__ __forceinline__ void hc_kv_point(const KvArgs& a, int row, int t, int lane, float* y) {
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = 0.f;
    if (lane >= (a.d >> 3)) return;
    const uint16_t sb = a.scales[row * a.scales_row + t];
    const float c = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&sb));
    const uint8_t* code = a.codes + row * a.codes_row + (long long)t * a.code_bytes + lane * a.bits;
    unsigned long long w = 0;
    for (int i = 0; i < a.bits; i++) w |= (unsigned long long)code[i] << (8 * i);
    const unsigned long long mask = (1ull << a.bits) - 1;
    const int h = 1 << (a.bits - 1);
    const int s0 = (int)(w & mask);
    const float half = (s0 & 1) ? 0.5f : 0.f;
    int p = 0;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        const int q = (int)((w >> (i * a.bits)) & mask) - h;
        p += q;
        y[i - 1] = ((float)q + half) * c;
    }
    y[7] = ((float)((s0 & ~1) - h + (p & 1)) + half) * c;
}

extern "C" __global__ void hc_kv_e8_decode(KvArgs a) {
    const int lane = threadIdx.x & 31;
    const long long v = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (v >= (long long)a.rows * a.toks) return;
    const int row = (int)(v / a.toks), t = (int)(v - (long long)row * a.toks);
    const bool on = lane < (a.d >> 3);
    float y[8];
    hc_kv_point(a, row, t, lane, y);
    if (a.tile > 0) hc_kv_unrotate(y, a.tile, a.seed, lane, on);
    if (on) {
        // A coded value a little past the output type's largest (its coding error, or the
        // scale's rounding) stays finite, as the host decode keeps it (a NaN stays NaN, as there).
        const float top = a.dtype == HC_F16 ? 65504.0f : a.dtype == HC_BF16 ? 3.3895313892515355e38f
                                                                            : 3.4028234663852886e38f;
#pragma unroll
        for (int i = 0; i < 8; i++) y[i] = fabsf(y[i]) > top ? copysignf(top, y[i]) : y[i];
        const long long at = row * a.out_row + (long long)t * a.d + 8 * lane;
        const int size = a.dtype == HC_F32 ? 4 : 2;
        const bool aligned = ((reinterpret_cast<uintptr_t>(a.out) + at * size) & 15) == 0;
        hc_store8(a.out, a.dtype, at, y, 8, aligned);
    }
}

// Attention of queries over compressed keys and values, without decoding the history to
// memory: block (c·⌈G/HC_KV_G⌉ + z, row) takes tokens [c·chunk, (c+1)·chunk) of row `row`
// (batch × KV head) for queries z·HC_KV_G .. of the row's G (its query heads × query positions). Scores are
// RHT(q)·(scale·point): the keys' rotation applied once to the query instead of inverted per
// key; the weighted sum of values stays in the values' rotated domain and is rotated back once.
// Each warp keeps an online softmax over its tokens (max, sum of exponentials, unnormalized
// output); the block merges its warps and writes its partial result — the output in the
// original domain, not divided, and (max, sum) — which the caller merges with the other chunks
// and the exact tokens (sinks, window).
#define HC_KV_G 8
#define HC_KV_WARPS 4

struct KvAttendArgs {
    KvArgs k, v;           // the codecs' codes and scales (x, out, dtype unused); toks = tokens
    const float* q;        // rows × G × d, f32, in the original domain
    const float* bias;     // null, or bias[(row / heads)·bias_b + (g % qlen)·bias_q + column]
    float* part_o;         // rows × chunks × G × d
    float* part_ml;        // rows × chunks × G × 2: (max, sum)
    const void* ek;        // exact keys, row r's token j at ek + (r·exact + j)·d, `edtype`
    const void* ev;        // exact values, the same layout
    long long bias_b, bias_q;
    int G, qlen, heads, bias0, chunk, chunks, exact, edtype;
    float scaling;
};

// Token t of the block's walk: compressed history t < toks (the scaled E8 point, rotated
// domain), then exact token j = t − toks (loaded and rotated by the codec's RHT).
__device__ __forceinline__ void hc_kv_token(const KvArgs& c, const void* exact, int exact_n, int edtype, int row, int t,
                                            int lane, float* y) {
    if (t < c.toks) {
        hc_kv_point(c, row, t, lane, y);
        return;
    }
    hc_kv_rotated(exact, edtype, ((long long)row * exact_n + (t - c.toks)) * c.d + 8 * lane, c, lane, y);
}

extern "C" __global__ void __launch_bounds__(32 * HC_KV_WARPS) hc_kv_e8_attend(KvAttendArgs a) {
    __shared__ __align__(16) float qs[HC_KV_G][256];
    __shared__ __align__(16) float os[HC_KV_WARPS][HC_KV_G][256];
    __shared__ float ms[HC_KV_WARPS][HC_KV_G], ls[HC_KV_WARPS][HC_KV_G];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gz = (a.G + HC_KV_G - 1) / HC_KV_G;
    const int c = blockIdx.x / gz, row = blockIdx.y, g0 = (blockIdx.x % gz) * HC_KV_G;
    const int ng = min(HC_KV_G, a.G - g0);
    const int d = a.k.d;
    const bool on = lane < (d >> 3);
    // The block's queries, rotated by the keys' RHT.
    for (int g = warp; g < ng; g += HC_KV_WARPS) {
        float y[8];
        hc_kv_rotated(a.q, HC_F32, ((long long)row * a.G + g0 + g) * d + 8 * lane, a.k, lane, y);
        if (on)
#pragma unroll
            for (int k = 0; k < 8; k++) qs[g][8 * lane + k] = y[k];
    }
    __syncthreads();
    float qv[HC_KV_G][8], m[HC_KV_G], l[HC_KV_G], o[HC_KV_G][8];
#pragma unroll
    for (int g = 0; g < HC_KV_G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            qv[g][k] = on && g < ng ? qs[g][8 * lane + k] : 0.f;
            o[g][k] = 0.f;
        }
    }
    const int t1 = (int)min((long long)a.k.toks + a.exact, (long long)(c + 1) * a.chunk);
    const long long brow = (long long)(row / a.heads) * a.bias_b;
    for (int t = (int)((long long)c * a.chunk) + warp; t < t1; t += HC_KV_WARPS) {
        float kv[8], vv[8];
        hc_kv_token(a.k, a.ek, a.exact, a.edtype, row, t, lane, kv);
        hc_kv_token(a.v, a.ev, a.exact, a.edtype, row, t, lane, vv);
        // The bias column: sinks (the first bias0 exact tokens), the history, the window.
        const int j = t - a.k.toks;
        const int col = j < 0 ? a.bias0 + t : j < a.bias0 ? j : a.k.toks + j;
#pragma unroll
        for (int g = 0; g < HC_KV_G; g++) {
            if (g < ng) {
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 8; k++) s = fmaf(qv[g][k], kv[k], s);
                s = hc_warp_sum(s) * a.scaling;
                if (a.bias) s += a.bias[brow + (long long)((g0 + g) % a.qlen) * a.bias_q + col];
                if (s != -INFINITY) {  // a masked token adds nothing; NaN propagates
                    const float mn = fmaxf(m[g], s);
                    const float corr = expf(m[g] - mn), p = expf(s - mn);
                    l[g] = fmaf(l[g], corr, p);
#pragma unroll
                    for (int k = 0; k < 8; k++) o[g][k] = fmaf(o[g][k], corr, p * vv[k]);
                    m[g] = mn;
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < HC_KV_G; g++) {
        if (lane == 0) {
            ms[warp][g] = m[g];
            ls[warp][g] = l[g];
        }
        if (on)
#pragma unroll
            for (int k = 0; k < 8; k++) os[warp][g][8 * lane + k] = o[g][k];
    }
    __syncthreads();
    for (int g = warp; g < ng; g += HC_KV_WARPS) {
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < HC_KV_WARPS; w++) mx = fmaxf(mx, ms[w][g]);
        float sum = 0.f, y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < HC_KV_WARPS; w++) {
            const float e = ms[w][g] == -INFINITY ? 0.f : expf(ms[w][g] - mx);
            sum = fmaf(ls[w][g], e, sum);
            if (on)
#pragma unroll
                for (int k = 0; k < 8; k++) y[k] = fmaf(e, os[w][g][8 * lane + k], y[k]);
        }
        if (a.v.tile > 0) hc_kv_unrotate(y, a.v.tile, a.v.seed, lane, on);
        const long long pi = ((long long)row * a.chunks + c) * a.G + g0 + g;
        if (on) hc_store8(a.part_o, HC_F32, pi * d + 8 * lane, y, 8, true);
        if (lane == 0) {
            a.part_ml[2 * pi] = mx;
            a.part_ml[2 * pi + 1] = sum;
        }
    }
}

// The chunks' partial results of hc_kv_e8_attend merged: a warp per (row, query), written as
// out[b][position][query head][:] (`odtype`) with row = b·heads + h and query g = i·qlen +
// position, query head h·(G / qlen) + i. A query that sees no token (a padding row) gets
// zeros, as the CPU runtime gives.
struct KvMergeArgs {
    const float* part_o;
    const float* part_ml;
    void* out;
    int rows, chunks, G, d, qlen, heads, odtype;
};

extern "C" __global__ void __launch_bounds__(128) hc_kv_attend_merge(KvMergeArgs a) {
    const int lane = threadIdx.x & 31;
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= (long long)a.rows * a.G) return;
    const int row = (int)(w / a.G), g = (int)(w - (long long)row * a.G);
    float mx = -INFINITY;
    for (int c = lane; c < a.chunks; c += 32) mx = fmaxf(mx, a.part_ml[2 * (((long long)row * a.chunks + c) * a.G + g)]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (mx == -INFINITY) mx = 0.f;
    const bool on = lane < (a.d >> 3);
    float sum = 0.f, y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int c = 0; c < a.chunks; c++) {
        const long long pi = ((long long)row * a.chunks + c) * a.G + g;
        const float m = a.part_ml[2 * pi];
        const float e = m == -INFINITY ? 0.f : expf(m - mx);
        sum = fmaf(a.part_ml[2 * pi + 1], e, sum);
        if (on) {
            float p[8];
            hc_load8(a.part_o, HC_F32, pi * a.d + 8 * lane, p);
#pragma unroll
            for (int k = 0; k < 8; k++) y[k] = fmaf(e, p[k], y[k]);
        }
    }
    if (on) {
        const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a query that sees no token: zeros
#pragma unroll
        for (int k = 0; k < 8; k++) y[k] *= inv;
        const int per = a.G / a.qlen, b = row / a.heads, h = row - b * a.heads;
        const int i = g / a.qlen, pos = g - i * a.qlen;
        const long long at = (((long long)b * a.qlen + pos) * a.heads * per + (long long)h * per + i) * a.d + 8 * lane;
        const int size = a.odtype == HC_F32 ? 4 : 2;
        hc_store8(a.out, a.odtype, at, y, 8, ((reinterpret_cast<uintptr_t>(a.out) + at * size) & 15) == 0);
    }
}

// ---------------------------------------------------------------------------------------
// E8 symbols in GPU-shaped rANS chunks (`hwz::Coding::RANS_GPU`; the coder is
// `hypercodec_rice::rans`), decoded inside the GEMV: one warp per chunk of whole rows, lane l
// decoding the chunk's symbols l, l + 32, ... (the format's lanes) from the chunk table's word
// offset and 32 lane states. A step decodes 32 symbols, four E8 words of one row: the lanes at
// position 0 of a word (context 0) first, then the others in the context of their word's coset
// bit. A slot's packed entry `b << 24 | (f − 1) << 12 | (slot − cum)` gives the state update
// and, in `b`, the symbol's signed coordinate (`2t + c` for a word's first symbol, `s` for the
// others: `rans::Decoder::warp_slots` with the runtime's E8 map); lanes whose state fell below
// 2^16 take the stream's next words in lane order (a ballot's prefix count) from a window of
// two 32-word buffers (a third loading ahead). Reads never leave the chunk's words (past its end they read 0): a
// corrupt stream gives wrong values, never a fault (the host checks the chunk table once).
// The rANS steps are mirrored by `warp_decode` in the tests of crates/rice/src/rans.rs.
struct E8RansArgs {
    const uint16_t* payload;
    const uint32_t* index;    // per chunk: word offset, then 32 lane states
    const uint32_t* slots;    // 3 << pb packed entries
    const float* row_scales;  // the stored row scale divided by α
    const float* xr;          // RHT(x), M × spr, f32 (GEMV)
    void* y;                  // GEMV: M × rows; decode: rows × spr (the rotated domain)
    const float* bias;
    long long words;          // payload words (< 2^31)
    int ydtype, M, rows, spr, chunk, chunks, pb;
};

// The slots of the largest model the host sends (12 probability bits, 3 contexts): 48 KB.
#define HC_RANS_SLOTS (3 << 12)

template <int M, bool DECODE>
__device__ __forceinline__ void hc_e8_rans(const E8RansArgs& a) {
    __shared__ uint32_t tab[HC_RANS_SLOTS];
    for (int i = threadIdx.x; i < (3 << a.pb); i += blockDim.x) tab[i] = a.slots[i];
    __syncthreads();
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, p = lane & 7, pb = a.pb;
    const unsigned below = (1u << lane) - 1u;
    // Lanes at position 0 count the odd coordinates of their word's other 7 lanes.
    const unsigned word_mask = p ? 0u : 0xFEu << (lane & 24);
    // The coordinate of this lane's symbol within its step: s_{p−1}, or s₇ at position 0.
    const int lc = (lane & 24) + (p ? p - 1 : 7);
    // Twice the coset's ½: +1 for s₀..s₆; −1 for s₇, whose byte 2t + c holds c once already.
    const int coset = p ? 1 : -1;
    const uint32_t mask = (1u << pb) - 1u;
    const int warps = blockDim.x >> 5;
    const long long n = (long long)a.rows * a.spr;
    for (int c = blockIdx.x * warps + (threadIdx.x >> 5); c < a.chunks; c += gridDim.x * warps) {
        const uint32_t* e = a.index + (long long)c * 33;
        // Clamped, so that no table (checked by the host or not) moves a read off the payload.
        const long long start = min((long long)e[0], a.words);
        const long long stop = c + 1 < a.chunks ? min((long long)e[33], a.words) : a.words;
        const int len = (int)max(stop - start, 0ll);
        const uint16_t* pl = a.payload + start;
        uint32_t x = e[1 + lane];
        int wbase = 0, rel = 0;
        uint32_t b0 = lane < len ? pl[lane] : 0u;
        uint32_t b1 = 32 + lane < len ? pl[32 + lane] : 0u;
        uint32_t b2 = 64 + lane < len ? pl[64 + lane] : 0u;
        const long long s0 = (long long)c * a.chunk;
        const int nsym = (int)min((long long)a.chunk, n - s0);
        int row = (int)(s0 / a.spr), col = 0;
        // Values are accumulated doubled (integers, the coset's ½ included): half the scale.
        float sc = 0.5f * a.row_scales[row];
        // The activations of this step and the next are held, and those of the step after
        // load while this one decodes (the next row's first when a row ends).
        const int c1 = 32 % a.spr;
        int c2 = 64 % a.spr;
        float acc[M], xv[M], xw[M];
#pragma unroll
        for (int m = 0; m < M; m++) {
            acc[m] = 0.f;
            if (!DECODE) {
                xv[m] = a.xr[m * a.spr + lc];
                xw[m] = a.xr[m * a.spr + c1 + lc];
            }
        }
        for (int st = 0; st < nsym; st += 32) {
            const int next = col + 32 == a.spr ? 0 : col + 32;
            float xn[M];
#pragma unroll
            for (int m = 0; m < M; m++)
                if (!DECODE) xn[m] = a.xr[m * a.spr + c2 + lc];
            c2 = c2 + 32 == a.spr ? 0 : c2 + 32;
            const uint32_t slot = x & mask;
            const uint32_t e0 = tab[slot];
            const uint32_t b0c = __shfl_sync(full, e0 >> 24, lane & 24);
            const int cs = (int)(b0c & 1u);  // the word's coset bit
            const uint32_t ent = p ? tab[((1 + cs) << pb) + slot] : e0;
            x = (((ent >> 12) & 0xFFFu) + 1u) * (x >> pb) + (ent & 0xFFFu);
            const bool need = x < 65536u;
            const unsigned bal = __ballot_sync(full, need);
            const int off = rel + __popc(bal & below);
            const uint32_t w0 = __shfl_sync(full, b0, off);
            const uint32_t w1 = __shfl_sync(full, b1, off);
            if (need) x = (x << 16) | (off < 32 ? w0 : w1);
            rel += __popc(bal);
            if (rel >= 32) {
                // A third buffer loads 32 words ahead of the two the steps read.
                rel -= 32;
                wbase += 32;
                b0 = b1;
                b1 = b2;
                b2 = wbase + 64 + lane < len ? pl[wbase + 64 + lane] : 0u;
            }
            // Doubled coordinate: 2s + c for s₀..s₆; 2(2t + par) + c for s₇, par the parity of
            // s₀ + … + s₆ (from the odd bytes of the word's other lanes).
            const int b = (int)ent >> 24;
            const unsigned odd = __ballot_sync(full, b & 1);
            const int par = __popc(odd & word_mask) & 1;
            const float v = (float)(2 * (b + par) + (cs ? coset : 0));
            if (DECODE) {
                hc_store(a.y, a.ydtype, (long long)row * a.spr + col + lc, v * sc);
            } else {
#pragma unroll
                for (int m = 0; m < M; m++) {
                    acc[m] += v * xv[m];
                    xv[m] = xw[m];
                    xw[m] = xn[m];
                }
            }
            col = next;
            if (col == 0) {
                if (!DECODE) {
                    const float bias = a.bias ? a.bias[row] : 0.f;
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        const float t = hc_warp_sum(acc[m]);
                        if (lane == 0) hc_store(a.y, a.ydtype, (long long)m * a.rows + row, t * sc + bias);
                        acc[m] = 0.f;
                    }
                }
                row++;
                if (st + 32 < nsym) sc = 0.5f * a.row_scales[row];
            }
        }
    }
}

// hc_e8_rans_gemv_m{1..4}: passes of exactly 1 to 4 activation rows; hc_e8_rans_decode: the
// scaled points in the rotated domain for large batches (then cuBLAS).
extern "C" __global__ void __launch_bounds__(256) hc_e8_rans_gemv_m1(E8RansArgs a) { hc_e8_rans<1, false>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_rans_gemv_m2(E8RansArgs a) { hc_e8_rans<2, false>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_rans_gemv_m3(E8RansArgs a) { hc_e8_rans<3, false>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_rans_gemv_m4(E8RansArgs a) { hc_e8_rans<4, false>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_rans_decode(E8RansArgs a) { hc_e8_rans<1, true>(a); }

// ---------------------------------------------------------------------------------------
// Per-token int8 activations for W8A8 (`hypercodec.nn.quantize_activations`): for row r of
// x (`xdtype`, rows × cols), step[r] = max(max_j |x[r, j]|, 1e-30) / 127 and q[r, j] =
// round-half-even(x[r, j] / step[r]) clamped to ±127: the host's torch expression, operation
// for operation (IEEE division), so both give the same codes. A block per row.
// The reduction of hc_row_step (below): the row's step from each thread's partial absolute
// maximum and NaN flag.
__device__ __forceinline__ float hc_block_step(float a, int nan, float top, float* __restrict__ step) {
    __shared__ float part[8];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = a;
    nan = __syncthreads_or(nan);
    a = part[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) a = fmaxf(a, part[w]);
    const float s = nan ? __int_as_float(0x7fc00000) : fmaxf(a, 1e-30f) / top;
    if (threadIdx.x == 0) step[blockIdx.x] = s;
    return s;
}

// The step of one activation row (a block of at most 256 threads per row): its absolute
// maximum (at least 1e-30) divided by `top`, NaN where the row holds one (fmaxf drops NaN; a
// NaN step makes NaN outputs, as torch's amax); written to step[blockIdx.x] and returned.
__device__ __forceinline__ float hc_row_step(const void* __restrict__ x, int xdtype, long long base, int cols,
                                             float top, float* __restrict__ step) {
    float a = 0.f;
    int nan = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = hc_load(x, xdtype, base + j);
        nan |= isnan(v);
        a = fmaxf(a, fabsf(v));
    }
    return hc_block_step(a, nan, top, step);
}

extern "C" __global__ void __launch_bounds__(256) hc_quant_i8(const void* __restrict__ x, int xdtype,
                                                              int8_t* __restrict__ q, float* __restrict__ step,
                                                              int cols) {
    const long long base = (long long)blockIdx.x * cols;
    int8_t* qr = q + base;
    const float s = hc_row_step(x, xdtype, base, cols, 127.f, step);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const int v = __float2int_rn(hc_load(x, xdtype, base + j) / s);
        qr[j] = (int8_t)max(-127, min(127, v));
    }
}

// The W8A8 epilogue: y[r, n] = acc[r, n]·step[r]·scale[n] (+ bias[n]) in `ydtype`, from the
// int8 GEMM's int32 sums, in one pass (rows × cols, grid-stride).
// f32 → FP8 E4M3 (OCP "e4m3fn": bias 7, no infinities, largest 448) by round to nearest even,
// for |v| <= 448 and v finite (larger magnitudes saturate to ±448; NaN gives 0x7F). Written out
// so that the sm_80 PTX carries it (cvt.rn.satfinite.e4m3x2 needs sm_89).
__device__ __forceinline__ uint32_t hc_f32_to_e4m3(float v) {
    const uint32_t sign = (__float_as_uint(v) >> 24) & 0x80u;
    const float a = fabsf(v);
    if (!(a == a)) return 0x7Fu;
    uint32_t code;
    if (a < 0.015625f) {
        // Subnormals: m·2^-9, m = 0..7; m = 8 is 2^-6, the smallest normal (code 8).
        code = (uint32_t)__float2int_rn(a * 512.f);
    } else {
        const uint32_t b = __float_as_uint(a);
        const uint32_t r = (b + 0x7FFFFu + ((b >> 20) & 1u)) & 0xFFF00000u;  // 3 mantissa bits, RNE
        code = ((((r >> 23) - 127u + 7u) << 3) | ((r >> 20) & 7u));
        code = min(code, 0x7Eu);  // 448
    }
    return sign | code;
}

// Per-token FP8 E4M3 activations for the FP8 GEMM: row r of `x` (rows × cols of xdtype) is
// scaled by its absolute maximum to ±448 and rounded to E4M3 (q, bytes), its step
// (max / 448) written to step[r]; a block per row of `padded` rows (the GEMM takes multiples of
// 16), rows past `rows` zeros with step 1. A row holding NaN gets a NaN step (NaN outputs).
extern "C" __global__ void __launch_bounds__(256) hc_quant_f8(const void* __restrict__ x, int xdtype,
                                                              uint8_t* __restrict__ q, float* __restrict__ step,
                                                              int rows, int cols) {
    const long long base = (long long)blockIdx.x * cols;
    uint8_t* qr = q + base;
    if ((int)blockIdx.x >= rows) {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) qr[j] = 0;
        if (threadIdx.x == 0) step[blockIdx.x] = 1.f;
        return;
    }
    // Rows of whole 16-byte pieces at aligned addresses: 8 values a load and an 8-byte store
    // (the row's second read mostly from L2); otherwise value by value.
    if ((cols & 7) == 0 && hc_aligned16(x) && (reinterpret_cast<uintptr_t>(q) & 7) == 0) {
        float a = 0.f;
        int nan = 0;
        for (int j = 8 * threadIdx.x; j < cols; j += 8 * blockDim.x) {
            float v[8];
            hc_load8(x, xdtype, base + j, v);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                nan |= isnan(v[k]);
                a = fmaxf(a, fabsf(v[k]));
            }
        }
        const float s = hc_block_step(a, nan, 448.f, step);
        for (int j = 8 * threadIdx.x; j < cols; j += 8 * blockDim.x) {
            float v[8];
            hc_load8(x, xdtype, base + j, v);
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                lo |= hc_f32_to_e4m3(v[k] / s) << (8 * k);
                hi |= hc_f32_to_e4m3(v[4 + k] / s) << (8 * k);
            }
            *reinterpret_cast<uint2*>(qr + j) = make_uint2(lo, hi);
        }
        return;
    }
    const float s = hc_row_step(x, xdtype, base, cols, 448.f, step);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) qr[j] = (uint8_t)hc_f32_to_e4m3(hc_load(x, xdtype, base + j) / s);
}

// Block-scaled FP8 E4M3 activations for an FP8 GEMM with 1×128 scales (weights with a scale per
// group): as hc_quant_f8, but each run of `block` columns of a row has its own step, written
// column-major for cuBLASLt, step[b · gridDim.x + r] (`gridDim.x` = the padded rows). Grid:
// (padded rows, ⌈runs / (8 · HC_QF8_RUNS)⌉), a warp per HC_QF8_RUNS runs; rows past `rows`
// zeros with step 1. With `sums` (else null) each run's sum of the activations as given (f32,
// before rounding; the offsets' term of asymmetric weights) goes to sums[r · runs + b], 0 past
// `rows`.
#define HC_QF8_RUNS 4

// One run at x[base ..< base + block], any length and alignment: lanes stride the run twice.
__device__ __forceinline__ void hc_qf8_run(const void* __restrict__ x, int xdtype, uint8_t* __restrict__ q, float* st,
                                           float* sum, long long base, int block, int lane) {
    float a = 0.f, t = 0.f;
    int nan = 0;
    for (int j = lane; j < block; j += 32) {
        const float u = hc_load(x, xdtype, base + j);
        nan |= isnan(u);
        a = fmaxf(a, fabsf(u));
        t += u;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        t += __shfl_xor_sync(0xffffffffu, t, o);
    }
    const float s = __any_sync(0xffffffffu, nan) ? __int_as_float(0x7fc00000) : fmaxf(a, 1e-30f) / 448.f;
    if (lane == 0) {
        *st = s;
        if (sum) *sum = t;
    }
    for (int j = lane; j < block; j += 32) q[base + j] = (uint8_t)hc_f32_to_e4m3(hc_load(x, xdtype, base + j) / s);
}

extern "C" __global__ void __launch_bounds__(256) hc_quant_f8_blocks(const void* __restrict__ x, int xdtype,
                                                                     uint8_t* __restrict__ q, float* __restrict__ step,
                                                                     int rows, int cols, int block,
                                                                     float* __restrict__ sums) {
    constexpr int R = HC_QF8_RUNS;
    const int lane = threadIdx.x & 31, nb = cols / block;
    const int b0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * R;
    if (b0 >= nb) return;
    const long long row = (long long)blockIdx.x * cols;
    float* st = step + (long long)b0 * gridDim.x + blockIdx.x;  // run b0 + i: st[i · gridDim.x]
    float* sum = sums ? sums + (long long)blockIdx.x * nb + b0 : nullptr;
    if ((int)blockIdx.x >= rows) {
        for (int i = 0; i < R && b0 + i < nb; i++) {
            for (int j = lane; j < block; j += 32) q[row + (long long)(b0 + i) * block + j] = 0;
            if (lane == 0) {
                st[(long long)i * gridDim.x] = 1.f;
                if (sum) sum[i] = 0.f;
            }
        }
        return;
    }
    // Runs of 128 at 16-byte aligned rows: each lane holds 4 values of each of the warp's runs
    // in registers, all loaded before any reduction (one 8- or 16-byte load and one 4-byte
    // store a lane and run). Otherwise the loop of hc_qf8_run, run after run.
    if (block != 128 || (cols & 7) || !hc_aligned16(x) || (reinterpret_cast<uintptr_t>(q) & 3)) {
        for (int i = 0; i < R && b0 + i < nb; i++)
            hc_qf8_run(x, xdtype, q, st + (long long)i * gridDim.x, sum ? sum + i : nullptr,
                       row + (long long)(b0 + i) * block, block, lane);
        return;
    }
    float v[R][4], a[R], t[R];
    int nan[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        a[i] = t[i] = 0.f;
        nan[i] = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) v[i][k] = 0.f;
        if (b0 + i < nb) hc_load4(x, xdtype, row + (long long)(b0 + i) * 128 + 4 * lane, v[i]);
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            nan[i] |= isnan(v[i][k]);
            a[i] = fmaxf(a[i], fabsf(v[i][k]));
            t[i] += v[i][k];
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < R; i++) {
            a[i] = fmaxf(a[i], __shfl_xor_sync(0xffffffffu, a[i], o));
            t[i] += __shfl_xor_sync(0xffffffffu, t[i], o);
        }
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (b0 + i >= nb) break;
        const float s = __any_sync(0xffffffffu, nan[i]) ? __int_as_float(0x7fc00000) : fmaxf(a[i], 1e-30f) / 448.f;
        if (lane == 0) {
            st[(long long)i * gridDim.x] = s;
            if (sum) sum[i] = t[i];
        }
        uint32_t w = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) w |= hc_f32_to_e4m3(v[i][k] / s) << (8 * k);
        *reinterpret_cast<uint32_t*>(q + row + (long long)(b0 + i) * 128 + 4 * lane) = w;
    }
}

extern "C" __global__ void __launch_bounds__(256) hc_w8a8_out(const int32_t* __restrict__ acc,
                                                              const float* __restrict__ step,
                                                              const float* __restrict__ scale,
                                                              const float* __restrict__ bias, void* __restrict__ y,
                                                              int ydtype, long long rows, int cols) {
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % cols);
        const float v = (float)acc[i] * step[i / cols] * scale[c];
        hc_store(y, ydtype, i, bias ? v + bias[c] : v);
    }
}
