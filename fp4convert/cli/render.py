"""How commands write: one JSON form for every result, one form for every error, progress on stderr.

stdout carries the result (text, or JSON with ``--json``), stderr carries notes, progress and
errors. :func:`json_text` is the only place a result becomes JSON; :func:`problem_text` is the only
place an error (or a lint finding) becomes text, so ``error[code]: message`` and its hint read the
same everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click

from fp4convert.errors import Fp4ConvertError
from fp4convert.inventory import ModelInventory

__all__ = [
    "describe_model",
    "echo_json",
    "echo_notes",
    "error_text",
    "json_text",
    "problem_text",
    "progress_bar",
]


def json_text(result: Any) -> str:
    """The JSON form of a command's result.

    A result type with a ``to_json()`` method gives its own plain data; any other dataclass gives its
    fields; plain data (dicts, lists) is written as it is.

    Example:
        >>> print(json_text({"tensors": 3, "ok": True}))
        {
          "tensors": 3,
          "ok": true
        }
    """
    to_json = getattr(result, "to_json", None)
    if callable(to_json):
        data = to_json()
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        data = dataclasses.asdict(result)
    else:
        data = result
    return json.dumps(data, indent=2)


def echo_json(result: Any) -> None:
    """Print :func:`json_text` of ``result`` on stdout."""
    click.echo(json_text(result))


def problem_text(severity: str, code: str, message: str, hint: str | None) -> str:
    """``severity[code]: message`` and, on its own line, ``hint: ...``.

    Example:
        >>> print(problem_text("error", "contract", "rules[0] is ambiguous", "make one pattern more specific"))
        error[contract]: rules[0] is ambiguous
          hint: make one pattern more specific
    """
    text = f"{severity}[{code}]: {message}"
    if hint:
        text += f"\n  hint: {hint}"
    return text


def error_text(exc: Fp4ConvertError) -> str:
    """The lines a library error shows: ``error[code]: message`` and its hint."""
    return problem_text("error", exc.code, exc.message, exc.hint)


def echo_notes(notes: Iterable[str]) -> None:
    """Each note as ``note: ...`` on stderr (what a result could not carry, or what was assumed)."""
    for note in notes:
        click.echo(f"note: {note}", err=True)


def describe_model(inventory: ModelInventory) -> str:
    """``qwen3_moe (48 layers, 18867 tensors)``.

    Example:
        >>> describe_model(ModelInventory("deepseek_v3", 61, (), num_mtp_layers=1))
        'deepseek_v3 (61 + 1 MTP layers, 0 tensors)'
    """
    mtp = f" + {inventory.num_mtp_layers} MTP" if inventory.num_mtp_layers else ""
    return f"{inventory.family} ({inventory.num_layers}{mtp} layers, {len(inventory)} tensors)"


@contextmanager
def progress_bar(enabled: bool, label: str = "converting") -> Iterator[Any]:
    """A rich progress bar on stderr driven by converter events; a no-op hook when disabled."""
    if not enabled or not sys.stderr.isatty():
        yield lambda event, payload: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=None)

        def hook(event: str, payload: Mapping[str, Any]) -> None:
            if event == "plan":
                bar.update(task, total=payload["bytes"])
            elif event == "shard":
                bar.update(task, description=f"{label} {payload['file']}")
                if payload.get("resumed"):
                    bar.advance(task, payload["bytes"])
            elif event in ("tensor", "bytes"):  # "bytes": done by another rank
                bar.advance(task, payload["bytes"])

        yield hook
