"""The evaluation suite on a tiny causal LM and a tiny encoder made here (no files, no hub):
its measurements move the right way with the rate, its bytes are the stored bytes, its page
and tables are written."""

from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the evaluation tests are skipped")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from hypercodec import eval as hev  # noqa: E402


class Tokens:
    """A stand-in tokenizer: the text is already token ids separated by spaces."""

    bos_token_id = 1
    eos_token_id = 2

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        return {"input_ids": torch.tensor([[int(t) for t in text.split()]])}


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def test_causal_lm_rows_follow_the_rate_and_count_stored_bytes(tmp_path):
    model = tiny_llama()
    g = torch.Generator().manual_seed(1)
    text = " ".join(str(int(t)) for t in torch.randint(3, 96, (1400,), generator=g))
    subject = hev.CausalLM(model, Tokens(), text, tokens=640, window=128)
    assert len(subject.windows) == 5 and all(w[0, 0] == 1 for w in subject.windows)
    tensors = []
    rows = hev.evaluate("tiny", subject, ["affine", "trellis-l12", "affine+cal"], [8, 2], tensors, progress=lambda _: None)
    base, int8, tcq8, cal8, int2, tcq2, cal2 = rows
    assert base.method == "original" and math.isfinite(base.quality["ppl"])
    assert not any(r.error for r in rows), [r.error for r in rows]
    # INT8 g128: 8 bits plus an f16 scale and offset per group of 128 values (the whole row
    # when it is shorter), counted per tensor from its stored bytes.
    for t in tensors:
        if t["method"] == int8.label:
            cols = int(t["shape"].split("x")[1])
            assert t["bps"] == pytest.approx(8 + 32 / min(cols, 128)), t
    assert int8.quality["kl"] < 1e-3 and int8.quality["top1"] > 0.97
    assert abs(int8.quality["ppl"] / base.quality["ppl"] - 1) < 0.01
    # Two bits cost more KL than eight, and the trellis beats round-to-nearest at 2 bits.
    assert int2.quality["kl"] > int8.quality["kl"]
    assert tcq2.snr_db > int2.snr_db
    assert 2.0 <= tcq2.bps < 2.3  # an f16 scale per row of 64 or 128 values
    # Calibrated rounding: the same format (the same bytes), a lower output error.
    assert cal2.bps == int2.bps and cal8.bps == int8.bps
    assert cal2.quality["kl"] < int2.quality["kl"]
    assert {t["method"] for t in tensors} == {r.label for r in rows[1:]}
    assert all(t["snr_db"] > 0 for t in tensors)
    meta = {"command": "test", "machine": "test", "torch": "", "transformers": "", "hypercodec": "",
            "threads": 1, "text": "ids", "seconds": 0.0, "plots": hev.plots(rows, str(tmp_path))}
    page = hev.markdown(rows, meta)
    assert "RTN INT2 g128 asym" in page and "trellis L12" in page and "| ppl |" in page
    for png in meta["plots"]:
        assert os.path.getsize(tmp_path / png) > 1000


def test_encoder_rows_measure_embedding_cosine():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(cfg).eval()

    class Batch:
        def __call__(self, texts, **kw):
            ids = torch.tensor([[int(t) for t in s.split()] for s in texts])
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    g = torch.Generator().manual_seed(2)
    texts = [" ".join(str(int(t)) for t in torch.randint(3, 96, (16,), generator=g)) for _ in range(20)]
    subject = hev.Encoder(model, Batch(), texts)
    rows = hev.evaluate("enc", subject, ["affine"], [8, 2], [], progress=lambda _: None)
    assert rows[0].quality["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert rows[1].quality["cosine"] > 0.9999 and rows[1].quality["cosine"] > rows[2].quality["cosine"]
    json.dumps([r.__dict__ for r in rows])
