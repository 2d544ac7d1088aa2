// Entropy-coded E8 decoded inside the GEMV: lane-interleaved prefix codes, one E8 word a lane
// (`hypercodec_rice::prefix`; the format is `Coding::Prefix` in crates/hwz/README.md). Shared by
// the committed kernels (e8_prefix.cu: the 8-row layout the format stores) and the prototype
// (prototypes/e8_prefix_gemv.cu, which also times a one-row layout the format does not store).
//
// One warp decodes one chunk; each lane decodes whole words, symbol after symbol:
// - a word's first symbol from the context-0 table, the others from the tables of the word's
//   coset c (bit 5 of the first entry), each with one lookup of the buffer's next L bits (pairs:
//   one lookup of an 8-byte entry per pair of coordinates);
// - an entry is the doubled coordinate as f32 bits with the code length in bits 0–4 and the
//   coordinate's parity in bit 5: the GEMV and tensor cores multiply by `e` as it is (within
//   2^-17 of the coordinate, HC_EP_VALUE), the decoders write `e & ~63`, and the funnel shifts
//   that consume the code take the length from the entry's low 5 bits (wrap mode);
// - the lane's bit buffer is hi:lo with a marker 1 below the valid bits, so the lane holds fewer
//   than 32 bits exactly when lo is 0; at the format's checks those lanes take the chunk's next
//   words in lane order (a ballot's prefix count) from the warp's ring in shared memory (cp.async
//   keeps it at least 160 words ahead), and the new word goes under the valid bits: with m the
//   marker (hi's lowest set bit), w·m as a 64-bit product is the word at the marker's place;
// - s₇ = 2t + p is rebuilt from the first entry (4t + c) and the parity p of s₀…s₆ (the entries'
//   bit 5, xor-accumulated). Reads never leave the chunk's words (past its end they read 0).
//
// The same source compiles for the host under prototypes/host_simt.h (one thread a lane, the
// warp's votes, shuffles and mma.sync through barriers): py/benches/cuda_e8_prefix_prototype.py
// `--host` runs it there, and `--format` runs the committed kernels on the streams the Rust
// encoder writes, without a GPU.
#pragma once
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

// Words a warp's ring in shared memory holds: the chunk's words are copied in (cp.async) in
// groups of 64, at least 160 words (three groups) ahead of the reads, so a refill reads shared
// memory and no register ever waits on a global load.
#define HC_EP_RING 256
// Warps a block has at most.
#define HC_EP_WARPS 16

#ifdef __CUDA_ARCH__
typedef uint32_t HcSmem;  // a shared-memory address
__device__ __forceinline__ uint32_t hc_ep_lds(HcSmem base, uint32_t off) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(base + off));
    return v;
}
__device__ __forceinline__ void hc_ep_lds2(HcSmem base, uint32_t off, uint32_t& x, uint32_t& y) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "r"(base + off));
}
// base + (v >> SH) · 2^K as a shift and one LEA (ptxas otherwise shifts, masks and adds).
template <int SH, int K>
__device__ __forceinline__ uint32_t hc_ep_at(uint32_t v, uint32_t base) {
    uint32_t r;
    asm("{\n\t.reg .u32 t;\n\tshr.u32 t, %1, %2;\n\tmad.lo.u32 %0, t, %3, %4;\n\t}"
        : "=r"(r) : "r"(v), "n"(SH), "n"(1 << K), "r"(base));
    return r;
}
// Opaque to the compiler, so that it keeps the table's address in a register instead of
// rebuilding it (three instructions) in every trip.
__device__ __forceinline__ HcSmem hc_ep_smem(const uint32_t* p) {
    uint32_t a;
    asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"((uint32_t)__cvta_generic_to_shared(p)));
    return a;
}
#else
template <int SH, int K>
inline uint32_t hc_ep_at(uint32_t v, uint32_t base) { return base + ((v >> SH) << K); }
typedef const uint32_t* HcSmem;
inline uint32_t hc_ep_lds(HcSmem base, uint32_t off) { return base[off / 4]; }
inline void hc_ep_lds2(HcSmem base, uint32_t off, uint32_t& x, uint32_t& y) { x = base[off / 4], y = base[off / 4 + 1]; }
inline HcSmem hc_ep_smem(const uint32_t* p) { return p; }
#endif

// Dynamic shared memory: the warps' word rings (1 KB each, so a ring's address is base | offset;
// one a warp, two for the kernels of two chunks a warp), then the tables (the pair tables take
// 67 KB at 12 bits). A block is launched with 1024 · rings · warps + 4 · entries · copies bytes.
#ifdef __CUDA_ARCH__
extern __shared__ __align__(4 * HC_EP_RING) uint32_t hc_ep_dyn[];
#else
alignas(4 * HC_EP_RING) static uint32_t hc_ep_dyn[2 * HC_EP_WARPS * HC_EP_RING + (3 << 8) * 32 + (4 << 12)];
inline void hc_ep_cp4(uint32_t dst, const uint32_t* src, bool ok) { hc_ep_dyn[dst / 4] = ok ? *src : 0u; }
inline uint32_t hc_ep_ring_lds(uint32_t addr) { return hc_ep_dyn[addr / 4]; }
#endif
// The tables: after the block's rings (`rings` a warp).
__device__ __forceinline__ uint32_t* hc_ep_tables(int rings = 1) {
    return hc_ep_dyn + HC_EP_RING * rings * (blockDim.x >> 5);
}

__device__ __forceinline__ float hc_ep_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#ifdef __CUDA_ARCH__
// Two floats as f16x2 (lo in the low half).
__device__ __forceinline__ uint32_t hc_ep_h2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// c += A·B, mma.m16n8k16 (f16 inputs, f32 accumulators; PTX ISA fragment layouts).
__device__ __forceinline__ void hc_ep_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint4 hc_ep_ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// Two floats as bf16x2 (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t hc_ep_bf2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#else
inline uint32_t hc_ep_h2(float lo, float hi) { return hc_host::h2(lo, hi); }
inline void hc_ep_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { hc_host::mma16816(c, a, b0, b1); }
inline uint4 hc_ep_ldg16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
inline uint32_t hc_ep_bf2(float lo, float hi) { return hc_host::bf16(lo) | (uint32_t)hc_host::bf16(hi) << 16; }
#endif

