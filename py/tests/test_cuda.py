"""CUDA execution of compressed layers (`hypercodec.cuda`): the device tests skip, with the
reason printed, where torch sees no CUDA device (CI); the error path runs everywhere."""

import itertools
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hypercodec  # noqa: E402
import hypercodec.cuda as hcuda  # noqa: E402
import hypercodec.nn as hnn  # noqa: E402

# Where torch sees a device the kernels must load on it: a failed load is a failure below, not a
# skip (`test_the_kernels_load_where_torch_sees_a_device`).
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the CUDA kernels were not run")


def _split_gemm(d, dtype=torch.bfloat16, batch: int = 17):
    """The tensor-core GEMM split over clusters that the kernels run for layer ``d`` at ``batch``
    rows, as (batch tiles, blocks a cluster), or None (kernels-cuda ``affine_gemm_split``: on
    unless ``HYPERCODEC_GEMM_SPLIT=0`` turns it off, compute capability 9.0 only). A short layer
    takes the GEMM at 17-64 rows on its own where it splits over 2 blocks or more."""
    dt = {torch.float16: 1, torch.bfloat16: 2}[dtype]
    return d.kernels.affine_gemm_split(dict(d.args, x=0, x_dtype=dt, y=0, y_dtype=0, batch=batch))


@needs_cuda
def test_the_kernels_load_where_torch_sees_a_device():
    hcuda.kernels(torch.cuda.current_device())  # raises (a failure) where they do not load
    assert hcuda.available() is True


def test_without_a_device_loading_is_a_typed_error():
    if HAS_CUDA:
        pytest.skip("a CUDA device is present")
    with pytest.raises(hypercodec.CudaError):
        hypercodec._native.CudaKernels(0)
    assert hcuda.available() is False
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    with pytest.raises(hypercodec.CudaError):
        hypercodec.Linear.quantize(w, "tcq@2-l12", device=0)


def test_device_forms_name_the_stored_codes():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    f = hypercodec.Linear.quantize(w, "int4").device_form()
    assert f["kind"] == "affine" and f["bits"] == 4 and f["codes"].nbytes == 48 * 256 // 2
    assert f["scales"].shape == (48 * 2,) and f["scales_per_row"] == 2 and f["group_len"] == 128
    e = hypercodec.Linear.quantize(w, "e8-fixed3").device_form()
    assert e["kind"] == "e8" and e["bits"] == 3 and e["packed"].nbytes == 48 * 32 * 3
    t = hypercodec.Linear.quantize(w, "tcq@2-l12").device_form()
    assert t["kind"] == "trellis" and (t["l"], t["k"]) == (12, 2) and t["bits"].nbytes == 48 * 256 * 2 // 8
    assert hypercodec.Linear.quantize(w, "e8@4").device_form() is None  # CPU-shaped chunks: decoded
    # GPU-shaped rANS: chunks of whole rows (64 rows of 256 symbols), 12-bit slots of 3 contexts.
    r = hypercodec.Linear.quantize(w, "e8@4-gpu").device_form()
    assert r["kind"] == "e8rans" and r["words"] == 32 and r["chunk"] == 64 * 256 and r["prob_bits"] == 12
    assert r["slots"].shape == (3 << 12,) and r["index"].nbytes == 1 * 33 * 4 and r["payload"].nbytes % 2 == 0
    # Prefix codes: a row is one segment of 8 blocks, so a chunk spans 8 groups of eight rows
    # (2^14 symbols; the 6 groups here make one chunk); the GPU tables of 8-bit singles and 12-bit
    # pairs, `chunks + 1` word offsets.
    p = hypercodec.Linear.quantize(w, "e8@4-prefix").device_form()
    assert p["kind"] == "e8prefix" and (p["limit"], p["pair_limit"], p["segment"], p["span"]) == (8, 12, 8, 8)
    assert p["table"].shape == (3 * 256 + 4 * 4096,) and p["starts"].shape == (1 + 1,)
    # Chunks of N symbols by hand (`-cN`): 2^12 here, two groups a chunk.
    p = hypercodec.Linear.quantize(w, "e8@4-prefix-c4096").device_form()
    assert (p["segment"], p["span"]) == (16, 2) and p["starts"].shape == (3 + 1,)
    assert p["starts"][-1] * 4 == p["payload"].nbytes and p["words"] == 32
    # Rows longer than a chunk's aim take one chunk each.
    wide = rng.standard_normal((3, 24576)).astype(np.float32)
    r = hypercodec.Linear.quantize(wide, "e8@3-gpu").device_form()
    assert r["chunk"] == 24576 and r["index"].nbytes == 3 * 33 * 4


