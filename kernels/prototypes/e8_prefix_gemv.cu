// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): entropy-coded E8 GEMV at
// batch 1 with lane-interleaved prefix codes, the coder shape docs/eval/cuda_rans.md asks for
// (the committed rANS step costs about 79 warp instructions a symbol). Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/e8p.cubin kernels/prototypes/e8_prefix_gemv.cu
// count its instructions with `python py/benches/cuda_e8_prefix_prototype.py --sass .dev/e8p.cubin`,
// and time it on a GPU with `python py/benches/cuda_e8_prefix_prototype.py .dev/e8p.cubin`.
//
// The format and its encoder are modelled in py/benches/_e8prefix.py, whose `emulate` runs these
// steps on the host. One warp decodes one chunk of whole rows; lane l decodes words l, l + 32, …
// of each row, all 8 symbols of a word in turn:
// - a word's first symbol from the context-0 table, the other 7 from table 1 + c (c: the word's
//   coset bit, bit 5 of the first entry), each with one lookup of the buffer's next L bits;
// - an entry is the doubled coordinate as f32 bits with the code length in bits 0–4 and the
//   coordinate's parity in bit 5: `e & ~63` is the FFMA operand, and the funnel shifts that
//   consume the code take the length from the entry's low 5 bits (wrap mode);
// - the lane's bit buffer is hi:lo with a marker 1 below the valid bits, so the lane holds fewer
//   than 32 bits exactly when lo is 0; before symbols 0, G, 2G, … (G·L ≤ 32) those lanes take
//   the chunk's next words in lane order (a ballot's prefix count) from a window of two 32-word
//   registers (a third loading ahead; one shuffle a check), and the new word goes under the valid bits: with m the
//   marker (hi's lowest set bit), w·m as a 64-bit product is the word at the marker's place;
// - s₇ = 2t + p is rebuilt from the first entry (4t + c) and the parity p of s₀…s₆ (the entries'
//   bit 5, xor-accumulated). Reads never leave the chunk's words (past its end they read 0).
//
// The same source compiles for the host under kernels/prototypes/host_simt.h (one thread a lane,
// the warp's votes and shuffles through barriers): `--host` of the script above runs it there
// against the numpy model, without a GPU.
#ifdef __CUDACC__
#include <stdint.h>
#endif

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
// Opaque to the compiler, so that it keeps the table's address in a register instead of
// rebuilding it (three instructions) in every trip.
__device__ __forceinline__ HcSmem hc_ep_smem(const uint32_t* p) {
    uint32_t a;
    asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"((uint32_t)__cvta_generic_to_shared(p)));
    return a;
}
#else
typedef const uint32_t* HcSmem;
inline uint32_t hc_ep_lds(HcSmem base, uint32_t off) { return base[off / 4]; }
inline void hc_ep_lds2(HcSmem base, uint32_t off, uint32_t& x, uint32_t& y) { x = base[off / 4], y = base[off / 4 + 1]; }
inline HcSmem hc_ep_smem(const uint32_t* p) { return p; }
#endif

// The tables, in dynamic shared memory (the pair tables take 67 KB at 12 bits).
#ifdef __CUDA_ARCH__
extern __shared__ uint32_t hc_ep_tab[];
#else
static uint32_t hc_ep_tab[(3 << 8) * 32 + (4 << 12)];
#endif

__device__ __forceinline__ float hc_ep_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

struct E8PrefixArgs {
    const uint32_t* words;     // the chunks' words, end to end
    const uint32_t* index;     // chunks + 1 word offsets
    const uint32_t* table;     // 3 << L entries: contexts 0, 1 (coset 0), 2 (coset 1)
    const float* row_scales;   // per row: y = ½ · scale · Σ doubled coordinate · x
    const float* xr;           // RHT(x): cols f32
    float* y;                  // rows f32
    const float* bias;         // rows f32 or null
    long long nwords;
    int rows, cols, rows_per_chunk, chunks;
};

struct Lane {
    uint32_t hi, lo;          // the bit buffer with its marker
    uint32_t b0, b1, b2;      // the word window: b0, b1 read, b2 loading
    int rel, left;            // left: the chunk's words from b2's next load on, less this lane
    const uint32_t* next;     // this lane's word of b2's next load
};


// Consumes the code whose length is the entry's bits 0–4.
__device__ __forceinline__ void hc_ep_consume(Lane& s, uint32_t e) {
    const uint32_t nh = __funnelshift_l(s.lo, s.hi, e);
    s.lo = __funnelshift_l(0u, s.lo, e);
    s.hi = nh;
}

