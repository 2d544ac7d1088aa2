// The bitshift-trellis encoder on the GPU: the Viterbi search of `hypercodec_trellis::Encoder`,
// one block per tail-biting sequence, operation for operation the CPU's (the same fused
// multiply-adds, the same tagged minima, the same renormalization), so where the search's
// decisions fit in shared memory the bits are the CPU's, bit for bit.
//
// The search, per value: `G[j]`, for each of the 2^(L−K) groups `j` of states that share
// their low L − K bits (their successors' predecessors), is the group's least tagged cost (a
// non-negative f32 whose low K bits hold which of the 2^K predecessors it came from). The next
// value's group `j'` is the least, over its 2^K states `s = t·2^(L−K) + j'`, of
// `tag(fma(d, d, G[s >> K] − S), t)` with `d = fma(−sum(s), c1, x + 510·c1)`: only the group
// minima are ever stored (2^(L−K) words), the state costs never are.
//
// A thread owns `rpt` runs of 2^K consecutive groups (run `T + threads·r`): the runs' 2^K
// predecessor words per state column are loaded once, the run's 2^K results are stored as one
// vector, and the run's tags (its back pointers) land in one ring word per thread and step.
//
// The back pointers of `ring` values stay in shared memory (K bits per group and value: 4 KiB
// a value at L = 16). A sequence shorter than the ring is searched once and traced back from
// its cheapest end. A longer one writes its back pointers to the caller's scratch (4 KiB a
// value at L = 16, K = 2: 64 GB for a 4096² tensor, 14 ms of HBM bandwidth) and is traced
// back stretch by stretch through the ring. Where that scratch would be too large (sequences
// of whole long rows), it is searched three times instead: a forward pass that stores the
// group costs every `w1` values (checkpoints), then, for each stretch of `w1` from the last, a
// pass from its checkpoint that stores them every `w2` values, and for each stretch of `w2`
// from the last a pass from its checkpoint that keeps the back pointers, traced back from the
// state the later stretch started from. Either way the result is the CPU's. (Survivor paths
// of this code take about 128 values to merge at L = 16, K = 2, so deciding values from a
// ring of a few dozen instead would cost about a dB.)
//
// The pair code (`V = 2`, `hc_trellis_encode_k{1,2}_v2`) runs the same search a step of two
// values at a time, with `K` the step's 2K bits: each state's cost adds the second value's
// squared error, its sum from the pair's second hash, as the CPU's pair step does.
#include "common.cuh"

// Field for field `args::TrellisEncodeArgs`.
struct TrellisEncodeArgs {
    const float* x;       // rows × cols values (about unit variance), row after row
    uint8_t* bits;        // rows × row_bytes: the packed bits, LSB-first
    uint32_t* scratch;    // per block: the checkpoints of sequences longer than the ring
    long long row_bytes;
    long long scratch_stride;  // words of scratch per block
    int rows;
    int cols;
    int seq;              // values per sequence (a multiple of 8; the last takes the rest)
    int per_row;          // sequences per row: max(1, cols / seq)
    int l;                // state bits L
    int ring;             // values of back pointers held
    int w1;               // values between the forward pass's checkpoints (a multiple of w2)
    int w2;               // values between the second passes' checkpoints (a multiple of 8, < ring)
    int rpt;              // runs of 2^K groups per thread
    int global_bp;        // 1: longer sequences keep every back pointer in scratch (else checkpoints)
    float c1;             // scale / 147.8
    float c0;             // −510·c1
};

// Warp minima of the newest group costs (by step parity), the renormalization by step parity,
// the block's argmin keys, and the thread-0 results of a pass.
__shared__ uint32_t hc_te_wmin[2][32];
__shared__ float hc_te_sub[2];
__shared__ unsigned long long hc_te_key[32];
__shared__ int hc_te_boundary;
__shared__ double hc_te_cost;

template <int K> struct HcTe {
    static constexpr int FAN = 1 << K;
    // Runs per thread at most: a thread's back pointers of a value (rpt·2^K·K bits) fill at
    // most one 64-bit ring word.
    static constexpr int RMAX = K == 1 ? 32 : K == 2 ? 8 : K == 3 ? 2 : 1;
    typedef unsigned long long Word;
};

