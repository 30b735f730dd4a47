"""``import_hf``: an HF checkpoint -> Megatron-Core-named BF16 safetensors, plus the contract's
TransformerEngine precision file, so the learner starts from exactly the weights the sampler serves.

Streaming and atomic like the converter: the layout of every output shard is planned from the
source headers first (no tensor data), then each Megatron tensor is built from its HF pieces
(q/k/v interleaved, gate/up concatenated, experts renamed) and written, one at a time, into
``<DST>.partial/`` under temporary names; ``DST`` appears only once everything is written. The
tensors are the family transforms' output, so :func:`~fp4convert.families.megatron_to_hf` gives
the source back byte for byte.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert import __version__
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, tensor_nbytes
from fp4convert.checkpoint.source import INDEX_NAME, SourceCheckpoint, open_checkpoint
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.manifest import write_json_atomic
from fp4convert.errors import ConversionError
from fp4convert.families import ExpertLayout, hf_to_megatron, inventory_from_checkpoint
from fp4convert.inventory import ModelInventory

__all__ = ["MEGATRON_MANIFEST", "TE_PRECISION_FILE", "ImportReport", "import_hf"]

#: the TransformerEngine precision file written next to the weights (``--te-precision-config-file``)
TE_PRECISION_FILE = "te_precision.yaml"
#: what was imported, from where, in which layout, with each tensor's sha256 and HF pieces
MEGATRON_MANIFEST = "fp4convert-megatron.json"
_DEFAULT_SHARD = 5 * 10**9


@dataclass
class ImportReport:
    """What :func:`import_hf` wrote."""

    destination: str
    family: str
    expert_layout: str
    ep_rank: int
    ep_size: int
    tensors: int
    source_tensors: int
    bytes: int
    seconds: float
    files: list[str] = field(default_factory=list)
    te_precision_file: str | None = None


def _groups(inventory: ModelInventory) -> dict[str, list[str]]:
    """Megatron tensor -> its HF pieces, in checkpoint order of the first piece.

    An MTP tensor whose Megatron name lies outside ``mtp.layers.`` is the MTP layer's HF copy of a
    tensor Megatron shares with the main model (embedding, output layer): it joins the shared
    tensor's group, where :func:`hf_to_megatron` checks the two are byte-identical.
    """
    groups: dict[str, list[str]] = {}
    for info in inventory:
        if info.megatron_name is None:  # pragma: no cover - a configured family names every tensor
            raise ConversionError(f"`{info.name}` has no Megatron-Core name in family {inventory.family}")
        groups.setdefault(info.megatron_name, []).append(info.name)
    return groups


def _is_shared_copy(inventory_by_name: dict[str, Any], name: str) -> bool:
    info = inventory_by_name[name]
    return bool(info.is_mtp and info.megatron_name and not info.megatron_name.startswith("mtp."))


@dataclass
class _Planned:
    hf_names: list[str]
    megatron_name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str = ""


def _plan(
    source: SourceCheckpoint,
    inventory: ModelInventory,
    layout: ExpertLayout,
    ep_rank: int,
    ep_size: int,
    max_shard_size: int,
) -> list[_Planned]:
    by_name = inventory.by_name()
    planned: list[_Planned] = []
    for hf_names in _groups(inventory).values():
        # Shapes only: the transforms run on meta tensors (MTP copies carry no Megatron tensor).
        metas = {
            name: torch.empty(source.entry(name).shape, dtype=torch.float32, device="meta")
            for name in hf_names
            if not _is_shared_copy(by_name, name)
        }
        out = hf_to_megatron(
            metas, inventory.family, inventory.config, expert_layout=layout, ep_rank=ep_rank, ep_size=ep_size
        )
        for megatron_name, tensor in out.items():  # nothing: an expert of another EP rank
            dtype = source.entry(hf_names[0]).dtype
            shape = tuple(tensor.shape)
            planned.append(_Planned(hf_names, megatron_name, dtype, shape, tensor_nbytes(dtype, shape)))
    files: list[list[_Planned]] = [[]]
    size = 0
    for item in planned:
        if files[-1] and size + item.nbytes > max_shard_size:
            files.append([])
            size = 0
        files[-1].append(item)
        size += item.nbytes
    names = (
        ["model.safetensors"]
        if len(files) == 1
        else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    )
    for name, items in zip(names, files, strict=True):
        for item in items:
            item.file = name
    return planned


def _staging(source: Path, destination: Path, overwrite: bool) -> Path:
    src, dst = source.resolve(), destination.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise ConversionError(
            f"destination {destination} overlaps the source {source}",
            hint="write the Megatron checkpoint to a separate folder; the source is never modified",
        )
    if destination.exists() and not overwrite:
        raise ConversionError(
            f"destination {destination} already exists",
            hint="pass --overwrite to replace it, or choose another folder",
            file=str(destination),
        )
    staging = destination.with_name(destination.name + ".partial")
    if staging.exists():
        if not overwrite:
            raise ConversionError(
                f"{staging} holds an interrupted import",
                hint="pass --overwrite to start over",
                file=str(staging),
            )
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


class _Reader:
    def __init__(self, source: SourceCheckpoint) -> None:
        self.source = source
        self.files: dict[str, SafetensorsFile] = {}

    def read(self, name: str) -> torch.Tensor:
        shard = self.source.tensor_file[name]
        if shard not in self.files:
            self.files[shard] = self.source.open(shard)
        return self.files[shard].read(name)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def import_hf(
    source: str | Path,
    destination: str | Path,
    *,
    contract: Contract | str | Path | None = None,
    expert_layout: ExpertLayout | str = ExpertLayout.GROUPED,
    ep_rank: int = 0,
    ep_size: int = 1,
    max_shard_size: int | None = None,
    overwrite: bool = False,
    revision: str | None = None,
) -> ImportReport:
    """Write an HF checkpoint as Megatron-Core-named BF16 safetensors (and the TE precision file).

    Args:
        source: HF checkpoint folder (or Hub repo id).
        destination: output folder; refused if it exists, unless ``overwrite``.
        contract: when given, its TransformerEngine precision file is written as
            ``te_precision.yaml`` (``contract emit --target te-yaml``) and its hash recorded.
        expert_layout: ``grouped`` (TEGroupedMLP ``linear_fc1.weight{e}``) or ``sequential``
            (SequentialMLP ``local_experts.{e}.linear_fc1.weight``).
        ep_rank: with ``ep_size > 1``, write only this expert-parallel rank's experts (local ids);
            every other tensor is written on every rank, as Megatron replicates it.
        ep_size: expert-parallel size.
        max_shard_size: bytes per output file (default 5 GB).
        overwrite: replace an existing destination (or an interrupted import).
        revision: Hub revision when ``source`` is a repo id.

    Returns:
        An :class:`ImportReport`. The destination holds the weights (``model.safetensors`` or shards
        plus ``model.safetensors.index.json``), ``config.json``, ``te_precision.yaml`` (with a
        contract) and ``fp4convert-megatron.json`` (layout, source, each tensor's sha256 and HF pieces).

    Raises:
        ConversionError: the destination overlaps the source or exists.
        MappingError: a source tensor is not part of its family, or a fused group is incomplete.
        CheckpointError: unreadable source files.

    Example:
        >>> import_hf("Qwen3-30B-A3B-hf", "Qwen3-30B-A3B-megatron",
        ...           contract="nvfp4-experts-per-token")  # doctest: +SKIP
    """
    from fp4convert.contract.emit import emit
    from fp4convert.convert.execute import _publish  # the converter's atomic swap into place
    from fp4convert.hub import resolve_source

    started = time.perf_counter()
    layout = ExpertLayout(expert_layout)
    the_contract = (
        None if contract is None else (contract if isinstance(contract, Contract) else load_contract(contract))
    )
    source_path = resolve_source(source, revision=revision)
    ckpt = open_checkpoint(source_path)
    inventory = inventory_from_checkpoint(source_path)
    planned = _plan(ckpt, inventory, layout, ep_rank, ep_size, max_shard_size or _DEFAULT_SHARD)
    destination = Path(destination)
    staging = _staging(source_path, destination, overwrite)
    reader = _Reader(ckpt)
    sha: dict[str, str] = {}
    try:
        for file in dict.fromkeys(item.file for item in planned):
            items = [item for item in planned if item.file == file]
            tmp = staging / (file + ".tmp")
            writer = StreamingWriter(
                tmp,
                [(i.megatron_name, i.dtype, i.shape) for i in items],
                metadata={"format": "pt", "producer": f"fp4convert {__version__}"},
            )
            try:
                for item in items:
                    pieces = {name: reader.read(name) for name in item.hf_names}
                    out = hf_to_megatron(
                        pieces,
                        inventory.family,
                        inventory.config,
                        expert_layout=layout,
                        ep_rank=ep_rank,
                        ep_size=ep_size,
                    )
                    writer.write(item.megatron_name, out[item.megatron_name])
                writer.close()
            except BaseException:
                writer.abort()
                raise
            sha.update(writer.sha256)
            os.replace(tmp, staging / file)
    finally:
        reader.close()
    files = sorted({item.file for item in planned})
    total = sum((staging / f).stat().st_size for f in files)
    if files != ["model.safetensors"]:
        write_json_atomic(
            staging / INDEX_NAME,
            {"metadata": {"total_size": total}, "weight_map": {i.megatron_name: i.file for i in planned}},
        )
    shutil.copy2(ckpt.root / "config.json", staging / "config.json")
    te_file = None
    if the_contract is not None:
        (staging / TE_PRECISION_FILE).write_text(emit(the_contract, "te-yaml").text)
        te_file = TE_PRECISION_FILE
    write_json_atomic(
        staging / MEGATRON_MANIFEST,
        {
            "producer": {"name": "fp4convert", "version": __version__},
            "family": inventory.family,
            "expert_layout": layout.value,
            "ep_rank": ep_rank,
            "ep_size": ep_size,
            "source": str(source),
            "contract": None
            if the_contract is None
            else {"name": the_contract.name, "sha256": contract_hash(the_contract)},
            "te_precision_file": te_file,
            "tensors": {
                i.megatron_name: {
                    "file": i.file,
                    "dtype": i.dtype,
                    "shape": list(i.shape),
                    "sha256": sha[i.megatron_name],
                    "hf": i.hf_names,
                }
                for i in planned
            },
        },
    )
    _publish(staging, destination)
    return ImportReport(
        destination=str(destination),
        family=inventory.family,
        expert_layout=layout.value,
        ep_rank=ep_rank,
        ep_size=ep_size,
        tensors=len(planned),
        source_tensors=len(inventory),
        bytes=total,
        seconds=time.perf_counter() - started,
        files=files,
        te_precision_file=te_file,
    )
