"""Hugging Face causal LMs (transformers 5.x): quantize in memory, save to one ``.hwz`` with the
config and tokenizer inside, and :func:`from_hwz` back into a working model whose linear layers
run from the stored form (their dense weights are never built). Requires torch and transformers.

    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf")  # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")             # doctest: +SKIP
    >>> save_hwz(model, "model.hwz", tok, encoding="lattice", bps=4)                    # doctest: +SKIP
    >>> model, tok = from_hwz("model.hwz")                                              # doctest: +SKIP
    >>> tok.decode(model.generate(**tok("Hello", return_tensors="pt"), max_new_tokens=8)[0])  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import contextlib
import json
import numbers
import os
import tempfile
import threading
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

from . import _native
from .api import compress_state_dict
from .nn import (
    HWZ_KEY,
    HyperConv1d,
    HyperConv2d,
    HyperEmbedding,
    HyperLinear,
    _archive_source,
    _as_linear,
    _is_conv1d,
    _state_keys,
    method_spec,
    quantize,
    rebuild_meta_buffers,
)

__all__ = ["quantize", "save_hwz", "from_hwz"]

TOKENIZER_PREFIX = "hf_tokenizer/"
# A tokenizer file that is not UTF-8 text (SentencePiece's ``tokenizer.model``), as base64.
TOKENIZER_B64_PREFIX = "hf_tokenizer_b64/"


def _unique_state_dict(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict with tied tensors stored once: (tensors, {alias: stored name})."""
    seen: dict[tuple[int, int], str] = {}
    out: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and t.shape == out[seen[key]].shape:
            tied[name] = seen[key]
            continue
        seen[key] = name
        out[name] = t
    return out, tied


def save_hwz(model: nn.Module, path: str, tokenizer: Any = None, **options: Any) -> dict:
    """Compresses the dense ``model`` into the archive ``path`` with the ``compress`` options
    (``encoding="lattice", bps=4``, ``mode="budget", target_bps=3``, ...), its config and
    (when given) its tokenizer's files in the archive's metadata. Returns the summary."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        raise _native.InvalidInputError(
            f"save_hwz takes a Hugging Face model (with a config), not a {type(model).__name__}: "
            "hypercodec.save(model.state_dict(), path) stores any module's tensors"
        )
    stored = [n for n, m in model.named_modules() if isinstance(m, (HyperLinear, HyperEmbedding, HyperConv2d))]
    if stored:
        # Its state dict holds those layers as uint8 stored forms, which an archive of float
        # tensors would leave out (the reload then found them missing).
        raise _native.InvalidInputError(
            f"the model is already quantized by hypercodec ({len(stored)} stored layers, e.g. `{stored[0]}`): "
            "save it with model.save_pretrained(folder) (or torch.save of its state dict), or call "
            "save_hwz on the float model"
        )
    sd, tied = _unique_state_dict(model)
    # The model's class, which from_hwz builds again (a Whisper or BERT model is no causal LM).
    meta = {"hf_config": config.to_json_string(), "hf_tied": json.dumps(tied), "hf_class": type(model).__name__}
    if tokenizer is not None:
        with tempfile.TemporaryDirectory() as d:
            tokenizer.save_pretrained(d)
            for name in sorted(os.listdir(d)):
                if not os.path.isfile(os.path.join(d, name)):
                    continue
                with open(os.path.join(d, name), "rb") as f:
                    data = f.read()
                try:
                    meta[TOKENIZER_PREFIX + name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    meta[TOKENIZER_B64_PREFIX + name] = base64.b64encode(data).decode("ascii")
    return compress_state_dict(sd, path, metadata=meta, **options)


def _set(model: nn.Module, name: str, new: nn.Module) -> None:
    parent = model
    *path, last = name.split(".")
    for p in path:
        parent = getattr(parent, p)
    setattr(parent, last, new)


def _transformers_class(name: Any) -> Any:
    """The transformers model class of that name, or None."""
    import transformers

    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return cls if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) else None


def _build(meta: dict, config: Any, dtype: torch.dtype, path: Any) -> nn.Module:
    """An archive's model on the current device: the class :func:`save_hwz` recorded
    (``hf_class``); for an archive written before classes were recorded, a causal LM as then,
    else the config's first architecture transformers has (``architectures`` names the
    checkpoint's original class, which may not be the one saved)."""
    from transformers import AutoModelForCausalLM

    cls = _transformers_class(meta.get("hf_class"))
    if cls is not None:
        return cls._from_config(config, dtype=dtype)
    try:
        return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as e:  # transformers: no causal LM for this config
        for name in getattr(config, "architectures", None) or []:
            cls = _transformers_class(name)
            if cls is not None:
                return cls._from_config(config, dtype=dtype)
        raise _native.FormatError(f"{path}: the archive names no model class transformers has, and {e}") from None


