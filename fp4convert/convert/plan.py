"""Plan and validate a conversion before a single byte is written (phases 1 and 2).

The plan fixes, for every source tensor, its contract decision, the output tensors the dialect
gives it (names, dtypes, shapes), and the output shard they go to, so shard headers can be written
first and tensors streamed after. Validation collects *every* problem (shape not divisible by the
block, a dialect that cannot express the contract, missing activation calibration, fused siblings
or one FusedMoE container split across formats) and raises them together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fp4convert.checkpoint.safetensors_io import tensor_nbytes
from fp4convert.checkpoint.source import SourceCheckpoint, output_shard_names
from fp4convert.contract import Contract
from fp4convert.dialects import Dialect, OutputSpec, Planned
from fp4convert.errors import ConversionError
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.inventory import ModelInventory, Role

__all__ = ["ConversionPlan", "PlannedTensor", "build_plan", "load_calibration", "validate_plan"]


@dataclass(frozen=True)
class PlannedTensor(Planned):
    """A source tensor, its decision, where it is read from and what is written for it."""

    source_file: str = ""
    outputs: tuple[OutputSpec, ...] = ()
    output_file: str = ""

    @property
    def output_bytes(self) -> int:
        return sum(tensor_nbytes(dtype, shape) for _, dtype, shape in self.outputs)


@dataclass
class ConversionPlan:
    """Everything the converter will do, decided up front."""

    source: SourceCheckpoint
    contract: Contract
    dialect: Dialect
    inventory: ModelInventory
    items: list[PlannedTensor]
    groups: dict[str, list[str]] = field(default_factory=dict)  # shared-scale group -> member names

    def by_output_file(self) -> dict[str, list[PlannedTensor]]:
        files: dict[str, list[PlannedTensor]] = {}
        for item in self.items:
            files.setdefault(item.output_file, []).append(item)
        return files

    @property
    def source_bytes(self) -> int:
        return sum(self.source.entry(i.info.name).nbytes for i in self.items)


def _assign_shards(items: list[PlannedTensor], max_shard_size: int | None) -> list[PlannedTensor]:
    """Group items (in source order) into output shards and name them; names are generated, never
    the source's (a crafted index could name ``../elsewhere.safetensors``)."""
    from dataclasses import replace

    groups: list[list[PlannedTensor]] = []
    if max_shard_size is None:  # one output shard per source shard, in the source's order
        by_source: dict[str, list[PlannedTensor]] = {}
        for item in items:
            by_source.setdefault(item.source_file, []).append(item)
        groups = list(by_source.values())
    else:
        size = 0
        for item in items:
            if not groups or (groups[-1] and size + item.output_bytes > max_shard_size):
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += item.output_bytes
    names = output_shard_names(len(groups))
    return [replace(i, output_file=names[n]) for n, group in enumerate(groups) for i in group]


def build_plan(
    source: SourceCheckpoint, contract: Contract, dialect: Dialect, *, max_shard_size: int | None = None
) -> ConversionPlan:
    """Decide every tensor's format and output layout (reads headers only)."""
    inventory = source.inventory()
    decisions = contract.decide_all(inventory)
    items: list[PlannedTensor] = []
    for info in inventory:
        planned = Planned(info, decisions[info.name])
        items.append(
            PlannedTensor(
                info,
                decisions[info.name],
                source_file=source.tensor_file[info.name],
                outputs=tuple(dialect.layout(planned)),
            )
        )
    # Read each source shard front to back: conversion follows the data order of the files.
    order = {name: n for n, name in enumerate(source.shards)}
    items.sort(key=lambda i: (order[i.source_file], source.entry(i.info.name).start))
    items = _assign_shards(items, max_shard_size)
    groups: dict[str, list[str]] = {}
    for item in items:
        if item.quantized and item.decision.format == "nvfp4" and item.decision.fused_group:
            groups.setdefault(item.decision.fused_group, []).append(item.info.name)
    return ConversionPlan(source, contract, dialect, inventory, items, groups)


def load_calibration(path: str | Path) -> dict[str, float]:
    """Activation amaxes per HF module name, from a JSON object ``{module: amax}``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{path}: calibration file is not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(data, dict) or not all(isinstance(v, int | float) and v > 0 for v in data.values()):
        raise ConversionError(
            f"{path}: expected a JSON object mapping module names to positive activation amaxes",
            hint='e.g. {"model.layers.0.mlp.experts.0.gate_proj": 12.5}',
            file=str(path),
        )
    return {str(k): float(v) for k, v in data.items()}


def _shape_problem(item: PlannedTensor) -> str | None:
    shape = item.info.shape
    fmt = item.decision.format
    if len(shape) != 2:
        return f"{item.info.name}: {fmt} needs a 2-D weight, got shape {shape}"
    rows, cols = shape
    if fmt == "nvfp4":
        if cols % NVFP4_BLOCK:
            return f"{item.info.name}: shape {shape}, in-features {cols} not divisible by the NVFP4 block 16"
        if item.decision.recipe is not None and getattr(item.decision.recipe, "tile", "") == "16x16" and rows % 16:
            return f"{item.info.name}: shape {shape}, rows {rows} not divisible by the 16x16 tile"
    if fmt == "mxfp8" and cols % MXFP8_BLOCK:
        return f"{item.info.name}: shape {shape}, in-features {cols} not divisible by the MXFP8 block 32"
    return None


def _fused_moe_problems(items: list[PlannedTensor]) -> list[str]:
    """Engines load each layer's routed experts as one FusedMoE: one format per layer container."""
    formats: dict[str, set[str]] = {}
    for item in items:
        if item.info.role is Role.ROUTED_EXPERT and item.info.gemm_weight:
            container = item.module.split(".experts.", 1)[0] + ".experts"
            formats.setdefault(container, set()).add(item.decision.format)
    return [
        f"{c}: routed experts split across formats {sorted(f)}; engines load one format per MoE layer"
        for c, f in formats.items()
        if len(f) > 1
    ]


def validate_plan(plan: ConversionPlan, calibration: Mapping[str, float] | None = None) -> None:
    """Check everything that could fail later, and raise every problem at once.

    Raises:
        ConversionError: with one line per problem in the message.
    """
    problems = plan.dialect.refusals(plan.contract, plan.items)
    quantized = [i for i in plan.items if i.quantized]
    problems += [p for i in quantized if (p := _shape_problem(i))]
    problems += _fused_moe_problems(plan.items)
    nvfp4 = [i for i in quantized if i.decision.format == "nvfp4"]
    if nvfp4 and plan.dialect.writes_input_scale(nvfp4[0]) and not plan.contract.formats.nvfp4.per_token_activations:
        missing = [i.module for i in nvfp4 if i.module not in (calibration or {})]
        if missing:
            problems.append(
                f"contract {plan.contract.name!r} quantizes NVFP4 activations per tensor "
                f"(per_token_activations: false), so input_scale needs calibrated activation amaxes; "
                f"{len(missing)} modules have none (first: {missing[0]}); pass --calibration FILE "
                "or use a per-token contract"
            )
    if problems:
        listing = "\n  - ".join(problems)
        raise ConversionError(
            f"conversion refused before writing anything ({len(problems)} problems):\n  - {listing}",
            hint="fix the contract, pick another --dialect, or keep the listed tensors in BF16",
            problems=problems,
        )
