"""Entropy-coded E8 with lane-interleaved prefix codes (kernels/prototypes/e8_prefix_gemv.cu, the
format modelled in _e8prefix.py): its instruction count, its rate, and on a GPU its speed beside
torch bf16 `F.linear` and the committed rANS GEMV (`e8@4-gpu`), in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/e8p.cubin kernels/prototypes/e8_prefix_gemv.cu   # here
    python py/benches/cuda_e8_prefix_prototype.py --sass .dev/e8p.cubin     # here: SASS a symbol
    python py/benches/cuda_e8_prefix_prototype.py --rate                    # here: bits against SNR
    python py/benches/cuda_e8_prefix_prototype.py --host                    # here: the kernel's source on the CPU
    python py/benches/cuda_e8_prefix_prototype.py .dev/e8p.cubin            # on the GPU

The GPU run quantizes N(0, 1) rows (the RHT's output is Gaussian) to E8 at about 4 bits a value
all-in, encodes them here in numpy, checks each kernel's y against x·Ŵᵀ in float64, and times 40
launches in a CUDA graph, median of 5 replays (`_graph_timing.graph_time_us`). The prototype reads
RHT(x) in f32 like the committed kernel and rotates over copies of its payload (≥ 400 MB, so L2
never holds it); the committed layer's time includes its activation RHT and reads one payload
(≤ 34 MB at 8192², which L2 can hold); its kernel alone (from RHT(x)) and its RHT alone are
timed too. Needs a CUDA device of compute capability 9.0 for the GPU run (exits 0 with a
message otherwise).
"""

from __future__ import annotations

import argparse
import ctypes as C
import os
import subprocess
import sys
import time

import numpy as np

import _e8prefix as P

# name: (code limits, refill group) and the model of its format
KERNELS = {"l8": (8, 4), "l10": (10, 3), "l12": (12, 2), "l8c16": (8, 4), "l8c32": (8, 4), "pairs12": (12, 0),
           "pairs11": (11, 0)}
COPIES = {"l8c16": 16, "l8c32": 32}  # copies of the tables in shared memory (1 otherwise)


def describe(key: str) -> str:
    L, G = KERNELS[key]
    if key.startswith("pairs"):
        return f"pairs: singles ≤ 8 bits, pairs ≤ {L} bits, 2 refills a word"
    copies = f", {COPIES[key]} table copies" if key in COPIES else ""
    return f"singles ≤ {L} bits, refills every {G}{copies}"


def model_of(key: str, sym: np.ndarray):
    L, _ = KERNELS[key]
    return P.PairModel(sym, 8, L) if key.startswith("pairs") else P.Model(sym, L)


