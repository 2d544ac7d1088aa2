"""The batch-1 INT4 kernel (`hc_affine_cpa`) on a grid of fewer blocks than row tiles, each block's
warp rings running on across its tiles (`kernels/prototypes/cpa_tiles.cu`), against the committed
PTX and torch bf16 `F.linear`, in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/cpat.cubin kernels/prototypes/cpa_tiles.cu   # here
    python py/benches/cuda_cpa_tiles.py .dev/gpu/cpat.cubin [--out FILE]                            # on the GPU

Random INT4 g128 codes (row-major, as stored) with f16 scales in tiles of 16 rows and no offsets
(the `int4` spec's device form). Each call is checked against x·Ŵᵀ in float32 and timed as 40
launches in a CUDA graph over ≥ 400 MB of weight copies (L2 never holds them), median of 7
replays (`_graph_timing.graph_time_us`). A prototype's grid is named by blocks a multiprocessor
(`× n SMs`, at most what fits, from the driver's occupancy) or `tiles` (one block a tile, as
committed).
"""

from __future__ import annotations

import argparse
import ctypes as C
import itertools
import sys

import torch
import torch.nn.functional as F
from _driver import AffineArgs as Args
from _driver import Driver, int4_copies, print_table
from _graph_timing import graph_time_us

STAGE = 1408  # sizeof(HcCpaStage<4>)
VARIANTS = [(8, 3), (8, 4), (4, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", help="kernels/prototypes/cpa_tiles.cu built for sm_90")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--shapes", default="28672x4096,32000x4096,14336x4096,6144x4096,4096x4096,4096x14336,8192x8192,28672x8192")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_cpa_tiles: no CUDA device; nothing to do")
        return 0
    drv = Driver({"proto": args.cubin})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    committed = drv.fn("ptx", "hc_affine_cpa_b4_bf16")
    drv.check(drv.cu.cuFuncSetAttribute(committed, 8, 8 * (3 * STAGE + 64)), "max dynamic shared memory")
    kernels = [("committed PTX (8 warps × 3 stages, a block a tile)", committed, 8, 8 * (3 * STAGE + 64), None)]
    for nw, s in VARIANTS:
        f = drv.fn("proto", f"hc_cpat_w{nw}_s{s}")
        smem = nw * s * STAGE + 2 * nw * 64
        drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem), "max dynamic shared memory")
        fit = C.c_int()
        drv.check(drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(fit), f, 32 * nw, C.c_size_t(smem)), "occupancy")
        per_sm = sorted({fit.value, max(1, fit.value - 1)})
        kernels.append((f"{nw} × {s}, a block a tile", f, nw, smem, 0))
        kernels += [(f"{nw} × {s}, {k} × {sms} SMs", f, nw, smem, k * sms) for k in per_sm]
    torch.manual_seed(0)
    rows_out = []
    for shape in args.shapes.split(","):
        n_rows, k = (int(v) for v in shape.split("x"))
        steps, glen = k // 128, 128
        tiles = (n_rows + 15) // 16
        w, sct, wd = int4_copies(n_rows, k)
        copies = len(w)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n_rows, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ wd.T
        kept = []  # ctypes values must outlive the graph's capture

        def args_for(i: int) -> Args:
            a = Args(w[i].data_ptr(), sct[i].data_ptr(), None, x.data_ptr(), y.data_ptr(), None,
                     w[i].numel(), 2, 2, 1, n_rows, k, 4, glen, steps, 1.0, 8.0, 7, 1)
            kept.append(a)
            return a

        for name, f, nw, smem, grid in kernels:
            blocks = tiles if not grid else min(tiles, grid)
            calls = itertools.count()

            def make(i: int, f=f, nw=nw, smem=smem, blocks=blocks) -> None:
                drv.launch(f, blocks, 32 * nw, [args_for(i)], smem)

            us = graph_time_us(lambda: make(next(calls) % copies), 40, replays=7)
            y.fill_(float("nan"))
            make(0)
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            rows_out.append((shape, f"{name} [{blocks} blocks]", us, err))
        wb = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(int(400e6 // (n_rows * k * 2)) + 1)]
        bf16_calls = itertools.count()
        rows_out.append((shape, "torch bf16 F.linear",
                         graph_time_us(lambda: F.linear(x, wb[next(bf16_calls) % len(wb)]), 40, replays=7), 0.0))
        del w, sct, wb
        torch.cuda.empty_cache()
    print_table(rows_out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