@pytest.mark.parametrize("spec", ["int4", "int8-row", "int3"])
@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_affine_device_forms_hold_scales_tiled_as_the_kernels_read_them(spec, scale):
    """Scales and offsets in tiles of 16 rows ([tile][group][g][rows g, g + 8], zeros past the
    last row; `hypercodec_kernels_cuda::tiled_scales`), 16-bit ones as stored (f16, or bf16 for
    scales f16 would flush): the codes decoded with them in numpy give the host's weight, for
    37 rows (a partial last tile)."""
    rows, cols = 37, 384
    w = np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32) * np.float32(scale)
    op = hypercodec.Linear.quantize(w, spec)
    f = op.device_form()
    assert f["scale_dtype"] == ("f16" if scale == 1.0 else "bf16") and f["scales"].dtype == np.uint16
    bits, per = f["bits"], f["scales_per_row"]
    assert f["kind"] == "affine" and f["scales"].shape == (48 * per,)
    stream = np.unpackbits(f["codes"], bitorder="little")[: rows * cols * bits].reshape(rows * cols, bits)
    q = (stream.astype(np.int64) << np.arange(bits)).sum(1).reshape(rows, cols)
    groups = np.arange(cols) // f["group_len"]

    def by_row(a):
        # 16-bit scales are held as stored (uint16 bits).
        if f["scale_dtype"] == "f16":
            a = a.view(np.float16).astype(np.float32)
        elif f["scale_dtype"] == "bf16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        t = a.reshape(-1, per, 8, 2)  # [tile][group][g][h]: row 16·tile + 8·h + g
        assert not t.transpose(0, 3, 2, 1).reshape(-1, per)[rows:].any()
        return t.transpose(0, 3, 2, 1).reshape(-1, per)[:rows][:, groups]

    lo = by_row(f["offsets"]) if len(f["offsets"]) else 0.0
    dec = by_row(f["scales"]) * (f["qmul"] * q - f["qbias"]) + lo
    np.testing.assert_allclose(dec, op.weight(), rtol=1e-6, atol=1e-6 * scale)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int8-row", "int3", "e8-fixed4", "e8-fixed3", "tcq@2-l12", "tcq@2-l12-v2", "e8@4", "e8@4-gpu", "e8@2-gpu",
                                  "e8@4-prefix", "e8@3-prefix10", "e8@3-prefix8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_cuda_forward_matches_the_cpu_runtime(spec, dtype, scale):
    # scale 1e-9: the scales are stored as bf16 (f16 would round them to zero).
    rng = np.random.default_rng(1)
    # 100 rows: the decoders' last block is partial (rows x pieces not a multiple of theirs).
    w = rng.standard_normal((100, 512)).astype(np.float32) * np.float32(scale)
    b = rng.standard_normal(100).astype(np.float32) * np.float32(scale)
    op = hypercodec.Linear.quantize(w, spec, b)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    for m in (1, 2, 3, 4, 12, 20):  # every fused pass (E8: 1, 2 and 4 rows), then decode (or the GEMM)
        x = torch.from_numpy(rng.standard_normal((m, 512)).astype(np.float32)).to(dtype)
        want = op.forward(x.float().numpy())
        got = d.forward(x.cuda()).float().cpu().numpy()
        tol = 3e-4 if dtype == torch.float32 else 3e-2
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), (spec, m, d.route(m))
    if d.kind == "e8prefix":
        # Its fused kernels forced past their batch: passes of 16 rows and one.
        x = torch.from_numpy(rng.standard_normal((17, 512)).astype(np.float32)).to(dtype)
        got = d.forward(x.cuda(), route="gemv").float().cpu().numpy()
        want = op.forward(x.float().numpy())
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), (spec, "forced gemv")
        # 512 columns make chunks spanning 4 row groups (the last span short, its last group
        # partial); 4096 two segments a row, of one; 2080 one segment (65 blocks). At one row the
        # pair forms decode two row groups a warp: 20 rows leave a partial group without a
        # partner, 44 rows a partial group in the last pair.
        assert op.device_form()["span"] == 4
        for rows2, cols2, span in ((20, 4096, 1), (44, 2080, 1)):
            w2 = rng.standard_normal((rows2, cols2)).astype(np.float32) * np.float32(scale)
            op2 = hypercodec.Linear.quantize(w2, spec)
            assert op2.device_form()["span"] == span
            d2 = hcuda.DeviceLinear(op2, torch.device("cuda"))
            for m in (1, 5, 20):
                x = torch.from_numpy(rng.standard_normal((m, cols2)).astype(np.float32)).to(dtype)
                want = op2.forward(x.float().numpy())
                got = d2.forward(x.cuda()).float().cpu().numpy()
                assert np.abs(got - want).max() <= tol * np.abs(want).max(), (spec, rows2, cols2, m)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int4-row", "int4-tensor", "int2", "int2-row", "int8", "int8-row",
                                  "int4-g64-sym", "int4-g64", "int4-g256", "int2-g32", "int4-g96", "int8-g160-sym",
                                  "int3-g5", "int4-g1-sym"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensor_core_route_matches_the_cpu_runtime(spec, dtype):
    # Rows that are not whole tiles of 16, steps of 1, 2 and 4 words per lane, batches of one
    # and two mma tiles (and their edges), outlier columns, a bias; groups of other lengths
    # (symmetric ones too), which the tensor-core kernels take where each step lies in one group.
    rng = np.random.default_rng(3)
    # (2-bit groups of 128 spanning outliers × 6 are no better than zeros on 16 × 128, and such
    # a layer is stored raw: pipeline::raw_instead.)
    outliers = 3 if spec.startswith("int2") else 6
    for rows, cols in ((37, 96), (16, 128), (130, 640), (8, 1024)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        w[:, ::29] *= outliers
        b = rng.standard_normal(rows).astype(np.float32)
        op = hypercodec.Linear.quantize(w, spec, b)
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        f = op.device_form()
        bits = f["bits"]
        # Steps of 4 lanes × 1, 2 or 4 words (32 / bits columns a word), each in one group.
        kernel = bits in (2, 4) or (bits == 8 and dtype == torch.float16)
        steps = [4 * words * (32 // bits) for words in (1, 2, 4)]
        whole = [cols % st == 0 and (f["scales_per_row"] <= 1 or f["group_len"] % st == 0) for st in steps]
        expect = kernel and any(whole)
        assert (d.route(1, dtype) == "cuda-affine-mma") == expect, (spec, rows, cols, d.route(1, dtype))
        # Above 16 rows: the GEMM, for 2 or 4 bits in chunks (and groups) of 128 columns; the
        # routes give it layers of GEMM_MIN_ROWS rows and more, and shorter ones where it splits
        # (else these decode: forced onto it here).
        gemm = bits in (2, 4) and cols % 128 == 0 and (f["scales_per_row"] <= 1 or f["group_len"] % 128 == 0)
        split = _split_gemm(d, dtype)
        short = "cuda-affine-gemm" if gemm and split and split[1] > 1 else "cuda-affine-decode+linear"
        assert d.route(17, dtype) == short, (spec, rows, cols, d.route(17, dtype))
        if cols % 128 == 0:  # (the GEMM's chunks)
            tall = hcuda.DeviceLinear(hypercodec.Linear.quantize(np.resize(w, (hcuda.GEMM_MIN_ROWS, cols)), spec),
                                      torch.device("cuda"))
            assert (tall.route(17, dtype) == "cuda-affine-gemm") == gemm, (spec, cols, tall.route(17, dtype))
        for m in (1, 2, 7, 8, 9, 16, 17, 33, 70):
            x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
            want = op.forward(x.float().numpy())
            y = torch.full((m, rows), float("nan"), dtype=dtype, device="cuda")
            y.copy_(d.forward(x.cuda(), route="gemv" if gemm and 16 < m <= 64 else None))
            got = y.float().cpu().numpy()
            assert np.isfinite(got).all()
            tol = 1e-2 if dtype == torch.bfloat16 else 3e-3
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= tol, (spec, rows, cols, m, err, d.route(m, dtype))


_SPLIT_CHECK = """
import sys
import numpy as np
import torch
import hypercodec
import hypercodec.cuda as hcuda

rng = np.random.default_rng(int(sys.argv[1]))
FORCED = int(sys.argv[2])  # blocks a cluster forced (0: the rule)
bad = []
# Chunks of 128 columns: 4 (fewer than 8 blocks a cluster: some walk none), 9 (shares of 1 and
# 2), 8, 32; rows that leave a tile or a block partial; batches of two, four and eight tiles.
for (rows, cols), spec in zip([(37, 512), (100, 1152), (64, 1024), (1000, 4096)],
                              ["int4", "int2-row", "int4-tensor", "int4-g256"]):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, ::29] *= 2 if spec.startswith("int2") else 4  # (2-bit rows of large outliers are kept raw)
    op = hypercodec.Linear.quantize(w, spec, rng.standard_normal(rows).astype(np.float32))
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.kind == "affine", (spec, d.kind)  # (not stored raw: the 2-bit path is what is tested)
    split = d.kernels.affine_gemm_split(dict(d.args, x=0, x_dtype=2, y=0, y_dtype=0, batch=17))
    # The split kernel is what runs: forced blocks a cluster, or the rule's for short layers of
    # 8 chunks and more (1 below: the unsplit GEMM).
    rule = {512: None, 1152: (4, 2), 1024: (4, 2), 4096: (4, 8)}[cols]  # (132 SMs; 9 chunks split once)
    want = (4, FORCED) if FORCED > 1 else rule if FORCED == 0 else None
    if split != want or (want and d.route(17, torch.bfloat16) != "cuda-affine-gemm"):
        bad.append(("route", spec, rows, cols, split, d.route(17, torch.bfloat16)))
    for dtype, m in [(t, m) for t in (torch.bfloat16, torch.float16) for m in (9, 16, 17, 40, 64)]:
        x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
        want = op.forward(x.float().numpy())
        got = d.forward(x.cuda(), route="gemv").float().cpu().numpy()
        err = np.abs(got - want).max() / np.abs(want).max()
        if not err <= (1e-2 if dtype == torch.bfloat16 else 3e-3):
            bad.append((spec, rows, cols, str(dtype), m, float(err)))
print("bad:", bad)
sys.exit(1 if bad else 0)
"""


@needs_cuda
@pytest.mark.skipif(HAS_CUDA and torch.cuda.get_device_capability() != (9, 0),
                    reason="the split GEMM is built for compute capability 9.0 only")
@pytest.mark.parametrize("setting", ["ks=1,from=9", "ks=2,from=9", "ks=4", "ks=4,from=9", "ks=8,from=9", "1"])
def test_cuda_split_gemm_matches_the_cpu_runtime_at_every_cluster_size(setting):
    """The tensor-core GEMM split over clusters of 1-8 blocks (HYPERCODEC_GEMM_SPLIT, read when
    the kernels load: a process each) at 9-64 activation rows, against the CPU runtime, with
    blocks that walk no chunk, shares of unequal length and partial tiles."""
    import subprocess
    import sys

    env = dict(os.environ, HYPERCODEC_GEMM_SPLIT=setting)
    forced = setting.split(",")[0].removeprefix("ks=") if setting.startswith("ks=") else "0"
    r = subprocess.run([sys.executable, "-c", _SPLIT_CHECK, "5", forced], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (setting, r.stdout[-2000:], r.stderr[-2000:])


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int2-row", "int4-tensor", "int4-g128-sym"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensor_core_gemm_matches_the_cpu_runtime_at_large_batches(spec, dtype):
    # 4100 rows (the last tile of 16 partial) and 40, 300 or 520 activation rows, forced onto the
    # GEMM (the routes take it up to 64): blocks of one and of two row tiles per warp, several
    # batch tiles, the last one partial. (On compute capability 9.0, int4 and int4-g128-sym take
    # the Hopper GEMM above 64 rows instead: test_hopper_gemm_matches_the_cpu_runtime_at_large_batches.)
    rng = np.random.default_rng(11)
    w = rng.standard_normal((4100, 256)).astype(np.float32)
    b = rng.standard_normal(4100).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec, b)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.route(40, dtype) == "cuda-affine-gemm"
    # ... and 25728 rows (201 blocks of 128) at 24 rows: two row tiles per warp, batch tiles of 32.
    big = hypercodec.Linear.quantize(rng.standard_normal((25728, 128)).astype(np.float32), spec)
    x = torch.from_numpy(rng.standard_normal((24, 128)).astype(np.float32)).to(dtype)
    got = hcuda.DeviceLinear(big, torch.device("cuda")).forward(x.cuda()).float().cpu().numpy()
    want = big.forward(x.float().numpy())
    tol = 1e-2 if dtype == torch.bfloat16 else 3e-3
    assert np.abs(got - want).max() <= tol * np.abs(want).max(), (spec, "25728 rows")
    for m in (40, 300, 520):
        x = torch.from_numpy(rng.standard_normal((m, 256)).astype(np.float32)).to(dtype)
        want = op.forward(x.float().numpy())
        y = torch.full((m, 4100), float("nan"), dtype=dtype, device="cuda")
        y.copy_(d.forward(x.cuda(), route="gemv"))
        got = y.float().cpu().numpy()
        assert np.isfinite(got).all()
        tol = 1e-2 if dtype == torch.bfloat16 else 3e-3
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= tol, (spec, m, err)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int4-g128-sym", "int4-g64", "int4-g64-sym", "int4-row", "int4-g256"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hopper_gemm_matches_the_cpu_runtime_at_large_batches(spec, dtype):
    """On compute capability 9.0, batches above the other fused kernels' run the wgmma GEMM
    (kernels/gemm_sm90a.cu) in affine_gemv (``route="gemv"``), against the CPU runtime: 13 000
    rows × 256 columns (unsplit; blocks of 256 activation rows above 128), 4100 × 640 (the last
    block of 128 rows partial; the columns split over clusters of 2 blocks: 2 and 3 chunks of
    128, a row's scale starting part way through the second part) and 200 × 384 (split in
    chunks of 64); groups of 64, 128, 256 (the last partial) or a row; 65–520 activation rows
    (the last batch tile partial). The routes take it only where its grid fills the device,
    from above the other fused kernels' batches (64 for groups of 128, 16 for groups of 64) up
    to 256 rows, and at 448–512 rows (the last block of 256 rows nearly full)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper GEMM loads on compute capability 9.0 only")
    if os.environ.get("HYPERCODEC_WGMMA") == "0":
        pytest.skip("HYPERCODEC_WGMMA=0 turns the Hopper GEMM off")
    rng = np.random.default_rng(17)
    # 102 blocks of 13 000 rows fill three quarters of an H100's or H200's 132 multiprocessors
    # (and of any up to 136); at most 8 of 200 rows fill none with 11 or more.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows, cols in ((13000, 256), (4100, 640), (200, 384)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        op = hypercodec.Linear.quantize(w, spec, rng.standard_normal(rows).astype(np.float32))
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        batches = (64, 65, 128, 129, 256, 257, 384, 447, 448, 512, 513, 520)
        routed = [m for m in batches if d.route(m, dtype) == "cuda-affine-wgmma"]
        if 11 <= sms <= 136 and rows != 4100:
            fused = d._kernel_batches(dtype)[0]
            want = [m for m in (64, 65, 128, 129, 256, 448, 512) if m > fused] if rows == 13000 else []
            assert routed == want, (spec, rows, sms)
        if rows == 4100 and 89 <= sms <= 176:
            # 33 blocks of 128 rows split in 2 fill three quarters of at most 88 multiprocessors;
            # with 2 blocks of 128 activation rows (129–256) or 2 of 256 (448–512), of up to 176.
            assert routed == [129, 256, 448, 512], (spec, sms)
        for m in (65, 128, 129, 300, 520):
            x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
            want = op.forward(x.float().numpy())
            y = torch.full((m, rows), float("nan"), dtype=dtype, device="cuda")
            y.copy_(d.forward(x.cuda(), route="gemv"))
            got = y.float().cpu().numpy()
            assert np.isfinite(got).all()
            tol = 1e-2 if dtype == torch.bfloat16 else 3e-3
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= tol, (spec, rows, cols, m, err)


@needs_cuda
@pytest.mark.parametrize("spec", ["int1", "int1-row", "int3", "int3-row", "int5", "int5-g64", "int6", "int6-row", "int7",
                                  "int7-g32-sym"])
def test_cuda_affine_codes_that_straddle_words_match_the_cpu_runtime(spec):
    """Codes of 3, 5, 6 and 7 bits (which straddle 32-bit words) and of 1 bit take the aligned
    GEMV (chunks of 32 codes, a funnel shift joining two words) and the chunked decoder where
    the columns and groups hold whole chunks; odd columns the generic kernels. Every width
    against the CPU runtime: GEMV passes of 1 and 4 rows (and their edges), the decode route
    above, rows that leave the last block partial, f32/bf16/f16 activations, a bias."""
    rng = np.random.default_rng(29)
    for rows, cols in ((37, 256), (130, 1024), (9, 96)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        w[:, ::17] *= 4  # (outliers: codes at both ends of their range)
        op = hypercodec.Linear.quantize(w, spec, rng.standard_normal(rows).astype(np.float32))
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        assert d.kind == "affine" and op.device_form()["bits"] == int(spec[3]), spec
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for m in (1, 2, 4, 5, 9, 40):
                x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
                want = op.forward(x.float().numpy())
                got = d.forward(x.cuda()).float().cpu().numpy()
                tol = 3e-5 if dtype == torch.float32 else 2e-2
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err <= tol, (spec, rows, cols, dtype, m, d.route(m, dtype), err)
        # The device's decoder alone, against the host's decoded weight.
        dec = d._decode(torch.float32, hcuda._stream(0)).cpu().numpy()
        np.testing.assert_allclose(dec, op.weight(), rtol=1e-6, atol=1e-6 * np.abs(op.weight()).max())


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int4-row", "int2", "int8-row", "int3", "int4-g64", "int4-g64-sym"])
def test_cuda_affine_kernels_read_f32_and_16_bit_scales_alike(spec):
    """The device holds stored f16/bf16 scales as they are; the same layer with them widened to
    f32 on the device gives bit-identical outputs on every route (the kernels compute in f32
    from either)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((130, 1024)).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec, rng.standard_normal(130).astype(np.float32))
    d16, d32 = hcuda.DeviceLinear(op, torch.device("cuda")), hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d16.args["scale_dtype"] in (1, 2)
    widen = (lambda t: t.view(torch.float16).float()) if d16.args["scale_dtype"] == 1 else \
        (lambda t: (t.int() << 16).view(torch.float32))
    d32.scales = widen(d32.scales).contiguous()
    d32.offsets = None if d32.offsets is None else widen(d32.offsets).contiguous()
    d32.args.update(scales=d32.scales.data_ptr(), offsets=0 if d32.offsets is None else d32.offsets.data_ptr(), scale_dtype=0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        # (17 rows forced onto the fused kernels too: the GEMM, which routes give taller layers;
        # on compute capability 9.0 the Hopper GEMM for groups of 64.)
        for m, route in ((1, None), (3, None), (9, None), (17, None), (17, "gemv"), (70, None)):
            x = torch.from_numpy(rng.standard_normal((m, 1024)).astype(np.float32)).to("cuda", dtype)
            a, b = d16.forward(x, route=route), d32.forward(x, route=route)
            assert torch.isfinite(a).all() and torch.equal(a, b), (spec, dtype, m, route or d16.route(m, dtype))


def test_affine_device_forms_say_whether_the_fused_kernels_hold_them():
    """The route choice for weights near f32's range is the native `affine_fusable` bound,
    read from the device form (no device needed)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((40, 512)).astype(np.float32)
    for spec in ("int4", "int4-g64", "int4-g128-sym", "int8-row", "int2"):
        for scale, fused in ((1.0, True), (1e25, True), (1e36, False)):
            form = hypercodec.Linear.quantize(w * np.float32(scale), spec).device_form()
            assert form["kind"] == "affine" and form["fusable"] is fused, (spec, scale)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int4-g64", "int4-g128-sym", "int4-row", "int2", "int8", "int8-row", "int3",
                                  "e8-fixed4", "tcq@2-l12", "e8@4-gpu", "e8@4-prefix"])
def test_cuda_weights_near_the_f32_range_stay_finite(spec):
    """Weights of standard deviation 1e36 (a few powers of two below f32's largest): a group's
    scale and offset terms, and the tensor cores' magic-biased code sums by a scale, pass f32's
    range where the output does not (the fused kernels gave ±inf and NaN), so such affine
    layers take the decode route at every batch (the native ``affine_fusable``); at 1e25 they stay on
    the fused kernels. Every route, f32 and bf16 activations, against the CPU runtime (bf16
    keeps f32's range: outputs of about 1e37 are finite)."""
    rng = np.random.default_rng(23)
    rows, cols = 40, 512
    # The rotated forms refuse rows whose Hadamard transform would leave f32: a tenth as large.
    for scale in (1e25, 1e36) if spec.startswith("int") else (1e35,):
        w = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale)
        op = hypercodec.Linear.quantize(w, spec)
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        if d.kind == "affine":
            assert (d.route(1, torch.bfloat16) == "cuda-affine-decode+linear") == (scale > 1e30), (spec, scale)
        for dtype in (torch.float32, torch.bfloat16):
            for m in (1, 3, 8, 16, 17, 70):
                x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
                want = op.forward(x.float().numpy()).astype(np.float64)
                assert np.isfinite(want).all(), (spec, m)
                # (17 rows forced onto the fused kernels too, where they hold the terms: the GEMM,
                # which routes give taller layers; on compute capability 9.0 the Hopper GEMM for
                # groups of 64.)
                gemm = m == 17 and d.kind == "affine" and d.route(1, dtype) != "cuda-affine-decode+linear"
                for route in (None, "decode", "gemv") if gemm else (None, "decode"):
                    y = torch.full((m, rows), float("nan"), dtype=dtype, device="cuda")
                    y.copy_(d.forward(x.cuda(), route=route))
                    got = y.double().cpu().numpy()
                    where = d.route(m, dtype) if route is None else route
                    assert np.isfinite(got).all(), (spec, scale, dtype, m, where)
                    tol = 3e-4 if dtype == torch.float32 else 2e-2
                    err = np.abs(got - want).max() / np.abs(want).max()
                    assert err <= tol, (spec, scale, dtype, m, where, err)
        if d.kind == "affine":
            # One input through a group of such layers: one launch at batch 1 where they fuse,
            # else none (the caller runs them one by one).
            x = torch.from_numpy(rng.standard_normal((1, cols)).astype(np.float32)).to("cuda", torch.bfloat16)
            ys = hcuda.forward_group([d, d], x)
            assert (ys is None) == (scale > 1e30), (spec, scale)
            assert ys is None or all(torch.equal(y, d.forward(x)) for y in ys), (spec, scale)


@needs_cuda
def test_hyper_linear_runs_on_cuda_tensors():
    lin = torch.nn.Linear(256, 64)
    h = hnn.HyperLinear.from_linear(lin, "int4")
    x = torch.randn(2, 5, 256)
    assert torch.allclose(h(x.cuda()).cpu(), h(x), rtol=1e-3, atol=1e-4)


@needs_cuda
def test_a_weight_stored_in_out_runs_on_cuda_as_on_the_host(tmp_path):
    """GPT-2's Conv1D weights are stored [in, out] and run so (``Archive.linear(...,
    transposed=True)``): no device form, so CUDA takes the decode fallback, which must give the
    transposed weight, at batch 1 and 20, f32 and bf16."""
    w = np.random.default_rng(3).standard_normal((96, 160)).astype(np.float32)  # [in, out]
    hypercodec.save({"w": w, "b": np.ones(160, np.float32)}, str(tmp_path / "t.hwz"), encoding="affine", bits=4)
    archive = hypercodec.Archive(str(tmp_path / "t.hwz"))
    h = hnn.HyperLinear(archive.linear("w", archive.read("b"), None, True))
    assert h.op.transposed and (h.in_features, h.out_features) == (96, 160)
    for batch in (1, 20):
        x = torch.randn(batch, 96)
        want = h(x)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            got = h(x.cuda().to(dtype)).float().cpu()
            assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item()), (batch, dtype)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int2-row", "int8-row", "e8-fixed4", "tcq@2-l12", "tcq@2-l12-v2", "e8@4-gpu"])
def test_compressed_layers_replay_in_a_cuda_graph(spec):
    """Decoding loops capture their steps in CUDA graphs (static caches, torch.compile's
    reduce-overhead): no route may synchronize, copy from the host or allocate outside PyTorch
    while capturing, and a replay must read the inputs' new values. Every route: the fused
    kernels at 1-16 rows, decode + cuBLAS at 40 (a short layer's route; the GEMM is captured in
    test_cuda_layers_of_one_input_in_one_launch_equal_their_own_launches) and 300, f32 passes."""
    torch.manual_seed(8)
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(512, 192), spec)
    for dtype, batches in ((torch.bfloat16, (1, 4, 16, 40, 300)), (torch.float32, (1, 3, 9))):
        for m in batches:
            x = torch.randn(m, 512, device="cuda", dtype=dtype)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                h(x)  # warm-up, as PyTorch asks before a capture: the device form is built here
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g):
                y = h(x)
            for _ in range(2):
                x.copy_(torch.randn_like(x))
                g.replay()
                with torch.no_grad():
                    ref = h(x)
                torch.cuda.synchronize()
                tol = 2e-3 * ref.float().abs().max().item()
                torch.testing.assert_close(y.float(), ref.float(), rtol=0, atol=tol, msg=f"{spec} {dtype} {m}")


@needs_cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_compressed_models_compile_whole(mode, monkeypatch):
    """`torch.compile(model, fullgraph=True)` with inductor on CUDA: each compressed layer is one
    operator between fused kernels, and under reduce-overhead the whole step is one CUDA graph
    of torch's; the outputs match the eager model's. Kernels of three kinds, one layer taking
    FP8 or int8 activations, batches 1 and 16."""
    torch.manual_seed(16)

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(256, 512)
            self.mid = torch.nn.Linear(512, 512, bias=False)
            self.down = torch.nn.Linear(512, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)
            return x + self.down(torch.nn.functional.silu(self.mid(torch.relu(self.up(h)))))

    model = Mlp()
    model.up = hnn.HyperLinear.from_linear(model.up, "int4")
    model.mid = hnn.HyperLinear.from_linear(model.mid, "e8-fixed4")
    model.down = hnn.HyperLinear.from_linear(model.down, "tcq@2-l12")
    model = model.to(device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(hnn, "FP8_MIN_WEIGHTS", 0)
    acts = "fp8" if torch.cuda.get_device_capability() >= (8, 9) else "int8"
    from torch._dynamo.utils import counters

    counters.clear()
    for quantized in (False, True):
        if quantized:  # before compiling: a CUDA graph replays the kernels it recorded
            hnn.quantize_activations(model.mid, acts)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, mode=mode)
        for m in (1, 16):
            for _ in range(3):  # reduce-overhead records on a later call: check every one
                x = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    ref = model(x)
                    got = compiled(x).clone()
                assert got.dtype == torch.bfloat16 and got.shape == ref.shape
                tol = 2e-2 * ref.float().abs().max().item()
                torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=tol, msg=f"{mode} {quantized} {m}")
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])  # (every step in CUDA graphs)
    # New weights loaded into a compiled layer: a graph recorded with the old codes' device
    # pointers is recorded again (the layer's key moved), not replayed.
    # Compiled first: the new operator's device form is made while torch records (a recording
    # again may follow no warm-up).
    fresh = hnn.HyperLinear.from_linear(torch.nn.Linear(256, 512), "int4")
    model.up.load_state_dict(fresh.state_dict())
    for _ in range(3):
        x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            got = compiled(x).clone()
            ref = model(x)
        tol = 2e-2 * ref.float().abs().max().item()
        torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=tol, msg=f"{mode} new weights")
    # An embedding (its ids read on the host) in front: compiled whole, and left out of the
    # CUDA graphs under reduce-overhead rather than failing to capture.
    lm = torch.nn.Sequential(torch.nn.Embedding(100, 256), model)
    lm[0] = hnn.HyperEmbedding.from_embedding(lm[0], "int8").to("cuda")
    lm[0].dtype = torch.bfloat16
    torch._dynamo.reset()
    compiled_lm = torch.compile(lm, fullgraph=True, mode=mode)
    for _ in range(3):
        ids = torch.randint(0, 100, (2, 5), device="cuda")
        with torch.no_grad():
            ref, got = lm(ids), compiled_lm(ids).clone()
        tol = 2e-2 * ref.float().abs().max().item()
        torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=tol, msg=f"{mode} embedding")
    if mode == "default":  # the compiled backward: each layer's input gradient on the device
        x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        (want,) = torch.autograd.grad(model(x).float().square().sum(), x)
        (got,) = torch.autograd.grad(compiled(x).float().square().sum(), x)
        tol = 2e-2 * want.float().abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol, msg="input gradient")


