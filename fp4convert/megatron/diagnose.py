"""The slow path of ``validate-export``: turn the fast path's verdicts into findings, with causes.

Only failing tensors come here. Each byte mismatch is reported with its first differing block
(:mod:`fp4convert.megatron.difference`): the exported and the expected values dequantized (what
the sampler would compute with), and the master's BF16 values. Then the faults real exporters make
are tried as hypotheses (:mod:`fp4convert.megatron.causes`), each by re-quantizing the master the
faulty way (:func:`fp4convert.megatron.encode.encode_group`, the converter's own arithmetic) and
comparing bytes:

* fused siblings quantized separately (gate/up, q/k/v, MLA q_a/kv_a each with its own amax);
* another arithmetic profile (ModelOpt's division order, TE <= 2.13's);
* a global scale a few ulps off (an approximate reciprocal), alone or also used to encode;
* another expert's tensor under this name (expert ids not offset by the EP rank);
* a tensor the contract keeps BF16 sent quantized, or the reverse (ignored exceptions);
* an ``input_scale`` the update must not carry.

What matches none of them is a tensor whose values differ from the master's: a stale tensor from
an older step, or an export of another master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from fp4convert.dialects import stored_format
from fp4convert.megatron.causes import (
    STALE_BF16,
    ep_words,
    expert_name,
    matches_other,
    other_expert_cause,
    quantized_cause,
)
from fp4convert.megatron.context import Context, all_same_bytes, core_outputs, same_bytes
from fp4convert.megatron.difference import difference
from fp4convert.megatron.report import Finding
from fp4convert.megatron.sources import tensor_meta
from fp4convert.plan import PlannedTensor, group_input_amax

__all__ = ["explain"]


def _byte_findings(ctx: Context, item: PlannedTensor, counts: Mapping[str, int], diagnose: bool) -> None:
    names = core_outputs(item)
    if counts.get("shared"):
        values = []
        for member in ctx.plan.members(item):
            glob = core_outputs(ctx.plan.item(member))[-1]
            if glob in ctx.exported:
                values.append(f"{member.rsplit('.', 2)[-2]} {ctx.exported[glob].float().reshape(-1)[0].item():.9g}")
        ctx.add(
            Finding(
                names[-1],
                "shared-scale",
                f"fused siblings carry different {names[-1].rsplit('.', 1)[1]} ({', '.join(values)})",
            )
        )
    if not diagnose:
        parts = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        ctx.add(Finding(names[0], "bytes", f"differs from the reference ({parts}); not diagnosed (max_diagnosed)"))
        return
    actual = ctx.actual(item)
    expected = ctx.reference(item) if item.quantized else {item.info.name: ctx.master_piece(item).cpu()}
    where = difference(ctx, item, actual, expected)
    if where is not None:
        ctx.add(Finding(where[0], "bytes", where[1]))
    if item.quantized:
        cause = quantized_cause(ctx, item, actual)
    else:
        cause = other_expert_cause(ctx, item, actual) or STALE_BF16
    ctx.set_cause(set(names), cause)


def _input_scale_finding(ctx: Context, item: PlannedTensor) -> None:
    name = item.outputs[3][0]
    if name not in ctx.exported:
        return
    expected = ctx.plan.dialect.input_scale(group_input_amax(ctx.plan.members(item), ctx.plan.calibration)).reshape(
        ctx.plan.dialect.global_shape
    )
    actual = ctx.exported[name].cpu()
    if not same_bytes(actual.float(), expected):
        ctx.add(
            Finding(
                name,
                "input-scale",
                f"{actual.float().reshape(-1)[0].item():.9g}, expected {expected.float().reshape(-1)[0].item():.9g}",
            )
        )


# -- structure and extras -----------------------------------------------------------------------------


def _found_format(ctx: Context, module: str) -> str:
    leaves = {name.rsplit(".", 1)[1]: tensor_meta(ctx.exported, name)[0] for name in ctx.module_outputs(module)}
    return stored_format(leaves)


def _structure_cause(ctx: Context, item: PlannedTensor) -> str:
    expected = item.decision.format if item.quantized else "bf16"
    found = _found_format(ctx, item.module)
    if found in (expected, "absent"):
        return ""
    if expected == "bf16":
        return (
            f"the contract keeps it BF16 ({item.decision.reason}), but the export quantized it to {found}: "
            "the exporter ignores this BF16 exception"
        )
    if found == "bf16":
        return (
            f"the contract gives it {expected} ({item.decision.reason}), but the export sent BF16: "
            "the exporter skipped it"
        )
    return f"the contract gives it {expected} ({item.decision.reason}), but the export sent {found}"


def _owner(ctx: Context, name: str) -> PlannedTensor | None:
    return ctx.plan.items.get(name) or ctx.plan.items.get(name.rsplit(".", 1)[0] + ".weight")


def _extra_finding(ctx: Context, name: str) -> Finding:
    owner = _owner(ctx, name)
    if owner is None:
        return Finding(name, "extra", "not a tensor of this model in this dialect")
    input_suffix = ctx.plan.dialect.suffixes.get("nvfp4", {}).get("input")
    if input_suffix and name.endswith("." + input_suffix) and owner.quantized:
        if not ctx.plan.dialect.writes_input_scale(owner):
            why = (
                f"the contract forbids it: activations are scaled per token (per_token_activations: true), "
                f"and dialect {ctx.plan.dialect.name} stores no {input_suffix}"
            )
        else:
            why = (
                "live updates never re-send input_scale: the engine keeps the activation scale loaded with the "
                "converted checkpoint (pass include_input_scale=True if this exporter is meant to send it)"
            )
        return Finding(name, "input-scale", f"the update carries {input_suffix}", why)
    if not ctx.plan.on_rank(owner, ctx.ep_rank, ctx.ep_size):
        per_rank = ctx.plan.experts_per_rank(ctx.ep_size)
        rank = owner.info.expert // per_rank  # type: ignore[operator]
        return Finding(
            name,
            "extra",
            f"expert {owner.info.expert} belongs to EP rank {rank}, not rank {ctx.ep_rank} "
            f"(experts {ctx.ep_rank * per_rank}-{(ctx.ep_rank + 1) * per_rank - 1})",
        )
    return Finding(name, "extra", f"not an output of `{owner.info.name}` under the contract ({owner.decision.reason})")


def _ep_extra_cause(ctx: Context, owner: PlannedTensor) -> str:
    """For another rank's expert in the export: if it holds the bytes of this rank's expert with the
    same local id, that expert's missing tensors and these extra ones share one cause."""
    per_rank = ctx.plan.experts_per_rank(ctx.ep_size)
    holds = ctx.ep_rank * per_rank + owner.info.expert % per_rank  # type: ignore[operator]
    other = ctx.plan.items.get(expert_name(owner.info.name, holds))
    if other is None or other.info.name not in ctx.sources or not all(n in ctx.exported for n in core_outputs(owner)):
        return ""
    if not matches_other(ctx, owner, other, ctx.actual(owner)):
        return ""
    cause = ep_words(ctx, owner.info.expert, holds, owner.info.layer)  # type: ignore[arg-type]
    ctx.set_cause({n for n, _, _ in other.outputs}, cause)
    return cause


