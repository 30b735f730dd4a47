"""Atomic output folders: everything is written into ``DST.partial/`` and renamed to ``DST`` at the end.

A failed or interrupted run never leaves a ``DST`` that looks complete, and nothing is ever
written outside ``DST.partial/`` then ``DST``. :func:`prepare_staging` refuses a destination that
overlaps the source or exists (unless asked to replace it), and locks ``DST.partial/`` so that two
runs on one destination cannot interleave (the second is refused); :func:`write_json_atomic`
writes a file under a temporary name and renames it; :class:`Journal` records finished shards (and
the source files' sha256 known so far) so a resumed run keeps them; :func:`check_resumable` makes
sure an interrupted run's folder holds only what a run writes (no symlink, no stray file);
:func:`publish` swaps the finished folder into place and :func:`discard` removes a failed one.

The lock is ``flock`` on the ``DST.partial/`` folder itself (no lock file outside it). It belongs
to the process: the kernel drops it when the process dies (``kill -9`` included), and a call in the
same process takes it over, so a library caller can retry after a failure.

Error hints name both spellings of an option (``overwrite=True`` for Python callers,
``--overwrite`` on the command line): the library serves both.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.io_errors import writing
from fp4convert.errors import ConversionError

__all__ = [
    "JOURNAL",
    "Journal",
    "check_resumable",
    "discard",
    "prepare_staging",
    "publish",
    "release",
    "staging_path",
    "write_json_atomic",
]

#: the resume journal inside ``DST.partial/``
JOURNAL = ".fp4convert-journal.json"


def staging_path(destination: Path) -> Path:
    """``DST.partial``, next to ``DST``.

    Example:
        >>> staging_path(Path("out/model")).as_posix()
        'out/model.partial'
    """
    return destination.with_name(destination.name + ".partial")


_LOCKS: dict[str, int] = {}  # staging folder (resolved) -> the fd holding its flock, in this process
_LOCKS_GUARD = threading.Lock()


def _lock(staging: Path) -> None:
    """Take the flock of ``staging`` for this process (see the module docstring)."""
    key = str(staging.resolve())
    with _LOCKS_GUARD:
        previous = _LOCKS.pop(key, None)
        if previous is not None:
            held, now = os.fstat(previous), os.stat(staging)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                _LOCKS[key] = previous  # this process holds it already
                return
            os.close(previous)  # the lock of a folder since removed
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConversionError(
                f"{staging} is being written by another fp4convert run",
                hint="wait for that run to finish (or stop it), or write to another destination",
                file=str(staging),
            ) from None
        _LOCKS[key] = fd


def release(staging: Path) -> None:
    """Drop this process's lock on ``staging`` (nothing when it holds none)."""
    with _LOCKS_GUARD:
        for key in (str(staging.resolve()), str(staging.absolute())):
            fd = _LOCKS.pop(key, None)
            if fd is not None:
                os.close(fd)


def _refuse_symlink(path: Path, what: str) -> None:
    if path.is_symlink():
        raise ConversionError(
            f"{what} {path} is a symlink (to {os.readlink(path)}), which no fp4convert run makes",
            hint="remove it; fp4convert writes only into a real DST.partial/ folder it creates",
            file=str(path),
        )


