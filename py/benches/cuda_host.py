"""Host time of an eager call, piece by piece of the Python path, beside ``nn.Linear``.

    python py/benches/cuda_host.py [--spec int4] [--size 4096x4096] [--batch 1] [--profile]

The graph-captured benches (``cuda_linear.py``, ``cuda_e2e.py``) leave Python's launch cost
out, as CUDA graphs and ``torch.compile`` do; eager PyTorch (``generate`` without a compiled
step, say) pays it on every layer. This prints, for one layer at one batch in bf16, the host
µs a call (back-to-back calls, no synchronization inside; median of 5 runs of ``--iters``) and
the host + GPU µs (after a final synchronize) of: ``nn.Linear`` in bf16, ``HyperLinear`` with
grad mode on and under ``no_grad``, its stored forward, ``DeviceLinear.forward`` on 2-D and
3-D inputs, and the stream query. Where a call's host time reaches its GPU time, an eager
model of such layers is bound by Python. ``--profile`` adds cProfile's top functions over
3000 ``HyperLinear`` calls. Needs a CUDA device (exits 0 with a message when there is none).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn as nn


def timed(f, iters: int) -> tuple[float, float]:
    """(host µs a call, host + GPU µs a call): medians of 5 runs of ``iters`` calls."""
    for _ in range(30):
        f()
    torch.cuda.synchronize()
    hs, gs = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hs.append((t1 - t0) / iters * 1e6)
        gs.append((t2 - t0) / iters * 1e6)
    return sorted(hs)[2], sorted(gs)[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="int4")
    ap.add_argument("--size", default="4096x4096", help="ROWSxCOLS of the weight")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_host: no CUDA device; nothing measured")
        return 0
    import hypercodec.nn as hnn

    rows, cols = (int(v) for v in args.size.split("x"))
    torch.manual_seed(0)
    lin = nn.Linear(cols, rows).cuda()
    h = hnn.HyperLinear.from_linear(lin, args.spec).cuda()
    lb = lin.to(torch.bfloat16)
    x = torch.randn(args.batch, cols, dtype=torch.bfloat16, device="cuda")
    x3 = x.view(1, args.batch, cols)
    d = hnn._on_device(h, x.device)

    def no_grad(f):
        def g():
            with torch.no_grad():
                return f()
        return g

    index = x.device.index
    rows_ = [
        ("nn.Linear (bf16)", lambda: lb(x)),
        ("nn.Linear (bf16), no_grad", no_grad(lambda: lb(x))),
        ("HyperLinear", lambda: h(x)),
        ("HyperLinear, no_grad", no_grad(lambda: h(x))),
        ("nn.Linear (bf16), no_grad, 3-D input", no_grad(lambda: lb(x3))),
        ("HyperLinear, no_grad, 3-D input", no_grad(lambda: h(x3))),
        ("HyperLinear._stored_forward", lambda: h._stored_forward(x)),
        ("DeviceLinear.forward, 2-D input", lambda: d.forward(x)),
        ("DeviceLinear.forward, 3-D input", lambda: d.forward(x3)),
        ("torch.cuda.current_stream(i).cuda_stream", lambda: torch.cuda.current_stream(index).cuda_stream),
    ]
    print(f"{args.spec} {rows}x{cols}, batch {args.batch}, bf16; {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"route {d.route(args.batch, torch.bfloat16)}")
    print("| call | host µs | host + GPU µs |")
    print("|---|---:|---:|")
    for name, f in rows_:
        host, total = timed(f, args.iters)
        print(f"| {name} | {host:.1f} | {total:.1f} |")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        with torch.no_grad():
            for _ in range(3000):
                h(x)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
