"""Every option and argument type more than one command takes, declared once, spelled once.

Commands stack these decorators; what an option's value turns into (a size in bytes, the model's
inventory) is parsed here too, so two commands can never read one option differently.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fp4convert.dialects import DIALECTS
from fp4convert.errors import ConversionError
from fp4convert.formats.devices import check_device
from fp4convert.inventory import ModelInventory
from fp4convert.model_source import load_model_inventory

__all__ = [
    "CONTRACT_FILE",
    "contract_option",
    "device",
    "dialect_option",
    "json_output",
    "load_model",
    "model_option",
    "overwrite",
    "parse_size",
    "quiet",
    "revision_option",
]

F = TypeVar("F", bound=Callable[..., Any])

#: A contract file argument (``contract check FILE``, ``explain FILE``, ``diff A B``, ``plan CONTRACT``).
CONTRACT_FILE = click.Path(dir_okay=False, path_type=Path)

json_output = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")


def _checked_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return check_device(value)  # a misspelled or absent device is refused before any work


device = click.option(
    "--device",
    default="cpu",
    show_default=True,
    callback=_checked_device,
    help="Where to quantize: cpu, cuda, cuda:1 (same bytes).",
)
overwrite = click.option("--overwrite", is_flag=True, help="Replace an existing destination.")
quiet = click.option("--quiet", "-q", is_flag=True, help="No progress output.")


def contract_option(*, required: bool, help: str) -> Callable[[F], F]:
    """``--contract``: a contract file or a shipped contract name (``nvfp4-experts-per-token``)."""
    return click.option("--contract", "contract_path", required=required, default=None, help=help)


def dialect_option(help: str) -> Callable[[F], F]:
    """``--dialect``: one of the on-disk dialects, ModelOpt by default."""
    return click.option(
        "--dialect", type=click.Choice(sorted(DIALECTS)), default="modelopt", show_default=True, help=help
    )


def revision_option(what: str) -> Callable[[F], F]:
    """``--revision``: the Hub revision (branch, tag or commit) of ``what`` when it is a repo id."""
    return click.option("--revision", default=None, help=f"Hub revision when {what} is a repo id.")


def model_option(*, required: bool = False) -> Callable[[F], F]:
    """``--model CONFIG_OR_DIR``, optional except where a command cannot work without a model."""
    return click.option(
        "--model",
        "model",
        metavar="CONFIG_OR_DIR",
        required=required,  # no explicit default: click >= 8.3 treats default=None as a value
        help="The model: a checkpoint directory, a config.json, a shipped config name (e.g. DeepSeek-V3), "
        "or a tensor list file (JSON/YAML list of {name, shape, role?, layer?, ...}).",
    )


def load_model(model: str | None) -> ModelInventory | None:
    """The inventory ``--model`` names, or None when the option was not given."""
    return load_model_inventory(model) if model else None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}


def parse_size(text: str | None) -> int | None:
    """``"5GB"`` -> 5_000_000_000, ``"512MiB"`` -> 536_870_912; None stays None.

    Example:
        >>> parse_size("5GB"), parse_size("512MiB"), parse_size(None)
        (5000000000, 536870912, None)
    """
    if text is None:
        return None
    match = _SIZE.match(text)
    if not match:
        raise ConversionError(f"--max-shard-size {text!r} is not a size", hint="write e.g. 5GB, 500MB or 2GiB")
    unit = (match.group(2) or "").upper().removesuffix("B")
    return int(float(match.group(1)) * _UNITS[unit])
