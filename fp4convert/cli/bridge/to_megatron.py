"""``fp4convert bridge to-megatron SRC DST [--contract C]``: HF checkpoint -> Megatron-named BF16 safetensors."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from fp4convert.cli import options


@click.command("to-megatron")
@click.argument("source")
@click.argument("destination", type=click.Path(path_type=Path))
@click.option(
    "--contract",
    "contract_path",
    default=None,
    help="Precision contract (file or shipped name): also write its te_precision.yaml.",
)
@click.option(
    "--expert-layout",
    type=click.Choice(["grouped", "sequential"]),
    default="grouped",
    show_default=True,
    help="TEGroupedMLP (linear_fc1.weight{e}) or SequentialMLP (local_experts.{e}.linear_fc1.weight).",
)
@click.option(
    "--ep-rank",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="With --ep-size > 1: write this rank's experts, under local ids.",
)
@click.option("--ep-size", type=click.IntRange(1), default=1, show_default=True, help="Expert-parallel size.")
@click.option("--max-shard-size", default=None, help="Bytes per output file, e.g. 5GB (the default).")
@click.option("--revision", default=None, help="Hub revision when SOURCE is a repo id.")
@options.overwrite
@options.json_output
def to_megatron(
    source: str,
    destination: Path,
    contract_path: str | None,
    expert_layout: str,
    ep_rank: int,
    ep_size: int,
    max_shard_size: str | None,
    revision: str | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write the HF checkpoint SOURCE (folder or Hub repo id) as Megatron-Core-named BF16 safetensors.

    q/k/v are interleaved into linear_qkv and gate/up concatenated into linear_fc1, exactly as the
    family transforms define (megatron_to_hf gives the source back byte for byte). Streams one
    tensor at a time into DESTINATION.partial/ and renames it to DESTINATION once complete.
    """
    from fp4convert.bridge.import_ import import_hf

    report = import_hf(
        source,
        destination,
        contract=contract_path,
        expert_layout=expert_layout,
        ep_rank=ep_rank,
        ep_size=ep_size,
        max_shard_size=options.parse_size(max_shard_size),
        overwrite=overwrite,
        revision=revision,
    )
    if as_json:
        click.echo(json.dumps(asdict(report), indent=2))
        return
    te = f"; TransformerEngine precision file {report.te_precision_file}" if report.te_precision_file else ""
    ep = f", EP rank {report.ep_rank} of {report.ep_size}" if report.ep_size > 1 else ""
    click.echo(
        f"wrote {report.tensors} Megatron tensors from {report.source_tensors} HF tensors ({report.family}, "
        f"{report.expert_layout} experts{ep}) into {report.destination}: {report.bytes / 1e9:.3f} GB in "
        f"{len(report.files)} files{te}"
    )
