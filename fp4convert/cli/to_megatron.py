"""``fp4convert to-megatron SRC DST [--contract C]``: HF checkpoint -> Megatron-named BF16 safetensors."""

from __future__ import annotations

from pathlib import Path

import click

from fp4convert.cli import options
from fp4convert.cli.render import echo_json, echo_notes


@click.command("to-megatron")
@click.argument("source")
@click.argument("destination", type=click.Path(path_type=Path))
@options.contract_option(
    required=False,
    help="Precision contract (file or shipped name): also write te-precision.yaml and megatron-args.txt.",
)
@click.option(
    "--expert-layout",
    type=click.Choice(["grouped", "sequential"]),
    default="grouped",
    show_default=True,
    help="Expert names: TEGroupedMLP (linear_fc1.weight{e}) or SequentialMLP (local_experts.{e}.linear_fc1).",
)
@options.revision_option("SOURCE")
@options.overwrite
@options.json_output
def to_megatron(
    source: str,
    destination: Path,
    contract_path: str | None,
    expert_layout: str,
    revision: str | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write the HF checkpoint SOURCE as Megatron-Core-named BF16 safetensors into DESTINATION.

    QKV is interleaved per query group, gate/up concatenated into linear_fc1, experts named for the
    chosen layout; megatron_to_hf gives the HF tensors back byte for byte. With --contract, the
    TransformerEngine precision file and the Megatron flags of the contract are written alongside.
    """
    from fp4convert.megatron import import_hf

    report = import_hf(
        source,
        destination,
        contract=contract_path,
        expert_layout=expert_layout,
        overwrite=overwrite,
        revision=revision,
    )
    echo_notes(report.notes)
    if as_json:
        echo_json(report)
        return
    extra = f"; {', '.join(report.precision_files)} from contract {report.contract}" if report.contract else ""
    click.echo(
        f"wrote {report.tensors} Megatron tensors ({report.family}, {report.expert_layout} experts) from "
        f"{report.source_tensors} HF tensors into {report.destination}{extra}\n"
        f"{report.bytes / 1e9:.3f} GB in {report.seconds:.1f} s"
    )
