"""Fast kernels equal the pure-torch reference, byte for byte, on adversarial data."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _helpers import adversarial, assert_bytes_equal

from fp4convert.formats import kernels
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def test_native_kernel_required():
    # The CPU fast path must exist in every install this suite runs on (CI builds it).
    assert kernels.native_available(), "fp4convert.formats._native is not built: reinstall the package"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt"])
@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_native_equals_reference(dtype, profile, scope, seed):
    x = adversarial((96, 272), dtype, seed)
    ref = quantize_nvfp4(x, profile=profile, scope=scope, columnwise=True, backend="reference")
    fast = quantize_nvfp4(x, profile=profile, scope=scope, columnwise=True, backend="auto")
    for field in ("data", "scale", "data_t", "scale_t", "amax", "amax_t"):
        assert_bytes_equal(getattr(fast, field), getattr(ref, field))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_native_16x16_and_expert_scope(dtype):
    x = adversarial((4, 48, 64), dtype, 7)
    for kwargs in ({"tile": "16x16"}, {"scope": "expert"}, {"scope": "expert", "tile": "16x16"}):
        ref = quantize_nvfp4(x, backend="reference", columnwise=True, **kwargs)
        fast = quantize_nvfp4(x, columnwise=True, **kwargs)
        for field in ("data", "scale", "data_t", "scale_t", "amax"):
            assert_bytes_equal(getattr(fast, field), getattr(ref, field))


def test_nvfp4_native_large_random_many_threads():
    x = torch.randn(1024, 4096, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = quantize_nvfp4(x, backend="reference")
    fast = quantize_nvfp4(x)
    assert_bytes_equal(fast.data, ref.data)
    assert_bytes_equal(fast.scale, ref.scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("seed", [0, 1])
def test_mxfp8_native_equals_reference(dtype, axis, seed):
    x = adversarial((96, 320), dtype, seed)
    ref = quantize_mxfp8(x, axis=axis, backend="reference")
    fast = quantize_mxfp8(x, axis=axis)
    assert_bytes_equal(fast.data, ref.data)
    assert_bytes_equal(fast.scale, ref.scale)


def test_non_contiguous_input_is_handled():
    base = torch.randn(64, 128, generator=torch.Generator().manual_seed(4))
    x = base[:, ::2]  # stride 2 along the row
    assert_bytes_equal(quantize_nvfp4(x).data, quantize_nvfp4(x.contiguous(), backend="reference").data)
    xt = torch.randn(32, 128, generator=torch.Generator().manual_seed(5)).t()  # TE's noncontiguous case
    assert_bytes_equal(quantize_nvfp4(xt).data, quantize_nvfp4(xt.contiguous(), backend="reference").data)


class _FakeCuda:
    def __init__(self, capability: tuple[int, int]):
        self.capability = capability

    def is_available(self) -> bool:
        return True

    def get_device_capability(self, device=None) -> tuple[int, int]:
        return self.capability


@pytest.mark.parametrize(
    ("capability", "installed", "usable"),
    [
        ((9, 0), True, False),
        ((8, 9), True, False),
        ((10, 0), True, True),
        ((12, 0), True, True),
        ((10, 0), False, False),
    ],
)
def test_flashinfer_gate_refuses_hopper(monkeypatch, capability, installed, usable):
    # FlashInfer's FP4/MXFP8 quantize kernels write nothing below sm_100 and raise no error.
    monkeypatch.setattr(kernels.torch, "cuda", _FakeCuda(capability))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        kernels.importlib.util,
        "find_spec",
        lambda name: (object() if installed else None) if name == "flashinfer" else real_find_spec(name),
    )
    assert kernels.flashinfer_quantize_usable() is usable
