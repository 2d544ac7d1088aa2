// The tensor-core GEMM (included by gemv.cu, built for sm_80, and by gemm_sm90a.cu, which builds
// its split forms): a GEMM whose weight fragments are decoded to the
// activation type in registers. 2- or 4-bit codes under bf16 or f16 activations, rows and
// groups of whole chunks of HC_GEMM_BK columns.
//
// A block of HC_GEMM_WARPS warps computes HC_GEMM_WARPS·16·R weight rows (each warp R mma
// row tiles of 16) for BN = 8·NT activation rows (blockIdx.y picks them), walking the columns
// a chunk of 128 at a time through a ring of S stages in shared memory that all its threads
// fill with cp.async: the chunk's activations, the block's codes as stored and its tiles'
// scale and offset pairs (one block barrier per chunk). A lane then reads its code words in
// the layout of hc_affine_mma (lane (g, t): CW words of rows g and g + 8 at the chunk's
// columns [32t, 32t + 32)), so the activations are paired with PRMT exactly as there. (Codes
// and scales loaded from global memory into registers a chunk ahead instead were 1.2-3.3×
// slower on an H200: a block has too few warps to hide that latency.) Unlike the small-batch
// kernels, which keep MAGIC + q and apply the scale terms to the sums of each group, this one
// turns each fragment register into two weights, ŵ = (s·qmul)·q + (lo − s·qbias), by three
// (bf16) or four (f16) packed FMAs with the group's terms split in two parts each (hc_terms):
// ŵ is then rounded to the activation type about as the decode-then-cuBLAS route rounds it.
// The cost per weight is shared by the 8·NT activation rows of its mmas, and there is no
// second mma for Σx.
//
// Split K (KS > 1, sm_90 only: clusters): a block alone walks the whole row, one chunk after
// another, and a short layer makes few blocks (1024 rows: 16 of them for 132 SMs), so the layer
// took one block's walk whatever its height (22-24 µs for 4096 columns on an H100). Split, KS
// blocks of one cluster take the same rows and batch tile, each a KS-th of the chunks; each
// leaves its partial sums in its own shared memory, and each sums a share of the outputs over
// the cluster (distributed shared memory, in rank order: the same sums whichever block adds
// them) and stores them, as the Hopper GEMM's split does. No workspace, no atomics.
#pragma once
#include "affine.cuh"

#define HC_GEMM_WARPS 4
#define HC_GEMM_BK 128

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// This block's rank in its cluster, a barrier over the cluster (the writes to shared memory
// before it seen by the reads after it in every block), and a read of another block's shared
// memory at the address `p` has in this one.
__device__ __forceinline__ int hc_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ void hc_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float4 hc_ld_cluster(const void* p, int rank) {
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(hc_smem(p)), "r"(rank));
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
    return v;
}
#define HC_HAS_CLUSTERS 1
#else
#define HC_HAS_CLUSTERS 0
#endif

// Where 16-byte piece p (0..15: columns 8p .. 8p + 8 of the chunk) of activation row m sits in
// its stage's row of 256 bytes: a lane (g, t) reads pieces 4t .. 4t + 3 of row g, and the
// eight lanes of a quarter warp (rows g, g + 1; t = 0..3) then hit eight different bank groups.
__device__ __forceinline__ int hc_gemm_piece(int m, int p) { return p ^ ((p >> 3) << 1) ^ (m & 1); }

