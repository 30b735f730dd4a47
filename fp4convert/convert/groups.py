"""Quantize one tensor, or every member of one shared-scale group, and encode it for a dialect.

Fused siblings (gate/up, q/k/v, MLA q_a/kv_a) share one FP32 outer scale: their amax is the
maximum of the members' NaN-ignoring amaxes (background.md, decision 6). Everything that produces
quantized output tensors without the converter's file machinery (the live Megatron export, the
export validator's diagnostics) goes through these functions, so the bytes are those the
converter writes for the same contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fp4convert.convert.plan import PlannedTensor
from fp4convert.dialects import Dialect, module_of
from fp4convert.formats import kernels

__all__ = ["group_input_amax", "member_amax", "quantize_members", "shared_amax"]


def member_amax(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor's NaN-ignoring amax as a float32 scalar on its device (no host sync).

    Example:
        >>> member_amax(torch.tensor([[1.0, -3.0], [float("nan"), 2.0]])).item()
        3.0
    """
    return kernels.row_amax(tensor.reshape(-1, tensor.shape[-1])).amax()


def shared_amax(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The outer amax fused siblings share: the maximum of the members' amaxes.

    Example:
        >>> shared_amax([torch.full((2, 16), 2.0), torch.full((2, 16), -5.0)]).item()
        5.0
    """
    return torch.stack([member_amax(t) for t in tensors]).amax()


def group_input_amax(member_names: Sequence[str], calibration: Mapping[str, float] | None) -> float | None:
    """The calibrated activation amax fused siblings share (they read the same input): the max.

    Args:
        member_names: HF tensor names of the group's members (or of one tensor).
        calibration: ``{module: activation amax}``; None when activations are per token.

    Returns:
        The largest calibrated amax among the members' modules, or None when none is known.

    Example:
        >>> names = ["m.gate_proj.weight", "m.up_proj.weight"]
        >>> group_input_amax(names, {"m.gate_proj": 3.0, "m.up_proj": 4.0})
        4.0
    """
    if calibration is None:
        return None
    values = [calibration[m] for m in map(module_of, member_names) if m in calibration]
    return max(values) if values else None


def quantize_members(
    items: Sequence[PlannedTensor],
    tensors: Sequence[torch.Tensor],
    *,
    dialect: Dialect,
    profile: str,
    input_amax: float | None = None,
    amax: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Quantize one tensor or one whole shared-scale group, and encode it as ``dialect`` writes it.

    With two or more NVFP4 members the outer amax is :func:`shared_amax` of all of them, exactly
    as the converter computes it; a single tensor uses its own amax. BF16 members come back as
    they are. Quantization runs on each tensor's own device.

    Args:
        items: the planned tensors (info + decision), in output order; one fused group at most.
        tensors: their source tensors (HF layout), in the same order.
        dialect: the on-disk / on-wire dialect whose tensor names and scale conventions are used.
        profile: the contract's quantizer profile (``te``, ``te-2.13``, ``modelopt``).
        input_amax: the group's calibrated activation amax (None: per-token placeholder).
        amax: impose this outer amax instead (diagnostics use it to replay an exporter's mistake).

    Returns:
        Output tensor name -> tensor, in the dialect's order, members in ``items`` order.

    Example:
        >>> from fp4convert.contract import load_contract
        >>> from fp4convert.dialects import get_dialect
        >>> from fp4convert.families import describe_name, load_config
        >>> config = load_config("Qwen3-30B-A3B")
        >>> contract = load_contract("nvfp4-experts-per-token")
        >>> names = [f"model.layers.0.mlp.experts.0.{p}_proj.weight" for p in ("gate", "up")]
        >>> items = [PlannedTensor(i, contract.decide(i, num_layers=48))
        ...          for i in (describe_name(n, config) for n in names)]
        >>> out = quantize_members(items, [torch.ones(4, 16), torch.full((4, 16), 2.0)],
        ...                        dialect=get_dialect("modelopt"), profile="te")
        >>> scales = [out[f"model.layers.0.mlp.experts.0.{p}_proj.weight_scale_2"] for p in ("gate", "up")]
        >>> torch.equal(scales[0], scales[1]), f"{scales[0].item():.6g}"  # rn(1 / rn(2688 / 2))
        (True, '0.000744048')
    """
    from fp4convert.convert.execute import quantize_planned

    if amax is None and len(items) > 1 and all(i.quantized and i.decision.format == "nvfp4" for i in items):
        amax = shared_amax(tensors)
    out: dict[str, torch.Tensor] = {}
    for item, x in zip(items, tensors, strict=True):
        q = quantize_planned(item, x, profile=profile, amax=amax, device=str(x.device))
        out.update(dialect.encode(item, q, x, input_amax))
    return out
