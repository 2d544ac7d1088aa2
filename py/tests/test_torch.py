"""The torch layer: HyperLinear against F.linear on its decoded weight, models and archives."""

from __future__ import annotations

import copy
import warnings
import zipfile

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


@pytest.mark.parametrize("spec", ["int8-row", "int4", "e8@4", "e8-fixed4", "tcq@2-l12", "cb-b2-k16"])
def test_tiny_and_huge_weights_keep_their_precision(spec):
    # f16 scales cannot hold a layer of std 1e-9 (they would be zero: all outputs 0) or 1e8
    # (infinite): such a layer is stored with bf16 scales instead, at the same bytes.
    torch.manual_seed(2)
    base = torch.randn(48, 256)
    x = torch.randn(5, 256).double()

    def snr(w):
        layer = torch.nn.Linear(256, 48, bias=False)
        layer.weight.data = w
        h = hnn.HyperLinear.from_linear(layer, spec)
        ref = x @ w.double().T
        err = h(x.float()).double() - ref
        return 10 * torch.log10(ref.pow(2).mean() / err.pow(2).mean()).item(), h, layer

    unit, h_unit, _ = snr(base)
    for factor in [1e-9, 1e8]:
        db, h, layer = snr(base * factor)
        assert db > unit - 1.5, (spec, factor, db, unit)
        # The same bytes within rate control's tolerance (the scales' rounding moves its last
        # try by a few bytes).
        assert abs(h.op.stored_bytes - h_unit.op.stored_bytes) <= 0.005 * h_unit.op.stored_bytes
        # The stored form says so, and loads back to the same outputs.
        back = hnn.HyperLinear.placeholder(layer)
        back.load_state_dict(h.state_dict())
        assert torch.equal(back(x.float()), h(x.float()))


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
    # An archive of another width is refused before any layer changes (the model had become
    # 20 wide in silence), and so is a weight whose bias the archive lacks (it was dropped).
    narrow = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16))
    with pytest.raises(hypercodec.InvalidInputError, match=r"`0.weight` is stored as \[32, 64\]; the model's is \[16, 64\]"):
        hnn.load_into(narrow, str(path))
    assert all(type(m) is not hnn.HyperLinear for m in narrow.modules())
    # The same for a tensor outside the linear layers (a norm of another width: torch's
    # RuntimeError came after the layers were replaced).
    normed = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 32))
    hypercodec.save(normed.state_dict(), tmp_path / "n.hwz", bits=8)
    other = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(64), torch.nn.Linear(128, 32))
    with pytest.raises(hypercodec.InvalidInputError, match=r"`1.weight` is stored as \[128\]; the model's is \[64\]"):
        hnn.load_into(other, str(tmp_path / "n.hwz"))
    assert all(type(m) is not hnn.HyperLinear for m in other.modules())
    # That check reads no compressed layer's bytes (a layer built without them made it fail),
    # and a scalar stored as [1] (archives before 0-d tensors kept their shape) still loads.
    a = hypercodec.Archive(str(tmp_path / "n.hwz"))
    held = torch.nn.Sequential(hnn.HyperLinear(a.linear("0.weight", a.read("0.bias"))), torch.nn.LayerNorm(128),
                               torch.nn.Linear(128, 32))
    hnn.load_into(held, str(tmp_path / "n.hwz"))
    assert isinstance(held[2], hnn.HyperLinear) and torch.equal(held[1].weight, normed[1].weight)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(1.0))

    hypercodec.save({"scale": np.array([2.5], np.float32)}, tmp_path / "s.hwz", verbose=False)
    scaled = hnn.load_into(Scaled(), str(tmp_path / "s.hwz"))
    assert scaled.scale.shape == () and float(scaled.scale) == 2.5
    hypercodec.save({"0.weight": model[0].weight.detach()}, tmp_path / "w.hwz", bits=8)
    with pytest.raises(hypercodec.FormatError, match="not `0.bias`"):
        hnn.load_into(torch.nn.Sequential(torch.nn.Linear(64, 32)), str(tmp_path / "w.hwz"))


def _convnet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.Conv2d(16, 24, 1),
        torch.nn.Flatten(),
        torch.nn.Linear(24 * 8 * 8, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10, bias=False),
    )


def test_quantized_state_dict_carries_the_stored_form_and_loads_on_the_meta_device(tmp_path):
    torch.manual_seed(7)
    model = hnn.quantize(_convnet(), bps=4, method="lattice")
    x = torch.randn(2, 3, 8, 8)
    ref = model(x)
    sd = model.state_dict()
    # Each compressed layer saves one uint8 tensor (its one-tensor .hwz), never a dense weight.
    assert {k for k in sd if k.endswith("weight")} == set()
    hwz = [k for k in sd if k.endswith("weight_hwz")]
    assert len(hwz) == 4 and all(sd[k].dtype == torch.uint8 for k in hwz)
    assert sd["3.weight_hwz"].numel() < 24 * 8 * 8 * 32 * 4 / 6  # < 1/6 of f32 with all side info
    torch.save(sd, tmp_path / "q.pt")
    loaded = torch.load(tmp_path / "q.pt", weights_only=True)
    with torch.device("meta"):
        fresh = _convnet()
    hnn.load_state_dict(fresh, loaded)
    assert isinstance(fresh[3], hnn.HyperLinear) and isinstance(fresh[1], hnn.HyperConv2d)
    assert not any(p.is_meta for p in fresh.parameters())
    assert torch.equal(fresh(x), ref)
    # Saved again, the reloaded layers give the same bytes (copied, not re-encoded).
    again = fresh.state_dict()
    assert all(torch.equal(again[k], sd[k]) for k in hwz)
    # A stored form of the wrong shape or hostile bytes are typed errors.
    with torch.device("meta"):
        other = _convnet()
    bad = dict(loaded)
    bad["3.weight_hwz"] = loaded["5.weight_hwz"]
    with pytest.raises(hypercodec.InvalidInputError, match="stored weight is 10x32"):
        hnn.load_state_dict(other, bad)
    with pytest.raises(hypercodec.FormatError):
        hypercodec.Linear.from_hwz(loaded["3.weight_hwz"][:-9].numpy())
    with pytest.raises(hypercodec.HypercodecError):
        hypercodec.Linear.from_hwz(b"HWZ1" + bytes(100))


def test_layers_read_from_an_archive_save_their_stored_bytes(tmp_path):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    path = tmp_path / "m.hwz"
    hypercodec.save(model.state_dict(), path, encoding="lattice", bps=3)
    fresh = hnn.load_into(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16)), str(path))
    x = torch.randn(4, 64)
    sd = fresh.state_dict()
    with torch.device("meta"):
        back = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16))
    hnn.load_state_dict(back, sd)
    assert torch.equal(back(x), fresh(x))
    assert back[0].op.path == fresh[0].op.path


def test_torch_state_dict_roundtrip_keeps_dtypes(tmp_path):
    sd = {"w": torch.randn(32, 64).to(torch.bfloat16), "b": torch.randn(32)}
    hypercodec.save(sd, tmp_path / "t.hwz", encoding="raw-bf16")
    back = hypercodec.load(tmp_path / "t.hwz", framework="torch")
    assert back["w"].dtype == torch.bfloat16
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])
    # f16 weights up to f16's largest, stored with loss: decoded values past it are rounding,
    # clamped (the cast to f16 made them inf).
    w16 = (torch.randn(64, 64) * 20000).clamp(-65504, 65504).to(torch.float16)
    w16[0, :8] = 65504
    hypercodec.save({"w": w16}, tmp_path / "h.hwz", encoding="lattice", bps=3)
    back = hypercodec.load(tmp_path / "h.hwz", framework="torch")["w"]
    assert back.dtype == torch.float16 and torch.isfinite(back).all()


def test_conv2d_pointwise_runs_on_the_runtime_and_others_decode():
    torch.manual_seed(3)
    for conv in [torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(8, 12, 3, padding=1), torch.nn.Conv2d(8, 8, 3, groups=8)]:
        h = hnn.HyperConv2d.from_conv(conv, "int8-row")
        x = torch.randn(2, conv.in_channels, 9, 7)
        wd = torch.from_numpy(np.asarray(h.op.weight())).reshape(conv.weight.shape)
        want = torch.nn.functional.conv2d(x, wd, conv.bias.detach(), conv.stride, conv.padding, conv.dilation, conv.groups)
        assert torch.allclose(h(x), want, atol=1e-4, rtol=1e-4), h.path
        assert (h.path != "decode-fallback+conv2d") == (conv.kernel_size == (1, 1))
        # A channels_last input gives a channels_last output, as nn.Conv2d's (the 1×1 path
        # returned NCHW).
        xl = x.contiguous(memory_format=torch.channels_last)
        y = h(xl)
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous(), h.path
        assert torch.allclose(y, want, atol=1e-4, rtol=1e-4) and h(x).is_contiguous(), h.path
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
    hnn.quantize(model, bps=8, method="int8-row")
    assert all(isinstance(m, hnn.HyperConv2d) for m in (model[0], model[2]))


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
def test_conv2d_padding_modes_pad_as_nn_conv2d_does(mode):
    """`padding_mode` (reflect in style-transfer and image-to-image nets, circular in periodic
    data) is kept: the input is padded first, as nn.Conv2d does; before, every mode zero-padded
    without a word. Eager, compiled, pickled, through a placeholder loaded from a state dict, and
    the input gradient."""
    import pickle

    torch.manual_seed(26)
    for kw in ({"padding": 1}, {"padding": (2, 1), "stride": 2}, {"padding": "same", "dilation": 2}, {"padding": 1, "groups": 4}):
        conv = torch.nn.Conv2d(8, 12, 3, padding_mode=mode, **kw)
        h = hnn.HyperConv2d.from_conv(conv, "int8-row")
        ref = torch.nn.Conv2d(8, 12, 3, padding_mode=mode, **kw)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(np.asarray(h.op.weight())).reshape(ref.weight.shape))
            ref.bias.copy_(conv.bias)
        x = torch.randn(2, 8, 9, 7, requires_grad=True)
        want = ref(x)
        got = h(x)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-4), (mode, kw)
        (g_want,) = torch.autograd.grad(want.square().sum(), x)
        (g_got,) = torch.autograd.grad(h(x).square().sum(), x)
        assert torch.allclose(g_got, g_want, atol=1e-3, rtol=1e-3), (mode, kw)
        assert torch.allclose(pickle.loads(pickle.dumps(h))(x), got)
        assert h.padding == conv.padding and h.padding_mode == mode  # (as the module it replaces)
        twin = hnn._dense_twin(h, torch.device("cpu"))  # (the dense module distillation trains)
        assert torch.allclose(twin(x), got, atol=1e-4, rtol=1e-4), (mode, kw)
        empty = hnn.HyperConv2d.placeholder(conv)
        empty.load_state_dict(h.state_dict())
        assert torch.allclose(empty(x), got)
        if hasattr(torch.library, "custom_op"):
            torch._dynamo.reset()
            with torch.no_grad():
                assert torch.allclose(torch.compile(h, fullgraph=True, backend="aot_eager")(x), got, atol=1e-5)
        # Set after construction, as on an nn.Conv2d.
        h.padding_mode = ref.padding_mode = "circular" if mode == "reflect" else "reflect"
        assert torch.allclose(h(x), ref(x), atol=1e-4, rtol=1e-4), (mode, kw)
    torch._dynamo.reset()


def test_compressed_layers_follow_autocast_as_nn_linear_and_conv2d_do():
    """Under torch.autocast a float32 input reaches nn.Linear / nn.Conv2d in the autocast dtype;
    the compressed layers take it so too (their output's dtype is the one the model expects, and
    on CUDA the bf16 kernels run instead of the float32 passes)."""
    torch.manual_seed(28)
    lin, conv = torch.nn.Linear(64, 32), torch.nn.Conv2d(4, 8, 3, padding=1)
    hl, hc = hnn.HyperLinear.from_linear(lin, "int8-row"), hnn.HyperConv2d.from_conv(conv, "int8-row")
    for dense, h, x in ((lin, hl, torch.randn(3, 64)), (conv, hc, torch.randn(2, 4, 5, 5))):
        with torch.no_grad():
            dense.weight.copy_(torch.from_numpy(np.asarray(h.op.weight())).reshape(dense.weight.shape))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want, got = dense(x), h(x)
        assert want.dtype == got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())
        assert h(x).dtype == torch.float32  # (outside autocast: the input's dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert h(x.double()).dtype == torch.float64  # (autocast leaves float64 alone)


def test_torch_transformer_modules_run_after_quantize():
    """nn.TransformerEncoder / DecoderLayer / MultiheadAttention read some of their linear
    layers' weights themselves: MultiheadAttention's out_proj (in every call) and the encoder
    layer's linear1/linear2 (its inference fast path). quantize raised AttributeError /
    TypeError in their forward; now out_proj stays float and the encoder layer keeps its own
    forward, which calls the compressed feed-forward layers."""
    torch.manual_seed(29)
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True), num_layers=2
    ).eval()
    dec = torch.nn.TransformerDecoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True).eval()
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x, mem = torch.randn(2, 7, 64), torch.randn(2, 5, 64)
    # (A padding mask under no_grad: the encoder made its input a nested tensor for the layers'
    # fast path, which reached the stored layers: "NestedTensorImpl doesn't support sizes".)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 4:] = True
    # (Each run quantizes a model of its own: the masked one a float copy of the encoder.)
    runs = ((copy.deepcopy(enc), lambda m: m(x, src_key_padding_mask=pad)[~pad]), (enc, lambda m: m(x)),
            (dec, lambda m: m(x, mem)), (mha, lambda m: m(x, x, x)[0]))
    for model, run in runs:
        with torch.no_grad():
            want = run(hnn.dequantize(copy.deepcopy(model)))
        hnn.quantize(model, bps=8, method="affine", skip=())
        with torch.no_grad():
            got = run(model)
        assert got.shape == want.shape and (got - want).abs().max() < 0.05 * want.abs().max(), type(model).__name__
        kinds = {n: type(m) for n, m in model.named_modules()}
        assert all(k is not hnn.HyperLinear for n, k in kinds.items() if n.endswith("out_proj"))
        assert (hnn.HyperLinear in kinds.values()) == (model is not mha)  # (the feed-forward layers are compressed)


def test_layers_under_torchs_older_weight_hooks_are_quantized_from_their_current_weight():
    """torch.nn.utils.weight_norm, spectral_norm and prune rebuild ``weight`` in a forward
    pre-hook (from weight_g and weight_v, say). The stored layer took that hook over and its
    first call raised AttributeError ('HyperLinear' object has no attribute 'weight_g'). Now the
    weight the hook would compute next is quantized (here after weight_g changed without a
    call: the attribute the hook last wrote was stale) and such hooks are dropped; a user's
    own pre-hook stays."""
    from torch.nn.utils import prune

    torch.manual_seed(41)
    wraps = {
        "weight_norm": torch.nn.utils.weight_norm,
        "spectral_norm": torch.nn.utils.spectral_norm,
        "prune": lambda m: prune.l1_unstructured(m, "weight", amount=0.5),
    }
    for name, wrap in wraps.items():
        for layer, x in ((torch.nn.Linear(64, 32), torch.randn(3, 64)), (torch.nn.Conv2d(8, 16, 3), torch.randn(2, 8, 7, 7))):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # (weight_norm is deprecated)
                wrap(layer)
            model = torch.nn.Sequential(layer).eval()
            stale = layer.weight.detach().clone()
            if name == "weight_norm":
                with torch.no_grad():
                    layer.weight_g.mul_(2.0)
            calls = []
            layer.register_forward_pre_hook(lambda m, args: calls.append(1))
            with torch.no_grad():
                want = model(x)
            layer.weight = stale  # (as the hook left it before weight_g changed)
            hnn.quantize(model, bps=8, method="affine-row", conv=True)
            stored = model[0]
            assert isinstance(stored, (hnn.HyperLinear, hnn.HyperConv2d)), name
            calls.clear()
            with torch.no_grad():
                got = model(x)
            assert calls == [1], name  # (the user's hook, once; the rebuilding one is gone)
            err = float((got - want).norm() / want.norm())
            assert err < 0.02, (name, type(layer).__name__, err)


