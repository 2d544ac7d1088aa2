"""Compressed layers on CUDA tensors (requires torch; used by :class:`hypercodec.nn.HyperLinear`).

A :class:`DeviceLinear` puts one layer's *stored* form on a GPU — affine codes, fixed-rate E8
words or bitshift-trellis bits exactly as the archive holds them, plus f32 scales — as PyTorch tensors (so
``torch.cuda.memory_allocated`` counts every byte), and runs ``y = x·Wᵀ + b`` with hypercodec's
CUDA kernels (PTX shipped in the wheel, loaded by the driver: nothing is compiled at import)
on PyTorch's current stream, without synchronizing:

- up to :data:`GEMV_MAX_BATCH` activation rows: a fused GEMV reading the codes once per 4 rows
  (E8 and trellis: after the activation's randomized Hadamard transform on the GPU); affine
  codes of 2 or 4 bits (8 with f16) under bf16 or f16 activations run on tensor cores up to
  :data:`MMA_MAX_BATCH` rows in one launch (the codes read once), and 2- or 4-bit codes whose
  rows and groups hold whole chunks of 128 columns on a tensor-core GEMM above that, up to the
  kernels' ``MAX_GEMM_BATCH`` (weights decoded in registers, never in memory), where the layer
  has :data:`GEMM_MIN_ROWS` rows or more (a shorter one leaves most of the device idle, and
  decodes; on an H100 or H200 a shorter one runs it split over clusters of 2–8 blocks instead,
  and one of up to 1024 rows does from 9 rows);
- on an H100 or H200 (compute capability 9.0), 4-bit affine layers whose groups hold multiples
  of 64 columns above that, up to 256 rows and at 448–512, where the layer has rows enough to
  fill the device (about 6300, its columns split over two blocks below about 12 500; from 129
  rows, about 3100):
  the Hopper GEMM (wgmma, weights decoded in registers, activations copied by TMA), 1.2–2.4× the
  speed of decoding then cuBLAS there on an H100 (``HYPERCODEC_WGMMA=0`` turns it off);
- larger batches: the weight is decoded to the activation dtype for the call, then
  ``F.linear`` (cuBLAS) — transient memory of one dense weight;
- E8 symbols in GPU-shaped rANS chunks (``e8@B-gpu``, CLI ``--coding rans-gpu``): one warp
  decodes each chunk inside the GEMV, so the entropy-coded bytes are all the device holds;
  larger batches decode them on the device for the call, then ``F.linear``;
- E8 symbols in the format's prefix codes (``e8@B-prefix``, CLI ``--coding prefix-gpu``): one
  warp decodes each chunk of eight rows (of several groups of eight where a row is short) inside
  the GEMV, on FFMA for one activation row and on
  the tensor cores for 2–16 bf16/f16 rows (:data:`MMA_MAX_BATCH`; f32 rows: up to 4, one by
  one on FFMA); larger batches decode the weight on the device for the call, then ``F.linear``;
- forms without a kernel (other entropy-coded or Z1/D4 lattice symbols, codebook, nested):
  the documented *decode fallback* — the weight is decoded once on the host and kept on the
  device in the activation dtype.

:func:`forward_group` runs layers that read one input together (affine layers at batch 1 in one
launch, E8 and trellis layers with one activation RHT; the kernels of several rows, and of E8
and trellis layers, side by side on streams of their own); ``torch.compile`` calls
it for the layers it groups (:func:`hypercodec.nn.set_compile_grouping`).

    >>> import torch, hypercodec.nn as hnn
    >>> lin = hnn.HyperLinear.from_linear(torch.nn.Linear(4096, 4096), "int4")  # doctest: +SKIP
    >>> y = lin(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16))      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import torch

from . import _native
from .nn import _lasting, _op_weight, _rht_signs, _wht_tiles

#: Activation rows up to which the fused GEMV runs, per form (in passes of 4; above: decode,
#: then cuBLAS): the crossover measured on an H200 by ``py/benches/cuda_linear.py`` (rANS:
#: each pass decodes the whole weight, so decoding once wins from 3 rows).
GEMV_MAX_BATCH = {"affine": 4, "e8": 4, "trellis": 4, "e8rans": 2, "e8prefix": 16}
#: Activation rows of the tensor-core affine and trellis kernels (bf16/f16 activations, see above).
MMA_MAX_BATCH = 16
#: Weight rows below which an affine layer on its own decodes at 17–64 activation rows rather
#: than run the tensor-core GEMM, whose blocks would leave most of the device idle (kernels-cuda
#: ``GEMM_MIN_ROWS``; beside other layers, in :func:`forward_group`, it runs the GEMM; on compute
#: capability 9.0 it runs the GEMM split over clusters, where that fills the device).
GEMM_MIN_ROWS = _native.GEMM_MIN_ROWS
#: Layers one launch of :func:`forward_group` takes (kernels-cuda ``AFFINE_GROUP_MAX``).
GROUP_MAX = 4

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

#: Whether :func:`forward_group` runs the fused kernels of its layers side by side on streams of
#: their own (E8 and trellis layers at any batch, affine ones at 2 rows and more; on by default;
#: off only to measure what it gains).
_GROUP_STREAMS = True
#: Side streams per device index, made once (:func:`_side_streams`).
_SIDE: dict[int, list[torch.cuda.Stream]] = {}


def _side_streams(device: torch.device, n: int) -> list[torch.cuda.Stream]:
    """``n`` streams of ``device`` besides PyTorch's current one, kept for the process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    streams = _SIDE.setdefault(index, [])
    while len(streams) < n:
        streams.append(torch.cuda.Stream(device=device))
    return streams[:n]