@needs_cuda
def test_cuda_a_model_compiled_before_any_eager_call_records_its_cuda_graphs():
    """Compiled with reduce-overhead and called compiled first: each layer's device form (and a
    convolution's kept decoded weight) is made during torch's warm-up, outside the pool of the
    CUDA graph about to be recorded (made inside it, the recording failed: "tensors in the
    cudagraph pool not tracked as outputs"); every step replays in CUDA graphs, equal to eager."""
    from torch._dynamo.utils import counters

    torch.manual_seed(25)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect")
            self.a, self.b = torch.nn.Linear(8 * 6 * 6, 256), torch.nn.Linear(256, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(torch.relu(self.conv(x)).flatten(1))))

    model = Net()
    model.conv = hnn.HyperConv2d.from_conv(model.conv, "int8")
    model.a = hnn.HyperLinear.from_linear(model.a, "int4")
    model.b = hnn.HyperLinear.from_linear(model.b, "tcq@2-l12")
    model = model.to(device="cuda", dtype=torch.bfloat16)
    assert "_device_forms" not in model.a.__dict__  # (nothing on the device yet)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    xs = [torch.randn(2, 4, 6, 6, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with torch.no_grad():
        got = [compiled(x).clone() for x in xs]
        want = [model(x) for x in xs]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=2e-2 * w.float().abs().max().item())
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    torch._dynamo.reset()


@needs_cuda
def test_cuda_repeated_blocks_compiled_one_by_one_share_one_graph():
    """Regional compilation with inductor: 6 blocks of one shape, each `block.compile()`d, share
    one compiled graph (each layer's key is an input, as a weight is); the outputs match the
    eager blocks', before and after new weights are loaded into one block. (Not under
    reduce-overhead: torch's CUDA graph trees take a second call of one function in a step for
    a new step, and refuse the previous block's output, with nn.Linear as with these.)"""
    from torch._dynamo.utils import counters

    torch.manual_seed(22)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.silu(self.up(x)))

    blocks = torch.nn.Sequential(*(Block() for _ in range(6)))
    for b in blocks:
        b.up = hnn.HyperLinear.from_linear(b.up, "int4")
        b.down = hnn.HyperLinear.from_linear(b.down, "tcq@2-l12")
    blocks = blocks.to(device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    counters.clear()
    for b in blocks:
        b.compile(fullgraph=True)

    def check(msg: str) -> None:
        for _ in range(3):
            x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                got = blocks(x).clone()
                ref = x
                for b in blocks:
                    ref = b._call_impl(ref)  # (the eager forward: _call_impl skips the compiled call)
            tol = 2e-2 * ref.float().abs().max().item()
            torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=tol, msg=msg)

    check("compiled")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    # New weights loaded into one block.
    fresh = hnn.HyperLinear.from_linear(torch.nn.Linear(256, 512), "int4")
    blocks[2].up.load_state_dict(fresh.state_dict())
    check("new weights")
    torch._dynamo.reset()


