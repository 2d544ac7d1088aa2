"""The GPU-shaped entropy codings of E8 against each other, the bound and the CPU-shaped and
fixed-rate forms, in one run on the CPU (no GPU needed):

    python py/benches/e8_gpu_codings.py [--size 2048x4096] [--bits 4,3,2]

For each rate: bits a value as stored (every stream: words, chunk offsets, the model, the row
scales), the SNR of the decoded weight, the Gaussian bound 6.02·R dB at that rate, the bytes a
GPU holds per weight (the device form's arrays; 2.0 for the decode fallback's bf16 copy), and the
CPU runtime's decode and batch-1 forward times (medians of 5; the CPU decoder is the reference, the
GPU decodes these forms inside its GEMV). Forms: `e8@B` (rANS in CPU chunks), `e8@B-gpu` (rANS
in chunks of whole rows), `e8@B-prefix` (prefix codes: 8-bit singles, 12-bit pairs, chunks of
eight rows, or of several groups of eight where a row is short), `e8@B-prefix10`, `e8@B-prefix12` (singles of 10 and 12 bits) and `e8-fixedB`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import hypercodec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="2048x4096", help="ROWSxCOLS of the N(0, 1) matrix")
    ap.add_argument("--bits", default="4,3,2", help="rates, bits a value")
    args = ap.parse_args()
    rows, cols = (int(v) for v in args.size.split("x"))
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32)
    power = float((w.astype(np.float64) ** 2).sum())
    print(f"N(0, 1) {rows}x{cols}; SNR of the decoded weight; times: CPU, medians of 5")
    print("| spec | bits a value, all-in | SNR dB | bound 6.02·R dB | vs e8@B-gpu dB | GPU bytes a weight | decode ms | "
          "forward (batch 1) ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for b in (int(v) for v in args.bits.split(",")):
        peer = None
        for spec in (f"e8@{b}-gpu", f"e8@{b}", f"e8@{b}-prefix", f"e8@{b}-prefix10", f"e8@{b}-prefix12",
                     f"e8-fixed{b}"):
            try:
                op = hypercodec.Linear.quantize(w, spec)
            except hypercodec.HypercodecError as e:
                print(f"| {spec} | refused: {e} | | | | | |")
                continue
            bits = op.stored_bytes * 8 / w.size
            err = (op.weight() - w).astype(np.float64)
            snr = 10 * np.log10(power / float((err**2).sum()))
            if spec.endswith("-gpu"):
                peer = snr
            dec, fwd = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                op.weight()
                dec.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                op.forward(x)
                fwd.append(time.perf_counter() - t0)
            rel = "" if peer is None or spec.endswith("-gpu") else f"{snr - peer:+.2f}"
            # What a GPU holds of the layer (its device form's arrays), or the decode fallback's
            # bf16 copy where no kernel runs the form.
            form = op.device_form()
            held = (sum(np.asarray(v).nbytes for v in form.values() if isinstance(v, np.ndarray)) / w.size
                    if form is not None else 2.0)
            print(f"| {spec} | {bits:.3f} | {snr:.2f} | {6.0206 * bits:.2f} | {rel} | {held:.4f} | "
                  f"{1e3 * np.median(dec):.1f} | {1e3 * np.median(fwd):.1f} |", flush=True)


if __name__ == "__main__":
    main()