_KERNELS: dict[int, _native.CudaKernels] = {}


def kernels(device: torch.device | int) -> _native.CudaKernels:
    """The kernels loaded on ``device`` (once per device); raises :class:`hypercodec.CudaError`
    when there is no CUDA driver or device."""
    index = torch.device("cuda", device).index if isinstance(device, int) else device.index
    index = torch.cuda.current_device() if index is None else index
    k = _KERNELS.get(index)
    if k is None:
        torch.cuda.init()  # the primary context the kernels load into is torch's
        k = _KERNELS[index] = _native.CudaKernels(index)
    return k


def available() -> bool:
    """True when torch sees a CUDA device and the kernels load on it."""
    if not torch.cuda.is_available():
        return False
    try:
        kernels(torch.cuda.current_device())
    except _native.HypercodecError:
        return False
    return True


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(index: int) -> int:
    """torch's current stream on device ``index``, as the raw handle the kernels take (without
    building a ``torch.cuda.Stream`` each call: a forward asks it every time)."""
    return _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _within(batch: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    """Whether ``batch`` lies in one of the inclusive ranges ``(fewest, most)``."""
    return any(lo <= batch <= hi for lo, hi in ranges)


def rht(x2: torch.Tensor, width: int, tile: int, seed: int, out16: torch.Tensor | None = None) -> torch.Tensor:
    """``RHT`` of the rows of ``x2`` (CUDA, ``m × cols`` of f32/f16/bf16, contiguous) by the
    kernel, as float32 zero-padded to ``width`` columns, on PyTorch's current stream; also
    written in f16 into ``out16`` (``m × width``) when given."""
    m, cols = x2.shape
    if out16 is not None and (out16.dtype != torch.float16 or tuple(out16.shape) != (m, width)
                              or not out16.is_contiguous() or out16.device != x2.device):
        raise _native.InvalidInputError(
            f"out16 must be a contiguous float16 tensor of shape {(m, width)} on {x2.device}; got "
            f"{out16.dtype} {tuple(out16.shape)} on {out16.device}")
    out = torch.empty(m, width, dtype=torch.float32, device=x2.device)
    kernels(x2.device).rht(
        {
            "x": _ptr(x2),
            "x_dtype": _DTYPES[x2.dtype],
            "out": _ptr(out),
            "out16": 0 if out16 is None else _ptr(out16),
            "batch": m,
            "cols": cols,
            "width": width,
            "tile": tile,
            "seed": seed,
        },
        _stream(x2.get_device()),
    )
    return out


def _trellis_args(x_ptr: int, bits_ptr: int, rows: int, cols: int, l: int, k: int, seq: int,
                  scale: float | None, max_scratch: int, v: int = 1) -> dict[str, Any]:
    _, c1, c0 = _native.trellis_code(l, k, scale, v)
    rb = (cols * k + 7) // 8
    return {"x": x_ptr, "bits": bits_ptr, "scratch": 0, "max_scratch": max_scratch, "bit_bytes": rows * rb,
            "row_bytes": rb, "rows": rows, "cols": cols, "seq": seq, "l": l, "k": k, "v": v, "c1": c1, "c0": c0}


def trellis_encode(values: torch.Tensor, l: int, k: int, seq: int, scale: float | None = None,
                   max_scratch: int = 0, v: int = 1) -> torch.Tensor:
    """Bitshift-trellis bits of the rows of ``values`` (CUDA, ``rows × cols`` float32, each row
    about unit variance: RHT and row scale already applied), encoded on the GPU on PyTorch's
    current stream: ``rows × ceil(cols·k/8)`` uint8, each row cut into tail-biting sequences of
    ``seq`` values (the last takes the rest), ``L = l`` state bits and ``k`` (1..4) bits per
    value, at the calibrated code scale unless ``scale`` is given. ``v = 2`` codes pairs (two
    values per state, ``k`` up to 2, rows of an even length; the CPU codes larger ``k``).

    The search is the CPU encoder's (:func:`hypercodec._native.trellis_encode`), operation for
    operation, and so are the bits. Sequences longer than the back pointers shared memory holds
    keep them in a scratch buffer allocated here through PyTorch and freed on return
    (:func:`trellis_encode_plan` gives its size: 4 MiB per block at ``L = 16``, ``K = 2`` and
    sequences of 1024, 0.5 GiB on an H200); where that would pass ``max_scratch`` bytes (0: 2
    GiB) they are searched three times from checkpoints instead, on as many blocks as the cap
    holds. Values must be finite and at most 1e15 in magnitude."""
    if values.dim() != 2 or values.device.type != "cuda":
        raise _native.InvalidInputError(f"values must be a 2-D CUDA tensor, got {tuple(values.shape)} on {values.device}")
    x = values.to(torch.float32).contiguous()
    if x.numel() and not bool((x.abs() <= 1e15).all()):
        raise _native.InvalidInputError("values must be finite and at most 1e15 in magnitude (rows about unit variance)")
    rows, cols = x.shape
    bits = torch.empty(rows, (cols * k + 7) // 8, dtype=torch.uint8, device=x.device)
    args = _trellis_args(_ptr(x), _ptr(bits), rows, cols, l, k, seq, scale, max_scratch, v)
    if rows and cols:
        need = kernels(x.device).trellis_encode_plan(args)["scratch_bytes"]
        scratch = torch.empty(need, dtype=torch.uint8, device=x.device) if need else None
        args["scratch"] = _ptr(scratch)
        args["max_scratch"] = need
    kernels(x.device).trellis_encode(args, torch.cuda.current_stream(x.device).cuda_stream)
    return bits


def trellis_encode_plan(rows: int, cols: int, l: int, k: int, seq: int, device: torch.device | int = 0,
                        max_scratch: int = 0, v: int = 1) -> dict:
    """How :func:`trellis_encode` runs on ``device``: ``threads`` per block, ``runs_per_thread``,
    the steps (of ``v`` values) whose back pointers shared memory holds (``ring``: sequences
    shorter than it need no scratch), ``shared`` memory per block, ``blocks`` launched, the ``scratch_bytes``
    they need, whether longer sequences keep every back pointer there
    (``back_pointers_in_scratch``) or are searched from checkpoints every ``w1`` and ``w2``."""
    dev = torch.device("cuda", device) if isinstance(device, int) else device
    return kernels(dev).trellis_encode_plan(_trellis_args(16, 16, rows, cols, l, k, seq, None, max_scratch, v))


class DeviceLinear:
    """One :class:`hypercodec.Linear` on one CUDA device (see the module docs)."""

    def __init__(self, op: _native.Linear, device: torch.device) -> None:
        self.rows, self.cols = op.rows, op.cols
        self._op = op
        if device.index is None:  # pin the device now: the codes and the kernels live there
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.kernels = kernels(device)
        bias = op.bias
        self.bias = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32)).to(device)
        form = op.device_form()
        if form is not None and form["kind"] == "z1":
            form = None  # no GEMV of its own: the decode fallback (W8A8 reads it, in nn)
        if form is not None and form["kind"] == "e8prefix" and not self.kernels.e8_prefix_loaded(form["limit"],
                                                                                                  form["pair_limit"]):
            form = None  # no kernel for its limits, or its PTX module did not load: the decode fallback
        self.kind = "dense" if form is None else form["kind"]
        self._dense: dict[torch.dtype, torch.Tensor] = {}
        self._fused: dict[torch.dtype, tuple[int, int | None, tuple[tuple[int, int], ...], int]] = {}
        # Affine codes of weights near f32's range take the decode route at every batch.
        # An affine layer whose scale and offset terms pass what the fused kernels' f32 sums hold
        # (weights near f32's range: the native `affine_fusable`) is decoded, then F.linear.
        self._fusable = form is None or form["kind"] != "affine" or bool(form["fusable"])
        if form is None:
            return

        def up(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        if self.kind == "affine":
            # Scales and offsets tiled for the kernels; f16/bf16 ones as stored (uint16 bits,
            # held in int16 tensors).
            def side(a: np.ndarray) -> torch.Tensor:
                return up(a.view(np.int16) if a.dtype == np.uint16 else a)

            self.codes = up(form["codes"])
            self.scales = side(form["scales"])
            self.offsets = side(form["offsets"]) if len(form["offsets"]) else None
            self.args = {
                "codes": _ptr(self.codes),
                "code_bytes": self.codes.numel(),
                "scales": _ptr(self.scales),
                "offsets": _ptr(self.offsets),
                "scale_dtype": {"f32": 0, "f16": 1, "bf16": 2}[form["scale_dtype"]],
                "bias": _ptr(self.bias),
                "rows": self.rows,
                "cols": self.cols,
                "bits": form["bits"],
                "group_len": form["group_len"],
                "scales_per_row": form["scales_per_row"],
                "qmul": form["qmul"],
                "qbias": form["qbias"],
            }
        elif self.kind == "trellis":
            self.bits = up(form["bits"])
            self.row_scales = up(form["row_scales"])
            self.tile, self.seed = form["tile"], form["seed"]
            self.args = {
                "bits": _ptr(self.bits),
                "bit_bytes": self.bits.numel(),
                "row_bytes": form["row_bytes"],
                "row_scales": _ptr(self.row_scales),
                "bias": _ptr(self.bias),
                "rows": self.rows,
                "cols": self.cols,
                "l": form["l"],
                "k": form["k"],
                "seq": form["seq"],
                "c1": form["c1"],
                "c0": form["c0"],
                "v": form["v"],
            }
        elif self.kind == "e8rans":
            self.payload = up(form["payload"])
            self.index = up(form["index"])
            self.slots = up(form["slots"].view(np.int32))
            self.row_scales = up(form["row_scales"])
            self.words, self.tile, self.seed = form["words"], form["tile"], form["seed"]
            self.args = {
                "payload": _ptr(self.payload),
                "payload_bytes": self.payload.numel(),
                "index": _ptr(self.index),
                "index_bytes": self.index.numel(),
                "slots": _ptr(self.slots),
                "prob_bits": form["prob_bits"],
                "chunk": form["chunk"],
                "row_scales": _ptr(self.row_scales),
                "bias": _ptr(self.bias),
                "rows": self.rows,
                "words": self.words,
            }
        elif self.kind == "e8prefix":
            self.payload = up(form["payload"].view(np.int32))
            self.index = up(form["starts"].view(np.int32))
            self.table = up(form["table"].view(np.int32))
            self.row_scales = up(form["row_scales"])
            self.words, self.tile, self.seed = form["words"], form["tile"], form["seed"]
            self.args = {
                "words_ptr": _ptr(self.payload),
                "payload_words": self.payload.numel(),
                "index": _ptr(self.index),
                "table": _ptr(self.table),
                "limit": form["limit"],
                "pair_limit": form["pair_limit"],
                "segment": form["segment"],
                "span": form["span"],
                "y_dtype": 0,
                "row_scales": _ptr(self.row_scales),
                "bias": _ptr(self.bias),
                "rows": self.rows,
                "cols": 8 * self.words,
            }
        else:
            self.packed = up(form["packed"])
            self.row_scales = up(form["row_scales"])
            self.words, self.tile, self.seed = form["words"], form["tile"], form["seed"]
            self.args = {
                "packed": _ptr(self.packed),
                "row_scales": _ptr(self.row_scales),
                "bias": _ptr(self.bias),
                "rows": self.rows,
                "words": self.words,
                "bits": form["bits"],
            }

    def _decode(self, dt: torch.dtype, stream: int) -> torch.Tensor:
        """The weight decoded on the device in ``dt`` for one call (affine: ``rows × cols``; E8
        and trellis: the rotated domain, ``rows × width``), with the form's decoder."""
        code = _DTYPES[dt]
        if self.kind == "affine":
            w = torch.empty(self.rows, self.cols, dtype=dt, device=self.device)
            self.kernels.affine_decode(dict(self.args, x=_ptr(w), x_dtype=code, batch=1, y=_ptr(w), y_dtype=code), _ptr(w), code, stream)
            return w
        width = self.cols if self.kind == "trellis" else 8 * self.words
        w = torch.empty(self.rows, width, dtype=dt, device=self.device)
        if self.kind == "e8rans":
            args = dict(self.args, xr=_ptr(w), batch=0, y=_ptr(w), y_dtype=code)
            self.kernels.e8_rans_decode(args, _ptr(w), code, stream)
        elif self.kind == "e8prefix":
            args = dict(self.args, xr=0, xr16=0, batch=0, y=_ptr(w))
            self.kernels.e8_prefix_decode(args, _ptr(w), code, stream)
        elif self.kind == "e8":
            args = dict(self.args, xr=_ptr(w), half=_ptr(w), batch=1, y=_ptr(w), y_dtype=code)
            self.kernels.e8_decode(args, _ptr(w), code, stream)
        else:
            args = dict(self.args, xr=_ptr(w), batch=1, y=_ptr(w), y_dtype=code)
            self.kernels.trellis_decode(args, _ptr(w), code, stream)
        return w

    def input_grad(self, gy: torch.Tensor) -> torch.Tensor:
        """``∂y·Ŵ`` for a backward pass, with ``Ŵ`` decoded on the device for this product and
        dropped, in ``gy``'s dtype (f32 for other dtypes). E8 and trellis decode to the rotated
        domain: the product goes back through the transposed RHT (signs, then the normalized
        Walsh–Hadamard transform of each tile)."""
        dt = gy.dtype if gy.dtype in _DTYPES else torch.float32
        g = gy.reshape(math.prod(gy.shape[:-1]), self.rows).to(device=self.device, dtype=dt)
        if self.kind == "dense":
            return (g @ self.dense_weight(dt)).reshape(*gy.shape[:-1], self.cols)
        w = self._decode(dt, torch.cuda.current_stream(self.device).cuda_stream)
        if self.kind == "affine":
            return (g @ w).reshape(*gy.shape[:-1], self.cols)
        v = (g @ w)[:, : self.cols].float()
        # RHTᵀ: each tile's Walsh–Hadamard transform (its own transpose), then the signs.
        gx = _wht_tiles(v, self.tile) * _rht_signs(self.seed, self.cols, v.device) if self.tile else v
        return gx.to(dt).reshape(*gy.shape[:-1], self.cols)

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies rebuild from the operator (shared: it is immutable): the launch arguments are
        # raw device pointers into this object's tensors, which a member-wise copy would share.
        # (Pickling needs a picklable operator: compressed layers pickle their bytes instead.)
        return (DeviceLinear, (self._op, self.device))

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight decoded on the host (once per dtype, from the stored form) and kept on
        the device in ``dtype``: the decode fallback."""
        w = self._dense.get(dtype)
        if w is None:
            w = self._dense[dtype] = _lasting(self.device, lambda: _op_weight(self._op).to(self.device, dtype))
        return w

    @property
    def held_bytes(self) -> int:
        """Device bytes this layer holds."""
        ts = [self.bias, *self._dense.values()]
        if self.kind == "affine":
            ts += [self.codes, self.scales, self.offsets]
        elif self.kind == "e8":
            ts += [self.packed, self.row_scales]
        elif self.kind == "trellis":
            ts += [self.bits, self.row_scales]
        elif self.kind == "e8rans":
            ts += [self.payload, self.index, self.slots, self.row_scales]
        elif self.kind == "e8prefix":
            ts += [self.payload, self.index, self.table, self.row_scales]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def _takes(self, batch: int, dtype: torch.dtype, grouped: bool = False) -> bool:
        """Whether a fused kernel (rather than decode + ``F.linear``) runs ``batch`` rows of
        ``dtype`` (asked of the kernels once per dtype: it is read on every forward), for the
        layer on its own or (``grouped``) launched beside others of one input."""
        fused, _, wgmma, group = self._kernel_batches(dtype)
        return batch <= (group if grouped else fused) or _within(batch, wgmma)

    def _kernel_batches(self, dtype: torch.dtype) -> tuple[int, int | None, tuple[tuple[int, int], ...], int]:
        """The fused kernels' most activation rows for ``dtype`` (beside the Hopper GEMM's), the
        fewest for which the trellis tensor-core kernel runs (None: never), for affine layers
        the batches the Hopper GEMM runs, as inclusive ranges ``(fewest, most)`` (none for other
        layers and off sm_90), and the most rows beside other layers of one input (an affine
        layer shorter than :data:`GEMM_MIN_ROWS` takes the tensor-core GEMM at 17–64 rows only
        there, unless it splits over clusters: alone unsplit it leaves most of the device idle),
        asked of the kernels once per dtype."""
        got = self._fused.get(dtype)
        if got is None:
            n, mma_from, wgmma, group = GEMV_MAX_BATCH.get(self.kind, 0), None, (), None
            if not self._fusable:
                n = 0  # (terms past the fused kernels' range: decoded, then F.linear)
            elif self.kind == "affine" and dtype in _DTYPES:
                a = dict(self.args, x=0, x_dtype=_DTYPES[dtype], y=0, y_dtype=0, batch=1)
                n, wgmma = self.kernels.affine_fused_batch(a), tuple(self.kernels.affine_wgmma_batches(a))
                group = self.kernels.affine_group_batch(a)
            elif self.kind == "e8prefix" and dtype not in (torch.bfloat16, torch.float16):
                n = 4  # f32 rows one at a time on FFMA (f16 tensor cores would round them)
            elif self.kind == "trellis" and dtype in _DTYPES:
                a = dict(self.args, xr=0, y=0, y_dtype=_DTYPES[dtype], batch=1)
                n, mma_from = self.kernels.trellis_fused_batch(a), self.kernels.trellis_mma_min_batch(a)
            got = self._fused[dtype] = (n, mma_from, wgmma, n if group is None else group)
        return got

    def route(self, batch: int, dtype: torch.dtype = torch.float32) -> str:
        """The route a batch of ``batch`` rows of ``dtype`` takes."""
        if self.kind == "dense":
            return "cuda-decode-fallback+linear"
        fused, mma_from, wgmma, _ = self._kernel_batches(dtype)
        if _within(batch, wgmma):
            return "cuda-affine-wgmma"
        if batch <= fused:
            if self.kind == "affine" and fused >= MMA_MAX_BATCH:
                # (9-16 rows of a short layer: the GEMM split over clusters, where the kernels
                # say it runs)
                split = 1 < batch <= MMA_MAX_BATCH and self.kernels.affine_gemm_split(
                    dict(self.args, x=0, x_dtype=_DTYPES[dtype], y=0, y_dtype=0, batch=batch))
                return "cuda-affine-mma" if batch <= MMA_MAX_BATCH and not split else "cuda-affine-gemm"
            if mma_from is not None and batch >= mma_from:
                return "cuda-trellis-mma"
            if self.kind == "e8prefix" and batch > 1 and dtype in (torch.bfloat16, torch.float16):
                return "cuda-e8prefix-mma"
            return f"cuda-{self.kind}-gemv"
        return f"cuda-{self.kind}-decode+linear"

    def rotation(self) -> tuple[int, int, int] | None:
        """The activation RHT an E8 or trellis layer applies, ``(width, tile, seed)`` (None for
        the other forms): layers with the same one can share it (:func:`forward_group`)."""
        if self.kind not in ("trellis", "e8", "e8rans", "e8prefix"):
            return None
        return (self.cols if self.kind == "trellis" else 8 * self.words, self.tile, self.seed)

    def _wants_xr16(self, m: int, dt: torch.dtype, gemv: bool) -> bool:
        return gemv and self.route(min(m, MMA_MAX_BATCH), dt) in ("cuda-trellis-mma", "cuda-e8prefix-mma")

    def _from_rotated(self, xr: torch.Tensor, xr16: torch.Tensor | None, dt: torch.dtype, gemv: bool,
                      stream: int, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``m × rows`` outputs in ``dt`` of an E8 or trellis layer from its rotated activations
        ``xr`` (f32, ``m × width``; ``xr16``: their f16 copy, where the route reads it). Scratch
        the launch writes goes into ``keep`` where given (a launch on another stream than
        PyTorch's: its buffers must outlive the join)."""
        m, code = xr.shape[0], _DTYPES[dt]
        if not gemv:
            b = None if self.bias is None else self.bias.to(dt)
            return torch.nn.functional.linear(xr.to(dt), self._decode(dt, stream), b)
        y = torch.empty(m, self.rows, dtype=dt, device=self.device)
        if self.kind == "e8prefix":
            # Outputs in ``dt`` (the kernels' f32 sums, rounded once): bf16/f16 activations in
            # passes of up to 16 rows on the tensor cores (from the f16 copy), a lone row and f32
            # rows one by one on FFMA.
            mma = m > 1 and dt in (torch.bfloat16, torch.float16)
            if mma and xr16 is None:
                xr16 = xr.to(torch.float16)
            step = MMA_MAX_BATCH if mma else 1
            for m0 in range(0, m, step):
                n = min(step, m - m0)
                args = dict(self.args, xr=_ptr(xr[m0:]), xr16=_ptr(xr16[m0:]) if n > 1 else 0, batch=n,
                            y=_ptr(y[m0:]), y_dtype=code)
                self.kernels.e8_prefix_gemv(args, stream)
            return y
        if self.kind in ("trellis", "e8rans"):
            args = dict(self.args, xr=_ptr(xr), batch=m, y=_ptr(y), y_dtype=code)
            if xr16 is not None:
                args["xr16"] = _ptr(xr16)
            launch = self.kernels.trellis_gemv if self.kind == "trellis" else self.kernels.e8_rans_gemv
            launch(args, stream)
        else:
            half = torch.empty(m, self.words, dtype=torch.float32, device=self.device)
            if keep is not None:
                keep.append(half)
            self.kernels.e8_gemv(dict(self.args, xr=_ptr(xr), half=_ptr(half), batch=m, y=_ptr(y), y_dtype=code), stream)
        return y

    def forward(self, x: torch.Tensor, route: str | None = None) -> torch.Tensor:
        """``y = x·Wᵀ + b`` for ``x`` of shape ``(..., cols)`` on this device; the output has
        ``x``'s dtype (f32, f16 or bf16; other dtypes compute in f32). ``route`` forces
        ``"gemv"`` or ``"decode"`` (for benchmarks); by default the batch size picks it."""
        if x.shape[-1] != self.cols:
            raise _native.InvalidInputError(f"x has shape {tuple(x.shape)}; its last dimension must be {self.cols}")
        lead = x.shape[:-1]
        dt = x.dtype if x.dtype in _DTYPES else torch.float32
        # Contiguous rows of the right dtype on this device as they come (the common case, and
        # the cheapest: a reshape, a cast and a copy check cost as much host time as the
        # launch), viewed as a matrix where they have more dimensions; others reshaped, cast
        # and made contiguous. (Explicit sizes: `-1` is ambiguous when a dimension is 0.)
        plain = x.is_cuda and x.dtype == dt and x.get_device() == self.device.index and x.is_contiguous()
        two = x.dim() == 2
        if plain:
            x2 = x if two else x.view(math.prod(lead), self.cols)
        else:
            x2 = x.reshape(math.prod(lead), self.cols).to(device=self.device, dtype=dt).contiguous()
        m = x2.shape[0]
        code = _DTYPES[dt]
        if m == 0 or self.rows == 0 or self.cols == 0:
            # Nothing to read: y = b (or 0) for each row.
            y = torch.zeros(m, self.rows, dtype=dt, device=self.device)
            if self.bias is not None:
                y += self.bias.to(dt)
            return y.reshape(*lead, self.rows).to(x.dtype)
        gemv = self._takes(m, dt) if route is None else route == "gemv"
        stream = _stream(self.device.index)
        if self.kind == "dense":
            b = None if self.bias is None else self.bias.to(dt)
            y = torch.nn.functional.linear(x2, self.dense_weight(dt), b)
        elif self.kind == "affine":
            if x2.data_ptr() % 16:
                # A view at an odd offset: the tensor-core kernels read 16-byte pieces.
                x2 = x2.clone()
            if gemv:
                y = torch.empty(m, self.rows, dtype=dt, device=self.device)
                self.kernels.affine_gemv(dict(self.args, x=x2.data_ptr(), x_dtype=code, batch=m, y=y.data_ptr(), y_dtype=code),
                                         stream)
            else:
                b = None if self.bias is None else self.bias.to(dt)
                y = torch.nn.functional.linear(x2, self._decode(dt, stream), b)
        else:
            width = self.rotation()[0]
            # The trellis tensor-core kernel (its passes of up to 16 rows) reads the rotated
            # activations in f16 (half the bytes of f32): the RHT writes that copy too.
            xr16 = torch.empty(m, width, dtype=torch.float16, device=self.device) if self._wants_xr16(m, dt, gemv) else None
            y = self._from_rotated(rht(x2, width, self.tile, self.seed, xr16), xr16, dt, gemv, stream)
        if plain:
            return y if two else y.view(*lead, self.rows)
        return y.reshape(*lead, self.rows).to(x.dtype) if dt != x.dtype else y.reshape(*lead, self.rows)


