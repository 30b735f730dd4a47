"""A Hugging Face checkpoint directory opened read-only: config, shards, index, other files.

Only safetensors weights are ever read. Pickle-based weights (``*.bin``, ``*.pt``, ``*.pth``,
``*.ckpt``, ``*.pkl``) are refused when they are the only weights, and ignored otherwise.

A source is untrusted input (a Hub repo can ship any index): shard names an index gives must be
plain ``*.safetensors`` file names, and every file read must resolve (symlinks followed) inside
the source folder, or inside the Hub cache's ``blobs/`` folder when the source is a Hub snapshot
(whose files are symlinks to ``../../blobs/<hash>``). Output file names never come from here:
:func:`output_shard_names` generates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.decode.units import SourceView
from fp4convert.checkpoint.decode.view import source_view
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, TensorEntry, read_header
from fp4convert.errors import CheckpointError
from fp4convert.inventory import ModelInventory

__all__ = [
    "INDEX_NAME",
    "PICKLE_SUFFIXES",
    "SourceCheckpoint",
    "checked_file",
    "inventory_from_checkpoint",
    "open_checkpoint",
    "output_shard_names",
    "read_weight_map",
    "shard_name_problem",
]

INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Files a converted checkpoint must not inherit: weights, their index, and quantization side files.
_NOT_COPIED_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES, ".h5", ".msgpack", ".partial", ".tmp")
_NOT_COPIED_NAMES = {INDEX_NAME, "config.json", "hf_quant_config.json", "fp4convert.json", "README.md"}


@dataclass
class SourceCheckpoint:
    """What conversion reads from a source checkpoint (nothing is opened for writing)."""

    root: Path
    config: dict[str, Any]
    shards: dict[str, dict[str, TensorEntry]]  # file name -> its tensors, in data order
    tensor_file: dict[str, str] = field(default_factory=dict)  # tensor name -> file name
    other_files: list[str] = field(default_factory=list)  # copied unchanged (tokenizer, ...)
    _view: SourceView | None = field(default=None, repr=False, compare=False)

    def open(self, shard: str) -> SafetensorsFile:
        return SafetensorsFile(self.root / shard)

    def entry(self, tensor: str) -> TensorEntry:
        return self.shards[self.tensor_file[tensor]][tensor]

    def view(self) -> SourceView:
        """The logical view of this source: every model tensor under its per-tensor name, its source
        format (dense, FP8 block-scaled, MXFP4, fused 3-D experts) and read unit; built once from the
        headers (:func:`fp4convert.checkpoint.decode.source_view`, docs/sources.md).

        Raises:
            CheckpointError: the source's structure is inconsistent (a missing or mismatched scale ...).
        """
        if self._view is None:
            self._view = source_view(self.config, self.shards)
        return self._view

    def inventory(self) -> ModelInventory:
        """Every tensor, classified by its family, from the headers already read: in read order
        (shard by shard, each in data order), with decoded shapes and dtypes and source formats.

        Raises:
            MappingError: a tensor is not part of the config's family, or is ambiguous.
            CheckpointError: the source's structure is inconsistent.
        """
        return self.view().inventory()


_JSON_TYPES = {int: "number", float: "number", bool: "boolean", list: "array", dict: "object", type(None): "null"}


def output_shard_names(count: int) -> list[str]:
    """The names fp4convert gives ``count`` output shards: ``model.safetensors`` for one, else
    ``model-00001-of-0000N.safetensors`` ... (never a name taken from the source).

    Example:
        >>> output_shard_names(1), output_shard_names(2)[1]
        (['model.safetensors'], 'model-00002-of-00002.safetensors')
    """
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def shard_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain safetensors file name (None when it is one).

    Example:
        >>> shard_name_problem("model-00001-of-00002.safetensors") is None
        True
        >>> shard_name_problem("../victim/evil.safetensors")
        'is not a plain file name (it contains a path separator)'
    """
    if not isinstance(name, str):
        return f"is a JSON {_JSON_TYPES.get(type(name), type(name).__name__)}, not a file name string"
    if "\0" in name:
        return "contains a NUL byte"
    if "/" in name or "\\" in name:
        return "is not a plain file name (it contains a path separator)"
    if name in ("", ".", ".."):
        return "is not a file name"
    if not name.endswith(".safetensors"):
        return "does not end with .safetensors"
    return None


def _allowed_roots(root: Path) -> tuple[Path, ...]:
    """Where the files of ``root`` may resolve to: the folder, and for a Hub snapshot
    (``.../snapshots/<commit>``) the cache's ``blobs/`` folder its symlinks point into."""
    real = root.resolve()
    blobs = real.parent.parent / "blobs"
    if real.parent.name == "snapshots" and blobs.is_dir():
        return real, blobs.resolve()
    return (real,)


