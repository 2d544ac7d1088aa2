"""The shared-activation split-K INT4 prototype (kernels/prototypes/sk_batch16.cu) against the
committed two-batch-tile tensor-core kernel and torch bf16 `F.linear`, batches 9-16, in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/gpu/sk16.cubin kernels/prototypes/sk_batch16.cu  # here
    python py/benches/cuda_sk16_prototype.py .dev/gpu/sk16.cubin [--out FILE]                        # on the GPU

Random INT4 g128 codes (row-major, as stored) with f16 scales in the device's tiled layout and no
offsets (the `int4` spec's form: 4.25 bits a weight). Each call is checked against x·Ŵᵀ in
float32 (twice: the counter that picks the last share must reset itself) and timed as 40
launches in a CUDA graph over ≥ 400 MB of weight copies (L2 never holds them), median of 7
replays (`_graph_timing.graph_time_us`). Every (kernel, split) pair is timed; the table keeps
each kernel's best split and the best over all.
"""

from __future__ import annotations

import argparse
import ctypes as C
import itertools
import sys

import torch
import torch.nn.functional as F
from _driver import AffineArgs as Args
from _driver import Driver, int4_copies
from _graph_timing import graph_time_us

# (row tiles R a warp, warps, stages) of the prototype's kernels.
PROTOS = [(2, 8, 3), (2, 8, 2), (2, 4, 3), (2, 4, 4), (1, 8, 3)]
SPLITS = [1, 2, 3, 4, 6, 8, 12, 16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", help="the prototype built for sm_90")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--shapes", default="4096x4096,8192x8192,14336x4096,28672x8192,8192x28672")
    ap.add_argument("--batches", default="9,16")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("cuda_sk16_prototype: no CUDA device of compute capability 9.0; nothing to do")
        return 0
    drv = Driver({"proto": args.cubin})
    committed = drv.fn("ptx", "hc_affine_mma_b4_w4_n2_bf16")
    protos = []
    for r, nw, s in PROTOS:
        f = drv.fn("proto", f"hc_sk_b4_bf16_r{r}_w{nw}_s{s}")
        smem = s * (4096 + nw * r * 1152)
        drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem), "max dynamic shared memory")
        protos.append((f, r, nw, s, smem))
    torch.manual_seed(0)
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "| shape | batch | kernel | best split (blocks) | µs per call | × bf16 | × committed | rel. error vs float32 |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    sweep = ["", "Every split (µs per call):", "| shape | batch | kernel | " + " | ".join(f"split {s}" for s in SPLITS) + " |",
             "|---|---:|---|" + "---:|" * len(SPLITS)]
    for shape in args.shapes.split(","):
        n_rows, k = (int(v) for v in shape.split("x"))
        steps, glen = k // 128, 128
        w, sct, wd = int4_copies(n_rows, k)
        copies = len(w)
        wb = [torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16) for _ in range(int(400e6 // (n_rows * k * 2)) + 1)]
        for m in (int(v) for v in args.batches.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(m, n_rows, device="cuda", dtype=torch.bfloat16)
            ws = torch.empty(max(SPLITS) * m * n_rows, device="cuda", dtype=torch.float32)
            cnt = torch.zeros(n_rows // 16 + 1, device="cuda", dtype=torch.int32)
            ref = x.float() @ wd.T
            kept = []  # ctypes values must outlive the graph's capture

            def args_for(i: int) -> Args:
                a = Args(w[i].data_ptr(), sct[i].data_ptr(), None, x.data_ptr(), y.data_ptr(), None,
                         w[i].numel(), 2, 2, m, n_rows, k, 4, glen, steps, 1.0, 8.0, 7, 1)
                kept.append(a)
                return a

            def run(launch) -> tuple[float, float]:
                errs = []
                for _ in range(2):
                    y.fill_(float("nan"))
                    launch(0)
                    torch.cuda.synchronize()
                    errs.append(((y.float() - ref).norm() / ref.norm()).item())
                calls = itertools.count()
                us = graph_time_us(lambda: launch(next(calls) % copies), 40, replays=7)
                y.fill_(float("nan"))
                launch(0)
                torch.cuda.synchronize()
                errs.append(((y.float() - ref).norm() / ref.norm()).item())
                return us, max(errs)

            bf16_calls = itertools.count()
            base = graph_time_us(lambda: F.linear(x, wb[next(bf16_calls) % len(wb)]), 40, replays=7)
            lines.append(f"| {shape} | {m} | torch bf16 F.linear | | {base:.1f} | 1.00 | | |")
            cu, ce = run(lambda i: drv.launch(committed, (n_rows + 31) // 32, 256, [args_for(i)]))
            lines.append(f"| {shape} | {m} | hc_affine_mma_b4_w4_n2_bf16 (committed) | ({(n_rows + 31) // 32}) | {cu:.1f} | "
                         f"{base / cu:.2f} | 1.00 | {ce:.1e} |")
            best_all = None
            for f, r, nw, s, smem in protos:
                rb = (n_rows + 16 * r * nw - 1) // (16 * r * nw)
                times, best = [], None
                for split in SPLITS:
                    if split > steps:
                        times.append(None)
                        continue
                    extra = [C.c_void_p(ws.data_ptr()), C.c_void_p(cnt.data_ptr()), C.c_int(split)]
                    us, e = run(lambda i, f=f, rb=rb, nw=nw, smem=smem, split=split, extra=extra:
                                drv.launch(f, (rb, split), 32 * nw, [args_for(i)] + extra, smem))
                    if e > 5e-3:
                        raise SystemExit(f"{shape} batch {m} R={r} NW={nw} S={s} split {split}: rel. error {e:.1e}")
                    times.append(us)
                    if best is None or us < best[0]:
                        best = (us, split, e)
                us, split, e = best
                name = f"shared activations, R = {r}, {nw} warps, {s} stages"
                lines.append(f"| {shape} | {m} | {name} | {split} ({rb * split}) | {us:.1f} | {base / us:.2f} | "
                             f"{cu / us:.2f} | {e:.1e} |")
                sweep.append(f"| {shape} | {m} | {name} | " + " | ".join("" if v is None else f"{v:.1f}" for v in times) + " |")
                if best_all is None or us < best_all:
                    best_all = us
            print("\n".join(lines[-2 - len(protos):]), flush=True)
            print(f"best: {best_all:.1f} µs = {base / best_all:.2f}× bf16, {cu / best_all:.2f}× committed", flush=True)
        w = sct = wb = []  # freed before the next shape
        torch.cuda.empty_cache()
    text = "\n".join(lines + sweep) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