template <bool TAIL>
__device__ __forceinline__ void hc_ep_refill(Lane& s, bool on, unsigned below) {
    const bool need = (!TAIL || on) && s.lo == 0u;
    const unsigned bal = __ballot_sync(0xffffffffu, need);
    const int off = s.rel + __popc(bal & below);
    // Words rel … rel + 31 of the window: lane j holds the one that is ≡ j (mod 32), in b0 from
    // rel on and in b1 below it, so one shuffle reads it.
    const uint32_t w = __shfl_sync(0xffffffffu, (int)(threadIdx.x & 31) >= s.rel ? s.b0 : s.b1, off);
    if (need) {
        const uint32_t m = s.hi & (0u - s.hi);
        const unsigned long long p = (unsigned long long)w * m;
        s.hi = (s.hi ^ m) | (uint32_t)(p >> 31);
        s.lo = 2u * (uint32_t)p + m;  // the bits are disjoint: one IMAD
    }
    s.rel += __popc(bal);
    if (s.rel >= 32) {
        s.rel -= 32;
        s.b0 = s.b1;
        s.b1 = s.b2;
        s.b2 = s.left > 0 ? *s.next : 0u;
        s.next += 32;
        s.left -= 32;
    }
}

// One E8 word of lane `s`: its dot product with x[0..8) added to acc.
// `tab` is this lane's copy of the tables: entry i at byte 4·C·i (C copies interleaved, see
// hc_e8_prefix).
template <int L, int G, int C, bool TAIL>
__device__ __forceinline__ void hc_ep_word(Lane& s, HcSmem tab, const float (&x)[8], float& acc, bool on,
                                           unsigned below) {
    uint32_t base = 0, par = 0, e0 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i % G == 0) hc_ep_refill<TAIL>(s, on, below);
        const uint32_t idx = s.hi >> (32 - L);
        uint32_t e = hc_ep_lds(tab, 4 * C * (base + idx));
        if (TAIL) e = on ? e : 0u;
        hc_ep_consume(s, e);
        if (i == 0) {
            e0 = e;
            base = (((e >> 5) & 1u) + 1u) << L;
        } else {
            acc = fmaf(__uint_as_float(e & ~63u), x[i - 1], acc);
            par ^= e;
        }
    }
    const float v7 = __uint_as_float(e0 & ~63u) + ((par & 32u) ? 2.f : 0.f);
    acc = fmaf(v7, x[7], acc);
}

// One E8 word in pairs (`_e8prefix.PairModel`): the first symbol (8-bit codes), the pairs
// (s₀, s₁), (s₂, s₃), (s₄, s₅) (LP-bit codes, 8-byte entries: the first coordinate with the
// length and the pair's parity, the second exact), s₆ (8-bit codes under the coset); refills
// before the first symbol (8 + LP ≤ 32 bits follow) and before the second pair (2·LP + 8 ≤ 32).
template <int LP, bool TAIL>
__device__ __forceinline__ void hc_ep_word_pairs(Lane& s, HcSmem tab, const float (&x)[8], float& acc, bool on,
                                                 unsigned below) {
    hc_ep_refill<TAIL>(s, on, below);
    uint32_t e0 = hc_ep_lds(tab, 4 * (s.hi >> 24));
    if (TAIL) e0 = on ? e0 : 0u;
    hc_ep_consume(s, e0);
    const uint32_t c = (e0 >> 5) & 1u;
    const uint32_t pb = 4u * (768u + (c << (LP + 1)));
    const uint32_t lb = 4u * (256u + (c << 8));
    uint32_t par = 0;
#pragma unroll
    for (int k = 0; k < 3; k++) {
        if (k == 1) hc_ep_refill<TAIL>(s, on, below);
        uint32_t ea, eb;
        hc_ep_lds2(tab, pb + 8u * (s.hi >> (32 - LP)), ea, eb);
        if (TAIL) ea = on ? ea : 0u;
        hc_ep_consume(s, ea);
        acc = fmaf(__uint_as_float(ea & ~63u), x[2 * k], acc);
        acc = fmaf(__uint_as_float(eb), x[2 * k + 1], acc);
        par ^= ea;
    }
    uint32_t e6 = hc_ep_lds(tab, lb + 4 * (s.hi >> 24));
    if (TAIL) e6 = on ? e6 : 0u;
    hc_ep_consume(s, e6);
    acc = fmaf(__uint_as_float(e6 & ~63u), x[6], acc);
    par ^= e6;
    const float v7 = __uint_as_float(e0 & ~63u) + ((par & 32u) ? 2.f : 0.f);
    acc = fmaf(v7, x[7], acc);
}

