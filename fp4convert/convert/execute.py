"""Convert a checkpoint shard by shard (phases 3-5), with bounded memory and atomic output.

Everything is written into ``<DST>.partial/``: each shard under a temporary name, renamed once
complete and recorded in a journal (so ``resume`` keeps shards whose sha256 still match). Config,
index, side files and the manifest come last, then the folder is renamed to ``DST``: a failed or
interrupted run never leaves a ``DST`` that looks complete. The source is only ever read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.hashing import file_sha256, tensor_sha256
from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter
from fp4convert.checkpoint.source import INDEX_NAME, open_checkpoint
from fp4convert.checkpoint.staging import Journal, prepare_staging, publish, write_json_atomic
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.groups import group_input_amax, member_amax
from fp4convert.convert.manifest import build_manifest
from fp4convert.convert.plan import ConversionPlan, PlannedTensor, build_plan, load_calibration, validate_plan
from fp4convert.dialects import get_dialect
from fp4convert.errors import ConversionError
from fp4convert.formats.mxfp8 import MXFP8Tensor, quantize_mxfp8
from fp4convert.formats.nvfp4 import NVFP4Tensor, quantize_nvfp4
from fp4convert.version import __version__

__all__ = ["ConversionReport", "ProgressHook", "convert_checkpoint", "quantize_planned"]

#: progress callback: (event, payload); events: "plan", "shard", "tensor", "done"
ProgressHook = Callable[[str, Mapping[str, Any]], None]


@dataclass
class ConversionReport:
    """What a conversion did, for humans and for ``--json``."""

    destination: str
    dialect: str
    contract: str
    contract_sha256: str
    device: str
    tensors: int
    formats: dict[str, int]
    source_bytes: int
    output_bytes: int
    seconds: float
    files: list[str] = field(default_factory=list)
    resumed_files: list[str] = field(default_factory=list)


def quantize_planned(
    item: PlannedTensor, x: torch.Tensor, *, profile: str, amax: torch.Tensor | None, device: str
) -> NVFP4Tensor | MXFP8Tensor | None:
    """Quantize one planned source tensor as its decision says (None when it stays high precision)."""
    if not item.quantized:
        return None
    x = x.to(device)
    if item.decision.format == "mxfp8":
        return quantize_mxfp8(x)
    tile = getattr(item.decision.recipe, "tile", "1x16")
    return quantize_nvfp4(x, tile=tile, amax=None if amax is None else amax.to(device), profile=profile)  # type: ignore[arg-type]


class _GroupAmax:
    """One outer amax per shared-scale group: the max over its members (read once, kept briefly)."""

    def __init__(self, plan: ConversionPlan, fetch: Callable[[str], torch.Tensor]) -> None:
        self.plan = plan
        self.fetch = fetch  # reads a tensor (from the read-ahead when it is there)
        self.values: dict[str, torch.Tensor] = {}
        self.pending: dict[str, torch.Tensor] = {}  # members read early, waiting for their turn

    def amax_for(self, item: PlannedTensor, x: torch.Tensor) -> torch.Tensor | None:
        """The shared amax of ``item``'s group (None: not shared, the quantizer measures it)."""
        group = item.decision.fused_group
        members = self.plan.groups.get(group or "", [])
        if item.decision.format != "nvfp4" or len(members) < 2:
            return None
        if group not in self.values:
            amaxes = []
            for name in members:
                t = x if name == item.info.name else self.pending.get(name)
                if t is None:
                    t = self.fetch(name)
                    if self.plan.source.tensor_file[name] == item.source_file:
                        self.pending[name] = t  # same shard: it comes up soon, do not read it twice
                amaxes.append(member_amax(t))
            self.values[group] = torch.stack(amaxes).amax()  # type: ignore[index]
        return self.values[group]  # type: ignore[index]

    def take(self, name: str) -> torch.Tensor | None:
        return self.pending.pop(name, None)


def _input_amax(item: PlannedTensor, plan: ConversionPlan, calibration: Mapping[str, float] | None) -> float | None:
    if calibration is None or item.decision.format != "nvfp4":
        return None
    # Fused siblings read the same activations: they share one input scale (the max).
    return group_input_amax(plan.groups.get(item.decision.fused_group or "", [item.info.name]), calibration)


def _fingerprint(plan: ConversionPlan, options: Mapping[str, Any]) -> str:
    """Identifies what a resumed run must match: contract, dialect, options and source headers."""
    h = hashlib.sha256()
    h.update(contract_hash(plan.contract).encode())
    h.update(repr(sorted(options.items())).encode())
    for shard, entries in plan.source.shards.items():
        h.update(shard.encode())
        h.update(repr([(e.name, e.dtype, e.shape, e.start) for e in entries.values()]).encode())
    return h.hexdigest()


