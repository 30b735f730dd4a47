"""``convert``: a checkpoint converted shard by shard under a contract, verified, then published.

The phases: plan and validate everything (:mod:`fp4convert.plan`), stream each output shard
(:mod:`fp4convert.convert.shards`) into ``<DST>.partial/`` with a resume journal, write config,
index, side files and the manifest (:mod:`fp4convert.convert.output`), verify the written output,
and rename the folder to ``DST`` (:mod:`fp4convert.checkpoint.staging`): a failed or interrupted
run never leaves a ``DST`` that looks complete. The source is only ever read.

Hostile or broken input is refused with one error before anything is written wherever it can be
told from the headers (:mod:`fp4convert.checkpoint.consistency`); what only the data shows is
checked on the way (:mod:`fp4convert.convert.integrity`): NaN / infinite source values are refused
at the end of the shards unless ``allow_nonfinite`` (the refused run's shards stay in
``DST.partial/``, so ``--resume --allow-nonfinite`` finishes it without converting again), and
``resume`` keeps a finished shard only if the source bytes it was made from are unchanged. A full
disk, a read-only destination or a lost permission is one error naming the file; the shards
finished so far stay in ``DST.partial/`` for ``--resume``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.file_hashes import FileHashes
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.source import SourceCheckpoint, open_checkpoint
from fp4convert.checkpoint.staging import JOURNAL, Journal, check_resumable, prepare_staging, publish, release
from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.distributed import (
    check_finished,
    check_shared_staging,
    hash_owners,
    merge_results,
    shard_bytes,
    share_shards,
)
from fp4convert.convert.group_amax import agree_group_amaxes, groups_to_agree
from fp4convert.convert.integrity import (
    check_source_unchanged,
    refuse_nonfinite,
    shard_inputs,
    source_stats,
    unchanged_inputs,
)
from fp4convert.convert.manifest import build_manifest
from fp4convert.convert.output import finish_output, output_names
from fp4convert.convert.parallel import ShardJob, ShardResults, default_readers, split_files_ahead, write_shards
from fp4convert.convert.shards import ProgressHook, tensor_hashes
from fp4convert.dialects import get_dialect
from fp4convert.errors import CheckpointError, ConversionError
from fp4convert.formats.devices import check_device
from fp4convert.hub import resolve_source
from fp4convert.plan import ConversionPlan, load_calibration, plan_conversion, validate_conversion
from fp4convert.plan.collector import gc_frozen
from fp4convert.ranks import Team, current_team
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
        ranks: per rank (one for a process alone), what it wrote and how long it took: ``rank``,
            ``device``, ``workers`` (its threads), ``files`` (output shards it wrote),
            ``source_bytes`` (the source bytes they are made from), ``hashed_files`` (source files
            it hashed) and ``seconds`` (its shard phase: read, quantize, hash, write, read back).
        phases: seconds of this process's phases, in order: ``plan`` (open, plan, validate),
            ``staging`` (the partial folder and journal), ``shards`` (read, quantize, hash, write,
            read back), ``manifest`` (side-file hashes, config, index, manifest), ``verify``,
            ``publish``; phases a rank does not run (every one after ``shards`` but on rank 0) are
            left out.
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
    ranks: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)


class _Phases:
    """Wall seconds per phase, each lap from the end of the previous one (what ``--json`` shows
    as :attr:`ConversionReport.phases`, to see where a run's time goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now


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


def _default_workers(team: Team) -> int:
    """CPU threads per rank: torch's setting for a process alone; the machine's cores shared out
    among the ranks on a node otherwise (torchrun sets OMP_NUM_THREADS=1 for each)."""
    if team.world == 1:
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, team.local_world))


