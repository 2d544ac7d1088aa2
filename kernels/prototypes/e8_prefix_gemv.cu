// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): entropy-coded E8 GEMV at
// batch 1 with lane-interleaved prefix codes, the coder shape docs/eval/cuda_rans.md asks for
// (the committed rANS step costs about 79 warp instructions a symbol). Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/e8p.cubin kernels/prototypes/e8_prefix_gemv.cu
// count its instructions with `python py/benches/cuda_e8_prefix_prototype.py --sass .dev/e8p.cubin`,
// and time it on a GPU with `python py/benches/cuda_e8_prefix_prototype.py .dev/e8p.cubin`.
//
// The device code is kernels/e8_prefix.cuh, shared with the committed kernels
// (kernels/e8_prefix.cu, the format's 8-row layout); this file instantiates the prototype's
// variants, including a one-row layout the format does not store, for timing them against each
// other. Its format and encoder are modelled in py/benches/_e8prefix.py (the committed format,
// `Coding::Prefix`, writes the same streams for the 8-row layout). Variants: singles (L = 8, 10,
// 12; `l8c16`/`l8c32` with interleaved table copies against bank conflicts), pairs
// (`pairs11`/`pairs12`: 5 lookups a word), and the 8-row layout (`r8_…`) whose stream also
// feeds the tensor cores (`…_mma`, batches up to 16) and a bf16 decoder (`…_decode`).
//
// The same source compiles for the host under kernels/prototypes/host_simt.h: `--host` of the
// script above runs it there against the numpy model, and `--dry-run` runs the script's GPU
// mode with it, without a GPU.
#include "e8_prefix.cuh"

// Launched with 1024 · warps + 4 · entries · copies bytes of dynamic shared memory (the rings,
// then the tables) and at most 16 warps a block.
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_l8(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_l10(E8PrefixArgs a) { hc_e8_prefix<10, 3, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_l12(E8PrefixArgs a) { hc_e8_prefix<12, 2, 0>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_l8c16(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0, 16>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_l8c32(E8PrefixArgs a) { hc_e8_prefix<8, 4, 0, 32>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_l8(E8PrefixArgs a) { hc_e8_prefix_r8<8, 4, 0, 1, false>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_l8c32(E8PrefixArgs a) { hc_e8_prefix_r8<8, 4, 0, 32, false>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs12(E8PrefixArgs a) { hc_e8_prefix_r8<8, 0, 12, 1, false>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_l8_mma(E8PrefixArgs a) { hc_e8_prefix_r8<8, 4, 0, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_l8c32_mma(E8PrefixArgs a) { hc_e8_prefix_r8<8, 4, 0, 32, true>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs12_mma(E8PrefixArgs a) { hc_e8_prefix_r8<8, 0, 12, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_l8_decode(E8PrefixArgs a) { hc_e8_prefix_r8_decode<8, 4, 0, 1>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs12_decode(E8PrefixArgs a) { hc_e8_prefix_r8_decode<8, 0, 12, 1>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_pairs11(E8PrefixArgs a) { hc_e8_prefix<8, 0, 11>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_pairs12(E8PrefixArgs a) { hc_e8_prefix<8, 0, 12>(a); }
// Two chunks a warp (row groups g and g + 1, two bit strings a lane; the committed
// hc_e8p_gemv2_* run the same code): 2 KB of rings a warp. `_d2w8`: at most 8 warps a block.
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs12_d2(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12>(a); }
extern "C" __global__ void __launch_bounds__(256, 4) hc_e8_prefix_r8_pairs12_d2w8(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs11(E8PrefixArgs a) { hc_e8_prefix_r8<8, 0, 11, 1, false>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs11_d2(E8PrefixArgs a) { hc_e8_prefix_r8_d2<11>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) hc_e8_prefix_r8_pairs12_d2_mma(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12, true>(a); }
extern "C" __global__ void __launch_bounds__(512, 1) hc_e8_prefix_r8_pairs12_d2_mma1(E8PrefixArgs a) { hc_e8_prefix_r8_d2<12, true>(a); }