@needs_cuda
def test_cuda_transformers_generate_compiled_with_a_static_cache(tmp_path):
    """transformers' own recipe for fast decoding, on a quantized model: a static cache, with which
    `generate` compiles the decode step (reduce-overhead here: the step in CUDA graphs, each
    compressed layer one operator in it). Greedy tokens equal the eager model's (weights scaled up so that the
    logits' gaps dwarf the compiled graph's rounding)."""
    transformers = pytest.importorskip("transformers")
    from torch._dynamo.utils import counters

    torch.manual_seed(23)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    import hypercodec.hf as hhf

    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "dense")
    m = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense", quantization_config=hhf.HypercodecConfig(bps=4, method="affine")
    ).eval()  # (quantized on load: transformers compiles only what its quantizer says it may)
    assert sum(isinstance(mod, hnn.HyperLinear) for mod in m.modules()) >= 7 * 3  # (every block's linears)
    m = m.to("cuda")
    ids = torch.randint(0, 256, (1, 12), device="cuda")

    def gen(**kw):
        with torch.no_grad():
            return m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                              min_new_tokens=12, do_sample=False, cache_implementation="static", **kw)

    want = gen(disable_compile=True)
    torch._dynamo.reset()
    counters.clear()
    compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    try:
        got = [gen(compile_config=compile_config) for _ in range(2)]  # (the second replays)
    finally:
        torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])  # (generate compiled the step)
    for out in got:
        assert torch.equal(out, want), (out, want)


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "e8-fixed4", "tcq@2-l12", "e8@4", "e8@4-gpu"])
def test_cuda_gradients_reach_the_inputs_of_compressed_layers(spec):
    torch.manual_seed(6)
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(256, 96), spec)
    w = h.weight_dense().reshape(96, 256).cuda()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 256, device="cuda", dtype=dtype, requires_grad=True)
        gy = torch.randn(3, 96, device="cuda", dtype=dtype)
        h(x).backward(gy)
        assert x.grad.dtype == dtype
        ref = gy.float() @ w
        assert torch.allclose(x.grad.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    # A 1x1 convolution on the matrix form takes the same device path.
    conv = hnn.HyperConv2d.from_conv(torch.nn.Conv2d(256, 96, 1), spec)
    img = torch.randn(2, 256, 3, 3, device="cuda", requires_grad=True)
    gimg = torch.randn(2, 96, 3, 3, device="cuda")
    conv(img).backward(gimg)
    ref = torch.einsum("nohw,oc->nchw", gimg, torch.from_numpy(np.asarray(conv.op.weight())).reshape(96, 256).cuda())
    assert torch.allclose(img.grad, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@needs_cuda
def test_cuda_conv1d_layers_compute_what_they_do_on_the_host():
    """HyperConv1d on CUDA tensors (a kernel of 3 on the decoded weight, a kernel of 1 on the
    device's matrix kernels, a depthwise one), f32 and bf16, against the same layers on the
    host, and the input gradient through the pointwise one."""
    import copy

    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Conv1d(64, 128, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv1d(128, 128, 5, padding="same", groups=128),
                                torch.nn.Conv1d(128, 96, 1)).eval()
    hnn.quantize(model, bps=4, method="affine")
    assert [type(m) for m in model if not isinstance(m, torch.nn.ReLU)] == [hnn.HyperConv1d] * 3
    x = torch.randn(2, 64, 40)
    with torch.no_grad():
        want = model(x)
    dev = copy.deepcopy(model).cuda()
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # (on by default: f32 convolutions in TF32 missed 1e-4 on an H100)
    try:
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            with torch.no_grad():
                got = dev.to(dtype)(x.cuda().to(dtype)).float().cpu()
            assert torch.allclose(got, want, rtol=tol, atol=tol * want.abs().max().item()), dtype
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    point = copy.deepcopy(model[3]).cuda().float()
    h = torch.randn(2, 128, 40, device="cuda", requires_grad=True)
    gy = torch.randn(2, 96, 40, device="cuda")
    point(h).backward(gy)
    w = torch.from_numpy(np.asarray(model[3].op.weight())).reshape(96, 128).cuda()
    ref = torch.einsum("nol,oc->ncl", gy, w)
    assert torch.allclose(h.grad, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "e8-fixed4", "tcq@2-l12", "e8@4-gpu"])
def test_a_deep_copy_on_cuda_owns_its_device_codes(spec):
    """A deep copy of a layer that ran on the device rebuilds its device form: the kernels'
    arguments are raw pointers into the original's buffers, which a member-wise copy shared."""
    import copy

    torch.manual_seed(5)
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(256, 96), spec)
    x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)
    ref = h(x)
    dev = torch.device("cuda", torch.cuda.current_device())
    own = h._device_forms[dev][1]
    twin = copy.deepcopy(h)
    assert not twin.__dict__.get("_device_forms") and twin.op is h.op
    assert torch.equal(twin(x), ref)
    buffers = lambda d: {t.data_ptr() for t in vars(d).values() if isinstance(t, torch.Tensor)}
    theirs = twin._device_forms[dev][1]
    assert theirs is not own and not buffers(theirs) & buffers(own)
    # A device form copied on its own gets buffers (and launch pointers) of its own too.
    other = copy.deepcopy(own)
    assert not buffers(other) & buffers(own)
    assert torch.equal(other.forward(x), ref)


