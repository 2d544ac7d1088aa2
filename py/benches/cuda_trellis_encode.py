"""The GPU trellis encoder (`hypercodec.cuda.trellis_encode`, kernels/trellis_encode.cu) against
the CPU encoder (`hypercodec._native.trellis_encode`, every core of the host) in one run.

    python py/benches/cuda_trellis_encode.py [--sizes 4096x4096] [--configs 16:2:1024,16:2:1024:2,...] [--layer SPEC] [--out FILE]

Unit Gaussian rows (what the RHT and row scale make of a weight). GPU: CUDA events around one
call of the whole tensor, median of 3 after a warm-up. CPU: a sample of rows (--cpu-rows) on
all cores, scaled to the tensor. Quality: SNR of the decoded sample rows, GPU and CPU bits,
beside the Gaussian bound 6.02·K dB (a config's optional fourth field V = 2 codes pairs); `same` is the fraction of the sample's bytes the two
encoders agree on (1.0: the GPU's search is the CPU's).
With --layer SPEC (e.g. tcq@2): also a whole layer, `hypercodec.Linear.quantize` of the first
size with the rows coded on the CPU and with `device=0` (RHT, row scales and the refit stay on
the CPU), wall-clock seconds, and whether the stored bytes are equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

import hypercodec._native as native
import hypercodec.cuda as hcuda


def snr_db(x: np.ndarray, y: np.ndarray) -> float:
    return float(10 * np.log10((x.astype(np.float64) ** 2).sum() / ((x - y).astype(np.float64) ** 2).sum()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096x4096")
    ap.add_argument("--configs", default="16:2:1024,16:4:1024,16:2:16,12:2:1024,12:2:16",
                    help="L:K:seq or L:K:seq:V (V = 2: the pair code), comma-separated")
    ap.add_argument("--cpu-rows", type=int, default=32)
    ap.add_argument("--layer", default=None, help="also time Linear.quantize of this spec, CPU vs device=0")
    ap.add_argument("--calibrated", action="store_true",
                    help="--layer with error feedback from the statistics of correlated random inputs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not hcuda.available():
        print("cuda_trellis_encode: no CUDA device; nothing to do")
        return 0
    dev = torch.device("cuda", torch.cuda.current_device())
    lines = [
        f"GPU: {torch.cuda.get_device_name(dev)}; CPU encoder on {os.cpu_count()} threads; torch {torch.__version__}",
        "",
        "| tensor | L | K | V | seq | ring | GPU s | CPU s (from rows) | GPU / CPU speed | SNR GPU dB | SNR CPU dB | bound dB | same |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in args.sizes.split(","):
        rows, cols = map(int, size.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(rows, cols, device=dev, generator=g)
        for cfg in args.configs.split(","):
            l, k, seq, v = (list(map(int, cfg.split(":"))) + [1])[:4]
            plan = hcuda.trellis_encode_plan(rows, cols, l, k, seq, dev, v=v)
            hcuda.trellis_encode(x[:8], l, k, seq, v=v)  # warm-up
            times = []
            for _ in range(3):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                bits = hcuda.trellis_encode(x, l, k, seq, v=v)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            gpu_s = statistics.median(times)
            n = min(args.cpu_rows, rows)
            xs = x[:n].cpu().numpy()
            t0 = time.perf_counter()
            cpu_bits = np.frombuffer(native.trellis_encode(xs, l, k, seq, v=v), np.uint8).reshape(n, -1)
            cpu_s = (time.perf_counter() - t0) * rows / n
            gb = bits[:n].cpu().numpy()
            snr_g = snr_db(xs, native.trellis_decode(gb.tobytes(), n, cols, l, k, seq, v=v))
            snr_c = snr_db(xs, native.trellis_decode(cpu_bits.tobytes(), n, cols, l, k, seq, v=v))
            same = float((gb == cpu_bits).mean())
            lines.append(f"| {rows}×{cols} | {l} | {k} | {v} | {seq} | {plan['ring']} | {gpu_s:.3f} | {cpu_s:.1f} | "
                         f"{cpu_s / gpu_s:.0f}× | {snr_g:.2f} | {snr_c:.2f} | {6.02 * k:.2f} | {same:.4f} |")
            print(lines[-1], flush=True)
    if args.layer:
        rows, cols = map(int, args.sizes.split(",")[0].split("x"))
        w = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)) * 0.02).numpy()
        h = None
        if args.calibrated:
            a = torch.randn(2 * cols, cols, device=dev, generator=g)
            a[:, 1:] += 0.8 * a[:, :-1].clone()
            h = (a.T @ a / a.shape[0]).float().cpu().numpy()
        t0 = time.perf_counter()
        gpu = native.Linear.quantize(w, args.layer, None, h, device=dev.index or 0)
        gpu_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cpu = native.Linear.quantize(w, args.layer, None, h)
        cpu_s = time.perf_counter() - t0
        what = f"Linear.quantize(w, {args.layer!r}" + (", hessian=H)" if h is not None else ")")
        lines += ["", f"Layer `{what}`, {rows}×{cols}: CPU {cpu_s:.1f} s, "
                      f"device=0 {gpu_s:.2f} s ({cpu_s / gpu_s:.0f}×); stored bytes equal: {gpu.to_hwz() == cpu.to_hwz()}"]
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