// The least (cost, group) over the groups, to thread 0 (every thread calls it).
template <int K>
__device__ unsigned long long hc_te_argmin(const uint32_t* G, int groups) {
    unsigned long long best = ~0ull;
    for (int j = threadIdx.x; j < groups; j += blockDim.x) {
        unsigned long long k = ((unsigned long long)G[j] << 32) | (uint32_t)j;
        best = k < best ? k : best;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long v = __shfl_xor_sync(0xffffffffu, best, o);
        best = v < best ? v : best;
    }
    if ((threadIdx.x & 31) == 0) hc_te_key[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) best = hc_te_key[w] < best ? hc_te_key[w] : best;
    }
    return best;
}

// Thread 0: traces the path that is in state `s` after value `e` back to value `b`, writing
// the symbols of values `b ..= e` to `sym` and, when `mark` is among them, the low L − K bits
// of its state to `*marked`. Returns the state before value `b` (read from the back pointers
// of value `b`, which the pass's start wrote).
template <int K>
__device__ uint32_t hc_te_trace(const typename HcTe<K>::Word* ring, int ring_len, int threads, int tshift,
                                int lb, uint32_t s, int e, int b, uint8_t* sym, int mark, int* marked) {
    constexpr int FAN = HcTe<K>::FAN;
    const uint32_t low = (1u << lb) - 1;
    for (int m = e; m >= b; m--) {
        sym[m - b] = (uint8_t)(s & (FAN - 1));
        if (m == mark) *marked = (int)(s & low);
        const uint32_t j = s >> K;
        const uint32_t run = j >> K;
        const int owner = (int)(run & (uint32_t)(threads - 1));
        const int r = (int)(run >> tshift);
        const unsigned long long w = ring[(size_t)(m % ring_len) * threads + owner];
        const uint32_t t = (uint32_t)(w >> ((r * FAN + (int)(j & (FAN - 1))) * K)) & (FAN - 1);
        s = (t << lb) | j;
    }
    return s;
}

// Thread 0: packs `count` K-bit symbols (each most significant bit first) into the LSB-first
// stream at `out` (which starts on a byte; spare bits of a last partial byte are zero).
template <int K>
__device__ void hc_te_emit(uint8_t* out, const uint8_t* sym, int count) {
    uint32_t acc = 0;
    int have = 0, o = 0;
    for (int v = 0; v < count; v++) {
#pragma unroll
        for (int b = K - 1; b >= 0; b--) {
            acc |= (uint32_t)((sym[v] >> b) & 1) << have;
            if (++have == 8) {
                out[o++] = (uint8_t)acc;
                acc = 0;
                have = 0;
            }
        }
    }
    if (have > 0) out[o] = (uint8_t)acc;
}

