"""Roofline of the batch-1 CUDA kernels from their SASS, without a GPU.

    python py/benches/cuda_roofline.py [--ptx crates/kernels-cuda/ptx/gemv.ptx] [--out FILE]

The committed PTX is assembled for sm_90 (`ptxas`, from the pinned nvcc that `cargo xtask ptx`
installs into .tools/cuda, else on PATH) and disassembled (`cuobjdump -sass`: in .tools, on
PATH, or the one in torch's triton wheel). For each kernel below, one trip of the main loop (the
longest backward branch, or the spec's own rule) is counted by instruction class along its
longest path that skips the optional work the measured case skips (`Spec.avoid`), and divided by
the weights one lane handles per trip: a figure derived from the kernel's source and checked
against a signature of the path (its `HMMA`, `IDP` or global-load count), so that a compiler
change that unrolls differently fails here instead of printing a wrong ratio.

The bounds, for an H200 (132 SMs, 4 schedulers each, 1.98 GHz boost, 4.8 TB/s HBM3e):
- bytes: 4.8e12 / (stored bytes per weight, side information included) weights/s;
- issue: 132 · 4 · 1.98e9 · 32 = 33.4 T lane-instructions/s ÷ (SASS instructions per weight and lane);
- ALU: 16.7 T/s (a 16-lane pipe) ÷ (integer, logic, compare, select and move operations per weight);
- FMA-heavy: 16.7 T/s ÷ (IMAD and IDP per weight), the pipe that runs them (and FP32);
- FMA: 33.4 T/s ÷ (IMAD, IDP and FP32/FP16 operations per weight), both FMA pipes together.
The kernel's limit is the lowest. Measured speeds are cited from the H200 runs recorded in
docs/eval (8192×8192, batch 1, bf16 activations), as weights/s and as the fraction of the limit
reached; bf16 `F.linear` reads 2 bytes a weight (2.4 T weights/s at 4.8 TB/s). Only the main loop
is counted: set-up and the final reduction, shared over a few trips a thread, are not.
"""

import argparse
import collections
import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Spec:
    """One kernel: what it runs, how many weights a lane handles per trip, how to check that."""

    kernel: str
    form: str
    bytes_per_weight: float
    per_trip: int
    signature: tuple[str, int]  # (opcode, count on a trip's path)
    measured: tuple[float, float, str] | None = None  # (µs, bf16 µs in the same run, source)
    loop: str = "longest"
    note: str = ""
    avoid: frozenset[str] = frozenset()


