"""End to end on CUDA: a Llama-shaped decoder (batch 1 by default), bf16 against compressed layers.

    python py/benches/cuda_e2e.py [--layers 8] [--specs int4,e8-fixed4,int8-row] [--out FILE] [--batch B]
        [--prefill N] [--acts fp8 [--round-weights]] [--compile [--grouping on|off|both]
        [--group-streams on|off|both]] [--merged-bf16] [--eager]

A stack of Llama-3-8B-shaped blocks (hidden 4096, MLP 14336, 32 query heads and 8 key/value
heads of 128, RMS norms, SiLU gate) plus a 32000-row output head, random weights (bf16), one
decode step = every block over one new token attending to a fixed context of ``--context``
cached tokens, then the head. Each configuration's step is captured in one CUDA graph (Python
launch overhead is not counted, for bf16 and for us alike) and timed with CUDA events over
``--iters`` replays, median of 5; tokens/s = 1 / step time (``--batch B``: B sequences, each
with its own cache, advance a token a step; tokens/s = B / step time). With ``--prefill N`` the step is a prompt of N
tokens instead (causal attention over them, no cache; the head on the last token only) and
tokens/s = N / step time. ``--acts fp8`` (or ``int8``) also quantizes the compressed layers'
activations (``hypercodec.nn.quantize_activations``; layers it does not take, or that stay
weight-only on CUDA under its size and batch rules, run weight-only, while the host reference
quantizes every layer it takes; ``--round-weights`` passes ``round_weights=True``, so that the
trellis and entropy-coded forms take FP8 too). The layers are coded from the weights on the GPU
(the trellis on the GPU encoder, the same bits as the CPU's). The compressed rows replace every
linear layer (blocks and head) by ``hypercodec.nn.HyperLinear`` with the named candidate;
"resident bytes per parameter" is the device memory those layers hold (PyTorch's allocator:
every buffer of ours is a PyTorch tensor) over their parameters. Before timing, each
compressed step is checked against the same compressed model run on the host (the CPU
runtime). ``--compile`` runs every configuration through ``torch.compile(fullgraph=True)``
(inductor fuses the norms, activations and adds; each compressed layer is one opaque operator)
before the graph is captured; stored linear layers that read one input (q, k, v; gate, up) then
run together (``hypercodec.nn.set_compile_grouping``; ``--grouping both`` times each compressed
configuration with and without): affine ones in one launch at batch 1, otherwise side by side on
streams of their own (``--group-streams both`` times that on and off). ``--merged-bf16`` also times a bf16 model whose
q/k/v and gate/up weights are concatenated into one ``F.linear`` each (as vLLM merges them), the
peer for grouped launches. ``--eager`` times the step as an eager PyTorch program runs it (HF
``generate`` without a compiled step): ``--iters`` calls back to back, no graph, so Python's
launch cost counts for bf16 and for us alike (CUDA events around the calls, median of 5). Needs
a CUDA device (exits 0 with a message when there is none).
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import hypercodec
import hypercodec.cuda as hcuda
import hypercodec.nn as hnn


class Block(nn.Module):
    def __init__(self, d: int, f: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)
        self.n1 = nn.Parameter(torch.ones(d))
        self.n2 = nn.Parameter(torch.ones(d))

    @staticmethod
    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def forward(self, x: torch.Tensor, kc: torch.Tensor | None, vc: torch.Tensor | None) -> torch.Tensor:
        if kc is None:
            return self.prefill(x)
        b = x.shape[0]  # (sequences decoded together)
        h = self.rms(x, self.n1)
        q, k, v = self.qkv(h)
        q = q.view(b, 1, self.heads, self.hd).transpose(1, 2)
        # The new token's key and value go into the cache's last slot (a fixed place, so
        # that the step is one graph).
        kc[:, :, -1:].copy_(k.view(b, 1, self.kv_heads, self.hd).transpose(1, 2))
        vc[:, :, -1:].copy_(v.view(b, 1, self.kv_heads, self.hd).transpose(1, 2))
        a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, 1, -1))
        h = self.rms(x, self.n2)
        return x + self.down(self.mlp_in(h))

    def qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if "merged_qkv" in self._modules:  # (see `merged`)
            return self.merged_qkv(h).split([self.q.out_features, self.k.out_features, self.v.out_features], -1)
        return self.q(h), self.k(h), self.v(h)

    def mlp_in(self, h: torch.Tensor) -> torch.Tensor:
        if "merged_gate_up" in self._modules:
            g, u = self.merged_gate_up(h).split([self.gate.out_features, self.up.out_features], -1)
            return F.silu(g) * u
        return F.silu(self.gate(h)) * self.up(h)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """A prompt of n tokens: causal attention among them (no cache)."""
        n = x.shape[1]
        h = self.rms(x, self.n1)
        q = self.q(h).reshape(1, n, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).reshape(1, n, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(h).reshape(1, n, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(1, n, -1))
        h = self.rms(x, self.n2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, layers: int, d: int = 4096, f: int = 14336, heads: int = 32, kv_heads: int = 8,
                 vocab: int = 32000) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, f, heads, kv_heads) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        for b, (kc, vc) in zip(self.blocks, caches):
            x = b(x, kc, vc)
        return self.head(Block.rms(x[:, -1:], self.norm))


class NoLinear(nn.Module):
    """A linear layer's place taken by a fixed output (no kernel): a step of these times the
    rest of the step (norms, attention, cache writes, adds). ``reads``: the output also reads
    one column of the input, so that a compiler cannot drop the work that feeds the layer (an
    add that it fuses into that work)."""

    def __init__(self, like: nn.Linear, reads: bool = False) -> None:
        super().__init__()
        w = like.weight
        self.reads = reads
        self.register_buffer("out", torch.randn(1, 1, like.out_features, device=w.device, dtype=w.dtype) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.out.expand(*x.shape[:-1], -1)
        return out + x[..., :1] if self.reads else out


def without_linears(model: nn.Module, reads: bool = False) -> nn.Module:
    for m in list(model.modules()):
        for name, c in list(m.named_children()):
            if isinstance(c, nn.Linear):
                setattr(m, name, NoLinear(c, reads))
    return model


def merged(model: nn.Module) -> nn.Module:
    """A bf16 model whose blocks compute q, k and v in one ``F.linear`` (their weights
    concatenated, as vLLM's merged projections do), and gate and up in another."""
    for b in model.blocks:
        for name, parts in (("merged_qkv", (b.q, b.k, b.v)), ("merged_gate_up", (b.gate, b.up))):
            w = torch.cat([p.weight.detach() for p in parts])
            m = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
            m.weight.data.copy_(w)
            setattr(b, name, m)
        for p in (b.q, b.k, b.v, b.gate, b.up):
            p.weight.data = p.weight.data[:0]  # (shapes kept for the split; weights freed)
    return model


def linear_params(model: nn.Module) -> int:
    return sum(m.in_features * m.out_features for m in model.modules()
               if isinstance(m, (nn.Linear, hnn.HyperLinear)))


COMPILED: list[str] = []  # per timed configuration: its graphs and compile seconds


def time_step(model: nn.Module, x: torch.Tensor, caches, iters: int, compile: str | None = None,
              eager: bool = False) -> tuple[float, torch.Tensor]:
    """Median milliseconds per decode step (CUDA graph replays; ``eager``: calls back to back)
    and the step's output (``compile``: ``"whole"``, of ``torch.compile(model, fullgraph=True)``;
    ``"regional"``, with each block compiled on its own, ``block.compile(fullgraph=True)``)."""
    from torch._dynamo.utils import counters

    if compile:
        torch._dynamo.reset()
        counters.clear()
        if compile == "whole":
            model = torch.compile(model, fullgraph=True)
        else:
            for b in model.blocks:
                b.compile(fullgraph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        t0 = time.perf_counter()
        model(x, caches)  # (compiles)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(2):
            model(x, caches)
    torch.cuda.current_stream().wait_stream(s)
    if compile:
        COMPILED.append(f"{counters['stats']['unique_graphs']} graphs, {first:.1f} s to the first output")
    if eager:
        times = []
        with torch.no_grad():
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(iters):
                    out = model(x, caches)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / iters)
        return statistics.median(times), out.detach().clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = model(x, caches)
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times), out.detach().clone()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1, help="sequences a decode step advances together")
    ap.add_argument("--specs", default="int4,e8-fixed4,int8-row")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out")
    ap.add_argument("--prefill", type=int, default=0, help="time a prompt of this many tokens instead of a decode step")
    ap.add_argument("--acts", choices=["fp8", "int8"], help="also quantize the compressed layers' activations")
    ap.add_argument("--round-weights", action="store_true",
                    help="with --acts fp8: layers without an exact E4M3 weight use their decoded weight rounded to E4M3")
    ap.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) every configuration before capturing")
    ap.add_argument("--regional", action="store_true",
                    help="instead of --compile: compile each block on its own (block.compile(fullgraph=True)), as for a model's repeated blocks")
    ap.add_argument("--group-streams", choices=["on", "off", "both"], default="on",
                    help="compiled and grouped: the grouped layers' launches side by side on streams of their own "
                    "(hypercodec.cuda._GROUP_STREAMS, on as shipped) or one after another; both: time each way")
    ap.add_argument("--grouping", choices=["on", "off", "both"], default="on",
                    help="compiled: stored layers that read one input in one launch at batch 1 "
                    "(hypercodec.nn.set_compile_grouping); both: time each compressed configuration both ways")
    ap.add_argument("--merged-bf16", action="store_true",
                    help="also time a bf16 model with q/k/v and gate/up merged into one F.linear each")
    ap.add_argument("--eager", action="store_true",
                    help="time eager calls back to back (Python's launch cost counted) instead of CUDA graph replays")
    ap.add_argument("--fp8-min-weights", type=int, default=None,
                    help="override hypercodec.nn.FP8_MIN_WEIGHTS (the size under which FP8 layers stay weight-only)")
    a = ap.parse_args()
    if a.round_weights and a.acts != "fp8":
        ap.error("--round-weights needs --acts fp8")
    if a.regional and a.compile:
        ap.error("--regional and --compile are two ways to compile: choose one")
    if a.merged_bf16 and a.prefill:
        ap.error("--merged-bf16 times a decode step")
    if a.batch != 1 and a.prefill:
        ap.error("--batch sets the sequences of a decode step; --prefill times one prompt")
    if a.batch < 1:
        ap.error("--batch takes one sequence or more")
    if a.eager and (a.compile or a.regional):
        ap.error("--eager times uncompiled calls")
    mode = "regional" if a.regional else "whole" if a.compile else None
    if a.fp8_min_weights is not None:
        hnn.FP8_MIN_WEIGHTS = a.fp8_min_weights
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    base = Decoder(a.layers).to(torch.bfloat16)
    for m in base.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
    params = linear_params(base)
    hd = 128
    if a.prefill:
        caches = [(None, None)] * a.layers
        x = torch.randn(1, a.prefill, 4096, device=dev, dtype=torch.bfloat16)
    else:
        caches = [
            (torch.randn(a.batch, 8, a.context, hd, device=dev, dtype=torch.bfloat16),
             torch.randn(a.batch, 8, a.context, hd, device=dev, dtype=torch.bfloat16))
            for _ in range(a.layers)
        ]
        x = torch.randn(a.batch, 1, 4096, device=dev, dtype=torch.bfloat16)
    tokens = a.prefill or a.batch
    what = (f"a prompt of {a.prefill} tokens (causal attention among them, the head on the last)" if a.prefill
            else f"batch {a.batch}, context {a.context}")
    if a.acts:
        what += f", compressed layers' activations {a.acts} (`quantize_activations`)"
    if a.compile:
        what += ", every configuration `torch.compile(fullgraph=True)`"
    if a.regional:
        what += ", every configuration's blocks compiled one by one (`block.compile(fullgraph=True)`)"
    if a.eager:
        what += ", eager calls back to back (no CUDA graph: Python's launch cost counted)"
    lines = [
        f"Llama-shaped decoder, {a.layers} blocks of hidden 4096 / MLP 14336 / 32 heads (8 KV) + a 32000-row "
        f"head: {params / 1e9:.2f} G linear parameters, {what}; "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, hypercodec {hypercodec.__version__}, "
        f"{platform.python_version()}. Command: `python py/benches/cuda_e2e.py {' '.join(sys.argv[1:])}`.",
        "",
        "| weights | resident bytes / param | step ms | tokens/s | vs bf16 | linear layers ms | their speed vs bf16 | max rel. error vs host |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    torch.cuda.synchronize()
    m0 = torch.cuda.memory_allocated()
    dense = copy.deepcopy(base).to(dev)
    held = torch.cuda.memory_allocated() - m0
    names = ["bf16", "the rest"]  # (the configurations compiled, in order)
    ms_bf16, _ = time_step(dense, x, caches, a.iters, mode, a.eager)
    ms_rest, _ = time_step(without_linears(dense, reads=mode is not None), x, caches, a.iters, mode, a.eager)
    lin_bf16 = ms_bf16 - ms_rest
    lines.append(f"| bf16 (`F.linear`) | {held / params:.3f} | {ms_bf16:.3f} | {1000 * tokens / ms_bf16:.1f} | 1.00× "
                 f"| {lin_bf16:.3f} | 1.00× | – |")
    print(lines[-1], flush=True)
    del dense
    torch.cuda.empty_cache()
    if a.merged_bf16:
        names.append("bf16 merged")
        ms_m, _ = time_step(merged(copy.deepcopy(base).to(dev)), x, caches, a.iters, mode, a.eager)
        lines.append(f"| bf16, q/k/v and gate/up merged (one `F.linear` each) | 2.000 | {ms_m:.3f} | {1000 * tokens / ms_m:.1f} "
                     f"| {ms_bf16 / ms_m:.2f}× | {ms_m - ms_rest:.3f} | {lin_bf16 / (ms_m - ms_rest):.2f}× | – |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    for spec in [s for s in a.specs.split(",") if s]:
        q = copy.deepcopy(base).to(dev)  # the GPU codes trellis specs (the same bits as the CPU)
        hnn.quantize(q, bps=4, method=spec, skip=())
        q = q.cpu()
        if a.acts:
            hnn.quantize_activations(q, a.acts, round_weights=a.round_weights)
        # The host reference first (CPU runtime), on the same compressed layers.
        host_caches = [(None, None) if k is None else (k.float().cpu(), v.float().cpu()) for k, v in caches]
        with torch.no_grad():
            want = q.float()(x.float().cpu(), host_caches)
        q = q.to(torch.bfloat16)
        torch.cuda.synchronize()
        m0 = torch.cuda.memory_allocated()
        q = q.to(dev)
        with torch.no_grad():
            q(x, [(None, None) if k is None else (k.clone(), v.clone()) for k, v in caches])  # builds every device form
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - m0
        ways = [(g, st) for g in (("on", "off") if a.grouping == "both" else (a.grouping,))
                for st in (("on", "off") if a.group_streams == "both" and g == "on" and mode else (a.group_streams,))]
        for grouping, streams in ways:
            hnn.set_compile_grouping(grouping == "on")
            hcuda._GROUP_STREAMS = streams == "on"
            label = spec + (" (grouping off)" if grouping == "off" and mode else "") + (
                " (streams off)" if streams == "off" and grouping == "on" and mode else "")
            names.append(label)
            ms, got = time_step(q, x, caches, a.iters, mode, a.eager)
            err = float((got.float().cpu() - want).abs().max() / want.abs().max())
            lines.append(f"| {label} | {held / params:.3f} | {ms:.3f} | {1000 * tokens / ms:.1f} | {ms_bf16 / ms:.2f}× "
                         f"| {ms - ms_rest:.3f} | {lin_bf16 / (ms - ms_rest):.2f}× | {err:.2e} |")
            print(lines[-1], flush=True)
        hnn.set_compile_grouping(True)
        hcuda._GROUP_STREAMS = True
        del q
        torch.cuda.empty_cache()
    lines += [
        "",
        f"The rest of the step (every linear layer's place taken by a fixed output: norms, attention over "
        f"the context, cache writes, adds) takes {ms_rest:.3f} ms; *linear layers ms* is a row's step less "
        f"that. With it fixed, the step is at most {ms_bf16 / ms_rest:.2f}× faster than bf16's however fast "
        f"the linear layers; 2× needs them {lin_bf16 / max(ms_bf16 / 2 - ms_rest, 1e-9):.2f}× faster than bf16's"
        + (" (more than the step's rest allows)." if ms_bf16 / 2 <= ms_rest else "."),
    ]
    if COMPILED:
        lines += ["", "Compiled: " + "; ".join(f"{n} {c}" for n, c in zip(names, COMPILED)) + "."]
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
