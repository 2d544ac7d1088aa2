"""Candidate trellis codes for the batch-1 GEMV (kernels/prototypes/trellis_codes.cu) against
bf16 `F.linear`, in one run: which code's decode is cheap enough for issue 15's trellis targets.

    nvcc -cubin -arch=sm_90 -O3 -o .dev/proto/codes.cubin kernels/prototypes/trellis_codes.cu  # here
    python py/benches/cuda_trellis_codes.py .dev/proto/codes.cubin --sass                      # here too
    python py/benches/cuda_trellis_codes.py .dev/proto/codes.cubin [--out FILE]                # on the GPU

`--sass` needs no GPU: it counts each kernel's SASS instructions (`cuobjdump -sass`; torch's
triton wheel carries one) in its loop over one row block — one group of 32 values per thread
and row, 4 rows, plus the block's reduction — per weight (128 weights), by kind.

Random bit streams (every state equally likely), f32 activations. Each kernel is first checked
against the same code computed in torch (int64 arithmetic, float64 sums) on a small weight,
then timed as 40 launches in a CUDA graph rotating over ≥ 400 MB of weight copies (L2 never
holds them), median of 5 replays (`_graph_timing.graph_time_us`).
"""

from __future__ import annotations

import argparse
import collections
import ctypes as C
import re
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from _driver import Driver
from _graph_timing import graph_time_us

CODES = {
    1: "1MAD, a value per state (committed code)",
    2: "pairs: two hashes, two byte sums",
    3: "pairs: one hash, bytes·(1,1,1,1) and ·(1,2,−1,−2)",
    4: "pairs: direct 2^14 f16-pair table (L=14, 64 KB smem)",
    5: "pairs: hashed 256-pair table, one copy per bank (32 KB)",
}
M1, A1, M2, A2 = 34038481, 76625530, 0x9E3779B9, 0x7F4A7C15
MASK = 0xFFFFFFFF


def mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """x·m mod 2^32 for x < 2^32 in int64 without overflow."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & MASK


def bytes4(x: torch.Tensor) -> list[torch.Tensor]:
    return [(x >> (8 * i)) & 255 for i in range(4)]


def reference(words: torch.Tensor, cols: int, k: int, code: int, table: torch.Tensor) -> torch.Tensor:
    """The rows × cols raw code values the kernel multiplies (every row one circular sequence)."""
    rows = words.shape[0]
    nbits = cols * k
    w = words.to(torch.int64) & MASK
    bits = ((w.unsqueeze(-1) >> torch.arange(32, device=w.device)) & 1).reshape(rows, -1)[:, :nbits]
    v = 1 if code == 1 else 2
    step = v * k
    L = 14 if code == 4 else 16
    ends = torch.arange(1, cols // v + 1, device=w.device) * step
    idx = (ends.unsqueeze(-1) - L + torch.arange(L, device=w.device)) % nbits
    s = (bits[:, idx] << torch.arange(L, device=w.device)).sum(-1)  # rows × steps
    if code in (1, 2, 3):
        x = (s * M1 + A1) & MASK
        b = bytes4(x)
        a = sum(b)
        if code == 1:
            return a.to(torch.float64)
        if code == 2:
            second = sum(bytes4((mul32(x, M2) + A2) & MASK))
        else:
            second = b[0] + 2 * b[1] - b[2] - 2 * b[3]
        return torch.stack([a, second], -1).reshape(rows, cols).to(torch.float64)
    i = s if code == 4 else (s * M1 & MASK) >> 24
    return table[i].reshape(rows, cols).to(torch.float64)


INT_OPS = {"SHF", "IMAD", "IDP", "LOP3", "IADD3", "LEA", "PRMT", "ISETP", "SEL", "VIMNMX", "IMNMX", "MOV", "I2F"}
FP_OPS = {"FADD", "FFMA", "FMUL", "HADD2", "HFMA2", "F2F"}


def cuobjdump() -> str:
    """A cuobjdump: on PATH, or the one in torch's triton wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        raise SystemExit("--sass needs cuobjdump (CUDA toolkit) or the triton wheel")
    return str(pathlib.Path(spec.origin).parent / "backends/nvidia/bin/cuobjdump")


