"""TE 4over6 profiles: worked examples derived by hand from TE's reference, edge cases, refusals.

The expected bytes below follow TE's ``NVFP4QuantizerRef`` 4over6 path step by step (the derivation
of the first example is in docs/formats.md, "4over6"); the kernels are compared with the reference
in test_kernels.py and test_cuda.py.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal, hexbytes

from fp4convert.errors import FormatError
from fp4convert.formats import dequantize, profiles
from fp4convert.formats.nvfp4 import four_over_six_choices, quantize_nvfp4

FOUR_OVER_SIX = list(profiles.FOUR_OVER_SIX_PROFILES)
BACKENDS = ["reference", "auto"]
NAN, INF = float("nan"), float("inf")


def _q(x: torch.Tensor, profile: str, backend: str, **kwargs):
    return quantize_nvfp4(x, profile=profile, backend=backend, **kwargs), four_over_six_choices(
        x, profile=profile, backend=backend, **kwargs
    )


def _row(*blocks: list[float]) -> torch.Tensor:
    return torch.tensor([[v for b in blocks for v in b]])


# Block [4, 1 x 15] in a tensor of amax 6. Map-to-6 (sf 288 = 0x79) encodes 4 as 6 and 1 as 1.5 and
# dequantizes them to 3.857 and 0.964; map-to-4 (sf 448 = 0x7E, encode multiplier 1.0) is exact.
FOUR_ONES = [4.0] + [1.0] * 15
SIX_ZEROS = [6.0] + [0.0] * 15


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_to_4_wins_where_it_is_exact(backend):
    plain = quantize_nvfp4(_row(FOUR_ONES, SIX_ZEROS), backend=backend)
    assert hexbytes(plain.scale) == "79 7e"
    assert hexbytes(plain.data) == "37 33 33 33 33 33 33 33 07 00 00 00 00 00 00 00"
    for profile in ("te-4over6-mae", "te-4over6-mse"):
        q, map4 = _q(_row(FOUR_ONES, SIX_ZEROS), profile, backend)
        assert hexbytes(q.scale) == "7e 7e"  # map-to-4's 672 saturates to 448 under the 448 bound
        assert hexbytes(q.data) == "26 22 22 22 22 22 22 22 07 00 00 00 00 00 00 00"
        assert map4.flatten().tolist() == [True, False]  # the amax block: both candidates 448, a tie
        assert q.global_decode_scale().item() == plain.global_decode_scale().item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_256_bound_changes_the_global_scale_and_keeps_map4_unsaturated(backend):
    for profile in ("te-4over6-mae-256", "te-4over6-mse-256"):
        q, map4 = _q(_row(FOUR_ONES, SIX_ZEROS), profile, backend)
        # S_enc = 1536 / 6 = 256: block 0 map-to-4 = 256 (0x78); block 1's candidates 256 and 384
        # (0x78 / 0x7C) are both exact, errors tie, and the tie goes to map-to-6 (0x78).
        assert hexbytes(q.scale) == "78 78"
        assert hexbytes(q.data) == "26 22 22 22 22 22 22 22 07 00 00 00 00 00 00 00"
        assert map4.flatten().tolist() == [True, False]
        assert q.global_decode_scale().item() == 1 / 256
        # dequantization uses 1/(6 * 256): TE's dequantize_fp4_kernel<..., 256>
        outer = profiles.outer_scales(q.amax.reshape(1, 1), profile)
        factor = profiles.dequant_block_scale(q.scale, outer, profile)
        inv = torch.div(torch.tensor(1.0), torch.tensor(1536.0))
        assert torch.equal(factor, (torch.tensor([[256.0, 256.0]]) * 6.0) * inv)


# A bf16 block where the two error measures disagree.
MAE_VS_MSE = [4.0, -2.75, -4.0, -3.0, -4.0, -2.75, -2.25, -0.5, 1.75, -3.75, -1.75, -1.25, -2.0, 3.75, 0.25, 2.75]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mae_and_mse_choose_differently(backend):
    x = _row(MAE_VS_MSE, SIX_ZEROS).to(torch.bfloat16)
    mae, mae_map4 = _q(x, "te-4over6-mae", backend)
    mse, mse_map4 = _q(x, "te-4over6-mse", backend)
    assert (mae_map4[0, 0].item(), mse_map4[0, 0].item()) == (True, False)
    assert hexbytes(mae.scale) == "7e 7e" and hexbytes(mse.scale) == "79 7e"
    assert hexbytes(mae.data[:, :8]) == "d6 de de 9c e4 ac 6c 50"
    assert hexbytes(mse.data[:, :8]) == "e7 ef ef ad f5 cd 7d 61"


@pytest.mark.parametrize("backend", BACKENDS)
def test_16x16_tiles_make_one_choice_from_the_summed_row_errors(backend):
    # Rows 0-7 alone prefer map-to-4 (exact); rows 8-15 ([4, 3.5 x 15]: 3.5 is a tie that map-to-4
    # rounds to 4) prefer map-to-6, and their larger errors decide the tile.
    x = torch.zeros(16, 32)
    x[:, 0] = 4.0
    x[:8, 1:16] = 1.0
    x[8:, 1:16] = 3.5
    x[0, 16] = 6.0
    rows, rows_map4 = _q(x, "te-4over6-mae", backend)
    tiles, tiles_map4 = _q(x, "te-4over6-mae", backend, tile="16x16")
    assert rows_map4[:, 0].tolist() == [True] * 8 + [False] * 8
    assert hexbytes(rows.scale[:, 0]) == " ".join(["7e"] * 8 + ["79"] * 8)
    assert tiles_map4.flatten().tolist() == [False] * 32
    assert hexbytes(tiles.scale[:, 0]) == " ".join(["79"] * 16)
    assert hexbytes(tiles.data[0]) == "37 33 33 33 33 33 33 33 07 00 00 00 00 00 00 00"
    assert hexbytes(tiles.data[8]) == "77 77 77 77 77 77 77 77 00 00 00 00 00 00 00 00"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("profile", FOUR_OVER_SIX)
def test_all_zero_blocks_give_zero_scales_and_keep_the_sign_of_zero(backend, profile):
    x = torch.zeros(2, 32)
    x[0, 5] = -0.0
    q, map4 = _q(x, profile, backend)
    assert hexbytes(q.scale) == "00 00 00 00"
    assert hexbytes(q.data[0, :8]) == "00 00 80 00 00 00 00 00"
    assert not map4.any()
    assert q.global_decode_scale().item() == 1.0  # A == 0 -> S_enc = 1, as TE's kernel


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_makes_both_errors_nan_and_the_block_takes_map_to_6(backend):
    x = _row([*FOUR_ONES[:15], NAN], SIX_ZEROS)
    q, map4 = _q(x, "te-4over6-mae", backend)
    assert map4.flatten().tolist() == [False, False]
    assert hexbytes(q.scale) == "79 7e"
    assert hexbytes(q.data[:, :8]) == "37 33 33 33 33 33 33 73"  # NaN encodes as +6 (0x7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_saturates(backend):
    q, map4 = _q(_row([INF] + [1.0] * 15), "te-4over6-mse", backend)
    assert q.amax.item() == INF and q.global_decode_scale().item() == 1.0  # S_enc = 1 for A = inf
    assert hexbytes(q.scale) == "7e" and hexbytes(q.data) == "07 00 00 00 00 00 00 00"
    assert not map4.any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp32_subnormals_are_not_flushed(backend):
    # A tensor of fp32 subnormals: S_enc = 2688 / 4e-39 overflows to FLT_MAX and S_dec = 1 / FLT_MAX
    # is itself subnormal (flushed to zero it would saturate every code to 0x7).
    x = torch.tensor([FOUR_ONES]) * 1e-39
    q, map4 = _q(x, "te-4over6-mae", backend)
    assert q.global_decode_scale().item() == 2.938735877055719e-39
    assert hexbytes(q.scale) == "2b" and hexbytes(q.data) == "13 11 11 11 11 11 11 11"
    assert map4.flatten().tolist() == [True]


@pytest.mark.parametrize("profile", FOUR_OVER_SIX)
def test_dequantize_round_trips_within_the_chosen_scale(profile):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    q = quantize_nvfp4(x, profile=profile)
    outer = profiles.outer_scales(q.amax.reshape(1, 1), profile)
    factor = profiles.dequant_block_scale(q.scale, outer, profile).repeat_interleave(16, dim=1)
    assert ((x - dequantize(q)).abs() <= factor * 1.01).all()


def test_4over6_lowers_the_error_it_measures():
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    err = {p: (dequantize(quantize_nvfp4(x, profile=p)) - x.float()) for p in ("te-2.13", "te-4over6-mse")}
    assert err["te-4over6-mse"].square().sum() < err["te-2.13"].square().sum()
    map4 = four_over_six_choices(x, profile="te-4over6-mse")
    assert 0.05 < map4.float().mean().item() < 0.95  # both candidates are taken on real data


def test_row_scaled_4over6_refuses_a_columnwise_copy():
    with pytest.raises(FormatError, match=r"row-scaled 4over6 tensor has no column-wise copy"):
        quantize_nvfp4(torch.ones(16, 32), profile="te-4over6-mae", scope="row", columnwise=True)


def test_choices_need_a_4over6_profile():
    with pytest.raises(FormatError, match=r"profile 'te' has no candidate choice"):
        four_over_six_choices(torch.ones(1, 16), profile="te")


def test_single_chain_helpers_refuse_4over6():
    outer = profiles.outer_scales(torch.ones(1, 1), "te-4over6-mae")
    with pytest.raises(FormatError, match=r"use profiles.quantize_blocks"):
        profiles.block_scale_bytes(torch.ones(1, 1), outer, "te-4over6-mae")


def test_profile_names_compose_from_mode_and_bound():
    assert profiles.four_over_six_profile("mae", 448) == "te-4over6-mae"
    assert profiles.four_over_six_profile("mse", 256) == "te-4over6-mse-256"
    assert set(profiles.FOUR_OVER_SIX_PROFILES) | set(profiles.BASE_PROFILES) == set(profiles.PROFILES)
    with pytest.raises(FormatError, match=r"no 4over6 profile for error 'max'"):
        profiles.four_over_six_profile("max", 448)


def test_imposed_scales_follow_the_chain():
    amax = torch.tensor([[15.0]])
    g = torch.tensor([[179.2]])
    exact = profiles.outer_scales(amax, "te")
    enc = profiles.outer_scales(amax, "te", encode_scale=g)
    assert enc.s_enc.item() == pytest.approx(179.2) and enc.s_dec.item() == torch.div(1.0, g).item()
    assert enc.mult.item() == (g * torch.div(torch.tensor(1.0), torch.tensor(6.0))).item()
    dec = profiles.outer_scales(amax, "te", decode_scale=g)
    assert dec.s_dec.item() == pytest.approx(179.2) and torch.equal(dec.mult, exact.mult)
    mo = profiles.outer_scales(amax, "modelopt", decode_scale=g)
    assert mo.mult.item() == (g * 6.0).item()
    with pytest.raises(FormatError, match="no encode scale"):
        profiles.outer_scales(amax, "modelopt", encode_scale=g)


@pytest.mark.parametrize("profile", FOUR_OVER_SIX)
def test_quantize_blocks_is_the_chain_quantize_nvfp4_uses(profile):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(6))
    q = quantize_nvfp4(x, profile=profile, tile="16x16", backend="reference")
    from fp4convert.formats.codecs import nan_ignoring_abs, pack_fp4
    from fp4convert.formats.nvfp4 import tile_amax

    outer = profiles.outer_scales(nan_ignoring_abs(x).amax().reshape(1, 1).expand(32, 1), profile)
    codes, scale, map4 = profiles.quantize_blocks(x.reshape(32, 4, 16), tile_amax(x), outer, profile, tile_rows=16)
    assert_bytes_equal(scale, q.scale)
    assert_bytes_equal(pack_fp4(codes.reshape(32, 64)), q.data)
    assert map4 is not None and torch.equal(map4, four_over_six_choices(x, profile=profile, tile="16x16"))
