"""The seed projects' entry points, mapped onto hypercodec (thin aliases; each says what
differs). New code should call :mod:`hypercodec` and :mod:`hypercodec.nn` directly.

HyperTensor: :class:`PrecisionFormat`, :class:`WeightOption`, :func:`scan_model`,
:func:`wrap_model_with_hypertensor`. HyperQuant: :func:`convert_linears`,
:func:`calibrate_lattice_bps_to_snr`, :func:`lattice_alpha` (the shipped calibration table: no
start-up sweep). Hyper Glyph: :class:`HyperGlyphConfig`, :class:`HyperGlyphCodec`,
:func:`save_compressed` (writes HWZ1), :func:`load_compressed` (reads HWZ1 and legacy zips).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, fields
from typing import Any

from . import _native
from .api import compress_state_dict, decompress_state_dict


class PrecisionFormat:
    """HyperTensor's per-tensor formats, as hypercodec candidate names."""

    FP32 = "f32"
    BF16 = "bf16"
    FP16 = "f16"
    INT8 = "int8-row"
    INT4 = "int4-row"


class WeightOption:
    """HyperTensor's modes, as hypercodec planner modes (``hypercodec plan --help`` states
    each rule; unlike the seed's, every candidate is measured, with scales)."""

    LOWEST = "lowest"
    HIGHEST = "highest"
    ALLOW = "allow"
    CLOSEST = "closest"
    AVERAGE = "average"
    BEST = "best"
    PER_WEIGHT = "per-weight"
    PER_BLOCK = "per-block"


def _state_dict(model: Any) -> dict:
    return {k: v for k, v in model.state_dict().items() if getattr(v, "is_floating_point", lambda: True)()}


def scan_model(
    model: Any,
    eps_fp16: float = 0.0,
    eps_bf16: float = 0.0,
    option: str = WeightOption.ALLOW,
    block_size: int = 32,
    prefer_bf16: bool = False,
) -> dict:
    """Plans ``model``'s weights with the planner mode ``option`` and returns the Plan (a
    dict: per tensor the recipe, its measured bytes and error, the reason). Differs: the plan
    is measured by compressing (the archive is discarded); ``block_size`` is rows per block."""
    with tempfile.TemporaryDirectory() as d:
        info = compress_state_dict(
            _state_dict(model),
            os.path.join(d, "scan.hwz"),
            mode=option,
            eps_fp16=eps_fp16,
            eps_bf16=eps_bf16,
            block_rows=block_size,
            prefer_bf16=prefer_bf16,
        )
    return info.get("plan") or {}


def wrap_model_with_hypertensor(
    model: Any, plan: dict | None = None, option: str = WeightOption.ALLOW, inference_only: bool = True
) -> Any:
    """Compresses ``model`` by ``plan`` (or the mode ``option``) and swaps its linear layers for
    :class:`hypercodec.nn.HyperLinear` on the stored form. Differs: training goes through
    ``hypercodec.nn.quantize(model, trainable=True)`` (straight-through estimator), so
    ``inference_only=False`` is refused here."""
    if not inference_only:
        raise _native.InvalidInputError(
            "wrap_model_with_hypertensor builds inference layers; train with hypercodec.nn.quantize(model, trainable=True)"
        )
    import json

    from .nn import load_into

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.hwz")
        if plan is not None:
            plan_path = os.path.join(d, "plan.json")
            with open(plan_path, "w") as f:
                json.dump(plan, f)
            compress_state_dict(_state_dict(model), path, plan=plan_path)
        else:
            compress_state_dict(_state_dict(model), path, mode=option)
        return load_into(model, path)


def convert_linears(model: Any, bps: float = 4.0, lattice: str = "e8", skip: tuple = ("lm_head",)) -> Any:
    """HyperQuant's conversion: every linear layer to lattice + rANS at ``bps`` bits per value
    (all side information counted), run from the stored form on the CPU runtime."""
    from .nn import quantize

    return quantize(model, bps=bps, method=f"{lattice}@{bps:g}", skip=skip)


def lattice_alpha(bps: float, lattice: str = "e8") -> float:
    """The scale α that gives ``bps`` bits per value on Gaussian data (shipped table)."""
    return _native.lattice_alpha(bps, lattice)


def calibrate_lattice_bps_to_snr(bps: float, lattice: str = "e8") -> float:
    """The SNR (dB) the lattice reaches at ``bps`` on Gaussian data (shipped table; no sweep)."""
    return _native.lattice_predict(lattice_alpha(bps, lattice), lattice)[0]


@dataclass
class HyperGlyphConfig:
    """Hyper Glyph's settings that hypercodec honours (each a ``compress`` flag). ``mode``
    ``auto``/``compact`` → the measured AUTO rule, ``standard`` → the codebook encoding."""

    mode: str = "auto"
    block_size: int | None = None
    n_prototypes: int | None = None
    residual_k: float | None = None
    residual_dtype: str | None = None
    scale_mode: str | None = None
    seed: int | None = None
    compress_bias: bool = False
    min_tensor_size: int | None = None
    target_ratio: float | None = None
    hdc_dim: int | None = None
    n_buckets: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "compact", "standard"):
            raise _native.InvalidInputError(f"mode {self.mode!r}: one of 'auto', 'compact', 'standard'")

    def options(self) -> dict:
        opts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "mode"}
        opts["encoding"] = "codebook" if self.mode == "standard" else "auto"
        return opts


class HyperGlyphCodec:
    """Hyper Glyph's codec object over hypercodec's pipeline (writes HWZ1, reads both)."""

    def __init__(self, config: HyperGlyphConfig | None = None) -> None:
        self.config = config or HyperGlyphConfig()

    def compress(self, state_dict: dict, path: str) -> dict:
        return compress_state_dict(state_dict, path, **self.config.options())

    def decompress(self, path: str) -> dict:
        return decompress_state_dict(path)


def save_compressed(state_dict: dict, path: str, config: HyperGlyphConfig | None = None) -> dict:
    """Writes an HWZ1 archive (not the legacy zip) with Hyper Glyph's settings."""
    return HyperGlyphCodec(config).compress(state_dict, path)


def load_compressed(path: str) -> dict:
    """Reads an HWZ1 archive or a legacy Hyper Glyph zip ``.hwz`` into float32 arrays."""
    return decompress_state_dict(path)
