"""Write a set of output shards with the whole machine: files read, hashed, quantized and written in parallel.

One conversion process (one rank) gets a list of output shards (:class:`ShardJob`) and:

* reads the source files in streams (``readers`` at a time): each file front to back, cut into
  several runs of tensors when there are more readers than files (:func:`split_streams`); sha256
  cannot be split within a file, so a file read by one stream is hashed from the bytes it reads
  (:class:`~fp4convert.checkpoint.file_hashes.SourceHashes`, its chain on a thread of its own) and
  a file read in runs is hashed whole from disk in a child process of its own
  (:class:`~fp4convert.checkpoint.file_hashes.FileHashes`; a process alone starts those it can
  tell from the headers before it plans, :func:`split_files_ahead`);
* hands each tensor (or a whole fused group, once its last member is read: the group's shared
  amax is the maximum of its members', :mod:`fp4convert.convert.group_amax` for groups no stream
  holds whole) to a pool of ``workers`` threads that quantize it, hash each output tensor and
  write it at its place in its shard (:class:`~fp4convert.checkpoint.positional_writer.PositionalWriter`:
  the plan fixed every offset, so tensors are written in any order);
* every 256 MiB written to a shard, syncs it to disk on a thread of its own (the disk works
  during the conversion, not only at the end);
* reads each write back at once and compares it with the bytes hashed (the writer), closes a
  shard once its last tensor is written, renames it into place, reports it finished (the resume
  journal records it) and fsyncs it on the same pool.

Memory is bounded: a stream waits while the source bytes in flight exceed ``budget`` plus twice
the largest tensor (so an embedding and an lm_head neither wait for everything else to drain nor
hold it back). A tensor of at least half a run's share of its file is read in a run
of its own, and the runs with the largest tensors start first: a 600 MB lm_head hashed and written on
one thread at the end was a one-thread tail (``bench/device/trace_convert.py`` shows the timeline).
The native kernels, hashlib, ``pread`` / ``pwritev`` and the CUDA copies release the GIL; with
many threads each release is a hand-off, so a tensor's outputs go out in one ``pwritev`` and small
kernels keep the GIL. On a GPU, one thread at a time quantizes (Triton's runtime is not safe
against concurrent first launches); the copies to the GPU bound that step. On any
failure, or once ``check`` raises (another rank failed), every stream stops, the unfinished shards
are removed and the first error is raised as it was.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.file_hashes import FileHashes, SourceHashes
from fp4convert.checkpoint.io_errors import writing
from fp4convert.checkpoint.positional_writer import PositionalWriter
from fp4convert.checkpoint.read_buffers import ReadBuffers
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.safetensors_io import read_header
from fp4convert.checkpoint.source import SourceCheckpoint
from fp4convert.convert.shards import SHARD_METADATA, ProgressHook
from fp4convert.formats import kernels
from fp4convert.plan import ConversionPlan, PlannedTensor, input_amax, member_amax, quantize_tensor

__all__ = ["ShardJob", "ShardResults", "default_readers", "split_files_ahead", "split_streams", "write_shards"]

_WRITEBACK_BYTES = 256 << 20  # bytes written to a shard between two background fdatasyncs
# A quantizing worker runs a tensor's CPU kernel in its own thread below this many source bytes:
# the other workers keep the cores busy, and splitting each tensor again over the kernel pool
# (futures, wake-ups, GIL round trips per tensor) cost more than it balanced. 64 MiB takes one core
# about 50 ms (~1.3 GB/s per core for amax + NVFP4): a worker left alone with it at the end of a
# run costs little, while an embedding or lm_head (hundreds of MB) is still split over every core.
_SPLIT_ABOVE_BYTES = 64 << 20
# A source tensor this large is read into memory of its own rather than a reused buffer: it is
# read once (an embedding, an lm_head), and kept in the pool it would hold its memory to the end.
_OWN_BUFFER_FROM_BYTES = 64 << 20


def default_readers(workers: int) -> int:
    """Source files streamed at once: enough for the hash chains (one core each) to keep up with
    ``workers`` quantizing threads, one on a small machine so shards finish in order there."""
    return max(2, workers // 2)


@dataclass
class ShardJob:
    """What one process writes.

    Attributes:
        plan: the conversion plan.
        staging: the ``DST.partial/`` folder.
        files: the output shards to write, in plan order.
        hash_files: the source files this process hashes (each file is hashed by one rank).
        group_amax: the agreed amax of the fused groups no stream holds whole.
        device: where tensors are quantized.
        calibration: activation amaxes (None: per-token activations).
        workers: threads quantizing, hashing and writing.
        readers: source files streamed at once.
        budget: source bytes in flight at most, beyond room for the job's two largest tensors.
        file_hashes: whole-file hashes already under way (a process alone starts those of the
            files :func:`split_files_ahead` names before it plans); the job starts the others it
            needs on it, and closes it.
    """

    plan: ConversionPlan
    staging: Path
    files: Sequence[str]
    hash_files: Collection[str]
    group_amax: Mapping[str, torch.Tensor]
    device: str
    calibration: Mapping[str, float] | None
    workers: int
    readers: int = 1
    budget: int = 512 << 20
    file_hashes: FileHashes | None = None


@dataclass
class ShardResults:
    """What writing the shards gave: each output tensor's sha256 (that of the bytes in the file:
    every write is read back and compared as it is made), each hashed source file's sha256, the
    shards written, and the NaN / inf counts of the source tensors read for them."""

    sha: dict[str, str] = field(default_factory=dict)
    source_hashes: dict[str, str] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    nonfinite: dict[str, dict[str, int]] = field(default_factory=dict)  # source tensor -> {"nan": n, "inf": m}


class _Stop(Exception):
    """Raised inside the streams once another one failed (never escapes :func:`write_shards`)."""


class _Budget:
    """Source bytes in flight; a stream waits for room unless nothing is in flight."""

    def __init__(self, limit: int, stopped: threading.Event) -> None:
        self.limit = limit
        self._used = 0
        self._cond = threading.Condition()
        self._stopped = stopped

    def take(self, nbytes: int, *, force: bool = False) -> None:
        with self._cond:
            while not force and self._used and self._used + nbytes > self.limit:
                if self._stopped.is_set():
                    raise _Stop
                self._cond.wait(0.1)
            self._used += nbytes
            if self._used < self.limit:
                self._cond.notify()  # room left: the next waiter may fit too

    def give(self, nbytes: int) -> None:
        # One waiter woken, not all: each woken stream needs the GIL back, and waking every
        # reader on every finished tensor made hand-offs the conversion's bound on 16 cores.
        with self._cond:
            self._used -= nbytes
            self._cond.notify()


class _Run:
    """The state of one :func:`write_shards` call, shared by its threads."""

    def __init__(
        self,
        job: ShardJob,
        hook: ProgressHook,
        on_finished: Callable[[str, dict[str, Any]], None],
        split_files: Collection[str] = (),
    ) -> None:
        self.job = job
        self.plan = job.plan
        self.hook_lock = threading.Lock()
        self._hook = hook
        self.on_finished = on_finished
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.writers: dict[str, PositionalWriter] = {}
        by_file = self.plan.by_output_file()
        self.items = {f: by_file[f] for f in job.files}
        # the budget on top of room for the two largest tensors: an embedding and an lm_head in
        # flight neither wait for the rest to drain nor hold every other stream back meanwhile
        largest = max((i.bytes_before for items in self.items.values() for i in items), default=0)
        self.budget = _Budget(job.budget + 2 * largest, self.stopped)
        self.remaining = {f: len(items) for f, items in self.items.items()}
        self.results = ShardResults()
        self.outstanding = 0  # streams and tasks not finished yet
        self.idle = threading.Condition(self.lock)
        cuda = torch.device(job.device).type == "cuda"
        index = torch.device(job.device).index if cuda else None
        self.compute = ThreadPoolExecutor(
            max(1, job.workers),
            thread_name_prefix="fp4convert-quantize",
            # the current CUDA device is per thread: the kernels launch on the job's GPU
            initializer=(lambda: torch.cuda.set_device(index))
            if index is not None
            else (lambda: kernels.set_split_threshold(_SPLIT_ABOVE_BYTES)),
        )
        # Triton's runtime is not safe against concurrent first launches (it compiles then): one
        # thread at a time on the GPU; hashing, writing and reading still run on every thread.
        self.gpu: Any = threading.Lock() if cuda else contextlib.nullcontext()
        self.syncer = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-writeback")
        # a file read front to back by one stream is hashed from the bytes read; a file several
        # streams read in pieces is hashed from disk in a child process (perhaps under way already)
        self.file_hashes = job.file_hashes if job.file_hashes is not None else FileHashes(self.plan.source.root)
        self.file_hashes.start(f for f in job.hash_files if f in split_files)
        chained = [f for f in job.hash_files if f not in self.file_hashes.files]
        self.reader = SourceReader(
            self.plan.source,
            hashes=SourceHashes(self.plan.source, files=chained, fill_gaps=True),
            # the budget's worth of buffers reused (no page faults on most reads); a tensor of
            # 64 MiB or more (an embedding, an lm_head: read once) gets memory of its own, which
            # is returned once it is written, so the peak RSS stays what the budget makes it
            buffers=ReadBuffers(job.budget, keep_below=_OWN_BUFFER_FROM_BYTES),
        )

    def hook(self, event: str, payload: Mapping[str, Any]) -> None:
        with self.hook_lock:
            self._hook(event, payload)

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if not isinstance(exc, _Stop):
                self.errors.append(exc)
        self.stopped.set()

    def submit(self, fn: Callable[..., Any], *args: Any, pool: ThreadPoolExecutor | None = None) -> None:
        with self.lock:
            self.outstanding += 1
        (pool or self.compute).submit(self.guarded, fn, *args)

    def guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            if self.stopped.is_set():
                raise _Stop
            fn(*args)
        except BaseException as exc:
            self.fail(exc)
        finally:
            with self.lock:
                self.outstanding -= 1
                if not self.outstanding:
                    self.idle.notify_all()

    def wait(self, check: Callable[[], None]) -> None:
        """Until every stream and task is done, or the work stopped; ``check`` runs meanwhile."""
        while True:
            with self.lock:
                if not self.outstanding or self.stopped.is_set():
                    return
                self.idle.wait(0.2)
            try:
                check()
            except BaseException as exc:
                self.fail(exc)
                return

    # -- one source file, front to back ------------------------------------------------------------

    def stream(self, items: list[PlannedTensor]) -> None:
        """Read ``items`` (one source file's share, in file order) and queue their quantization."""
        groups = self.plan.groups
        held: dict[str, list[tuple[PlannedTensor, torch.Tensor]]] = {}
        for item in items:
            if self.stopped.is_set():
                raise _Stop
            name = item.info.name
            self.budget.take(item.bytes_before, force=bool(held))  # held members must not wait on themselves
            x = self.reader.read(name)
            group = item.decision.fused_group
            if group in groups and group not in self.job.group_amax:
                held.setdefault(group, []).append((item, x))
                if len(held[group]) < len(groups[group]):
                    continue
                self.submit(self.quantize, held.pop(group))
            else:
                self.submit(self.quantize, [(item, x)])
        if held:  # groups_to_agree sends every group not whole in one stream to group_amax
            raise RuntimeError(f"internal error: fused groups {sorted(held)} were not whole in one stream")

    # -- one tensor or one fused group -------------------------------------------------------------

    def quantize(self, members: list[tuple[PlannedTensor, torch.Tensor]]) -> None:
        plan = self.plan
        first = members[0][0]
        amax = None
        group = first.decision.fused_group
        if len(members) > 1:  # a whole fused group: the maximum of its members' amaxes
            amax = torch.stack([member_amax(x) for _, x in members]).amax()
        elif group is not None and group in self.job.group_amax:
            amax = self.job.group_amax[group]
        for item, x in members:
            try:
                with self.gpu:
                    tensors = quantize_tensor(
                        item,
                        x,
                        dialect=plan.dialect,
                        profile=plan.contract.nvfp4_profile,
                        amax=amax,
                        input_amax=input_amax(item, plan.groups, self.job.calibration),
                        device=self.job.device,
                    )
                writer = self.writer(item.output_file)
                writer.write_many([(name, tensors[name]) for name, _, _ in item.outputs])  # sha256 + pwritev
                del tensors
                if writer.writeback_due():
                    self.submit(writer.writeback, pool=self.syncer)  # the disk writes while we go on
                self.hook("tensor", {"name": item.info.name, "bytes": item.bytes_before})
            finally:
                self.budget.give(item.bytes_before)
            self.tensor_done(item.output_file)

    def writer(self, file: str) -> PositionalWriter:
        with self.lock:
            writer = self.writers.get(file)
            if writer is None:
                if self.stopped.is_set():
                    raise _Stop
                layout = [spec for item in self.items[file] for spec in item.outputs]
                tmp = self.job.staging / (file + ".tmp")
                writer = self.writers[file] = PositionalWriter(
                    tmp, layout, metadata=SHARD_METADATA, writeback_every=_WRITEBACK_BYTES
                )
                created = True
            else:
                created = False
        if created:
            self.hook("shard", {"file": file, "resumed": False})
        return writer

    def tensor_done(self, file: str) -> None:
        with self.lock:
            self.remaining[file] -= 1
            last = self.remaining[file] == 0
        if not last:
            return
        writer = self.writers[file]
        writer.close(sync=False)  # the read-back fsyncs it, off the critical path
        names = [item.info.name for item in self.items[file]]
        nonfinite = {n: self.reader.nonfinite[n] for n in names if n in self.reader.nonfinite}
        # the journal entry: what the shard holds, and the source files hashed whole so far (a
        # resumed run keeps the shard only if the files it was made from are unchanged); made
        # before the rename, so the shard shows in place only a moment before the journal has it
        sources = {**self.reader.finished_hashes(), **self.file_hashes.finished()}
        record = {"tensors": dict(writer.sha256), "nonfinite": nonfinite, "sources": sources}
        path = self.job.staging / file
        with writing(path):
            os.replace(writer.path, path)
        with self.lock:
            del self.writers[file]
            self.results.written.append(file)
            self.results.sha.update(writer.sha256)
            self.results.nonfinite.update(nonfinite)
            self.on_finished(file, record)
        # every write was read back and compared as it was made (PositionalWriter): the file's
        # tensors hash as recorded; what is left is making it durable, off the critical path
        self.submit(self.sync, path)

    def sync(self, path: Path) -> None:
        """fsync a finished shard and parse its header (here, in parallel: verify finds it cached)."""
        with writing(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        read_header(path)

    def close(self) -> None:
        self.compute.shutdown(wait=True, cancel_futures=True)
        self.syncer.shutdown(wait=True, cancel_futures=True)
        for writer in self.writers.values():
            writer.abort()
        self.writers.clear()
        self.reader.close()
        self.file_hashes.close()

    def source_hashes(self) -> dict[str, str]:
        """sha256 of every source file this process hashes, in the source's order."""
        digests = {**self.reader.hashes.hexdigests(), **self.file_hashes.hexdigests()}
        return {f: digests[f] for f in self.plan.source.shards if f in digests}


def _runs(nbytes: int, count: int, total: int, readers: int) -> int:
    """Runs a source file of ``count`` tensors and ``nbytes`` (of ``total``) is read in: its share
    of the readers by bytes, one at least and one per tensor at most."""
    return max(1, min(count, round(readers * nbytes / (total or 1))))


def split_files_ahead(source: SourceCheckpoint, readers: int) -> list[str]:
    """The source files :func:`split_streams` will cut into runs (hashed whole in a child process
    each), told from the headers alone: a process alone starts hashing them before it plans, so
    their sha256 chains, the longest single steps of a conversion on many cores, run meanwhile.
    (The plan may read a little less of a file than its headers hold; a file guessed wrongly is
    only hashed the other way, the result is the same.)"""
    sizes = {f: (sum(e.nbytes for e in entries.values()), len(entries)) for f, entries in source.shards.items()}
    total = sum(n for n, _ in sizes.values())
    return [f for f, (n, count) in sizes.items() if _runs(n, count, total, readers) > 1]


def split_streams(by_source: Mapping[str, list[PlannedTensor]], job: ShardJob) -> list[list[PlannedTensor]]:
    """The read streams: each source file's items (in its data order) cut into up to ``k`` runs of
    about equal bytes, ``k`` its share of ``job.readers`` by bytes, so a few large files still keep
    every reader busy (one stream per file left a 16-core host at a third of its cores). A cut never
    separates the members of a fused group that one stream must hold whole (groups whose amax was
    agreed beforehand, ``job.group_amax``, may be cut)."""
    total = sum(i.bytes_before for items in by_source.values() for i in items)
    streams: list[list[PlannedTensor]] = []
    for items in by_source.values():
        nbytes = sum(i.bytes_before for i in items)
        pieces = _runs(nbytes, len(items), total, job.readers)
        if pieces == 1:
            streams.append(items)
            continue
        large_from = nbytes / pieces / 2  # half a run's share: read alone, started first (write_shards)
        last: dict[str, int] = {}  # fused group -> index of its last member here
        for index, item in enumerate(items):
            group = item.decision.fused_group
            if group is not None and group in job.plan.groups and group not in job.group_amax:
                last[group] = index
        start, done, open_until, cuts = 0, 0, -1, 0
        for index, item in enumerate(items):
            # a cut before ``index`` is allowed once every group opened before it has closed
            free = index > start and open_until < index
            large = item.bytes_before >= large_from
            if free and (large or (cuts < pieces - 1 and done >= nbytes * (cuts + 1) / pieces)):
                streams.append(items[start:index])
                start, cuts = index, cuts + 1
            elif free and index > 0 and items[index - 1].bytes_before >= large_from:
                streams.append(items[start:index])  # the cut after a large tensor
                start = index
            group = item.decision.fused_group
            if group in last:
                open_until = max(open_until, last[group])
            done += item.bytes_before
        streams.append(items[start:])
    return [s for s in streams if s]


def write_shards(
    job: ShardJob,
    *,
    hook: ProgressHook,
    on_finished: Callable[[str, dict[str, Any]], None],
    check: Callable[[], None] = lambda: None,
) -> ShardResults:
    """Write the output shards of ``job`` (see the module docstring).

    Args:
        job: what to write.
        hook: progress events ``("shard", ...)`` and ``("tensor", ...)`` (called one at a time).
        on_finished: called with each shard once it is complete on disk, and its journal entry:
            ``tensors`` (each tensor's sha256), ``nonfinite`` (NaN / inf counts of its source
            tensors) and ``sources`` (the source files hashed whole so far, with their sha256).
        check: called while the work runs; an exception it raises stops the work and is raised.

    Returns:
        A :class:`ShardResults`.
    """
    view = job.plan.source.view()
    by_output = job.plan.by_output_file()
    by_source: dict[str, list[PlannedTensor]] = {}
    for file in job.files:
        for item in by_output[file]:
            by_source.setdefault(item.source_file, []).append(item)
    for items in by_source.values():
        items.sort(key=lambda i: view.tensors[i.info.name].position)  # the file's data order
    streams = split_streams(by_source, job)
    split_files = {f for f, n in Counter(s[0].source_file for s in streams).items() if n > 1}
    # Streams holding the largest tensors first: an embedding or lm_head (hundreds of MB, hashed
    # and written on one thread) read last would leave a one-thread tail at the end of the run.
    streams.sort(key=lambda s: -max(i.bytes_before for i in s))
    run = _Run(job, hook, on_finished, split_files)
    try:
        streams_at_once = max(1, min(job.readers, len(streams)))
        with ThreadPoolExecutor(streams_at_once, thread_name_prefix="fp4convert-read") as pool:
            for items in streams:
                run.submit(run.stream, items, pool=pool)
            run.wait(check)  # a task counts its read-backs before it ends: nothing is missed
        if run.errors:
            raise run.errors[0]
        run.results.source_hashes = run.source_hashes()
    finally:
        run.stopped.set()
        run.close()
    if run.errors:
        raise run.errors[0]
    return run.results
