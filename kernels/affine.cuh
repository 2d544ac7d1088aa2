// The affine codes' kernel arguments and the helpers that the kernels of more than one module
// share (gemv.cu; gemm_sm90a.cu, built for Hopper only): the scale layout, cp.async copies,
// and the decode of a fragment register of MAGIC + q pairs to two weights of the activation type.
#pragma once
#include "common.cuh"

struct AffineArgs {
    const uint8_t* codes;
    const void* scales;    // f32, f16 or bf16 (sdtype), tiled (hc_si)
    const void* offsets;   // like scales; null when symmetric
    const void* x;
    void* y;
    const float* bias;  // null when none
    long long n_code_bytes;
    int xdtype, ydtype;
    int M, rows, cols, bits, glen, srs;
    float qmul, qbias;
    int glen_log2;  // log2(glen) when a power of two, else -1
    int sdtype;     // the scales' and offsets' type: 0 f32, 1 f16, 2 bf16 (as stored)
};

// Entry i of a scale or offset array of type a.sdtype, as f32 (16-bit ones are held as stored:
// 4.25 bits per weight at 4 bits in groups of 128, not 4.5).
__device__ __forceinline__ float hc_sval(const AffineArgs& a, const void* p, long long i) {
    if (a.sdtype == 0) return static_cast<const float*>(p)[i];
    const uint16_t h = static_cast<const uint16_t*>(p)[i];
    return a.sdtype == 1 ? __half2float(__ushort_as_half(h)) : __uint_as_float((uint32_t)h << 16);
}
// A 16-bit pair (entries 2k, 2k + 1 of a 32-bit word) as f32.
__device__ __forceinline__ float2 hc_spair16(int sdtype, uint32_t v) {
    if (sdtype == 1) return make_float2(__half2float(__ushort_as_half(v & 0xFFFF)), __half2float(__ushort_as_half(v >> 16)));
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
}

// Where row r's scale (and offset) of group grp sits in the layout the device holds them in
// (kernels-cuda's `tiled_scales`): [⌈rows/16⌉][srs][8][2], rows g and g + 8 of each tile of
// 16 side by side (the rows past the weight's last are zeros); 0 for one tensor-wide scale. A
// warp step of the tensor-core kernel (rows g, g + 8 of one tile, one group) then reads one
// run of 64 bytes per array: as 16 scattered words per row, the scales' loads held the
// batch-1 kernel at about 2× bf16 on an H200 (docs/eval/cuda_int4_variants.md).
__device__ __forceinline__ long long hc_si(const AffineArgs& a, int r, int grp) {
    return a.srs ? ((((long long)(r >> 4) * a.srs + grp) * 8 + (r & 7)) << 1) + ((r >> 3) & 1) : 0;
}

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t hc_lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint32_t hc_smem(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes global → shared, cached in L2 only (codes: read once).
__device__ __forceinline__ void hc_cp16(void* s, const void* g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(hc_smem(s)), "l"(g) : "memory");
}
// 16 or 8 bytes global → shared through L1 (activations and scales: read by every block).
__device__ __forceinline__ void hc_cp16_l1(void* s, const void* g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(hc_smem(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void hc_cp8_l1(void* s, const void* g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(hc_smem(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void hc_cp4_l1(void* s, const void* g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(hc_smem(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void hc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void hc_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// f32 → both halves of a bf16x2 or f16x2 word (round to nearest), and that value back.
template <bool BF16>
__device__ __forceinline__ uint32_t hc_pack2(float v, float& back) {
    uint32_t u;
    if (BF16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        u = __bfloat16_as_ushort(h);
        back = __bfloat162float(h);
    } else {
        const __half h = __float2half_rn(v);
        u = __half_as_ushort(h);
        back = __half2float(h);
    }
    return u | (u << 16);
}

// A group's terms for decoding a fragment register v (MAGIC + q in each half) to ŵ = m·q + c
// with m = s·qmul, c = lo − s·qbias, each carried as a pair hi + lo of the activation type, so
// that ŵ is rounded about as once as the decode route rounds it (one rounded m and c were
// several times less accurate where c is large, as asymmetric codes make it: review).
//   bf16: ŵ = (v·mh + ah) + (v·ml + al) with mh + ml = m and ah + al = c − MAGIC·m (bf16 keeps
//         f32's range, so MAGIC·m cannot overflow);
//   f16:  q = v − MAGIC exactly first (f16 would overflow MAGIC·m = 1024·m for m ≥ 64), then
//         ŵ = (q·mh + ah) + (q·ml + al) with ah + al = c.
struct HcTerms {
    uint32_t mh, ah, ml, al;
};
template <bool BF16>
__device__ __forceinline__ HcTerms hc_terms(float m, float c) {
    HcTerms t;
    float h, l;
    t.mh = hc_pack2<BF16>(m, h);
    t.ml = hc_pack2<BF16>(m - h, l);
    const float cc = BF16 ? c - 128.f * h - 128.f * l : c;
    t.ah = hc_pack2<BF16>(cc, h);
    t.al = hc_pack2<BF16>(cc - h, l);
    return t;
}
template <bool BF16>
__device__ __forceinline__ uint32_t hc_dequant2(uint32_t v, const HcTerms& t) {
    constexpr uint32_t ONES = BF16 ? 0x3F803F80u : 0x3C003C00u;
    uint32_t q = v, hi, lo, d;
    if (BF16) {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(hi) : "r"(q), "r"(t.mh), "r"(t.ah));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(lo) : "r"(q), "r"(t.ml), "r"(t.al));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(hi), "r"(ONES), "r"(lo));
    } else {
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(q) : "r"(v), "r"(ONES), "r"(0xE400E400u));
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(hi) : "r"(q), "r"(t.mh), "r"(t.ah));
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(lo) : "r"(q), "r"(t.ml), "r"(t.al));
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(hi), "r"(ONES), "r"(lo));
    }
    return d;
}

// One m16n8k16 tensor-core MMA, f32 accumulators, bf16 or f16 operands.
template <bool BF16>
__device__ __forceinline__ void hc_mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
    if (BF16) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// N words of 32 bits from p (16-byte aligned for 4, 8-byte for 2).
template <int N>
__device__ __forceinline__ void hc_load_words(const void* p, uint32_t* w) {
    if (N == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if (N == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x; w[1] = v.y;
    } else {
        w[0] = *reinterpret_cast<const uint32_t*>(p);
    }
}
