"""State dicts to and from ``.hwz`` archives, through the same pipeline as the command line.

Every option of ``hypercodec compress`` is a keyword argument here: ``encoding="lattice"``,
``bps=4``, ``mode="budget"``, ``target_bps=3``, ``plan="plan.json"``, ``bits=4``,
``group=32``, ``include_1d=True``, ... (``key_name=value`` becomes ``--key-name value``; ``True``
becomes the bare flag). See ``python -m hypercodec compress --help``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from . import _native

_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def _to_buffer(value: Any) -> tuple[str, tuple[int, ...], bytes]:
    """A floating tensor (numpy array or torch tensor; :func:`_is_floating`) as (safetensors
    dtype, shape, bytes): f32, f16 and bf16 as they are, other floats as f32."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        if getattr(value, "is_meta", False):
            raise _native.InvalidInputError("a tensor on the meta device holds no values to store")
        if getattr(value, "is_sparse", False) or str(getattr(value, "layout", "torch.strided")) != "torch.strided":
            value = value.to_dense()  # (sparse layouts: their values, densely)
        t = value.detach().cpu().contiguous()
        kind = str(t.dtype)
        if kind == "torch.bfloat16":
            # numpy has no bfloat16: the raw 16-bit patterns, stored as BF16.
            import torch

            bits = t.view(torch.int16).numpy()
            return "BF16", tuple(t.shape), bits.tobytes()
        if kind in ("torch.float32", "torch.float16"):
            arr = t.numpy()
        else:
            arr = t.to(dtype=__import__("torch").float32).numpy()
    else:
        arr = np.asarray(value)
        if arr.dtype not in _ST_DTYPES:
            arr = arr.astype(np.float32)
    # The shape before ascontiguousarray, which makes a 0-d array 1-d (a scalar came back (1,)).
    shape = tuple(arr.shape)
    arr = np.ascontiguousarray(arr)
    return _ST_DTYPES[arr.dtype], shape, arr.tobytes()


def _is_floating(value: Any) -> bool:
    """Whether a torch tensor or array-like holds floating values (what an archive stores)."""
    if hasattr(value, "is_floating_point"):
        return bool(value.is_floating_point())
    return bool(np.issubdtype(np.asarray(value).dtype, np.floating))


