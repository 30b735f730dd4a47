"""Where validation reads tensors from: folders of safetensors, and the master's HF pieces.

:class:`SafetensorsFolder` is a read-only mapping over every ``*.safetensors`` file of a folder
(an exporter's dump split into update buckets, or a master checkpoint), reading one tensor per
access with a positional read (no mmap, nothing kept), so memory stays at the tensors in use.

:func:`piece_sources` tells, for every HF tensor, which master tensor holds it and which rows: the
tensor itself for an HF master, a slice or row index for a fused Megatron master (``linear_fc1`` ->
gate rows then up rows, ``linear_qkv`` -> interleaved q/k/v rows). The row maps come from the
family's own transforms applied to a row index (``megatron_to_hf`` on ``arange(rows)``), so the
validator never re-implements the QKV interleave, and it never splits (copies) the BF16 master.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, TensorEntry, dtype_name
from fp4convert.checkpoint.source import checked_file
from fp4convert.errors import CheckpointError
from fp4convert.families import megatron_to_hf
from fp4convert.megatron.plan import ExportPlan

__all__ = ["PieceSource", "SafetensorsFolder", "piece_sources", "tensor_meta"]


class SafetensorsFolder(Mapping[str, torch.Tensor]):
    """Every tensor of the ``*.safetensors`` files under ``path`` (or of one file), read on access.

    Tensors stored in more than one file are kept in :attr:`duplicates` (the first file wins).

    Args:
        path: a folder, or a single ``.safetensors`` file.

    Raises:
        CheckpointError: nothing to read, a file that is not safetensors, or one that resolves
            (symlinks followed) outside the folder.

    Example (not run: it needs an exporter's dump in ``dump/``):
        >>> dump = SafetensorsFolder("dump/")  # doctest: +SKIP
        >>> dump["model.layers.0.mlp.experts.0.up_proj.weight_scale_2"].item()  # doctest: +SKIP
        0.000123
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_file():
            files = [self.path]
        elif self.path.is_dir():
            # a dump is untrusted: each file must resolve inside the folder (or the Hub cache's blobs)
            files = [checked_file(self.path, f.name) for f in sorted(self.path.glob("*.safetensors"))]
        else:
            raise CheckpointError(f"{self.path} does not exist", file=str(self.path))
        if not files:
            raise CheckpointError(
                f"{self.path} holds no *.safetensors files",
                hint="point at the exported tensors",
                file=str(self.path),
            )
        self.files: dict[Path, SafetensorsFile] = {}
        self.entries: dict[str, tuple[Path, TensorEntry]] = {}
        self.duplicates: dict[str, list[str]] = {}
        for file in files:
            handle = SafetensorsFile(file)
            self.files[file] = handle
            for name, entry in handle.entries.items():
                if name in self.entries:
                    self.duplicates.setdefault(name, [self.entries[name][0].name]).append(file.name)
                    continue
                self.entries[name] = (file, entry)

    def __getitem__(self, name: str) -> torch.Tensor:
        file, _ = self.entries[name]
        return self.files[file].read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype, shape) of a tensor, from the header alone."""
        entry = self.entries[name][1]
        return entry.dtype, entry.shape

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()

    def __enter__(self) -> SafetensorsFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tensor_meta(tensors: Mapping[str, torch.Tensor], name: str) -> tuple[str, tuple[int, ...]]:
    """(safetensors dtype, shape) of ``tensors[name]``, without reading it where the mapping can.

    Example:
        >>> tensor_meta({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, "w")
        ('BF16', (2, 3))
    """
    meta = getattr(tensors, "meta", None)
    if meta is not None:
        return meta(name)
    tensor = tensors[name]
    try:
        dtype = dtype_name(tensor.dtype)
    except CheckpointError:
        dtype = str(tensor.dtype)
    return dtype, tuple(tensor.shape)


@dataclass(frozen=True)
class PieceSource:
    """The rows of master tensor ``key`` that hold one HF tensor.

    Attributes:
        key: the master's name for the tensor holding it.
        rows: None (the whole tensor), a slice of rows, or an int64 row index (QKV interleave).
    """

    key: str
    rows: slice | torch.Tensor | None = None

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """The HF tensor's values from the master tensor (a view unless rows are interleaved)."""
        if self.rows is None:
            return tensor
        if isinstance(self.rows, slice):
            return tensor[self.rows]
        return tensor.index_select(0, self.rows.to(tensor.device))


def _as_rows(index: torch.Tensor, total: int) -> slice | torch.Tensor | None:
    n = index.numel()
    if n and torch.equal(index, torch.arange(int(index[0]), int(index[0]) + n)):
        return None if n == total else slice(int(index[0]), int(index[0]) + n)
    return index


def piece_sources(
    keys: Mapping[str, tuple[int, ...]], plan: ExportPlan, *, ep_rank: int, ep_size: int
) -> dict[str, PieceSource]:
    """HF tensor name -> where the master holds it, for a master of HF or Megatron-Core names.

    Args:
        keys: master name -> shape.
        plan: the export plan (model and family).
        ep_rank: EP rank of a Megatron master (its expert ids are local to it).
        ep_size: expert-parallel size.

    Raises:
        MappingError: a master name that is neither an HF nor a Megatron name of this model.

    Example:
        >>> from fp4convert.megatron import export_plan
        >>> plan = export_plan(contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B")
        >>> found = piece_sources({"decoder.layers.0.mlp.experts.linear_fc1.weight5": (1536, 2048)}, plan,
        ...                       ep_rank=1, ep_size=2)
        >>> {name: source.rows for name, source in found.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'model.layers.0.mlp.experts.69.gate_proj.weight': slice(0, 768, None),
         'model.layers.0.mlp.experts.69.up_proj.weight': slice(768, 1536, None)}
    """
    found: dict[str, PieceSource] = {}
    for key, shape in keys.items():
        if key in plan.items:  # an HF name
            found[key] = PieceSource(key)
            continue
        rows = shape[0] if shape else 1
        pieces = megatron_to_hf({key: torch.arange(rows)}, plan.family, plan.config, ep_rank=ep_rank, ep_size=ep_size)
        for name, index in pieces.items():
            found[name] = PieceSource(key, _as_rows(index, rows))
    return found
