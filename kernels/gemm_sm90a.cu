// hypercodec GEMM for large batches on Hopper (built for sm_90a only; kernels-cuda loads this
// module where the device is of compute capability 9.0 and routes to it there): y = x·Wᵀ (+ b)
// on 4-bit affine codes as stored, bf16 or f16 activations, with the weights decoded in
// registers as the A operand of warpgroup MMAs (wgmma) and the activations read by the tensor
// cores from shared memory.
//
// Why: above 64 activation rows the sm_80 routes ran 0.32–0.51× bf16 F.linear on an H200
// (docs/eval/cuda_gemm.md): the mma.sync GEMM is bound by the instructions around its mmas, and
// the decode route by writing and reading a dense weight. One wgmma m64nNk16 does 64·N·16
// multiply-adds, so decoding each weight once per N activation rows costs few issue slots.
//
// Design: a block of two warpgroups computes 128 weight rows (a warpgroup 64, a warp 16) for
// BN activation rows (blockIdx.y), walking the columns BK at a time through a ring of S stages
// filled S − 1 chunks ahead (no warp specialisation, one block barrier a chunk):
// - the chunk's activations, BK / 64 tiles of BN rows × 128 bytes in the 128-byte swizzled
//   layout that a shared-memory descriptor reads as wgmma's B operand (K-major), copied by the
//   tensor memory accelerator (one thread issues a box of 64 columns × BN rows a tile, from a
//   tensor map of x that kernels-cuda encodes at each launch; rows past the batch read as
//   zeros), completing on the stage's mbarrier. (Copied by every thread with cp.async, 16
//   bytes each, they ran 3–10 % slower at 256 rows on an H100: docs/eval/cuda_gemm.md.)
// - the block's codes as stored, by every thread with cp.async (BK / 2 bytes a row, rows
//   BK / 2 + 16 bytes apart so that the 8 rows a warp reads at once, an odd number of 16-byte
//   units apart, hit different banks).
// The weights: for k-step s (columns 16s .. 16s + 15) lane (g, t) of a warp needs columns
// 2t, 2t + 1 and 2t + 8, 2t + 9 of its rows g and g + 8 (mma.m16n8k16's A layout, which wgmma
// takes per warp), that is byte t of code words 2s and 2s + 1 of each row: one PRMT and one
// LOP3 put its two nibbles in the two halves of a register as MAGIC + q (wg_pair), then
// hc_dequant2 turns them into ŵ of the activation type (three packed FMAs under bf16, as the
// mma.sync GEMM). No activation is permuted: the codes are read in stored column order.
// The schedule is by chunk: a warpgroup issues all BK / 16 wgmmas of chunk c in one batch, then
// decodes every step of chunk c + 1 at once (independent chains) into a second set of A
// registers while they run, and waits only for chunk c − 1's before rewriting its set. (Buffered
// by k-step, decoding step s + 1 only once step s − 1 had finished, the first form of this
// kernel kept one or two wgmmas in flight and reached a quarter of the tensor rate on an H100:
// docs/eval/cuda_gemm.md.) The copies' addresses are worked out once (a chunk adds BK columns)
// and each group's scales are loaded two chunks before its terms are made (the first two at
// the prologue), and converted only then.
// Split K: a layer with too few rows to fill the device (one block an SM: the stages take most
// of its shared memory) runs as clusters of KS = 2 blocks over the same 128 rows (clusters of 4
// ran slower), each block a KS-th of the chunks; each block then leaves its partial sums in its
// own shared memory, and each sums a KS-th of the outputs over the cluster (distributed shared
// memory, in rank order: the same sums whichever block adds them) and stores them. No
// workspace, no atomics.
#include "affine.cuh"
#include "gemm_mma.cuh"

