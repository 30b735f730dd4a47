"""``fp4convert contract check|schema|emit``: precision contract files.

The options shared with ``explain`` and ``diff`` (``--model``, ``--json``) are declared here once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.contract.emit import TARGETS, emit
from fp4convert.contract.lint import lint
from fp4convert.contract.model_source import load_model_inventory
from fp4convert.inventory import ModelInventory

__all__ = [
    "CONTRACT_FILE",
    "JSON_OPTION",
    "MODEL_OPTION",
    "contract",
    "describe_model",
    "load_model",
    "model_option",
]

CONTRACT_FILE = click.Path(dir_okay=False, path_type=Path)


def model_option(*, required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--model CONFIG_OR_DIR``, optional except where a command cannot work without a model."""
    return click.option(
        "--model",
        "model",
        metavar="CONFIG_OR_DIR",
        required=required,  # no explicit default: click >= 8.3 treats default=None as a value
        help="The model: a checkpoint directory, a config.json, a shipped config name (e.g. DeepSeek-V3), "
        "or a tensor list file (JSON/YAML list of {name, shape, role?, layer?, ...}).",
    )


MODEL_OPTION = model_option()
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of text.")


def load_model(model: str | None) -> ModelInventory | None:
    """The inventory ``--model`` names, or None when the option was not given."""
    return load_model_inventory(model) if model else None


def describe_model(inventory: ModelInventory) -> str:
    """``qwen3_moe (48 layers, 18867 tensors)``."""
    mtp = f" + {inventory.num_mtp_layers} MTP" if inventory.num_mtp_layers else ""
    return f"{inventory.family} ({inventory.num_layers}{mtp} layers, {len(inventory)} tensors)"


@click.group()
def contract() -> None:
    """Precision contracts: check a file, print the JSON Schema, emit engine settings."""


@contract.command()
@click.argument("file", type=CONTRACT_FILE)
@MODEL_OPTION
@JSON_OPTION
@click.pass_context
def check(ctx: click.Context, file: Path, model: str | None, as_json: bool) -> None:
    """Parse and lint FILE; with --model, also resolve every tensor of the model.

    Exits 1 when an error is found (warnings alone exit 0).
    """
    loaded = load_contract(file)
    inventory = load_model(model)
    findings = lint(loaded, inventory)
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    if as_json:
        report = {
            "file": str(file),
            "contract": loaded.name,
            "sha256": contract_hash(loaded),
            "model": None if inventory is None else describe_model(inventory),
            "errors": errors,
            "warnings": warnings,
            "findings": [dataclasses.asdict(f) for f in findings],
        }
        click.echo(json.dumps(report, indent=2))
    else:
        for finding in findings:
            click.echo(f"{finding.severity}[{finding.code}]: {finding.message}")
            click.echo(f"  hint: {finding.hint}")
        on_model = "" if inventory is None else f" on {describe_model(inventory)}"
        click.echo(
            f"{file}: contract '{loaded.name}' (sha256 {contract_hash(loaded)[:16]}){on_model}: "
            f"{errors} error(s), {warnings} warning(s)"
        )
    ctx.exit(1 if errors else 0)


@contract.command()
def schema() -> None:
    """Print the JSON Schema of contract files."""
    click.echo(json.dumps(Contract.model_json_schema(), indent=2))


@contract.command(name="emit")
@click.argument("file", type=CONTRACT_FILE)
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    required=True,
    help="te-yaml: TransformerEngine precision file; megatron-args: Megatron/Miles flags; "
    "sglang-args: SGLang flags; env: environment variables.",
)
@MODEL_OPTION
def emit_command(file: Path, target: str, model: str | None) -> None:
    """Print FILE as one consumer's settings; notes on what the target cannot carry go to stderr.

    --model is needed when a layer count is a fraction or MTP layers are kept BF16 (megatron-args).
    """
    inventory = load_model(model)
    result = emit(
        load_contract(file),
        target,  # type: ignore[arg-type]  # click.Choice guarantees a Target
        num_layers=None if inventory is None else inventory.num_layers,
        num_mtp_layers=0 if inventory is None else inventory.num_mtp_layers,
    )
    click.echo(result.text, nl=False)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