def sass(cubin: str) -> None:
    """Instructions of one trip of each kernel's full-step loop (one E8 word a lane)."""
    import cuda_roofline as R

    env = dict(os.environ)
    env["PATH"] = os.path.dirname(R.tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    text = subprocess.run([R.tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True,
                          env=env).stdout
    print("| kernel | codes | SASS a word (8 symbols a lane): no window advance · both | a symbol | LDS | SHFL | VOTE |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, ins in sorted(R.functions(text).items()):
        key = name.rsplit("_", 1)[-1]
        lookups = 5 if key.startswith("pairs") else 8
        # The full-step loop: the shortest backward branch around a word's table lookups.
        lo, hi = min(((a, b) for a, b in R.loops(ins)
                      if sum(1 for i in ins if a <= i[0] <= b and i[1] == "LDS") >= lookups),
                     key=lambda p: p[1] - p[0])
        bare = R.executed_path(ins, lo, hi, frozenset({"LDG"}))  # the window's advance loads words
        full = R.executed_path(ins, lo, hi, frozenset())
        assert bare["LDS"] == lookups, "one table lookup a unit"
        n0, n1 = sum(bare.values()), sum(full.values())
        print(f"| `{name}` | {describe(key)} | {n0} · {n1} | {n0 / 8:.1f}–{n1 / 8:.1f} | {bare['LDS']} | {bare['SHFL']} | "
              f"{bare['VOTE']} |")


def quantize(w: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """E8 symbols of each row scaled to unit RMS times `alpha`, and the row scales (σ/α)."""
    sigma = np.sqrt((w.astype(np.float64) ** 2).mean(1)).clip(1e-30)
    u = (w / sigma[:, None] * alpha).reshape(-1, 8)
    return P.e8_symbols(u), sigma / alpha


def build(w: np.ndarray, alpha: float, key: str, quantized=None):
    rows, cols = w.shape
    sym, scales = quantized if quantized is not None else quantize(w, alpha)
    model = model_of(key, sym)
    enc = P.encode(sym, rows, cols, model)
    bits = enc.stored_bits(model) + 32 * rows  # f32 row scales
    what = 0.5 * scales.astype(np.float32).astype(np.float64)[:, None] * P.doubled_coords(sym).reshape(rows, cols)
    return enc, bits / (rows * cols), what, scales


def snr_db(w: np.ndarray, what: np.ndarray) -> float:
    return float(10 * np.log10((w.astype(np.float64) ** 2).sum() / ((w - what) ** 2).sum()))


def rate(rows: int, cols: int) -> None:
    """Bits a value all-in against SNR on N(0, 1) rows: the prefix forms, their entropy, and the
    committed rANS-gpu and fixed-rate E8 forms of the wheel (if importable), in one run."""
    w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    print(f"\n{rows}x{cols}, N(0, 1); bound: SNR = 6.02·R dB")
    print("| form | α | bits a value all-in | SNR dB | bound at those bits | entropy of the symbols (3 contexts) |")
    print("|---|---:|---:|---:|---:|---:|")
    for alpha in (2.0, 3.0, 4.0):
        sym, scales = quantize(w, alpha)
        h = P.entropy_bits(sym) / sym.size
        for key in (k for k in KERNELS if k not in COPIES):
            try:
                enc, bpv, what, _ = build(w, alpha, key)
            except ValueError as e:
                print(f"| prefix {key} | {alpha} | ({e}) | | | |")
                continue
            s = snr_db(w, what)
            print(f"| prefix {key} ({describe(key)}) | {alpha} | {bpv:.3f} | {s:.2f} | {6.02 * bpv:.2f} | {h:.3f} |")
    try:
        import hypercodec
    except ImportError:
        print("(hypercodec not importable: no rANS-gpu / fixed-rate rows)")
        return
    for spec in ("e8@3-gpu", "e8@4-gpu", "e8@4", "e8-fixed4"):
        op = hypercodec.Linear.quantize(w, spec)
        bpv = op.stored_bytes * 8 / w.size
        what = np.asarray(op.weight(), dtype=np.float64).reshape(rows, cols)
        print(f"| ours {spec} (committed) | | {bpv:.3f} | {snr_db(w, what):.2f} | {6.02 * bpv:.2f} | |")


HOST_CASES = [  # rows, cols, α, kernel, warps a block, grid (a grid smaller than the chunks strides)
    (37, 1024, 4.0, "l8", 8, 1), (5, 896, 3.0, "l10", 2, 2), (3, 4104, 2.0, "l12", 1, 3), (40, 64, 4.0, "l8", 2, 1),
    (1, 8, 1.0, "l8", 1, 1), (4, 8192, 6.0, "l10", 4, 1), (9, 1000, 4.0, "l12", 1, 2), (70, 256, 0.5, "l8", 8, 2),
    (300, 512, 4.0, "l8", 2, 1), (33, 4096, 4.0, "l10", 8, 3), (37, 1024, 4.0, "pairs12", 8, 1),
    (5, 896, 3.0, "pairs11", 2, 2), (1, 8, 1.0, "pairs12", 1, 1), (9, 1000, 4.0, "pairs12", 1, 2),
    (300, 512, 2.0, "pairs11", 2, 1), (33, 4096, 4.5, "pairs12", 8, 3), (37, 1024, 4.0, "l8c16", 8, 1),
    (9, 1000, 3.0, "l8c32", 2, 2), (300, 512, 4.0, "l8c32", 2, 1),
]


def host(sanitize: bool) -> int:
    """Runs the kernel's own source on the CPU (kernels/prototypes/host_simt.h) on odd shapes and
    on corrupt payloads; y is checked against x·Ŵᵀ in float64. With `sanitize`, built with
    AddressSanitizer: a read off any array stops the run."""
    import pathlib
    import tempfile

    root = pathlib.Path(__file__).resolve().parents[2]
    exe = root / ".dev" / ("e8p_host_asan" if sanitize else "e8p_host")
    exe.parent.mkdir(exist_ok=True)
    flags = ["-fsanitize=address", "-g", "-O1"] if sanitize else ["-O2"]
    subprocess.run(["g++", "-std=c++20", "-pthread", *flags, "-x", "c++", "-o", str(exe),
                    str(root / "kernels/prototypes/e8_prefix_host.cpp")], check=True)
    rng = np.random.default_rng(7)
    bad = 0
    print("| rows × cols | α | kernel | warps, grid | chunks | rel. error of y | corrupt payloads |")
    print("|---|---:|---|---|---:|---:|---|")
    for rows, cols, alpha, key, warps, grid in HOST_CASES:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.1, 10, (rows, 1)).astype(np.float32)
        x = rng.standard_normal(cols).astype(np.float32)
        enc, _, what, scales = build(w, alpha, key)
        assert np.array_equal(P.emulate(enc), P.doubled_coords(quantize(w, alpha)[0]).reshape(rows, cols))
        ref = what @ x.astype(np.float64)

        def run(words, index) -> np.ndarray | None:
            with tempfile.TemporaryDirectory() as d:
                chunks = len(index) - 1
                np.array([len(words), rows, cols, enc.rows_per_chunk, chunks], np.int64).tofile(f"{d}/meta.bin")
                for name, arr in (("words", words), ("index", index), ("table", enc.table),
                                  ("scales", scales.astype(np.float32)), ("x", x)):
                    np.ascontiguousarray(arr).tofile(f"{d}/{name}.bin")
                r = subprocess.run([str(exe), d, key, str(warps), str(grid)], capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stderr[-2000:])
                    return None
                return np.fromfile(f"{d}/y.bin", np.float32)

        y = run(enc.words, enc.index)
        err = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-300)) if y is not None else float("nan")
        ok = y is not None and err < 1e-5
        # Corrupt payloads: random words, a truncated stream, an index past the end and out of order.
        outcomes = []
        for words, index in ((rng.integers(0, 2**32, len(enc.words), dtype=np.uint64).astype(np.uint32), enc.index),
                             (enc.words[: len(enc.words) // 2], enc.index),
                             (enc.words, np.sort(rng.integers(0, 2**32, len(enc.index), dtype=np.uint64))[::-1]
                              .astype(np.uint32))):
            yc = run(words, index)
            outcomes.append("ran" if yc is not None else "FAILED")
        ok = ok and all(o == "ran" for o in outcomes)
        bad += not ok
        print(f"| {rows} × {cols} | {alpha} | {key} | {warps}, {grid} | {len(enc.index) - 1} | {err:.1e} | "
              f"{', '.join(outcomes)} |")
    print("host run:", "every case checks" if not bad else f"{bad} case(s) failed")
    return 1 if bad else 0


def gpu(cubin: str, shapes: list[tuple[int, int]], kernels: list[str], alpha: float, iters: int) -> int:
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("cuda_e8_prefix_prototype: no CUDA device of compute capability 9.0; nothing to do")
        return 0
    from _driver import Driver
    from _graph_timing import graph_time_us

    class Args(C.Structure):
        _fields_ = [("words", C.c_void_p), ("index", C.c_void_p), ("table", C.c_void_p), ("row_scales", C.c_void_p),
                    ("xr", C.c_void_p), ("y", C.c_void_p), ("bias", C.c_void_p), ("nwords", C.c_longlong),
                    ("rows", C.c_int), ("cols", C.c_int), ("rows_per_chunk", C.c_int), ("chunks", C.c_int)]

    drv = Driver({"proto": cubin})
    dev = torch.device("cuda")
    print("| size | method | bits a value all-in | µs a call | × bf16 speed | rel. error of y vs float64 x·Ŵᵀ | encode s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for rows, cols in shapes:
        w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
        x = torch.randn(1, cols, device=dev)
        wb = torch.from_numpy(w).to(dev, torch.bfloat16)
        xb = x.to(torch.bfloat16)
        base = graph_time_us(lambda: torch.nn.functional.linear(xb, wb), iters)
        print(f"| {rows}x{cols} | torch bf16 F.linear | 16 | {base:.1f} | 1.00 | |  |")
        try:
            import hypercodec
            import hypercodec.cuda as hcuda

            t0 = time.time()
            op = hypercodec.Linear.quantize(w, "e8@4-gpu")
            d = hcuda.DeviceLinear(op, dev)
            enc_s = time.time() - t0
            y = d.forward(x).double().cpu().numpy()
            ref = x.double().cpu().numpy() @ np.asarray(op.weight(), dtype=np.float64).reshape(rows, cols).T
            err = f"{np.linalg.norm(y - ref) / np.linalg.norm(ref):.1e}"
            t = graph_time_us(lambda: d.forward(x), iters)
            print(f"| {rows}x{cols} | ours e8@4-gpu, committed rANS GEMV + RHT ({d.route(1, torch.float32)}) | "
                  f"{op.stored_bytes * 8 / w.size:.3f} | {t:.1f} | {base / t:.2f} | {err} | {enc_s:.0f} |")
            # The same layer from its rotated input (the kernel alone), and its RHT alone.
            stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
            xr = torch.empty(1, 8 * d.words, device=dev)
            rargs = {"x": x.data_ptr(), "x_dtype": 0, "out": xr.data_ptr(), "batch": 1, "cols": cols,
                     "width": 8 * d.words, "tile": d.tile, "seed": d.seed}
            t_rht = graph_time_us(lambda: d.kernels.rht(rargs, stream()), iters)
            d.kernels.rht(rargs, stream())
            t_k = graph_time_us(lambda: d._from_rotated(xr, None, torch.float32, True, stream()), iters)
            print(f"| {rows}x{cols} | (its rANS GEMV alone, from RHT(x)) | | {t_k:.1f} | {base / t_k:.2f} | | |")
            print(f"| {rows}x{cols} | (its activation RHT alone) | | {t_rht:.1f} | | | |")
        except ImportError:
            print("(hypercodec not importable: no committed row)")
        t0 = time.time()
        quantized = quantize(w, alpha)
        q_s = time.time() - t0
        for key in kernels:
            t0 = time.time()
            try:
                enc, bpv, what, scales = build(w, alpha, key, quantized)
            except ValueError as e:
                print(f"| {rows}x{cols} | prototype {key} | ({e}) | | | | |")
                continue
            enc_s = time.time() - t0 + q_s
            to = lambda arr: torch.from_numpy(np.ascontiguousarray(arr).view(np.int32)).to(dev)  # noqa: E731
            # Copies of the payload, rotated call by call, so that no call finds it in L2 (≥ 400 MB).
            copies = max(1, min(iters, -(-400_000_000 // max(4 * len(enc.words), 1))))
            words = [to(enc.words) for _ in range(copies)]
            index, table = to(enc.index), to(enc.table)
            row_scales = torch.from_numpy(scales.astype(np.float32)).to(dev)
            y = torch.full((rows,), float("nan"), device=dev)
            chunks = len(enc.index) - 1
            argv = [Args(wd.data_ptr(), index.data_ptr(), table.data_ptr(), row_scales.data_ptr(), x.data_ptr(),
                         y.data_ptr(), None, len(enc.words), rows, cols, enc.rows_per_chunk, chunks) for wd in words]
            a = argv[0]
            fn = drv.fn("proto", f"hc_e8_prefix_{key}")
            smem = 4 * len(enc.table) * COPIES.get(key, 1)  # the kernel's dynamic shared memory: its tables
            drv.check(drv.cu.cuFuncSetAttribute(fn, 8, smem), "max dynamic shared memory")
            grid = (chunks + 7) // 8
            drv.launch(fn, grid, 256, [a], smem)
            torch.cuda.synchronize()
            ref = what.astype(np.float64) @ x.double().cpu().numpy()[0]
            got = y.double().cpu().numpy()
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            turn = iter(range(10**9))
            t = graph_time_us(lambda: drv.launch(fn, grid, 256, [argv[next(turn) % copies]], smem), iters)
            del words
            print(f"| {rows}x{cols} | prototype {key} ({describe(key)}) | {bpv:.3f} | {t:.1f} | "
                  f"{base / t:.2f} | {err:.1e} | {enc_s:.0f} |")
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", nargs="?", help="the prototype built for sm_90 (GPU run)")
    ap.add_argument("--sass", metavar="CUBIN", help="count the kernels' instructions (no GPU)")
    ap.add_argument("--rate", action="store_true", help="bits against SNR on the CPU")
    ap.add_argument("--host", action="store_true", help="run the kernel's source on the CPU (g++)")
    ap.add_argument("--asan", action="store_true", help="with --host: build with AddressSanitizer")
    ap.add_argument("--shapes", default="4096x4096,8192x8192",
                    help="GPU run: rows×cols list (28672x8192 takes about 4 minutes of numpy encoding)")
    ap.add_argument("--kernels", default="l8,l8c32,l10,pairs12", help="GPU run: " + ",".join(KERNELS))
    ap.add_argument("--alpha", type=float, default=4.0, help="lattice scale (4: about 4.2 bits a value)")
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args()
    if args.sass:
        sass(args.sass)
    if args.rate:
        rate(1024, 4096)
    if args.host:
        rc = host(args.asan)
        if rc:
            return rc
    if args.cubin:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        return gpu(args.cubin, shapes, args.kernels.split(","), args.alpha, args.iters)
    if not (args.sass or args.rate or args.host):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
