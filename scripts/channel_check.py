#!/usr/bin/env python3
"""Per-channel damage that a tensor's SNR hides: compress a model, decompress it, and count the
rows (output channels) of every weight that came back as zeros or below 3 dB.

    python3 scripts/channel_check.py MODEL.safetensors "ARGS" ["ARGS" ...] [--bin target/release/hypercodec]

Each ARGS is one `hypercodec compress MODEL out.hwz ARGS` run (e.g. "--encoding lattice --bps 3").
Prints, per run, the rows counted over all tensors of rank ≥ 2 and the tensors with damaged rows.
Needs numpy.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """Float tensors of rank ≥ 2 by name, as float32 (bf16 widened; other types skipped)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__" or len(v["shape"]) < 2:
            continue
        s, e = v["data_offsets"]
        raw = data[8 + n + s : 8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] in DTYPES:
            a = np.frombuffer(raw, DTYPES[v["dtype"]]).astype(np.float32)
        else:
            continue
        out[name] = a.reshape(v["shape"][0], -1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("runs", nargs="+", help="compress arguments, one string per run")
    ap.add_argument("--bin", default="target/release/hypercodec")
    args = ap.parse_args()
    src = read_safetensors(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        hwz, back = os.path.join(tmp, "m.hwz"), os.path.join(tmp, "d.safetensors")
        for run in args.runs:
            subprocess.run([args.bin, "compress", args.model, hwz, *run.split()], check=True, capture_output=True)
            subprocess.run([args.bin, "decompress", hwz, back], check=True, capture_output=True)
            dec = read_safetensors(back)
            rows = zeroed = low = 0
            worst = []
            for name, x in src.items():
                y = dec[name]
                signal = (x.astype(np.float64) ** 2).sum(1)
                noise = ((x - y).astype(np.float64) ** 2).sum(1)
                live = signal > 0
                z = int(((y == 0).all(1) & live).sum())
                snr = 10 * np.log10(signal[live] / np.maximum(noise[live], 1e-300))
                b = int((snr < 3).sum())
                rows, zeroed, low = rows + len(x), zeroed + z, low + b
                if z:
                    worst.append(f"  {name} {list(x.shape)}: {z} of {len(x)} rows decoded as zeros")
            print(f"{run}: {rows} rows, {zeroed} decoded as zeros, {low} below 3 dB")
            print("\n".join(worst[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
