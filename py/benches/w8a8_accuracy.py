"""W8A8 accuracy on SmolLM2-135M (CPU): perplexity over the evaluation text with int8 weights
alone and with int8 activations too (``hypercodec.nn.quantize_activations``), beside the
float32 original, in one run.

    python py/benches/w8a8_accuracy.py [--tokens 2048] [--window 512]

Every linear layer is quantized (the tied embedding stays float32: this measures the linear
layers' arithmetic); activations are quantized per token by their absolute maximum, after the
weight's RHT for z1-fixed8.
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
    a = ap.parse_args()
    lm = hev.smollm2(a.text or hev.fetch_text(), a.tokens, a.window, calibration_windows=0)
    base = lm.measure(lm.model)["ppl"]
    print(f"SmolLM2-135M, {len(lm.windows)} windows of {a.window} tokens; torch {torch.__version__}")
    print("| weights | activations | ppl | Δppl | KL vs original | top-1 | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print(f"| float32 | float32 | {base:.3f} | +0.00 % | 0 | 1.000 | |")
    for spec in ("int8-row", "z1-fixed8"):
        m = copy.deepcopy(lm.model)
        hnn.quantize(m, method=spec, skip=())
        for acts in ("float32", "int8 per token"):
            if acts != "float32":
                hnn.quantize_activations(m)
            t0 = time.time()
            r = lm.measure(m)
            d = 100 * (r["ppl"] / base - 1)
            print(f"| {spec} | {acts} | {r['ppl']:.3f} | {d:+.2f} % | {r['kl']:.4f} | {r['top1']:.3f} | {time.time() - t0:.0f} |")


if __name__ == "__main__":
    main()
