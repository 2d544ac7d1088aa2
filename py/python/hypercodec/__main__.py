"""``python -m hypercodec ...``: the ``hypercodec`` command line, run by the same library."""

from __future__ import annotations

import sys
from typing import Any

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


def _is_torch_file(path: str) -> bool:
    """Whether ``path`` is a file in one of torch.save's formats (a zip, or a pickle); a
    ``.bin`` may be anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


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

        from .api import PT_SUFFIXES

        c = args.index("compress")
        pt = next(
            (i for i in range(c + 1, len(args)) if args[i].endswith(PT_SUFFIXES) and _is_torch_file(args[i])), None
        )
        if pt is not None:
            from .api import read_pt, staged_safetensors

            # Staged beside the output (the same file system), else beside the input.
            out = next((a for a in args[c + 1 :] if a.endswith(".hwz")), args[pt])
            out_dir = os.path.dirname(os.path.abspath(out))
            try:
                state = read_pt(args[pt])
            except Exception as e:  # a pickled module, a corrupt file, no torch: one line, no traceback
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                print(f"error: {args[pt]}: not read as a state dict by torch.load(weights_only=True): {first}", file=sys.stderr)
                return 1
            with staged_safetensors(state, out_dir) as tmp:
                return cli([*args[:pt], tmp, *args[pt + 1 :]])
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
