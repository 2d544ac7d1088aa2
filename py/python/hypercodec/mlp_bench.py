"""``python -m hypercodec mlp-bench``: the seed project's benchmark done honestly — its
4096-wide, 4-layer MLP (PyTorch's default initialization) under each of the ten planner modes,
for inference and training, on the CPU or (``--device cuda``) a CUDA device.

Per mode the MLP's weights go through the same pipeline as the command line
(:func:`hypercodec.save` with ``mode=``; BUDGET and AUTO at ``--target-bps``), then:

- inference: the layers run on the stored form (:func:`hypercodec.nn.load_into`); median
  seconds per forward step of a ``--batch``-row batch and of one row (the memory-bound case), bytes the layers hold (the runtime's
  operators and biases, against the f32 weights'), output drift ``‖y − y_f32‖ / ‖y_f32‖``;
- training: each layer trains its float master weight through the straight-through estimator
  on the mode's per-tensor choice (re-quantized every step), ``--train-steps`` Adam steps on a
  regression towards a fixed random teacher; median seconds per step, bytes held (master
  weights, Adam state and the compressed form), and the drift of the trained model's output
  from the f32 model trained alike. A mode whose plan mixes encodings inside a tensor
  (PER_BLOCK's ``mixed``, PER_WEIGHT's ``exceptions``) has no single recipe to re-quantize with:
  its training row says so.

On a CUDA device the model, its batch and the f32 baseline live there; the compressed layers run
their device forms (:mod:`hypercodec.cuda`), timed with a synchronize around each step, and the
bytes held are the PyTorch allocator's growth when the layers build their device forms.
Training re-quantizes each master weight on the host every step (the codecs run on the CPU), so
its time is mostly that.

Output: ``OUT/mlp.md`` and ``OUT/mlp.json`` (``mlp-cuda.*`` on a CUDA device).

    python -m hypercodec mlp-bench [--width 4096] [--layers 4] [--batch 16] [--device cpu] [--out docs/eval]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import tempfile
import time
from typing import Any

__all__ = ["main"]

MODES = ("lowest", "highest", "allow", "closest", "average", "best", "per_block", "per_weight", "budget", "auto")

# Plan labels (hwz encodings) → the candidate names a layer re-quantizes with.
_LABEL_SPECS = {
    "raw-f32": "f32",
    "raw-bf16": "bf16",
    "raw-f16": "f16",
}


def _spec_of(label: str) -> str | None:
    """The candidate name of a plan label (``affine-int4-g128-asym-f16`` → ``int4``,
    ``lattice-e8-rans@4`` → ``e8@4``), or None for mixed and exception encodings."""
    if label in _LABEL_SPECS:
        return _LABEL_SPECS[label]
    parts = label.split("-")
    if parts[0] == "affine" and len(parts) >= 3:
        bits = parts[1]
        group = parts[2]
        if group == "g128" and parts[3:4] == ["asym"]:
            return bits
        if group.startswith("g") and parts[3:4] in (["asym"], ["sym"]):  # (intN-gG, intN-gG-sym)
            return f"{bits}-{group}" + ("-sym" if parts[3] == "sym" else "")
        if group == "row":
            return f"{bits}-row"
        if group == "tensor":
            return f"{bits}-tensor"
        return None
    if parts[0] == "lattice" and "@" in label:
        lat = parts[1]
        return f"{lat}@{label.rsplit('@', 1)[1]}"
    if parts[0] == "lattice" and parts[-1].startswith("fixed"):
        return f"{parts[1]}-{parts[-1]}"
    return None


def _mlp(width: int, layers: int) -> Any:
    import torch

    mods: list[Any] = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _drift(y: Any, ref: Any) -> float:
    return float((y - ref).norm() / ref.norm())


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(f: Any, reps: int, device: Any) -> float:
    ts = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        f()
        _sync(device)
        ts.append(time.perf_counter() - t)
    return _median(ts)


def _train(model: Any, x: Any, target: Any, steps: int) -> list[float]:
    import torch

    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for _ in range(steps):
        _sync(x.device)
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        _sync(x.device)
        times.append(time.perf_counter() - t)
    return times


def _held_training(model: Any) -> int:
    from . import nn as hnn

    n = 0
    for m in model.modules():
        if isinstance(m, hnn.HyperLinear):
            n += m.op.held_bytes
    # Master weights and biases, and Adam's two moments of each.
    n += 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    return n


def run(width: int, layers: int, batch: int, steps: int, train_steps: int, target_bps: float,
        modes: list[str], progress: Any = print, device: str = "cpu") -> dict[str, Any]:
    """The benchmark; returns the rows and the f32 baselines."""
    import torch

    import hypercodec

    from . import nn as hnn

    dev = torch.device(device)
    torch.manual_seed(0)
    base = _mlp(width, layers).eval()
    teacher = _mlp(width, layers).eval()
    x = torch.randn(batch, width)
    sd = {k: v.detach().numpy() for k, v in base.state_dict().items()}
    base, teacher, x = base.to(dev), teacher.to(dev), x.to(dev)
    with torch.no_grad():
        ref = base(x)
        target = teacher(x)
    dense_bytes = sum(p.numel() * 4 for p in base.parameters())
    x1 = x[:1]
    with torch.no_grad():
        base(x)  # warm-up (CUDA: kernel selection)
        t_ref = _timed(lambda: base(x), steps, dev)
        t_ref1 = _timed(lambda: base(x1), steps, dev)
    trained_ref = copy.deepcopy(base).train()
    tt_ref = _train(trained_ref, x, target, train_steps)
    with torch.no_grad():
        y_trained_ref = trained_ref(x)
    rows: list[dict[str, Any]] = []
    for mode in modes:
        row: dict[str, Any] = {"mode": mode}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "mlp.hwz")
            opts: dict[str, Any] = {"mode": mode}
            if mode in ("budget", "auto"):
                opts["target_bps"] = target_bps
            if mode == "budget":
                # The layers are what is held and measured: the target counts their streams.
                opts["target_scope"] = "streams"
            t = time.time()
            try:
                info = hypercodec.save(sd, path, **opts)
            except hypercodec.HypercodecError as e:
                row["error"] = str(e)
                rows.append(row)
                progress(f"mlp-bench: {mode}: {e}")
                continue
            row["compress_s"] = time.time() - t
            lossy = info["totals"].get("lossy") or {}
            row["bps"] = info["totals"]["bps_file"]
            row["lossy_bps"] = lossy.get("bps")
            row["snr_db"] = lossy.get("snr_db")
            plan = hypercodec.inspect(path).get("plan") or {}
            labels = {p["name"]: p.get("label", "?") for p in plan.get("tensors", [])}
            row["choices"] = sorted({v for k, v in labels.items() if k.endswith("weight")})
            model = hnn.load_into(_mlp(width, layers).eval(), path).to(dev)
            with torch.no_grad():
                before = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
                y = model(x)  # on a CUDA device this builds the layers' device forms
                if dev.type == "cuda":
                    _sync(dev)
                    # The allocator's growth: device forms and biases, not the output.
                    row["held_bytes"] = torch.cuda.memory_allocated(dev) - before - y.numel() * y.element_size()
                row["infer_s"] = _timed(lambda: model(x), steps, dev)
                row["infer1_s"] = _timed(lambda: model(x1), steps, dev)
            row["infer_ratio"] = row["infer_s"] / t_ref
            row["infer1_ratio"] = row["infer1_s"] / t_ref1
            if dev.type != "cuda":
                row["held_bytes"] = sum(m.op.held_bytes for m in model.modules() if isinstance(m, hnn.HyperLinear))
                row["held_bytes"] += sum(p.numel() * p.element_size() for p in model.parameters())
            row["held_ratio"] = row["held_bytes"] / dense_bytes
            row["drift"] = _drift(y, ref)
        specs = {k.removesuffix(".weight"): _spec_of(v) for k, v in labels.items() if k.endswith("weight")}
        if any(s is None for s in specs.values()):
            row["train"] = "n/a: no single recipe per tensor to re-quantize with (" + ", ".join(row["choices"]) + ")"
        else:
            tm = copy.deepcopy(base).train()
            for name, layer in list(tm.named_children()):
                if isinstance(layer, torch.nn.Linear):
                    setattr(tm, name, hnn.HyperLinear.from_linear(layer, specs[name], trainable=True))
            times = _train(tm, x, target, train_steps)
            tm.eval()
            with torch.no_grad():
                y_t = tm(x)
            row["train_s"] = _median(times[1:] or times)
            row["train_ratio"] = row["train_s"] / _median(tt_ref[1:] or tt_ref)
            row["train_held_ratio"] = _held_training(tm) / (3 * dense_bytes)
            row["train_drift"] = _drift(y_t, y_trained_ref)
        rows.append(row)
        progress(f"mlp-bench: {mode}: {row.get('bps', 0):.2f} bps, drift {row.get('drift', math.nan):.4f}, "
                 f"inference {row.get('infer_ratio', math.nan):.2f}x, training {row.get('train_ratio', 'n/a')}")
    return {"rows": rows, "f32_infer_s": t_ref, "f32_infer1_s": t_ref1, "f32_train_s": _median(tt_ref[1:] or tt_ref),
            "dense_bytes": dense_bytes}


def _f(v: Any, fmt: str) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(res: dict[str, Any], meta: dict[str, Any]) -> str:
    """The results page."""
    out = [
        "# The seed's MLP benchmark, every planner mode",
        "",
        f"Regenerate: `{meta['command'].strip()}` ({meta['seconds']:.0f} s). Machine: {meta['machine']}; "
        f"torch {meta['torch']}, hypercodec {meta['hypercodec']}, {meta['threads']} threads. "
        f"Model: {meta['model']}, PyTorch's default initialization, batch {meta['batch']}.",
        "",
        f"f32 baseline: {1000 * res['f32_infer_s']:.3g} ms per forward step ({1000 * res['f32_infer1_s']:.3g} ms at "
        f"batch 1), {1000 * res['f32_train_s']:.4g} ms per "
        f"training step, {res['dense_bytes'] / 2**20:.1f} MiB of weights. Ratios are against these, measured in the "
        "same run. Drift: ‖y − y_f32‖ / ‖y_f32‖ on the batch (training: against the f32 model trained alike). "
        "Held: the bytes of the layers as they run (compressed operators and biases), against the f32 weights'; "
        "training also holds float master weights and Adam's moments (ratio against f32 training's).",
        "",
        "| mode | bits/value all-in (lossy tensors) | weight SNR dB | picks | inference ms | vs f32 | batch 1 vs f32 | "
        "held vs f32 | drift | training ms | vs f32 | held vs f32 | drift |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        if "error" in r:
            out.append(f"| {r['mode']} | failed: {r['error']} ||||||||||||")
            continue
        if "train" in r:
            train = f"{r['train']} | | | "
        else:
            train = (f"{1000 * r['train_s']:.0f} | {r['train_ratio']:.2f}× | {r['train_held_ratio']:.3f} | "
                     f"{r['train_drift']:.4f} ")
        out.append(
            f"| {r['mode']} | {r['bps']:.3f} ({_f(r['lossy_bps'], '.3f')}) | {_f(r['snr_db'], '.2f')} | {', '.join(r['choices'])} | "
            f"{1000 * r['infer_s']:.3g} | {r['infer_ratio']:.2f}× | {r['infer1_ratio']:.2f}× | {r['held_ratio']:.3f} | {r['drift']:.4f} | {train}|"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    """The ``mlp-bench`` command."""
    ap = argparse.ArgumentParser(prog="python -m hypercodec mlp-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="timed forward steps (median)")
    ap.add_argument("--train-steps", type=int, default=3, help="Adam steps (median time of all but the first)")
    ap.add_argument("--target-bps", type=float, default=4.0, help="BUDGET and AUTO's target")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--out", default="docs/eval")
    a = ap.parse_args(argv)
    import torch

    from . import __version__, _native
    from .eval import set_threads

    set_threads(a.threads)
    start = time.time()
    modes = [m for m in a.modes.split(",") if m]
    res = run(a.width, a.layers, a.batch, a.steps, a.train_steps, a.target_bps, modes, device=a.device)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, kernels {_native.simd_level()}"
    if a.device.startswith("cuda"):
        machine += f"; device {torch.cuda.get_device_name(torch.device(a.device))} (CUDA {torch.version.cuda})"
    meta = {
        "command": "python -m hypercodec mlp-bench " + " ".join(argv),
        "machine": machine,
        "torch": torch.__version__,
        "hypercodec": __version__,
        "threads": a.threads,
        "model": f"{a.layers} × Linear({a.width}, {a.width}) with ReLU between",
        "batch": a.batch,
        "seconds": time.time() - start,
    }
    os.makedirs(a.out, exist_ok=True)
    stem = "mlp-cuda" if a.device.startswith("cuda") else "mlp"
    with open(os.path.join(a.out, f"{stem}.md"), "w", encoding="utf-8") as f:
        f.write(markdown(res, meta))
    with open(os.path.join(a.out, f"{stem}.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, **res}, f, indent=1, default=str)
    print(f"wrote {a.out}/{stem}.md ({time.time() - start:.0f} s)")
    return 0
