"""A weight stored ``[in, out]`` (GPT-2's ``Conv1D``) run as stored (``Archive.linear(...,
transposed=True)``: tiles of stored rows decoded and added into ``y``, lattice and trellis rows
summed in their RHT domain) against the same weight stored ``[out, in]`` on the runtime's fast
paths, and dense float32 ``x @ W`` (torch), on the CPU.

    python py/benches/cpu_transposed.py [--shapes 768x2304,768x3072,3072x768] [--batches 1,8]
                                        [--encodings int4,int8,e8@4,tcq@2]

Each weight is random normal (σ 0.02), coded once per orientation with the same options
(``int4``/``int8``: affine, groups of 128; ``e8@4``: lattice E8 at 4 bps, rANS; ``tcq@2``:
trellis at 2 bits); the outputs of both are checked against ``x @ W`` after the timing (the stored ``[in, out]``
error at most twice the ``[out, in]`` one's, or 2e-3: the two orientations are coded apart). Median of 7 runs of
``--calls`` calls each, in microseconds per call; prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

# numpy's BLAS threads spin a while after a product returns and took the cores from the timings
# that followed; the check's products are small.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hypercodec  # noqa: E402
from hypercodec import _native  # noqa: E402

OPTIONS = {
    "int4": dict(encoding="affine", bits=4),
    "int8": dict(encoding="affine", bits=8),
    "e8@4": dict(encoding="lattice", bps=4),
    "tcq@2": dict(encoding="trellis", bits=2),
}


def median_us(f, calls: int) -> float:
    f()
    runs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="768x2304,768x3072,3072x768", help="[in]x[out], comma-separated")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--encodings", default="int4,int8,e8@4,tcq@2", help=", ".join(OPTIONS))
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| [in, out] | encoding | batch | stored [in, out] µs | stored [out, in] µs | ratio | dense f32 µs | routes |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as d:
        for shape in a.shapes.split(","):
            i, o = (int(v) for v in shape.split("x"))
            w = (rng.standard_normal((i, o)) * 0.02).astype(np.float32)
            wt = torch.from_numpy(w)
            for enc in a.encodings.split(","):
                paths = [os.path.join(d, "t.hwz"), os.path.join(d, "l.hwz")]
                hypercodec.save({"w": w}, paths[0], verbose=False, **OPTIONS[enc])
                hypercodec.save({"w": np.ascontiguousarray(w.T)}, paths[1], verbose=False, **OPTIONS[enc])
                t = _native.Archive(paths[0]).linear("w", None, None, True)
                lin = _native.Archive(paths[1]).linear("w")
                for b in (int(v) for v in a.batches.split(",")):
                    x = rng.standard_normal((b, i)).astype(np.float32)
                    xt = torch.from_numpy(x)
                    us = [median_us(lambda op=op: op.forward(x), a.calls) for op in (t, lin)]
                    dense = median_us(lambda: xt @ wt, a.calls)
                    time.sleep(0.5)  # (until torch's threads stop spinning)
                    want = x @ w
                    err = [np.linalg.norm(op.forward(x) - want) / np.linalg.norm(want) for op in (t, lin)]
                    if err[0] > 2 * max(err[1], 1e-3):
                        raise SystemExit(f"{shape} {enc} batch {b}: stored [in, out] off by {err[0]:.2e}, [out, in] {err[1]:.2e}")
                    print(f"| {i}×{o} | {enc} | {b} | {us[0]:.0f} | {us[1]:.0f} | {us[0] / us[1]:.2f} | {dense:.0f} | "
                          f"{t.route(b)} / {lin.route(b)} |")


if __name__ == "__main__":
    main()
