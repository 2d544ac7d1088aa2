// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): INT4 GEMV at batch 1
// on the stored row-major codes, fed by per-warp cp.async rings. Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/cpa.cubin kernels/prototypes/cpasync_int4_gemv.cu
// and time it on a GPU with py/benches/cuda_cpasync_prototype.py.
//
// Idea: the committed tensor-core kernel keeps one step of codes in registers per warp, so the
// bytes in flight are bounded by registers (and occupancy). Here each warp owns a ring of S
// stages in shared memory and every lane copies its own 16-byte pieces with cp.async, whose
// bytes in flight cost no registers. A lane reads back what its warp copied after
// `cp.async.wait_group` and `__syncwarp`: no block-wide barrier and no producer warp.
#include "../gemv.cu"

// The cp.async helpers (hc_cp16, hc_cp16_l1, hc_cp8_l1, hc_cp4_l1, hc_cp_commit, hc_cp_wait) are gemv.cu's.

// One stage: a warp's step of 16 rows × 128 columns of 4-bit codes ([h][g][t][word]), the four
// scale terms of each g ([g][t]: scale g, offset g, scale g + 8, offset g + 8), the activations of
// each lane column t (raw, or in fragment order when PREP) and, when PREP, the step's Σx.
struct CpaStage {
    uint32_t w[2][8][4][4];
    float so[8][4];
    uint32_t x[4][16];
    float sx[4];
};

// The activation row in fragment order (entry (s, t, q), q = 2k + j: b0 = (x[c + 2j], x[c + 2j + 4]),
// b1 = (x[c + 2j + 1], x[c + 2j + 5]), c = 128s + 32t + 8k) and each step's Σx: a warp per step.
extern "C" __global__ void hc_cpa_xprep(const uint16_t* __restrict__ x, uint32_t* __restrict__ xf,
                                        float* __restrict__ sx, int cols) {
    const int s = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (s >= cols / 128) return;
    const int t = lane >> 3, q = lane & 7, k = q >> 1, j = q & 1;
    const int c = 128 * s + 32 * t + 8 * k;
    const uint32_t* xw = reinterpret_cast<const uint32_t*>(x);
    const uint32_t lo = xw[(c >> 1) + j], hi = xw[(c >> 1) + j + 2];
    xf[(s * 32 + lane) * 2] = __byte_perm(lo, hi, 0x5410);
    xf[(s * 32 + lane) * 2 + 1] = __byte_perm(lo, hi, 0x7632);
    float v = __uint_as_float(lo << 16) + __uint_as_float(lo & 0xFFFF0000u) + __uint_as_float(hi << 16) +
              __uint_as_float(hi & 0xFFFF0000u);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sx[s] = v;
}