def _write_safetensors(path: str, state_dict: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> None:
    """Stages ``state_dict`` as a safetensors file through the library's writer (names and
    sizes checked, atomic rename); ``metadata`` (strings) goes to ``__metadata__``, which the
    archive keeps as its ``safetensors`` metadata."""
    for name in state_dict:
        if not isinstance(name, str):
            raise _native.InvalidInputError(f"tensor names are strings, not {name!r} ({type(name).__name__})")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # (a lone surrogate: no UTF-8 form to store)
            raise _native.InvalidInputError(f"tensor name {name!r} has no UTF-8 form") from None
    stored = [name for name in state_dict if name.endswith(".weight_hwz") or name == "weight_hwz"]
    if stored:
        # A quantized model's state dict: its layers are already compressed (uint8 stored
        # forms), and an archive of its float tensors alone would lose them.
        raise _native.InvalidInputError(
            f"the state dict holds {len(stored)} stored layers ({', '.join(stored[:3])}"
            + (" ..." if len(stored) > 3 else "")
            + "): it is a model quantized by hypercodec.nn, already compressed. Save it with "
            "torch.save(model.state_dict(), path) (or safetensors) and load it with "
            "hypercodec.nn.load_state_dict, or save the float model here and load it with "
            "hypercodec.nn.load_into"
        )
    if metadata is not None and not isinstance(metadata, Mapping):
        raise _native.InvalidInputError(f"metadata: a mapping of strings to strings, not a {type(metadata).__name__}")
    tensors, skipped = [], []
    for name, value in state_dict.items():
        if not _is_floating(value):
            # Integer and bool buffers (batch norm's ``num_batches_tracked``, position ids):
            # left out, as the command line leaves a safetensors file's (the archive lists them).
            skipped.append(f"{name} ({getattr(value, 'dtype', type(value).__name__)})")
            continue
        dtype, shape, data = _to_buffer(value)
        tensors.append((name, dtype, list(shape), data))
    if not tensors:
        raise _native.InvalidInputError(
            "the state dict holds no floating-point tensor to store"
            + (f" ({len(skipped)} non-floating left out: {', '.join(skipped[:4])})" if skipped else "")
        )
    if skipped:
        warnings.warn(
            f"{len(skipped)} non-floating tensors are not stored: {', '.join(skipped[:8])}"
            + (" ..." if len(skipped) > 8 else "")
            + " (load_state_dict(..., strict=False) takes the archive back)",
            stacklevel=5,  # (the caller of save: here, the staging generator, contextlib, compress_state_dict)
        )
    meta = None if metadata is None else {str(k): str(v) for k, v in metadata.items()}
    _native.write_safetensors(os.fsdecode(path), tensors, meta)


def _flags(options: Mapping[str, Any]) -> list[str]:
    """Keyword options as ``--flag=value`` (one argument each: a negative number is the flag's
    value, not another flag)."""
    argv: list[str] = []
    for key, value in options.items():
        if key in ("help", "version") and value:  # (the command line's own flags: it would print and write nothing)
            raise _native.InvalidInputError(f"`{key}` is not an option of compress")
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv.append(f"{flag}={','.join(str(v) for v in value)}")
        else:
            argv.append(f"{flag}={value}")
    return argv


def _run(argv: list[str], verbose: bool = True) -> None:
    """Runs the command line on ``argv`` (``["inspect", "m.hwz"]``), raising its error as a
    :class:`HypercodecError` subclass; what it prints goes through ``sys.stdout`` and
    ``sys.stderr`` (so a notebook shows it and ``contextlib.redirect_stdout`` catches it), or
    nowhere unless ``verbose``."""
    out, err = _native.run(list(argv))
    if verbose and out and sys.stdout is not None:  # (None under pythonw)
        sys.stdout.write(out)
    if verbose and err and sys.stderr is not None:
        sys.stderr.write(err)


PT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def is_torch_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file in one of torch.save's formats (a zip, or a pickle); a
    ``.bin`` may be anything else (a safetensors file, say)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def check_output_is_not(input: str | os.PathLike, output: str | os.PathLike) -> None:
    """Refuses an ``output`` that is the file ``input`` (the checkpoint staged before the
    command line runs, which cannot see it)."""
    same = os.path.realpath(input) == os.path.realpath(output)
    if not same and os.path.exists(output):
        try:
            same = os.path.samefile(input, output)
        except OSError:
            pass
    if same:
        raise _native.InvalidInputError(
            f"{os.fsdecode(output)}: the output is an input of this command; choose another output path"
        )


def read_pt(path: str | os.PathLike) -> dict:
    """A PyTorch checkpoint's tensors, read with ``torch.load(weights_only=True)`` (never
    unpickling code); a ``{"state_dict": ...}`` wrapper is unwrapped. Needs torch. Integer and
    bool tensors are kept: the writer leaves them out with a warning, as ``save`` does."""
    import torch

    try:
        obj = torch.load(os.fsdecode(path), map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as e:  # a corrupt file, a pickle of code: torch's errors vary by kind
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _native.FormatError(
            f"{os.fsdecode(path)}: not read as a state dict by torch.load(weights_only=True): {first}"
        ) from e
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise _native.InvalidInputError(f"{os.fsdecode(path)}: not a state dict (a {type(obj).__name__})")
    return {k: v for k, v in obj.items() if hasattr(v, "is_floating_point")}


def compress_file(input: str | os.PathLike, output: str | os.PathLike, verbose: bool = True, **options: Any) -> dict:
    """Compresses a ``.safetensors``/``.gguf`` file (or a sharded model, or a PyTorch
    ``.pt``/``.pth``/``.bin`` checkpoint read safely through torch) into ``output`` exactly as
    ``hypercodec compress`` does; returns the archive's summary (:func:`inspect`). With
    ``verbose`` (the default) what the command line prints (its summary line, the fallbacks,
    warnings) goes to ``sys.stdout`` / ``sys.stderr``; ``verbose=False`` keeps it quiet.

    >>> hypercodec.compress_file("model.safetensors", "model.hwz", encoding="lattice", bps=4)  # doctest: +SKIP
    >>> hypercodec.compress_file("model.safetensors", "model.hwz", encoding="trellis", bits=2, device="cuda")  # doctest: +SKIP
    """
    if os.fsdecode(input).endswith(PT_SUFFIXES) and is_torch_file(input):
        check_output_is_not(input, output)
        return compress_state_dict(read_pt(input), output, verbose=verbose, **options)
    # The paths after `--`: a file named `-model.hwz` or `--help` is a path, not a flag.
    _run(["compress", *_flags(options), "--", os.fsdecode(input), os.fsdecode(output)], verbose)
    index = os.fsdecode(output) + ".index.json"
    if options.get("shard_size") is not None or (not os.path.exists(output) and os.path.exists(index)):
        # Written as shards (`shard_size`): their index stands for the archive (a file at
        # `output` itself is not what this run wrote).
        return inspect(index)
    return inspect(output)


def compress_state_dict(
    state_dict: Mapping[str, Any],
    path: str | os.PathLike,
    metadata: Mapping[str, str] | None = None,
    verbose: bool = True,
    **options: Any,
) -> dict:
    """Writes ``state_dict`` (numpy arrays or torch tensors, float32/float16/bfloat16) to the
    ``.hwz`` archive ``path`` through the command line's pipeline (same encodings, planner
    modes, targets and plan files; see the module docs for the options); ``metadata`` (string
    values) is kept in the archive under ``safetensors``; ``verbose=False`` keeps what the
    command line prints quiet (:func:`compress_file`). Returns the archive's summary.

    >>> import numpy as np
    >>> sd = {"w": np.random.default_rng(0).standard_normal((256, 512), dtype=np.float32)}
    >>> info = compress_state_dict(sd, "w.hwz", encoding="lattice", bps=4)  # doctest: +SKIP
    >>> round(info["totals"]["bps_file"], 1)  # doctest: +SKIP
    4.0
    """
    path = os.fsdecode(path)
    _flags(options)  # (options and metadata refused before any tensor is converted)
    if metadata is not None and isinstance(metadata, Mapping) and any(v is None for v in metadata.values()):
        raise _native.InvalidInputError("metadata values are strings (None was stored as the text 'None')")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise _native.InvalidInputError(f"{path}: no folder {folder} to write the archive in")
    with staged_safetensors(state_dict, folder, metadata) as tmp:
        return compress_file(tmp, path, verbose=verbose, **options)


@contextlib.contextmanager
def staged_safetensors(
    state_dict: Mapping[str, Any], folder: str, metadata: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``state_dict`` written as a temporary safetensors file in ``folder`` (beside the archive
    to come: the same file system), removed on leaving."""
    try:
        fd, tmp = tempfile.mkstemp(suffix=".safetensors", dir=folder)
    except OSError as e:  # (a folder that is missing or not writable: the archive's own error type)
        raise _native.HypercodecIOError(f"cannot write a temporary file in {folder!r}: {e}") from e
    os.close(fd)
    try:
        _write_safetensors(tmp, state_dict, metadata)
        yield tmp
    finally:
        os.unlink(tmp)


save = compress_state_dict


def decompress_state_dict(path: str | os.PathLike, framework: str = "numpy") -> dict[str, Any]:
    """Every tensor of the archive decoded to float32, by name, in archive order; with
    ``framework="torch"``, torch tensors (restored to bfloat16/float16 where the source was).

    >>> sd = decompress_state_dict("w.hwz")  # doctest: +SKIP
    """
    if framework not in ("numpy", "torch"):
        raise _native.InvalidInputError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    lazy = LazyStateDict(path, framework)
    return {name: lazy[name] for name in lazy}


class LazyStateDict(Mapping):
    """A read-only state dict over an archive: each tensor is decoded when it is looked up
    (and not kept), so opening a large archive costs nothing until a tensor is used.

    The archive is memory-mapped, as safetensors files are: truncating or overwriting the file
    in place while it is open ends the process with SIGBUS. :func:`save` and the command line
    never do (they write a temporary file and rename it over the old one)."""

    def __init__(self, path: str | os.PathLike, framework: str = "numpy") -> None:
        if framework not in ("numpy", "torch"):
            raise _native.InvalidInputError(f"framework must be 'numpy' or 'torch', not {framework!r}")
        self.archive = _native.Archive(os.fsdecode(path))
        self.framework = framework
        self._names = self.archive.names()
        self._name_set = set(self._names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._name_set:
            raise KeyError(name)
        arr = self.archive.read(name)
        if self.framework == "torch":
            import torch

            t = torch.from_numpy(arr)
            kind = self.archive.source_dtype(name)
            if kind == "bf16":
                t = t.to(torch.bfloat16)
            elif kind == "f16":
                # The source's values were f16: a decoded value past its largest is rounding
                # error, clamped (the cast made it inf), as the CLI's decompress does.
                top = torch.finfo(torch.float16).max
                t = torch.where(t.isfinite(), t.clamp(-top, top), t).to(torch.float16)
            return t
        return arr

    def __iter__(self):
        return iter(self._names)

    def __contains__(self, name: object) -> bool:
        # (Mapping's own decodes the tensor to answer.)
        return name in self._name_set

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"LazyStateDict({len(self)} tensors)"


def load(path: str | os.PathLike, framework: str = "numpy", lazy: bool = True) -> Mapping[str, Any]:
    """The archive as a state dict: lazily decoded per tensor (:class:`LazyStateDict`) by
    default, or all at once with ``lazy=False`` (:func:`decompress_state_dict`).

    >>> sd = load("w.hwz")  # doctest: +SKIP
    >>> sd["w"].shape  # decodes `w` now  # doctest: +SKIP
    """
    if framework not in ("numpy", "torch"):
        raise _native.InvalidInputError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    return LazyStateDict(path, framework) if lazy else decompress_state_dict(path, framework)


def metadata(path: str | os.PathLike) -> dict:
    """The archive's free metadata (``safetensors``: what :func:`compress_state_dict` was given)."""
    return json.loads(_native.Archive(os.fsdecode(path)).metadata_json())


def inspect(path: str | os.PathLike) -> dict:
    """The archive's summary (what ``hypercodec inspect --json`` prints): tensors, shapes,
    encodings, bits per value, bytes per stream role, error figures; native and legacy
    Hyper Glyph archives.

    >>> inspect("w.hwz")["tensors"][0]["name"]  # doctest: +SKIP
    'w'
    """
    return json.loads(_native.inspect_json(os.fsdecode(path)))
