"""KV-cache compression for transformers' generation (requires torch and transformers).

:class:`HypercodecCache` is a ``Cache`` usable as ``past_key_values`` in ``generate()`` (any
batch size) whose layers (:class:`HypercodecKVLayer`, the same shape as transformers'
``QuantoQuantizedLayer`` / ``HQQQuantizedLayer``) keep

- the first ``sinks`` tokens exact (attention sinks, optional; counted by position in the
  cache, so in a left-padded batch a padded row's sinks are its pad tokens and its own first
  tokens are compressed),
- the newest ``window`` to ``window + block − 1`` tokens exact (the residual window), and
- every other token compressed per head vector with the native :class:`hypercodec.KvCodec`:
  a rotation (seeded RHT, Haar-random, or none), one scale per vector (bf16, or with
  ``scale="log8"`` one byte in steps of 2^(1/8), or with ``scale="log4"`` 4 bits in steps of
  2^(1/4) around 1, after calibrated transforms), and fixed-rate codes (the E8 lattice's
  box-constrained form, or the bitshift trellis), ``key_bits`` / ``value_bits`` bits per value
  (one rate, or one per layer). ``int8`` / ``int4`` (per-token absmax, one f16 scale per head
  vector) are the plain baselines of the same layer.

New tokens are encoded once, when they leave the window, ``block`` at a time; the compressed
history lives in token-major arrays that grow by doubling. On a CUDA device, E8 codecs without
dither (RHT or no rotation, head sizes of 8..256 in whole words of 8) encode and decode with
hypercodec's CUDA kernels and keep their codes on the device; other codecs go through the
host.

Attention: with the model's attention set to :data:`ATTENTION` (``"hypercodec_kv"``, registered
with transformers when this module is imported: ``model.set_attn_implementation(ATTENTION)``),
host caches never decode their history: each step's attention runs over the codes a block of
tokens at a time in the rotated domain (native ``KvCodec.attend``) and merges with attention
over the exact tokens. Any other attention implementation (or the CUDA path, or the ``int``
baselines) gets the history decoded into a transient per-layer buffer at each ``update``; the
``hypercodec_kv`` attention falls back to PyTorch's SDPA for every other cache.
:meth:`HypercodecCache.stored_bytes` and :meth:`HypercodecCache.bits_per_value` count every
byte held: codes, scales and exact tokens at their dtype's size.

    >>> from hypercodec.kv import HypercodecCache                                # doctest: +SKIP
    >>> cache = HypercodecCache(model.config, key_bits=4, value_bits=3, window=32)  # doctest: +SKIP
    >>> out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)   # doctest: +SKIP
    >>> cache.bits_per_value()                                                   # doctest: +SKIP

At low rates, :func:`kv_calibrate` fits each head's mean and a transform of its keys and values
to the model (``HypercodecCache(config, calibration=...)``; :func:`kv_means` gives the means
alone); :func:`bits_at` counts the bits per value of any options at a given context.

Dither (``dither=True``, lattice only) is keyed on each vector's cache index and head, so
rows of a batch agree with the same rows run alone only when their padding agrees.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from . import _native

__all__ = [
    "ATTENTION",
    "HypercodecCache",
    "HypercodecKVLayer",
    "IntCodec",
    "KvCalibration",
    "attention",
    "bits_at",
    "kv_calibrate",
    "kv_means",
    "make_codec",
]

#: The attention implementation that runs over compressed caches without decoding them.
ATTENTION = "hypercodec_kv"


class IntCodec:
    """Round-to-nearest baseline with the native codec's interface: per vector, symmetric
    absmax INT``bits`` (codes offset by 2^(bits−1), packed LSB-first) and one f16 scale."""

    def __init__(self, dim: int, bits: int) -> None:
        if bits not in (2, 4, 8):
            raise _native.InvalidInputError(f"int baseline bits must be 2, 4 or 8, not {bits}")
        if not isinstance(dim, (int, np.integer)) or dim < 1:
            raise _native.InvalidInputError(f"vectors of dim >= 1 values, not {dim!r}")
        self.dim, self.bits = int(dim), bits
        self.per = 8 // bits
        self.code_bytes = -(-dim * bits // 8)
        self.bits_per_value = (8 * self.code_bytes + 16) / dim

    def encode(self, x: np.ndarray, keys: Any = None) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, np.float32)
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise _native.InvalidInputError(f"vectors of {self.dim} values, not an array of shape {x.shape}")
        if not np.isfinite(x).all():
            raise _native.InvalidInputError("the int baseline codes finite values only")
        qmax = (1 << (self.bits - 1)) - 1
        amax = np.abs(x).max(axis=-1)
        # f16 scales: larger ones saturate (and their values clip) instead of becoming inf.
        scale = np.minimum(amax / qmax, np.finfo(np.float16).max).astype(np.float16)
        s = scale.astype(np.float32)[..., None]
        q = np.where(s > 0, np.rint(x / np.where(s > 0, s, 1)), 0).clip(-qmax - 1, qmax)
        u = (q + (1 << (self.bits - 1))).astype(np.uint8)
        pad = self.code_bytes * self.per - self.dim
        if pad:
            u = np.concatenate([u, np.zeros(u.shape[:-1] + (pad,), np.uint8)], -1)
        u = u.reshape(u.shape[:-1] + (self.code_bytes, self.per))
        codes = np.zeros(u.shape[:-1], np.uint8)
        for j in range(self.per):
            codes |= u[..., j] << (j * self.bits)
        return codes, scale.view(np.uint16)

    def decode(self, codes: np.ndarray, scales: np.ndarray, keys: Any = None) -> np.ndarray:
        mask = (1 << self.bits) - 1
        parts = [(codes >> (j * self.bits)) & mask for j in range(self.per)]
        u = np.stack(parts, -1).reshape(codes.shape[:-1] + (self.code_bytes * self.per,))[..., : self.dim]
        q = u.astype(np.float32) - (1 << (self.bits - 1))
        return q * scales.view(np.float16).astype(np.float32)[..., None]

    def scale_len(self, n: int) -> int:
        """Scale entries of ``n`` vectors: one f16 each."""
        return n


#: The quantizers a KV codec takes (``make_codec``, :class:`HypercodecKVLayer`): the native
#: codec's, and the RTN baseline ``int``.
QUANTIZERS = (*_native.KV_QUANTIZERS, "int")


def make_codec(dim: int, bits: int, quantizer: str = "e8", **options: Any) -> Any:
    """The codec of ``dim``-value vectors: ``e8`` / ``d4`` / ``z1`` / ``trellis`` (native, with
    ``rotation``, ``seed``, ``dither``, ``trellis_l``) or ``int`` (the RTN baseline). The
    trellis' state bits default to 10 below 4 bits and 12 from 4 bits (at ``l − bits ≤ 6`` and
    short vectors its tail-biting search tries every boundary: exact but 30× slower)."""
    if quantizer == "int":
        if options.get("dither"):
            raise _native.InvalidInputError("the int baseline has no dithered form")
        return IntCodec(dim, bits)
    if quantizer not in QUANTIZERS:
        raise _native.InvalidInputError(f"unknown KV quantizer {quantizer!r}; use one of {', '.join(QUANTIZERS)}")
    options = dict(options)
    if quantizer == "trellis" and options.get("trellis_l") is None:
        options["trellis_l"] = 10 if bits < 4 else 12
    return _native.KvCodec(dim, bits, quantizer, **options)


def _nibbles(scales: np.ndarray, m: int) -> np.ndarray:
    """The first ``m`` 4-bit scales of each row of packed log4 entries ``[rows, e]``."""
    shifts = np.arange(0, 16, 4, dtype=np.uint16)
    return ((scales[:, :, None] >> shifts) & 15).reshape(scales.shape[0], -1)[:, :m]


def _pack(nibbles: np.ndarray) -> np.ndarray:
    """Rows of 4-bit scales ``[rows, m]`` as log4 entries ``[rows, ⌈m/4⌉]``."""
    rows, m = nibbles.shape
    padded = np.zeros((rows, -(-m // 4) * 4), np.uint16)
    padded[:, :m] = nibbles
    shifts = np.arange(0, 16, 4, dtype=np.uint16)
    return (padded.reshape(rows, -1, 4) << shifts).sum(-1, dtype=np.uint16)


def _one_each(n: int) -> int:
    """One scale entry a vector (a function, not a lambda: caches pickle)."""
    return n


class _Store:
    """Compressed rows ``[batch·heads, capacity, code_bytes]`` and their scales (16-bit,
    ``[batch·heads, scale_len(capacity)]``: one per vector, none where the codec keeps its
    scales in the codes, or four 4-bit scales to an entry), growing by doubling along the
    token axis: numpy arrays on the host, or PyTorch tensors on ``device`` (the CUDA path)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.codes: Any = None
        self.scales: Any = None
        self.n = 0
        #: Scale entries of ``n`` vectors of a row (the codec's ``scale_len``).
        self.scale_len: Any = _one_each

    def _empty(self, shape: tuple[int, ...], host: Any, dev: torch.dtype) -> Any:
        if self.device is None:
            return np.empty(shape, host)
        return torch.empty(shape, dtype=dev, device=self.device)

    def append(self, codes: Any, scales: Any) -> None:
        """Appends ``[rows, m, code_bytes]`` codes and ``[rows, scale_len(m)]`` scales."""
        rows, m = codes.shape[:2]
        if m == 0:
            return
        sl = self.scale_len
        if self.codes is None or self.n + m > self.codes.shape[1]:
            cap = max(64, 2 * (self.n + m))
            c = self._empty((rows, cap, codes.shape[2]), np.uint8, torch.uint8)
            s = self._empty((rows, sl(cap)), np.uint16, torch.int16)
            if self.codes is not None:
                c[:, : self.n], s[:, : sl(self.n)] = self.codes[:, : self.n], self.scales[:, : sl(self.n)]
            self.codes, self.scales = c, s
        self.codes[:, self.n : self.n + m] = codes
        if sl(4) == 1 and self.n % 4:
            # Packed 4-bit scales that do not start on an entry: the last entry's scales
            # first, then the new ones, packed again from that entry.
            head = self.n // 4
            scales = _pack(np.concatenate([_nibbles(self.scales[:, head : head + 1], self.n % 4), _nibbles(scales, m)], 1))
            self.scales[:, head : head + scales.shape[1]] = scales
        else:
            self.scales[:, sl(self.n) : sl(self.n + m)] = scales
        self.n += m

    def nbytes(self) -> int:
        if self.codes is None:
            return 0
        c, s = self.codes[:, : self.n], self.scales[:, : self.scale_len(self.n)]
        if self.device is None:
            return int(c.nbytes + s.nbytes)
        return int(c.numel() * c.element_size() + s.numel() * s.element_size())

    def select(self, index: np.ndarray, heads: int) -> None:
        """Keeps batch rows ``index`` (beam search, batch selection)."""
        if self.codes is not None:
            rows = (index[:, None] * heads + np.arange(heads)[None, :]).reshape(-1)
            if self.device is None:
                self.codes = np.ascontiguousarray(self.codes[rows])
                self.scales = np.ascontiguousarray(self.scales[rows])
            else:
                r = torch.as_tensor(rows, device=self.device)
                self.codes = self.codes.index_select(0, r).contiguous()
                self.scales = self.scales.index_select(0, r).contiguous()


