"""PyTorch layers that keep only the compressed form of their weight (requires torch).

:class:`HyperLinear` replaces ``nn.Linear``; its forward pass runs on hypercodec's CPU runtime
straight from the stored codes. :class:`HyperConv2d` replaces ``nn.Conv2d``: a 1×1 convolution
runs on the runtime as a linear layer over channels; any other kernel is the documented *decode
fallback* (the weight is decoded for the call, then ``F.conv2d``). :class:`HyperConv1d` replaces
``nn.Conv1d`` as a convolution of height 1. :func:`quantize` swaps the
layers of a model in place; :func:`load_into` builds them from an archive without ever holding
their dense weights. Built from a compressed form, these layers are inference-only; a
``HyperLinear(..., trainable=True)`` keeps a float master weight and trains through a
straight-through estimator, re-quantizing every ``refresh_every`` steps. Under
``torch.compile`` each inference layer traces as one operator (``hypercodec::stored_forward``,
``stored_lookup`` for tables), so ``fullgraph=True`` compiles a whole model around them (and
``torch.export``, ``torch.jit.trace`` and ``torch.fx.symbolic_trace`` record the same operators); under
inductor the linear layers that read one input (q, k, v; gate, up) become one operator that
launches once on CUDA at batch 1 (:func:`set_compile_grouping`).

    >>> import torch, hypercodec.nn as hnn
    >>> model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    >>> hnn.quantize(model, bps=4, method="lattice-fixed")  # doctest: +SKIP
    >>> model(torch.randn(2, 256)).shape  # doctest: +SKIP
    torch.Size([2, 10])
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from . import _native


def method_spec(method: str, bps: float) -> str:
    """The candidate name of ``method`` at ``bps`` bits per value: ``lattice`` → ``e8@{bps}``
    (E8 + rANS, all-in rate), ``lattice-gpu`` → ``e8@{bps}-gpu`` (rANS in chunks a CUDA warp
    decodes inside the GEMV: the device holds the coded bytes), ``lattice-prefix`` →
    ``e8@{bps}-prefix`` (lane-interleaved prefix codes, the GPU's cheaper entropy decode; up to
    about 4.6 bits, rANS beyond), ``lattice-fixed`` → ``e8-fixed{bits}`` (fixed-rate E8, the fastest
    form), ``affine`` → ``int{bits}`` (groups of 128), ``affine-row`` → ``int{bits}-row``,
    ``trellis`` → ``tcq@{bits}`` (bitshift trellis, L = 16), ``trellis-l12`` → ``tcq@{bits}-l12``
    (16× faster to encode, about 0.3 dB lower), ``trellis-lL`` → ``tcq@{bits}-lL`` (L = 8..16);
    ``trellis-pairs`` / ``trellis-pairs-lL`` → ``tcq@{bits}-v2`` / ``tcq@{bits}-lL-v2``
    (experimental: a pair of values per state, the code a GPU decoder needs fewer instructions
    for, 0.05–0.3 dB lower; coded on the CPU even with a device, run by the CUDA kernels);
    ``lattice-d4`` / ``-a2`` / ``-z1`` → ``d4@{bps}`` ... (the other lattices); ``lattice:tensor``
    → ``e8@{bps}:tensor`` (one step for every row instead of each row's own scale);
    ``affine-gG`` / ``affine-gG-sym`` → ``int{bits}-gG`` / ``int{bits}-gG-sym`` (groups of ``G``
    columns, with an offset each or symmetric);
    ``codebook-bB[-rR][-sMODE]`` → ``cb-bB-kK[-rR][-sMODE]`` with ``K = 2^(B·bits)`` prototypes
    (at most 4096) of ``B`` values, ``R`` residual corrections per block, scales per ``channel``,
    ``block`` or ``tensor``; any other string is taken as a candidate name itself (``int8-row``,
    ``e8@3.5``, ``bf16``, ``cb-b8-k256``, ...). A ``bps`` that is not a number raises
    ``TypeError``, one outside (0, 16] ``ValueError``, as does a width the method's format does
    not hold (``lattice-fixed`` 2–8 bits, ``affine`` 1–8, ``trellis-pairs`` 1–4)."""
    if isinstance(bps, bool) or not isinstance(bps, numbers.Real):
        hint = f"; a candidate name goes in method=, as in quantize(model, method={bps!r})" if isinstance(bps, str) else ""
        raise TypeError(f"bps must be a number of bits per value, not {bps!r}{hint}")
    if not (0 < bps <= 16):  # (NaN fails too)
        raise ValueError(f"bps must be more than 0 and at most 16 bits per value, not {bps!r}")
    # Integer widths round half up (round() went to even: 2.5 gave int2, 3.5 int4).
    bits = math.floor(bps + 0.5)
    integer_width = method.startswith(("codebook-b", "affine", "trellis")) or method == "lattice-fixed"
    if integer_width and bits < 1:
        raise ValueError(f"{method} stores whole bits per value: bps={bps!r} rounds to {bits}; ask for at least 0.5")
    # The widths each integer-width method's format holds.
    widths = (
        (2, 8) if method == "lattice-fixed"
        else (1, 8) if method.startswith("affine")
        else (1, 4) if method.startswith("trellis-pairs")
        else None
    )
    if widths is not None and not widths[0] <= bits <= widths[1]:
        raise ValueError(
            f"{method} stores {widths[0]} to {widths[1]} bits per value: bps={bps!r} rounds to {bits}"
        )
    if method.startswith("codebook-b"):
        block, _, rest = method.removeprefix("codebook-b").partition("-")
        if not block.isdigit() or int(block) < 1:
            raise ValueError(f"{method}: the block size after codebook-b must be a whole number of values, as in codebook-b4")
        k = min(2 ** (int(block) * bits), 4096)
        return f"cb-b{block}-k{k}" + (f"-{rest}" if rest else "")
    if method.startswith("affine-g"):
        if not re.fullmatch(r"affine-g[1-9][0-9]{0,8}(-sym)?", method):
            raise ValueError(f"{method}: the group after affine-g must be a whole number of columns, as in affine-g64 or affine-g64-sym")
        return f"int{bits}-{method.removeprefix('affine-')}"
    table = {
        "lattice": f"e8@{bps:g}",
        "lattice:tensor": f"e8@{bps:g}:tensor",
        "lattice-gpu": f"e8@{bps:g}-gpu",
        "lattice-prefix": f"e8@{bps:g}-prefix",
        "lattice-d4": f"d4@{bps:g}",
        "lattice-a2": f"a2@{bps:g}",
        "lattice-z1": f"z1@{bps:g}",
        "lattice-fixed": f"e8-fixed{bits}",
        "affine": f"int{bits}",
        "affine-row": f"int{bits}-row",
        "trellis": f"tcq@{bits}",
        **{f"trellis-l{n}": f"tcq@{bits}-l{n}" for n in range(8, 17)},
        "trellis-pairs": f"tcq@{bits}-v2",
        **{f"trellis-pairs-l{n}": f"tcq@{bits}-l{n}-v2" for n in range(8, 17)},
    }
    return table.get(method, method)


def _op_weight(op: "_native.Linear") -> torch.Tensor:
    """The operator's decoded weight as a float32 CPU tensor (flat or as the runtime shapes it),
    sharing the runtime's array."""
    return torch.from_numpy(np.asarray(op.weight()))


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().contiguous().numpy()


def _quantize(w: torch.Tensor, spec: str, bias: np.ndarray | None, hessian: np.ndarray | None = None) -> _native.Linear:
    """``Linear.quantize`` of ``w``; a weight on a CUDA device has trellis specs coded on that
    GPU (the same bits; the CPU codes them where the kernels cannot load)."""
    x = _f32(w)
    if w.is_cuda and "tcq" in spec:
        device = w.device.index if w.device.index is not None else torch.cuda.current_device()
        try:
            return _native.Linear.quantize(x, spec, bias, hessian, device=device)
        except _native.CudaError:
            pass
    return _native.Linear.quantize(x, spec, bias, hessian)


HWZ_KEY = "weight_hwz"
#: Per-layer entries that copies and pickles rebuild instead of carrying: device forms, W8A8 and
#: decoded weights (raw device pointers, device tensors), a compiled call (it would run the
#: original).
_CACHES = ("_device_forms", "_compiled_call_impl", "_w8a8", "_w8a8_form", "_dense_on_device")


class _StoredForm:
    """The ``weight_hwz`` entry a compressed layer puts in its state dict: its stored form as a
    one-tensor ``.hwz`` archive in a 1-D ``torch.uint8`` tensor (``weight`` as stored, and the
    ``bias`` when the runtime holds it), so ``state_dict`` / ``load_state_dict``,
    ``torch.save`` and transformers' ``save_pretrained`` / ``from_pretrained`` carry the
    compressed bytes and never a dense weight. Loading it builds the operator straight from
    those bytes (:meth:`hypercodec.Linear.from_hwz`).

    A layer that shares another's operator (a tied input embedding and output head) names that
    layer in ``tied``: it saves nothing of its own (its ``weight_hwz`` reads as empty: the bytes
    are the other layer's), and :func:`hypercodec.nn.load_state_dict` gives it the other's
    operator again, so the shared bytes are stored once (``Module.load_state_dict`` on a model
    already quantized does not re-tie: load into a fresh model)."""

    op: "_native.Linear | None"

    def __prepare_scriptable__(self) -> Any:
        # torch.jit.script calls this on every module first; the stored layers run native code
        # TorchScript cannot compile (it failed on an annotation: "Unknown type annotation").
        raise _native.InvalidInputError(
            f"torch.jit.script cannot compile hypercodec's {type(self).__name__} (it runs native code): "
            "torch.jit.trace, torch.export and torch.compile record its operators"
        )

    def _init_stored(self, source: Any = None, tied: str | None = None) -> None:
        # `source()` gives the bytes of a layer read from an archive; `_hwz` keeps the tensor
        # a layer was loaded from (re-saving it copies nothing).
        self._hwz_source = source
        self._hwz: torch.Tensor | None = None
        self.tied = tied
        _register(self)

    @property
    def weight_hwz(self) -> torch.Tensor:
        """The stored form (see the class docs); an empty meta tensor before loading or for a
        tied layer."""
        if self._hwz is not None:
            return self._hwz
        if self.op is None or self.tied is not None:
            return torch.empty(0, dtype=torch.uint8, device="meta")
        data = self.op.to_hwz()
        if data is None and self._hwz_source is not None:
            data = self._hwz_source()
        if data is None:
            raise _native.InvalidInputError("this layer has no stored form to save (it was built from bytes that were not kept)")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _load_hwz(self, value: torch.Tensor) -> None:
        t = value.detach()
        if t.is_meta or t.numel() == 0:
            return  # a loader initializing what it found missing: the layer stays unloaded
        t = t.to(device="cpu", dtype=torch.uint8).reshape(-1).contiguous()
        # (a layer read with `fixed_bits` converts again: `hf.from_hwz` records it)
        op = _native.Linear.from_hwz(t.numpy(), self.__dict__.get("_fixed_bits"))
        self._check_loaded(op)
        self.op = op
        self._hwz = t
        self.tied = None  # its own bytes now: saved as its own
        self._buffers.pop(HWZ_KEY, None)

    @classmethod
    def _empty(cls, tied: str | None = None) -> Any:
        """A bare module of this class with no operator yet, for ``placeholder``: its stored
        form arrives by loading (its own ``weight_hwz``) or, ``tied``, from that layer."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._init_stored(tied=tied)
        if tied is None:
            # Loaders look stored names up as buffers (transformers does, to report and
            # initialize what a checkpoint lacks): an empty one stands in until it arrives.
            self._buffers[HWZ_KEY] = torch.empty(0, dtype=torch.uint8, device="meta")
        self.op = None
        return self

    def _check_loaded(self, op: "_native.Linear") -> None:
        pass

    def _input_grad(self, gy: torch.Tensor) -> torch.Tensor:
        """``∂y·Ŵ`` for ``gy`` of shape ``(..., rows)``: the weight decoded for this product and
        dropped, on the device for CUDA tensors (:meth:`hypercodec.cuda.DeviceLinear.input_grad`)."""
        if gy.is_cuda:
            return _on_device(self, gy.device).input_grad(gy)
        return gy.float() @ _decoded(self, gy.device)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A deep copy shares the immutable operator (so ties stay ties) and copies the rest;
        device forms are rebuilt at the copy's first call (theirs hold raw device pointers)."""
        import copy

        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k in _CACHES:
                continue  # (a compiled call would run the original layer)
            if k == "_buffers":  # (the key is a slot of an arena: copied, it would copy the arena)
                v = {b: t for b, t in v.items() if b != _OP_KEY}
            new.__dict__[k] = v if k == "op" else copy.deepcopy(v, memo)
        key = self._buffers.get(_OP_KEY)
        _register(new, None if key is None else key.device)
        return new

    def __copy__(self) -> Any:
        """A shallow copy shares the operator (and, as ``nn.Module``'s does, the parameter and
        submodule tables); device forms are rebuilt at its first call."""
        new = type(self).__new__(type(self))
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k not in _CACHES})
        _register(new)
        return new

    def _replicate_for_data_parallel(self) -> Any:
        """``nn.DataParallel``'s replica (it copies ``__dict__``). It keeps its original's number:
        ``replicate`` then sets its key on the replica's device, where that number has its slot
        (the same one at every step, not a new slot per step)."""
        replica = super()._replicate_for_data_parallel()
        replica.__dict__.pop("_dense_on_device", None)  # (each replica its own: one is cleared when the operator changes)
        return replica

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (``torch.save(model)``): the stored form as bytes in place of the operator
        (rebuilt on load); device forms are dropped. A tied layer pickles its owner's bytes
        too, and comes back with an operator of its own (``state_dict`` stores them once)."""
        state = nn.Module.__getstate__(self)
        for k in _CACHES:
            state.pop(k, None)
        state["_buffers"] = {b: t for b, t in state["_buffers"].items() if b != _OP_KEY}  # (made again)
        state.pop("_op_number", None)
        state["_hwz_source"] = None
        if state.get("op") is not None:
            if self.tied is None:
                state["_hwz"] = self.weight_hwz
            else:
                data = self.op.to_hwz()
                if data is None and self._hwz_source is not None:
                    data = self._hwz_source()  # the owner's bytes, where the tie was made
                if data is None:
                    raise _native.InvalidInputError(
                        f"this layer shares {self.tied!r}'s operator, read from an archive: pickle "
                        "cannot carry it; save the model's state_dict instead"
                    )
                state["_tied_hwz"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            state["op"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        tied_bytes = state.pop("_tied_hwz", None)
        if isinstance(state.get("dtype"), torch.dtype) and "_dtype_of" not in state:
            # A table pickled before its dtype followed .half() / .to(): the probe that does.
            state["_dtype_of"] = torch.empty(0, dtype=state.pop("dtype"))
        nn.Module.__setstate__(self, state)
        _register(self)
        if self._parameters.get("weight") is not None:  # a trainable layer
            _untraced_training_weight()
        data = tied_bytes if tied_bytes is not None else self._hwz
        if self.op is None and data is not None and data.numel():
            # (a layer read with `fixed_bits` converts again: `hf.from_hwz` records it)
            self.op = _native.Linear.from_hwz(data.numpy(), self.__dict__.get("_fixed_bits"))
        if tied_bytes is not None:  # what pickling it again carries
            self._hwz_source = lambda b=tied_bytes: b.numpy()

    def __setattr__(self, name: str, value: Any) -> None:
        if name == HWZ_KEY:
            self._load_hwz(value)
            return
        before = self.__dict__.get("op")
        super().__setattr__(name, value)
        if "_op_number" not in self.__dict__:
            return
        if name == _OP_KEY and isinstance(value, torch.Tensor):
            # A loader's replacement (transformers fills non-persistent buffers with empty
            # ones): a key again, where it was put.
            _rekey(self, value.device)
        elif name == "op" and value is not before:
            # New weights: a new key, so that a CUDA graph recorded for the old operator's
            # device pointers is recorded again rather than replayed.
            self.__dict__["_op_generation"] = self.__dict__.get("_op_generation", 0) + 1
            _rekey(self)

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        key = self._buffers.get(_OP_KEY)
        out = super()._apply(*args, **kwargs)
        probe = self.__dict__.get("_dtype_of")
        if probe is not None and args:
            self.__dict__["_dtype_of"] = args[0](probe)  # (the dtype a converted weight would have)
        if self._buffers.get(_OP_KEY) is not key:  # moved or converted: a key of its own again
            _rekey(self)
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._parameters.get("weight") is None and self.tied is None:
            destination[prefix + HWZ_KEY] = self.weight_hwz

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        key = prefix + HWZ_KEY
        if key in state_dict:
            self._load_hwz(state_dict[key])
        elif strict and self._parameters.get("weight") is None and self.tied is None and HWZ_KEY not in self._buffers:
            missing_keys.append(key)  # (a placeholder's stand-in buffer is reported by torch)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if key in unexpected_keys:
            unexpected_keys.remove(key)


class _Stored(torch.autograd.Function):
    """``forward(x)`` computed on a stored form, differentiable in ``x`` (adapters, prompts or
    norms trained around frozen compressed layers): the backward pass decodes the weight for
    its one product (``∂x = backward(∂y)``) and drops it; the stored form takes no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward: Callable, backward: Callable) -> torch.Tensor:
        ctx.backward_fn, ctx.x_dtype = backward, x.dtype
        return forward(x)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, None, None]:
        return ctx.backward_fn(gy).to(ctx.x_dtype), None, None


_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)  # (one call where autocast is off)


