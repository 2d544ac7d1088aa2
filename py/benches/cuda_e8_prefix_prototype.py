"""Entropy-coded E8 with lane-interleaved prefix codes (kernels/prototypes/e8_prefix_gemv.cu, the
format modelled in _e8prefix.py): its instruction count, its rate, and on a GPU its speed beside
torch bf16 `F.linear` and the committed layers (`e8@4-gpu`: rANS; `e8@4-prefix`: the format's
prefix codes, whose kernels are this file's 8-row layout), in one run.

    nvcc -cubin -arch=sm_90 -O3 -I kernels -o .dev/e8p.cubin kernels/prototypes/e8_prefix_gemv.cu   # here
    python py/benches/cuda_e8_prefix_prototype.py --sass .dev/e8p.cubin     # here: SASS a symbol
    python py/benches/cuda_e8_prefix_prototype.py --rate                    # here: bits against SNR
    python py/benches/cuda_e8_prefix_prototype.py --host                    # here: the kernel's source on the CPU
    python py/benches/cuda_e8_prefix_prototype.py --dry-run --shapes 40x1024,13x2080 --batches 1,16,17
                                                   # here: the GPU mode's own code, kernels on the CPU
    python py/benches/cuda_e8_prefix_prototype.py .dev/e8p.cubin            # on the GPU

The GPU run quantizes N(0, 1) rows (the RHT's output is Gaussian) to E8 at about 4 bits a value
all-in, encodes them here in numpy, and checks each kernel's y against x·Ŵᵀ in float64 (a y off
by more than 2e-5 relative, or a decoded weight off by a bit, fails the run with exit 1 after the
table). It times at least 40 launches in a CUDA graph, median of 5 replays
(`_graph_timing.graph_time_us`), on a persistent grid (the occupancy API's blocks per SM),
rotating over copies of the payload (≥ 400 MB or 64 copies: L2 holds none at 4096² and up). The
prototype reads RHT(x) in f32 like the committed kernel (f16 for the tensor cores). The committed
layers' times include their activation RHT and read one payload (≤ 34 MB at 8192², which L2 can
hold); their kernels alone (from RHT(x)) and the RHT alone are timed too; `e8@4-prefix` with
f32 and bf16 activations (bf16 rows up to 16 take its tensor cores). The GPU run
needs a CUDA device of compute capability 9.0 (it exits 0 with a message otherwise).
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

# name: (code limits, refill group). "r8_…": the rows8 layout (…_mma: tensor cores, batches ≤ 16).
KERNELS = {"l8": (8, 4), "l10": (10, 3), "l12": (12, 2), "l8c16": (8, 4), "l8c32": (8, 4), "pairs12": (12, 0),
           "pairs11": (11, 0), "r8_l8": (8, 4), "r8_l8c32": (8, 4), "r8_pairs12": (12, 0), "r8_l8_mma": (8, 4),
           "r8_l8c32_mma": (8, 4), "r8_pairs12_mma": (12, 0), "r8_l8_decode": (8, 4), "r8_pairs12_decode": (12, 0),
           "r8_pairs12_d2": (12, 0), "r8_pairs12_d2w8": (12, 0), "r8_pairs11": (11, 0),
           "r8_pairs11_d2": (11, 0), "r8_pairs12_d2_mma": (12, 0), "r8_pairs12_d2_mma1": (12, 0)}
D2_PAIRS = 0  # --d2-pairs: pairs of row groups a block for the _d2 kernels (0: as many as fill the SMs)
# copies of the tables in shared memory (1 otherwise)
COPIES = {"l8c16": 16, "l8c32": 32, "r8_l8c32": 32, "r8_l8c32_mma": 32}


def describe(key: str) -> str:
    L, G = KERNELS[key]
    where = ("8-row layout, tensor cores, " if "_mma" in key else "8-row layout, decode to bf16, "
             if key.endswith("_decode") else "8-row layout, ") if key.startswith("r8") else ""
    if "_d2" in key:
        where += "two chunks a warp (row groups g, g + 1), "
    if "pairs" in key:
        return f"{where}pairs: singles ≤ 8 bits, pairs ≤ {L} bits, 2 refills a word"
    copies = f", {COPIES[key]} table copies" if key in COPIES else ""
    return f"{where}singles ≤ {L} bits, refills every {G}{copies}"


def model_of(key: str, sym: np.ndarray):
    L, _ = KERNELS[key]
    return P.PairModel(sym, 8, L) if "pairs" in key else P.Model(sym, L)


def layout_of(key: str, rows: int, cols: int):
    return P.Rows8Layout(rows, cols) if key.startswith("r8") else P.RowLayout(rows, cols)


def dual(key: str) -> bool:
    """Two chunks a warp (`hc_e8_prefix_r8_d2`): 2 KB of rings a warp, pairs of row groups."""
    return "_d2" in key


def sass(cubin: str) -> None:
    """Instructions of one trip of each kernel's full-step loop (one E8 word a lane)."""
    import cuda_roofline as R

    env = dict(os.environ)
    env["PATH"] = os.path.dirname(R.tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    text = subprocess.run([R.tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True,
                          env=env).stdout
    print("| kernel | codes | SASS a word (8 symbols a lane): ring not topped up · topped up at every refill | a symbol "
          "| LDS | VOTE | HMMA |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, ins in sorted(R.functions(text).items()):
        key = name.removeprefix("hc_e8_prefix_")
        L, G = KERNELS[key]
        # A word's table lookups and its refills' ring reads.
        lookups = 5 + 2 if "pairs" in key else 8 + -(-8 // G)
        # The full-step loop: the shortest backward branch whose trip (the ring not topped up)
        # makes exactly a word's shared-memory reads (the rows8 kernels' final sums are a loop
        # of other ones; ptxas may duplicate a refill's tail, so the static count can differ).
        avoid = frozenset({"LDG", "LDGSTS"})  # the ring is topped up with LDGSTS
        trips = []
        for a, b in R.loops(ins):
            try:
                path = R.executed_path(ins, a, b, avoid)
            except SystemExit:
                continue
            if path["LDS"] == lookups:
                trips.append((b - a, a, b, path))
        _, lo, hi, bare = min(trips, key=lambda t: t[0])
        full = R.executed_path(ins, lo, hi, frozenset())
        assert bare["LDS"] == lookups, "one table lookup a unit, one ring read a refill"
        n0, n1 = sum(bare.values()), sum(full.values())
        print(f"| `{name}` | {describe(key)} | {n0} · {n1} | {n0 / 8:.1f}–{n1 / 8:.1f} | {bare['LDS']} | "
              f"{bare['VOTE']} | {bare['HMMA']} |")


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 bits, rounded to nearest even (finite values), as the kernels round."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def quantize(w: np.ndarray, alpha: float, layout=None) -> tuple[np.ndarray, np.ndarray]:
    """E8 symbols of each row scaled to unit RMS times `alpha` (words in the layout's order), and
    the row scales (σ/α)."""
    layout = layout or P.RowLayout(*w.shape)
    sigma = np.sqrt((w.astype(np.float64) ** 2).mean(1)).clip(1e-30)
    u = layout.words(w / sigma[:, None] * alpha).reshape(-1, 8)
    return P.e8_symbols(u), sigma / alpha


def build(w: np.ndarray, alpha: float, key: str, quantized=None):
    """The payload of kernel `key` for w at lattice scale α: the encoding, bits a value all-in,
    the decoded matrix Ŵ (float64) and the row scales."""
    rows, cols = w.shape
    if w.size == 0:
        raise ValueError(f"a {rows}x{cols} matrix has no weights to encode")
    layout = layout_of(key, rows, cols)
    sym, scales = quantized if quantized is not None else quantize(w, alpha, layout)
    model = model_of(key, sym)
    enc = P.encode(sym, rows, cols, model, layout)
    bits = enc.stored_bits() + 32 * rows  # f32 row scales
    doubled = P.doubled_coords(sym).reshape(rows, cols // 8, 8)
    if "_mma" in key and np.abs(doubled).max(initial=0) > 2048:
        raise ValueError("doubled coordinates beyond 2048: f16 fragments would round them")
    what = 0.5 * scales.astype(np.float32).astype(np.float64)[:, None] * layout.matrix(doubled)
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
        # (the tensor-core kernels and table copies read the same payloads as these)
        for key in ("l8", "l10", "l12", "pairs12", "pairs11", "r8_l8", "r8_pairs12"):
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


HOST_CASES = [  # rows, cols, α, kernel, warps a block, grid (a grid smaller than the chunks strides), M
    (37, 1024, 4.0, "l8", 8, 1, 1), (5, 896, 3.0, "l10", 2, 2, 1), (3, 4104, 2.0, "l12", 1, 3, 1),
    (40, 64, 4.0, "l8", 2, 1, 1), (1, 8, 1.0, "l8", 1, 1, 1), (4, 8192, 6.0, "l10", 4, 1, 1),
    (9, 1000, 4.0, "l12", 1, 2, 1), (70, 256, 0.5, "l8", 8, 2, 1), (300, 512, 4.0, "l8", 2, 1, 1),
    (33, 4096, 4.0, "l10", 8, 3, 1), (37, 1024, 4.0, "pairs12", 8, 1, 1), (5, 896, 3.0, "pairs11", 2, 2, 1),
    (1, 8, 1.0, "pairs12", 1, 1, 1), (9, 1000, 4.0, "pairs12", 1, 2, 1), (300, 512, 2.0, "pairs11", 2, 1, 1),
    (33, 4096, 4.5, "pairs12", 8, 3, 1), (37, 1024, 4.0, "l8c16", 8, 1, 1), (9, 1000, 3.0, "l8c32", 2, 2, 1),
    (300, 512, 4.0, "l8c32", 2, 1, 1),
    # The rows8 layout: a block is 2 row groups' segments where they fit (warps column ignored);
    # partial groups.
    (37, 1024, 4.0, "r8_l8", 0, 2, 1), (8, 4096, 3.0, "r8_pairs12", 0, 1, 1), (1, 32, 1.0, "r8_l8", 0, 1, 1),
    (20, 8192, 4.0, "r8_l8c32", 0, 1, 1), (300, 512, 2.0, "r8_pairs12", 0, 7, 1), (13, 96, 6.0, "r8_l8", 0, 1, 1),
    (37, 1024, 4.0, "r8_l8_mma", 0, 2, 16), (8, 4096, 3.0, "r8_pairs12_mma", 0, 1, 5), (1, 32, 1.0, "r8_l8_mma", 0, 1, 1),
    (20, 8192, 4.0, "r8_l8c32_mma", 0, 1, 9), (300, 512, 2.0, "r8_pairs12_mma", 0, 7, 16),
    (13, 96, 6.0, "r8_l8_mma", 0, 1, 8),
    # α = 0: an all-zero matrix (one code a context, every word zero: no word is stored).
    (16, 256, 0.0, "l8", 2, 1, 1), (16, 256, 0.0, "r8_pairs12_mma", 0, 1, 3), (16, 256, 0.05, "pairs12", 2, 1, 1),
    (5, 264, 4.0, "pairs12", 1, 1, 1), (2, 16392, 4.0, "pairs11", 1, 1, 1),
    # Short last segments (2080 = 2048 + 32 columns, 6176 = 3 · 2048 + 32).
    (11, 2080, 4.0, "r8_l8", 0, 1, 1), (11, 2080, 4.0, "r8_pairs12_mma", 0, 1, 7), (9, 6176, 3.0, "r8_l8c32_mma", 0, 2, 16),
    # Two chunks a warp: odd group counts (the last pair a single group), partial groups, short segments.
    (37, 1024, 4.0, "r8_pairs12_d2", 0, 1, 1), (8, 4096, 3.0, "r8_pairs12_d2", 0, 1, 1),
    (300, 512, 2.0, "r8_pairs12_d2", 0, 7, 1), (11, 2080, 4.0, "r8_pairs12_d2w8", 0, 1, 1),
    (20, 8192, 4.0, "r8_pairs12_d2w8", 0, 2, 1), (16, 256, 0.0, "r8_pairs12_d2", 0, 1, 1),
    (13, 96, 6.0, "r8_pairs12_d2", 0, 1, 1), (64, 6176, 3.0, "r8_pairs12_d2", 0, 3, 1),
    (37, 1024, 4.0, "r8_pairs11_d2", 0, 1, 1), (37, 1024, 4.0, "r8_pairs12_d2_mma", 0, 1, 16),
    (300, 512, 2.0, "r8_pairs12_d2_mma1", 0, 7, 5), (11, 2080, 4.0, "r8_pairs12_d2_mma", 0, 1, 7),
    (64, 6176, 3.0, "r8_pairs12_d2_mma", 0, 3, 2), (8, 4096, 3.0, "r8_pairs12_d2_mma1", 0, 1, 9), (40, 4096, 4.0, "r8_pairs11", 0, 2, 1),
    # Decode to bf16 (the weights, compared bit for bit; warps column: warps a block).
    (37, 1024, 4.0, "r8_l8_decode", 2, 3, 1), (11, 2080, 3.0, "r8_pairs12_decode", 4, 1, 1),
    (1, 32, 1.0, "r8_l8_decode", 1, 1, 1), (16, 256, 0.0, "r8_pairs12_decode", 1, 2, 1),
]


def host(sanitize: bool) -> int:
    """Runs the kernel's own source on the CPU (kernels/prototypes/host_simt.h) on odd shapes and
    on corrupt payloads; y is checked against x·Ŵᵀ in float64 (x rounded to f16 for the tensor
    cores). With `sanitize`, built with AddressSanitizer: a read off any array stops the run."""
    import pathlib
    import tempfile

    root = pathlib.Path(__file__).resolve().parents[2]
    exe = root / ".dev" / ("e8p_host_asan" if sanitize else "e8p_host")
    exe.parent.mkdir(exist_ok=True)
    flags = ["-fsanitize=address", "-g", "-O1"] if sanitize else ["-O2"]
    subprocess.run(["g++", "-std=c++20", "-pthread", *flags, "-I", str(root / "kernels"), "-x", "c++", "-o", str(exe),
                    str(root / "kernels/prototypes/e8_prefix_host.cpp")], check=True)
    rng = np.random.default_rng(7)
    bad = 0
    print("| rows × cols | α | kernel | M | warps, grid | chunks | rel. error of y | corrupt payloads |")
    print("|---|---:|---|---:|---|---:|---:|---|")
    for rows, cols, alpha, key, warps, grid, m in HOST_CASES:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.1, 10, (rows, 1)).astype(np.float32)
        if alpha == 0:
            w, alpha = np.zeros_like(w), 1.0
        x = rng.standard_normal((m, cols)).astype(np.float32)
        layout = layout_of(key, rows, cols)
        quantized = quantize(w, alpha, layout)
        sym = quantized[0]
        enc, _, what, scales = build(w, alpha, key, quantized)
        assert np.array_equal(P.emulate(enc), P.doubled_coords(sym).reshape(rows, cols // 8, 8))
        mma = "_mma" in key
        xk = x.astype(np.float16) if mma else x
        ref = xk.astype(np.float64) @ what.T  # m × rows
        xin = xk
        segs = getattr(layout, "segments", 1)
        decode = key.endswith("_decode")
        if key.startswith("r8") and not decode:  # blocks of 2 row groups where they fit, else 1
            warps = segs * (2 if 2 * segs <= 16 else 1)
            if dual(key):  # pairs of row groups: one pair a block (two where they fit)
                warps = segs * (2 if 2 * segs <= 8 else 1)
        if decode:  # the weights, scaled in f32, rounded to bf16
            sc32 = (np.float32(0.5) * scales.astype(np.float32))[:, None]
            doubled = P.doubled_coords(sym).reshape(rows, cols).astype(np.float32)
            want = bf16_bits(sc32 * doubled)

        def run(words, index) -> np.ndarray | None:
            with tempfile.TemporaryDirectory() as d:
                chunks = len(index) - 1
                np.array([len(words), rows, cols, enc.layout.rows_per_chunk, chunks, segs,
                          getattr(layout, "seg_blocks", 0), m], np.int64).tofile(f"{d}/meta.bin")
                for name, arr in (("words", words), ("index", index), ("table", enc.table),
                                  ("scales", scales.astype(np.float32)), ("x", xin)):
                    np.ascontiguousarray(arr).tofile(f"{d}/{name}.bin")
                r = subprocess.run([str(exe), d, key, str(warps), str(grid)], capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stderr[-2000:])
                    return None
                if decode:
                    return np.fromfile(f"{d}/y.bin", np.uint16).reshape(rows, cols)
                return np.fromfile(f"{d}/y.bin", np.float32).reshape(m, rows)

        y = run(enc.words, enc.index)
        if decode:  # bit for bit: the fraction of weights that differ
            err = float(np.mean(y != want)) if y is not None else float("nan")
            ok = y is not None and err == 0
        else:
            # Relative to Σ|x|·|Ŵ| (the GEMV takes each coordinate to 2^-17 of itself: HC_EP_VALUE).
            scale = max(np.linalg.norm(np.abs(xk.astype(np.float64)) @ np.abs(what).T), 1e-300)
            err = float(np.linalg.norm(y - ref) / scale) if y is not None else float("nan")
            ok = y is not None and (err < 1e-5 or (not ref.any() and not y.any()))
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
        print(f"| {rows} × {cols} | {alpha} | {key} | {m} | {warps}, {grid} | {len(enc.index) - 1} | {err:.1e} | "
              f"{', '.join(outcomes)} |")
    print("host run:", "every case checks" if not bad else f"{bad} case(s) failed")
    return 1 if bad else 0


class Args(C.Structure):
    """`E8PrefixArgs` of kernels/prototypes/e8_prefix_gemv.cu (96 bytes)."""

    _fields_ = [("words", C.c_void_p), ("index", C.c_void_p), ("table", C.c_void_p), ("row_scales", C.c_void_p),
                ("xr", C.c_void_p), ("y", C.c_void_p), ("bias", C.c_void_p), ("nwords", C.c_longlong),
                ("rows", C.c_int), ("cols", C.c_int), ("rows_per_chunk", C.c_int), ("chunks", C.c_int),
                ("segments", C.c_int), ("seg_blocks", C.c_int), ("M", C.c_int),
                ("y_dtype", C.c_int)]


class CudaBackend:
    """The prototype's cubin through the driver API, on PyTorch's current stream, timed as CUDA
    graphs (`_graph_timing.graph_time_us`)."""

    cuda = True

    def __init__(self, cubin: str) -> None:
        import torch
        from _driver import Driver
        from _graph_timing import graph_time_us

        self.torch, self.drv, self.time_us = torch, Driver({"proto": cubin}), graph_time_us
        self.dev = torch.device("cuda")
        self.sms = torch.cuda.get_device_properties(self.dev).multi_processor_count

    def fn(self, name: str):
        return self.drv.fn("proto", name)

    def set_smem(self, fn, smem: int) -> None:
        self.drv.check(self.drv.cu.cuFuncSetAttribute(fn, 8, smem), "max dynamic shared memory")

    def blocks_per_sm(self, fn, block: int, smem: int) -> int:
        n = C.c_int()
        self.drv.check(self.drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(n), fn, block,
                                                                               C.c_size_t(smem)), "occupancy")
        return n.value

    def launch(self, fn, grid: int, block: int, args: Args, smem: int) -> None:
        self.drv.launch(fn, grid, block, [args], smem)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()


class HostBackend:
    """The same kernels' source on the CPU (kernels/prototypes/host_simt.h, built as a shared
    library) over host tensors: `--dry-run` runs the GPU mode's own code end to end without a GPU
    (every check; the times are wall-clock µs of one call, not a benchmark)."""

    cuda = False

    def __init__(self) -> None:
        import pathlib

        import torch

        root = pathlib.Path(__file__).resolve().parents[2]
        lib = root / ".dev" / "e8p_host.so"
        lib.parent.mkdir(exist_ok=True)
        subprocess.run(["g++", "-std=c++20", "-O2", "-pthread", "-shared", "-fPIC", "-DHC_EP_LIBRARY", "-I",
                        str(root / "kernels"), "-x", "c++", "-o", str(lib),
                        str(root / "kernels/prototypes/e8_prefix_host.cpp")], check=True)
        self.lib = C.CDLL(str(lib))
        self.lib.hc_ep_host_launch.argtypes = [C.c_char_p, C.c_void_p, C.c_int, C.c_int]
        self.torch, self.dev, self.sms = torch, torch.device("cpu"), 4

    def time_us(self, fn, iters: int) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    def fn(self, name: str) -> str:
        return name.removeprefix("hc_e8_prefix_")

    def set_smem(self, fn, smem: int) -> None:
        pass

    def blocks_per_sm(self, fn, block: int, smem: int) -> int:
        return 2 if smem <= 227 * 1024 // 2 else 1 if smem <= 227 * 1024 else 0

    def launch(self, fn, grid: int, block: int, args: Args, smem: int) -> None:
        if self.lib.hc_ep_host_launch(fn.encode(), C.addressof(args), block // 32, grid) != 0:
            raise RuntimeError(f"no host kernel {fn}")

    def sync(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass


def gpu(be, shapes: list[tuple[int, int]], kernels: list[str], batches: list[int], alpha: float,
        iters: int) -> int:
    """The GPU mode on backend `be` (CudaBackend, or HostBackend for a dry run)."""
    import torch

    dev, sms, graph_time_us = be.dev, be.sms, be.time_us
    failed = []
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    print("| size | batch | method | bits a value all-in | µs a call | × bf16 speed | rel. error of y vs float64 "
          "x·Ŵᵀ | encode s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for rows, cols in shapes:
        w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
        wb = torch.from_numpy(w).to(dev, torch.bfloat16)
        xs = {m: torch.randn(m, cols, device=dev) for m in batches}
        base = {}
        for m in batches:
            xb = xs[m].to(torch.bfloat16)
            base[m] = graph_time_us(lambda: torch.nn.functional.linear(xb, wb), iters)
            print(f"| {rows}x{cols} | {m} | torch bf16 F.linear | 16 | {base[m]:.1f} | 1.00 | | |")
        try:
            if not be.cuda:
                raise ImportError("the committed layer runs on CUDA only")
            import hypercodec
            import hypercodec.cuda as hcuda

            # The committed layers: rANS in chunks of whole rows, and the format's prefix codes
            # (the 8-row layout's kernels in the PTX; bf16 rows take its tensor cores).
            for spec in ("e8@4-gpu", "e8@4-prefix"):
                t0 = time.time()
                op = hypercodec.Linear.quantize(w, spec)
                d = hcuda.DeviceLinear(op, dev)
                enc_s = time.time() - t0
                wt = np.asarray(op.weight(), dtype=np.float64).reshape(rows, cols).T
                for m in batches:
                    for dt in (torch.float32, torch.bfloat16) if spec.endswith("prefix") else (torch.float32,):
                        x = xs[m].to(dt)
                        y = d.forward(x).double().cpu().numpy()
                        ref = x.double().cpu().numpy() @ wt
                        err = f"{np.linalg.norm(y - ref) / np.linalg.norm(ref):.1e}"
                        t = graph_time_us(lambda: d.forward(x), iters)
                        print(f"| {rows}x{cols} | {m} | ours {spec}, committed, whole layer, {str(dt)[6:]} "
                              f"({d.route(m, dt)}) | {op.stored_bytes * 8 / w.size:.3f} | {t:.1f} | "
                              f"{base[m] / t:.2f} | {err} | {enc_s:.0f} |")
                # The same layer from its rotated input (the kernel alone), and its RHT alone, batch 1.
                x = xs[1] if 1 in xs else xs[batches[0]][:1]
                xr = torch.empty(1, 8 * d.words, device=dev)
                rargs = {"x": x.data_ptr(), "x_dtype": 0, "out": xr.data_ptr(), "batch": 1, "cols": cols,
                         "width": 8 * d.words, "tile": d.tile, "seed": d.seed}
                t_rht = graph_time_us(lambda: d.kernels.rht(rargs, stream()), iters)
                d.kernels.rht(rargs, stream())
                t_k = graph_time_us(lambda: d._from_rotated(xr, None, torch.float32, True, stream()), iters)
                print(f"| {rows}x{cols} | 1 | (its GEMV alone, from RHT(x): {spec}) | | {t_k:.1f} | "
                      f"{base.get(1, t_k) / t_k:.2f} | | |")
                print(f"| {rows}x{cols} | 1 | (its activation RHT alone) | | {t_rht:.1f} | | | |")
        except ImportError as e:
            print(f"(no committed row: {e})")
        def decode_run(key, layout, enc, sym, scales, what, bpv, enc_s, fn, grid, block, smem, words, index, table,
                       row_scales, chunks, segs, seg_blocks, copies):
            """The decode kernel: its bf16 weights checked bit for bit, timed alone, then timed
            with the GEMM (torch F.linear) at every batch."""
            wout = torch.empty(rows, cols, dtype=torch.bfloat16, device=dev)
            argv = [Args(wd.data_ptr(), index.data_ptr(), table.data_ptr(), row_scales.data_ptr(), None,
                         wout.data_ptr(), None, len(enc.words), rows, cols, enc.layout.rows_per_chunk, chunks, segs,
                         seg_blocks, 1) for wd in words]
            be.launch(fn, grid, block, argv[0], smem)
            be.sync()
            sc32 = (np.float32(0.5) * scales.astype(np.float32))[:, None]
            want = bf16_bits(sc32 * P.doubled_coords(sym).reshape(rows, cols).astype(np.float32))
            diff = float(np.mean(wout.view(torch.int16).cpu().numpy().view(np.uint16) != want))
            if diff:
                failed.append(f"{key} {rows}x{cols}: {diff:.1e} of the decoded weights differ")
            turn = iter(range(10**9))
            launch = lambda: be.launch(fn, grid, block, argv[next(turn) % copies], smem)  # noqa: E731
            t = graph_time_us(launch, max(iters, copies))
            print(f"| {rows}x{cols} | – | prototype {key} ({describe(key)}), decode alone | {bpv:.3f} | {t:.1f} | | "
                  f"{diff:.0e} of weights differ | {enc_s:.0f} |")
            for m, x in xs.items():
                xin = x.to(torch.bfloat16)
                ref = x.to(torch.bfloat16).double().cpu().numpy() @ what.T
                got = torch.nn.functional.linear(xin, wout).double().cpu().numpy()
                err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                if not err < 2e-2:  # bf16 weights and outputs
                    failed.append(f"{key} {rows}x{cols} batch {m}: rel. error {err:.1e}")
                t = graph_time_us(lambda: (launch(), torch.nn.functional.linear(xin, wout)), max(iters, copies))
                print(f"| {rows}x{cols} | {m} | prototype {key}, decode + F.linear | {bpv:.3f} | {t:.1f} | "
                      f"{base[m] / t:.2f} | {err:.1e} | |")

        quantized, built = {}, {}
        for key in kernels:
            mma, r8, decode = "_mma" in key, key.startswith("r8"), key.endswith("_decode")
            layout = layout_of(key, rows, cols)
            t0 = time.time()
            if layout.name not in quantized:
                quantized[layout.name] = quantize(w, alpha, layout)
            # Kernels of one layout and code share a payload (table copies and tensor cores
            # read the same stream): encoded once.
            same = (layout.name, key.replace("r8_", "").replace("_mma1", "").replace("_mma", "").replace("_decode", "").replace("c16", "")
                    .replace("c32", ""))
            try:
                if same not in built:
                    built[same] = build(w, alpha, key, quantized[layout.name])
                enc, bpv, what, scales = built[same]
                if mma and np.abs(P.doubled_coords(quantized[layout.name][0])).max(initial=0) > 2048:
                    raise ValueError("doubled coordinates beyond 2048: f16 fragments would round them")
            except ValueError as e:
                print(f"| {rows}x{cols} | | prototype {key} | ({e}) | | | | |")
                continue
            enc_s = time.time() - t0
            to = lambda arr: torch.from_numpy(np.ascontiguousarray(arr).view(np.int32)).to(dev)  # noqa: E731
            # Copies of the payload (≥ 400 MB, or 64), rotated call by call in a graph of at least
            # as many calls, so that no call finds its payload in L2.
            copies = min(64, max(1, -(-400_000_000 // max(4 * len(enc.words), 1)))) if be.cuda else 1
            words = [to(enc.words) for _ in range(copies)]
            index, table = to(enc.index), to(enc.table)
            row_scales = torch.from_numpy(scales.astype(np.float32)).to(dev)
            chunks = len(enc.index) - 1
            segs, seg_blocks = getattr(layout, "segments", 1), getattr(layout, "seg_blocks", 0)
            fn = be.fn(f"hc_e8_prefix_{key}")

            # At most 16 warps a block, fewer where the chunks would not fill every SM.
            if r8 and not decode and dual(key):  # pairs of row groups, a warp a pair's segment
                most = 8 if key.endswith("w8") else 16
                pairs = max(1, min(most // segs, layout.groups // (2 * sms)))
                if D2_PAIRS:
                    pairs = max(1, min(16 // segs, D2_PAIRS))
                block, gpb = 32 * segs * pairs, 2 * pairs
            elif r8 and not decode:
                gpb = max(1, min(16 // segs, layout.groups // sms))  # row groups a block
                block = 32 * segs * gpb
            else:  # a chunk a warp
                block = 32 * max(1, min(16, chunks // sms))
            # A persistent grid (the kernels stride over chunks or row groups): each block loads
            # the tables once.
            rings = 2 if dual(key) else 1
            smem = 1024 * rings * (block // 32) + 4 * len(enc.table) * COPIES.get(key, 1)  # rings, then tables
            be.set_smem(fn, smem)
            per_sm = be.blocks_per_sm(fn, block, smem)
            need = -(-layout.groups // gpb) if r8 and not decode else -(-chunks // (block // 32))
            if per_sm < 1:
                failed.append(f"{key} {rows}x{cols}: no block fits an SM ({smem} B of shared memory)")
                continue
            grid = min(need, per_sm * sms)
            if decode:
                decode_run(key, layout, enc, quantized[layout.name][0], scales, what, bpv, enc_s, fn, grid, block, smem,
                           words, index, table, row_scales, chunks, segs, seg_blocks, copies)
                del words
                continue
            runs = [m for m in batches if m <= 16] if mma else [1]
            if not set(runs) & set(xs):
                print(f"| {rows}x{cols} | | prototype {key} | (no batch it takes in --batches) | | | | |")
            for m in runs:
                if m not in xs:
                    continue
                x = xs[m]
                xk = x.half() if mma else x
                ref = xk.double().cpu().numpy() @ what.T
                xin = xk.contiguous()
                y = torch.full((m, rows), float("nan"), device=dev)
                argv = [Args(wd.data_ptr(), index.data_ptr(), table.data_ptr(), row_scales.data_ptr(), xin.data_ptr(),
                             y.data_ptr(), None, len(enc.words), rows, cols, enc.layout.rows_per_chunk, chunks, segs,
                             seg_blocks, m) for wd in words]
                be.launch(fn, grid, block, argv[0], smem)
                be.sync()
                got = y.double().cpu().numpy()
                err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                if not err < 2e-5:  # f32 sums, each product within 2^-17 of exact (f16 x: rounded before the reference)
                    failed.append(f"{key} {rows}x{cols} batch {m}: rel. error {err:.1e}")
                turn = iter(range(10**9))
                t = graph_time_us(lambda: be.launch(fn, grid, block, argv[next(turn) % copies], smem),
                                  max(iters, copies))
                print(f"| {rows}x{cols} | {m} | prototype {key} ({describe(key)}) | {bpv:.3f} | {t:.1f} | "
                      f"{base[m] / t:.2f} | {err:.1e} | {enc_s:.0f} |")
            del words
        be.empty_cache()
    for f in failed:
        print("FAILED:", f)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", nargs="?", help="the prototype built for sm_90 (GPU run)")
    ap.add_argument("--sass", metavar="CUBIN", help="count the kernels' instructions (no GPU)")
    ap.add_argument("--rate", action="store_true", help="bits against SNR on the CPU")
    ap.add_argument("--host", action="store_true", help="run the kernel's source on the CPU (g++)")
    ap.add_argument("--asan", action="store_true", help="with --host: build with AddressSanitizer")
    ap.add_argument("--dry-run", action="store_true",
                    help="the GPU mode's code on the CPU (the kernels' source through host_simt.h), small shapes")
    ap.add_argument("--shapes", default="4096x4096,8192x8192",
                    help="GPU run: rows×cols list (28672x8192 takes about 4 minutes of numpy encoding)")
    ap.add_argument("--kernels", default="l8,l8c32,l10,pairs12,r8_l8,r8_pairs12,r8_l8_mma,r8_pairs12_mma,"
                    "r8_l8_decode,r8_pairs12_decode",
                    help="GPU run: " + ",".join(KERNELS))
    ap.add_argument("--batches", default="1,4,16,256",
                    help="GPU run: activation rows (the GEMVs take 1, the _mma kernels 1–16, _decode any)")
    ap.add_argument("--alpha", type=float, default=4.0, help="lattice scale (4: about 4.2 bits a value)")
    ap.add_argument("--chunk-symbols", type=int, default=P.CHUNK_SYMBOLS,
                    help="symbols a chunk aims at (fewer: more warps, more padding)")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--d2-pairs", type=int, default=0,
                    help="pairs of row groups a block for the _d2 kernels (0: as many as fill the SMs)")
    args = ap.parse_args()
    P.CHUNK_SYMBOLS = args.chunk_symbols
    global D2_PAIRS
    D2_PAIRS = args.d2_pairs
    if args.sass:
        sass(args.sass)
    if args.rate:
        rate(1024, 4096)
    if args.host:
        rc = host(args.asan)
        if rc:
            return rc
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    if args.dry_run:
        return gpu(HostBackend(), shapes, args.kernels.split(","), batches, args.alpha, 1)
    if args.cubin:
        import torch

        if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
            print("cuda_e8_prefix_prototype: no CUDA device of compute capability 9.0 (the cubin is sm_90); "
                  "nothing to do")
            return 0
        return gpu(CudaBackend(args.cubin), shapes, args.kernels.split(","), batches, args.alpha, args.iters)
    if not (args.sass or args.rate or args.host):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
