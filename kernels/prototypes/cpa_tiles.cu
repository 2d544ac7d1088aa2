// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): the committed batch-1
// INT4 kernel (hc_affine_cpa) on a grid of fewer blocks than row tiles, each block taking tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... with its warps' cp.async rings running on across the
// tiles. Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/cpat.cubin kernels/prototypes/cpa_tiles.cu
// and time it on a GPU with py/benches/cuda_cpa_tiles.py.
//
// Question: a 4096-column row gives each of 8 warps 4 steps; at 28672 rows (a block's gate and
// up in one launch) 1792 blocks of one tile each start their rings from empty, 4.5 waves of
// prologues whose first bytes arrive a DRAM round trip later, and these layers move 2.1 TB/s
// where 8192-column ones move 2.5 TB/s on an H200. Here a block's next tile is in flight while
// its current one computes: the prologue is paid once per block.
#include "../gemv.cu"

template <int BITS, bool BF16, int NW, int S>
__device__ __forceinline__ void hc_affine_cpa_tiles(const AffineArgs& a) {
    constexpr int CW = 4, PER = 32 / BITS, XW = PER / 2, MC = 4 * CW * PER;
    constexpr float FMAGIC = BF16 ? 128.f : 1024.f;
    extern __shared__ __align__(16) uint8_t hc_cpa_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    HcCpaStage<BITS>* ring = reinterpret_cast<HcCpaStage<BITS>*>(hc_cpa_sm) + warp * S;
    // Two buffers of the warps' partial sums: part[tile parity][warp][row].
    float* part = reinterpret_cast<float*>(hc_cpa_sm + sizeof(HcCpaStage<BITS>) * NW * S);
    const int steps = a.cols / MC;
    const int tiles = (a.rows + 15) / 16;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    const void* so_src = t == 0 ? a.scales : a.offsets;
    const int s_bytes = a.sdtype ? 2 : 4;
    const uint16_t* xr = static_cast<const uint16_t*>(a.x) + t * CW * PER;
    const int per = warp < steps ? (steps - 1 - warp) / NW + 1 : 0;  // this warp's steps a tile
    const int ntiles = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int mine = per * ntiles;
    // Where the next copy goes: its tile's first row, its step within the tile, its slot.
    int is_r0 = blockIdx.x * 16, is_j = 0, is_slot = 0;
    auto issue = [&]() {
        const int s = warp + is_j * NW;
        HcCpaStage<BITS>& st = ring[is_slot];
        const uint8_t* ca = a.codes + min(is_r0 + g, a.rows - 1) * row_bytes + t * 16;
        const uint8_t* cb = a.codes + min(is_r0 + g + 8, a.rows - 1) * row_bytes + t * 16;
        hc_cp16(&st.w[0][g][t][0], ca + (long long)s * 64);
        hc_cp16(&st.w[1][g][t][0], cb + (long long)s * 64);
        if (a.srs && t < 2 && so_src) {
            const int grp = a.glen_log2 >= 0 ? (s * MC) >> a.glen_log2 : (s * MC) / a.glen;
            const uint8_t* src = static_cast<const uint8_t*>(so_src) + hc_si(a, is_r0 + g, grp) * s_bytes;
            if (s_bytes == 4) hc_cp8_l1(&st.so[g][2 * t], src);
            else hc_cp4_l1(&st.so[g][t], src);
        }
        if (g == 0)
#pragma unroll
            for (int q = 0; q < CW * XW / 4; q++) hc_cp16_l1(&st.x[t][4 * q], xr + (long long)s * MC + 8 * q);
        is_slot = is_slot + 1 == S ? 0 : is_slot + 1;
        if (++is_j == per) {
            is_j = 0;
            is_r0 += gridDim.x * 16;
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < mine) issue();
        hc_cp_commit();
    }
    const float sc0 = a.srs ? 0.f : hc_sval(a, a.scales, 0), lo0 = a.srs || !a.offsets ? 0.f : hc_sval(a, a.offsets, 0);
    int ci = 0, slot = 0, buf = 0;
    for (int tk = 0; tk < ntiles; tk++) {
        const int r0 = (blockIdx.x + tk * gridDim.x) * 16;
        float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
        for (int j = 0; j < per; j++, ci++) {
            if (ci + S - 1 < mine) issue();
            hc_cp_commit();
            hc_cp_wait<S - 1>();
            __syncwarp();
            const HcCpaStage<BITS>& st = ring[slot];
            slot = slot + 1 == S ? 0 : slot + 1;
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
            float4 so = make_float4(sc0, sc0, lo0, lo0);
            if (a.srs) {
                if (a.sdtype == 0) {
                    so = *reinterpret_cast<const float4*>(&st.so[g][0]);
                } else {
                    const uint2 v = *reinterpret_cast<const uint2*>(&st.so[g][0]);
                    const float2 sp = hc_spair16(a.sdtype, v.x), op = hc_spair16(a.sdtype, v.y);
                    so = make_float4(sp.x, sp.y, op.x, op.y);
                }
                if (!a.offsets) so.z = so.w = 0.f;
            }
            __syncwarp();  // every lane has read the slot before any lane refills it
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float sc = h ? so.y : so.x, lo = h ? so.w : so.z;
                cur.mul[0][h] = sc * a.qmul;
                cur.add[0][h] = lo - sc * a.qbias - FMAGIC * cur.mul[0][h];
            }
            hc_mma_step<BITS, CW, 1, 1, BF16>(a, 0, g, t, cur, acc);
        }
        if (t == 0) {
            part[(buf * NW + warp) * 16 + g] = acc[0][0][0];
            part[(buf * NW + warp) * 16 + g + 8] = acc[0][0][2];
        }
        __syncthreads();
        if (threadIdx.x < 16 && r0 + (int)threadIdx.x < a.rows) {
            const int r = r0 + threadIdx.x;
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++) v += part[(buf * NW + w) * 16 + threadIdx.x];
            hc_store(a.y, a.ydtype, r, v + (a.bias ? a.bias[r] : 0.f));
        }
        buf ^= 1;
    }
    hc_cp_wait<0>();
}

#define CPAT(NW, S)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpat_w##NW##_s##S(AffineArgs a) {            \
        hc_affine_cpa_tiles<4, true, NW, S>(a);                                                           \
    }
CPAT(8, 3)
CPAT(8, 4)
CPAT(4, 4)