def _autocast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in autocast's dtype where ``torch.autocast`` is on for its device, as ``nn.Linear``
    and ``nn.Conv2d`` take their inputs (a float32 input then runs the bf16 / f16 kernels, and
    the output has the dtype the model around it expects). An integer or bool input is refused,
    as ``nn.Linear`` refuses it (it used to come back as truncated integers)."""
    if not x.is_floating_point():
        raise TypeError(f"a compressed layer takes floating-point inputs, not {x.dtype}")
    if x.dtype == torch.float64 or (_ANY_AUTOCAST is not None and not _ANY_AUTOCAST()):
        return x  # (autocast leaves float64 alone; and the common case: autocast off, asked once)
    try:
        on = torch.is_autocast_enabled(x.device.type)
    except TypeError:  # torch < 2.4: no per-device query
        return x
    dtype = torch.get_autocast_dtype(x.device.type) if on else x.dtype
    return x if dtype == x.dtype else x.to(dtype)


_FUNCTORCH = getattr(torch._C, "_functorch", None)  # (looked up once: every eager forward asks it)


def _check_plain(x: torch.Tensor) -> None:
    """Refuses inputs the native product cannot honour: tensors wrapped by ``torch.func``
    transforms (``vmap``, ``grad``, ``jvp``: they failed inside with PyTorch's "tensor that
    doesn't have storage") and forward-mode dual tensors (their tangent was dropped without a
    word). Plain reverse-mode autograd, ``torch.compile`` and ``torch.export`` are unaffected."""
    if _FUNCTORCH is not None and _FUNCTORCH.is_functorch_wrapped_tensor(x):
        raise _native.InvalidInputError(
            "torch.func transforms (vmap, grad, jvp, jacrev) cannot run a compressed layer's stored product: "
            "use reverse-mode autograd, torch.compile, or the decoded weight (weight_dense())"
        )
    fwd = torch.autograd.forward_ad
    if getattr(fwd, "_current_level", -1) >= 0 and fwd.unpack_dual(x).tangent is not None:
        raise _native.InvalidInputError(
            "forward-mode AD (dual tensors) does not pass through a compressed layer's stored product: "
            "use reverse-mode autograd, or the decoded weight (weight_dense())"
        )


def _through_stored(x: torch.Tensor, forward: Callable, backward: Callable) -> torch.Tensor:
    """``forward(x)``, through :class:`_Stored` when a gradient w.r.t. ``x`` is wanted."""
    _check_plain(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Stored.apply(x, forward, backward)
    return forward(x)


# torch.compile: a traced stored layer is one opaque operator, ``hypercodec::stored_forward(x,
# key, meta)``, so a model with compressed layers compiles whole (``fullgraph=True``, CUDA graphs
# around the kernels) instead of breaking its graph at every layer. The operator names its layer
# by a *key*: a buffer of the layer's own (``_op_key``, not saved) holding a number unique to
# the layer, which the tracer takes as an input like a weight, so that blocks of the same shape
# share one compiled graph (``block.compile()`` on each of 32 blocks compiles once; a handle
# kept constant in the graph compiled a graph per block and, past dynamo's recompile limit, left
# the rest uncompiled). The operator finds the layer by the key's address (no read of a device
# tensor), or, for a copy of a key, by its number (a read: a device synchronization); numbers
# start at a random point per process, so a graph run in another process finds no layer.
# ``meta`` (ints) is all the fake form needs for the output's shape, dtype and strides. The
# backward is a second operator, ``hypercodec::stored_input_grad(∂y, key, x_shape)``, so that
# the traced backward reads the layer when it runs (a traced product would keep the weight
# decoded at trace time as a constant). Eager calls do not go through them (the dispatcher
# would cost every call microseconds).
_OP_KEY = "_op_key"
_NUMBERS = itertools.count(int.from_bytes(os.urandom(4), "little") << 24)
_BY_NUMBER: dict[int, weakref.ref] = {}
_BY_ADDRESS: dict[tuple[str, int], weakref.ref] = {}
# Keys are slots of arenas that are never freed, so that no two keys ever share an address: a
# CUDA graph recorded for one layer (its kernels hold that layer's device pointers) is never
# replayed for another whose key took the first one's place. A layer has one slot per device and
# weights (``_op_generation``, counted up when its operator changes): moving it back and forth,
# or nn.DataParallel's replicas (which keep their original's number) at every step, reuse them.
_ARENAS: dict[Any, list[Any]] = {}
_ARENA_SLOTS = 1024
_SLOTS: dict[tuple[int, torch.device, int], torch.Tensor] = {}


def _new_key(number: int, device: Any, generation: int = 0) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "meta":
        return torch.empty(1, dtype=torch.int64, device=device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = _SLOTS.get((number, device, generation))
    if key is not None:
        return key
    # (Normal tensors even under torch.inference_mode: a key is saved for backward, and an
    # arena made there would refuse the next fill outside it.)
    with torch.inference_mode(False), torch.no_grad():
        arena = _ARENAS.get(device)
        if arena is None or arena[1] == _ARENA_SLOTS:
            arena = [torch.empty(_ARENA_SLOTS, 8, dtype=torch.int64, device=device), 0]
            _ARENAS[device] = arena
            _ARENAS.setdefault(None, []).append(arena[0])  # (every arena kept)
        # A slot of 64 bytes: inductor copies a CUDA input that is not 16-byte aligned (and the
        # operator would then meet a copy while capturing a CUDA graph).
        key = arena[0][arena[1], :1]
        arena[1] += 1
        key.fill_(number)
    # What torch._dynamo.mark_static_address(key) sets (without importing dynamo): a fixed
    # address, which CUDA graph trees read in place, as they do a weight, instead of copying
    # it into a graph's own input (the operator would then meet a copy while capturing, and
    # a copy can only be named by reading its number). A block with other keys records anew.
    key._dynamo_static_input_type = "unguarded"
    _SLOTS[(number, device, generation)] = key
    return key


def _register(layer: Any, device: Any = None) -> None:
    """Gives ``layer`` a key of its own (copies and unpickled layers get fresh ones): a
    non-persistent buffer, so that it moves with the layer and never enters a state dict. Made
    on ``device``, else where its present key is, else on the host (even under a
    ``torch.device("meta")`` context: loaders build layers there)."""
    number = next(_NUMBERS)
    layer.__dict__["_op_number"] = number
    layer.__dict__["_op_generation"] = 0
    _BY_NUMBER[number] = weakref.ref(layer, lambda _ref, n=number: _BY_NUMBER.pop(n, None))
    d = layer.__dict__
    d["_buffers"] = dict(d["_buffers"])  # (a shallow copy's table is its original's)
    d["_non_persistent_buffers_set"] = d["_non_persistent_buffers_set"] | {_OP_KEY}
    _rekey(layer, device)


def _rekey(layer: Any, device: Any = None) -> None:
    """The layer's key on ``device`` (else where the present one is, else where its other
    tensors are) in place of the present one: moved, converted, or overwritten by a loader or by
    nn.DataParallel's replicate."""
    d = layer.__dict__
    old = d["_buffers"].get(_OP_KEY)
    if device is None:
        held = [t for t in (old, *d["_parameters"].values(), *d["_buffers"].values()) if t is not None and not t.is_meta]
        device = held[0].device if held else "cpu"
    d["_buffers"][_OP_KEY] = _new_key(d["_op_number"], device, d.get("_op_generation", 0))
    _remember(layer)


def _keyed_on(layer: Any, weight: torch.Tensor) -> Any:
    """``layer`` with its key where the weight it was made from is (a layer made from a CUDA
    model's weight is called on CUDA tensors: a host key would keep its graphs off CUDA graphs)."""
    if not weight.is_meta and weight.device != layer._buffers[_OP_KEY].device:
        _rekey(layer, weight.device)
    return layer


def _remember(layer: Any) -> None:
    """Files ``layer`` under its key's present address."""
    k = _key_of(layer)
    if k is not None:

        def drop(ref: weakref.ref, k: tuple[str, int] = k) -> None:
            if _BY_ADDRESS.get(k) is ref:  # (not a later entry at the same address)
                del _BY_ADDRESS[k]

        _BY_ADDRESS[k] = weakref.ref(layer, drop)


def _address(key: torch.Tensor | None) -> tuple[str, int] | None:
    return None if key is None or key.is_meta else (str(key.device), key.data_ptr())


def _key_of(layer: Any) -> tuple[str, int] | None:
    return _address(layer.__dict__.get("_buffers", {}).get(_OP_KEY))


def _layer_of(key: torch.Tensor) -> Any:
    """The live layer whose key ``key`` is (by address), or holds the number of (a copy)."""
    k = _address(key)
    ref = _BY_ADDRESS.get(k)
    layer = None if ref is None else ref()
    if layer is not None and _key_of(layer) == k:
        return layer
    copy = key.numel() == 1 and key.dtype == torch.int64 and not key.is_meta
    if copy and key.is_cuda and torch.cuda.is_current_stream_capturing():
        raise _native.InvalidInputError(
            "a copy of a hypercodec layer's key met while capturing a CUDA graph (naming its layer "
            "would read the device): pass the layer's own key (torch._dynamo.mark_static_address)"
        )
    ref = _BY_NUMBER.get(int(key.reshape(-1)[0])) if copy else None
    layer = None if ref is None else ref()
    if layer is None:
        raise _native.InvalidInputError(
            "no hypercodec layer in this process holds this key (a compiled graph outlived its "
            "layer, or an exported program was loaded elsewhere: such a program names layers, "
            "it does not hold them)"
        )
    if _key_of(layer) == k:  # the layer's own key, moved: found by its address from now on
        _remember(layer)
    return layer


# ``meta`` of the operators: what the fake forms compute the output from.
_LINEAR, _CONV = 0, 1
_PAD_MODES = ("same", "valid")


def _fake_forward(x: torch.Tensor, meta: list[int]) -> torch.Tensor:
    if meta[0] == _LINEAR:  # [_LINEAR, out_features]
        return x.new_empty((*x.shape[:-1], meta[1]))
    # [_CONV, *weight_shape, *stride, *dilation, groups, pointwise, pad_mode (-1: numeric), *padding,
    #  bias added outside the operator]
    _, oc, icg, kh, kw, sh, sw, dh, dw, groups, pointwise, mode, ph, pw, _ = meta
    padding: Any = _PAD_MODES[mode] if mode >= 0 else (ph, pw)
    y = nn.functional.conv2d(x, x.new_empty((oc, icg, kh, kw)), None, (sh, sw), padding, (dh, dw), groups)
    return y.contiguous(memory_format=_pointwise_format(x)) if pointwise and x.shape[1] > 0 else y  # (as _pointwise_forward)


def _pointwise_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format of a stored 1×1 convolution's output for the input ``x``: the input's,
    as ``nn.Conv2d`` keeps it (channels_last where ``x`` is so and not also plain contiguous)."""
    cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if cl else torch.contiguous_format


_custom_op = getattr(torch.library, "custom_op", None)  # torch >= 2.4
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
if _custom_op is not None:

    def _checked(layer: Any, meta: Any, what: Any) -> Any:
        if meta != what:  # (a graph's fake outputs were shaped by `meta`)
            raise _native.InvalidInputError(f"this key names a layer of {what}, not {meta}")
        return layer

    @_custom_op("hypercodec::stored_forward", mutates_args=())
    def _stored_forward_op(x: torch.Tensor, key: torch.Tensor, meta: list[int]) -> torch.Tensor:
        layer = _layer_of(key)
        return _checked(layer, list(meta), layer._op_meta())._op_forward(x)

    @_stored_forward_op.register_fake
    def _(x: torch.Tensor, key: torch.Tensor, meta: list[int]) -> torch.Tensor:
        _install_grouping()  # (runs while a graph with stored layers is traced)
        return _fake_forward(x, meta)

    # Linear layers that read one input, as inductor's post-grad pass groups them (see
    # `_group_stored_linears`): `outs` holds each layer's out_features.
    @_custom_op("hypercodec::stored_forward_group", mutates_args=())
    def _stored_forward_group_op(x: torch.Tensor, keys: list[torch.Tensor], outs: list[int]) -> list[torch.Tensor]:
        if len(keys) != len(outs):
            raise _native.InvalidInputError(f"{len(keys)} keys for {len(outs)} layers")
        layers = [_layer_of(k) for k in keys]
        for layer, out in zip(layers, outs):
            _checked(layer, [_LINEAR, out], layer._op_meta())
        return _grouped_forward(x, layers)

    @_stored_forward_group_op.register_fake
    def _(x: torch.Tensor, keys: list[torch.Tensor], outs: list[int]) -> list[torch.Tensor]:
        return [_fake_forward(x, [_LINEAR, out]) for out in outs]

    @_custom_op("hypercodec::stored_input_grad", mutates_args=())
    def _stored_input_grad_op(gy: torch.Tensor, key: torch.Tensor, x_shape: list[int]) -> torch.Tensor:
        return _layer_of(key)._op_backward(gy, tuple(x_shape)).to(gy.dtype).contiguous()

    @_stored_input_grad_op.register_fake
    def _(gy: torch.Tensor, key: torch.Tensor, x_shape: list[int]) -> torch.Tensor:
        return gy.new_empty(x_shape)

    def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, key, _meta = inputs
        ctx.save_for_backward(key)
        ctx.x_shape, ctx.x_dtype = list(x.shape), x.dtype

    def _op_backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, None, None]:
        (key,) = ctx.saved_tensors
        gx = torch.ops.hypercodec.stored_input_grad(gy.contiguous(), key, ctx.x_shape)
        return gx.to(ctx.x_dtype), None, None

    _stored_forward_op.register_autograd(_op_backward, setup_context=_op_setup)

    # An embedding reads its ids on the host: a CUDA graph cannot hold that (torch.compile's
    # reduce-overhead leaves a step with one out of its graphs, where torch knows the tag).
    _unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
    try:
        _lookup = _custom_op("hypercodec::stored_lookup", mutates_args=(), tags=() if _unsafe is None else (_unsafe,))
    except TypeError:  # a torch without tags here
        _lookup = _custom_op("hypercodec::stored_lookup", mutates_args=())

    @_lookup
    def _stored_lookup_op(ids: torch.Tensor, key: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
        layer = _layer_of(key)
        return _checked(layer, (dim, dtype), (layer.embedding_dim, layer.dtype))._op_forward(ids)

    @_stored_lookup_op.register_fake
    def _(ids: torch.Tensor, key: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return ids.new_empty((*ids.shape, dim), dtype=dtype)


def _grouped_forward(x: torch.Tensor, layers: list[Any]) -> list[torch.Tensor]:
    """Each linear layer's output for ``x``: on CUDA with fewer launches where
    :func:`hypercodec.cuda.forward_group` takes the layers (affine ones at batch 1 in one launch;
    E8 and trellis ones with one activation RHT; kernels side by side on streams of their own;
    the same outputs bit for bit but where short affine layers run the GEMM together), else one by one."""
    if x.is_cuda and all(_w8a8_ready(layer, x) is None for layer in layers):
        from .cuda import forward_group

        ys = forward_group([_on_device(layer, x.device) for layer in layers], x)
        if ys is not None:
            return ys
    return [layer._op_forward(x) for layer in layers]


# Grouped launches under torch.compile. At batch 1 a launch of a 4096-wide layer costs a few µs
# beyond its bytes and leaves much of the GPU idle, so the projections of one input (a Llama
# block's q, k and v; gate and up) run faster as one launch, or side by side on streams. Models
# call them one by one, so a post-grad pass of inductor's
# (``torch._inductor.config.post_grad_custom_post_pass``) replaces the ``stored_forward`` calls
# of linear layers that read one node by one ``stored_forward_group`` call. It is installed the
# first time a graph with stored layers is traced, unless that setting holds another pass (a
# user's: then nothing is grouped) or :func:`set_compile_grouping` turned it off.
_GROUPING = {"on": True, "pass": None}


def set_compile_grouping(enabled: bool) -> None:
    """Whether ``torch.compile`` (inductor) runs stored linear layers that read one input
    together (on by default; the outputs are the same bit for bit, but for short affine layers
    at 17–64 rows, which run the GEMM there and decode alone: :func:`hypercodec.cuda.forward_group`):
    affine layers in one launch at batch 1 and their fused kernels side by side on streams of
    their own at more rows (the layers that decode at that batch beside them), E8 and trellis layers
    after one activation RHT with their kernels side by side on streams
    (:func:`hypercodec.cuda.forward_group`). Takes effect for graphs compiled from then on."""
    _GROUPING["on"] = bool(enabled)
    if not enabled and _GROUPING["pass"] is not None:
        from torch._inductor import config

        if config.post_grad_custom_post_pass is _GROUPING["pass"]:
            config.post_grad_custom_post_pass = None


def _install_grouping() -> None:
    if not _GROUPING["on"]:
        return
    try:
        from torch._inductor import config
        from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
    except ImportError:  # a torch without custom passes
        _GROUPING["on"] = False
        return
    if _GROUPING["pass"] is None:

        class _GroupStoredLinears(CustomGraphPass):
            def __call__(self, graph: torch.fx.Graph) -> None:
                _group_stored_linears(graph)

            def uuid(self) -> Any:
                return get_hash_for_files((__file__,))

        _GROUPING["pass"] = _GroupStoredLinears()
    if getattr(config, "post_grad_custom_post_pass", _GROUPING) is None:
        config.post_grad_custom_post_pass = _GROUPING["pass"]


def _group_stored_linears(graph: torch.fx.Graph) -> int:
    """Replaces the ``stored_forward`` calls of linear layers that read one node by
    ``stored_forward_group`` calls of up to :data:`hypercodec.cuda.GROUP_MAX` layers, placed
    where the first of them was; returns the groups made."""
    import operator

    from .cuda import GROUP_MAX

    one = torch.ops.hypercodec.stored_forward.default
    group = torch.ops.hypercodec.stored_forward_group.default
    order = {n: i for i, n in enumerate(graph.nodes)}
    by_input: dict[Any, list[Any]] = {}
    for n in graph.nodes:
        if n.op != "call_function" or n.target is not one or n.kwargs or len(n.args) != 3:
            continue
        meta = n.args[2]
        if isinstance(meta, (list, tuple)) and len(meta) == 2 and meta[0] == _LINEAR and "val" in n.meta:
            by_input.setdefault(n.args[0], []).append(n)
    made = 0
    for nodes in by_input.values():
        for i in range(0, len(nodes) - 1, GROUP_MAX):
            part = nodes[i : i + GROUP_MAX]
            first = part[0]
            # (The input as it is now: an earlier group may have replaced the node that made it.)
            x = first.args[0]
            # Every key must exist where the group goes (they are graph inputs).
            if len(part) < 2 or any(not isinstance(n.args[1], torch.fx.Node) or order[n.args[1]] > order[first] for n in part):
                continue
            with graph.inserting_before(first):
                g = graph.call_function(group, (x, [n.args[1] for n in part], [int(n.args[2][1]) for n in part]))
                g.meta["val"] = [n.meta["val"] for n in part]
                for j, n in enumerate(part):
                    item = graph.call_function(operator.getitem, (g, j))
                    item.meta.update(n.meta)
                    n.replace_all_uses_with(item)
            for n in part:
                graph.erase_node(n)
            made += 1
    return made


#: ``HyperLinear._training_weight`` under ``torch.compiler.disable`` (torch ≥ 2.2), made when a
#: trainable layer is (``torch.compiler.disable`` imports dynamo: 2 s that inference skips).
_TRAINING_WEIGHT: Callable | None = None


def _untraced_training_weight() -> None:
    global _TRAINING_WEIGHT
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if _TRAINING_WEIGHT is None and disable is not None:
        _TRAINING_WEIGHT = disable(HyperLinear._training_weight)


def _exporting() -> bool:
    """True while ``torch.export`` traces (strict or not)."""
    is_exporting = getattr(getattr(torch, "compiler", None), "is_exporting", None)
    return is_exporting is not None and is_exporting()


def _traced() -> bool:
    """True while torch.compile, ``torch.jit.trace`` or ``torch.fx.symbolic_trace``
    (:func:`_fx_traced`) traces a stored layer's forward (which then calls :func:`_as_op`, so
    that the graph holds the operator; ``torch.jit.trace`` otherwise recorded the eager path's
    native call as a constant: the first input's output)."""
    if _custom_op is None:
        return False
    return (_is_compiling is not None and _is_compiling()) or torch.jit.is_tracing() or _fx_traced()


def _as_op(layer: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.hypercodec.stored_forward(x, getattr(layer, _OP_KEY), layer._op_meta())


_FX_SYMBOLIC = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None) or getattr(
    torch.fx._symbolic_trace, "is_fx_tracing", None
)


def _fx_traced() -> bool:
    """True while ``torch.fx.symbolic_trace`` (or a tracer built on it: transformers',
    ``torch.ao``'s) traces a stored layer's forward. The layer then records its operator as
    torch.compile does, with its input's checks as functions of the graph (:func:`_autocast`,
    :func:`_conv_input`, :func:`_conv_output`, :func:`_embedding_ids`, which torch.fx keeps as
    calls), since a traced input cannot steer Python's control flow."""
    return _custom_op is not None and _FX_SYMBOLIC is not None and _FX_SYMBOLIC()


