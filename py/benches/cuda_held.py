"""Device bytes a compressed layer holds on CUDA, per spec: the stored form's bytes, or the
dense copy of the decode fallback, after one forward in bf16 (needs a CUDA device).

    python py/benches/cuda_held.py --size 8192x8192 --specs e8@4-gpu,e8@4,e8@2-gpu,e8-fixed4
"""

import argparse

import torch

import hypercodec
import hypercodec.cuda as hcuda


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="8192x8192")
    ap.add_argument("--specs", default="e8@4-gpu,e8@4,e8@2-gpu,e8-fixed4")
    a = ap.parse_args()
    rows, cols = (int(v) for v in a.size.split("x"))
    w = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)) * 0.02).numpy()
    x = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)
    print("| spec | route at batch 1 | stored bits/value | device bytes/param |")
    print("|---|---|---:|---:|")
    for spec in a.specs.split(","):
        op = hypercodec.Linear.quantize(w, spec)
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        d.forward(x)
        torch.cuda.synchronize()
        route = d.route(1, torch.bfloat16)
        print(f"| {spec} | {route} | {op.stored_bytes * 8 / w.size:.3f} | {d.held_bytes / w.size:.3f} |")


if __name__ == "__main__":
    main()
