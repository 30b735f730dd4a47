"""Property tests (hypothesis): inverses, fixed points, error bounds, backend equality."""

from __future__ import annotations

import torch
from _helpers import assert_bytes_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4convert.formats import dequantize, profiles
from fp4convert.formats.codecs import E2M1_VALUES, pack_fp4, unpack_fp4
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
codes = st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0)


@given(codes)
def test_pack_unpack_inverse(values):
    c = torch.tensor(values, dtype=torch.uint8)
    assert torch.equal(unpack_fp4(pack_fp4(c)), c)


@given(st.lists(st.sampled_from(E2M1_VALUES[:8]), min_size=16, max_size=16), st.integers(-20, 20))
def test_grid_values_times_power_of_two_are_fixed_points(grid, k):
    # A block that already sits on the E2M1 grid at an E4M3 scale survives quantization exactly
    # when its amax is 6 * 2**k and the tensor amax equals it (sf = 448 = 0x7E encodes it exactly).
    grid[0] = 6.0
    x = torch.tensor([grid]) * 2.0**k
    q = quantize_nvfp4(x)
    assert torch.equal(dequantize(q), x)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite32, min_size=32, max_size=32), st.sampled_from(profiles.PROFILES))
def test_nvfp4_backends_agree(values, profile):
    x = torch.tensor([values], dtype=torch.float32)
    ref = quantize_nvfp4(x, profile=profile, backend="reference")
    fast = quantize_nvfp4(x, profile=profile)
    assert_bytes_equal(fast.data, ref.data)
    assert_bytes_equal(fast.scale, ref.scale)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite32, min_size=32, max_size=32))
def test_mxfp8_backends_agree(values):
    x = torch.tensor([values], dtype=torch.float32)
    assert_bytes_equal(quantize_mxfp8(x).data, quantize_mxfp8(x, backend="reference").data)
    assert_bytes_equal(quantize_mxfp8(x).scale, quantize_mxfp8(x, backend="reference").scale)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=32, max_size=32))
def test_nvfp4_dequantize_error_bound(values):
    x = torch.tensor([values], dtype=torch.float32)
    q = quantize_nvfp4(x)
    outer = profiles.outer_scales(q.amax.reshape(1, 1), "te")
    factor = profiles.dequant_block_scale(q.scale, outer, "te").repeat_interleave(16, dim=1)
    ok = q.scale.repeat_interleave(16, dim=1) > 0  # underflowed blocks (scale 0) carry no bound
    err = (x - dequantize(q)).abs()
    assert (err[ok] <= factor[ok] * 1.01 + 1e-30).all()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=32, max_size=32))
def test_mxfp8_dequantize_error_bound(values):
    x = torch.tensor([values], dtype=torch.float32)
    q = quantize_mxfp8(x)
    scale = torch.ldexp(torch.ones(1), q.scale.int() - 127)
    err = (x - dequantize(q)).abs()
    # half an ulp of the largest binade (2^8 * scale -> ulp 2^5 * scale) bounds every element
    assert (err <= scale * 2.0**4 + 1e-30).all()
