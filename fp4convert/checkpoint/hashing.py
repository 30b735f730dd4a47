"""sha256 of files and tensors: the one definition every manifest, fixture and verifier uses.

A tensor's hash is the sha256 of its raw little-endian bytes in row-major order, which is what
the bytes of a safetensors entry are, so a tensor and its stored entry hash alike.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["file_sha256", "range_sha256", "tensor_sha256", "update_from_file"]

_CHUNK = 16 << 20


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (any dtype, any device; copied to the CPU if needed)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]  # numpy arrays are buffers


def update_from_file(h: Any, path: str | Path, start: int, end: int) -> None:
    """Feed bytes ``[start, end)`` of a file to the hash ``h``, 16 MiB at a time (memory stays flat)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end:
            chunk = os.pread(fd, min(_CHUNK, end - start), start)
            if not chunk:
                raise OSError(f"{path}: unexpected end of file at byte {start}")
            h.update(chunk)
            start += len(chunk)
    finally:
        os.close(fd)


def range_sha256(path: str | Path, start: int, end: int) -> str:
    """sha256 of bytes ``[start, end)`` of a file: a stored tensor's hash, read in chunks.

    Equal to :func:`tensor_sha256` of the tensor stored there (its bytes are the entry's bytes).
    """
    h = hashlib.sha256()
    update_from_file(h, path, start, end)
    return h.hexdigest()