@needs_cuda
@pytest.mark.parametrize("shape", [(100, 256), (7, 4096), (5, 24576), (33, 96), (1, 4096)])
def test_cuda_rans_chunks_of_any_row_count_match_the_cpu_runtime(shape):
    """A warp per chunk of whole rows: many rows per chunk, a few, one long row per chunk,
    rows of 96 values (RHT tile 32), a single row; the decoder and the GEMV both."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal(shape).astype(np.float32)
    op = hypercodec.Linear.quantize(w, "e8@3-gpu", rng.standard_normal(shape[0]).astype(np.float32))
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.kind == "e8rans", op.device_form()
    for m in (1, 3, 4, 6, 9):
        x = torch.from_numpy(rng.standard_normal((m, shape[1])).astype(np.float32))
        want = op.forward(x.numpy())
        for route in ("gemv", "decode"):
            got = d.forward(x.cuda(), route=route).cpu().numpy()
            assert np.abs(got - want).max() <= 3e-4 * np.abs(want).max(), (shape, m, route)


@needs_cuda
def test_cuda_constant_weights_and_layers_without_inputs():
    """A zero weight in GPU-shaped rANS (every context one symbol: its payload is only the
    format's minimum padding, never read) through both routes; a layer without inputs gives
    its bias."""
    z = np.zeros((64, 512), np.float32)
    b = np.arange(64, dtype=np.float32)
    op = hypercodec.Linear.quantize(z, "e8@4-gpu", b)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    x = torch.randn(3, 512)
    for route in ("gemv", "decode"):
        got = d.forward(x.cuda(), route=route).cpu().numpy()
        assert np.allclose(got, op.forward(x.numpy()), atol=1e-6), route
    lin = torch.nn.Linear(0, 8)
    want = lin(torch.zeros(2, 0))
    h = hnn.HyperLinear.from_linear(lin, "int4")
    assert torch.allclose(h(torch.zeros(2, 0, device="cuda")).cpu(), want)


@needs_cuda
@pytest.mark.parametrize("spec", ["int8-row", "z1-fixed8", "int4-row", "e8-fixed4", "e8@4", "e8@4-gpu"])
def test_cuda_w8a8_matches_the_host_w8a8(spec):
    """The int8 GEMM (cuBLASLt through torch._int_mm; fewer than 17 rows padded) gives the
    host's W8A8 result: the same int8 codes and int32 sums (the RHT's float rounding may move
    a code by 1), in f32, f16 and bf16."""
    torch.manual_seed(9)
    m = torch.nn.Sequential(torch.nn.Linear(512, 256))
    hnn.quantize(m, method=spec, skip=())
    assert hnn.quantize_activations(m) == 1
    for rows in (1, 3, 17, 64):
        x = torch.randn(rows, 512)
        host = m(x)
        if rows <= {"int8-row": hnn.W8A8_GEMV_BATCH, "int4-row": hnn.LOWBIT_GEMV_BATCH,
                    "e8-fixed4": hnn.LATTICE_GEMV_BATCH}.get(spec, 0):
            hnn.quantize_activations(m, None)  # the device keeps the weight-only GEMV here
            host = m(x)
            hnn.quantize_activations(m)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            dev = m(x.cuda().to(dt))
            assert dev.dtype == dt
            tol = 2e-3 if dt == torch.float32 else 1e-2
            assert torch.allclose(dev.float().cpu(), host, rtol=tol, atol=tol * host.abs().max().item()), (rows, dt)
    # A NaN in a row: that row's outputs are NaN, the others unchanged (as on the host).
    x = torch.randn(32, 512)
    clean = m(x.cuda()).cpu()
    x[3, 100] = float("nan")
    got = m(x.cuda()).cpu()
    assert torch.isnan(got[3]).all() and torch.equal(torch.isnan(m(x)[3]), torch.isnan(got[3]))
    assert torch.equal(got[torch.arange(32) != 3], clean[torch.arange(32) != 3])


@needs_cuda
def test_cuda_fp8_quantization_rounds_as_torch_casts():
    """hc_quant_f8: each row scaled by its absolute maximum to ±448 and rounded to E4M3 to
    nearest even, byte for byte what torch's cast of x / step gives (subnormals, ties, the
    largest value, zero rows); padding rows zeros with step 1; a row holding NaN gets a NaN
    step; f32, f16 and bf16 activations; rows of whole 16-byte pieces (the kernel's vector
    path) and not (its loop)."""
    k = hcuda.kernels(torch.cuda.current_device())
    g = torch.Generator().manual_seed(3)
    rows, padded = 21, 32
    x0 = torch.randn(rows, 1000, generator=g) * torch.logspace(-6, 3, rows).unsqueeze(1)
    x0[2, :8] = torch.tensor([448.0, -448.0, 1.0, 2 ** -7, 2 ** -9, 3 * 2 ** -10, 2 ** -6, -(2 ** -10)])
    x0[3, 0] = 6e4  # one large value: the rest of its row falls to E4M3's subnormals and zeros
    x0[4] = 0.0
    x0[5, 7] = float("nan")
    for dt, cols in itertools.product((torch.float32, torch.float16, torch.bfloat16), (1000, 997)):
        xs = x0[:, :cols].to(dt).contiguous().cuda()
        q = torch.full((padded, cols), 0x55, dtype=torch.uint8, device="cuda")  # poisoned
        step = torch.full((padded, 1), float("nan"), device="cuda")
        k.quant_f8({"x": xs.data_ptr(), "x_dtype": hcuda._DTYPES[dt], "q": q.data_ptr(), "step": step.data_ptr(),
                    "rows": rows, "padded_rows": padded, "cols": cols}, torch.cuda.current_stream().cuda_stream)
        xf = xs.float().cpu()
        want_step = xf.abs().amax(1, keepdim=True).clamp_min(1e-30) / 448
        got_step = step.cpu()
        assert torch.isnan(got_step[5]).all() and torch.equal(got_step[:5], want_step[:5])
        assert torch.equal(got_step[6:rows], want_step[6:]), dt
        want = (xf / want_step).to(torch.float8_e4m3fn).view(torch.uint8)
        ok = torch.arange(rows) != 5
        assert torch.equal(q[:rows].cpu()[ok], want[ok]), dt
        assert (q[rows:] == 0).all() and (step[rows:] == 1).all()
    with pytest.raises(hypercodec.InvalidInputError):
        k.quant_f8({"x": xs.data_ptr(), "x_dtype": 2, "q": q.data_ptr(), "step": step.data_ptr(),
                    "rows": rows, "padded_rows": rows - 1, "cols": cols}, 0)


@needs_cuda
def test_cuda_fp8_block_quantization_rounds_as_torch_casts():
    """hc_quant_f8_blocks: each run of 128 columns of a row scaled by its own absolute maximum
    and rounded to E4M3, byte for byte what torch's cast gives; the steps column-major (as
    cuBLASLt's 1×128 scales), the runs' sums of the activations as given row-major; padding rows
    zeros, step 1, sum 0; a NaN makes its run's step NaN and no other's; runs of 128 (the
    kernel's vector path; 40 runs a row, more than one block of the grid's y) and of 64 (its
    loop, without sums: the buffer is left alone). Run lengths that do not tile a row, and sums
    without runs, are refused."""
    k = hcuda.kernels(torch.cuda.current_device())
    g = torch.Generator().manual_seed(4)
    rows, cols, padded = 19, 5120, 32
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-5, 3, 40).repeat_interleave(128)
    x[2, :6] = torch.tensor([448.0, -448.0, 2 ** -9, 3 * 2 ** -10, 2 ** -6, -(2 ** -10)])
    x[3, 130] = 6e4
    x[4] = 0.0
    x[5, 7] = float("nan")
    for dt, block in itertools.product((torch.float32, torch.float16, torch.bfloat16), (128, 64)):
        runs = cols // block
        xs = x.to(dt).cuda()
        q = torch.full((padded, cols), 0x55, dtype=torch.uint8, device="cuda")
        step = torch.full((runs, padded), float("nan"), device="cuda").t()  # column-major
        sums = torch.full((padded, runs), float("nan"), device="cuda")
        args = {"x": xs.data_ptr(), "x_dtype": hcuda._DTYPES[dt], "q": q.data_ptr(), "step": step.data_ptr(),
                "rows": rows, "padded_rows": padded, "cols": cols, "block": block}
        if block == 128:
            args["sums"] = sums.data_ptr()
        k.quant_f8(args, torch.cuda.current_stream().cuda_stream)
        xf = xs.float().cpu().reshape(rows, runs, block)
        want_step = xf.abs().amax(2).clamp_min(1e-30) / 448
        got_step = step.cpu()
        assert torch.isnan(got_step[5, 0]) and not torch.isnan(got_step[5, 1:]).any()
        ok = torch.ones(rows, runs, dtype=torch.bool)
        ok[5, 0] = False
        assert torch.equal(got_step[:rows][ok], want_step[ok]), dt
        want = (xf / want_step.unsqueeze(2)).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(q[:rows].cpu().reshape(rows, runs, block)[ok], want[ok]), dt
        assert (q[rows:] == 0).all() and (got_step[rows:] == 1).all()
        if block == 128:  # each run's sum, to a tolerance of its own magnitude
            err = (sums[:rows].cpu() - xf.sum(2))[ok].abs()
            assert (err <= 4e-5 * xf.abs().sum(2)[ok]).all(), dt
            assert (sums[rows:] == 0).all()
        else:
            assert torch.isnan(sums).all()  # no sums asked: untouched
    base = {"x": xs.data_ptr(), "x_dtype": 2, "q": q.data_ptr(), "step": step.data_ptr(), "rows": rows,
            "padded_rows": padded, "cols": cols}
    for bad in ({"block": 100}, {"sums": sums.data_ptr()}):
        with pytest.raises(hypercodec.InvalidInputError):
            k.quant_f8({**base, **bad}, 0)


def _fp8_switched(method: str, x: torch.Tensor) -> tuple[torch.nn.Module, torch.Tensor]:
    """A 512 → 256 layer quantized with ``method``, its weight-only output for ``x``, then
    switched to FP8 activations."""
    m = torch.nn.Sequential(torch.nn.Linear(512, 256))
    hnn.quantize(m, method=method, skip=())
    weight_only = m(x)
    assert hnn.quantize_activations(m, "fp8") == 1
    return m, weight_only


@needs_cuda
def test_cuda_fp8_without_block_scales_runs_weight_only(monkeypatch):
    """Where ``torch._scaled_mm`` refuses 1×128 block scales (an older torch or cuBLASLt), a
    row-scaled layer warns once and takes a scale per token from then on (the host's product at
    that scaling), leaving the device unmarked; a group-scaled layer warns once, gives the
    weight-only output, and its device runs such layers weight-only from then on."""
    import warnings

    if not hnn._fp8_device(torch.device("cuda")) or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("no block-scaled FP8 route on this device")
    torch.manual_seed(13)
    x = torch.randn(40, 512, device="cuda")
    monkeypatch.setattr(hnn, "FP8_MIN_WEIGHTS", 0)
    real = torch._scaled_mm

    def refuse(a, b, *args, scale_a=None, scale_b=None, **kw):
        if scale_a is not None and scale_a.dim() == 2 and scale_a.shape[1] > 1:  # 1×128 blocks
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED (test)")
        return real(a, b, *args, scale_a=scale_a, scale_b=scale_b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    monkeypatch.setattr(hnn, "_NO_FP8_BLOCKS", set())
    row, want = _fp8_switched("int4-row", x)
    with pytest.warns(RuntimeWarning, match="per token"):
        y = row(x)
    assert x.device not in hnn._NO_FP8_BLOCKS
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no second attempt, no second warning
        assert torch.equal(row(x), y)
    runs = hnn.FP8_BLOCK_MAX_ROWS
    monkeypatch.setattr(hnn, "FP8_BLOCK_MAX_ROWS", 0)  # the host's step per token
    host = row(x.cpu())
    monkeypatch.setattr(hnn, "FP8_BLOCK_MAX_ROWS", runs)
    assert torch.allclose(y.cpu(), host, rtol=1e-2, atol=1e-2 * host.abs().max().item())
    err = ((y - want).norm() / want.norm()).item()
    assert 0 < err < 0.08, err
    # A group-scaled layer.
    m, weight_only = _fp8_switched("int4", x)
    with pytest.warns(RuntimeWarning, match="block scales"):
        got = m(x)
    assert torch.equal(got, weight_only)
    assert x.device in hnn._NO_FP8_BLOCKS
    assert torch.equal(m(x), weight_only)  # no second attempt
    # A row-scaled layer on the marked device: a step per token from the start, no warning.
    row2, want2 = _fp8_switched("int4-row", x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y2 = row2(x)
    assert torch.device("cuda", torch.cuda.current_device()) in row2[0].__dict__.get("_w8a8", {})
    err = ((y2 - want2).norm() / want2.norm()).item()
    assert 0 < err < 0.08, err


@needs_cuda
@pytest.mark.parametrize("spec", ["int4-row", "z1-fixed4", "int4", "e8-fixed4", "tcq@2-l12", "e8@4"])
def test_cuda_fp8_activations_match_the_host(spec, monkeypatch):
    """FP8 activations on CUDA (torch._scaled_mm, E4M3 against the weight's exact E4M3 copy,
    or for the trellis and entropy-coded E8 its decoded weight rounded to E4M3 (``round_weights``),
    a scale per token and per weight row, or for ``int4`` per token and group of 128 on both
    sides plus the offsets' term, as row-scaled layers at up to 96 rows on compute capability 9.x;
    fewer than 16 rows padded) give the host's product (the RHT's
    float rounding may move an activation to a neighbouring E4M3 value), in f32, f16 and bf16;
    where the device has no such FP8 GEMM the layer runs weight-only."""
    torch.manual_seed(10)
    m = torch.nn.Sequential(torch.nn.Linear(512, 256))
    hnn.quantize(m, method=spec, skip=())
    rw = spec in ("tcq@2-l12", "e8@4")
    x = torch.randn(40, 512)
    weight_only = m(x.cuda())
    assert hnn.quantize_activations(m, "fp8", round_weights=rw) == 1
    assert torch.equal(m(x.cuda()), weight_only)  # a layer under FP8_MIN_WEIGHTS stays weight-only
    monkeypatch.setattr(hnn, "FP8_MIN_WEIGHTS", 0)
    fp8 = hnn._fp8_device(torch.device("cuda"))
    if spec == "int4":  # cuBLASLt's 1×128 block scales: compute capability 9.0
        fp8 = fp8 and torch.cuda.get_device_capability()[0] == 9
    if torch.cuda.get_device_capability()[0] != 9:
        monkeypatch.setattr(hnn, "FP8_BLOCK_MAX_ROWS", 0)  # no block-scaled GEMM: a step per token, host too
    # Rows up to which the device keeps the layer's own weight-only kernel.
    own = {"z1-fixed4": 0, "e8-fixed4": hnn.LATTICE_GEMV_BATCH, "tcq@2-l12": hnn.TRELLIS_GEMV_BATCH,
           "e8@4": 0}.get(spec, hnn.LOWBIT_GEMV_BATCH)
    # 112: a row-scaled layer's step per token (above FP8_BLOCK_MAX_ROWS).
    for rows in (1, 3, 17, 64, 112):
        x = torch.randn(rows, 512)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            xd = x.to(dt)  # the host rounds what the device rounds
            host = m(xd.float())
            if not fp8 or rows <= own:
                hnn.quantize_activations(m, None)  # the device runs weight-only here
                host = m(xd.float())
                hnn.quantize_activations(m, "fp8", round_weights=rw)
            dev = m(xd.cuda())
            assert dev.dtype == dt and dev.shape == (rows, 256)
            tol = 1e-2 if dt != torch.bfloat16 else 2e-2
            assert torch.allclose(dev.float().cpu(), host, rtol=tol, atol=tol * host.abs().max().item()), (rows, dt)
        # The FP8 route ran (its device copy exists) exactly where it should.
        ran = torch.device("cuda", torch.cuda.current_device()) in m[0].__dict__.get("_w8a8", {})
        assert ran == (fp8 and rows > own), rows


@needs_cuda
def test_cuda_rans_kernel_on_a_corrupt_payload_stays_inside_its_buffers():
    """Garbage words (the host checks only the chunk table) give garbage, never a fault."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    d = hcuda.DeviceLinear(hypercodec.Linear.quantize(w, "e8@4-gpu"), torch.device("cuda"))
    for fill in (0, 255):
        d.payload.fill_(fill)
        d.payload[::7] = torch.randint(0, 256, d.payload[::7].shape, dtype=torch.uint8, device="cuda")
        for route in ("gemv", "decode"):
            d.forward(torch.randn(2, 1024, device="cuda"), route=route)
        torch.cuda.synchronize()


@needs_cuda
@pytest.mark.parametrize("spec", ["tcq@2-l12", "tcq@3-l12", "tcq@1-l12", "tcq@2", "tcq@2-l12-v2", "tcq@3-l12-v2"])
def test_cuda_trellis_with_calibrated_short_sequences(spec):
    # Calibrated trellis rows are cut into sequences of 16 values: most chunks wrap.
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 384)).astype(np.float32)
    a = rng.standard_normal((2048, 384)).astype(np.float32)
    h = (a.T @ a / len(a)).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec, None, h)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.kind == "trellis"
    for m in (1, 2, 9):
        x = torch.from_numpy(rng.standard_normal((m, 384)).astype(np.float32))
        want = op.forward(x.numpy())
        got = d.forward(x.cuda()).cpu().numpy()
        assert np.abs(got - want).max() <= 3e-4 * np.abs(want).max(), (spec, m)