template <int BITS, bool BF16, int R, int NT, int S, int KS = 1>
__device__ __forceinline__ void hc_affine_gemm(const AffineArgs& a) {
    static_assert(KS == 1 || HC_HAS_CLUSTERS, "split K needs clusters (sm_90)");
    constexpr int PER = 32 / BITS, XW = PER / 2;
    constexpr int CW = HC_GEMM_BK / 4 / PER;  // code words per lane and chunk
    constexpr int BN = 8 * NT, NTH = 32 * HC_GEMM_WARPS;
    constexpr int CB = HC_GEMM_BK * BITS / 8, BM = HC_GEMM_WARPS * 16 * R;  // code bytes per row and chunk
    // A stage: the activations (BN rows of 256 bytes), the block's codes (BM rows of CB bytes),
    // then per tile of 16 rows its scale pairs and offset pairs (64 bytes each: 16 f32, or 16
    // 16-bit values and 32 unused bytes).
    constexpr int XST = BN * 256, CST = XST + BM * CB, STAGE = CST + BM / 16 * 128;
    constexpr uint32_t MASK = ((1u << BITS) - 1) * 0x00010001u;
    constexpr uint32_t MAGIC = BF16 ? 0x43004300u : 0x64006400u;
    extern __shared__ __align__(16) uint8_t hc_gemm_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // Split: the KS blocks of a cluster (consecutive along x) share rows, rank q walking chunks
    // [q·all/KS, (q + 1)·all/KS).
    int rank = 0;
#if HC_HAS_CLUSTERS
    if (KS > 1) rank = hc_cluster_rank();
#endif
    const int rb = (blockIdx.x / KS) * BM, r0 = rb + warp * 16 * R;
    const int m0 = blockIdx.y * BN;
    const int all = a.cols / HC_GEMM_BK, c0 = (int)((long long)all * rank / KS);
    const int chunks = (int)((long long)all * (rank + 1) / KS) - c0;
    const long long row_bytes = (long long)a.cols * BITS / 8;
    const uint16_t* x = static_cast<const uint16_t*>(a.x);
    auto group = [&](int c) { return a.glen_log2 >= 0 ? (c * HC_GEMM_BK) >> a.glen_log2 : (c * HC_GEMM_BK) / a.glen; };
    // This block's chunk i (chunk c0 + i of the row) into its stage: activation rows past the
    // batch and weight rows past the last read the last one (their sums are never stored).
    auto issue = [&](int i) {
        uint8_t* st = hc_gemm_sm + (i % S) * STAGE;
        const int c = c0 + i;
#pragma unroll
        for (int u = 0; u < BN * 16 / NTH; u++) {
            const int e = threadIdx.x + u * NTH, m = e >> 4, p = e & 15;
            const long long src = (long long)min(m0 + m, a.M - 1) * a.cols + (long long)c * HC_GEMM_BK + 8 * p;
            hc_cp16(st + 16 * (m * 16 + hc_gemm_piece(m, p)), x + src);
        }
#pragma unroll
        for (int u = 0; u < BM * CB / 16 / NTH; u++) {
            const int e = threadIdx.x + u * NTH, r = e / (CB / 16), p = e % (CB / 16);
            hc_cp16(st + XST + r * CB + 16 * p, a.codes + (long long)min(rb + r, a.rows - 1) * row_bytes + (long long)c * CB + 16 * p);
        }
        if (a.srs && threadIdx.x < BM / 16 * 8) {
            // Tile threadIdx.x / 8 of the block: scales (threads 0..3 of the 8) or offsets (4..7),
            // 64 bytes of f32 or 32 of a 16-bit type.
            const int tile = threadIdx.x >> 3, arr = (threadIdx.x >> 2) & 1, p = threadIdx.x & 3;
            const int sb = a.sdtype ? 2 : 4;
            const void* src = arr ? a.offsets : a.scales;
            if (p < sb && src) {
                const long long tt = min(rb / 16 + tile, (a.rows - 1) / 16);
                hc_cp16(st + CST + tile * 128 + arr * 64 + 16 * p,
                        static_cast<const uint8_t*>(src) + ((tt * a.srs + group(c)) * 16) * sb + 16 * p);
            }
        }
    };
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < chunks) issue(i);
        hc_cp_commit();
    }
    float acc[R][NT][4] = {};
    // One tensor-wide scale: its terms once.
    HcTerms tm[R][2];
    if (!a.srs) {
        const float s = hc_sval(a, a.scales, 0), lo = a.offsets ? hc_sval(a, a.offsets, 0) : 0.f;
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int h = 0; h < 2; h++) tm[ti][h] = hc_terms<BF16>(s * a.qmul, lo - s * a.qbias);
    }
    for (int i = 0; i < chunks; i++) {
        hc_cp_wait<S - 2>();
        __syncthreads();  // chunk i is in; every warp is done with chunk i − 1's stage
        if (i + S - 1 < chunks) issue(i + S - 1);
        hc_cp_commit();
        const uint8_t* st = hc_gemm_sm + (i % S) * STAGE;
        uint32_t w[R][2][CW];
#pragma unroll
        for (int ti = 0; ti < R; ti++) {
#pragma unroll
            for (int h = 0; h < 2; h++) hc_load_words<CW>(st + XST + (warp * 16 * R + 16 * ti + g + 8 * h) * CB + t * CW * 4, w[ti][h]);
            if (a.srs) {
                // The scale and offset pairs of rows g, g + 8 (groups hold whole chunks).
                const uint8_t* sp = st + CST + (warp * R + ti) * 128 + g * (a.sdtype ? 4 : 8);
                float2 sc, lo = make_float2(0.f, 0.f);
                if (a.sdtype == 0) {
                    sc = *reinterpret_cast<const float2*>(sp);
                    if (a.offsets) lo = *reinterpret_cast<const float2*>(sp + 64);
                } else {
                    sc = hc_spair16(a.sdtype, *reinterpret_cast<const uint32_t*>(sp));
                    if (a.offsets) lo = hc_spair16(a.sdtype, *reinterpret_cast<const uint32_t*>(sp + 64));
                }
                tm[ti][0] = hc_terms<BF16>(sc.x * a.qmul, lo.x - sc.x * a.qbias);
                tm[ti][1] = hc_terms<BF16>(sc.y * a.qmul, lo.y - sc.y * a.qbias);
            }
        }
        const uint4* xs = reinterpret_cast<const uint4*>(st);
#pragma unroll
        for (int k = 0; k < CW; k++) {
            // The word's weights as PER/4 k-steps of A fragments (pairs 2j and 2j + 1, as in
            // hc_mma_step).
            uint32_t af[PER / 4][R][4];
#pragma unroll
            for (int j = 0; j < PER / 4; j++)
#pragma unroll
                for (int ti = 0; ti < R; ti++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int h = e & 1, i = 2 * j + (e >> 1);
                        af[j][ti][e] = hc_dequant2<BF16>(hc_lop3_and_or(w[ti][h][k] >> (BITS * i), MASK, MAGIC), tm[ti][h]);
                    }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int m = 8 * n + g;
                uint32_t xv[XW];
#pragma unroll
                for (int q = 0; q < XW / 4; q++) {
                    const uint4 v = xs[m * 16 + hc_gemm_piece(m, 4 * t + k * (XW / 4) + q)];
                    xv[4 * q] = v.x;
                    xv[4 * q + 1] = v.y;
                    xv[4 * q + 2] = v.z;
                    xv[4 * q + 3] = v.w;
                }
#pragma unroll
                for (int j = 0; j < PER / 4; j++) {
                    const int i0 = 2 * j, i1 = 2 * j + 1;
                    const uint32_t b0 = __byte_perm(xv[i0 / 2], xv[i0 / 2 + PER / 4], (i0 & 1) ? 0x7632 : 0x5410);
                    const uint32_t b1 = __byte_perm(xv[i1 / 2], xv[i1 / 2 + PER / 4], (i1 & 1) ? 0x7632 : 0x5410);
#pragma unroll
                    for (int ti = 0; ti < R; ti++)
                        hc_mma16816<BF16>(acc[ti][n], af[j][ti][0], af[j][ti][1], af[j][ti][2], af[j][ti][3], b0, b1);
                }
            }
        }
    }
    hc_cp_wait<0>();
