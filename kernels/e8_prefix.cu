// Entropy-coded E8 in the format's prefix codes (`Coding::Prefix`, hypercodec_rice::prefix),
// decoded inside the GEMV: chunks of eight rows (where a row is one segment, of rows_per_chunk / 8
// groups of eight rows), a warp each; lane 4n + q decodes word q of each 32-column block of the
// group's row n (see e8_prefix.cuh). One stream, three consumers:
// - hc_e8p_gemv_*: y = ½·s_r·⟨2p_r, x'⟩ for one activation row (x' = RHT(x), f32; FFMA);
// - hc_e8p_mma_*: the same for 1–16 rows on the tensor cores (x' as f16, M × cols; the doubled
//   coordinates are f16-exact up to 2048, far above any the tables hold);
// - hc_e8p_decode_{bf16,f16,f32}_*: the scaled weights (rotated domain, rows × cols) for a GEMM.
// y is f32, M × rows. Forms: l8, l10, l12 (singles of at most 8, 10, 12 bits, refills every 4, 3,
// 2 symbols) and p11, p12 (8-bit singles, pairs of at most 11 or 12 bits). Needs cols % 32 == 0.
// Launched with 1024 · warps + 4 · entries bytes of dynamic shared memory (the warps' rings, then
// the tables: 3 << L entries, or 768 + 4 << LP with pairs), at most 16 warps a block; the GEMV
// and mma blocks take whole groups of `segments` warps (chunks of several groups: a warp each).
#include "e8_prefix.cuh"

#define HC_E8P_FORM(NAME, L, G, LP)                                                                     \
    extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_gemv_##NAME(E8PrefixArgs a) {         \
        hc_e8_prefix_r8<L, G, LP, 1, false>(a);                                                       \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_mma_##NAME(E8PrefixArgs a) {          \
        hc_e8_prefix_r8<L, G, LP, 1, true>(a);                                                        \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_decode_bf16_##NAME(E8PrefixArgs a) {  \
        hc_e8_prefix_r8_decode<L, G, LP, 1, 0>(a);                                                    \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_decode_f16_##NAME(E8PrefixArgs a) {   \
        hc_e8_prefix_r8_decode<L, G, LP, 1, 1>(a);                                                    \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_decode_f32_##NAME(E8PrefixArgs a) {   \
        hc_e8_prefix_r8_decode<L, G, LP, 1, 2>(a);                                                    \
    }

HC_E8P_FORM(l8, 8, 4, 0)
HC_E8P_FORM(l10, 10, 3, 0)
HC_E8P_FORM(l12, 12, 2, 0)
HC_E8P_FORM(p11, 8, 0, 11)
HC_E8P_FORM(p12, 8, 0, 12)

// The pair forms, two chunks a warp: row groups g and g + 1 of one segment, two bit strings a lane
// decoded side by side (hc_e8_prefix_r8_d2); gemv2 at one activation row (FFMA), mma2 at 1–16 on
// the tensor cores (85 registers where 64 spill: one block of 16 warps an SM). Launched with
// 2048 · warps + 4 · entries bytes (two rings a warp), `segments` warps a pair of groups, at most
// 16 warps.
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_gemv2_p11(E8PrefixArgs a) { hc_e8_prefix_r8_d2<11>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8p_gemv2_p12(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) hc_e8p_mma2_p11(E8PrefixArgs a) { hc_e8_prefix_r8_d2<11, true>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) hc_e8p_mma2_p12(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12, true>(a); }