// xf/sx: the prepared row (PREP) or unused. Groups must hold whole steps of 128 columns.
// LAYOUT 0: codes and scales as stored; 1: codes tile-major ([tile][step][h][g][t][16 B], each
// warp copy 512 contiguous bytes), scales as stored; 2: both tile-major (scales [tile][step][g]
// of 16 B: scale g, offset g, scale g + 8, offset g + 8; groups of 128 only). MATH false: the
// feed alone (every copy and wait, no arithmetic; the output is not computed).
template <int NW, int S, bool PREP, int LAYOUT = 0, bool MATH = true>
__device__ __forceinline__ void hc_cpa(const AffineArgs& a, const uint32_t* __restrict__ xf, const float* __restrict__ sxg) {
    constexpr int MC = 128;
    extern __shared__ __align__(16) uint8_t cpa_sm[];
    CpaStage* ring = reinterpret_cast<CpaStage*>(cpa_sm);
    float* part = reinterpret_cast<float*>(cpa_sm + sizeof(CpaStage) * NW * S);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16;
    const int steps = a.cols / MC;
    const long long row_bytes = a.cols / 2;
    const int ra = min(r0 + g, a.rows - 1), rb = min(r0 + g + 8, a.rows - 1);
    const uint8_t* ca = a.codes + ra * row_bytes + t * 16;
    const uint8_t* cb = a.codes + rb * row_bytes + t * 16;
    const bool off = a.offsets != nullptr;
    const float* sp = static_cast<const float*>((t & 1) && off ? a.offsets : a.scales) + (a.srs ? (long long)(t < 2 ? ra : rb) * a.srs : 0);
    const uint16_t* xr = static_cast<const uint16_t*>(a.x) + t * 32;
    CpaStage* mine = ring + warp * S;
    const int my = warp < steps ? (steps - 1 - warp) / NW + 1 : 0;
    auto issue = [&](int i) {
        const int s = warp + i * NW;
        CpaStage& st = mine[i % S];
        if (LAYOUT == 0 || LAYOUT == 3) {
            hc_cp16(&st.w[0][g][t][0], ca + (long long)s * 64);
            hc_cp16(&st.w[1][g][t][0], cb + (long long)s * 64);
        } else {
            const uint8_t* tp = a.codes + ((long long)blockIdx.x * steps + s) * 1024 + lane * 16;
            hc_cp16(&st.w[0][g][t][0], tp);
            hc_cp16(&st.w[1][g][t][0], tp + 512);
        }
        if (LAYOUT == 4) {
            // f16 pairs (rows g, g + 8) of the tiled layout: scales then offsets, 4 bytes each.
            const long long si = hc_si(a, r0 + g, (s * MC) >> 7);
            if (t == 0) hc_cp4_l1(&st.so[g][0], static_cast<const uint16_t*>(a.scales) + si);
            if (t == 1) hc_cp4_l1(&st.so[g][1], static_cast<const uint16_t*>(a.offsets) + si);
        } else if (LAYOUT >= 2) {
            // f32 pairs (rows g, g + 8) of the committed tiled layout: scales then offsets.
            const int grp = a.srs ? (a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen) : 0;
            const long long si = hc_si(a, r0 + g, grp);
            if (t == 0) hc_cp8_l1(&st.so[g][0], static_cast<const float*>(a.scales) + si);
            if (t == 1) hc_cp8_l1(&st.so[g][2], static_cast<const float*>(a.offsets) + si);
        } else {
            const int grp = a.srs ? (a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen) : 0;
            hc_cp4_l1(&st.so[g][t], sp + grp);
        }
        if (g == 0) {
            if (PREP) {
#pragma unroll
                for (int q = 0; q < 4; q++) hc_cp16_l1(&st.x[t][4 * q], xf + (s * 4 + t) * 16 + 4 * q);
                if (t == 0) hc_cp4_l1(&st.sx[0], sxg + s);
            } else {
#pragma unroll
                for (int q = 0; q < 4; q++) hc_cp16_l1(&st.x[t][4 * q], xr + (long long)s * MC + q * 8);
            }
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < my) issue(i);
        hc_cp_commit();
    }
    float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
    for (int i = 0; i < my; i++) {
        if (i + S - 1 < my) issue(i + S - 1);
        hc_cp_commit();
        hc_cp_wait<S - 1>();
        __syncwarp();
        if (!MATH) continue;
        const CpaStage& st = mine[i % S];
        HcMmaStep<4, 1, 1, 4> cur;
        const uint4 wa = *reinterpret_cast<const uint4*>(&st.w[0][g][t][0]);
        const uint4 wb = *reinterpret_cast<const uint4*>(&st.w[1][g][t][0]);
        cur.w[0][0][0] = wa.x; cur.w[0][0][1] = wa.y; cur.w[0][0][2] = wa.z; cur.w[0][0][3] = wa.w;
        cur.w[0][1][0] = wb.x; cur.w[0][1][1] = wb.y; cur.w[0][1][2] = wb.z; cur.w[0][1][3] = wb.w;
        // (scale g, offset g, scale g + 8, offset g + 8)
        float4 so;
        if (LAYOUT == 4) {
            const uint2 h = *reinterpret_cast<const uint2*>(&st.so[g][0]);
            so = make_float4(__half2float(__ushort_as_half(h.x & 0xFFFF)), __half2float(__ushort_as_half(h.y & 0xFFFF)),
                             __half2float(__ushort_as_half(h.x >> 16)), __half2float(__ushort_as_half(h.y >> 16)));
        } else if (LAYOUT >= 2) {
            const float4 v = *reinterpret_cast<const float4*>(&st.so[g][0]);
            so = make_float4(v.x, v.z, v.y, v.w);
        } else {
            so = *reinterpret_cast<const float4*>(&st.so[g][0]);
        }
        for (int q = 0; q < 4; q++) {
            const uint4 xv = *reinterpret_cast<const uint4*>(&st.x[t][4 * q]);
            cur.x[q][0] = xv.x; cur.x[q][1] = xv.y; cur.x[q][2] = xv.z; cur.x[q][3] = xv.w;
        }
        const float sxv = PREP ? st.sx[0] : 0.f;
        __syncwarp();  // every lane has read the slot before any refills it
        const float m0 = so.x * a.qmul, m1 = so.z * a.qmul;
        cur.mul[0][0] = m0;
        cur.mul[0][1] = m1;
        cur.add[0][0] = (off ? so.y : 0.f) - so.x * a.qbias - 128.f * m0;
        cur.add[0][1] = (off ? so.w : 0.f) - so.z * a.qbias - 128.f * m1;
        const int s = warp + i * NW;
        if (PREP) {
            constexpr uint32_t MASK = 0x000F000Fu, MAGIC = 0x43004300u;
            float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int i0 = 2 * j, i1 = 2 * j + 1, q = 2 * k + j;
                    hc_mma16816<true>(c, hc_lop3_and_or(cur.w[0][0][k] >> (4 * i0), MASK, MAGIC),
                                      hc_lop3_and_or(cur.w[0][1][k] >> (4 * i0), MASK, MAGIC),
                                      hc_lop3_and_or(cur.w[0][0][k] >> (4 * i1), MASK, MAGIC),
                                      hc_lop3_and_or(cur.w[0][1][k] >> (4 * i1), MASK, MAGIC), cur.x[k][2 * j],
                                      cur.x[k][2 * j + 1]);
                }
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[0][0][e] = fmaf(cur.mul[0][e >> 1], c[e], fmaf(cur.add[0][e >> 1], sxv, acc[0][0][e]));
        } else {
            hc_mma_step<4, 4, 1, 1, true>(a, s, g, t, cur, acc);
        }
    }
    hc_cp_wait<0>();
