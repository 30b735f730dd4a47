"""MXFP8 semantics: edge cases, column-wise copies, shapes and errors."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal

from fp4convert.errors import FormatError
from fp4convert.formats import dequantize
from fp4convert.formats.mxfp8 import MXFP8Tensor, dequantize_mxfp8, quantize_mxfp8

BACKENDS = ["reference", "auto"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_is_ignored_in_scale_and_kept_in_data(backend):
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 1.0, float("nan")
    q = quantize_mxfp8(x, backend=backend)
    assert q.scale.item() == 0x77  # from amax 1.0, as if the NaN were absent
    assert q.data[0, :2].tolist() == [0x78, 0x7F]


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_block_saturates(backend):
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = float("inf"), float("-inf"), 1.0
    q = quantize_mxfp8(x, backend=backend)
    assert q.scale.item() == 0xFE  # satfinite 2^127
    assert q.data[0, :3].tolist() == [0x7E, 0xFE, 0x00]


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_zero(backend):
    x = torch.zeros(1, 32)
    x[0, 0] = -0.0
    assert quantize_mxfp8(x, backend=backend).data[0, 0].item() == 0x80


@pytest.mark.parametrize("backend", BACKENDS)
def test_column_axis_blocks_run_down_columns(backend):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g, dtype=torch.bfloat16)
    qc = quantize_mxfp8(x, axis="col", backend=backend)
    qr_t = quantize_mxfp8(x.t().contiguous(), backend=backend)
    assert qc.data.shape == (64, 96) and qc.scale.shape == (2, 96)
    assert_bytes_equal(qc.data, qr_t.data.t())
    assert_bytes_equal(qc.scale, qr_t.scale.t())


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_d_input(backend):
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(1))
    q = quantize_mxfp8(x, backend=backend)
    q2 = quantize_mxfp8(x.reshape(64, 64), backend=backend)
    assert q.scale.shape == (2, 32, 2)
    assert_bytes_equal(q.data.reshape(64, 64), q2.data)


def test_dequantize_error_bound_is_half_an_e4m3_ulp():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    xh = dequantize(quantize_mxfp8(x))
    rel = ((x - xh).abs() / x.abs().clamp_min(1e-3))[x.abs() > 2**-6 * x.abs().max()]
    assert rel.max() <= 2**-4 + 1e-6  # 3 mantissa bits: half an ulp is 2^-4 relative


@pytest.mark.parametrize(
    ("shape", "axis", "message"),
    [
        ((4, 48), "row", r"shape \(4, 48\): last dim 48 not divisible by the MXFP8 block size 32"),
        ((48, 32), "col", r"shape \(48, 32\): rows 48 not divisible by the MXFP8 block size 32"),
        ((32,), "row", r"at least 2 dims"),
        ((32, 32), "diag", r"unknown MXFP8 axis 'diag'"),
    ],
)
def test_bad_input_errors(shape, axis, message):
    with pytest.raises(FormatError, match=message):
        quantize_mxfp8(torch.ones(shape), axis=axis)


def test_dequantize_profiles_decode_e8m0_codes_0_and_255_as_te_did():
    # TE PR #3262 (after 2.18): code 0 is 2**-127 and code 255 NaN; TE <= 2.18 gave 0.0 and +inf.
    q = quantize_mxfp8(torch.full((2, 32), 1e-40))
    assert q.scale.flatten().tolist() == [0, 0]
    scale = q.scale.clone()
    scale[1, 0] = 0xFF
    planted = MXFP8Tensor(q.shape, q.dtype, q.axis, q.data, scale)
    new = dequantize_mxfp8(planted)
    old = dequantize_mxfp8(planted, profile="te-2.18")
    assert q.data[0, 0].item() == 0x09
    assert torch.equal(new[0], torch.full((32,), 1.125 * 2.0**-133))  # E4M3 0x09 (1.125 * 2**-6) x 2**-127
    assert new[1].isnan().all()
    assert old[0].eq(0).all() and old[1].isinf().all()
    assert torch.equal(dequantize_mxfp8(quantize_mxfp8(torch.ones(1, 32)), profile="te-2.18"), torch.ones(1, 32))


def test_unknown_mxfp8_profile_is_refused():
    with pytest.raises(FormatError, match=r"unknown MXFP8 profile 'te-2.17'"):
        dequantize_mxfp8(quantize_mxfp8(torch.ones(1, 32)), profile="te-2.17")  # type: ignore[arg-type]
