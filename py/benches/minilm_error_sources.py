"""Where MiniLM-L6's embedding error comes from at 4 bits per value: which tensors of the
best 4-bit configuration (`budget-e8+fisher+cal`, `python -m hypercodec eval`) cost the cosine,
and what the linear layers alone reach.

    python py/benches/minilm_error_sources.py [--bps 4] [--out FILE]

The same model, text, calibration (Fisher sensitivity on 8 batches, input statistics on the
rest) and cosine as `hypercodec eval --models minilm`. Rows:

- the whole model quantized (every linear layer and embedding, BUDGET over E8 rates);
- that model with one group of tensors put back to the original float32 weights (the cosine
  that group's error costs);
- the linear layers alone under the same budget, embeddings left float32 (what peers that
  quantize only `nn.Linear` report);
- an experiment outside the format: the word-embedding table's rows split by how often the
  calibration sentences use their token, each class coded at its own E8 rate (rates from
  0.5·log2(count + 0.5), in steps of 1/4 bit, the mean bisected to keep the table's bytes), to bound what a
  frequency-aware embedding coder could add.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bps", type=float, default=4.0)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()

    import numpy as np
    import torch

    import hypercodec
    from hypercodec import eval as hev
    from hypercodec import nn as hnn

    hev.set_threads(2)
    started = time.time()
    subj = hev.minilm(hev.fetch_text(), 256)
    loss = hnn.output_projection_loss(lambda m, b: subj.pooled(m, b))
    with hnn.InputStatistics(subj.model) as stats:
        sens = hnn.collect_fisher(subj.model, subj.calibration[:8], loss)
        stats.run(subj.calibration[8:])
        hessians = stats.result()
    method = "budget-e8+fisher+cal"
    rows: list[tuple[str, str, float, float]] = []

    def row(what: str, model, bps: float | None) -> None:
        q = subj.measure(model)
        shown = "–" if bps is None else f"{bps:.3f}"
        rows.append((what, shown, q["cosine"], q["cosine_min"]))
        print(f"{what}: {shown} bits/value, cosine {q['cosine']:.4f} (min {q['cosine_min']:.4f})", flush=True)

    full = copy.deepcopy(subj.model)
    bps, _, tensors = hev.quantize_model(full, method, args.bps, hessians, sens)
    full = hev.decoded(full)
    row(f"`{method}`, every linear layer and embedding", full, bps)
    rates = {t["tensor"]: t["bps"] for t in tensors}

    def restored(names: list[str]):
        q = copy.deepcopy(full)
        for n, mod in subj.model.named_modules():
            if n in names:
                hnn._replace(q, n, copy.deepcopy(mod))
        return q

    layers = [n for n, m in subj.model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("encoder.")]
    groups = {
        "word embeddings": ["embeddings.word_embeddings"],
        "position embeddings": ["embeddings.position_embeddings"],
        "attention query + key": [n for n in layers if n.endswith((".query", ".key"))],
        "attention value + output": [n for n in layers if n.endswith((".value", "attention.output.dense"))],
        "MLP in": [n for n in layers if n.endswith("intermediate.dense")],
        "MLP out": [n for n in layers if n.endswith(".output.dense") and "attention" not in n],
    }
    for name, names in groups.items():
        row(f"… with the {name} float32 ({len(names)} tensor{'s' if len(names) > 1 else ''})", restored(names), None)

    alone = copy.deepcopy(subj.model)
    bps_alone, _, _ = hev.quantize_model(alone, method, args.bps, hessians, sens, embeddings=False)
    row(f"`{method}`, linear layers alone (embeddings float32)", hev.decoded(alone), bps_alone)

    # Word-embedding rows at rates by token frequency (bits over the table as before).
    w = subj.model.embeddings.word_embeddings.weight.detach().numpy()
    counts = np.zeros(w.shape[0])
    for b in subj.calibration:
        np.add.at(counts, b["input_ids"][b["attention_mask"].bool()].numpy(), 1)
    table_bps = rates["embeddings.word_embeddings.weight"]

    def by_frequency(mean: float):
        g = 0.5 * np.log2(counts + 0.5)
        r = np.clip(np.round((mean + g - g.mean()) * 4) / 4, 1.0, 8.0)
        out, bits = np.empty_like(w), 0
        for rate in np.unique(r):
            idx = np.where(r == rate)[0]
            lin = hypercodec.Linear.quantize(np.ascontiguousarray(w[idx]), f"e8@{rate:g}")
            out[idx] = lin.weight()
            bits += 8 * lin.stored_bytes
        return out, bits / w.size

    lo, hi = table_bps - 2, table_bps + 1
    for _ in range(8):  # bisection: the table's bits at most what BUDGET gave it
        mid = (lo + hi) / 2
        out, got = by_frequency(mid)
        lo, hi = (mid, hi) if got <= table_bps else (lo, mid)
    out, got = by_frequency(lo)
    q = copy.deepcopy(full)
    emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(out), freeze=True, padding_idx=0)
    q.embeddings.word_embeddings = emb
    values = sum(int(np.prod([int(v) for v in t["shape"].split("x")])) for t in tensors)
    total = bps + (got - table_bps) * w.size / values
    row(f"… word-embedding rows at rates by calibration token counts ({got:.2f} bits/value on the table)", q, total)

    lines = [
        f"MiniLM-L6 (float32), {len(subj.texts)} sentences, target {args.bps:g} bits per value; "
        f"{time.time() - started:.0f} s on 2 threads. Command: `python py/benches/minilm_error_sources.py --bps {args.bps:g}`.",
        "",
        "Bits per value: stored bytes over the quantized tensors' values, all side information included "
        "(`hypercodec eval`'s count); a row that puts tensors back to float32 has none.",
        "",
        "| configuration | bits/value | cosine | cosine_min |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {w_} | {b} | {c:.4f} | {m:.4f} |" for w_, b, c, m in rows]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
