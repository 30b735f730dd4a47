"""Click options and renderers shared by several commands (declared once, spelled once)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click

from fp4convert.errors import ConversionError

json_output = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
device = click.option(
    "--device", default="cpu", show_default=True, help="Where to quantize: cpu, cuda, cuda:1 (same bytes)."
)
overwrite = click.option("--overwrite", is_flag=True, help="Replace an existing destination.")
quiet = click.option("--quiet", "-q", is_flag=True, help="No progress bars.")

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
    """``"5GB"`` -> 5_000_000_000, ``"512MiB"`` -> 536_870_912; None stays None."""
    if text is None:
        return None
    match = _SIZE.match(text)
    if not match:
        raise ConversionError(f"--max-shard-size {text!r} is not a size", hint="write e.g. 5GB, 500MB or 2GiB")
    unit = (match.group(2) or "").upper().removesuffix("B")
    return int(float(match.group(1)) * _UNITS[unit])


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
            elif event == "tensor":
                bar.advance(task, payload["bytes"])

        yield hook
