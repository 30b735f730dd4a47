"""``fp4convert explain FILE TENSOR_NAME``: why a tensor gets its format under a contract.

With a 4over6 contract and ``--model CHECKPOINT_DIR``, it also reads the tensor (and its fused
siblings, for their shared outer scale) and counts which candidate each block takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from fp4convert.cli.contract import CONTRACT_FILE, JSON_OPTION, MODEL_OPTION, load_model
from fp4convert.contract import Contract, Explanation, load_contract
from fp4convert.inventory import ModelInventory

__all__ = ["explain"]


def four_over_six_counts(
    contract: Contract, explanation: Explanation, inventory: ModelInventory | None, model: str | None
) -> dict[str, Any] | None:
    """Which 4over6 candidate each block of the explained tensor takes (None when not 4over6 NVFP4).

    Returns ``{"profile", "tile", "blocks", "map4", "map6"}``, or ``{"profile", "note"}`` when
    ``model`` is not a checkpoint directory holding the tensor in bf16/fp16/fp32.
    """
    recipe = contract.formats.nvfp4
    if explanation.decision.format != "nvfp4" or recipe.four_over_six is None or not explanation.tensor.gemm_weight:
        return None
    profile = contract.nvfp4_profile
    if model is None or not Path(model).is_dir():
        return {"profile": profile, "note": "pass --model CHECKPOINT_DIR to count the candidates its blocks take"}
    import torch

    from fp4convert.checkpoint import open_checkpoint
    from fp4convert.formats.nvfp4 import four_over_six_choices, row_amax

    checkpoint = open_checkpoint(model)
    group = explanation.decision.fused_group
    members = [explanation.tensor.name]
    if group is not None and inventory is not None:
        members = [t.name for t in inventory if t.fused_group == group]
    tensors = {}
    for name in members:
        if name not in checkpoint.tensor_file:
            return {"profile": profile, "note": f"{name} is not in {model}"}
        with checkpoint.open(checkpoint.tensor_file[name]) as shard:
            tensors[name] = shard.read(name)
    x = tensors[explanation.tensor.name]
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.ndim < 2:
        return {
            "profile": profile,
            "note": f"stored as {x.dtype} {tuple(x.shape)}: counts need a bf16/fp16/fp32 matrix",
        }
    amax = torch.stack([row_amax(t.reshape(-1, t.shape[-1])).amax() for t in tensors.values()]).amax()
    map4 = four_over_six_choices(x, profile=profile, tile=recipe.tile, amax=amax)  # type: ignore[arg-type]
    took_four = int(map4.sum())
    return {
        "profile": profile,
        "tile": recipe.tile,
        "blocks": map4.numel(),
        "map4": took_four,
        "map6": map4.numel() - took_four,
    }


def _counts_line(counts: dict[str, Any]) -> str:
    if "note" in counts:
        return f"4over6    {counts['profile']}: {counts['note']}"
    blocks, map4 = counts["blocks"], counts["map4"]
    per_tile = "; one choice per 16x16 tile" if counts["tile"] == "16x16" else ""
    return (
        f"4over6    {counts['profile']}: map-to-4 in {map4} of {blocks} blocks ({100 * map4 / blocks:.1f}%), "
        f"map-to-6 in {counts['map6']}{per_tile}"
    )


def _tensor_lines(explanation: Explanation) -> list[str]:
    tensor, decision = explanation.tensor, explanation.decision
    where = [tensor.role.value]
    if tensor.layer is not None:
        where.append(f"{'MTP ' if tensor.is_mtp else ''}layer {tensor.layer}")
    if tensor.expert is not None:
        where.append(f"expert {tensor.expert}")
    lines = [f"tensor    {tensor.name}"]
    if tensor.megatron_name and tensor.megatron_name != tensor.name:
        lines.append(f"megatron  {tensor.megatron_name}")
    lines.append(f"role      {', '.join(where)}")
    if tensor.fused_group is not None:
        kind = tensor.fused_kind.value if tensor.fused_kind is not None else "fused"
        if decision.fused_group is not None:
            scale = "one outer scale for the group"
        elif decision.format == "bf16":
            scale = "bf16, no outer scale"
        else:
            scale = f"outer scale not shared: fused_groups.{kind} is false"
        lines.append(f"fused     {tensor.fused_group} ({kind}; {scale})")
    lines += [f"format    {decision.format}", f"reason    {decision.reason}"]
    return lines


def render(explanation: Explanation) -> str:
    """The human form of an explanation (what ``explain`` prints without ``--json``)."""
    matched = explanation.decision.matched
    lines = _tensor_lines(explanation)
    lines.append("matched, in precedence order (* won):")
    width = max(len(m.rule) for m in matched)
    for position, match in enumerate(matched):
        marker = "*" if position == 0 else " "
        lines.append(f"  {marker} {match.rule:<{width}}  {match.format:<5}  {match.detail}")
    lines += [f"note: {note}" for note in explanation.notes]
    return "\n".join(lines)


@click.command()
@click.argument("file", type=CONTRACT_FILE)
@click.argument("tensor_name")
@MODEL_OPTION
@click.option(
    "--namespace",
    type=click.Choice(["hf", "megatron"]),
    default=None,
    help="Evaluate only this naming scheme's rules and name exceptions (what one engine sees). "
    "Without a model or family, it also says which scheme TENSOR_NAME is in (default hf).",
)
@JSON_OPTION
def explain(file: Path, tensor_name: str, model: str | None, namespace: str | None, as_json: bool) -> None:
    """Explain the format FILE gives TENSOR_NAME (an HF or Megatron name): every entry that matched it,
    in precedence order, and the one that won. Under a 4over6 contract with --model CHECKPOINT_DIR,
    also count which candidate (map-to-4 / map-to-6) each block of the tensor takes."""
    contract, inventory = load_contract(file), load_model(model)
    explanation = contract.explain(
        tensor_name,
        inventory,
        namespace=namespace,  # type: ignore[arg-type]  # click.Choice guarantees a Namespace
    )
    counts = four_over_six_counts(contract, explanation, inventory, model)
    if as_json:
        data = explanation.to_dict() | ({"four_over_six": counts} if counts is not None else {})
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(explanation) + ("" if counts is None else "\n" + _counts_line(counts)))
