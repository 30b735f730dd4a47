"""``fp4convert verify DST [--source SRC]``."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.ranks import is_root, joined, rank_timeout
from fp4convert.cli.render import echo_json


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--source", default=None, help="BF16 source (folder or repo id): re-quantize and compare bytes.")
@options.device
@rank_timeout
@options.json_output
@click.pass_context
def verify(
    ctx: click.Context, directory: Path, source: str | None, device: str, rank_timeout: float, as_json: bool
) -> None:
    """Check a converted checkpoint: structure, hashes, shared scales, and (with --source) every byte.

    Under torchrun each rank checks its share of the shards (docs/distributed.md).
    """
    from fp4convert.verify.distributed import verify_distributed

    with joined(device):
        report = verify_distributed(directory, source=source, device=device, rank_timeout=rank_timeout)
    if not is_root():
        ctx.exit(0 if report.ok else 1)
    if as_json:
        echo_json(report)
    else:
        for failure in report.failures:
            click.echo(f"FAIL {failure.check:12} {failure.name}: {failure.detail}")
        click.echo(report.summary())
    ctx.exit(0 if report.ok else 1)
