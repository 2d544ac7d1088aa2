"""Compressed KV cache on CUDA: decode-step time and cache bytes against transformers'
DynamicCache, on a random Llama-shaped model (no weights needed).

    python py/benches/cuda_kv.py [--context 2048] [--layers 8] [--batch 1,8]

After an untimed warm-up, for each batch size: prefill `--context` tokens, then time 32 greedy
decode steps (CUDA events, median per step) with the uncompressed cache, with HypercodecCache
(E8, keys 4 / values 3 bits, window 32: codes encoded and decoded on the device), with the same
cache under the model's attention implementation `hypercodec.kv.ATTENTION` (attention over the
codes: `hc_kv_e8_attend`, the history never decoded to memory), and with the uncompressed cache
again. The first run at each batch size pays one-time costs (measured: 4–7×
slower steps), so ratios are against the uncompressed cache's second run. Prints a markdown
table.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", default="1,8")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_kv: no CUDA device; nothing measured")
        return 0
    import transformers
    from transformers import DynamicCache

    from hypercodec.kv import ATTENTION, HypercodecCache

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=a.layers, num_attention_heads=16, num_key_value_heads=4,
                                   head_dim=128, max_position_embeddings=a.context + 64)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()

    def steps(cache, ids, n):
        """Prefill, then `n` greedy steps; the median ms per step."""
        with torch.no_grad():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
                tok = out.logits[:, -1:].argmax(-1)
        return statistics.median(times)

    def make_ours():
        return HypercodecCache(cfg, key_bits=4, value_bits=3, window=32)

    warm = torch.randint(0, 32000, (1, a.context), device="cuda")
    steps(DynamicCache(config=cfg), warm, 16)
    steps(make_ours(), warm, 16)
    model.set_attn_implementation(ATTENTION)
    steps(make_ours(), warm, 16)
    model.set_attn_implementation("sdpa")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{a.layers} layers, 4 KV heads of 128, bf16, context {a.context}")
    print("\n| batch | cache | ms per decode step | × uncompressed | cache MB | bits per value |")
    print("|---:|---|---:|---:|---:|---:|")
    for b in (int(v) for v in a.batch.split(",")):
        ids = torch.randint(0, 32000, (b, a.context), device="cuda")
        rows = []
        for name, make in (("DynamicCache (bf16)", lambda: DynamicCache(config=cfg)),
                           ("hypercodec E8 K4/V3, window 32", make_ours),
                           ("hypercodec E8 K4/V3, window 32, attention over the codes", make_ours),
                           ("DynamicCache (bf16), again", lambda: DynamicCache(config=cfg))):
            cache = make()
            fused = "over the codes" in name
            if fused:
                model.set_attn_implementation(ATTENTION)
            try:
                ms = steps(cache, ids, 32)
            finally:
                if fused:
                    model.set_attn_implementation("sdpa")
            if isinstance(cache, HypercodecCache):
                mb, bpv = cache.stored_bytes() / 2**20, f"{cache.bits_per_value():.2f}"
            else:
                mb = sum(l.keys.numel() * 2 + l.values.numel() * 2 for l in cache.layers) / 2**20
                bpv = "16"
            rows.append((name, ms, mb, bpv))
            del cache
            torch.cuda.empty_cache()
        base = rows[3][1]
        for name, ms, mb, bpv in rows:
            print(f"| {b} | {name} | {ms:.2f} | {ms / base:.2f} | {mb:.1f} | {bpv} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
