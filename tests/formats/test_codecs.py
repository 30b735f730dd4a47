"""Element and scale codecs, one test per E2M1 code point (filter with -k fp4_code_3)."""

from __future__ import annotations

import pytest
import torch

from fp4convert.formats.codecs import (
    E2M1_VALUES,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    e8m0_decode,
    e8m0_encode_roundup,
    e8m0_inverse,
    pack_fp4,
    unpack_fp4,
)

# code -> inputs that must encode to it; ties go to the even code:
# 0.25 -> 0 (0.0), 0.75 -> 2 (1.0), 1.25 -> 2 (1.0), 1.75 -> 4 (2.0), 2.5 -> 4 (2.0),
# 3.5 -> 6 (4.0), 5.0 -> 6 (4.0); everything above 5 saturates to 7 (6.0).
E2M1_CASES = {
    0: [0.0, 0.1, 0.25],
    1: [0.2500001, 0.5, 0.7499999],
    2: [0.75, 1.0, 1.25],
    3: [1.2500001, 1.5, 1.7499999],
    4: [1.75, 2.0, 2.5],
    5: [2.5000002, 3.0, 3.4999998],
    6: [3.5, 4.0, 5.0],
    7: [5.0000005, 6.0, 6.5, 1e30, float("inf")],
}


@pytest.mark.parametrize("code", sorted(E2M1_CASES), ids=[f"fp4_code_{c}" for c in sorted(E2M1_CASES)])
def test_e2m1_code_points(code):
    values = torch.tensor(E2M1_CASES[code], dtype=torch.float32)
    assert e2m1_encode(values).tolist() == [code] * len(values)
    assert e2m1_encode(-values).tolist() == [code | 8] * len(values)
    assert e2m1_decode(torch.tensor([code], dtype=torch.uint8)).item() == E2M1_VALUES[code]


def test_e2m1_sign_and_nan_rules():
    y = torch.tensor([-0.0, 0.0, float("nan"), -float("nan")])
    assert e2m1_encode(y).tolist() == [0x8, 0x0, 0x7, 0x7]
    assert e2m1_encode(y, signed_zero=False).tolist() == [0x0, 0x0, 0x7, 0x7]


def test_representable_values_are_fixed_points():
    values = torch.tensor(E2M1_VALUES)
    assert torch.equal(e2m1_decode(e2m1_encode(values)), values)


def test_pack_puts_even_element_in_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x0]], dtype=torch.uint8)
    assert pack_fp4(codes).tolist() == [[0x21, 0x0F]]
    assert torch.equal(unpack_fp4(pack_fp4(codes)), codes)


def test_e4m3_encode_matches_torch_cast_on_every_bf16_value():
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).float()
    x = x[~x.isnan()]
    ours = e4m3_encode(x)
    expected = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(ours, expected)


def test_e4m3_saturation_subnormals_and_nan():
    d = torch.tensor(
        [448.0, 463.9, 464.0, 1e30, float("inf"), 2.0**-9, 2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10, float("nan")]
    )
    assert e4m3_encode(d).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x01, 0x00, 0x02, 0x02, 0x7F]
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)
    assert torch.equal(e4m3_encode(e4m3_decode(codes)), codes)


@pytest.mark.parametrize(
    ("v", "e"),
    [
        (0.0, 0x00),
        (2.0**-127, 0x00),  # exactly 2^-127 (subnormal, mantissa 0x400000) stays
        (2.0**-127 * 1.5, 0x01),  # above 2^-127 rounds up to 2^-126
        (1.0, 0x7F),
        (1.0000001, 0x80),
        (0.0022321430, 0x77),
        (2.0**127, 0xFE),
        (3e38, 0xFE),  # above 2^127: satfinite
        (float("inf"), 0xFE),
        (float("nan"), 0xFF),
    ],
)
def test_e8m0_round_up_rule(v, e):
    assert e8m0_encode_roundup(torch.tensor([v], dtype=torch.float32)).item() == e


def test_e8m0_decode_and_inverse_are_exact_powers_of_two():
    e = torch.arange(0, 255, dtype=torch.uint8)
    assert torch.equal(e8m0_decode(e), torch.ldexp(torch.ones(255), e.int() - 127))
    assert torch.equal(e8m0_inverse(e), torch.ldexp(torch.ones(255), 127 - e.int()))
    assert e8m0_inverse(torch.tensor([254], dtype=torch.uint8)).item() == 2.0**-127
    assert e8m0_decode(torch.tensor([255], dtype=torch.uint8)).isnan().all()
