"""``fp4convert validate-export DUMP --master SRC --contract C``: prove a live export followed the contract."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json


@click.command("validate-export")
@click.argument("dump", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--master",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="BF16 master: an HF checkpoint folder, or Megatron-named safetensors (folder or file).",
)
@options.contract_option(required=True, help="Precision contract: a file or a shipped name.")
@options.dialect_option("Dialect the exporter writes.")
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
    help="The dump is meant to carry NVFP4 input_scale (live updates do not re-send it).",
)
@click.option("--all", "show_all", is_flag=True, help="List every tensor with its status, not only failures.")
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
    show_all: bool,
    device: str,
    as_json: bool,
) -> None:
    """Check an exporter's DUMP (safetensors with HF names, any number of update buckets) against
    the contract and the BF16 master: every tensor present and nothing extra, formats, dtypes and
    shapes, every byte re-derived from the master, shared fused scales, no input_scale where the
    update must not carry one. Exits 1 on any failure, naming the first differing block and the
    likely cause.
    """
    from fp4convert.megatron import validate_export_files

    report = validate_export_files(
        dump,
        master,
        contract=contract_path,
        dialect=dialect,
        config=config_path,
        ep_rank=ep_rank,
        ep_size=ep_size,
        include_input_scale=include_input_scale,
        device=device,
    )
    if as_json:
        echo_json(report)
        ctx.exit(0 if report.ok else 1)
    for name, status, _ in report.tensors():
        if show_all and status == "ok":
            click.echo(f"ok   {name}")
    for finding in report.findings:
        click.echo(f"FAIL {finding.check:12} {finding.tensor}: {finding.detail}")
        if finding.cause:
            click.echo(f"     cause: {finding.cause}")
    causes = report.causes()
    if causes:
        click.echo("causes:")
        for cause, count in causes.items():
            click.echo(f"  {count:5} x {cause}")
    click.echo(report.summary())
    ctx.exit(0 if report.ok else 1)
