"""The native kernels that take work off torch: outer scales computed in the NVFP4 kernel from
each unit's amax, a whole-tensor amax, non-finite counts, and the thread-local split setting.
Each is compared with the pure-torch specification, byte for byte."""

from __future__ import annotations

import pytest
import torch
from _helpers import adversarial, assert_bytes_equal, e2m1_risky_patterns

from fp4convert.checkpoint.reader import nonfinite_counts
from fp4convert.formats import kernels, profiles
from fp4convert.formats.codecs import e2m1_encode, nan_ignoring_abs
from fp4convert.formats.nvfp4 import nvfp4_matrix_reference

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
KERNEL_PROFILES = [p for p in profiles.PROFILES if profiles.profile_spec(p).chain != "pow2"]
FLT_MAX = torch.finfo(torch.float32).max
# Outer amaxes the scale chain treats specially: NaN (propagates), 0 (S_enc would be inf), a subnormal (S_enc
# overflows to inf -> FLT_MAX), huge and inf (S_enc underflows to 0 -> 1), -0.
EDGE_AMAXES = [float("nan"), 0.0, -0.0, 1e-45, 1e-40, 2.0**-126, 1.0, 3.0e38, FLT_MAX, float("inf")]


def _reference(x2d: torch.Tensor, unit_amax: torch.Tensor, unit_rows: int, profile: str, tile: str):
    per_row = unit_amax.repeat_interleave(unit_rows)
    return nvfp4_matrix_reference(x2d, per_row, profile, tile=tile)  # type: ignore[arg-type]


def _units(x2d: torch.Tensor, scope: str, experts: int) -> tuple[torch.Tensor, int]:
    rows = nan_ignoring_abs(x2d).amax(dim=-1)
    if scope == "tensor":
        return rows.amax().reshape(1), x2d.shape[0]
    if scope == "expert":
        return rows.reshape(experts, -1).amax(dim=1), x2d.shape[0] // experts
    return rows, 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", KERNEL_PROFILES)
@pytest.mark.parametrize("scope", ["tensor", "expert", "row"])
@pytest.mark.parametrize("tile", ["1x16", "16x16"])
def test_unit_kernel_equals_reference(dtype, profile, scope, tile):
    experts = 3
    x2d = adversarial((experts * 32, 272), dtype, 11)
    unit_amax, unit_rows = _units(x2d, scope, experts)
    data, scale = kernels.nvfp4_units(x2d, unit_amax, unit_rows, profile, tile16=tile == "16x16")
    want_data, want_scale = _reference(x2d, unit_amax, unit_rows, profile, tile)
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)


@pytest.mark.parametrize("profile", KERNEL_PROFILES)
@pytest.mark.parametrize("amax", EDGE_AMAXES)
def test_unit_kernel_edge_amaxes_equal_reference(profile, amax):
    # An imposed amax unrelated to the data: the outer-scale chain's every branch, on values that
    # overflow, underflow and round at the block scale too.
    x2d = adversarial((32, 64), torch.float32, 5)
    unit_amax = torch.tensor([amax, 2.5], dtype=torch.float32)
    data, scale = kernels.nvfp4_units(x2d, unit_amax, 16, profile)
    want_data, want_scale = _reference(x2d, unit_amax, 16, profile, "1x16")
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)


@pytest.mark.parametrize("profile", KERNEL_PROFILES)
def test_row_amax_adapter_takes_one_unit_for_an_expanded_amax(profile, monkeypatch):
    x2d = adversarial((48, 64), torch.bfloat16, 6)
    amax = nan_ignoring_abs(x2d).amax()
    seen: list[int] = []
    real = kernels.nvfp4_units

    def spy(x, unit_amax, unit_rows, *args, **kwargs):
        seen.append(unit_rows)
        return real(x, unit_amax, unit_rows, *args, **kwargs)

    monkeypatch.setattr(kernels, "nvfp4_units", spy)
    expanded = kernels.nvfp4_matrix(x2d, amax.reshape(1).expand(48), profile)
    materialized = kernels.nvfp4_matrix(x2d, amax.repeat(48), profile)
    assert seen == [48, 1]
    want_data, want_scale = _reference(x2d, amax.reshape(1), 48, profile, "1x16")
    for data, scale in (expanded, materialized):
        assert_bytes_equal(data, want_data)
        assert_bytes_equal(scale, want_scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_tensor_amax_equals_reference(dtype, seed):
    x = adversarial((1100, 1024), dtype, seed)  # over 1M elements: split into tasks, then combined
    if seed == 2:
        x.view(-1)[12345] = float("-inf")  # in one task only: its partial must win the combine
    got = kernels.tensor_amax(x)
    assert got is not None and got.shape == () and got.dtype == torch.float32
    assert_bytes_equal(got, nan_ignoring_abs(x).amax())


@pytest.mark.parametrize(
    "values",
    [[float("nan")] * 16, [-0.0] * 16, [0.0, -0.0] * 8, [1e-40, -2e-41] * 8],
    ids=["all-nan", "negative-zeros", "zeros", "subnormals"],
)
def test_native_tensor_amax_edge_values(values):
    x = torch.tensor(values, dtype=torch.float32).reshape(2, 8)
    got = kernels.tensor_amax(x)
    assert got is not None
    assert_bytes_equal(got, nan_ignoring_abs(x).amax())


def _torch_counts(t: torch.Tensor) -> dict[str, int]:
    counts = {"nan": int(torch.isnan(t).sum()), "inf": int(torch.isinf(t).sum())}
    return {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("dtype", DTYPES)
def test_native_nonfinite_counts_equal_torch(dtype):
    x = adversarial((64, 300), dtype, 3)
    flat = x.view(-1)
    flat[5::1013] = float("inf")
    flat[7::2029] = float("-inf")
    bits = flat.view(torch.int16 if dtype != torch.float32 else torch.int32)
    bits[11] = -1  # all ones: a NaN with the sign set and every mantissa bit
    assert kernels.nonfinite_counts(x) is not None
    assert nonfinite_counts(x) == _torch_counts(x)
    assert set(nonfinite_counts(x)) == {"nan", "inf"}
    assert nonfinite_counts(torch.ones(10, dtype=dtype) * torch.finfo(dtype).max) == {}


def test_nonfinite_counts_without_the_kernel_still_count():
    x = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], dtype=torch.float64).t()  # not contiguous
    assert kernels.nonfinite_counts(x) is None
    assert nonfinite_counts(x) == {"nan": 1, "inf": 1}


