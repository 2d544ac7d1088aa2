"""Where the compiled decode step of `cuda_e2e.py` spends its time: each kernel of one CUDA-graph
replay (torch.profiler), the time between kernels, and the kernels summed by name, for bf16
`F.linear` and INT4 g128 (grouped launches on), 8 Llama-shaped blocks, batch 1, context 1024.

    python py/benches/cuda_e2e_profile.py          # LAYERS=8 by default

Figures and what they showed: docs/eval/cuda_e2e.md ("Where the compiled INT4 step's time goes").
"""
import copy
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from torch import nn
import cuda_e2e as E
import hypercodec.nn as hnn
from torch.profiler import profile, ProfilerActivity

if not torch.cuda.is_available():
    print("no CUDA device: nothing to profile")
    sys.exit(0)
layers = int(os.environ.get("LAYERS", "8"))
dev = torch.device("cuda")
torch.manual_seed(0)
base = E.Decoder(layers).to(torch.bfloat16)
for m in base.modules():
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
caches = [(torch.randn(1, 8, 1024, 128, device=dev, dtype=torch.bfloat16),
           torch.randn(1, 8, 1024, 128, device=dev, dtype=torch.bfloat16)) for _ in range(layers)]
x = torch.randn(1, 1, 4096, device=dev, dtype=torch.bfloat16)


def graph_of(model):
    torch._dynamo.reset()
    model = torch.compile(model, fullgraph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x, caches)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        model(x, caches)
    return g


def timed(g, iters=30):
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / iters)
    return statistics.median(ts)


def prof(label, g):
    ms = timed(g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0]
    ks = sorted([(e.time_range.start, e.time_range.end, e.name) for e in ev if "emcpy" not in e.name and "emset" not in e.name])
    print(f"\n## {label}: step {ms*1000:.1f} us (graph replays); {len(ks)} kernel records in 3 replays", flush=True)
    if not ks:
        return
    n = len(ks) // 3
    rep = ks[-n:]
    span = rep[-1][1] - rep[0][0]
    busy = sum(e - s for s, e, _ in rep)
    gaps = [rep[i + 1][0] - rep[i][1] for i in range(len(rep) - 1)]
    print(f"kernels per step {n}; span {span:.1f} us, busy {busy:.1f} us, gaps {sum(gaps):.1f} us "
          f"(median gap {statistics.median(gaps):.2f} us, max {max(gaps):.1f})")
    agg = {}
    for s, e, nm in rep:
        k = nm[:70]
        c, t = agg.get(k, (0, 0.0)); agg[k] = (c + 1, t + e - s)
    for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"  {t:8.1f} us  {c:3d}x  {t/c:6.2f}  {k}")
    # One block's sequence with the gap before each kernel.
    print("  first 16 kernels of the last replay (gap before, duration):")
    prev = None
    for s, e, nm in rep[:16]:
        print(f"    {0 if prev is None else s - prev:5.2f} {e - s:7.2f}  {nm[:60]}")
        prev = e


dense = copy.deepcopy(base).to(dev)
prof("bf16", graph_of(dense))
del dense; torch.cuda.empty_cache()
q = copy.deepcopy(base).to(dev)
hnn.quantize(q, bps=4, method="int4", skip=())
q = q.cpu().to(torch.bfloat16).to(dev)
with torch.no_grad():
    q(x, [(k.clone(), v.clone()) for k, v in caches])
prof("int4", graph_of(q))
