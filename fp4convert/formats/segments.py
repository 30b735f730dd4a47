"""Grouped quantization: many 2-D tensors quantized together, read where they are (docs/formats.md, "Segments").

A live weight sync quantizes tens of thousands of tensors of a few shapes. Doing them one call each
costs a launch, a host round trip and Python per tensor, so here a *group* of tensors with one
width and dtype is one :class:`SegmentLayout`: each *segment* (a run of rows of one source tensor:
an expert's ``linear_fc1``, one query group of ``linear_qkv``) is written at fixed rows of one
output matrix, whose row ranges are then the per-tensor outputs. Each segment belongs to a *unit*,
the tensors sharing one NVFP4 outer amax (gate/up, q/k/v); the unit amaxes are a device vector
(:func:`unit_amax`), never read back. Quantization is row-independent given the row's outer amax,
and 16x16 tiles never straddle segments (their rows are multiples of 16), so every segment's bytes
are exactly the per-tensor quantizer's (tests/formats/test_segments.py).

On CUDA one Triton launch covers a group (``_triton_segments``: a table of ``(segment, row)``
blocks, source addresses loaded from a device table); on the CPU the native kernel runs per
segment straight from the source's memory, segments spread over the kernel threads. 4over6
profiles gather the group into one matrix and use the per-row kernels.
"""

from __future__ import annotations

import array
import functools
import itertools
import operator
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import torch

from fp4convert.errors import FormatError
from fp4convert.formats import kernels, profiles
from fp4convert.formats.mxfp8 import mxfp8_matrix
from fp4convert.formats.nvfp4 import nvfp4_matrix
from fp4convert.formats.nvfp4 import row_amax as nvfp4_row_amax
from fp4convert.formats.spec import KERNEL_BLOCK_ROWS as BLOCK_ROWS
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.formats.uploads import upload

__all__ = [
    "SegmentLayout",
    "Sources",
    "mxfp8_segments",
    "nvfp4_segment_mismatches",
    "nvfp4_segments",
    "reads_by_address",
    "segment_amax",
    "unit_amax",
]

#: block chains the segment kernels (CPU and CUDA) implement
_SEGMENT_CHAINS = frozenset(kernels.PROFILE_CODES) - {"4over6"}

_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_DEVICE = operator.attrgetter("device")