// The group costs a search holds in shared memory, and what a pass of it needs.
template <int K, int V> struct HcTeSearch {
    const TrellisEncodeArgs& a;
    uint32_t* G;                          // the group costs: two buffers of `groups`
    typename HcTe<K>::Word* ring;         // back pointers, `a.ring` values × threads
    typename HcTe<K>::Word* bp;           // where the passes write them: `ring`, or scratch
    int bp_len;                           // values `bp` holds (value m at m % bp_len)
    const float* __restrict__ xs;         // the sequence
    int xlen;                             // its values
    int before;                           // ≥ 0: the boundary pass's rotation, in steps of V values
    int lb, groups, runs, T, threads, tshift, nwarps;

    __device__ HcTeSearch(const TrellisEncodeArgs& a_, uint32_t* G_, typename HcTe<K>::Word* ring_,
                          const float* xs_, int xlen_, int before_)
        : a(a_), G(G_), ring(ring_), bp(ring_), bp_len(a_.ring), xs(xs_), xlen(xlen_), before(before_) {
        lb = a.l - K;
        groups = 1 << lb;
        runs = groups >> K;
        T = threadIdx.x;
        threads = blockDim.x;
        tshift = __ffs(threads) - 1;
        nwarps = threads >> 5;
    }

    // The group costs value `i` reads (those after value i − 1): two buffers, by parity.
    __device__ uint32_t* costs(int i) const { return G + (size_t)(i & 1) * groups; }

    // Value `i` of the pass (step i / V's value i % V).
    __device__ float x_at(int i) const {
        const int bv = before * V;
        const int idx = before >= 0 ? (i < bv ? xlen - bv + i : i - bv) : i;
        return __ldg(xs + idx);
    }

    // Block-wide: the state before value `b` — the pass's start (`ck` null: the groups whose
    // low bits are `fixed`, or all, at cost 1), or a checkpoint (`G` after value b − 1, then
    // the subtraction of value b) — with the back pointers of value `b` and the minimum the
    // renormalization of value b + 1 needs.
    __device__ void start(int b, int fixed, const uint32_t* ck) {
        constexpr uint32_t TM = HcTe<K>::FAN - 1;
        uint32_t* G = costs(b);
        if (!ck) {
            const uint32_t forbidden = __float_as_uint(1e30f) & ~TM;
            for (int j = T; j < groups; j += threads) G[j] = (fixed < 0 || j == fixed) ? 0x3F800000u : forbidden;
            bp[T] = 0;
            if (T < 32) {
                hc_te_wmin[0][T] = 0xFFFFFFFFu;
                hc_te_wmin[1][T] = T == 0 ? 0x3F800000u : 0xFFFFFFFFu;
            }
            if (T == 0) hc_te_sub[0] = 0.f;
            __syncthreads();
            return;
        }
        for (int j = T; j < groups; j += threads) G[j] = ck[j];
        if (T == 0) hc_te_sub[b & 1] = __uint_as_float(ck[groups]);
        __syncthreads();
        typename HcTe<K>::Word tags = 0;
        uint32_t lmin = 0xFFFFFFFFu;
        if (T < runs) {
            for (int r = 0; r < a.rpt; r++) {
                const int run = T + threads * r;
                for (int u = 0; u < HcTe<K>::FAN; u++) {
                    const uint32_t g = G[run * HcTe<K>::FAN + u];
                    tags |= (typename HcTe<K>::Word)(g & TM) << ((r * HcTe<K>::FAN + u) * K);
                    lmin = min(lmin, g);
                }
            }
        }
        bp[(size_t)(b % bp_len) * threads + T] = tags;
        lmin = __reduce_min_sync(0xffffffffu, lmin);
        if ((T & 31) == 0) hc_te_wmin[(b - 1) & 1][T >> 5] = lmin;
        __syncthreads();
    }

    // Block-wide: values `b ..= e`, from the state `start` left; the back pointers of each
    // value into the ring; with `ck`, the state after every `w`-th value (but the last) into
    // it. Returns (thread 0) the sum of the subtractions (the costs' offset).
    __device__ double steps(int b, int e, uint32_t* ck, int w) {
        constexpr int FAN = HcTe<K>::FAN, RMAX = HcTe<K>::RMAX;
        typedef typename HcTe<K>::Word Word;
        constexpr uint32_t TM = FAN - 1;
        const bool active = T < runs;
        const int R = bp_len, rpt = a.rpt;
        // The 1MAD state of state s = t·groups + j', j' = run·2^K + u, run = T + threads·r:
        // the L-bit reversal of s is a sum of disjoint bit fields, so its product with the
        // multiplier is a sum of per-run, per-u and per-t terms.
        const int rsh = 32 - (lb - K);    // reverses the run index's lb − K bits
        const uint32_t mul_run = HC_CODE_MUL << K, mul_u = HC_CODE_MUL << lb;
        const float off = -a.c0;
        double offset = 0.0;
        float xnext = x_at(V * b), xnext2 = V == 2 ? x_at(V * b + 1) : 0.f;
        for (int i = b; i <= e; i++) {
            const uint32_t* Gp = costs(i);
            uint32_t* Gn = costs(i + 1);
            // Warp 0: the subtraction of value i + 1 — the least cost before value i (whose
            // warp minima the previous value wrote), less the subtraction of value i, less one
            // (the CPU's `sub`).
            const float sub = hc_te_sub[i & 1];
            if (T < 32) {
                uint32_t v = T < nwarps ? hc_te_wmin[(i - 1) & 1][T] : 0xFFFFFFFFu;
                v = __reduce_min_sync(0xffffffffu, v);
                if (T == 0) {
                    hc_te_sub[(i + 1) & 1] = (__uint_as_float(v & ~TM) - sub) - 1.0f;
                    offset += (double)sub;
                }
            }
            const float xc = xnext + off, xc2 = xnext2 + off;
            if (i < e) {
                xnext = x_at(V * (i + 1));
                if (V == 2) xnext2 = x_at(V * (i + 1) + 1);
            }
            Word tags = 0;
            float lmin = __uint_as_float(0x7F800000u);
            if (active) {
                // One run at a time (its 2^K × 2^K states unrolled): few live registers, so
                // the compiler interleaves the independent chains.
#pragma unroll 1
                for (int r = 0; r < rpt; r++) {
                    {
                        const int run = T + threads * r;
                        const uint32_t xrun = (lb - K > 0 ? (__brev((uint32_t)run) >> rsh) : 0u) * mul_run + HC_CODE_ADD;
                        uint32_t xu[FAN];
                        float best[FAN];
#pragma unroll
                        for (int u = 0; u < FAN; u++) {
                            xu[u] = (__brev((uint32_t)u) >> (32 - K)) * mul_u + xrun;
                            best[u] = __uint_as_float(0x7F800000u);
                        }
#pragma unroll
                        for (int t = 0; t < FAN; t++) {
                            const float bt = __uint_as_float(Gp[t * runs + run] & ~TM) - sub;
                            const uint32_t xt = (__brev((uint32_t)t) >> (32 - K)) * HC_CODE_MUL;
                            // The tag from a register: one LOP3 (LUT 0xEA: (a & b) | c) for
                            // (cost & ~TM) | t.
                            uint32_t treg;
                            asm("mov.b32 %0, %1;" : "=r"(treg) : "r"((uint32_t)t));
#pragma unroll
                            for (int u = 0; u < FAN; u++) {
                                const uint32_t h = xu[u] + xt;
                                const float sum = __uint_as_float(__dp4a(h, 0x01010101u, 0x4B000000u)) - 8388608.f;
                                const float d = fmaf(-sum, a.c1, xc);
                                float c = fmaf(d, d, bt);
                                if constexpr (V == 2) {
                                    // The pair's second value: its hash from the first's.
                                    const float sum2 =
                                        __uint_as_float(__dp4a(hc_pair_second(h), 0x01010101u, 0x4B000000u)) -
                                        8388608.f;
                                    const float d2 = fmaf(-sum2, a.c1, xc2);
                                    c = fmaf(d2, d2, c);
                                }
                                uint32_t tagged;
                                asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(tagged) : "r"(__float_as_uint(c)), "n"(~TM), "r"(treg));
                                best[u] = fminf(best[u], __uint_as_float(tagged));
                            }
                        }
                        uint32_t* g = Gn + (size_t)run * FAN;
#pragma unroll
                        for (int u = 0; u < FAN; u += (FAN >= 4 ? 4 : FAN)) {
                            if constexpr (FAN >= 4) {
                                *reinterpret_cast<uint4*>(g + u) =
                                    make_uint4(__float_as_uint(best[u]), __float_as_uint(best[u + 1]),
                                               __float_as_uint(best[u + 2]), __float_as_uint(best[u + 3]));
                            } else {
                                *reinterpret_cast<uint2*>(g + u) =
                                    make_uint2(__float_as_uint(best[u]), __float_as_uint(best[u + 1]));
                            }
                        }
#pragma unroll
                        for (int u = 0; u < FAN; u++) {
                            tags |= (Word)(__float_as_uint(best[u]) & TM) << ((r * FAN + u) * K);
                            lmin = fminf(lmin, best[u]);
                        }
                    }
                }
            }
            bp[(size_t)((i + 1) % R) * threads + T] = tags;
            const uint32_t wmin = __reduce_min_sync(0xffffffffu, __float_as_uint(lmin));
            if ((T & 31) == 0) hc_te_wmin[i & 1][T >> 5] = wmin;
            __syncthreads();
            if (ck && i < e && (i + 1 - b) % w == 0) {
                uint32_t* c = ck + (size_t)((i + 1 - b) / w - 1) * (groups + 4);
                for (int j = T; j < groups; j += threads) c[j] = Gn[j];
                if (T == 0) c[groups] = __float_as_uint(hc_te_sub[(i + 1) & 1]);
            }
        }
        return offset;
    }

    // Block-wide: the path's end after the last value (to thread 0): the cheapest state (the
    // first on ties), or the cheapest whose low bits close the loop; its tagged cost too.
    __device__ uint32_t end(int e, int fixed, uint32_t* cost) {
        constexpr uint32_t TM = HcTe<K>::FAN - 1;
        const uint32_t* G = costs(e + 1);
        if (fixed >= 0) {
            *cost = G[fixed];
            return (*cost & TM) << lb | (uint32_t)fixed;
        }
        const unsigned long long k = hc_te_argmin<K>(G, groups);
        *cost = (uint32_t)(k >> 32);
        return (*cost & TM) << lb | (uint32_t)(k & 0xFFFFFFFFu);
    }
};