#if HC_HAS_CLUSTERS
    if (KS > 1) {
        // Partial sums to this block's shared memory (piece j of every thread, then piece j + 1:
        // a thread reads its own pieces in the others), then this block's outputs: the pieces
        // j = ti·NT + n with j mod KS = rank, summed over the cluster in rank order.
        float4* part = reinterpret_cast<float4*>(hc_gemm_sm);
        __syncthreads();  // no warp reads the stages any more
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int n = 0; n < NT; n++)
                part[(ti * NT + n) * NTH + threadIdx.x] = make_float4(acc[ti][n][0], acc[ti][n][1], acc[ti][n][2], acc[ti][n][3]);
        hc_cluster_sync();
#pragma unroll
        for (int ti = 0; ti < R; ti++)
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int j = ti * NT + n;
                if (j % KS != rank) continue;
                float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int q = 0; q < KS; q++) {
                    const float4 v = q == rank ? make_float4(acc[ti][n][0], acc[ti][n][1], acc[ti][n][2], acc[ti][n][3])
                                               : hc_ld_cluster(part + j * NTH + threadIdx.x, q);
                    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                }
                acc[ti][n][0] = sum.x, acc[ti][n][1] = sum.y, acc[ti][n][2] = sum.z, acc[ti][n][3] = sum.w;
            }
        hc_cluster_sync();  // every read of this block's partial sums is done before it exits
    }
#endif
#pragma unroll
    for (int ti = 0; ti < R; ti++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = r0 + 16 * ti + g + 8 * (i >> 1), m = m0 + 8 * n + 2 * t + (i & 1);
                if (r < a.rows && m < a.M && (KS == 1 || (ti * NT + n) % KS == rank))
                    hc_store(a.y, a.ydtype, (long long)m * a.rows + r, acc[ti][n][i] + (a.bias ? a.bias[r] : 0.f));
            }
}

