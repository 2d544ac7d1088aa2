// Shared helpers of the hypercodec kernels: activation loads and stores in f32/f16/bf16,
// warp reductions. Dtype codes are those of `hypercodec_kernels_cuda::Dtype`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define HC_F32 0
#define HC_F16 1
#define HC_BF16 2

// The bitshift trellis's hashes (`hypercodec_trellis::{CODE,PAIR}_{MUL,ADD}`; a kernels-cuda
// test finds them in the PTX): a state's value under the 1MAD code is the byte sum of
// CODE_MUL·state + CODE_ADD (mod 2^32); under the pair code that gives the first value, and the
// second is the byte sum of PAIR_MUL·x + PAIR_ADD of that first hash x.
constexpr uint32_t HC_CODE_MUL = 34038481u, HC_CODE_ADD = 76625530u;
constexpr uint32_t HC_PAIR_MUL = 0x9E3779B9u, HC_PAIR_ADD = 0x7F4A7C15u;
__device__ __forceinline__ uint32_t hc_code_hash(uint32_t state) { return state * HC_CODE_MUL + HC_CODE_ADD; }
__device__ __forceinline__ uint32_t hc_pair_second(uint32_t x) { return x * HC_PAIR_MUL + HC_PAIR_ADD; }

// Rows of activations the generic GEMV keeps in registers (the host runs larger batches in
// passes of MAX_GEMV_BATCH = 4).
#define HC_MAX_M 4

__device__ __forceinline__ float hc_load(const void* p, int dtype, long long i) {
    if (dtype == HC_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    if (dtype == HC_F16) return __half2float(static_cast<const __half*>(p)[i]);
    return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void hc_store(void* p, int dtype, long long i, float v) {
    if (dtype == HC_BF16) {
        static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    } else if (dtype == HC_F16) {
        static_cast<__half*>(p)[i] = __float2half(v);
    } else {
        static_cast<float*>(p)[i] = v;
    }
}

// Eight consecutive activations from index `i` (a multiple of 8) as f32.
__device__ __forceinline__ void hc_load8(const void* p, int dtype, long long i, float* out) {
    if (dtype == HC_F32) {
        const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
        float4 a = q[0], b = q[1];
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
        return;
    }
    uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (dtype == HC_BF16) {
            __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&w[k]);
            float2 f = __bfloat1622float2(h);
            out[2 * k] = f.x;
            out[2 * k + 1] = f.y;
        } else {
            __half2 h = *reinterpret_cast<__half2*>(&w[k]);
            float2 f = __half22float2(h);
            out[2 * k] = f.x;
            out[2 * k + 1] = f.y;
        }
    }
}

// Four consecutive activations from index `i` (a multiple of 4; 16-byte aligned rows) as f32.
__device__ __forceinline__ void hc_load4(const void* p, int dtype, long long i, float* out) {
    if (dtype == HC_F32) {
        const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
        out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
        return;
    }
    const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
    uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const float2 f = dtype == HC_BF16 ? __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w[k]))
                                          : __half22float2(*reinterpret_cast<__half2*>(&w[k]));
        out[2 * k] = f.x;
        out[2 * k + 1] = f.y;
    }
}

__device__ __forceinline__ bool hc_aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Stores `n` (≤ 8) values from index `i`; one or two 16-byte stores when `aligned` (i a
// multiple of 8, n = 8, the buffer 16-byte aligned).
__device__ __forceinline__ void hc_store8(void* p, int dtype, long long i, const float* v, int n, bool aligned) {
    if (aligned && n == 8) {
        if (dtype == HC_F32) {
            float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
            q[0] = make_float4(v[0], v[1], v[2], v[3]);
            q[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (dtype == HC_BF16) {
                    __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
                    w[k] = *reinterpret_cast<uint32_t*>(&h);
                } else {
                    __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
                    w[k] = *reinterpret_cast<uint32_t*>(&h);
                }
            }
            *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
    }
    for (int k = 0; k < n; k++) hc_store(p, dtype, i + k, v[k]);
}

__device__ __forceinline__ float hc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// splitmix64's output function (`hypercodec_lattice::rht::mix64`).
__device__ __forceinline__ unsigned long long hc_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Whether position `j` of a row is negated by the RHT of `seed` (part of the format).
__device__ __forceinline__ bool hc_rht_neg(unsigned long long seed, long long j) {
    unsigned long long w = hc_mix64(seed + (unsigned long long)(j / 64 + 1) * 0x9E3779B97F4A7C15ull);
    return (w >> (j % 64)) & 1ull;
}