def test_empty_skip_names_skip_nothing_and_unwritable_folders_are_io_errors(tmp_path, monkeypatch):
    """``skip=""`` skipped every layer ("" is in every name); ``save`` into a folder where no
    temporary file can be made raised a bare PermissionError, where the archive's own writes
    raise HypercodecIOError."""
    import tempfile

    torch.manual_seed(43)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    hnn.quantize(model, bps=4, skip="")
    assert isinstance(model[0], hnn.HyperLinear) and isinstance(model[2], hnn.HyperLinear)
    # Quantizing again says that the stored layers keep their form (it changed nothing, silently).
    before = model[0].op.stored_bytes
    with pytest.warns(UserWarning, match="stored already"):
        hnn.quantize(model, bps=2)
    assert model[0].op.stored_bytes == before

    def refuse(*args, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(hypercodec.HypercodecIOError, match="temporary file"):
        hypercodec.save({"w": np.ones((4, 4), np.float32)}, str(tmp_path / "w.hwz"))
    assert not (tmp_path / "w.hwz").exists()


def test_subclasses_with_a_forward_of_their_own_stay_float():
    """A Linear or Conv2d subclass whose forward does more (timm's Conv2dSame pads by the input's
    size, StdConv2d standardizes its weight, a LoRA layer adds its update) was replaced by a
    stored layer that did only the base class's product: a silent change of the model's output.
    Such layers stay float; a subclass that only renames (no forward of its own) is compressed."""

    class SameConv(torch.nn.Conv2d):
        def forward(self, x):
            ih, iw = x.shape[-2:]
            ph, pw = max((-(-ih // 2) - 1) * 2 + 3 - ih, 0), max((-(-iw // 2) - 1) * 2 + 3 - iw, 0)
            return super().forward(torch.nn.functional.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2]))

    class StdConv(torch.nn.Conv2d):
        def _conv_forward(self, x, weight, bias):
            w = (weight - weight.mean((1, 2, 3), keepdim=True)) / (weight.std((1, 2, 3), keepdim=True) + 1e-5)
            return super()._conv_forward(x, w, bias)

    class LoraLinear(torch.nn.Linear):
        def __init__(self, *a):
            super().__init__(*a)
            self.down, self.up = torch.nn.Parameter(torch.randn(4, self.in_features)), torch.nn.Parameter(torch.randn(self.out_features, 4))

        def forward(self, x):
            return super().forward(x) + x @ self.down.T @ self.up.T

    class Renamed(torch.nn.Linear):
        pass

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.same, self.std = SameConv(3, 8, 3, stride=2), StdConv(8, 8, 3, padding=1)
            self.lora, self.plain = LoraLinear(8, 16), Renamed(16, 4)

        def forward(self, x):
            h = self.std(self.same(x)).mean((2, 3))
            return self.plain(torch.relu(self.lora(h)))

    torch.manual_seed(30)
    net = Net().eval()
    x = torch.randn(2, 3, 11, 9)
    with torch.no_grad():
        want = net(x)
    with pytest.warns(UserWarning, match=r"left float.*same \(SameConv\).*std \(StdConv\).*lora \(LoraLinear\)"):
        hnn.quantize(net, bps=8, method="affine", skip=())
    assert [type(getattr(net, n)).__name__ for n in ("same", "std", "lora", "plain")] == ["SameConv", "StdConv", "LoraLinear", "HyperLinear"]
    with torch.no_grad():
        assert (net(x) - want).abs().max() < 0.02 * want.abs().max()


def test_straight_through_training_reaches_the_float_loss():
    # A toy regression: a 2-layer MLP at 4 bits per weight (straight-through estimator, the
    # master weights re-quantized every 5 steps) trains to within 1.1x of f32's held-out loss.
    def train(quantized: bool) -> tuple[float, float, float]:
        torch.manual_seed(0)
        w_true = torch.randn(32, 1) / 4
        x, xt = torch.randn(1024, 32), torch.randn(1024, 32)
        y = torch.tanh(x @ w_true) + 0.1 * torch.randn(1024, 1)
        yt = torch.tanh(xt @ w_true) + 0.1 * torch.randn(1024, 1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        if quantized:
            hnn.quantize(model, bps=4, method="affine", trainable=True, refresh_every=5)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        first = None
        for _ in range(300):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            first = loss.item() if first is None else first
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            return first, loss.item(), torch.nn.functional.mse_loss(model(xt), yt).item()

    (_, _, f32), (q_first, q_last, q4) = train(False), train(True)
    assert q_last < 0.25 * q_first, (q_first, q_last)
    assert q4 <= 1.1 * f32, (q4, f32)


@pytest.mark.skipif(not hasattr(torch, "compiler"), reason="torch.compile support needs torch >= 2.2")
def test_straight_through_training_compiles_without_a_graph_per_step():
    """Under torch.compile the re-quantizing step is left out of the graph: the step counter
    used to be traced, so every step recompiled (until the cache limit sent it back to eager)."""
    torch.manual_seed(3)
    base = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    hnn.quantize(base, bps=4, method="affine", skip=(), trainable=True, refresh_every=3)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    x, y = torch.randn(64, 32), torch.randn(64, 1)
    trained = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model = copy.deepcopy(base).train()
        run = torch.compile(model, backend=backend) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(12):
            opt.zero_grad()
            torch.nn.functional.mse_loss(run(x), y).backward()
            opt.step()
        trained.append(model)
    for a, b in zip(trained[0].parameters(), trained[1].parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert 0 < len(graphs) <= 4, len(graphs)


def test_seed_aliases_map_onto_hypercodec(tmp_path):
    from hypercodec import compat

    assert 22.0 < compat.calibrate_lattice_bps_to_snr(4.0) < 24.1
    assert compat.lattice_alpha(4.0) > compat.lattice_alpha(3.0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    plan = compat.scan_model(model, option=compat.WeightOption.BEST)
    assert len(plan["tensors"]) >= 2
    x = torch.randn(3, 64)
    ref = model(x)
    compat.wrap_model_with_hypertensor(model, plan)
    assert isinstance(model[0], hnn.HyperLinear)
    assert torch.allclose(model(x), ref, atol=0.05, rtol=0.1)
    sd = {"w": torch.randn(64, 128)}
    compat.save_compressed(sd, str(tmp_path / "g.hwz"), compat.HyperGlyphConfig(mode="auto"))
    assert compat.load_compressed(str(tmp_path / "g.hwz"))["w"].shape == (64, 128)


def test_pt_checkpoints_are_read_without_unpickling_code(tmp_path):
    sd = {"fc.weight": torch.randn(32, 64), "fc.bias": torch.randn(32), "step": torch.tensor(3)}
    torch.save({"state_dict": sd}, tmp_path / "m.pt")
    # The integer tensor is left out with the warning save() gives (it went in silence).
    with pytest.warns(UserWarning, match=r"1 non-floating tensors are not stored: step"):
        info = hypercodec.compress_file(tmp_path / "m.pt", tmp_path / "m.hwz", bits=8)
    assert [t["name"] for t in info["tensors"]] == ["fc.weight", "fc.bias"]
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "hypercodec", "compress", str(tmp_path / "m.pt"), str(tmp_path / "n.hwz")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert hypercodec.load(tmp_path / "n.hwz")["fc.bias"].shape == (32,)
    # What fails is one line and a typed error, never a traceback or torch's own exception
    # type: no float tensor, a missing output folder, and files torch cannot read as weights.
    torch.save({"n": torch.arange(4)}, tmp_path / "ints.pt")
    (tmp_path / "junk.bin").write_bytes(b"\x80garbage")
    with zipfile.ZipFile(tmp_path / "z.pt", "w") as z:
        z.writestr("hello.txt", "hi")
    for inp, out, said in (("ints.pt", "o.hwz", "no floating-point tensor"), ("m.pt", "nope/o.hwz", "no folder"),
                           ("junk.bin", "o.hwz", "not read as a state dict"), ("z.pt", "o.hwz", "not read as a state dict")):
        r = subprocess.run([sys.executable, "-m", "hypercodec", "compress", str(tmp_path / inp), str(tmp_path / out)],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "Traceback" not in r.stderr and said in r.stderr, (inp, r.stderr)
    # inspect on a checkpoint says what it is (it said "legacy archive: zip entry
    # `metadata.json` is missing").
    with pytest.raises(hypercodec.FormatError, match="a PyTorch checkpoint"):
        hypercodec.inspect(tmp_path / "m.pt")
    for inp in ("junk.bin", "z.pt"):
        with pytest.raises(hypercodec.FormatError, match="not read as a state dict"):
            hypercodec.compress_file(tmp_path / inp, tmp_path / "o.hwz", verbose=False)
    assert not (tmp_path / "o.hwz").exists()


def test_hyper_attention_is_causal_and_close_to_its_dense_twin():
    torch.manual_seed(4)
    h, heads, kv = 128, 8, 2
    proj = [torch.nn.Linear(h, heads * 16), torch.nn.Linear(h, kv * 16), torch.nn.Linear(h, kv * 16), torch.nn.Linear(heads * 16, h)]
    att = hnn.HyperAttention.from_projections(*proj, num_heads=heads, num_kv_heads=kv, bps=6)
    exact = hnn.HyperAttention.from_projections(*proj, num_heads=heads, num_kv_heads=kv, method="f32")
    x = torch.randn(2, 10, h)
    y, ref = att(x), exact(x)
    snr = 10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum())
    assert snr > 25, snr
    x2 = x.clone()
    x2[:, 7:] = torch.randn(2, 3, h)
    assert torch.allclose(att(x2)[:, :7], y[:, :7], atol=1e-5)
    fresh = hnn.HyperAttention(64, 4, bps=4, method="lattice-fixed")
    assert fresh(torch.randn(1, 5, 64)).shape == (1, 5, 64)
    assert fresh.q_proj.op.path == "e8-fixed4"


def test_input_statistics_share_a_shared_input_and_not_a_changed_one():
    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 8) for _ in range(3))

        def forward(self, x):
            x = x.clone()
            a, b = self.q(x), self.k(x)  # the same tensor: one product
            x.mul_(2.0)  # changed in place: v gets its own
            return a + b + self.v(x)

    torch.manual_seed(15)
    batches = [torch.randn(40, 16) * 3 + 1, torch.randn(24, 16)]
    hs = hnn.collect_hessians(Split(), batches)
    with torch.inference_mode():  # inference tensors keep no version counter
        hi = hnn.collect_hessians(Split(), [b.clone() for b in batches])
    assert all(np.allclose(hi[k], hs[k], rtol=1e-6, atol=1e-6) for k in hs)
    x = torch.cat(batches).double()
    want = (x.T @ x / len(x)).numpy()
    tol = 1e-5 * np.abs(want).max()
    assert np.allclose(hs["q"], want, atol=tol) and np.allclose(hs["k"], want, atol=tol)
    assert np.allclose(hs["v"], 4 * want, atol=4 * tol)
    assert hs["q"] is not hs["k"]


def test_input_statistics_of_wide_layers_over_many_batches_and_fisher_passes():
    """Wide inputs (products from halves), more batches than one float32 partial sum holds,
    and statistics fed by the Fisher passes' forward halves: all equal the float64 moments."""
    torch.manual_seed(16)
    model = torch.nn.Sequential(torch.nn.Linear(1030, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1030))
    batches = [torch.randn(7, 1030) * (1 + i % 3) + 0.5 for i in range(37)]
    hs = hnn.collect_hessians(model, batches)
    x = torch.cat(batches).double()
    want = (x.T @ x / len(x)).numpy()
    assert np.allclose(hs["0"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # The Fisher passes (with gradients) feed the statistics; the rest run without.
    loss = hnn.output_projection_loss(lambda m, b: m(b), seed=2)
    with hnn.InputStatistics(model) as stats:
        fisher = hnn.collect_fisher(model, batches[:5], loss)
        stats.run(batches[5:])
    merged = stats.result()
    assert set(fisher) == {"0.weight", "2.weight"}
    for k in hs:
        assert np.allclose(merged[k], hs[k], rtol=1e-6, atol=1e-6 * np.abs(hs[k]).max()), k
    # Outside the context nothing is added.
    model(batches[0])
    assert all(np.array_equal(stats.result()[k], merged[k]) for k in merged)


def test_calibrated_compression_lowers_the_output_error_at_the_same_bytes(tmp_path):
    # Correlated inputs (a random walk across features): error feedback from their statistics
    # beats plain rounding on the layer's output, through the Python layer and the CLI alike.
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Tanh(), torch.nn.Linear(64, 32))
    x = torch.randn(512, 128).cumsum(dim=1) / 8
    hs = hnn.collect_hessians(model, [x[:256], x[256:]])
    assert set(hs) == {"0", "2"} and hs["0"].shape == (128, 128)
    want = model(x)

    def out_err(m):
        return ((m(x) - want) ** 2).mean().item()

    for spec in ["int3", "e8@3"]:
        plain = hnn.quantize(copy.deepcopy(model), method=spec, skip=())
        fed = hnn.quantize(copy.deepcopy(model), method=spec, skip=(), hessians=hs)
        if spec == "int3":  # the same format: the same bytes
            assert plain[0].op.stored_bytes == fed[0].op.stored_bytes
        assert out_err(fed) < 0.8 * out_err(plain), spec
    # The trellis feeds its error forward between sequences: a row of 1024 inputs is 4
    # sequences (or more) when calibrated.
    wide = torch.nn.Sequential(torch.nn.Linear(1024, 16))
    xw = torch.randn(2048, 1024).cumsum(dim=1) / 32
    hw = hnn.collect_hessians(wide, [xw])
    ref = wide(xw)
    plain = hnn.quantize(copy.deepcopy(wide), method="tcq@2-l10", skip=())
    fed = hnn.quantize(copy.deepcopy(wide), method="tcq@2-l10", skip=(), hessians=hw)
    assert plain[0].op.stored_bytes == fed[0].op.stored_bytes
    e_plain, e_fed = ((plain(xw) - ref) ** 2).mean().item(), ((fed(xw) - ref) ** 2).mean().item()
    assert e_fed < 0.8 * e_plain, (e_fed, e_plain)
    cal = tmp_path / "h.safetensors"
    hnn.save_hessians(str(cal), {"0": hs["0"], "2": hs["2"]})
    a, b = tmp_path / "a.hwz", tmp_path / "b.hwz"
    hypercodec.save(model.state_dict(), a, bits=3)
    hypercodec.save(model.state_dict(), b, bits=3, calibration=str(cal))
    meta = hypercodec.metadata(b)
    assert meta["calibration"]["tensors_calibrated"] == 2, meta
    errs = []
    for path in (a, b):
        m = copy.deepcopy(model)
        hnn.load_into(m, str(path))
        errs.append(out_err(m))
    assert errs[1] < 0.8 * errs[0], errs


def test_quantize_budget_meets_the_rate_and_keeps_biases_exact():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    biases = [m[0].bias.detach().clone(), m[2].bias.detach().clone()]
    weights = m[0].weight.numel() + m[2].weight.numel()
    hnn.quantize_budget(m, 3, skip=())
    assert all(isinstance(m[i], hnn.HyperLinear) for i in (0, 2))
    for layer, b in zip((m[0], m[2]), biases):
        assert torch.equal(torch.from_numpy(layer.op.bias), b)
    assert 8 * (m[0].op.stored_bytes + m[2].op.stored_bytes) / weights <= 3.0 + 1e-6


def test_quantize_budget_warns_of_sensitivity_for_weights_it_does_not_code():
    torch.manual_seed(0)

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    # A key without ".weight", a typo, and a layer skipped by name: each moves nothing.
    weights = {"0": 2.0, "2.wieght": 1.0, "2.weight": 1.0}
    with pytest.warns(UserWarning, match=r"2 weight\(s\).*: 0, 2\.wieght$"):
        hnn.quantize_budget(model(), 4, sensitivity=weights, skip=())
    with pytest.warns(UserWarning, match=r"1 weight\(s\).*: 2\.weight$"):
        hnn.quantize_budget(model(), 4, sensitivity={"0.weight": 1.0, "2.weight": 1.0}, skip=("2",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = hnn.quantize_budget(model(), 4, sensitivity={"0.weight": 3.0, "2.weight": 1.0}, skip=())
    assert isinstance(m[0], hnn.HyperLinear) and isinstance(m[2], hnn.HyperLinear)


def test_quantize_budget_codes_on_the_device_asked_for(monkeypatch):
    from hypercodec import api

    seen = []
    real = api.compress_state_dict

    def spy(sd, path, metadata=None, **options):
        seen.append(options.get("device"))
        return real(sd, path, metadata, **options)

    monkeypatch.setattr(api, "compress_state_dict", spy)
    torch.manual_seed(0)

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    # Weights on the CPU, by default or by name: the CPU codes (no --device).
    for device in (None, "cpu", torch.device("cpu")):
        m = model()
        hnn.quantize_budget(m, 3, skip=(), candidates=("tcq@2-l8", "tcq@4-l8"), device=device)
        assert isinstance(m[0], hnn.HyperLinear)
    assert seen == [None, None, None]
    with pytest.raises(hypercodec.InvalidInputError, match="CUDA device or the CPU"):
        hnn.quantize_budget(model(), 3, skip=(), device="meta")
    for bad in ("gpu", -1):
        with pytest.raises(hypercodec.InvalidInputError, match="device"):
            hnn.quantize_budget(model(), 3, skip=(), device=bad)
    if not torch.cuda.is_available():
        # A GPU asked for by name that is not there is an error, not a silent CPU run.
        for device in ("cuda", "cuda:0", 0):
            with pytest.raises(hypercodec.CudaError, match="no CUDA device"):
                hnn.quantize_budget(model(), 3, skip=(), device=device)
    assert len(seen) == 3


class _Lm(torch.nn.Module):
    """A token table, a layer and an output head: tied (the head is the table) or not."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(300, 64, padding_idx=0)
        self.pos = torch.nn.Embedding(16, 64)
        self.mid = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 300, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[-1]))
        return self.head(torch.tanh(self.mid(x)))


class _Twins(torch.nn.Module):
    """Two linear layers on one weight Parameter (the second with or without a bias of its own)."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 48, bias=False)
        self.b = torch.nn.Linear(64, 48, bias=bias)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + 2 * self.b(torch.tanh(x))


class _Audio(torch.nn.Module):
    """Conv1d layers as audio models use them: strided, depthwise with "same" padding, a
    pointwise one (the runtime's matrix route), dilated with reflect padding."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv1d(16, 32, 5, stride=2, padding=2)
        self.b = torch.nn.Conv1d(32, 32, 3, padding="same", groups=32, bias=False)
        self.c = torch.nn.Conv1d(32, 24, 1)
        self.d = torch.nn.Conv1d(24, 8, 4, dilation=2, padding=3, padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(torch.relu(self.c(self.b(torch.relu(self.a(x))))))


def test_conv1d_layers_are_stored_and_compute_what_conv1d_does(tmp_path):
    """nn.Conv1d stayed float (audio models, Conv1d-heavy, got little from quantize). Each is
    now a HyperConv1d holding its weight in its own shape, computing what a Conv1d of the
    decoded weight does (unbatched inputs, input gradients too), and reloading from its state
    dict."""
    torch.manual_seed(5)
    model = _Audio().eval()
    x = torch.randn(3, 16, 50, requires_grad=True)
    ref = model(x)
    q = hnn.quantize(copy.deepcopy(model), bps=8, method="affine")
    assert all(type(m) is hnn.HyperConv1d for m in q.children())
    assert q.c.path == "affine-int8-fused" and q.a.path == "decode-fallback+conv2d"
    assert q.a.weight.shape == (32, 16, 5) and "weight_shape=(32, 16, 5)" in repr(q.a)
    # nn.Conv1d's geometry, which code around it reads (Whisper checks its input's length by
    # `conv.stride[0]`: the height-1 convolution's (1, 2) made it refuse every input).
    assert (q.a.kernel_size, q.a.stride, q.a.padding, q.a.dilation) == ((5,), (2,), (2,), (1,))
    assert (q.d.padding, q.d.dilation, q.b.padding) == ((3,), (2,), "same")
    y = q(x)
    assert y.shape == ref.shape and float((y - ref).detach().norm() / ref.detach().norm()) < 0.02
    # What nn.Conv1d computes on the decoded weights.
    dense = hnn.dequantize(copy.deepcopy(q))
    assert all(type(m) is torch.nn.Conv1d for m in dense.children())
    want = dense(x)
    assert torch.allclose(y, want, atol=1e-5)
    # Its weight reads as the decoded values (code around a 1-D convolution computes with it).
    assert torch.equal(q.b.weight, dense.b.weight.detach()) and q.b.weight.shape == (32, 1, 3)
    (gy,) = torch.autograd.grad(y.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(gy, gw, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(q(x[1]), want[1], atol=1e-5)  # one unbatched signal
        with pytest.raises(hypercodec.InvalidInputError, match=r"HyperConv1d takes \(N, 16, L\)"):
            q(torch.randn(3, 16, 1, 50))
        # A transposed (N, L, C) signal, as Conformer and Mamba pass one: a contiguous output,
        # as nn.Conv1d's (it came back channels-last at height 1, and `.view` failed).
        seq = torch.randn(2, 50, 16)
        out = q(seq.transpose(1, 2))
        assert out.is_contiguous() and torch.allclose(out, dense(seq.transpose(1, 2)), atol=1e-5)
        out.view(2, -1)
        # torch.fx traces it (its input checks are calls of the graph).
        traced = torch.fx.symbolic_trace(q)
        assert torch.equal(traced(x), q(x))
        torch.save(q.state_dict(), tmp_path / "a.pt")
        with torch.device("meta"):
            fresh = _Audio()
        hnn.load_state_dict(fresh, torch.load(tmp_path / "a.pt", weights_only=True))
        assert all(type(m) is hnn.HyperConv1d for m in fresh.children())
        assert torch.equal(fresh(x), y)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_layers_on_one_weight_share_one_stored_form(tmp_path, bias):
    """Two nn.Linear layers that share a weight Parameter were quantized and saved twice, their
    tie lost; now the second runs on the first's operator and saves nothing of its own (as a
    tied output head does), and a fresh model loads the tie back. One with a bias of its own
    keeps a stored form of its own (the runtime adds a bias inside the product)."""
    torch.manual_seed(3)
    model = _Twins(bias)
    x = torch.randn(5, 64)
    hnn.quantize(model, bps=4, method="affine", skip=())
    assert isinstance(model.a, hnn.HyperLinear) and isinstance(model.b, hnn.HyperLinear)
    assert (model.b.op is model.a.op) == (not bias) and (model.b.tied == "a") == (not bias)
    sd = model.state_dict()
    assert ("b.weight_hwz" in sd) == bias and "a.weight_hwz" in sd
    ref = model(x)
    # The tied layer computes with the shared stored weight.
    w = torch.from_numpy(np.asarray(model.a.op.weight())).reshape(48, 64)
    want = x @ w.T + 2 * (torch.tanh(x) @ w.T + (torch.from_numpy(np.asarray(model.b.op.bias)) if bias else 0))
    assert torch.allclose(ref, want, atol=1e-4), (ref - want).abs().max()
    torch.save(sd, tmp_path / "t.pt")
    with torch.device("meta"):
        fresh = _Twins(bias)
    hnn.load_state_dict(fresh, torch.load(tmp_path / "t.pt", weights_only=True))
    assert torch.equal(fresh(x), ref)
    assert (fresh.b.op is fresh.a.op) == (not bias)
    assert fresh.state_dict().keys() == sd.keys()


@pytest.mark.parametrize("tied", [False, True])
def test_quantized_embeddings_read_the_stored_table_and_survive_a_state_dict(tmp_path, tied):
    torch.manual_seed(11)
    model = _Lm(tied)
    ids = torch.randint(0, 300, (2, 16))
    hnn.quantize(model, bps=4, method="lattice", skip=(), embeddings=True)
    assert isinstance(model.embed, hnn.HyperEmbedding) and isinstance(model.pos, hnn.HyperEmbedding)
    # A lookup is the stored table's row, decoded: quantized, not the float original.
    table = torch.from_numpy(np.asarray(model.embed.op.weight())).reshape(300, 64)
    assert torch.equal(model.embed(ids), table[ids])
    assert model.embed.padding_idx == 0
    if tied:
        # One operator serves the lookup and the logits, and is saved once.
        assert model.embed.op is model.head.op and model.embed.tied == "head"
    sd = model.state_dict()
    assert not any(k.endswith(".weight") and k.split(".")[0] in ("embed", "pos", "head") for k in sd)
    assert ("embed.weight_hwz" in sd) != tied and "head.weight_hwz" in sd and "pos.weight_hwz" in sd
    ref = model(ids)
    torch.save(sd, tmp_path / "lm.pt")
    with torch.device("meta"):
        fresh = _Lm(tied)
    hnn.load_state_dict(fresh, torch.load(tmp_path / "lm.pt", weights_only=True))
    assert not any(p.is_meta for p in fresh.parameters())
    assert torch.equal(fresh(ids), ref)
    # Saved again, the reloaded model gives the same entries; a tied layer's own reads empty.
    assert fresh.state_dict().keys() == sd.keys()
    if tied:
        assert fresh.embed.op is fresh.head.op and fresh.embed.weight_hwz.numel() == 0
    # Bad ids and a table of the wrong shape are typed errors.
    with pytest.raises(hypercodec.HypercodecError):
        fresh.embed(torch.tensor([300]))
    with pytest.raises(hypercodec.HypercodecError):
        fresh.embed(torch.tensor([-1]))
    with pytest.raises(hypercodec.InvalidInputError, match="integers"):
        fresh.embed(torch.tensor([1.0]))
    bad = dict(sd)
    bad["pos.weight_hwz"] = sd["head.weight_hwz"]
    with torch.device("meta"):
        other = _Lm(tied)
    with pytest.raises(hypercodec.InvalidInputError, match="stored table is 300x64"):
        hnn.load_state_dict(other, bad)


@pytest.mark.parametrize("spec", ["int4", "e8@4", "e8-fixed4", "tcq@2-l12", "cb-b2-k16"])
def test_gradients_reach_the_inputs_of_compressed_layers(spec):
    """Adapters, prompts or norms trained around frozen compressed layers need the gradient
    w.r.t. a compressed layer's input (it was silently cut: the runtime reads a copy)."""
    torch.manual_seed(13)
    lin = torch.nn.Linear(64, 48)
    h = hnn.HyperLinear.from_linear(lin, spec)
    dense = torch.nn.Linear(64, 48)
    with torch.no_grad():
        dense.weight.copy_(h.weight_dense().reshape(48, 64))
        dense.bias.copy_(lin.bias)
    x = torch.randn(3, 5, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    (h(x) ** 2).sum().backward()
    (dense(x2) ** 2).sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    # bf16 activations get a bf16 gradient; the stored form has nothing to train.
    xb = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
    h(xb).sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and xb.grad.abs().sum() > 0
    assert not list(h.parameters())
    # 1x1 and 3x3 convolutions, the 1x1 on its matrix form.
    for k in (1, 3):
        conv = torch.nn.Conv2d(8, 6, k, padding=k // 2)
        hc = hnn.HyperConv2d.from_conv(conv, spec)
        ref = torch.nn.Conv2d(8, 6, k, padding=k // 2)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(np.asarray(hc.op.weight())).reshape(ref.weight.shape))
            ref.bias.copy_(conv.bias)
        img = torch.randn(2, 8, 5, 5, requires_grad=True)
        img2 = img.detach().clone().requires_grad_(True)
        (hc(img) ** 2).sum().backward()
        (ref(img2) ** 2).sum().backward()
        assert torch.allclose(img.grad, img2.grad, rtol=1e-4, atol=1e-4), k


def test_an_adapter_trains_in_front_of_a_frozen_compressed_layer():
    torch.manual_seed(14)
    teacher = torch.nn.Linear(32, 32)
    frozen = hnn.HyperLinear.from_linear(torch.nn.Linear(32, 16), "int4")
    adapter = torch.nn.Linear(32, 32)
    target = hnn.HyperLinear.from_linear(torch.nn.Linear(32, 16), "int4")
    opt = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    data = torch.randn(64, 32)
    with torch.no_grad():
        goal = target(teacher(data))
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = ((frozen(adapter(data)) - goal) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("tied", [False, True])
def test_compressed_models_deep_copy_and_pickle_whole(tmp_path, tied):
    """`copy.deepcopy` (eval loops, EMA copies, HF utilities) and `torch.save(model)` of a
    whole compressed model: the operators could not be pickled, so both raised."""
    import io
    import pickle

    torch.manual_seed(12)
    model = _Lm(tied)
    model.conv = torch.nn.Conv2d(4, 8, 3)
    ids = torch.randint(0, 300, (2, 16))
    hnn.quantize(model, bps=4, method="affine", skip=(), embeddings=True)
    assert isinstance(model.conv, hnn.HyperConv2d)
    ref = model(ids)
    img = torch.randn(1, 4, 9, 9)
    ref_conv = model.conv(img)
    twin = copy.deepcopy(model)
    assert torch.equal(twin(ids), ref) and torch.equal(twin.conv(img), ref_conv)
    # The immutable operators are shared, ties stay ties.
    assert twin.head.op is model.head.op and twin.mid is not model.mid
    if tied:
        assert twin.embed.op is twin.head.op
    # Whole-model pickling carries the stored bytes and rebuilds the operators.
    buf = io.BytesIO()
    torch.save(model, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert torch.equal(back(ids), ref) and torch.equal(back.conv(img), ref_conv)
    assert back.state_dict().keys() == model.state_dict().keys()
    # Saved again as loaded (a checkpoint's round trip), and copied after loading.
    again = pickle.loads(pickle.dumps(back))
    assert torch.equal(again(ids), ref) and torch.equal(copy.deepcopy(again)(ids), ref)
    # A shallow copy shares the operator; a compiled layer's copy runs its own operator.
    assert copy.copy(model.mid).op is model.mid.op
    # A decoded weight kept on a device (the conv decode fallback's) is never copied or pickled.
    model.conv.__dict__["_dense_on_device"] = {("cuda", torch.float32, 0): torch.ones(3)}
    for back in (copy.deepcopy(model.conv), pickle.loads(pickle.dumps(model.conv)), copy.copy(model.conv)):
        assert "_dense_on_device" not in back.__dict__ and torch.equal(back(img), ref_conv)
    assert "_dense_on_device" not in model.conv._replicate_for_data_parallel().__dict__  # (its parameters come later)
    del model.conv.__dict__["_dense_on_device"]
    mid = copy.deepcopy(model.mid)
    mid.compile()
    assert "_compiled_call_impl" in mid.__dict__
    assert "_compiled_call_impl" not in copy.deepcopy(mid).__dict__
    assert "_compiled_call_impl" not in pickle.loads(pickle.dumps(mid)).__dict__
    # So does a model whose layers were loaded from a state dict (no bytes kept natively).
    torch.save(model.state_dict(), tmp_path / "lm.pt")
    with torch.device("meta"):
        fresh = _Lm(tied)
        fresh.conv = torch.nn.Conv2d(4, 8, 3)
    hnn.load_state_dict(fresh, torch.load(tmp_path / "lm.pt", weights_only=True))
    again = pickle.loads(pickle.dumps(fresh))
    assert torch.equal(again(ids), ref) and torch.equal(copy.deepcopy(fresh)(ids), ref)
    # A layer converted to fixed-rate symbols at load (`hf.from_hwz(fixed_bits=…)` records it)
    # is converted again when unpickled.
    ent = hnn.HyperLinear.from_linear(torch.nn.Linear(256, 64), "e8@4")
    fixed = hnn.HyperLinear(hypercodec.Linear.from_hwz(ent.op.to_hwz(), fixed_bits=5), source=ent.op.to_hwz)
    fixed._fixed_bits = 5
    back = pickle.loads(pickle.dumps(fixed))
    assert back.op.path == fixed.op.path == "e8-fixed5"
    x = torch.randn(3, 256)
    assert torch.equal(back(x), fixed(x))


class _ConvNet(torch.nn.Module):
    """Convolutions (a padded 3×3, a strided depthwise 3×3, a 1×1), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(4, 16, 3, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, stride=2, groups=16)
        self.pw = torch.nn.Conv2d(16, 8, 1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.pw(torch.relu(self.dw(torch.relu(self.c1(x))))))
        return self.fc(x.flatten(1))


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.compile support needs torch >= 2.4")
def test_compressed_models_compile_whole_and_train_through_the_compiled_graph():
    """`torch.compile(model, fullgraph=True)`: every stored layer is one traced operator (the
    runtime's calls broke the graph at every layer before, and fullgraph raised), with the
    eager outputs and input gradients."""
    import gc
    import pickle
    import weakref

    torch.manual_seed(15)
    lm = _Lm(tied=True)
    hnn.quantize(lm, bps=4, method="lattice", skip=(), embeddings=True)
    net = _ConvNet()
    hnn.quantize(net, bps=8, method="affine", skip=())
    assert isinstance(net.dw, hnn.HyperConv2d) and net.pw.pointwise and not net.c1.pointwise
    ids = torch.randint(0, 300, (2, 16))
    img = torch.randn(2, 4, 9, 9, requires_grad=True)
    for model, x in ((lm, ids), (net, img)):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        ref = model(x)
        got = compiled(x)
        assert got.dtype == ref.dtype and torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
        if x.is_floating_point():
            (gx,) = torch.autograd.grad((ref**2).sum(), x)
            (gc_,) = torch.autograd.grad((got**2).sum(), x)
            assert gx.abs().sum() > 0 and torch.allclose(gc_, gx, rtol=1e-4, atol=1e-5)
    # A compiled bf16 layer keeps bf16, and a copy runs its own operator under its own key (a
    # buffer that never enters the state dict).
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4")
    twin = copy.deepcopy(h)
    keys = {hnn._key_of(m) for m in (h, twin, copy.copy(h), pickle.loads(pickle.dumps(h)))}
    assert len(keys) == 4 and None not in keys
    # nn.DataParallel's replica keeps its original's number: replicate sets its key on the
    # replica's device, where that number has one slot (not a new one at every step).
    replica = h._replicate_for_data_parallel()
    replica._op_key = h._op_key.clone()  # (what replicate does, on the host)
    assert replica._op_number == h._op_number and hnn._key_of(replica) == hnn._key_of(h)
    arena = hnn._ARENAS[torch.device("cpu")][1]
    for _ in range(5):
        step = h._replicate_for_data_parallel()
        step._op_key = h._op_key.clone()
    assert hnn._ARENAS[torch.device("cpu")][1] == arena  # (no slot per step)
    assert "_op_key" not in h.state_dict() and "_op_key" in dict(h.named_buffers())
    xb = torch.randn(5, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    out = torch.compile(twin, fullgraph=True, backend="aot_eager")(xb)
    assert out.dtype == torch.bfloat16 and torch.equal(out, h(xb))
    # The compiled backward reads the layer when it runs: new weights loaded after compiling
    # give the new input gradient (a traced product would keep the old weight as a constant).
    xg = torch.randn(4, 64, requires_grad=True)
    torch._dynamo.reset()
    c = torch.compile(twin, fullgraph=True, backend="aot_eager")
    c(xg).sum().backward()
    twin.load_state_dict(hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4").state_dict())
    (g_compiled,) = torch.autograd.grad(c(xg).sum(), xg)
    (g_eager,) = torch.autograd.grad(twin(xg).sum(), xg)
    assert torch.allclose(g_compiled, g_eager, rtol=1e-5, atol=1e-6)
    # The fake forms agree with the real outputs in shape, dtype and strides (a 1×1 convolution
    # of a channels_last image returns a contiguous one), for both operators.
    img_cl = torch.randn(2, 16, 5, 5).to(memory_format=torch.channels_last).requires_grad_(True)
    for layer, x in ((net.pw, img_cl), (net.dw, img_cl), (h, torch.randn(3, 7, 64, requires_grad=True))):
        torch.library.opcheck(torch.ops.hypercodec.stored_forward.default, (x, layer._op_key, layer._op_meta()))
        gy = layer(x).detach()
        torch.library.opcheck(torch.ops.hypercodec.stored_input_grad.default, (gy, layer._op_key, list(x.shape)))
    # One unbatched image, as nn.Conv2d takes it.
    one = img_cl.detach()
    assert torch.allclose(net.pw(one[0]), net.pw(one[:1])[0]) and torch.allclose(net.dw(one[0]), net.dw(one[:1])[0])
    calls = []
    hook = net.dw.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    net.dw(one[0])
    hook.remove()
    assert len(calls) == 1  # (the batch of one went round the module's hooks a second time)
    # A bias set to train gets its gradient through the compiled graph, as in eager mode.
    net.dw.bias.requires_grad_(True)
    torch._dynamo.reset()
    (gb_compiled,) = torch.autograd.grad(torch.compile(net.dw, fullgraph=True, backend="aot_eager")(one).sum(), net.dw.bias)
    (gb_eager,) = torch.autograd.grad(net.dw(one).sum(), net.dw.bias)
    assert gb_eager.abs().sum() > 0 and torch.allclose(gb_compiled, gb_eager)
    net.dw.bias.requires_grad_(False)
    # A copy of a key (opcheck clones its inputs; so may a tracer) names its layer by number.
    xk = torch.randn(2, 64)
    assert torch.equal(torch.ops.hypercodec.stored_forward(xk, twin._op_key.clone(), twin._op_meta()), twin(xk))
    # A key with the geometry of another layer (the fake output was shaped by it) is refused.
    with pytest.raises(hypercodec.InvalidInputError, match="names a layer of"):
        torch.ops.hypercodec.stored_forward(xk, twin._op_key, [0, 33])
    # A key that no layer holds (a graph from elsewhere) names no layer here.
    with pytest.raises(hypercodec.InvalidInputError, match="no hypercodec layer"):
        torch.ops.hypercodec.stored_forward(torch.randn(2, 64), torch.zeros(1, dtype=torch.int64), [0, 32])
    # A freed layer leaves no entry behind.
    key, ref = hnn._key_of(twin), weakref.ref(twin)
    assert key in hnn._BY_ADDRESS
    del twin, c
    torch._dynamo.reset()
    gc.collect()
    assert ref() is None and key not in hnn._BY_ADDRESS


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.compile support needs torch >= 2.4")
def test_layer_keys_survive_conversions_loaders_and_new_weights():
    """The key that names a layer to its compiled operator stays an int64 holding the layer's
    number whatever is done to the layer's buffers, no two keys ever share an address, and new
    weights give a new key (a CUDA graph recorded for the old weights is recorded again)."""
    torch.manual_seed(24)
    h = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4")
    x = torch.randn(3, 64)

    def compiled_equals_eager(layer):
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
        return torch.equal(got, layer(x)) and int(layer._op_key) == layer._op_number

    with torch.inference_mode():  # a first arena made here stays a normal tensor
        hnn._ARENAS.pop(torch.device("cpu"), None)
        made = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4")
    assert not made._op_key.is_inference() and compiled_equals_eager(made)
    assert not hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4")._op_key.is_inference()
    h.type(torch.float16)  # (Module.type converts every buffer)
    assert h._op_key.dtype == torch.int64 and compiled_equals_eager(h.float())
    h.to_empty(device="cpu")  # (empty buffers: the operator is not a buffer and stays)
    assert compiled_equals_eager(h)
    h._op_key = torch.empty(1)  # a loader's placeholder (transformers fills non-persistent buffers so)
    assert compiled_equals_eager(h)
    seen = set()
    for _ in range(40):  # freed layers' key addresses are never given out again
        seen.add(hnn._key_of(hnn.HyperLinear.from_linear(torch.nn.Linear(8, 8), "int8")))
    assert len(seen) == 40
    before = hnn._key_of(h)
    h.load_state_dict(hnn.HyperLinear.from_linear(torch.nn.Linear(64, 32), "int4").state_dict())
    assert hnn._key_of(h) != before and compiled_equals_eager(h)
    # An embedding of any dtype names it to the fake form.
    e = hnn.HyperEmbedding.from_embedding(torch.nn.Embedding(50, 16), "int8")
    e.dtype = torch.float64
    ids = torch.randint(0, 50, (2, 5))
    torch._dynamo.reset()
    got = torch.compile(e, fullgraph=True, backend="aot_eager")(ids)
    assert got.dtype == torch.float64 and torch.equal(got, e(ids))
    torch._dynamo.reset()


class _Block(torch.nn.Module):
    """A residual block of a decoder (norm, two linears) or of a CNN (3×3 conv, 1×1 conv)."""

    def __init__(self, conv: bool) -> None:
        super().__init__()
        self.conv = conv
        if conv:
            self.a, self.b = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(16, 8, 1)
        else:
            self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.conv else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x + self.b(torch.relu(self.a(h)))


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="torch.compile support needs torch >= 2.4")
@pytest.mark.parametrize("conv", [False, True])
def test_repeated_blocks_compiled_one_by_one_share_one_graph(conv):
    """Regional compilation (`block.compile()` on each of a model's repeated blocks, as PyTorch
    recommends for compile time): blocks of one shape share one compiled graph, as they do with
    nn.Linear. Each stored layer's operator takes its key as an input, like a weight; a handle
    kept constant in the graph compiled a graph per block, and past dynamo's recompile limit
    (8) left the other blocks uncompiled without a word."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(21)
    blocks = torch.nn.Sequential(*(_Block(conv) for _ in range(12)))
    hnn.quantize(blocks, bps=4, method="affine", skip=())
    assert all(isinstance(m, (hnn.HyperConv2d if conv else hnn.HyperLinear)) for b in blocks for m in (b.a, b.b))
    x = torch.randn(2, 8, 6, 6) if conv else torch.randn(3, 5, 64)
    with torch.no_grad():
        ref = blocks(x)
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    for b in blocks:
        b.compile(backend=counter, fullgraph=True)
    with torch.no_grad():
        got = blocks(x)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs for 12 blocks of one shape"
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    # Each block still runs its own weights through the shared graph.
    y = x.clone()
    with torch.no_grad():
        for b in blocks:
            y = b(y)
    assert torch.equal(y, got) and not torch.allclose(blocks[0](x), blocks[1](x))
    torch._dynamo.reset()


def test_an_embedding_with_max_norm_renormalizes_its_rows_as_nn_embedding_does():
    """nn.Embedding(max_norm=...) scales each looked-up row whose norm passes max_norm down to it
    (in place, in its table); the stored table gives each lookup what that table would. Before,
    max_norm was dropped without a word."""
    torch.manual_seed(27)
    for norm_type in (2.0, 1.0):
        emb = torch.nn.Embedding(40, 16, max_norm=1.5, norm_type=norm_type)
        with torch.no_grad():
            emb.weight.mul_(torch.linspace(0.05, 1.0, 40)[:, None])  # rows on both sides of max_norm
        model = torch.nn.Sequential(emb)
        hnn.quantize(model, bps=8, method="int8-row", skip=(), embeddings=True)
        h = model[0]
        assert isinstance(h, hnn.HyperEmbedding) and h.max_norm == 1.5
        ref = torch.nn.Embedding(40, 16, max_norm=1.5, norm_type=norm_type)
        with torch.no_grad():
            ref.weight.copy_(torch.from_numpy(np.asarray(h.op.weight())).reshape(40, 16))
        ids = torch.tensor([[0, 39, 20, 39], [5, 5, 33, 1]])
        got, want = h(ids), ref(ids)
        norms = torch.linalg.vector_norm(want, ord=norm_type, dim=-1)
        assert norms.max() <= 1.5 + 1e-5 and (norms < 1.4).any()  # (both kinds of row looked up)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), norm_type
        empty = hnn.HyperEmbedding.placeholder(emb)
        empty.load_state_dict(h.state_dict())
        assert empty.max_norm == 1.5 and torch.equal(empty(ids), got)


def test_an_embedding_tied_to_a_skipped_head_stays_float():
    model = _Lm(tied=True)
    hnn.quantize(model, bps=4, skip=("head",), embeddings=True)
    assert isinstance(model.embed, torch.nn.Embedding) and model.embed.weight is model.head.weight
    assert isinstance(model.pos, hnn.HyperEmbedding) and isinstance(model.mid, hnn.HyperLinear)


def test_embedding_ties_follow_the_weights_and_scaled_or_trained_tables_stay_float(tmp_path):
    class Shared(torch.nn.Module):
        """T5's layout: two tables on one weight, an untied head."""

        def __init__(self) -> None:
            super().__init__()
            self.enc = torch.nn.Embedding(200, 32)
            self.dec = torch.nn.Embedding(200, 32)
            self.dec.weight = self.enc.weight
            self.head = torch.nn.Linear(32, 200)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(ids) + self.dec(ids.flip(-1)))

    torch.manual_seed(12)
    model = hnn.quantize(Shared(), bps=4, skip=(), embeddings=True)
    assert model.dec.op is model.enc.op and model.dec.tied == "enc" and model.enc.tied is None
    sd = model.state_dict()
    assert "enc.weight_hwz" in sd and "dec.weight_hwz" not in sd
    with torch.device("meta"):
        fresh = Shared()
    hnn.load_state_dict(fresh, sd)
    ids = torch.randint(0, 200, (3, 5))
    assert fresh.dec.op is fresh.enc.op and torch.equal(fresh(ids), model(ids))

    class Scaled(torch.nn.Embedding):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return super().forward(ids) * 8.0

    m = torch.nn.Sequential(Scaled(50, 16), torch.nn.Linear(16, 4))
    hnn.quantize(m, skip=(), embeddings=True)
    assert type(m[0]) is Scaled and isinstance(m[1], hnn.HyperLinear)
    # A trained head keeps a float master weight: its tied table stays float.
    lm = hnn.quantize(_Lm(tied=True), skip=(), embeddings=True, trainable=True)
    assert type(lm.embed) is torch.nn.Embedding and isinstance(lm.head, hnn.HyperLinear)
    assert isinstance(lm.pos, hnn.HyperEmbedding)


def test_a_bf16_table_returns_bf16_beside_a_dense_bf16_head():
    torch.manual_seed(13)
    model = _Lm(tied=False).to(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 16))
    hnn.quantize(model, bps=4, skip=("head", "mid"), embeddings=True)
    assert isinstance(model.embed, hnn.HyperEmbedding) and isinstance(model.head, torch.nn.Linear)
    out = model(ids)  # the dense bf16 layers would refuse float32 inputs
    assert out.dtype == torch.bfloat16 and model.embed(ids).dtype == torch.bfloat16
    sd = model.state_dict()
    with torch.device("meta"):
        fresh = _Lm(tied=False).to(torch.bfloat16)
    hnn.load_state_dict(fresh, sd)
    assert fresh.embed.dtype == torch.bfloat16 and torch.equal(fresh(ids), out)


def test_distill_tunes_only_the_norms_and_lowers_the_kl_to_the_original():
    torch.manual_seed(5)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 96)
            self.up = torch.nn.Linear(96, 192)
            self.norm = torch.nn.LayerNorm(192)
            self.down = torch.nn.Linear(192, 96, bias=False)
            self.final = torch.nn.LayerNorm(96)
            self.head = torch.nn.Linear(96, 64, bias=False)

        def forward(self, ids):
            h = self.emb(ids)
            h = h + self.down(torch.relu(self.norm(self.up(h))))
            return self.head(self.final(h))

    teacher = Toy().eval()
    model = copy.deepcopy(teacher)
    hnn.quantize(model, bps=2, method="affine-row")
    batches = [torch.randint(0, 64, (4, 16)) for _ in range(24)]
    held = [torch.randint(0, 64, (4, 16)) for _ in range(8)]
    kl = lambda: sum(hnn._logits_kl(model(b), teacher(b)).item() for b in held)  # noqa: E731
    stored = {n: bytes(m.weight_hwz.numpy()) for n, m in model.named_modules() if isinstance(m, hnn.HyperLinear)}
    others = {n: p.detach().clone() for n, p in model.named_parameters() if "norm" not in n and "final" not in n}
    with torch.no_grad():
        before = kl()
    out = hnn.distill(model, teacher, batches, lr=1e-2, epochs=3)
    with torch.no_grad():
        after = kl()
    assert out["steps"] == 72 and out["values"] == 2 * 192 + 2 * 96
    assert after < 0.8 * before, (before, after)
    # The compressed layers are back, with the same stored bytes; nothing else moved.
    assert {n: bytes(m.weight_hwz.numpy()) for n, m in model.named_modules() if isinstance(m, hnn.HyperLinear)} == stored
    assert all(torch.equal(p, others[n]) for n, p in model.named_parameters() if n in others)
    assert not torch.equal(model.norm.weight, teacher.norm.weight)
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(hypercodec.InvalidInputError):
        hnn.distill(torch.nn.Sequential(torch.nn.Linear(4, 4)), teacher, batches)
    # A teacher of another shape, or a loss that diverges: typed errors, the norms untouched.
    tuned = [p.detach().clone() for p in hnn.norm_parameters(model)]
    other = copy.deepcopy(teacher)
    other.head = torch.nn.Linear(96, 32, bias=False)
    with pytest.raises(hypercodec.InvalidInputError, match="teacher's"):
        hnn.distill(model, other, batches)
    calls = []

    def diverging(s, t):
        calls.append(1)
        return (s - t).pow(2).mean() * (1.0 if len(calls) < 3 else float("nan"))

    with pytest.raises(hypercodec.InvalidInputError, match="left as they were"):
        hnn.distill(model, teacher, batches, lr=1e-2, loss=diverging)
    assert all(torch.equal(p, q) for p, q in zip(hnn.norm_parameters(model), tuned))
    assert all(isinstance(getattr(model, n), hnn.HyperLinear) for n in ("up", "down"))


def test_distill_runs_through_convolutions_and_bf16_models():
    torch.manual_seed(6)
    teacher = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 8, 1), torch.nn.Flatten(), torch.nn.Linear(8 * 36, 10),
    ).eval()
    with torch.no_grad():
        teacher[1].running_var.uniform_(0.5, 2.0)
    model = copy.deepcopy(teacher)
    hnn.quantize(model, bps=2, method="affine-row")
    assert isinstance(model[0], hnn.HyperConv2d) and isinstance(model[3], hnn.HyperConv2d)
    batches = [torch.randn(4, 3, 6, 6) for _ in range(16)]
    mse = lambda s, t: (s - t).pow(2).mean()  # noqa: E731
    with torch.no_grad():
        before = sum(mse(model(b), teacher(b)).item() for b in batches)
    out = hnn.distill(model, teacher, batches, lr=1e-2, epochs=3, loss=mse)
    with torch.no_grad():
        after = sum(mse(model(b), teacher(b)).item() for b in batches)
    assert out["values"] == 32 and after < before, (before, after)
    assert isinstance(model[0], hnn.HyperConv2d)
    # A bf16 model: the compressed layers' stand-ins take and give bf16.
    bf = copy.deepcopy(teacher).to(torch.bfloat16)
    hnn.quantize(bf, bps=4, method="affine")
    out = hnn.distill(bf, teacher.to(torch.bfloat16), [b.to(torch.bfloat16) for b in batches], loss=mse)
    assert out["last_loss"] == out["last_loss"]  # finite, not NaN


def test_a_candidate_name_in_the_rate_argument_is_a_clear_type_error():
    m = torch.nn.Sequential(torch.nn.Linear(16, 8))
    with pytest.raises(TypeError, match=r"method='int4'"):
        hnn.quantize(m, "int4")
    with pytest.raises(TypeError, match="bits per value"):
        hnn.method_spec("affine", None)
    for bad in (0, -2, 100, float("nan")):
        with pytest.raises(ValueError, match="at most 16 bits per value"):
            hnn.method_spec("lattice", bad)
    # The model is untouched, and the keyword form works.
    assert isinstance(m[0], torch.nn.Linear)
    hnn.quantize(m, method="int4")
    assert isinstance(m[0], hnn.HyperLinear)
    assert hnn.method_spec("affine", np.float32(3.0)) == "int3"
    # Integer widths round half up (2.5 gave int2 and 3.5 int4), and none rounds to 0 bits.
    assert [hnn.method_spec("affine", b) for b in (2.5, 3.5, 3.4)] == ["int3", "int4", "int3"]
    with pytest.raises(ValueError, match="whole bits"):
        hnn.method_spec("trellis", 0.4)
    assert hnn.method_spec("lattice", 0.4) == "e8@0.4"
    assert hnn.method_spec("trellis-pairs", 2) == "tcq@2-v2"
    assert hnn.method_spec("trellis-pairs-l12", 3) == "tcq@3-l12-v2"
    # A width the method's format does not hold names the method's range (it raised "unknown
    # candidate e8-fixed1" or a native error), as does a block size that is not a number.
    for method, bps, what in [
        ("lattice-fixed", 1, "2 to 8"),
        ("lattice-fixed", 9, "2 to 8"),
        ("affine", 12, "1 to 8"),
        ("affine-row", 16, "1 to 8"),
        ("trellis-pairs", 8, "1 to 4"),
        ("codebook-bx", 4, "block size"),
    ]:
        with pytest.raises(ValueError, match=what):
            hnn.method_spec(method, bps)
    assert hnn.method_spec("lattice-fixed", 8) == "e8-fixed8" and hnn.method_spec("trellis", 8) == "tcq@8"
    # Affine groups of other lengths: the method names them, the spec parser checks them.
    assert hnn.method_spec("affine-g256", 4) == "int4-g256"
    assert hnn.method_spec("affine-g64-sym", 3) == "int3-g64-sym"
    # 8 rows of 256 columns: 1024 bytes of codes, the f32 bias's 32, and an f16 scale a group
    # of 64 (no offsets), or a scale and an offset a group of 256.
    for method, held in (("affine-g64-sym", 1024 + 32 + 8 * 4 * 2), ("affine-g256", 1024 + 32 + 8 * 2 * 2)):
        m = torch.nn.Sequential(torch.nn.Linear(256, 8))
        hnn.quantize(m, 4, method=method)
        assert m[0].op.held_bytes == held, (method, m[0].op)
    for bad in ("affine-g0", "affine-gx", "affine-g64-asym", "affine-g064", "affine-g"):
        with pytest.raises(ValueError, match="whole number of columns"):
            hnn.quantize(torch.nn.Sequential(), 4, method=bad)  # (refused before any layer is read)
    # A model quantized with pairs runs (on the CPU) like its decoded weights.
    m = torch.nn.Sequential(torch.nn.Linear(64, 8))
    x = torch.randn(2, 64)
    bias = m[0].bias.detach().clone()
    hnn.quantize(m, 2, method="trellis-pairs-l12")
    assert m[0].op.path.endswith("-v2"), m[0].op.path
    want = x @ torch.from_numpy(m[0].op.weight()).reshape(8, 64).T + bias
    assert torch.allclose(m(x), want, rtol=1e-4, atol=1e-5)


def test_lattice_gpu_layers_store_warp_shaped_chunks_and_run_on_the_host():
    """``lattice-gpu``: E8 + rANS in chunks of whole rows a CUDA warp decodes; on the host it is
    an entropy-coded layer like any other (the same rate, the same outputs as its decode)."""
    assert hnn.method_spec("lattice-gpu", 3) == "e8@3-gpu"
    m, x = _two_layers_at_4_bits("lattice-gpu", seed=3)
    for layer in (m[0], m[2]):
        assert isinstance(layer, hnn.HyperLinear)
        form = layer.op.device_form()
        assert form["kind"] == "e8rans" and form["prob_bits"] == 12
        assert form["chunk"] % (8 * form["words"]) == 0
        assert layer.op.stored_bytes * 8 <= 4.0 * layer.op.rows * layer.op.cols
    _first_layer_matches_its_decode(m, x)


def _two_layers_at_4_bits(method, seed):
    """A 512 → 256 → 64 MLP quantized with ``method`` at 4 bits, and a batch of 4 inputs."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x = torch.randn(4, 512)
    hnn.quantize(m, bps=4, method=method)
    return m, x


def _first_layer_matches_its_decode(m, x):
    w0 = m[0].weight_dense().reshape(m[0].op.rows, m[0].op.cols)
    b0 = torch.from_numpy(np.asarray(m[0].op.bias, np.float32))
    assert torch.allclose(m[0](x), x @ w0.T + b0, rtol=1e-4, atol=1e-5)


def test_lattice_prefix_layers_store_row_group_chunks_and_run_on_the_host():
    """``lattice-prefix``: E8 in the prefix codes a CUDA warp decodes a word a lane, in chunks of
    groups of eight rows (rows this short make one segment, so a chunk spans 2^14 / (8 · cols)
    groups); on the host an entropy-coded layer like any other (within its rate, the same outputs
    as its decode)."""
    assert hnn.method_spec("lattice-prefix", 3) == "e8@3-prefix"
    m, x = _two_layers_at_4_bits("lattice-prefix", seed=4)
    for layer in (m[0], m[2]):
        form = layer.op.device_form()
        assert form["kind"] == "e8prefix" and (form["limit"], form["pair_limit"]) == (8, 12)
        assert form["segment"] == form["words"] // 4 and form["span"] == 16384 // (8 * layer.op.cols)
        assert len(form["starts"]) == -(-layer.op.rows // (8 * form["span"])) + 1
        assert layer.op.stored_bytes * 8 <= 4.0 * layer.op.rows * layer.op.cols
    _first_layer_matches_its_decode(m, x)


def test_load_state_dict_names_meta_buffers_it_cannot_rebuild():
    """A plain model built on the meta device keeps its non-persistent buffers there (a state
    dict never holds them): loading says so and how to build it, instead of a forward failing
    with "Cannot copy out of meta tensor"; built with its buffers on the CPU, it loads."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 16)
            self.register_buffer("gain", torch.linspace(0.5, 2.0, 16), persistent=False)

        def forward(self, x):
            return self.fc(x) * self.gain

    torch.manual_seed(6)
    m = Scaled()
    hnn.quantize(m, bps=4, method="int4")
    sd = m.state_dict()
    # (`.to("meta")`: after other tests have run, a module built under `torch.device("meta")`
    # may already keep its buffers on the CPU.)
    fresh = Scaled().to("meta")
    assert fresh.gain.is_meta
    with pytest.raises(hypercodec.InvalidInputError, match=r"\['gain'\].*init_empty_weights"):
        hnn.load_state_dict(fresh, sd)
    fresh = Scaled()
    hnn.load_state_dict(fresh, sd)
    x = torch.randn(3, 32)
    assert torch.equal(fresh(x), m(x))


def test_python_m_compress_reads_checkpoints_after_global_options(tmp_path):
    """``python -m hypercodec --threads 1 compress m.pt out.hwz``: the checkpoint is read through
    torch wherever ``compress`` stands; a pickled module is one line of error, no traceback."""
    import subprocess
    import sys

    torch.save({"w": torch.randn(16, 32)}, tmp_path / "m.pt")
    run = lambda *a: subprocess.run([sys.executable, "-m", "hypercodec", *a], capture_output=True, text=True)
    r = run("--threads", "1", "compress", str(tmp_path / "m.pt"), str(tmp_path / "m.hwz"))
    assert r.returncode == 0, r.stderr
    assert hypercodec.inspect(tmp_path / "m.hwz")["tensors"][0]["name"] == "w"
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    r = run("compress", str(tmp_path / "module.pt"), str(tmp_path / "x.hwz"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "not read as a state dict" in r.stderr, r.stderr
    assert not (tmp_path / "x.hwz").exists()


def test_a_checkpoint_is_never_overwritten_and_an_output_never_taken_for_an_input(tmp_path):
    """``compress_file("m.pt", "m.pt")`` and ``python -m hypercodec compress m.pt m.pt`` wrote the
    archive over the checkpoint (the command line saw only the staged copy); ``python -m
    hypercodec compress m.safetensors old.bin`` with an old torch file at ``old.bin`` took the
    output for the input and wrote nothing. A safetensors file named ``.bin`` is compressed as
    what it is."""
    import subprocess
    import sys

    torch.save({"w": torch.randn(16, 32)}, tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    with pytest.raises(hypercodec.InvalidInputError, match="the output is an input"):
        hypercodec.compress_file(tmp_path / "m.pt", tmp_path / "m.pt")
    with pytest.raises(hypercodec.InvalidInputError, match="the output is an input"):
        hypercodec.compress_file(tmp_path / "m.pt", str(tmp_path / "sub" / ".." / "m.pt"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "hypercodec", *a], capture_output=True, text=True, cwd=tmp_path)
    r = run("compress", "m.pt", "./m.pt")
    assert r.returncode == 1 and "the output is an input" in r.stderr, r.stderr
    r = run("--threads", "1", "compress", "--bits", "8", "m.pt", "opt.hwz")  # the input after an option
    assert r.returncode == 0, r.stderr
    assert [t["name"] for t in hypercodec.inspect(tmp_path / "opt.hwz")["tensors"]] == ["w"]
    assert (tmp_path / "m.pt").read_bytes() == before
    hypercodec.save({"w": np.ones((8, 64), np.float32)}, tmp_path / "x.hwz")
    hypercodec.decompress_state_dict  # (the safetensors input below)
    from safetensors.numpy import save_file

    save_file({"v": np.ones((8, 64), np.float32)}, str(tmp_path / "in.safetensors"))
    torch.save({"old": torch.zeros(2)}, tmp_path / "old.bin")
    r = run("compress", "in.safetensors", "old.bin", "--bits", "8")
    assert r.returncode == 0, r.stderr
    assert [t["name"] for t in hypercodec.inspect(tmp_path / "old.bin")["tensors"]] == ["v"]
    save_file({"u": np.ones((8, 64), np.float32)}, str(tmp_path / "st.bin"))
    info = hypercodec.compress_file(tmp_path / "st.bin", tmp_path / "st.hwz", bits=8, verbose=False)
    assert [t["name"] for t in info["tensors"]] == ["u"]


def test_save_names_what_it_cannot_store_and_reads_back_what_it_wrote(tmp_path):
    """Typed errors for a name that is not a string, metadata that is not a mapping, a folder
    that does not exist and a meta tensor (they were AttributeError, FileNotFoundError of a
    temporary file, NotImplementedError); a sparse tensor is stored densely; with ``shard_size``
    the summary is the index just written, not an older file at the output's name; ``in`` on
    a lazy archive reads no tensor."""
    w = np.ones((8, 64), np.float32)
    with pytest.raises(hypercodec.InvalidInputError, match="names are strings"):
        hypercodec.save({1: w}, tmp_path / "a.hwz")
    with pytest.raises(hypercodec.InvalidInputError, match="metadata"):
        hypercodec.save({"w": w}, tmp_path / "a.hwz", metadata=["x"])
    with pytest.raises(hypercodec.InvalidInputError, match="no folder"):
        hypercodec.save({"w": w}, tmp_path / "nowhere" / "a.hwz")
    with pytest.raises(hypercodec.InvalidInputError, match="meta device"):
        hypercodec.save({"w": torch.empty(8, 64, device="meta")}, tmp_path / "a.hwz")
    sparse = torch.eye(64)[:8].to_sparse()
    hypercodec.save({"s": sparse}, tmp_path / "s.hwz", bits=8, verbose=False)
    assert np.allclose(hypercodec.load(tmp_path / "s.hwz")["s"], sparse.to_dense().numpy(), atol=0.01)
    hypercodec.save({"old": w}, tmp_path / "m.hwz", verbose=False)
    info = hypercodec.save({"new": w}, tmp_path / "m.hwz", shard_size="1MB", verbose=False)
    assert [t["name"] for t in info["tensors"]] == ["new"]
    lazy = hypercodec.load(tmp_path / "s.hwz")
    calls = []
    read = lazy.archive
    lazy.archive = type("Counting", (), {"read": lambda self, n: calls.append(n) or read.read(n)})()
    assert "s" in lazy and "t" not in lazy and calls == []


def test_outputs_too_large_for_memory_are_a_memory_error_and_compat_checks_its_arguments():
    """A broadcast input of 2^50 rows asked the runtime for a 4 PiB output and aborted the
    process; the compatibility helpers took NaN and negative rates and unknown modes."""
    from hypercodec import compat

    lin = hypercodec.Linear.quantize(np.ones((16, 64), np.float32), "int8")
    x = np.broadcast_to(np.ones((1, 64), np.float32), (1 << 50, 64))
    with pytest.raises(MemoryError):
        lin.forward(x)
    for bps in (float("nan"), -1.0, 0.0, 0.5, 40.0):
        with pytest.raises(hypercodec.InvalidInputError, match="calibration covers"):
            compat.lattice_alpha(bps)
    with pytest.raises(hypercodec.InvalidInputError, match="mode"):
        compat.HyperGlyphConfig(mode="nonsense")


def test_bad_inputs_are_typed_errors(tmp_path):
    """Integer activations are refused as nn.Linear refuses them (not returned as truncated
    integers); NaN weights and biases are the input's fault (InvalidInputError, with or without
    allow_non_finite, which only raw formats honour); a NaN hessian is named as such."""
    m = torch.nn.Sequential(torch.nn.Linear(32, 16))
    hnn.quantize(m, bps=4, method="int4")
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(2, 32, dtype=torch.int64))
    w = torch.randn(16, 32).numpy()
    w[0, 0] = float("nan")
    for kw in ({}, {"allow_non_finite": True}):
        with pytest.raises(hypercodec.InvalidInputError, match="not finite"):
            hypercodec.save({"w": w}, tmp_path / "w.hwz", encoding="lattice", bps=4, **kw)
        assert not (tmp_path / "w.hwz").exists()
    b = np.zeros(16, np.float32)
    b[0] = np.nan
    with pytest.raises(hypercodec.InvalidInputError, match="bias"):
        hypercodec.Linear.quantize(np.ones((16, 32), np.float32), "int4", b)
    h = np.full((32, 32), np.nan, np.float32)
    with pytest.raises(hypercodec.InvalidInputError, match="hessian"):
        hypercodec.Linear.quantize(np.ones((16, 32), np.float32), "int4", None, h)
    with torch.device("meta"):
        empty = torch.nn.Sequential(torch.nn.Linear(32, 16))
    with pytest.raises(hypercodec.InvalidInputError, match=r"\['0'\].*meta device"):
        hnn.quantize(empty, bps=4, method="int4")


def test_embedding_ids_out_of_range_are_errors_naming_the_id():
    m = torch.nn.Sequential(torch.nn.Embedding(50, 16))
    hnn.quantize(m, bps=4, method="int4", embeddings=True)
    assert isinstance(m[0], hnn.HyperEmbedding)
    assert m(torch.tensor([0, 49])).shape == (2, 16)
    for bad in (50, -1):
        with pytest.raises(hypercodec.InvalidInputError, match=f"id {bad} is out of range for an embedding of 50 rows"):
            m(torch.tensor([3, bad]))


def test_lattice_prefix_layers_too_small_for_their_code_lengths_take_gpu_rans():
    """A 64 → 100 layer at 4 bits: a kilobyte of prefix code lengths is a third of its budget,
    so it takes ``lattice-gpu``'s rANS (the same lattice, a model of about a hundred bytes, the
    warp kernel's form) within the rate, not the INT6 grid."""
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(64, 100))
    x = torch.randn(3, 64)
    hnn.quantize(m, bps=4, method="lattice-prefix")
    form = m[0].op.device_form()
    assert form["kind"] == "e8rans" and form["prob_bits"] == 12
    assert m[0].op.stored_bytes * 8 <= 4.0 * 100 * 64
    _first_layer_matches_its_decode(m, x)


@pytest.mark.parametrize("method", ["int4", "lattice", "bf16"])
def test_a_layer_without_inputs_keeps_its_outputs(method):
    """``nn.Linear(0, 8)``: no weight values, 8 outputs, each its bias (it used to be refused
    with a bias, and to give 0 outputs without one)."""
    for bias in (True, False):
        lin = torch.nn.Linear(0, 8, bias=bias)
        if bias:
            torch.nn.init.normal_(lin.bias)
        m = torch.nn.Sequential(lin)
        x = torch.zeros(3, 0)
        want = m(x)
        hnn.quantize(m, bps=4, method=method)
        assert isinstance(m[0], hnn.HyperLinear) and (m[0].in_features, m[0].out_features) == (0, 8)
        assert torch.equal(m(x), want)
    # Convolutions of 0 channels give what PyTorch's give (an empty output), 1×1 and 3×3.
    for k in (1, 3):
        conv = torch.nn.Conv2d(0, 8, k, padding=k // 2)
        img = torch.zeros(2, 0, 5, 5)
        h = hnn.HyperConv2d.from_conv(conv, method if method != "lattice" else "e8@4")
        assert torch.equal(h(img), conv(img))


def test_w8a8_multiplies_int8_activations_by_the_stored_int8_weight():
    """``quantize_activations``: int8-row, int4-row (no rotation), z1-fixed8, z1-fixed4, e8-fixed4 and
    entropy-coded e8@4 (after their RHT; E8's points doubled) layers quantize each activation row by its
    absolute maximum and multiply in int8; the result is that integer product, scaled, and stays near the
    weight-only output; other forms are left."""
    torch.manual_seed(4)
    base = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40))
    x = torch.randn(7, 256)
    for spec in ("int8-row", "z1-fixed8", "int4-row", "z1-fixed4", "e8-fixed4", "e8@4"):
        m = copy.deepcopy(base)
        hnn.quantize(m, method=spec, skip=())
        weight_only = m(x)
        assert hnn.quantize_activations(m) == 2, spec
        got = m(x)
        # The integer product written out for the first layer.
        layer = m[0]
        q, scales, tile, seed, _, _ = hnn._int8_form(layer.op)
        assert (tile > 0) == (spec[:2] in ("z1", "e8")), spec
        xr = hnn._rht(x, tile, seed) if tile else x
        step = xr.abs().amax(1, keepdim=True) / 127
        xq = torch.round(xr / step).clamp(-127, 127).to(torch.int64)
        acc = xq @ torch.from_numpy(q).to(torch.int64).T
        want = acc.to(torch.float32) * step * torch.from_numpy(scales) + torch.from_numpy(np.asarray(layer.op.bias))
        assert torch.allclose(layer(x), want, rtol=1e-5, atol=1e-5), spec
        err = ((got - weight_only).norm() / weight_only.norm()).item()
        assert 0 < err < 0.03, (spec, err)
        # Off again: the weight-only output.
        assert hnn.quantize_activations(m, None) == 0
        assert torch.equal(m(x), weight_only)
    m = copy.deepcopy(base)
    hnn.quantize(m, method="int4", skip=())
    assert hnn.quantize_activations(m) == 0
    with pytest.raises(hypercodec.InvalidInputError):
        hnn.quantize_activations(m, "fp4")


def test_fp8_activations_multiply_the_exact_e4m3_weight():
    """``quantize_activations(m, "fp8")``: layers whose integer weight fits E4M3 exactly (codes
    of up to 5 bits) round each activation row, scaled to ±448, to E4M3 and sum the products in
    f32; the result is that product written out, near the weight-only output. Up to
    ``FP8_BLOCK_MAX_ROWS`` rows, a layer whose columns are whole runs of 128 scales each run of
    a row on its own (as the block-scaled GEMM on CUDA takes them). E8 points of up to 4 bits,
    doubled, are integers in -16..15: they take it too. 8-bit codes and 5-bit E8 points are
    left as they are (group-scaled forms: the next test)."""
    torch.manual_seed(11)
    base = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 48))
    for spec in ("int4-row", "z1-fixed4", "int3-tensor", "int2-row", "e8-fixed4", "e8-fixed2"):
        m = copy.deepcopy(base)
        hnn.quantize(m, method=spec, skip=())
        layer = m[0]
        q, scales, tile, seed, _, _ = hnn._int8_form(layer.op)
        assert np.abs(q).max() <= 16
        for rows in (5, hnn.FP8_BLOCK_MAX_ROWS + 16):
            x = torch.randn(rows, 256) * 3
            x[1, 7] = 40.0  # an outlier sets its row's (or run's) scale
            assert hnn.quantize_activations(m, None) == 0
            weight_only = m(x)
            assert hnn.quantize_activations(m, "fp8") == 2, spec
            got = m(x)
            xr = hnn._rht(x, tile, seed) if tile else x
            # A step per run of 128 columns at few rows, per row above.
            xb = xr.reshape(rows, 2, 128) if rows <= hnn.FP8_BLOCK_MAX_ROWS else xr.reshape(rows, 1, 256)
            step = xb.abs().amax(2, keepdim=True) / 448
            xq = (xb / step).to(torch.float8_e4m3fn).to(torch.float64)
            assert not torch.equal(xq, (xb / step).to(torch.float64))  # E4M3 rounded them
            xd = (xq * step.to(torch.float64)).reshape(rows, 256)
            acc = xd @ torch.from_numpy(q).to(torch.float64).T
            want = (acc * torch.from_numpy(scales) + torch.from_numpy(np.asarray(layer.op.bias))).float()
            assert torch.allclose(layer(x), want, rtol=1e-4, atol=1e-4 * want.abs().max().item()), (spec, rows)
            err = ((got - weight_only).norm() / weight_only.norm()).item()
            assert 0 < err < 0.08, (spec, rows, err)
        assert hnn.quantize_activations(m, None) == 0
        assert torch.equal(m(x), weight_only)
    for spec in ("int8-row", "z1-fixed8", "int8", "e8-fixed5"):
        m = copy.deepcopy(base)
        hnn.quantize(m, method=spec, skip=())
        assert hnn.quantize_activations(m, "fp8") == 0, spec


def test_fp8_rounded_weights_take_every_form():
    """``quantize_activations(m, "fp8", round_weights=True)``: layers without an exact E4M3
    weight (trellis, entropy-coded E8) multiply their decoded weight rounded to E4M3 with a scale
    per row (max/448), written out here for both activation scalings (per run of 128 at few rows,
    per token above); layers with an exact form keep it; int8 refuses the option."""
    torch.manual_seed(14)
    base = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 48))
    for spec in ("tcq@2-l12", "e8@4"):
        m = copy.deepcopy(base)
        hnn.quantize(m, method=spec, skip=())
        x = torch.randn(hnn.FP8_BLOCK_MAX_ROWS + 16, 256)
        weight_only = m(x)
        if spec.startswith("tcq"):
            assert hnn.quantize_activations(m, "fp8") == 0  # no exact E4M3 weight
        assert hnn.quantize_activations(m, "fp8", round_weights=True) == 2, spec
        layer = m[0]
        assert layer.round_weights and layer.__dict__["_w8a8_form"][6]  # rounded: e8@4's points here pass ±16
        # Rounded as the host rounds them: float32 scales and quotients.
        w = torch.from_numpy(np.asarray(layer.op.weight())).reshape(96, 256)
        s = w.abs().amax(1) / 448
        q = (w / s[:, None]).to(torch.float8_e4m3fn).to(torch.float64)
        w, s = w.to(torch.float64), s.to(torch.float64)
        rel = ((q * s[:, None] - w).norm() / w.norm()).item()
        assert 0 < rel < 0.04, rel  # E4M3's 3 mantissa bits: about 2^-4.5
        for rows in (5, len(x)):
            xs = x[:rows]
            xb = xs.reshape(rows, 2, 128) if rows <= hnn.FP8_BLOCK_MAX_ROWS else xs.reshape(rows, 1, 256)
            step = xb.abs().amax(2, keepdim=True) / 448
            xq = (xb / step).to(torch.float8_e4m3fn).to(torch.float64) * step.to(torch.float64)
            want = (xq.reshape(rows, 256) @ q.T) * s + torch.from_numpy(np.asarray(layer.op.bias))
            got = layer(xs)
            assert torch.allclose(got, want.float(), rtol=1e-4, atol=1e-4 * want.abs().max().item()), (spec, rows)
            y = m(xs)
            err = ((y - weight_only[:rows]).norm() / weight_only[:rows].norm()).item()
            assert 0 < err < 0.08, (spec, rows, err)
        # A later call sets the whole model: FP8 without rounding leaves these layers off.
        n = hnn.quantize_activations(m, "fp8")
        assert layer.activations is None and not layer.round_weights
        if spec.startswith("tcq"):
            assert n == 0 and torch.equal(m(x), weight_only)
        assert hnn.quantize_activations(m, "fp8", round_weights=True) == 2
        assert hnn.quantize_activations(m, None) == 0 and not layer.round_weights
        assert torch.equal(m(x), weight_only)
    m = copy.deepcopy(base)
    hnn.quantize(m, method="e8-fixed4", skip=())
    assert hnn.quantize_activations(m, "fp8", round_weights=True) == 2
    assert not m[0].__dict__["_w8a8_form"][6]  # its exact form, though rounding was allowed
    # A weight loaded later without an exact E4M3 form is rounded, as the call allowed.
    m[0].op = hypercodec.Linear.quantize(np.asarray(m[0].weight_dense().reshape(96, 256)), "tcq@2-l12")
    x = torch.randn(3, 256)
    m(x)
    assert m[0].__dict__["_w8a8_form"][6] and torch.device("cpu") in m[0].__dict__["_w8a8"]
    with pytest.raises(hypercodec.InvalidInputError):
        hnn.quantize_activations(m, "int8", round_weights=True)


def test_fp8_rounded_weights_of_empty_tiny_and_huge_layers():
    """``round_weights`` leaves layers without weights alone and keeps the relative precision of
    rows of any magnitude (a scale per row, no floor): the FP8 product stays within E4M3's
    rounding of the weight-only one for weights scaled by 1e-35 as by 1e30."""
    z = torch.nn.Sequential(torch.nn.Linear(0, 8), torch.nn.Linear(8, 0))
    hnn.quantize(z, method="tcq@2-l12", skip=())
    assert hnn.quantize_activations(z, "fp8", round_weights=True) == 0
    assert z(torch.zeros(3, 0)).shape == (3, 0)
    torch.manual_seed(15)
    for scale in (1e-35, 1e30):
        lin = torch.nn.Linear(256, 32, bias=False)
        with torch.no_grad():
            lin.weight.mul_(scale)
        m = torch.nn.Sequential(hnn.HyperLinear.from_linear(lin, "tcq@2-l12"))
        x = torch.randn(4, 256)
        weight_only = m(x).double()
        assert hnn.quantize_activations(m, "fp8", round_weights=True) == 1
        y = m(x).double()
        rel = ((y - weight_only).abs().max() / weight_only.abs().max()).item()
        assert torch.isfinite(y).all() and 0 < rel < 0.08, (scale, rel)


def test_fp8_activations_of_group_scaled_codes_scale_each_group():
    """Group-scaled codes (``int4``: asymmetric, groups of 128) take FP8 activations with a step
    per token and group of columns, the same groups as the weight's scales, against the codes
    centred (``q − 8``, exact in E4M3) and their offsets moved to match: y is the sum over groups
    of step·scale·(E4M3 activations · centred codes) plus each group's activation sum times its
    offset, written out here, near the weight-only output. int8 W8A8 has neither group scales
    nor offsets: it leaves them."""
    torch.manual_seed(12)
    base = torch.nn.Sequential(torch.nn.Linear(512, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    x = torch.randn(6, 512) * 2 + 0.5
    x[0, 300] = 60.0  # an outlier sets its group's step, not its row's
    m = copy.deepcopy(base)
    hnn.quantize(m, method="int4", skip=())
    weight_only = m(x)
    layer = m[0]
    q, scales, tile, seed, glen, offsets = hnn._int8_form(layer.op)
    assert (tile, glen, scales.shape, offsets.shape) == (0, 128, (64, 4), (64, 4))
    assert (q.min(), q.max()) == (-8, 7)  # centred
    w = torch.from_numpy(np.asarray(layer.op.weight())).to(torch.float64)
    mine = (torch.from_numpy(q).to(torch.float64).reshape(64, 4, 128) * torch.from_numpy(scales)[:, :, None]
            + torch.from_numpy(offsets)[:, :, None]).reshape(64, 512)
    assert torch.allclose(mine, w, atol=1e-6)
    assert hnn.quantize_activations(m, "int8") == 0
    assert hnn.quantize_activations(m, "fp8") == 2  # the 64-column layer: one group, a row's
    got = layer(x)
    # The codes as the host rounds them (float32 steps and quotients), the sums in float64.
    xb = x.reshape(6, 4, 128)
    step = xb.abs().amax(2, keepdim=True) / 448
    xq = (xb / step).to(torch.float8_e4m3fn).to(torch.float64)
    step = step.to(torch.float64)
    parts = torch.einsum("mgk,ngk->mng", xq, torch.from_numpy(q).to(torch.float64).reshape(64, 4, 128))
    want = (parts * step.reshape(6, 1, 4) * torch.from_numpy(scales).to(torch.float64)).sum(2)
    want = want + xb.to(torch.float64).sum(2) @ torch.from_numpy(offsets).to(torch.float64).T
    want = (want + torch.from_numpy(np.asarray(layer.op.bias))).float()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    # The 64-column layer: one group, so a scale and an offset per row, the same sum written out.
    h = torch.relu(got)
    q2, s2, _, _, glen2, o2 = hnn._int8_form(m[2].op)
    assert (glen2, s2.shape, o2.shape) == (64, (32,), (32,))
    hd = h.to(torch.float64)
    step2 = h.abs().amax(1, keepdim=True) / 448
    xq2 = (h / step2).to(torch.float8_e4m3fn).to(torch.float64)
    step2 = step2.to(torch.float64)
    want2 = (xq2 @ torch.from_numpy(q2).to(torch.float64).T) * step2 * torch.from_numpy(s2).to(torch.float64)
    want2 = (want2 + hd.sum(1, keepdim=True) * torch.from_numpy(o2).to(torch.float64)
             + torch.from_numpy(np.asarray(m[2].op.bias))).float()
    got2 = m(x)
    assert torch.allclose(got2, want2, rtol=1e-4, atol=1e-4 * want2.abs().max().item())
    hnn.quantize_activations(m, None)
    plain = layer(x)
    err = ((got - plain).norm() / plain.norm()).item()
    assert 0 < err < 0.05, err  # E4M3's 3 mantissa bits
    assert torch.equal(m(x), weight_only)

def test_w8a8_models_mix_forms_copy_pickle_and_reload():
    """A model mixing int8, trellis, GPU-shaped rANS E8 and int4 layers switches its int8 and
    E8 ones (the E8 points doubled are integers in i8); a switched model deep-copies and pickles after running (its int8 copies are caches,
    rebuilt), and a weight loaded later without an int8 form runs weight-only."""
    import io

    torch.manual_seed(5)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)
    )
    for i, spec in enumerate(["z1-fixed8", "tcq@2-l12", "e8@4-gpu", "int4"]):
        m[i] = hnn.HyperLinear.from_linear(m[i], spec)
    assert hnn.quantize_activations(m) == 2
    x = torch.randn(3, 256)
    y = m(x)
    twin = copy.deepcopy(m)
    assert "_w8a8" not in twin[0].__dict__ and torch.equal(twin(x), y)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert torch.equal(back(x), y)
    # A weight without an int8 form replaces the first layer's: the layer runs weight-only.
    m[0].op = hypercodec.Linear.quantize(np.asarray(m[0].weight_dense().reshape(64, 256)), "int4")
    assert torch.allclose(m[0](x), torch.from_numpy(m[0].op.forward(x.numpy())))


def test_stored_linears_of_one_input_are_grouped_under_inductor(grouped_graphs, projections):
    """inductor's post-grad pass (installed the first time a graph with stored layers is traced)
    turns the `stored_forward` calls of linear layers that read one node into one
    `stored_forward_group` call (one launch at batch 1 on CUDA; here, on the host, the layers one
    by one): 2 groups in this block, and outputs equal to the ungrouped compile's bit for bit."""
    torch.manual_seed(35)
    blk = projections(64)
    hnn.quantize(blk, bps=4, method="affine", skip=())
    got = {}
    for grouping in (True, False):
        hnn.set_compile_grouping(grouping)
        torch._dynamo.reset()
        c = torch.compile(blk, fullgraph=True)
        with torch.no_grad():
            got[grouping] = [c(torch.randn(m, 1, 64, generator=torch.Generator().manual_seed(m))) for m in (1, 1, 3)]
    assert grouped_graphs and all(n == 2 for n in grouped_graphs), grouped_graphs  # (the pass runs only with grouping on)
    for a, b in zip(got[True], got[False]):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.allclose(got[True][2], blk(torch.randn(3, 1, 64, generator=torch.Generator().manual_seed(3))), atol=1e-5)


def test_the_group_operator_checks_its_layers():
    """`hypercodec::stored_forward_group(x, keys, outs)` gives each layer's output, and refuses a
    key whose layer has another width, or a count of widths that is not the keys'."""
    torch.manual_seed(36)
    a, b = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 48), "int4"), hnn.HyperLinear.from_linear(torch.nn.Linear(64, 16), "int4")
    x = torch.randn(2, 64)
    ya, yb = torch.ops.hypercodec.stored_forward_group(x, [a._op_key, b._op_key], [48, 16])
    with torch.no_grad():
        assert torch.equal(ya, a(x)) and torch.equal(yb, b(x))
    with pytest.raises(hypercodec.InvalidInputError):
        torch.ops.hypercodec.stored_forward_group(x, [a._op_key, b._op_key], [48, 48])
    with pytest.raises(hypercodec.InvalidInputError):
        torch.ops.hypercodec.stored_forward_group(x, [a._op_key, b._op_key], [48])


