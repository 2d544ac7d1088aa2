"""Input-gradient cost of compressed layers on CUDA: forward + backward with the weight decoded
on the device (what `HyperLinear` does) against the host decode alone (what it did before), and
their relative difference. Run on a CUDA machine: `python py/benches/cuda_backward.py`."""
import time

import torch

import hypercodec.nn as hnn

torch.manual_seed(0)
print("| spec | 4096x4096 backward, batch 16, bf16 | forward + backward, device decode, ms | host decode ms |")
for spec in ["int4", "e8-fixed4", "tcq@2-l12"]:
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(4096, 4096), spec)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(2): h(x).backward(gy)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(5): h(x).backward(gy)
    torch.cuda.synchronize(); dev = (time.perf_counter() - t) / 5 * 1e3
    t = time.perf_counter()
    for _ in range(2): g = gy.float() @ hnn._decoded(h, gy.device)
    torch.cuda.synchronize(); host = (time.perf_counter() - t) / 2 * 1e3
    err = ((x.grad.float() / 7 - g).norm() / g.norm()).item()  # x.grad accumulated 7 times
    print(f"| {spec} | rel. diff to host {err:.1e} | {dev:.2f} | {host:.1f} |")
