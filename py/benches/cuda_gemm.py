"""The tensor-core affine GEMM (batches above 16) in each of its compiled shapes, against torch
bf16 `F.linear`, the decode-then-cuBLAS route and the batch-16 tensor-core kernel, in one run.

    python py/benches/cuda_gemm.py [--shapes 4096x4096,8192x8192] [--batches 16,64,256] [--out FILE]
                                   [--wgmma crates/kernels-cuda/ptx/gemm_sm90a.ptx ...] [--wg-extra NAME:S:BN:BK[:KS],...]
                                   [--wg-only SUBSTR,...]

Random INT4 codes in groups of `--group` columns (128; row-major, as stored), asymmetric, with f16 scales and
offsets in the tiled layout `DeviceLinear` holds (`_driver.tile_scales`); bf16 activations.
Each kernel is checked against x·Ŵᵀ in float32, then timed as `--iters` launches in a CUDA
graph that rotates over weight copies of ≥ 400 MB (L2 never holds them), median of 5 replays
(`_graph_timing.graph_time_us`). `hc_affine_gemm_b4_r{R}_n{NT}_bf16` computes 64·R weight rows
for 8·NT activation rows per block; the row marked `*` is the shape kernels-cuda picks
(`args::gemm_shape`); "decode + F.linear" is the committed decoder (`hc_affine_decode_b4`,
to bf16) then cuBLAS, the route above `MAX_GEMM_BATCH` rows. `--wgmma` adds the Hopper
GEMM `kernels/gemm_sm90a.cu` (its committed sm_90a PTX, or a cubin of it) in each compiled
shape at batches of 64 and more (a shape split over a cluster where each block takes at least
2 chunks; `--wg-only` picks some; a kernel that takes a second parameter, as the committed one
does, gets a tensor map of x for its activations' TMA copies, so an earlier build's cubin,
which copied them with cp.async, runs beside it); `--skip-committed` leaves out the sm_80 GEMM's
shapes.
"""

from __future__ import annotations

import argparse
import ctypes as C
import sys

import torch
import torch.nn.functional as F
from _driver import AffineArgs as Args
from _driver import Driver, tensor_map_2d, tile_scales
from _graph_timing import graph_time_us

# (row tiles per warp, batch tiles of 8, stages): kernels-cuda `args::GEMM_SHAPES`.
SHAPES = [(1, 4, 4), (1, 8, 4), (2, 4, 3), (2, 8, 3)]
# The Hopper kernels' (stages, activation rows, columns a chunk, blocks a cluster splitting the
# columns): kernels-cuda `args::WGMMA_SHAPES` (kernels/gemm_sm90a.cu).
WG_SHAPES = [(4, 128, 128, 1), (6, 128, 64, 1), (5, 256, 64, 1), (4, 128, 128, 2), (6, 128, 64, 2), (5, 256, 64, 2)]