_KV_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _score_bias(mask: Any, q: int, total: int, device: torch.device) -> torch.Tensor | None:
    """The additive f32 bias over ``total`` tokens that :meth:`HypercodecKVLayer.attend` adds to
    the scores, on ``device``: from transformers' 4-D boolean or additive ``mask`` (``[batch
    rows or 1, its query rows, total]``), else causal for ``q`` > 1 queries (query i sees
    tokens up to ``total − q + i``; ``[1, q, total]``), else None."""
    if mask is not None:
        m = mask[:, 0, :, :total].to(device)
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=torch.float32, device=device).masked_fill_(~m, float("-inf"))
        return m.to(torch.float32)
    if q > 1:
        seen = torch.arange(total, device=device)[None, :] <= torch.arange(total - q, total, device=device)[:, None]
        return torch.zeros((1, q, total), dtype=torch.float32, device=device).masked_fill_(~seen[None], float("-inf"))
    return None


class HypercodecKVLayer(DynamicLayer):
    """One attention layer's compressed cache (see the module docs). ``quantizer``: ``e8``,
    ``d4``, ``z1``, ``trellis`` or ``int``; ``block``: tokens compressed at once (the exact
    window holds ``window`` to ``window + block − 1`` tokens); ``scale``: each vector's scale
    as ``bf16``, ``log8`` (8 bits in steps of 2^(1/8): 8/head_dim bits per value less, for
    low rates) or ``log4`` (4 bits in steps of 2^(1/4), for RMS 0.30 to 3.4 only, so it needs
    a ``mix`` — :func:`kv_calibrate`'s transforms bring each head's vectors to a mean square
    of 1 — and ``sinks``, whose keys are outliers the calibration leaves out; against bf16
    scales it costs 0.02 / 0.12 / 0.49 / 1.67 dB of SNR at 1 / 2 / 3 / 4 trellis bits, on
    Gaussian vectors whose RMS spreads 0.4 octaves around 1); host codecs only — on CUDA such a
    layer encodes and decodes on the host;
    ``mean``: ``(key_mean, value_mean)``, float32 ``[kv heads, head_dim]`` each (from
    :func:`kv_means`), taken out of every vector before it is encoded and added back to every
    decoded one, so the codes carry only what varies (a head's keys share a large common part:
    removing it leaves 31–57 % of SmolLM2's key energy); host codecs only, like ``log8``;
    ``mix``: ``(key_transform, value_transform)``, float32 ``[kv heads, head_dim, head_dim]``
    each (from :func:`kv_calibrate`): each head's vectors are encoded as ``T·(x − mean)`` and
    read back through ``T⁻¹``, so the codes' error falls where the model is least sensitive to
    it (attention maps the queries and outputs once per query, never the tokens); host codecs
    only."""

    is_croppable = False

    def __init__(
        self,
        key_bits: int = 4,
        value_bits: int = 4,
        quantizer: str = "e8",
        window: int = 32,
        sinks: int = 0,
        block: int = 16,
        rotation: str = "rht",
        dither: bool = False,
        seed: int = 0,
        trellis_l: int | None = None,
        scale: str = "bf16",
        mean: tuple[Any, Any] | None = None,
        mix: tuple[Any, Any] | None = None,
    ) -> None:
        super().__init__()
        counts = (window, sinks, block)
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in counts) or not (
            window >= 0 and sinks >= 0 and block >= 1
        ):
            raise _native.InvalidInputError(f"window and sinks must be integers >= 0 and block >= 1, not {counts}")
        if quantizer == "int" and scale != "bf16":
            raise _native.InvalidInputError("the int baseline keeps an f16 scale per vector (scale='bf16')")
        if quantizer == "int" and dither:
            raise _native.InvalidInputError("the int baseline has no dither (dither is for the lattices)")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise _native.InvalidInputError(f"seed must be an integer in 0..2^64, not {seed!r}")
        if scale == "log4" and mix is None:
            raise _native.InvalidInputError(
                "scale='log4' spans sizes 0.30 to 3.4 only: it needs transforms that bring each head's "
                "vectors near unit size (mix=, or HypercodecCache(calibration=kv_calibrate(...)))"
            )
        self.key_bits, self.value_bits, self.quantizer = key_bits, value_bits, quantizer
        self.window, self.sinks, self.block = window, sinks, block
        self.options = {} if quantizer == "int" else {"rotation": rotation, "dither": dither, "seed": seed, "scale": scale}
        if quantizer == "trellis":
            self.options["trellis_l"] = trellis_l
        self.dither = dither and quantizer != "int"
        # Rates, quantizer and options checked now (a codec of 64 values, a usual head size),
        # not at the first forward.
        for bits in {key_bits, value_bits}:
            make_codec(64, bits, quantizer, **self.options)
        self.mean = None
        if mean is not None:
            km, vm = (torch.as_tensor(m, dtype=torch.float32).detach().cpu().contiguous() for m in mean)
            if km.dim() != 2 or vm.dim() != 2 or km.shape[0] != vm.shape[0]:
                raise _native.InvalidInputError(
                    f"mean: (key_mean, value_mean) of shape [kv heads, head_dim] each, not {tuple(km.shape)} / {tuple(vm.shape)}"
                )
            if not (torch.isfinite(km).all() and torch.isfinite(vm).all()):
                raise _native.InvalidInputError("mean: the key and value means must be finite")
            self.mean = (km, vm)
        # With a mix T: codes of T·x − T·mean, read back as W·(x̂ + T·mean) with W = T⁻¹
        # (``coded_mean`` is T·mean, ``inverse`` W), per head.
        self.mix = self.inverse = self.coded_mean = None
        if mix is not None:
            if quantizer == "int":
                raise _native.InvalidInputError("mix: the int baseline codes the vectors as they are")
            ts = [torch.as_tensor(t, dtype=torch.float64).detach().cpu() for t in mix]
            if len(ts) != 2 or any(t.dim() != 3 or t.shape[-1] != t.shape[-2] for t in ts) or ts[0].shape[0] != ts[1].shape[0]:
                raise _native.InvalidInputError(
                    "mix: (key_transform, value_transform) of shape [kv heads, head_dim, head_dim] each, not "
                    + " / ".join(str(tuple(t.shape)) for t in ts)
                )
            if not all(torch.isfinite(t).all() for t in ts):
                raise _native.InvalidInputError("mix: the transforms must be finite")
            if any(not bool((torch.linalg.cond(t) <= 1e4).all()) for t in ts):
                raise _native.InvalidInputError("mix: a transform is singular or nearly so (condition number above 1e4)")
            self.mix = tuple(t.float().contiguous() for t in ts)
            self.inverse = tuple(torch.linalg.inv(t).float().contiguous() for t in ts)
            if not all(torch.isfinite(t).all() for t in self.mix + self.inverse):
                raise _native.InvalidInputError("mix: a transform or its inverse overflows float32")
            if self.mean is not None and any(m.shape != t.shape[:2] for m, t in zip(self.mean, ts)):
                raise _native.InvalidInputError(
                    f"mean and mix disagree: means {[tuple(m.shape) for m in self.mean]}, transforms "
                    f"{[tuple(t.shape) for t in ts]} ([kv heads, head_dim] and [kv heads, head_dim, head_dim])"
                )
            if self.mean is not None:
                self.coded_mean = tuple(
                    torch.einsum("hij,hj->hi", t, m.double()).float().contiguous() for t, m in zip(ts, self.mean)
                )
        self.cumulative_length = 0
        self._k, self._v = _Store(), _Store()
        self._gpu = None
        #: Set by :class:`HypercodecCache` when the model's attention is :data:`ATTENTION`:
        #: ``update`` then returns only the exact tokens, tagged for :func:`attention`.
        self.fused = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.heads = h
        self.kcodec = make_codec(d, self.key_bits, self.quantizer, **self.options)
        self.vcodec = make_codec(value_states.shape[-1], self.value_bits, self.quantizer, **self.options)
        self._k.scale_len, self._v.scale_len = self.kcodec.scale_len, self.vcodec.scale_len
        # Empty tensors of their own: a view of the first keys would hold all of them.
        self.keys = key_states.new_empty((b, h, 0, d))
        self.values = value_states.new_empty((*value_states.shape[:2], 0, value_states.shape[3]))
        self.sink_keys, self.sink_values = self.keys.clone(), self.values.clone()
        self.is_initialized = True
        want = ((key_states.shape[1], key_states.shape[3]), (value_states.shape[1], value_states.shape[3]))
        if self.mean is not None:
            if (tuple(self.mean[0].shape), tuple(self.mean[1].shape)) != want:
                raise _native.InvalidInputError(
                    f"mean: shapes {tuple(self.mean[0].shape)} / {tuple(self.mean[1].shape)} for keys and values "
                    f"of {want[0]} / {want[1]} (heads, head_dim)"
                )
        if self.mix is not None:
            got = tuple(tuple(t.shape) for t in self.mix)
            if got != tuple((h, d, d) for h, d in want):
                raise _native.InvalidInputError(
                    f"mix: shapes {got[0]} / {got[1]} for keys and values of {want[0]} / {want[1]} (heads, head_dim)"
                )
        # On a CUDA device, E8 codecs without dither (and without means or mixes) encode and decode
        # there (the codes stay on the device); everything else goes through the host.
        self._gpu = None
        if key_states.is_cuda and self.quantizer != "int" and self.mean is None and self.mix is None:
            kp, vp = self.kcodec.device_params(), self.vcodec.device_params()
            if kp is not None and vp is not None and key_states.dtype in _KV_DTYPES:
                from . import cuda

                if cuda.available():
                    self._gpu = (cuda.kernels(key_states.device), kp, vp)
                    self._k, self._v = _Store(key_states.device), _Store(key_states.device)

    def _keys(self, first: int, m: int, batch: int) -> np.ndarray | None:
        """Dither keys of tokens ``first .. first+m`` in ``[batch, heads, m]`` order: cache
        index · heads + head."""
        if not self.dither:
            return None
        t = np.arange(first, first + m, dtype=np.uint64)[None, None, :]
        h = np.arange(self.heads, dtype=np.uint64)[None, :, None]
        return np.broadcast_to(t * np.uint64(self.heads) + h, (batch, self.heads, m)).reshape(-1).copy()

    def _kv_args(self, p: dict, rows: int, toks: int) -> dict:
        """The kernels' arguments for ``rows × toks`` vectors of the codec ``p``; pointers and
        strides are the caller's to fill in."""
        return {
            "x": 0,
            "out": 0,
            "dtype": _KV_DTYPES[self.dtype],
            "codes": 0,
            "scales": 0,
            "out_row": 0,
            "codes_row": 0,
            "scales_row": 0,
            "rows": rows,
            "toks": toks,
            "dim": p["dim"],
            "bits": p["bits"],
            "tile": p["tile"],
            "alpha": p["alpha"],
            "seed": p["seed"],
        }

    def _compress_gpu(self, k: torch.Tensor, v: torch.Tensor) -> None:
        kernels, kp, vp = self._gpu
        b, h, m, _ = k.shape
        stream = torch.cuda.current_stream(self.device).cuda_stream
        coded = []
        for store, p, x in ((self._k, kp, k), (self._v, vp, v)):
            xs = x.detach().to(self.dtype).contiguous()
            if xs.data_ptr() % 16:
                xs = xs.clone()
            cb = p["code_bytes"]
            codes = torch.empty((b * h, m, cb), dtype=torch.uint8, device=self.device)
            scales = torch.empty((b * h, m), dtype=torch.int16, device=self.device)
            args = self._kv_args(p, b * h, m)
            args.update(x=xs.data_ptr(), codes=codes.data_ptr(), scales=scales.data_ptr(), codes_row=m * cb, scales_row=m)
            kernels.kv_e8_encode(args, stream)
            coded.append((store, codes, scales))
        for store, codes, scales in coded:
            store.append(codes, scales)

    def _assemble_gpu(self, sink: torch.Tensor, store: _Store, p: dict, window: torch.Tensor) -> torch.Tensor:
        kernels = self._gpu[0]
        b, h, s, d = sink.shape
        n, w = store.n, window.shape[2]
        out = torch.empty((b, h, s + n + w, d), dtype=self.dtype, device=self.device)
        out[:, :, :s] = sink
        out[:, :, s + n :] = window
        args = self._kv_args(p, b * h, n)
        args.update(
            out=out.data_ptr() + s * d * out.element_size(),
            out_row=(s + n + w) * d,
            codes=store.codes.data_ptr(),
            codes_row=store.codes.stride(0),
            scales=store.scales.data_ptr(),
            scales_row=store.scales.stride(0),
        )
        kernels.kv_e8_decode(args, torch.cuda.current_stream(self.device).cuda_stream)
        return out

    def _compress(self, k: torch.Tensor, v: torch.Tensor, sinks: int) -> None:
        """Appends ``[B, H, m, d]`` tokens to the compressed history, which follows ``sinks``
        exact tokens (the count after this update: the dither keys are cache indices)."""
        if self._gpu is not None:
            return self._compress_gpu(k, v)
        b, h, m, _ = k.shape
        keys = self._keys(sinks + self._k.n, m, b)
        means = self.mean if self.mean is not None else (None, None)
        mixes = self.mix if self.mix is not None else (None, None)
        coded = []
        for codec, x, mu, t in ((self.kcodec, k, means[0], mixes[0]), (self.vcodec, v, means[1], mixes[1])):
            x = x.detach().to(device="cpu", dtype=torch.float32)
            if mu is not None:
                x = x - mu[None, :, None, :]
            if t is not None:
                x = torch.einsum("hij,bhtj->bhti", t, x)
            coded.append(codec.encode(x.contiguous().numpy(), keys))
        # Appended once both are coded: an input the codecs refuse changes nothing.
        for store, (codes, scales) in zip((self._k, self._v), coded):
            store.append(codes.reshape(b * h, m, -1), scales.reshape(b * h, -1))

    def _assemble(self, sink: torch.Tensor, store: _Store, codec: Any, window: torch.Tensor) -> torch.Tensor:
        """``[sinks, decoded history, window]`` along the token axis, decoded in place."""
        b, h, s, d = sink.shape
        n, w = store.n, window.shape[2]
        out = torch.empty((b, h, s + n + w, d), dtype=torch.float32)
        out[:, :, :s] = sink.detach()
        out[:, :, s + n :] = window.detach()
        o = out.numpy().reshape(b * h, s + n + w, d)
        if isinstance(codec, IntCodec):
            x = codec.decode(store.codes[:, :n], store.scales[:, :n])
            o[:, s : s + n] = x
        else:
            codec.decode_rows_into(store.codes, store.scales, n, o, s, self.heads)
        side = 0 if store is self._k else 1
        if self.mix is not None and n:
            y = out[:, :, s : s + n]
            if self.coded_mean is not None:
                y = y + self.coded_mean[side][None, :, None, :]
            out[:, :, s : s + n] = torch.einsum("hij,bhtj->bhti", self.inverse[side], y)
        elif self.mean is not None and n:
            out[:, :, s : s + n] += self.mean[side][None, :, None, :]
        if self.dtype == torch.float16 and n:
            # A coded value a little past f16's largest (its coding error) stays finite.
            out[:, :, s : s + n].clamp_(-65504.0, 65504.0)
        out = out.to(device=self.device, dtype=self.dtype)
        if torch.is_grad_enabled() and (sink.requires_grad or window.requires_grad):
            # The exact tokens carry their gradients, as in transformers' own caches (the coded
            # history has none).
            return torch.cat([sink, out[:, :, s : s + n], window], 2)
        return out

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        # Nothing changes until the new tokens are coded: tokens the codecs refuse (not finite)
        # leave the layer as it was.
        n_new = key_states.shape[-2]
        sink_keys, sink_values = self.sink_keys, self.sink_values
        take = min(self.sinks - sink_keys.shape[2], key_states.shape[2])
        if take > 0:
            sink_keys = torch.cat([sink_keys, key_states[:, :, :take]], dim=2)
            sink_values = torch.cat([sink_values, value_states[:, :, :take]], dim=2)
            key_states, value_states = key_states[:, :, take:], value_states[:, :, take:]
        keys = torch.cat([self.keys, key_states], dim=2)
        values = torch.cat([self.values, value_states], dim=2)
        over = keys.shape[2] - self.window
        if over >= self.block and keys.shape[0] * keys.shape[1] > 0:  # (no rows: nothing to code)
            self._compress(keys[:, :, :over], values[:, :, :over], sink_keys.shape[2])
            # Copies: views would hold the coded tokens too.
            keys, values = keys[:, :, over:].clone(), values[:, :, over:].clone()
        self.sink_keys, self.sink_values, self.keys, self.values = sink_keys, sink_values, keys, values
        self.cumulative_length += n_new
        if self._k.n == 0:
            return torch.cat([self.sink_keys, self.keys], 2), torch.cat([self.sink_values, self.values], 2)
        # On the device, attention over the codes needs keys and values of one head size.
        if self.fused and not isinstance(self.kcodec, IntCodec) and (self._gpu is None or self.keys.shape[3] == self.values.shape[3]):
            k = torch.cat([self.sink_keys, self.keys], 2)
            k._hypercodec = self  # read by `attention`, which attends over the codes too
            return k, torch.cat([self.sink_values, self.values], 2)
        if self._gpu is not None:
            _, kp, vp = self._gpu
            k = self._assemble_gpu(self.sink_keys, self._k, kp, self.keys)
            v = self._assemble_gpu(self.sink_values, self._v, vp, self.values)
            return k, v
        k = self._assemble(self.sink_keys, self._k, self.kcodec, self.keys)
        v = self._assemble(self.sink_values, self._v, self.vcodec, self.values)
        return k, v

    def attend(self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scaling: float) -> torch.Tensor:
        """Attention of ``query`` ``[B, Hq, q, d]`` over ``[sinks, compressed history, window]``
        in one native call (``k``/``v``: the exact sinks and window that ``update`` returned;
        ``mask``: None for causal, or the boolean / additive 4-D mask over every token), as
        ``[B, q, Hq, d]``."""
        if self._gpu is not None:
            return self._attend_gpu(query, k, v, mask, scaling)
        b, hq, q, d = query.shape
        s, n = self.sink_keys.shape[2], self._k.n
        total = s + n + self.keys.shape[2]
        bias = _score_bias(mask, q, total, torch.device("cpu"))
        hk = k.shape[1]
        g = hq // hk
        host = {"device": "cpu", "dtype": torch.float32}
        qn = query.detach().to(**host).reshape(b * hk, g * q, d).contiguous().numpy()
        ek = k.detach().to(**host).reshape(b * hk, k.shape[2], d).contiguous().numpy()
        ev = v.detach().to(**host).reshape(b * hk, v.shape[2], v.shape[3]).contiguous().numpy()
        out = np.empty((b * hk, g * q, ev.shape[2]), np.float32)
        lse = np.empty((b * hk, g * q), np.float32)
        self.kcodec.attend(
            self.vcodec,
            qn,
            self._k.codes,
            self._k.scales,
            self._v.codes,
            self._v.scales,
            n,
            float(scaling),
            None if bias is None else bias.contiguous().numpy(),
            out,
            lse,
            ek,
            ev,
            s,
            s,
            self.heads,
            **self._side_args(),
        )
        o = torch.from_numpy(out).reshape(b, hq, q, -1).transpose(1, 2).contiguous()
        return o.to(device=query.device, dtype=query.dtype)

    def _side_args(self) -> dict[str, Any]:
        """The native attention's means and mixes (the means in the coded domain with a mix)."""
        if self.mix is None:
            if self.mean is None:
                return {}
            return {"kmean": self.mean[0].numpy(), "vmean": self.mean[1].numpy()}
        args = {"kmix": self.inverse[0].numpy(), "vmix": self.inverse[1].numpy()}
        if self.coded_mean is not None:
            args.update(kmean=self.coded_mean[0].numpy(), vmean=self.coded_mean[1].numpy())
        return args

    def _attend_gpu(self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scaling: float) -> torch.Tensor:
        """:meth:`attend` on the device, in two launches (``hc_kv_e8_attend`` over chunks of the
        compressed history and the exact sinks and window, nothing decoded to memory; then
        ``hc_kv_attend_merge``), written in transformers' ``[B, q, Hq, d]`` layout."""
        kernels, kp, vp = self._gpu
        b, hq, q, d = query.shape
        hk = k.shape[1]
        rows, queries = b * hk, (hq // hk) * q
        s, n, exact = self.sink_keys.shape[2], self._k.n, k.shape[2]
        total = s + n + self.keys.shape[2]
        dev, f32 = query.device, torch.float32
        if mask is not None and (
            mask.dim() != 4 or mask.shape[-1] < total or mask.shape[0] not in (1, b) or mask.shape[2] not in (1, q)
        ):
            raise _native.InvalidInputError(
                f"attention mask of shape {tuple(mask.shape)} for {b} batch rows, {q} queries and {total} tokens")
        bias = _score_bias(mask, q, total, dev)  # the kernel reads [batch rows or 1, q, total]
        if bias is not None:
            bias = bias.expand(bias.shape[0], q, total).contiguous()
        qf = query.detach().to(f32).contiguous()  # [B, Hq, q, d] is [rows, queries, d]
        ke, ve = k.detach().to(self.dtype).contiguous(), v.detach().to(self.dtype).contiguous()
        chunk = kernels.kv_attend_chunk(rows, n + exact, queries)
        chunks = -(-(n + exact) // chunk)
        part_o = torch.empty((rows, chunks, queries, d), dtype=f32, device=dev)
        part_ml = torch.empty((rows, chunks, queries, 2), dtype=f32, device=dev)
        out_dtype = query.dtype if query.dtype in _KV_DTYPES else f32
        out = torch.empty((b, q, hq, d), dtype=out_dtype, device=dev)

        def codec(p: dict, store: _Store) -> dict:
            a = self._kv_args(p, rows, n)
            a.update(codes=store.codes.data_ptr(), codes_row=store.codes.stride(0),
                     scales=store.scales.data_ptr(), scales_row=store.scales.stride(0))
            return a

        kernels.kv_e8_attend(
            {
                "keys": codec(kp, self._k),
                "values": codec(vp, self._v),
                "q": qf.data_ptr(),
                "queries": queries,
                "query_len": q,
                "heads": hk,
                "exact_keys": ke.data_ptr() if exact else 0,
                "exact_values": ve.data_ptr() if exact else 0,
                "exact": exact,
                "exact_dtype": _KV_DTYPES[self.dtype],
                "bias": 0 if bias is None else bias.data_ptr(),
                "bias_batch": 0 if bias is None or bias.shape[0] == 1 else q * total,
                "bias_query": total,
                "bias_first": s,
                "scaling": float(scaling),
                "chunk": chunk,
                "part_o": part_o.data_ptr(),
                "part_ml": part_ml.data_ptr(),
                "out": out.data_ptr(),
                "out_dtype": _KV_DTYPES[out_dtype],
            },
            torch.cuda.current_stream(dev).cuda_stream,
        )
        return out.to(query.dtype)

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def stored_bytes(self) -> int:
        """Bytes held: codes, scales, and the exact sink and window tokens at their dtype."""
        if not self.is_initialized:
            return 0
        exact = sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.sink_keys, self.sink_values))
        return self._k.nbytes() + self._v.nbytes() + exact

    def values_held(self) -> int:
        """Key and value numbers the layer stands for (tokens · batch · heads · head_dim · 2)."""
        if not self.is_initialized:
            return 0
        b, h, _, dk = self.keys.shape
        return self.cumulative_length * b * h * (dk + self.values.shape[3])

    def crop(self, tokens_to_remove: int) -> None:
        """Refused: compressed tokens cannot be cropped (``is_croppable`` is false)."""
        raise _native.InvalidInputError("a HypercodecKVLayer cannot be cropped (its history is compressed)")

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0
        scale_lens = self._k.scale_len, self._v.scale_len
        self._k, self._v = _Store(), _Store()
        self._k.scale_len, self._v.scale_len = scale_lens
        self._gpu = None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        indices = torch.as_tensor(indices)
        if indices.dtype == torch.bool:  # a mask of the rows kept
            indices = indices.nonzero().reshape(-1)
        idx = np.asarray(indices.detach().cpu().numpy(), dtype=np.int64)
        self._k.select(idx, self.heads)
        self._v.select(idx, self.heads)
        for name in ("keys", "values", "sink_keys", "sink_values"):
            setattr(self, name, getattr(self, name)[indices])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self.is_initialized:
            return
        idx = torch.arange(self.keys.shape[0]).repeat_interleave(repeats)
        self.batch_select_indices(idx)