struct E8PrefixArgs {
    const uint32_t* words;     // the chunks' words, end to end
    const uint32_t* index;     // chunks + 1 word offsets
    const uint32_t* table;     // the decode tables (_e8prefix: Model.table, PairModel.table)
    const float* row_scales;   // per row: y = ½ · scale · Σ doubled coordinate · x
    const float* xr;           // RHT(x): cols f32 (the mma kernels: M × cols f16)
    float* y;                  // M × rows of y_dtype (the decoders: rows × cols of theirs)
    const float* bias;         // rows f32 or null
    long long nwords;
    int rows, cols, rows_per_chunk, chunks;
    int segments, seg_blocks;  // rows8 layouts: column segments a row (a warp each), 32-column blocks a segment
    int M;                     // the mma kernels: activation rows, 1..16
    int y_dtype;               // the GEMV and mma kernels' y: 0 f32, 1 f16, 2 bf16 (rounded to nearest even)
};

// y[i] = v as a.y_dtype.
__device__ __forceinline__ void hc_ep_store_y(const E8PrefixArgs& a, long long i, float v) {
#ifdef __CUDA_ARCH__
    if (a.y_dtype == 1) {
        reinterpret_cast<__half*>(a.y)[i] = __float2half_rn(v);
    } else if (a.y_dtype == 2) {
        reinterpret_cast<__nv_bfloat16*>(a.y)[i] = __float2bfloat16_rn(v);
    } else {
        a.y[i] = v;
    }
#else
    if (a.y_dtype == 1) {
        reinterpret_cast<uint16_t*>(a.y)[i] = (uint16_t)hc_host::h2(v, 0.f);
    } else if (a.y_dtype == 2) {
        reinterpret_cast<uint16_t*>(a.y)[i] = hc_host::bf16(v);
    } else {
        a.y[i] = v;
    }
#endif
}

struct Lane {
    uint32_t hi, lo;       // the bit buffer with its marker
    uint32_t ring;         // this warp's ring (its address, 1 KB aligned: base | offset)
    uint32_t pos4;         // 4 × words taken, mod the ring (warp-uniform)
    int ahead;             // words asked for and not taken (warp-uniform)
    int left;              // this lane's next fetch: words of the chunk from it on (≤ 0: none)
    const uint32_t* src;   // its address
};

