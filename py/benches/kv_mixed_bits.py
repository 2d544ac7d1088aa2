"""KV caches at and below 2 bits per value at 2k tokens: SmolLM2-135M perplexity with trellis keys
and values at rates per layer, exact attention sinks, 8- and 4-bit scales, centered and calibrated
(``kv_calibrate``) vectors, beside the uncompressed cache, in one run (CPU; the measurement of
``python -m hypercodec kv-eval``, tokens fed 16 at a time, an exact window of 32 tokens, but in
windows of 2048 tokens by default, the context at which the bits are counted, and over 8192
tokens, since differences of about one percent of perplexity move from one 2048-token sample to
the next).

    python py/benches/kv_mixed_bits.py [--tokens 8192] [--window 2048] [--out docs/eval/kv_2bit.md]

Bits per value at 2k: codes, scales (16, 8 or 4 bits per vector: ``bf16``, ``log8``, ``log4``),
and the exact window and sinks in bf16 at 2048 tokens of context (``hypercodec.kv.bits_at``);
every layer holds as many values, so rates per layer count by their mean.
"""

import argparse
import os
import platform
import sys
import time

import torch
import transformers
from transformers import DynamicCache

from hypercodec import __version__, kv_eval
from hypercodec.eval import fetch_text, set_threads, smollm2
from hypercodec.kv import ATTENTION, HypercodecCache, bits_at, kv_calibrate


def configs(layers: int, cal) -> list[tuple[str, dict]]:
    def first(k: int) -> list[int]:
        return [2] * k + [1] * (layers - k)

    t = {"quantizer": "trellis", "key_bits": 2, "window": kv_eval.KV_WINDOW}
    c = {**t, "sinks": 4, "scale": "log8", "means": cal.means}
    k = {**t, "sinks": 4, "scale": "log8", "calibration": cal}
    k4 = {**k, "scale": "log4"}
    return [
        ("K2 / V2", {**t, "value_bits": 2}),
        ("K2 / V2, 4 sinks, centered, log8 scales", {**c, "value_bits": 2}),
        ("K2 / V2, 4 sinks, calibrated, log8 scales", {**k, "value_bits": 2}),
        ("K2 / V2 in the first 10 layers, V1 after, 4 sinks, centered, log8", {**c, "value_bits": first(10)}),
        ("K2 / V2 in the first 10 layers, V1 after, 4 sinks, calibrated, log8", {**k, "value_bits": first(10)}),
        ("K2 / V2 in the first 7 layers, V1 after, 4 sinks, centered, log8", {**c, "value_bits": first(7)}),
        ("K2 / V2 in the first 7 layers, V1 after, 4 sinks, calibrated, log8", {**k, "value_bits": first(7)}),
        ("K2 / V1, 4 sinks, calibrated, log8", {**k, "value_bits": 1}),
        # Keys at 1 bit in the three layers the calibration weighs least (layer 0 aside).
        ("K1 in layers 14, 15, 28, K2 elsewhere / V2 in the first 10 layers, V1 after, 4 sinks, calibrated, log8",
         {**k, "key_bits": [1 if i in (14, 15, 28) else 2 for i in range(layers)], "value_bits": first(10)}),
        # 4-bit scales (the calibration's transforms bring the vectors near unit size): 4/64 bits
        # per value less, spent on a value layer more at 2 bits.
        ("K2 / V2, 4 sinks, calibrated, log4", {**k4, "value_bits": 2}),
        ("K2 / V2 in the first 11 layers, V1 after, 4 sinks, calibrated, log4", {**k4, "value_bits": first(11)}),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--window", type=int, default=2048, help="tokens per perplexity window, BOS included")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="", help="only the caches whose name contains this")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    set_threads(a.threads)
    start = time.time()
    text = fetch_text()
    lm = smollm2(text, a.tokens, a.window)
    model, windows = lm.model, lm.windows
    model.set_attn_implementation(ATTENTION)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    # Each head's mean key and value and their transforms, from 4 calibration windows (a later
    # part of the text; 8192 tokens at the default window).
    t = time.time()
    cal = kv_calibrate(model, lm.calibration[:4])
    calibrate_s = time.time() - t
    base = kv_eval.measure(model, windows, lambda: DynamicCache(config=model.config), 16)["ppl"]
    lines = [
        "| cache (trellis L10, exact window 32) | bits/value at 2k | vs bf16 | ppl | Δppl | seconds |",
        "|---|---:|---:|---:|---:|---:|",
        f"| uncompressed | 16 | 1.00× | {base:.3f} | +0.00 % | |",
    ]
    print("\n".join(lines), flush=True)
    for name, opts in configs(model.config.num_hidden_layers, cal):
        if a.rows not in name:
            continue
        t = time.time()
        ppl = kv_eval.measure(model, windows, lambda o=opts: HypercodecCache(model.config, **o), 16)["ppl"]
        bits = bits_at(opts, head_dim, 2048)
        lines.append(f"| {name} | {bits:.3f} | {16 / bits:.2f}× | {ppl:.3f} | {100 * (ppl / base - 1):+.2f} % "
                     f"| {time.time() - t:.0f} |")
        print(lines[-1], flush=True)
    head = [
        "# KV caches at and below 2 bits per value (SmolLM2-135M)",
        "",
        f"Command: `python py/benches/kv_mixed_bits.py {' '.join(sys.argv[1:])}` ({time.time() - start:.0f} s). "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, hypercodec {__version__}. Text: {os.path.basename(text)}, {len(windows)} "
        f"windows of {a.window} tokens fed 16 at a time, the model on `hypercodec.kv.ATTENTION`.",
        "",
        "Bits per value at 2k: codes, scales (bf16: 16 bits per 64-value head vector; log8: 8; log4: 4), the "
        "exact window (32 tokens) and sinks in bf16, at 2048 tokens of context. *V2 in the first k "
        "layers*: `HypercodecCache(config, key_bits=2, value_bits=[2] * k + [1] * (30 - k), ...)`. *Centered*: "
        "`means=cal.means` — each head's mean key and value taken out before coding and added back. "
        "*Calibrated*: `calibration=cal` — the means, and each head's keys and values coded through the "
        "transform `T` that minimizes the predicted loss (`TᵀT ∝ C^-½ (C^½ F C^½)^½ C^-½` for their "
        "covariance `C` and the Fisher information `F` of the loss about them), read back through `T⁻¹`. "
        f"`cal = hypercodec.kv.kv_calibrate(model, windows)` on 4 windows of a later part of the text "
        f"({calibrate_s:.0f} s); predicted gain, mean over layers: keys "
        f"{sum(k for k, _ in cal.gains) / len(cal.gains):.2f} dB, values {sum(v for _, v in cal.gains) / len(cal.gains):.2f} dB.",
        "",
    ]
    page = "\n".join(head + lines) + "\n"
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(page)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
