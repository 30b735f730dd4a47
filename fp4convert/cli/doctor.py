"""``fp4convert doctor PATH_OR_REPO``: diagnose a checkpoint before an engine loads it; ``--fix DST`` repairs it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json, error_text
from fp4convert.errors import CheckpointError, HubError

if TYPE_CHECKING:
    from fp4convert.doctor import DoctorReport

#: exit status of a checkpoint doctor cannot read (0 healthy, 1 errors found)
UNREADABLE = 2


@click.command()
@click.argument("path")
@options.contract_option(required=False, help="Also judge every tensor against this contract (file or shipped name).")
@click.option("--source", default=None, help="BF16 source (folder or repo id): which arithmetic made each tensor.")
@click.option(
    "--engine",
    type=click.Choice(["sglang", "vllm", "trtllm"]),
    default=None,
    help="Judge for this engine only (default: every engine the config routes to).",
)
@click.option("--headers-only", is_flag=True, help="Read no tensor data (structure, routing, exclude list only).")
@click.option(
    "--fix",
    "fix",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a repaired copy to this new folder (the checkpoint itself is never modified).",
)
@options.overwrite
@options.revision_option("PATH_OR_REPO")
@options.device
@options.json_output
@click.pass_context
def doctor(
    ctx: click.Context,
    path: str,
    contract_path: str | None,
    source: str | None,
    engine: str | None,
    headers_only: bool,
    fix: Path | None,
    overwrite: bool,
    revision: str | None,
    device: str,
    as_json: bool,
) -> None:
    """Diagnose an NVFP4 / MXFP8 checkpoint (ModelOpt, compressed-tensors or SGLang MXFP8, whoever
    wrote it) before an engine loads it. Each finding names its tensors, what SGLang, vLLM and
    TensorRT-LLM do with them, and the fix. Exits 0 when healthy, 1 with errors, 2 when the
    checkpoint cannot be read.
    """
    from fp4convert.doctor import doctor_checkpoint, repair_checkpoint

    try:
        if fix is not None:
            repaired = repair_checkpoint(
                path, fix, source=source, contract=contract_path, engine=engine, overwrite=overwrite, device=device
            )
            report = repaired.after
            assert report is not None
            if as_json:
                echo_json(repaired)
            else:
                for line in repaired.repairs:
                    click.echo(f"repaired: {line}")
                _echo(report)
            ctx.exit(report.exit_code)
        report = doctor_checkpoint(
            path,
            contract=contract_path,
            source=source,
            engine=engine,
            headers_only=headers_only,
            revision=revision,
            device=device,
        )
    except (CheckpointError, HubError) as exc:
        if as_json:
            echo_json({"path": path, "ok": False, "exit_code": UNREADABLE, "error": str(exc)})
        else:
            click.echo(error_text(exc), err=True)
        ctx.exit(UNREADABLE)
    if as_json:
        echo_json(report)
    else:
        _echo(report)
    ctx.exit(report.exit_code)


def _echo(report: DoctorReport) -> None:
    for finding in report.findings:
        click.echo("\n".join(finding.lines()))
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(report.summary())