def _conv_input(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``x`` as a batch of images: one unbatched image ``(C, H, W)`` gets a batch of one, as
    ``nn.Conv2d`` takes it; any other shape than ``(N, C, H, W)`` is refused."""
    batch = x.unsqueeze(0) if x.dim() == 3 else x
    if batch.dim() != 4 or batch.shape[1] != channels:
        raise _native.InvalidInputError(
            f"HyperConv2d takes (N, {channels}, H, W) or ({channels}, H, W) inputs, not {tuple(x.shape)}"
        )
    return batch


def _conv_output(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` without the batch :func:`_conv_input` gave an unbatched input ``x``."""
    return y.squeeze(0) if x.dim() == 3 else y


def _embedding_ids(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` as a lookup takes them: int64 or int32, as ``nn.Embedding`` (a bool mask or a
    float tensor is refused: a bool one was looked up as rows 0 and 1)."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise _native.InvalidInputError(f"embedding ids must be integers, int64 or int32 (as nn.Embedding takes), got {ids.dtype}")
    return ids


def _signal_input(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``x`` (``(N, C, L)`` or ``(C, L)``, as ``nn.Conv1d`` takes it) as images of height 1;
    any other shape is refused."""
    if x.dim() not in (2, 3) or x.shape[-2] != channels:
        raise _native.InvalidInputError(
            f"HyperConv1d takes (N, {channels}, L) or ({channels}, L) inputs, not {tuple(x.shape)}"
        )
    return x.unsqueeze(-2)


def _signal_output(y: torch.Tensor) -> torch.Tensor:
    """``y`` without the height :func:`_signal_input` gave it, contiguous as ``nn.Conv1d``'s
    (a transposed ``(N, L, C)`` input, as Conformer and Mamba pass one, is channels-last at
    height 1, and so was the output: a later ``.view`` failed)."""
    return y.squeeze(-2).contiguous()


for _name in ("_autocast", "_conv_input", "_conv_output", "_embedding_ids", "_signal_input", "_signal_output"):
    torch.fx.wrap(_name)  # (called by name from this module's forwards: calls of the traced graph)
del _name


def _decoded(layer: Any, device: torch.device) -> torch.Tensor:
    """``layer.op``'s weight as a float32 ``rows × cols`` matrix on ``device`` (for a backward
    pass: decoded on the host, not kept)."""
    return _op_weight(layer.op).reshape(layer.op.rows, layer.op.cols).to(device)


_BUILDER: Any = None  # the thread that makes lasting device tensors (see _lasting)
_BUILD_STREAMS: dict[int, Any] = {}
_BUILDER_LOCK = threading.Lock()


def _lasting(device: torch.device, make: Callable[[], Any]) -> Any:
    """``make()``, whose device tensors outlive the call (a layer's device form, a weight
    decoded and kept), made outside any private memory pool of the caller's: torch.compile's
    CUDA graph trees send a thread's allocations to a graph's pool while they warm the graph up,
    and refuse to record one from which a tensor outlives the step ("tensors in the cudagraph pool
    not tracked as outputs"). ``make`` runs on a thread and stream of its own, after the work so
    far on the caller's stream, which then waits for it (no host synchronization)."""
    global _BUILDER
    if device.type != "cuda" or threading.current_thread().name.startswith("hypercodec-device"):
        return make()  # (on the host, or already on the worker)
    index = device.index if device.index is not None else torch.cuda.current_device()
    caller = torch.cuda.current_stream(index)
    # While torch captures a CUDA graph (a recording again after new weights, which may follow
    # no warm-up), the caller's stream cannot be waited on or wait: the worker orders nothing
    # against it and the host waits for the worker's stream instead (torch captures in
    # thread-local mode, which lets another thread do so).
    capturing = torch.cuda.is_current_stream_capturing()

    def run() -> tuple[Any, Any]:
        stream = _BUILD_STREAMS.get(index)
        if stream is None:
            stream = _BUILD_STREAMS[index] = torch.cuda.Stream(index)
        if not capturing:
            stream.wait_stream(caller)
        with torch.cuda.device(index), torch.cuda.stream(stream):
            out = make()
            done = torch.cuda.Event()
            done.record(stream)
        if capturing:
            stream.synchronize()
        return out, done

    with _BUILDER_LOCK:
        if _BUILDER is None:
            from concurrent.futures import ThreadPoolExecutor

            _BUILDER = ThreadPoolExecutor(1, thread_name_prefix="hypercodec-device")
    out, done = _BUILDER.submit(run).result()
    if not capturing:
        caller.wait_event(done)
    return out


def _on_device(layer: Any, device: torch.device) -> Any:
    """``layer.op``'s :class:`hypercodec.cuda.DeviceLinear` on ``device`` (built once; dropped
    when the operator changes)."""
    cache = layer.__dict__.get("_device_forms")
    hit = None if cache is None else cache.get(device)
    if hit is None or hit[0] is not layer.op:
        from .cuda import DeviceLinear

        op = layer.op
        hit = layer.__dict__.setdefault("_device_forms", {})[device] = (op, _lasting(device, lambda: DeviceLinear(op, device)))
    return hit[1]


def _wht_tiles(v: torch.Tensor, tile: int) -> torch.Tensor:
    """The normalized Walsh–Hadamard transform of each ``tile`` of the rows of ``v`` (``m ×
    cols``, cols a multiple of ``tile``; its own inverse)."""
    m, cols = v.shape
    u = v.reshape(m, cols // tile, tile)
    h = 1
    while h < tile:
        u = u.reshape(m, cols // tile, tile // (2 * h), 2, h)
        a, b = u[..., 0, :], u[..., 1, :]
        u = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return u.reshape(m, cols) * (tile**-0.5)


_SIGNS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _rht_signs(seed: int, n: int, device: torch.device) -> torch.Tensor:
    """The RHT's ±1 of positions 0..n for ``seed`` (:func:`hypercodec._native.rht_signs`, the
    format's rule), float32 on ``device``; kept per (seed, n, device)."""
    key = (seed, n, device)
    hit = _SIGNS.get(key)
    if hit is None:
        hit = _SIGNS[key] = _lasting(device, lambda: torch.from_numpy(_native.rht_signs(seed, n)).to(device))
    return hit


def _rht(v: torch.Tensor, tile: int, seed: int) -> torch.Tensor:
    """``RHT`` of the float32 rows of ``v``: the signs of ``seed``, then each tile's normalized
    Walsh–Hadamard transform (the lattice codecs' rotation)."""
    return _wht_tiles(v * _rht_signs(seed, v.shape[1], v.device), tile)


#: Rows of the int8 GEMM on CUDA (cuBLASLt's, through ``torch._int_mm``, takes more than 16):
#: smaller batches are padded with zero rows.
W8A8_MIN_BATCH_CUDA = 17
#: The largest magnitude of E4M3 (``torch.float8_e4m3fn``): FP8 activations are scaled per
#: token to it; integer weights of magnitude up to 16 are exact in it.
FP8_MAX = 448.0
#: The group length whose scales the FP8 GEMM applies on CUDA (cuBLASLt's 1×128 block scales,
#: ``torch._scaled_mm`` on compute capability 9.0 with CUDA 12.9 or later): group-scaled codes
#: with other groups stay weight-only there.
FP8_BLOCK = 128
#: CUDA devices where ``torch._scaled_mm`` refused 1×128 block scales (found on first use).
_NO_FP8_BLOCKS: set[torch.device] = set()
#: Activation rows (padded to 16) up to which row-scaled FP8 layers whose columns are whole
#: runs of :data:`FP8_BLOCK` scale their activations per token and run (as group-scaled ones
#: do), their row scales repeated per run, so that CUDA devices of compute capability 9.x take
#: cuBLASLt's block-scaled FP8 GEMM: on an H200 it ran in 0.50-0.99 of the row-scaled GEMM's
#: time at 16-96 rows (4096², 8192², 14336×4096, 4096×14336, 28672×8192), which is up to 12 %
#: faster at 112-128 rows and 1.1-1.3× faster at 256 (``docs/eval/w8a8.md``). The host
#: computes the products a device of compute capability 9.x does (others scale per token).
FP8_BLOCK_MAX_ROWS = 96
#: Activation rows up to which affine codes of at most 5 bits keep their weight-only kernels on
#: CUDA when activations are quantized (the tensor-core kernels run up to 16 rows at 1.5-2×
#: bf16, ``docs/eval/cuda.md``).
LOWBIT_GEMV_BATCH = 16
#: Weights a layer needs before FP8 activations run on CUDA (smaller layers stay weight-only):
#: 2^25 takes a Llama-8B MLP's 14336×4096 and 4096×14336 layers, where FP8 ran 0.78-1.53×
#: bf16 at 64-1024 rows on an H200 against 0.46-0.80× weight-only (int4, int4-row;
#: ``py/benches/cuda_w8a8.py``, docs/eval/w8a8.md). With the quantization kernels of
#: 2026-12-04 FP8 also beat weight-only on 4096² (0.51-1.23× against 0.38-0.78×), but Z1
#: layers there, whose weight-only route is a bf16 copy, were not timed.
FP8_MIN_WEIGHTS = 1 << 25
#: Activation rows up to which fixed-rate E8 layers keep their GEMV on CUDA when activations
#: are quantized (an H200 ran it at 0.67-1.37× bf16 at one row, FP8 at 0.47-1.06×; at two rows
#: FP8 won, ``docs/eval/w8a8.md``). Other lattice forms take the quantized route at every
#: batch: Z1 and CPU-shaped entropy-coded E8, whose weight-only route is a dense copy, and E8 in
#: GPU-shaped rANS chunks, whose GEMV ran 0.07-0.14× against W8A8's 0.46-1.13× at one row.
LATTICE_GEMV_BATCH = 1
#: Activation rows up to which trellis layers keep their own kernels on CUDA when FP8
#: activations run against their rounded weight (``quantize_activations(..., round_weights=True)``):
#: none, since on an H200 the FP8 route ran faster from one row (``tcq@2``: 1.31-1.37× bf16 on
#: 8192², 1.63-1.67× on 28672×8192 at 1-16 rows, against the trellis kernels' 0.91-1.34×;
#: ``docs/eval/w8a8.md``). A knob for devices where it does not.
TRELLIS_GEMV_BATCH = 0
#: Activation rows up to which affine int8 layers keep their weight-only GEMV on CUDA when
#: W8A8 is on (``py/benches/cuda_w8a8.py`` on an H200, 8192²: the GEMV at 1.59× bf16 for one
#: row and 0.64× for four, W8A8 at 0.83–0.87× for either; at 16 rows 0.38× against 0.80×).
W8A8_GEMV_BATCH = 2


class _W8A8:
    """A layer's integer weight and per-row (or, for ``fp8``, per-group) scales for quantized
    activations (see :func:`quantize_activations`), on one device: ``w`` is ``rows × cols``
    int8 (or its exact, or with ``round_weights`` rounded, E4M3 copy for ``fp8``; on the host
    float32, times the group scales for group-scaled forms), ``scales`` float32 (``rows``, or ``rows ×
    groups`` of ``glen`` columns: column-major on CUDA, as cuBLASLt's block-scaled FP8 GEMM
    reads them), ``offsets`` the group offsets of asymmetric codes (``groups × rows``: float32
    on the host, bf16 on CUDA) or None, ``tile`` the RHT tile of a lattice form (0: none)."""

    def __init__(self, op: _native.Linear, form: _Int8Form, device: torch.device, fp8: bool = False) -> None:
        q, scales, self.tile, self.seed, self.glen, offsets = form
        self.fp8 = fp8
        self.grouped = scales.ndim == 2
        # Integers of magnitude <= 16 (or values already rounded to E4M3): exact in E4M3. Cast
        # on the host, so that the device never holds a wider copy.
        w = torch.from_numpy(q)
        self.w = (w.to(torch.float32 if device.type == "cpu" else torch.float8_e4m3fn) if fp8 else w).to(device)
        self.scales = torch.from_numpy(scales).to(device)
        if self.grouped and device.type == "cuda":
            self.scales = torch.empty(scales.shape[1], scales.shape[0], dtype=torch.float32, device=device).t().copy_(
                self.scales)
        if self.grouped and fp8 and device.type == "cpu":
            # The host sums the products of the scaled values: the weight times its group scales,
            # made once (float32, as the per-row form's copy).
            rows, cols = self.w.shape
            self.w = (self.w.reshape(rows, -1, self.glen) * self.scales[:, :, None]).reshape(rows, cols)
        self._block_scales: torch.Tensor | None = None  # row scales per run (CUDA, made on first use)
        self._no_runs = False  # the block-scaled GEMM failed for this row-scaled layer
        self._sm90 = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
        self.offsets = None
        if offsets is not None:
            o = torch.from_numpy(offsets.reshape(offsets.shape[0], -1).T.copy()).to(device)
            self.offsets = o if device.type == "cpu" else o.to(torch.bfloat16)
        bias = op.bias
        self.bias = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32)).to(device)
        self._bias16: torch.Tensor | None = None  # the FP8 GEMM's bias (bf16, made on first use)
        self.op = op

    def forward(self, x2: torch.Tensor) -> torch.Tensor | None:
        """``y`` (``m × rows``, ``x2``'s dtype) for activations ``x2`` (``m × cols``), or None
        where the device turns out to lack the block-scaled FP8 GEMM (the caller then runs the
        layer weight-only): each row
        rotated (lattice forms) and scaled by its absolute maximum to int8, one int8 GEMM with int32 sums,
        then both scales (on CUDA: the RHT kernel, :func:`hc_quant_i8 <hypercodec.cuda>`,
        ``torch._int_mm`` on at least 17 rows, zero rows padding smaller batches, and one
        epilogue kernel). ``fp8``: each row scaled to ±:data:`FP8_MAX` and rounded to E4M3, the
        products summed in f32 (CUDA: ``torch._scaled_mm`` with both scales per row and the
        bias in bf16, a bf16 result; the host computes the same products in f32). With group
        scales each run of ``glen`` columns of a row has its own activation scale (CUDA: 1×128
        block scales on both sides of ``torch._scaled_mm``); with offsets, each run's sum of the
        activations (unrounded) times them is added (CUDA: one bf16 ``addmm_`` of the sums
        against the offsets). Row-scaled layers whose columns are whole runs of
        :data:`FP8_BLOCK` scale each run of a token too at up to :data:`FP8_BLOCK_MAX_ROWS`
        rows (CUDA: the block-scaled GEMM, their row scales repeated per run; on devices without
        it, other than compute capability 9.x, a scale per token, so the host matches 9.x)."""
        if self.fp8:
            return self._fp8(x2)
        if not x2.is_cuda:
            xr = x2.to(torch.float32)
            xr = _rht(xr, self.tile, self.seed) if self.tile else xr
            step = xr.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127.0
            xq = torch.round(xr / step).clamp_(-127, 127).to(torch.int8)
            y = torch._int_mm(xq, self.w.t()).to(torch.float32) * step * self.scales
            return (y if self.bias is None else y + self.bias).to(x2.dtype)
        from . import cuda as hcuda

        k = hcuda.kernels(x2.device)
        stream = torch.cuda.current_stream(x2.device).cuda_stream
        dt = x2.dtype if x2.dtype in hcuda._DTYPES else torch.float32
        xs = x2.to(dt).contiguous()
        m, cols = xs.shape
        if self.tile:
            xs = hcuda.rht(xs, cols, self.tile, self.seed)
        padded = max(m, W8A8_MIN_BATCH_CUDA)
        xq = torch.zeros(padded, cols, dtype=torch.int8, device=xs.device) if padded > m else torch.empty(
            m, cols, dtype=torch.int8, device=xs.device)
        step = torch.empty(m, dtype=torch.float32, device=xs.device)
        k.quant_i8({"x": xs.data_ptr(), "x_dtype": hcuda._DTYPES[xs.dtype], "q": xq.data_ptr(),
                    "step": step.data_ptr(), "rows": m, "cols": cols}, stream)
        acc = torch._int_mm(xq, self.w.t())
        y = torch.empty(m, self.w.shape[0], dtype=dt, device=xs.device)
        k.w8a8_out({"acc": acc.data_ptr(), "step": step.data_ptr(), "scales": self.scales.data_ptr(),
                    "bias": 0 if self.bias is None else self.bias.data_ptr(), "y": y.data_ptr(),
                    "y_dtype": hcuda._DTYPES[dt], "rows": m, "cols": self.w.shape[0]}, stream)
        return y.to(x2.dtype)

    def _row_runs(self, m: int) -> bool:
        """Whether a row-scaled layer scales ``m`` activation rows per token and run of
        :data:`FP8_BLOCK` columns (:data:`FP8_BLOCK_MAX_ROWS`; on CUDA also only where the
        block-scaled GEMM runs, compute capability 9.x)."""
        return (not self.grouped and -(-m // 16) * 16 <= FP8_BLOCK_MAX_ROWS
                and self.w.shape[1] % FP8_BLOCK == 0)

    def _fp8(self, x2: torch.Tensor) -> torch.Tensor | None:
        m = x2.shape[0]
        if not x2.is_cuda:
            xr = x2.to(torch.float32)
            xr = _rht(xr, self.tile, self.seed) if self.tile else xr
            if self.grouped or self._row_runs(m):
                # A step per run of glen columns, products of the scaled values summed in f32.
                cols = self.w.shape[1]
                glen = self.glen if self.grouped else FP8_BLOCK
                g = cols // glen
                xb = xr.reshape(m, g, glen)
                step = xb.abs().amax(dim=2, keepdim=True).clamp_min(1e-30) / FP8_MAX
                xq = (xb / step).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
                xd = (xq.to(torch.float32) * step).reshape(m, cols)
                y = xd @ self.w.t()  # group scales are in it (__init__), row scales not
                if not self.grouped:
                    y = y * self.scales
                if self.offsets is not None:
                    y = y + (xb.sum(2) if self.grouped else xr.sum(1, keepdim=True)) @ self.offsets
                return (y if self.bias is None else y + self.bias).to(x2.dtype)
            step = xr.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / FP8_MAX
            xq = (xr / step).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            y = (xq.to(torch.float32) @ self.w.t()) * step * self.scales
            if self.offsets is not None:
                y = y + xr.sum(1, keepdim=True) @ self.offsets
            return (y if self.bias is None else y + self.bias).to(x2.dtype)
        if m == 0:
            return torch.zeros(0, self.w.shape[0], dtype=x2.dtype, device=x2.device)
        from . import cuda as hcuda

        # The FP8 GEMM takes rows in multiples of 16: hc_quant_f8 scales and rounds each row
        # (one launch) and writes the padding rows as zeros with step 1.
        dt = x2.dtype if x2.dtype in hcuda._DTYPES else torch.float32
        xr = x2.to(dt).contiguous()
        cols = xr.shape[1]
        if self.tile:
            xr = hcuda.rht(xr, cols, self.tile, self.seed)
        pm = -(-m // 16) * 16
        # Row-scaled layers take the block-scaled GEMM too at few rows (their row scales
        # repeated per run), where the device has it.
        runs = self._row_runs(m) and self._sm90 and xr.device not in _NO_FP8_BLOCKS and not self._no_runs
        blocked = self.grouped or runs
        glen = self.glen if self.grouped else FP8_BLOCK
        xq = torch.empty(pm, cols, dtype=torch.float8_e4m3fn, device=xr.device)
        # Block scales column-major (pm × groups, strides 1 and pm), as cuBLASLt reads them.
        step = (torch.empty(cols // glen, pm, dtype=torch.float32, device=xr.device).t() if blocked
                else torch.empty(pm, 1, dtype=torch.float32, device=xr.device))
        sums = None if self.offsets is None else torch.empty(pm, cols // self.glen, dtype=torch.float32, device=xr.device)
        args = {"x": xr.data_ptr(), "x_dtype": hcuda._DTYPES[xr.dtype], "q": xq.data_ptr(), "step": step.data_ptr(),
                "rows": m, "padded_rows": pm, "cols": cols, "block": glen if blocked else 0}
        if sums is not None:
            args["sums"] = sums.data_ptr()
        hcuda.kernels(xr.device).quant_f8(args, torch.cuda.current_stream(xr.device).cuda_stream)
        if self._bias16 is None and self.bias is not None:
            self._bias16 = self.bias.to(torch.bfloat16)
        if blocked:
            if runs and self._block_scales is None:
                g = cols // FP8_BLOCK
                self._block_scales = torch.empty(g, self.scales.shape[0], dtype=torch.float32, device=xr.device).t()
                self._block_scales.copy_(self.scales[:, None].expand(-1, g))
            refused: RuntimeError | None = None
            try:
                y = torch._scaled_mm(xq, self.w.t(), scale_a=step,
                                     scale_b=(self._block_scales if runs else self.scales).t(), out_dtype=torch.bfloat16)
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError as e:
                refused = e
            if refused is not None:
                # A torch or cuBLASLt without 1×128 block scales: a row-scaled layer takes a
                # scale per token from now on; a group-scaled one marks the device, which runs
                # such layers weight-only from now on (the caller reruns this call so).
                if runs:
                    self._no_runs = True
                    self._block_scales = None
                    warnings.warn(f"FP8 with 1x128 block scales failed on {xr.device} ({refused}); this layer "
                                  "scales its activations per token", RuntimeWarning, stacklevel=4)
                    return self._fp8(x2)
                _NO_FP8_BLOCKS.add(xr.device)
                warnings.warn(f"FP8 with 1x128 block scales is not available on {xr.device} ({refused}); "
                              "group-scaled layers run weight-only there", RuntimeWarning, stacklevel=4)
                return None
            if sums is not None:
                y.addmm_(sums.to(torch.bfloat16), self.offsets)
            if self._bias16 is not None:
                y += self._bias16
        else:
            y = torch._scaled_mm(xq, self.w.t(), scale_a=step, scale_b=self.scales.view(1, -1), bias=self._bias16,
                                 out_dtype=torch.bfloat16)
        return (y if m % 16 == 0 else y[:m]).to(x2.dtype)


_Int8Form = tuple[np.ndarray, np.ndarray, int, int, int, "np.ndarray | None"]


def _int8_form(op: _native.Linear) -> _Int8Form | None:
    """``(int8 weight rows × cols, float32 scales, RHT tile, seed, group length, offsets)``
    when the stored form is an integer matrix times a scale per row or per group, plus an offset
    where the codes are asymmetric (:meth:`hypercodec.Linear.int8_weight`: affine codes per row,
    group or tensor, ``int8-row``, ``int4-row``, ``int4``, …; lattice points, ``z1-fixed4``,
    ``e8-fixed4``, ``e8@4``, …, in their RHT domain): the scales (and offsets, else ``None``)
    are ``rows`` values, or ``rows × groups`` for group scales (whole groups only: a shorter
    last group has no form here). Otherwise ``None``."""
    w = op.int8_weight()
    if w is None:
        return None
    glen = int(w["group_len"])
    if w["scales"].ndim == 2 and op.cols % glen:
        return None
    return w["values"], w["scales"], int(w["tile"]), int(w["seed"]), glen, w.get("offsets")


def _rounded_form(op: _native.Linear) -> _Int8Form:
    """The decoded weight rounded to E4M3 with a scale per row (its largest magnitude over
    :data:`FP8_MAX`), as an :func:`_int8_form` whose values are float32 on E4M3's grid: the
    weight of ``quantize_activations(..., round_weights=True)`` for forms without an exact one."""
    w = _op_weight(op).reshape(op.rows, op.cols)
    s = w.abs().amax(dim=1) / FP8_MAX
    s = torch.where(s > 0, s, torch.ones_like(s))  # a row of zeros: any scale (no floor for tiny rows)
    q = (w / s[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return q.numpy(), s.numpy(), 0, 0, op.cols, None


def _span(form: _Int8Form) -> int:
    """The largest magnitude of an integer form's values (int8's −128 counted as 128)."""
    q = form[0]
    return max(int(q.max(initial=0)), -int(q.min(initial=0)))


def _route(op: _native.Linear, form: _Int8Form | None, mode: str | None, round_weights: bool) -> tuple[bool, bool]:
    """``(exact, rounded)``: whether activations quantized by ``mode`` multiply ``op``'s integer
    ``form`` as it is (int8: a scale per row and no offsets; FP8: magnitudes up to 16), or, with
    ``round_weights`` (FP8 only), its decoded weight rounded to E4M3 (a weight with elements)."""
    exact = form is not None and (
        (mode == "int8" and form[1].ndim == 1 and form[5] is None) or (mode == "fp8" and _span(form) <= 16))
    rounded = round_weights and mode == "fp8" and not exact and op.rows * op.cols > 0
    return exact, rounded


def _layer_summary(layer: Any) -> tuple[Any, ...]:
    """:func:`_form_summary` of the weight ``layer``'s quantized activations multiply: its exact
    form, or where ``round_weights`` was asked for FP8 and it has none that E4M3 holds, the
    rounded one (not decoded here)."""
    form = _int8_form(layer.op)
    _, rounded = _route(layer.op, form, getattr(layer, "activations", None), getattr(layer, "round_weights", False))
    return _form_summary(layer.op, form, rounded)


def _form_summary(op: _native.Linear, form: _Int8Form | None, rounded: bool = False) -> tuple[Any, ...]:
    """What :func:`_w8a8_ready` reads of a layer's integer form on every call, without its
    values: ``(op, RHT tile or None (no form), largest integer magnitude, group length (0: a
    scale per row), whether it has offsets, the CUDA kernels of the stored form
    (:meth:`hypercodec.Linear.device_kind`), whether the weight is the decoded one rounded to
    E4M3 (:func:`_rounded_form`: no RHT, a scale per row, no offsets; the span is then the
    stored integer form's, if any, which sets how long affine kernels keep the small batches))``."""
    if rounded:
        return (op, 0, 0 if form is None else _span(form), 0, False, op.device_kind(), True)
    if form is None:
        return (op, None, 0, 0, False, None, False)
    return (op, form[2], _span(form), 0 if form[1].ndim == 1 else form[4], form[5] is not None, op.device_kind(),
            False)


def _fp8_device(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` multiplies E4M3 on ``device`` (compute capability 8.9+)."""
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9))


def _w8a8_ready(layer: Any, x: torch.Tensor) -> "_W8A8 | None":
    """The layer's :class:`_W8A8` on ``x``'s device when quantized activations are on and this
    batch takes them."""
    # (Read from the instance's dict: a module's getattr of a missing name raises inside, at
    # about 2 µs of host time on every eager call.)
    mode = layer.__dict__.get("activations")
    if mode not in ("int8", "fp8"):
        return None
    fp8 = mode == "fp8"
    if x.is_cuda and (layer.op.cols % (16 if fp8 else 8) or layer.op.rows % (16 if fp8 else 8)):
        return None  # cuBLASLt's int8 GEMM takes multiples of 8, the FP8 one of 16
    if fp8 and (not _fp8_device(x.device) or (x.is_cuda and layer.op.rows * layer.op.cols < FP8_MIN_WEIGHTS)):
        return None
    known = layer.__dict__.get("_w8a8_form")
    if known is None or known[0] is not layer.op:
        # A weight loaded since the switch may have no integer form: weight-only then. The
        # values stay on the devices only.
        known = layer.__dict__["_w8a8_form"] = _layer_summary(layer)
    tile, span, glen, offsets, kernel, rounded = known[1:]
    if tile is None or (fp8 and span > 16 and not rounded) or (offsets and not fp8):
        return None
    # Group scales and offsets: FP8 only (the int8 GEMM has neither), and on CUDA only groups
    # of 128 (cuBLASLt's 1×128 block scales).
    if glen and (not fp8 or (x.is_cuda and (glen != FP8_BLOCK or torch.cuda.get_device_capability(x.device)[0] != 9
                                            or x.device in _NO_FP8_BLOCKS))):
        return None
    if offsets and not glen and x.is_cuda:
        return None  # per-row offsets: the row-scaled FP8 GEMM has no term for them
    # Affine codes have weight-only kernels of their own at small batches: up to 2 rows for
    # 8-bit codes, up to 16 on the tensor cores for the narrower ones; fixed-rate E8 up to
    # LATTICE_GEMV_BATCH, the trellis up to TRELLIS_GEMV_BATCH (E8 in rANS chunks decodes
    # slower than the quantized route at any batch).
    own = {"affine": W8A8_GEMV_BATCH if span > 16 else LOWBIT_GEMV_BATCH, "e8": LATTICE_GEMV_BATCH,
           "trellis": TRELLIS_GEMV_BATCH}.get(kernel, 0)
    if x.is_cuda and x.numel() // layer.op.cols <= own:
        return None
    cache = layer.__dict__.setdefault("_w8a8", {})
    hit = cache.get(x.device)
    if hit is None or hit.op is not layer.op or hit.fp8 != fp8:
        form = _rounded_form(layer.op) if rounded else _int8_form(layer.op)
        if form is None:
            return None
        op = layer.op
        hit = cache[x.device] = _lasting(x.device, lambda: _W8A8(op, form, x.device, fp8))
    return hit


def quantize_activations(model: nn.Module, mode: str | None = "int8", round_weights: bool = False) -> int:
    """Quantized activations: every :class:`HyperLinear` of ``model`` whose stored weight is an
    integer matrix with a scale per row (symmetric affine codes per row or tensor: ``int8-row``,
    ``int4-row``, …; the points of Z1, D4 and E8 tensors, fixed-rate or entropy-coded, in their
    RHT domain: ``z1-fixed8``, ``e8-fixed4``, ``e8@4``, …, E8's half-integer points doubled),
    or for ``"fp8"`` also per group and with offsets (group-scaled asymmetric codes: ``int4``,
    groups of 128), quantizes its activations too, per token by their absolute maximum (after
    the weight's RHT for lattice forms; for group scales, per token and group of columns):

    - ``"int8"`` (W8A8): to int8, multiplied in int8 with int32 sums (``torch._int_mm``:
      cuBLASLt's int8 tensor-core GEMM on CUDA, batches under :data:`W8A8_MIN_BATCH_CUDA` rows
      padded with zeros);
    - ``"fp8"``: to FP8 E4M3, against the weight's exact E4M3 copy (magnitudes up to 16: codes
      of up to 5 bits, E8 points of up to 4; other layers run weight-only), products summed in f32
      (``torch._scaled_mm`` with a scale per token and per weight row on CUDA devices of compute
      capability 8.9 or more, for layers of at least :data:`FP8_MIN_WEIGHTS` weights; group
      scales as 1×128 block scales on both sides, for groups of :data:`FP8_BLOCK` only and on
      compute capability 9.0 (cuBLASLt's block-scaled FP8 GEMM); elsewhere on CUDA the layer
      stays weight-only; row-scaled layers take that GEMM too, a scale per token and run of 128
      columns, at up to :data:`FP8_BLOCK_MAX_ROWS` rows, where it is faster; the host computes
      the same products in f32). With ``round_weights=True`` every other layer takes it too
      (trellis, entropy-coded E8 with points past ±16, codebooks, …): its decoded weight rounded
      to E4M3 with a scale per row, which adds E4M3's rounding error (3 mantissa bits: about
      29 dB below the weight) to the stored form's.

    On CUDA, affine layers keep their weight-only kernels up to :data:`W8A8_GEMV_BATCH` rows
    (8-bit codes) or :data:`LOWBIT_GEMV_BATCH` (narrower ones), fixed-rate E8 layers
    up to :data:`LATTICE_GEMV_BATCH`, trellis layers up to :data:`TRELLIS_GEMV_BATCH`.
    ``mode=None`` turns it off.
    Returns the number of layers switched on (0 for ``None``); every other layer is switched
    off (weight-only), so a call sets the whole model whatever earlier calls did. The
    accuracy cost is measured by ``py/benches/w8a8_accuracy.py``. Each switched layer holds its
    integer (or rounded E4M3) weight beside the stored form on every device it runs on: 1 byte
    per parameter on CUDA (a float32 copy, 4 bytes, on the host); row-scaled FP8 layers on
    compute capability 9.x also their row scales repeated per run of 128 columns (float32: 0.031
    bytes per parameter) once they run at few rows.

    A backward pass through a switched layer takes the weight-only input gradient (straight
    through the activations' rounding). The setting is not part of ``state_dict``: call this
    again after loading a model (before loading, it switches nothing), and before capturing
    the model in a CUDA graph (``torch.compile(mode="reduce-overhead")`` too): a captured graph
    replays the kernels it recorded. Needs torch ≥ 2.3 (CPU int8 GEMM); ``"fp8"`` needs
    ``torch.float8_e4m3fn`` (torch ≥ 2.1)."""
    if mode not in ("int8", "fp8", None):
        raise _native.InvalidInputError(f"activation quantization {mode!r}: use 'int8', 'fp8' or None")
    if round_weights and mode != "fp8":
        raise _native.InvalidInputError("round_weights applies to 'fp8' only")
    if mode is not None and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 3):
        raise _native.InvalidInputError(f"quantized activations need torch >= 2.3 (torch._int_mm); this is {torch.__version__}")
    n = 0
    for layer in model.modules():
        if isinstance(layer, HyperLinear) and layer.op is not None:
            form = None if mode is None else _int8_form(layer.op)
            exact, rounded = _route(layer.op, form, mode, round_weights)
            taken = exact or rounded
            # Every layer is set: the ones this mode takes on, the others off (weight-only).
            layer.activations = mode if taken else None
            layer.round_weights = round_weights and taken  # asked for: a weight loaded later may need it
            layer.__dict__.pop("_w8a8", None)
            layer.__dict__.pop("_w8a8_form", None)
            if taken:  # the summary kept (an entropy-coded form's points take a while to decode)
                layer.__dict__["_w8a8_form"] = _form_summary(layer.op, form, rounded)
            n += taken
    return n


class HyperLinear(_StoredForm, nn.Module):
    """``y = x·Wᵀ + b`` with ``W`` kept compressed (a :class:`hypercodec.Linear`); float32
    computation, outputs in the input's dtype. Differentiable in ``x``: a backward pass decodes
    ``W`` for its one product and drops it (on the GPU for CUDA tensors), so adapters, prompts or norms train around frozen compressed layers (the
    stored form itself takes no gradient).

    With ``trainable=True`` (see :meth:`from_linear`) the layer also keeps the float master
    weight and bias as parameters: in training mode the forward pass uses the quantized weight
    with a straight-through estimator (gradients flow to the master weight as if quantization
    were the identity) and re-quantizes the master weight every ``refresh_every`` training
    steps; in eval mode it runs on the compressed form."""

    def __init__(
        self,
        op: _native.Linear,
        master: nn.Linear | None = None,
        spec: str | None = None,
        refresh_every: int = 1,
        source: Any = None,
        tied: str | None = None,
    ) -> None:
        super().__init__()
        self._init_stored(source, tied)
        self.op = op
        self.in_features = op.cols
        self.out_features = op.rows
        self.spec = spec
        self.refresh_every = max(1, int(refresh_every))
        self._steps = 0
        self._wq: torch.Tensor | None = None
        if master is not None:
            _untraced_training_weight()
            self.weight = nn.Parameter(master.weight.detach().to(torch.float32).clone())
            self.bias = (
                nn.Parameter(master.bias.detach().to(torch.float32).clone()) if master.bias is not None else None
            )
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    @classmethod
    def placeholder(cls, layer: nn.Linear, tied: str | None = None) -> "HyperLinear":
        """An empty layer of ``layer``'s shape (no operator yet) whose ``weight_hwz`` is filled
        by ``load_state_dict`` or transformers' loader — how a saved quantized model is
        rebuilt without a dense weight (``tied``: it will share that layer's operator)."""
        self = cls._empty(tied)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.spec, self.refresh_every, self._steps, self._wq = None, 1, 0, None
        self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        return self

    def _check_loaded(self, op: "_native.Linear") -> None:
        if (op.rows, op.cols) != (self.out_features, self.in_features):
            raise _native.InvalidInputError(
                f"stored weight is {op.rows}x{op.cols}; this layer is {self.out_features}x{self.in_features}"
            )

    @property
    def inference_only(self) -> bool:
        """True when the layer holds only the compressed form (no master weight to train)."""
        return self.weight is None

    @classmethod
    def from_linear(
        cls,
        layer: nn.Linear,
        spec: str,
        trainable: bool = False,
        refresh_every: int = 1,
        hessian: np.ndarray | None = None,
    ) -> "HyperLinear":
        """Quantizes ``layer``'s weight with the candidate ``spec`` (e.g. ``int4``, ``e8@4``);
        ``trainable`` keeps a float master copy for straight-through training; ``hessian``
        (``E[x·xᵀ]`` of the layer's inputs, see :func:`collect_hessians`) rounds with error
        feedback where the spec has it (affine, lattice, trellis). A weight on a CUDA device
        has trellis specs coded on that GPU (the CPU encoder's bits; see
        :func:`hypercodec.cuda.trellis_encode`)."""
        b = _f32(layer.bias) if layer.bias is not None else None
        h = None if hessian is None else np.ascontiguousarray(hessian, dtype=np.float32)
        op = _quantize(layer.weight, spec, b, h)
        return _keyed_on(cls(op, layer if trainable else None, spec, refresh_every), layer.weight)

    def refresh(self) -> None:
        """Re-quantizes the master weight (and bias) into the compressed form (without error
        feedback: the ``hessian`` of :meth:`from_linear` is not kept). The layer calls it
        itself after training steps and after ``load_state_dict`` of master weights without
        their stored form; call it after editing the master weight in place."""
        if self.weight is None or self.spec is None:
            return
        b = _f32(self.bias) if self.bias is not None else None
        self.op = _quantize(self.weight, self.spec, b)
        self._wq = None
        self._hwz = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if self._parameters.get("weight") is not None and prefix + "weight" in state_dict:
            # Master weights loaded (a training run resumed): the stored form follows them,
            # the one saved beside them where the state dict has it, else quantized afresh.
            self._wq, self._steps = None, 0
            if prefix + HWZ_KEY not in state_dict:
                self.refresh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op is None:
            raise _native.InvalidInputError("this HyperLinear has no weight yet: load its state dict (weight_hwz) first")
        x = _autocast(x)
        # (Cheapest tests first: `self.weight` is a module attribute lookup, asked last.)
        if self.training and torch.is_grad_enabled() and self.weight is not None:
            if torch.jit.is_tracing() or _exporting() or _fx_traced():
                # The step's weight would be a constant of the graph: later steps' master
                # weights would not reach it (torch.compile breaks its graph here instead).
                raise _native.InvalidInputError(
                    "a trainable HyperLinear in training mode re-quantizes its weight every step, which a traced "
                    "or exported graph would freeze: capture the model in eval() mode, or torch.compile it"
                )
            step = _TRAINING_WEIGHT or HyperLinear._training_weight
            wq = step(self).to(device=self.weight.device)
            w = self.weight + (wq - self.weight).detach()
            return nn.functional.linear(x, w.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        if self._steps > 0 and self._wq is not None and self.weight is not None:
            # Left training: the compressed form reflects the latest master weight.
            self.refresh()
            self._steps = 0
        if _traced():
            return _as_op(self, x)
        return _through_stored(x, self._stored_forward, self._input_grad)

    def _training_weight(self) -> torch.Tensor:
        """The quantized weight of this training step, re-quantized from the master weight every
        ``refresh_every`` steps (called through :data:`_TRAINING_WEIGHT`, untraced: torch.compile
        breaks its graph here instead of recompiling at every step for the step counter)."""
        if self._steps % self.refresh_every == 0 or self._wq is None:
            if self._steps > 0:
                self.refresh()
            self._wq = _op_weight(self.op)
        self._steps += 1
        return self._wq

    def _stored_forward(self, x: torch.Tensor) -> torch.Tensor:
        w8 = _w8a8_ready(self, x)
        if w8 is not None:
            lead = x.shape[:-1]
            y = w8.forward(x.reshape(math.prod(lead), self.in_features))
            if y is not None:
                return y.reshape(*lead, self.out_features)
        if x.is_cuda:
            return _on_device(self, x.device).forward(x)
        y = torch.from_numpy(self.op.forward(_f32(x)))
        return y.to(dtype=x.dtype, device=x.device)

    _op_forward = _stored_forward

    def _op_meta(self) -> list[int]:
        return [_LINEAR, self.out_features]

    def _op_backward(self, gy: torch.Tensor, x_shape: tuple[int, ...]) -> torch.Tensor:
        return self._input_grad(gy)

    def weight_dense(self) -> torch.Tensor:
        """The decoded weight (for checks; the layer itself never holds it)."""
        return _decoded(self, torch.device("cpu"))

    def extra_repr(self) -> str:
        if self.op is None:
            return f"in_features={self.in_features}, out_features={self.out_features}, not loaded"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"path={self.op.path}, held_bytes={self.op.held_bytes}" + (f", tied={self.tied}" if self.tied else "")
        )


class HyperConv2d(_StoredForm, nn.Module):
    """``nn.Conv2d`` with its weight kept compressed on the runtime's matrix view
    ``[out, in/groups·kh·kw]``. A 1×1, stride-1, unpadded, ungrouped convolution runs on the
    CPU runtime as a linear layer over channels; every other kernel takes the documented decode
    fallback: the weight is decoded for the call and passed to ``F.conv2d``."""

    def __init__(self, op: _native.Linear, conv: nn.Conv2d) -> None:
        super().__init__()
        self._init_stored()
        self.op = op
        self._geometry(conv)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone(), requires_grad=False)
        self.pointwise = self._is_pointwise()

    def _geometry(self, conv: nn.Conv2d) -> None:
        self.weight_shape = tuple(conv.weight.shape)
        self.in_channels, self.out_channels, self.kernel_size = conv.in_channels, conv.out_channels, conv.kernel_size
        self.__dict__["_dtype_of"] = torch.empty(0, dtype=conv.weight.dtype)  # (follows .to() and .half())
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        # padding_mode "reflect", "replicate" or "circular": the input padded first (F.pad, as
        # nn.Conv2d does), then a convolution without padding.
        self.padding_mode = conv.padding_mode
        self._pad = tuple(conv._reversed_padding_repeated_twice)

    @property
    def weight(self) -> torch.Tensor:
        """A meta tensor of the dense weight's shape and dtype, for code that reads
        ``conv.weight.dtype`` or ``.shape`` (ViT's and CLIP's patch embeddings cast their input
        so): the values live in the stored form (``op.weight()``), nowhere on a device. Code that
        computes with the weight itself (a decoder tied to it, ``F.conv_transpose2d(h,
        enc.weight)``) cannot use it (PyTorch's CPU kernels may return garbage for a meta operand
        instead of raising): leave such a layer float (``skip``)."""
        probe = self.__dict__.get("_dtype_of")
        return torch.empty(self.weight_shape, dtype=torch.float32 if probe is None else probe.dtype, device="meta")

    @property
    def _g(self) -> tuple[Any, Any, Any]:
        """Stride, padding and dilation of the 2-D convolution this layer computes: its own, or
        a :class:`HyperConv1d`'s as a convolution of height 1 (its public ones are ``nn.Conv1d``'s,
        which code around it reads: Whisper checks its input length by ``conv.stride[0]``)."""
        return self.__dict__.get("_as_2d") or (self.stride, self.padding, self.dilation)

    @property
    def _conv_padding(self) -> Any:
        """The padding of the convolution proper: none after an explicit F.pad."""
        return self._g[1] if getattr(self, "padding_mode", "zeros") == "zeros" else (0, 0)

    @classmethod
    def placeholder(cls, conv: nn.Conv2d) -> "HyperConv2d":
        """An empty layer of ``conv``'s geometry whose ``weight_hwz`` (and ``bias``) are filled
        by ``load_state_dict``."""
        self = cls._empty()
        self._geometry(conv)
        self.bias = None if conv.bias is None else nn.Parameter(torch.empty_like(conv.bias, device="cpu"), requires_grad=False)
        self.pointwise = cls._is_pointwise(self)
        return self

    def _is_pointwise(self) -> bool:
        return (
            self.weight_shape[2:] == (1, 1)
            and tuple(self._g[0]) == (1, 1)
            and tuple(self._conv_padding) in ((0, 0), 0)
            and self.groups == 1
        )

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, spec: str) -> "HyperConv2d":
        """Quantizes ``conv``'s weight with the candidate ``spec``."""
        return _keyed_on(cls(_quantize(conv.weight, spec, None), conv), conv.weight)

    def _check_loaded(self, op: "_native.Linear") -> None:
        # The stored tensor's own shape (its matrix view alone let a 8×4×3×3 kernel load into
        # a 8×9×2×2 convolution, or one of other groups, and compute garbage).
        shape = tuple(op.shape)
        if shape != tuple(self.stored_shape):
            raise _native.InvalidInputError(f"stored weight is {shape}; this convolution's is {tuple(self.stored_shape)}")

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The stored weight's shape: the dense weight's (a :class:`HyperConv1d`'s is 3-D)."""
        return tuple(self.weight_shape)

    @property
    def path(self) -> str:
        """The route: the runtime's (1×1) or ``decode-fallback+conv2d``."""
        return self.op.path if self.pointwise else "decode-fallback+conv2d"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op is None:
            raise _native.InvalidInputError("this HyperConv2d has no weight yet: load its state dict (weight_hwz) first")
        # One unbatched image, as nn.Conv2d takes it, runs as a batch of one.
        batch = _autocast(_conv_input(x, self.in_channels))
        if getattr(self, "padding_mode", "zeros") != "zeros":
            batch = nn.functional.pad(batch, self._pad, mode=self.padding_mode)
        if _traced():
            # A bias set to train is added outside the operator, where its gradient is taken;
            # any other is added inside, in float32 before the output's rounding, as eagerly.
            y = self._add_trained_bias(_as_op(self, batch))
        elif self.pointwise and batch.shape[1] > 0:
            # A 1×1 convolution runs on the matrix form. (Without input channels it takes the
            # decoded weight's path, so its output is PyTorch's: empty.)
            inside = not self._trained_bias()
            y = _through_stored(batch, lambda t: self._pointwise_forward(t, bias=inside), self._pointwise_grad)
            y = self._add_trained_bias(y)
        else:
            y = self._decoded_forward(batch)
        return _conv_output(y, x)

    def _trained_bias(self) -> bool:
        """Whether the bias is set to train (``requires_grad``): then added outside the stored
        product, where autograd sees it (added inside, it got no gradient on 1×1 convolutions).
        (Read from ``_parameters``: under torch.fx, ``self.bias`` is a node of the graph.)"""
        bias = self._parameters.get("bias")
        return bias is not None and bias.requires_grad

    def _add_trained_bias(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` of the stored product plus a bias set to train (any other was added inside)."""
        return y + self.bias.to(y.dtype)[None, :, None, None] if self._trained_bias() else y

    def _pointwise_grad(self, gy: torch.Tensor) -> torch.Tensor:
        """A 1×1 convolution's input gradient: ``∂y``'s channels times the decoded matrix."""
        return self._input_grad(gy.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def _op_forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = not self._trained_bias()  # (the traced forward adds a trained bias itself)
        if self.pointwise and x.shape[1] > 0:
            return self._pointwise_forward(x, bias=bias)
        return self._decoded_forward(x, bias=bias)

    def _op_meta(self) -> list[int]:
        from torch.nn.modules.utils import _pair

        pad = self._conv_padding
        mode, padding = (_PAD_MODES.index(pad), (0, 0)) if isinstance(pad, str) else (-1, _pair(pad))
        # The last entry says where the graph adds the bias (outside the operator where it
        # trains): a graph captured before `bias.requires_grad` changed is refused, not run
        # without its bias or with it twice.
        stride, _, dilation = self._g
        return [_CONV, *self.weight_shape, *_pair(stride), *_pair(dilation), self.groups, int(self.pointwise), mode,
                *padding, int(self._trained_bias())]

    def _op_backward(self, gy: torch.Tensor, x_shape: tuple[int, ...]) -> torch.Tensor:
        if self.pointwise and x_shape[1] > 0:
            return self._pointwise_grad(gy)
        # The transposed convolution, on the input padded explicitly ("same" may pad one more
        # on the far side), then cropped; no autograd (this runs inside an operator).
        dt = gy.dtype if gy.is_cuda else torch.float32  # (the forward's weight, kept on a device)
        w = self._dense_weight(gy.device, dt)
        pads = []
        padding, (_, _, dilation) = self._conv_padding, self._g
        for d in range(2):
            if isinstance(padding, str):
                total = 0 if padding == "valid" else dilation[d] * (self.weight_shape[2 + d] - 1)
                pads.append((total // 2, total - total // 2))
            else:
                pads.append((padding[d], padding[d]))
        n, c, h, wd = x_shape
        padded = (n, c, h + sum(pads[0]), wd + sum(pads[1]))
        g = torch.nn.grad.conv2d_input(padded, w, gy.to(dt), self._g[0], 0, dilation, self.groups)
        return g[:, :, pads[0][0] : pads[0][0] + h, pads[1][0] : pads[1][0] + wd]

    def _dense_weight(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The decoded weight: decoded for the call on the host; on a CUDA device decoded once
        and kept there (its stored form is not uploaded: nothing would read it)."""
        if device.type != "cuda":
            return _op_weight(self.op).reshape(self.weight_shape).to(dtype)
        cache = self.__dict__.setdefault("_dense_on_device", {})
        key = (device, dtype, id(self.op))
        if key not in cache:
            cache.clear()
            op = self.op
            cache[key] = _lasting(device, lambda: _op_weight(op).reshape(self.weight_shape).to(device=device, dtype=dtype))
        return cache[key]

    def _decoded_forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """The decode fallback: ``F.conv2d`` with the decoded weight (``bias``: added too)."""
        dt = x.dtype if x.is_cuda else torch.float32
        b = self.bias if bias else None
        b = None if b is None else b.to(device=x.device, dtype=dt)
        y = nn.functional.conv2d(
            x.to(dt), self._dense_weight(x.device, dt), b, self._g[0], self._conv_padding, self._g[2], self.groups
        )
        return y.to(x.dtype)

    def _pointwise_forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        n, c, h, w = x.shape
        o = self.op.rows  # explicit sizes: `-1` is ambiguous when a dimension is 0
        # The input's memory format (channels_last: the rows computed are already in that
        # order, so no copy).
        fmt = _pointwise_format(x)
        if x.is_cuda:
            y = _on_device(self, x.device).forward(x.permute(0, 2, 3, 1).reshape(n * h * w, c))
            y = y.reshape(n, h, w, o).permute(0, 3, 1, 2)
            if bias and self.bias is not None:
                y = y + self.bias.detach().to(device=x.device, dtype=y.dtype)[None, :, None, None]
            return y.contiguous(memory_format=fmt)
        xs = _f32(x.permute(0, 2, 3, 1).reshape(n * h * w, c))
        y = torch.from_numpy(self.op.forward(xs)).reshape(n, h, w, o).permute(0, 3, 1, 2)
        if bias and self.bias is not None:
            y = y + self.bias.detach().to(torch.float32)[None, :, None, None]
        return y.to(dtype=x.dtype, device=x.device).contiguous(memory_format=fmt)

    def extra_repr(self) -> str:
        if self.op is None:
            return f"weight_shape={self.stored_shape}, not loaded"
        mode = getattr(self, "padding_mode", "zeros")
        pad = "" if mode == "zeros" else f", padding_mode={mode}"
        return f"weight_shape={self.stored_shape}{pad}, path={self.path}, held_bytes={self.op.held_bytes}"


def _as_conv2d(conv: nn.Conv1d) -> Any:
    """``conv`` seen as an ``nn.Conv2d`` of height 1: kernel ``1×k``, stride, dilation and
    padding ``(1 or 0, ·)`` (a padding string as it is), its weight ``[out, in/groups, 1, k]``."""
    from types import SimpleNamespace

    pad = conv.padding if isinstance(conv.padding, str) else (0, conv.padding[0])
    left, right = conv._reversed_padding_repeated_twice
    return SimpleNamespace(
        weight=conv.weight.unsqueeze(2), bias=conv.bias, in_channels=conv.in_channels,
        out_channels=conv.out_channels, kernel_size=(1, conv.kernel_size[0]), stride=(1, conv.stride[0]),
        padding=pad, dilation=(1, conv.dilation[0]), groups=conv.groups, padding_mode=conv.padding_mode,
        # (F.pad's order: the last dimension first; none above or below the one row)
        _reversed_padding_repeated_twice=[left, right, 0, 0],
    )


class HyperConv1d(HyperConv2d):
    """``nn.Conv1d`` with its weight kept compressed (stored in its own shape, ``[out,
    in/groups, k]``), run as a :class:`HyperConv2d` of height 1 (kernel ``1×k``) on inputs
    ``(N, C, L)`` or ``(C, L)``: a kernel of 1 (stride 1, no padding, one group) on the runtime as
    a linear layer over channels, any other on the decode fallback (``F.conv2d`` with the decoded
    weight, which computes what ``F.conv1d`` does). Audio models (wav2vec2's feature encoder,
    HiFi-GAN, EnCodec, Conformer's depthwise convolutions) are mostly such layers."""

    def __init__(self, op: _native.Linear, conv: nn.Conv1d) -> None:
        super().__init__(op, _as_conv2d(conv))
        self._geometry1d(conv)

    def _geometry1d(self, conv: nn.Conv1d) -> None:
        # What HyperConv2d computes with (height 1), then nn.Conv1d's own geometry in public.
        self.shape1d = tuple(conv.weight.shape)
        self.__dict__["_as_2d"] = (self.stride, self.padding, self.dilation)
        self.kernel_size, self.stride, self.padding, self.dilation = (
            conv.kernel_size, conv.stride, conv.padding, conv.dilation)

    @property
    def conv1d(self) -> dict[str, Any]:
        """``nn.Conv1d``'s geometry arguments (kernel size, stride, padding, dilation)."""
        return dict(kernel_size=self.kernel_size, stride=self.stride, padding=self.padding, dilation=self.dilation)

    @classmethod
    def placeholder(cls, conv: nn.Conv1d) -> "HyperConv1d":
        """An empty layer of ``conv``'s geometry whose ``weight_hwz`` (and ``bias``) are filled
        by ``load_state_dict``."""
        self = super().placeholder(_as_conv2d(conv))
        self._geometry1d(conv)
        return self

    @property
    def weight(self) -> torch.Tensor:
        """The decoded weight (``[out, in/groups, k]``, the layer's dtype, on its device),
        decoded when read (kept on a CUDA device, as the decode fallback keeps it): code around
        a 1-D convolution computes with its weight (Mamba's and Jamba's mixers pass it to their
        causal convolution and step by it, which a meta tensor made NaN). Before loading, a meta
        tensor of its shape."""
        meta = super().weight.reshape(self.shape1d)
        if self.op is None:
            return meta
        key = self._buffers.get(_OP_KEY)
        device = key.device if key is not None else torch.device("cpu")
        w = self._dense_weight(device, meta.dtype).reshape(self.shape1d)
        # (on a CUDA device the forward's kept copy: a copy of it, so that no write changes it)
        return w.clone() if device.type == "cuda" else w

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(self.shape1d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (functions torch.fx keeps as calls: a traced input cannot steer Python's control flow)
        return _signal_output(super().forward(_signal_input(x, self.in_channels)))


class HyperEmbedding(_StoredForm, nn.Module):
    """``nn.Embedding`` on the stored form: each looked-up row is decoded from the compressed
    weight (a :class:`hypercodec.Linear`, which a tied output head can share), returned in
    ``dtype`` (the original table's: a bf16 model stays bf16). Saved like :class:`HyperLinear`
    (``weight_hwz``). ``max_norm`` scales each looked-up row whose ``norm_type`` norm passes it
    down to it, as ``nn.Embedding`` does to the rows of its table (the stored table is not
    changed: every lookup gives what the renormalized table would; a tied output head, which
    ``nn.Embedding`` would renormalize too, keeps the stored rows); sparse gradients are not kept
    (the table is inference-only)."""

    def __init__(
        self,
        op: _native.Linear,
        padding_idx: int | None = None,
        source: Any = None,
        tied: str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self._init_stored(source, tied)
        self.op = op
        self.num_embeddings = op.rows
        self.embedding_dim = op.cols
        self.padding_idx = padding_idx
        self.dtype = dtype
        self.max_norm: float | None = None
        self.norm_type = 2.0

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the rows looked up: the original table's, converted by ``.half()``,
        ``.to(dtype)`` and their kin as a table's weight would be."""
        probe = self.__dict__.get("_dtype_of")
        return self.__dict__.get("dtype", torch.float32) if probe is None else probe.dtype

    @dtype.setter
    def dtype(self, value: torch.dtype) -> None:
        self.__dict__["_dtype_of"] = torch.empty(0, dtype=value)  # (follows .to() and .half())

    @classmethod
    def placeholder(cls, emb: nn.Embedding, tied: str | None = None) -> "HyperEmbedding":
        """An empty table of ``emb``'s shape whose ``weight_hwz`` is filled by
        ``load_state_dict`` (``tied``: it will share that layer's operator)."""
        self = cls._empty(tied)
        self.num_embeddings, self.embedding_dim = emb.num_embeddings, emb.embedding_dim
        self.padding_idx = emb.padding_idx
        self.dtype = emb.weight.dtype
        self.max_norm, self.norm_type = emb.max_norm, emb.norm_type
        return self

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, spec: str) -> "HyperEmbedding":
        """Quantizes ``emb``'s table with the candidate ``spec``, without error feedback (an
        embedding's inputs are one-hot: every row is its own output)."""
        return _keyed_on(cls._like(emb, _quantize(emb.weight, spec, None)), emb.weight)

    @classmethod
    def _like(cls, emb: nn.Embedding, op: "_native.Linear", **kw: Any) -> "HyperEmbedding":
        """A table on ``op`` that looks rows up as ``emb`` does (padding index, dtype, max_norm)."""
        layer = cls(op, emb.padding_idx, dtype=emb.weight.dtype, **kw)
        layer.max_norm, layer.norm_type = emb.max_norm, emb.norm_type
        return layer

    @property
    def weight(self) -> torch.Tensor:
        """A meta tensor of the table's shape and dtype, for code that reads ``emb.weight.shape``
        or ``.dtype`` (CLIP's text embeddings check the position table's length so): the rows
        live in the stored form (``op.weight()``), nowhere on a device. Code that computes with
        the table itself (a tied head written as ``F.linear(h, wte.weight)``) cannot use it
        (PyTorch's CPU kernels may return garbage for a meta operand instead of raising):
        leave such a table float (``skip``)."""
        return torch.empty(self.num_embeddings, self.embedding_dim, dtype=self.dtype, device="meta")

    def _check_loaded(self, op: "_native.Linear") -> None:
        if (op.rows, op.cols) != (self.num_embeddings, self.embedding_dim):
            raise _native.InvalidInputError(
                f"stored table is {op.rows}x{op.cols}; this embedding is {self.num_embeddings}x{self.embedding_dim}"
            )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.op is None:
            raise _native.InvalidInputError("this HyperEmbedding has no table yet: load its state dict (weight_hwz) first")
        ids = _embedding_ids(ids)
        if _traced():
            rows = torch.ops.hypercodec.stored_lookup(ids, getattr(self, _OP_KEY), self.embedding_dim, self.dtype)
        else:
            _check_plain(ids)
            rows = self._op_forward(ids)
        max_norm = getattr(self, "max_norm", None)
        if max_norm is None:
            return rows
        # nn.Embedding's renormalization (embedding_renorm_): rows past max_norm scaled to it.
        norms = torch.linalg.vector_norm(rows, ord=self.norm_type, dim=-1, keepdim=True)
        return torch.where(norms > max_norm, rows * (max_norm / (norms + 1e-7)), rows)

    def _op_forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.detach().reshape(-1).to(torch.int64).cpu().numpy()
        rows = torch.from_numpy(self.op.rows_of(flat))
        return rows.reshape(*ids.shape, self.embedding_dim).to(device=ids.device, dtype=self.dtype)

    def extra_repr(self) -> str:
        if self.op is None:
            return f"{self.num_embeddings}, {self.embedding_dim}, not loaded"
        tied = f", tied={self.tied}" if self.tied else ""
        norm = "" if getattr(self, "max_norm", None) is None else f", max_norm={self.max_norm}"
        return f"{self.num_embeddings}, {self.embedding_dim}{norm}, path={self.op.path}, held_bytes={self.op.held_bytes}{tied}"


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding over the last dimension (pairs of halves), positions 0..T-1."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], -1) * sin.to(x.dtype)


class HyperAttention(nn.Module):
    """Causal multi-head attention (grouped-query when ``num_kv_heads`` < ``num_heads``, rotary
    positions) whose Q/K/V/O projections are :class:`HyperLinear` — HyperTensor's
    ``HyperAttention`` made real. Built with fresh ``nn.Linear`` weights quantized with
    ``method`` at ``bps``, or around existing projections with :meth:`from_projections`;
    ``inference_only=False`` keeps float master weights (straight-through training)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = False,
        rope_theta: float = 10000.0,
        inference_only: bool = True,
        bps: float = 4.0,
        method: str = "lattice",
    ) -> None:
        super().__init__()
        kv = num_kv_heads or num_heads
        if num_heads < 1 or hidden_size % num_heads:
            raise _native.InvalidInputError(f"HyperAttention: hidden_size {hidden_size} is not num_heads {num_heads} heads")
        d = hidden_size // num_heads
        dense = [
            nn.Linear(hidden_size, num_heads * d, bias=bias),
            nn.Linear(hidden_size, kv * d, bias=bias),
            nn.Linear(hidden_size, kv * d, bias=bias),
            nn.Linear(num_heads * d, hidden_size, bias=bias),
        ]
        self._setup(dense, num_heads, kv, rope_theta, method_spec(method, bps), not inference_only)

    @classmethod
    def from_projections(
        cls,
        q: nn.Linear,
        k: nn.Linear,
        v: nn.Linear,
        o: nn.Linear,
        num_heads: int,
        num_kv_heads: int | None = None,
        rope_theta: float = 10000.0,
        bps: float = 4.0,
        method: str = "lattice",
        inference_only: bool = True,
    ) -> "HyperAttention":
        """The attention of existing projections, quantized."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._setup([q, k, v, o], num_heads, num_kv_heads or num_heads, rope_theta, method_spec(method, bps), not inference_only)
        return self

    def _setup(self, dense, heads: int, kv: int, theta: float, spec: str, trainable: bool) -> None:
        q, k, v, o = dense
        d = q.out_features // heads if heads > 0 else 0
        # Shapes the forward pass needs, checked here rather than met as a reshape error there.
        problem = (
            f"num_heads {heads} must be at least 1" if heads < 1
            else f"num_kv_heads {kv} must divide num_heads {heads}" if kv < 1 or heads % kv
            else f"the query projection's {q.out_features} outputs are not num_heads {heads} heads of an even size (rotary positions pair a head's halves)"
            if q.out_features % heads or d % 2
            else f"the key and value projections must have num_kv_heads {kv} × head size {d} = {kv * d} outputs, not {k.out_features} and {v.out_features}"
            if k.out_features != kv * d or v.out_features != kv * d
            else f"the output projection must take {heads * d} inputs, not {o.in_features}" if o.in_features != heads * d
            else None
        )
        if problem is not None:
            raise _native.InvalidInputError(f"HyperAttention: {problem}")
        self.num_heads, self.num_kv_heads, self.rope_theta = heads, kv, theta
        self.head_dim = d
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            HyperLinear.from_linear(layer, spec, trainable) for layer in dense
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.head_dim
        q = self.q_proj(x).view(b, t, self.num_heads, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, d).transpose(1, 2)
        q, k = _rope(q, self.rope_theta), _rope(k, self.rope_theta)
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.num_heads * d))


def _parent(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rpartition(".")[0])


def _is_conv1d(m: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2 and its kin): a linear layer that holds its weight
    transposed, ``[in, out]``, and computes ``x·W + b``."""
    t = type(m)
    return t.__name__ == "Conv1D" and t.__module__.startswith("transformers") and getattr(m, "weight", None) is not None


def _as_linear(m: nn.Module) -> Any:
    """``m`` seen as an ``nn.Linear`` (``weight`` ``[out, in]``): itself, or a view of a ``Conv1D``."""
    if not _is_conv1d(m):
        return m
    from types import SimpleNamespace

    w = m.weight
    return SimpleNamespace(weight=w.t(), bias=m.bias, in_features=w.shape[0], out_features=w.shape[1])


def _replaceable(model: nn.Module, name: str) -> bool:
    """Whether the linear or conv layer ``name`` may become a stored layer: it computes what its
    base class does (a subclass with a forward of its own, such as timm's ``Conv2dSame`` or
    ``StdConv2d`` or a LoRA layer, stays float: replacing it would drop what its forward adds),
    and it is not the output projection of an ``nn.MultiheadAttention``, whose forward reads
    ``out_proj.weight`` itself (so it stays float, like the attention's packed input
    projection, a bare parameter)."""
    return not _own_forward(model.get_submodule(name)) and not isinstance(_parent(model, name), nn.MultiheadAttention)


# Subclasses whose forward of their own computes the base class's product (replaced as it is).
_SAME_PRODUCT = {"transformers.models.falcon.modeling_falcon.FalconLinear"}


def _own_forward(m: nn.Module) -> bool:
    """Whether ``m`` (a Linear, Conv2d or Conv1D) computes more than its base class's product."""
    t = type(m)
    if f"{t.__module__}.{t.__qualname__}" in _SAME_PRODUCT:
        return False
    base = next((b for b in (nn.Linear, nn.Conv1d, nn.Conv2d) if isinstance(m, b)), t)
    convs = (nn.Conv1d, nn.Conv2d)
    return t.forward is not base.forward or (base in convs and t._conv_forward is not base._conv_forward)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent = _parent(model, name)
    old = getattr(parent, name.rpartition(".")[2], None)
    if isinstance(old, nn.Module):
        # The layer it replaces: its mode (a model put in eval mode stays so: BatchNorm fusion
        # checks it) and its forward hooks (feature extractors; the same tables, so their
        # handles still remove them), less those that rebuild its weight from parameters the
        # replacement does not have (torch's older weight_norm, spectral_norm and prune: the
        # replacement holds the weight they computed, :func:`_refresh_recomputed`).
        new.train(old.training)
        for k in [k for k, h in old._forward_pre_hooks.items() if _recomputed(h)]:
            del old._forward_pre_hooks[k]
        for hooks in _HOOK_TABLES:
            if getattr(old, hooks, None) and not getattr(new, hooks, None):
                setattr(new, hooks, getattr(old, hooks))
    setattr(parent, name.rpartition(".")[2], new)
    if isinstance(parent, nn.TransformerEncoderLayer) and isinstance(new, _StoredForm):
        # Its inference fast path (torch._transformer_encoder_layer_fwd) reads linear1.weight
        # and linear2.weight itself; this flag, which only gates that path, keeps the module's
        # own forward, which calls the layers (self.activation is unchanged). An encoder over
        # such layers made its input a nested tensor (eval, no grad, a padding mask) for that
        # path, which the stored layers do not take: it keeps plain tensors.
        parent.activation_relu_or_gelu = 0
        parts = name.split(".")
        for i in range(len(parts) - 1):
            up = model.get_submodule(".".join(parts[:i]))
            if isinstance(up, nn.TransformerEncoder):
                up.use_nested_tensor = False


def _recomputed(hook: Any) -> tuple[str, Callable[[nn.Module], torch.Tensor]] | None:
    """The tensor a forward pre-hook of torch's older reparametrizations rebuilds before every
    call (``torch.nn.utils.weight_norm``, ``spectral_norm``, ``prune``: ``weight`` from
    ``weight_g`` and ``weight_v``, say) and how it computes it for a module (spectral_norm
    without a power iteration, as in eval mode), or None for any other hook."""
    from torch.nn.utils.prune import BasePruningMethod
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    if isinstance(hook, WeightNorm):
        return hook.name, hook.compute_weight
    if isinstance(hook, SpectralNorm):
        return hook.name, lambda m: hook.compute_weight(m, do_power_iteration=False)
    if isinstance(hook, BasePruningMethod):
        return hook._tensor_name, hook.apply_mask
    return None


def _refresh_recomputed(m: nn.Module) -> None:
    """Sets each tensor of ``m`` that such a hook (:func:`_recomputed`) rebuilds to the value its
    next call would compute (parameters loaded since the last call included), so that it is the
    one quantized."""
    with torch.no_grad():
        for name, compute in filter(None, map(_recomputed, list(m._forward_pre_hooks.values()))):
            setattr(m, name, compute(m))


# A module's forward hook tables that a replacement takes over.
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)


def _weights_multiplied_by_parents(model: nn.Module) -> set[int]:
    """The ids of ``model``'s modules whose parent's own code multiplies their ``weight``
    (``self.dt_proj.weight @ time_step``: the mixers of transformers' Mamba, Falcon-Mamba and
    Jamba), found in the parents' class sources. A stored layer has no dense weight to give such
    code (it raised ``TypeError: unsupported operand type(s) for @: 'NoneType'``), so these stay
    float."""
    import inspect

    pattern = re.compile(r"self\.(\w+)\.weight\s*@|@\s*self\.(\w+)\.weight\b")
    read: dict[type, set[str]] = {}
    found: set[int] = set()
    for parent in model.modules():
        cls = type(parent)
        if cls not in read:
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):  # (a class without a source file)
                source = ""
            read[cls] = {a or b for a, b in pattern.findall(source)}
        for child in read[cls]:
            m = parent._modules.get(child)
            if m is not None:
                found.add(id(m))
    return found


def _skipped_under_any_name(model: nn.Module, skip: tuple[str, ...]) -> Callable[[nn.Module], bool]:
    """Whether a module of ``model`` is left float: it has a name containing one of ``skip`` (a
    module used at several places has several names: one skipped keeps it float at all of them),
    or its parent multiplies its weight itself (:func:`_weights_multiplied_by_parents`). An
    empty name skips nothing (it is in every name)."""
    skip = tuple(s for s in skip if s)
    names_of: dict[int, list[str]] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        names_of.setdefault(id(m), []).append(n)
    multiplied = _weights_multiplied_by_parents(model)
    return lambda m: id(m) in multiplied or any(s in n for n in names_of.get(id(m), ()) for s in skip)


def quantize(
    model: nn.Module,
    bps: float = 4.0,
    method: str = "lattice",
    skip: Iterable[str] = ("lm_head",),
    conv: bool = True,
    trainable: bool = False,
    refresh_every: int = 1,
    hessians: dict[str, np.ndarray] | None = None,
    embeddings: bool = False,
) -> nn.Module:
    """Replaces every ``nn.Linear`` (and, with ``conv``, ``nn.Conv2d`` and ``nn.Conv1d``) of
    ``model`` whose name does not contain one of ``skip`` by a :class:`HyperLinear`
    (:class:`HyperConv2d`, :class:`HyperConv1d`) quantized
    with ``method`` at ``bps`` (see :func:`method_spec`; a layer too small for the lattice at
    ``bps`` — its row scales and chunk tables alone over the rate, or a per-tensor grid better,
    as 3×3 depthwise kernels — falls back to affine INT(⌊bps⌋ + 2) with a scale per output
    channel (as many
    bits as keep it within 8 KB of the rate: a large layer at a rate below the lattice's reach
    gets a grid within the rate), or, for ``lattice-prefix`` where only its kilobyte of code
    lengths is too much, to ``lattice-gpu``'s rANS; so a model of
    many tiny layers lands a little above ``bps``: :func:`quantize_budget` holds a model-wide
    budget); transformers' ``Conv1D`` (GPT-2's
    linear layers, their weight transposed) becomes a :class:`HyperLinear` too; ``trainable`` keeps float master
    weights for straight-through training; ``hessians`` (by layer name, from
    :func:`collect_hessians`) turns on error-feedback rounding. A subclass with a forward of its
    own (timm's ``Conv2dSame``, ``StdConv2d``, a LoRA layer), ``nn.MultiheadAttention``'s
    ``out_proj`` (which the attention reads as a weight) and a layer whose parent multiplies
    its weight in its own code (``self.dt_proj.weight @ …`` in the Mamba, Falcon-Mamba and
    Jamba mixers) stay float.

    With ``embeddings``, every ``nn.Embedding`` not skipped becomes a :class:`HyperEmbedding`
    too: one whose weight a quantized linear layer shares (a tied output head) reads that
    layer's operator (one stored copy, saved once; rounded for the head: with ``hessians``,
    with the head's error feedback); one whose weight a skipped or ``trainable`` layer shares
    stays float with it; tables sharing one weight (T5's) share one operator; any other is
    quantized at the same ``bps`` without error feedback. A subclass of ``nn.Embedding`` (a
    scaled one, as in Gemma or BART, whose ``forward`` does more than a lookup) stays float.
    A module reached by several names (one layer used twice) is quantized once and replaced
    at every name. Every layer is quantized before any is replaced: an error (naming the layer)
    leaves ``model`` as it was. Returns ``model``; a bare layer (``model`` itself an
    ``nn.Linear`` or ``nn.Conv2d``, or with ``embeddings`` an ``nn.Embedding``) cannot replace
    itself in place, and its stored replacement is returned instead. With ``trainable``, re-quantizations of the master
    weights round without the ``hessians``' error feedback (they are not kept)."""
    spec = method_spec(method, bps)
    # A single name is one name, not its letters ("lm_head" skipped every layer with an "l").
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    # Every name of every module: a layer used at two places is replaced at both, and left
    # float where any of its names is skipped.
    named = list(model.named_modules(remove_duplicate=False))
    skipped = _skipped_under_any_name(model, skip)
    candidates = [
        (n, m)
        for n, m in named
        if (isinstance(m, nn.Linear) or _is_conv1d(m) or (conv and isinstance(m, (nn.Conv1d, nn.Conv2d))))
        and not skipped(m)
    ]
    meta = [n for n, m in candidates if any(p.is_meta for p in m.parameters(recurse=False))]
    if meta:
        raise _native.InvalidInputError(
            f"layers {meta[:3]}{' ...' if len(meta) > 3 else ''} have their weights on the meta device: "
            "quantize needs their values (load the weights first; a saved quantized model loads "
            "with hnn.load_state_dict)"
        )
    kept = [f"{n} ({type(m).__name__})" for n, m in candidates if _own_forward(m)]
    if kept:
        warnings.warn(
            f"left float, their forward does more than the product a stored layer computes: {', '.join(kept[:5])}"
            + (f" and {len(kept) - 5} more" if len(kept) > 5 else ""),
            stacklevel=2,
        )
    stored_already = sorted({n for n, m in named if isinstance(m, _StoredForm)})
    if stored_already:
        warnings.warn(
            f"{len(stored_already)} layers are stored already ({', '.join(stored_already[:3])}"
            f"{' ...' if len(stored_already) > 3 else ''}) and keep their stored form: quantize does not "
            "re-quantize them (hnn.dequantize(model) first to quantize them again, from their decoded values)",
            stacklevel=2,
        )
    targets = [(n, m) for n, m in candidates if _replaceable(model, n)]
    tables = [(n, m) for n, m in named if embeddings and type(m) is nn.Embedding and not skipped(m)]
    for _, m in targets + tables:
        _refresh_recomputed(m)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    # Quantized first, replaced after: a failure leaves the model untouched.
    made: dict[int, nn.Module] = {}
    # A weight's first quantized layer and its name (a table tied to it reads its operator).
    heads: dict[int, tuple[nn.Module, str]] = {}
    replacements: list[tuple[str, nn.Module]] = []

    def stored(name: str, make: Callable[[], nn.Module]) -> nn.Module:
        try:
            return make()
        except _native.HypercodecError as e:
            raise type(e)(f"layer `{name or type(model).__name__}`: {e}") from e

    for name, layer in targets:
        if id(layer) not in made:
            head = None if trainable else heads.get(id(layer.weight))
            if head is not None and _shares_operator(layer, head[0]):
                # Another linear layer on the same weight Parameter (an autoencoder's tied
                # decoder, a layer reused under two names by parameter): one stored form, tied as
                # an output head is to its table (it was quantized and stored twice, untied).
                made[id(layer)] = _keyed_on(HyperLinear(head[0].op, tied=head[1]), layer.weight)
            elif not isinstance(layer, (nn.Conv1d, nn.Conv2d)):
                h = None if hessians is None else hessians.get(name)
                made[id(layer)] = stored(
                    name, lambda: HyperLinear.from_linear(_as_linear(layer), spec, trainable, refresh_every, h)
                )
                if not trainable:
                    heads.setdefault(id(layer.weight), (made[id(layer)], name))
            else:
                kind = HyperConv1d if isinstance(layer, nn.Conv1d) else HyperConv2d
                made[id(layer)] = stored(name, lambda: kind.from_conv(layer, spec))
        replacements.append((name, made[id(layer)]))
    for name, emb in tables:
        if id(emb) not in made:
            head = heads.get(id(emb.weight))
            if head is not None:
                made[id(emb)] = HyperEmbedding._like(emb, head[0].op, tied=head[1])
            elif id(emb.weight) in linear_weights:
                continue  # shared with a layer left float (skipped or trainable): float with it
            else:
                made[id(emb)] = stored(name, lambda: HyperEmbedding.from_embedding(emb, spec))
                heads.setdefault(id(emb.weight), (made[id(emb)], name))
        replacements.append((name, made[id(emb)]))
    for name, new in replacements:
        if name == "":
            return new  # a bare layer: its replacement
        _replace(model, name, new)
    _mark_for_transformers(model)
    return model


def _shares_operator(layer: nn.Module, owner: nn.Module) -> bool:
    """Whether the linear ``layer`` can run on ``owner``'s operator: a plain ``nn.Linear`` of
    the same shape whose weight ``owner`` was quantized from, neither adding a bias (the runtime
    adds the owner's inside its product; a tied layer restored by :func:`load_state_dict` has
    none of its own either)."""
    return (
        isinstance(owner, HyperLinear)
        and isinstance(layer, nn.Linear)
        and layer.bias is None
        and owner.op.bias is None
        and (owner.op.rows, owner.op.cols) == tuple(layer.weight.shape)
    )


def _mark_for_transformers(model: nn.Module) -> None:
    """A transformers model with stored layers carries hypercodec's quantization config naming
    them (:func:`hypercodec.hf._mark_quantized`), so that ``save_pretrained`` then
    ``from_pretrained`` rebuild it on the stored forms: without it the reload built dense layers
    of random weights where the stored ones were, behind transformers' load report. A model being
    quantized on load keeps the config it has (its quantizer names the layers)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        return
    current = getattr(config, "quantization_config", None)
    fixed_bits = None
    if current is not None:
        get = current.get if isinstance(current, dict) else lambda k, d=None: getattr(current, k, d)
        if get("quant_method") != "hypercodec":
            return  # another method's model
        if get("modules") is None:
            return  # being quantized on load: its quantizer names the layers next
        fixed_bits = get("fixed_bits")  # (a model read with fixed_bits keeps them at reload)
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return
    trains = any(isinstance(m, HyperLinear) and m.weight is not None for m in model.modules())
    if isinstance(model, PreTrainedModel) and not trains:
        # (A model with master weights to train stays unmarked: transformers' Trainer refuses
        # to train a quantized model.)
        from . import hf

        hf._mark_quantized(model, fixed_bits)


def quantize_budget(
    model: nn.Module,
    target_bps: float,
    sensitivity: Mapping[str, float] | None = None,
    hessians: Mapping[str, np.ndarray] | None = None,
    skip: Iterable[str] = ("lm_head",),
    candidates: Iterable[str] | None = None,
    embeddings: bool = False,
    device: str | int | torch.device | None = None,
) -> nn.Module:
    """Replaces every ``nn.Linear`` of ``model`` whose name contains none of ``skip`` by a
    :class:`HyperLinear`, the encodings chosen together by the planner's BUDGET: the fewest
    squared errors (weighted by ``sensitivity``, by ``"{name}.weight"``, e.g. from
    :func:`collect_fisher`) at ``target_bps`` bits per value all-in over those weights;
    ``hessians`` (from :func:`collect_hessians`) round the chosen encodings with error
    feedback; ``candidates`` replaces BUDGET's ladder (names as ``hypercodec compress
    --candidates`` takes them); ``embeddings`` adds every ``nn.Embedding`` whose weight no
    linear layer shares to the same budget, each becoming a :class:`HyperEmbedding` (rounded
    without error feedback: its inputs are one-hot). Biases are kept as float32. ``device``
    codes trellis candidates (BUDGET's measurements and the chosen encodings: the same bits as
    the CPU's) on a GPU — ``"cuda"``, ``"cuda:N"`` or an ordinal; ``"cpu"`` keeps them on the
    CPU; None (the default) uses the GPU the model's weights are on where the kernels load
    there, else the CPU. Runs the command line's pipeline (``hypercodec compress --device``)
    on a temporary archive and loads the layers from it (:func:`load_into`). Returns
    ``model``.

        >>> hnn.quantize_budget(model, 3, collect_fisher(model, batches))  # doctest: +SKIP
    """
    import json
    import os
    import tempfile

    from . import api

    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    gpu = _coding_gpu(model, device)
    skipped = _skipped_under_any_name(model, skip)
    sd: dict[str, np.ndarray] = {}
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear) and _replaceable(model, n) and not skipped(m):
            _refresh_recomputed(m)
            sd[f"{n}.weight"] = m.weight.detach().to(torch.float32).cpu().numpy()
            if m.bias is not None:
                sd[f"{n}.bias"] = m.bias.detach().to(torch.float32).cpu().numpy()
    shared = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    tables = [
        (n, m)
        for n, m in model.named_modules()
        if embeddings and isinstance(m, nn.Embedding) and id(m.weight) not in shared and not skipped(m)
    ]
    for n, m in tables:
        sd[f"{n}.weight"] = m.weight.detach().to(torch.float32).cpu().numpy()
    if not sd:
        return model
    if sensitivity is not None:
        # (as the command line warns: a weight for a name that no coded layer has is a typo or
        # a layer skipped, and it moves nothing)
        coded = {k for k in sd if k.endswith(".weight")}
        unmatched = sorted(k for k in sensitivity if k not in coded)
        if unmatched:
            shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
            warnings.warn(
                f"sensitivity names {len(unmatched)} weight(s) that quantize_budget does not code "
                f"(keys are '{{layer}}.weight' of the layers it replaces): {shown}",
                stacklevel=2,
            )
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "budget.hwz")
        # The layers leave the archive: the target counts their streams, not its manifest.
        options: dict[str, Any] = {"mode": "budget", "target_bps": target_bps, "target_scope": "streams"}
        if gpu is not None:
            options["device"] = f"cuda:{gpu}"
        if candidates is not None:
            options["candidates"] = ",".join(candidates)
        if sensitivity is not None:
            weights = os.path.join(d, "sensitivity.json")
            with open(weights, "w") as f:
                json.dump(dict(sensitivity), f)
            options["sensitivity"] = weights
        if hessians is not None:
            stats = os.path.join(d, "calibration.safetensors")
            save_hessians(stats, dict(hessians))
            options["calibration"] = stats
        api.compress_state_dict(sd, path, verbose=False, **options)
        archive = _native.Archive(path)
        for n, m in tables:
            op = archive.linear(f"{n}.weight", None)
            source = _archive_source(archive, n, False)
            _replace(model, n, HyperEmbedding._like(m, op, source=source))
        load_into(model, path)  # (which marks a transformers model, as quantize does)
    return model


def _coding_gpu(model: nn.Module, device: str | int | torch.device | None) -> int | None:
    """The CUDA ordinal :func:`quantize_budget` codes trellis candidates on (None: the CPU).
    Asked for by name, a GPU whose kernels do not load is a :class:`hypercodec.CudaError`; by
    default, the weights' GPU where the kernels load, else the CPU."""
    from . import cuda

    if device is None:
        p = next((p for p in model.parameters() if p.is_cuda), None)
        if p is None:
            return None
        index = p.device.index if p.device.index is not None else torch.cuda.current_device()
        try:
            cuda.kernels(index)
        except _native.HypercodecError:
            return None
        return index
    try:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _native.InvalidInputError(f"device {str(device)!r}: {e}") from None
    if d.type == "cpu":
        return None
    if d.type != "cuda":
        raise _native.InvalidInputError(f"device {str(device)!r}: trellis candidates are coded on a CUDA device or the CPU")
    if not torch.cuda.is_available():
        raise _native.CudaError(f"device {str(device)!r}: torch sees no CUDA device")
    index = d.index if d.index is not None else torch.cuda.current_device()
    cuda.kernels(index)
    return index


def _gram(x: torch.Tensor) -> torch.Tensor:
    """``xᵀx`` in float32; for wide rows from three products of halves (its two diagonal blocks
    and one off-diagonal block, mirrored): three quarters of the multiplications."""
    d = x.shape[1]
    if d < 1024:
        return x.T @ x
    h = d // 2
    a, b = x[:, :h], x[:, h:]
    out = torch.empty(d, d, dtype=x.dtype, device=x.device)
    out[:h, :h] = a.T @ a
    out[h:, h:] = b.T @ b
    ab = a.T @ b
    out[:h, h:] = ab
    out[h:, :h] = ab.T
    return out


class InputStatistics:
    """The collector behind :func:`collect_hessians`, as a context: while it is entered, every
    forward pass of the model adds its ``nn.Linear`` inputs' products (whatever runs it —
    :func:`collect_fisher`'s passes too, so that one pass serves both), and :meth:`result`
    gives ``E[x·xᵀ]`` per layer so far. Each batch's product is formed in float32 (wide inputs
    by :func:`_gram`'s halves) and summed in float32 for at most 16 batches before it joins the
    float64 total. Consecutive layers fed the same tensor (q/k/v, gate/up) share its product
    (computed once); the tensor counts as the same while its version counter is (an in-place
    write that bypasses it, through ``.data`` or a raw pointer, between two such layers would go
    unseen)."""

    FLUSH = 16

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._sums: dict[str, torch.Tensor] = {}
        self._pending: dict[str, list[Any]] = {}  # name -> [float32 sum, batches in it]
        self._counts: dict[str, int] = {}
        # The last input seen (the tensor itself, held so that its memory is not reused, and
        # its version) and its product: consecutive layers fed that same tensor reuse it.
        self._last: list[Any] = [None, -1, None]
        self._hooks: list[Any] = []

    def _hook(self, name: str) -> Callable:
        def f(_module, inputs):
            t = inputs[0]
            x = t.detach().reshape(-1, t.shape[-1])
            # (Inference tensors keep no version: their products are not shared.)
            version = None if t.is_inference() else t._version
            last = self._last
            if version is not None and last[0] is t and last[1] == version:
                prod = last[2]
            else:
                with torch.no_grad():
                    prod = _gram(x.to(torch.float32))
                last[:] = [t, version, prod]
            pending = self._pending.get(name)
            if pending is None:
                self._pending[name] = [prod.clone(), 1]
            else:
                pending[0] += prod
                pending[1] += 1
                if pending[1] >= self.FLUSH:
                    self._flush(name)
            self._counts[name] = self._counts.get(name, 0) + x.shape[0]

        return f

    def _flush(self, name: str) -> None:
        pending = self._pending.pop(name, None)
        if pending is None:
            return
        total = pending[0].to(torch.float64)
        if name in self._sums:
            self._sums[name] += total
        else:
            self._sums[name] = total

    def __enter__(self) -> "InputStatistics":
        for name, m in self.model.named_modules():
            if isinstance(m, nn.Linear) or _is_conv1d(m):  # (Conv1D: GPT-2's, its input as a Linear's)
                self._hooks.append(m.register_forward_pre_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._last[:] = [None, -1, None]
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def run(self, batches: Iterable[Any]) -> None:
        """Forward passes of the model over ``batches`` (each ``model(**b)`` when a mapping,
        else ``model(b)``), without gradients: their inputs join the statistics."""
        with torch.no_grad():
            for b in batches:
                self.model(**b) if isinstance(b, Mapping) else self.model(b)

    def result(self) -> dict[str, np.ndarray]:
        """``E[x·xᵀ]`` of every layer seen (float32 ``in × in``), by layer name."""
        for name in list(self._pending):
            self._flush(name)
        return {
            n: (self._sums[n] / max(self._counts[n], 1)).to(torch.float32).cpu().numpy() for n in self._sums
        }


def collect_hessians(model: nn.Module, batches: Iterable[Any]) -> dict[str, np.ndarray]:
    """The second moment ``E[x·xᵀ]`` of every ``nn.Linear``'s (and transformers ``Conv1D``'s) inputs (by layer name, float32
    ``in × in``), over the calibration ``batches`` (each passed as ``model(**b)`` when a mapping,
    else ``model(b)``), by forward hooks (:class:`InputStatistics`: each batch's product in
    float32, accumulated in float64; layers fed the same tensor share its product)."""
    with InputStatistics(model) as stats:
        stats.run(batches)
    return stats.result()


def collect_fisher(
    model: nn.Module, batches: Iterable[Any], loss: Callable[[nn.Module, Any], torch.Tensor] | None = None
) -> dict[str, float]:
    """BUDGET's sensitivity weights from a causal LM's own loss: for every ``nn.Linear`` and
    every ``nn.Embedding`` whose weight no linear layer shares (``"{name}.weight"``), the mean
    over its weights of the squared gradient of the next-token loss, averaged over the calibration ``batches`` (token id tensors; a diagonal empirical
    Fisher at the granularity of a batch). To second order a weight error δ raises the loss by
    ``½·Σ F_ii·δ_i²``, about ``½·w·SSE`` for a tensor whose errors spread evenly — the
    ``Σ w·SSE`` that ``mode="budget"`` minimizes. A weight shared by two layers (a tied output
    head) gets the gradient of both uses. Leaves the model's gradients cleared.

    ``loss(model, batch)`` replaces the next-token loss, e.g. for an encoder without one:
    :func:`output_projection_loss` (the squared gradient of a random projection of the output
    is, in expectation, the sensitivity of the output's squared error to each weight)."""
    import torch

    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    shared = {id(m.weight) for m in linears.values()}
    linears.update(
        (n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding) and id(m.weight) not in shared
    )
    sums = {n: 0.0 for n in linears}
    count = 0
    was_training = model.training
    model.eval()
    try:
        for ids in batches:
            model.zero_grad(set_to_none=True)
            if loss is None:
                model(ids, labels=ids).loss.backward()
            else:
                loss(model, ids).backward()
            for n, m in linears.items():
                if m.weight.grad is not None:
                    g = m.weight.grad.detach()
                    # A float32 norm (its reduction is accurate to ~1e-7), squared in float64.
                    sums[n] += torch.linalg.vector_norm(g, dtype=torch.float32).double().item() ** 2 / g.numel()
            count += 1
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if count == 0:
        raise _native.InvalidInputError("collect_fisher needs at least one calibration batch")
    return {f"{n}.weight": s / count for n, s in sums.items()}


def output_projection_loss(
    output: Callable[[nn.Module, Any], torch.Tensor], seed: int = 0
) -> Callable[[nn.Module, Any], torch.Tensor]:
    """A loss for :func:`collect_fisher` on a model without one: ``⟨r, output(model, batch)⟩``
    with a fresh standard normal ``r`` per call (seeded). Its squared gradient averages to
    ``Σ_j (∂y_j/∂w)²``: how much a weight error moves the output ``y`` (an embedding, say) in
    squared error."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        y = output(model, batch)
        r = torch.randn(y.shape, generator=gen, dtype=y.dtype)
        return (y * r).sum()

    return loss


def _logits_kl(student: Any, teacher: Any) -> torch.Tensor:
    """Mean over positions of KL(teacher ‖ student) between two outputs' ``logits`` (or the
    outputs themselves), softmax over the last dimension."""
    s = getattr(student, "logits", student)
    t = getattr(teacher, "logits", teacher)
    if s.shape != t.shape:
        raise _native.InvalidInputError(f"the model's outputs are {tuple(s.shape)}, the teacher's {tuple(t.shape)}")
    s, t = s.float().log_softmax(-1), t.float().log_softmax(-1)
    return (t.exp() * (t - s)).sum(-1).mean()


def _batch_key(batch: Any) -> Any:
    """The object that names a batch for :class:`CachedTeacher`: the batch itself, or a
    mapping's ``input_ids``."""
    return batch.get("input_ids", batch) if isinstance(batch, Mapping) else batch


class CachedTeacher(nn.Module):
    """A causal LM's outputs on its calibration batches, replayed for :func:`distill` from its
    final hidden states instead of running the whole model again: while :meth:`recording`, the
    model's forward passes (those of :func:`collect_hessians`, say) leave the input of its
    output head (``get_output_embeddings()``, copied here as it is now, so the model may then be
    quantized in place) for each batch; ``teacher(batch)`` is that head applied to it. On
    SmolLM2-135M a replay takes 0.19 s where the forward pass takes 0.91 s (512 tokens, 2
    threads).

    The replay must be what the model outputs: the first recorded batch is checked against the
    model's own logits, and a model that transforms its head's output (a logit scale or soft
    cap) leaves the teacher unusable (``exact`` is False; calling it raises
    :class:`InvalidInputError`) — distill with the original model then. A batch is recognised
    by identity (the same tensor object, or a mapping's ``input_ids``); an unrecorded one
    raises. Memory: one hidden state per batch, in the model's dtype (1.2 MB per 512-token
    window of SmolLM2)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        import copy

        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None:
            raise _native.InvalidInputError("CachedTeacher needs a model with an output head (get_output_embeddings)")
        self._model = [model]  # not a submodule: the cache does not own or copy the model
        self.head = copy.deepcopy(head).requires_grad_(False)
        self._hidden: dict[int, tuple[Any, torch.Tensor]] = {}
        self.exact: bool | None = None

    def recording(self) -> Any:
        """A context in which every forward pass of the model records its batch's hidden state."""
        import contextlib

        model = self._model[0]
        head = model.get_output_embeddings()
        current: list[Any] = [None]

        def enter(_m, args, kwargs):
            current[0] = args[0] if args else kwargs.get("input_ids")

        def keep(_m, inputs):
            if current[0] is not None:
                self._hidden[id(current[0])] = (current[0], inputs[0].detach())

        def check(_m, _args, _kwargs, output):
            key, current[0] = current[0], None
            if self.exact is None and key is not None and id(key) in self._hidden:
                want = getattr(output, "logits", output)
                with torch.no_grad():
                    got = self.head(self._hidden[id(key)][1])
                if not isinstance(want, torch.Tensor) or got.shape != want.shape:
                    self.exact = False
                else:
                    scale = want.detach().float().abs().max().clamp_min(1e-30)
                    self.exact = bool(((got.float() - want.detach().float()).abs().max() <= 1e-5 * scale).item())

        @contextlib.contextmanager
        def ctx():
            hooks = [
                model.register_forward_pre_hook(enter, with_kwargs=True),
                head.register_forward_pre_hook(keep),
                model.register_forward_hook(check, with_kwargs=True),
            ]
            try:
                yield self
            finally:
                for h in hooks:
                    h.remove()

        return ctx()

    @property
    def recorded(self) -> int:
        """How many batches have a hidden state."""
        return len(self._hidden)

    def forward(self, batch: Any) -> torch.Tensor:
        key = _batch_key(batch)
        if not self.exact:
            raise _native.InvalidInputError(
                "CachedTeacher recorded nothing usable: "
                + ("no batch was recorded" if self.exact is None else "the model's logits are not its head's output")
                + "; distill with the original model instead"
            )
        entry = self._hidden.get(id(key))
        if entry is None or entry[0] is not key:
            raise _native.InvalidInputError(
                "CachedTeacher has no hidden state for this batch (batches are recognised by identity: pass the "
                "recorded tensors themselves)"
            )
        return self.head(entry[1])


class _FloatTwin(nn.Module):
    """A frozen float32 layer standing in for a compressed one during :func:`distill`: inputs
    of any float dtype, outputs in the input's (as the compressed layer)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(torch.float32)).to(x.dtype)


def _dense_layer(m: nn.Module) -> nn.Module:
    """A float32 ``nn.Linear`` / ``nn.Conv2d`` holding the compressed ``m``'s decoded weight and
    its bias (a trainable layer's own, else the operator's): what ``m`` computes."""
    w = _op_weight(m.op)
    if isinstance(m, HyperConv1d):
        twin: nn.Module = torch.nn.utils.skip_init(
            nn.Conv1d, m.in_channels, m.out_channels, groups=m.groups, bias=m.bias is not None,
            padding_mode=m.padding_mode, **m.conv1d,
        )
        bias = m.bias
    elif isinstance(m, HyperConv2d):
        out, per_group, kh, kw = m.weight_shape
        # (skip_init: the weights are overwritten below, a random init would be wasted work.)
        twin = torch.nn.utils.skip_init(
            nn.Conv2d,
            per_group * m.groups,
            out,
            (kh, kw),
            m.stride,
            m.padding,
            m.dilation,
            m.groups,
            bias=m.bias is not None,
            padding_mode=getattr(m, "padding_mode", "zeros"),
        )
        bias = m.bias
    else:
        bias = m.bias if m.bias is not None else m.op.bias
        twin = torch.nn.utils.skip_init(nn.Linear, m.in_features, m.out_features, bias=bias is not None)
    with torch.no_grad():
        twin.weight.copy_(w.reshape(twin.weight.shape))
        if bias is not None:
            twin.bias.copy_(torch.as_tensor(bias, dtype=torch.float32))
    return twin


def _dense_twin(m: nn.Module, device: torch.device) -> nn.Module:
    """A frozen float layer computing what the compressed ``m`` computes (its decoded weight),
    differentiable with respect to its input."""
    return _FloatTwin(_dense_layer(m).requires_grad_(False).to(device))


def norm_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The float parameters of ``model``'s normalization layers (``LayerNorm``, ``GroupNorm``,
    batch norms and any module whose class name ends in ``Norm``, such as Llama's
    ``LlamaRMSNorm``): what :func:`distill` tunes by default. Stored as they are (a few
    thousand values per layer), they cost nothing in the compressed size."""
    seen: set[int] = set()
    out = []
    for m in model.modules():
        if type(m).__name__.endswith("Norm") or isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)):
            for p in m.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def distill(
    model: nn.Module,
    teacher: nn.Module,
    batches: Iterable[Any],
    lr: float = 1e-3,
    epochs: int = 1,
    params: Iterable[nn.Parameter] | None = None,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    forward: Callable[[nn.Module, Any], Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Tunes the float parameters a quantized ``model`` keeps (by default its normalization
    layers' gains and biases, :func:`norm_parameters`) so that its outputs match the original
    ``teacher``'s on ``batches`` (token id tensors, or whatever both models take; a
    :class:`CachedTeacher` replays a causal LM's outputs recorded during calibration): Adam at
    ``lr`` with a cosine schedule over ``epochs`` passes, ``loss(student_out, teacher_out)``
    (default: KL(teacher ‖ model) of the ``logits``, averaged over positions) of the outputs
    ``forward(model, batch)`` (default ``model(batch)``; an encoder's pooled embedding, say).
    The compressed
    weights are unchanged: only parameters that are stored as floats anyway move, so the
    stored size does not change. The compressed layers run as frozen dense twins of their
    decoded weights during the passes (hooks on them do not fire; the model on one device;
    memory: one float copy of the quantized layers beside
    the teacher), and are back in place afterwards. Returns the first and last batch losses,
    the number of steps and of tuned values. A loss that is not finite (or any error) stops the
    passes with the tuned parameters as they were before the call."""
    batches = list(batches)
    loss = loss or _logits_kl
    forward = forward or (lambda m, batch: m(batch))
    params = list(norm_parameters(model) if params is None else params)
    if not params:
        raise _native.InvalidInputError("distill found no float parameters to tune (no normalization layers)")
    if not batches:
        raise _native.InvalidInputError("distill needs at least one batch")
    device = params[0].device
    # Every path of a layer registered twice is swapped (and put back).
    swapped = [
        (name, m)
        for name, m in model.named_modules(remove_duplicate=False)
        if isinstance(m, (HyperLinear, HyperConv2d)) and m.op is not None
    ]
    flags = {id(p): p.requires_grad for p in model.parameters()}
    was_training, teacher_training = model.training, teacher.training
    wanted = {id(p) for p in params}
    steps = epochs * len(batches)
    first = last = math.nan
    before = [p.detach().clone() for p in params]
    done = False
    try:
        twins: dict[int, nn.Module] = {}
        for name, m in swapped:
            if id(m) not in twins:
                twins[id(m)] = _dense_twin(m, device)
            _replace(model, name, twins[id(m)])
        for p in model.parameters():
            p.requires_grad_(id(p) in wanted)
        for p in params:
            p.requires_grad_(True)
        model.eval()
        teacher.eval()
        opt = torch.optim.Adam(params, lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps))
        step = 0
        for _ in range(epochs):
            for batch in batches:
                with torch.no_grad():
                    want = forward(teacher, batch)
                value = loss(forward(model, batch), want)
                if not torch.isfinite(value):
                    raise _native.InvalidInputError(
                        f"distill's loss is {value.item()} at step {step + 1} (learning rate {lr} too high, or "
                        "non-finite outputs): the parameters are left as they were"
                    )
                value.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step()
                step += 1
                last = value.item()
                if step == 1:
                    first = last
                if progress is not None and (step % 16 == 0 or step == steps):
                    progress(f"distill step {step}/{steps}: loss {last:.4f}")
        done = True
    finally:
        if not done:
            # Interrupted or failed: nothing half-tuned is left behind.
            with torch.no_grad():
                for p, b in zip(params, before):
                    p.copy_(b)
        for name, m in swapped:
            _replace(model, name, m)
        for p in model.parameters():
            p.requires_grad_(flags.get(id(p), True))
        model.train(was_training)
        teacher.train(teacher_training)
    return {"steps": float(steps), "first_loss": first, "last_loss": last, "values": float(sum(p.numel() for p in params))}


def save_hessians(path: str, hessians: dict[str, np.ndarray]) -> None:
    """Writes the statistics of :func:`collect_hessians` as a safetensors file (float32, one
    ``in × in`` matrix per layer name) for ``hypercodec compress --calibration PATH``."""
    from .api import _write_safetensors

    _write_safetensors(path, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in hessians.items()})


def dequantize(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Replaces every stored layer of ``model`` (:class:`HyperLinear`, :class:`HyperConv2d`,
    :class:`HyperEmbedding`) by the dense ``nn.Linear`` / ``nn.Conv2d`` / ``nn.Embedding`` of its
    decoded weight (the stored form's values, not the original's), in ``dtype`` (default: each
    layer's own; a linear layer keeps no dtype: the model's floating parameters'), on the device
    of the model's parameters (the CPU for a model of stored layers only): for export to tools
    that read dense weights, or full fine-tuning.
    Layers that share one stored form (a tied head and table) share one dense weight. A
    transformers model loses hypercodec's quantization config (``model.dequantize()`` does the
    same through its quantizer). Returns ``model`` (a bare stored layer: its dense twin)."""
    shared: dict[int, nn.Parameter] = {}
    floats = [p for p in model.parameters() if p.is_floating_point() and not p.is_meta]
    linear_dtype = floats[0].dtype if floats else torch.float32
    home = floats[0].device if floats else torch.device("cpu")

    def weight(layer: Any, shape: tuple[int, ...], dt: torch.dtype) -> nn.Parameter:
        key = id(layer.op)
        if key not in shared or tuple(shared[key].shape) != tuple(shape):
            values = _op_weight(layer.op).reshape(shape).to(home, dtype or dt)
            shared[key] = nn.Parameter(values)
        return shared[key]

    def dense(layer: nn.Module) -> nn.Module | None:
        if isinstance(layer, (HyperLinear, HyperConv2d, HyperEmbedding)) and layer.op is None:
            raise _native.InvalidInputError(f"this {type(layer).__name__} has no weight yet: nothing to dequantize")
        if isinstance(layer, HyperLinear):
            bias = layer.op.bias if layer.bias is None else layer.bias.detach().float().numpy()
            new = nn.Linear(layer.in_features, layer.out_features, bias=bias is not None, device="meta")
            new.weight = weight(layer, (layer.out_features, layer.in_features), linear_dtype)
            if bias is not None:
                new.bias = nn.Parameter(torch.as_tensor(np.asarray(bias, np.float32)).to(home, dtype or linear_dtype))
            return new
        if isinstance(layer, HyperConv2d):
            common = dict(groups=layer.groups, bias=layer.bias is not None, padding_mode=layer.padding_mode, device="meta")
            if isinstance(layer, HyperConv1d):
                new = nn.Conv1d(layer.in_channels, layer.out_channels, **layer.conv1d, **common)
            else:
                oc, _, kh, kw = layer.weight_shape
                new = nn.Conv2d(layer.in_channels, oc, (kh, kw), layer.stride, layer.padding, layer.dilation, **common)
            dt = HyperConv2d.weight.fget(layer).dtype  # (a HyperConv1d's own weight decodes: the dtype alone here)
            new.weight = weight(layer, layer.stored_shape, dt)
            if layer.bias is not None:
                new.bias = nn.Parameter(layer.bias.detach().to(home, dtype or dt).clone())
            return new
        if isinstance(layer, HyperEmbedding):
            new = nn.Embedding(layer.num_embeddings, layer.embedding_dim, layer.padding_idx, layer.max_norm,
                               layer.norm_type, device="meta")
            new.weight = weight(layer, (layer.num_embeddings, layer.embedding_dim), layer.dtype)
            return new
        return None

    whole = dense(model)
    if whole is not None:
        return whole
    for name, layer in list(model.named_modules(remove_duplicate=False)):
        new = dense(layer) if name else None
        if new is not None:
            _replace(model, name, new)
    config = getattr(model, "config", None)
    current = getattr(config, "quantization_config", None)
    if current is not None and getattr(current, "quant_method", None) == "hypercodec":
        del config.quantization_config
        model.__dict__.pop("hf_quantizer", None)
        if "is_quantized" in model.__dict__:
            model.is_quantized = False
    return model


def load_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> nn.Module:
    """Loads a state dict saved from a quantized model (``model.state_dict()``, e.g. through
    ``torch.save`` / ``torch.load(weights_only=True)``) into a fresh dense ``model`` of the same
    architecture: each ``nn.Linear`` / ``nn.Conv2d`` / ``nn.Embedding`` whose ``weight_hwz`` is
    in ``state_dict`` becomes a :class:`HyperLinear` / :class:`HyperConv2d` /
    :class:`HyperEmbedding` on that stored form (its dense weight is dropped unused; build
    ``model`` on the meta device to never allocate it: a Hugging Face model's computed buffers,
    such as rotary frequencies, are then rebuilt from its ``config``; for other models use
    accelerate's ``init_empty_weights()``, which keeps buffers on the CPU); a layer tied to one
    of them (the same weight ``Parameter``, no entry of its own) shares its operator. Returns
    ``model``.

        >>> sd = quantized.state_dict()                                  # doctest: +SKIP
        >>> fresh = load_state_dict(make_model(), sd)                    # doctest: +SKIP
    """
    kinds = {nn.Linear: HyperLinear, nn.Conv1d: HyperConv1d, nn.Conv2d: HyperConv2d, nn.Embedding: HyperEmbedding}
    # Every name of every module: a layer used at two places (saved under both) is one
    # placeholder at both.
    modules = list(model.named_modules(remove_duplicate=False))
    placed: dict[int, nn.Module] = {}

    def kind_of(m: nn.Module) -> Any:
        return HyperLinear if _is_conv1d(m) else next((v for k, v in kinds.items() if isinstance(m, k)), None)

    stored = {id(m.weight): n for n, m in modules if f"{n}.{HWZ_KEY}" in state_dict and kind_of(m) is not None}
    tied: list[tuple[str, str]] = []
    for name, m in modules:
        kind = kind_of(m)
        if f"{name}.{HWZ_KEY}" in state_dict:
            if kind is None:
                raise _native.InvalidInputError(
                    f"`{name}` has a stored weight but is {type(m).__name__}, not Linear, Conv1D, Conv1d, Conv2d or Embedding"
                )
            if id(m) not in placed:
                placed[id(m)] = kind.placeholder(_as_linear(m))
            _replace(model, name, placed[id(m)])
        elif (
            kind in (HyperLinear, HyperEmbedding)
            and id(m.weight) in stored
            and f"{name}.weight" not in state_dict
            and getattr(m, "bias", None) is None
        ):
            tied.append((name, stored[id(m.weight)]))
            _replace(model, name, kind.placeholder(m, tied=stored[id(m.weight)]))
    model.load_state_dict(state_dict, strict=strict, assign=True)
    _restore_meta_buffers(model)
    for name, source in tied:
        owner = model.get_submodule(source)
        layer, op = model.get_submodule(name), owner.op
        if op is not None:
            layer._check_loaded(op)
        layer.op = op
        # What pickling the tied layer carries (the bytes the owner was loaded from).
        layer._hwz_source = lambda t=owner._hwz: None if t is None else t.numpy()
    _mark_for_transformers(model)
    return model


def _fresh_like(module: nn.Module, config: Any) -> nn.Module:
    """A new module of ``module``'s class built from ``config``; constructor arguments besides the
    config are taken from the module's attributes of the same names (GPT-Neo's attention takes
    its ``attention_type`` and ``layer_id`` so)."""
    try:
        return type(module)(config=config)
    except TypeError as first:
        import inspect

        try:
            params = list(inspect.signature(type(module).__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            raise first from None
        kwargs: dict[str, Any] = {}
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            value = config if p.name == "config" else getattr(module, p.name, inspect.Parameter.empty)
            if isinstance(value, (torch.Tensor, nn.Module)):
                value = inspect.Parameter.empty  # (a state, not a constructor argument)
            if value is not inspect.Parameter.empty:
                kwargs[p.name] = value
            elif p.default is inspect.Parameter.empty:
                raise first from None
        return type(module)(**kwargs)


def rebuild_meta_buffers(model: nn.Module, config: Any) -> None:
    """Buffers computed at construction (rotary frequencies, BERT's position ids) are built
    again on the CPU from ``config``: a model made on the meta device has none of their values.
    A module that holds nothing loaded (no parameters, no children: a rotary embedding) is
    replaced by a fresh one; any other keeps what was loaded into it and takes only its meta
    buffers from a fresh one (replacing BERT's embeddings whole put random tables in place of
    the loaded ones)."""
    for name, module in list(model.named_modules()):
        meta = [k for k, b in module.named_buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        if all(isinstance(getattr(module, f"scalar_{k}", None), numbers.Real) for k in meta):
            # A buffer that holds a number the module keeps beside it (Gemma's scaled embedding:
            # `embed_scale` and `scalar_embed_scale`; its constructor takes no config).
            for k in meta:
                module._buffers[k] = torch.tensor(getattr(module, f"scalar_{k}"))
            continue
        try:
            fresh = _fresh_like(module, config)
        except TypeError as e:
            raise _native.InvalidInputError(f"cannot rebuild module `{name}` ({type(module).__name__}): {e}")
        if next(module.parameters(), None) is None and next(module.children(), None) is None:
            _replace(model, name, fresh)
            continue
        for key in meta:
            module._buffers[key] = fresh._buffers[key]


def _restore_meta_buffers(model: nn.Module) -> None:
    """After a state dict is loaded into a model built on the meta device: its non-persistent
    buffers (rotary frequencies, masks: computed when a module is built, never saved) are still
    meta. A Hugging Face model's modules are rebuilt from its ``config``; any other model's
    meta buffers are an error that says how to build it, rather than a failing forward."""
    if not any(b.is_meta for b in model.buffers()):
        return
    config = getattr(model, "config", None)
    if config is not None:
        rebuild_meta_buffers(model, config)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise _native.InvalidInputError(
            f"buffers {left[:4]}{' ...' if len(left) > 4 else ''} are still on the meta device: a state "
            "dict does not hold non-persistent buffers (computed when the module is built). Build the "
            "model under accelerate's init_empty_weights() (parameters on meta, buffers on the CPU) "
            'instead of torch.device("meta"), or set those buffers before the forward'
        )


def _state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors ``model.state_dict()`` would give, by name (tied and shared tensors under
    each name, persistent buffers only), without serializing every compressed layer."""
    out = {}
    for prefix, m in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        out.update({dot + k: v for k, v in m._parameters.items() if v is not None})
        out.update({dot + k: v for k, v in m._buffers.items() if v is not None and k not in m._non_persistent_buffers_set})
    return out


def _state_keys(model: nn.Module) -> list[str]:
    """The names ``model.state_dict()`` would give (:func:`_state_tensors`)."""
    return list(_state_tensors(model))


def _archive_source(archive: "_native.Archive", layer: str, bias: bool, transposed: bool = False) -> Any:
    """The stored form of ``layer`` (``.weight``, and ``.bias`` when the runtime holds it) read
    back from ``archive`` when the layer is saved: nothing is kept in memory meanwhile.
    ``transposed``: the weight is stored ``[in, out]`` (a ``Conv1D``'s), saved as ``weight_in_out``."""
    return lambda: archive.tensor_hwz(f"{layer}.weight", f"{layer}.bias" if bias else None, transposed)


def load_into(model: nn.Module, path: str) -> nn.Module:
    """Fills ``model`` from the archive ``path``: each ``nn.Linear`` (or GPT-2's ``Conv1D``,
    whose weight is stored ``[in, out]`` and run so) whose weight is stored
    becomes a :class:`HyperLinear` on the stored form (its dense weight is never built); the
    other parameters and buffers are decoded into place. Returns ``model``.

    As ``load_state_dict(..., strict=False)``: a stored tensor whose shape differs from the
    model's is an error, naming both, and so is a stored weight whose layer has a bias the
    archive does not hold (it was dropped), both before any layer is replaced."""
    archive = _native.Archive(path)
    names = set(archive.names())
    linears = [
        (n, m)
        for n, m in model.named_modules()
        if (isinstance(m, nn.Linear) or _is_conv1d(m)) and f"{n}.weight" in names and _replaceable(model, n)
    ]
    # Every stored tensor's shape (the layers' and the rest: a norm of the wrong width failed
    # in torch's load_state_dict after the layers were replaced); a scalar stored as [1] loads,
    # as torch's load_state_dict takes it.
    for key, own in _state_tensors(model).items():
        stored = tuple(archive.shape(key)) if key in names else None
        if stored is not None and stored != tuple(own.shape) and not (own.dim() == 0 and stored == (1,)):
            raise _native.InvalidInputError(
                f"{path}: `{key}` is stored as {list(stored)}; the model's is {list(own.shape)}"
            )
    for name, layer in linears:
        if layer.bias is not None and f"{name}.bias" not in names:
            raise _native.FormatError(f"{path}: holds `{name}.weight` but not `{name}.bias`, which the model's layer has")
    done = set()
    every = list(model.named_modules(remove_duplicate=False))  # (before any is replaced)
    made: dict[int, nn.Module] = {}
    for name, layer in linears:
        bias = None
        if layer.bias is not None and f"{name}.bias" in names:
            bias = np.ascontiguousarray(archive.read(f"{name}.bias"), dtype=np.float32)
            done.add(f"{name}.bias")
        # A Conv1D's weight is stored as it holds it, [in, out]: its operator runs it so.
        t = _is_conv1d(layer)
        op = archive.linear(f"{name}.weight", bias, None, t)
        made[id(layer)] = HyperLinear(op, source=_archive_source(archive, name, bias is not None, t))
        done.add(f"{name}.weight")
    # Every name of a stored layer (a layer used at several places: one stored layer at all).
    for name, layer in every:
        if id(layer) in made and name:
            _replace(model, name, made[id(layer)])
    rest = {}
    for key in _state_keys(model):
        if key in names and key not in done:
            rest[key] = torch.from_numpy(archive.read(key))
    model.load_state_dict(rest, strict=False)
    _mark_for_transformers(model)
    return model
