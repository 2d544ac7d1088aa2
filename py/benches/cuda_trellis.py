"""The trellis GEMV's and decoder's two kernels each — per chunk of 8 values (`hc_trellis_gemv_m*_k*`,
`hc_trellis_decode`) and per group of 32 (`hc_trellis_groups_m*_k*`, `hc_trellis_decode_groups_k*`) —
and the tensor-core kernel (`hc_trellis_mma_k*_v*_n*`, bf16 outputs) — against torch bf16 `F.linear`,
batches 1 to 16, in one run; each under the 1MAD code (one value per state) and the pair code (two values
per state, `tcq@K-v2`). The f32 kernels take 4 batch rows a pass (above 4 only the reference runs).

    python py/benches/cuda_trellis.py [--sizes 8192x8192,...] [--out FILE]   # on the GPU

The tensor-core kernel reads the activations' f16 copy (`xr16`, as the layers pass it).
Random bits (every bit string is a valid trellis stream) at K = 2 and 4, L = 12, sequences
of 1024 values and of 16 (calibrated rows), f32 activations already rotated (the GEMV's input; the RHT is a separate
launch that `cuda_linear.py` includes). Both kernels come from the committed PTX. The group kernel's output is
checked against the per-chunk kernel's of the same code (which the tests check against the CPU
runtime); the decoders write bf16.
Timing: 40 launches in a CUDA graph over ≥ 400 MB of weight copies (L2 never holds them),
median of 7 replays (`_graph_timing.graph_time_us`).
"""

from __future__ import annotations

import argparse
import ctypes as C
import itertools
import pathlib
import sys

import torch
import torch.nn.functional as F
from _driver import Driver
from _graph_timing import graph_time_us



