"""Scale layouts: TE padding, the 128x4 swizzle formula, and their inverses."""

from __future__ import annotations

import pytest
import torch

from fp4convert.errors import FormatError
from fp4convert.formats.layouts import from_layout, pad_scale, swizzle_scale, to_layout, unswizzle_scale


def _offset(r: int, c: int, cols: int) -> int:
    """docs/formats.md "Layouts": the cuBLAS / FlashInfer swizzled offset of padded element (r, c)."""
    return ((r // 128) * (cols // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def test_swizzle_matches_the_offset_formula():
    rows, cols = 256, 8
    padded = torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols)
    flat = swizzle_scale(padded).flatten()
    for r in range(rows):
        for c in range(cols):
            assert flat[_offset(r, c, cols)].item() == padded[r, c].item()


@pytest.mark.parametrize("shape", [(1, 4), (3, 7), (130, 9), (2, 200, 3)])
@pytest.mark.parametrize("layout", ["compact", "te-padded", "swizzled"])
def test_layout_round_trip(shape, layout):
    scale = torch.randint(0, 255, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = to_layout(scale, layout)
    assert torch.equal(from_layout(out, layout, shape), scale)


def test_padding_is_zero_and_shape_is_te():
    padded = pad_scale(torch.full((130, 9), 7, dtype=torch.uint8))
    assert padded.shape == (256, 12)
    assert padded[130:].eq(0).all() and padded[:, 9:].eq(0).all()


def test_unswizzle_inverts_swizzle():
    padded = torch.randint(0, 255, (384, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(unswizzle_scale(swizzle_scale(padded)), padded)


def test_swizzle_refuses_unpadded_input():
    with pytest.raises(FormatError, match=r"not a padded 2-D tile grid; pad it first"):
        swizzle_scale(torch.zeros(100, 4, dtype=torch.uint8))