#ifdef __CUDA_ARCH__
// 4 bytes global → shared, zero-filled when !ok (nothing read then).
__device__ __forceinline__ void hc_ep_cp4(uint32_t dst, const uint32_t* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void hc_ep_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void hc_ep_wait2() { asm volatile("cp.async.wait_group 2;" ::: "memory"); }
__device__ __forceinline__ void hc_ep_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ uint32_t hc_ep_ring_lds(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
#else
// On the host a ring "address" is a byte offset into hc_ep_dyn.
inline void hc_ep_cp4(uint32_t dst, const uint32_t* src, bool ok);
inline uint32_t hc_ep_ring_lds(uint32_t addr);
inline void hc_ep_commit() {}
inline void hc_ep_wait2() {}
inline void hc_ep_wait0() {}
#endif

#define HC_EP_RING_MASK (4 * HC_EP_RING - 4)

// Warp w's ring: its shared-memory address (the host: its byte offset in hc_ep_dyn).
__device__ __forceinline__ uint32_t hc_ep_ring_of(int w) {
#ifdef __CUDA_ARCH__
    uint32_t a;
    asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"((uint32_t)__cvta_generic_to_shared(hc_ep_dyn + HC_EP_RING * w)));
    return a;
#else
    return 4u * HC_EP_RING * (uint32_t)w;
#endif
}

// Asks for the chunk's next 64 words (zeros past its end) into the ring, at pos + ahead.
__device__ __forceinline__ void hc_ep_fetch(Lane& s) {
    const uint32_t at = s.pos4 + 4u * (uint32_t)(s.ahead + (int)(threadIdx.x & 31));
    // With !ok nothing is read (src-size 0).
    hc_ep_cp4(s.ring | (at & HC_EP_RING_MASK), s.src, s.left > 0);
    hc_ep_cp4(s.ring | ((at + 128u) & HC_EP_RING_MASK), s.src + 32, s.left > 32);
    hc_ep_commit();
    s.src += 64;
    s.left -= 64;
    s.ahead += 64;
}

// A lane's state at the start of a chunk of `len` words from `pl`; `ring` is its warp's ring.
__device__ __forceinline__ void hc_ep_start(Lane& s, uint32_t ring, const uint32_t* pl, int len) {
    const int lane = threadIdx.x & 31;
    s.hi = 0x80000000u, s.lo = 0u;
    s.ring = ring, s.pos4 = 0, s.ahead = 0;
    s.src = pl + lane, s.left = len - lane;
    // The previous chunk's reads are done and its copies (fetched past what it took) have landed,
    // so none of them can land over this chunk's words.
    hc_ep_wait0();
    __syncwarp();
    hc_ep_fetch(s);
    hc_ep_fetch(s);
    hc_ep_fetch(s);
    hc_ep_wait2();
    __syncwarp();  // words 0 … 63 have landed
}

// A lane's state at the start of chunk c of `a` (its offsets clamped to the payload, so that
// reads never leave it).
__device__ __forceinline__ void hc_ep_start_chunk(Lane& s, uint32_t ring, const E8PrefixArgs& a, int c) {
    const long long start = min((long long)a.index[c], a.nwords);
    const long long stop = min((long long)a.index[c + 1], a.nwords);
    hc_ep_start(s, ring, a.words + start, (int)max(stop - start, 0ll));
}

// Consumes the code whose length is the entry's bits 0–4.
__device__ __forceinline__ void hc_ep_consume(Lane& s, uint32_t e) {
    const uint32_t nh = __funnelshift_l(s.lo, s.hi, e);
    s.lo = __funnelshift_l(0u, s.lo, e);
    s.hi = nh;
}

// Keeps the ring ahead of a whole word of at most two checks (64 words): after this, ahead ≥ 192
// and every group but the two newest has landed, so the word's checks (words below pos + 64 ≤
// pos + ahead − 128) are there. The ahead was at least 192 at the previous word and fell by at
// most 64, so one group is enough; the slots it overwrites held words below pos + ahead − 192 ≤
// pos: all taken, by reads the first __syncwarp orders before the copies.
__device__ __forceinline__ void hc_ep_keep_ahead(Lane& s) {
    if (s.ahead < 192) {
        __syncwarp();
        hc_ep_fetch(s);
        hc_ep_wait2();
        __syncwarp();
    }
}

// A refill check. FETCH: keep the ring ahead here (words of more than two checks); else the
// word's caller did, once (hc_ep_keep_ahead).
template <bool TAIL, bool FETCH = true>
__device__ __forceinline__ void hc_ep_refill(Lane& s, bool on, unsigned below) {
    const bool need = (!TAIL || on) && s.lo == 0u;
    const unsigned bal = __ballot_sync(0xffffffffu, need);
    // Words pos … pos + 31 have landed (see below); the lanes that need one take them in order.
    const uint32_t w = hc_ep_ring_lds(s.ring | ((s.pos4 + 4u * __popc(bal & below)) & HC_EP_RING_MASK));
    if (need) {
        const uint32_t m = s.hi & (0u - s.hi);
        const unsigned long long p = (unsigned long long)w * m;
        s.hi = (s.hi ^ m) | (uint32_t)(p >> 31);
        s.lo = 2u * (uint32_t)p + m;  // the bits are disjoint: one IMAD
    }
    const int taken = __popc(bal);
    s.pos4 += 4u * taken;
    s.ahead -= taken;
    if (!FETCH) return;
    // Stay ahead: after this, ahead ≥ 160, and every group but the two newest has landed, so the
    // next check's words (below pos + 32 ≤ pos + ahead − 128) are there. The slots a new group
    // overwrites held words below pos + ahead − 256 < pos − 32: all taken, by reads the first
    // __syncwarp orders before the copies.
    if (s.ahead < 160) {
        __syncwarp();
        hc_ep_fetch(s);
        hc_ep_wait2();
        __syncwarp();
    }
}

// A value's entry bits: the doubled coordinate as f32 (EXACT), or the entry as it is, its low six
// bits (code length, parity) left in the mantissa: at most 63 units in the last place over, 2^-17
// of the value (0 stays a denormal of at most 63 · 2^-149). The products (GEMV, tensor cores) take
// it as is: one instruction a value fewer; the tensor cores' f16 rounding gives back the exact
// coordinate (it lies within half an f16 unit of it), the f32 FFMA sums carry at most 2^-17 of
// each product, far below the bf16 rounding of the activations they multiply (2^-9). (s₇ is the
// first entry plus 2·parity: its error is 2^-17 of that entry, |4t + c| ≤ 3·|s₇|, e.g. −3 + 2.)
// The decoders write exact weights.
#define HC_EP_VALUE(EXACT) ((EXACT) ? ~63u : ~0u)

// The GEMV's products: a·b + c with subnormal inputs and result read as zero (FTZ), so that a zero
// coordinate's entry taken as it is (HC_EP_VALUE) adds exactly nothing.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float hc_ep_fma(float a, float b, float c) {
    float r;
    asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
    return r;
}
#else
inline float hc_ep_ftz(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.f, v) : v; }
inline float hc_ep_fma(float a, float b, float c) { return hc_ep_ftz(std::fmaf(hc_ep_ftz(a), hc_ep_ftz(b), hc_ep_ftz(c))); }
#endif

// One E8 word of lane `s` in singles. `tab` is this lane's copy of the tables: entry i at byte
// 4·C·i (C copies interleaved, see hc_e8_prefix). The word's 8 doubled coordinates go to v.
template <int L, int G, int C, bool TAIL, bool EXACT>
__device__ __forceinline__ void hc_ep_word(Lane& s, HcSmem tab, float (&v)[8], bool on, unsigned below) {
    uint32_t base = 0, par = 0, e0 = 0;
    // Two checks a word (G ≥ 4): the ring is kept ahead once, before the word.
    constexpr bool WORDWISE = G >= 4;
    if (WORDWISE) hc_ep_keep_ahead(s);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i % G == 0) hc_ep_refill<TAIL, !WORDWISE>(s, on, below);
        const uint32_t idx = s.hi >> (32 - L);
        uint32_t e = hc_ep_lds(tab, 4 * C * (base + idx));
        if (TAIL) e = on ? e : 0u;
        hc_ep_consume(s, e);
        if (i == 0) {
            e0 = e;
            base = (((e >> 5) & 1u) + 1u) << L;
        } else {
            v[i - 1] = __uint_as_float(e & HC_EP_VALUE(EXACT));
            par ^= e;
        }
    }
    v[7] = __uint_as_float(e0 & HC_EP_VALUE(EXACT)) + ((par & 32u) ? 2.f : 0.f);
}

