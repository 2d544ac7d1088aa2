"""Output SNR of a compressed 64x256 Gaussian layer scaled by factors from 1e-30 to 1e30, per
encoding: tiny and huge weights keep the quality of unit ones (scales that f16 cannot hold are
stored as bf16). Prints a markdown table.

    python scripts/scale_range.py
"""

from __future__ import annotations

import numpy as np

import hypercodec

SPECS = ["int8-row", "int4", "int4-row", "e8@4", "e8-fixed4", "tcq@2-l12", "cb-b2-k16"]
FACTORS = [1e-30, 1e-9, 1e-7, 1e-5, 1e-4, 1.0, 1e4, 1e8, 1e30]


def snr(spec: str, factor: float) -> str:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 256)) * factor).astype(np.float32)
    x = rng.standard_normal((8, 256))
    try:
        op = hypercodec.Linear.quantize(w, spec)
    except hypercodec.HypercodecError as e:
        return f"error: {type(e).__name__}"
    ref = x @ w.astype(np.float64).T
    got = op.forward(x.astype(np.float32)).astype(np.float64)
    db = 10 * np.log10((ref**2).mean() / ((got - ref) ** 2).mean())
    return f"{db:.1f}"


def main() -> None:
    print("| encoding | " + " | ".join(f"×{f:g}" for f in FACTORS) + " |")
    print("|---|" + "---:|" * len(FACTORS))
    for spec in SPECS:
        print(f"| {spec} | " + " | ".join(snr(spec, f) for f in FACTORS) + " |")


if __name__ == "__main__":
    main()
