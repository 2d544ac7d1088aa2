"""Trellis layers on the CPU runtime: rows cut into sequences of 1024 values (`tcq@K-lL`, and
the experimental pair code `tcq@K-lL-v2`) against calibrated rows (sequences of 16, what
`Linear.quantize(w, spec, bias, hessian)` writes), with fixed-rate E8 at 4 bits beside them,
in one run.

    python py/benches/cpu_trellis.py [--shape 1536x576] [--batches 1,4,64]

A Gaussian weight, a Hessian from Gaussian activations; `hypercodec.Linear.forward` timed as
the median of 7 repetitions of 20 calls per batch size. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hypercodec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1536x576")
    ap.add_argument("--batches", default="1,4,64")
    a = ap.parse_args()
    rows, cols = map(int, a.shape.split("x"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    acts = rng.standard_normal((4 * cols, cols)).astype(np.float32)
    h = (acts.T @ acts / len(acts)).astype(np.float32)
    ops = {
        "trellis 2 bits L12, sequences of 1024": hypercodec.Linear.quantize(w, "tcq@2-l12"),
        "trellis pairs (experimental) 2 bits L12, sequences of 1024": hypercodec.Linear.quantize(w, "tcq@2-l12-v2"),
        "trellis 2 bits L12, calibrated (sequences of 16)": hypercodec.Linear.quantize(w, "tcq@2-l12", None, h),
        "trellis 4 bits L16, calibrated (sequences of 16)": hypercodec.Linear.quantize(w, "tcq@4", None, h),
        "E8 fixed-rate 4 bits": hypercodec.Linear.quantize(w, "e8-fixed4"),
    }
    print(f"{rows}x{cols}, hypercodec {hypercodec.__version__}")
    print("\n| layer | " + " | ".join(f"batch {m} µs" for m in a.batches.split(",")) + " |")
    print("|---|" + "---:|" * len(a.batches.split(",")))
    for name, op in ops.items():
        cells = []
        for m in (int(v) for v in a.batches.split(",")):
            x = rng.standard_normal((m, cols)).astype(np.float32)
            op.forward(x)
            times = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(20):
                    op.forward(x)
                times.append((time.perf_counter() - t) / 20)
            cells.append(f"{statistics.median(times) * 1e6:.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
