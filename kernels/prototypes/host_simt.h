// Runs a prototype kernel's source on the host, for checking it without a GPU (not a CUDA
// emulator: only what kernels/prototypes/e8_prefix_gemv.cu uses). One std::thread per thread of
// a block, blocks one after another; the warp's votes and shuffles go through a per-warp slot
// array and barrier, so every lane of a warp must reach each of them, as on the GPU with full
// masks. __shared__ becomes `static` (one block runs at a time).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __syncthreads() hc_host::block_sync()

struct HcDim3 {
    unsigned x = 0, y = 0, z = 0;
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
using __half = uint16_t;
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float4 __ldg(const float4* p) { return *p; }
inline uint32_t __ldg(const uint32_t* p) { return *p; }
inline uint4 __ldg(const uint4* p) { return *p; }
using std::max;
using std::min;

namespace hc_host {
struct Warp {
    std::barrier<> bar{32};
    uint64_t slot[32];
    uint32_t frag[32][6];
};
struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};
inline Block* block = nullptr;
inline thread_local HcDim3 tid;
inline HcDim3 bid, bdim, gdim;
inline void block_sync() { block->bar->arrive_and_wait(); }
// Each lane writes its value, then reads lane `src(lane)`'s.
template <class F>
inline uint64_t exchange(uint64_t v, F src) {
    Warp& w = *block->warps[tid.x / 32];
    const unsigned lane = tid.x & 31;
    w.slot[lane] = v;
    w.bar.arrive_and_wait();
    const uint64_t r = src(w.slot, lane);
    w.bar.arrive_and_wait();
    return r;
}
inline uint32_t h2(float lo, float hi) {
    const _Float16 a = (_Float16)lo, b = (_Float16)hi;
    uint16_t ua, ub;
    std::memcpy(&ua, &a, 2);
    std::memcpy(&ub, &b, 2);
    return (uint32_t)ua | (uint32_t)ub << 16;
}
// f32 → bf16 bits, rounded to nearest even (finite inputs).
inline uint16_t bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float hf(uint32_t w, int upper) {
    const uint16_t u = (uint16_t)(upper ? w >> 16 : w);
    _Float16 h;
    std::memcpy(&h, &u, 2);
    return (float)h;
}
// mma.sync.m16n8k16.row.col f32 += f16·f16 with the PTX ISA's fragment layouts: every lane's
// fragments are exchanged, then each lane sums its own four outputs over k in order.
inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    Warp& w = *block->warps[tid.x / 32];
    const unsigned lane = tid.x & 31;
    for (int i = 0; i < 4; i++) w.frag[lane][i] = a[i];
    w.frag[lane][4] = b0, w.frag[lane][5] = b1;
    w.bar.arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int o = 0; o < 4; o++) {
        const int row = g + (o >= 2 ? 8 : 0), col = 2 * t + (o & 1);
        float acc = c[o];
        for (int k = 0; k < 16; k++) {
            const int al = (row % 8) * 4 + (k % 8) / 2, ar = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const int bl = col * 4 + (k % 8) / 2, br = k >= 8 ? 5 : 4;
            acc += hf(w.frag[al][ar], k & 1) * hf(w.frag[bl][br], k & 1);
        }
        c[o] = acc;
    }
    w.bar.arrive_and_wait();
}
// Runs `kernel()` as a <<<grid, block>>> launch (block a multiple of 32).
inline void launch(unsigned grid, unsigned threads, const std::function<void()>& kernel) {
    gdim = {grid, 1, 1};
    bdim = {threads, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        Block blk;
        blk.bar = std::make_unique<std::barrier<>>(threads);
        for (unsigned w = 0; w < threads / 32; w++) blk.warps.push_back(std::make_unique<Warp>());
        block = &blk;
        bid = {b, 0, 0};
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; t++)
            ts.emplace_back([t, &kernel] {
                tid = {t, 0, 0};
                kernel();
            });
        for (auto& t : ts) t.join();
    }
}
}  // namespace hc_host

#define threadIdx hc_host::tid
#define blockIdx hc_host::bid
#define blockDim hc_host::bdim
#define gridDim hc_host::gdim

inline unsigned __ballot_sync(unsigned, bool p) {
    return (unsigned)hc_host::exchange(p, [](const uint64_t* s, unsigned) {
        uint64_t b = 0;
        for (int i = 0; i < 32; i++) b |= (s[i] & 1) << i;
        return b;
    });
}
inline uint32_t __shfl_sync(unsigned, uint32_t v, int src) {
    return (uint32_t)hc_host::exchange(v, [src](const uint64_t* s, unsigned) { return s[src & 31]; });
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (uint32_t)hc_host::exchange(u, [m](const uint64_t* s, unsigned lane) { return s[(lane ^ m) & 31]; });
    std::memcpy(&v, &u, 4);
    return v;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline void __syncwarp(unsigned = 0xffffffffu) { hc_host::block->warps[hc_host::tid.x / 32]->bar.arrive_and_wait(); }
inline uint32_t __funnelshift_l(uint32_t lo, uint32_t hi, uint32_t s) {
    return (uint32_t)((((uint64_t)hi << 32 | lo) << (s & 31)) >> 32);
}
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
