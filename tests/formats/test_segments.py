"""Grouped quantization (fp4convert.formats.segments): every segment's bytes are the per-tensor
quantizer's, on the CPU kernel, the gathering path and (tests/formats/test_cuda.py) the GPU."""

from __future__ import annotations

import pytest
import torch
from _helpers import check_mxfp8_segments as check_mxfp8
from _helpers import check_nvfp4_segments as check_nvfp4
from _helpers import segment_group as group

from fp4convert.errors import FormatError
from fp4convert.formats.segments import SegmentLayout, Sources, nvfp4_segments, segment_amax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("profile", ["te", "te-2.13", "modelopt", "te-4over6-mse", "te-4over6-mae-256", "mxfp4-cast"])
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


def test_address_tables_refuse_rows_off_16_byte_boundaries():
    # the segment kernels are compiled for 16-byte-aligned row starts and strides (tl.multiple_of)
    layout = SegmentLayout.of([4, 4], cols=16)
    aligned = torch.zeros(4, 16, dtype=torch.bfloat16)
    ptrs, lds = Sources(layout).bind([aligned, torch.zeros(4, 16, dtype=torch.bfloat16)]).device_tables()
    assert lds.tolist() == [16, 16] and ptrs.tolist()[0] == aligned.data_ptr()
    shifted = torch.zeros(1 + 64, dtype=torch.bfloat16)[1:].view(4, 16)  # starts 2 bytes past a boundary
    padded = torch.zeros(4, 24, dtype=torch.bfloat16)[:, :16]  # a row stride of 24 elements
    for odd in (shifted, padded):
        with pytest.raises(FormatError, match=r"16-byte boundaries"):
            Sources(layout).bind([aligned, odd]).device_tables()


def test_address_tables_are_read_once_per_bind_and_again_at_the_next():
    # a call's launches share one read of the addresses; the next bind of the same tensors reads
    # them again, so a parameter whose storage moved (``param.data = ...``) is found where it is now
    from fp4convert.megatron.groups import bind_segments

    layout = SegmentLayout.of([4, 4], cols=16)
    a, b = torch.zeros(4, 16, dtype=torch.bfloat16), torch.zeros(4, 16, dtype=torch.bfloat16)
    sources = Sources(layout).bind([a, b])
    ptrs, _ = sources.device_tables()
    old = a.data_ptr()
    a.data = torch.ones(4, 16, dtype=torch.bfloat16)
    assert sources.device_tables()[0] is ptrs and ptrs.tolist()[0] == old  # the same call
    assert sources.bind([a, b]).device_tables()[0].tolist() == [a.data_ptr(), b.data_ptr()]
    segments = [("a", None, 0), ("b", None, 0)]
    with pytest.MonkeyPatch.context() as patch:  # the GPU's path: binds read the address tables
        patch.setattr("fp4convert.megatron.groups.reads_by_address", lambda device: True)
        assert bind_segments(sources, segments, [a, b])  # bound as themselves: the next bind is the fast one
        b.data = torch.ones(4, 16, dtype=torch.bfloat16)
        assert bind_segments(sources, segments, [a, b])
    assert sources.device_tables()[0].tolist() == [a.data_ptr(), b.data_ptr()]
    # moved onto every other column of a wider tensor (same shape, aligned rows, elements 2 apart),
    # or onto memory of another shape: the same objects are checked again, and refused
    a.data = torch.zeros(4, 32, dtype=torch.bfloat16)[:, ::2]
    sources.again()
    with pytest.raises(FormatError, match="contiguous"):  # the address table checks what it reads
        sources.device_tables()
    with pytest.raises(FormatError, match="does not fit"):
        sources.bind([a, b])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fp4convert.megatron.groups.reads_by_address", lambda device: True)
        assert not bind_segments(sources, segments, [a, b])  # the caller gathers the rows instead
    a.data = torch.zeros(4, 16, dtype=torch.bfloat16)
    sources.bind([a, b])
    b.data = torch.zeros(8, 16, dtype=torch.bfloat16)  # the same object, another shape
    with pytest.raises(FormatError, match="does not fit"):
        sources.bind([a, b])


def test_the_same_tensor_objects_are_checked_again_at_each_bind():
    # param.data = ... can give a bound parameter another dtype: the GPU kernel reads a group in one
    # dtype, so a group of mixed dtypes is refused (the caller gathers its rows instead)
    from fp4convert.megatron.groups import bind_segments

    layout = SegmentLayout.of([4, 4], cols=16)
    a, b = torch.zeros(4, 16, dtype=torch.bfloat16), torch.zeros(4, 16, dtype=torch.bfloat16)
    sources = Sources(layout)
    segments = [("a", None, 0), ("b", None, 0)]
    assert bind_segments(sources, segments, [a, b]) and sources.bound_from == [a, b]
    b.data = b.float()
    with pytest.raises(FormatError, match="share dtype"):
        sources.bind([a, b])
    assert not bind_segments(sources, segments, [a, b])


def test_equal_layouts_are_one_object_while_in_use_and_share_their_tables():
    import gc

    first = SegmentLayout.of([768, 768, 40], [0, 0, 1], cols=64)
    tables = first.tables(torch.device("cpu"))
    again = SegmentLayout.of((768, 768, 40), (0, 0, 1), cols=64)
    assert again is first and again.tables(torch.device("cpu")) is tables
    assert SegmentLayout.of([768, 768, 40], [0, 1, 2], cols=64) is not first  # other units
    assert SegmentLayout.of([768, 768, 40], [0, 0, 1], cols=128) is not first  # other width
    # the block table: (segment, first row) of every 16-row block, a short last block included
    blocks = [[s, r] for s, rows in enumerate((768, 768, 40)) for r in range(0, rows, 16)]
    assert tables["tab"].dtype == torch.int32 and tables["tab"].tolist() == blocks
    del first, again, tables
    gc.collect()
    fresh = SegmentLayout.of([768, 768, 40], [0, 0, 1], cols=64)
    assert fresh._device == {}  # nothing kept once no group held it (built anew)
