"""Compressed layers in 32 transformers architectures: does replacing a model's layers break it?

Each architecture is built from a tiny random config (CPU, float32, no download) and checked
four ways, each against the float model or the step before:

1. ``hypercodec.nn.quantize`` (INT8 affine; also with ``embeddings=True``, ``skip=()``, and,
   for vision models, without the convolutions): relative max error of the output;
2. quantized on load (``from_pretrained(..., quantization_config=HypercodecConfig(...))``), then
   ``save_pretrained`` and ``from_pretrained`` of that checkpoint: the reload must equal the
   quantized model;
3. ``torch.compile(fullgraph=True, backend="aot_eager")`` of the quantized model: equal to eager;
4. ``generate`` (5 greedy tokens) for the generative ones: the quantized model's tokens against
   the float model's, with and without the KV cache;
5. with ``--inductor``: ``torch.compile(fullgraph=True)`` with inductor, with the grouping of
   stored linear layers that read one input (``hypercodec.nn.set_compile_grouping``) on and
   off: the groups its pass made, whether the two compiles give the same outputs bit for bit,
   and the grouped compile's relative max error against eager;
6. with ``--cuda METHOD@BPS,...`` (a CUDA device): the model quantized by each method on the
   CPU (``skip=()``, embeddings too), moved to the GPU (where its layers run the CUDA kernels),
   against the same model on the CPU (the host runtime): relative max error in float32, and in
   bfloat16 (``model.to(torch.bfloat16)``, the GPU's 16-bit kernels) against the float32 host;
   for generative ones, whether 5 greedy tokens on the GPU equal the host's (a raise, other tokens
   or an f32 error over 1e-4 fail). All architectures run in one process (no compiler state to
   keep apart): a CUDA fault would fail the ones after it too.

    python py/benches/hf_arch_sweep.py [ARCH ...] [--inductor] [--cuda affine@4,trellis@2] [--out table.md]

Each architecture runs in a process of its own (dynamo's state and caches stay apart); the
table is printed, and the exit status is 1 when any check raised. Needs torch and transformers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers as T

import hypercodec.hf as hhf
import hypercodec.nn as hnn

LLM = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
ENC = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
torch.manual_seed(0)
ids = torch.randint(3, 120, (1, 8))
img = torch.randn(1, 3, 32, 32)


def causal(cfgcls: str, **kw: Any) -> dict[str, Any]:
    return dict(cfg=lambda: getattr(T, cfgcls)(**kw), cls=T.AutoModelForCausalLM, inp=lambda: dict(input_ids=ids), out=["logits"], gen=True)


ARCHS = {
 "Llama": causal("LlamaConfig", **LLM),
 "Mistral": causal("MistralConfig", **LLM),
 "Qwen2": causal("Qwen2Config", **LLM),
 "Qwen3": causal("Qwen3Config", **LLM, head_dim=16),
 "Gemma": causal("GemmaConfig", **LLM, head_dim=16),
 "Gemma2": causal("Gemma2Config", **LLM, head_dim=16),
 "Phi": causal("PhiConfig", **LLM),
 "Phi3": causal("Phi3Config", **LLM, pad_token_id=0),
 "GPT2": causal("GPT2Config", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64),
 "GPTNeo": causal("GPTNeoConfig", vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], max_position_embeddings=64, window_size=16),
 "GPTNeoX": causal("GPTNeoXConfig", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
 "GPTJ": causal("GPTJConfig", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8),
 "OPT": causal("OPTConfig", vocab_size=128, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64, pad_token_id=1),
 "Bloom": causal("BloomConfig", vocab_size=128, hidden_size=64, n_layer=2, n_head=4),
 "Falcon": causal("FalconConfig", vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
 "MPT": causal("MptConfig", vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=64),
 "GPTBigCode": causal("GPTBigCodeConfig", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64),
 "CodeGen": causal("CodeGenConfig", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, n_ctx=64, rotary_dim=8),
 "Starcoder2": causal("Starcoder2Config", **LLM),
 "BERT": dict(cfg=lambda: T.BertConfig(**ENC), cls=T.BertForMaskedLM, inp=lambda: dict(input_ids=ids), out=["logits"]),
 "RoBERTa": dict(cfg=lambda: T.RobertaConfig(**{**ENC, "max_position_embeddings": 66}, pad_token_id=1), cls=T.RobertaForMaskedLM, inp=lambda: dict(input_ids=ids), out=["logits"]),
 "DistilBERT": dict(cfg=lambda: T.DistilBertConfig(vocab_size=128, dim=64, hidden_dim=128, n_layers=2, n_heads=4, max_position_embeddings=64), cls=T.DistilBertForMaskedLM, inp=lambda: dict(input_ids=ids), out=["logits"]),
 "ALBERT": dict(cfg=lambda: T.AlbertConfig(vocab_size=128, embedding_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64), cls=T.AlbertForMaskedLM, inp=lambda: dict(input_ids=ids), out=["logits"]),
 "T5": dict(cfg=lambda: T.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1), cls=T.T5ForConditionalGeneration, inp=lambda: dict(input_ids=ids, decoder_input_ids=ids[:, :4]), out=["logits"], gen=True),
 "BART": dict(cfg=lambda: T.BartConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64), cls=T.BartForConditionalGeneration, inp=lambda: dict(input_ids=ids, decoder_input_ids=ids[:, :4]), out=["logits"], gen=True),
 "Whisper": dict(cfg=lambda: T.WhisperConfig(vocab_size=128, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None), cls=T.WhisperForConditionalGeneration, inp=lambda: dict(input_features=torch.randn(1, 16, 64), decoder_input_ids=torch.tensor([[1, 5, 6, 7]])), out=["logits"], gen=True, genkw=lambda: dict(input_features=torch.randn(1, 16, 64))),
 "ViT": dict(cfg=lambda: T.ViTConfig(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4), cls=T.ViTModel, inp=lambda: dict(pixel_values=img), out=["last_hidden_state"], conv=True),
 "CLIP": dict(cfg=lambda: T.CLIPConfig(text_config=dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32), vision_config=dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4), projection_dim=32), cls=T.CLIPModel, inp=lambda: dict(input_ids=ids, pixel_values=img), out=["text_embeds", "image_embeds"], conv=True),
 "Wav2Vec2": dict(cfg=lambda: T.Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4), cls=T.Wav2Vec2Model, inp=lambda: dict(input_values=torch.randn(1, 1600)), out=["last_hidden_state"]),
 "MobileNetV2": dict(cfg=lambda: T.MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=10), cls=T.MobileNetV2ForImageClassification, inp=lambda: dict(pixel_values=img), out=["logits"], conv=True, kaiming=True),
 "ResNet": dict(cfg=lambda: T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10), cls=T.ResNetForImageClassification, inp=lambda: dict(pixel_values=img), out=["logits"], conv=True),
 "ConvNext": dict(cfg=lambda: T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32, num_labels=10), cls=T.ConvNextForImageClassification, inp=lambda: dict(pixel_values=img), out=["logits"], conv=True),
}


def _outs(spec: dict[str, Any], m: torch.nn.Module, inp: dict[str, Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        o = m(**inp)
    return [getattr(o, k) if hasattr(o, k) else o[k] for k in spec["out"]]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b))


def _float_model(spec: dict[str, Any]) -> torch.nn.Module:
    """The architecture's float model from its tiny config (seeded), in eval mode."""
    torch.manual_seed(1)
    cls, cfg = spec["cls"], spec["cfg"]()
    fm = (cls.from_config(cfg) if hasattr(cls, "from_config") else cls._from_config(cfg)).eval()
    if spec.get("kaiming"):  # (the default init shrinks a deep random conv net's activations to ~1e-26)
        for m in fm.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight)
    return fm


