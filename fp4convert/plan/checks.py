"""What every plan must satisfy before a byte is written or sent: shared by converter and live export.

Problems are collected, not raised one at a time: a dialect that cannot store the contract, a
shape not divisible by the format's block, one FusedMoE container split across formats, NVFP4
input scales without calibrated activation amaxes. :func:`refuse` raises them together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fp4convert.contract import Contract
from fp4convert.dialects import Dialect
from fp4convert.errors import ConversionError
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.inventory import Role
from fp4convert.plan.tensors import PlannedTensor

__all__ = ["fused_moe_problems", "plan_problems", "refuse", "shape_problem", "uncalibrated_modules"]


def shape_problem(item: PlannedTensor) -> str | None:
    """Why ``item``'s shape cannot take its format (None when it can).

    Example:
        >>> from fp4convert.contract import load_contract
        >>> from fp4convert.inventory import TensorInfo
        >>> w = TensorInfo("model.layers.0.mlp.experts.0.up_proj.weight", (8, 24), gemm_weight=True)
        >>> decision = load_contract("nvfp4-experts-per-token").decide(w, num_layers=1)
        >>> shape_problem(PlannedTensor(w, decision))
        '... shape (8, 24), in-features 24 not divisible by the NVFP4 block 16'
    """
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


def fused_moe_problems(items: Iterable[PlannedTensor]) -> list[str]:
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


def plan_problems(contract: Contract, dialect: Dialect, items: Sequence[PlannedTensor]) -> list[str]:
    """Everything about a plan a dialect, the block sizes or the engines' FusedMoE would refuse."""
    problems = dialect.refusals(contract, items)
    problems += [p for i in items if i.quantized and (p := shape_problem(i))]
    problems += fused_moe_problems(items)
    return problems


def uncalibrated_modules(
    items: Iterable[PlannedTensor], dialect: Dialect, calibration: Mapping[str, float] | None
) -> list[str]:
    """Modules whose NVFP4 input scale the dialect stores but ``calibration`` has no amax for."""
    return [
        i.module
        for i in items
        if i.quantized
        and i.decision.format == "nvfp4"
        and dialect.writes_input_scale(i)
        and i.module not in (calibration or {})
    ]


def refuse(problems: Sequence[str], headline: str, hint: str) -> None:
    """Raise one :class:`ConversionError` listing every problem (nothing when there is none)."""
    if problems:
        listing = "\n  - ".join(problems)
        raise ConversionError(
            f"{headline} ({len(problems)} problems):\n  - {listing}", hint=hint, problems=list(problems)
        )
