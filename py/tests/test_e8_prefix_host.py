"""The committed CUDA kernels of prefix-coded E8 (kernels/e8_prefix.cu) run on the CPU: their own
source built with g++ under kernels/prototypes/host_simt.h (one thread a lane; votes, shuffles
and mma.sync through barriers), fed the device form the wheel builds from the Rust encoder's
streams (`Linear.device_form()`), and checked against the stored weight in the rotated domain
(`Linear.int8_weight()`: the doubled E8 points and their row scales). Skips, with the reason,
where g++ is missing."""

import ctypes as C
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import hypercodec

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "prototypes" / "e8_prefix_format_host.cpp"
# The host runs lanes as threads: the sums differ from float64 by f32 rounding only.
Y_RTOL = 2e-5
# The tensor cores take f16 activations (the doubled points are f16-exact).
MMA_RTOL = 1e-5
# Host "SMs": the launch shapes follow hypercodec_kernels_cuda (whole row groups a block).
SMS = 4


class Args(C.Structure):
    """`E8PrefixArgs` of kernels/e8_prefix.cuh (96 bytes, as `hypercodec_kernels_cuda`'s)."""

    _fields_ = [("words", C.c_void_p), ("index", C.c_void_p), ("table", C.c_void_p), ("row_scales", C.c_void_p),
                ("xr", C.c_void_p), ("y", C.c_void_p), ("bias", C.c_void_p), ("nwords", C.c_longlong),
                ("rows", C.c_int), ("cols", C.c_int), ("rows_per_chunk", C.c_int), ("chunks", C.c_int),
                ("segments", C.c_int), ("seg_blocks", C.c_int), ("M", C.c_int),
                ("y_dtype", C.c_int)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++: the kernels' source was not run on the host")
    out = tmp_path_factory.mktemp("e8p") / "e8p_format.so"
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-I", str(ROOT / "kernels"),
                    "-I", str(ROOT / "kernels" / "prototypes"), "-x", "c++", "-o", str(out), str(SOURCE)],
                   check=True)
    so = C.CDLL(str(out))
    so.hc_e8p_host_launch.argtypes = [C.c_char_p, C.c_void_p, C.c_int, C.c_int]
    return so


# The compiled forms' kernel suffixes, by (limit, pair_limit).
FORMS = {(8, 0): "l8", (10, 0): "l10", (12, 0): "l12", (8, 11): "p11", (8, 12): "p12"}


def _form(f):
    return FORMS[(f["limit"], f["pair_limit"])]