def forward_group(layers: list[DeviceLinear], x: torch.Tensor) -> list[torch.Tensor] | None:
    """``[x·W_lᵀ + b_l for each layer]`` for layers on ``x``'s device that read the one input
    ``x`` (shape ``(..., cols)``), each output equal to :meth:`DeviceLinear.forward`'s bit for
    bit (but for affine layers shorter than :data:`GEMM_MIN_ROWS` at 17–64 rows where the GEMM
    does not split over clusters: these decode on their own, and here run the GEMM as
    ``forward(x, route="gemv")`` does), with fewer launches:

    - affine layers under one bf16 or f16 activation row: one launch of the batch-1 kernel per
      :data:`GROUP_MAX` layers. At batch 1 a launch of a 4096-wide layer costs a few µs beyond
      its bytes, so a Llama block's q, k and v projections run about 1.7× faster as one launch
      (``docs/eval/cuda_e2e.md``); a group the kernel does not take (codes of two widths, say)
      runs layer by layer here (a layer without a fused route at this batch: None). At 2 rows
      and more, each layer's fused launch runs on a stream of its own, as below (short layers
      too: side by side, q, k and v of 4096, 1024 and 1024 rows ran 1.3–1.5× faster so than
      with k and v decoded, and of 2048, 512 and 512 rows 1.7× faster than decoded, on an
      H100), and the layers that decode at this batch (past their fused kernels' batch) run on
      the current stream beside them (None where every layer decodes);
    - E8 and trellis layers with the same activation RHT (:meth:`DeviceLinear.rotation`), any
      batch: the RHT once, then each layer's kernel. At the batches their fused kernels take,
      those kernels run side by side, each beyond the first on a stream of its own that forks
      from the current one after the RHT and joins it before this returns (every buffer is the
      current stream's, kept to the join). One 4096-wide layer leaves much of the GPU idle (a
      prefix-coded chunk is a warp's serial work), and its neighbours fill it: a Llama block's
      q, k and v run 1.6× faster so on an H100 in prefix codes, 2.4× in trellis or fixed-rate E8
      (``docs/eval/cuda_rans.md``).

    None where the layers are not all of one of these kinds (the caller runs them one by one)."""
    if not layers or x.dim() == 0:
        return None
    cols = x.shape[-1]
    if any(d.cols != cols or d.device != x.device or d.rows == 0 for d in layers) or cols == 0:
        return None
    if all(d.kind == "affine" for d in layers):
        return _affine_group(layers, x)
    rotations = {d.rotation() for d in layers}
    if len(rotations) == 1 and None not in rotations:
        return _rotated_group(layers, x)
    return None


