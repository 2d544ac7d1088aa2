"""PyTorch layers that keep only the compressed form of their weight (requires torch).

:class:`HyperLinear` replaces ``nn.Linear`` (and ``nn.Conv2d``'s 1×1 case is a linear layer
too); its forward pass runs on hypercodec's CPU runtime straight from the stored codes.
:func:`quantize` swaps the linear layers of a model in place; :func:`load_into` builds them from
an archive without ever holding their dense weights. These layers are for inference: they have
no gradient (``inference_only``).

    >>> import torch, hypercodec.nn as hnn
    >>> model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    >>> hnn.quantize(model, bps=4, method="lattice-fixed")  # doctest: +SKIP
    >>> model(torch.randn(2, 256)).shape  # doctest: +SKIP
    torch.Size([2, 10])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from . import _native


def method_spec(method: str, bps: float) -> str:
    """The candidate name of ``method`` at ``bps`` bits per value: ``lattice`` → ``e8@{bps}``
    (E8 + rANS, all-in rate), ``lattice-fixed`` → ``e8-fixed{bits}`` (fixed-rate E8, the fastest
    form), ``affine`` → ``int{bits}`` (groups of 128), ``affine-row`` → ``int{bits}-row``; any
    other string is taken as a candidate name itself (``int8-row``, ``e8@3.5``, ``bf16``, ...)."""
    bits = int(round(bps))
    table = {
        "lattice": f"e8@{bps:g}",
        "lattice-fixed": f"e8-fixed{bits}",
        "affine": f"int{bits}",
        "affine-row": f"int{bits}-row",
    }
    return table.get(method, method)


class HyperLinear(nn.Module):
    """``y = x·Wᵀ + b`` with ``W`` kept compressed (a :class:`hypercodec.Linear`); float32
    computation, outputs in the input's dtype."""

    inference_only = True

    def __init__(self, op: _native.Linear) -> None:
        super().__init__()
        self.op = op
        self.in_features = op.cols
        self.out_features = op.rows

    @classmethod
    def from_linear(cls, layer: nn.Linear, spec: str) -> "HyperLinear":
        """Quantizes ``layer``'s weight with the candidate ``spec`` (e.g. ``int4``, ``e8@4``)."""
        w = layer.weight.detach().to(torch.float32).cpu().contiguous().numpy()
        b = None
        if layer.bias is not None:
            b = layer.bias.detach().to(torch.float32).cpu().contiguous().numpy()
        return cls(_native.Linear.quantize(w, spec, b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.detach().to(torch.float32).cpu().contiguous().numpy()
        y = torch.from_numpy(self.op.forward(xs))
        return y.to(dtype=x.dtype, device=x.device)

    def weight_dense(self) -> torch.Tensor:
        """The decoded weight (for checks; the layer itself never holds it)."""
        return torch.from_numpy(np.asarray(self.op.weight()))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"path={self.op.path}, held_bytes={self.op.held_bytes}"
        )


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent = model
    *path, last = name.split(".")
    for p in path:
        parent = getattr(parent, p)
    setattr(parent, last, new)


def quantize(
    model: nn.Module,
    bps: float = 4.0,
    method: str = "lattice",
    skip: Iterable[str] = ("lm_head",),
) -> nn.Module:
    """Replaces every ``nn.Linear`` of ``model`` whose name does not contain one of ``skip``
    by a :class:`HyperLinear` quantized with ``method`` at ``bps`` (see :func:`method_spec`);
    returns ``model``."""
    spec = method_spec(method, bps)
    skip = tuple(skip)
    targets = [
        (n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not any(s in n for s in skip)
    ]
    for name, layer in targets:
        _replace(model, name, HyperLinear.from_linear(layer, spec))
    return model


def load_into(model: nn.Module, path: str) -> nn.Module:
    """Fills ``model`` from the archive ``path``: each ``nn.Linear`` whose weight is stored
    becomes a :class:`HyperLinear` on the stored form (its dense weight is never built); the
    other parameters and buffers are decoded into place. Returns ``model``."""
    archive = _native.Archive(path)
    names = set(archive.names())
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and f"{n}.weight" in names]
    done = set()
    for name, layer in linears:
        bias = None
        if layer.bias is not None and f"{name}.bias" in names:
            bias = np.ascontiguousarray(archive.read(f"{name}.bias"), dtype=np.float32)
            done.add(f"{name}.bias")
        _replace(model, name, HyperLinear(archive.linear(f"{name}.weight", bias)))
        done.add(f"{name}.weight")
    rest = {}
    for key in model.state_dict().keys():
        if key in names and key not in done:
            rest[key] = torch.from_numpy(archive.read(key))
    model.load_state_dict(rest, strict=False)
    return model