class HypercodecCache(Cache):
    """A transformers ``Cache`` of :class:`HypercodecKVLayer` (one per decoder layer; the
    keyword arguments go to each), for models whose layers are all full attention.
    ``key_bits`` and ``value_bits`` may also be sequences of one rate per layer (mixed
    precision: e.g. 2-bit values in the first layers, 1-bit values in the rest); ``means``
    (from :func:`kv_means`) gives each layer its ``mean``."""

    def __init__(self, config: Any, **layer_options: Any) -> None:
        config = config.get_text_config(decoder=True)
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds - {"full_attention"}:
            raise _native.InvalidInputError(f"HypercodecCache needs full-attention layers only, found {sorted(kinds)}")
        n = config.num_hidden_layers
        per_layer = {}
        for name in ("key_bits", "value_bits"):
            bits = layer_options.get(name)
            if hasattr(bits, "tolist"):  # a numpy array or tensor of rates (or one rate)
                bits = layer_options[name] = bits.tolist()
            if isinstance(bits, (list, tuple)):
                if len(bits) != n:
                    raise _native.InvalidInputError(f"{name}: {len(bits)} rates for {n} layers")
                per_layer[name] = list(bits)
        calibration = layer_options.pop("calibration", None)
        means = layer_options.pop("means", None)
        if calibration is not None:
            if means is not None:
                raise _native.InvalidInputError("give means or calibration, not both")
            means = calibration.means
            if len(calibration.mixes) != n:
                raise _native.InvalidInputError(f"calibration: {len(calibration.mixes)} layers for {n}")
            per_layer["mix"] = list(calibration.mixes)
        if means is not None:
            if len(means) != n:
                raise _native.InvalidInputError(f"means: {len(means)} pairs for {n} layers")
            per_layer["mean"] = list(means)
        super().__init__(
            layers=[
                HypercodecKVLayer(**{**layer_options, **{k: v[i] for k, v in per_layer.items()}})
                for i in range(n)
            ]
        )
        self._config = config

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # Attention over the codes when the model runs `attention` (read at each call: the
        # model's implementation can change after the cache is built).
        if not 0 <= layer_idx < len(self.layers):
            raise _native.InvalidInputError(
                f"this cache was made for {len(self.layers)} layers (its config's num_hidden_layers), "
                f"and a layer {layer_idx} writes to it"
            )
        self.layers[layer_idx].fused = getattr(self._config, "_attn_implementation", None) == ATTENTION
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def stored_bytes(self) -> int:
        """Bytes held by every layer (see :meth:`HypercodecKVLayer.stored_bytes`)."""
        return sum(layer.stored_bytes() for layer in self.layers)

    def bits_per_value(self) -> float:
        """Stored bits per cached key/value number, every overhead included."""
        n = sum(layer.values_held() for layer in self.layers)
        return 8 * self.stored_bytes() / max(n, 1)