def prepare_staging(
    source: Path, destination: Path, *, overwrite: bool, resume: bool = False, resumable: bool = True
) -> Path:
    """Check ``destination`` and return ``DST.partial/``, created (kept as it is when resuming) and locked.

    Args:
        source: the folder read from; the destination may neither contain it nor lie inside it.
        destination: the output folder.
        overwrite: replace an existing destination and start over any interrupted run.
        resume: keep an interrupted run's ``DST.partial/`` to continue it.
        resumable: whether the caller can resume at all (worded into the hint).

    Raises:
        ConversionError: the destination overlaps the source, exists, or an interrupted run is
            in the way (without ``overwrite`` / ``resume``); ``DST.partial`` is a symlink or is
            locked by another run.
        CheckpointError: the folder cannot be created (read-only, no permission, disk full).
    """
    src, dst = source.resolve(), destination.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise ConversionError(
            f"destination {destination} overlaps the source {source}",
            hint="write the output to a separate folder; the source is never modified",
        )
    if (destination.exists() or destination.is_symlink()) and not overwrite:
        raise ConversionError(
            f"destination {destination} already exists",
            hint="pass overwrite=True (--overwrite) to replace it, or choose another folder",
            file=str(destination),
        )
    staging = staging_path(destination)
    _refuse_symlink(staging, "the staging folder")
    if staging.exists() and not staging.is_dir():
        raise ConversionError(
            f"{staging} is a file, not the folder of an interrupted run",
            hint="remove it, or choose another destination",
            file=str(staging),
        )
    if staging.exists():
        _lock(staging)  # before anything is removed: a running conversion keeps its folder
        if not resume:
            if not overwrite:
                release(staging)
                hint = "pass overwrite=True (--overwrite) to start over"
                if resumable:
                    hint = "pass resume=True (--resume) to continue it, or overwrite=True (--overwrite) to start over"
                raise ConversionError(f"{staging} holds an interrupted conversion", hint=hint, file=str(staging))
            with writing(staging, "cannot remove"):
                shutil.rmtree(staging)
            release(staging)
    with writing(staging, "cannot create"):
        staging.mkdir(parents=True, exist_ok=True)
    _lock(staging)
    return staging