// One Viterbi pass over `n` steps of V values (value `i` is `xs[i]`, or with `before` ≥ 0 the
// sequence `xs[xlen − V·before ..] ++ xs[..]`: the boundary-crossing pass). `fixed` < 0 starts
// from every state; else only from states whose low L − K bits are `fixed`, and only ends with
// them count. Writes the symbols to `out` (unless null); leaves in shared memory (from thread
// 0) the low bits of the path's state after step `before − 1` and, for a sequence within the
// ring, the path's cost.
template <int K, int V>
__device__ __forceinline__ void hc_te_pass(const TrellisEncodeArgs& a, uint32_t* G, typename HcTe<K>::Word* ring,
                                           uint8_t* sym, uint32_t* scratch, const float* __restrict__ xs, int xlen,
                                           int n, int before, int fixed, uint8_t* out) {
    constexpr uint32_t TM = HcTe<K>::FAN - 1;
    HcTeSearch<K, V> v(a, G, ring, xs, xlen, before);
    const int mark = before - 1;
    if (threadIdx.x == 0) hc_te_boundary = 0;
    // A sequence within the ring: one pass, traced back from its end. Else three passes (see
    // the top of the file): checkpoints of the forward pass (stage 0), then of each stretch
    // of w1 from the last (stage 1), then the back pointers of each stretch of w2 in it from
    // the last, traced back (stage 2). One loop, so the search is inlined once.
    const bool whole = n <= a.ring - 1;
    // Longer sequences with every back pointer in scratch: one pass, then stretches of w2.
    const bool global = !whole && a.global_bp;
    const int w1 = a.w1, w2 = a.w2, slot = v.groups + 4;
    uint32_t* ck1 = scratch;
    uint32_t* ck2 = whole || global ? nullptr : scratch + (size_t)((n - 1) / w1) * slot;
    auto stretches = [&](int seg) { return (min(n, seg * w1 + w1) - 1 - seg * w1) / w2 + 1; };
    int stage = 0, seg = whole ? 0 : (n - 1) / w1, sub = 0;
    uint32_t s = 0, cost = 0;
    for (;;) {
        int b = 0, e = n - 1, w = 0;
        const uint32_t* in = nullptr;
        uint32_t* ck = nullptr;
        if (stage == 0) {
            if (!whole) {
                ck = ck1;
                w = w1;
            }
        } else {
            const int b1 = seg * w1, e1 = min(n, b1 + w1) - 1;
            const uint32_t* in1 = seg > 0 ? ck1 + (size_t)(seg - 1) * slot : nullptr;
            if (stage == 1) {
                b = b1;
                e = e1;
                in = in1;
                ck = ck2;
                w = w2;
            } else {
                b = b1 + sub * w2;
                e = min(e1, b + w2 - 1);
                in = sub > 0 ? ck2 + (size_t)(sub - 1) * slot : in1;
            }
        }
        if (stage == 0 && global) {
            v.bp = reinterpret_cast<typename HcTe<K>::Word*>(scratch);
            v.bp_len = n + 1;
            ck = nullptr;
        }
        v.start(b, fixed, in);
        const double offset = v.steps(b, e, ck, w);
        if (stage == 0) {
            s = v.end(e, fixed, &cost);
            if (threadIdx.x == 0) hc_te_cost = (double)__uint_as_float(cost & ~TM) + offset;
            // Thread 0 has read the end before any thread starts the next search (which
            // rewrites these costs).
            __syncthreads();
        }
        if (global) {
            // Stretches of w2 from the last, copied from scratch into the ring and traced.
            for (int b2 = (n - 1) / w2 * w2; b2 >= 0; b2 -= w2) {
                const int e2 = min(n, b2 + w2) - 1;
                const int words = (e2 - b2 + 1) * v.threads;
                for (int i = threadIdx.x; i < words; i += v.threads) {
                    const int m = b2 + i / v.threads, t = i % v.threads;
                    ring[(size_t)(m % a.ring) * v.threads + t] = v.bp[(size_t)m * v.threads + t];
                }
                __syncthreads();
                if (threadIdx.x == 0) {
                    s = hc_te_trace<K>(ring, a.ring, v.threads, v.tshift, v.lb, s, e2, b2, sym, mark,
                                       &hc_te_boundary);
                    if (out) hc_te_emit<K>(out + (size_t)b2 * K / 8, sym, e2 - b2 + 1);
                }
                __syncthreads();
            }
            return;
        }
        if (stage == 2 || whole) {
            if (threadIdx.x == 0) {
                s = hc_te_trace<K>(ring, a.ring, v.threads, v.tshift, v.lb, s, e, b, sym, mark, &hc_te_boundary);
                if (out) hc_te_emit<K>(out + (size_t)b * K / 8, sym, e - b + 1);
            }
            __syncthreads();
            if (whole) return;
            if (sub > 0) {
                sub--;
                continue;
            }
            if (seg == 0) return;
            seg--;
        }
        if (stage == 1) {
            stage = 2;
        } else {
            stage = stretches(seg) > 1 ? 1 : 2;
            sub = stretches(seg) - 1;
        }
    }
}