// One E8 word in pairs (`_e8prefix.PairModel`): the first symbol (8-bit codes), the pairs
// (s₀, s₁), (s₂, s₃), (s₄, s₅) (LP-bit codes, 8-byte entries: the first coordinate with the
// length and the pair's parity, the second exact), s₆ (8-bit codes under the coset); refills
// before the first symbol (8 + LP ≤ 32 bits follow) and before the second pair (2·LP + 8 ≤ 32).
template <int LP, bool TAIL, bool EXACT>
__device__ __forceinline__ void hc_ep_word_pairs(Lane& s, HcSmem tab, float (&v)[8], bool on, unsigned below) {
    hc_ep_keep_ahead(s);  // two checks a word: the ring is kept ahead once, here
    hc_ep_refill<TAIL, false>(s, on, below);
    uint32_t e0 = hc_ep_lds(tab, 4 * (s.hi >> 24));
    if (TAIL) e0 = on ? e0 : 0u;
    hc_ep_consume(s, e0);
    // The coset's tables (bit 5 of e0): pairs at byte 4 · (768 + (c << (LP + 1))), s₆ at
    // 4 · (256 + (c << 8)); the constant parts go to the loads' immediates.
    const uint32_t pb = (e0 << (LP - 2)) & (1u << (LP + 3));
    const uint32_t lb = (e0 << 5) & (1u << 10);
    uint32_t par = 0;
#pragma unroll
    for (int k = 0; k < 3; k++) {
        if (k == 1) hc_ep_refill<TAIL, false>(s, on, below);
        uint32_t ea, eb;
        hc_ep_lds2(tab, hc_ep_at<32 - LP, 3>(s.hi, pb) + 4u * 768u, ea, eb);
        if (TAIL) ea = on ? ea : 0u;
        hc_ep_consume(s, ea);
        v[2 * k] = __uint_as_float(ea & HC_EP_VALUE(EXACT));
        v[2 * k + 1] = __uint_as_float(eb);
        par ^= ea;
    }
    uint32_t e6 = hc_ep_lds(tab, hc_ep_at<24, 2>(s.hi, lb) + 4u * 256u);
    if (TAIL) e6 = on ? e6 : 0u;
    hc_ep_consume(s, e6);
    v[6] = __uint_as_float(e6 & HC_EP_VALUE(EXACT));
    par ^= e6;
    v[7] = __uint_as_float(e0 & HC_EP_VALUE(EXACT)) + ((par & 32u) ? 2.f : 0.f);
}

// One word of any variant: its values into v (EXACT false: see HC_EP_VALUE).
template <int L, int G, int LP, int C, bool TAIL, bool EXACT = true>
__device__ __forceinline__ void hc_ep_values(Lane& s, HcSmem tab, float (&v)[8], bool on, unsigned below) {
    if constexpr (LP > 0) {
        hc_ep_word_pairs<LP, TAIL, EXACT>(s, tab, v, on, below);
    } else {
        hc_ep_word<L, G, C, TAIL, EXACT>(s, tab, v, on, below);
    }
}

template <int L, int G, int LP, int C, bool TAIL>
__device__ __forceinline__ void hc_ep_dot(Lane& s, HcSmem tab, const float (&x)[8], float& acc, bool on,
                                          unsigned below) {
    float v[8];
    hc_ep_values<L, G, LP, C, TAIL, false>(s, tab, v, on, below);
#pragma unroll
    for (int i = 0; i < 8; i++) acc = hc_ep_fma(v[i], x[i], acc);
}

__device__ __forceinline__ void hc_ep_x(const float* xr, int w, bool on, float (&x)[8]) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 p = on ? __ldg(reinterpret_cast<const float4*>(xr) + 2 * w) : z;
    const float4 q = on ? __ldg(reinterpret_cast<const float4*>(xr) + 2 * w + 1) : z;
    x[0] = p.x, x[1] = p.y, x[2] = p.z, x[3] = p.w, x[4] = q.x, x[5] = q.y, x[6] = q.z, x[7] = q.w;
}

// The tables into shared memory, C interleaved copies (entry i of copy j at C·i + j). C = 1:
// 16-byte loads, four in flight a thread (entries is a multiple of 4, the table 16-byte
// aligned). C > 1: consecutive threads write consecutive words (no bank conflict), reading one
// entry a C-thread group (a broadcast), four loads in flight.
template <int C>
__device__ __forceinline__ void hc_ep_fill(const uint32_t* table, int entries, int rings = 1) {
    uint32_t* tab = hc_ep_tables(rings);
    const int step = blockDim.x;
    if (C == 1) {
        const uint4* t4 = reinterpret_cast<const uint4*>(table);
        uint4* d4 = reinterpret_cast<uint4*>(tab);
        const int n4 = entries >> 2;
        for (int i = threadIdx.x; i < n4; i += 4 * step) {
            uint4 v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = i + k * step < n4 ? __ldg(t4 + i + k * step) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i + k * step < n4) d4[i + k * step] = v[k];
        }
    } else {
        const int n = entries * C;
        for (int i = threadIdx.x; i < n; i += 4 * step) {
            uint32_t v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = i + k * step < n ? __ldg(table + (i + k * step) / C) : 0u;
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i + k * step < n) tab[i + k * step] = v[k];
        }
    }
}

// Every kernel's start: the tables into shared memory, then this lane's copy of them.
template <int L, int LP, int C>
__device__ __forceinline__ HcSmem hc_ep_setup(const E8PrefixArgs& a, int rings = 1) {
    constexpr int entries = LP ? (3 << 8) + (4 << LP) : 3 << L;
    hc_ep_fill<C>(a.table, entries, rings);
    __syncthreads();
    return hc_ep_smem(hc_ep_tables(rings) + (LP ? 0 : (threadIdx.x & 31) % C));
}

