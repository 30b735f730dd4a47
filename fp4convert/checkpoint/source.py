"""A Hugging Face checkpoint directory opened read-only: config, shards, index, other files.

Only safetensors weights are ever read. Pickle-based weights (``*.bin``, ``*.pt``, ``*.pth``,
``*.ckpt``, ``*.pkl``) are refused when they are the only weights, and ignored otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, TensorEntry, read_header
from fp4convert.errors import CheckpointError

__all__ = ["INDEX_NAME", "PICKLE_SUFFIXES", "SourceCheckpoint", "open_checkpoint"]

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

    def open(self, shard: str) -> SafetensorsFile:
        return SafetensorsFile(self.root / shard)

    def entry(self, tensor: str) -> TensorEntry:
        return self.shards[self.tensor_file[tensor]][tensor]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})", file=str(path)) from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    return data


def open_checkpoint(path: str | Path) -> SourceCheckpoint:
    """Open an HF checkpoint directory: read config.json and every shard header.

    Raises:
        CheckpointError: missing directory or config.json, pickle-only weights, an index naming a
            missing file or tensor, or a tensor in two shards.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"source {root} is not a directory", hint="pass a local HF checkpoint or a Hub repo id")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{root} has no config.json", hint="point at the model's top folder", file=str(root))
    config = _read_json(config_path)
    files = sorted(p.name for p in root.iterdir() if p.is_file())
    shard_names = [f for f in files if f.endswith(".safetensors")]
    if not shard_names:
        pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
        hint = "fp4convert never unpickles; convert the weights to safetensors first" if pickles else None
        raise CheckpointError(
            f"{root} has no *.safetensors weights" + (f" (only {pickles[0]})" if pickles else ""),
            hint=hint or "download the safetensors files",
            file=str(root),
        )
    index_path = root / INDEX_NAME
    weight_map: dict[str, str] | None = None
    if index_path.is_file():
        weight_map = _read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path} has no weight_map", file=str(index_path))
        shard_names = sorted(set(weight_map.values()))
    shards: dict[str, dict[str, TensorEntry]] = {}
    tensor_file: dict[str, str] = {}
    for name in shard_names:
        if not (root / name).is_file():
            raise CheckpointError(
                f"{INDEX_NAME} names {name}, which is missing from {root}",
                hint="re-download the checkpoint",
                file=name,
            )
        entries, _ = read_header(root / name)
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
