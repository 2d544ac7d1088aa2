"""Quantized activations on CUDA (``hypercodec.nn.quantize_activations``: int8 W8A8, FP8 E4M3)
against bf16 ``F.linear`` and the weight-only route of the same layer, in one run (needs a
CUDA device).

    python py/benches/cuda_w8a8.py [--sizes 4096x4096,8192x8192,28672x8192] [--batches 32,256,1024]
        [--specs int8-row:int8,z1-fixed8:int8,int4-row:fp8,z1-fixed4:fp8] [--fp8-min-weights N]
        [--lattice-gemv-batch N] [--trellis-gemv-batch N]

Each spec is timed weight-only and with its activation mode (after the colon: ``int8``, ``fp8``,
or ``fp8-rounded`` for FP8 with ``round_weights=True``); a layer the mode does not take (no
integer form, or too large for E4M3: it runs weight-only) is marked "not switched". The float weight is made on the
GPU, so trellis specs are coded by the GPU encoder.
Times are medians over replays of a CUDA graph of back-to-back calls (``_graph_timing``); the
error is ‖y − y_bf16‖ / ‖y_bf16‖ with the bf16 weight as reference.
"""

import argparse

import torch
from _graph_timing import graph_time_us

import hypercodec.nn as hnn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096x4096,8192x8192,28672x8192")
    ap.add_argument("--batches", default="32,256,1024")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--specs", default="int8-row:int8,z1-fixed8:int8,int4-row:fp8,z1-fixed4:fp8",
                    help="layers as SPEC:MODE (MODE: int8, fp8, or fp8-rounded for round_weights=True)")
    ap.add_argument("--fp8-min-weights", type=int, default=None,
                    help="override hypercodec.nn.FP8_MIN_WEIGHTS (the size under which FP8 layers stay weight-only)")
    ap.add_argument("--lattice-gemv-batch", type=int, default=None,
                    help="override hypercodec.nn.LATTICE_GEMV_BATCH (rows up to which fixed-rate E8 layers keep their GEMV)")
    ap.add_argument("--trellis-gemv-batch", type=int, default=None,
                    help="override hypercodec.nn.TRELLIS_GEMV_BATCH (rows up to which trellis layers keep their own kernels)")
    a = ap.parse_args()
    if a.trellis_gemv_batch is not None:
        hnn.TRELLIS_GEMV_BATCH = a.trellis_gemv_batch
    if a.fp8_min_weights is not None:
        hnn.FP8_MIN_WEIGHTS = a.fp8_min_weights
    if a.lattice_gemv_batch is not None:
        hnn.LATTICE_GEMV_BATCH = a.lattice_gemv_batch
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| size | batch | method | µs per call | × bf16 speed | rel. error vs bf16 |")
    print("|---|---:|---|---:|---:|---:|")
    for size in a.sizes.split(","):
        rows, cols = (int(v) for v in size.split("x"))
        lin = torch.nn.Linear(cols, rows, bias=False, device=dev)
        with torch.no_grad():
            lin.weight.normal_(0, 0.02)
        wb = lin.weight.detach().to(dev, torch.bfloat16)
        layers = {}
        for item in a.specs.split(","):
            spec, mode = item.split(":")
            m = torch.nn.Sequential(hnn.HyperLinear.from_linear(lin, spec)).to(dev)
            layers[spec] = (m, mode)
        batches = [int(b) for b in a.batches.split(",")]
        xs, rows_out = {}, []  # rows_out: (batch, order, text), printed by batch
        for batch in batches:
            x = torch.randn(batch, cols, device=dev, dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, wb).float()
            base = graph_time_us(lambda: torch.nn.functional.linear(x, wb), a.iters)
            xs[batch] = (x, ref, base)
            rows_out.append((batch, 0, f"| {size} | {batch} | torch bf16 F.linear | {base:.1f} | 1.00 | 0 |"))
        # Each mode is switched on once per layer (an entropy-coded layer decodes its points then).
        order = 1
        for spec, (m, mode) in layers.items():
            for acts in ("weight-only", {"int8": "W8A8", "fp8": "FP8 activations"}.get(mode, "FP8, rounded weight")):
                n = hnn.quantize_activations(m, None if acts == "weight-only" else mode.removesuffix("-rounded"),
                                             round_weights=acts != "weight-only" and mode == "fp8-rounded")
                if acts != "weight-only" and n == 0:
                    acts += " (not switched)"
                for batch in batches:
                    x, ref, base = xs[batch]
                    with torch.no_grad():
                        y = m(x).float()
                        t = graph_time_us(lambda: m(x), a.iters)
                    e = float((y - ref).norm() / ref.norm())
                    rows_out.append((batch, order, f"| {size} | {batch} | {spec} {acts} | {t:.1f} | {base / t:.2f} | {e:.4f} |"))
                order += 1
        for _, _, text in sorted(rows_out, key=lambda r: r[:2]):
            print(text)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
