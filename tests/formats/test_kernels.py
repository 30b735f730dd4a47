"""Fast kernels equal the pure-torch reference, byte for byte, on adversarial data."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _helpers import adversarial, assert_bytes_equal

from fp4convert.formats import kernels, profiles
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import four_over_six_choices, quantize_nvfp4

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FOUR_OVER_SIX = list(profiles.FOUR_OVER_SIX_PROFILES)


def test_native_kernel_required():
    # The CPU fast path must exist in every install this suite runs on (CI builds it).
    assert kernels.native_available(), "fp4convert.formats._native is not built: reinstall the package"


def _fields(q):
    return [f for f in ("data", "scale", "data_t", "scale_t", "amax", "amax_t") if getattr(q, f) is not None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", profiles.PROFILES)
@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_native_equals_reference(dtype, profile, scope, seed):
    x = adversarial((96, 272), dtype, seed)
    columnwise = not (scope == "row" and profile in FOUR_OVER_SIX)  # TE refuses that combination
    ref = quantize_nvfp4(x, profile=profile, scope=scope, columnwise=columnwise, backend="reference")
    fast = quantize_nvfp4(x, profile=profile, scope=scope, columnwise=columnwise, backend="auto")
    assert len(_fields(ref)) == (6 if columnwise else 3)
    for field in _fields(ref):
        assert_bytes_equal(getattr(fast, field), getattr(ref, field))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", FOUR_OVER_SIX)
@pytest.mark.parametrize("tile", ["1x16", "16x16"])
def test_4over6_native_choices_equal_reference(dtype, profile, tile):
    x = adversarial((64, 1040), dtype, 2)  # wider than the kernel's 512-column pass, not a multiple
    ref = four_over_six_choices(x, profile=profile, tile=tile, backend="reference")
    fast = four_over_six_choices(x, profile=profile, tile=tile)
    assert torch.equal(fast, ref)
    assert ref.any() and not ref.all()  # both candidates occur, so a swapped pick would show


@pytest.mark.parametrize("profile", FOUR_OVER_SIX)
def test_4over6_native_16x16_tasks_hold_whole_tiles(profile):
    # 1040 rows = 65 tiles: an unaligned split between threads would cut a tile in two.
    x = torch.randn(1040, 1040, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    ref = quantize_nvfp4(x, profile=profile, tile="16x16", backend="reference")
    fast = quantize_nvfp4(x, profile=profile, tile="16x16")
    assert_bytes_equal(fast.data, ref.data)
    assert_bytes_equal(fast.scale, ref.scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", ["te", *FOUR_OVER_SIX])
def test_nvfp4_native_16x16_and_expert_scope(dtype, profile):
    x = adversarial((4, 48, 64), dtype, 7)
    for kwargs in ({"tile": "16x16"}, {"scope": "expert"}, {"scope": "expert", "tile": "16x16"}):
        ref = quantize_nvfp4(x, backend="reference", columnwise=True, profile=profile, **kwargs)
        fast = quantize_nvfp4(x, columnwise=True, profile=profile, **kwargs)
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


@pytest.mark.parametrize("dtype", DTYPES)
def test_tile_amax_native_equals_reference(dtype):
    from fp4convert.formats.nvfp4 import tile_amax

    x = adversarial((1040, 1040), dtype, 8)  # NaN, inf, +-0; 65 tiles split over threads
    assert_bytes_equal(kernels.tile_amax(x), tile_amax(x))