def _write_shard(
    path: Path,
    items: list[PlannedTensor],
    plan: ConversionPlan,
    reader: SourceReader,
    amaxes: _GroupAmax,
    *,
    device: str,
    calibration: Mapping[str, float] | None,
    hook: ProgressHook,
) -> dict[str, str]:
    layout = [spec for item in items for spec in item.outputs]
    tmp = path.with_name(path.name + ".tmp")
    writer = StreamingWriter(tmp, layout, metadata={"format": "pt", "producer": f"fp4convert {__version__}"})
    profile = plan.contract.quantizer

    def write(item: PlannedTensor, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, _, _ in item.outputs:
            writer.write(name, tensors[name])  # per-tensor sha256 + file write
        hook("tensor", {"name": item.info.name, "bytes": plan.source.entry(item.info.name).nbytes})

    # Three stages overlap: one thread reads (and hashes the source), this thread quantizes (the
    # kernel itself is multi-threaded), one thread hashes the outputs and writes. hashlib, file I/O
    # and the native kernel release the GIL. Read-ahead is two tensors and at most two writes are
    # in flight, so memory stays bounded whatever the shard size.
    with (
        ThreadPoolExecutor(1, thread_name_prefix="fp4convert-read") as read_pool,
        ThreadPoolExecutor(1, thread_name_prefix="fp4convert-write") as write_pool,
    ):
        ahead: dict[str, Future[torch.Tensor]] = {}

        def read_ahead(start: int) -> None:
            for item in items[start : start + 2]:
                name = item.info.name
                if name not in ahead and name not in amaxes.pending:
                    ahead[name] = read_pool.submit(reader.read, name)

        def fetch(name: str) -> torch.Tensor:
            future = ahead.pop(name, None)
            return future.result() if future is not None else reader.read(name)

        amaxes.fetch = fetch
        writes: list[Future[None]] = []
        try:
            for index, item in enumerate(items):
                read_ahead(index)
                early = amaxes.take(item.info.name)
                x = early if early is not None else fetch(item.info.name)
                amax = amaxes.amax_for(item, x)
                read_ahead(index + 1)
                q = quantize_planned(item, x, profile=profile, amax=amax, device=device)
                tensors = plan.dialect.encode(item, q, x, _input_amax(item, plan, calibration))
                writes.append(write_pool.submit(write, item, tensors))
                while len(writes) > 2 or (writes and writes[0].done()):
                    writes.pop(0).result()
            for pending in writes:
                pending.result()
            writer.close(sync=False)  # the read-back stage fsyncs it, off the critical path
        except BaseException:
            unfinished: list[Future[Any]] = [*ahead.values(), *writes]
            for future in unfinished:
                future.cancel()
            amaxes.fetch = reader.read
            write_pool.shutdown(wait=True)
            writer.abort()
            raise
    os.replace(tmp, path)
    return writer.sha256


def _tensor_hashes(path: Path, *, sync: bool = False) -> dict[str, str]:
    """sha256 of every tensor of a finished shard, read back from disk (the verify phase compares
    them with the hashes taken while writing; ``resume`` decides with them which shards to keep).

    Args:
        path: the shard.
        sync: fsync the file first (the converter closes shards without syncing).
    """
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with SafetensorsFile(path) as f:
        return {name: tensor_sha256(f.read_bytes(name)) for name in f.entries}


def _finalize(staging: Path, plan: ConversionPlan, manifest: dict[str, Any]) -> int:
    source = plan.source
    config = dict(source.config)
    config["quantization_config"] = plan.dialect.quantization_config(plan.contract, plan.items)
    write_json_atomic(staging / "config.json", config)
    weight_map = {name: item.output_file for item in plan.items for name, _, _ in item.outputs}
    files = sorted(set(weight_map.values()))
    total = sum((staging / f).stat().st_size for f in files)
    if files != ["model.safetensors"]:
        write_json_atomic(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    for name, content in plan.dialect.side_files(plan.contract, plan.items).items():
        write_json_atomic(staging / name, content)
    for name in source.other_files:
        shutil.copy2(source.root / name, staging / name)
    write_json_atomic(staging / MANIFEST, manifest)  # last: its presence marks a finished output
    return total


def convert_checkpoint(
    source: str | Path,
    destination: str | Path,
    *,
    contract: Contract | str | Path,
    dialect: str = "modelopt",
    device: str = "cpu",
    workers: int | None = None,
    max_shard_size: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    calibration: str | Path | None = None,
    revision: str | None = None,
    progress: ProgressHook | None = None,
) -> ConversionReport:
    """Convert an HF checkpoint under a precision contract into one on-disk dialect.

    Args:
        source: local HF checkpoint folder, or a Hub repo id (see :func:`fp4convert.hub.resolve_source`).
        destination: output folder; refused if it exists, unless ``overwrite``.
        contract: a :class:`~fp4convert.contract.Contract` or the path of a contract file.
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors``.
        device: ``cpu`` or ``cuda[:n]``: where tensors are quantized (bytes are identical).
        workers: CPU threads for the quantizer (default: torch's current setting).
        max_shard_size: bytes per output shard; default mirrors the source's shards.
        overwrite: replace an existing destination (and any interrupted run).
        resume: continue an interrupted run, keeping shards whose sha256 verify.
        calibration: JSON ``{module: activation amax}``, required when NVFP4 activations are
            quantized per tensor (contracts without ``per_token_activations``).
        revision: Hub revision of ``source``.
        progress: called with progress events (the CLI draws bars from them).

    Returns:
        A :class:`ConversionReport`.

    Raises:
        ConversionError: the plan was refused (every problem listed) or the destination is unusable.
        ContractError, MappingError, CheckpointError: bad contract, unknown tensor names, bad files.

    Example:
        >>> convert_checkpoint("Qwen/Qwen3-30B-A3B", "out", contract="nvfp4-experts-per-token")  # doctest: +SKIP
    """
    from fp4convert.hub import resolve_source

    started = time.perf_counter()
    hook: ProgressHook = progress or (lambda event, payload: None)
    if workers is not None:
        torch.set_num_threads(workers)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConversionError("--device cuda was asked for, but no CUDA device is available", hint="use --device cpu")
    source_path = resolve_source(source, revision=revision)
    ckpt = open_checkpoint(source_path)
    the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
    the_dialect = get_dialect(dialect, per_token_activations=the_contract.formats.nvfp4.per_token_activations)
    plan = build_plan(ckpt, the_contract, the_dialect, max_shard_size=max_shard_size)
    calib = load_calibration(calibration) if calibration is not None else None
    validate_plan(plan, calib)
    destination = Path(destination)
    staging = prepare_staging(source_path, destination, overwrite=overwrite, resume=resume)

    options = {"dialect": dialect, "max_shard_size": max_shard_size, "calibration": str(calibration)}
    fingerprint = _fingerprint(plan, options)
    journal = Journal(staging, fingerprint, resume=resume)  # from the first byte on, the run is identifiable

    by_file = plan.by_output_file()
    hook("plan", {"files": len(by_file), "tensors": len(plan.items), "bytes": plan.source_bytes})
    reader = SourceReader(ckpt)
    amaxes = _GroupAmax(plan, reader.read)
    sha: dict[str, str] = {}
    resumed: list[str] = []
    # Each finished shard is read back from disk and hashed while the next one converts; the
    # verify phase compares these with the hashes taken while writing (no second read at the end).
    read_back_pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-readback")
    read_back: list[Future[dict[str, str]]] = []
    try:
        for file_name, items in by_file.items():
            done = journal.finished(file_name)
            path = staging / file_name
            if done and path.is_file() and _tensor_hashes(path) == done:
                sha.update(done)
                resumed.append(file_name)
                hook(
                    "shard",
                    {
                        "file": file_name,
                        "resumed": True,
                        "bytes": sum(plan.source.entry(i.info.name).nbytes for i in items),
                    },
                )
                continue
            hook("shard", {"file": file_name, "resumed": False})
            tensor_sha = _write_shard(path, items, plan, reader, amaxes, device=device, calibration=calib, hook=hook)
            read_back.append(read_back_pool.submit(_tensor_hashes, path, sync=True))
            sha.update(tensor_sha)
            journal.record(file_name, tensor_sha)
        source_hashes = reader.shard_hashes()
        digests = {name: digest for future in read_back for name, digest in future.result().items()}
    finally:
        reader.close()
        read_back_pool.shutdown(wait=True)
    for name in ("config.json", *ckpt.other_files):
        source_hashes[name] = file_sha256(ckpt.root / name)
    # A Hub snapshot lives in .../snapshots/<commit>/: record which commit was converted.
    hub_commit = None if Path(str(source)).is_dir() else source_path.name
    manifest = build_manifest(
        plan,
        sha,
        source_hashes,
        location=str(source),
        revision=revision,
        hub_commit=hub_commit,
        device=device,
        calibration_path=None if calibration is None else str(calibration),
    )
    total = _finalize(staging, plan, manifest)
    from fp4convert.verify.checkpoint import verify_checkpoint

    report = verify_checkpoint(staging, read_back=digests)  # structure and every tensor's sha256
    if not report.ok:
        raise ConversionError(
            f"the written output failed verification: {report.summary()}",
            hint=f"the unfinished output stays in {staging}; check the disk and run again with overwrite=True "
            "(--overwrite)",
        )
    journal.remove()
    publish(staging, destination)
    hook("done", {})
    return ConversionReport(
        destination=str(destination),
        dialect=the_dialect.name,
        contract=the_contract.name,
        contract_sha256=contract_hash(the_contract),
        device=device,
        tensors=len(plan.items),
        formats=manifest["formats"],
        source_bytes=plan.source_bytes,
        output_bytes=total,
        seconds=time.perf_counter() - started,
        files=sorted(by_file),
        resumed_files=resumed,
    )