def kv_means(model: Any, batches: Any, skip: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's mean key and mean value per key/value head (float32 ``[heads, head_dim]``
    on the CPU), over the tokens of ``batches`` (token-id tensors ``[1, T]``, e.g. calibration
    windows of the text the model will read) after the first ``skip`` of each (the attention
    sinks, whose keys are outliers), for ``HypercodecCache(config, means=...)``: the cache
    then codes ``k − mean`` and adds the mean back, for every batch row alike."""
    from transformers import DynamicCache

    _check_skip(skip)
    sums: list[list[torch.Tensor]] | None = None
    count = 0
    for ids in batches:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        parts = [
            [layer.keys[:, :, skip:].float().sum((0, 2)).cpu(), layer.values[:, :, skip:].float().sum((0, 2)).cpu()]
            for layer in cache.layers
        ]
        count += ids.shape[0] * max(ids.shape[-1] - skip, 0)
        sums = parts if sums is None else [[a + b for a, b in zip(x, y)] for x, y in zip(sums, parts)]
    if sums is None or count == 0:
        raise _native.InvalidInputError(f"kv_means: no tokens after the first {skip} of each batch")
    return [(k / count, v / count) for k, v in sums]


def _check_skip(skip: int) -> None:
    if not isinstance(skip, (int, np.integer)) or skip < 0:
        raise _native.InvalidInputError(f"skip: a count of tokens >= 0, not {skip!r}")


def bits_at(options: dict[str, Any], head_dim: int, context: int) -> float:
    """Bits per cached value of a cache made with ``options`` (``HypercodecCache``'s keyword
    arguments: ``quantizer``, ``key_bits``, ``value_bits``, ``window``, ``sinks``, ``scale``) at
    ``context`` tokens, with the exact window and sinks in bf16; rates per layer count by their
    mean (every layer holds as many values). ``quantizer="group"`` stands for transformers'
    quantized caches: ``bits`` per value plus an f16 scale and zero point per group of 64 (their
    documented layout; counted, not measured)."""
    if not context >= 1:
        raise _native.InvalidInputError(f"context: at least 1 token, not {context}")
    q = options["quantizer"]
    # Up to the window and sinks every token is exact.
    w = min(options["window"] + options.get("sinks", 0), context)
    sides = []
    for rates in (options["key_bits"], options["value_bits"]):
        rates = list(rates) if isinstance(rates, (list, tuple)) else [rates]
        extra = {"scale": options["scale"]} if "scale" in options else {}
        per = [b + 32 / 64 if q == "group" else make_codec(head_dim, b, q, **extra).bits_per_value for b in rates]
        sides.append(((context - w) * sum(per) / len(per) + w * 16) / context)
    return sum(sides) / 2


def _powm(a: torch.Tensor, p: float) -> torch.Tensor:
    """``a^p`` of a symmetric positive semi-definite matrix (eigenvalues clamped at 1e-300)."""
    w, u = torch.linalg.eigh((a + a.T) / 2)
    return (u * w.clamp(min=1e-300) ** p) @ u.T


def _mix(c: torch.Tensor, f: torch.Tensor, count: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The transform ``T`` for vectors of covariance ``c`` whose errors cost ``eᵀ·f·e`` (both
    estimated from ``count`` vectors, so shrunk towards their mean eigenvalue by
    ``max(eps, d / (d + count))``), and ``(C^{½}·F·C^{½})^{½}`` (its trace squared over ``d`` is
    the cost per unit of relative error after ``T``)."""
    d = c.shape[0]
    eye = torch.eye(d, dtype=c.dtype)
    if not float(torch.trace(c)) > 1e-30:
        # A head whose vectors do not vary (its mean carries it): nothing to shape.
        return eye, torch.zeros_like(c)
    shrink = max(eps, d / (d + count))
    c = (1 - shrink) * c + shrink * torch.trace(c).clamp(min=1e-300) / d * eye
    f = (1 - shrink) * f + shrink * torch.trace(f).clamp(min=1e-300) / d * eye
    ch, cih = _powm(c, 0.5), _powm(c, -0.5)
    root = _powm(ch @ f @ ch, 0.5)
    t = _powm(cih @ root @ cih, 0.5)
    return t * (d / torch.trace(t @ c @ t.T)).sqrt(), root


