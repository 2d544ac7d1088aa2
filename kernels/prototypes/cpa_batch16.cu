// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): the cp.async ring of the
// batch-1 kernel (hc_affine_cpa) for batches of 9-16 rows (two mma batch tiles). Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/cpa16.cubin kernels/prototypes/cpa_batch16.cu
// and time it on a GPU with py/benches/cuda_cpa16_prototype.py.
//
// Idea: at batch 16 the committed tensor-core kernel (hc_affine_mma_*_n2) holds the next step's
// codes and scales in registers (HC_MMA_AHEAD) beside 2 row tiles × 2 batch tiles of sums, and
// runs 1.5-1.8× bf16 where batch 1 (fed by cp.async) runs 2.0-2.3×. Here each warp streams its
// steps' codes and scale pairs (R row tiles) through a ring of S stages in shared memory by
// cp.async, as the batch-1 kernel does; the activations (16 rows, read by every block) come from
// L1 in the step, as in the committed kernel (hc_mma_step with NT = 2).
#include "../gemv.cu"

template <int R>
struct HcCpa2Stage {
    uint32_t w[R][2][8][4][4];  // [row tile][h][g][t][word]: rows 16·ti + g + 8h
    float so[R][8][4];          // [row tile][g]: scale pair, offset pair (f32), or the 16-bit pairs in [0], [1]
};

template <int BITS, bool BF16, int R, int NW, int S>
__device__ __forceinline__ void hc_affine_cpa2(const AffineArgs& a) {
    constexpr int CW = 4, PER = 32 / BITS, XW = PER / 2, MC = 4 * CW * PER, NT = 2;
    constexpr float FMAGIC = BF16 ? 128.f : 1024.f;
    extern __shared__ __align__(16) uint8_t hc_cpa2_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16 * R;
    HcCpa2Stage<R>* ring = reinterpret_cast<HcCpa2Stage<R>*>(hc_cpa2_sm) + warp * S;
    float* part = reinterpret_cast<float*>(hc_cpa2_sm + sizeof(HcCpa2Stage<R>) * NW * S);
    const int steps = a.cols / MC;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    // Rows past the weight read its last row, a row tile past it the last tile's terms (their
    // sums are never stored).
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
    const int mine = warp < steps ? (steps - 1 - warp) / NW + 1 : 0;
    auto issue = [&](int i) {
        const int s = warp + i * NW;
        HcCpa2Stage<R>& st = ring[i % S];
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int h = 0; h < 2; h++) hc_cp16(&st.w[ti][h][g][t][0], cp[ti][h] + (long long)s * 64);
        if (a.srs && t < 2 && so_src) {
            const int grp = a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen;
#pragma unroll
            for (int ti = 0; ti < R; ti++) {
                const uint8_t* src = static_cast<const uint8_t*>(so_src) + hc_si(a, rt[ti] + g, grp) * s_bytes;
                if (s_bytes == 4) hc_cp8_l1(&st.so[ti][g][2 * t], src);
                else hc_cp4_l1(&st.so[ti][g][t], src);
            }
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < mine) issue(i);
        hc_cp_commit();
    }
    const float sc0 = a.srs ? 0.f : hc_sval(a, a.scales, 0), lo0 = a.srs || !a.offsets ? 0.f : hc_sval(a, a.offsets, 0);
    float acc[R][NT][4] = {};
    for (int i = 0; i < mine; i++) {
        if (i + S - 1 < mine) issue(i + S - 1);
        hc_cp_commit();
        hc_cp_wait<S - 1>();
        __syncwarp();
        const HcCpa2Stage<R>& st = ring[i % S];
        HcMmaStep<CW, R, NT, XW> cur;
        float4 so[R];
#pragma unroll
        for (int ti = 0; ti < R; ti++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 v = *reinterpret_cast<const uint4*>(&st.w[ti][h][g][t][0]);
                cur.w[ti][h][0] = v.x;
                cur.w[ti][h][1] = v.y;
                cur.w[ti][h][2] = v.z;
                cur.w[ti][h][3] = v.w;
            }
            so[ti] = make_float4(sc0, sc0, lo0, lo0);
            if (a.srs) {
                if (a.sdtype == 0) {
                    so[ti] = *reinterpret_cast<const float4*>(&st.so[ti][g][0]);
                } else {
                    const uint2 v = *reinterpret_cast<const uint2*>(&st.so[ti][g][0]);
                    const float2 sp = hc_spair16(a.sdtype, v.x), op = hc_spair16(a.sdtype, v.y);
                    so[ti] = make_float4(sp.x, sp.y, op.x, op.y);
                }
                if (!a.offsets) so[ti].z = so[ti].w = 0.f;
            }
        }
        __syncwarp();  // every lane has read the slot before any lane refills it
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float sc = h ? so[ti].y : so[ti].x, lo = h ? so[ti].w : so[ti].z;
                cur.mul[ti][h] = sc * a.qmul;
                cur.add[ti][h] = lo - sc * a.qbias - FMAGIC * cur.mul[ti][h];
            }
        hc_mma_step<BITS, CW, NT, R, BF16>(a, warp + i * NW, g, t, cur, acc);
    }
    hc_cp_wait<0>();
    // The warps' partial sums: part[warp][row][batch row], as hc_affine_mma.
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                part[(warp * 16 * R + 16 * ti + g + 8 * (i >> 1)) * 8 * NT + 8 * n + 2 * t + (i & 1)] = acc[ti][n][i];
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * R * 8 * NT; e += blockDim.x) {
        const int r = e / (8 * NT), m = e % (8 * NT);
        if (r0 + r < a.rows && m < a.M) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++) v += part[(w * 16 * R + r) * 8 * NT + m];
            hc_store(a.y, a.ydtype, (long long)m * a.rows + r0 + r, v + (a.bias ? a.bias[r0 + r] : 0.f));
        }
    }
}

// Dynamic shared memory: NW · (S · sizeof(HcCpa2Stage<R>)) + NW · 16R · 16 · 4 bytes.
#define HC_CPA2(R, NW, S)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpa2_b4_bf16_r##R##_w##NW##_s##S(AffineArgs a) { \
        hc_affine_cpa2<4, true, R, NW, S>(a);                                                                 \
    }
HC_CPA2(1, 8, 3)
HC_CPA2(2, 8, 3)
HC_CPA2(1, 8, 4)
HC_CPA2(2, 4, 4)
HC_CPA2(2, 8, 2)
// Four row tiles a warp: the activations read once per 64 weight rows (R = 2 reads them per 32).
HC_CPA2(4, 4, 3)
HC_CPA2(4, 8, 2)
