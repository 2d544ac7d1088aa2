"""Roofline of the batch-1 CUDA kernels from their SASS, without a GPU.

    python py/benches/cuda_roofline.py [--ptx crates/kernels-cuda/ptx/gemv.ptx] [--out FILE]

The committed PTX is assembled for sm_90 (`ptxas`, from the pinned nvcc that `cargo xtask ptx`
installs into .tools/cuda, or on PATH) and disassembled (`cuobjdump -sass`: on PATH, in
.tools, or the one in torch's triton wheel). For each kernel below, the main loop (the longest
backward branch's span, or the spec's own rule) is counted by instruction class, and divided by
the weights one lane handles per trip of that loop: a figure derived from the kernel's source
and checked against a signature of the loop (its `HMMA`, `IDP` or global-load count), so that a
compiler change that unrolls differently fails here instead of printing a wrong ratio.

The bounds, for an H200 (132 SMs, 4 schedulers each, 1.98 GHz boost, 4.8 TB/s HBM3e):
- bytes: 4.8e12 / (stored bytes per weight, side information included) weights/s;
- issue: 132 · 4 · 1.98e9 · 32 lane-instructions/s ÷ (SASS instructions per weight and lane);
- integer: the issue's 16.7 T int32 operations/s ÷ (integer instructions per weight and lane).
The kernel's bound is the lowest of the three. Measured speeds are cited from the H200 runs
recorded in docs/eval (8192×8192, batch 1, bf16 activations), as weights/s and as the fraction
of the bound reached; bf16 `F.linear` reads 2 bytes a weight (2.4 T weights/s at 4.8 TB/s).
"""

import argparse
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

SMS, SCHEDULERS, CLOCK, HBM = 132, 4, 1.98e9, 4.8e12
ISSUE = SMS * SCHEDULERS * CLOCK * 32  # lane-instructions per second: one warp instruction a scheduler and cycle
HALF = ISSUE / 2  # a 16-lane pipe (ALU, FMA-heavy): 16.7 T lane-operations per second

# Pipes on GH100 (NVIDIA's answer on the developer forum, 2024): FMA-heavy runs IMAD, IDP and
# FP32; FMA-lite FP32 only; the ALU integer and logic operations other than IMAD, comparisons,
# selects and moves. Each of the three is 16 lanes wide per scheduler.
HEAVY = {"IMAD", "IDP", "IMUL"}
FP = {"FADD", "FFMA", "FMUL", "HADD2", "HFMA2", "HMUL2"}
ALU = {"LOP3", "SHF", "IADD3", "LEA", "PRMT", "ISETP", "SEL", "MOV", "VIADD", "VIADDMNMX", "VIMNMX", "IMNMX",
       "POPC", "FLO", "BMSK", "SGXT", "BREV", "IABS", "FSEL", "FSETP", "FMNMX", "PLOP3", "P2R", "R2P"}
MEM = {"LDG", "LDS", "LDGSTS", "STS", "STG", "LDSM", "LD", "ST", "LDC", "LDL", "STL", "SHFL"}


class Spec:
    """One kernel: what it runs, how many weights a lane handles per trip, how to check that."""

    def __init__(self, kernel, form, bytes_per_weight, per_trip, signature, measured=None, loop="longest",
                 note=""):
        self.kernel, self.form, self.bytes_per_weight = kernel, form, bytes_per_weight
        self.per_trip, self.signature, self.measured, self.loop, self.note = per_trip, signature, measured, loop, note


