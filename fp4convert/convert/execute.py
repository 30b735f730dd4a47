"""``convert``: a checkpoint converted shard by shard under a contract, verified, then published.

The phases: plan and validate everything (:mod:`fp4convert.plan`), stream each output shard
(:mod:`fp4convert.convert.shards`) into ``<DST>.partial/`` with a resume journal, write config,
index, side files and the manifest (:mod:`fp4convert.convert.output`), verify the written output,
and rename the folder to ``DST`` (:mod:`fp4convert.checkpoint.staging`): a failed or interrupted
run never leaves a ``DST`` that looks complete. The source is only ever read.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.checkpoint.staging import Journal, prepare_staging, publish
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.manifest import build_manifest
from fp4convert.convert.output import finish_output
from fp4convert.convert.shards import ProgressHook, tensor_hashes, write_shard
from fp4convert.dialects import get_dialect
from fp4convert.errors import ConversionError
from fp4convert.hub import resolve_source
from fp4convert.plan import ConversionPlan, SharedAmax, load_calibration, plan_conversion, validate_conversion
from fp4convert.verify.checkpoint import verify_checkpoint

__all__ = ["ConversionReport", "ProgressHook", "convert_checkpoint"]


@dataclass
class ConversionReport:
    """What a conversion did, for humans and for ``--json``.

    Attributes:
        destination: the output folder.
        dialect: the dialect written.
        contract: the contract's name.
        contract_sha256: the contract's hash (as in the manifest).
        device: where tensors were quantized.
        tensors: source tensors converted.
        formats: source tensors per format.
        source_bytes: bytes of source tensors read.
        output_bytes: bytes of the output shards.
        seconds: wall time.
        files: the output shards.
        resumed_files: shards kept from an interrupted run.
    """

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


@contextmanager
def _threads(workers: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``workers`` for the run, and restored after it."""
    if workers is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(workers)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _fingerprint(plan: ConversionPlan, options: Mapping[str, Any]) -> str:
    """Identifies what a resumed run must match: contract, dialect, options and source headers."""
    h = hashlib.sha256()
    h.update(contract_hash(plan.contract).encode())
    h.update(repr(sorted(options.items())).encode())
    for shard, entries in plan.source.shards.items():
        h.update(shard.encode())
        h.update(repr([(e.name, e.dtype, e.shape, e.start) for e in entries.values()]).encode())
    return h.hexdigest()


def _convert_shards(
    plan: ConversionPlan,
    staging: Path,
    journal: Journal,
    *,
    device: str,
    calibration: Mapping[str, float] | None,
    hook: ProgressHook,
) -> tuple[dict[str, str], dict[str, str], dict[str, str], list[str]]:
    """Write (or keep, when resuming) every output shard.

    Returns:
        (sha256 of each output tensor as written, sha256 of each output tensor read back from
        disk, sha256 of each source shard, the shards kept from an interrupted run).
    """
    reader = SourceReader(plan.source)
    amaxes = SharedAmax(plan, reader.read)
    sha: dict[str, str] = {}
    resumed: list[str] = []
    # Each finished shard is read back from disk and hashed while the next one converts; the
    # verify phase compares these with the hashes taken while writing (no second read at the end).
    read_back_pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-readback")
    read_back: list[Future[dict[str, str]]] = []
    try:
        for file_name, items in plan.by_output_file().items():
            done = journal.finished(file_name)
            path = staging / file_name
            if done and path.is_file() and tensor_hashes(path) == done:
                sha.update(done)
                resumed.append(file_name)
                source_bytes = sum(i.bytes_before for i in items)
                hook("shard", {"file": file_name, "resumed": True, "bytes": source_bytes})
                continue
            hook("shard", {"file": file_name, "resumed": False})
            tensor_sha = write_shard(
                path, items, plan, reader, amaxes, device=device, calibration=calibration, hook=hook
            )
            read_back.append(read_back_pool.submit(tensor_hashes, path, sync=True))
            sha.update(tensor_sha)
            journal.record(file_name, tensor_sha)
        source_hashes = reader.shard_hashes()
        digests = {name: digest for future in read_back for name, digest in future.result().items()}
    finally:
        reader.close()
        read_back_pool.shutdown(wait=True)
    return sha, digests, source_hashes, resumed


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
        workers: CPU threads for the quantizer (default: torch's current setting); torch's setting
            is restored when the call returns.
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

    Example (not run: it downloads and converts a 30B-parameter checkpoint):
        >>> convert_checkpoint("Qwen/Qwen3-30B-A3B", "out", contract="nvfp4-experts-per-token")  # doctest: +SKIP
    """
    with _threads(workers):
        return _convert(
            resolve_source(source, revision=revision),
            Path(destination),
            location=str(source),
            contract=contract,
            dialect=dialect,
            device=device,
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            resume=resume,
            calibration=calibration,
            revision=revision,
            hook=progress or (lambda event, payload: None),
        )


def _convert(
    source_path: Path,
    destination: Path,
    *,
    location: str,
    contract: Contract | str | Path,
    dialect: str,
    device: str,
    max_shard_size: int | None,
    overwrite: bool,
    resume: bool,
    calibration: str | Path | None,
    revision: str | None,
    hook: ProgressHook,
) -> ConversionReport:
    started = time.perf_counter()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConversionError(
            f"device {device!r} (--device {device}) was asked for, but no CUDA device is available",
            hint="use device='cpu' (--device cpu)",
        )
    ckpt = open_checkpoint(source_path)
    the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
    the_dialect = get_dialect(dialect, per_token_activations=the_contract.formats.nvfp4.per_token_activations)
    plan = plan_conversion(ckpt, the_contract, the_dialect, max_shard_size=max_shard_size)
    calib = load_calibration(calibration) if calibration is not None else None
    validate_conversion(plan, calib)
    staging = prepare_staging(source_path, destination, overwrite=overwrite, resume=resume)
    options = {"dialect": dialect, "max_shard_size": max_shard_size, "calibration": str(calibration)}
    journal = Journal(staging, _fingerprint(plan, options), resume=resume)  # identifiable from the first byte on

    by_file = plan.by_output_file()
    hook("plan", {"files": len(by_file), "tensors": len(plan.items), "bytes": plan.source_bytes})
    sha, digests, source_hashes, resumed = _convert_shards(
        plan, staging, journal, device=device, calibration=calib, hook=hook
    )
    for name in ("config.json", *ckpt.other_files):
        source_hashes[name] = file_sha256(ckpt.root / name)
    # A Hub snapshot lives in .../snapshots/<commit>/: record which commit was converted.
    hub_commit = None if Path(location).is_dir() else source_path.name
    manifest = build_manifest(
        plan,
        sha,
        source_hashes,
        location=location,
        revision=revision,
        hub_commit=hub_commit,
        device=device,
        calibration_path=None if calibration is None else str(calibration),
    )
    total = finish_output(staging, plan, manifest)
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