// Blocks take sequences `blockIdx.x, + gridDim.x, …` (sequence = row · per_row + j); `K` bits
// a step of `V` values.
template <int K, int V>
__device__ void hc_trellis_encode(const TrellisEncodeArgs& a) {
    typedef typename HcTe<K>::Word Word;
    extern __shared__ __align__(16) unsigned char hc_te_smem[];
    const int lb = a.l - K, groups = 1 << lb;
    uint32_t* G = reinterpret_cast<uint32_t*>(hc_te_smem);
    Word* ring = reinterpret_cast<Word*>(hc_te_smem + (size_t)groups * 8);
    uint8_t* sym = reinterpret_cast<uint8_t*>(ring + (size_t)a.ring * blockDim.x);
    uint32_t* scratch = a.scratch ? a.scratch + (size_t)blockIdx.x * a.scratch_stride : nullptr;
    const long long total = (long long)a.rows * a.per_row;

    for (long long q = blockIdx.x; q < total; q += gridDim.x) {
        const int row = (int)(q / a.per_row), jq = (int)(q % a.per_row);
        const int start = jq * a.seq;
        const int n = jq + 1 == a.per_row ? a.cols - start : a.seq;
        const float* xs = a.x + (long long)row * a.cols + start;
        uint8_t* out = a.bits + (long long)row * a.row_bytes + (long long)(start / V) * K / 8;
        // Few boundaries and a short sequence: a pass from every boundary, the cheapest kept
        // (the first on ties), then its path written. Else the boundary pass over the values
        // around the sequence's boundary (its end, then its start: 64 of each, or the whole
        // sequence rotated by half), then the pass from the boundary it found. One call site,
        // so the pass is inlined once. Counted in values here (as the CPU does), in steps by
        // the passes.
        const bool every = groups <= 64 && n <= 128;
        const int w = 64;
        const int rn = every ? n : n > 2 * w ? 2 * w : n;
        const int rbefore = every ? -1 : n > 2 * w ? w : n - n / 2 / V * V;
        const int passes = every ? groups + 1 : 2;
        double best = 0.0;
        int best_start = 0, boundary = 0;
        for (int p = 0; p < passes; p++) {
            const bool last = p + 1 == passes;
            const int fixed = every ? (last ? best_start : p) : (last ? boundary : -1);
            hc_te_pass<K, V>(a, G, ring, sym, scratch, xs, n, (last ? n : rn) / V,
                             last || rbefore < 0 ? -1 : rbefore / V, fixed, last ? out : nullptr);
            if (every && !last) {
                const double c = hc_te_cost;
                if (p == 0 || c < best) {
                    best = c;
                    best_start = p;
                }
            }
            boundary = hc_te_boundary;
            __syncthreads();
        }
    }
}

#define HC_TE_KERNEL(K) \
    extern "C" __global__ void __launch_bounds__(512, 1) hc_trellis_encode_k##K(TrellisEncodeArgs a) { \
        hc_trellis_encode<K, 1>(a); \
    }
HC_TE_KERNEL(1)
HC_TE_KERNEL(2)
HC_TE_KERNEL(3)
HC_TE_KERNEL(4)
// The pair code (`V = 2`) at K bits a value: a step of 2K bits. K = 3 and 4 would fan out to
// 64 and 256 predecessors a state, past the ring's 64-bit words: they encode on the CPU. At
// K = 2 a block has at most 2^(L−8) ≤ 256 threads (one run each), so the bound leaves each
// 255 registers: the 16 states' chains of a run with the second hash, without spills.
#define HC_TE_PAIR_KERNEL(K, THREADS) \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) hc_trellis_encode_k##K##_v2(TrellisEncodeArgs a) { \
        hc_trellis_encode<2 * K, 2>(a); \
    }
HC_TE_PAIR_KERNEL(1, 512)
HC_TE_PAIR_KERNEL(2, 256)
