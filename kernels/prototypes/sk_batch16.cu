// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): INT4 at batches of 9-16
// rows with the activations shared by every warp of a block, and split-K. Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/sk16.cubin kernels/prototypes/sk_batch16.cu
// and time it on a GPU with py/benches/cuda_sk16_prototype.py.
//
// Why (docs/eval/cuda_int4_variants.md, 2026-12-04): at 16 rows the committed two-batch-tile
// kernel and the cp.async prototypes (cpa_batch16.cu) are bound by reading the activations: the
// warps of a block split the columns, so each block reads all 16 activation rows (2 bytes a
// value) for its 32 weight rows (half a byte a value), twice the bytes of the codes, from L2.
//
// Here the warps of a block split the rows instead: warp w computes row tiles 16·R·w .. of the
// block's 16·R·NW rows, and every warp walks the same columns, so one copy of a step's
// activations (16 rows × 128 columns, 4 KB) in shared memory serves them all: the activations
// read from L2 fall to 32 / (16·R·NW·0.5) of the codes (1/4 at R = 2, NW = 8). A block would
// then cover 256 rows, 32 blocks for 8192 rows, so the columns are split too (blockIdx.y takes
// a contiguous share of the steps): each share writes its partial sums to a workspace slab
// (plain stores, no atomics), and the last share of a row block to finish (a counter) sums the
// slabs in a fixed order (deterministic) and stores y; it resets the counter for the next call.
//
// Each stage of the block's ring (S stages, cp.async, one block barrier a step) holds the step's
// activations (16-byte pieces swizzled by hc_gemm_piece: a lane (g, t) reads pieces 4t..4t+3
// of rows g and g + 8, conflict-free) and each warp's codes and scale pairs, as the batch-1
// kernel's ring (hc_affine_cpa) holds them. The math is hc_mma_step's with two batch tiles.
#include "../gemv.cu"

template <int R, int NW>
struct HcSkStage {
    uint4 x[16][16];                // [activation row][piece], swizzled
    uint32_t w[NW][R][2][8][4][4];  // [warp][row tile][h][g][t][word]: rows 16·ti + g + 8h of the warp
    float so[NW][R][8][4];          // [warp][row tile][g]: scale pair, offset pair (f32), or 16-bit pairs in [0], [1]
};