def check_resumable(staging: Path, outputs: Iterable[str]) -> None:
    """Make an interrupted run's ``staging`` safe to continue: only its ``outputs`` (the file names
    this run writes) and the journal may be there; their temporary copies are removed.

    Raises:
        ConversionError: a symlink, a folder, or a file no run of this job writes.
    """
    known = {*outputs, JOURNAL}
    for entry in sorted(staging.iterdir()):
        _refuse_symlink(entry, "in the interrupted run's folder,")
        if entry.name.endswith(".tmp") and entry.name.removesuffix(".tmp") in known and entry.is_file():
            with writing(entry, "cannot remove"):
                entry.unlink()  # half written when the run stopped
            continue
        if entry.name not in known or not entry.is_file():
            raise ConversionError(
                f"{staging} holds {entry.name}{'/' if entry.is_dir() else ''}, which this conversion does not write",
                hint="remove it to resume, or pass overwrite=True (--overwrite) to start over",
                file=str(entry),
            )


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON under a temporary name, fsync, then rename over ``path``.

    Raises:
        CheckpointError: the file cannot be written (disk full, read-only, no permission).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(tmp):
        try:
            tmp.unlink(missing_ok=True)  # a fresh file, never through a symlink left at this name
            with tmp.open("x") as f:
                json.dump(data, f, indent=2, sort_keys=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


class Journal:
    """Which output shards of a run are finished, and what the run was (its fingerprint).

    Written to ``DST.partial/.fp4convert-journal.json`` from the first byte on, so a resumed run
    can tell whether it continues the same job; removed just before the folder is published. Each
    finished shard records its tensors' sha256 and what it noted about its inputs (non-finite
    counts); the journal also keeps the sha256 of every source file read to its end, so a resumed
    run can check that the bytes it keeps came from the source as it is now, and the ``stat``
    fingerprint (size, mtime, ctime, inode) of every source file as the run found it when it began
    (for the files an interrupted run never hashed whole: a file written since shows another ctime).

    Args:
        staging: the ``DST.partial/`` folder.
        fingerprint: what identifies the job (contract, dialect, options, source headers).
        resume: load the journal an interrupted run left, if any.

    Raises:
        ConversionError: the journal left there is unreadable, or belongs to another job.
    """

    def __init__(self, staging: Path, fingerprint: str, *, resume: bool) -> None:
        self.path = staging / JOURNAL
        self.data: dict[str, Any] = {"fingerprint": fingerprint, "files": {}, "sources": {}, "stats": {}}
        if resume and self.path.is_file():
            try:
                previous = json.loads(self.path.read_text())
            except (OSError, ValueError):
                previous = None
            if not (
                isinstance(previous, dict)
                and isinstance(previous.get("files"), dict)
                and isinstance(previous.get("sources", {}), dict)
            ):
                raise ConversionError(
                    f"{self.path} is unreadable: the interrupted run cannot be resumed",
                    hint="pass overwrite=True (--overwrite) to start over",
                    file=str(self.path),
                )
            if previous.get("fingerprint") != fingerprint:
                raise ConversionError(
                    f"{staging} was started with another contract, dialect, options or source",
                    hint="pass overwrite=True (--overwrite) to start over",
                )
            previous.setdefault("sources", {})
            if not isinstance(previous.get("stats"), dict):
                previous["stats"] = None  # not known: stats taken now would prove nothing about that run
            self.data = previous
        write_json_atomic(self.path, self.data)

    def entry(self, file: str) -> dict[str, Any] | None:
        """What the journal holds about a finished output shard (None: not finished)."""
        done = self.data["files"].get(file)
        return done if isinstance(done, dict) and isinstance(done.get("tensors"), dict) else None

    def finished(self, file: str) -> dict[str, str] | None:
        """The tensor sha256 recorded for a finished output shard (None: not finished)."""
        done = self.entry(file)
        return None if done is None else done["tensors"]

    @property
    def sources(self) -> dict[str, str]:
        """sha256 of the source files the interrupted run read to their end."""
        return {k: v for k, v in self.data["sources"].items() if isinstance(k, str) and isinstance(v, str)}

    @property
    def stats(self) -> dict[str, list[int]]:
        """``stat`` fingerprints of the source files when the (first, interrupted) run began."""
        recorded = self.data.get("stats") or {}
        return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, list)}

    def note_stats(self, stats: dict[str, list[int]]) -> None:
        """Record the source files' ``stat`` fingerprints, unless a run already did (the first run's stay)."""
        if self.data.get("stats") is None:
            return
        for file, fingerprint in stats.items():
            self.data["stats"].setdefault(file, fingerprint)
        write_json_atomic(self.path, self.data)

    def record(
        self,
        file: str,
        tensors: dict[str, str],
        *,
        nonfinite: dict[str, dict[str, int]] | None = None,
        sources: dict[str, str] | None = None,
    ) -> None:
        """Mark ``file`` finished with its tensors' sha256 (and its inputs' non-finite counts), and
        note the source files hashed so far."""
        self.data["files"][file] = {"tensors": tensors, "nonfinite": dict(nonfinite or {})}
        self.data["sources"].update(sources or {})
        write_json_atomic(self.path, self.data)

    def note_sources(self, sources: dict[str, str]) -> None:
        """Record the sha256 of source files (every one, once all shards are written)."""
        self.data["sources"].update(sources)
        write_json_atomic(self.path, self.data)

    def remove(self) -> None:
        with writing(self.path, "cannot remove"):
            self.path.unlink(missing_ok=True)


def publish(staging: Path, destination: Path) -> None:
    """Rename the finished ``staging`` folder to ``destination`` (replacing an old one last), and
    drop the lock.

    Raises:
        CheckpointError: a rename failed (the finished folder then stays at ``staging``).
    """
    try:
        with writing(destination, "cannot publish"):
            if destination.exists() or destination.is_symlink():
                trash = destination.with_name(f"{destination.name}.old-{os.getpid()}")
                os.replace(destination, trash)
                os.replace(staging, destination)
                if trash.is_dir() and not trash.is_symlink():
                    shutil.rmtree(trash)
                else:
                    trash.unlink()
            else:
                os.replace(staging, destination)
    finally:
        release(staging)


def discard(staging: Path) -> None:
    """Remove a failed run's ``staging`` folder (for callers that cannot resume) and drop the lock."""
    try:
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        release(staging)
