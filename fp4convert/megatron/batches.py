"""The batched byte check of ``validate-export``: which tensors are quantized together, and how.

Per-tensor work would be bound by kernel launches (a Qwen3-30B-A3B sync has ~18k expert tensors of
a few MB), so tensors are batched: the master rows of all tensors of one layer, format and width
are quantized by the segment kernels (:mod:`fp4convert.formats.segments`, reading each master
tensor in place, as the exporter does), with the shared outer amaxes taken on the device, and
compared with the export (a view when its tensors lie back to back in one buffer). Quantization is
row-independent given each row's outer amax (1x16 blocks; 16x16 tiles never straddle tensors,
whose rows are multiples of 16), so a batch's bytes are the per-tensor bytes the converter writes.
Mismatch counts stay on the device; the validator reads them back once.
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4convert.formats import kernels
from fp4convert.formats.nvfp4 import NVFP4Tensor
from fp4convert.formats.segments import (
    Sources,
    mxfp8_segments,
    nvfp4_segment_mismatches,
    nvfp4_segments,
    reads_by_address,
    unit_amax,
)
from fp4convert.formats.uploads import upload
from fp4convert.megatron.context import Context
from fp4convert.megatron.groups import bind_segments, segments_of
from fp4convert.megatron.plan import ExportPlan
from fp4convert.megatron.resolve import Piece
from fp4convert.plan import PlannedTensor

__all__ = [
    "MXFP8_COLUMNS",
    "NVFP4_COLUMNS",
    "Batch",
    "Step",
    "lay_out",
    "mismatches",
    "plan_steps",
    "prepare",
    "unit_of",
]

#: what each column of a batch's mismatch counts checks, per format
NVFP4_COLUMNS = ("data", "scale", "global", "shared")
MXFP8_COLUMNS = ("data", "scale")


@dataclass
class Batch:
    """Tensors of one layer, format and width, quantized together. Everything about it that does
    not change between syncs is kept: names, master rows, and device index tensors."""

    fmt: str
    items: list[PlannedTensor]
    units: list[str]  # shared-amax unit of each item
    outputs: list[list[str]]  # per output role (data, scale[, global]), the items' names
    rows: list[int]
    index: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # device -> on()
    row_tables: dict[str, torch.Tensor] = field(default_factory=dict)  # "item:device" / "unit:device"
    pieces: list[Piece] | None = None  # the master pieces the segments below were made from
    segments: list[tuple[str, int | None, int]] = field(default_factory=list)
    sources: Sources | None = None
    whole_keys: list[str] | None = None  # the segments' master keys when none is unpacked, else []
    #: (the validator's name -> position map it was made for, per output role a picker of the tensors)
    picks: tuple[Mapping[str, int], list[Callable[[list[torch.Tensor]], list[torch.Tensor]]]] | None = None

    def __post_init__(self) -> None:
        self.names = [item.info.name for item in self.items]  # what the master's pieces are looked up by
        self._host_index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def item_units(self) -> list[int]:
        ids: dict[str, int] = {}
        return [ids.setdefault(u, len(ids)) for u in self.units]

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(item_unit, item_first, units) index tensors on ``device``: each item's unit, the first
        item of each item's unit, and how many units."""
        key = str(device)
        if key not in self.index:
            item_unit, item_first, count = self.host_index()
            on_device = upload([item_unit, item_first], device)
            self.index[key] = (on_device[0], on_device[1], count)
        return self.index[key]

    def host_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`on`'s tables on the host (built once: a validator builds them at construction)."""
        if self._host_index is None:
            item_unit = self.item_units()
            first = {u: i for i, u in reversed(list(enumerate(item_unit)))}
            self._host_index = (
                torch.tensor(item_unit),
                torch.tensor([first[u] for u in item_unit]),
                torch.tensor(max(item_unit) + 1),
            )
        return self._host_index

    def per_row(self, what: str, device: torch.device) -> torch.Tensor:
        """Each master row's ``"item"`` or ``"unit"`` (int64 on ``device``), built on first use: only
        batches of unequal items and the paths without segment kernels need them."""
        key = f"{what}:{device}"
        if key not in self.row_tables:
            values = torch.arange(len(self.items)) if what == "item" else torch.tensor(self.item_units())
            (self.row_tables[key],) = upload([torch.repeat_interleave(values, torch.tensor(self.rows))], device)
        return self.row_tables[key]

    @property
    def equal_rows(self) -> bool:
        """Whether every item has the same rows (a layer's experts), so per-item sums are a reshape."""
        return len(set(self.rows)) == 1


