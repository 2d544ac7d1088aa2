"""CUDA compressed linear layers: correctness against the CPU runtime, then speed against bf16.

    python py/benches/cuda_linear.py [--quick] [--sizes 8192x8192,28672x8192] [--iters 200]

Part 1 checks every device route (affine codes of 2..8 bits, aligned and not, symmetric and
asymmetric, per group / row / tensor scales; fixed-rate E8 of 2..8 bits; the decode fallback;
batches 1, 3, 8 and 17; f32, f16 and bf16 activations; a 1×1 and a 3×3 convolution) against
``hypercodec.Linear.forward`` on the host (the CPU runtime, itself checked against the f64
reference in the Rust tests) and prints the worst relative error per case.

Part 2 times ``y = x·Wᵀ`` at batch 1, 2, 4, 16, 32, 64 and 256 (``--batches``) for each size (both our
routes wherever the fused one takes the batch): PyTorch's bf16 ``F.linear``, its
int4 weight-only kernel (``_weight_int4pack_mm``, groups of 128) where it runs, and ours.
Each timing is the median over 5 repetitions of ``--iters`` back-to-back calls captured in a
CUDA graph (so Python's launch overhead is not counted, for peers and us alike), CUDA events
around the replay. Prints markdown tables; needs a CUDA device (exits 0 with a message when
there is none).
"""

from __future__ import annotations

import argparse
import builtins
import platform
import sys
import time

_LINES: list[str] = []


def print(*args, file=None, **kw):  # noqa: A001 - keeps every table line for --out
    if file is None:
        _LINES.append(" ".join(str(a) for a in args))
    builtins.print(*args, file=file, **kw)

import numpy as np
import torch

import hypercodec
import hypercodec.cuda as hcuda
from _graph_timing import graph_time_us
import hypercodec.nn as hnn


def rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    g = got.detach().float().cpu().numpy().reshape(want.shape)
    return float(np.abs(g - want).max() / (np.abs(want).max() + 1e-30))


