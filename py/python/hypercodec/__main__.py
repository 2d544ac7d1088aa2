"""``python -m hypercodec ...``: the ``hypercodec`` command line, run by the same library."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from . import _native
from ._native import cli


class _ClosedPipeSafe:
    """Standard output for the long Python commands: when the reader goes away (``| head``),
    the rest of the output goes to /dev/null and the run finishes (it writes its results
    page), instead of dying on ``BrokenPipeError``."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def _silence(self) -> None:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._out.fileno())

    def write(self, s: str) -> int:
        try:
            return self._out.write(s)
        except BrokenPipeError:
            self._silence()
            return len(s)

    def flush(self) -> None:
        try:
            self._out.flush()
        except BrokenPipeError:
            self._silence()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def _cli(args: list[str]) -> int:
    """The command line's exit code; Ctrl-C cancels the run (its temporary file removed) and
    exits 130, as the command line itself does."""
    try:
        return cli(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """Runs the command line on ``argv`` (default: ``sys.argv[1:]``) and returns its exit code.
    ``eval`` runs the evaluation suite (:mod:`hypercodec.eval`; needs torch and transformers),
    ``kv-eval`` the KV-cache evaluation (:mod:`hypercodec.kv_eval`), ``mlp-bench`` the seed's
    MLP benchmark over the planner modes (:mod:`hypercodec.mlp_bench`).
    ``compress`` also reads PyTorch checkpoints (``.pt``/``.pth``/``.bin``, through
    ``torch.load(weights_only=True)``): they are staged as a temporary safetensors file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["eval"], ["kv-eval"], ["mlp-bench"]) and not isinstance(sys.stdout, _ClosedPipeSafe):
        sys.stdout = _ClosedPipeSafe(sys.stdout)
    if args[:1] == ["eval"]:
        from .eval import main as eval_main

        return eval_main(args[1:])
    if args[:1] == ["mlp-bench"]:
        from .mlp_bench import main as mlp_main

        return mlp_main(args[1:])
    if args[:1] == ["kv-eval"]:
        from .kv_eval import main as kv_eval_main

        return kv_eval_main(args[1:])
    # `compress` anywhere (global options such as --threads may come first), and an input
    # that is a PyTorch checkpoint: staged as safetensors beside the output.
    if "compress" in args:
        import os

        from .api import PT_SUFFIXES, check_output_is_not, is_torch_file

        paths = _native.compress_paths(args)
        if paths is not None and paths[0].endswith(PT_SUFFIXES) and is_torch_file(paths[0]):
            from .api import read_pt, staged_safetensors

            inp, out, after = paths
            # (Only global options, whose values are never `compress`, come before it.)
            at = args.index("compress") + after
            try:
                check_output_is_not(inp, out)
            except _native.HypercodecError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            try:
                state = read_pt(inp)
            except _native.HypercodecError as e:  # (its message names the file and torch's reason)
                print(f"error: {e}", file=sys.stderr)
                return 1
            except Exception as e:  # a pickled module, a corrupt file, no torch: one line, no traceback
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"error: {inp}: not read as a state dict by torch.load(weights_only=True): {first}", file=sys.stderr)
                return 1
            # Staged beside the output (the same file system), in the input's place.
            folder = os.path.dirname(os.path.abspath(out))
            if not os.path.isdir(folder):
                print(f"error: {out}: no folder {folder} to write the archive in", file=sys.stderr)
                return 1
            try:
                with warnings.catch_warnings(record=True) as said:
                    warnings.simplefilter("always")
                    with staged_safetensors(state, folder) as tmp:
                        for w in said:  # (the tensors left out: a line as the command line's own)
                            print(f"warning: {w.message}", file=sys.stderr)
                        return _cli([*args[:at], tmp, *args[at + 1 :]])
            except (_native.HypercodecError, OSError) as e:  # (no float tensor; a folder not writable)
                print(f"error: {inp}: {e}", file=sys.stderr)
                return 1
    return _cli(args)


if __name__ == "__main__":
    sys.exit(main())
