"""Tensors of one or more safetensors files as a read-on-access mapping.

A dump of a live update is a folder of safetensors files, one per update bucket, with HF names and
no index; a master is an HF checkpoint folder or Megatron-named safetensors. Only headers are read
up front; each tensor is read (one positional read, no mmap) when the validator asks for it, so
memory holds what one layer needs, not the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import INDEX_NAME
from fp4convert.errors import CheckpointError

__all__ = ["SafetensorsFolder", "tensor_metas"]


class SafetensorsFolder(Mapping[str, torch.Tensor]):
    """Every tensor of a safetensors file or folder, read when accessed.

    Args:
        path: a ``.safetensors`` file, or a folder: its index's files when it has
            ``model.safetensors.index.json``, else every ``*.safetensors`` in it (update buckets).
        device: where tensors are placed when read.

    Attributes:
        duplicates: tensor name -> every file holding it, for names stored more than once (the
            first file in name order is the one read).

    Raises:
        CheckpointError: no safetensors file, or an unreadable header.

    Example:
        >>> with SafetensorsFolder("dump/") as dump:  # doctest: +SKIP
        ...     dump.meta("model.layers.0.mlp.experts.0.up_proj.weight")
        ('U8', (768, 1024))
    """

    def __init__(self, path: str | Path, *, device: str | torch.device = "cpu") -> None:
        self.path = Path(path)
        self.device = torch.device(device)
        if self.path.is_file():
            files = [self.path]
        elif (self.path / INDEX_NAME).is_file():
            weight_map = json.loads((self.path / INDEX_NAME).read_text()).get("weight_map", {})
            files = [self.path / name for name in sorted(set(weight_map.values()))]
        else:
            files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"{self.path} holds no *.safetensors files",
                hint="point at the folder the exporter wrote its update buckets to",
                file=str(self.path),
            )
        self._files: dict[Path, SafetensorsFile] = {}
        self._where: dict[str, Path] = {}
        self.duplicates: dict[str, list[str]] = {}
        for file in files:
            opened = self._files[file] = SafetensorsFile(file)
            for name in opened.entries:
                if name in self._where:
                    self.duplicates.setdefault(name, [self._where[name].name]).append(file.name)
                    continue
                self._where[name] = file

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._files[self._where[name]].read(name)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """``(safetensors dtype, shape)`` of a tensor, from its header."""
        entry = self._files[self._where[name]].entries[name]
        return entry.dtype, entry.shape

    def metas(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """:meth:`meta` of every tensor, without reading any data."""
        return {name: self.meta(name) for name in self._where}

    def nbytes(self, name: str) -> int:
        return self._files[self._where[name]].entries[name].nbytes

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def __enter__(self) -> SafetensorsFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensor_metas(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (safetensors dtype, shape)}`` of a mapping, from headers when it is a folder."""
    from fp4convert.checkpoint.safetensors_io import dtype_name

    if isinstance(tensors, SafetensorsFolder):
        return tensors.metas()
    names: dict[torch.dtype, str] = {}  # dtype -> safetensors name, looked up once per dtype
    metas: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, tensor in tensors.items():
        dtype = tensor.dtype
        if dtype not in names:
            names[dtype] = dtype_name(dtype)
        metas[name] = (names[dtype], tensor.shape)  # torch.Size compares equal to the tuple of its dims
    return metas
