"""KV caches below 2 bits per value at 2k tokens: SmolLM2-135M perplexity with trellis keys and
values at different rates, beside the uncompressed cache and trellis 2/2, in one run (CPU;
the same measurement as ``python -m hypercodec kv-eval``: 4 windows of 512 tokens fed 16 at a
time, an exact window of 32 tokens).

    python py/benches/kv_mixed_bits.py [--pairs 2/1,1/2,2/2]
"""

import argparse
import time

from transformers import DynamicCache

from hypercodec import kv_eval
from hypercodec.eval import fetch_text, set_threads, smollm2
from hypercodec.kv import ATTENTION, HypercodecCache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="2/1,1/2,2/2", help="key bits / value bits, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    set_threads(a.threads)
    lm = smollm2(fetch_text(), 2048, 512)
    model, windows = lm.model, lm.windows
    model.set_attn_implementation(ATTENTION)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    base = kv_eval.measure(model, windows, lambda: DynamicCache(config=model.config), 16)["ppl"]
    print("| cache | bits/value at 2k | ppl | Δppl | seconds |")
    print("|---|---:|---:|---:|---:|")
    print(f"| uncompressed | 16 | {base:.3f} | +0.00 % | |")
    for pair in a.pairs.split(","):
        kb, vb = (int(v) for v in pair.split("/"))
        opts = {"quantizer": "trellis", "key_bits": kb, "value_bits": vb, "window": kv_eval.KV_WINDOW}
        t = time.time()
        ppl = kv_eval.measure(model, windows, lambda o=opts: HypercodecCache(model.config, **o), 16)["ppl"]
        bits = kv_eval._bits_at(opts, head_dim, 2048)
        print(f"| trellis K{kb}/V{vb} | {bits:.3f} | {ppl:.3f} | {100 * (ppl / base - 1):+.2f} % | {time.time() - t:.0f} |")


if __name__ == "__main__":
    main()
