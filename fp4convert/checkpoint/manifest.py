"""The manifest a converted checkpoint carries (``fp4convert.json``): its name, version and reader.

The manifest embeds the contract and its hash, the fp4convert version and quantizer profile, the
source files' sha256, and for every source tensor its decision and the sha256 of each output
tensor (the converter builds it: :mod:`fp4convert.convert.manifest`). ``verify``, ``dequantize``
and ``publish`` read it; its presence marks a finished conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fp4convert.errors import CheckpointError

__all__ = ["MANIFEST", "MANIFEST_VERSION", "read_manifest"]

MANIFEST = "fp4convert.json"
MANIFEST_VERSION = 1


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a converted checkpoint.

    Raises:
        CheckpointError: no manifest (not an fp4convert output, or an unfinished one), a manifest
            that is not a JSON object, or one of another manifest_version.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it is not a finished fp4convert output",
            hint="convert it with `fp4convert convert`, or finish an interrupted run with resume=True (--resume)",
            file=str(path),
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise CheckpointError(f"{path}: unsupported manifest_version {manifest.get('manifest_version')!r}")
    return manifest