# INT4/INT2 g128 with 16-bit scale and offset per group (4 bytes per 128 weights); E8 fixed-rate
# and trellis rows carry one f32 scale a row (negligible at 8192 columns); rANS E8 at 4 bits
# stores 4.0 bits a value all-in, chunk index included (docs/eval/cuda_rans.md).
# The trellis tensor-core loop holds two bodies, for activations read as the RHT's f16 copy or
# converted from f32 (one runs a trip, 4 rows × 32 values, one dp4a a value): the loop's
# instructions over both bodies' weights are their mean.
MMA_NOTE = "two bodies of 128 (f16 or f32 activations), one a trip: the mean of the two"
T, I, R = "docs/eval/cuda_trellis.md", "docs/eval/cuda_int4_variants.md", "docs/eval/cuda_rans.md"
SPECS = [
    Spec("hc_affine_cpa_b4_bf16", "INT4 g128 (batch 1 route)", 0.5 + 4 / 128, 64, ("HMMA", 16),
         (17.3, 34.2, I + ", final run, f16 scales"),
         note="a warp step: 16 rows × 128 columns (8 weight mmas + 8 Σx mmas)"),
    Spec("hc_affine_cpa_b2_bf16", "INT2 g128 (batch 1 route)", 0.25 + 4 / 128, 128, ("HMMA", 32),
         note="16 rows × 256 columns a step"),
    Spec("hc_affine_mma_b4_w4_n1_bf16", "INT4 g128 (batches 2–8)", 0.5 + 4 / 128, 64, ("HMMA", 16),
         (17.1, 34.2, I + ", final run, tiled f32 scales, batch 1"),
         note="16 rows × 128 columns a step, codes loaded into registers"),
    Spec("hc_e8_gemv_b4_m1", "E8 fixed 4 bits", 0.5, 128, ("LDG", 13),
         (28.1, 34.5, "docs/eval/cuda.md"), note="4 rows × 4 words × 8 values a trip"),
    Spec("hc_e8_gemv_b2_m1", "E8 fixed 2 bits", 0.25, 128, ("LDG", 13),
         (28.6, 34.5, "docs/eval/cuda.md"), note="4 rows × 4 words × 8 values a trip"),
    Spec("hc_trellis_groups_m1_k2", "trellis 1MAD K=2, f32 (batch 1 route)", 0.25, 128, ("IDP", 128),
         (23.2, 33.6, T + ", 2026-12-03"), note="one dp4a a weight"),
    Spec("hc_trellis_groups_m1_k4", "trellis 1MAD K=4, f32 (batch 1 route)", 0.5, 128, ("IDP", 128),
         (25.7, 33.6, T + ", 2026-12-03"), note="one dp4a a weight"),
    Spec("hc_trellis_mma_k2_v1_n1", "trellis 1MAD K=2, tensor cores", 0.25, 256, ("IDP", 256),
         (25.9, 33.6, T + ", 2026-12-03"), note=MMA_NOTE),
    Spec("hc_trellis_mma_k2_v2_n1", "trellis pairs K=2, tensor cores", 0.25, 256, ("IDP", 256),
         (23.7, 33.6, T + ", 2026-12-03"), note=MMA_NOTE),
    Spec("hc_trellis_mma_k4_v2_n1", "trellis pairs K=4, tensor cores", 0.5, 256, ("IDP", 256),
         (25.1, 33.6, T + ", 2026-12-03"), note=MMA_NOTE),
    Spec("hc_e8_rans_gemv_m1", "E8 @4 bits, GPU rANS chunks", 0.5, 1, ("VOTE", 2),
         (235.8, 33.4, R), loop="shortest-vote",
         note="a step: one symbol a lane; static count includes the row-end and refill branches"),
]


def tool(name: str) -> str:
    """`name` on PATH, under .tools (the pinned nvcc / cuobjdump wheels), or in triton's wheel."""
    found = shutil.which(name)
    if found:
        return found
    for p in sorted((ROOT / ".tools").glob(f"*/nvidia/cu13/bin/{name}")):
        return str(p)
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        p = pathlib.Path(spec.origin).parent / "backends/nvidia/bin" / name
        if p.exists():
            return str(p)
    raise SystemExit(f"cuda_roofline: no {name} (cargo xtask ptx installs ptxas into .tools/cuda; "
                     "cuobjdump and nvdisasm come with torch's triton wheel or the CUDA toolkit)")


def sass(ptx: pathlib.Path) -> str:
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        subprocess.run([tool("ptxas"), "-arch=sm_90", "-O3", str(ptx), "-o", cubin], check=True)
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
        return subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True,
                              env=env).stdout


def functions(text: str) -> dict[str, list[tuple[int, str, str]]]:
    out = {}
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        name = block.split("\n")[0].strip()
        out[name] = [(int(m.group(1), 16), m.group(2).split(".")[0], m.group(3))
                     for m in re.finditer(r"/\*([0-9a-f]{4,5})\*/\s*(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", block)]
    return out