def test_the_grouping_pass_leaves_a_users_post_grad_pass_in_place(grouped_graphs, projections):
    """A post-grad pass the user set stays set and runs (no grouping then), and turning grouping
    off removes only hypercodec's own pass."""
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Theirs(CustomGraphPass):
        runs = 0

        def __call__(self, graph):
            Theirs.runs += 1

        def uuid(self):
            return "theirs"

    torch.manual_seed(38)
    blk = projections(64)
    hnn.quantize(blk, bps=4, method="affine", skip=())
    theirs = Theirs()
    with config.patch(post_grad_custom_post_pass=theirs):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(blk, fullgraph=True)(torch.randn(1, 1, 64))
        assert config.post_grad_custom_post_pass is theirs and Theirs.runs >= 1 and not grouped_graphs
        hnn.set_compile_grouping(False)
        assert config.post_grad_custom_post_pass is theirs
    torch._dynamo.reset()
    hnn.set_compile_grouping(True)
    with torch.no_grad():
        torch.compile(blk, fullgraph=True)(torch.randn(1, 1, 64))
    assert grouped_graphs == [2] and config.post_grad_custom_post_pass is not None
    hnn.set_compile_grouping(False)
    assert config.post_grad_custom_post_pass is None


def test_grouping_layers_whose_input_is_a_grouped_layers_output(grouped_graphs):
    """h = a(x) with a grouped with b(x), then c(h) and d(h) grouped too: the second group reads
    the first group's output (the pass once kept the node it had replaced, and inductor failed
    on the graph: "topological sort did not consume all nodes")."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)
            self.c, self.d = torch.nn.Linear(64, 48), torch.nn.Linear(64, 16)

        def forward(self, x):
            h = self.a(x)
            return self.c(h), self.d(h), self.b(x)

    torch.manual_seed(39)
    m = M()
    hnn.quantize(m, bps=4, method="affine", skip=())
    x = torch.randn(1, 64)
    got = {}
    with torch.no_grad():
        for grouping in (True, False):
            hnn.set_compile_grouping(grouping)
            torch._dynamo.reset()
            got[grouping] = torch.compile(m, fullgraph=True)(x)
        ref = m(x)
    assert grouped_graphs == [2]
    assert all(torch.equal(p, q) for p, q in zip(got[True], got[False]))
    assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(got[True], ref))


def test_the_group_operator_on_empty_inputs_and_layers_without_outputs():
    """Zero input rows, a layer with no outputs and one with no inputs' columns to read: the
    group gives each layer what its own call gives."""
    torch.manual_seed(40)
    a = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 48), "int4")
    none_out = hnn.HyperLinear.from_linear(torch.nn.Linear(64, 0), "int4")
    keys, outs = [a._op_key, none_out._op_key], [48, 0]
    for x in (torch.randn(0, 64), torch.randn(2, 0, 64), torch.randn(3, 64) * 1e30, torch.randn(1, 64) * 1e-30):
        ys = torch.ops.hypercodec.stored_forward_group(x, keys, outs)
        with torch.no_grad():
            want = [a(x), none_out(x)]
        assert [y.shape for y in ys] == [w.shape for w in want]
        assert all(torch.equal(y, w) for y, w in zip(ys, want))


def _rel(a, b):
    return float(((a - b).norm() / b.norm()).detach())


def test_quantize_replaces_a_layer_at_every_name_and_a_bare_layer_comes_back():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)
    m = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
    x = torch.randn(4, 32)
    ref = m(x)
    hnn.quantize(m, bps=8, method="affine")
    assert isinstance(m[0], hnn.HyperLinear) and m[2] is m[0]
    assert not any(k.endswith(".weight") for k in m.state_dict())
    assert _rel(m(x), ref) < 0.02
    # A bare layer cannot replace itself: its stored form is returned, and it gains no child.
    for bare, inp in [
        (torch.nn.Linear(64, 32), torch.randn(3, 64)),
        (torch.nn.Conv2d(4, 8, 3), torch.randn(2, 4, 9, 9)),
    ]:
        ref = bare(inp)
        q = hnn.quantize(bare, bps=8, method="affine")
        assert isinstance(q, (hnn.HyperLinear, hnn.HyperConv2d)), type(q)
        assert list(bare.named_children()) == []
        assert _rel(q(inp), ref) < 0.02
    emb = torch.nn.Embedding(100, 16)
    q = hnn.quantize(emb, bps=8, method="affine", embeddings=True)
    assert isinstance(q, hnn.HyperEmbedding)
    # A bare layer whose forward does more than the product stays itself.
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    s = Scaled(8, 8)
    with pytest.warns(UserWarning, match="left float"):
        assert hnn.quantize(s, bps=8, method="affine") is s
    # The model of two names saves under both and loads back into a fresh model.
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)
    fresh_lin = torch.nn.Linear(32, 32)
    m = hnn.quantize(torch.nn.Sequential(lin, torch.nn.ReLU(), lin), bps=8, method="affine")
    fresh = hnn.load_state_dict(torch.nn.Sequential(fresh_lin, torch.nn.ReLU(), fresh_lin), m.state_dict())
    assert fresh[0] is fresh[2] and isinstance(fresh[0], hnn.HyperLinear)
    assert torch.equal(fresh(x), m(x))
    # A layer skipped under one of its names stays float under all of them.
    m = torch.nn.ModuleDict({"lm_head": lin, "layer": lin, "other": torch.nn.Linear(32, 32)})
    hnn.quantize(m, bps=8, method="affine")
    assert m["lm_head"] is lin and m["layer"] is lin and isinstance(m["other"], hnn.HyperLinear)


def test_quantize_takes_one_skipped_name_as_a_string():
    m = torch.nn.ModuleDict({"lm_head": torch.nn.Linear(16, 16), "layer": torch.nn.Linear(16, 16)})
    hnn.quantize(m, bps=4, method="affine", skip="lm_head")
    assert isinstance(m["layer"], hnn.HyperLinear)
    assert isinstance(m["lm_head"], torch.nn.Linear)


def test_a_failed_quantize_names_the_layer_and_leaves_the_model_float():
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    with torch.no_grad():
        m[2].weight[3, 4] = float("nan")
    with pytest.raises(hypercodec.HypercodecError, match="layer `2`"):
        hnn.quantize(m, bps=4, method="affine")
    assert type(m[0]) is torch.nn.Linear and type(m[2]) is torch.nn.Linear


def test_lattice_prefix_above_its_tables_falls_back_to_rans():
    # Prefix codes hold pair coordinates up to 63: about 5 bits a value and above they cannot.
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(256, 256))
    x = torch.randn(4, 256)
    ref = m(x)
    hnn.quantize(m, bps=7, method="lattice-prefix")
    assert _rel(m(x), ref) < 0.02


def test_a_trainable_layer_runs_its_loaded_or_edited_master_weight_in_eval():
    torch.manual_seed(2)
    a, b = torch.nn.Linear(32, 16), torch.nn.Linear(32, 16)
    qa = hnn.HyperLinear.from_linear(a, "int8", trainable=True)
    qb = hnn.HyperLinear.from_linear(b, "int8", trainable=True)
    qa.load_state_dict(qb.state_dict())
    qa.eval()
    x = torch.randn(5, 32)
    assert _rel(qa(x), b(x)) < 0.02
    # An edit in place is followed once the layer is told (refresh).
    with torch.no_grad():
        qa.weight.mul_(-1.0)
    qa.refresh()
    assert _rel(qa(x), -(b(x) - b.bias) + b.bias) < 0.02
    # A copy runs what it copied: the same stored form, not a re-quantization.
    assert torch.equal(copy.deepcopy(qa)(x), qa(x))


def test_a_stored_embedding_follows_half_and_to():
    emb = torch.nn.Embedding(50, 8)
    q = hnn.HyperEmbedding.from_embedding(emb, "int8")
    ids = torch.tensor([[1, 2, 3]])
    assert q(ids).dtype == torch.float32
    q.half()
    assert q(ids).dtype == torch.float16 and q.weight.dtype == torch.float16
    q.to(torch.bfloat16)
    assert q(ids).dtype == torch.bfloat16
    q.float()
    assert torch.allclose(q(ids), emb(ids), atol=0.02)
    assert copy.deepcopy(q)(ids).dtype == torch.float32


def test_saving_a_quantized_state_dict_is_refused_not_emptied(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    hnn.quantize(m, bps=4, method="affine")
    with pytest.raises(hypercodec.InvalidInputError, match="0.weight_hwz"):
        hypercodec.save(m.state_dict(), tmp_path / "q.hwz")
    assert not (tmp_path / "q.hwz").exists()


def test_attention_shapes_that_cannot_run_are_refused_when_built():
    for args, kw, what in [
        ((60, 8), {}, "not num_heads 8 heads"),
        ((64, 8), {"num_kv_heads": 3}, "must divide"),
        ((40, 8), {}, "even size"),
        ((64, 0), {}, "num_heads 0"),
    ]:
        with pytest.raises(hypercodec.InvalidInputError, match=what):
            hnn.HyperAttention(*args, method="affine", **kw)
    q, k, v, o = (torch.nn.Linear(64, n) for n in (64, 32, 16, 64))
    with pytest.raises(hypercodec.InvalidInputError, match="key and value"):
        hnn.HyperAttention.from_projections(q, k, v, o, num_heads=8, num_kv_heads=4, method="affine")
    att = hnn.HyperAttention(64, 8, num_kv_heads=2, method="affine", bps=8)
    assert att(torch.randn(1, 5, 64)).shape == (1, 5, 64)


def test_a_stored_conv_names_the_input_shape_it_takes():
    for k in (1, 3):
        q = hnn.HyperConv2d.from_conv(torch.nn.Conv2d(16, 8, k), "int8")
        for bad in (torch.randn(2, 15, 9, 9), torch.randn(1, 2, 16, 9, 9), torch.randn(16, 9)):
            with pytest.raises(hypercodec.InvalidInputError, match=r"\(N, 16, H, W\)"):
                q(bad)
        assert q(torch.randn(16, 9, 9)).shape[0] == 8


def test_quantize_budget_is_quiet_and_replaces_a_layer_at_every_name(capsys, tmp_path):
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 64)
    m = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.Linear(64, 8))
    x = torch.randn(3, 64)
    ref = m(x)
    hnn.quantize_budget(m, 6, skip=())
    assert isinstance(m[0], hnn.HyperLinear) and m[2] is m[0] and isinstance(m[3], hnn.HyperLinear)
    assert _rel(m(x), ref) < 0.2  # (BUDGET spends its 6 bits unevenly on these small layers)
    out = capsys.readouterr()
    assert out.out == "" and out.err == "", out
    # load_into alike: an archive of the float model fills both names with one stored layer.
    lin2 = torch.nn.Linear(64, 64)
    twin = torch.nn.Sequential(lin2, torch.nn.ReLU(), lin2)
    path = str(tmp_path / "t.hwz")
    hypercodec.save(twin.state_dict(), path, encoding="lattice", bps=6, verbose=False)
    assert capsys.readouterr().out == ""
    fresh_lin = torch.nn.Linear(64, 64)
    fresh = hnn.load_into(torch.nn.Sequential(fresh_lin, torch.nn.ReLU(), fresh_lin), path)
    assert isinstance(fresh[0], hnn.HyperLinear) and fresh[2] is fresh[0]
    assert _rel(fresh(x), twin(x)) < 0.1


def test_conv_biases_train_and_round_once_and_stored_kernels_keep_their_geometry():
    """A helper's hostile pass over HyperConv2d: a 1×1 convolution's bias set to train got no
    gradient (it was added inside the stored product, detached); compiled and eager outputs of
    f16 inputs differed where a bias was added after the output's rounding; a stored 8×4×3×3
    kernel loaded into an 8×9×2×2 convolution (the same 8×36 matrix view) and computed
    garbage; quantize left the layers of a model in eval mode training (BatchNorm fusion then
    refused them), and dropped their forward hooks."""
    torch.manual_seed(0)
    q = hnn.HyperConv2d.from_conv(torch.nn.Conv2d(8, 4, 1), "int8")
    q.bias.requires_grad_(True)
    q(torch.randn(2, 8, 5, 5)).sum().backward()
    assert q.bias.grad is not None and torch.allclose(q.bias.grad, torch.full((4,), 50.0))
    for k in (1, 3):
        m = torch.nn.Sequential(torch.nn.Conv2d(16, 32, k))
        hnn.quantize(m, bps=8, method="affine")
        x = torch.randn(2, 16, 10, 10).half()
        assert torch.equal(m(x), torch.compile(m, fullgraph=True, backend="aot_eager")(x)), k
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3))
    hnn.quantize(m, bps=8, method="affine")
    with pytest.raises(hypercodec.InvalidInputError, match=r"\(8, 9, 2, 2\)"):
        hnn.load_state_dict(torch.nn.Sequential(torch.nn.Conv2d(9, 8, 2)), m.state_dict())
    m = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    seen = []
    handle = m[0].register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    hnn.quantize(m, bps=8, method="affine")
    m(torch.randn(1, 4, 6, 6))
    assert not m[0].training and len(seen) == 1
    handle.remove()
    m(torch.randn(1, 4, 6, 6))
    assert len(seen) == 1


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="the stored operator needs torch >= 2.4")
def test_torch_jit_trace_records_the_stored_operator():
    """`torch.jit.trace` of a compressed model computes each new input: the graph calls the
    stored layers' operator (it baked the traced input's output in as a constant before, for
    linear layers, 1×1 convolutions and embeddings alike)."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e, self.l, self.c = torch.nn.Embedding(100, 64), torch.nn.Linear(64, 64), torch.nn.Conv2d(64, 16, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.c(self.l(self.e(ids)).permute(0, 2, 1)[..., None])

    torch.manual_seed(0)
    model = Net().eval()
    hnn.quantize(model, bps=4, embeddings=True)
    assert [type(m).__name__ for m in (model.e, model.l, model.c)] == ["HyperEmbedding", "HyperLinear", "HyperConv2d"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.jit.trace is deprecated, and warns of the ids' checks)
        traced = torch.jit.trace(model, torch.randint(0, 100, (2, 7)))
    for _ in range(2):
        ids = torch.randint(0, 100, (2, 7))
        assert torch.allclose(traced(ids), model(ids), atol=1e-5)
    # torch.jit.script cannot compile native code: it says what can (it failed on an annotation).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.jit.script is deprecated)
        with pytest.raises(hypercodec.InvalidInputError, match="torch.jit.trace, torch.export and torch.compile"):
            torch.jit.script(model)


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="the stored operator needs torch >= 2.4")
def test_torch_fx_symbolic_trace_records_the_stored_operator():
    """`torch.fx.symbolic_trace` of a compressed model (it raised TraceError: the layers' input
    checks branch on the input) records each stored layer's operator, with those checks as calls
    of the graph: the GraphModule computes what the model does, for inputs of other shapes, an
    unbatched image and under autocast, and refuses at run time what the layer refuses; a
    trainable layer in training mode is refused at trace time."""
    import torch.fx as fx

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = torch.nn.Embedding(100, 64, max_norm=2.0)
            self.l = torch.nn.Linear(64, 48)
            self.c = torch.nn.Conv2d(48, 16, 3, padding=1, padding_mode="reflect")
            self.p = torch.nn.Conv2d(16, 8, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.l(self.e(ids)).permute(0, 2, 1)[..., None].expand(-1, -1, -1, 3)
            return self.p(torch.relu(self.c(h)))

    torch.manual_seed(0)
    model = Net().eval()
    hnn.quantize(model, bps=4, embeddings=True)
    assert [type(m).__name__ for m in (model.e, model.l, model.c, model.p)] == [
        "HyperEmbedding", "HyperLinear", "HyperConv2d", "HyperConv2d"]
    g = fx.symbolic_trace(model)
    assert "stored_forward" in g.code and "stored_lookup" in g.code
    for shape in ((2, 7), (1, 3)):
        ids = torch.randint(0, 100, shape)
        assert torch.equal(g(ids), model(ids)), shape
    with pytest.raises(hypercodec.InvalidInputError, match="integers"):
        g(torch.rand(2, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ids = torch.randint(0, 100, (2, 5))
        y = g(ids)
        assert y.dtype == torch.bfloat16 and torch.equal(y, model(ids))
    conv = fx.symbolic_trace(model.c)
    x = torch.randn(48, 6, 3)  # one unbatched image
    assert conv(x).shape == (16, 6, 3) and torch.equal(conv(x), model.c(x))
    with pytest.raises(hypercodec.InvalidInputError, match=r"\(N, 48, H, W\)"):
        conv(torch.randn(1, 40, 6, 3))
    lin = torch.nn.Sequential(torch.nn.Linear(64, 64))
    hnn.quantize(lin, bps=4, trainable=True)
    lin.train()
    with pytest.raises(hypercodec.InvalidInputError, match="training mode"):
        fx.symbolic_trace(lin)
    lin.eval()
    x = torch.randn(3, 64)
    assert torch.equal(fx.symbolic_trace(lin)(x), lin(x))


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"), reason="the stored operator needs torch >= 2.4")
def test_graph_captures_refuse_what_they_would_freeze_or_drop():
    """What a captured graph or a transform would get silently wrong is refused instead: a
    trainable layer in training mode under torch.jit.trace / torch.export (its step's weight
    became a constant), a convolution's graph run after its bias's `requires_grad` changed (the
    bias went missing or was added twice), vmap (PyTorch's storage error) and forward-mode AD
    (the tangent was dropped)."""
    import warnings

    import torch.autograd.forward_ad as fwad

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 64))
    hnn.quantize(lin, bps=4, trainable=True)
    lin.train()
    x = torch.randn(2, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(hypercodec.InvalidInputError, match="training mode"):
            torch.jit.trace(lin, x)
        if hasattr(torch.compiler, "is_exporting"):
            with pytest.raises(Exception, match="training mode"):
                torch.export.export(lin, (x,))
    lin.eval()  # then captured and run as the eager model
    ep = torch.export.export(lin, (x,)).module()
    x2 = torch.randn(2, 64)
    assert torch.allclose(ep(x2), lin(x2), atol=1e-5)

    for k in (1, 3):
        conv = torch.nn.Sequential(torch.nn.Conv2d(16, 8, k, padding=k // 2))
        hnn.quantize(conv, bps=4)
        conv.eval()
        xc = torch.randn(1, 16, 5, 5)
        ep = torch.export.export(conv, (xc,)).module()
        assert torch.allclose(ep(xc), conv(xc), atol=1e-5)
        conv[0].bias.requires_grad_(not conv[0].bias.requires_grad)
        with pytest.raises(hypercodec.InvalidInputError, match="names a layer"):
            ep(xc)

    lin.eval()
    with pytest.raises(hypercodec.InvalidInputError, match="torch.func"):
        torch.vmap(lin)(torch.randn(3, 2, 64))
    with fwad.dual_level():
        with pytest.raises(hypercodec.InvalidInputError, match="forward-mode"):
            lin(fwad.make_dual(x, torch.randn_like(x)))
    emb = torch.nn.Sequential(torch.nn.Embedding(50, 16))
    hnn.quantize(emb, bps=4, embeddings=True)
    with pytest.raises(hypercodec.InvalidInputError, match="torch.func"):
        torch.vmap(emb)(torch.randint(0, 50, (3, 4)))


def test_ids_placeholders_and_options_that_misled():
    """Three answers that misled, from a hostile read of the Python surface: a bool mask (or
    uint8 ids) was looked up as rows 0 and 1 where ``nn.Embedding`` refuses it; a placeholder
    without its ``weight_hwz`` reported the key missing twice; ``save(..., help=True)`` printed
    the command line's help, wrote nothing, then failed on reading the archive."""
    e = hnn.HyperEmbedding.from_embedding(torch.nn.Embedding(10, 4), "int8")
    for dtype in (torch.bool, torch.uint8, torch.int16, torch.float32):
        with pytest.raises(hypercodec.InvalidInputError, match="int64 or int32"):
            e(torch.zeros(3, dtype=dtype))
    assert e(torch.tensor([1, 2], dtype=torch.int32)).shape == (2, 4)
    empty = hnn.HyperLinear.placeholder(torch.nn.Linear(8, 4))
    got = empty.load_state_dict({}, strict=False)
    assert got.missing_keys == ["weight_hwz"], got
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "weight_hwz"\\.'):
        empty.load_state_dict({})
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for flag in ("help", "version"):
            with pytest.raises(hypercodec.InvalidInputError, match=f"`{flag}` is not an option"):
                hypercodec.save({"w": np.ones((4, 4), np.float32)}, f"{d}/w.hwz", **{flag: True})
