"""The plan of a checkpoint conversion, decided before a single byte is written.

For every source tensor the plan fixes its contract decision, the output tensors the dialect gives
it (names, dtypes, shapes), the source shard it is read from and the output shard it goes to, so
shard headers can be written first and tensors streamed after. Items follow the source's data
order (each shard is read front to back). ``verify --source`` re-derives a checkpoint from the
same plan. :func:`validate_conversion` collects every problem before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from fp4convert.checkpoint.decode import DecodedSource
from fp4convert.checkpoint.source import SourceCheckpoint, output_shard_names
from fp4convert.contract import Contract
from fp4convert.dialects import Dialect
from fp4convert.errors import ConversionError
from fp4convert.formats.spec import FLT_MAX
from fp4convert.inventory import ModelInventory
from fp4convert.plan.checks import plan_problems, refuse, uncalibrated_modules
from fp4convert.plan.collector import gc_paused
from fp4convert.plan.tensors import PlannedTensor, plan_tensors, shared_scale_groups

__all__ = ["ConversionPlan", "checked_calibration", "load_calibration", "plan_conversion", "validate_conversion"]


@dataclass
class ConversionPlan:
    """Everything the converter will do, decided up front.

    Attributes:
        source: the source checkpoint (headers read, nothing else).
        contract: the contract.
        dialect: the output dialect.
        inventory: the source's tensors, classified.
        items: one per source tensor, in source data order, with source and output shards.
        groups: shared-scale group -> member names (NVFP4 fused siblings, two or more).
    """

    source: SourceCheckpoint
    contract: Contract
    dialect: Dialect
    inventory: ModelInventory
    items: list[PlannedTensor]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def by_output_file(self) -> dict[str, list[PlannedTensor]]:
        """Output shard -> its items, in write order."""
        files: dict[str, list[PlannedTensor]] = {}
        for item in self.items:
            files.setdefault(item.output_file, []).append(item)
        return files

    @property
    def source_bytes(self) -> int:
        """Bytes of the source read for every item (weights and their scales)."""
        return sum(i.bytes_before for i in self.items)


def _assign_shards(items: list[PlannedTensor], max_shard_size: int | None) -> list[PlannedTensor]:
    """Group items (in source order) into output shards and name them; names are generated, never
    the source's (a crafted index could name ``../elsewhere.safetensors``)."""
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


def plan_conversion(
    source: SourceCheckpoint, contract: Contract, dialect: Dialect, *, max_shard_size: int | None = None
) -> ConversionPlan:
    """Decide every tensor's format and output layout (reads headers only).

    Args:
        source: the opened source checkpoint.
        contract: the precision contract.
        dialect: the output dialect.
        max_shard_size: bytes per output shard; None mirrors the source's shards.
    """
    with gc_paused():  # tens of thousands of plan objects: see fp4convert.plan.collector
        return _plan_conversion(source, contract, dialect, max_shard_size)


def _plan_conversion(
    source: SourceCheckpoint, contract: Contract, dialect: Dialect, max_shard_size: int | None
) -> ConversionPlan:
    view = source.view()
    inventory = source.inventory()
    items = [replace(i, source_file=view.file_of(i.info.name)) for i in plan_tensors(contract, inventory, dialect)]
    # Read each source shard front to back: conversion follows the data order of the files (the
    # logical tensors' read order: an FP8 weight where its data is, experts of a fused tensor in turn).
    items.sort(key=lambda i: view.tensors[i.info.name].position)
    items = _assign_shards(items, max_shard_size)
    return ConversionPlan(source, contract, dialect, inventory, items, shared_scale_groups(items))


def load_calibration(path: str | Path) -> dict[str, float]:
    """Activation amaxes per HF module name, from a JSON object ``{module: amax}``.

    Raises:
        ConversionError: unreadable, or not what :func:`checked_calibration` accepts.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{path}: calibration file is not readable JSON ({exc})", file=str(path)) from exc
    return checked_calibration(data, str(path))


def checked_calibration(data: object, origin: str = "calibration") -> dict[str, float]:
    """``{module: amax}`` with every amax a positive number a float32 holds (an input scale is
    ``amax / 2688`` in float32: an infinite one, from ``Infinity`` or 1e39 in a JSON file, makes every
    activation it scales NaN in the engine).

    Example:
        >>> checked_calibration({"model.layers.0.mlp.experts.0.gate_proj": 12.5})
        {'model.layers.0.mlp.experts.0.gate_proj': 12.5}

    Raises:
        ConversionError: not an object, or naming the first value that is not such a number.
    """
    hint = 'e.g. {"model.layers.0.mlp.experts.0.gate_proj": 12.5}'
    if not isinstance(data, Mapping):
        raise ConversionError(f"{origin}: expected a JSON object mapping module names to activation amaxes", hint=hint)
    for module, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= FLT_MAX:
            raise ConversionError(
                f"{origin}: the activation amax of {module!r} is {value!r}; expected a positive number at most "
                f"{FLT_MAX:.7g} (a float32's largest)",
                hint=hint,
                tensor=str(module),
            )
    return {str(k): float(v) for k, v in data.items()}


def validate_conversion(plan: ConversionPlan, calibration: Mapping[str, float] | None = None) -> None:
    """Check everything that could fail later, and raise every problem at once.

    Reads the source's scales (FP8 ``weight_scale_inv``, MXFP4 ``*_scales``: a small fraction of its
    bytes) so a corrupt one is refused here, before anything is written.

    Raises:
        ConversionError: with one line per problem in the message.
        CheckpointError: a source scale is NaN, infinite, zero or negative, or not the power of two
            ``scale_fmt: ue8m0`` promises (naming the tensor).
    """
    with DecodedSource(plan.source) as source:
        source.check_scales()
    problems = plan_problems(plan.contract, plan.dialect, plan.items)
    if not any(item.quantized for item in plan.items):
        problems.append(
            f"contract {plan.contract.name!r} keeps every tensor of this {plan.inventory.family} model in high "
            "precision: there is nothing to quantize (the source already is that checkpoint)"
        )
    if not plan.contract.formats.nvfp4.per_token_activations:
        missing = uncalibrated_modules(plan.items, plan.dialect, calibration)
        if missing:
            problems.append(
                f"contract {plan.contract.name!r} quantizes NVFP4 activations per tensor "
                f"(per_token_activations: false), so input_scale needs calibrated activation amaxes; "
                f"{len(missing)} modules have none (first: {missing[0]}); pass calibration=FILE "
                "(--calibration FILE) or use a per-token contract"
            )
    refuse(
        problems,
        "conversion refused before writing anything",
        "fix the contract, pick another dialect (--dialect), or keep the listed tensors in BF16",
    )