def sass_counts(cubin: str) -> list[str]:
    """Per kernel, the instructions of its longest loop (a backward branch's span) per weight."""
    text = subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    lines = ["| kernel | instructions / weight | integer | f32/f16 | LDS |", "|---|---:|---:|---:|---:|"]
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        name = block.split("\n")[0].strip()
        ins = []
        for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s*(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", block):
            ins.append((int(m.group(1), 16), m.group(2).split(".")[0], m.group(3)))
        loops = [(int(t.group(1), 16), a) for a, op, rest in ins if op == "BRA"
                 for t in [re.search(r"0x([0-9a-f]+)", rest)] if t and int(t.group(1), 16) < a]
        if not loops:
            continue
        lo, hi = max(loops, key=lambda p: p[1] - p[0])
        c = collections.Counter(op for a, op, _ in ins if lo <= a <= hi)
        w = 128
        lines.append(f"| `{name}` | {sum(c.values()) / w:.2f} | {sum(c[o] for o in INT_OPS) / w:.2f} | "
                     f"{sum(c[o] for o in FP_OPS) / w:.2f} | {c['LDS'] / w:.2f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cubin", help="the prototype built for sm_90")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--shapes", default="8192x8192,28672x8192,4096x4096")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--codes", default="1,2,3,4,5")
    ap.add_argument("--sass", action="store_true", help="count SASS instructions per weight (no GPU needed)")
    args = ap.parse_args()
    if args.sass:
        print("\n".join(sass_counts(args.cubin)))
        return 0
    if not torch.cuda.is_available():
        print("cuda_trellis_codes: no CUDA device; nothing to do")
        return 0
    drv = Driver({"proto": args.cubin})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    codes = [int(c) for c in args.codes.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    torch.manual_seed(0)
    t4 = (torch.randn(1 << 14, 2, device="cuda") * 150 + 500).to(torch.float16)
    t5 = (torch.randn(256, 2, device="cuda") * 150 + 500).to(torch.float16)
    tables = {4: t4, 5: t5}
    smem = {4: 65536, 5: 32768}

    def launcher(code: int, k: int):
        f = drv.fn("proto", f"hc_p_code{code}_k{k}")
        sm = smem.get(code, 0)
        if sm > 48 * 1024:
            drv.check(drv.cu.cuFuncSetAttribute(f, 8, sm), "max dynamic shared memory")
        occ = C.c_int()
        drv.check(drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(occ), f, 256, C.c_size_t(sm)), "occupancy")
        tab = tables.get(code, t4)

        def run(bits: torch.Tensor, x: torch.Tensor, y: torch.Tensor, rows: int, cols: int) -> None:
            grid = max(1, min((rows + 3) // 4, sms * occ.value))
            params = [C.c_void_p(bits.data_ptr()), C.c_void_p(x.data_ptr()), C.c_void_p(y.data_ptr()),
                      C.c_void_p(tab.data_ptr()), C.c_int(rows), C.c_int(cols)]
            drv.launch(f, grid, 256, params, sm)

        return run, occ.value

    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {sms} SMs",
             "| shape | K | code | blocks/SM | µs per call | × bf16 | T weights/s | rel. error |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    # Correctness first, on a small weight (every code, every K).
    failures = 0
    errs = {}
    for k in ks:
        for code in codes:
            run, _ = launcher(code, k)
            rows, cols = 37, 2048
            words = torch.randint(-2**31, 2**31, (rows, cols * k // 32), dtype=torch.int64, device="cuda").to(torch.int32)
            x = torch.randn(cols, device="cuda")
            y = torch.full((rows,), float("nan"), device="cuda")
            run(words, x, y, rows, cols)
            torch.cuda.synchronize()
            ref = reference(words, cols, k, code, tables.get(code, t4)) @ x.double()
            err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            errs[(code, k)] = err
            ok = err < 1e-4
            failures += not ok
            print(f"check code {code} K {k}: rel. error {err:.1e} {'ok' if ok else 'FAILED'}", flush=True)
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        wb = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, int(400e6 // (2 * rows * cols)) + 1))]
        xb = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)
        it = iter(range(10**9))
        base = graph_time_us(lambda: F.linear(xb, wb[next(it) % len(wb)]), 40)
        lines.append(f"| {shape} | – | torch bf16 F.linear | – | {base:.1f} | 1.00 | {rows * cols / base / 1e6:.2f} | – |")
        for k in ks:
            n = max(2, int(400e6 // (rows * cols * k // 8)) + 1)
            bits = [torch.randint(-2**31, 2**31, (rows, cols * k // 32), dtype=torch.int64, device="cuda").to(torch.int32) for _ in range(n)]
            x = torch.randn(cols, device="cuda")
            y = torch.empty(rows, device="cuda")
            for code in codes:
                run, occ = launcher(code, k)
                it = iter(range(10**9))
                us = graph_time_us(lambda: run(bits[next(it) % n], x, y, rows, cols), 40)
                lines.append(f"| {shape} | {k} | {code}: {CODES[code]} | {occ} | {us:.1f} | {base / us:.2f} | "
                             f"{rows * cols / us / 1e6:.2f} | {errs[(code, k)]:.1e} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
