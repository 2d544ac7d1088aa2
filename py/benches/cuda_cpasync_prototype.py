"""The cp.async INT4 GEMV prototype (kernels/prototypes/cpasync_int4_gemv.cu) against the
committed tensor-core kernel and torch bf16 `F.linear`, batch 1, in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/proto/cpa.cubin kernels/prototypes/cpasync_int4_gemv.cu  # here
    python py/benches/cuda_cpasync_prototype.py .dev/proto/cpa.cubin [--out FILE]                            # on the GPU

Random INT4 g128 codes (row-major, as stored) with f32 scales and offsets. Each call is checked
against x·Ŵᵀ in float32 and timed as 40 launches in a CUDA graph over ≥ 400 MB of weight copies
(L2 never holds them), median of 7 replays (`_graph_timing.graph_time_us`). The prototype's
`hc_cpa_prep_*` kernels (activations prepared by a separate launch) were timed by this script at
commit ba60ff7 (docs/eval/cuda_int4_variants.md).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F
from _driver import AffineArgs as Args
from _driver import Driver, print_table, tile_scales
from _graph_timing import graph_time_us

STAGE_BYTES = 1424  # sizeof(CpaStage)
CPA_SMEM = 8 * (3 * 1408 + 64)  # hc_affine_cpa_b4: HC_CPA_WARPS · (HC_CPA_STAGES · stage + 64)
# (warps, stages, layout, math): layout 1 = tile-major codes, 2 = tile-major codes and scales.
LAYOUTS = [(8, 4, 2, 1), (8, 3, 4, 1), (8, 4, 4, 0)]
LAYOUT_NAMES = {0: "as stored", 1: "codes tile-major", 2: "codes tile-major, scales tiled",
                3: "codes as stored, scales tiled", 4: "codes tile-major and f16 scales tiled"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", help="the prototype built for sm_90 (or sm_80)")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--old-ptx", default=None, help="an earlier gemv.ptx whose kernel reads scales row after row")
    ap.add_argument("--shapes", default="4096x4096,8192x8192,14336x4096,28672x8192,8192x28672,1000x4096")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_cpasync_prototype: no CUDA device; nothing to do")
        return 0
    drv = Driver({"proto": args.cubin, **({"old": args.old_ptx} if args.old_ptx else {})})
    fn = drv.fn
    committed = fn("ptx", "hc_affine_mma_b4_w4_n1_bf16")
    cpa = fn("ptx", "hc_affine_cpa_b4_bf16")
    drv.check(drv.cu.cuFuncSetAttribute(cpa, 8, CPA_SMEM), "max dynamic shared memory")
    old = fn("old", "hc_affine_mma_b4_w4_n1_bf16") if args.old_ptx else None
    torch.manual_seed(0)
    rows_out = []
    for shape in args.shapes.split(","):
        n_rows, k = (int(v) for v in shape.split("x"))
        steps, glen = k // 128, 128
        copies = int(400e6 // (n_rows * k // 2)) + 1
        w = [torch.randint(0, 256, (n_rows, k // 2), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        sc = [torch.rand(n_rows, steps, device="cuda") * 0.01 + 0.001 for _ in range(copies)]
        of = [torch.randn(n_rows, steps, device="cuda") * 0.01 for _ in range(copies)]
        tiled = n_rows % 16 == 0
        # The committed kernels' scale layout (kernels-cuda `tiled_scales`): [tile][group][g][rows g, g + 8].
        sct, oft = [tile_scales(a) for a in sc], [tile_scales(a) for a in of]
        sct16, oft16 = [a.half() for a in sct], [a.half() for a in oft]
        if tiled:
            wt = [c.view(n_rows // 16, 2, 8, steps, 4, 16).permute(0, 3, 1, 2, 4, 5).contiguous() for c in w]
        q = torch.stack([(w[0].int() >> (4 * i)) & 15 for i in range(2)], -1).reshape(n_rows, k).float()
        wd = (q - 8.0) * sc[0].repeat_interleave(glen, 1) + of[0].repeat_interleave(glen, 1)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, n_rows, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ wd.T
        wd16 = (q - 8.0) * sc[0].half().float().repeat_interleave(glen, 1) + of[0].half().float().repeat_interleave(glen, 1)
        ref16 = x.float() @ wd16.T
        kept = []  # ctypes values must outlive the graph's capture

        def args_for(i: int, tiled_scales: bool = False) -> Args:
            s_, o_ = (sct[i], oft[i]) if tiled_scales else (sc[i], of[i])
            a = Args(w[i].data_ptr(), s_.data_ptr(), o_.data_ptr(), x.data_ptr(), y.data_ptr(), None,
                     w[i].numel(), 2, 2, 1, n_rows, k, 4, glen, steps, 1.0, 8.0, 7)
            kept.append(a)
            return a

        def run(make, name: str, ref=ref) -> None:
            calls = itertools.count()
            us = graph_time_us(lambda: make(next(calls) % copies), 40, replays=7)
            y.fill_(float("nan"))
            make(0)
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            rows_out.append((shape, name, us, err))

        if old is not None:
            run(lambda i: drv.launch(old, (n_rows + 15) // 16, 256, [args_for(i)]), "tensor-core kernel, scales row after row (before)")
        run(lambda i: drv.launch(committed, (n_rows + 15) // 16, 256, [args_for(i, True)]), "tensor-core kernel, tiled scales")
        run(lambda i: drv.launch(cpa, (n_rows + 15) // 16, 256, [args_for(i, True)], CPA_SMEM), "hc_affine_cpa_b4_bf16 (committed PTX)")

        def make_cpa16(i: int) -> None:
            a = Args(w[i].data_ptr(), sct16[i].data_ptr(), oft16[i].data_ptr(), x.data_ptr(), y.data_ptr(), None,
                     w[i].numel(), 2, 2, 1, n_rows, k, 4, glen, steps, 1.0, 8.0, 7, 1)
            kept.append(a)
            drv.launch(cpa, (n_rows + 15) // 16, 256, [a], CPA_SMEM)

        run(make_cpa16, "hc_affine_cpa_b4_bf16 (committed PTX), f16 scales", ref16)
        for nw, stg in [(8, 3), (4, 3)]:
            f = fn("proto", f"hc_cpac_w{nw}_s{stg}")
            smem = nw * (stg * 1408 + 64)
            drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem), "max dynamic shared memory")
            run(lambda i, f=f, nw=nw, smem=smem: drv.launch(f, (n_rows + 15) // 16, 32 * nw, [args_for(i, True)], smem),
                f"hc_affine_cpa_b4_bf16 at {nw} warps, {stg} stages")
        for nw, stg, lay, math in LAYOUTS if tiled else []:
            smem = nw * stg * STAGE_BYTES + nw * 64
            f = fn("proto", f"hc_cpa_l{lay}_m{math}_w{nw}_s{stg}")
            drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem), "max dynamic shared memory")

            def make_l(i: int, f=f, smem=smem, nw=nw, lay=lay) -> None:
                codes = w[i] if lay in (0, 3) else wt[i]
                scales, offsets = (sc[i], of[i]) if lay < 2 else (sct16[i], oft16[i]) if lay == 4 else (sct[i], oft[i])
                a = Args(codes.data_ptr(), scales.data_ptr(),
                         offsets.data_ptr(), x.data_ptr(), y.data_ptr(), None, w[i].numel(), 2, 2, 1, n_rows, k, 4, glen, steps,
                         1.0, 8.0, 7)
                kept.append(a)
                drv.launch(f, (n_rows + 15) // 16, 32 * nw, [a], smem)

            run(make_l, f"cp.async, {nw} warps, {stg} stages, {LAYOUT_NAMES[lay]}" + ("" if math else ", FEED ALONE"),
                ref16 if lay == 4 else ref)

        wb = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(int(400e6 // (n_rows * k * 2)) + 1)]
        bf16_calls = itertools.count()
        rows_out.append((shape, "torch bf16 F.linear",
                         graph_time_us(lambda: F.linear(x, wb[next(bf16_calls) % len(wb)]), 40, replays=7), 0.0))
        del w, sc, of, wb, sct, oft, sct16, oft16
        if tiled:
            del wt
        torch.cuda.empty_cache()
    print_table(rows_out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