def picked(rows: int, batch: int) -> tuple[int, int]:
    """kernels-cuda `args::gemm_shape`."""
    order = [(2, 4), (1, 4)] if batch <= 32 else [(2, 8), (1, 8), (2, 4), (1, 4)]
    for r, nt in order:
        if -(-rows // (64 * r)) * -(-batch // (8 * nt)) >= 200:
            return (r, nt)
    return (1, 4)


def smem(r: int, nt: int, stages: int, bits: int = 4) -> int:
    """kernels-cuda `args::affine_gemm_shared`."""
    return stages * (8 * nt * 256 + 64 * r * 16 * bits + 4 * r * 128)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096,8192x8192,14336x4096,4096x14336,28672x8192")
    ap.add_argument("--batches", default="16,32,64,128,256,512,1024")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--group", type=int, default=128, help="columns a scale group (64 or 128; the sm_80 GEMM takes 128)")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--wgmma", action="append", default=[], metavar="FILE",
                    help="also time the Hopper GEMM of this module (its PTX or a cubin; may repeat)")
    ap.add_argument("--wg-extra", default="", metavar="NAME:S:BN:BK[:KS],...",
                    help="other kernels of the --wgmma modules to time, with the Hopper GEMM's arguments "
                         "and shared-memory layout (an earlier build's names, say)")
    ap.add_argument("--wg-only", default="", metavar="SUBSTR,...",
                    help="time only the Hopper kernels whose names hold one of these")
    ap.add_argument("--skip-committed", action="store_true", help="leave out the committed GEMM's shapes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_gemm: no CUDA device; nothing measured")
        return 0
    mods = {f"wg{i}": path for i, path in enumerate(args.wgmma)}
    drv = Driver(mods or None)
    wanted = [(f"hc_wgmma_b4_s{st}_n{bn}_k{bk}{f'_x{ks}' if ks > 1 else ''}_bf16", st, bn, bk, ks)
              for st, bn, bk, ks in WG_SHAPES]
    for e in filter(None, args.wg_extra.split(",")):
        name, st, bn, bk, *ks = e.split(":")
        wanted.append((name, int(st), int(bn), int(bk), int(ks[0]) if ks else 1))
    only = [o for o in args.wg_only.split(",") if o]
    wanted = [w for w in wanted if not only or any(o in w[0] for o in only)]
    wg = {}
    for mod in mods:
        for name, st, bn, bk, ks in wanted:
            try:
                f = drv.fn(mod, name)
            except RuntimeError:
                continue  # not in this module
            sm = st * (bn * bk * 2 + 128 * (bk // 2 + 16)) + 1024  # stages (WgStage) + alignment
            drv.check(drv.cu.cuFuncSetAttribute(f, 8, sm), "max dynamic shared memory")
            label = name.removeprefix("hc_").removesuffix("_bf16") + (f" ({mod})" if len(mods) > 1 else "")
            # A kernel taking a tensor map of x after its arguments reads the activations
            # through the tensor memory accelerator.
            wg[label] = (f, sm, bn, bk, ks, len(drv.params(f)) == 2)
    gemm = {}
    for r, n, st in [] if args.skip_committed else SHAPES:
        f = drv.fn("ptx", f"hc_affine_gemm_b4_r{r}_n{n}_bf16")
        drv.check(drv.cu.cuFuncSetAttribute(f, 8, smem(r, n, st)), "max dynamic shared memory")
        gemm[(r, n)] = (f, smem(r, n, st))
    mma16 = drv.fn("ptx", "hc_affine_mma_b4_w4_n2_bf16")
    dec = drv.fn("ptx", "hc_affine_decode_b4")
    torch.manual_seed(0)
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "| shape | batch | kernel | µs per call | × bf16 | rel. error vs float32 |", "|---|---:|---|---:|---:|---:|"]
    for shape in args.shapes.split(","):
        rows, k = (int(v) for v in shape.split("x"))
        glen = args.group
        groups = k // glen
        copies = int(400e6 // (rows * k // 2)) + 1
        w = [torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        sc = torch.rand(rows, groups, device="cuda") * 0.01 + 0.001
        of = torch.randn(rows, groups, device="cuda") * 0.01
        sc16, of16 = sc.half(), of.half()
        sct, oft = tile_scales(sc16), tile_scales(of16)
        q = torch.stack([(w[0].int() >> (4 * i)) & 15 for i in range(2)], -1).reshape(rows, k).float()
        wd = q * sc16.float().repeat_interleave(glen, 1) + of16.float().repeat_interleave(glen, 1)
        wb = wd.to(torch.bfloat16)
        q = None
        for m in (int(v) for v in args.batches.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ wd.T
            y = torch.empty(m, rows, device="cuda", dtype=torch.bfloat16)
            kept = []

            def args_for(i: int) -> Args:
                a = Args(w[i].data_ptr(), sct.data_ptr(), oft.data_ptr(), x.data_ptr(), y.data_ptr(), None,
                         w[i].numel(), 2, 2, m, rows, k, 4, glen, groups, 1.0, 0.0, 7, 1)
                kept.append(a)
                return a

            def err() -> float:
                return float((y.float() - ref).norm() / ref.norm())

            base = graph_time_us(lambda: F.linear(x, wb), args.iters)
            lines.append(f"| {shape} | {m} | torch bf16 F.linear | {base:.1f} | 1.00 | "
                         f"{float((F.linear(x, wb).float() - ref).norm() / ref.norm()):.1e} |")
            cands = [(f"hc_affine_gemm r{r} n{n}" + (" *" if (r, n) == picked(rows, m) else ""), f,
                      (-(-rows // (64 * r)), -(-m // (8 * n))), 128, sm, []) for (r, n), (f, sm) in gemm.items()]
            if m >= 64:
                # (a split takes at least 2 chunks a block: kernels-cuda `args::wgmma_shape`)
                cands += [(label, f, (-(-rows // 128) * ks, -(-m // bn)), 256, sm,
                           [tensor_map_2d(drv, x, 64, bn)] if tma else [])
                          for label, (f, sm, bn, bk, ks, tma) in wg.items()
                          if (k // bk >= 2 * ks or ks == 1) and glen % bk == 0]
            if m <= 16:
                cands.append(("hc_affine_mma_b4_w4_n2 (batch ≤ 16)", mma16, -(-rows // 32), 256, 0, []))
            for name, f, grid, block, sm, extra in cands:
                y.fill_(float("nan"))
                drv.launch(f, grid, block, [args_for(0)] + extra, sm)
                torch.cuda.synchronize()
                e = err()
                it = iter(range(10**9))
                t = graph_time_us(lambda: drv.launch(f, grid, block, [args_for(next(it) % copies)] + extra, sm), args.iters)
                lines.append(f"| {shape} | {m} | {name} | {t:.1f} | {base / t:.2f} | {e:.1e} |")
                kept.clear()
            # The route above MAX_GEMM_BATCH: decode to bf16 (HC_DEC_U = 4 pieces of 8 per
            # thread), then cuBLAS.
            wdec = torch.empty(rows, k, device="cuda", dtype=torch.bfloat16)
            threads = -(-(rows * k // 8) // 4)
            dgrid = min(max(-(-threads // 256), 1), 1 << 20)

            def decode_linear(i: int) -> None:
                drv.launch(dec, dgrid, 256, [args_for(i), C.c_void_p(wdec.data_ptr()), C.c_int(2)])
                torch.matmul(x, wdec.t(), out=y)

            decode_linear(0)
            torch.cuda.synchronize()
            e = err()
            it = iter(range(10**9))
            t = graph_time_us(lambda: decode_linear(next(it) % copies), args.iters)
            lines.append(f"| {shape} | {m} | decode + F.linear | {t:.1f} | {base / t:.2f} | {e:.1e} |")
            kept.clear()
            wdec = None
            print("\n".join(lines[-len(cands) - 2:]), flush=True)
        w = wd = wb = None  # freed before the next shape
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print("\n" + text if args.out is None else f"(table written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
