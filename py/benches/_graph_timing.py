"""CUDA-graph timing shared by the benchmark scripts beside this file."""

from __future__ import annotations

import statistics

import torch


def graph_time_us(fn, iters: int, replays: int = 5) -> float:
    """Median µs per call of `fn` over `replays` replays of a CUDA graph of `iters` calls (three
    warm-up calls first, on a side stream). `fn` may change what it launches from call to call
    (rotating over weight copies, say): the graph records the calls as made during capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / iters)
    return statistics.median(times)
