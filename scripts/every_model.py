#!/usr/bin/env python3
"""The "Every model" tables of the README, measured in one run (standard library only).

    python3 scripts/every_model.py MODEL.safetensors [--bin target/release/hypercodec]

For every row: `hypercodec compress MODEL out.hwz ARGS`, then `inspect --json` of the archive.
Columns: bits per value of the encoded tensors' streams ("stored"); "all-in" = the file's
bytes less the exactly stored tensors (the raw 1-D tensors: everything outside the lossy
totals), per encoded value, so the manifest and the stored plan are counted; SNR over the encoded tensors; min and
median per-tensor SNR; how many tensors fell back.

With `$HYPERCODEC_PYTHON` importing `hyperglyph` (the peer), `hypercodec benchmark MODEL
--json` measures the peer's default archive in the same run, and BUDGET is searched for the
largest target whose archive is no larger all-in than the peer's file: the comparison at equal
size.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROWS = [
    "--encoding lattice --bps 2",
    "--encoding lattice --bps 3",
    "--encoding lattice --bps 4",
    "--mode budget --target-bps 2",
    "--mode budget --target-bps 3",
    "--mode budget --target-bps 4",
    "--encoding affine --bits 4",
    "--encoding auto",
]


def compress(binary, model, out, args):
    """Compresses; returns (compress --json report, inspect --json of the archive)."""
    report = subprocess.run(
        [binary, "compress", model, out, *args.split(), "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    inspect = subprocess.run(
        [binary, "inspect", out, "--json"], check=True, capture_output=True, text=True
    )
    return json.loads(report.stdout), json.loads(inspect.stdout)


def all_in(inspect):
    """The archive's bits per lossy value all-in: `totals.lossy.all_in_bps` of `inspect --json`
    (the file less the tensors stored exactly, over the lossy tensors' values)."""
    lossy = inspect["totals"]["lossy"]
    if not lossy:
        sys.exit("no lossy tensor in the archive: nothing to compare")
    return lossy["all_in_bps"]


def row(label, report, inspect):
    lossy = inspect["totals"]["lossy"]
    return (
        f"| {label} | {lossy['bps']:.3f} | {all_in(inspect):.3f} | {lossy['snr_db']:.2f} | "
        f"{lossy['min_snr_db']:.2f} / {lossy['median_snr_db']:.2f} | {len(report['fallbacks'])} |"
    )


def peer(binary, model):
    """The peer's row of `hypercodec benchmark` (None when it is not installed)."""
    if not os.environ.get("HYPERCODEC_PYTHON"):
        return None
    out = subprocess.run(
        [binary, "benchmark", model, "--json"], check=True, capture_output=True, text=True
    )
    bench = json.loads(out.stdout)
    p = next((r for r in bench["rows"] if "(peer, file bytes)" in r["representation"]), None)
    return p and dict(p, elements=bench["elements"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--bin", default="target/release/hypercodec")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.hwz")
        print("| ARGS | bps stored | bps all-in | SNR dB | per tensor min / median dB | fallbacks |")
        print("|---|---:|---:|---:|---:|---:|")
        for args in ROWS:
            report, inspect = compress(a.bin, a.model, out, args)
            print(row(f"`{args}`", report, inspect), flush=True)
        p = peer(a.bin, a.model)
        if p is None:
            print("(peer not measured: set $HYPERCODEC_PYTHON to a Python that imports hyperglyph)")
            return
        print(f"| **peer** {p['representation']} | – | {p['bps']:.3f} | {p['snr_db']:.2f} | – | – |")
        # Equal size means the same tensors: the benchmark's (rank >= 2) and our lossy ones.
        ours = inspect["totals"]["lossy"]["elements"]
        if ours != p["elements"]:
            print(f"(warning: the peer covers {p['elements']} values, our lossy tensors {ours})")
        # The largest BUDGET target (to 0.005 bps) whose archive is no larger than the peer's,
        # with each row's own lattice scale (the default) and with one step per tensor.
        found = []
        for extra in ("", " --lattice-scale tensor"):
            # BUDGET's target counts the whole file over all its values (the raw tensors too),
            # the peer's figure its lossy tensors: the target at equal size lies above it.
            lo, hi, best = 0.05, p["bps"] + 1.5, None
            while hi - lo > 0.005:
                mid = (lo + hi) / 2
                report, inspect = compress(a.bin, a.model, out, f"--mode budget --target-bps {mid:.4f}{extra}")
                if all_in(inspect) <= p["bps"]:
                    lo, best = mid, (mid, report, inspect)
                else:
                    hi = mid
            if best is None:
                print(f"(no BUDGET target{extra} fits the peer's size)")
                continue
            t, report, inspect = best
            print(row(f"`--mode budget --target-bps {t:.3f}{extra}` (at the peer's size)", report, inspect))
            found.append((extra.strip() or "default", inspect["totals"]["lossy"]["snr_db"]))
        print()
        for what, snr in found:
            print(f"At the peer's size ({what}): {snr:.2f} dB vs {p['snr_db']:.2f} dB, {snr - p['snr_db']:+.2f} dB.")


if __name__ == "__main__":
    sys.exit(main())
