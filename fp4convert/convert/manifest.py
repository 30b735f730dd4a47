"""The manifest every converted checkpoint carries (``fp4convert.json``), and the resume journal.

The manifest embeds the contract and its hash, the fp4convert version and quantizer profile, the
source files' sha256, and for every source tensor its decision and the sha256 of each output
tensor. ``verify`` and ``publish`` read it; its presence marks a finished conversion.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.errors import CheckpointError

__all__ = ["JOURNAL", "MANIFEST", "file_sha256", "read_manifest", "write_json_atomic"]

MANIFEST = "fp4convert.json"
JOURNAL = ".fp4convert-journal.json"
MANIFEST_VERSION = 1


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


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a converted checkpoint.

    Raises:
        CheckpointError: no manifest (not an fp4convert output, or an unfinished one).
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it is not a finished fp4convert output",
            hint="convert it with `fp4convert convert`, or finish an interrupted run with --resume",
            file=str(path),
        )
    manifest = json.loads(path.read_text())
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise CheckpointError(f"{path}: unsupported manifest_version {manifest.get('manifest_version')!r}")
    return manifest