def _explain_extras(ctx: Context, budget: int) -> int:
    ep_causes: dict[str, str] = {}
    for name in ctx.extras:
        finding = _extra_finding(ctx, name)
        owner = _owner(ctx, name)
        if (
            not finding.cause
            and owner is not None
            and owner.is_expert
            and not ctx.plan.on_rank(owner, ctx.ep_rank, ctx.ep_size)
        ):
            if owner.info.name not in ep_causes and budget > 0:
                budget -= 1
                ep_causes[owner.info.name] = _ep_extra_cause(ctx, owner)
            finding = replace(finding, cause=ep_causes.get(owner.info.name, ""))
        ctx.add(finding)
    return budget


def explain(ctx: Context, failing: list[tuple[PlannedTensor, dict[str, int]]], max_diagnosed: int) -> None:
    """Turn the fast path's verdicts into findings with details and causes (see the module docstring).

    Args:
        ctx: the run (its structural findings are already in the report).
        failing: items whose bytes failed, with the fast path's mismatch counts (``{"slow": 1}``
            for items of a group with a broken member, checked here one by one).
        max_diagnosed: modules diagnosed in full; later ones are reported with their counts only.
    """
    budget = _explain_extras(ctx, max_diagnosed)
    for item in ctx.structure_failed:
        cause = _structure_cause(ctx, item)
        if cause:
            ctx.set_cause({n for n, _, _ in item.outputs} | set(ctx.module_outputs(item.module)), cause)
    # The fast path flags a member whose global scale differs from its unit's first member's; the
    # finding belongs on the member(s) whose global scale is wrong, not on a right one.
    broken_groups = {item.decision.fused_group for item, counts in failing if counts.get("shared")}
    for item, counts in failing:
        if counts.get("shared"):
            if not any(counts.get(k) for k in ("data", "scale", "global")):
                continue  # itself right: its sibling is the one reported
        if item.decision.fused_group in broken_groups and counts.get("global"):
            counts = {**counts, "shared": 1}
        if "slow" in counts:
            if all_same_bytes(ctx.actual(item), ctx.reference(item), {}):
                continue
            counts = {"bytes": 1}
        _byte_findings(ctx, item, counts, diagnose=budget > 0)
        budget -= 1
    if ctx.plan.include_input_scale:
        for item in dict.fromkeys(ctx.expected_names.values()):
            if item.quantized and len(item.outputs) > 3 and item not in ctx.structure_failed:
                _input_scale_finding(ctx, item)