class KvCalibration:
    """What :func:`kv_calibrate` measured, per layer: ``means`` (``(key_mean, value_mean)``,
    float32 ``[kv heads, head_dim]``) and ``mixes`` (``(key_transform, value_transform)``,
    float32 ``[kv heads, head_dim, head_dim]``), for ``HypercodecCache(config,
    calibration=...)``; ``gains`` (``(keys, values)`` per layer, dB): the predicted drop of the
    loss' growth under coding noise that the transforms bring, mean over heads."""

    def __init__(self, means: list, mixes: list, gains: list[tuple[float, float]]) -> None:
        self.means, self.mixes, self.gains = means, mixes, gains


def kv_calibrate(model: Any, batches: Any, skip: int = 4, eps: float = 1e-3) -> KvCalibration:
    """Measures, over ``batches`` (token-id tensors ``[B, T]`` of text like the text the model
    will read), each key/value head's mean key and value, their covariances ``C`` (after the
    first ``skip`` tokens of each row: the attention sinks) and the Fisher information ``F`` of
    the next-token loss about them (one backward pass per batch; each layer's keys and values
    taken as leaves, so their gradients hold the other layers' keys and values fixed: on
    SmolLM2-135M at 2 bits this measured +2.13 % perplexity against +3.47 % with every path to
    the loss; the model's weights, modes and attention are left as they were), and from these each head's transform ``T`` for :class:`HypercodecKVLayer`'s
    ``mix``: with an error that is white after ``T`` and scales with ``‖T·x‖``, the expected
    loss grows as ``tr(T·C·Tᵀ)·tr(T⁻ᵀ·F·T⁻¹)``, least for ``TᵀT ∝ C^{-½}(C^{½}·F·C^{½})^{½}
    C^{-½}`` (``T`` its symmetric root, scaled so that ``tr(T·C·Tᵀ) = head_dim``: the coded vectors
    have a mean square of 1, the size ``scale='log4'`` is made for; ``C`` and ``F``
    are shrunk towards their mean eigenvalue by ``max(eps, head_dim / (head_dim + tokens))``,
    so that few tokens give a mild ``T`` and ``T`` stays well conditioned; ``F`` is the
    empirical Fisher, from the text's own next tokens; ``gains`` are predicted for the shrunk
    ``C`` and ``F``). The batches go to the model's device; padding is not masked out."""
    _check_skip(skip)
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    caught: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def probe(module: Any, query: Any, key: Any, value: Any, mask: Any, **kwargs: Any) -> Any:
        # Each layer's keys and values as leaves: their gradients hold the other layers' keys
        # and values fixed (measured better than every path to the loss: see the docs).
        key = key.detach().requires_grad_()
        value = value.detach().requires_grad_()
        caught[module.layer_idx] = (key, value)
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)

    name = "hypercodec_calibrate"
    before = model.config._attn_implementation
    grads = [p.requires_grad for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    device = next(model.parameters()).device
    stats: dict[int, list] = {}
    count = 0
    AttentionInterface.register(name, probe)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        model.set_attn_implementation(name)
        for ids in batches:
            caught.clear()
            ids = torch.as_tensor(ids).to(device)
            with torch.inference_mode(False), torch.enable_grad():
                logits = model(input_ids=ids, use_cache=False).logits[:, :-1].flatten(0, 1).float()
                torch.nn.functional.cross_entropy(logits, ids[:, 1:].flatten(), reduction="sum").backward()
            count += ids.shape[0] * max(ids.shape[-1] - skip, 0)
            for layer, pair in caught.items():
                acc = stats.setdefault(layer, [None] * 6)
                for i, t in enumerate(pair):
                    x = t.detach()[:, :, skip:].double().cpu()  # [B, H, T, d]
                    g = t.grad[:, :, skip:].double().cpu()
                    parts = (x.sum((0, 2)), torch.einsum("bhti,bhtj->hij", x, x), torch.einsum("bhti,bhtj->hij", g, g))
                    for j, v in enumerate(parts):
                        acc[3 * i + j] = v if acc[3 * i + j] is None else acc[3 * i + j] + v
    finally:
        caught.clear()
        for p, g in zip(model.parameters(), grads):
            p.requires_grad_(g)
        for m, mode in zip(model.modules(), modes):
            m.training = mode
        AttentionInterface._global_mapping.pop(name, None)
        model.set_attn_implementation(before)
    if count == 0 or not stats:
        raise _native.InvalidInputError(f"kv_calibrate: no tokens after the first {skip} of each batch")
    means, mixes, gains = [], [], []
    for layer in sorted(stats):
        side_means, side_mixes, side_gains = [], [], []
        for i in (0, 1):
            total, outer, fisher = stats[layer][3 * i : 3 * i + 3]
            mean = total / count
            ts, db = [], 0.0
            for h in range(mean.shape[0]):
                second = outer[h] / count
                c, f = second - torch.outer(mean[h], mean[h]), fisher[h] / count
                if not float(torch.trace(c)) > 1e-12 * float(torch.trace(second)):
                    c = torch.zeros_like(c)  # constant up to rounding: the mean carries it
                t, root = _mix(c, f, count, eps)
                ts.append(t)
                tr = float(torch.trace(root))
                if tr > 0:  # (a head whose vectors never vary gains nothing)
                    db += 10 * math.log10(max(float(torch.trace(c) * torch.trace(f)) / tr**2, 1e-300))
            side_means.append(mean.float())
            side_mixes.append(torch.stack(ts).float())
            side_gains.append(db / mean.shape[0])
        means.append(tuple(side_means))
        mixes.append(tuple(side_mixes))
        gains.append(tuple(side_gains))
    return KvCalibration(means, mixes, gains)


def attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface (:data:`ATTENTION`): over a :class:`HypercodecCache`
    layer's codes when ``key`` comes from one, else PyTorch's SDPA (``sdpa_attention_forward``)."""
    layer = getattr(key, "_hypercodec", None)
    if layer is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # What the attention over the codes does not compute is refused, never skipped.
    if kwargs.get("softcap") is not None:
        raise _native.InvalidInputError(
            f"the {ATTENTION!r} attention has no logit soft-capping (softcap={kwargs['softcap']}): "
            "run this model with attn_implementation='eager' or 'sdpa' and the same HypercodecCache"
        )
    if dropout:
        raise _native.InvalidInputError(
            f"the {ATTENTION!r} attention has no dropout (dropout={dropout}): put the model in eval mode"
        )
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        warnings.warn(
            f"the {ATTENTION!r} attention passes no gradient to the queries or the exact tokens; "
            "run it under torch.no_grad(), or train with attn_implementation='eager' or 'sdpa'",
            stacklevel=2,
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return layer.attend(query, key, value, attention_mask, scaling), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


_register()
