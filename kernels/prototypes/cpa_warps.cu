// PROTOTYPE, not built into the PTX (xtask compiles kernels/*.cu only): the committed batch-1
// INT4 kernel (hc_affine_cpa) with more warps per block. Build here with
//   nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/cpaw.cubin kernels/prototypes/cpa_warps.cu
// and time it on a GPU with py/benches/cuda_cpa_warps.py.
//
// Question: a block covers one tile of 16 rows and its warps split the columns, so a short row
// (4096 columns: 32 steps of 128) gives each of 8 warps 4 steps, a chain of about two round
// trips to DRAM behind a 3-stage ring, and 1024 rows give 64 blocks for 132 SMs. With 16 or 32
// warps a block, each warp has 1–2 steps, all in flight from the prologue.
#include "../gemv.cu"

#define CPAW(NW, S)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * NW) hc_cpaw_w##NW##_s##S(AffineArgs a) {       \
        hc_affine_cpa<4, true, NW, S>(a, blockIdx.x);                                                          \
    }
CPAW(8, 3)
CPAW(16, 2)
CPAW(16, 3)
CPAW(32, 1)
CPAW(32, 2)
CPAW(32, 3)