def _affine_group(layers: list[DeviceLinear], x: torch.Tensor) -> list[torch.Tensor] | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return None
    m, cols = math.prod(x.shape[:-1]), x.shape[-1]
    # Beside each other, short layers take the GEMM too: their blocks fill the device together.
    fused = [d._takes(m, x.dtype, grouped=len(layers) > 1) for d in layers]
    # One row: every layer on the batch-1 kernel. More: at least one layer's fused kernel (each
    # launch on a stream of its own; the layers that decode at this batch on the current stream
    # beside them); else None, and the caller runs them one by one.
    if m == 0 or not (all(fused) if m == 1 else any(fused)):
        return None
    x2 = x.reshape(m, cols).contiguous()
    if x2.data_ptr() % 16:
        x2 = x2.clone()  # (the kernel reads 16-byte pieces)
    code = _DTYPES[x.dtype]
    ys = [torch.empty(m, d.rows, dtype=x.dtype, device=x.device) if f else None for d, f in zip(layers, fused)]
    main = torch.cuda.current_stream(x.device)
    if m > 1:
        launched = [i for i, f in enumerate(fused) if f]
        decoded = [i for i, f in enumerate(fused) if not f]
        with _forked(x, len(launched) + bool(decoded)) as streams:
            for i, s in zip(launched, streams[bool(decoded):]):
                d = layers[i]
                d.kernels.affine_gemv(dict(d.args, x=_ptr(x2), x_dtype=code, batch=m, y=_ptr(ys[i]), y_dtype=code),
                                      s.cuda_stream)
            for i in decoded:
                ys[i] = layers[i].forward(x2)
        return [y.reshape(*x.shape[:-1], d.rows) for d, y in zip(layers, ys)]
    for i in range(0, len(layers), GROUP_MAX):
        part = list(zip(layers[i : i + GROUP_MAX], ys[i : i + GROUP_MAX]))
        args = [dict(d.args, x=_ptr(x2), x_dtype=code, batch=1, y=_ptr(y), y_dtype=code) for d, y in part]
        if not layers[0].kernels.affine_gemv_group(args, main.cuda_stream):
            for j, (d, _) in enumerate(part):
                ys[i + j] = d.forward(x2)
    return [y.reshape(*x.shape[:-1], d.rows) for d, y in zip(layers, ys)]


