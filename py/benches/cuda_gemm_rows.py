"""The affine GEMM (17–64 activation rows) against decode + cuBLAS by layer height, alone and in a
group of layers that read one input.

    python py/benches/cuda_gemm_rows.py [--rows 1024,2048,3072,4096] [--cols 4096] [--specs int4,int2]
                                        [--batches 17,32,64] [--groups "4096,1024,1024;2048,512,512"]

Part 1, one layer: for each layer height, the fused route (``DeviceLinear.forward(route="gemv")``,
the tensor-core GEMM at these batches) against decoding to bf16 then ``F.linear``
(``route="decode"``), bf16 ``F.linear`` beside. Part 2, an attention block's q, k and v read one
input (``--groups``: Llama-3-8B's 4096, 1024, 1024 rows and a 2048-wide model's 2048, 512, 512 by
default): ``forward_group`` (each fused
launch on a stream of its own, the layers that decode on the current stream beside them), every
layer's fused kernel side by side (short ones too), the three layers one after another on their
default routes, the tall layer fused with the short ones decoded one after another, and all
decoded.

Each call rotates over device copies of each layer (the same codes uploaded again, at least
``--mb`` MB of them, and a CUDA graph of at least as many calls), so the weights come from memory
as in a model, not from L2; median of 5 graph replays. The fused route is checked against the
decode route first (relative error ≤ 1e-2: both compute on the same decoded values; the error
against bf16 on the original weight, the codes' own, is printed). Prints markdown tables; exits
0 with a message where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import sys

import torch

import hypercodec
import hypercodec.cuda as hcuda
from _graph_timing import graph_time_us


def copies(op, n: int, dev) -> list:
    return [hcuda.DeviceLinear(op, dev) for _ in range(n)]


def count(stored_bytes: int, mb: float) -> int:
    """Copies of ``stored_bytes`` each that make at least ``mb`` MB (2 to 512)."""
    return max(2, min(512, -(-int(mb * 1e6) // max(stored_bytes, 1))))


def rotating(layers_list, fn):
    """A callable that runs ``fn(layers)`` over the next copy of each layer on each call."""
    state = {"i": 0}

    def call():
        i = state["i"]
        state["i"] = (i + 1) % len(layers_list)
        return fn(layers_list[i])

    return call


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1024,2048,3072,4096")
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--specs", default="int4,int2")
    ap.add_argument("--batches", default="17,32,64")
    ap.add_argument("--groups", default="4096,1024,1024;2048,512,512",
                    help="the heights of the layers of each group of part 2, groups apart by ';'")
    ap.add_argument("--mb", type=float, default=400, help="megabytes of weight copies each timing rotates over")
    a = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # (each line out as it is printed: a time limit keeps them)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    dev = torch.device("cuda")
    cols = a.cols
    batches = [int(b) for b in a.batches.split(",")]
    specs = a.specs.split(",")
    print(f"device: {torch.cuda.get_device_name()}, weight copies of at least {a.mb:.0f} MB per timing")
    ok = True

    print("\n## One layer\n")
    print("| rows | spec | batch | bf16 µs | fused µs | decode + cuBLAS µs | fused / decode | route now | "
          "rel. error vs bf16 |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for rows in [int(r) for r in filter(None, a.rows.split(","))]:
        w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)) * 0.02
        wbs = [w.to(dev, torch.bfloat16) for _ in range(count(rows * cols * 2, a.mb))]
        for spec in specs:
            op = hypercodec.Linear.quantize(w.numpy(), spec)
            ds = copies(op, count(op.stored_bytes, a.mb), dev)
            for m in batches:
                x = torch.randn(m, cols, device=dev, dtype=torch.bfloat16)
                want = ds[0].forward(x, route="decode").float()
                e = rel(ds[0].forward(x, route="gemv"), want)
                if not e <= 1e-2:
                    print(f"CHECK FAILED: {rows}x{cols} {spec} batch {m}: fused against decoded, rel. error {e:.3g}")
                    ok = False
                e_bf16 = rel(want, torch.nn.functional.linear(x, wbs[0]).float())
                base = graph_time_us(rotating(wbs, lambda wb: torch.nn.functional.linear(x, wb)), len(wbs))
                fused = graph_time_us(rotating(ds, lambda d: d.forward(x, route="gemv")), len(ds))
                dec = graph_time_us(rotating(ds, lambda d: d.forward(x, route="decode")), len(ds))
                name = ds[0].route(m, torch.bfloat16)
                print(f"| {rows} | {spec} | {m} | {base:.1f} | {fused:.1f} | {dec:.1f} | {fused / dec:.2f} | {name} | {e_bf16:.3f} |")
            del ds
        del wbs
        torch.cuda.empty_cache()

    for group in filter(None, a.groups.split(";")):
        heights = [int(r) for r in group.split(",")]
        part2(heights, cols, specs, batches, a.mb, dev)
    if not ok or not _OK[0]:
        print("some route's check failed", file=sys.stderr)
    return 0 if ok and _OK[0] else 1


_OK = [True]


def part2(heights: list[int], cols: int, specs: list[str], batches: list[int], mb: float, dev) -> None:
    print(f"\n## A group of {len(heights)} layers on one input ({', '.join(f'{h}x{cols}' for h in heights)})\n")
    print("| spec | batch | forward_group µs | every fused kernel side by side µs | one by one, default routes µs "
          "| tallest fused, the rest decoded, one by one µs | all decoded µs | routes now |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    tallest = max(range(len(heights)), key=lambda i: heights[i])
    for spec in specs:
        ops = [hypercodec.Linear.quantize((torch.randn(h, cols, generator=torch.Generator().manual_seed(h + i)) * 0.02).numpy(), spec)
               for i, h in enumerate(heights)]
        sets = [[hcuda.DeviceLinear(op, dev) for op in ops] for _ in range(count(sum(op.stored_bytes for op in ops), mb))]
        n = len(sets)
        for m in batches:
            x = torch.randn(m, cols, device=dev, dtype=torch.bfloat16)
            got = hcuda.forward_group(sets[0], x)
            for d, y in zip(sets[0], got or []):
                e = rel(y, d.forward(x, route="decode").float())
                if not e <= 1e-2:
                    print(f"CHECK FAILED: group {spec} batch {m}: rel. error {e:.3g}")
                    _OK[0] = False

            def mixed(ls):
                return [d.forward(x, route="gemv" if i == tallest else "decode") for i, d in enumerate(ls)]

            def side_by_side(ls):
                # Every layer's fused kernel (the GEMM, short layers too) on a stream of its own.
                ys = [torch.empty(m, d.rows, dtype=x.dtype, device=dev) for d in ls]
                with hcuda._forked(x, len(ls)) as streams:
                    for d, y, s in zip(ls, ys, streams):
                        d.kernels.affine_gemv(dict(d.args, x=x.data_ptr(), x_dtype=2, batch=m, y=y.data_ptr(), y_dtype=2),
                                              s.cuda_stream)
                return ys

            each = lambda ls: [d.forward(x) for d in ls]  # noqa: E731
            t_group = "(None)" if got is None else f"{graph_time_us(rotating(sets, lambda ls: hcuda.forward_group(ls, x)), n):.1f}"
            # (The affine kernels alone: an E8 or trellis group's forward_group is its side by side.)
            affine = sets[0][0].kind == "affine"
            t_side = f"{graph_time_us(rotating(sets, side_by_side), n):.1f}" if affine else "-"
            t_each = graph_time_us(rotating(sets, each), n)
            t_mixed = graph_time_us(rotating(sets, mixed), n)
            t_dec = graph_time_us(rotating(sets, lambda ls: [d.forward(x, route="decode") for d in ls]), n)
            routes = ", ".join(d.route(m, torch.bfloat16).removeprefix("cuda-").removeprefix(d.kind + "-") for d in sets[0])
            print(f"| {spec} | {m} | {t_group} | {t_side} | {t_each:.1f} | {t_mixed:.1f} | {t_dec:.1f} | {routes} |")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
