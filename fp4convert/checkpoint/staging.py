"""Atomic output folders: everything is written into ``DST.partial/`` and renamed to ``DST`` at the end.

A failed or interrupted run never leaves a ``DST`` that looks complete, and nothing is ever
written outside ``DST.partial/`` then ``DST``. :func:`prepare_staging` refuses a destination that
overlaps the source or exists (unless asked to replace it); :func:`write_json_atomic` writes a
file under a temporary name and renames it; :class:`Journal` records finished shards so a resumed
run keeps them; :func:`publish` swaps the finished folder into place.

Error hints name both spellings of an option (``overwrite=True`` for Python callers,
``--overwrite`` on the command line): the library serves both.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from fp4convert.errors import ConversionError

__all__ = ["JOURNAL", "Journal", "prepare_staging", "publish", "staging_path", "write_json_atomic"]

#: the resume journal inside ``DST.partial/``
JOURNAL = ".fp4convert-journal.json"


def staging_path(destination: Path) -> Path:
    """``DST.partial``, next to ``DST``.

    Example:
        >>> staging_path(Path("out/model")).as_posix()
        'out/model.partial'
    """
    return destination.with_name(destination.name + ".partial")


def prepare_staging(
    source: Path, destination: Path, *, overwrite: bool, resume: bool = False, resumable: bool = True
) -> Path:
    """Check ``destination`` and return ``DST.partial/``, created (kept as it is when resuming).

    Args:
        source: the folder read from; the destination may neither contain it nor lie inside it.
        destination: the output folder.
        overwrite: replace an existing destination and start over any interrupted run.
        resume: keep an interrupted run's ``DST.partial/`` to continue it.
        resumable: whether the caller can resume at all (worded into the hint).

    Raises:
        ConversionError: the destination overlaps the source, exists, or an interrupted run is
            in the way (without ``overwrite`` / ``resume``).
    """
    src, dst = source.resolve(), destination.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        raise ConversionError(
            f"destination {destination} overlaps the source {source}",
            hint="write the output to a separate folder; the source is never modified",
        )
    if destination.exists() and not overwrite:
        raise ConversionError(
            f"destination {destination} already exists",
            hint="pass overwrite=True (--overwrite) to replace it, or choose another folder",
            file=str(destination),
        )
    staging = staging_path(destination)
    if staging.exists() and not resume:
        if not overwrite:
            hint = "pass overwrite=True (--overwrite) to start over"
            if resumable:
                hint = "pass resume=True (--resume) to continue it, or overwrite=True (--overwrite) to start over"
            raise ConversionError(f"{staging} holds an interrupted conversion", hint=hint, file=str(staging))
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    return staging


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON under a temporary name, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a fresh file, never through a symlink left at this name
    with tmp.open("x") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Journal:
    """Which output shards of a run are finished, and what the run was (its fingerprint).

    Written to ``DST.partial/.fp4convert-journal.json`` from the first byte on, so a resumed run
    can tell whether it continues the same job; removed just before the folder is published.

    Args:
        staging: the ``DST.partial/`` folder.
        fingerprint: what identifies the job (contract, dialect, options, source headers).
        resume: load the journal an interrupted run left, if any.

    Raises:
        ConversionError: the journal left there is unreadable, or belongs to another job.
    """

    def __init__(self, staging: Path, fingerprint: str, *, resume: bool) -> None:
        self.path = staging / JOURNAL
        self.data: dict[str, Any] = {"fingerprint": fingerprint, "files": {}}
        if resume and self.path.is_file():
            try:
                previous = json.loads(self.path.read_text())
                same = previous.get("fingerprint") == fingerprint and isinstance(previous.get("files"), dict)
            except (OSError, ValueError, AttributeError):
                previous, same = None, False
            if previous is None:
                raise ConversionError(
                    f"{self.path} is unreadable: the interrupted run cannot be resumed",
                    hint="pass overwrite=True (--overwrite) to start over",
                    file=str(self.path),
                )
            if not same:
                raise ConversionError(
                    f"{staging} was started with another contract, dialect, options or source",
                    hint="pass overwrite=True (--overwrite) to start over",
                )
            self.data = previous
        write_json_atomic(self.path, self.data)

    def finished(self, file: str) -> dict[str, str] | None:
        """The tensor sha256 recorded for a finished output shard (None: not finished)."""
        done = self.data["files"].get(file)
        return done.get("tensors") if isinstance(done, dict) else None

    def record(self, file: str, tensors: dict[str, str]) -> None:
        """Mark ``file`` finished with its tensors' sha256."""
        self.data["files"][file] = {"tensors": tensors}
        write_json_atomic(self.path, self.data)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def publish(staging: Path, destination: Path) -> None:
    """Rename the finished ``staging`` folder to ``destination`` (replacing an old one last)."""
    if destination.exists():
        trash = destination.with_name(f"{destination.name}.old-{os.getpid()}")
        os.replace(destination, trash)
        os.replace(staging, destination)
        shutil.rmtree(trash)
    else:
        os.replace(staging, destination)
