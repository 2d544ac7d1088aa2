"""CPU runtime, batch 1: the forward time of each lattice's entropy-coded layer (E8, D4, A2, Z1
in rANS, the CPU's chunks) beside fixed-rate E8 and INT4 g128, on seeded N(0, 1) weights, with
the rate and SNR of each and the error of y against the decoded weight; medians of 7.

    python py/benches/cpu_lattice_forward.py [--size 4096x4096] [--bits 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import hypercodec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="4096x4096", help="ROWSxCOLS")
    ap.add_argument("--bits", type=float, default=4.0, help="bits a value")
    args = ap.parse_args()
    rows, cols = (int(v) for v in args.size.split("x"))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    b = f"{args.bits:g}"
    specs = [f"e8@{b}", f"d4@{b}", f"a2@{b}", f"z1@{b}", f"e8-fixed{int(args.bits)}", f"int{int(args.bits)}"]
    print(f"N(0, 1) {rows}x{cols}, batch 1, CPU runtime; medians of 7")
    print("| spec | path | bits a value | SNR dB | forward ms | y error (rel. to max) |")
    print("|---|---|---:|---:|---:|---:|")
    for spec in specs:
        op = hypercodec.Linear.quantize(w, spec)
        what = np.asarray(op.weight(), dtype=np.float64).reshape(rows, cols)
        snr = 10 * np.log10((w.astype(np.float64) ** 2).sum() / ((w - what) ** 2).sum())
        op.forward(x)
        times = []
        for _ in range(7):
            t = time.perf_counter()
            y = op.forward(x)
            times.append(time.perf_counter() - t)
        ref = x.astype(np.float64) @ what.T
        err = np.abs(y - ref).max() / np.abs(ref).max()
        print(f"| {spec} | {op.path} | {op.stored_bytes * 8 / w.size:.3f} | {snr:.2f} | "
              f"{1e3 * sorted(times)[3]:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
