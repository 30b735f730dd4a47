"""Quantize one shared-scale group and encode it for a dialect: the converter's arithmetic, reused.

Every byte a live export sends comes from here, and so does the slow-path reference that
``validate-export`` diagnoses with. It calls the converter's own pieces
(:func:`fp4convert.convert.execute.quantize_planned` and ``Dialect.encode``) and computes the
shared outer amax the way the converter's ``_GroupAmax`` does: the maximum of each member's
NaN-ignoring amax. So an exported tensor and the converted checkpoint's tensor are the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from fp4convert.convert.execute import quantize_planned
from fp4convert.formats import kernels
from fp4convert.megatron.plan import ExportItem, ExportPlan

__all__ = ["encode_group", "group_amax"]


def group_amax(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The outer amax fused siblings share: the max of the members' NaN-ignoring amaxes.

    Example:
        >>> group_amax([torch.tensor([[1.0, -3.0]]), torch.tensor([[2.0, float("nan")]])]).item()
        3.0
    """
    return torch.stack([kernels.row_amax(t.reshape(-1, t.shape[-1])).amax() for t in tensors]).amax()


def encode_group(
    plan: ExportPlan,
    items: Sequence[ExportItem],
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
    """
    the_profile = profile or plan.profile
    quantized = [x for item, x in zip(items, tensors) if item.quantized]
    amax = None
    if shared and len(quantized) > 1 and items[0].decision.format == "nvfp4":
        amax = group_amax(quantized)
    for item, x in zip(items, tensors):
        q = quantize_planned(item, x, profile=the_profile, amax=amax, device=str(x.device))
        encoded = plan.dialect.encode(item, q, x, plan.input_amax(item))
        for name, _, _ in item.outputs:
            yield name, encoded[name]
