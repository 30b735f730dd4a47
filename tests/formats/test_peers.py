"""Peer packages as oracles: ModelOpt's NVFP4QTensor and torchao's MXFP8 (RCEIL), byte for byte."""

from __future__ import annotations

import warnings

import pytest
import torch
from _helpers import assert_bytes_equal

from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

pytestmark = pytest.mark.peer


def _weights(shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(shape[0], 1, generator=g))  # rows of different magnitude
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@pytest.fixture(scope="module")
def nvfp4_qtensor():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.quantization.qtensor import NVFP4QTensor
    return NVFP4QTensor


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_modelopt_profile_equals_modelopt(nvfp4_qtensor, dtype, seed):
    w = _weights((256, 512), dtype, seed)
    packed, block_scale, s2 = nvfp4_qtensor.quantize(w.clone(), 16)
    ours = quantize_nvfp4(w, profile="modelopt")
    assert_bytes_equal(ours.data, packed._quantized_data)
    assert_bytes_equal(ours.scale, block_scale.view(torch.uint8))
    assert_bytes_equal(ours.global_decode_scale(), s2.float())


def test_te_profile_differs_from_modelopt_somewhere(nvfp4_qtensor):
    # The profiles are not aliases: over tensors whose amaxes span 1e-3..1e3 the TE chain moves
    # about 0.2% of scale bytes against ModelOpt (docs/formats.md, "Profiles").
    g = torch.Generator().manual_seed(0)
    differing = 0
    for _ in range(20):
        scale = float(torch.exp(torch.empty(1).uniform_(-7, 7, generator=g)))
        w = (torch.randn(256, 1024, generator=g) * scale).to(torch.bfloat16)
        _, block_scale, _ = nvfp4_qtensor.quantize(w.clone(), 16)
        differing += int((quantize_nvfp4(w).scale != block_scale.view(torch.uint8)).sum())
    assert differing > 0


@pytest.fixture(scope="module")
def torchao_to_mx():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
    return lambda x: to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # torchao refuses float16 input
@pytest.mark.parametrize("seed", range(4))
def test_mxfp8_equals_torchao_rceil(torchao_to_mx, dtype, seed):
    x = _weights((128, 512), dtype, seed)
    x[0, :32] = 0  # an all-zero block
    scale, data = torchao_to_mx(x)
    ours = quantize_mxfp8(x)
    assert_bytes_equal(ours.scale, scale.view(torch.uint8))
    assert_bytes_equal(ours.data, data.view(torch.uint8))