def checked_file(root: Path, name: str, *, roots: tuple[Path, ...] | None = None) -> Path:
    """``root / name`` after checking it resolves (symlinks followed) inside ``root`` (or the Hub
    blobs folder of a snapshot); ``name`` must already be a plain file name.

    Raises:
        CheckpointError: the file resolves outside the source.
    """
    path = root / name
    real = path.resolve()
    if not any(real == r or r in real.parents for r in roots or _allowed_roots(root)):
        raise CheckpointError(
            f"{path} resolves to {real}, outside the source folder {root}",
            hint="a checkpoint's files must live inside it (a symlink may point only into the Hub cache's blobs)",
            file=name,
        )
    return path


def inventory_from_checkpoint(directory: str | Path) -> ModelInventory:
    """Every tensor of a checkpoint directory, classified, from its config.json and safetensors headers.

    Reads only headers (no tensor data, nothing unpickled); see :meth:`SourceCheckpoint.inventory`.

    Raises:
        MappingError: a tensor is not part of the family, or is ambiguous.
        CheckpointError: files are missing, unreadable or outside the checkpoint.

    Example (not run: it needs a checkpoint folder):
        >>> inventory_from_checkpoint("path/to/Qwen3-8B").num_layers  # doctest: +SKIP
        36
    """
    return open_checkpoint(directory).inventory()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    return data


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The ``weight_map`` of an index: tensor name -> plain shard file name.

    Raises:
        CheckpointError: no weight_map object, or a value that is not a plain ``*.safetensors``
            file name (``../x.safetensors``, an absolute path, a number ...), naming the tensor.
    """
    weight_map = _read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path} has no weight_map object", file=str(index_path))
    for tensor, name in weight_map.items():
        problem = shard_name_problem(name)
        if problem is not None:
            raise CheckpointError(
                f"{INDEX_NAME} maps tensor {tensor!r} to {name!r}, which {problem}",
                hint="an index may only name shard files of the checkpoint folder itself; re-download the checkpoint",
                file=str(index_path),
                tensor=tensor,
            )
    return weight_map


def open_checkpoint(path: str | Path) -> SourceCheckpoint:
    """Open an HF checkpoint directory: read config.json and every shard header.

    Raises:
        CheckpointError: missing directory or config.json, pickle-only weights, an index naming a
            missing file or tensor or a name that is not a plain shard file name, a file that
            resolves outside the source, or a tensor in two shards.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"source {root} is not a directory", hint="pass a local HF checkpoint or a Hub repo id")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"no config.json at {root}", hint="point at the model's top folder", file=str(root))
    config = _read_json(config_path)
    files = sorted(p.name for p in root.iterdir() if p.is_file())
    shard_names = [f for f in files if f.endswith(".safetensors")]
    if not shard_names:
        pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
        hint = "fp4convert never unpickles; convert the weights to safetensors first" if pickles else None
        raise CheckpointError(
            f"no *.safetensors files in {root}" + (f" (only {pickles[0]})" if pickles else ""),
            hint=hint or "download the safetensors files",
            file=str(root),
        )
    roots = _allowed_roots(root)
    for name in files:  # everything that is read or copied must stay inside the source
        checked_file(root, name, roots=roots)
    index_path = root / INDEX_NAME
    weight_map: dict[str, str] | None = None
    if index_path.is_file():
        weight_map = read_weight_map(index_path)
        shard_names = sorted(set(weight_map.values()))
        if not shard_names:
            raise CheckpointError(f"{index_path} maps no tensors", hint="re-download the checkpoint", file=INDEX_NAME)
    shards: dict[str, dict[str, TensorEntry]] = {}
    tensor_file: dict[str, str] = {}
    for name in shard_names:
        if not (root / name).is_file():
            raise CheckpointError(
                f"{INDEX_NAME} names {name}, which is missing from {root}",
                hint="re-download the checkpoint",
                file=name,
            )
        entries, _ = read_header(checked_file(root, name, roots=roots))
        shards[name] = entries
        for tensor in entries:
            if tensor in tensor_file:
                raise CheckpointError(
                    f"tensor {tensor!r} is stored in both {tensor_file[tensor]} and {name}", tensor=tensor
                )
            tensor_file[tensor] = name
    if weight_map is not None:
        for tensor, name in weight_map.items():
            if tensor_file.get(tensor) != name:
                raise CheckpointError(
                    f"{INDEX_NAME} maps {tensor!r} to {name}, which does not hold it",
                    hint="the index is stale; re-download the checkpoint",
                    tensor=tensor,
                )
    other = [f for f in files if not f.endswith(_NOT_COPIED_SUFFIXES) and f not in _NOT_COPIED_NAMES]
    return SourceCheckpoint(root, config, shards, tensor_file, other)
