"""Shared-memory wavefronts of a warp's random 4-byte table lookups with C interleaved copies of
the table (entry i of copy j at word C·i + j, lane l reading copy l mod C), as the prefix-code
kernels' `l8cC` prototypes lay them out: the fullest of the 32 banks, counting each distinct
word once (lanes reading the same word share it). No GPU needed.

    python py/benches/cuda_bank_conflicts.py [--entries 256] [--draws 4000]
"""

from __future__ import annotations

import argparse

import numpy as np


def wavefronts(words: np.ndarray) -> int:
    """Passes of the shared-memory pipe for one warp's 32 word addresses."""
    distinct = np.unique(words)
    return int(np.bincount(distinct % 32, minlength=32).max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=256)
    ap.add_argument("--draws", type=int, default=4000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    lanes = np.arange(32)
    print(f"{a.entries}-entry table, uniform random entries, {a.draws} warp lookups each")
    print("| copies C | table KB | wavefronts a lookup |")
    print("|---:|---:|---:|")
    for c in (1, 2, 4, 8, 16, 32):
        mean = np.mean([wavefronts(c * rng.integers(0, a.entries, 32) + lanes % c) for _ in range(a.draws)])
        print(f"| {c} | {4 * a.entries * c / 1024:.0f} | {mean:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