@needs_cuda
@pytest.mark.parametrize("k,l", [(1, 8), (2, 12), (2, 16), (3, 10), (4, 16)])
@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_trellis_group_path_matches_the_cpu_runtime(k, l, v, dtype):
    # Rows of whole 32-value groups take the group kernels (GEMV and decoder): one sequence
    # (512 columns), three with a longer last one (3104 = 1024 + 1024 + 1056), calibrated rows
    # (sequences of 16), a partial block of rows, batches of 1 to 5 (two passes); 2040 columns
    # (a partial group) take the per-chunk kernels. v = 2: the pair code, in each of them.
    # bf16: the tensor-core kernel for whole groups (one or two batch tiles, two passes at 17;
    # 3104 columns end on a step of one group), the f32 kernels for 2040 columns.
    rng = np.random.default_rng(10 * k + l + 100 * v)
    bf16 = dtype == torch.bfloat16
    a = rng.standard_normal((1024, 512)).astype(np.float32)
    for rows, cols, hess in ((37, 512, None), (6, 3104, None), (5, 2040, None), (19, 512, a.T @ a / len(a))):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        b = rng.standard_normal(rows).astype(np.float32)
        op = hypercodec.Linear.quantize(w, f"tcq@{k}-l{l}" + ("-v2" if v == 2 else ""), b, hess)
        d = hcuda.DeviceLinear(op, torch.device("cuda"))
        assert d.kind == "trellis" and (op.device_form()["seq"] == 16) == (hess is not None)
        assert op.device_form()["v"] == v
        tc = bf16 and cols % 32 == 0
        assert (d.route(1, dtype) == "cuda-trellis-mma") == (tc and v == 2), d.route(1, dtype)
        assert (d.route(2, dtype) == "cuda-trellis-mma") == tc, d.route(2, dtype)
        batches = ((1, "gemv"), (2, "gemv"), (3, "gemv"), (5, "gemv"), (5, "decode"))
        if bf16:
            batches += ((8, "gemv"), (9, "gemv"), (16, "gemv"), (17, "gemv"))
        for m, route in batches:
            # 5 through the GEMV: a pass of 4 rows and one of 1.
            x = torch.from_numpy(rng.standard_normal((m, cols)).astype(np.float32)).to(dtype)
            want = op.forward(x.float().numpy())
            got = d.forward(x.cuda(), route=route).float().cpu().numpy()
            # bf16: the output's rounding (2^-9) and the rotated activations' in f16 (2^-12).
            tol = 1e-2 if bf16 else 3e-4
            assert np.abs(got - want).max() <= tol * np.abs(want).max(), (k, l, rows, cols, hess is None, m, route)


@needs_cuda
@pytest.mark.parametrize("spec", ["tcq@2-l12", "tcq@2-l12-v2"])
def test_cuda_trellis_tensor_cores_survive_activations_past_f16(spec):
    # The tensor-core kernel feeds rotated activations to the mma as f16: a batch row above
    # f16's range (1e6) is recomputed in f32 and matches the CPU runtime; a NaN in one batch row
    # leaves the others exact; a tiny batch row (1e-3) keeps its precision.
    rng = np.random.default_rng(7)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.route(3, torch.bfloat16) == "cuda-trellis-mma"
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[0] *= 1e6
    x[2] *= 1e-3
    xb = torch.from_numpy(x).to(torch.bfloat16)
    want = op.forward(xb.float().numpy())
    got = d.forward(xb.cuda()).float().cpu().numpy()
    assert np.isfinite(got).all()
    for m in range(3):
        assert np.abs(got[m] - want[m]).max() <= 1e-2 * np.abs(want[m]).max(), m
    xb[1, 5] = float("nan")
    got = d.forward(xb.cuda()).float().cpu().numpy()
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()
    assert np.abs(got[0] - want[0]).max() <= 1e-2 * np.abs(want[0]).max()


@needs_cuda
@pytest.mark.parametrize("m, cols, width, tile, offset", [
    (2, 64, 64, 64, 0),          # a small tile: hc_rht
    (1, 128, 136, 128, 0),       # rows padded past the columns
    (3, 1024, 1024, 256, 0),     # hc_rht_fast
    (2, 4096, 4096, 4096, 0),    # the largest tile
    (2, 1024, 1024, 1024, 1),    # activations 4 bytes off 16-byte alignment
])
def test_cuda_rht_f16_copy_is_its_f32_output_rounded(m, cols, width, tile, offset):
    rng = np.random.default_rng(m * cols + offset)
    v = rng.standard_normal(m * cols + offset).astype(np.float32)
    v[offset + 3] = 1e7  # past f16 after any tile's 1/√tile: inf in the copy, as .half() gives
    x2 = torch.from_numpy(v).cuda()[offset:].view(m, cols)
    out16 = torch.full((m, width), float("nan"), dtype=torch.float16, device="cuda")  # poisoned
    out = hcuda.rht(x2, width, tile, 11, out16)
    assert torch.equal(out, hcuda.rht(x2, width, tile, 11))
    assert torch.equal(out16, out.half())
    assert torch.isinf(out16).any() and not torch.isnan(out16).any()
    for bad in [torch.empty(m, width, dtype=torch.float32, device="cuda"),
                torch.empty(m, width + 8, dtype=torch.float16, device="cuda"),
                torch.empty(m, 2 * width, dtype=torch.float16, device="cuda")[:, ::2],  # strided (a transpose is contiguous at m = 1)
                torch.empty(m, width, dtype=torch.float16)]:
        with pytest.raises(hypercodec.InvalidInputError):
            hcuda.rht(x2, width, tile, 11, bad)


@needs_cuda
@pytest.mark.parametrize("tile", [32, 256, 512, 1024, 2048, 4096])
def test_cuda_rht_matches_the_host_for_every_tile(tile):
    """Each tile size's butterfly path (hc_rht below 256; hc_rht_fast's warp stages, then one
    barrier and the last 1-4 stages in registers, the 4096 tile's last across two lanes)
    against the host's signs and Walsh–Hadamard transform; two tiles a row, three rows, rows
    padded past the columns, bf16 input."""
    from hypercodec.nn import _rht

    torch.manual_seed(tile)
    cols, width = 2 * tile, 2 * tile + 8
    x = torch.randn(3, cols, device="cuda")
    out16 = torch.full((3, width), float("nan"), dtype=torch.float16, device="cuda")
    for xin in (x, x.bfloat16()):
        got = hcuda.rht(xin, width, tile, 77, out16)
        want = _rht(xin.float().cpu(), tile, 77)
        torch.testing.assert_close(got[:, :cols].cpu(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[:, cols:].cpu(), torch.zeros(3, 8))
        assert torch.equal(out16, got.half())


def _kv_args(p, rows, toks, dtype_code):
    return {"x": 0, "out": 0, "dtype": dtype_code, "codes": 0, "scales": 0, "out_row": 0, "codes_row": 0,
            "scales_row": 0, "rows": rows, "toks": toks, "dim": p["dim"], "bits": p["bits"], "tile": p["tile"],
            "alpha": p["alpha"], "seed": p["seed"]}


def test_kv_device_params_name_what_the_kernels_take():
    assert hypercodec.KvCodec(128, 4, "e8").device_params()["tile"] == 128
    assert hypercodec.KvCodec(64, 3, "e8", rotation="none").device_params()["tile"] == 0
    assert hypercodec.KvCodec(128, 4, "e8", dither=True).device_params() is None
    assert hypercodec.KvCodec(128, 2, "trellis").device_params() is None
    assert hypercodec.KvCodec(20, 4, "e8").device_params() is None  # not whole words


@needs_cuda
@pytest.mark.parametrize("dim,bits,rotation", [(128, 4, "rht"), (64, 2, "rht"), (80, 3, "rht"), (128, 3, "none")])
def test_cuda_kv_codec_matches_the_host_codec(dim, bits, rotation):
    codec = hypercodec.KvCodec(dim, bits, "e8", rotation=rotation, seed=5)
    p = codec.device_params()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6 * 10, dim)).astype(np.float32)
    x[:, 3] *= 20  # an outlier channel
    x[7] = 0  # a zero vector
    k = hcuda.kernels(torch.device("cuda"))
    stream = torch.cuda.current_stream().cuda_stream
    xt = torch.from_numpy(x).cuda()
    codes = torch.empty((6, 10, p["code_bytes"]), dtype=torch.uint8, device="cuda")
    scales = torch.empty((6, 10), dtype=torch.int16, device="cuda")
    a = _kv_args(p, 6, 10, 0)
    a.update(x=xt.data_ptr(), codes=codes.data_ptr(), scales=scales.data_ptr(), codes_row=10 * p["code_bytes"], scales_row=10)
    k.kv_e8_encode(a, stream)
    hc, hs = codec.encode(x)
    gc = codes.cpu().numpy().reshape(60, -1)
    gs = scales.cpu().numpy().view(np.uint16).reshape(60)
    assert (gc == hc.reshape(60, -1)).all(axis=1).mean() >= 0.95  # rounding ties may differ
    snr = lambda y: 10 * np.log10((x ** 2).sum() / ((x - y) ** 2).sum())  # noqa: E731
    assert abs(snr(codec.decode(gc, gs)) - snr(codec.decode(hc, hs))) < 0.05
    # Device decode of the host's codes into a strided output (rows of 12 tokens, from token 1).
    out = torch.zeros((6, 12, dim), dtype=torch.float32, device="cuda")
    hct = torch.from_numpy(hc.reshape(6, 10, -1).copy()).cuda()
    hst = torch.from_numpy(hs.reshape(6, 10).view(np.int16).copy()).cuda()
    d = _kv_args(p, 6, 10, 0)
    d.update(out=out.data_ptr() + dim * 4, out_row=12 * dim, codes=hct.data_ptr(), codes_row=10 * p["code_bytes"],
             scales=hst.data_ptr(), scales_row=10)
    k.kv_e8_decode(d, stream)
    got = out.cpu().numpy()
    want = codec.decode(hc, hs).reshape(6, 10, dim)
    assert np.abs(got[:, 1:11] - want).max() <= 1e-4 * np.abs(want).max()
    assert (got[:, 0] == 0).all() and (got[:, 11] == 0).all()


@needs_cuda
@pytest.mark.parametrize("dim,bits,rotation", [(64, 4, "rht"), (128, 2, "rht"), (256, 4, "rht"), (64, 4, "none")])
def test_cuda_kv_codec_decodes_values_near_the_f32_range_finite(dim, bits, rotation):
    """A value of 3e38 among small ones: the decode's inverse RHT sums up to a tile of values
    near it, which overflowed to inf − inf = NaN; it now runs scaled down by the tile (a power
    of two) and back, as the host's does."""
    codec = hypercodec.KvCodec(dim, bits, "e8", rotation=rotation, seed=9)
    p = codec.device_params()
    rng = np.random.default_rng(4)
    n = 12
    x = rng.standard_normal((n, dim)).astype(np.float32)
    for i in range(n):
        x[i, (7 * i) % dim] = 3e38 if i % 2 else -3e38
    x[5] = 3e38 * rng.uniform(-1, 1, dim).astype(np.float32) / dim  # large everywhere, finite rotated
    k = hcuda.kernels(torch.device("cuda"))
    stream = torch.cuda.current_stream().cuda_stream
    xt = torch.from_numpy(x).cuda()
    codes = torch.empty((1, n, p["code_bytes"]), dtype=torch.uint8, device="cuda")
    scales = torch.empty((1, n), dtype=torch.int16, device="cuda")
    a = _kv_args(p, 1, n, 0)
    a.update(x=xt.data_ptr(), codes=codes.data_ptr(), scales=scales.data_ptr(), codes_row=n * p["code_bytes"],
             scales_row=n)
    k.kv_e8_encode(a, stream)
    gc = codes.cpu().numpy().reshape(n, -1)
    gs = scales.cpu().numpy().view(np.uint16).reshape(n)
    want = codec.decode(gc, gs)
    assert np.isfinite(want).all()
    for dtype, code, tol in ((torch.float32, 0, 1e-4), (torch.bfloat16, 2, 1e-2)):
        out = torch.full((1, n, dim), float("nan"), dtype=dtype, device="cuda")
        d = _kv_args(p, 1, n, code)
        d.update(out=out.data_ptr(), out_row=n * dim, codes=codes.data_ptr(), codes_row=n * p["code_bytes"],
                 scales=scales.data_ptr(), scales_row=n)
        k.kv_e8_decode(d, stream)
        got = out.float().cpu().numpy().reshape(n, dim)
        assert np.isfinite(got).all(), (dtype, np.argwhere(~np.isfinite(got))[:4])
        for i in range(n):
            if i != 5:
                j = (7 * i) % dim
                assert abs(got[i, j]) > 1e38 and np.sign(got[i, j]) == np.sign(x[i, j]), (dtype, i, got[i, j])
        err = np.abs(got.astype(np.float64) - want).max(axis=1) / np.abs(want).max(axis=1)
        assert (err <= tol).all(), (dtype, err)


