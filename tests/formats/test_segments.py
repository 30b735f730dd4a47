"""Grouped quantization (fp4convert.formats.segments): every segment's bytes are the per-tensor
quantizer's, on the CPU kernel, the gathering path and (tests/formats/test_cuda.py) the GPU."""

from __future__ import annotations

import pytest
import torch
from _helpers import adversarial, assert_bytes_equal

from fp4convert.errors import FormatError
from fp4convert.formats.mxfp8 import mxfp8_matrix_reference
from fp4convert.formats.nvfp4 import nvfp4_matrix_reference
from fp4convert.formats.segments import SegmentLayout, Sources, mxfp8_segments, nvfp4_segments, segment_amax, unit_amax


def group(dtype: torch.dtype, device: str = "cpu") -> tuple[list[torch.Tensor], list[int]]:
    """Separate tensors, row slices of one tensor and rows with a stride wider than the row; units
    shared by the first two segments and by the last two."""
    big = adversarial((64, 160), dtype, seed=8).to(device)[:, :128]
    parts = [
        adversarial((32, 128), dtype, seed=5).to(device),
        (adversarial((48, 128), dtype, seed=6) * 3).to(device),
        adversarial((16, 128), dtype, seed=7).to(device),
        big[:32],
        big[32:],
    ]
    return parts, [0, 0, 1, 2, 2]


def reference_amax(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return torch.where(x.isnan(), torch.zeros_like(x), x.abs()).amax()


def check_nvfp4(parts: list[torch.Tensor], units: list[int], profile: str, tile: str) -> None:
    layout = SegmentLayout.of([p.shape[0] for p in parts], units, cols=128)
    sources = Sources(layout).bind(parts)
    amax = unit_amax(sources)
    for u in range(layout.num_units):
        members = [p for p, unit in zip(parts, units, strict=True) if unit == u]
        assert_bytes_equal(amax[u], torch.stack([reference_amax(p) for p in members]).amax().to(amax.device))
    data = torch.empty(layout.total_rows, 64, dtype=torch.uint8, device=parts[0].device)
    scale = torch.empty(layout.total_rows, 8, dtype=torch.uint8, device=parts[0].device)
    nvfp4_segments(sources, amax, profile, tile=tile, data=data, scale=scale)
    for p, unit, row in zip(parts, units, layout.out_rows, strict=True):
        rows = p.shape[0]
        want_data, want_scale = nvfp4_matrix_reference(
            p.cpu().contiguous(), amax[unit].cpu().expand(rows), profile, tile=tile
        )
        assert_bytes_equal(data[row : row + rows], want_data)
        assert_bytes_equal(scale[row : row + rows], want_scale)


def check_mxfp8(parts: list[torch.Tensor]) -> None:
    layout = SegmentLayout.of([p.shape[0] for p in parts], cols=128)
    sources = Sources(layout).bind(parts)
    data = torch.empty(layout.total_rows, 128, dtype=torch.uint8, device=parts[0].device)
    scale = torch.empty(layout.total_rows, 4, dtype=torch.uint8, device=parts[0].device)
    mxfp8_segments(sources, data=data, scale=scale)
    want_data, want_scale = mxfp8_matrix_reference(torch.cat([p.cpu() for p in parts]))
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt", "te-4over6-mse", "te-4over6-mae-256"])
@pytest.mark.parametrize("tile", ["1x16", "16x16"])
def test_nvfp4_segments_equal_the_per_tensor_quantizer(dtype, profile, tile):
    check_nvfp4(*group(dtype), profile, tile)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp8_segments_equal_the_per_tensor_quantizer(dtype):
    check_mxfp8(group(dtype)[0])


def test_segment_amax_ignores_nan_and_keeps_inf():
    a = torch.tensor([[1.0, float("nan")] * 8], dtype=torch.bfloat16)
    b = torch.tensor([[float("-inf"), 2.0] * 8], dtype=torch.bfloat16)
    sources = Sources(SegmentLayout.of([1, 1], cols=16)).bind([a, b])
    assert segment_amax(sources).tolist() == [1.0, float("inf")]


def test_tensors_that_do_not_fit_the_group_are_refused():
    layout = SegmentLayout.of([4, 4], cols=16)
    with pytest.raises(FormatError, match=r"2 tensors for a group of 2 segments|does not fit"):
        Sources(layout).bind([torch.zeros(4, 16), torch.zeros(4, 32)])
    with pytest.raises(FormatError, match=r"does not fit its group"):
        Sources(layout).bind([torch.zeros(4, 16), torch.zeros(16, 4).t()])
    with pytest.raises(FormatError, match=r"share dtype and device"):
        Sources(layout).bind([torch.zeros(4, 16), torch.zeros(4, 16, dtype=torch.bfloat16)])
    sources = Sources(SegmentLayout.of([4, 4], cols=16)).bind([torch.zeros(4, 16), torch.zeros(4, 16)])
    with pytest.raises(FormatError, match=r"output buffers"):
        nvfp4_segments(sources, torch.ones(2), "te", tile="1x16", data=torch.empty(8, 4, dtype=torch.uint8),
                       scale=torch.empty(8, 1, dtype=torch.uint8))  # fmt: skip
    with pytest.raises(FormatError, match=r"cannot take 16x16"):
        odd = Sources(SegmentLayout.of([8, 8], cols=16)).bind([torch.zeros(8, 16), torch.zeros(8, 16)])
        nvfp4_segments(odd, torch.ones(2), "te", tile="16x16", data=torch.empty(16, 8, dtype=torch.uint8),
                       scale=torch.empty(16, 1, dtype=torch.uint8))  # fmt: skip