# INT4/INT2 g128 with 16-bit scale and offset per group (4 bytes per 128 weights); E8 fixed-rate
# and trellis rows carry one f32 scale a row (negligible at 8192 columns); rANS E8 at 4 bits
# stores 4.0 bits a value all-in, chunk index included (docs/eval/cuda_rans.md).
# What a trip of the measured case skips (`avoid`): the affine kernels' division for group
# lengths that are not powers of two (its reciprocal, MUFU); the trellis tensor-core loop's body
# for f32 activations (F2FP: the layers pass the RHT's f16 copy); the rANS step's window refill
# (LDG) and row end (STG).
DIV = frozenset({"MUFU"})
E8_LAYER = "docs/eval/cuda.md, the layer: its activation RHT (4.6 µs there) included"
MMA_NOTE = "2 row tiles × rows g, g + 8 × a group of 32, one dp4a a value; the f16-activation body"
T, I, R = "docs/eval/cuda_trellis.md", "docs/eval/cuda_int4_variants.md", "docs/eval/cuda_rans.md"
SPECS = [
    Spec("hc_affine_cpa_b4_bf16", "INT4 g128 (batch 1 route)", 0.5 + 4 / 128, 64, ("HMMA", 16),
         (17.3, 34.2, I + ", final run, f16 scales"),
         note="a warp step: 16 rows × 128 columns (8 weight mmas + 8 Σx mmas)", avoid=DIV),
    Spec("hc_affine_cpa_halves_b4_bf16", "INT4 g64 sym (batch 1 route)", 0.5 + 2 / 64, 64, ("HMMA", 16),
         note="16 rows × 128 columns a step, two groups of 64, a lane's words from both", avoid=DIV),
    Spec("hc_affine_cpa_b2_bf16", "INT2 g256 (batch 1 route; g128 takes the plain kernel)", 0.25 + 4 / 256, 128,
         ("HMMA", 32), note="16 rows × 256 columns a step", avoid=DIV),
    Spec("hc_affine_mma_b4_w4_n1_bf16", "INT4 g128, f32 scales (batches 2–8)", 0.5 + 8 / 128, 64, ("HMMA", 16),
         (17.1, 34.2, I + ", final run, tiled f32 scales, batch 1"),
         note="16 rows × 128 columns a step, codes loaded into registers", avoid=DIV),
    Spec("hc_e8_gemv_b4_m1", "E8 fixed 4 bits", 0.5, 128, ("LDG", 13),
         (28.1, 34.5, E8_LAYER), note="4 rows × 4 words × 8 values a trip"),
    Spec("hc_e8_gemv_b2_m1", "E8 fixed 2 bits", 0.25, 128, ("LDG", 13),
         (28.6, 34.5, E8_LAYER), note="4 rows × 4 words × 8 values a trip"),
    Spec("hc_trellis_groups_m1_k2", "trellis 1MAD K=2, f32 (batch 1 route)", 0.25, 128, ("IDP", 128),
         (23.2, 33.6, T + ", 2026-12-03"), note="one dp4a a weight"),
    Spec("hc_trellis_groups_m1_k4", "trellis 1MAD K=4, f32 (batch 1 route)", 0.5, 128, ("IDP", 128),
         (25.7, 33.6, T + ", 2026-12-03"), note="one dp4a a weight"),
    Spec("hc_trellis_mma_k2_v1_n1", "trellis 1MAD K=2, tensor cores", 0.25, 128, ("IDP", 128),
         (25.9, 33.6, T + ", 2026-12-03"), note=MMA_NOTE, avoid=frozenset({"F2FP"})),
    Spec("hc_trellis_mma_k2_v2_n1", "trellis pairs K=2, tensor cores", 0.25, 128, ("IDP", 128),
         (23.7, 33.6, T + ", 2026-12-03"), note=MMA_NOTE, avoid=frozenset({"F2FP"})),
    Spec("hc_trellis_mma_k4_v2_n1", "trellis pairs K=4, tensor cores", 0.5, 128, ("IDP", 128),
         (25.1, 33.6, T + ", 2026-12-03"), note=MMA_NOTE, avoid=frozenset({"F2FP"})),
    Spec("hc_e8_rans_gemv_m1", "E8 @4 bits, GPU rANS chunks", 0.5, 1, ("VOTE", 2),
         (235.8, 33.4, R), loop="shortest-vote",
         note="a step: one symbol a lane, no refill and no row end", avoid=frozenset({"STG", "LDG"})),
]


def tool(name: str) -> str:
    """`name` under .tools (the pinned nvcc / cuobjdump wheels: the PTX's own ptxas), on PATH,
    or in torch's triton wheel."""
    for p in sorted((ROOT / ".tools").glob(f"*/nvidia/cu13/bin/{name}")):
        return str(p)
    found = shutil.which(name)
    if found:
        return found
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


# address, opcode (no modifiers), predicate ("", "@P0", "@!P1", ...), the opcode's modifiers and operands
Ins = tuple[int, str, str, str]


def functions(text: str) -> dict[str, list[Ins]]:
    out = {}
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        name = block.split("\n")[0].strip()
        out[name] = [(int(m.group(1), 16), m.group(3).split(".")[0], (m.group(2) or "").strip(),
                      m.group(3)[len(m.group(3).split(".")[0]):] + m.group(4))
                     for m in re.finditer(r"/\*([0-9a-f]{4,5})\*/\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", block)]
    return out


def _target(i: Ins) -> int | None:
    t = re.search(r"0x([0-9a-f]+)", i[3])
    return int(t.group(1), 16) if i[1] == "BRA" and t else None


def _always(i: Ins) -> bool:
    """An unconditional jump or exit: no predicate (or `@PT`) and not `BRA.DIV`."""
    return i[1] in ("BRA", "EXIT") and i[2] in ("", "@PT") and not i[3].startswith(".DIV")


