"""Where the time of an `int4` layer with FP8 activations goes, on CUDA: the block-scaled
quantization kernel, the FP8 GEMM, the offsets' term, against the whole layer and bf16
`F.linear`, in one run (needs a CUDA device of compute capability 9.x).

    python py/benches/cuda_fp8_parts.py [--sizes 8192x8192,28672x8192] [--batches 64,256,1024]

Medians over CUDA-graph replays (`_graph_timing`); each part timed alone, the layer as a whole.
Also times the per-token kernel (`hc_quant_f8`) and torch's own division and E4M3 cast on the
same input, for scale.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from _graph_timing import graph_time_us

import hypercodec.cuda as hcuda
import hypercodec.nn as hnn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8192x8192,28672x8192")
    ap.add_argument("--batches", default="64,256,1024")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("cuda_fp8_parts: no CUDA device of compute capability 9.x; nothing to do")
        return 0
    torch.manual_seed(0)
    dev = torch.device("cuda")
    k = hcuda.kernels(dev)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| size | rows | bf16 | layer | quantization | FP8 GEMM | sums → bf16 | offsets' addmm_ | "
          "per-token hc_quant_f8 | torch x / 3 → E4M3 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in a.sizes.split(","):
        rows, cols = (int(v) for v in size.split("x"))
        lin = torch.nn.Linear(cols, rows, bias=False)
        with torch.no_grad():
            lin.weight.normal_(0, 0.02)
        m = torch.nn.Sequential(hnn.HyperLinear.from_linear(lin, "int4")).to(dev)
        hnn.quantize_activations(m, "fp8")
        wb = lin.weight.detach().to(dev, torch.bfloat16)
        groups = cols // hnn.FP8_BLOCK
        for b in (int(v) for v in a.batches.split(",")):
            x = torch.randn(b, cols, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                m(x)
            hit = next(iter(m[0].__dict__["_w8a8"].values()))
            xq = torch.empty(b, cols, dtype=torch.float8_e4m3fn, device=dev)
            step = torch.empty(groups, b, device=dev).t()
            sums = torch.empty(b, groups, device=dev)
            step1 = torch.empty(b, 1, device=dev)
            common = {"x": x.data_ptr(), "x_dtype": 2, "q": xq.data_ptr(), "rows": b, "padded_rows": b, "cols": cols}
            blocks = {**common, "step": step.data_ptr(), "block": hnn.FP8_BLOCK, "sums": sums.data_ptr()}
            rowwise = {**common, "step": step1.data_ptr()}

            def stream() -> int:
                return torch.cuda.current_stream().cuda_stream

            t_q = graph_time_us(lambda: k.quant_f8(blocks, stream()), 30, 7)
            t_q1 = graph_time_us(lambda: k.quant_f8(rowwise, stream()), 30, 7)
            t_cast = graph_time_us(lambda: (x / 3.0).to(torch.float8_e4m3fn), 30, 7)
            k.quant_f8(blocks, stream())
            t_mm = graph_time_us(lambda: torch._scaled_mm(xq, hit.w.t(), scale_a=step, scale_b=hit.scales.t(),
                                                          out_dtype=torch.bfloat16), 30, 7)
            y = torch._scaled_mm(xq, hit.w.t(), scale_a=step, scale_b=hit.scales.t(), out_dtype=torch.bfloat16)
            s16 = sums.to(torch.bfloat16)
            t_cv = graph_time_us(lambda: sums.to(torch.bfloat16), 30, 7)
            t_add = graph_time_us(lambda: y.addmm_(s16, hit.offsets), 30, 7)
            with torch.no_grad():
                t_all = graph_time_us(lambda: m(x), 30, 7)
            t_bf = graph_time_us(lambda: F.linear(x, wb), 30, 7)
            print(f"| {size} | {b} | {t_bf:.1f} | {t_all:.1f} ({t_bf / t_all:.2f}×) | {t_q:.1f} | {t_mm:.1f} | "
                  f"{t_cv:.1f} | {t_add:.1f} | {t_q1:.1f} | {t_cast:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
