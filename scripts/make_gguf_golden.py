"""Writes tests/data/blocks.gguf and the values the reference implementation (gguf-py, the
llama.cpp project's own Python package) dequantizes them to, for the Rust GGUF reader's test.

    python -m venv .venv-gguf && .venv-gguf/bin/pip install gguf numpy
    .venv-gguf/bin/python scripts/make_gguf_golden.py

Block bytes are random but every f16 scale is a finite, moderate value, so the expected values
are finite. Output: tests/data/blocks.gguf, tests/data/blocks.expected.f32 (the tensors'
dequantized values concatenated in file order, little-endian f32) and blocks.expected.json.
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data"
rng = np.random.default_rng(1234)

# (type, offsets of f16 scale fields inside a block)
TYPES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}

w = GGUFWriter(str(OUT / "blocks.gguf"), "test")
w.add_uint32("test.answer", 42)
w.add_string("test.note", "golden blocks for hypercodec")
expected = []
meta = []
rows = 3
for qtype, scale_offsets in TYPES.items():
    block, size = GGML_QUANT_SIZES[qtype]
    cols = 2 * 256  # a multiple of every block size
    nblocks = rows * cols // block
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in scale_offsets:
        scales = rng.uniform(0.001, 0.05, size=nblocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(nblocks, 2)
    data = raw.reshape(rows, cols // block * size)
    name = f"t.{qtype.name.lower()}"
    w.add_tensor(name, data, raw_dtype=qtype)
    values = dequantize(data, qtype).astype(np.float32).reshape(-1)
    expected.append(values)
    meta.append({"name": name, "type": qtype.name.lower(), "shape": [rows, cols]})
# plain float types too
for dtype, qtype in [(np.float32, T.F32), (np.float16, T.F16)]:
    values = rng.standard_normal((2, 8)).astype(dtype)
    name = f"t.{qtype.name.lower()}"
    w.add_tensor(name, values, raw_dtype=qtype)
    expected.append(values.astype(np.float32).reshape(-1))
    meta.append({"name": name, "type": qtype.name.lower(), "shape": [2, 8]})
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
np.concatenate(expected).astype("<f4").tofile(OUT / "blocks.expected.f32")
(OUT / "blocks.expected.json").write_text(json.dumps(meta, indent=1) + "\n")
print("wrote", OUT / "blocks.gguf")
