"""``fp4convert explain FILE TENSOR_NAME``: why a tensor gets its format under a contract.

With a 4over6 contract and ``--model CHECKPOINT_DIR``, it also counts which candidate each block of
the tensor takes (:func:`fp4convert.candidates.four_over_six_counts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fp4convert.candidates import four_over_six_counts
from fp4convert.cli import options
from fp4convert.cli.render import echo_json
from fp4convert.contract import Explanation, load_contract
from fp4convert.model_source import explain_name

__all__ = ["explain"]


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
@click.argument("file", type=options.CONTRACT_FILE)
@click.argument("tensor_name")
@options.model_option()
@click.option(
    "--namespace",
    type=click.Choice(["hf", "megatron"]),
    default=None,
    help="Evaluate only this naming scheme's rules and name exceptions (what one engine sees). "
    "Without a model or family, it also says which scheme TENSOR_NAME is in (default hf).",
)
@options.json_output
def explain(file: Path, tensor_name: str, model: str | None, namespace: str | None, as_json: bool) -> None:
    """Explain the format FILE gives TENSOR_NAME (an HF or Megatron name): every entry that matched it,
    in precedence order, and the one that won. Under a 4over6 contract with --model CHECKPOINT_DIR,
    also count which candidate (map-to-4 / map-to-6) each block of the tensor takes."""
    contract, inventory = load_contract(file), options.load_model(model)
    explanation = explain_name(
        contract,
        tensor_name,
        inventory,
        namespace=namespace,  # type: ignore[arg-type]  # click.Choice guarantees a Namespace
    )
    counts = four_over_six_counts(contract, explanation, inventory, model)
    if as_json:
        echo_json(explanation.to_json() | ({"four_over_six": counts} if counts is not None else {}))
    else:
        click.echo(render(explanation) + ("" if counts is None else "\n" + _counts_line(counts)))
