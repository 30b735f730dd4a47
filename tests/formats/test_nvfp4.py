"""NVFP4 semantics beyond the worked examples: edge cases, scopes, tiles, errors, dequantize."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal

from fp4convert.errors import FormatError
from fp4convert.formats import dequantize, to_layout
from fp4convert.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4

BACKENDS = ["reference", "auto"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_is_ignored_by_every_amax_and_encodes_as_plus_six(backend):
    clean = torch.tensor([[0.5 * i for i in range(16)] + [1.0] * 16])
    dirty = clean.clone()
    dirty[0, 3] = float("nan")  # 1.5 replaced: the block amax (7.5) and global amax are unchanged
    qc, qd = quantize_nvfp4(clean, backend=backend), quantize_nvfp4(dirty, backend=backend)
    assert qd.amax.item() == qc.amax.item() == 7.5
    assert_bytes_equal(qd.scale, qc.scale)
    assert qd.data[0, 1].item() >> 4 == 0x7  # NaN -> +6, as the hardware cvt does
    assert_bytes_equal(qd.data[0, 2:], qc.data[0, 2:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_nan_block_has_zero_scale(backend):
    x = torch.full((1, 16), float("nan"))
    q = quantize_nvfp4(x, backend=backend)
    assert q.amax.item() == 0.0
    assert q.scale.item() == 0x00
    assert q.data.flatten().tolist() == [0x77] * 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinities_saturate(backend):
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = float("inf"), float("-inf"), 1.0
    x[0, 16] = 2.0
    q = quantize_nvfp4(x, backend=backend)
    assert q.amax.item() == float("inf")
    # inf block amax saturates to 448 (0x7E); A = inf gives S_enc = 1, so the finite block's
    # d = 2 * rn32(1/6) = 0.3333 rounds to 0.34375 (0x2B).
    assert q.scale[0].tolist() == [0x7E, 0x2B]
    assert q.data[0, 0].item() == 0xF7  # +inf -> +6 (low nibble), -inf -> -6 (high nibble)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_zero_keeps_its_sign_except_under_modelopt(backend):
    x = torch.zeros(1, 16)
    x[0, 0] = -0.0
    x[0, 2] = 1.0
    assert quantize_nvfp4(x, backend=backend).data[0, 0].item() == 0x08
    assert quantize_nvfp4(x, profile="modelopt", backend=backend).data[0, 0].item() == 0x00


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_negatives_round_to_negative_zero(backend):
    x = torch.tensor([[-0.1] + [0.0] * 14 + [6.0]])
    assert quantize_nvfp4(x, backend=backend).data[0, 0].item() == 0x08


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt"])
def test_subnormal_inputs_match_reference(profile, backend):
    tiny = torch.finfo(torch.float32).tiny
    x = torch.tensor([[tiny * 0.25 * i for i in range(16)] + [tiny * 3] * 16])
    ref = quantize_nvfp4(x, profile=profile, backend="reference")
    q = quantize_nvfp4(x, profile=profile, backend=backend)
    assert_bytes_equal(q.data, ref.data)
    assert_bytes_equal(q.scale, ref.scale)
    assert q.scale.flatten().tolist() != [0, 0]  # the outer scale lifts subnormal blocks into range


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_rows_under_row_scope(backend):
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    x[0] = 0
    q = quantize_nvfp4(x, scope="row", backend=backend)
    assert q.amax[0].item() == 0.0
    assert q.scale[0].tolist() == [0, 0] and q.data[0].unique().tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_tensor_under_modelopt_is_defined(backend):
    q = quantize_nvfp4(torch.zeros(2, 16), profile="modelopt", backend=backend)
    assert q.scale.flatten().tolist() == [0x38, 0x38]  # ModelOpt itself would write NaN here
    assert q.data.unique().tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_expert_scope_equals_per_expert_quantization(dtype, backend):
    x = torch.randn(3, 32, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    x[1] *= 50
    q = quantize_nvfp4(x, scope="expert", backend=backend)
    assert q.amax.shape == (3,)
    for e in range(3):
        qe = quantize_nvfp4(x[e], backend=backend)
        assert_bytes_equal(q.data[e], qe.data)
        assert_bytes_equal(q.scale[e], qe.scale)
        assert q.amax[e].item() == qe.amax.item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_scope_on_3d_equals_flattened(backend):
    x = torch.randn(2, 16, 48, generator=torch.Generator().manual_seed(3), dtype=torch.bfloat16)
    q3 = quantize_nvfp4(x, backend=backend)
    q2 = quantize_nvfp4(x.reshape(32, 48), backend=backend)
    assert q3.data.shape == (2, 16, 24) and q3.scale.shape == (2, 16, 3)
    assert_bytes_equal(q3.data.reshape(32, 24), q2.data)
    assert_bytes_equal(q3.scale.reshape(32, 3), q2.scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_amax_equals_quantizing_the_fused_pair(backend):
    g = torch.Generator().manual_seed(4)
    gate = torch.randn(32, 64, generator=g, dtype=torch.bfloat16)
    up = (torch.randn(32, 64, generator=g) * 3).to(torch.bfloat16)
    fused = quantize_nvfp4(torch.cat([gate, up]), backend=backend)
    shared = torch.maximum(quantize_nvfp4(gate).amax, quantize_nvfp4(up).amax)
    qg = quantize_nvfp4(gate, amax=shared, backend=backend)
    qu = quantize_nvfp4(up, amax=shared, backend=backend)
    assert_bytes_equal(torch.cat([qg.data, qu.data]), fused.data)
    assert_bytes_equal(torch.cat([qg.scale, qu.scale]), fused.scale)
    assert torch.equal(qg.global_decode_scale(), qu.global_decode_scale())


@pytest.mark.parametrize("backend", BACKENDS)
def test_columnwise_is_quantized_from_high_precision(backend):
    x = torch.randn(32, 48, generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)
    q = quantize_nvfp4(x, columnwise=True, backend=backend)
    qt = quantize_nvfp4(x.t().contiguous(), amax=q.amax, backend=backend)
    assert_bytes_equal(q.data_t, qt.data)
    assert_bytes_equal(q.scale_t, qt.scale)
    assert q.data_t.shape == (48, 16) and q.scale_t.shape == (48, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_scope_columnwise_uses_per_column_amax(backend):
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(6))
    q = quantize_nvfp4(x, scope="row", columnwise=True, backend=backend)
    assert torch.equal(q.amax_t, x.abs().amax(dim=0))


def test_16x16_columnwise_scales_are_the_transposed_tiles():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
    q = quantize_nvfp4(x, tile="16x16", columnwise=True)
    tiles = q.scale[::16]  # one row per tile row
    assert_bytes_equal(q.scale_t[::16], tiles.t())


@pytest.mark.parametrize(
    ("shape", "kwargs", "message"),
    [
        ((4, 24), {}, r"shape \(4, 24\): last dim 24 is not divisible by the NVFP4 block size 16"),
        ((8, 32), {"tile": "16x16"}, r"shape \(8, 32\): rows 8 not divisible by 16, needed by 16x16 tiles"),
        ((8, 32), {"columnwise": True}, r"rows 8 not divisible by 16, needed by the column-wise copy"),
        ((32,), {}, r"at least 2 dims"),
        ((2, 16, 16), {"scope": "row", "tile": "16x16"}, r"16x16 tiles cannot be combined with per-row"),
        ((16, 16), {"scope": "expert"}, r"scope='expert' needs a 3-D"),
        ((16, 16), {"profile": "trt"}, r"unknown quantizer profile 'trt'; use one of te, te-2.13, modelopt"),
        ((16, 16), {"amax": torch.ones(3)}, r"amax= has shape \(3,\), expected \(\) for scope='tensor'"),
    ],
)
def test_bad_input_errors_name_the_problem(shape, kwargs, message):
    with pytest.raises(FormatError, match=message):
        quantize_nvfp4(torch.ones(shape), **kwargs)


def test_integer_dtype_is_refused():
    with pytest.raises(FormatError, match=r"dtype torch.int32, expected bfloat16, float16 or float32"):
        quantize_nvfp4(torch.ones(2, 16, dtype=torch.int32))


@pytest.mark.parametrize("profile", ["te", "modelopt"])
def test_dequantize_error_bound(profile):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(8))
    q = quantize_nvfp4(x, profile=profile)
    xh = dequantize(q)
    # Each element is within one E2M1 half-step (at most 1.0 at the top of the grid) of its block
    # scale, plus the tiny difference between the encode and decode chains.
    from fp4convert.formats import profiles

    outer = profiles.outer_scales(q.amax.reshape(1, 1), profile)
    factor = profiles.dequant_block_scale(q.scale, outer, profile).repeat_interleave(16, dim=1)
    assert ((x - xh).abs() <= factor * 1.01).all()


def test_dequantize_columnwise_round_trips_layout():
    x = torch.randn(32, 48, generator=torch.Generator().manual_seed(9))
    q = quantize_nvfp4(x, columnwise=True)
    xt = dequantize_nvfp4(q, columnwise=True)
    assert xt.shape == x.shape
    assert (x - xt).abs().max() < x.abs().max() / 4


def test_te_padded_scale_shape():
    q = quantize_nvfp4(torch.ones(3, 64))
    padded = to_layout(q.scale, "te-padded")
    assert padded.shape == (128, 4)
    assert padded[3:].unique().tolist() == [0] and padded[:, 4:].numel() == 0
