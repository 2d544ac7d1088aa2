"""How long `hypercodec.nn.quantize` takes to code a Llama-shaped model's linear layers with the
bitshift trellis when the model is on a GPU (the trellis search on the device, see
`hypercodec.cuda.trellis_encode`) against the same call for one layer on the CPU.

    python py/benches/cuda_quantize_model.py [--layers 2] [--method trellis] [--bps 2] [--out FILE]

`--layers` decoder layers of Llama-2-7B's shapes (q, k, v, o: 4096×4096; gate, up: 11008×4096;
down: 4096×11008), random bf16 weights on the GPU. The whole 7B model has 32 such layers
(6.48 G parameters in them); the table extrapolates the measured seconds per parameter to it.
The CPU column codes one 4096×4096 layer of the same model on the host's cores.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn

import hypercodec.nn as hnn

SHAPES = [(4096, 4096)] * 4 + [(11008, 4096), (11008, 4096), (4096, 11008)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--method", default="trellis")
    ap.add_argument("--bps", type=float, default=2.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_quantize_model: no CUDA device; nothing to do")
        return 0
    torch.manual_seed(0)
    model = nn.Sequential(*[
        nn.Linear(i, o, bias=False, device="cuda", dtype=torch.bfloat16)
        for _ in range(args.layers) for (o, i) in SHAPES
    ])
    params = sum(p.numel() for p in model.parameters())
    # Warm-up: the kernels load once per device.
    hnn.quantize(nn.Sequential(nn.Linear(512, 64, device="cuda")), args.bps, args.method)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hnn.quantize(model, args.bps, args.method)
    gpu_s = time.perf_counter() - t0
    one = nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    hnn.quantize(nn.Sequential(one), args.bps, args.method)
    cpu_s = time.perf_counter() - t0
    seven_b = 32 * sum(o * i for o, i in SHAPES)
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; host: {os.cpu_count()} cores; torch {torch.__version__}; "
        f"method {args.method} at {args.bps:g} bits",
        "",
        "| what | parameters | seconds | seconds per G parameters |",
        "|---|---:|---:|---:|",
        f"| {args.layers} Llama-2-7B decoder layers, on the GPU | {params / 1e6:.0f} M | {gpu_s:.1f} | {gpu_s / params * 1e9:.1f} |",
        f"| one 4096×4096 layer, on the CPU | 16.8 M | {cpu_s:.1f} | {cpu_s / 4096**2 * 1e9:.0f} |",
        f"| the 32 layers of Llama-2-7B, extrapolated: GPU | {seven_b / 1e9:.2f} G | {gpu_s / params * seven_b:.0f} | |",
        f"| the same, extrapolated: CPU | {seven_b / 1e9:.2f} G | {cpu_s / 4096**2 * seven_b:.0f} | |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