class Args(C.Structure):
    """`TrellisArgs` of kernels/gemv.cu."""

    _fields_ = [("bits", C.c_void_p), ("row_scales", C.c_void_p), ("xr", C.c_void_p), ("y", C.c_void_p),
                ("bias", C.c_void_p), ("n_bytes", C.c_longlong), ("row_bytes", C.c_longlong), ("ydtype", C.c_int),
                ("M", C.c_int), ("rows", C.c_int), ("cols", C.c_int), ("l", C.c_int), ("k", C.c_int),
                ("seq", C.c_int), ("c1", C.c_float), ("c0", C.c_float), ("v", C.c_int), ("xr16", C.c_void_p)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096x4096,8192x8192,28672x8192,8192x28672")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=CUBIN:ROWS:THREADS: also time that build's tensor-core kernels (rows and threads "
                         "per block), e.g. a cubin of kernels/gemv.cu built with -DHC_TM_R=1")
    ap.add_argument("--group-threads", type=int, default=0,
                    help="threads per block of the group kernels (default: the host's choice, a thread per 2 groups)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_trellis: no CUDA device; nothing to do")
        return 0
    variants = []
    for v in args.variant:
        label, rest = v.split("=", 1)
        path, vrows, vthreads = rest.rsplit(":", 2)
        variants.append((label, path, int(vrows), int(vthreads)))
    drv = Driver({label: path for label, path, _, _ in variants})
    fn = drv.fn

    torch.manual_seed(0)
    out = []
    for size in args.sizes.split(","):
        rows, cols = map(int, size.split("x"))
        groups = cols // 32
        for m in map(int, args.batches.split(",")):
            x = torch.randn(m, cols, device="cuda")
            x16 = x.half()  # the RHT's f16 copy, which the tensor-core kernel reads
            xb = x.to(torch.bfloat16)
            wb = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
                  for _ in range(int(400e6 // (rows * cols * 2)) + 1)]
            calls = itertools.count()
            bf16 = graph_time_us(lambda: F.linear(xb, wb[next(calls) % len(wb)]), 40, replays=7)
            out.append((rows * cols, size, m, "-", "-", "torch bf16 F.linear", bf16, bf16, None))
            del wb
            for k in (2, 4):
                row_bytes = cols * k // 8
                copies = int(400e6 // (rows * row_bytes)) + 1
                bits = [torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, device="cuda") for _ in range(copies)]
                sc = torch.rand(rows, device="cuda") + 0.5
                y = torch.empty(m, rows, device="cuda")
                ymma = torch.empty(m, rows, device="cuda", dtype=torch.bfloat16)
                ref = torch.empty(m, rows, device="cuda")
                dec = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
                dref = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
                kept = []

                def make(f, r, threads, seq, target, i, decode=False, v=1):
                    # Batches above 4 run the f32 kernels in passes of 4 (the tensor-core kernel
                    # takes up to 16 in one).
                    step = m if (decode or target is ymma) else 4
                    for m0 in range(0, m, step):
                        mm = min(step, m - m0)
                        yd = 2 if target is ymma else 0
                        a = Args(bits[i].data_ptr(), sc.data_ptr(), x.data_ptr() + 4 * m0 * cols,
                                 0 if decode else target.data_ptr() + target.element_size() * m0 * rows, None,
                                 bits[i].numel(), row_bytes, yd, mm, rows, cols, 12, k, seq, 0.0066, -3.37, v,
                                 x16.data_ptr() + 2 * m0 * cols if target is ymma else None)
                        kept.append(a)
                        if decode:
                            o, dt = C.c_void_p(target.data_ptr()), C.c_int(2)
                            kept.extend([o, dt])
                            drv.launch(f, min((r + 255) // 256, 1 << 20), 256, [a, o, dt])
                        else:
                            drv.launch(f, (rows + r - 1) // r, threads, [a])

                chunk = (fn("ptx", f"hc_trellis_gemv_m{1 if m == 1 else 4}_k{k}"), 4 if m == 1 else 2,
                         min(256, max(32, (cols // 8 + 127) // 128 * 32)))
                mm4 = m if m in (1, 2) else 4  # the f32 group kernels take tiles of 1, 2 or 4 rows
                group = (fn("ptx", f"hc_trellis_groups_m{mm4}_k{k}"), 4 if m == 1 else 8,
                         args.group_threads or min(256, max(32, (groups // 2 + 31) // 32 * 32)))
                pairs = (fn("ptx", f"hc_trellis_groups_m{mm4}_k{k}_v2"), *group[1:])
                nt = 1 if m <= 8 else 2
                cases = []
                # Each reference case (per chunk) runs just before the cases checked against it.
                for seq in (1024, 16):
                    cases.append((f"seq {seq}", "per chunk of 8 (before)", *chunk, seq, "", True, 1))
                    cases.append((f"seq {seq}", "per group of 32", *group, seq, "", False, 1))
                    cases.append((f"seq {seq}", "tensor cores (bf16 out)", fn("ptx", f"hc_trellis_mma_k{k}_v1_n{nt}"),
                                  32, 256, seq, "mma", False, 1))
                cases.append(("seq 1024", "pairs, per chunk of 8", *chunk, 1024, "", True, 2))
                cases.append(("seq 1024", "pairs, per group of 32", *pairs, 1024, "", False, 2))
                cases.append(("seq 1024", "pairs, tensor cores (bf16 out)", fn("ptx", f"hc_trellis_mma_k{k}_v2_n{nt}"),
                              32, 256, 1024, "mma", False, 2))
                for label, _, vrows, vthreads in variants:
                    cases.append(("seq 1024", f"pairs, tensor cores [{label}]", fn(label, f"hc_trellis_mma_k{k}_v2_n{nt}"),
                                  vrows, vthreads, 1024, "mma", False, 2))
                if m == 1:
                    for v, name in ((1, ""), (2, "pairs, ")):
                        cases.append(("seq 1024", f"{name}decode to bf16, per chunk of 8", fn("ptx", "hc_trellis_decode"),
                                      rows * ((cols + 7) // 8), 256, 1024, "decode", True, v))
                        cases.append(("seq 1024", f"{name}decode to bf16, per group of 32",
                                      fn("ptx", f"hc_trellis_decode_groups_k{k}" + ("_v2" if v == 2 else "")),
                                      rows * groups, 256, 1024, "decode", False, v))
                for seq_label, label, f, r, threads, seq, what, is_ref, v in cases:
                    if m > 4 and what == "" and not is_ref:
                        continue  # the f32 group kernels take 4 rows a pass: only the reference runs
                    decode = what == "decode"
                    target = (dref if is_ref else dec) if decode else ymma if what == "mma" else ref if is_ref else y
                    make(f, r, threads, seq, target, 0, decode, v)
                    torch.cuda.synchronize()
                    calls = itertools.count()
                    us = graph_time_us(lambda: make(f, r, threads, seq, target, next(calls) % copies, decode, v), 40,
                                       replays=7)
                    err = None
                    if not is_ref:
                        want, got = (dref, dec) if decode else (ref, target)
                        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                    out.append((rows * cols, size, m, str(k), seq_label, label, us, bf16, err))
                    kept.clear()
                del bits
                torch.cuda.empty_cache()
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "| shape | batch | K | sequences | kernel | µs per call | × bf16 | weights/s (T) | rel. diff vs per-chunk |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for n, size, m, k, seq, label, us, base, err in out:
        lines.append(f"| {size} | {m} | {k} | {seq} | {label} | {us:.1f} | {base / us:.2f} | {n / us / 1e6:.2f} | "
                     f"{'—' if err is None else f'{err:.1e}'} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
