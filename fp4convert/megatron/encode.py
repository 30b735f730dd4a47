"""Quantize one shared-scale group and encode it for a dialect: the converter's arithmetic, reused.

Every byte a live export sends comes from here, and so does the slow-path reference that
``validate-export`` diagnoses with. It is a thin layer over the per-tensor quantize step
(:func:`fp4convert.plan.quantize_members`, with the shared amax computed as the converter
computes it), adding what a live update needs: only the outputs the update carries, and the
faulty variants diagnosis replays (another arithmetic profile, members quantized separately).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from fp4convert.megatron.plan import ExportPlan
from fp4convert.plan import PlannedTensor, group_input_amax, quantize_members

__all__ = ["encode_group"]


def encode_group(
    plan: ExportPlan,
    items: Sequence[PlannedTensor],
    tensors: Sequence[torch.Tensor],
    *,
    profile: str | None = None,
    shared: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a live update sends for one group (or one lone tensor), in layout order.

    Args:
        plan: the export plan (contract, dialect, which outputs are sent).
        items: the group's members (one item for a tensor that shares no scale).
        tensors: their BF16 values, HF layout, on the device to quantize on.
        profile: arithmetic profile; default the contract's. Other values exist for diagnosis.
        shared: quantize members with the group's shared amax (the contract); False quantizes each
            with its own amax, as a faulty exporter would (for diagnosis).

    Yields:
        ``(HF output name, tensor)``; high-precision members are passed through unchanged.

    Example:
        >>> from fp4convert.megatron import export_plan
        >>> plan = export_plan(contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B")
        >>> items = [plan.item(f"model.layers.0.mlp.experts.0.{p}_proj.weight") for p in ("gate", "up")]
        >>> out = dict(encode_group(plan, items, [torch.ones(4, 16), torch.full((4, 16), 2.0)]))
        >>> [name.split("experts.0.")[1] for name in out]  # doctest: +NORMALIZE_WHITESPACE
        ['gate_proj.weight', 'gate_proj.weight_scale', 'gate_proj.weight_scale_2',
         'up_proj.weight', 'up_proj.weight_scale', 'up_proj.weight_scale_2']
        >>> torch.equal(out[items[0].module + ".weight_scale_2"], out[items[1].module + ".weight_scale_2"])
        True
    """
    the_profile = profile or plan.profile
    input_amax = group_input_amax([item.info.name for item in items], plan.calibration)
    groups = [(items, tensors)] if shared else [([i], [x]) for i, x in zip(items, tensors, strict=True)]
    encoded: dict[str, torch.Tensor] = {}
    for members, values in groups:
        encoded.update(
            quantize_members(members, values, dialect=plan.dialect, profile=the_profile, input_amax=input_amax)
        )
    for item in items:
        for name, _, _ in item.outputs:
            yield name, encoded[name]
