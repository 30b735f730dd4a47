"""``fp4convert convert SRC DST --contract FILE``: the main job."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.ranks import is_root, joined, rank_timeout
from fp4convert.cli.render import echo_json, echo_notes, progress_bar


@click.command()
@click.argument("source")
@click.argument("destination", type=click.Path(path_type=Path))
@options.contract_option(
    required=True, help="Precision contract: a YAML/JSON file, or a shipped name such as nvfp4-experts-per-token."
)
@options.dialect_option("On-disk format engines load.")
@options.device
@click.option("--workers", type=click.IntRange(1), default=None, help="CPU threads for the quantizer.")
@click.option("--max-shard-size", default=None, help="Re-shard the output (e.g. 5GB); default mirrors the input.")
@click.option(
    "--calibration",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="JSON {module: activation amax}; needed when activations are not per-token.",
)
@options.revision_option("SOURCE")
@options.overwrite
@click.option("--resume", is_flag=True, help="Continue an interrupted run, keeping verified shards.")
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Convert source tensors holding NaN/inf values (recorded in the manifest and the model card) "
    "instead of refusing them.",
)
@rank_timeout
@options.quiet
@options.json_output
def convert(
    source: str,
    destination: Path,
    contract_path: str,
    dialect: str,
    device: str,
    workers: int | None,
    max_shard_size: str | None,
    calibration: Path | None,
    revision: str | None,
    overwrite: bool,
    resume: bool,
    allow_nonfinite: bool,
    rank_timeout: float,
    quiet: bool,
    as_json: bool,
) -> None:
    """Convert the HF checkpoint SOURCE (folder or Hub repo id) into DESTINATION under a contract.

    Plans every tensor, refuses before writing anything if the contract cannot hold, converts shard
    by shard, writes config, index and manifest, then verifies the output.

    Under torchrun (torchrun --nproc-per-node P -m fp4convert convert ...) the ranks share the work
    and the output is the same, byte for byte (docs/distributed.md).
    """
    from fp4convert.convert.execute import convert_checkpoint

    with joined(device), progress_bar(not quiet and is_root()) as hook:
        report = convert_checkpoint(
            source,
            destination,
            contract=contract_path,
            dialect=dialect,
            device=device,
            workers=workers,
            max_shard_size=options.parse_size(max_shard_size),
            overwrite=overwrite,
            resume=resume,
            calibration=calibration,
            revision=revision,
            allow_nonfinite=allow_nonfinite,
            progress=hook,
            rank_timeout=rank_timeout,
        )
    if not is_root():
        return
    if as_json:
        echo_json(report)
        return
    if report.nonfinite:
        echo_notes(
            [f"{len(report.nonfinite)} source tensors held NaN/inf values, converted as asked (--allow-nonfinite)"]
        )
    formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(report.formats.items()))
    click.echo(
        f"converted {report.tensors} tensors ({formats}) with contract {report.contract} "
        f"into {report.destination} [{report.dialect}]\n"
        f"{report.source_bytes / 1e9:.3f} GB -> {report.output_bytes / 1e9:.3f} GB in {report.seconds:.1f} s; "
        f"verified"
    )
