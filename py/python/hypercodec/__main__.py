"""``python -m hypercodec ...``: the ``hypercodec`` command line, run by the same library."""

from __future__ import annotations

import sys

from ._native import cli


def main(argv: list[str] | None = None) -> int:
    """Runs the command line on ``argv`` (default: ``sys.argv[1:]``) and returns its exit code."""
    return cli(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