template <int BITS, bool BF16, int R, int NW, int S>
__device__ __forceinline__ void hc_affine_sk(const AffineArgs& a, float* __restrict__ ws, unsigned* __restrict__ cnt,
                                             int split) {
    static_assert(BITS == 4, "4-bit codes only");
    constexpr int CW = 4, PER = 32 / BITS, XW = PER / 2, MC = 4 * CW * PER, NT = 2;
    constexpr uint32_t MASK = ((1u << BITS) - 1) * 0x00010001u;
    constexpr uint32_t MAGIC = BF16 ? 0x43004300u : 0x64006400u;
    constexpr uint32_t ONES = BF16 ? 0x3F803F80u : 0x3C003C00u;
    constexpr float FMAGIC = BF16 ? 128.f : 1024.f;
    extern __shared__ __align__(16) uint8_t hc_sk_sm[];
    HcSkStage<R, NW>* ring = reinterpret_cast<HcSkStage<R, NW>*>(hc_sk_sm);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x * 16 * R * NW;  // the block's first row
    const int r0 = rb + 16 * R * warp;        // the warp's first row
    const int steps = a.cols / MC;
    const int sb = (int)((long long)blockIdx.y * steps / split), se = (int)((long long)(blockIdx.y + 1) * steps / split);
    const int n = se - sb;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    const uint8_t* cp[R][2];
    int rt[R];
#pragma unroll
    for (int ti = 0; ti < R; ti++) {
#pragma unroll
        for (int h = 0; h < 2; h++) cp[ti][h] = a.codes + min(r0 + 16 * ti + g + 8 * h, a.rows - 1) * row_bytes + t * 16;
        rt[ti] = min(r0 + 16 * ti, (a.rows - 1) & ~15);
    }
    const void* so_src = t == 0 ? a.scales : a.offsets;
    const int s_bytes = a.sdtype ? 2 : 4;
    const uint16_t* x = static_cast<const uint16_t*>(a.x);
    auto issue = [&](int i) {
        const int s = sb + i;
        HcSkStage<R, NW>& st = ring[i % S];
        for (int p = threadIdx.x; p < 256; p += 32 * NW) {
            const int m = p >> 4, piece = p & 15;
            hc_cp16_l1(&st.x[m][hc_gemm_piece(m, piece)], x + (long long)min(m, a.M - 1) * a.cols + s * MC + piece * 8);
        }
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int h = 0; h < 2; h++) hc_cp16(&st.w[warp][ti][h][g][t][0], cp[ti][h] + (long long)s * 64);
        if (a.srs && t < 2 && so_src) {
            const int grp = a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen;
#pragma unroll
            for (int ti = 0; ti < R; ti++) {
                const uint8_t* src = static_cast<const uint8_t*>(so_src) + hc_si(a, rt[ti] + g, grp) * s_bytes;
                if (s_bytes == 4) hc_cp8_l1(&st.so[warp][ti][g][2 * t], src);
                else hc_cp4_l1(&st.so[warp][ti][g][t], src);
            }
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < n) issue(i);
        hc_cp_commit();
    }
    const float sc0 = a.srs ? 0.f : hc_sval(a, a.scales, 0), lo0 = a.srs || !a.offsets ? 0.f : hc_sval(a, a.offsets, 0);
    float acc[R][NT][4] = {};
    for (int i = 0; i < n; i++) {
        hc_cp_wait<S - 2>();
        __syncthreads();  // stage i is complete for every thread; stage i - 1 is read by all
        if (i + S - 1 < n) issue(i + S - 1);
        hc_cp_commit();
        const HcSkStage<R, NW>& st = ring[i % S];
        uint32_t w[R][2][CW];
        float mul[R][2], add[R][2];
#pragma unroll
        for (int ti = 0; ti < R; ti++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 v = *reinterpret_cast<const uint4*>(&st.w[warp][ti][h][g][t][0]);
                w[ti][h][0] = v.x;
                w[ti][h][1] = v.y;
                w[ti][h][2] = v.z;
                w[ti][h][3] = v.w;
            }
            float4 so = make_float4(sc0, sc0, lo0, lo0);
            if (a.srs) {
                if (a.sdtype == 0) {
                    so = *reinterpret_cast<const float4*>(&st.so[warp][ti][g][0]);
                } else {
                    const uint2 v = *reinterpret_cast<const uint2*>(&st.so[warp][ti][g][0]);
                    const float2 sp = hc_spair16(a.sdtype, v.x), op = hc_spair16(a.sdtype, v.y);
                    so = make_float4(sp.x, sp.y, op.x, op.y);
                }
                if (!a.offsets) so.z = so.w = 0.f;
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float sc = h ? so.y : so.x, lo = h ? so.w : so.z;
                mul[ti][h] = sc * a.qmul;
                add[ti][h] = lo - sc * a.qbias - FMAGIC * mul[ti][h];
            }
        }
        // hc_mma_step with two batch tiles, the activations from the stage.
        float c[R][NT][4], sx[NT][4];
#pragma unroll
        for (int nn = 0; nn < NT; nn++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                sx[nn][q] = 0.f;
#pragma unroll
                for (int ti = 0; ti < R; ti++) c[ti][nn][q] = 0.f;
            }
