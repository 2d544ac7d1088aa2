"""The CUDA driver API through ctypes, for the benchmark scripts beside this file that launch
kernels of the committed PTX (or of a prototype cubin) directly, on PyTorch's current stream."""

from __future__ import annotations

import ctypes as C
import pathlib

import torch

PTX = pathlib.Path(__file__).resolve().parents[2] / "crates/kernels-cuda/ptx/gemv.ptx"


class Driver:
    """Modules loaded by name (`ptx`: the committed PTX; others from `extra`: name → file, a
    cubin or PTX)."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        self.cu = C.CDLL("libcuda.so.1")
        torch.zeros(1, device="cuda")  # PyTorch's context is current
        self.mods = {}
        sources = [("ptx", PTX.read_bytes() + b"\0")]
        # PTX text is loaded NUL-terminated; a cubin as it is.
        sources += [(name, pathlib.Path(path).read_bytes() + (b"\0" if str(path).endswith(".ptx") else b""))
                    for name, path in (extra or {}).items()]
        for name, data in sources:
            m = C.c_void_p()
            self.check(self.cu.cuModuleLoadData(C.byref(m), data), name)
            self.mods[name] = m

    @staticmethod
    def check(r: int, what: str) -> None:
        if r != 0:
            raise RuntimeError(f"CUDA driver error {r} ({what})")

    def fn(self, mod: str, name: str) -> C.c_void_p:
        """Function `name` of module `mod`."""
        f = C.c_void_p()
        self.check(self.cu.cuModuleGetFunction(C.byref(f), self.mods[mod], name.encode()), name)
        return f

    def params(self, f: C.c_void_p) -> list[int]:
        """The sizes of function `f`'s parameters, in order (`cuFuncGetParamInfo`)."""
        sizes = []
        off, size = C.c_size_t(), C.c_size_t()
        while self.cu.cuFuncGetParamInfo(f, len(sizes), C.byref(off), C.byref(size)) == 0:
            sizes.append(size.value)
        return sizes

    def launch(self, f: C.c_void_p, grid: int | tuple[int, int], block: int, params: list, smem: int = 0) -> None:
        """`f<<<grid, block, smem>>>` with the ctypes values `params` (kept alive by the caller
        until the launch has run, or been captured); `grid` is x or (x, y)."""
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        arr = (C.c_void_p * len(params))(*[C.addressof(p) for p in params])
        stream = C.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(self.cu.cuLaunchKernel(f, gx, gy, 1, block, 1, 1, smem, stream, arr, None), "launch")


def tensor_map_2d(drv: Driver, t: torch.Tensor, box_cols: int, box_rows: int) -> C.Array:
    """A CUtensorMap of the row-major 2-D bf16 or f16 tensor `t` (boxes of `box_rows` rows of
    `box_cols` columns in the 128-byte swizzle, zeros past its edges, L2 promotion 256 bytes),
    as a ctypes value to pass by value: 128 bytes, 128-byte aligned as CUDA 13 declares it, in a
    buffer the value keeps alive."""
    kinds = {torch.bfloat16: 9, torch.float16: 6}  # CU_TENSOR_MAP_DATA_TYPE_{BFLOAT16,FLOAT16}
    if t.dtype not in kinds:
        raise ValueError(f"tensor_map_2d: a bf16 or f16 tensor, not {t.dtype}")
    rows, cols = t.shape
    buf = C.create_string_buffer(128 + 128)
    m = (C.c_uint8 * 128).from_address((C.addressof(buf) + 127) & ~127)
    m._buf = buf
    dims = (C.c_uint64 * 2)(cols, rows)
    strides = (C.c_uint64 * 1)(cols * t.element_size())
    box = (C.c_uint32 * 2)(box_cols, box_rows)
    one = (C.c_uint32 * 2)(1, 1)
    # No interleave, SWIZZLE_128B = 3, L2_PROMOTION_256B = 3, OOB fill zeros.
    drv.check(drv.cu.cuTensorMapEncodeTiled(C.byref(m), kinds[t.dtype], 2, C.c_void_p(t.data_ptr()), dims, strides,
                                            box, one, 0, 3, 3, 0), "cuTensorMapEncodeTiled")
    return m


class AffineArgs(C.Structure):
    """`AffineArgs` of kernels/gemv.cu (`sdtype` 0: f32 scales, 1: f16, 2: bf16)."""

    _fields_ = [("codes", C.c_void_p), ("scales", C.c_void_p), ("offsets", C.c_void_p), ("x", C.c_void_p),
                ("y", C.c_void_p), ("bias", C.c_void_p), ("n_code_bytes", C.c_longlong), ("xdtype", C.c_int),
                ("ydtype", C.c_int), ("M", C.c_int), ("rows", C.c_int), ("cols", C.c_int), ("bits", C.c_int),
                ("glen", C.c_int), ("srs", C.c_int), ("qmul", C.c_float), ("qbias", C.c_float), ("glen_log2", C.c_int),
                ("sdtype", C.c_int)]


def tile_scales(a: torch.Tensor) -> torch.Tensor:
    """`rows × groups` scales in tiles of 16 rows: [tile][group][g][rows g, g + 8], zero rows past the last."""
    rows, groups = a.shape
    p = torch.zeros((rows + 15) // 16 * 16, groups, device=a.device, dtype=a.dtype)
    p[:rows] = a
    return p.view(-1, 2, 8, groups).permute(0, 3, 2, 1).contiguous()


def int4_copies(n_rows: int, k: int, device: str = "cuda") -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Random INT4 g128 layers as the `int4` spec's device form holds them, in enough copies
    (≥ 400 MB) that L2 never holds them: the codes (`n_rows × k/2` bytes each), the f16 scales in
    tiles (`tile_scales`, no offsets), and the first copy's decoded weight in float32 (codes
    less 8, times the scale)."""
    steps, glen = k // 128, 128
    copies = int(400e6 // (n_rows * k // 2)) + 1
    w = [torch.randint(0, 256, (n_rows, k // 2), dtype=torch.uint8, device=device) for _ in range(copies)]
    sc = [(torch.rand(n_rows, steps, device=device) * 0.01 + 0.001).half() for _ in range(copies)]
    q = torch.stack([(w[0].int() >> (4 * i)) & 15 for i in range(2)], -1).reshape(n_rows, k).float()
    wd = (q - 8.0) * sc[0].float().repeat_interleave(glen, 1)
    return w, [tile_scales(a) for a in sc], wd


def print_table(rows: list[tuple[str, str, float, float]], out: str | None) -> None:
    """`(shape, kernel, µs, relative error)` rows as markdown, with each row's speed against the
    shape's `torch bf16 F.linear` row; also written to `out` when given."""
    import pathlib

    base = {r[0]: r[2] for r in rows if r[1] == "torch bf16 F.linear"}
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "| shape | kernel | µs per call | × bf16 | rel. error vs float32 |", "|---|---|---:|---:|---:|"]
    lines += [f"| {s} | {n} | {us:.1f} | {base[s] / us:.2f} | {e:.1e} |" for s, n, us, e in rows]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        pathlib.Path(out).write_text(text)