def check(quick: bool) -> bool:
    dev = torch.device("cuda")
    rng = np.random.default_rng(7)
    specs = [
        "int4", "int4-row", "int4-tensor", "int8-row", "int8", "int2", "int2-row", "int3", "int5", "int1-row",
        "e8-fixed2", "e8-fixed3", "e8-fixed4", "e8-fixed5", "e8-fixed8", "e8@4", "e8@4-gpu", "e8@2-gpu", "e8@4-prefix", "e8@3-prefix10", "tcq@2", "tcq@1-l12", "tcq@3-l12",
        "tcq@4-l12", "cb-b4-k256",
    ]
    shapes = [(256, 1024), (48, 768), (100, 250), (33, 72)] if not quick else [(256, 1024), (48, 768), (33, 72)]
    tol = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
    print("| spec | shape | route (batch 1 / 17) | held on device | worst rel. error f32 / f16 / bf16 | ok |")
    print("|---|---|---|---:|---|---|")
    all_ok = True
    for spec in specs:
        for rows, cols in shapes:
            w = rng.standard_normal((rows, cols)).astype(np.float32)
            w[:, ::37] *= 8  # a few outlier columns
            b = rng.standard_normal(rows).astype(np.float32)
            try:
                op = hypercodec.Linear.quantize(w, spec, b)
            except hypercodec.HypercodecError as e:
                print(f"| {spec} | {rows}x{cols} | refused: {e} | | | |")
                continue
            d = hcuda.DeviceLinear(op, dev)
            errs = []
            ok = True
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                worst = 0.0
                for m in (1, 3, 8, 12, 17):
                    x = rng.standard_normal((m, cols)).astype(np.float32)
                    xt = torch.from_numpy(x).to(dt)
                    want = op.forward(xt.float().numpy())
                    got = d.forward(xt.to(dev))
                    torch.cuda.synchronize()
                    assert got.dtype == dt and got.shape == (m, rows)
                    worst = max(worst, rel_err(got, want))
                errs.append(worst)
                ok &= worst <= tol[dt]
            all_ok &= ok
            print(
                f"| {spec} | {rows}x{cols} | {d.route(1, torch.bfloat16)} / {d.route(17, torch.bfloat16)} | {d.held_bytes} | "
                + " / ".join(f"{e:.1e}" for e in errs)
                + f" | {'yes' if ok else 'NO'} |"
            )
    # Convolutions through HyperConv2d (1×1 on the GEMV, 3×3 by the decode fallback).
    for k in (1, 3):
        conv = torch.nn.Conv2d(32, 48, k, padding=k // 2)
        hc = hnn.HyperConv2d.from_conv(conv, "int4")
        x = torch.randn(2, 32, 9, 9)
        want = hc(x).numpy()
        got = hc(x.to(dev))
        e = rel_err(got, want)
        ok = e <= 2e-4
        all_ok &= ok
        print(f"| conv {k}x{k} int4 | [48,32,{k},{k}] | {hc.path} | | {e:.1e} / - / - | {'yes' if ok else 'NO'} |")
    return all_ok


def bench(sizes: list[tuple[int, int]], iters: int, specs: list[str], batches: list[int]) -> None:
    dev = torch.device("cuda")
    print("\n| size | batch | method | bits/value all-in | µs per call | × bf16 speed | rel. error vs bf16 |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for rows, cols in sizes:
        g = torch.Generator().manual_seed(1)
        w = torch.randn(rows, cols, generator=g) * 0.02
        wb = w.to(dev, torch.bfloat16)
        layers = {}
        for spec in specs:
            if spec.startswith("tcq") and rows * cols > 8192 * 8192:
                print(f"({spec} skipped at {rows}x{cols}: its CPU encoder would take minutes)", file=sys.stderr)
                continue
            t0 = time.time()
            op = hypercodec.Linear.quantize(w.numpy(), spec)
            layers[spec] = (op, hcuda.DeviceLinear(op, dev), time.time() - t0)
        int4 = None
        try:
            # PyTorch's int4 layout: asymmetric codes in groups of 128, dequantized as
            # (q − 8)·scale + zero (zero = the value of code 8), scales and zeros in bf16.
            gs = 128
            wg = w.reshape(rows, cols // gs, gs)
            lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(rows, cols)
            zero = lo + 8 * scale
            sz = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1).to(dev, torch.bfloat16).contiguous()
            qu8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).to(dev)
            int4 = (torch.ops.aten._convert_weight_to_int4pack(qu8, 8), sz)
        except Exception as e:  # a torch without this kernel on this device
            print(f"(torch int4 kernel unavailable: {type(e).__name__}: {e})", file=sys.stderr)
        for m in batches:
            x = torch.randn(m, cols, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, wb).float()
            base = graph_time_us(lambda: torch.nn.functional.linear(x, wb), iters)
            print(f"| {rows}x{cols} | {m} | torch bf16 F.linear | 16 | {base:.1f} | 1.00 | 0 |")
            if int4 is not None:
                packed, sz = int4
                f = lambda: torch.ops.aten._weight_int4pack_mm(x, packed, 128, sz)  # noqa: E731
                try:
                    y = f().float()
                    t = graph_time_us(f, iters)
                    e = float((y - ref).norm() / ref.norm())
                    print(f"| {rows}x{cols} | {m} | torch int4 g128 (_weight_int4pack_mm) | 4.25 | {t:.1f} | {base / t:.2f} | {e:.3f} |")
                except Exception as ex:
                    print(f"| {rows}x{cols} | {m} | torch int4 g128 | | failed: {type(ex).__name__} | | |")
            e8 = next((d for _, d, _ in layers.values() if d.kind == "e8"), None)
            if e8 is not None:
                xr = torch.empty(m, 8 * e8.words, device=dev)
                rargs = {"x": x.data_ptr(), "x_dtype": 2, "out": xr.data_ptr(), "batch": m, "cols": cols,
                         "width": 8 * e8.words, "tile": e8.tile, "seed": e8.seed}
                stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
                t = graph_time_us(lambda: e8.kernels.rht(rargs, stream()), iters)
                print(f"| {rows}x{cols} | {m} | (our activation RHT alone, tile {e8.tile}) | | {t:.1f} | | |")
            for spec, (op, d, qs) in layers.items():
                bpv = op.stored_bytes * 8 / (rows * cols)
                fused = d._takes(m, torch.bfloat16)
                for route in ("gemv",) if m == 1 else ("gemv", "decode") if fused else ("decode",):
                    y = d.forward(x, route=route).float()
                    e = float((y - ref).norm() / ref.norm())
                    t = graph_time_us(lambda: d.forward(x, route=route), iters)
                    name = d.route(m, torch.bfloat16) if route == "gemv" else f"cuda-{d.kind}-decode+linear"
                    print(f"| {rows}x{cols} | {m} | ours {spec} ({name}) | {bpv:.2f} | {t:.1f} | {base / t:.2f} | {e:.3f} |")
        del layers
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="4096x4096,8192x8192,28672x8192")
    ap.add_argument("--specs", default="int4,int8-row,e8-fixed4,e8-fixed2,tcq@2-l12")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batches", default="1,2,4,16,32,64,256", help="activation rows to time")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--out", help="also write the tables to this markdown file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_linear: no CUDA device; nothing measured")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, hypercodec {hypercodec.__version__}")
    ok = True
    if not a.skip_check:
        ok = check(a.quick)
        print(f"\ncheck: {'all routes match the CPU runtime' if ok else 'MISMATCH'}")
    sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",") if s]
    bench(sizes, a.iters, a.specs.split(","), [int(v) for v in a.batches.split(",")])
    if a.out:
        head = [
            "# CUDA compressed linear layers: checks and speed",
            "",
            "Regenerate: `python py/benches/cuda_linear.py "
            + " ".join(sys.argv[1:]).replace(f"--out {a.out}", "--out docs/eval/cuda.md").strip()
            + "` (needs a CUDA device).",
            "",
            f"Machine: {torch.cuda.get_device_name()}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"Python {platform.python_version()}; hypercodec {hypercodec.__version__}. "
            "Timings: median over 5 replays of a CUDA graph of back-to-back calls (no Python launch overhead, "
            "for PyTorch and for us), CUDA events; bits per value all-in count every stored byte "
            "(codes, scales, offsets); PyTorch's int4 row counts its codes plus a bf16 scale and zero per 128.",
            "",
        ]
        with open(a.out, "w") as f:
            f.write("\n".join(head + _LINES) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