#pragma unroll
    for (int e = 0; e < 4; e++)
        if (t == 0 && (e & 1) == 0) part[warp * 16 + g + 8 * (e >> 1)] = acc[0][0][e];
    __syncthreads();
    if (threadIdx.x < 16 && r0 + threadIdx.x < a.rows) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) v += part[w * 16 + threadIdx.x];
        hc_store(a.y, a.ydtype, r0 + threadIdx.x, v + (a.bias ? a.bias[r0 + threadIdx.x] : 0.f));
    }
}

#define CPA(NW, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpa_w##NW##_s##S(AffineArgs a) {               \
        hc_cpa<NW, S, false>(a, nullptr, nullptr);                                                          \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpa_prep_w##NW##_s##S(AffineArgs a, const uint32_t* xf, \
                                                                                  const float* sx) {         \
        hc_cpa<NW, S, true>(a, xf, sx);                                                                     \
    }
CPA(8, 4)
CPA(4, 4)
#define CPAL(NW, S, L, M)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpa_l##L##_m##M##_w##NW##_s##S(AffineArgs a) {    \
        hc_cpa<NW, S, false, L, M>(a, nullptr, nullptr);                                                        \
    }
CPAL(8, 4, 2, 1)
CPAL(4, 4, 2, 1)
CPAL(4, 4, 3, 1)
CPAL(8, 4, 3, 1)
CPAL(4, 4, 4, 1)
CPAL(8, 4, 4, 1)
CPAL(8, 3, 4, 1)
CPAL(8, 4, 4, 0)
CPAL(8, 4, 2, 0)


// The committed hc_affine_cpa (4-bit, bf16) at other warps and stages.
#define CPAC(NW, S)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpac_w##NW##_s##S(AffineArgs a) {       \
        hc_affine_cpa<4, true, NW, S>(a, blockIdx.x);                                                          \
    }
CPAC(8, 3)
CPAC(8, 2)
CPAC(4, 4)
CPAC(4, 3)
CPAC(8, 6)
