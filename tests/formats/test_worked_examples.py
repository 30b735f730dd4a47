"""Every worked example of docs/formats.md "Worked examples", as a byte-level test (both backends)."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal, from_hex, hexbytes

from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

BACKENDS = ["reference", "auto"]
BF16_MAX = torch.finfo(torch.bfloat16).max
FP32_MAX = torch.finfo(torch.float32).max


def _row(block: list[float], other: float | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One row: the example block, plus a second block holding the global amax if it comes from elsewhere."""
    values = list(block) + ([other] + [0.0] * 15 if other is not None else [])
    return torch.tensor([values], dtype=torch.float32).to(dtype)


# (id, block values, amax from another block, dtype, scale byte, data bytes of the example block)
NVFP4_EXAMPLES = [
    (
        "Ex1",
        [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, -6],
        None,
        torch.float32,
        0x7E,
        "00 21 22 43 44 65 66 f7",
    ),
    ("Ex1b", [0.0625 * i for i in range(16)], None, torch.float32, 0x7E, "10 22 43 54 65 66 76 77"),
    ("Ex2a", [0.1 * i for i in range(16)], 10.0, torch.float32, 0x68, "10 32 43 55 65 66 77 77"),
    ("Ex2b", [10 - 0.5 * i for i in range(16)], None, torch.float32, 0x7E, "77 77 66 66 56 55 44 34"),
    ("Ex3", [0.0] * 16, None, torch.float32, 0x00, "00 00 00 00 00 00 00 00"),
    ("Ex4", [BF16_MAX] * 16, None, torch.bfloat16, 0x7E, "77 77 77 77 77 77 77 77"),
    ("Ex5", [FP32_MAX] * 16, None, torch.float32, 0x7E, "77 77 77 77 77 77 77 77"),
    ("Ex6", [1e-6 * (i - 8) for i in range(16)], 1000.0, torch.float32, 0x00, "ff ff ff ff 70 77 77 77"),
    ("fp16-max", [65504.0] * 16, None, torch.float16, 0x7E, "77 77 77 77 77 77 77 77"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("block", "other", "dtype", "scale", "data"),
    [e[1:] for e in NVFP4_EXAMPLES],
    ids=[e[0] for e in NVFP4_EXAMPLES],
)
def test_nvfp4_block_examples(block, other, dtype, scale, data, backend):
    q = quantize_nvfp4(_row(block, other, dtype), backend=backend)
    assert q.scale[0, 0].item() == scale
    assert hexbytes(q.data[0, :8]) == data


@pytest.mark.parametrize("backend", BACKENDS)
def test_ex7_scale_tie_depends_on_profile(backend):
    # Block amax 5.0625, global amax 13.5: TE's d = 168.00002 rounds up to 176 (0x73); ModelOpt's
    # and TE <= 2.13's chain lands exactly on the tie 168.0, which goes to even: 160 (0x72).
    x = _row([5.0625] + [0.0] * 15, 13.5, torch.bfloat16)
    assert quantize_nvfp4(x, backend=backend).scale[0, 0].item() == 0x73
    assert quantize_nvfp4(x, profile="modelopt", backend=backend).scale[0, 0].item() == 0x72
    assert quantize_nvfp4(x, profile="te-2.13", backend=backend).scale[0, 0].item() == 0x72


@pytest.mark.parametrize("backend", BACKENDS)
def test_ex8_ex9_encode_chain(backend):
    # Global amax 9: block 0 (amax 3.5) gets sf 0x73 = 176, block 1 (amax 4) gets 0x74 = 192.
    row = [3.5, 2.0625] + [0.0] * 14 + [4.0, 1.125] + [0.0] * 14 + [9.0] + [0.0] * 15
    x = torch.tensor([row])
    te = quantize_nvfp4(x, backend=backend)
    mo = quantize_nvfp4(x, profile="modelopt", backend=backend)
    assert te.scale[0, :2].tolist() == [0x73, 0x74]
    # Ex8: TE enc = 1/(176*S_dec) = 1.6969696, 2.0625*enc = 3.4999998 -> 3.0 (code 5);
    # ModelOpt divides: 2.0625/(176*s2) = 3.5, a tie -> 4.0 (code 6).
    assert te.data[0, 0].item() >> 4 == 0x5
    assert mo.data[0, 0].item() >> 4 == 0x6
    # Ex9: TE enc = 1.5555556, 1.125*enc = 1.75 -> 2.0 (code 4); S_enc/sf would give code 3.
    assert te.data[0, 8].item() >> 4 == 0x4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_te_boundary_fixture(dtype, backend):
    base = torch.linspace(-12, 12, 64, dtype=torch.float32)
    row = torch.stack((base - 1e-3, base + 1e-3), dim=1).flatten()
    x = row.repeat(16, 1).to(dtype)
    q = quantize_nvfp4(x, backend=backend)
    assert q.amax.item() == pytest.approx(12.001 if dtype == torch.float32 else 12.0, abs=1e-6)
    assert hexbytes(q.scale[0]) == "7e 7a 76 6d 6d 76 7a 7e"
    expected = (
        "ff ff ff ff ff ff ee ee ff ff ff ff ff ee ee ee ff ff ff ee ee ee ee dd ff ff ee ee dd cc aa 99 "
        "11 22 44 55 66 66 77 77 55 66 66 66 66 77 77 77 66 66 66 77 77 77 77 77 66 66 77 77 77 77 77 77"
    )
    assert_bytes_equal(q.data, from_hex(expected).repeat(16, 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_scaled_example(backend):
    x = torch.tensor([[0.05 * i for i in range(16)] + [1.0] * 16, [5.0 * i for i in range(16)] + [-100.0] * 16])
    g = quantize_nvfp4(x, backend=backend)
    assert g.amax.item() == 100.0
    assert hexbytes(g.scale) == "45 49 7a 7e"
    assert hexbytes(g.data[0]) == "10 22 43 54 65 66 76 77 " + " ".join(["77"] * 8)
    assert hexbytes(g.data[1]) == "10 32 43 55 65 66 77 77 " + " ".join(["ff"] * 8)
    r = quantize_nvfp4(x, scope="row", backend=backend)
    assert r.amax.tolist() == [1.0, 100.0]
    assert hexbytes(r.scale) == "7a 7e 7a 7e"
    assert hexbytes(r.data[0]) == "10 32 43 55 65 66 77 77 " + " ".join(["77"] * 8)
    assert_bytes_equal(r.data[1], g.data[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_2d_tile_example(backend):
    j = torch.arange(16)
    x = (0.5 * ((j % 5) - 2)).float().repeat(16, 1)
    x[5, 7] = 12.0  # the outlier sets both the global and the tile amax
    one_d = quantize_nvfp4(x, backend=backend)
    two_d = quantize_nvfp4(x, tile="16x16", backend=backend)
    assert one_d.scale[0, 0].item() == 0x61
    assert hexbytes(one_d.data[0]) == "df 50 f7 0d 75 df 50 f7"
    assert two_d.scale[:, 0].tolist() == [0x7E] * 16
    assert hexbytes(two_d.data[0]) == "89 00 91 08 10 89 00 91"


@pytest.mark.parametrize("backend", BACKENDS)
def test_columnwise_example(backend):
    # X[i, j] = i with amax 15: the amax where 2688.0 / A (a reciprocal) and 2688 / A (IEEE) differ.
    x = torch.arange(16, dtype=torch.float32).unsqueeze(1).repeat(1, 16)
    q = quantize_nvfp4(x, rowwise=True, columnwise=True, backend=backend)
    assert hexbytes(q.scale[:, 0]) == "00 5f 67 6b 6f 71 73 75 77 78 79 7a 7b 7c 7d 7e"
    assert hexbytes(q.data[1]) == " ".join(["77"] * 8)
    assert q.scale_t.flatten().tolist() == [0x7E] * 16
    assert_bytes_equal(q.data_t, from_hex("10 22 43 54 65 66 76 77").repeat(16, 1))


def test_global_scale_uses_ieee_division_not_reciprocal():
    from fp4convert.formats.profiles import outer_scales

    amax = torch.tensor(15.0)
    assert outer_scales(amax, "te").s_enc.item() == 179.1999969482422
    assert (2688.0 / amax).item() == 179.20001220703125  # the trap docs/formats.md "Pitfalls" warns of


# (id, block values (rest zero), dtype, E8M0 byte, leading data bytes)
MXFP8_EXAMPLES = [
    ("M1", [1.0] * 32, torch.float32, 0x77, "78"),
    ("M2", [448.0, 1.0], torch.float32, 0x7F, "7e 38"),
    ("M3", [449.0, 0.3, -7.0, 0.0], torch.float32, 0x80, "76 22 c6 00"),
    ("M4", [0.0], torch.float32, 0x00, "00"),
    ("M5", [BF16_MAX] * 32, torch.bfloat16, 0xF7, "78"),
    ("M6", [FP32_MAX] * 32, torch.float32, 0xF7, "78"),
    ("M7", [1e-40], torch.float32, 0x00, "09"),
    ("M8", [3.0, 0.1, -0.0625, 2.75], torch.float32, 0x78, "7c 55 d0 7b"),
    ("M9", [56.0, 55.0, 1 / 3], torch.float32, 0x7C, "7e 7e 43"),
    ("fp16-max", [65504.0] * 32, torch.float16, 0x87, "78"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("block", "dtype", "scale", "data"), [e[1:] for e in MXFP8_EXAMPLES], ids=[e[0] for e in MXFP8_EXAMPLES]
)
def test_mxfp8_examples(block, dtype, scale, data, backend):
    values = (list(block) + [0.0] * 32)[:32]
    x = torch.tensor([values], dtype=torch.float32).to(dtype)
    q = quantize_mxfp8(x, backend=backend)
    assert q.scale[0, 0].item() == scale
    n = len(data.split())
    assert hexbytes(q.data[0, :n]) == data