def main_loop(ins, rule: str) -> collections.Counter:
    loops = [(int(t.group(1), 16), a) for a, op, rest in ins if op == "BRA"
             for t in [re.search(r"0x([0-9a-f]+)", rest)] if t and int(t.group(1), 16) < a]
    if not loops:
        raise SystemExit("no loop")
    counted = [collections.Counter(op for a, op, _ in ins if lo <= a <= hi) for lo, hi in loops]
    if rule == "longest":
        return max(counted, key=lambda c: sum(c.values()))
    if rule == "shortest-vote":
        return min((c for c in counted if c["VOTE"]), key=lambda c: sum(c.values()))
    raise ValueError(rule)


def table(text: str) -> list[str]:
    funs = functions(text)
    sources: dict[str, int] = {}
    lines = [
        "| kernel | form | bytes / weight | SASS / weight | ALU | IMAD·IDP | FP32·FP16 | memory | HMMA "
        "| bounds, T weights/s: bytes · issue · ALU · FMA-heavy | limit | measured, T weights/s (× bf16, µs) | of the limit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for s in SPECS:
        if s.kernel not in funs:
            raise SystemExit(f"{s.kernel}: not in the PTX")
        c = main_loop(funs[s.kernel], s.loop)
        op, want = s.signature
        if c[op] != want:
            raise SystemExit(f"{s.kernel}: its main loop has {c[op]} {op}, the spec expects {want}: "
                             "the loop's shape changed, re-derive its weights per trip")
        w = s.per_trip
        per = {k: sum(c[o] for o in ops) / w for k, ops in (("alu", ALU), ("heavy", HEAVY), ("fp", FP), ("mem", MEM))}
        total = sum(c.values()) / w
        bounds = {"bytes": HBM / s.bytes_per_weight, "issue": ISSUE / total, "ALU": HALF / per["alu"],
                  "FMA-heavy": HALF / per["heavy"] if per["heavy"] else float("inf")}
        if per["heavy"] + per["fp"]:
            bounds["FMA"] = ISSUE / (per["heavy"] + per["fp"])
        which = min(bounds, key=bounds.get)
        meas, frac = "", ""
        if s.measured:
            us, bf16_us, src = s.measured
            rate = 8192 * 8192 / (us * 1e-6)
            meas = f"{rate / 1e12:.2f} ({bf16_us / us:.2f}×, {us} µs [{sources.setdefault(src, len(sources) + 1)}])"
            frac = f"{rate / bounds[which]:.0%}" if s.loop == "longest" else "(static count ≠ executed)"
        shown = " · ".join(f"{bounds[k] / 1e12:.1f}" for k in ("bytes", "issue", "ALU", "FMA-heavy"))
        lines.append(
            f"| `{s.kernel}` | {s.form} | {s.bytes_per_weight:.3f} | {total:.2f} | {per['alu']:.2f} | "
            f"{per['heavy']:.2f} | {per['fp']:.2f} | {per['mem']:.2f} | {c['HMMA'] / w:.3f} | {shown} | {which} | "
            f"{meas} | {frac} |")
    lines.append("")
    lines.append("Measured on 8192×8192 at batch 1 (bf16 `F.linear` in the same run): " + "; ".join(
        f"[{i}] {src}" for src, i in sources.items()) + ".")
    lines.append("")
    lines.append("Per trip of each main loop: " + "; ".join(f"`{s.kernel}` {s.per_trip} weights a lane ({s.note})"
                                                           for s in SPECS) + ".")
    spills = [s.kernel for s in SPECS if main_loop(funs[s.kernel], s.loop)["STL"]]
    if spills:
        lines.append("")
        lines.append("Register spills (`STL`/`LDL`) inside the main loop: " + ", ".join(f"`{k}`" for k in spills) + ".")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ptx", default=str(ROOT / "crates/kernels-cuda/ptx/gemv.ptx"))
    ap.add_argument("--out", help="also write the table to this markdown file")
    a = ap.parse_args()
    lines = table(sass(pathlib.Path(a.ptx)))
    text = "\n".join(lines)
    print(text)
    if a.out:
        pathlib.Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