def _launch_args(lib, kind, a, y, batch, max_grid=2 * SMS):
    """One launch of kernel `kind` over the wheel's argument dict `a` (host pointers: the keys
    `DeviceLinear` passes), shaped as `Kernels::e8_prefix_gemv` / `e8_prefix_decode` shape it:
    their grid is capped by the blocks resident at once, `max_grid` here (1 makes every block
    stride)."""
    rows, cols, seg, span = a["rows"], a["cols"], a["segment"], a["span"]
    blocks = cols // 32
    segs = -(-blocks // seg)
    groups = -(-rows // 8)
    chunks = -(-groups // span) * segs
    xr = a["xr16"] if batch > 1 else a["xr"]
    args = Args(a["words_ptr"] or None, a["index"], a["table"], a["row_scales"], xr or None, y, a["bias"] or None,
                a["payload_words"], rows, cols, 8 * span, chunks, segs, min(seg, blocks), batch, a.get("y_dtype", 0))
    if kind.startswith("decode") or span > 1:
        warps = min(max(chunks // SMS, 1), 16)
        grid = min(-(-chunks // warps), max_grid)
    elif kind in ("gemv2", "mma2"):  # pairs of row groups, as `e8_prefix_pairs` picks them (residency aside)
        most = max(16 // segs, 1)
        pairs = min(range(1, most + 1), key=lambda p: (-(-(-(-groups // (2 * p))) // SMS) * p, -p))
        warps, grid = segs * pairs, min(-(-groups // (2 * pairs)), max_grid)
    else:
        gpb = max(1, min(16 // segs, groups // SMS))
        warps, grid = segs * gpb, min(-(-groups // gpb), max_grid)
    assert lib.hc_e8p_host_launch(f"hc_e8p_{kind}_{_form(a)}".encode(), C.addressof(args), warps, grid) == 0


def _launch(lib, kind, f, rows, xr, y, m, keep, bias=None, max_grid=2 * SMS, y_dtype=0):
    """`_launch_args` over a device form `f` and host arrays (kept alive in `keep`)."""
    payload = np.ascontiguousarray(f["payload"]).view(np.uint32)
    starts = np.ascontiguousarray(f["starts"], np.uint32)
    table = np.ascontiguousarray(f["table"], np.uint32)
    scales = np.ascontiguousarray(f["row_scales"], np.float32)
    keep += [payload, starts, table, scales]
    ptr = lambda a: a.ctypes.data if a is not None and a.size else 0  # noqa: E731
    a = {"words_ptr": ptr(payload), "payload_words": len(payload), "index": ptr(starts), "table": ptr(table),
         "row_scales": ptr(scales), "bias": ptr(bias), "rows": rows, "cols": 8 * f["words"], "segment": f["segment"],
         "span": f["span"], "y_dtype": y_dtype, "limit": f["limit"], "pair_limit": f["pair_limit"], "xr": ptr(xr), "xr16": ptr(xr)}
    _launch_args(lib, kind, a, ptr(y), m, max_grid)


# Specs of every compiled form; shapes with a partial row group (pairs of groups a warp: alone
# at 37 rows, the second of the last pair at 44), one or several segments a row, a short row
# (96 columns: 3 blocks). `-c16384`: chunks of 2^14 symbols, the size large matrices take (6176
# columns: 4 segments, the last one block; rows of one segment make chunks of several row
# groups: spans of 2, 21, 8 and 4 groups here, the last span short, the last group partial;
# 2080 and 6176 columns make chunks of one). Without it the writer's rule for matrices this small
# gives the same chunks, but a row's blocks shared out evenly (6176 columns: 3 segments of 65).
CASES = [("e8@4-prefix-c16384", 40, 1024), ("e8@3-prefix8-c16384", 13, 2080), ("e8@4-prefix10-c16384", 41, 96),
         ("e8@4-prefix12-c16384", 16, 256), ("e8@3-prefix8p11-c16384", 3, 6176), ("e8@2-prefix-c16384", 63, 512),
         ("e8@4-prefix-c16384", 37, 2080), ("e8@3-prefix8p11-c16384", 24, 6176), ("e8@4-prefix-c16384", 16, 4096),
         ("e8@4-prefix-c16384", 44, 2080), ("e8@4-prefix", 40, 1024), ("e8@3-prefix8p11", 201, 96),
         ("e8@4-prefix", 24, 6176), ("e8@4-prefix10", 16, 256)]


def _kind(f, rows, m):
    """The kernel `Kernels::e8_prefix_gemv` launches for `m` activation rows: two chunks a warp
    (`gemv2`, `mma2`) for the pair forms where chunks are one row group and there are two groups
    or more."""
    two = "2" if f["pair_limit"] and f["span"] == 1 and rows > 8 else ""
    return ("mma" if m > 1 else "gemv") + two


@pytest.mark.parametrize("spec, rows, cols", CASES)
def test_the_kernels_source_computes_the_stored_weight(lib, spec, rows, cols):
    rng = np.random.default_rng(rows * cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec)
    f = op.device_form()
    assert f is not None and f["kind"] == "e8prefix", f
    base = spec.removesuffix("-c16384")
    one_segment = cols <= 1024  # a row at most half a chunk's symbols
    assert (f["span"] > 1) == one_segment, (spec, f["span"])
    two = base.endswith(("-prefix", "p11")) and not one_segment and rows > 8
    assert _kind(f, rows, 1) == ("gemv2" if two else "gemv") and _kind(f, rows, 5) == ("mma2" if two else "mma")
    ref = op.int8_weight()
    wr = ref["values"].astype(np.float64) * ref["scales"].astype(np.float64)[:, None]  # rows × cols, rotated
    keep = []
    bias = rng.standard_normal(rows).astype(np.float32)
    # The GEMV (one f32 row) and the tensor cores (f16 rows, 2 to 16), with a bias, on the
    # launch's grid and on one block that strides over every row group.
    runs = [(1, 2 * SMS, "gemv"), (5, 2 * SMS, "mma"), (16, 2 * SMS, "mma"), (1, 1, "gemv"), (7, 1, "mma")]
    if two:  # and the kernels of two chunks a warp
        runs += [(1, 2 * SMS, "gemv2"), (1, 1, "gemv2"), (5, 2 * SMS, "mma2"), (16, 2 * SMS, "mma2"), (7, 1, "mma2")]
    for m, max_grid, kind in runs:
        if m == 1:
            x = rng.standard_normal((1, cols)).astype(np.float32)
            xk, tol = x, Y_RTOL
        else:
            x = rng.standard_normal((m, cols)).astype(np.float16).astype(np.float32)
            xk, tol = x.astype(np.float16), MMA_RTOL
        y = np.full((m, rows), np.nan, np.float32)
        _launch(lib, kind, f, rows, xk, y, m, keep, bias, max_grid)
        want = x.astype(np.float64) @ wr.T + bias
        err = np.abs(y - want).max() / max(np.abs(want).max(), 1e-30)
        assert err <= tol, (spec, kind, m, max_grid, err)
        # y as f16 and bf16: the same f32 sums, rounded to nearest even.
        y16 = np.full((m, rows), 0xFFFF, np.uint16)
        _launch(lib, kind, f, rows, xk, y16, m, keep, bias, max_grid, y_dtype=1)
        assert np.array_equal(y16.view(np.float16), y.astype(np.float16)), (spec, kind, m, "f16 y")
        _launch(lib, kind, f, rows, xk, y16, m, keep, bias, max_grid, y_dtype=2)
        u = y.view(np.uint32).astype(np.uint64)
        assert np.array_equal(y16, ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)), (spec, kind, m, "bf16 y")
    # The decoders: the scaled weight, rounded as the kernels round it.
    # `int8_weight` holds E8's doubled points; the kernels scale them by ½·σ/α in f32.
    sc = (np.float32(0.5) * np.asarray(f["row_scales"], np.float32))[:, None]
    exact = sc * ref["values"].astype(np.float32)
    for kind, dt, max_grid in (("decode_f32", np.float32, 2 * SMS), ("decode_f16", np.float16, 2 * SMS),
                               ("decode_f32", np.float32, 1)):
        out = np.full((rows, cols), np.nan, dt)
        _launch(lib, kind, f, rows, None, out, 0, keep, max_grid=max_grid)
        assert np.array_equal(out, exact.astype(dt)), (spec, kind, max_grid)
    out = np.zeros((rows, cols), np.uint16)
    _launch(lib, "decode_bf16", f, rows, None, out, 0, keep)
    u = exact.view(np.uint32).astype(np.uint64)
    bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    assert np.array_equal(out, bf16), spec


@pytest.mark.parametrize("rows, cols", [(64, 256), (24, 2080)])
def test_corrupt_words_stay_in_bounds(lib, rows, cols):
    """Random words, a payload cut short and chunk offsets past its end decode to wrong values,
    never outside the buffers (the offsets are clamped, reads past a chunk's end give 0); chunks
    of several row groups (256 columns) and of one, two a warp (2080)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    f = dict(hypercodec.Linear.quantize(w, "e8@4-prefix").device_form())
    keep = []
    payload = np.ascontiguousarray(f["payload"]).view(np.uint32)
    for bad in ("random", "short", "offsets"):
        g = dict(f)
        if bad == "random":
            g["payload"] = rng.integers(0, 2**32, len(payload), dtype=np.uint64).astype(np.uint32).view(np.uint8)
        elif bad == "short":
            g["payload"] = payload[: len(payload) // 2].view(np.uint8)
            g["starts"] = np.minimum(np.asarray(f["starts"]), len(payload) // 2).astype(np.uint32)
        else:
            g["starts"] = np.asarray(f["starts"], np.uint32) + np.uint32(1 << 20)
        y = np.zeros((1, rows), np.float32)
        _launch(lib, _kind(f, rows, 1), g, rows, rng.standard_normal((1, cols)).astype(np.float32), y, 1, keep)
        assert np.isfinite(y).all(), bad
        if _kind(f, rows, 3) == "mma2":  # the tensor cores, two chunks a warp
            y3 = np.zeros((3, rows), np.float32)
            _launch(lib, "mma2", g, rows, rng.standard_normal((3, cols)).astype(np.float16), y3, 3, keep)
            assert np.isfinite(y3).all(), (bad, "mma2")


class _HostKernels:
    """The two `CudaKernels` methods a prefix-coded `DeviceLinear` calls, run by the host build
    of the kernels over host tensors' pointers, launched as `Kernels::e8_prefix_gemv` /
    `e8_prefix_decode` launch them."""

    def __init__(self, lib) -> None:
        self.lib = lib

    def e8_prefix_loaded(self, limit: int, pair_limit: int) -> bool:
        return (limit, pair_limit) in FORMS

    def e8_prefix_gemv(self, a: dict, stream: int) -> None:
        assert 1 <= a["batch"] <= 16 and stream == 0
        kind = _kind(a, a["rows"], a["batch"])
        _launch_args(self.lib, kind, a, a["y"], a["batch"])

    def e8_prefix_decode(self, a: dict, out: int, dtype: int, stream: int) -> None:
        _launch_args(self.lib, {0: "decode_f32", 1: "decode_f16", 2: "decode_bf16"}[dtype], a, out, 0)


def test_device_linear_routes_prefix_layers_through_the_kernels_source(lib, monkeypatch):
    """`hypercodec.cuda.DeviceLinear` on a prefix-coded layer, run on the host: the kernels'
    source stands in for the GPU (and the torch RHT for the RHT kernel), so every route's Python
    side — passes of 16 rows on the tensor cores, f32 rows one by one, the decode route, a forced
    GEMV past 16 rows — is checked against the CPU runtime without a GPU."""
    torch = pytest.importorskip("torch")
    import types

    import hypercodec.cuda as hcuda
    import hypercodec.nn as hnn

    host = _HostKernels(lib)
    monkeypatch.setattr(hcuda, "kernels", lambda device: host)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(hcuda, "_stream", lambda index: 0)  # (the raw stream query a forward asks)

    def rht(x2, width, tile, seed, out16=None):
        assert width == x2.shape[1]
        xr = hnn._rht(x2.float(), tile, seed).contiguous()
        if out16 is not None:
            out16.copy_(xr.half())
        return xr

    monkeypatch.setattr(hcuda, "rht", rht)
    rng = np.random.default_rng(11)
    rows, cols = 44, 512  # chunks spanning 4 row groups
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    op = hypercodec.Linear.quantize(w, "e8@4-prefix", b)
    assert op.device_form()["span"] == 4
    d = hcuda.DeviceLinear(op, torch.device("cpu", 0))
    assert d.kind == "e8prefix" and d.rotation() == (cols, d.tile, d.seed)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
        for m in (1, 2, 5, 16, 17, 20):
            x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
            want = op.forward(x.float().numpy())
            for route in (None, "gemv"):
                got = d.forward(x, route=route).float().numpy()
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err <= tol, (dtype, m, route, d.route(m, dtype), err)
    # Chunks of one row group (2080 columns): two a warp at every fused batch (gemv2, mma2).
    w3 = rng.standard_normal((44, 2080)).astype(np.float32)
    op3 = hypercodec.Linear.quantize(w3, "e8@4-prefix")
    d3 = hcuda.DeviceLinear(op3, torch.device("cpu", 0))
    assert _kind(op3.device_form(), 44, 1) == "gemv2"
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for m in (1, 5, 16):
            x = torch.from_numpy(rng.standard_normal((m, 2080)).astype(np.float32)).to(dtype)
            got, want = d3.forward(x).float().numpy(), op3.forward(x.float().numpy())
            assert np.abs(got - want).max() <= tol * np.abs(want).max(), (dtype, m, d3.route(m, dtype))
    # Layers that read one input share the RHT (forward_group's rotated path; its device check
    # needs a CUDA tensor), each output its forward's.
    w2 = rng.standard_normal((24, cols)).astype(np.float32)
    d2 = hcuda.DeviceLinear(hypercodec.Linear.quantize(w2, "e8@3-prefix10"), torch.device("cpu", 0))
    assert d2.rotation() == d.rotation()
    for m in (1, 7):
        x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(torch.bfloat16)
        ys = hcuda._rotated_group([d, d2], x)
        assert ys is not None and all(torch.equal(y, e.forward(x)) for y, e in zip(ys, (d, d2)))
    assert d.route(1, torch.bfloat16) == "cuda-e8prefix-gemv"
    assert d.route(16, torch.bfloat16) == "cuda-e8prefix-mma"
    assert d.route(4, torch.float32) == "cuda-e8prefix-gemv"
    assert d.route(5, torch.float32) == "cuda-e8prefix-decode+linear"
    assert d.route(17, torch.float16) == "cuda-e8prefix-decode+linear"
