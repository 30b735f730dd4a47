"""Where validation reads tensors from: folders of safetensors, and a mapping's dtypes and shapes.

:class:`SafetensorsFolder` is a read-only mapping over every ``*.safetensors`` file of a folder
(an exporter's dump split into update buckets, or a master checkpoint), reading one tensor per
access with a positional read (no mmap, nothing kept), so memory stays at the tensors in use.
:func:`tensor_meta` reads a tensor's dtype and shape from the header where it can. Which master
tensor holds each HF tensor is :mod:`fp4convert.megatron.resolve`'s job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, TensorEntry, dtype_name
from fp4convert.checkpoint.source import checked_file
from fp4convert.errors import CheckpointError, MappingError
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES

__all__ = [
    "MASTER_DTYPES",
    "MASTER_DTYPES_PHRASE",
    "MASTER_TORCH_DTYPES",
    "SafetensorsFolder",
    "check_master_tensor",
    "meta_dtype",
    "tensor_meta",
]


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
    return meta_dtype(tensor.dtype), tuple(tensor.shape)


#: what a master tensor may hold: the values the quantizers read (a learner's BF16 parameters; norms
#: may be FP32), never an integer, bool or FP8 tensor
MASTER_DTYPES = ("BF16", "F16", "F32")
#: the same, as torch dtypes (a set: a whole master's dtypes are checked against it in one pass)
MASTER_TORCH_DTYPES = frozenset(SAFETENSORS_DTYPES[d] for d in MASTER_DTYPES)
#: the same, as errors name them
MASTER_DTYPES_PHRASE = f"{', '.join(MASTER_DTYPES[:-1])} or {MASTER_DTYPES[-1]}"


def check_master_tensor(key: str, tensor: torch.Tensor) -> None:
    """Refuse a tensor no master may be: another dtype than :data:`MASTER_DTYPES`, or no values
    (the meta device).

    Raises:
        MappingError: naming ``key`` and what it is.

    Example:
        >>> check_master_tensor("w", torch.zeros(2, dtype=torch.int8))
        Traceback (most recent call last):
        ...
        fp4convert.errors.MappingError: master tensor `w` is I8, not BF16, F16 or F32; pass the learner's ...
    """
    if tensor.dtype in MASTER_TORCH_DTYPES and not tensor.is_meta:  # the usual case: no name looked up
        return
    dtype = meta_dtype(tensor.dtype)
    if dtype not in MASTER_DTYPES:
        problem = f"is {dtype}, not {MASTER_DTYPES_PHRASE}"
    elif tensor.is_meta:
        problem = "is on the meta device: it holds no values"
    else:
        return
    raise MappingError(
        f"master tensor `{key}` {problem}",
        hint="pass the learner's parameters as it trains them (BF16, FP16 or FP32, materialized)",
        tensor=key,
    )


def meta_dtype(dtype: torch.dtype) -> str:
    """A torch dtype as :func:`tensor_meta` names it: its safetensors code, else torch's own name.

    Example:
        >>> meta_dtype(torch.bfloat16), meta_dtype(torch.complex64)
        ('BF16', 'torch.complex64')
    """
    try:
        return dtype_name(dtype)
    except CheckpointError:
        return str(dtype)