// L, G: singles of at most L bits, refills every G symbols; LP > 0: pairs of at most LP bits.
// C: copies of the singles' tables, interleaved (entry i of copy j at u32 C·i + j), lane l
// reading copy l mod C: random lookups from a warp then meet bank conflicts of at most 32 / C
// lanes (C = 32: none), where one copy averages 3.5 wavefronts a lookup.
template <int L, int G, int LP, int C = 1>
__device__ __forceinline__ void hc_e8_prefix(const E8PrefixArgs& a) {
    const HcSmem tabs = hc_ep_setup<L, LP, C>(a);
    const uint32_t ring = hc_ep_ring_of(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u;
    const int wpr = a.cols >> 3, full_steps = wpr >> 5;
    const int warps = blockDim.x >> 5;
    for (int c = blockIdx.x * warps + (threadIdx.x >> 5); c < a.chunks; c += gridDim.x * warps) {
        Lane s;
        hc_ep_start_chunk(s, ring, a, c);
        const int r0 = c * a.rows_per_chunk, r1 = min(r0 + a.rows_per_chunk, a.rows);
        for (int row = r0; row < r1; row++) {
            float acc = 0.f, x[8];
            const float* xp = a.xr + 8 * lane;
            for (int st = full_steps; st > 0; st--, xp += 256) {
                hc_ep_x(xp, 0, true, x);
                hc_ep_dot<L, G, LP, C, false>(s, tabs, x, acc, true, below);
            }
            if (wpr & 31) {
                const int w = (full_steps << 5) + lane;
                hc_ep_x(a.xr, w, w < wpr, x);
                hc_ep_dot<L, G, LP, C, true>(s, tabs, x, acc, w < wpr, below);
            }
            const float t = hc_ep_warp_sum(acc);
            if (lane == 0) hc_ep_store_y(a, row, 0.5f * a.row_scales[row] * t + (a.bias ? a.bias[row] : 0.f));
        }
    }
    hc_ep_wait0();  // no copy outlives the block
}

// ---------------------------------------------------------------------------------------
// The rows8 layout (`_e8prefix.Rows8Layout`): a block of gpb × `segments` warps (at most 16)
// takes gpb groups of 8 rows, warp w group w / segments and that row's segment w % segments of
// 32-column blocks (chunk group · segments + segment). Lane 4n + q decodes word q of each block
// of row n (columns 8q … 8q + 7 of the block) and reads the activations of the same 8 columns:
// f32 for the GEMV (MMA false: FFMA, the 4 lanes of a row summed by two shuffles), f16 M × cols
// for the tensor cores (MMA true, batches up to 16). For mma.m16n8k16 the lane's values 0–3 are
// its B-fragment slots k = 2q, 2q + 1, 2q + 8, 2q + 9 of k-tile 0 (values 4–7: k-tile 1), column
// n, and the activations of rows n and n + 8 at those columns (two 16-byte loads) its A-fragment
// slots of the same k: every lane of group q maps those k to the same 4 columns, so the mma sums
// the block's 32 products in another order and nothing is permuted. The segments' sums meet in
// the warps' rings and are added in warp order (deterministic). Needs cols % 32 == 0, and M ≤ 16
// with doubled coordinates of at most 2048 in magnitude for the tensor cores (f16 holds them
// exactly).
//
// One warp's segment of a group in the rows8 layout: nb blocks from block b0 (see below).
template <int L, int G, int LP, int C, bool MMA, bool TAIL>
__device__ __forceinline__ void hc_ep_r8_span(Lane& s, HcSmem tabs, const E8PrefixArgs& a, int b0, int nb, bool on,
                                              unsigned below, float (&acc)[4]) {
    const int lane = threadIdx.x & 31, n = lane >> 2, q = lane & 3;
    float v[8];
    if (!MMA) {
        const float* xp = a.xr + 32 * b0 + 8 * q;
        for (int j = 0; j < nb; j++, xp += 32) {
            float x[8];
            hc_ep_x(xp, 0, true, x);
            hc_ep_values<L, G, LP, C, TAIL, false>(s, tabs, v, on, below);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[0] = hc_ep_fma(v[i], x[i], acc[0]);
        }
    } else {
        const __half* x16 = reinterpret_cast<const __half*>(a.xr);
        // Activation rows n and n + 8; past the batch a copy of its last row (the products of
        // those rows are never stored), so that every load is unconditional.
        const int last = max(a.M, 1) - 1;  // (launchers never pass M = 0; row 0 then, not −1)
        const __half* xa = x16 + (long long)min(n, last) * a.cols + 32 * b0 + 8 * q;
        const __half* xb = x16 + (long long)min(n + 8, last) * a.cols + 32 * b0 + 8 * q;
        for (int j = 0; j < nb; j++, xa += 32, xb += 32) {
            const uint4 ra = hc_ep_ldg16(xa), rb = hc_ep_ldg16(xb);
            hc_ep_values<L, G, LP, C, TAIL, false>(s, tabs, v, on, below);
            const uint32_t fa[4] = {ra.x, rb.x, ra.y, rb.y}, fb[4] = {ra.z, rb.z, ra.w, rb.w};
            hc_ep_mma(acc, fa, hc_ep_h2(v[0], v[1]), hc_ep_h2(v[2], v[3]));
            hc_ep_mma(acc, fb, hc_ep_h2(v[4], v[5]), hc_ep_h2(v[6], v[7]));
        }
    }
}

// Chunks of several row groups (`span` = rows_per_chunk / 8 > 1, where a row is one segment): a
// warp a chunk, grid-striding; its lanes' bit strings run on from group to group, and it writes
// each group's outputs itself (a row's sum is the warp's alone), no shared sums.
template <int L, int G, int LP, int C, bool MMA>
__device__ __forceinline__ void hc_e8_prefix_r8_spans(const E8PrefixArgs& a, HcSmem tabs) {
    const uint32_t ring = hc_ep_ring_of(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, n = lane >> 2, q = lane & 3;
    const unsigned below = (1u << lane) - 1u;
    const int groups = (a.rows + 7) >> 3, blocks = a.cols >> 5, span = a.rows_per_chunk >> 3;
    const int warps = blockDim.x >> 5;
    for (int c = blockIdx.x * warps + (threadIdx.x >> 5); c < a.chunks; c += gridDim.x * warps) {
        Lane s;
        hc_ep_start_chunk(s, ring, a, c);
        const int g1 = min(c * span + span, groups);
        for (int g = c * span; g < g1; g++) {
            const bool on = g * 8 + n < a.rows, full = g * 8 + 8 <= a.rows;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            if (full) {
                hc_ep_r8_span<L, G, LP, C, MMA, false>(s, tabs, a, 0, blocks, true, below, acc);
            } else {
                hc_ep_r8_span<L, G, LP, C, MMA, true>(s, tabs, a, 0, blocks, on, below, acc);
            }
            if (!MMA) {
                acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 1);
                acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 2);
                const int r = g * 8 + n;
                if (q == 0 && on) hc_ep_store_y(a, r, 0.5f * a.row_scales[r] * acc[0] + (a.bias ? a.bias[r] : 0.f));
            } else {
                // c0, c1: activation row n, rows 2q, 2q + 1 of the group; c2, c3: activation row n + 8.
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int m = n + 8 * (i >> 1), r = g * 8 + 2 * q + (i & 1);
                    if (m < a.M && r < a.rows)
                        hc_ep_store_y(a, (long long)m * a.rows + r,
                                      0.5f * a.row_scales[r] * acc[i] + (a.bias ? a.bias[r] : 0.f));
                }
            }
        }
    }
    hc_ep_wait0();  // no copy outlives the block
}

