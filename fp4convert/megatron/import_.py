"""``to-megatron``: an HF checkpoint -> Megatron-Core-named BF16 safetensors, plus the contract's
TransformerEngine precision file.

The learner side of a run starts here: the same BF16 weights the converter quantizes for the
sampler, named and laid out as Megatron-Core holds them (QKV interleaved per query group, gate/up
concatenated into ``linear_fc1``, TEGroupedMLP or SequentialMLP experts), and the files that make
TransformerEngine quantize them as the contract says (``te-precision.yaml`` for
``--te-precision-config-file``, ``megatron-args.txt`` with the layer counts TE matchers cannot
carry). Reading ``fp4convert.families.megatron_to_hf`` over the output gives the HF tensors back
byte for byte.

Streaming with bounded memory: one Megatron tensor's HF pieces are read, fused and written before
the next. An FP8 or MXFP4 source is dequantized on the way, by the one dequantizer the converter
uses (docs/sources.md), so the learner's BF16 master is exactly what the sampler was converted
from. Written like the converter: into ``DST.partial/``, shard headers first, renamed to ``DST``
only when complete.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.decode import DecodedSource
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.safetensors_io import StreamingWriter, dtype_name
from fp4convert.checkpoint.source import INDEX_NAME, SourceCheckpoint, open_checkpoint, output_shard_names
from fp4convert.checkpoint.staging import prepare_staging, publish, write_json_atomic
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.contract.emit import emit
from fp4convert.convert.shards import SHARD_METADATA
from fp4convert.errors import ConversionError
from fp4convert.families import ExpertLayout, MegatronSpelling, hf_to_megatron, packed_name
from fp4convert.hub import resolve_source
from fp4convert.inventory import ModelInventory, TensorInfo
from fp4convert.inventory.dtypes import torch_dtype
from fp4convert.version import __version__

__all__ = ["MANIFEST_NAME", "PRECISION_FILES", "ImportReport", "import_hf"]

#: the manifest ``to-megatron`` writes next to the tensors
MANIFEST_NAME = "megatron.json"
#: emit target -> file name, written when a contract is given
PRECISION_FILES = {"te-yaml": "te-precision.yaml", "megatron-args": "megatron-args.txt"}

#: progress callback: (event, payload); events "plan", "tensor", "done"
ProgressHook = Callable[[str, Mapping[str, Any]], None]


@dataclass
class ImportReport:
    """What ``import_hf`` wrote."""

    destination: str
    family: str
    expert_layout: str
    source_tensors: int
    tensors: int
    bytes: int
    seconds: float
    files: list[str] = field(default_factory=list)
    contract: str | None = None
    precision_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _is_shared_copy(info: TensorInfo) -> bool:
    # An MTP-layer HF tensor held by a Megatron tensor outside the MTP block is a copy of the
    # embedding / output layer Megatron shares with the MTP layers: it adds no Megatron tensor
    # (hf_to_megatron checks it equals the original byte for byte and drops it).
    return info.is_mtp and info.megatron_name is not None and not info.megatron_name.startswith("mtp.")


@dataclass
class _Target:
    """One Megatron tensor: the HF tensors it is made of, and where it is written."""

    members: list[TensorInfo]
    file: str = ""
    name: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()


def _targets(inventory: ModelInventory, source: SourceCheckpoint, spelling: MegatronSpelling) -> list[_Target]:
    """Megatron tensors in source-file order, each with its name, dtype and shape from a meta dry run."""
    groups: dict[str, _Target] = {}
    for info in inventory:  # stacked experts / fused MLA down projections gather several tables' tensors
        groups.setdefault(packed_name(info.megatron_name or info.name, spelling), _Target([])).members.append(info)
    view = source.view()
    targets = sorted(groups.values(), key=lambda target: view.tensors[target.members[0].name].position)
    for target in targets:
        meta = {
            i.name: torch.empty(i.shape, dtype=torch_dtype(i.dtype), device="meta")
            for i in target.members
            if not _is_shared_copy(i)
        }
        [(name, tensor)] = hf_to_megatron(meta, inventory.family, inventory.config, spelling=spelling).items()
        target.name, target.dtype, target.shape = name, dtype_name(tensor.dtype), tuple(tensor.shape)
        target.file = view.file_of(target.members[0].name)
    files = [f for f in source.shards if any(t.file == f for t in targets)]
    names = dict(zip(files, output_shard_names(len(files)), strict=True))
    for target in targets:
        target.file = names[target.file]
    return targets


def _precision_files(contract: Contract, inventory: ModelInventory) -> tuple[dict[str, str], list[str]]:
    texts: dict[str, str] = {}
    notes: list[str] = []
    for target, file_name in PRECISION_FILES.items():
        emitted = emit(contract, target, num_layers=inventory.num_layers, num_mtp_layers=inventory.num_mtp_layers)  # type: ignore[arg-type]
        texts[file_name] = emitted.text
        notes += [f"{file_name}: {note}" for note in emitted.notes]
    return texts, notes


def _write_shard(
    path: Path,
    targets: list[_Target],
    source: DecodedSource,
    inventory: ModelInventory,
    spelling: MegatronSpelling,
    hook: ProgressHook,
) -> dict[str, str]:
    tmp = path.with_name(path.name + ".tmp")
    writer = StreamingWriter(
        tmp,
        [(t.name, t.dtype, t.shape) for t in targets],
        metadata=SHARD_METADATA,
    )
    try:
        for target in targets:
            # The BF16 master of a quantized source is its one dequantization (docs/sources.md).
            pieces = {info.name: source[info.name] for info in target.members}
            out = hf_to_megatron(pieces, inventory.family, inventory.config, spelling=spelling)
            writer.write(target.name, out[target.name])
            hook(
                "tensor",
                {"name": target.name, "bytes": sum(t.numel() * t.element_size() for t in pieces.values())},
            )
        writer.close()
    except BaseException:
        writer.abort()
        raise
    os.replace(tmp, path)
    return writer.sha256


def import_hf(
    source: str | Path,
    destination: str | Path,
    *,
    contract: Contract | str | Path | None = None,
    expert_layout: ExpertLayout | str = ExpertLayout.GROUPED,
    overwrite: bool = False,
    revision: str | None = None,
    progress: ProgressHook | None = None,
    spelling: MegatronSpelling | None = None,
) -> ImportReport:
    """Write an HF checkpoint's BF16 weights under Megatron-Core names, with the contract's TE files.

    Args:
        source: an HF checkpoint folder, or a Hub repo id (safetensors only).
        destination: the output folder; refused if it exists unless ``overwrite``.
        contract: a contract (object, file or shipped name); when given, ``te-precision.yaml`` and
            ``megatron-args.txt`` are written from it (``fp4convert.contract.emit``).
        expert_layout: ``grouped`` (TEGroupedMLP ``linear_fc1.weight{e}``) or ``sequential``
            (SequentialMLP ``local_experts.{e}.linear_fc1.weight``).
        overwrite: replace an existing destination.
        revision: Hub revision of ``source``.
        progress: called with progress events.
        spelling: the Megatron-Core spelling to write (layer spec norms, MTP name of the version,
            expert layout, MLA fusion: :class:`~fp4convert.families.MegatronSpelling`); None writes
            the TE spec with ``expert_layout``.

    Returns:
        An :class:`ImportReport`.

    Raises:
        MappingError: a source tensor is not part of the model's family, or an MTP copy differs
            from the tensor Megatron shares.
        ContractError: the contract cannot be written as a TE precision file.
        ConversionError: the destination is unusable.
        CheckpointError: unreadable source files.

    Example (not run: it needs the Qwen3-30B-A3B checkpoint):
        >>> import_hf("Qwen3-30B-A3B", "qwen3-megatron", contract="nvfp4-experts-per-token")  # doctest: +SKIP
    """
    started = time.perf_counter()
    hook: ProgressHook = progress or (lambda event, payload: None)
    layout = ExpertLayout(expert_layout)
    if spelling is None:
        spelling = MegatronSpelling(experts=layout)
    elif layout is not ExpertLayout.GROUPED and layout is not spelling.experts:
        raise ConversionError(
            f"--expert-layout {layout.value} contradicts the spelling's {spelling.experts.value}",
            hint="give the expert layout once",
        )
    layout = spelling.experts
    source_path = resolve_source(source, revision=revision)
    ckpt = open_checkpoint(source_path)
    inventory = ckpt.inventory()
    the_contract = (
        None if contract is None else contract if isinstance(contract, Contract) else load_contract(contract)
    )
    texts, notes = _precision_files(the_contract, inventory) if the_contract is not None else ({}, [])
    targets = _targets(inventory, ckpt, spelling)  # everything is decided before a byte is written
    view = ckpt.view()
    with DecodedSource(ckpt) as decoded:
        decoded.check_scales()  # a corrupt source scale is refused before anything is written
        staging = prepare_staging(source_path, Path(destination), overwrite=overwrite, resumable=False)
        hook("plan", {"tensors": len(targets), "bytes": sum(t.nbytes for t in view)})
        by_file: dict[str, list[_Target]] = {}
        for target in targets:
            by_file.setdefault(target.file, []).append(target)
        sha: dict[str, str] = {}
        for file_name, group in by_file.items():
            sha.update(_write_shard(staging / file_name, group, decoded, inventory, spelling, hook))
    total = sum((staging / f).stat().st_size for f in by_file)
    if len(by_file) > 1:
        write_json_atomic(
            staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": {t.name: t.file for t in targets}}
        )
    if view.decodes:  # the output holds BF16 masters: the source's quantization_config no longer applies
        config = {k: v for k, v in ckpt.config.items() if k != "quantization_config"}
        write_json_atomic(staging / "config.json", config)
    else:
        shutil.copy2(ckpt.root / "config.json", staging / "config.json")
    for name in ckpt.other_files:
        shutil.copy2(ckpt.root / name, staging / name)
    for name, text in texts.items():
        (staging / name).write_text(text)
    write_json_atomic(
        staging / MANIFEST_NAME,
        {
            "producer": {"name": "fp4convert", "version": __version__},
            "family": inventory.family,
            "expert_layout": layout.value,
            "spelling": {
                "separate_norms": spelling.separate_norms,
                "mtp_inner": spelling.mtp_inner.value,
                "mla_down_proj_fusion": spelling.mla_down_proj_fusion,
            },
            "source": {
                "location": str(source),
                "revision": revision,
                "config_sha256": file_sha256(ckpt.root / "config.json"),
                "formats": view.formats(),
                "dequantizers": view.dequantizers(),
            },
            "contract": None
            if the_contract is None
            else {"name": the_contract.name, "sha256": contract_hash(the_contract)},
            "precision_files": sorted(texts),
            "tensors": {
                t.name: {
                    "file": t.file,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "sha256": sha[t.name],
                    "hf": [i.name for i in t.members],
                }
                for t in targets
            },
        },
    )
    publish(staging, Path(destination))
    hook("done", {})
    return ImportReport(
        destination=str(destination),
        family=inventory.family,
        expert_layout=layout.value,
        source_tensors=len(inventory),
        tensors=len(targets),
        bytes=total,
        seconds=time.perf_counter() - started,
        files=sorted(by_file),
        contract=None if the_contract is None else the_contract.name,
        precision_files=sorted(texts),
        notes=notes,
    )