// A tensor map (the driver's CUtensorMap, 128 bytes) passed by value.
struct __align__(64) WgTmap {
    unsigned long long w[16];
};
// mbarriers: initialised for n arrivals, an arrival expecting `bytes` of copies, and a wait for
// the phase of parity `parity` to complete.
__device__ __forceinline__ void wg_bar_init(uint64_t* b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(hc_smem(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void wg_bar_expect(uint64_t* b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(hc_smem(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wg_bar_wait(uint64_t* b, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred P1;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nbra WAIT;\nDONE:\n}\n" ::"r"(hc_smem(b)),
        "r"(parity)
        : "memory");
}
// The box of `map` at (col, row) (64 columns, the map's rows, in the 128-byte swizzle) copied
// to dst by the tensor memory accelerator, completing on bar.
__device__ __forceinline__ void wg_tma2d(void* dst, const WgTmap* map, int col, int row, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            hc_smem(dst)),
        "l"(map), "r"(col), "r"(row), "r"(hc_smem(bar))
        : "memory");
}

// d += A · B on the tensor cores (wgmma m64nNk16, f32 accumulation): A (64 weight rows × 16
// columns; this lane's fragment a[4] in mma.m16n8k16's layout for its warp's 16 rows) from
// registers, B (16 columns × N activation rows) from shared memory through `desc`.
template <bool BF16>
__device__ __forceinline__ void wg_mma_n128(float* d, const uint32_t* a, uint64_t desc) {
    if (BF16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
    if (!BF16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
}
template <bool BF16>
__device__ __forceinline__ void wg_mma_n256(float* d, const uint32_t* a, uint64_t desc) {
    if (BF16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
    if (!BF16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
}
template <int N, bool BF16>
__device__ __forceinline__ void wg_mma(float* d, const uint32_t* a, uint64_t desc) {
    if (N == 128) wg_mma_n128<BF16>(d, a, desc);
    else wg_mma_n256<BF16>(d, a, desc);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving an accumulator across an asynchronous wgmma.
__device__ __forceinline__ void wg_keep(float& v) { asm volatile("" : "+f"(v)::"memory"); }

// A shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte swizzle, 8-row groups
// 1024 bytes apart (the stride byte offset; the leading one is unused by this layout).
__device__ __forceinline__ uint64_t wg_desc(const void* p) {
    const uint32_t a = hc_smem(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#define WG_THREADS 256
#define WG_BM 128  // weight rows a block

// A stage of a block computing WG_BM weight rows for BN activation rows, BK columns a chunk
// (kernels-cuda `args::wgmma_shared`). Every size is a multiple of 1024 bytes, the swizzle's
// period.
template <int BN, int BK>
struct WgStage {
    static constexpr int CROW = BK / 2 + 16;
    static constexpr int XST = BN * BK * 2;
    static constexpr int BYTES = XST + WG_BM * CROW;
    static_assert(BYTES % 1024 == 0, "stage not a multiple of 1024 bytes");
    // The activations: 16-byte piece p (columns 8p .. 8p + 7 of the chunk) of row n at tile
    // p / 8 (BN · 128 bytes each), row n at 128 n, piece (p mod 8) XOR (n mod 8): what the
    // tensor map's 128-byte swizzle writes.
};

// Two weights of row word w's byte t (columns 2t, 2t + 1 of its 8) as MAGIC + q in the halves of
// a fragment register; sel = t | t << 4 | (4 + t) << 8 | (4 + t) << 12 takes byte t of w and of
// w >> 4. (Reading the high nibble in place, as MAGIC + 16 q, would save the shift, but under
// bf16 its top bit lands on the exponent: 7 significand bits.)
__device__ __forceinline__ uint32_t wg_pair(uint32_t w, uint32_t sel, uint32_t magic) {
    return hc_lop3_and_or(__byte_perm(w, w >> 4, sel), 0x000F000Fu, magic);
}

// The scale (or offset) pair of rows g, g + 8 of a tile in group grp as loaded (idx: the pair's
// first entry in group 0, hc_si's layout; 16 entries a group): two f32 words, or one word of two
// 16-bit values. Converted only where used (wg_pair_from): a conversion next to the load makes
// the warp wait for it there (Nsight Compute: a fifth of the stall samples of the n256 kernel
// sat on the conversion of a scale load issued just before it).
__device__ __forceinline__ uint2 wg_raw_of(const void* p, int sdtype, long long idx, int grp) {
    if (sdtype == 0) return __ldg(reinterpret_cast<const uint2*>(static_cast<const float*>(p) + idx + 16LL * grp));
    return make_uint2(__ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p) + idx + 16LL * grp)), 0u);
}
__device__ __forceinline__ float2 wg_pair_from(int sdtype, uint2 v) {
    asm volatile("" : "+r"(v.x), "+r"(v.y));  // (keeps the compiler from moving the conversion up to the load)
    if (sdtype == 0) return make_float2(__uint_as_float(v.x), __uint_as_float(v.y));
    return hc_spair16(sdtype, v.x);
}

// y[m][r] = Σ_k x[m][k] · ŵ[r][k] (+ bias) for 4-bit codes with a scale per row or per group of
// a multiple of BK columns (a.srs ≥ 1), a.cols a multiple of 128, codes and activation rows
// 16-byte aligned (kernels-cuda `AffineGemv::wgmma_ok`); KS > 1: blocks in clusters of KS,
// at least KS chunks of BK columns a row (kernels-cuda `args::wgmma_shape`).
template <bool BF16, int S, int BN, int BK, int KS>
__device__ __forceinline__ void wg_affine_gemm(const AffineArgs& a, const WgTmap* map) {
    __shared__ __align__(8) uint64_t full[S];  // stage s holds its chunk's activations
    using St = WgStage<BN, BK>;
    static_assert(S >= 3, "a stage in use, one being decoded, one filling");
    static_assert(KS == 1 || S * St::BYTES >= (BN / 8) * 16 * WG_THREADS, "the stages hold the partial sums");
    constexpr uint32_t MAGIC = BF16 ? 0x43004300u : 0x64006400u;
    constexpr int STEPS = BK / 16, NACC = BN / 2;
    constexpr int CN = WG_BM * (BK / 32) / WG_THREADS;
    static_assert(CN * WG_THREADS == WG_BM * (BK / 32), "whole copies");
    extern __shared__ uint8_t wg_sm_raw[];
    uint8_t* sm = wg_sm_raw + ((1024u - (hc_smem(wg_sm_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rank = KS > 1 ? hc_cluster_rank() : 0;
    const int rb = (blockIdx.x / KS) * WG_BM, m0 = blockIdx.y * BN;
    // This block's chunks: c0 .. c0 + chunks − 1 of the row's.
    const int c0 = rank * (a.cols / BK) / KS, chunks = (rank + 1) * (a.cols / BK) / KS - c0;
    // This thread's copies of a chunk's codes (weight rows past the last read the last one;
    // their sums are never stored): sources at chunk 0, destinations in a stage. The
    // activations: BK / 64 boxes of the map (activation rows past the batch read as zeros).
    const uint8_t* cs[CN];
    int cd[CN];
#pragma unroll
    for (int i = 0; i < CN; i++) {
        const int e = tid + i * WG_THREADS, r = e / (BK / 32), p = e % (BK / 32);
        cs[i] = a.codes + (long long)min(rb + r, a.rows - 1) * (a.cols / 2) + c0 * (BK / 2) + 16 * p;
        cd[i] = St::XST + r * St::CROW + 16 * p;
    }
    if (tid == 0) {
#pragma unroll
        for (int i = 0; i < S; i++) wg_bar_init(&full[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int c) {
        uint8_t* st = sm + (c % S) * St::BYTES;
        if (tid == 0) {
            wg_bar_expect(&full[c % S], BN * BK * 2);
#pragma unroll
            for (int j = 0; j < BK / 64; j++) wg_tma2d(st + j * BN * 128, map, (c0 + c) * BK + 64 * j, m0, &full[c % S]);
        }
#pragma unroll
        for (int i = 0; i < CN; i++) hc_cp16(st + cd[i], cs[i] + c * (BK / 2));
    };
    // This warp's tile of 16 rows: where its scale pairs start (hc_si of row g, group 0).
    const int tile = min((rb + 16 * warp) >> 4, (a.rows - 1) >> 4);
    const long long sidx = (long long)tile * a.srs * 16 + 2 * g;
    const int per_group = a.glen / BK;  // chunks a group
    // The scale and offset pairs as loaded, in two slots: those of the group starting at chunk c
    // in slot c mod 2 (the main loop's two bodies name them statically), loaded two chunks
    // before its terms are made (chunks 0 and 1: at the prologue). With the conversion next to
    // the load, every warp waited for it there: groups of one chunk ran 25–35 % slower.
    struct Raw {
        uint2 s, o;
    };
    Raw r0{}, r1{};
    // Whether this block's chunk c starts a group (or is its first chunk), and that group's load.
    auto starts = [&](int c) { return c == 0 || (c0 + c) % per_group == 0; };
    auto load = [&](Raw& r, int c) {
        const int grp = (c0 + c) / per_group;
        r.s = wg_raw_of(a.scales, a.sdtype, sidx, grp);
        if (a.offsets) r.o = wg_raw_of(a.offsets, a.sdtype, sidx, grp);
    };
    HcTerms tm[2];
    // Chunk c's terms where it starts a group (r: slot c mod 2), then chunk c + 2's load where
    // that one starts a group (whether or not c does: groups of 3 chunks and more).
    auto terms_for = [&](int c, Raw& r) {
        if (starts(c)) {
            const float2 ps = wg_pair_from(a.sdtype, r.s);
            const float2 po = a.offsets ? wg_pair_from(a.sdtype, r.o) : make_float2(0.f, 0.f);
            tm[0] = hc_terms<BF16>(ps.x * a.qmul, po.x - ps.x * a.qbias);
            tm[1] = hc_terms<BF16>(ps.y * a.qmul, po.y - ps.y * a.qbias);
        }
        if (c + 2 < chunks && starts(c + 2)) load(r, c + 2);
    };
    const uint32_t sel = t | (t << 4) | ((4 + t) << 8) | ((4 + t) << 12);
    const int cw_off = St::XST + (16 * warp + g) * St::CROW;
    // Every step's fragments of chunk c (its codes in): rows g, g + 8, words 2s and 2s + 1.
    auto decode = [&](int c, uint32_t(&f)[STEPS][4]) {
        const uint8_t* cw = sm + (c % S) * St::BYTES + cw_off;
#pragma unroll
        for (int s = 0; s < STEPS; s += 2) {
            const uint4 w0 = *reinterpret_cast<const uint4*>(cw + 8 * s);
            const uint4 w1 = *reinterpret_cast<const uint4*>(cw + 8 * St::CROW + 8 * s);
            f[s][0] = hc_dequant2<BF16>(wg_pair(w0.x, sel, MAGIC), tm[0]);
            f[s][1] = hc_dequant2<BF16>(wg_pair(w1.x, sel, MAGIC), tm[1]);
            f[s][2] = hc_dequant2<BF16>(wg_pair(w0.y, sel, MAGIC), tm[0]);
            f[s][3] = hc_dequant2<BF16>(wg_pair(w1.y, sel, MAGIC), tm[1]);
            f[s + 1][0] = hc_dequant2<BF16>(wg_pair(w0.z, sel, MAGIC), tm[0]);
            f[s + 1][1] = hc_dequant2<BF16>(wg_pair(w1.z, sel, MAGIC), tm[1]);
            f[s + 1][2] = hc_dequant2<BF16>(wg_pair(w0.w, sel, MAGIC), tm[0]);
            f[s + 1][3] = hc_dequant2<BF16>(wg_pair(w1.w, sel, MAGIC), tm[1]);
        }
    };
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = 0.f;
    uint32_t fa[STEPS][4], fb[STEPS][4];
    // Chunk c's wgmmas on fragments cur; then, while they run, chunk c + 1 into nxt (read by
    // chunk c − 1's, which are waited for). Stage (c − 1) mod S is refilled with chunk c + S − 1
    // once both warpgroups are past chunk c − 1.
    auto step = [&](int c, uint32_t(&cur)[STEPS][4], uint32_t(&nxt)[STEPS][4], Raw& rn) {
        const uint64_t d0 = wg_desc(sm + (c % S) * St::BYTES);
        wg_bar_wait(&full[c % S], (c / S) & 1);  // chunk c's activations are in
#pragma unroll
        for (int i = 0; i < NACC; i++) wg_keep(acc[i]);
        wg_fence();
#pragma unroll
        for (int s = 0; s < STEPS; s++)
            wg_mma<BN, BF16>(acc, cur[s], d0 + (uint64_t)((s >> 2) * (BN * 128 / 16) + 2 * (s & 3)));
        wg_commit();
#pragma unroll
        for (int i = 0; i < NACC; i++) wg_keep(acc[i]);
        if (c + 1 < chunks) {
            wg_wait<1>();
            hc_cp_wait<S - 3>();
            __syncthreads();  // chunk c + 1's codes are in; chunk c − 1's wgmmas are done in both warpgroups
            if (c + S - 1 < chunks) issue(c + S - 1);
            hc_cp_commit();
            terms_for(c + 1, rn);
            decode(c + 1, nxt);
        }
    };
    if (chunks > 0) {  // (the host gives every block of a cluster some)
#pragma unroll
        for (int i = 0; i < S - 1; i++) {
            if (i < chunks) issue(i);
            hc_cp_commit();
        }
        load(r0, 0);
        if (chunks > 1 && starts(1)) load(r1, 1);
        hc_cp_wait<S - 2>();
        __syncthreads();
        terms_for(0, r0);
        decode(0, fa);
        for (int c = 0; c < chunks; c += 2) {
            step(c, fa, fb, r1);
            if (c + 1 < chunks) step(c + 1, fb, fa, r0);
        }
        wg_wait<0>();
        hc_cp_wait<0>();
    }
#pragma unroll
    for (int i = 0; i < NACC; i++) wg_keep(acc[i]);
    if (KS > 1) {
        // Partial sums to this block's shared memory (piece i of every thread, then piece i + 1:
        // a thread reads its own pieces in the others), then this block's outputs: the
        // 8-activation-row columns j with j mod KS = rank, summed over the cluster in rank order.
        float4* part = reinterpret_cast<float4*>(sm);
        __syncthreads();  // no wgmma reads the stages any more
#pragma unroll
        for (int j = 0; j < BN / 8; j++) part[j * WG_THREADS + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        hc_cluster_sync();
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            if (j % KS != rank) continue;
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int q = 0; q < KS; q++) {
                const float4 v = q == rank ? make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3])
                                           : hc_ld_cluster(part + j * WG_THREADS + tid, q);
                sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
            }
            acc[4 * j] = sum.x, acc[4 * j + 1] = sum.y, acc[4 * j + 2] = sum.z, acc[4 * j + 3] = sum.w;
        }
        hc_cluster_sync();  // every read of this block's partial sums is done before it exits
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = rb + 16 * warp + g + 8 * (e >> 1), m = m0 + 8 * j + 2 * t + (e & 1);
            if (r < a.rows && m < a.M && (KS == 1 || j % KS == rank))
                hc_store(a.y, a.ydtype, (long long)m * a.rows + r, acc[4 * j + e] + (a.bias ? a.bias[r] : 0.f));
        }
}


// hc_wgmma_b4_s{S}_n{BN}_k{BK}[_x{KS}]_{bf16,f16}: 256 threads, dynamic shared memory S · stage
// + 1024 bytes (kernels-cuda `args::wgmma_shared`; the base is aligned to 1024 in the kernel);
// _x{KS}: clusters of KS blocks along x, which holds KS blocks for each 128 rows. `map`: x as a
// 2-D tensor (columns, then M rows) of the activation type, boxes of 64 columns × BN rows,
// 128-byte swizzle, zeros out of bounds (kernels-cuda `driver::tensor_map_2d`).
#define HC_WGMMA(S, BN, BK, T, BF)                                                                      \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) hc_wgmma_b4_s##S##_n##BN##_k##BK##_##T( \
        AffineArgs a, const __grid_constant__ WgTmap map) {                                             \
        wg_affine_gemm<BF, S, BN, BK, 1>(a, &map);                                                            \
    }
#define HC_WGMMA_X(S, BN, BK, KS, T, BF)                                                         \
    extern "C" __global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__(WG_THREADS, 1)       \
        hc_wgmma_b4_s##S##_n##BN##_k##BK##_x##KS##_##T(AffineArgs a, const __grid_constant__ WgTmap map) { \
        wg_affine_gemm<BF, S, BN, BK, KS>(a, &map);                                                    \
    }
#define HC_WGMMA_T(T, BF)                                                                     \
    HC_WGMMA(4, 128, 128, T, BF) HC_WGMMA(6, 128, 64, T, BF) HC_WGMMA(5, 256, 64, T, BF)  \
    HC_WGMMA_X(4, 128, 128, 2, T, BF) HC_WGMMA_X(6, 128, 64, 2, T, BF) HC_WGMMA_X(5, 256, 64, 2, T, BF)
HC_WGMMA_T(bf16, true)
HC_WGMMA_T(f16, false)

// The tensor-core GEMM of gemm_mma.cuh (mma.sync) split over clusters of KS blocks, for layers
// too short to fill the device with blocks that each walk the whole row; and unsplit with two
// batch tiles. hc_affine_gemm_b{2,4}_r1_n{NT}_x{KS}_{bf16,f16}: 128 threads, dynamic shared
// memory 4 stages as the unsplit GEMM's (kernels-cuda `affine_gemm_shared`).
#define HC_GEMM_X(B, N, KS, T, BF)                                                                             \
    extern "C" __global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__(32 * HC_GEMM_WARPS)                \
        hc_affine_gemm_b##B##_r1_n##N##_x##KS##_##T(AffineArgs a) {                                            \
        hc_affine_gemm<B, BF, 1, N, 4, KS>(a);                                                                  \
    }
#define HC_GEMM_XS(B, T, BF)                                                                                    \
    HC_GEMM_X(B, 2, 1, T, BF) HC_GEMM_X(B, 2, 2, T, BF) HC_GEMM_X(B, 2, 4, T, BF) HC_GEMM_X(B, 2, 8, T, BF)     \
    HC_GEMM_X(B, 4, 2, T, BF) HC_GEMM_X(B, 4, 4, T, BF) HC_GEMM_X(B, 4, 8, T, BF)                               \
    HC_GEMM_X(B, 8, 2, T, BF) HC_GEMM_X(B, 8, 4, T, BF) HC_GEMM_X(B, 8, 8, T, BF)
HC_GEMM_XS(2, bf16, true)
HC_GEMM_XS(4, bf16, true)
HC_GEMM_XS(2, f16, false)
HC_GEMM_XS(4, f16, false)
