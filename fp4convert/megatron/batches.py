"""The batched byte check of ``validate-export``: which tensors are quantized together, and how.

Per-tensor work would be bound by kernel launches (a Qwen3-30B-A3B sync has ~18k expert tensors of
a few MB), so tensors are batched: the master rows of all tensors of one layer, format and width
are concatenated and quantized with one amax kernel, one scatter-max for the shared outer amaxes
and one quantize kernel, and compared with the export concatenated the same way. Quantization is
row-independent given each row's outer amax (1x16 blocks; 16x16 tiles never straddle tensors,
whose rows are multiples of 16), so a batch's bytes are the per-tensor bytes the converter writes.
Mismatch counts stay on the device; the validator reads them back once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4convert.formats import kernels
from fp4convert.formats.nvfp4 import NVFP4Tensor, tile_amax
from fp4convert.megatron.context import Context
from fp4convert.megatron.plan import ExportPlan
from fp4convert.plan import PlannedTensor

__all__ = ["MXFP8_COLUMNS", "NVFP4_COLUMNS", "Batch", "Step", "mismatches", "plan_steps", "unit_of"]

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
    index: dict[str, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # device -> tensors

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(row_unit, row_item, item_unit, unit_first, units) index tensors on ``device``."""
        key = str(device)
        if key not in self.index:
            ids: dict[str, int] = {}
            item_unit = [ids.setdefault(u, len(ids)) for u in self.units]
            first = {u: i for i, u in reversed(list(enumerate(item_unit)))}
            counts = torch.tensor(self.rows)
            self.index[key] = (
                torch.repeat_interleave(torch.tensor(item_unit), counts).to(device),
                torch.repeat_interleave(torch.arange(len(self.items)), counts).to(device),
                torch.tensor(item_unit).to(device),
                torch.tensor([first[u] for u in range(len(ids))]).to(device),
                torch.tensor(len(ids)),
            )
        return self.index[key]


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


def _bad_rows(row_item: torch.Tensor, items: int, actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    bad = (actual.reshape(expected.shape) != expected).any(dim=1).long()
    return torch.zeros(items, dtype=torch.int64, device=expected.device).index_add_(0, row_item, bad)


def _inputs(ctx: Context, batch: Batch) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """The batch's master rows concatenated, and the exported tensors of each output role."""
    xs = [ctx.master_piece(item) for item in batch.items]
    x = xs[0] if len(xs) == 1 else torch.cat(xs)
    get, device = ctx.exported.__getitem__, ctx.device
    return x, [[_on(get(name), device) for name in names] for names in batch.outputs]


def _nvfp4(ctx: Context, batch: Batch) -> torch.Tensor:
    plan = ctx.plan
    x, (data_out, scale_out, global_out) = _inputs(ctx, batch)
    row_unit, row_item, item_unit, unit_first, units = batch.on(x.device)
    row_amax = kernels.row_amax(x)
    unit_amax = torch.zeros(int(units), dtype=torch.float32, device=x.device).scatter_reduce_(
        0, row_unit, row_amax, "amax", include_self=False
    )
    tile = getattr(batch.items[0].decision.recipe, "tile", "1x16")
    block_amax = tile_amax(x) if tile == "16x16" else None
    data, scale = kernels.nvfp4_matrix(x, unit_amax[row_unit], plan.profile, block_amax)  # type: ignore[arg-type]
    # Dialect global scales are elementwise in the amax: one call for every unit of the batch.
    amaxes = NVFP4Tensor((int(units),), x.dtype, tile, "tensor", plan.profile, unit_amax)
    expected_global = plan.dialect.global_scale(amaxes).float()[item_unit].view(torch.int32)
    act_global = torch.stack(global_out).reshape(-1).view(torch.int32)
    act_scale = torch.cat(scale_out).view(torch.uint8)
    n = len(batch.items)
    return torch.stack(
        [
            _bad_rows(row_item, n, torch.cat(data_out), data),
            _bad_rows(row_item, n, act_scale, scale),
            (act_global != expected_global).long(),
            (act_global != act_global[unit_first[item_unit]]).long(),
        ],
        dim=1,
    )


def _mxfp8(ctx: Context, batch: Batch) -> torch.Tensor:
    x, (data_out, scale_out) = _inputs(ctx, batch)
    _, row_item, _, _, _ = batch.on(x.device)
    data, scale = kernels.mxfp8_matrix(x)
    n = len(batch.items)
    act_data = torch.cat(data_out).view(torch.uint8)
    return torch.stack(
        [_bad_rows(row_item, n, act_data, data), _bad_rows(row_item, n, torch.cat(scale_out), scale)],
        dim=1,
    )


def mismatches(ctx: Context, kind: str, payload: PlannedTensor | Batch) -> tuple[torch.Tensor, tuple[str, ...]]:
    """One step's mismatch counts, ``(items, columns)`` on the device, and the columns' names."""
    if isinstance(payload, Batch):
        if kind == "nvfp4":
            return _nvfp4(ctx, payload), NVFP4_COLUMNS
        return _mxfp8(ctx, payload), MXFP8_COLUMNS
    return ctx.bf16_mismatch(payload).reshape(1, 1).long(), ("data",)
