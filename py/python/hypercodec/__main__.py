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
    if len(args) >= 3 and args[0] == "compress" and args[1].endswith((".pt", ".pth", ".bin", ".ckpt")):
        import os
        import tempfile

        from .api import _write_safetensors, read_pt

        out_dir = os.path.dirname(os.path.abspath(args[2]))
        fd, tmp = tempfile.mkstemp(suffix=".safetensors", dir=out_dir)
        os.close(fd)
        try:
            _write_safetensors(tmp, read_pt(args[1]))
            return cli([args[0], tmp, *args[2:]])
        finally:
            os.unlink(tmp)
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
