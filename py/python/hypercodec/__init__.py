"""hypercodec: compress neural-network weights into ``.hwz`` archives and run them compressed.

The package needs numpy only; torch is optional (``pip install hypercodec[torch]``) and is
imported by :mod:`hypercodec.nn` alone.  Everything heavy runs in the native module (the same
Rust library as the ``hypercodec`` command line) with the GIL released.

Quick start::

    import numpy as np, hypercodec
    sd = {"layer.weight": np.random.randn(256, 512).astype(np.float32)}
    hypercodec.save(sd, "model.hwz", encoding="lattice", bps=4)   # E8 + rANS, 4 bits/value all-in
    back = hypercodec.load("model.hwz")                           # dict of float32 arrays
    info = hypercodec.inspect("model.hwz")                        # the `inspect --json` summary
    lin = hypercodec.Linear.quantize(sd["layer.weight"], "int4")  # a compressed layer
    y = lin.forward(np.ones((1, 512), np.float32))                # y = x·Wᵀ on the stored codes
"""

from __future__ import annotations

from ._native import (
    Archive,
    CancelledError,
    CudaError,
    FormatError,
    HypercodecError,
    HypercodecIOError,
    InvalidInputError,
    KvCodec,
    Linear,
    __version__,
    init_threads,
)
from .api import (
    LazyStateDict,
    compress_file,
    compress_state_dict,
    decompress_state_dict,
    inspect,
    load,
    metadata,
    save,
)

__all__ = [
    "Archive",
    "CancelledError",
    "CudaError",
    "FormatError",
    "HypercodecError",
    "HypercodecIOError",
    "InvalidInputError",
    "KvCodec",
    "LazyStateDict",
    "Linear",
    "__version__",
    "compress_file",
    "compress_state_dict",
    "decompress_state_dict",
    "init_threads",
    "inspect",
    "load",
    "metadata",
    "save",
]
