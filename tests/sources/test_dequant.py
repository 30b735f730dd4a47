"""The dequantizers against implementations written from the formats' definitions (tests/_sources.py)."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal
from _sources import reference_fp8_dequant, reference_mxfp4_dequant

from fp4convert.checkpoint.decode.dequant import (
    check_fp8_scales,
    check_mxfp4_scales,
    dequantize_fp8_block,
    dequantize_mxfp4,
)
from fp4convert.errors import CheckpointError


def _fp8_codes(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Every E4M3 code but the two NaNs (0x7F, 0xFF), then random ones."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, shape, generator=g, dtype=torch.int64)
    every = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)])
    n = min(codes.numel(), every.numel())
    codes.view(-1)[:n] = every[:n]
    codes[(codes == 0x7F) | (codes == 0xFF)] = 0x7E
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def _scales(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Positive float32 scales over a wide range: tiny, huge, subnormal, arbitrary mantissas."""
    g = torch.Generator().manual_seed(seed)
    s = torch.exp2(torch.randint(-140, 100, shape, generator=g).float()) * (1 + torch.rand(shape, generator=g))
    s.view(-1)[0] = 2.0**-149  # the smallest fp32 subnormal
    return s


@pytest.mark.parametrize(("shape", "block"), [((300, 200), (128, 128)), ((97, 130), (32, 48)), ((5, 7), (128, 128))])
def test_fp8_block_dequant_equals_deepseeks_cast(shape, block):
    w = _fp8_codes(shape, seed=shape[0])
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    scale = _scales(grid, seed=shape[1])
    assert_bytes_equal(dequantize_fp8_block(w, scale, block), reference_fp8_dequant(w, scale, block))


def test_other_plausible_casts_give_other_bytes():
    # The comparison above can fail: rounding the scale to BF16 first, or multiplying in BF16, is not
    # DeepSeek's cast and differs from it on the same data.
    w, scale = _fp8_codes((256, 256), seed=7), _scales((2, 2), seed=8)
    ours = dequantize_fp8_block(w, scale, (128, 128))
    grid = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert not torch.equal(ours, (w.float() * grid.to(torch.bfloat16).float()).to(torch.bfloat16))
    assert not torch.equal(ours, w.to(torch.bfloat16) * grid.to(torch.bfloat16))


def test_fp8_dequant_takes_bf16_and_e8m0_scales_exactly():
    w = _fp8_codes((64, 64), seed=3)
    exact = torch.exp2(torch.tensor([[-7.0, 3.0], [0.0, -20.0]]))
    reference = dequantize_fp8_block(w, exact, (32, 32))
    assert_bytes_equal(dequantize_fp8_block(w, exact.to(torch.bfloat16), (32, 32)), reference)
    assert_bytes_equal(dequantize_fp8_block(w, exact.to(torch.float8_e8m0fnu), (32, 32)), reference)


@pytest.mark.parametrize("codes", [(0, 254), (2, 252)])  # every scale (subnormal / overflowing values too); normals
def test_mxfp4_dequant_is_exact_for_every_code_and_scale(codes):
    g = torch.Generator().manual_seed(codes[0])
    count = codes[1] - codes[0] + 1
    blocks = torch.randint(0, 256, (3, count, 2, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    blocks[0, :16, 0, :] = torch.arange(256, dtype=torch.int64).reshape(16, 16).to(torch.uint8)  # every byte
    scales = torch.arange(codes[0], codes[1] + 1, dtype=torch.int64).to(torch.uint8)
    scales = scales.reshape(1, count, 1).expand(3, count, 2).contiguous()
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (3, count, 64) and out.dtype == torch.bfloat16
    assert_bytes_equal(out, reference_mxfp4_dequant(blocks, scales))


def test_mxfp4_low_nibble_is_the_even_element():
    blocks = torch.zeros(1, 16, dtype=torch.uint8)
    blocks[0, 0] = 0x71  # low nibble 0x1 (0.5), high nibble 0x7 (6.0)
    values = dequantize_mxfp4(blocks, torch.tensor([127], dtype=torch.uint8))
    assert values[:2].tolist() == [0.5, 6.0]


@pytest.mark.parametrize(("bad", "what"), [(float("nan"), "nan"), (float("inf"), "inf"), (0.0, "0.0"), (-0.5, "-0.5")])
def test_a_bad_fp8_scale_is_refused_naming_the_tensor_and_block(bad, what):
    scale = torch.ones(3, 4)
    scale[2, 1] = bad
    with pytest.raises(CheckpointError) as err:
        check_fp8_scales("model.layers.0.mlp.down_proj.weight_scale_inv", scale, ue8m0=False)
    assert err.value.tensor == "model.layers.0.mlp.down_proj.weight_scale_inv"
    assert "block 2, 1" in err.value.message and what in err.value.message


def test_ue8m0_scales_must_be_powers_of_two():
    check_fp8_scales("w_scale_inv", torch.tensor([[0.25, 2.0**-30]]), ue8m0=True)  # fine
    with pytest.raises(CheckpointError, match=r"not a power of two.*scale_fmt: ue8m0") as err:
        check_fp8_scales("w_scale_inv", torch.tensor([[0.25, 0.3]]), ue8m0=True)
    assert "block 0, 1" in err.value.message
    check_fp8_scales("w_scale_inv", torch.tensor([[0.25, 0.3]]), ue8m0=False)  # arbitrary FP32 is fine without it


def test_the_e8m0_nan_code_is_refused():
    check_mxfp4_scales("x_scales", torch.tensor([0, 127, 254], dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="0xFF") as err:
        check_mxfp4_scales("x_scales", torch.tensor([[0, 255]], dtype=torch.uint8))
    assert err.value.tensor == "x_scales"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dequantizers_give_the_same_bytes_on_cuda():
    w, scale = _fp8_codes((300, 200), seed=1), _scales((3, 2), seed=2)
    assert_bytes_equal(
        dequantize_fp8_block(w.cuda(), scale.cuda(), (128, 128)), dequantize_fp8_block(w, scale, (128, 128))
    )
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (4, 64, 3, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.randint(100, 140, (4, 64, 3), generator=g, dtype=torch.int64).to(torch.uint8)
    assert_bytes_equal(dequantize_mxfp4(blocks.cuda(), scales.cuda()), dequantize_mxfp4(blocks, scales))
