"""Stored layers that read one input, side by side on streams or one after another.

    python py/benches/cuda_prefix_group.py [--spec e8@4-prefix] [--batches 1] [--iters 40]

A warp decodes one chunk of a prefix-coded layer as a serial chain of table lookups, so a
4096-wide layer (a Llama block's q, k, v, o) leaves much of the GPU waiting on that chain.
`hypercodec.cuda.forward_group` runs such layers' kernels on streams of their own, so that the
layers of one input fill the GPU together. This times, at batch 1 (bf16 activations), each group
of a Llama-3-8B block (q, k, v: 4096², 1024×4096 twice; gate, up: 14336×4096 twice) and of a
Llama-2-7B one (q, k, v: 4096² three times) three ways, in one CUDA graph of `--iters` calls
rotating over enough copies of the layers that L2 never holds them (median of 5 replays):
`DeviceLinear.forward` one layer after another, `forward_group` with its streams off (for E8
and trellis forms one RHT, the kernels one after another), and `forward_group` as it runs. Bf16 `F.linear` on the same
shapes, one after another, is the baseline. Each way's outputs are checked equal bit for bit.
Needs a CUDA device (exits 0 with a message when there is none).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import hypercodec
import hypercodec.cuda as hcuda
from _graph_timing import graph_time_us

GROUPS = {
    "Llama-3-8B q, k, v": [(4096, 4096), (1024, 4096), (1024, 4096)],
    "Llama-3-8B gate, up": [(14336, 4096), (14336, 4096)],
    "Llama-2-7B q, k, v": [(4096, 4096)] * 3,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="e8@4-prefix")
    ap.add_argument("--batches", default="1", help="activation rows, comma-separated")
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_prefix_group: no CUDA device; nothing to time")
        return
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{torch.cuda.get_device_name()}; {args.spec}; bf16; µs a group (× the layers one after another)")
    print("| group | batch | bf16 F.linear | layers one after another | forward_group, streams off | forward_group |")
    print("|---|---:|---:|---:|---:|---:|")
    ok = True
    for name, shapes in GROUPS.items():
        # Copies of each layer in device memory of their own (the same codes: L2 holds lines,
        # not values), enough that one replay's reads never come from L2.
        per = sum(r * c for r, c in shapes) * 4.2 / 8
        copies = int(min(8, max(2, np.ceil(160e6 / per))))
        ops = {s: hypercodec.Linear.quantize(rng.standard_normal(s).astype(np.float32), args.spec) for s in set(shapes)}
        layers = [[hcuda.DeviceLinear(ops[s], dev) for s in shapes] for _ in range(copies)]
        dense = [[torch.randn(r, c, device=dev, dtype=torch.bfloat16) for r, c in shapes] for _ in range(copies)]
        for m in batches:
            x = torch.randn(m, shapes[0][1], device=dev, dtype=torch.bfloat16)
            state = {"i": 0}

            def step(run):
                def fn():
                    run(state["i"] % copies)
                    state["i"] += 1
                return fn

            def one_by_one(i):
                return [d.forward(x) for d in layers[i]]

            def grouped(i):
                return hcuda.forward_group(layers[i], x)

            t_bf16 = graph_time_us(step(lambda i: [torch.nn.functional.linear(x, w) for w in dense[i]]), args.iters)
            t_one = graph_time_us(step(one_by_one), args.iters)
            if grouped(0) is None:  # (a batch past the fused kernels': the caller runs the layers)
                print(f"| {name} | {m} | {t_bf16:.1f} | {t_one:.1f} | – | – (not grouped) |")
                continue
            hcuda._GROUP_STREAMS = False
            want = grouped(0)
            t_off = graph_time_us(step(grouped), args.iters)
            hcuda._GROUP_STREAMS = True
            got = grouped(0)
            t_on = graph_time_us(step(grouped), args.iters)
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(want, got, one_by_one(0)))
            ok &= same
            print(f"| {name} | {m} | {t_bf16:.1f} | {t_one:.1f} | {t_off:.1f} ({t_one / t_off:.2f}×) | "
                  f"{t_on:.1f} ({t_one / t_on:.2f}×){'' if same else ' MISMATCH'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