@needs_cuda
def test_cuda_kv_cache_decodes_f16_keys_near_the_largest_f16_finite():
    """The device decode converted to f16 as it wrote: a coded value a little past 65504 (its
    coding error) became inf, where the host decode clamps it."""
    from hypercodec.kv import HypercodecKVLayer

    torch.manual_seed(0)
    layer = HypercodecKVLayer(key_bits=2, value_bits=2, window=4, block=2)
    k = (torch.rand(1, 2, 40, 64, device="cuda") * 2 - 1).mul(65000).to(torch.float16)
    k[:, :, :, 0] = 65504.0
    out, _ = layer.update(k, k)
    assert layer._gpu is not None and out.is_cuda
    assert torch.isfinite(out).all()
    host, _ = HypercodecKVLayer(key_bits=2, value_bits=2, window=4, block=2).update(k.cpu(), k.cpu())
    snr = lambda y: float(10 * torch.log10(k.float().cpu().norm() ** 2 / (y.float().cpu() - k.float().cpu()).norm() ** 2))  # noqa: E731
    assert abs(snr(out) - snr(host)) < 0.3, (snr(out), snr(host))


@needs_cuda
def test_cuda_kv_cache_generates_batch_8_equal_to_batch_1_on_the_device():
    transformers = pytest.importorskip("transformers")
    from hypercodec.kv import HypercodecCache

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    m = transformers.LlamaForCausalLM(cfg).cuda().eval()
    prompts = torch.randint(0, 256, (8, 60), device="cuda")

    def gen(ids, cache):
        with torch.no_grad():
            return m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                              max_new_tokens=10, min_new_tokens=10, do_sample=False)

    cache = HypercodecCache(cfg, window=16, block=8)
    out = gen(prompts, cache)
    assert cache.layers[0]._gpu is not None and cache.layers[0]._k.codes.is_cuda
    assert 4.0 < cache.bits_per_value() < 12.0
    for i in range(8):
        assert torch.equal(out[i], gen(prompts[i : i + 1], HypercodecCache(cfg, window=16, block=8))[0])
    # Attention over the codes (the fused path): the logits of a step after a left-padded
    # prefill long enough to compress (60 tokens > window 16 + block 8; the padding rows'
    # queries see no token), against decoding the cache.
    from hypercodec.kv import ATTENTION

    ids, am = prompts[:4], torch.ones_like(prompts[:4])
    am[1, :7] = 0

    def step(cache):
        with torch.no_grad():
            m(input_ids=ids, attention_mask=am, past_key_values=cache, use_cache=True)
            nxt = torch.full((4, 1), 5, device="cuda")
            mask = torch.cat([am, torch.ones_like(nxt)], 1)
            return m(input_ids=nxt, attention_mask=mask, past_key_values=cache, use_cache=True).logits[:, -1].float()

    want = step(HypercodecCache(cfg, window=16, block=8))
    m.set_attn_implementation(ATTENTION)
    try:
        got = step(HypercodecCache(cfg, window=16, block=8))
    finally:
        m.set_attn_implementation("sdpa")
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max(), (got - want).abs().max()


@needs_cuda
@pytest.mark.parametrize("d,q,sinks", [(64, 1, 0), (128, 3, 4), (32, 1, 2)])
def test_cuda_kv_attention_over_the_codes_matches_the_decoded_cache(d, q, sinks):
    """The fused device path (`hc_kv_e8_attend` + the exact tokens) against softmax attention
    over the same cache decoded on the device: GQA (3 query heads per KV head; 9 queries per
    row at q = 3, two query tiles), a padded batch row, causal queries, sinks, a window."""
    pytest.importorskip("transformers")  # the cache needs it
    from hypercodec.kv import HypercodecKVLayer

    torch.manual_seed(d + q)
    b, hk, g = 2, 2, 3
    fused, plain = (HypercodecKVLayer(4, 3, window=8, sinks=sinks, block=16) for _ in range(2))
    fused.fused = True
    for steps in (40, 17, q):  # prefill, a second block, then the attended step
        k = torch.randn(b, hk, steps, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hk, steps, d, device="cuda", dtype=torch.bfloat16)
        kf, vf = fused.update(k, v)
        kd, vd = plain.update(k, v)
    assert fused._gpu is not None and fused._k.n > 0 and hasattr(kf, "_hypercodec")
    total = kd.shape[2]
    query = torch.randn(b, hk * g, q, d, device="cuda", dtype=torch.bfloat16)
    seen = torch.arange(total, device="cuda")[None, :] <= torch.arange(total - q, total, device="cuda")[:, None]
    pad = torch.ones(b, 1, q, total, dtype=torch.bool, device="cuda") & seen
    pad[1, :, :, :5] = False  # batch row 1: five padding tokens
    pad[0, :, 0, :] = False  # and a query that sees no token: zeros, as on the host
    scaling = d**-0.5
    for mask in (None, pad):
        got = fused.attend(query, kf, vf, mask, scaling).float()  # [b, q, hq, d]
        keys = kd.float().repeat_interleave(g, 1)
        vals = vd.float().repeat_interleave(g, 1)
        logits = torch.einsum("bhqd,bhtd->bhqt", query.float(), keys) * scaling
        allowed = pad if mask is not None else seen[None, None]
        logits = logits.masked_fill(~allowed, float("-inf"))
        want = torch.einsum("bhqt,bhtd->bhqd", logits.softmax(-1).nan_to_num(0.0), vals).transpose(1, 2)
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, (mask is None, err)  # bf16 queries and output


@needs_cuda
def test_cuda_edge_shapes_and_dtype_switches():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    d = hcuda.DeviceLinear(hypercodec.Linear.quantize(w, "e8-fixed4"), torch.device("cuda"))
    x = rng.standard_normal((70000, 256)).astype(np.float32)  # more rows than one RHT launch takes
    got = d.forward(torch.from_numpy(x).cuda()).cpu().numpy()
    want = d._op.forward(x)
    assert np.abs(got - want).max() <= 3e-4 * np.abs(want).max()
    assert d.forward(torch.empty(0, 256, device="cuda")).shape == (0, 32)
    # The decode fallback keeps one weight per dtype: f32 after bf16 stays exact.
    f = hcuda.DeviceLinear(hypercodec.Linear.quantize(w, "e8@4"), torch.device("cuda"))
    xs = torch.from_numpy(x[:3]).cuda()
    f.forward(xs.bfloat16())
    want = f._op.forward(x[:3])
    assert np.abs(f.forward(xs).cpu().numpy() - want).max() <= 3e-5 * np.abs(want).max()


def _trellis_lengths(cols: int, seq: int) -> list[int]:
    m = max(1, cols // seq)
    return [seq if j + 1 < m else cols - j * seq for j in range(m)]


@needs_cuda
@pytest.mark.parametrize(
    "l,k,seq,rows,cols,max_scratch,v",
    [(*case, 1) for case in [
        (8, 2, 64, 5, 200, 0),  # every boundary tried (64 groups); the last sequence takes 72 more
        (10, 4, 16, 3, 72, 0),  # every boundary tried at K = 4
        (12, 2, 16, 9, 256, 0),  # calibrated rows: sequences of 16
        (12, 1, 32, 4, 100, 0),
        (12, 3, 64, 4, 200, 0),
        (14, 2, 1024, 3, 700, 0),  # rows shorter than a sequence: one each
        (16, 2, 16, 4, 64, 0),
        (16, 2, 1024, 3, 2088, 0),  # longer than the ring: back pointers in scratch
        (16, 2, 1024, 3, 2088, 1 << 20),  # ... or, under a small cap, checkpoints
        (15, 1, 256, 2, 600, 0),
        (16, 3, 256, 2, 520, 0),
        (16, 4, 256, 3, 512, 0),
        (16, 4, 256, 3, 512, 1 << 16),
        (12, 2, 4096, 2, 5000, 0),  # one sequence per row, thousands of values long
        (12, 2, 4096, 2, 5000, 1 << 16),
    ]]
    # The pair code (two values a state, a step of 2K bits).
    + [
        (8, 1, 64, 5, 200, 0, 2),  # 64 boundaries: every one tried; the last sequence takes 72 more
        (12, 2, 16, 9, 256, 0, 2),  # calibrated rows: sequences of 16 (8 steps)
        (12, 1, 32, 4, 100, 0, 2),
        (16, 2, 16, 4, 64, 0, 2),
        (16, 2, 1024, 3, 2088, 0, 2),  # longer than the ring: back pointers in scratch
        (16, 2, 1024, 3, 2088, 1 << 20, 2),  # ... or, under a small cap, checkpoints
        (16, 1, 256, 2, 600, 0, 2),  # L = 16 at one bit: 2^14 groups
        (10, 2, 4096, 2, 5000, 1 << 16, 2),  # one sequence per row, thousands of values long
        (14, 2, 1024, 3, 702, 0, 2),  # rows shorter than a sequence: one each
    ],
)
def test_cuda_trellis_encoder_matches_the_cpu_encoder(l, k, seq, rows, cols, max_scratch, v):
    rng = np.random.default_rng(l * 100 + k * 10 + rows + v)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x[0, :8] *= 6.0  # a few outliers
    cpu = np.frombuffer(hypercodec._native.trellis_encode(x, l, k, seq, v=v), np.uint8).reshape(rows, -1)
    plan = hcuda.trellis_encode_plan(rows, cols, l, k, seq, max_scratch=max_scratch, v=v)
    gpu = hcuda.trellis_encode(torch.from_numpy(x).cuda(), l, k, seq, max_scratch=max_scratch, v=v).cpu().numpy()
    assert gpu.shape == cpu.shape
    # Sequences within the ring need no scratch; longer ones keep their back pointers there
    # or, under the cap, are searched from checkpoints: the CPU's bits every way.
    longer = max(_trellis_lengths(cols, seq)) // v >= plan["ring"]
    assert longer == (plan["scratch_bytes"] > 0)
    if longer:
        assert plan["back_pointers_in_scratch"] == (max_scratch == 0), plan
    np.testing.assert_array_equal(gpu, cpu)


@needs_cuda
def test_cuda_trellis_encoder_refuses_what_it_cannot_encode():
    x = torch.randn(2, 64, device="cuda")
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 12, 5, 16)  # K above 4
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 12, 2, 12)  # sequences not a multiple of 8
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 16, 1, 8)  # 8 values of 1 bit cannot hold a 16-bit state
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 16, 1, 64)  # two buffers of 2^15 costs: more than a block has
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 12, 3, 16, v=2)  # pairs of 3 bits: a 6-bit step (the CPU codes them)
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x[:, :63], 12, 2, 16, v=2)  # pairs need rows of an even length
    x[1, 3] = 1e20  # squared errors near f32's overflow
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 12, 2, 16)
    x[1, 3] = float("nan")
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x, 12, 2, 16)
    with pytest.raises(hypercodec.InvalidInputError):
        hcuda.trellis_encode(x.cpu(), 12, 2, 16)
    assert hcuda.trellis_encode(torch.empty(0, 64, device="cuda"), 12, 2, 16).shape == (0, 16)


@needs_cuda
@pytest.mark.parametrize("spec", ["tcq@2", "tcq@4-l12", "tcq@3-l14", "tcq@2-l12-v2", "tcq@1-v2", "tcq@4-l12-v2"])
def test_trellis_layers_of_cuda_weights_are_coded_on_the_gpu_with_the_cpus_bits(spec):
    # tcq@2-l12-v2, tcq@1-v2: pairs on the GPU; tcq@4-l12-v2: pairs of 4 bits, which the GPU
    # encoder refuses, so the CPU codes them: the same archive every way.
    torch.manual_seed(5)
    lin = torch.nn.Linear(512, 96)
    with torch.no_grad():
        lin.weight[3].zero_()  # a zero row keeps zero bits and scale 0
        lin.weight[7] *= 1e3
    w = lin.weight.detach().numpy().copy()
    b = lin.bias.detach().numpy().copy()
    cpu = hypercodec.Linear.quantize(w, spec, b)
    gpu = hypercodec.Linear.quantize(w, spec, b, device=torch.cuda.current_device())
    assert gpu.to_hwz() == cpu.to_hwz()
    layer = hnn.HyperLinear.from_linear(lin.cuda(), spec)
    assert layer.op.to_hwz() == cpu.to_hwz()