// A warp's sums of one row group into ring `red` (its copies have all landed): [activation
// row][row of the group], 128 floats at most (c0, c1: activation row n, rows 2q, 2q + 1 of the group; c2, c3:
// activation row n + 8).
template <bool MMA>
__device__ __forceinline__ void hc_ep_r8_sums(float* red, float (&acc)[4]) {
    const int n = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
    if (!MMA) {
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 1);
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], 2);
        if (q == 0) red[n] = acc[0];
    } else {
        red[8 * n + 2 * q] = acc[0];
        red[8 * n + 2 * q + 1] = acc[1];
        red[8 * (n + 8) + 2 * q] = acc[2];
        red[8 * (n + 8) + 2 * q + 1] = acc[3];
    }
}

// The block's outputs of groups base … base + gpb − 1 (at most): each the sum of its `segments`
// warps' sums, in warp order (deterministic), read from ring `ring(gl, w)` of the group's local
// index gl and segment w as hc_ep_r8_sums laid them out.
template <class RingOf>
__device__ __forceinline__ void hc_ep_r8_store(const E8PrefixArgs& a, int base, int gpb, int M, RingOf ring) {
    for (int i = threadIdx.x; i < gpb * 8 * M; i += blockDim.x) {
        const int gl = i / (8 * M), m = (i >> 3) % M, r = (base + gl) * 8 + (i & 7);
        if (r >= a.rows) continue;
        float t = 0.f;
        for (int w = 0; w < a.segments; w++)
            t += reinterpret_cast<const float*>(hc_ep_dyn + HC_EP_RING * ring(gl, w))[8 * m + (i & 7)];
        hc_ep_store_y(a, (long long)m * a.rows + r, 0.5f * a.row_scales[r] * t + (a.bias ? a.bias[r] : 0.f));
    }
}