def _convert_shards(
    plan: ConversionPlan,
    staging: Path,
    journal: Journal | None,
    team: Team,
    *,
    device: str,
    workers: int,
    calibration: Mapping[str, float] | None,
    hook: ProgressHook,
    file_hashes: FileHashes,
) -> tuple[ShardResults, list[str], list[dict[str, Any]]]:
    """Write this rank's share of the output shards (keeping, when resuming, every finished shard
    whose tensors still hash as the journal says); rank 0 gets every rank's results.

    Returns:
        (the results of every rank on rank 0, this rank's own elsewhere; the shards kept; on rank
        0, every rank's :attr:`ConversionReport.ranks` figures, this rank's own elsewhere).
    """
    journaled = team.broadcast(
        "journal",
        {"files": journal.data["files"], "sources": journal.sources, "stats": journal.stats}
        if journal is not None
        else None,
    )
    finished, hashed, recorded_stats = journaled["files"], journaled["sources"], journaled["stats"]
    stats_now = source_stats(plan.source.root, plan.source.shards) if finished else {}
    by_file = plan.by_output_file()
    sizes = shard_bytes(plan)

    def keep(file: str) -> dict[str, str] | None:
        done = finished[file].get("tensors") if isinstance(finished.get(file), dict) else None
        path = staging / file
        if not done or not path.is_file() or path.is_symlink():
            return None
        if not unchanged_inputs(shard_inputs(plan, by_file[file]), hashed, recorded_stats, stats_now):
            return None
        return done if tensor_hashes(path) == done else None

    kept = check_finished({f: sizes[f] for f in by_file if f in finished}, keep, team)
    writing = [f for f in by_file if f not in kept]
    owner = share_shards(plan, writing, team.world)
    group_amax = agree_group_amaxes(plan, groups_to_agree(plan, owner, writing), team)
    if team.is_root:
        for file in kept:
            hook("shard", {"file": file, "resumed": True, "bytes": sizes[file]})
    lock = threading.Lock()

    def record(rank: int, message: Mapping[str, Any]) -> None:  # rank 0: every finished shard, journaled
        if journal is not None:
            with lock:
                journal.record(
                    message["file"], message["tensors"], nonfinite=message["nonfinite"], sources=message["sources"]
                )

    job = ShardJob(
        plan,
        staging,
        files=[f for f in writing if owner[f] == team.rank],
        # the files the interrupted run hashed whole were hashed again and found unchanged before
        # anything was kept (check_source_unchanged): their recorded sha256 stands
        hash_files=[f for f, r in hash_owners(plan, owner, team.world).items() if r == team.rank and f not in hashed],
        group_amax=group_amax,
        device=device,
        calibration=calibration,
        workers=workers,
        readers=default_readers(workers),
        file_hashes=file_hashes,
    )

    def local_hook(event: str, payload: Mapping[str, Any]) -> None:
        if event == "tensor":
            team.progress(payload["bytes"])
        hook(event, payload)

    started = time.perf_counter()
    with team.working(hook, on_message=record):
        mine = write_shards(
            job,
            hook=local_hook,
            on_finished=lambda file, record: team.send({"file": file, **record}),
            check=team.check,
        )
        seconds = time.perf_counter() - started  # its own work, not the wait for the others at the end
    figures = {
        "rank": team.rank,
        "device": device,
        "workers": workers,
        "files": len(job.files),
        "source_bytes": sum(sizes[f] for f in job.files),
        "hashed_files": len(job.hash_files),
        "seconds": seconds,
    }
    records = team.gather("results", {**mine.__dict__, "figures": figures})
    results = merge_results(records) if records is not None else mine
    # in the source's order whichever rank hashed which file: the manifest lists them so, and is
    # then the single-process one byte for byte (but for its creation time)
    known = {**hashed, **results.source_hashes}
    results.source_hashes = {f: known[f] for f in plan.source.shards if f in known}
    for file, tensors in kept.items():  # kept only where the file's tensors hash as journaled
        results.sha.update(tensors)
        nonfinite = finished[file].get("nonfinite")
        results.nonfinite.update(nonfinite if isinstance(nonfinite, dict) else {})
    return results, list(kept), [r["figures"] for r in records] if records is not None else [figures]


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
    rank_timeout: float = 60.0,
) -> ConversionReport:
    """Convert an HF checkpoint under a precision contract into one on-disk dialect.

    Under an initialized ``torch.distributed`` process group of several ranks (``torchrun``), every
    rank calls this with the same arguments and the work is split across them (docs/distributed.md):
    each rank writes a byte-balanced share of the output shards, rank 0 writes the other files and
    publishes once every rank succeeded, and the output is byte for byte the single-process one.

    Args:
        source: local HF checkpoint folder, or a Hub repo id (see :func:`fp4convert.hub.resolve_source`).
        destination: output folder; refused if it exists, unless ``overwrite``.
        contract: a :class:`~fp4convert.contract.Contract` or the path of a contract file.
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors``.
        device: ``cpu`` or ``cuda[:n]``: where tensors are quantized (bytes are identical); with
            several ranks, ``cuda`` is each rank's ``LOCAL_RANK`` GPU.
        workers: CPU threads quantizing, hashing and writing (default: torch's current setting; with
            several ranks, the node's cores shared among its ranks); torch's setting is restored
            when the call returns.
        max_shard_size: bytes per output shard (a tensor larger than that gets a shard of its
            own); default mirrors the source's shards.
        overwrite: replace an existing destination (and any interrupted run).
        resume: continue an interrupted run (with any number of ranks), keeping shards whose sha256
            verify and whose source files are unchanged.
        calibration: JSON ``{module: activation amax}``, required when NVFP4 activations are
            quantized per tensor (contracts without ``per_token_activations``).
        revision: Hub revision of ``source``.
        allow_nonfinite: convert source tensors holding NaN / inf values (recorded in the manifest)
            instead of refusing them.
        progress: called with progress events (the CLI draws bars from them); with several ranks,
            rank 0's also gets ``("bytes", {"bytes": n, "rank": r})`` for the other ranks' work.
        rank_timeout: with several ranks, seconds without a heartbeat after which a rank is
            reported lost (killed, or its node gone) and the others stop.

    Returns:
        A :class:`ConversionReport`.

    Raises:
        ConversionError: the plan was refused (every problem listed), the destination is unusable
            (or locked by another run), the source holds NaN/inf values, or changed under a resume.
        ContractError, MappingError, CheckpointError: bad contract, unknown tensor names, bad files,
            a source that disagrees with its config.json, a full or read-only disk.
        DistributedError: another rank failed (named, with its error) or stopped responding, or
            the ranks were given different arguments.

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
    team = current_team(rank_timeout=rank_timeout)
    try:
        threads = workers if workers is not None or team.world == 1 else _default_workers(team)
        # the heap alive at the start (imports, plan) left out of the collector's passes meanwhile
        with _threads(threads), gc_frozen():
            return _convert(
                resolve_source(source, revision=revision),
                Path(destination),
                location=str(source),
                contract=contract,
                dialect=dialect,
                device=device,
                workers=torch.get_num_threads(),
                max_shard_size=max_shard_size,
                overwrite=overwrite,
                resume=resume,
                calibration=calibration,
                revision=revision,
                allow_nonfinite=allow_nonfinite,
                hook=progress or (lambda event, payload: None),
                team=team,
            )
    except BaseException as exc:
        team.fail(exc)
        raise
    finally:
        team.close()


def _convert(
    source_path: Path,
    destination: Path,
    *,
    location: str,
    contract: Contract | str | Path,
    dialect: str,
    device: str,
    workers: int,
    max_shard_size: int | None,
    overwrite: bool,
    resume: bool,
    calibration: str | Path | None,
    revision: str | None,
    allow_nonfinite: bool,
    hook: ProgressHook,
    team: Team,
) -> ConversionReport:
    started = time.perf_counter()
    phases = _Phases()
    ckpt = open_checkpoint(source_path)
    # A process alone starts hashing the source files it will read in several runs now: each
    # file's sha256 is a chain on one core (about 2 s per 2 GB), the longest single steps of a
    # conversion on many cores, and they run while it plans. (With several ranks, which rank hashes
    # which file is known only from the plan.)
    ahead = split_files_ahead(ckpt, default_readers(workers)) if team.world == 1 else []
    with FileHashes(ckpt.root, ahead) as file_hashes:
        the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
        the_dialect = get_dialect(dialect, per_token_activations=the_contract.formats.nvfp4.per_token_activations)
        plan = plan_conversion(ckpt, the_contract, the_dialect, max_shard_size=max_shard_size)
        calib = load_calibration(calibration) if calibration is not None else None
        validate_conversion(plan, calib)
        options = {"dialect": dialect, "max_shard_size": max_shard_size, "calibration": str(calibration)}
        fingerprint = _fingerprint(plan, options)
        team.agree(
            "arguments",
            {
                "source": location,
                "destination": str(destination.resolve()),
                "job (contract, dialect, options, source headers)": fingerprint,
                "device": device,
                "overwrite": overwrite,
                "resume": resume,
                "allow_nonfinite": allow_nonfinite,
            },
        )
        phases.lap("plan")
        journal = None
        staging: Path | None = None
        try:
            if team.is_root:
                staging = prepare_staging(source_path, destination, overwrite=overwrite, resume=resume)
                if resume:
                    check_resumable(staging, output_names(plan))
                journal = Journal(staging, fingerprint, resume=resume)  # identifiable from the first byte on
                check_source_unchanged(plan, journal.sources, workers=workers, under_way=file_hashes)
                journal.note_stats(source_stats(plan.source.root, plan.source.shards))
            staging = Path(team.broadcast("staging", str(staging) if team.is_root else None))
            check_shared_staging(staging, team)
            if team.is_root:
                counts = {"files": len(plan.by_output_file()), "tensors": len(plan.items), "bytes": plan.source_bytes}
                hook("plan", counts)
            phases.lap("staging")
            shards, resumed, ranks = _convert_shards(
                plan,
                staging,
                journal,
                team,
                device=team.device(device),
                workers=workers,
                calibration=calib,
                hook=hook,
                file_hashes=file_hashes,
            )
            phases.lap("shards")
            outcome: dict[str, Any] = {}
            if team.is_root:
                assert journal is not None
                journal.note_sources(shards.source_hashes)  # a run refused now (NaN) can be resumed shard for shard
                if shards.nonfinite and not allow_nonfinite:
                    refuse_nonfinite(shards.nonfinite, staging)
                # A Hub snapshot lives in .../snapshots/<commit>/: record which commit was converted.
                hub_commit = None if Path(location).is_dir() else source_path.name
                outcome = _publish(
                    plan, ckpt, staging, destination, journal, shards, location, hub_commit, revision, device,
                    calibration, phases,
                )  # fmt: skip
                outcome["ranks"] = ranks
        except CheckpointError as exc:
            if exc.fields.get("errno") is None or staging is None:
                raise
            raise CheckpointError(  # a full disk, a read-only folder ...: what to do once it is fixed
                exc.message,
                hint=f"{exc.hint}; the shards finished so far stay in {staging}: continue with resume=True (--resume)",
                **exc.fields,
            ) from exc
        finally:
            if team.is_root and staging is not None:
                release(staging)
        outcome = team.broadcast("published", outcome)
        hook("done", {})
        return ConversionReport(
            destination=str(destination),
            dialect=the_dialect.name,
            contract=the_contract.name,
            contract_sha256=contract_hash(the_contract),
            device=device,
            tensors=len(plan.items),
            formats=outcome["formats"],
            source_bytes=plan.source_bytes,
            output_bytes=outcome["output_bytes"],
            seconds=time.perf_counter() - started,
            files=sorted(plan.by_output_file()),
            resumed_files=resumed,
            nonfinite=outcome["nonfinite"],
            ranks=outcome["ranks"],
            phases=phases.seconds,
        )


def _publish(
    plan: ConversionPlan,
    ckpt: SourceCheckpoint,
    staging: Path,
    destination: Path,
    journal: Journal,
    shards: ShardResults,
    location: str,
    hub_commit: str | None,
    revision: str | None,
    device: str,
    calibration: str | Path | None,
    phases: _Phases,
) -> dict[str, Any]:
    """Rank 0, once every shard is written: config, index, side files and manifest, verify, publish."""
    for name in ("config.json", *ckpt.other_files):
        shards.source_hashes[name] = file_sha256(ckpt.root / name)
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
    phases.lap("manifest")
    report = verify_checkpoint(staging, read_back=shards.sha, ignore_files=(JOURNAL,))
    phases.lap("verify")
    if not report.ok:
        raise ConversionError(
            f"the written output failed verification: {report.summary()}",
            hint=f"the unfinished output stays in {staging}; check the disk and run again with overwrite=True "
            "(--overwrite)",
        )
    journal.remove()
    publish(staging, destination)
    phases.lap("publish")
    return {"formats": manifest["formats"], "output_bytes": total, "nonfinite": shards.nonfinite}