_NBYTES = operator.attrgetter("nbytes")

#: one step of the byte check: ``("bf16", item)`` compared as is, or ``(format, batch)``
Step = tuple[str, PlannedTensor | Batch]


def unit_of(plan: ExportPlan, item: PlannedTensor) -> str:
    """The shared-amax unit ``item`` belongs to: its fused group, or itself."""
    group = item.decision.fused_group
    return group if group is not None and group in plan.groups else item.info.name


def _batch(plan: ExportPlan, items: list[PlannedTensor]) -> Batch:
    roles = 3 if items[0].decision.format == "nvfp4" else 2
    return Batch(
        fmt=items[0].decision.format,
        items=items,
        units=[unit_of(plan, item) for item in items],
        outputs=[[item.outputs[role][0] for item in items] for role in range(roles)],
        rows=[item.info.shape[0] for item in items],
    )


def plan_steps(
    plan: ExportPlan, items: list[PlannedTensor], complete: set[str] | None, max_batch_bytes: int
) -> list[list[Step]]:
    """Per layer: BF16 items one by one, quantized ones in batches of one (format, width, tile),
    whole shared-amax units at a time, at most ``max_batch_bytes`` of BF16 master per batch.

    Args:
        plan: the export plan.
        items: the items to check.
        complete: the units allowed in batches (None: all).
        max_batch_bytes: the cap on one batch's master bytes.
    """
    layers: OrderedDict[int | None, list[PlannedTensor]] = OrderedDict()
    for item in items:
        layers.setdefault(item.info.layer, []).append(item)
    steps: list[list[Step]] = []
    for members in layers.values():
        layer: list[Step] = [("bf16", item) for item in members if not item.quantized]
        keyed: OrderedDict[tuple[Any, ...], OrderedDict[str, list[PlannedTensor]]] = OrderedDict()
        for item in members:
            unit = unit_of(plan, item)
            if item.quantized and (complete is None or unit in complete):
                key = (item.decision.format, item.info.shape[-1], getattr(item.decision.recipe, "tile", ""))
                keyed.setdefault(key, OrderedDict()).setdefault(unit, []).append(item)
        for units in keyed.values():
            batch: list[PlannedTensor] = []
            size = 0
            for group in units.values():
                nbytes = sum(m.info.numel * 2 for m in group)
                if batch and size + nbytes > max_batch_bytes:
                    layer.append((batch[0].decision.format, _batch(plan, batch)))
                    batch, size = [], 0
                batch += group
                size += nbytes
            if batch:
                layer.append((batch[0].decision.format, _batch(plan, batch)))
        steps.append(layer)
    return steps


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor if tensor.device == device else tensor.to(device)


