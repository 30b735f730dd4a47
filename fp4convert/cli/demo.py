"""``fp4convert demo``: convert and verify a small embedded model (no download)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json


@click.command()
@click.argument("workdir", required=False, type=click.Path(file_okay=False, path_type=Path))
@options.json_output
@click.pass_context
def demo(ctx: click.Context, workdir: Path | None, as_json: bool) -> None:
    """Build a tiny Qwen3-MoE checkpoint, convert it under the shipped per-token NVFP4 experts
    contract (ModelOpt dialect), and verify every byte against the source.

    WORKDIR keeps the files (default: a temporary folder, removed afterwards).
    """
    from fp4convert.demo import run_demo

    with tempfile.TemporaryDirectory(prefix="fp4convert-demo-") as tmp:
        report = run_demo(workdir or Path(tmp))
        if as_json:
            echo_json(report)
        else:
            c = report.conversion
            formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(c.formats.items()))
            size = f"{c.source_bytes / 1e6:.1f} MB bf16"
            click.echo(f"source      tiny Qwen3-MoE (4 layers, 8 experts), {size}: {report.source}")
            click.echo(f"contract    {c.contract} (sha256 {c.contract_sha256[:12]})")
            click.echo(
                f"converted   {c.tensors} tensors ({formats}) -> {c.output_bytes / 1e6:.1f} MB "
                f"[{c.dialect}] in {c.seconds:.2f} s: {c.destination}"
            )
            click.echo(f"verified    {report.verification.summary()}")
            click.echo("serve with  (fp4convert contract emit nvfp4-experts-per-token --target env)")
            click.echo("".join(f"  {line}\n" for line in report.environment.splitlines()), nl=False)
    ctx.exit(0 if report.verification.ok else 1)
