"""``fp4convert plan CONTRACT --model M``: every tensor's format, the rule behind it, and the bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from fp4convert.cli import options
from fp4convert.cli.render import describe_model, echo_json
from fp4convert.contract import load_contract
from fp4convert.hub import resolve_model_config
from fp4convert.model_source import load_model_inventory
from fp4convert.plan import Plan, Totals, build_plan, human_bytes

__all__ = ["plan", "render"]

_PIPE_WIDTH = 180


def _layer_name(layer: int | None, plan: Plan) -> str:
    if layer is None:
        return "outside layers"
    return f"{layer} (MTP)" if layer >= plan.num_layers else str(layer)


def _totals_table(title: str, first: str, rows: dict[str, Totals], params_of: int) -> Table:
    table = Table(title=title, title_justify="left")
    for column in (first, "tensors", "params", "% of decoder params", "bytes before", "bytes after"):
        table.add_column(column, justify="left" if column == first else "right", no_wrap=column != first)
    for key, totals in rows.items():
        share = f"{100 * totals.params / params_of:.2f}" if params_of else "-"
        table.add_row(
            key,
            f"{totals.tensors:,}",
            f"{totals.params:,}",
            share,
            human_bytes(totals.bytes_before),
            human_bytes(totals.bytes_after),
        )
    return table


def render(plan: Plan, console: Console, *, model: str, tensors: bool) -> None:
    """Print the human form of a plan (what ``plan`` prints without ``--json``)."""
    console.print(f"plan: contract '{plan.contract}' on {model}")
    if tensors:
        table = Table(title="Tensors (routed experts folded under *)", title_justify="left")
        for column in ("tensor", "shape", "role", "format", "rule", "bytes before", "bytes after"):
            numeric = column.startswith("bytes") or column == "shape"
            table.add_column(column, justify="right" if numeric else "left", no_wrap=numeric)
        for row in plan.rows():
            name = row.name if row.count == 1 else f"{row.name} (x{row.count})"
            shape = "x".join(map(str, row.shape))
            before, after = human_bytes(row.bytes_before), human_bytes(row.bytes_after)
            table.add_row(name, shape, row.role, row.format, row.rule, before, after)
        console.print(table)
    decoder = plan.total()
    mtp = " (MTP layers counted apart)" if plan.num_mtp_layers else ""
    by_role = {**plan.by_role(), "experts (routed + shared)": plan.experts(), "decoder model": decoder}
    if plan.num_mtp_layers:
        by_role |= {"MTP layers": plan.total(mtp=True), "all": plan.total(mtp=None)}
    console.print(_totals_table(f"Per role{mtp}", "role", by_role, decoder.params))
    console.print(_totals_table(f"Per winning rule{mtp}", "rule", plan.by_rule(), decoder.params))
    console.print(_totals_table(f"Per format{mtp}", "format", plan.by_format(), decoder.params))
    by_source = plan.by_source_format()
    if by_source:  # read from a checkpoint: how it stores its tensors, and what comes back exactly
        console.print(_totals_table(f"Per source format{mtp}", "source format", by_source, decoder.params))
        counts = ", ".join(f"{n:,} {word}" for word, n in plan.lossless_counts().items())
        console.print(f"lossless (dequantized output == dequantized source, docs/sources.md): {counts}")
    by_layer = {_layer_name(layer, plan): totals for layer, totals in plan.by_layer().items()}
    console.print(_totals_table("Per layer", "layer", by_layer, decoder.params))


@click.command()
@click.argument("contract", type=options.CONTRACT_FILE)
@options.model_option(required=True)
@options.revision_option("--model")
@click.option("--summary", is_flag=True, help="Totals only: no per-tensor rows (also in --json).")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE.png|FILE.svg",
    help="Also draw the layer x role grid coloured by format, with bytes per layer (needs matplotlib).",
)
@options.json_output
def plan(
    contract: Path, model: str, revision: str | None, summary: bool, plot_path: Path | None, as_json: bool
) -> None:
    """Show what CONTRACT does to every tensor of a model: the resolved format, the rule that decided
    it, and the bytes before and after conversion, with totals per role, rule, format and layer.

    Routed experts are folded into one row per layer and projection in the text output; --json
    lists every tensor. --model may also be a Hub repo id: its config.json alone is downloaded.
    """
    inventory = load_model_inventory(resolve_model_config(model, revision=revision))
    result = build_plan(load_contract(contract), inventory)
    if plot_path is not None:
        from fp4convert.plan_plot import plot_plan

        plot_plan(result, plot_path)
        click.echo(f"wrote {plot_path}", err=True)
    if as_json:
        echo_json(result.to_dict(tensors=not summary))
        return
    # Piped output gets a width that fits the longest tensor names instead of rich's 80 columns.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else _PIPE_WIDTH)
    render(result, console, model=describe_model(inventory), tensors=not summary)
