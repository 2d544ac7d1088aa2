"""W8A8 accuracy on SmolLM2-135M (CPU): perplexity over the evaluation text with int8 weights
alone and with int8 activations too (``hypercodec.nn.quantize_activations``), beside the
float32 original, in one run.

    python py/benches/w8a8_accuracy.py [--tokens 2048] [--window 512]
        [--specs int8-row:int8,z1-fixed8:int8,int4-row:int8,int4-row:fp8,z1-fixed4:int8,z1-fixed4:fp8]

Every linear layer is quantized (the tied embedding stays float32: this measures the linear
layers' arithmetic); activations are quantized per token by their absolute maximum, after the
weight's RHT for the lattice forms, to int8 or to FP8 E4M3 (the host computes what the GPU's FP8
GEMM does: E4M3 products summed in f32). ``fp8-rounded``: FP8 with ``round_weights=True`` (forms
without an exact E4M3 weight multiply their decoded weight rounded to E4M3, a scale per row).
"""

import argparse
import copy
import time

import torch

from hypercodec import eval as hev
from hypercodec import nn as hnn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--text", default=None, help="the evaluation text (default: the suite's)")
    ap.add_argument("--specs", default="int8-row:int8,z1-fixed8:int8,int4-row:int8,int4-row:fp8,z1-fixed4:int8,z1-fixed4:fp8",
                    help="weights:activations pairs; each weight form is also measured with float32 activations")
    a = ap.parse_args()
    lm = hev.smollm2(a.text or hev.fetch_text(), a.tokens, a.window, calibration_windows=0)
    base = lm.measure(lm.model)["ppl"]
    print(f"SmolLM2-135M, {len(lm.windows)} windows of {a.window} tokens; torch {torch.__version__}")
    print("| weights | activations | ppl | Δppl | KL vs original | top-1 | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print(f"| float32 | float32 | {base:.3f} | +0.00 % | 0 | 1.000 | |")
    modes: dict[str, list[str]] = {}
    for item in a.specs.split(","):
        spec, mode = item.split(":")
        modes.setdefault(spec, []).append(mode)
    for spec, acts_list in modes.items():
        m = copy.deepcopy(lm.model)
        hnn.quantize(m, method=spec, skip=())
        for acts in ["float32"] + [f"{mode} per token" for mode in acts_list]:
            mode = None if acts == "float32" else acts.split()[0]
            n = hnn.quantize_activations(m, "fp8" if mode == "fp8-rounded" else mode, round_weights=mode == "fp8-rounded")
            if mode and n == 0:
                acts += " (no layer switched)"
            t0 = time.time()
            r = lm.measure(m)
            d = 100 * (r["ppl"] / base - 1)
            print(f"| {spec} | {acts} | {r['ppl']:.3f} | {d:+.2f} % | {r['kl']:.4f} | {r['top1']:.3f} | {time.time() - t0:.0f} |")


if __name__ == "__main__":
    main()
