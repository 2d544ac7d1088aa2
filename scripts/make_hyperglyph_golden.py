"""Writes legacy Hyper Glyph archives and the values the package itself decodes them to, for
the legacy importer's test (tests/tests/legacy.rs).

    python -m venv .venv-hg && .venv-hg/bin/pip install 'hyperglyph-codec[compression]==0.7.0'
    .venv-hg/bin/python scripts/make_hyperglyph_golden.py

Outputs in tests/data/: hyperglyph-auto.hwz (default compact "auto" mode: packed_int4,
low_rank_residual, sparse, raw_int8), hyperglyph-codebook.hwz (compact codebook mode), and for
each NAME.expected.json ({tensor: shape}) plus NAME.expected.f32 (values in tensor order).
"""
import json
import pathlib

import numpy as np
from hyperglyph.compact_codec import compress_state_dict_compact, decompress_state_dict_compact
from hyperglyph.config import HyperGlyphConfig
from hyperglyph.serialization import load_compressed, save_compressed

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data"
rng = np.random.default_rng(0)
auto = {
    "dense.weight": rng.standard_normal((64, 96)).astype(np.float32) * 0.05,
    "lowrank.weight": (rng.standard_normal((128, 2)) @ rng.standard_normal((2, 128))).astype(np.float32),
    "sparse.weight": np.where(rng.random((64, 64)) < 0.05, rng.standard_normal((64, 64)), 0).astype(np.float32),
    "tiny.weight": rng.standard_normal((16, 16)).astype(np.float32),
    "layer.bias": rng.standard_normal(64).astype(np.float32),
}
codebook = {
    "cb.weight": rng.standard_normal((32, 64)).astype(np.float32) * 0.1,
    "cb2.weight": rng.standard_normal((16, 80)).astype(np.float32),
}
for name, sd, cfg in [
    ("hyperglyph-auto", auto, HyperGlyphConfig(min_tensor_size=64)),
    ("hyperglyph-codebook", codebook, HyperGlyphConfig(min_tensor_size=64, compact_tensor_codec="codebook")),
]:
    path = OUT / f"{name}.hwz"
    save_compressed(compress_state_dict_compact(sd, cfg), path)
    restored = decompress_state_dict_compact(load_compressed(path))  # what the package decodes
    order = [t["name"] for t in load_compressed(path).metadata["tensors"]]
    (OUT / f"{name}.expected.json").write_text(
        json.dumps({t: {"shape": list(restored[t].shape), "codec": c} for t, c in
                    [(t["name"], t["codec"]) for t in load_compressed(path).metadata["tensors"]]}, indent=1) + "\n")
    np.concatenate([restored[t].astype("<f4").reshape(-1) for t in order]).tofile(OUT / f"{name}.expected.f32")
    print("wrote", path, order)
