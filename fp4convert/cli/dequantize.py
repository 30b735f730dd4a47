"""``fp4convert dequantize SRC DST``: back to a BF16 checkpoint plain transformers loads."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json


@click.command()
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("destination", type=click.Path(path_type=Path))
@options.overwrite
@options.json_output
def dequantize(source: Path, destination: Path, overwrite: bool, as_json: bool) -> None:
    """Dequantize an NVFP4/MXFP8 checkpoint (ModelOpt, SGLang MXFP8 or compressed-tensors) to BF16, or
    an FP8 block-scaled / MXFP4 / fused-expert source to its per-tensor BF16 master."""
    from fp4convert.convert.dequantize import dequantize_checkpoint

    report = dequantize_checkpoint(source, destination, overwrite=overwrite)
    if as_json:
        echo_json(report)
    elif report.source_formats:
        decoded = ", ".join(f"{count} {fmt}" for fmt, count in report.source_formats.items())
        click.echo(f"decoded {decoded} tensors into {report.destination} ({report.copied_tensors} tensors copied)")
    else:
        click.echo(
            f"dequantized {report.nvfp4_modules} NVFP4 and {report.mxfp8_modules} MXFP8 modules "
            f"into {report.destination} ({report.copied_tensors} tensors copied)"
        )
