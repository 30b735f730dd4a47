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
    type=click.Choice(["grouped", "sequential", "single_grouped", "legacy_grouped"]),
    default=None,
    help="Experts: TEGroupedMLP (linear_fc1.weight{e}), SequentialMLP (local_experts.{e}.linear_fc1), one stacked "
    "linear_fc1.weight (moe_single_grouped_weight) or legacy GroupedMLP weight1/weight2. Default: the spec's.",
)
@click.option(
    "--spec",
    type=click.Choice(["te", "local", "modelopt"]),
    default="te",
    show_default=True,
    help="Megatron-Core layer spec: TE fuses norms into layer_norm_weight; local and ModelOpt keep them apart.",
)
@click.option(
    "--megatron-version",
    default=None,
    help="Megatron-Core version to write for (e.g. 0.16.1: MTP inner layer `transformer_layer`). Default: current.",
)
@click.option("--mla-down-proj-fusion", is_flag=True, help="MLA: one linear_qkv_down_proj (Megatron-Core >= 0.17).")
@options.revision_option("SOURCE")
@options.overwrite
@options.json_output
def to_megatron(
    source: str,
    destination: Path,
    contract_path: str | None,
    expert_layout: str | None,
    spec: str,
    megatron_version: str | None,
    mla_down_proj_fusion: bool,
    revision: str | None,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write the HF checkpoint SOURCE as Megatron-Core-named BF16 safetensors into DESTINATION.

    QKV is interleaved per query group, gate/up concatenated into linear_fc1, experts named for the
    chosen layout; megatron_to_hf gives the HF tensors back byte for byte. With --contract, the
    TransformerEngine precision file and the Megatron flags of the contract are written alongside.
    """
    from fp4convert.families import MegatronSpelling
    from fp4convert.megatron import import_hf

    spelling = MegatronSpelling.parse(
        spec, megatron_version=megatron_version, experts=expert_layout, mla_down_proj_fusion=mla_down_proj_fusion
    )
    report = import_hf(
        source,
        destination,
        contract=contract_path,
        spelling=spelling,
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
