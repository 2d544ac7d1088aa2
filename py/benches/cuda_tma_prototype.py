"""The Hopper INT4 GEMV prototype (kernels/prototypes/tma_int4_gemv.cu) against the committed
tensor-core kernel and torch bf16 `F.linear`, batch 1, in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/tma.cubin kernels/prototypes/tma_int4_gemv.cu   # here
    python py/benches/cuda_tma_prototype.py .dev/tma.cubin [--out FILE]                           # on the GPU

Random INT4 g128 codes with f32 scales and offsets; the prototype reads them permuted
tile-major (see the kernel's header), the committed kernel (`hc_affine_mma_b4_w4_n1_bf16`
from the committed PTX) as stored, its scales and offsets tiled (kernels-cuda `tiled_scales`).
Each call is checked against x·Ŵᵀ in float32 and timed as
40 launches in a CUDA graph over ≥ 400 MB of weight copies (L2 never holds them), median of 7
replays (`_graph_timing.graph_time_us`). Needs a CUDA device of compute capability 9.0 (exits 0 with a message otherwise).
"""

from __future__ import annotations

import argparse
import ctypes as C
import itertools
import sys

import torch
import torch.nn.functional as F
from _driver import AffineArgs as Args
from _driver import Driver, print_table, tile_scales
from _graph_timing import graph_time_us



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", help="the prototype built for sm_90")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("cuda_tma_prototype: no CUDA device of compute capability 9.0; nothing to do")
        return 0
    drv = Driver({"proto": args.cubin})
    fn = drv.fn

    def launch(f, grid: int, block: int, smem: int, params: list) -> None:
        drv.launch(f, grid, block, params, smem)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    committed = fn("ptx", "hc_affine_mma_b4_w4_n1_bf16")
    torch.manual_seed(0)
    rows_out = []
    for n_rows, k in [(4096, 4096), (8192, 8192), (14336, 4096), (28672, 8192), (8192, 28672)]:
        steps, glen = k // 128, 128
        copies = int(400e6 // (n_rows * k // 2)) + 1
        w = [torch.randint(0, 256, (n_rows, k // 2), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        sc = [torch.rand(n_rows, steps, device="cuda") * 0.01 + 0.001 for _ in range(copies)]
        of = [torch.randn(n_rows, steps, device="cuda") * 0.01 for _ in range(copies)]
        wt = [c.view(n_rows // 16, 2, 8, steps, 4, 16).permute(0, 3, 1, 2, 4, 5).contiguous() for c in w]
        so = [torch.stack([s.view(-1, 16, steps).transpose(1, 2), o.view(-1, 16, steps).transpose(1, 2)], 2).contiguous()
              for s, o in zip(sc, of)]
        q = torch.stack([(w[0].int() >> (4 * i)) & 15 for i in range(2)], -1).reshape(n_rows, k).float()
        wd = (q - 8.0) * sc[0].repeat_interleave(glen, 1) + of[0].repeat_interleave(glen, 1)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n_rows, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ wd.T
        kept = []  # ctypes values must outlive the graph's capture

        def run(make, name: str) -> None:
            calls = itertools.count()
            us = graph_time_us(lambda: make(next(calls) % copies), 40, replays=7)
            y.fill_(float("nan"))
            make(0)
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            rows_out.append((f"{n_rows}x{k}", name, us, err))

        sct, oft = [tile_scales(a) for a in sc], [tile_scales(a) for a in of]

        def make_committed(i: int) -> None:
            a = Args(w[i].data_ptr(), sct[i].data_ptr(), oft[i].data_ptr(), x.data_ptr(), y.data_ptr(), None,
                     w[i].numel(), 2, 2, 1, n_rows, k, 4, glen, steps, 1.0, 8.0, 7)
            kept.append(a)
            launch(committed, n_rows // 16, 256, 0, [a])

        run(make_committed, "committed tensor-core kernel")
        for name, stages, per_sm in [("hc_tma2_s4", 4, 2), ("hc_tma2_s2", 2, 3), ("hc_tma2_move_s4", 4, 2)]:
            smem = 2048 + stages * (8 * 1024 + 8 * 128) + k * 2 + steps * 4
            f = fn("proto", name)
            drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem), "max dynamic shared memory")
            grid = min(n_rows // 16, sms * per_sm)

            def make_proto(i: int, f=f, smem=smem, grid=grid) -> None:
                p = [C.c_void_p(wt[i].data_ptr()), C.c_void_p(so[i].data_ptr()), C.c_void_p(x.data_ptr()),
                     C.c_void_p(y.data_ptr()), C.c_int(n_rows), C.c_int(k)]
                kept.append(p)
                launch(f, grid, 288, smem, p)

            label = "its feed alone (no arithmetic; output not computed)" if "move" in name else \
                f"prototype, {stages} stages, {per_sm} blocks per SM"
            run(make_proto, label)
        wb = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(int(400e6 // (n_rows * k * 2)) + 1)]

        bf16_calls = itertools.count()
        rows_out.append((f"{n_rows}x{k}", "torch bf16 F.linear",
                         graph_time_us(lambda: F.linear(x, wb[next(bf16_calls) % len(wb)]), 40, replays=7), 0.0))
        del w, sc, of, wt, so, wb, sct, oft
        torch.cuda.empty_cache()
    print_table(rows_out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
