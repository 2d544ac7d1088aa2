"""Runs the peer Hyper Glyph (hyperglyph-codec 0.7.0, default configuration) on the f32 tensors of
a .safetensors file and prints one JSON line: archive bytes, SSE and energy, seconds, peak RSS.

`hypercodec benchmark` calls it when the package is importable (by `$HYPERCODEC_PYTHON`,
default `python3`); it needs numpy and `hyperglyph-codec[compression]==0.7.0` only:

    python -m venv .venv-hg && .venv-hg/bin/pip install 'hyperglyph-codec[compression]==0.7.0'
    HYPERCODEC_PYTHON=.venv-hg/bin/python hypercodec benchmark gaussian:4096x4096
"""
import json
import os
import resource
import struct
import sys
import tempfile
import time

import numpy as np
from hyperglyph.compact_codec import compress_state_dict_compact, decompress_state_dict_compact
from hyperglyph.config import HyperGlyphConfig
from hyperglyph.serialization import load_compressed, save_compressed


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).copy()
    return out


def main():
    sd = read_safetensors(sys.argv[1])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "peer.hwz")
        save_compressed(compress_state_dict_compact(sd, HyperGlyphConfig()), path)
        seconds = time.perf_counter() - start
        size = os.path.getsize(path)
        restored = decompress_state_dict_compact(load_compressed(path))
    sse = sum(float(np.sum((sd[k].astype(np.float64) - restored[k].astype(np.float64)) ** 2)) for k in sd)
    energy = sum(float(np.sum(sd[k].astype(np.float64) ** 2)) for k in sd)
    print(json.dumps({
        "bytes": size, "sse": sse, "energy": energy, "seconds": seconds,
        "elements": int(sum(v.size for v in sd.values())),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


main()
