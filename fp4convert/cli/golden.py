"""``fp4convert golden verify|regenerate``: the golden byte fixtures."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json
from fp4convert.verify import golden as golden_lib

_DIR = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("golden"),
    show_default=True,
    help="Folder holding manifest.json and fixtures.safetensors.",
)


@click.group()
def golden() -> None:
    """Golden byte fixtures (random / boundary / zeros / maxes) of every format variant."""


@golden.command()
@_DIR
@options.device
@options.json_output
@click.pass_context
def verify(ctx: click.Context, directory: Path, device: str, as_json: bool) -> None:
    """Recompute every fixture and compare bytes; exit 1 on any difference."""
    results = list(golden_lib.verify(directory, device=device))
    failed = [r for r in results if not r.equal]
    if as_json:
        echo_json([{"name": r.name, "equal": r.equal, "mismatches": r.mismatches} for r in results])
    else:
        for r in failed:
            detail = "; ".join(f"{k}: {v}" for k, v in r.mismatches.items())
            click.echo(f"DIFF {r.name}: {detail}")
        click.echo(f"{len(results) - len(failed)}/{len(results)} fixtures byte-equal on {device}")
    ctx.exit(1 if failed else 0)


@golden.command()
@_DIR
@click.option("--yes", is_flag=True, help="Do not ask before overwriting the expected bytes.")
def regenerate(directory: Path, yes: bool) -> None:
    """Rewrite the expected bytes from the current quantizer (only when asked)."""
    if not yes:
        click.confirm(f"Overwrite the golden fixtures in {directory}?", abort=True)
    manifest = golden_lib.regenerate(directory)
    click.echo(f"wrote {len(manifest['fixtures'])} fixtures to {directory}")