def _to(inp: dict[str, Any], device: str, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The inputs on ``device``; floating ones (pixels, audio) in ``dtype`` where given."""
    return {k: v.to(device, dtype if dtype is not None and v.is_floating_point() else v.dtype) for k, v in inp.items()}


def run_cuda(name: str, methods: list[str], device: str = "cuda") -> dict[str, Any]:
    """Check 6 for one architecture: ``{method: {"f32": err, "bf16": err, "tokens": bool}}``,
    or ``{"FAIL": ...}`` for a method that raised."""
    spec = ARCHS[name]
    fm = _float_model(spec)
    inp = spec["inp"]()
    result: dict[str, Any] = {"arch": name}
    for mb in methods:
        method, _, bps = mb.partition("@")
        try:
            m = copy.deepcopy(fm)
            hnn.quantize(m, bps=float(bps or 4), method=method, skip=(), embeddings=True)
            host = _outs(spec, m, inp)
            r: dict[str, Any] = {}
            if spec.get("gen"):
                kw = spec["genkw"]() if "genkw" in spec else dict(input_ids=ids)
                with torch.no_grad():
                    want = m.generate(**kw, max_new_tokens=5, do_sample=False)[0].tolist()
            m.to(device)
            r["f32"] = _rel([o.float().cpu() for o in _outs(spec, m, _to(inp, device))], host)
            if spec.get("gen"):
                with torch.no_grad():
                    r["tokens"] = m.generate(**_to(kw, device), max_new_tokens=5, do_sample=False)[0].tolist() == want
            m.to(torch.bfloat16)
            r["bf16"] = _rel([o.float().cpu() for o in _outs(spec, m, _to(inp, device, torch.bfloat16))], host)
            result[mb] = r
        except Exception as e:
            print(f"==== {name} {mb}\n{traceback.format_exc()}", file=sys.stderr)
            result[mb] = {"FAIL": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return result


def run(name: str, inductor: bool = False) -> dict[str, Any]:
    """The four checks of one architecture; a check that raises is recorded as ``{"FAIL": ...}``."""
    spec = ARCHS[name]
    result: dict[str, Any] = {"arch": name}

    def step(key: str, fn: Any) -> None:
        try:
            result[key] = fn()
        except Exception as e:
            print(f"==== {name} {key}\n{traceback.format_exc()}", file=sys.stderr)
            result[key] = {"FAIL": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}

    cls = spec["cls"]
    fm = _float_model(spec)
    inp = spec["inp"]()
    ref = _outs(spec, fm, inp)

    def quantized(**kw: Any) -> torch.nn.Module:
        m = copy.deepcopy(fm)
        hnn.quantize(m, bps=8, method="affine", **kw)
        return m

    def variants() -> dict[str, float]:
        kws = {"default": {}, "embeddings": {"embeddings": True}, "skip=()": {"skip": ()},
               "embeddings, skip=()": {"embeddings": True, "skip": ()}}
        if spec.get("conv"):
            kws["conv=False"] = {"conv": False}
        return {k: round(_rel(_outs(spec, quantized(**kw), inp), ref), 5) for k, kw in kws.items()}

    def gen(m: torch.nn.Module, **extra: Any) -> list[int]:
        kw = spec["genkw"]() if "genkw" in spec else dict(input_ids=ids)
        with torch.no_grad():
            return m.generate(**kw, max_new_tokens=5, do_sample=False, **extra)[0].tolist()

    def on_load() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as d:
            fm.save_pretrained(os.path.join(d, "f"))
            ql = cls.from_pretrained(os.path.join(d, "f"), quantization_config=hhf.HypercodecConfig(bps=8, method="affine")).eval()
            a = _outs(spec, ql, inp)
            ql.save_pretrained(os.path.join(d, "q"))
            back = cls.from_pretrained(os.path.join(d, "q")).eval()
            r = {"vs_float": round(_rel(a, ref), 5), "reload_vs_load": _rel(_outs(spec, back, inp), a),
                 "stored_layers": sum(isinstance(m, hnn.HyperLinear) for m in back.modules())}
            if spec.get("gen"):
                gen(back)  # (runs)
            return r

    def compiled() -> float:
        m = quantized(embeddings=True, skip=())
        e = _outs(spec, m, inp)
        torch._dynamo.reset()
        return _rel(_outs(spec, torch.compile(m, fullgraph=True, backend="aot_eager"), inp), e)

    def grouped() -> dict[str, Any]:
        from torch._inductor import config

        m = quantized(embeddings=True, skip=())
        e = _outs(spec, m, inp)
        made: list[int] = []
        real = hnn._group_stored_linears
        hnn._group_stored_linears = lambda g: made.append(real(g)) or made[-1]
        try:
            outs = {}
            with config.patch(fx_graph_cache=False):
                for on in (True, False):
                    hnn.set_compile_grouping(on)
                    torch._dynamo.reset()
                    outs[on] = _outs(spec, torch.compile(m, fullgraph=True), inp)
        finally:
            hnn._group_stored_linears = real
            hnn.set_compile_grouping(True)
        return {"groups": sum(made), "same": _rel(outs[True], outs[False]) == 0, "vs_eager": _rel(outs[True], e)}

    def generated() -> dict[str, bool]:
        m = quantized()
        tokens = gen(m)
        return {"as_float": tokens == gen(fm), "cache_as_no_cache": tokens == gen(m, use_cache=False)}

    step("quantize", variants)
    step("on_load", on_load)
    step("compiled", compiled)
    if spec.get("gen"):
        step("generate", generated)
    if inductor:
        step("inductor", grouped)
    return result


def _cell(v: Any, fmt: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, dict) and "FAIL" in v:
        return "**FAIL** " + v["FAIL"][:80]
    return fmt(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", help=f"default: all ({', '.join(ARCHS)})")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # (a child process: one architecture, JSON out)
    ap.add_argument("--out")
    ap.add_argument("--inductor", action="store_true", help="also compile with inductor, grouping on and off (check 5)")
    ap.add_argument("--cuda", metavar="METHOD@BPS,...", help="only check 6: these methods on a CUDA device against the host")
    a = ap.parse_args()
    methods = a.cuda.split(",") if a.cuda else []
    if a.one:
        r = run_cuda(a.one, methods) if methods else run(a.one, a.inductor)
        print("RESULT " + json.dumps(r, default=str), flush=True)
        return 0
    names = a.archs or list(ARCHS)
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        ap.error(f"unknown architectures {unknown}; known: {', '.join(ARCHS)}")
    if methods:
        if a.inductor:
            ap.error("--cuda runs check 6 alone; run --inductor separately")
        return _sweep_cuda(names, methods, a.out)
    lines = [
        f"torch {torch.__version__}, transformers {T.__version__}, INT8 affine (`bps=8, method=\"affine\"`), "
        f"CPU, tiny random configs. Command: `python py/benches/hf_arch_sweep.py {' '.join(sys.argv[1:])}`.",
        "",
        "| architecture | quantize: max rel. error (variants) | on load: vs float | reload = load | stored layers | compiled = eager | greedy tokens = float |"
        + (" inductor: groups | grouped = ungrouped | grouped vs eager |" if a.inductor else "") + " s |",
        "|---|---|---:|---|---:|---|---|" + ("---:|---|---:|" if a.inductor else "") + "---:|",
    ]
    failed = False
    for n in names:
        t = time.time()
        p = subprocess.run([sys.executable, __file__, "--one", n] + ["--inductor"] * a.inductor, capture_output=True, text=True)
        rows = [json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        last = p.stderr.strip().splitlines()[-1:] or [""]
        r = rows[0] if rows else {"quantize": {"FAIL": f"exit {p.returncode}: {last[0]}"}}
        q, ol, c, g, ind = r.get("quantize"), r.get("on_load"), r.get("compiled"), r.get("generate"), r.get("inductor")
        failed |= any(isinstance(v, dict) and "FAIL" in v for v in (q, ol, c, g, ind))
        def reload(v: dict[str, Any]) -> str:
            return "yes" if v["reload_vs_load"] == 0 else f"no ({v['reload_vs_load']:.2g})"

        def tokens(v: dict[str, bool]) -> str:
            return ("yes" if v["as_float"] else "no") + ("" if v["cache_as_no_cache"] else ", cache differs")

        cells = [
            n,
            _cell(q, lambda v: f"{max(v.values()):.4f}"),
            _cell(ol, lambda v: f"{v['vs_float']:.4f}"),
            _cell(ol, reload),
            _cell(ol, lambda v: str(v["stored_layers"])),
            _cell(c, lambda v: "yes" if v == 0 else f"no ({v:.2g})"),
            _cell(g, tokens),
        ]
        if a.inductor:
            cells += [_cell(ind, lambda v: str(v["groups"])), _cell(ind, lambda v: "yes" if v["same"] else "**no**"),
                      _cell(ind, lambda v: f"{v['vs_eager']:.1e}")]
        cells.append(f"{time.time() - t:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


#: Check 6's largest relative error of the GPU's float32 outputs against the host's.
F32_TOLERANCE = 1e-4


def _sweep_cuda(names: list[str], methods: list[str], out: str | None) -> int:
    if not torch.cuda.is_available():
        print("hf_arch_sweep --cuda: no CUDA device; nothing to check")
        return 0
    lines = [
        f"torch {torch.__version__}, transformers {T.__version__}, {torch.cuda.get_device_name()}, tiny random "
        f"configs; each cell: max rel. error of the GPU against the host in f32 · in bf16 · greedy tokens equal. "
        f"Command: `python py/benches/hf_arch_sweep.py {' '.join(sys.argv[1:])}`.",
        "",
        "| architecture | " + " | ".join(methods) + " | s |",
        "|---|" + "---|" * len(methods) + "---:|",
    ]
    failed = False
    for n in names:
        t = time.time()
        r = run_cuda(n, methods)  # (in this process: no compiler state to keep apart)
        cells = [n]
        for mb in methods:
            v = r.get(mb)
            # A raise, greedy tokens that differ from the host's, or f32 outputs further from the
            # host's than float rounding explains fail the sweep.
            failed |= isinstance(v, dict) and ("FAIL" in v or v.get("tokens") is False or v["f32"] > F32_TOLERANCE)
            cells.append(_cell(v, lambda v: f"{v['f32']:.1e} · {v['bf16']:.1e}"
                               + ("" if "tokens" not in v else " · " + ("yes" if v["tokens"] else "**no**"))))
        cells.append(f"{time.time() - t:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