template <int L, int G, int LP, int C, bool MMA>
__device__ __forceinline__ void hc_e8_prefix_r8(const E8PrefixArgs& a) {
    const HcSmem tabs = hc_ep_setup<L, LP, C>(a);
    if (a.rows_per_chunk > 8) {
        hc_e8_prefix_r8_spans<L, G, LP, C, MMA>(a, tabs);
        return;
    }
    const uint32_t ring = hc_ep_ring_of(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = lane >> 2;
    const unsigned below = (1u << lane) - 1u;
    const int groups = (a.rows + 7) >> 3, blocks = a.cols >> 5;
    // A block holds gpb row groups, `segments` warps each: warp w takes group base + w / segments
    // and its segment w % segments. Every warp runs every trip (the barriers), idle past the end.
    const int gpb = (blockDim.x >> 5) / a.segments, wg = warp / a.segments, seg = warp % a.segments;
    for (int base = blockIdx.x * gpb; base < groups; base += gridDim.x * gpb) {
        const int g = base + wg;
        if (wg < gpb && g < groups) {
            const int c = g * a.segments + seg;
            Lane s;
            hc_ep_start_chunk(s, ring, a, c);
            const int b0 = seg * a.seg_blocks, nb = max(min(a.seg_blocks, blocks - b0), 0);
            const bool on = g * 8 + n < a.rows, full = g * 8 + 8 <= a.rows;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            if (full) {
                hc_ep_r8_span<L, G, LP, C, MMA, false>(s, tabs, a, b0, nb, true, below, acc);
            } else {
                hc_ep_r8_span<L, G, LP, C, MMA, true>(s, tabs, a, b0, nb, on, below, acc);
            }
            // The warp's sums go to its own ring (its copies have all landed).
            hc_ep_wait0();
            __syncwarp();
            hc_ep_r8_sums<MMA>(reinterpret_cast<float*>(hc_ep_dyn + HC_EP_RING * warp), acc);
        }
        __syncthreads();
        const int segs = a.segments;
        hc_ep_r8_store(a, base, gpb, MMA ? min(a.M, 16) : 1, [segs](int gl, int w) { return gl * segs + w; });
        __syncthreads();
    }
}

// Decode for batches above 16 (a GEMM then takes the weights): chunk c of the rows8 layout by
// warp, grid-striding; lane 4n + q writes each of its words scaled (rows × cols at a.y) as bf16
// (OUT 0) or f16 (OUT 1), one 16-byte store a word, or f32 (OUT 2), two. No shared sums: any
// number of warps a block.
template <int L, int G, int LP, int C, int OUT = 0>
__device__ __forceinline__ void hc_e8_prefix_r8_decode(const E8PrefixArgs& a) {
    const HcSmem tabs = hc_ep_setup<L, LP, C>(a);
    const uint32_t ring = hc_ep_ring_of(threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, n = lane >> 2, q = lane & 3;
    const unsigned below = (1u << lane) - 1u;
    const int warps = blockDim.x >> 5, blocks = a.cols >> 5;
    constexpr int P = OUT == 2 ? 2 : 1;  // 16-byte pieces a word
    uint4* out = reinterpret_cast<uint4*>(a.y);  // P pieces a word: P · cols / 8 a row
    const int groups = (a.rows + 7) >> 3, span = max(a.rows_per_chunk >> 3, 1);
    for (int c = blockIdx.x * warps + (threadIdx.x >> 5); c < a.chunks; c += gridDim.x * warps) {
        const int sp = c / a.segments, seg = c % a.segments;
        Lane s;
        hc_ep_start_chunk(s, ring, a, c);
        const int b0 = seg * a.seg_blocks, nb = max(min(a.seg_blocks, blocks - b0), 0);
        // The chunk's groups one after the other (several only where a row is one segment).
        for (int g = sp * span, g1 = min(sp * span + span, groups); g < g1; g++) {
            const int r = g * 8 + n;
            const bool on = r < a.rows, full = g * 8 + 8 <= a.rows;
            const float sc = on ? 0.5f * a.row_scales[r] : 0.f;
            uint4* o = out + P * ((long long)min(r, a.rows - 1) * (a.cols >> 3) + 4 * b0 + q);
            float v[8];
            for (int j = 0; j < nb; j++, o += 4 * P) {
                if (full) {
                    hc_ep_values<L, G, LP, C, false>(s, tabs, v, true, below);
                } else {
                    hc_ep_values<L, G, LP, C, true>(s, tabs, v, on, below);
                }
                if (!on) continue;
                if (OUT == 2) {
                    float4* f = reinterpret_cast<float4*>(o);
                    f[0] = make_float4(sc * v[0], sc * v[1], sc * v[2], sc * v[3]);
                    f[1] = make_float4(sc * v[4], sc * v[5], sc * v[6], sc * v[7]);
                } else if (OUT == 1) {
                    *o = make_uint4(hc_ep_h2(sc * v[0], sc * v[1]), hc_ep_h2(sc * v[2], sc * v[3]),
                                    hc_ep_h2(sc * v[4], sc * v[5]), hc_ep_h2(sc * v[6], sc * v[7]));
                } else {
                    *o = make_uint4(hc_ep_bf2(sc * v[0], sc * v[1]), hc_ep_bf2(sc * v[2], sc * v[3]),
                                    hc_ep_bf2(sc * v[4], sc * v[5]), hc_ep_bf2(sc * v[6], sc * v[7]));
                }
            }
        }
    }
    hc_ep_wait0();
}


// ---------------------------------------------------------------------------------------
// Two chunks a warp in the rows8 layout: the GEMV at batch 1 in pairs (hc_e8p_gemv2_*). Warp w
// of a block takes row groups g and g + 1 (the same segment of each, so the same activations),
// each lane two bit strings decoded side by side: two independent lookup chains a lane, where
// hc_e8_prefix_r8 has one (measured 5–9 % faster on 8192², docs/eval/cuda_rans.md). Each warp
// has two rings (2 KB of dynamic shared memory a warp before the tables). Chunks of one row group
// only (rows_per_chunk 8); a last group without a partner runs the one-chunk span.
//
// One word of each of two lanes in pairs (hc_ep_word_pairs's steps, interleaved, so that the
// two chains share basic blocks and ptxas can overlap them).
template <int LP, bool TAIL, bool EXACT>
__device__ __forceinline__ void hc_ep_word_pairs2(Lane& s, Lane& t, HcSmem tab, float (&v)[8], float (&u)[8], bool on,
                                                  bool onb, unsigned below) {
    hc_ep_keep_ahead(s);
    hc_ep_keep_ahead(t);
    hc_ep_refill<TAIL, false>(s, on, below);
    hc_ep_refill<TAIL, false>(t, onb, below);
    uint32_t e0 = hc_ep_lds(tab, 4 * (s.hi >> 24));
    uint32_t f0 = hc_ep_lds(tab, 4 * (t.hi >> 24));
    if (TAIL) e0 = on ? e0 : 0u, f0 = onb ? f0 : 0u;
    hc_ep_consume(s, e0);
    hc_ep_consume(t, f0);
    const uint32_t pb = (e0 << (LP - 2)) & (1u << (LP + 3)), qb = (f0 << (LP - 2)) & (1u << (LP + 3));
    const uint32_t lb = (e0 << 5) & (1u << 10), mb = (f0 << 5) & (1u << 10);
    uint32_t par = 0, pat = 0;
#pragma unroll
    for (int k = 0; k < 3; k++) {
        if (k == 1) {
            hc_ep_refill<TAIL, false>(s, on, below);
            hc_ep_refill<TAIL, false>(t, onb, below);
        }
        uint32_t ea, eb, fa, fb;
        hc_ep_lds2(tab, hc_ep_at<32 - LP, 3>(s.hi, pb) + 4u * 768u, ea, eb);
        hc_ep_lds2(tab, hc_ep_at<32 - LP, 3>(t.hi, qb) + 4u * 768u, fa, fb);
        if (TAIL) ea = on ? ea : 0u, fa = onb ? fa : 0u;
        hc_ep_consume(s, ea);
        hc_ep_consume(t, fa);
        v[2 * k] = __uint_as_float(ea & HC_EP_VALUE(EXACT));
        v[2 * k + 1] = __uint_as_float(eb);
        u[2 * k] = __uint_as_float(fa & HC_EP_VALUE(EXACT));
        u[2 * k + 1] = __uint_as_float(fb);
        par ^= ea, pat ^= fa;
    }
    uint32_t e6 = hc_ep_lds(tab, hc_ep_at<24, 2>(s.hi, lb) + 4u * 256u);
    uint32_t f6 = hc_ep_lds(tab, hc_ep_at<24, 2>(t.hi, mb) + 4u * 256u);
    if (TAIL) e6 = on ? e6 : 0u, f6 = onb ? f6 : 0u;
    hc_ep_consume(s, e6);
    hc_ep_consume(t, f6);
    v[6] = __uint_as_float(e6 & HC_EP_VALUE(EXACT));
    u[6] = __uint_as_float(f6 & HC_EP_VALUE(EXACT));
    par ^= e6, pat ^= f6;
    v[7] = __uint_as_float(e0 & HC_EP_VALUE(EXACT)) + ((par & 32u) ? 2.f : 0.f);
    u[7] = __uint_as_float(f0 & HC_EP_VALUE(EXACT)) + ((pat & 32u) ? 2.f : 0.f);
}

// Both chunks' words of one segment: FFMA against f32 activations (MMA false: acc[0], accb[0]),
// or the tensor cores (MMA true: f16 activation rows n and n + 8 as A fragments, shared by the
// two groups' B fragments; c0–c3 as in hc_ep_r8_span).
template <int LP, bool MMA, bool TAIL>
__device__ __forceinline__ void hc_ep_r8_span2(Lane& s, Lane& t, HcSmem tabs, const E8PrefixArgs& a, int b0, int nb,
                                               bool on, bool onb, unsigned below, float (&acc)[4], float (&accb)[4]) {
    const int n = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
    float v[8], u[8];
    if (!MMA) {
        const float* xp = a.xr + 32 * b0 + 8 * q;
        for (int j = 0; j < nb; j++, xp += 32) {
            float x[8];
            hc_ep_x(xp, 0, true, x);
            hc_ep_word_pairs2<LP, TAIL, false>(s, t, tabs, v, u, on, onb, below);
#pragma unroll
            for (int i = 0; i < 8; i++) acc[0] = hc_ep_fma(v[i], x[i], acc[0]), accb[0] = hc_ep_fma(u[i], x[i], accb[0]);
        }
    } else {
        const __half* x16 = reinterpret_cast<const __half*>(a.xr);
        const int last = max(a.M, 1) - 1;
        const __half* xa = x16 + (long long)min(n, last) * a.cols + 32 * b0 + 8 * q;
        const __half* xb = x16 + (long long)min(n + 8, last) * a.cols + 32 * b0 + 8 * q;
        for (int j = 0; j < nb; j++, xa += 32, xb += 32) {
            const uint4 ra = hc_ep_ldg16(xa), rb = hc_ep_ldg16(xb);
            hc_ep_word_pairs2<LP, TAIL, false>(s, t, tabs, v, u, on, onb, below);
            const uint32_t fa[4] = {ra.x, rb.x, ra.y, rb.y}, fb[4] = {ra.z, rb.z, ra.w, rb.w};
            hc_ep_mma(acc, fa, hc_ep_h2(v[0], v[1]), hc_ep_h2(v[2], v[3]));
            hc_ep_mma(accb, fa, hc_ep_h2(u[0], u[1]), hc_ep_h2(u[2], u[3]));
            hc_ep_mma(acc, fb, hc_ep_h2(v[4], v[5]), hc_ep_h2(v[6], v[7]));
            hc_ep_mma(accb, fb, hc_ep_h2(u[4], u[5]), hc_ep_h2(u[6], u[7]));
        }
    }
}

template <int LP, bool MMA = false>
__device__ __forceinline__ void hc_e8_prefix_r8_d2(const E8PrefixArgs& a) {
    const HcSmem tabs = hc_ep_setup<8, LP, 1>(a, 2);
    if (a.rows_per_chunk > 8) {  // chunks of several groups (launchers route them elsewhere): a warp each
        hc_e8_prefix_r8_spans<8, 0, LP, 1, MMA>(a, tabs);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = lane >> 2;
    const uint32_t ring = hc_ep_ring_of(2 * warp), ringb = hc_ep_ring_of(2 * warp + 1);
    const unsigned below = (1u << lane) - 1u;
    const int groups = (a.rows + 7) >> 3, blocks = a.cols >> 5;
    // A block holds `pairs` pairs of row groups, `segments` warps each.
    const int pairs = (blockDim.x >> 5) / a.segments, wp = warp / a.segments, seg = warp % a.segments;
    const int gpb = 2 * pairs;
    for (int base = blockIdx.x * gpb; base < groups; base += gridDim.x * gpb) {
        const int g = base + 2 * wp;
        if (wp < pairs && g < groups) {
            const int b0 = seg * a.seg_blocks, nb = max(min(a.seg_blocks, blocks - b0), 0);
            const bool on = g * 8 + n < a.rows, full = g * 8 + 8 <= a.rows;
            float acc[4] = {0.f, 0.f, 0.f, 0.f}, accb[4] = {0.f, 0.f, 0.f, 0.f};
            Lane s;
            hc_ep_start_chunk(s, ring, a, g * a.segments + seg);
            const bool both = g + 1 < groups;
            if (both) {
                Lane t;
                hc_ep_start_chunk(t, ringb, a, (g + 1) * a.segments + seg);
                const bool onb = (g + 1) * 8 + n < a.rows, fullb = (g + 1) * 8 + 8 <= a.rows;
                if (fullb) {
                    hc_ep_r8_span2<LP, MMA, false>(s, t, tabs, a, b0, nb, true, true, below, acc, accb);
                } else {
                    hc_ep_r8_span2<LP, MMA, true>(s, t, tabs, a, b0, nb, true, onb, below, acc, accb);
                }
            } else if (full) {
                hc_ep_r8_span<8, 0, LP, 1, MMA, false>(s, tabs, a, b0, nb, true, below, acc);
            } else {
                hc_ep_r8_span<8, 0, LP, 1, MMA, true>(s, tabs, a, b0, nb, on, below, acc);
            }
            // Group g's sums to the warp's first ring, g + 1's to its second.
            hc_ep_wait0();
            __syncwarp();
            hc_ep_r8_sums<MMA>(reinterpret_cast<float*>(hc_ep_dyn + HC_EP_RING * 2 * warp), acc);
            if (both) hc_ep_r8_sums<MMA>(reinterpret_cast<float*>(hc_ep_dyn + HC_EP_RING * (2 * warp + 1)), accb);
        }
        __syncthreads();
        // Group gl of the block: pair gl / 2, that warp's ring gl % 2.
        const int segs = a.segments;
        hc_ep_r8_store(a, base, gpb, MMA ? min(a.M, 16) : 1,
                       [segs](int gl, int w) { return 2 * ((gl >> 1) * segs + w) + (gl & 1); });
        __syncthreads();
    }
}
