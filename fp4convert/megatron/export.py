"""Live weight export: Megatron-named BF16 parameters in, the sampler's HF-named tensors out.

This is what an RL framework runs after every update (docs/live-export.md): take the
learner's parameters (tensor-parallel shards already gathered, expert ids local to the EP rank),
apply the family transforms (QKV split per query group, ``linear_fc1`` into gate/up, local expert
ids to global ones), quantize every tensor exactly as the contract and the converter do, and hand
over the tensors of the chosen dialect. The BF16 split happens before quantization, as the spec
requires, and every group's members share one outer amax.

Memory stays bounded: tensors are consumed one at a time and their outputs yielded before the next
one is read. A fused Megatron tensor (``linear_qkv``, ``linear_fc1``) is a whole shared-scale group,
so nothing waits; the only group spread over several Megatron tensors is MLA's
``q_a_proj`` / ``kv_a_proj_with_mqa`` (``linear_q_down_proj`` / ``linear_kv_down_proj``), whose
first member is held until the second arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from fp4convert.errors import MappingError
from fp4convert.families import megatron_to_hf
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.plan import ContractLike, DialectLike, ExportPlan, export_plan
from fp4convert.plan import PlannedTensor

__all__ = ["export_hf"]


def _checked(plan: ExportPlan, name: str, x: torch.Tensor, source: str) -> PlannedTensor:
    item = plan.item(name)
    if tuple(x.shape) != tuple(item.info.shape):
        raise MappingError(
            f"`{source}` gives `{name}` the shape {tuple(x.shape)}, but the config says {tuple(item.info.shape)}",
            hint="pass tensor-parallel-gathered parameters (whole tensors) of this model",
            tensor=source,
        )
    return item


def _sent(plan: ExportPlan, items: list[PlannedTensor], tensors: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """One group's outputs, computed without autograd (learner parameters require grad) and
    detached, so nothing handed to the sampler holds the learner's graph or its Parameters."""
    with torch.no_grad():
        return [(name, tensor.detach()) for name, tensor in encode_group(plan, items, tensors)]


def export_hf(
    named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    contract: ContractLike,
    family: str | None,
    config: Mapping[str, Any],
    dialect: DialectLike = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    calibration: Mapping[str, float] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Export Megatron parameters as the HF tensors of a dialect, quantized under a contract.

    The result is exactly what a sampler receives in a live update, and byte for byte what
    ``fp4convert convert`` writes for the same tensors (``validate_export`` proves it for any
    exporter). Quantization runs on each tensor's own device (CPU or CUDA, same bytes).

    ``input_scale`` is not sent by default: RL frameworks (Miles' ``quantize_params_nvfp4``) never
    re-send NVFP4 activation scales during live updates, the engine keeps the one it loaded from
    the converted checkpoint. ``include_input_scale=True`` sends them too (per-token contracts:
    the 1.0 placeholder; per-tensor contracts need ``calibration``).

    Args:
        named_params: ``(name, tensor)`` pairs or a mapping; Megatron-Core names (``module.``
            wrappers allowed, TEGroupedMLP or SequentialMLP experts), TP-gathered BF16 tensors.
            Consumed lazily, one at a time.
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        family: family key (``"qwen3_moe"``); None takes it from ``config``.
        config: the model's config.json.
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors`` (or a dialect instance).
        ep_rank: expert-parallel rank the parameters come from (their expert ids are local to it).
        ep_size: expert-parallel size.
        include_input_scale: also send NVFP4 activation scales (see above).
        calibration: activation amax per HF module, for per-tensor activation contracts.

    Yields:
        ``(HF name, tensor)`` in the dialect's layout, each group's tensors as soon as it is
        complete: e.g. ``...experts.7.gate_proj.weight`` (U8), ``...weight_scale`` (E4M3),
        ``...weight_scale_2`` (F32), then the same for ``up_proj``.

    Raises:
        ConversionError: the contract cannot be exported in this dialect (raised at the first
            ``next()``, before anything is yielded).
        MappingError: an unmapped name, a tensor whose shape does not fit the config (not TP
            gathered?), an expert id outside the EP rank, or a group left incomplete at the end.

    Example (not run: it needs a model's state dict and config):
        >>> megatron = hf_to_megatron(hf_state_dict, "qwen3_moe", config)  # doctest: +SKIP
        >>> for name, tensor in export_hf(megatron.items(), contract="nvfp4-experts-per-token",
        ...                               family="qwen3_moe", config=config):  # doctest: +SKIP
        ...     engine.update_weight(name, tensor)
    """
    plan = export_plan(
        contract=contract,
        config=config,
        dialect=dialect,
        family=family,
        include_input_scale=include_input_scale,
        calibration=calibration,
    )
    plan.experts_per_rank(ep_size)  # a bad EP size fails before the first tensor is read
    params = named_params.items() if isinstance(named_params, Mapping) else named_params
    waiting: dict[str, dict[str, torch.Tensor]] = {}  # groups spread over Megatron tensors
    for source, tensor in params:
        with torch.no_grad():  # not around the yields: grad mode is global and the caller runs in between
            pieces = megatron_to_hf(
                {source: tensor.detach()}, plan.family, plan.config, ep_rank=ep_rank, ep_size=ep_size
            )
        for name, x in pieces.items():
            item = _checked(plan, name, x, source)
            members = plan.members(item)
            if len(members) == 1:
                yield from _sent(plan, [item], [x])
                continue
            group = item.decision.fused_group or name
            got = waiting.setdefault(group, {})
            got[name] = x
            if len(got) == len(members):
                del waiting[group]
                yield from _sent(plan, [plan.item(m) for m in members], [got[m] for m in members])
    if waiting:
        missing = sorted(m for g, got in waiting.items() for m in plan.groups[g] if m not in got)
        raise MappingError(
            f"fused groups left incomplete: {', '.join(f'`{m}`' for m in missing[:4])}"
            + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            + " never arrived",
            hint="export every member of a shared-scale group in the same update",
            tensor=missing[0],
        )
