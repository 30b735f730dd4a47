"""``fp4convert bridge validate-export DUMP --master SRC --contract C``: prove a live export followed the contract."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.dialects import DIALECTS


@click.command("validate-export")
@click.argument("dump", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--master",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="BF16 master: an HF checkpoint folder, or Megatron-named safetensors (folder or file).",
)
@click.option("--contract", "contract_path", required=True, help="Precision contract: a file or a shipped name.")
@click.option(
    "--dialect",
    type=click.Choice(sorted(DIALECTS)),
    default="modelopt",
    show_default=True,
    help="Dialect the exporter sends.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="The model's config.json (default: the one next to the master).",
)
@click.option("--ep-rank", type=click.IntRange(0), default=0, show_default=True, help="EP rank the dump comes from.")
@click.option("--ep-size", type=click.IntRange(1), default=1, show_default=True, help="Expert-parallel size.")
@click.option(
    "--include-input-scale",
    is_flag=True,
    help="The dump must carry activation scales, as a checkpoint does (live updates must not).",
)
@click.option(
    "--calibration",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="JSON {module: activation amax}, for the expected input scales of calibrated contracts.",
)
@click.option(
    "--diagnose",
    type=click.IntRange(0),
    default=32,
    show_default=True,
    help="How many failing tensors to analyse for the first differing block and a likely cause.",
)
@options.device
@options.json_output
@click.pass_context
def validate_export(
    ctx: click.Context,
    dump: Path,
    master: Path,
    contract_path: str,
    dialect: str,
    config_path: Path | None,
    ep_rank: int,
    ep_size: int,
    include_input_scale: bool,
    calibration: Path | None,
    diagnose: int,
    device: str,
    as_json: bool,
) -> None:
    """Check the exporter's DUMP (safetensors with HF names, any number of update buckets) against the
    contract and the BF16 master: every expected tensor present and nothing extra; format, dtype and
    shape; every byte re-derived from the master; fused siblings sharing one outer scale; no
    input_scale in a live update. Prints each finding with the first differing block and, where it can
    be established, the cause; exits 1 on any failure.
    """
    from fp4convert.bridge.validate import validate_export_files

    report = validate_export_files(
        dump,
        master,
        contract=contract_path,
        config=config_path,
        dialect=dialect,
        ep_rank=ep_rank,
        ep_size=ep_size,
        include_input_scale=include_input_scale,
        calibration=calibration,
        device=device,
        diagnose=diagnose,
    )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
        click.echo(report.summary())
    ctx.exit(0 if report.ok else 1)