def from_hwz(path: str, fixed_bits: int | None = None, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """The model and tokenizer saved by :func:`save_hwz`, built as the model's own transformers
    class (archives that do not name one: a causal LM); every stored ``nn.Linear`` weight (and
    GPT-2's ``Conv1D``, whose ``[in, out]`` weight runs as stored) becomes a
    :class:`hypercodec.nn.HyperLinear` on the stored form (``fixed_bits`` converts
    entropy-coded lattice weights to fixed-rate symbols at load, for speed), and a plain input
    embedding a :class:`hypercodec.nn.HyperEmbedding`. The other tensors are decoded, to
    ``dtype``: norms, experts held as one parameter (Mixtral's in transformers 5). The stored
    layers compute in float32 and answer in their input's dtype. The model is built with its
    parameters on the meta device (buffers on the CPU), so no dense copy of a stored layer is
    ever filled. It carries a :class:`HypercodecConfig` naming its stored layers, so
    ``save_pretrained`` / ``from_pretrained`` round-trip it as they do a model quantized on load."""
    from transformers import AutoConfig, AutoTokenizer

    _check_fixed_bits(fixed_bits)
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise _native.InvalidInputError(f"dtype: torch.float16, bfloat16, float32 or float64, not {dtype!r}")
    archive = _native.Archive(os.fspath(path))
    meta = json.loads(archive.metadata_json()).get("safetensors") or {}
    if "hf_config" not in meta:
        raise _native.InvalidInputError(f"{path}: no Hugging Face config in the archive (write it with save_hwz)")
    cfg = json.loads(meta["hf_config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with _parameters_on_meta():
        model = _build(meta, config, dtype, path)
    names = set(archive.names())
    tied = json.loads(meta.get("hf_tied", "{}"))

    def stored(name: str) -> str | None:
        """Where the archive holds ``name``: itself, or the tensor it is tied to (BERT's head
        bias is its prediction layer's)."""
        return name if name in names else tied.get(name) if tied.get(name) in names else None

    # The input embedding on the stored form when it is compressed (a plain lookup: a scaled
    # subclass, as Gemma's, is decoded instead); a tied output head then runs on the same
    # operator (one compressed copy serves both).
    try:
        emb = model.get_input_embeddings()
    except NotImplementedError:  # (a model that names none: Decision Transformer)
        emb = None
    # Every name of the embedding module (one module under several names) takes the stored one.
    emb_names = [n for n, m in model.named_modules(remove_duplicate=False) if m is emb]
    emb_name = emb_names[0] if emb_names else None
    shared: dict[str, _native.Linear] = {}
    stored_emb = None
    if emb_name is not None and f"{emb_name}.weight" in names and type(emb) is nn.Embedding:
        encoding = json.loads(archive.encoding_json(f"{emb_name}.weight"))
        if encoding.get("type") != "raw":
            op = archive.linear(f"{emb_name}.weight", None, fixed_bits)
            source = _archive_source(archive, emb_name, False)
            stored_emb = HyperEmbedding._like(emb, op, source=source)
            for n in emb_names:
                _set(model, n, stored_emb)
            shared[f"{emb_name}.weight"] = op
    for alias, source in tied.items():
        if source in shared and alias.endswith(".weight"):
            head = alias[: -len(".weight")]
            layer = model.get_submodule(head)
            if type(layer) is nn.Embedding and stored_emb is not None and layer.weight.shape == emb.weight.shape:
                # Another embedding module on the same weight (T5's encoder and decoder
                # `embed_tokens`, tied to `shared`): a table on the stored one's operator,
                # tied to it (saved once: the same module under three names saved it thrice).
                _set(model, head, HyperEmbedding._like(layer, shared[source], tied=emb_name,
                                                       source=stored_emb._hwz_source))
            elif isinstance(layer, nn.Linear) and layer.bias is None:
                _set(model, head, HyperLinear(shared[source], tied=emb_name, source=_archive_source(archive, emb_name, False)))
            elif isinstance(layer, nn.Linear):
                # A head with a bias of its own: its operator holds the bias (the codes twice).
                b = stored(f"{head}.bias")
                op = archive.linear(source, None if b is None else archive.read(b), fixed_bits)
                _set(model, head, HyperLinear(op, source=lambda s=source, b=b: archive.tensor_hwz(s, b)))
    for name, module in list(model.named_modules()):
        if (isinstance(module, nn.Linear) or _is_conv1d(module)) and f"{name}.weight" in names:
            b = stored(f"{name}.bias")
            bias = archive.read(b) if b is not None else None
            # GPT-2's Conv1D holds (and the archive stores) its weight [in, out]: run as stored.
            t = _is_conv1d(module)
            op = archive.linear(f"{name}.weight", bias, fixed_bits, t)
            if b in (None, f"{name}.bias"):
                source = _archive_source(archive, name, bias is not None, t)
            else:  # a bias tied to another tensor
                source = lambda w=f"{name}.weight", b=b, t=t: archive.tensor_hwz(w, b, t)  # noqa: E731
            _set(model, name, HyperLinear(op, source=source))
    _mark_quantized(model, fixed_bits)
    if fixed_bits is not None:  # what a pickle of the model rebuilds its operators with
        for m in model.modules():
            if isinstance(m, (HyperLinear, HyperEmbedding)):
                m._fixed_bits = fixed_bits
    rest = {k: torch.from_numpy(archive.read(k)).to(dtype) for k in _state_keys(model) if k in names}
    model.load_state_dict(rest, strict=False, assign=True)
    params = dict(model.named_parameters())
    for alias, source in tied.items():
        owner, _, attr = alias.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        if isinstance(mod, (HyperLinear, HyperEmbedding)):
            continue
        src = params.get(source)
        if src is not None:
            setattr(mod, attr, src)
    rebuild_meta_buffers(model, config)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise _native.FormatError(f"{path}: tensors missing from the archive: {left[:5]}")
    model.eval()
    tokenizer = None
    files = {k[len(TOKENIZER_PREFIX) :]: v.encode("utf-8") for k, v in meta.items() if k.startswith(TOKENIZER_PREFIX)}
    files.update(
        {k[len(TOKENIZER_B64_PREFIX) :]: base64.b64decode(v) for k, v in meta.items() if k.startswith(TOKENIZER_B64_PREFIX)}
    )
    if files:
        with tempfile.TemporaryDirectory() as d:
            for name, data in files.items():
                with open(os.path.join(d, os.path.basename(name)), "wb") as f:
                    f.write(data)
            tokenizer = AutoTokenizer.from_pretrained(d)
    return model, tokenizer


# Threads building a model in `_parameters_on_meta` (a depth each, for nested builds).
_META_BUILD = threading.local()
_META_HOOK_LOCK = threading.Lock()
_REGISTER_PARAMETER: Any = None  # nn.Module.register_parameter before the hook


def _meta_hook(module: nn.Module, name: str, param: Any) -> None:
    """``nn.Module.register_parameter`` once hooked: as before, then, on a thread inside
    :func:`_parameters_on_meta`, the parameter moved to the meta device."""
    _REGISTER_PARAMETER(module, name, param)
    p = module._parameters.get(name)
    if not getattr(_META_BUILD, "depth", 0) or p is None or p.is_meta or isinstance(p, nn.UninitializedParameter):
        return
    if type(p) is nn.Parameter:
        moved = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)
        moved.__dict__.update(p.__dict__)  # (attributes set before registration: tags for optimizers)
    else:
        try:
            moved = type(p)(p.to("meta"), **{**p.__dict__, "requires_grad": p.requires_grad})
        except TypeError:
            return  # a subclass built otherwise: left where it was made
    module._parameters[name] = moved


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules this thread builds inside keep their parameters on the meta device and their
    buffers on the CPU, with the values their constructors compute (causal masks, rotary
    frequencies). Built wholly on the meta device, such buffers had to be rebuilt from the config
    afterwards, which fails for a module whose constructor takes more than the config (OpenAI
    GPT's attention). Each parameter is made on the CPU, then moved: the usual ``torch.empty``
    reserves memory it never fills, and weight init then runs on meta tensors (a constructor
    that fills a parameter itself, ``nn.Parameter(torch.randn(...))``, fills it once). The hook
    on ``nn.Module.register_parameter`` is installed at the first build and stays: other
    threads, and this one outside the block, register parameters as before."""
    global _REGISTER_PARAMETER
    with _META_HOOK_LOCK:
        if nn.Module.register_parameter is not _meta_hook:  # (first use, or another patch since)
            _REGISTER_PARAMETER = nn.Module.register_parameter
            nn.Module.register_parameter = _meta_hook
    _META_BUILD.depth = getattr(_META_BUILD, "depth", 0) + 1
    try:
        with torch.device("cpu"):
            yield
    finally:
        _META_BUILD.depth -= 1


def _check_fixed_bits(fixed_bits: Any) -> None:
    """``fixed_bits``: None, or the fixed-rate lattice widths the format holds (2 to 8)."""
    if fixed_bits is not None and (
        isinstance(fixed_bits, bool) or not isinstance(fixed_bits, int) or not 2 <= fixed_bits <= 8
    ):
        raise _native.InvalidInputError(f"fixed_bits: a whole number of bits per value from 2 to 8, not {fixed_bits!r}")


def _names(what: str, names: Any) -> list[str]:
    """A list of module names (one string is one name)."""
    if isinstance(names, str):
        return [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise _native.InvalidInputError(f"{what}: a list of module names, not {names!r}")
    return list(names)


def _iterable_names(what: str, names: Any) -> list[str]:
    """The names of any iterable of strings (a set, a tuple, a generator)."""
    try:
        out = list(names)
    except TypeError:
        out = None
    if out is None or not all(isinstance(n, str) for n in out):
        raise _native.InvalidInputError(f"{what}: names (strings), not {names!r}")
    return out


def _stored_module(model: nn.Module, name: str) -> nn.Module:
    """The module a checkpoint's hypercodec config names (a typed error where the model has none
    of that name: a config edited, or a model built with fewer layers than were saved)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        raise _native.FormatError(
            f"the checkpoint's hypercodec config names `{name}`, which this model does not have "
            "(was it built with another config than the one saved?)"
        ) from None


_PART_KEYS = ("root", "modules", "embeddings", "tied", "convs")


def _parts_of(c: Any) -> list[dict[str, Any]]:
    """Config ``c``'s own names as a part, then its other ``parts``."""
    return [{k: getattr(c, k, None) for k in _PART_KEYS}, *(getattr(c, "parts", None) or [])]


def _tied_names(what: str, tied: Any) -> dict[str, str]:
    """``tied`` (None: empty) checked as a mapping of head names to embedding names."""
    if tied is not None and not (
        isinstance(tied, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in tied.items())
    ):
        raise _native.InvalidInputError(f"{what}: a mapping of head names to embedding names, not {tied!r}")
    return dict(tied or {})


def _place(model: nn.Module, root: str | None) -> str:
    """The prefix of names written relative to a module of class ``root`` inside ``model``:
    ``""`` for ``model`` itself (or no root), else that module's place (the one of its class)."""
    if root is None or type(model).__name__ == root:
        return ""
    places = [n for n, m in model.named_modules() if type(m).__name__ == root and n]
    if len(places) != 1:
        raise _native.FormatError(
            f"the checkpoint's hypercodec config names layers of a {root}; this {type(model).__name__} holds "
            f"{len(places)} of them"
        )
    return places[0] + "."


def _root_names(model: nn.Module, c: Any) -> None:
    """Makes the stored layers' names of config ``c`` relative to ``model``: where they were
    written for a sub-model of class ``c.root`` (quantized alone), prefixed with that
    sub-model's place in ``model`` (the one module of that class); the names of the config's
    other ``parts`` (sub-models quantized one after another) are placed so too and joined."""
    parts = _parts_of(c)
    modules: dict[str, None] = {}
    embeddings: dict[str, None] = {}
    convs: dict[str, None] = {}
    tied: dict[str, str] = {}
    for p in parts:
        at = _place(model, p.get("root"))
        modules.update((at + n, None) for n in p.get("modules") or [])
        embeddings.update((at + n, None) for n in p.get("embeddings") or [])
        convs.update((at + n, None) for n in p.get("convs") or [])
        tied.update({at + k: at + v for k, v in (p.get("tied") or {}).items()})
    c.modules, c.embeddings, c.convs, c.tied = list(modules), list(embeddings), list(convs), tied
    c.root, c.parts = type(model).__name__, []


def _check_unplaced(model: nn.Module, files: Any) -> None:
    """Refuses a checkpoint whose safetensors files hold a stored form (``….weight_hwz``) for a
    layer its hypercodec config does not name: that layer would load as random dense weights,
    with transformers' load report the only sign (a hand-edited config, or one that lost a
    sub-model's names). Keys naming no module of ``model`` are left to transformers (renamed
    checkpoints); pickled checkpoints are not read here."""
    try:
        from safetensors import safe_open
    except ImportError:
        return
    prefix = getattr(model, "base_model_prefix", "") or ""
    modules = dict(model.named_modules())
    for f in files or []:
        if not str(f).endswith(".safetensors"):
            continue
        try:
            with safe_open(str(f), framework="pt") as h:
                keys = list(h.keys())
        except Exception:  # (a file safetensors cannot read: transformers' own load reports it)
            continue
        for key in keys:
            owner, _, attr = key.rpartition(".")
            if attr != HWZ_KEY:
                continue
            names = [owner, f"{prefix}.{owner}" if prefix else owner, owner.removeprefix(f"{prefix}.")]
            layer = next((modules[n] for n in names if n in modules), None)
            if layer is not None and not isinstance(layer, (HyperLinear, HyperEmbedding, HyperConv2d)):
                raise _native.FormatError(
                    f"the checkpoint holds a stored form for `{owner}`, which its hypercodec config does not name "
                    "(it would load as random weights): the config's modules, embeddings, convs and parts must "
                    "list every stored layer"
                )


def _mark_quantized(model: nn.Module, fixed_bits: int | None) -> None:
    """Gives a model read by :func:`from_hwz` (or quantized by :func:`hypercodec.nn.quantize`) the
    quantization config (and quantizer) a model quantized on load has, naming its stored layers,
    so that ``save_pretrained`` writes a checkpoint ``from_pretrained`` rebuilds on the stored
    forms (without it the reload made random dense layers where the stored ones were)."""
    if HypercodecConfig is None:
        return
    stored = {
        n: m
        for n, m in model.named_modules(remove_duplicate=False)
        if isinstance(m, (HyperLinear, HyperEmbedding, HyperConv2d))
    }
    # Sub-models quantized one after another (an encoder, then its decoder) share one config:
    # the names an earlier one wrote stay, as parts, unless they are this model's own (its class,
    # or a class inside it, whose stored layers this model's names cover).
    old = getattr(model.config, "quantization_config", None)
    parts = []
    if old is not None and not isinstance(old, dict) and getattr(old, "modules", None) is not None:
        inside = {type(m).__name__ for m in model.modules()}
        for p in _parts_of(old):
            if p.get("root") is not None and p["root"] not in inside:
                parts.append(p)
    config = HypercodecConfig(
        bps=None,  # (the archive's own rates: no method or rate describes them)
        method=None,
        skip=None,
        modules=[n for n, m in stored.items() if isinstance(m, HyperLinear) and m.tied is None],
        embeddings=[n for n, m in stored.items() if isinstance(m, HyperEmbedding)],
        tied={n: m.tied for n, m in stored.items() if getattr(m, "tied", None) is not None},
        fixed_bits=fixed_bits,
        convs=[n for n, m in stored.items() if isinstance(m, HyperConv2d)],
        root=type(model).__name__,
        parts=parts,
    )
    model.config.quantization_config = config
    model.hf_quantizer = HypercodecQuantizer(config, pre_quantized=True)
    _untie_stored_heads(model, config.tied)


def _stored_tensor(model: nn.Module, key: str) -> bool:
    """Whether ``key`` (``module.attr``) is a tensor of a stored layer (it has no parameter to tie)."""
    owner = key.rpartition(".")[0]
    try:
        return isinstance(model.get_submodule(owner), (HyperLinear, HyperEmbedding))
    except AttributeError:
        return False


def _untie_stored_heads(model: nn.Module, tied: dict[str, str]) -> None:
    """Takes the stored layers' tensors out of transformers' weight tying for this model: the
    heads that share a stored table's codes, and a stored head's bias (BERT's decoder bias, tied
    to ``cls.predictions.bias``, which its operator holds). None has a parameter to tie:
    ``model.tie_weights()`` and the reload of a saved model raised AttributeError."""
    keys = getattr(type(model), "_tied_weights_keys", None)
    heads = {f"{h}.weight" for h in tied}
    if isinstance(keys, dict):
        kept = {k: v for k, v in keys.items() if k not in heads and not _stored_tensor(model, k)}
        if len(kept) != len(keys):
            model._tied_weights_keys = kept


def _register() -> tuple[type, type] | tuple[None, None]:
    """Registers hypercodec with transformers' quantizer registry (``quant_method="hypercodec"``)
    so ``from_pretrained(..., quantization_config=HypercodecConfig(...))`` quantizes on load;
    returns the config and quantizer classes (None, None when this transformers has no
    third-party registry)."""
    try:
        from transformers import PreTrainedModel
        from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
        from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING
        from transformers.utils.quantization_config import QuantizationConfigMixin
    except ImportError:
        return None, None
    if "hypercodec" in AUTO_QUANTIZATION_CONFIG_MAPPING:
        from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING

        return AUTO_QUANTIZATION_CONFIG_MAPPING["hypercodec"], AUTO_QUANTIZER_MAPPING["hypercodec"]

    @register_quantization_config("hypercodec")
    class HypercodecConfig(QuantizationConfigMixin):
        """hypercodec as a transformers quantization method: after the weights load, every
        ``nn.Linear`` not named in ``skip`` becomes a :class:`hypercodec.nn.HyperLinear` quantized
        with ``method`` at ``bps`` (see :func:`hypercodec.nn.method_spec`). The quantized model
        round-trips through ``save_pretrained`` / ``from_pretrained`` (each layer's stored form is
        its ``weight_hwz`` tensor; ``import hypercodec.hf`` first so transformers knows the
        method); ``modules`` lists the quantized layers once that is known. A model read by
        :func:`from_hwz` carries one too, which also names its stored ``embeddings``, the heads
        ``tied`` to them (``{head: embedding}``: the codes are saved once) and the
        ``fixed_bits`` its lattice layers were converted to at load (done again at reload; given
        to quantize on load, the quantized lattice layers are converted so). A config of stored
        layers (``modules`` given) may leave ``method`` and ``bps`` None: a model read by
        ``from_hwz`` holds the archive's own rates, as does a model quantized by
        :func:`hypercodec.nn.quantize`, whose stored convolutions are its ``convs``. The names are
        relative to the model of class ``root`` (a sub-model quantized alone, such as a
        ``LlamaModel`` inside its ``LlamaForCausalLM``: found in the loading model by class);
        ``parts`` holds the names of other sub-models quantized one after another, each as
        ``{"root": class, "modules": [...], "embeddings": [...], "convs": [...], "tied": {...}}``."""

        def __init__(
            self,
            bps: float = 4.0,
            method: str = "lattice",
            skip=("lm_head",),
            modules: list[str] | None = None,
            embeddings: list[str] | None = None,
            tied: dict[str, str] | None = None,
            fixed_bits: int | None = None,
            convs: list[str] | None = None,
            root: str | None = None,
            parts: list[dict[str, Any]] | None = None,
            **kwargs: Any,
        ) -> None:
            self.quant_method = "hypercodec"
            stored = modules is not None and method is None and bps is None
            if not stored and not isinstance(method, str):
                raise _native.InvalidInputError(
                    f"method: a method name such as 'lattice' or 'int4', not {method!r} (a config of stored layers "
                    "names them in `modules`)"
                )
            if not stored and (isinstance(bps, bool) or not isinstance(bps, numbers.Real)):
                raise _native.InvalidInputError(f"bps: a number of bits per value, not {bps!r}")
            self.bps = None if stored else float(bps)
            self.method = method
            if not stored:
                # A bad rate or method fails here, before any weight loads.
                try:
                    spec = method_spec(method, self.bps)
                except ValueError as e:
                    raise _native.InvalidInputError(str(e)) from None
                _native.check_spec(spec)
            # One name is one name (not its letters); None skips nothing.
            self.skip = [] if skip is None else [skip] if isinstance(skip, str) else _iterable_names("skip", skip)
            self.modules = None if modules is None else _names("modules", modules)
            self.embeddings = [] if embeddings is None else _names("embeddings", embeddings)
            self.convs = [] if convs is None else _names("convs", convs)
            if root is not None and not isinstance(root, str):
                raise _native.InvalidInputError(f"root: a model class name, not {root!r}")
            self.root = root
            # Other sub-models' stored layers, each named relative to its own `root`.
            if parts is not None and not isinstance(parts, (list, tuple)):
                raise _native.InvalidInputError(f"parts: a list of dicts ({', '.join(_PART_KEYS)}), not {parts!r}")
            self.parts = []
            for p in parts or []:
                if not isinstance(p, dict) or not isinstance(p.get("root"), str) or set(p) - set(_PART_KEYS):
                    raise _native.InvalidInputError(f"parts: dicts of keys {', '.join(_PART_KEYS)} (a root class name), not {p!r}")
                self.parts.append({"root": p["root"], "tied": _tied_names("parts: tied", p.get("tied"))} | {
                    k: _names(f"parts: {k}", [] if p.get(k) is None else p[k]) for k in ("modules", "embeddings", "convs")})
            self.tied = _tied_names("tied", tied)
            _check_fixed_bits(fixed_bits)
            self.fixed_bits = fixed_bits

    def _init_around_placeholders(model: nn.Module) -> None:
        """Some models' weight init writes a child's weight from its parent (GPT-2 scales its
        attention's and MLP's ``c_proj.weight`` there), which a stored layer does not have: while
        a module is initialized, its placeholder children show an empty meta ``weight`` (writes
        to it do nothing; the stored form arrives from the checkpoint). The rest of that
        module's init runs as written (GPT-Neo fills its attention's causal mask there)."""

        def around(init: Callable[[nn.Module], None]) -> Callable[[nn.Module], None]:
            def call(module: nn.Module) -> None:
                shown = [m for m in module.children() if isinstance(m, HyperLinear) and m.weight is None]
                for m in shown:
                    m._parameters["weight"] = nn.Parameter(torch.empty(m.out_features, m.in_features, device="meta"), False)
                    if m.__dict__.get("_init_bias"):  # (Wav2Vec2 initializes its projection's bias there too)
                        m._parameters["bias"] = nn.Parameter(torch.empty(m.out_features, device="meta"), False)
                try:
                    init(module)
                finally:
                    for m in shown:
                        m._parameters["weight"] = m._parameters["bias"] = None

            return call

        # (Each sub-model initializes its own modules: GPT2LMHeadModel's GPT2Model.)
        for m in model.modules():
            if isinstance(m, PreTrainedModel):
                m._init_weights = around(m._init_weights)

    @register_quantizer("hypercodec")
    class HypercodecQuantizer(HfQuantizer):
        """Quantizes once the dense weights are loaded; for a saved quantized model, puts empty
        :meth:`hypercodec.nn.HyperLinear.placeholder` layers where the config's ``modules`` are
        (and :class:`hypercodec.nn.HyperEmbedding` ones at its ``embeddings``, heads sharing
        their codes at its ``tied`` names), which the loader fills from their ``weight_hwz``
        tensors (no dense weight is built)."""

        requires_calibration = False

        def _process_model_before_weight_loading(self, model, **kwargs):
            if not self.pre_quantized:
                c = self.quantization_config
                if c.embeddings or c.tied or c.method is None:
                    raise _native.InvalidInputError(
                        "this hypercodec config describes a saved model's stored layers (embeddings, tied "
                        "heads or no method): to quantize on load, give method and bps"
                    )
                return model
            c = self.quantization_config
            if c.modules is None:
                raise _native.FormatError("the checkpoint's hypercodec config lists no quantized modules")
            _root_names(model, c)
            placed: dict[int, nn.Module] = {}  # a layer at two names: one placeholder at both
            for head, table in c.tied.items():
                # A head on a stored table's codes (from_hwz), a table on a stored head's
                # (hypercodec.nn.quantize with embeddings=True), or a linear layer on another's
                # (two on one weight Parameter).
                if table not in c.embeddings and table not in c.modules:
                    raise _native.FormatError(
                        f"the checkpoint's hypercodec config ties `{head}` to `{table}`, which is not a stored "
                        "embedding or linear layer"
                    )
            convs = getattr(c, "convs", None) or []  # (configs saved before convolutions were named)
            wanted = [(n, None) for n in c.modules] + [(n, None) for n in c.embeddings] + list(c.tied.items())
            for name, tie in wanted + [(n, None) for n in convs]:
                layer = _stored_module(model, name)
                if isinstance(layer, (HyperLinear, HyperEmbedding, HyperConv2d)):
                    continue  # a fresh model holds none: a name whose parent was placed already
                embedding, conv = name in c.embeddings, name in convs
                if not (
                    isinstance(layer, nn.Embedding) if embedding else isinstance(layer, (nn.Conv1d, nn.Conv2d)) if conv
                    else isinstance(layer, nn.Linear) or _is_conv1d(layer)
                ):
                    raise _native.FormatError(f"`{name}` is quantized in the checkpoint but is {type(layer).__name__} here")
                if id(layer) not in placed:
                    if conv:
                        kind = HyperConv1d if isinstance(layer, nn.Conv1d) else HyperConv2d
                        placeholder = kind.placeholder(layer)
                    elif embedding:
                        placeholder = HyperEmbedding.placeholder(layer, tied=c.tied.get(name))
                    else:
                        placeholder = HyperLinear.placeholder(_as_linear(layer), tied=tie)
                        placeholder.__dict__["_init_bias"] = getattr(layer, "bias", None) is not None
                    if c.fixed_bits is not None:
                        placeholder._fixed_bits = c.fixed_bits
                    placed[id(layer)] = placeholder
                _set(model, name, placed[id(layer)])
                # A stored layer is tied by hypercodec (a head to its table's codes, after
                # loading), never by transformers' tie of dense weights (it has none).
                tying = getattr(model, "all_tied_weights_keys", {})
                for key in [k for k in tying if k.rpartition(".")[0] == name]:
                    tying.pop(key)
            _check_unplaced(model, kwargs.get("checkpoint_files"))
            _init_around_placeholders(model)
            return model

        def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
            # A stored form is as long as it is: the loader must not compare it with the
            # placeholder's empty shape.
            return self.pre_quantized and param_name.endswith("." + HWZ_KEY)

        def _process_model_after_weight_loading(self, model, **kwargs):
            c = self.quantization_config
            if self.pre_quantized:
                for m in model.modules():
                    m.__dict__.pop("_init_weights", None)  # (_init_around_placeholders' wrappers)
                    m.__dict__.pop("_init_bias", None)
                for head, table in c.tied.items():
                    layer, owner = _stored_module(model, head), _stored_module(model, table)
                    if owner.op is not None:
                        layer._check_loaded(owner.op)
                        layer.op = owner.op
                        layer._hwz_source = lambda t=owner._hwz: None if t is None else t.numpy()
                _untie_stored_heads(model, c.tied)
                stored = (HyperLinear, HyperEmbedding, HyperConv2d)
                empty = [n for n, m in model.named_modules() if isinstance(m, stored) and m.op is None]
                if empty:
                    raise _native.FormatError(f"stored weights missing from the checkpoint: {empty[:5]}")
                return model
            # A head whose weight is tied to the input embedding (BERT's cls.predictions.decoder,
            # Whisper's proj_out, any head with skip=()) stays float: transformers re-ties it
            # by parameter when the checkpoint is loaded again.
            uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
            tied = tuple(n for n, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor) and uses[id(m.weight)] > 1)
            quantize(model, bps=c.bps, method=c.method, skip=tuple(c.skip) + tied, conv=False)
            c.modules = [n for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, HyperLinear)]
            if c.fixed_bits is not None:
                # Converted now as a reload of the saved model converts them (the stored bytes
                # stay the lattice's).
                for m in {id(m): m for m in model.modules() if isinstance(m, HyperLinear)}.values():
                    m._fixed_bits = c.fixed_bits
                    m._load_hwz(m.weight_hwz)
            return model

        def _dequantize(self, model, dtype=None):
            # model.dequantize(): every stored layer dense again (hypercodec.nn.dequantize).
            from .nn import dequantize

            return dequantize(model, dtype)

        def is_serializable(self, **kwargs):
            return True

        @property
        def is_trainable(self):
            return False

        @property
        def is_compileable(self):
            # Each stored layer traces as one operator (hypercodec.nn): `generate` with a
            # static cache may compile the step, as it does for unquantized models.
            return True

    # Importable by these names (pickle finds them so).
    HypercodecConfig.__qualname__ = "HypercodecConfig"
    HypercodecQuantizer.__qualname__ = "HypercodecQuantizer"
    return HypercodecConfig, HypercodecQuantizer


HypercodecConfig, HypercodecQuantizer = _register()
__all__.append("HypercodecConfig")
