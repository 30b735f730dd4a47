"""``convert``: a checkpoint converted shard by shard under a contract, verified, then published.

The phases: plan and validate everything (:mod:`fp4convert.plan`), stream each output shard
(:mod:`fp4convert.convert.shards`) into ``<DST>.partial/`` with a resume journal, write config,
index, side files and the manifest (:mod:`fp4convert.convert.output`), verify the written output,
and rename the folder to ``DST`` (:mod:`fp4convert.checkpoint.staging`): a failed or interrupted
run never leaves a ``DST`` that looks complete. The source is only ever read.

Hostile or broken input is refused with one error before anything is written wherever it can be
told from the headers (:mod:`fp4convert.checkpoint.consistency`); what only the data shows is
checked on the way:

* NaN / infinite source values are counted per tensor while reading; a conversion that met any is
  refused at the end of the shards, naming the tensors and counts, unless ``allow_nonfinite``
  (``--allow-nonfinite``), which keeps the quantizers' documented NaN/inf policy and records the
  counts in the manifest. The refused run's shards stay in ``DST.partial/``, so ``--resume
  --allow-nonfinite`` finishes it without converting again.
* ``resume`` keeps a finished shard only if the source files its tensors (and their fused
  siblings) come from still have the sha256 the interrupted run read; a source whose bytes changed
  is refused, as one whose headers changed always was.
* A full disk, a read-only destination or a lost permission is one error naming the file; the
  shards finished so far stay in ``DST.partial/`` for ``--resume``.
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
from fp4convert.checkpoint.staging import JOURNAL, Journal, check_resumable, prepare_staging, publish, release
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.manifest import build_manifest
from fp4convert.convert.output import finish_output, output_names
from fp4convert.convert.shards import ProgressHook, tensor_hashes, write_shard
from fp4convert.dialects import get_dialect
from fp4convert.errors import CheckpointError, ConversionError
from fp4convert.formats.devices import check_device
from fp4convert.hub import resolve_source
from fp4convert.plan import (
    ConversionPlan,
    PlannedTensor,
    SharedAmax,
    load_calibration,
    members_of,
    plan_conversion,
    validate_conversion,
)
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
        nonfinite: source tensors holding NaN / infinite values, with their counts (converted only
            under ``allow_nonfinite``).
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
    nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)


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


def _inputs(plan: ConversionPlan, items: list[PlannedTensor]) -> set[str]:
    """The source files an output shard's bytes depend on: its tensors' and their fused siblings'
    (every stored part they are decoded from: an FP8 weight's scales may sit in another shard)."""
    view = plan.source.view()
    names = {name for item in items for name in members_of(plan.groups, item)}
    return {part.file for name in names for part in view.unit_of(name).parts}


def _check_source_unchanged(plan: ConversionPlan, journal: Journal) -> None:
    """A resumed run continues from the same source bytes, or not at all."""
    for shard, recorded in sorted(journal.sources.items()):
        path = plan.source.root / shard
        now = file_sha256(path) if shard in plan.source.shards and path.is_file() else None
        if now != recorded:
            raise ConversionError(
                f"the source changed since the interrupted run: {shard} had sha256 {recorded[:16]}..., "
                f"now {now[:16] + '...' if now else 'it is gone'}; the finished shards were made from the old bytes",
                hint="pass overwrite=True (--overwrite) to convert the new source from the start",
                file=shard,
            )


def _reusable(
    plan: ConversionPlan, journal: Journal, staging: Path, file_name: str, items: list[PlannedTensor]
) -> dict[str, Any] | None:
    """The journal entry of a finished shard that may be kept (None: convert it again)."""
    done = journal.entry(file_name)
    path = staging / file_name
    if done is None or not path.is_file() or path.is_symlink():
        return None
    if not _inputs(plan, items) <= set(journal.sources):  # an input the interrupted run never hashed
        return None
    return done if tensor_hashes(path) == done["tensors"] else None


@dataclass
class _Shards:
    """What writing (or keeping) the shards gave."""

    sha: dict[str, str]  # each output tensor's sha256 as written
    read_back: dict[str, str]  # each output tensor's sha256 read back from disk
    source_hashes: dict[str, str]  # each source shard's sha256
    resumed: list[str]
    nonfinite: dict[str, dict[str, int]]  # source tensor -> {"nan": n, "inf": m}


def _convert_shards(
    plan: ConversionPlan,
    staging: Path,
    journal: Journal,
    *,
    device: str,
    calibration: Mapping[str, float] | None,
    hook: ProgressHook,
) -> _Shards:
    """Write (or keep, when resuming) every output shard."""
    reader = SourceReader(plan.source)
    amaxes = SharedAmax(plan, reader.read)
    out = _Shards({}, {}, {}, [], {})
    # Each finished shard is read back from disk and hashed while the next one converts; the
    # verify phase compares these with the hashes taken while writing (no second read at the end).
    read_back_pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-readback")
    read_back: list[Future[dict[str, str]]] = []
    try:
        for file_name, items in plan.by_output_file().items():
            done = _reusable(plan, journal, staging, file_name, items)
            if done is not None:
                out.sha.update(done["tensors"])
                nonfinite = done.get("nonfinite")
                out.nonfinite.update(nonfinite if isinstance(nonfinite, dict) else {})
                out.resumed.append(file_name)
                source_bytes = sum(i.bytes_before for i in items)
                hook("shard", {"file": file_name, "resumed": True, "bytes": source_bytes})
                continue
            hook("shard", {"file": file_name, "resumed": False})
            tensor_sha = write_shard(
                staging / file_name, items, plan, reader, amaxes, device=device, calibration=calibration, hook=hook
            )
            read_back.append(read_back_pool.submit(tensor_hashes, staging / file_name, sync=True))
            out.sha.update(tensor_sha)
            counts = {i.info.name: reader.nonfinite[i.info.name] for i in items if i.info.name in reader.nonfinite}
            out.nonfinite.update(counts)
            sources = reader.finished_hashes(also=_inputs(plan, items))
            journal.record(file_name, tensor_sha, nonfinite=counts, sources=sources)
        out.source_hashes = reader.shard_hashes()
        journal.note_sources(out.source_hashes)  # a run refused now (NaN) can be resumed shard for shard
        out.read_back = {name: digest for future in read_back for name, digest in future.result().items()}
    finally:
        reader.close()
        read_back_pool.shutdown(wait=True)
    return out


def _refuse_nonfinite(nonfinite: Mapping[str, Mapping[str, int]], staging: Path) -> None:
    total = {kind: sum(c.get(kind, 0) for c in nonfinite.values()) for kind in ("nan", "inf")}
    listing = "\n  - ".join(
        f"{name}: {', '.join(f'{n} {kind}' for kind, n in counts.items())}"
        for name, counts in sorted(nonfinite.items())[:8]
    )
    more = f"\n  - ... and {len(nonfinite) - 8} more tensors" if len(nonfinite) > 8 else ""
    raise ConversionError(
        f"{len(nonfinite)} source tensor{'s' if len(nonfinite) > 1 else ''} hold{'' if len(nonfinite) > 1 else 's'} "
        f"non-finite values ({total['nan']} NaN, {total['inf']} inf):"
        f"\n  - {listing}{more}",
        hint="fix the source weights; or, to convert them as they are (under the quantizers' documented NaN/inf "
        "policy, recorded in the manifest), pass allow_nonfinite=True (--allow-nonfinite) with resume=True "
        f"(--resume): the converted shards stay in {staging}",
        tensors=dict(nonfinite),
    )


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
    allow_nonfinite: bool = False,
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
        max_shard_size: bytes per output shard (a tensor larger than that gets a shard of its
            own); default mirrors the source's shards.
        overwrite: replace an existing destination (and any interrupted run).
        resume: continue an interrupted run, keeping shards whose sha256 verify and whose source
            files are unchanged.
        calibration: JSON ``{module: activation amax}``, required when NVFP4 activations are
            quantized per tensor (contracts without ``per_token_activations``).
        revision: Hub revision of ``source``.
        allow_nonfinite: convert source tensors holding NaN / inf values (recorded in the manifest)
            instead of refusing them.
        progress: called with progress events (the CLI draws bars from them).

    Returns:
        A :class:`ConversionReport`.

    Raises:
        ConversionError: the plan was refused (every problem listed), the destination is unusable
            (or locked by another run), the source holds NaN/inf values, or changed under a resume.
        ContractError, MappingError, CheckpointError: bad contract, unknown tensor names, bad files,
            a source that disagrees with its config.json, a full or read-only disk.

    Example (not run: it downloads and converts a 30B-parameter checkpoint):
        >>> convert_checkpoint("Qwen/Qwen3-30B-A3B", "out", contract="nvfp4-experts-per-token")  # doctest: +SKIP
    """
    check_device(device)
    if max_shard_size is not None and max_shard_size <= 0:
        raise ConversionError(
            f"max_shard_size {max_shard_size} (--max-shard-size) is not a positive number of bytes",
            hint="give a size such as 5GB, or leave it out to mirror the source's shards",
            field="max_shard_size",
        )
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
            allow_nonfinite=allow_nonfinite,
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
    allow_nonfinite: bool,
    hook: ProgressHook,
) -> ConversionReport:
    started = time.perf_counter()
    ckpt = open_checkpoint(source_path)
    the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
    the_dialect = get_dialect(dialect, per_token_activations=the_contract.formats.nvfp4.per_token_activations)
    plan = plan_conversion(ckpt, the_contract, the_dialect, max_shard_size=max_shard_size)
    calib = load_calibration(calibration) if calibration is not None else None
    validate_conversion(plan, calib)
    staging = prepare_staging(source_path, destination, overwrite=overwrite, resume=resume)
    try:
        if resume:
            check_resumable(staging, output_names(plan))
        options = {"dialect": dialect, "max_shard_size": max_shard_size, "calibration": str(calibration)}
        journal = Journal(staging, _fingerprint(plan, options), resume=resume)  # identifiable from the first byte on
        _check_source_unchanged(plan, journal)
        by_file = plan.by_output_file()
        hook("plan", {"files": len(by_file), "tensors": len(plan.items), "bytes": plan.source_bytes})
        shards = _convert_shards(plan, staging, journal, device=device, calibration=calib, hook=hook)
        if shards.nonfinite and not allow_nonfinite:
            _refuse_nonfinite(shards.nonfinite, staging)
        for name in ("config.json", *ckpt.other_files):
            shards.source_hashes[name] = file_sha256(ckpt.root / name)
        # A Hub snapshot lives in .../snapshots/<commit>/: record which commit was converted.
        hub_commit = None if Path(location).is_dir() else source_path.name
        manifest = build_manifest(
            plan,
            shards.sha,
            shards.source_hashes,
            location=location,
            revision=revision,
            hub_commit=hub_commit,
            device=device,
            calibration_path=None if calibration is None else str(calibration),
            nonfinite=shards.nonfinite,
        )
        total = finish_output(staging, plan, manifest)
        report = verify_checkpoint(staging, read_back=shards.read_back, ignore_files=(JOURNAL,))
        if not report.ok:
            raise ConversionError(
                f"the written output failed verification: {report.summary()}",
                hint=f"the unfinished output stays in {staging}; check the disk and run again with overwrite=True "
                "(--overwrite)",
            )
        journal.remove()
        publish(staging, destination)
    except CheckpointError as exc:
        if exc.fields.get("errno") is None:
            raise
        raise CheckpointError(  # a full disk, a read-only folder ...: what to do once it is fixed
            exc.message,
            hint=f"{exc.hint}; the shards finished so far stay in {staging}: continue with resume=True (--resume)",
            **exc.fields,
        ) from exc
    finally:
        release(staging)
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
        resumed_files=shards.resumed,
        nonfinite=shards.nonfinite,
    )