@contextlib.contextmanager
def _forked(x: torch.Tensor, n: int, fork: bool = True):
    """``n`` streams for ``n`` launches that read ``x``: PyTorch's current one, then (where
    :data:`_GROUP_STREAMS` and ``fork`` allow, on CUDA) side streams that fork from it here and
    join it on exit, even where a launch raised. Every buffer the launches use must belong to the
    current stream and live to the exit; allocating one enqueues nothing, so a buffer made
    before the fork is ready on every stream."""
    main = torch.cuda.current_stream(x.device)
    forks: list[torch.cuda.Stream] = []
    if _GROUP_STREAMS and fork and x.is_cuda and n > 1:
        forks = _side_streams(x.device, n - 1)
        for s in forks:
            s.wait_stream(main)
    try:
        yield [main, *forks] if forks else [main] * n
    finally:
        for s in forks:
            main.wait_stream(s)


def _rotated_group(layers: list[DeviceLinear], x: torch.Tensor) -> list[torch.Tensor] | None:
    lead = x.shape[:-1]
    dt = x.dtype if x.dtype in _DTYPES else torch.float32
    x2 = x.reshape(math.prod(lead), x.shape[-1]).to(dtype=dt).contiguous()
    m = x2.shape[0]
    if m == 0:
        return None
    width, tile, seed = layers[0].rotation()
    gemv = [d._takes(m, dt) for d in layers]
    want16 = [d._wants_xr16(m, dt, g) for d, g in zip(layers, gemv)]
    xr16 = torch.empty(m, width, dtype=torch.float16, device=x.device) if any(want16) else None
    xr = rht(x2, width, tile, seed, xr16)
    keep: list[torch.Tensor] = []  # scratch of the side streams' launches, freed after the join
    with _forked(x, len(layers), all(gemv)) as streams:
        ys = [d._from_rotated(xr, xr16 if w else None, dt, g, s.cuda_stream, keep)
              for d, g, w, s in zip(layers, gemv, want16, streams)]
    return [y.reshape(*lead, d.rows).to(x.dtype) for d, y in zip(layers, ys)]
