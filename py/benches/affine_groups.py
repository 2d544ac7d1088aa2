"""Affine group layouts at about 4 bits: stored bits per value and weight SNR, beside the bound.

    python py/benches/affine_groups.py [--rows 2048] [--cols 4096] [--specs int4,int4-g256,...]

Each candidate (``intN`` groups of 128 with a scale and offset each, ``intN-gG`` groups of G,
``intN-gG-sym`` a scale and no offset a group, ``intN-row``) quantizes a unit Gaussian and a
Student-t(4) matrix (heavier tails, as trained weights have; fixed seeds) with
``hypercodec.Linear.quantize``. Bits per value are the layer's held bytes (codes, scales,
offsets) over its values; SNR is of the decoded weight. The Gaussian bound at R bits is
6.02·R dB. CPU only.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import hypercodec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--specs", default="int4,int4-g256,int4-g128-sym,int4-g64-sym,int4-g64,int4-row")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    shape = (a.rows, a.cols)
    weights = {
        "Gaussian": rng.standard_normal(shape).astype(np.float32),
        "Student-t(4)": rng.standard_t(4, shape).astype(np.float32),
    }
    print(f"{a.rows}×{a.cols}; command: python py/benches/affine_groups.py --rows {a.rows} --cols {a.cols} --specs {a.specs}")
    print("| weights | spec | bits / value (held) | SNR dB | Gaussian bound at those bits, dB |")
    print("|---|---|---:|---:|---:|")
    for name, w in weights.items():
        w64 = w.astype(np.float64)
        for spec in a.specs.split(","):
            op = hypercodec.Linear.quantize(w, spec)
            got = np.asarray(op.weight(), dtype=np.float64).reshape(shape)
            bits = op.held_bytes * 8 / w.size
            snr = 10 * math.log10((w64**2).sum() / ((w64 - got) ** 2).sum())
            print(f"| {name} | `{spec}` | {bits:.3f} | {snr:.2f} | {6.02 * bits:.2f} |")


if __name__ == "__main__":
    main()