__device__ __forceinline__ void hc_ep_x(const float* xr, int w, bool on, float (&x)[8]) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 p = on ? __ldg(reinterpret_cast<const float4*>(xr) + 2 * w) : z;
    const float4 q = on ? __ldg(reinterpret_cast<const float4*>(xr) + 2 * w + 1) : z;
    x[0] = p.x, x[1] = p.y, x[2] = p.z, x[3] = p.w, x[4] = q.x, x[5] = q.y, x[6] = q.z, x[7] = q.w;
}

// L, G: singles of at most L bits, refills every G symbols; LP > 0: pairs of at most LP bits.
// C: copies of the singles' tables, interleaved (entry i of copy j at u32 C·i + j), lane l
// reading copy l mod C: random lookups from a warp then meet bank conflicts of at most 32 / C
// lanes (C = 32: none), where one copy averages 3.5 wavefronts a lookup.
template <int L, int G, int LP, int C = 1>
__device__ __forceinline__ void hc_e8_prefix(const E8PrefixArgs& a) {
    constexpr int entries = LP ? (3 << 8) + (4 << LP) : 3 << L;
    for (int i = threadIdx.x; i < entries * C; i += blockDim.x) hc_ep_tab[i] = a.table[i / C];
    __syncthreads();
    const HcSmem tabs = hc_ep_smem(hc_ep_tab + (LP ? 0 : (threadIdx.x & 31) % C));
    const int lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u;
    const int wpr = a.cols >> 3, full_steps = wpr >> 5;
    const int warps = blockDim.x >> 5;
    for (int c = blockIdx.x * warps + (threadIdx.x >> 5); c < a.chunks; c += gridDim.x * warps) {
        const long long start = min((long long)a.index[c], a.nwords);
        const long long stop = min((long long)a.index[c + 1], a.nwords);
        Lane s;
        const int len = (int)max(stop - start, 0ll);
        const uint32_t* pl = a.words + start;
        s.b0 = lane < len ? pl[lane] : 0u;
        s.b1 = 32 + lane < len ? pl[32 + lane] : 0u;
        s.b2 = 64 + lane < len ? pl[64 + lane] : 0u;
        s.next = pl + 96 + lane;
        s.left = len - 96 - lane;
        s.rel = 0;
        s.hi = 0x80000000u, s.lo = 0u;
        const int r0 = c * a.rows_per_chunk, r1 = min(r0 + a.rows_per_chunk, a.rows);
        for (int row = r0; row < r1; row++) {
            float acc = 0.f, x[8];
            const float* xp = a.xr + 8 * lane;
            for (int st = full_steps; st > 0; st--, xp += 256) {
                hc_ep_x(xp, 0, true, x);
                if constexpr (LP > 0) {
                    hc_ep_word_pairs<LP, false>(s, tabs, x, acc, true, below);
                } else {
                    hc_ep_word<L, G, C, false>(s, tabs, x, acc, true, below);
                }
            }
            if (wpr & 31) {
                const int w = (full_steps << 5) + lane;
                hc_ep_x(a.xr, w, w < wpr, x);
                if constexpr (LP > 0) {
                    hc_ep_word_pairs<LP, true>(s, tabs, x, acc, w < wpr, below);
                } else {
                    hc_ep_word<L, G, C, true>(s, tabs, x, acc, w < wpr, below);
                }
            }
            const float t = hc_ep_warp_sum(acc);
            if (lane == 0) a.y[row] = 0.5f * a.row_scales[row] * t + (a.bias ? a.bias[row] : 0.f);
        }
    }
}

// Launched with the tables' bytes of dynamic shared memory (4 × entries × copies).
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_l8(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_l10(E8PrefixArgs a) { hc_e8_prefix<10, 3, 0>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_l12(E8PrefixArgs a) { hc_e8_prefix<12, 2, 0>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_l8c16(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0, 16>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_l8c32(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0, 32>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_pairs11(E8PrefixArgs a) { hc_e8_prefix<8, 0, 11>(a); }
extern "C" __global__ void __launch_bounds__(256) hc_e8_prefix_pairs12(E8PrefixArgs a) { hc_e8_prefix<8, 0, 12>(a); }
