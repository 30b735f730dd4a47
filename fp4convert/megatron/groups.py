"""The quantized groups of a live export: which tensors one launch covers, and running one.

A :class:`Group` is fixed by the plan alone: the routed experts of one layer sharing a format,
width and tile (every expert's gate/up, or every down projection), or one shared-scale unit of the
other tensors (q/k/v, MLA's q_a/kv_a, a dense gate/up), or one lone tensor. Its members' outputs
are row ranges of one output matrix (:class:`GroupBuffers`), so their views are built once. When a
sync has all of a group's master tensors, :func:`run_group` quantizes it with the segment kernels
of :mod:`fp4convert.formats.segments`, reading each master tensor where it is (an expert's
``linear_fc1`` is one segment: its gate and up rows are adjacent in the master and in the output),
with the shared outer amaxes and the dialect's global scales computed on the device. Groups whose
tensors are not plain row-contiguous BF16/FP16/FP32 of one dtype (legacy GroupedMLP's transposed
experts) take the converter's per-unit path instead, with the same bytes. A :class:`Run` is
groups of one format, tile and width (every layer's experts of one role) quantized by one set of
launches into rows of one allocation (:class:`RunBuffers`), what an eager whole update does unless
``FP4CONVERT_MERGE_RUNS=0`` (:mod:`fp4convert.megatron.sync`).
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fp4convert.errors import FormatError
from fp4convert.formats.nvfp4 import NVFP4Tensor
from fp4convert.formats.segments import (
    SegmentLayout,
    Sources,
    mxfp8_segments,
    nvfp4_segments,
    reads_by_address,
    unit_amax,
)
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.formats.uploads import upload
from fp4convert.inventory import Role
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.plan import ExportPlan
from fp4convert.megatron.resolve import Piece
from fp4convert.plan import PlannedTensor, group_input_amax

__all__ = [
    "Group",
    "GroupBuffers",
    "Run",
    "RunBuffers",
    "piece_value",
    "plan_groups",
    "plan_runs",
    "run_bound",
    "run_group",
]

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_START = operator.itemgetter(2)  # a segment's first row


@dataclass
class Group:
    """Quantized tensors handled by one launch (see the module docstring).

    Attributes:
        fmt: ``nvfp4`` or ``mxfp8``.
        tile: NVFP4 tile (``1x16`` / ``16x16``).
        cols: the members' width.
        items: members in plan order.
        out_rows: first output row of each member.
        units: outer-amax unit of each member (its shared-scale group).
        rows: rows of the output matrix.
        layout: segments (set on the first sync that has the group's master tensors).
        segments: per segment ``(master key, sub, first row)``.
    """

    fmt: str
    tile: str
    cols: int
    items: list[PlannedTensor]
    out_rows: list[int]
    units: list[int]
    rows: int
    layout: SegmentLayout | None = None
    segments: list[tuple[str, int | None, int]] = field(default_factory=list)
    sources: Sources | None = None
    _units_dev: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names = [item.info.name for item in self.items]  # what a sync looks the pieces up by

    @property
    def num_units(self) -> int:
        return max(self.units) + 1

    def item_units(self, device: torch.device) -> torch.Tensor:
        return _units_on(self._units_dev, self.units, device)

    def build_layout(self, pieces: Sequence[Piece]) -> None:
        """Segments from the members' pieces (:func:`segments_of`)."""
        self.segments, self.layout = segments_of(pieces, self.units, self.cols)
        self.segment_keys = [(key, sub) for key, sub, _ in self.segments]  # what a sync looks tensors up by
        self.sources = Sources(self.layout)


def segments_of(
    pieces: Sequence[Piece], units: Sequence[int], cols: int
) -> tuple[list[tuple[str, int | None, int]], SegmentLayout]:
    """Segments for members stacked in order: each run of a member's rows one segment, runs that
    continue each other in the same master tensor and unit merged (an expert's gate + up).

    Returns:
        ``(master key, sub, first row)`` per segment, and the :class:`SegmentLayout`.
    """
    rows: list[int] = []
    seg_units: list[int] = []
    segments: list[tuple[str, int | None, int]] = []
    for piece, unit in zip(pieces, units, strict=True):
        for start, count in piece.runs:
            last = segments[-1] if segments else None
            if last is not None and last[:2] == (piece.key, piece.sub) and seg_units[-1] == unit:
                if last[2] + rows[-1] == start:
                    rows[-1] += count
                    continue
            segments.append((piece.key, piece.sub, start))
            rows.append(count)
            seg_units.append(unit)
    return segments, SegmentLayout.of(rows, seg_units, cols=cols)


def bind_segments(
    sources: Sources, segments: Sequence[tuple[str, int | None, int]], tensors: Sequence[torch.Tensor]
) -> bool:
    """Bind the segments' rows of ``tensors`` (one per segment); False when they cannot be read in
    place (mixed dtypes or devices, rows not contiguous or not 16-byte aligned): the caller then
    takes the per-unit or gathering path."""
    first = tensors[0]
    if first.dtype not in _KERNEL_DTYPES:
        return False
    bound = sources.bound_from
    if len(bound) == len(tensors) and all(map(operator.is_, tensors, bound)):
        # the same whole tensors as the last bind (a learner's parameters, sync after sync), bound
        # as themselves again: no views to make (bind checks them: ``param.data = ...`` keeps the
        # object and may move its storage)
        views, whole = list(tensors), True
    else:
        rows = sources.layout.rows
        # C-level passes (a first sync binds ~12k tensors): every segment a whole tensor, or views of rows
        whole = not any(map(_START, segments)) and tuple(map(torch.Tensor.size, tensors, itertools.repeat(0))) == rows
        if whole:
            views = list(tensors)
        else:
            views = [
                t if start == 0 and count == t.shape[0] else t[start : start + count]
                for t, (_, _, start), count in zip(tensors, segments, rows, strict=True)
            ]
    try:
        sources.bind(views)  # mixed dtypes or devices, rows not contiguous: a FormatError
        if reads_by_address(first.device):
            sources.device_tables()
    except FormatError:
        sources.bound_from = []
        return False
    # only whole tensors bound as themselves may skip making views next time: a view of rows would
    # keep the storage the parameter had when it was made (``param.data = ...`` moves it)
    whole = whole or all(map(operator.is_, views, tensors))
    sources.bound_from = list(tensors) if whole else []
    return True


def _group_key(plan: ExportPlan, item: PlannedTensor) -> tuple[object, ...]:
    info = item.info
    tile = getattr(item.decision.recipe, "tile", "1x16")
    if info.role is Role.ROUTED_EXPERT:
        return ("experts", info.layer, item.decision.format, info.shape[-1], tile)
    group = item.decision.fused_group
    return ("unit", group if group is not None and group in plan.groups else info.name)


def _units_on(kept: dict[str, torch.Tensor], units: list[int], device: torch.device) -> torch.Tensor:
    """Each member tensor's unit (where its global scale is picked from), on ``device``, kept."""
    key = str(device)
    if key not in kept:
        (kept[key],) = upload([torch.tensor(units, dtype=torch.long)], device)
    return kept[key]


def plan_groups(plan: ExportPlan, items: Sequence[PlannedTensor]) -> list[Group]:
    """The groups of the quantized ``items`` (plan order within each group)."""
    by_key: OrderedDict[tuple[object, ...], list[PlannedTensor]] = OrderedDict()
    for item in items:
        if item.quantized:
            by_key.setdefault(_group_key(plan, item), []).append(item)
    groups = []
    for members in by_key.values():
        unit_ids: dict[str, int] = {}
        units, out_rows, total = [], [], 0
        for item in members:
            group = item.decision.fused_group
            unit = group if group is not None and group in plan.groups else item.info.name
            units.append(unit_ids.setdefault(unit, len(unit_ids)))
            out_rows.append(total)
            total += item.info.shape[0]
        first = members[0]
        groups.append(
            Group(
                fmt=first.decision.format,
                tile=getattr(first.decision.recipe, "tile", "1x16"),
                cols=first.info.shape[-1],
                items=members,
                out_rows=out_rows,
                units=units,
                rows=total,
            )
        )
    return groups


#: output matrices of a group or a run: codes, scales, and the NVFP4 global scales (one per member)
Matrices = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


#: per format, (values per code byte, values per scale byte): an output row's widths
_PACKING = {"nvfp4": (2, NVFP4_BLOCK), "mxfp8": (1, MXFP8_BLOCK)}


def _matrices(fmt: str, rows: int, cols: int, members: int, device: torch.device) -> Matrices:
    per_byte, block = _PACKING[fmt]
    data = torch.empty(rows, cols // per_byte, dtype=torch.uint8, device=device)
    scale = torch.empty(rows, cols // block, dtype=torch.uint8, device=device)
    global_scale = torch.empty(members, dtype=torch.float32, device=device) if fmt == "nvfp4" else None
    return data, scale, global_scale


@dataclass
class Run:
    """Groups of one format, tile and width quantized by one set of launches, their output matrices
    rows of one allocation (:class:`RunBuffers`): in a whole update, every layer's experts of one
    role at once, the launches of a group (a few per layer, issued from Python) being what bounds an
    eager sync rather than the GPU. Its segments are its groups' segments in order, its units theirs
    renumbered after each other, so each byte it writes is the one its group's own launch would.

    Attributes:
        members: the groups' indices, in plan order.
        fmt, tile, cols: what the groups share.
        rows: output rows of all of them.
        items: how many member tensors (global scales) all of them have.
    """

    members: list[int]
    fmt: str
    tile: str
    cols: int
    rows: int
    items: int
    built_from: list[list[tuple[str, int | None, int]]] = field(default_factory=list)  # the groups' segments
    layout: SegmentLayout | None = None
    sources: Sources | None = None
    segments: list[tuple[str, int | None, int]] = field(default_factory=list)
    segment_keys: list[tuple[str, int | None]] = field(default_factory=list)
    units: list[int] = field(default_factory=list)  # each member tensor's unit, across the groups
    num_units: int = 0
    _units_dev: dict[str, torch.Tensor] = field(default_factory=dict)

    def lay_out(self, groups: Sequence[Group]) -> None:
        """The run's segments from its groups' (rebuilt when a group's were: a first sync, a new
        spelling; equal layouts are one object, so the segments' master keys are what tell)."""
        built_from = [groups[g].segments for g in self.members]
        if len(built_from) == len(self.built_from) and all(map(operator.is_, built_from, self.built_from)):
            return
        layouts = [groups[g].layout for g in self.members]
        rows: list[int] = []
        seg_units: list[int] = []
        units: list[int] = []
        segments: list[tuple[str, int | None, int]] = []
        offset = 0
        for g, layout in zip(self.members, layouts, strict=True):
            group = groups[g]
            assert layout is not None and layout.total_rows == group.rows and layout.num_units == group.num_units
            rows += layout.rows
            seg_units += [unit + offset for unit in layout.units]
            units += [unit + offset for unit in group.units]
            segments += group.segments
            offset += group.num_units
        self.layout = SegmentLayout.of(rows, seg_units, cols=self.cols)
        self.sources = Sources(self.layout)
        self.segments, self.units, self.num_units, self.built_from = segments, units, offset, built_from
        self.segment_keys = [(key, sub) for key, sub, _ in segments]
        self._units_dev = {}

    def item_units(self, device: torch.device) -> torch.Tensor:
        return _units_on(self._units_dev, self.units, device)


def plan_runs(groups: Sequence[Group], max_bytes: int) -> list[Run]:
    """Runs of the groups sharing format, tile and width, in plan order, each of at most
    ``max_bytes`` of output (a larger group alone; a run of one group is none)."""
    by_key: OrderedDict[tuple[str, str, int], list[int]] = OrderedDict()
    for g, group in enumerate(groups):
        by_key.setdefault((group.fmt, group.tile, group.cols), []).append(g)
    runs: list[Run] = []
    for (fmt, tile, cols), members in by_key.items():
        chunks: list[list[int]] = [[]]
        size = 0
        for g in members:
            nbytes = _output_bytes(fmt, groups[g].rows, cols)
            if chunks[-1] and size + nbytes > max_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(g)
            size += nbytes
        for chunk in chunks:
            if len(chunk) > 1:
                rows = sum(groups[g].rows for g in chunk)
                runs.append(Run(chunk, fmt, tile, cols, rows, sum(len(groups[g].items) for g in chunk)))
    return runs


def _output_bytes(fmt: str, rows: int, cols: int) -> int:
    per_byte, block = _PACKING[fmt]
    return rows * (cols // per_byte + cols // block)


@dataclass
class RunBuffers:
    """A run's output matrices: each member group's are rows of them (:meth:`of_groups`)."""

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None

    @classmethod
    def allocate(cls, run: Run, device: torch.device) -> RunBuffers:
        return cls(*_matrices(run.fmt, run.rows, run.cols, run.items, device))

    def of_groups(self, run: Run, groups: Sequence[Group]) -> list[Matrices]:
        """Each member group's rows of the matrices, in run order."""
        rows = [groups[g].rows for g in run.members]
        items = [len(groups[g].items) for g in run.members]
        data, scale = self.data.split(rows), self.scale.split(rows)
        globals_ = self.global_scale.split(items) if self.global_scale is not None else [None] * len(rows)
        return list(zip(data, scale, globals_, strict=True))


@dataclass
class GroupBuffers:
    """One group's outputs for one sync: the matrices and, per member, its output tensors."""

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None
    outputs: list[list[tuple[str, torch.Tensor]]]  # per member, in its layout order

    @classmethod
    def allocate(
        cls, plan: ExportPlan, group: Group, device: torch.device, into: Matrices | None = None
    ) -> GroupBuffers:
        """The group's output matrices (``into``: given, rows of a :class:`RunBuffers`; else made
        here) and every member's output views of them."""
        made = into if into is not None else _matrices(group.fmt, group.rows, group.cols, len(group.items), device)
        data, scale, global_scale = made
        rows = [item.info.shape[0] for item in group.items]
        specs = [item.outputs for item in group.items]
        # one format, so one dtype per output kind: each matrix is retyped once, not each of its
        # ~10^4 views (a first sync without buffers made at construction spent ~13 ms on those)
        columns = [
            _retyped(data, {spec[0][1] for spec in specs}).split(rows),
            _retyped(scale, {spec[1][1] for spec in specs}).split(rows),
        ]
        if group.fmt == "nvfp4":
            assert global_scale is not None
            globals_ = _retyped(global_scale, {spec[2][1] for spec in specs})
            columns.append(globals_.unbind(0) if plan.dialect.global_shape == () else globals_.split(1))
        kinds = len(columns)  # the outputs made from the matrices; an input scale follows them
        outputs = [
            [(name, view) for (name, _, _), view in zip(spec[:kinds], views, strict=True)]
            for spec, views in zip(specs, zip(*columns, strict=True), strict=True)
        ]
        for index, spec in enumerate(specs):
            if len(spec) > kinds:  # input scale: a constant of the plan
                item = group.items[index]
                amax = group_input_amax(list(plan.members(item)), plan.calibration)
                value = plan.dialect.input_scale(amax).reshape(plan.dialect.global_shape).to(device)
                outputs[index].append((spec[kinds][0], value))
        return cls(data, scale, global_scale, outputs)


def _retyped(matrix: torch.Tensor, dtypes: set[str]) -> torch.Tensor:
    """``matrix`` viewed as the one safetensors dtype its outputs have."""
    (name,) = dtypes
    dtype = SAFETENSORS_DTYPES[name]
    return matrix if matrix.dtype == dtype else matrix.view(dtype)


def sent_dtype(item: PlannedTensor, master: torch.dtype) -> torch.dtype:
    """The dtype a high-precision tensor is sent in: the master's (as Megatron-Bridge streams it),
    except a norm weight the master holds wider than the plan records. Megatron-Core's local and
    ModelOpt layer specs keep RMSNorm weights in float32 inside a BF16 model; the HF checkpoint,
    ``fp4convert convert`` and the sampler hold them in the plan's dtype, so that is what is sent
    (a round-to-nearest-even cast, the one the sampler's loader would make).

    Example:
        >>> from fp4convert.megatron import export_plan
        >>> plan = export_plan(contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B")
        >>> sent_dtype(plan.item("model.layers.0.input_layernorm.weight"), torch.float32)
        torch.bfloat16
        >>> sent_dtype(plan.item("model.layers.0.mlp.gate.weight"), torch.float32)
        torch.float32
    """
    planned = SAFETENSORS_DTYPES[item.outputs[0][1]]
    if item.info.role is Role.NORM and master.is_floating_point and master.itemsize > planned.itemsize:
        return planned
    return master


def piece_value(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
    """An HF tensor's values from the (unpacked) master tensor holding it: a view unless its rows
    are interleaved (QKV)."""
    if piece.whole:
        return tensor
    if len(piece.runs) == 1:
        start, count = piece.runs[0]
        return tensor[start : start + count]
    rows = piece.strided(tensor)
    if rows is not None:  # one copy, not one per query group
        return rows.reshape(-1, *tensor.shape[1:])
    return torch.cat([tensor[s : s + n] for s, n in piece.runs])


def run_group(
    plan: ExportPlan,
    group: Group,
    tensors: Mapping[tuple[str, int | None], torch.Tensor],
    pieces: Sequence[Piece],
    buffers: GroupBuffers,
) -> None:
    """Quantize one group into ``buffers`` (no host synchronisation on the fast path).

    Args:
        plan: the export plan.
        group: the group (its layout built).
        tensors: ``(master key, sub) -> tensor`` of this sync.
        pieces: the members' pieces, in member order.
        buffers: where the outputs go.
    """
    if not run_bound(plan, group, tensors, (buffers.data, buffers.scale, buffers.global_scale)):
        _run_slow(plan, group, tensors, pieces, buffers)


def run_bound(
    plan: ExportPlan, unit: Group | Run, tensors: Mapping[tuple[str, int | None], torch.Tensor], out: Matrices
) -> bool:
    """Quantize a group or a run with the segment kernels, its master rows read in place, into
    ``out``; False (nothing written) when they cannot be read in place."""
    sources = unit.sources
    assert sources is not None
    seg_tensors = list(map(tensors.__getitem__, unit.segment_keys))  # C-level: ~12k segments a sync
    if not bind_segments(sources, unit.segments, seg_tensors):
        return False
    data, scale, global_scale = out
    if unit.fmt == "mxfp8":
        mxfp8_segments(sources, data=data, scale=scale)
        return True
    amax = unit_amax(sources)
    nvfp4_segments(sources, amax, plan.profile, tile=unit.tile, data=data, scale=scale)  # type: ignore[arg-type]
    q = NVFP4Tensor((unit.num_units,), seg_tensors[0].dtype, unit.tile, "tensor", plan.profile, amax)
    assert global_scale is not None
    torch.index_select(
        plan.dialect.global_scale(q).float().reshape(-1), 0, unit.item_units(amax.device), out=global_scale
    )
    return True


def _run_slow(
    plan: ExportPlan,
    group: Group,
    tensors: Mapping[tuple[str, int | None], torch.Tensor],
    pieces: Sequence[Piece],
    buffers: GroupBuffers,
) -> None:
    """The converter's per-unit path (any dtype, layout or device mix), copied into the buffers."""
    by_unit: OrderedDict[int, list[int]] = OrderedDict()
    for index, unit in enumerate(group.units):
        by_unit.setdefault(unit, []).append(index)
    for members in by_unit.values():
        items = [group.items[i] for i in members]
        values = [piece_value(tensors[(pieces[i].key, pieces[i].sub)], pieces[i]) for i in members]
        encoded = dict(encode_group(plan, items, values))
        for i in members:
            for name, view in buffers.outputs[i]:
                if name in encoded and view.data_ptr() != encoded[name].data_ptr():
                    view.copy_(encoded[name].to(view.device).view(view.dtype).reshape(view.shape))
