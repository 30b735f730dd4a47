"""The manifest a converted checkpoint carries (``fp4convert.json``): its name, version and reader.

The manifest embeds the contract and its hash, the fp4convert version and quantizer profile, the
source files' sha256, and for every source tensor its decision and the sha256 of each output
tensor (the converter builds it: :mod:`fp4convert.convert.manifest`). ``verify``, ``dequantize``
and ``publish`` read it; its presence marks a finished conversion.

A manifest in a folder is as untrusted as the folder: :func:`read_manifest` checks the structure
every reader relies on (:func:`manifest_problem`), so a crafted or damaged one is one error naming
the field, never a ``KeyError`` somewhere later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fp4convert.errors import CheckpointError

__all__ = ["MANIFEST", "MANIFEST_VERSION", "manifest_problem", "read_manifest"]

MANIFEST = "fp4convert.json"
MANIFEST_VERSION = 1


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a converted checkpoint.

    Raises:
        CheckpointError: no manifest (not an fp4convert output, or an unfinished one), a manifest
            that is not a JSON object, one of another manifest_version, or one whose structure is
            broken (:func:`manifest_problem`).
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
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise CheckpointError(f"{path}: unsupported manifest_version {manifest.get('manifest_version')!r}")
    problem = manifest_problem(manifest)
    if problem is not None:
        raise CheckpointError(
            f"{path}: not a valid fp4convert manifest: {problem}",
            hint="the manifest was edited or damaged; convert the checkpoint again",
            file=str(path),
        )
    return manifest


def _is(value: Any, kind: str) -> bool:
    if kind == "shape":
        return isinstance(value, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
        )
    if kind == "str?":
        return value is None or isinstance(value, str)
    return isinstance(value, {"str": str, "dict": dict, "int": int}[kind])


# field -> kind, for the top level and for each tensor and output entry
_TOP = {
    "dialect": "str",
    "contract": "dict",
    "contract_sha256": "str",
    "formats": "dict",
    "source": "dict",
    "tensors": "dict",
    "producer": "dict",
    "quantizer_profile": "str",
    "activation_mode": "str",
}
_TENSOR = {"format": "str", "outputs": "dict", "fused_group": "str?"}
_OUTPUT = {"file": "str", "dtype": "str", "shape": "shape", "sha256": "str"}


def _fields_problem(where: str, data: Any, fields: dict[str, str]) -> str | None:
    if not isinstance(data, dict):
        return f"{where} is not an object"
    for key, kind in fields.items():
        if not _is(data.get(key), kind):
            return f"{where}{key} is {'missing' if key not in data else f'not a {kind.rstrip(chr(63))}'}"
    return None


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with the structure of a manifest (None when its readers can rely on it).

    Example:
        >>> manifest_problem({"dialect": "modelopt"})
        'contract is missing'
    """
    problem = _fields_problem("", manifest, _TOP)
    if problem is not None:
        return problem
    files = manifest["source"].get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return "source.files is not an object of sha256 strings"
    if not isinstance(manifest.get("nonfinite", {}), dict):
        return "nonfinite is not an object"
    for name, info in manifest["tensors"].items():
        problem = _fields_problem(f"tensors[{name!r}].", info, _TENSOR)
        for out_name, out in (info.get("outputs") or {}).items() if problem is None else ():
            problem = problem or _fields_problem(f"tensors[{name!r}].outputs[{out_name!r}].", out, _OUTPUT)
        if problem is not None:
            return problem
    return None