def _bad_rows(batch: Batch, actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Differing rows of each item of ``batch`` (int64 ``(items,)`` on the device)."""
    return _per_item(batch, (actual.reshape(expected.shape) != expected).any(dim=1))


def _per_item(batch: Batch, bad: torch.Tensor) -> torch.Tensor:
    """Per-row flags ``(rows, ...)`` (0/1) summed over each item's rows: int64 ``(items, ...)``."""
    items = len(batch.items)
    if batch.equal_rows:
        return bad.reshape(items, -1, *bad.shape[1:]).sum(dim=1, dtype=torch.int64)
    row_item = batch.per_row("item", bad.device)
    counts = torch.zeros(items, *bad.shape[1:], dtype=torch.int64, device=bad.device)
    return counts.index_add_(0, row_item, bad.long())


def _joined(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The tensors' bytes as one flat uint8 tensor: a view when they lie back to back in one
    storage (an exporter's output buffer, as :class:`~fp4convert.megatron.sync.LiveExporter`
    writes it), else a concatenation."""
    first = tensors[0]
    if first.device == device and all(map(torch.Tensor.is_contiguous, tensors)):
        # C-level passes, not a Python loop: a sync has ~55k of these tensors
        starts = list(map(torch.Tensor.data_ptr, tensors))
        ends = list(itertools.accumulate(map(_NBYTES, tensors), initial=starts[0]))
        if ends[:-1] == starts:  # back to back
            start, end = starts[0], ends[-1]
            storage = first.untyped_storage()
            base = storage.data_ptr()
            if end <= base + storage.nbytes():  # the whole span lies in first's allocation
                flat = torch.empty(0, dtype=torch.uint8, device=device)
                return flat.set_(storage, start - base, (end - start,), (1,))
    return torch.cat([_on(t, device).contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _exported(ctx: Context, batch: Batch) -> list[torch.Tensor]:
    index = ctx.fetched_index
    if ctx.fetched is None or index is None:
        get = ctx.exported.__getitem__
        return [_joined(list(map(get, names)), ctx.device) for names in batch.outputs]
    # the structure check fetched every tensor already: pick this batch's from its list (C-level)
    fetched = ctx.fetched
    return [_joined(pick(fetched), ctx.device) for pick in _picks(batch, index)]


def _picks(batch: Batch, index: Mapping[str, int]) -> list[Callable[[list[torch.Tensor]], list[torch.Tensor]]]:
    """Per output role, the picker of the batch's tensors from a list fetched in ``index``'s order."""
    if batch.picks is None or batch.picks[0] is not index:
        get = index.__getitem__
        batch.picks = (index, [_picker(list(map(get, names))) for names in batch.outputs])
    return batch.picks[1]


def _picker(positions: list[int]) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """``seq -> [seq[p] for p in positions]`` at C speed (``itemgetter``; one position too)."""
    getter = operator.itemgetter(*positions)
    if len(positions) == 1:
        return lambda seq: [getter(seq)]
    return lambda seq: list(getter(seq))


def _master_rows(ctx: Context, batch: Batch) -> tuple[Sources | None, torch.Tensor | None]:
    """The batch's master rows: as segments read in place where they can be, else concatenated."""
    sources = _bound(ctx, batch)
    if sources is not None:
        return sources, None
    xs = [ctx.master_piece(item) for item in batch.items]
    return None, xs[0] if len(xs) == 1 else torch.cat(xs)


def _bound(ctx: Context, batch: Batch) -> Sources | None:
    """The batch's master rows as segments bound in place (their address table on the device), or
    None where they cannot be read in place."""
    _lay_out(batch, ctx.sources)
    assert batch.sources is not None
    if batch.whole_keys is None:  # segments of the master's own tensors (none unpacked): read directly
        whole = all(sub is None for _, sub, _ in batch.segments) and not hasattr(ctx.master, "meta")  # not files
        batch.whole_keys = [key for key, _, _ in batch.segments] if whole else []
    if batch.whole_keys:
        tensors = list(map(ctx.master.__getitem__, batch.whole_keys))  # off the device: not bound below
    else:
        tensors = [ctx.master_tensor(key, sub) for key, sub, _ in batch.segments]
    if tensors[0].device == ctx.device and bind_segments(batch.sources, batch.segments, tensors):
        return batch.sources
    return None


def _lay_out(batch: Batch, sources: Mapping[str, Piece]) -> None:
    """The batch's segments over the master pieces ``sources`` gives its items (kept while the
    pieces are the same objects)."""
    pieces = list(map(sources.__getitem__, batch.names))  # C-level passes: ~12k items a sync
    if batch.pieces is None or not all(map(operator.is_, batch.pieces, pieces)):
        batch.segments, layout = segments_of(pieces, batch.item_units(), batch.items[0].info.shape[-1])
        batch.sources, batch.pieces, batch.whole_keys = Sources(layout), pieces, None


def lay_out(
    steps: list[list[Step]], sources: Mapping[str, Piece], index: Mapping[str, int], device: torch.device | None = None
) -> None:
    """Build, before any master or export is seen, what the batches of ``steps`` keep for a master
    whose pieces are ``sources`` and an export fetched in ``index``'s order: segments, index tables,
    pickers (a validator's construction, for the layout it predicts; its first sync then only binds
    the tensors and uploads their address tables). With ``device``, the index and segment tables
    are uploaded there too (a validator told its device)."""
    for layer in steps:
        for _, payload in layer:
            if isinstance(payload, Batch):
                _lay_out(payload, sources)
                payload.host_index()
                _picks(payload, index)
                if device is not None:
                    payload.on(device)
                    if reads_by_address(device):  # the Triton kernels' tables (the CPU's check reads none)
                        assert payload.sources is not None  # laid out above
                        payload.sources.layout.tables(device)


def prepare(ctx: Context, kind: str, payload: PlannedTensor | Batch) -> None:
    """Make on ``ctx.device`` what one step's check reads besides the tensors (index tables, the
    master segments' address tables, interleaved rows' indices), so a first sync finds them made."""
    if isinstance(payload, Batch):
        payload.on(ctx.device)
        sources = _bound(ctx, payload)
        if sources is not None:
            sources.layout.tables(ctx.device)
        elif not payload.equal_rows:
            payload.per_row("item", ctx.device)
    else:
        ctx.master_piece(payload)


def _nvfp4(ctx: Context, batch: Batch) -> torch.Tensor:
    plan = ctx.plan
    sources, x = _master_rows(ctx, batch)
    act_data, act_scale, act_global = _exported(ctx, batch)
    device = ctx.device
    item_unit, item_first, units = batch.on(device)
    tile = getattr(batch.items[0].decision.recipe, "tile", "1x16")
    bad: torch.Tensor | None = None  # (items, 2): differing data / scale rows of each item
    if sources is not None:
        unit_amax_ = unit_amax(sources)
        layout = sources.layout
        dtype = sources.dtype
        # where the kernel can, it quantizes and compares in one pass (the expected bytes are never written)
        flags = nvfp4_segment_mismatches(
            sources, unit_amax_, plan.profile, tile=tile, data=act_data.view(layout.total_rows, layout.cols // 2),  # type: ignore[arg-type]
            scale=act_scale.view(layout.total_rows, layout.cols // 16),
        )  # fmt: skip
        if flags is not None:
            bad = _per_item(batch, flags)
        else:
            data = torch.empty(layout.total_rows, layout.cols // 2, dtype=torch.uint8, device=device)
            scale = torch.empty(layout.total_rows, layout.cols // 16, dtype=torch.uint8, device=device)
            nvfp4_segments(sources, unit_amax_, plan.profile, tile=tile, data=data, scale=scale)  # type: ignore[arg-type]
    else:
        assert x is not None
        row_unit = batch.per_row("unit", device)
        unit_amax_ = torch.zeros(int(units), dtype=torch.float32, device=device).scatter_reduce_(
            0, row_unit, kernels.row_amax(x), "amax", include_self=False
        )
        data, scale = kernels.nvfp4_matrix(x, unit_amax_[row_unit], plan.profile, tile16=tile == "16x16")  # type: ignore[arg-type]
        dtype = x.dtype
    if bad is None:
        bad = torch.stack([_bad_rows(batch, act_data, data), _bad_rows(batch, act_scale, scale)], dim=1)
    # Dialect global scales are elementwise in the amax: one call for every unit of the batch.
    amaxes = NVFP4Tensor((int(units),), dtype, tile, "tensor", plan.profile, unit_amax_)
    expected_global = plan.dialect.global_scale(amaxes).float()[item_unit].view(torch.int32)
    act_global = act_global.view(torch.int32)
    shared = act_global[item_first]
    return torch.cat([bad, torch.stack([act_global != expected_global, act_global != shared], dim=1).long()], dim=1)


def _mxfp8(ctx: Context, batch: Batch) -> torch.Tensor:
    sources, x = _master_rows(ctx, batch)
    act_data, act_scale = _exported(ctx, batch)
    if sources is not None:
        layout = sources.layout
        data = torch.empty(layout.total_rows, layout.cols, dtype=torch.uint8, device=ctx.device)
        scale = torch.empty(layout.total_rows, layout.cols // 32, dtype=torch.uint8, device=ctx.device)
        mxfp8_segments(sources, data=data, scale=scale)
    else:
        assert x is not None
        data, scale = kernels.mxfp8_matrix(x)
    return torch.stack([_bad_rows(batch, act_data, data), _bad_rows(batch, act_scale, scale)], dim=1)


def mismatches(ctx: Context, kind: str, payload: PlannedTensor | Batch) -> tuple[torch.Tensor, tuple[str, ...]]:
    """One step's mismatch counts, ``(items, columns)`` on the device, and the columns' names."""
    if isinstance(payload, Batch):
        if kind == "nvfp4":
            return _nvfp4(ctx, payload), NVFP4_COLUMNS
        return _mxfp8(ctx, payload), MXFP8_COLUMNS
    return ctx.bf16_mismatch(payload), ("data",)
