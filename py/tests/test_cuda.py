"""CUDA execution of compressed layers (`hypercodec.cuda`): the device tests skip, with the
reason printed, where torch sees no CUDA device (CI); the error path runs everywhere."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hypercodec  # noqa: E402
import hypercodec.cuda as hcuda  # noqa: E402
import hypercodec.nn as hnn  # noqa: E402

HAS_CUDA = hcuda.available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the CUDA kernels were not run")


def test_without_a_device_loading_is_a_typed_error():
    if HAS_CUDA:
        pytest.skip("a CUDA device is present")
    with pytest.raises(hypercodec.CudaError):
        hypercodec._native.CudaKernels(0)
    assert hcuda.available() is False


def test_device_forms_name_the_stored_codes():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    f = hypercodec.Linear.quantize(w, "int4").device_form()
    assert f["kind"] == "affine" and f["bits"] == 4 and f["codes"].nbytes == 48 * 256 // 2
    assert f["scales"].shape == (48 * 2,) and f["scales_per_row"] == 2 and f["group_len"] == 128
    e = hypercodec.Linear.quantize(w, "e8-fixed3").device_form()
    assert e["kind"] == "e8" and e["bits"] == 3 and e["packed"].nbytes == 48 * 32 * 3
    t = hypercodec.Linear.quantize(w, "tcq@2-l12").device_form()
    assert t["kind"] == "trellis" and (t["l"], t["k"]) == (12, 2) and t["bits"].nbytes == 48 * 256 * 2 // 8
    assert hypercodec.Linear.quantize(w, "e8@4").device_form() is None  # entropy-coded: decoded


@needs_cuda
@pytest.mark.parametrize("spec", ["int4", "int8-row", "int3", "e8-fixed4", "e8-fixed3", "tcq@2-l12", "e8@4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_forward_matches_the_cpu_runtime(spec, dtype):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 512)).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec, b)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    for m in (1, 3, 20):
        x = torch.from_numpy(rng.standard_normal((m, 512)).astype(np.float32)).to(dtype)
        want = op.forward(x.float().numpy())
        got = d.forward(x.cuda()).float().cpu().numpy()
        tol = 3e-4 if dtype == torch.float32 else 3e-2
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), (spec, m, d.route(m))


@needs_cuda
def test_hyper_linear_runs_on_cuda_tensors():
    lin = torch.nn.Linear(256, 64)
    h = hnn.HyperLinear.from_linear(lin, "int4")
    x = torch.randn(2, 5, 256)
    assert torch.allclose(h(x.cuda()).cpu(), h(x), rtol=1e-3, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("spec", ["tcq@2-l12", "tcq@3-l12", "tcq@1-l12", "tcq@2"])
def test_cuda_trellis_with_calibrated_short_sequences(spec):
    # Calibrated trellis rows are cut into sequences of 16 values: most chunks wrap.
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 384)).astype(np.float32)
    a = rng.standard_normal((2048, 384)).astype(np.float32)
    h = (a.T @ a / len(a)).astype(np.float32)
    op = hypercodec.Linear.quantize(w, spec, None, h)
    d = hcuda.DeviceLinear(op, torch.device("cuda"))
    assert d.kind == "trellis"
    for m in (1, 2, 9):
        x = torch.from_numpy(rng.standard_normal((m, 384)).astype(np.float32))
        want = op.forward(x.numpy())
        got = d.forward(x.cuda()).cpu().numpy()
        assert np.abs(got - want).max() <= 3e-4 * np.abs(want).max(), (spec, m)
