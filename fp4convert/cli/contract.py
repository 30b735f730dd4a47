"""``fp4convert contract check|schema|emit``: precision contract files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import describe_model, echo_json, echo_notes, problem_text
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.contract.emit import TARGETS, emit
from fp4convert.contract.lint import lint
from fp4convert.plan import build_plan, human_bytes

__all__ = ["contract"]


@click.group()
def contract() -> None:
    """Precision contracts: check a file, print the JSON Schema, emit engine settings."""


@contract.command()
@click.argument("file", type=options.CONTRACT_FILE)
@options.model_option()
@options.json_output
@click.pass_context
def check(ctx: click.Context, file: Path, model: str | None, as_json: bool) -> None:
    """Parse and lint FILE; with --model, also resolve every tensor of the model.

    Exits 1 when an error is found (warnings alone exit 0).
    """
    loaded = load_contract(file)
    inventory = options.load_model(model)
    findings = lint(loaded, inventory)
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    # A model read from a checkpoint: how it stores its tensors, bytes read and written per format.
    sources = {} if inventory is None or errors else build_plan(loaded, inventory).by_source_format()
    if as_json:
        report = {
            "file": str(file),
            "contract": loaded.name,
            "sha256": contract_hash(loaded),
            "model": None if inventory is None else describe_model(inventory),
            "errors": errors,
            "warnings": warnings,
            "findings": [dataclasses.asdict(f) for f in findings],
            "source_formats": {fmt: totals.to_dict() for fmt, totals in sources.items()},
        }
        echo_json(report)
    else:
        for finding in findings:
            click.echo(problem_text(finding.severity, finding.code, finding.message, finding.hint))
        for fmt, totals in sources.items():
            click.echo(
                f"source {fmt}: {totals.tensors:,} tensors, {human_bytes(totals.bytes_before)} read -> "
                f"{human_bytes(totals.bytes_after)} written"
            )
        on_model = "" if inventory is None else f" on {describe_model(inventory)}"
        click.echo(
            f"{file}: contract '{loaded.name}' (sha256 {contract_hash(loaded)[:16]}){on_model}: "
            f"{errors} error(s), {warnings} warning(s)"
        )
    ctx.exit(1 if errors else 0)


@contract.command()
def schema() -> None:
    """Print the JSON Schema of contract files."""
    echo_json(Contract.model_json_schema())


@contract.command(name="emit")
@click.argument("file", type=options.CONTRACT_FILE)
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    required=True,
    help="te-yaml: TransformerEngine precision file; megatron-args: Megatron/Miles flags; "
    "sglang-args: SGLang flags; env: environment variables.",
)
@options.model_option()
def emit_command(file: Path, target: str, model: str | None) -> None:
    """Print FILE as one consumer's settings; notes on what the target cannot carry go to stderr.

    --model is needed when a layer count is a fraction or MTP layers are kept BF16 (megatron-args).
    """
    inventory = options.load_model(model)
    result = emit(
        load_contract(file),
        target,  # type: ignore[arg-type]  # click.Choice guarantees a Target
        num_layers=None if inventory is None else inventory.num_layers,
        num_mtp_layers=0 if inventory is None else inventory.num_mtp_layers,
    )
    click.echo(result.text, nl=False)
    echo_notes(result.notes)
