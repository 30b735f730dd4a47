"""``fp4convert diff A B --model M``: the tensors whose format changes between two contracts."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import describe_model, echo_json
from fp4convert.contract import load_contract
from fp4convert.contract.diff import ContractDiff, LayerDiff, diff_contracts
from fp4convert.inventory import ModelInventory
from fp4convert.model_source import load_model_inventory

__all__ = ["diff"]


def _layer_title(layer: LayerDiff, inventory: ModelInventory) -> str:
    if layer.layer is None:
        name = "outside layers"
    elif layer.layer >= inventory.num_layers:
        name = f"layer {layer.layer} (MTP)"
    else:
        name = f"layer {layer.layer}"
    return f"{name}: {len(layer.changes)} tensor(s) change, {layer.bytes_before:,} -> {layer.bytes_after:,} bytes"


def render(result: ContractDiff, inventory: ModelInventory, *, summary: bool) -> str:
    """The human form of a diff (what ``diff`` prints without ``--json``)."""
    lines = [f"{result.before} -> {result.after} on {describe_model(inventory)}"]
    for layer in result.layers:
        lines.append(_layer_title(layer, inventory))
        if summary:
            continue
        width = max(len(c.tensor) for c in layer.changes)
        for c in layer.changes:
            change = f"{c.before} -> {c.after}" + (f" ({c.recipe_change})" if c.recipe_change else "")
            lines.append(
                f"  {c.tensor:<{width}}  {change}  [{c.rule_before} -> {c.rule_after}]  "
                f"{c.bytes_before:,} -> {c.bytes_after:,}"
            )
    lines.append(
        f"total: {len(result.changes)} of {result.num_tensors} tensors change, "
        f"{result.total_before:,} -> {result.total_after:,} bytes"
    )
    return "\n".join(lines)


@click.command()
@click.argument("contract_a", type=options.CONTRACT_FILE)
@click.argument("contract_b", type=options.CONTRACT_FILE)
@options.model_option(required=True)
@click.option("--summary", is_flag=True, help="One line per layer, without the tensor list.")
@options.json_output
def diff(contract_a: Path, contract_b: Path, model: str, summary: bool, as_json: bool) -> None:
    """Show which tensors change format between CONTRACT_A and CONTRACT_B on one model, layer by
    layer, with each changed layer's weight bytes under both."""
    inventory = load_model_inventory(model)
    result = diff_contracts(load_contract(contract_a), load_contract(contract_b), inventory)
    if as_json:
        echo_json(result)
    else:
        click.echo(render(result, inventory, summary=summary))
