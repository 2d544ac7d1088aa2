"""The torch layer: HyperLinear against F.linear on its decoded weight, models and archives."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests are skipped")
import hypercodec
import hypercodec.nn as hnn

DOT_REL_TOL = 2e-5


def test_hyperlinear_matches_f_linear_on_its_decoded_weight():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 96)
    for spec in ["int4", "e8@4", "e8-fixed4", "int8-row"]:
        h = hnn.HyperLinear.from_linear(layer, spec)
        x = torch.randn(3, 256)
        y = h(x)
        w = h.weight_dense()
        want = torch.nn.functional.linear(x.double(), w.double(), layer.bias.detach().double())
        scale = x.norm(dim=1)[:, None] * w.norm(dim=1)[None, :] + layer.bias.detach().abs()
        assert torch.all((y.double() - want).abs() <= DOT_REL_TOL * scale.double()), spec
        assert y.dtype == x.dtype
        assert h(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_quantize_swaps_linears_and_keeps_the_model_working():
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    )
    x = torch.randn(4, 128)
    ref = model(x)
    hnn.quantize(model, bps=4, method="lattice")
    assert sum(isinstance(m, hnn.HyperLinear) for m in model.modules()) == 3
    y = model(x)
    snr = 10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum())
    assert snr > 15, snr


def test_skip_and_load_into_from_an_archive(tmp_path):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    path = tmp_path / "m.hwz"
    hypercodec.save(model.state_dict(), path, bits=8)
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    hnn.load_into(fresh, str(path))
    assert isinstance(fresh[0], hnn.HyperLinear) and isinstance(fresh[2], hnn.HyperLinear)
    x = torch.randn(5, 64)
    assert torch.allclose(fresh(x), model(x), atol=0.02, rtol=0.05)
    m2 = torch.nn.Sequential(torch.nn.Linear(8, 8))
    hnn.quantize(m2, skip=("0",))
    assert isinstance(m2[0], torch.nn.Linear)


def test_torch_state_dict_roundtrip_keeps_dtypes(tmp_path):
    sd = {"w": torch.randn(32, 64).to(torch.bfloat16), "b": torch.randn(32)}
    hypercodec.save(sd, tmp_path / "t.hwz", encoding="raw-bf16")
    back = hypercodec.load(tmp_path / "t.hwz", framework="torch")
    assert back["w"].dtype == torch.bfloat16
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])