@needs_cuda
@pytest.mark.parametrize("spec", ["tcq@2", "tcq@3-l12", "tcq@2-l12-v2"])
def test_calibrated_trellis_on_the_gpu_gives_the_cpus_bits(spec):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((96, 512)).astype(np.float32)
    w[5] = 0.0
    x = rng.standard_normal((2048, 512)).astype(np.float32)
    x[:, 1:] += 0.8 * x[:, :-1]  # correlated inputs: the feedback moves values
    h = (x.T @ x / len(x)).astype(np.float32)
    cpu = hypercodec.Linear.quantize(w, spec, None, h)
    gpu = hypercodec.Linear.quantize(w, spec, None, h, device=torch.cuda.current_device())
    assert gpu.to_hwz() == cpu.to_hwz()
    plain = hypercodec.Linear.quantize(w, spec)
    assert plain.to_hwz() != cpu.to_hwz()  # the feedback did something


@needs_cuda
def test_quantize_budget_of_a_cuda_model_codes_on_the_gpu_with_the_cpus_choice():
    def model() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))

    ladder = ("tcq@2-l12", "tcq@3-l12", "tcq@4-l12")
    cpu = hnn.quantize_budget(model(), 3, skip=(), candidates=ladder, device="cpu")
    gpu = hnn.quantize_budget(model().cuda(), 3, skip=(), candidates=ladder)  # the weights' GPU
    named = hnn.quantize_budget(model(), 3, skip=(), candidates=ladder, device="cuda:0")
    for i in (0, 2):
        assert isinstance(gpu[i], hnn.HyperLinear) and isinstance(named[i], hnn.HyperLinear)
        assert gpu[i].op.to_hwz() == cpu[i].op.to_hwz()
        assert named[i].op.to_hwz() == cpu[i].op.to_hwz()
    x = torch.randn(4, 256)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), rtol=2e-3, atol=2e-3)


def _device_layer(rng, rows, cols, spec, bias=True):
    """A random layer of `spec` on the CUDA device (`hcuda.DeviceLinear`), with a bias or not."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32) if bias else None
    return hcuda.DeviceLinear(hypercodec.Linear.quantize(w, spec, b), torch.device("cuda"))


@needs_cuda
def test_cuda_layers_of_one_input_in_one_launch_equal_their_own_launches():
    """`hcuda.forward_group`: affine layers that read one activation row run as one launch of
    the batch-1 kernel (row tiles end to end, at most GROUP_MAX layers a launch). Each output
    equals the layer's own launch bit for bit: full and partial row tiles, with and without a
    bias, f32 and 16-bit scales, 2 and 4 bits, five layers (two launches). A group the kernel
    does not take (codes of two widths) runs layer by layer. At more rows the fused kernels'
    launches run side by side on streams of their own (busied here, and captured in a graph),
    short layers too (alone they decode at 40 rows), and layers that decode at that batch beside
    them on the current stream; where every layer decodes (beyond the fused batch) and for f32
    inputs the group is left to the caller."""
    rng = np.random.default_rng(31)
    cols = 1024

    def layer(rows, spec, bias=True):
        return _device_layer(rng, rows, cols, spec, bias)

    groups = {
        "qkv": [layer(256, "int4"), layer(64, "int4", False), layer(64, "int4")],
        "partial tiles": [layer(1000, "int4"), layer(37, "int4"), layer(16, "int4", False), layer(5, "int4")],
        "five": [layer(r, "int4") for r in (48, 32, 16, 80, 21)],
        "int2": [layer(96, "int2"), layer(40, "int2", False)],
        "f32 scales": [layer(64, "int4-row"), layer(48, "int4-row")],
        "two widths": [layer(64, "int4"), layer(64, "int2")],
        # Alone at 17-64 rows the tall layer runs the GEMM and the short ones decode (but where
        # the GEMM splits over clusters); side by side all run it.
        "tall beside short": [layer(hcuda.GEMM_MIN_ROWS, "int4"), layer(64, "int4", False), layer(100, "int4")],
        # At 40 rows groups of 64 have no GEMM: decoded on the current stream beside the others.
        "decoded beside": [layer(256, "int4"), layer(64, "int4-g64"), layer(48, "int2")],
    }
    tall = groups["tall beside short"]
    short = ["cuda-affine-gemm" if (_split_gemm(d) or (0, 1))[1] > 1 else "cuda-affine-decode+linear" for d in tall[1:]]
    assert [d.route(40, torch.bfloat16) for d in tall] == ["cuda-affine-gemm"] + short
    assert [d._takes(40, torch.bfloat16, grouped=True) for d in groups["decoded beside"]] == [True, False, True]
    for dtype, m in itertools.product((torch.bfloat16, torch.float16), (1, 3, 16, 40)):
        x = torch.from_numpy(rng.standard_normal((m, 1, cols)).astype(np.float32)).to("cuda", dtype)
        for name, ds in groups.items():
            _busy_streams()
            xi = x.clone()  # (written after the sleep: a side launch before the fork reads it unwritten)
            ys = hcuda.forward_group(ds, xi)
            assert ys is not None and len(ys) == len(ds), name
            for d, y, want in zip(ds, ys, _group_wants(ds, x)):
                assert y.shape == want.shape == (m, 1, d.rows) and y.dtype == dtype, name
                assert torch.isfinite(y).all() and torch.equal(y, want), (name, dtype, m, d.rows, d.route(m, dtype))
    assert len(hcuda._SIDE[torch.cuda.current_device()]) >= 4  # (five layers at 3 rows)
    _replays_follow_inputs(groups["qkv"], 3, cols)  # (the tensor-core GEMV)
    _replays_follow_inputs(groups["decoded beside"], 40, cols)  # (the GEMM beside a decoded layer)
    d = groups["qkv"]
    assert hcuda.forward_group(d, torch.randn(1, cols, device="cuda")) is None  # f32
    big = d[0]._kernel_batches(torch.bfloat16)[3] + 1  # (small layers: never the Hopper GEMM)
    assert not d[0]._takes(big, torch.bfloat16)
    assert hcuda.forward_group(d, torch.randn(big, cols, device="cuda", dtype=torch.bfloat16)) is None
    assert hcuda.forward_group(d, torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)) is None


def _busy_streams():
    """Busy streams make a missing fork (a side launch before the input it reads is written) or
    a missing join (outputs read before a side launch wrote them) show: PyTorch's current
    stream and every side stream of :func:`hcuda.forward_group` sleep a while."""
    for s in hcuda._SIDE.get(torch.cuda.current_device(), []):
        with torch.cuda.stream(s):
            torch.cuda._sleep(100_000)
    torch.cuda._sleep(100_000)


def _replays_follow_inputs(ds, m, cols):
    """`forward_group` on ``m`` rows captured in a CUDA graph (its streams' fork and join
    inside): replays on new inputs give each layer's own forward."""
    x = torch.zeros(m, cols, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        hcuda.forward_group(ds, x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = hcuda.forward_group(ds, x)
    for _ in range(2):
        _busy_streams()
        x.copy_(torch.randn(m, cols, device="cuda", dtype=torch.bfloat16))
        g.replay()
        assert all(torch.equal(y, want) for y, want in zip(ys, _group_wants(ds, x))), m


def _group_wants(ds, x):
    """Each affine layer's output as `forward_group` gives it: its fused launch where a group
    takes the batch (short layers run the GEMM beside others, and decode alone), else its own
    forward."""
    m = x.numel() // x.shape[-1]
    fused = [len(ds) > 1 and d._takes(m, x.dtype, grouped=True) for d in ds]
    return [d.forward(x, route="gemv" if f else None) for d, f in zip(ds, fused)]


@needs_cuda
def test_cuda_rotated_layers_of_one_input_share_their_activation_rht():
    """`hcuda.forward_group` on E8 and trellis layers with the same activation RHT (width, tile,
    seed): one RHT, then each layer's kernel, each output equal to the layer's own forward bit
    for bit, at batches on the GEMV, tensor-core and decode routes, and mixed forms. Layers of
    another rotation or an affine layer among them are left to the caller."""
    rng = np.random.default_rng(37)
    cols = 512

    def layer(rows, spec, bias=True):
        return _device_layer(rng, rows, cols, spec, bias)

    groups = {
        "trellis": [layer(64, "tcq@2-l12"), layer(32, "tcq@2-l12", False), layer(16, "tcq@2-l12")],
        "pairs": [layer(48, "tcq@2-l12-v2"), layer(21, "tcq@4-l12-v2")],
        "e8": [layer(40, "e8-fixed4"), layer(24, "e8-fixed3", False)],
        "e8 rans": [layer(64, "e8@4-gpu"), layer(8, "e8@3-gpu")],
        "mixed": [layer(64, "tcq@2-l12"), layer(32, "e8-fixed4"), layer(16, "e8@4-gpu")],
        # (side by side on streams of their own where the fused kernels take the batch)
        "prefix": [layer(64, "e8@4-prefix"), layer(40, "e8@3-prefix10", False), layer(24, "e8@4-prefix")],
    }
    assert all(len({d.rotation() for d in ds}) == 1 for ds in groups.values())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m in (1, 3, 16, 40):
            x = torch.from_numpy(rng.standard_normal((m, 1, cols)).astype(np.float32)).to("cuda", dtype)
            for name, ds in groups.items():
                _busy_streams()
                ys = hcuda.forward_group(ds, x.clone())  # (the clone as above, before the RHT)
                assert ys is not None and len(ys) == len(ds), name
                for d, y in zip(ds, ys):
                    want = d.forward(x)
                    assert y.shape == want.shape == (m, 1, d.rows) and y.dtype == dtype, name
                    assert torch.isfinite(y).all() and torch.equal(y, want), (name, dtype, m, d.route(m, dtype))
    assert len(hcuda._SIDE[torch.cuda.current_device()]) >= 2  # the fused kernels' streams
    # The streams' fork and join inside a CUDA graph: replays follow new inputs (fixed-rate E8
    # with its scratch, kept to the join).
    for ds, m in itertools.product((groups["prefix"], groups["e8"], groups["trellis"]), (1, 3)):
        _replays_follow_inputs(ds, m, cols)
    x = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)
    assert hcuda.forward_group(groups["trellis"] + [layer(16, "int4")], x) is None
    wide = _device_layer(rng, 16, 2 * cols, "tcq@2-l12")
    assert wide.rotation() != groups["trellis"][0].rotation()
    assert hcuda.forward_group(groups["trellis"] + [wide], x) is None  # (another width: not one input)


@needs_cuda
def test_cuda_compiled_projections_of_one_input_run_as_one_launch(grouped_graphs, projections):
    """Under torch.compile (inductor) the stored linear layers that read one node (q, k, v;
    gate, up) become one `stored_forward_group` call, which launches once at batch 1: the
    compiled block gives what it gives with grouping off, bit for bit, in the default mode and
    under CUDA graphs, at batch 1 and 3."""
    torch.manual_seed(33)
    blk = projections(256, bias=False).cuda().to(torch.bfloat16)
    hnn.quantize(blk, bps=4, method="affine", skip=())
    out = {}
    for grouping in (True, False):
        hnn.set_compile_grouping(grouping)
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            c = torch.compile(blk, fullgraph=True, mode=mode)
            for m in (1, 3):
                torch.manual_seed(m)
                x = torch.randn(m, 1, 256, device="cuda").to(torch.bfloat16)
                with torch.no_grad():
                    for _ in range(3):
                        y = c(x).clone()
                assert torch.isfinite(y).all()
                out[(grouping, mode, m)] = y
    assert grouped_graphs and all(n == 2 for n in grouped_graphs), grouped_graphs  # (the pass runs only with grouping on)
    for mode in ("default", "reduce-overhead"):
        for m in (1, 3):
            assert torch.equal(out[(True, mode, m)], out[(False, mode, m)]), (mode, m)