#pragma unroll
        for (int k = 0; k < CW; k++) {
            uint32_t xv[NT][XW];
#pragma unroll
            for (int nn = 0; nn < NT; nn++) {
                const int m = g + 8 * nn;
                const uint4 v = st.x[m][hc_gemm_piece(m, 4 * t + k)];
                xv[nn][0] = v.x;
                xv[nn][1] = v.y;
                xv[nn][2] = v.z;
                xv[nn][3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < PER / 4; j++) {
                const int i0 = 2 * j, i1 = 2 * j + 1;
                uint32_t b0[NT], b1[NT];
#pragma unroll
                for (int nn = 0; nn < NT; nn++) {
                    b0[nn] = __byte_perm(xv[nn][i0 / 2], xv[nn][i0 / 2 + PER / 4], (i0 & 1) ? 0x7632 : 0x5410);
                    b1[nn] = __byte_perm(xv[nn][i1 / 2], xv[nn][i1 / 2 + PER / 4], (i1 & 1) ? 0x7632 : 0x5410);
                    hc_mma16816<BF16>(sx[nn], ONES, ONES, ONES, ONES, b0[nn], b1[nn]);
                }
#pragma unroll
                for (int ti = 0; ti < R; ti++) {
                    const uint32_t a0 = hc_lop3_and_or(w[ti][0][k] >> (BITS * i0), MASK, MAGIC);
                    const uint32_t a1 = hc_lop3_and_or(w[ti][1][k] >> (BITS * i0), MASK, MAGIC);
                    const uint32_t a2 = hc_lop3_and_or(w[ti][0][k] >> (BITS * i1), MASK, MAGIC);
                    const uint32_t a3 = hc_lop3_and_or(w[ti][1][k] >> (BITS * i1), MASK, MAGIC);
#pragma unroll
                    for (int nn = 0; nn < NT; nn++) hc_mma16816<BF16>(c[ti][nn], a0, a1, a2, a3, b0[nn], b1[nn]);
                }
            }
        }
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int nn = 0; nn < NT; nn++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    acc[ti][nn][q] = fmaf(mul[ti][q >> 1], c[ti][nn][q], fmaf(add[ti][q >> 1], sx[nn][q], acc[ti][nn][q]));
    }
    hc_cp_wait<0>();
    // Lane (g, t) holds rows 16·ti + g + 8(q >> 1) of the warp for batch rows 8·nn + 2t + (q & 1).
    if (split == 1) {
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int nn = 0; nn < NT; nn++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int r = r0 + 16 * ti + g + 8 * (q >> 1), m = 8 * nn + 2 * t + (q & 1);
                    if (r < a.rows && m < a.M)
                        hc_store(a.y, a.ydtype, (long long)m * a.rows + r, acc[ti][nn][q] + (a.bias ? a.bias[r] : 0.f));
                }
        return;
    }
    // This share's slab: ws[share][m][row].
    float* slab = ws + (long long)blockIdx.y * a.M * a.rows;
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int nn = 0; nn < NT; nn++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = r0 + 16 * ti + g + 8 * (q >> 1), m = 8 * nn + 2 * t + (q & 1);
                if (r < a.rows && m < a.M) __stcg(slab + (long long)m * a.rows + r, acc[ti][nn][q]);
            }
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(cnt + blockIdx.x, 1u) == (unsigned)split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int nr = min(16 * R * NW, a.rows - rb);
    for (int e = threadIdx.x; e < nr * a.M; e += blockDim.x) {
        const int m = e / nr, r = rb + e % nr;
        float v = 0.f;
        for (int y = 0; y < split; y++) v += __ldcg(ws + ((long long)y * a.M + m) * a.rows + r);
        hc_store(a.y, a.ydtype, (long long)m * a.rows + r, v + (a.bias ? a.bias[r] : 0.f));
    }
    if (threadIdx.x == 0) cnt[blockIdx.x] = 0;
}

// Dynamic shared memory: S · sizeof(HcSkStage<R, NW>) = S · (4096 + NW·R·1152) bytes.
#define HC_SK(R, NW, S)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_sk_b4_bf16_r##R##_w##NW##_s##S(                   \
        AffineArgs a, float* ws, unsigned* cnt, int split) {                                                   \
        hc_affine_sk<4, true, R, NW, S>(a, ws, cnt, split);                                                    \
    }
HC_SK(2, 8, 3)
HC_SK(2, 4, 3)
HC_SK(2, 4, 4)
HC_SK(1, 8, 3)
HC_SK(2, 8, 2)