def loops(ins: list[Ins]) -> list[tuple[int, int]]:
    """Every backward branch as (its target, its own address)."""
    return [(t, i[0]) for i in ins for t in [_target(i)] if t is not None and t < i[0]]


def executed_path(ins: list[Ins], lo: int, hi: int, avoid: frozenset[str]) -> collections.Counter:
    """The instructions of one trip of a loop (head `lo`, back edge `hi`) on its longest path
    that enters no block holding an opcode of `avoid`: the spec names the optional work a trip
    of the measured case skips (a division for group lengths that are not powers of two, the
    other activation form, a refill, a row's end); everything else on a branch counts, so the
    figure errs high. Predicated instructions count (they issue either way); a conditional
    branch goes either way, an unconditional one only to its target; edges go forward."""
    body = [i for i in ins if lo <= i[0] <= hi]
    at = {i[0]: k for k, i in enumerate(body)}
    starts = {lo} | {t for i in body for t in [_target(i)] if t is not None and t in at}
    starts |= {body[k + 1][0] for k, i in enumerate(body[:-1]) if i[1] in ("BRA", "EXIT")}
    heads = sorted(starts)
    blocks = {h: body[at[h]:(at[n] if n in at else len(body))] for h, n in zip(heads, heads[1:] + [hi + 1])}
    best: dict[int, tuple[int, int | None]] = {lo: (len(blocks[lo]), None)}
    for h in heads:  # in address order: every edge used goes forward
        if h not in best:
            continue
        last = blocks[h][-1]
        if last[0] == hi:
            continue
        nexts = [t for t in [_target(last)] if t is not None and t in blocks and t > h]
        if not _always(last) and at[last[0]] + 1 < len(body):
            nexts.append(body[at[last[0]] + 1][0])
        for n in nexts:
            if any(i[1] in avoid for i in blocks[n]):
                continue
            d = best[h][0] + len(blocks[n])
            if d > best.get(n, (-1, None))[0]:
                best[n] = (d, h)
    ends = [h for h in blocks if blocks[h][-1][0] == hi and h in best]
    if not ends:
        raise SystemExit(f"no path through the loop {lo:#x}-{hi:#x} avoiding {sorted(avoid)}")
    h: int | None = ends[0]
    path = []
    while h is not None:
        path.append(h)
        h = best[h][1]
    return collections.Counter(i[1] for h in path for i in blocks[h])


def main_loop(ins: list[Ins], rule: str, avoid: frozenset[str] = frozenset()) -> collections.Counter:
    found = loops(ins)
    if not found:
        raise SystemExit("no loop")
    if rule == "longest":
        lo, hi = max(found, key=lambda p: p[1] - p[0])
    elif rule == "shortest-vote":
        lo, hi = min((p for p in found if any(i[1] == "VOTE" for i in ins if p[0] <= i[0] <= p[1])),
                     key=lambda p: p[1] - p[0])
    else:
        raise ValueError(rule)
    return executed_path(ins, lo, hi, avoid)


def table(text: str) -> list[str]:
    funs = functions(text)
    sources: dict[str, int] = {}
    lines = [
        "| kernel | form | bytes / weight | SASS / weight | ALU | IMAD·IDP | FP32·FP16 | memory | HMMA "
        "| bounds, T weights/s: bytes · issue · ALU · FMA-heavy · FMA | limit | measured, T weights/s (× bf16, µs) | of the limit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    spills = []
    for s in SPECS:
        if s.kernel not in funs:
            raise SystemExit(f"{s.kernel}: not in the PTX")
        c = main_loop(funs[s.kernel], s.loop, s.avoid)
        if c["STL"] or c["LDL"]:
            spills.append((s.kernel, c["STL"], c["LDL"]))
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
            frac = f"{rate / bounds[which]:.0%}"
        shown = " · ".join(f"{bounds[k] / 1e12:.1f}" if k in bounds else "–"
                           for k in ("bytes", "issue", "ALU", "FMA-heavy", "FMA"))
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
    if spills:
        lines.append("")
        lines.append("Register spills on a trip's path: " + ", ".join(
            f"`{k}` ({st} `STL`, {ld} `LDL`)" for k, st, ld in spills) + ".")
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