@dataclass
class SegmentLayout:
    """Where each segment of a group goes, fixed once per model layout.

    Attributes:
        cols: the width every segment shares.
        rows: rows of each segment.
        out_rows: first output row of each segment.
        units: outer-amax unit of each segment (``0 .. num_units - 1``).
        num_units: how many units.
        total_rows: rows of the output matrix.
    """

    cols: int
    rows: tuple[int, ...]
    out_rows: tuple[int, ...]
    units: tuple[int, ...]
    num_units: int
    total_rows: int
    _device: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, rows: Sequence[int], units: Sequence[int] | None = None, *, cols: int) -> SegmentLayout:
        """Segments of ``rows`` stacked in order; ``units`` default to one per segment.

        Equal layouts are one object while any is in use (every decoder layer's experts have the
        same one), so a model's device tables are built and uploaded once per distinct layout, not
        once per group: on a 48-layer MoE that was most of an exporter's first sync.

        Example:
            >>> layout = SegmentLayout.of([768, 768, 2048], [0, 0, 1], cols=2048)
            >>> layout.out_rows, layout.total_rows, layout.num_units
            ((0, 768, 1536), 3584, 2)
            >>> SegmentLayout.of([768, 768, 2048], [0, 0, 1], cols=2048) is layout
            True
        """
        the_rows = tuple(rows)
        the_units = tuple(units) if units is not None else tuple(range(len(the_rows)))
        key = (cols, the_rows, the_units)
        with _INTERNED_LOCK:
            layout = _INTERNED.get(key)
            if layout is None:
                starts = tuple(itertools.accumulate(the_rows, initial=0))
                layout = cls(cols, the_rows, starts[:-1], the_units, max(the_units, default=-1) + 1, starts[-1])
                _INTERNED[key] = layout
        return layout

    def tables(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Static device tables: the ``(segment, first row)`` block table and per-segment rows,
        output rows and units (built once per device, one copy)."""
        key = str(device)
        if key not in self._device:
            ints = {
                "tab": _block_table(self.rows),
                "rows": torch.tensor(self.rows, dtype=torch.int32),
                "out": torch.tensor(self.out_rows, dtype=torch.int32),
                "unit": torch.tensor(self.units, dtype=torch.int64),
                "unit32": torch.tensor(self.units, dtype=torch.int32),
            }
            self._device[key] = dict(zip(ints, upload(list(ints.values()), device), strict=True))
        return self._device[key]

    def row_units(self, device: torch.device) -> torch.Tensor:
        """Each row's unit (int64), for the paths without a segment kernel on the device (built
        once per device; the Triton kernels never need it, and it is the largest table)."""
        key = f"row_unit:{device}"
        if key not in self._device:
            rows = torch.repeat_interleave(torch.tensor(self.units, dtype=torch.int64), torch.tensor(self.rows))
            self._device[key] = {"row_unit": upload([rows], device)[0]}
        return self._device[key]["row_unit"]

    def make_tables(self, device: torch.device) -> None:
        """Make now the static tables the group kernels on ``device`` read (:meth:`tables` for the
        Triton kernels, :meth:`row_units` for the others): an exporter or validator told its device
        makes them at construction instead of at its first sync."""
        if _on_triton(device):
            self.tables(device)
        else:
            self.row_units(device)

    @functools.cached_property
    def shapes(self) -> list[torch.Size]:
        """Each segment's ``(rows, cols)``, as its bound tensor's ``shape`` compares."""
        return [torch.Size((rows, self.cols)) for rows in self.rows]

    @functools.cached_property
    def even_rows(self) -> bool:
        """Whether every segment's rows are a multiple of the kernels' block rows (read at every launch)."""
        return all(r % BLOCK_ROWS == 0 for r in self.rows)


#: the layouts in use, by (cols, rows, units): :meth:`SegmentLayout.of` hands out one object per key
_INTERNED: weakref.WeakValueDictionary[tuple[int, tuple[int, ...], tuple[int, ...]], SegmentLayout] = (
    weakref.WeakValueDictionary()
)
_INTERNED_LOCK = threading.Lock()


def _block_table(rows: tuple[int, ...]) -> torch.Tensor:
    """int32 ``(blocks, 2)``: ``(segment, first row)`` of every block of ``BLOCK_ROWS`` rows, in order
    (array ops: a Python list of a 48-layer model's ~10^4 blocks per group cost ms per group).

    Example:
        >>> _block_table((20, 16)).tolist()
        [[0, 0], [0, 16], [1, 0]]
    """
    counts = torch.tensor([-(-r // BLOCK_ROWS) for r in rows], dtype=torch.int64)
    segment = torch.repeat_interleave(torch.arange(len(rows)), counts)
    first_block = torch.cumsum(counts, 0) - counts
    row = (torch.arange(segment.numel()) - first_block[segment]) * BLOCK_ROWS
    return torch.stack([segment, row], dim=1).to(torch.int32)


_ROW_STRIDE = operator.itemgetter(0)
_ELEMENT_STRIDE = operator.itemgetter(1)


def _off_16(values: list[int]) -> bool:
    """Whether any of ``values`` is not a multiple of 16 (C-level: a first sync checks ~12k)."""
    return any(map((15).__and__, values))


class Sources:
    """The source tensors of one group for one call: checked, and their addresses on the device.

    The address table is rebuilt only when an address changed since the last call (a learner
    updating its parameters in place keeps them).
    """

    def __init__(self, layout: SegmentLayout) -> None:
        self.layout = layout
        self._last: list[int] | None = None
        #: the address table was read since the last bind (a call's launches read it once)
        self._current = False
        self._ptrs: torch.Tensor | None = None
        self._ld: torch.Tensor | None = None
        self.tensors: list[torch.Tensor] = []
        #: what the caller made the bound tensors from (whole parameters it took views of), if it says
        self.bound_from: list[torch.Tensor] = []

    def bind(self, tensors: Sequence[torch.Tensor]) -> Sources:
        """Use ``tensors`` (2-D, rows as the layout says, contiguous rows) for the next call.

        Checked at every bind, the same tensor objects as last call too: ``param.data = ...`` keeps
        a learner's parameter and may give it another storage, shape, strides or dtype. Their
        addresses are read again at the next launch.
        """
        layout = self.layout
        if len(tensors) != len(layout.rows):
            raise FormatError(f"{len(tensors)} tensors for a group of {len(layout.rows)} segments")
        if not self._fits(tensors):
            self._refuse(tensors)
        self.tensors = list(tensors)
        self._current = False
        return self

    def again(self) -> None:
        """A new call with the bound tensors: its first launch reads their addresses again
        (``param.data = ...`` moves a parameter's storage and keeps the tensor object)."""
        self._current = False

    def _fits(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether every tensor fits its segment, in C-level passes (a first sync binds ~12k
        tensors; :meth:`_refuse` names the first that does not)."""
        first = tensors[0]
        shapes = self.layout.shapes
        return (
            list(map(_SHAPE, tensors)) == shapes  # 2-D, rows and columns as laid out
            and set(map(torch.Tensor.stride, tensors, itertools.repeat(-1, len(tensors)))) == {1}
            and set(map(_DTYPE, tensors)) == {first.dtype}
            and set(map(_DEVICE, tensors)) == {first.device}
        )

    def _refuse(self, tensors: Sequence[torch.Tensor]) -> NoReturn:
        """Raise the :class:`FormatError` naming the first tensor that does not fit."""
        layout = self.layout
        first = tensors[0]
        for t, rows in zip(tensors, layout.rows, strict=True):
            if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != layout.cols or t.stride(1) != 1:
                raise FormatError(
                    f"a segment of shape {tuple(t.shape)} (strides {t.stride()}) does not fit its group "
                    f"({rows} x {layout.cols}, contiguous rows)",
                    hint="pass whole tensor-parallel-gathered tensors",
                    found=tuple(t.shape),
                )
            if t.dtype != first.dtype or t.device != first.device:
                raise FormatError("the tensors of one group must share dtype and device", found=str(t.dtype))
        raise AssertionError("_fits refused tensors that _refuse finds nothing wrong with")

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0].dtype

    def device_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(addresses, row strides) as int64 device tensors, read once per bind (a call's launches
        share them) and uploaded again only when an address changed."""
        if self._current and self._ptrs is not None and self._ld is not None:
            return self._ptrs, self._ld
        ptrs = list(map(torch.Tensor.data_ptr, self.tensors))  # C-level: every sync reads ~12k of these
        if ptrs != self._last or self._ptrs is None or self._ld is None:
            # (row, element) strides read with the addresses: rows are checked here too, for a storage
            # moved (``param.data = ...``) after the bind that checked them
            strides = list(map(torch.Tensor.stride, self.tensors))
            lds = list(map(_ROW_STRIDE, strides))
            # the kernels are compiled for 16-byte-aligned rows (tl.multiple_of on address and stride)
            if _off_16(ptrs) or _off_16(lds) or any(map((1).__ne__, map(_ELEMENT_STRIDE, strides))):
                raise FormatError(
                    "segment rows must be contiguous and start on 16-byte boundaries, with a row stride of a "
                    "multiple of 16 elements"
                )
            # from an int64 array: a third of torch.tensor's time on the lists (a first sync's ~12k)
            table = torch.frombuffer(array.array("q", ptrs + lds), dtype=torch.int64).view(2, -1)
            (dev,) = upload([table], self.device)
            self._ptrs, self._ld, self._last = dev[0], dev[1], ptrs
        self._current = True
        return self._ptrs, self._ld

    def stacked(self) -> torch.Tensor:
        """The group as one matrix (a copy; only for paths without a segment kernel)."""
        return self.tensors[0] if len(self.tensors) == 1 else torch.cat(self.tensors)


def _on_triton(device: torch.device) -> bool:
    """Whether the Triton segment kernels run on ``device`` (CUDA with Triton)."""
    return device.type == "cuda" and kernels.triton_available()


def reads_by_address(device: torch.device) -> bool:
    """Whether groups on ``device`` are read through an address table (the Triton kernels), so
    their rows must start on 16-byte boundaries (:meth:`Sources.device_tables` checks)."""
    return _on_triton(device)


def _cuda_kernels() -> object:
    from fp4convert.formats import _triton_segments

    return _triton_segments


def segment_amax(sources: Sources) -> torch.Tensor:
    """NaN-ignoring amax of each segment: float32 ``(segments,)`` on the sources' device."""
    layout = sources.layout
    if _on_triton(sources.device):
        ts = _cuda_kernels()
        tables = layout.tables(sources.device)
        ptrs, lds = sources.device_tables()
        out = torch.zeros(len(layout.rows), dtype=torch.int32, device=sources.device)
        bc = ts.launch_shape(layout.cols, 16)  # type: ignore[attr-defined]
        grid = (tables["tab"].shape[0],)
        ts._amax_seg_kernel[grid](  # type: ignore[attr-defined]
            tables["tab"], ptrs, lds, tables["rows"], out, layout.cols, DT=_tl_dtype(sources.dtype),
            EVEN_R=layout.even_rows, EVEN_C=layout.cols % bc == 0, BR=BLOCK_ROWS, BC=bc, enable_fp_fusion=False,
        )  # fmt: skip
        return out.view(torch.float32)
    if sources.device.type == "cpu" and sources.dtype in kernels.CPU_DTYPES and kernels.native_available():
        return kernels.segment_amax(sources.tensors)
    return torch.stack([nvfp4_row_amax(t).amax() for t in sources.tensors])


def unit_amax(sources: Sources, seg_amax: torch.Tensor | None = None) -> torch.Tensor:
    """The outer amax of each unit: the maximum over its segments, float32 ``(units,)`` on the device."""
    layout = sources.layout
    amax = segment_amax(sources) if seg_amax is None else seg_amax
    if layout.num_units == len(layout.rows) and layout.units == tuple(range(layout.num_units)):
        return amax
    index = layout.tables(amax.device)["unit"]
    return torch.zeros(layout.num_units, dtype=torch.float32, device=amax.device).scatter_reduce_(
        0, index, amax, "amax", include_self=False
    )


def _tl_dtype(dtype: torch.dtype) -> object:
    import triton.language as tl

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def _check_outputs(layout: SegmentLayout, data: torch.Tensor, scale: torch.Tensor, per_byte: int, block: int) -> None:
    want = ((layout.total_rows, layout.cols // per_byte), (layout.total_rows, layout.cols // block))
    got = (tuple(data.shape), tuple(scale.shape))
    if got != want or not (data.is_contiguous() and scale.is_contiguous()):
        raise FormatError(f"output buffers {got} do not match the group's {want} (contiguous uint8)")


def _check_nvfp4_group(layout: SegmentLayout, tile: str, data: torch.Tensor, scale: torch.Tensor) -> None:
    _check_outputs(layout, data, scale, 2, NVFP4_BLOCK)
    if layout.cols % NVFP4_BLOCK or (tile == "16x16" and not layout.even_rows):
        raise FormatError(f"a group of width {layout.cols} and rows {layout.rows[:4]}... cannot take {tile} blocks")


def nvfp4_segments(
    sources: Sources,
    amax: torch.Tensor,
    profile: profiles.Profile,
    *,
    tile: str,
    data: torch.Tensor,
    scale: torch.Tensor,
) -> None:
    """Quantize a group to NVFP4 into ``data (rows, cols/2)`` and ``scale (rows, cols/16)`` (uint8).

    Args:
        sources: the group's tensors (:meth:`Sources.bind`).
        amax: float32 ``(units,)`` outer amax of each unit, on the sources' device.
        profile: arithmetic profile.
        tile: ``"1x16"`` or ``"16x16"`` (every segment's rows a multiple of 16).
    """
    layout = sources.layout
    _check_nvfp4_group(layout, tile, data, scale)
    spec = profiles.profile_spec(profile)
    # 4over6 and the mxfp4-cast's power-of-two chain have no segment kernel: one stacked matrix instead
    segment_kernel = spec.chain in _SEGMENT_CHAINS
    device = sources.device
    if segment_kernel and _on_triton(device):
        _launch_nvfp4(sources, amax, spec, tile, data, scale, None)
        return
    row_amax = amax.float()[layout.row_units(amax.device)]
    if segment_kernel and device.type == "cpu" and sources.dtype in kernels.CPU_DTYPES and kernels.native_available():
        kernels.nvfp4_segments(sources.tensors, layout.out_rows, row_amax, profile, tile == "16x16", data, scale)
        return
    got_data, got_scale = nvfp4_matrix(sources.stacked(), row_amax, profile, tile=tile)  # type: ignore[arg-type]
    data.copy_(got_data)
    scale.copy_(got_scale)


def nvfp4_segment_mismatches(
    sources: Sources,
    amax: torch.Tensor,
    profile: profiles.Profile,
    *,
    tile: str,
    data: torch.Tensor,
    scale: torch.Tensor,
) -> torch.Tensor | None:
    """Which rows of ``data`` / ``scale`` differ from the group's NVFP4 bytes, in one pass that
    quantizes and compares without writing the expected bytes anywhere (a validator's check).

    Arguments as :func:`nvfp4_segments`, with ``data`` and ``scale`` the bytes to check (read only).
    Returns int32 ``(rows, 2)`` on the device, 1 where a row's data / scale bytes differ, or None
    where there is no such kernel (not on Triton, a chain without a segment kernel, ``data`` not on
    a 4-byte boundary): the caller quantizes with :func:`nvfp4_segments` and compares.
    """
    layout = sources.layout
    _check_nvfp4_group(layout, tile, data, scale)
    spec = profiles.profile_spec(profile)
    if not (_on_triton(sources.device) and spec.chain in _SEGMENT_CHAINS and data.data_ptr() % 4 == 0):
        return None
    bad = torch.empty(layout.total_rows, 2, dtype=torch.int32, device=sources.device)
    _launch_nvfp4(sources, amax, spec, tile, data, scale, bad)
    return bad


def _launch_nvfp4(
    sources: Sources,
    amax: torch.Tensor,
    spec: profiles.ProfileSpec,
    tile: str,
    data: torch.Tensor,
    scale: torch.Tensor,
    bad: torch.Tensor | None,
) -> None:
    """One launch of the NVFP4 segment kernel: writing ``data``/``scale``, or with ``bad`` comparing them."""
    layout = sources.layout
    device = sources.device
    ts = _cuda_kernels()
    tables = layout.tables(device)
    ptrs, lds = sources.device_tables()
    bc = ts.launch_shape(layout.cols, NVFP4_BLOCK)  # type: ignore[attr-defined]
    hw = ts.hardware_e4m3(device)  # type: ignore[attr-defined]
    code = kernels.PROFILE_CODES[spec.chain]
    ts._nvfp4_seg_kernel[(tables["tab"].shape[0], 1)](  # type: ignore[attr-defined]
        tables["tab"], ptrs, lds, tables["rows"], tables["out"], tables["unit32"], amax.float(),
        data, scale, layout.cols, data if bad is None else bad, DT=_tl_dtype(sources.dtype),
        PROFILE=code, GMAX=spec.global_max, TILE16=tile == "16x16", EVEN_R=layout.even_rows,
        EVEN_C=layout.cols % bc == 0, BR=BLOCK_ROWS, BC=bc, CH=0, VERIFY=bad is not None, HW=hw,
        WORDS=ts.word_path(sources.dtype == torch.bfloat16, hw, code),  # type: ignore[attr-defined]
        PREFETCH=ts._PREFETCH, enable_fp_fusion=False,  # type: ignore[attr-defined]
    )  # fmt: skip


def mxfp8_segments(sources: Sources, *, data: torch.Tensor, scale: torch.Tensor) -> None:
    """Quantize a group to MXFP8 (1x32 row blocks) into ``data (rows, cols)`` and ``scale (rows, cols/32)``."""
    layout = sources.layout
    _check_outputs(layout, data, scale, 1, MXFP8_BLOCK)
    if layout.cols % MXFP8_BLOCK:
        raise FormatError(f"a group of width {layout.cols} cannot take MXFP8 blocks of 32")
    device = sources.device
    if _on_triton(device):
        ts = _cuda_kernels()
        tables = layout.tables(device)
        ptrs, lds = sources.device_tables()
        bc = ts.launch_shape(layout.cols, MXFP8_BLOCK)  # type: ignore[attr-defined]
        ts._mxfp8_seg_kernel[(tables["tab"].shape[0], 1)](  # type: ignore[attr-defined]
            tables["tab"], ptrs, lds, tables["rows"], tables["out"], data, scale, layout.cols,
            DT=_tl_dtype(sources.dtype), EVEN_R=layout.even_rows, EVEN_C=layout.cols % bc == 0, BR=BLOCK_ROWS, BC=bc,
            CH=0, HW=ts.hardware_e4m3(device), enable_fp_fusion=False,  # type: ignore[attr-defined]
        )  # fmt: skip
        return
    if device.type == "cpu" and sources.dtype in kernels.CPU_DTYPES and kernels.native_available():
        kernels.mxfp8_segments(sources.tensors, layout.out_rows, data, scale)
        return
    got_data, got_scale = mxfp8_matrix(sources.stacked())
    data.copy_(got_data)
    scale.copy_(got_scale)
