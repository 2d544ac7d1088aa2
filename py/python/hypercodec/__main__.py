"""``python -m hypercodec ...``: the ``hypercodec`` command line, run by the same library."""

from __future__ import annotations

import sys

from ._native import cli


def main(argv: list[str] | None = None) -> int:
    """Runs the command line on ``argv`` (default: ``sys.argv[1:]``) and returns its exit code.
    ``eval`` runs the evaluation suite (:mod:`hypercodec.eval`; needs torch and transformers),
    ``kv-eval`` the KV-cache evaluation (:mod:`hypercodec.kv_eval`), ``mlp-bench`` the seed's
    MLP benchmark over the planner modes (:mod:`hypercodec.mlp_bench`).
    ``compress`` also reads PyTorch checkpoints (``.pt``/``.pth``/``.bin``, through
    ``torch.load(weights_only=True)``): they are staged as a temporary safetensors file."""
    args = list(sys.argv[1:] if argv is None else argv)
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