def test_split_only_above_keeps_small_tensors_in_the_calling_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        rows, cols = 2048, 1024  # 2M elements: split four ways by default
        assert len(kernels._row_tasks(rows, cols, 1, 2)) == 4
        with kernels.split_only_above(rows * cols * 2 + 1):
            assert kernels._row_tasks(rows, cols, 1, 2) == [(0, rows)]
            with kernels.split_only_above(rows * cols * 2):
                assert len(kernels._row_tasks(rows, cols, 1, 2)) == 4  # at the threshold: split
            assert kernels._row_tasks(rows, cols, 1, 2) == [(0, rows)]
        assert len(kernels._row_tasks(rows, cols, 1, 2)) == 4
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("profile", [p for p in KERNEL_PROFILES if profiles.profile_spec(p).chain != "4over6"])
def test_native_outer_decode_scales_equal_the_torch_chain(profile):
    # The global scale a checkpoint stores, from the kernel's chain, on every edge of it.
    amax = torch.tensor([*EDGE_AMAXES, 0.37, 448.0 * 6.0, 1e-20], dtype=torch.float32)
    got = kernels.outer_decode_scales(amax, profile)
    assert got is not None
    assert_bytes_equal(got, profiles.outer_scales(amax, profile).s_dec)
    one = kernels.outer_decode_scales(torch.tensor(3.5), profile)  # the 0-d amax of a tensor
    assert one is not None and one.shape == ()
    assert_bytes_equal(one, profiles.outer_scales(torch.tensor(3.5), profile).s_dec)


def test_native_outer_decode_scales_leave_other_cases_to_torch():
    assert kernels.outer_decode_scales(torch.tensor([1.0], dtype=torch.float64), "te") is None
    four_over_six = next(p for p in KERNEL_PROFILES if profiles.profile_spec(p).chain == "4over6")
    assert kernels.outer_decode_scales(torch.tensor([1.0]), four_over_six) is None


def test_small_inputs_take_the_gil_holding_handle_and_agree():
    # Below the threshold the kernels run without releasing the GIL: the same library, same bytes.
    small = adversarial((16, 64), torch.bfloat16, 3)
    assert small.numel() * 2 < kernels.HOLD_GIL_BELOW_BYTES
    assert kernels._lib(small.numel() * 2) is kernels._native_lib(True)
    assert kernels._lib(kernels.HOLD_GIL_BELOW_BYTES) is kernels._native_lib(False)
    amax = nan_ignoring_abs(small).amax().reshape(1)
    data, scale = kernels.nvfp4_units(small, amax, 16, "te")
    want_data, want_scale = _reference(small, amax, 16, "te", "1x16")
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", KERNEL_PROFILES)
def test_unit_kernel_block_scales_across_the_whole_e4m3_range(dtype, profile):
    # Blocks whose amax falls 2^0 .. 2^-33.5 below the tensor's, in half-octave steps: their E4M3
    # block scales run through the normal range, every subnormal (scale byte 1..7) and zero, where
    # the encode factor is clamped to FLT_MAX. Adversarial values rarely leave the normal range.
    g = torch.Generator().manual_seed(3)
    blocks = 68
    x = torch.rand(32, blocks * 16, generator=g) * 2 - 1
    x = x * torch.pow(2.0, -0.5 * torch.arange(blocks, dtype=torch.float32)).repeat_interleave(16)
    x[:, -16:] = 0.0  # an all-zero block
    x2d = x.to(dtype)
    unit_amax, unit_rows = _units(x2d, "tensor", 1)
    data, scale = kernels.nvfp4_units(x2d, unit_amax, unit_rows, profile)
    want_data, want_scale = _reference(x2d, unit_amax, unit_rows, profile, "1x16")
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)
    if dtype == torch.float32 and profiles.profile_spec(profile).chain in ("te", "te-2.13"):  # modelopt: >= 2^-9
        assert set(range(8)) <= set(scale.unique().tolist())  # zero and every subnormal scale occurred


@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt"])
def test_native_e2m1_rounding_equals_the_codec_on_risky_patterns(profile):
    # The kernel rounds to E2M1 with one float add on the bits (the GPU kernels' way). An outer amax of
    # 2688 and block amaxes of 6 give every block the factor 1 (scale byte 0x38), so the codes are the
    # rounding of the values themselves: every bf16 value, the patterns around each threshold, NaNs.
    bits = e2m1_risky_patterns()
    bits = torch.cat([bits, bits.new_zeros(-bits.numel() % 1024)])
    y = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32).reshape(-1, 1024)
    block_amax = torch.full((y.shape[0], 1024 // 16), 6.0)
    data, scale = kernels.nvfp4_units(y, torch.tensor([2688.0]), y.shape[0], profile, block_amax)
    assert bool((scale == 0x38).all())
    codes = e2m1_encode(y, signed_zero=profiles.profile_spec(profile).chain != "modelopt").to(torch.uint8)
    assert_bytes_equal(data, codes[:, 0::2] | (codes[:, 1::2] << 4))
