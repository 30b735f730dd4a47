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

__all__ = ["READ_CHUNK_BYTES", "file_sha256", "tensor_sha256", "update_from_file"]

# Bytes hashed per read. One buffer is reused for a whole file or range: a fresh 16 MiB bytes
# object per read cost a page fault per 4 KiB (a million faults per conversion, every one taking
# the address-space lock the other threads fault under), and 1 MiB stays in the core's L2, where
# sha256 runs about 1.5x as fast as on bytes in memory (file_hashes.py measures it).
READ_CHUNK_BYTES = 1 << 20


def file_sha256(path: str | Path) -> str:
    """sha256 of a file (read through one reused buffer)."""
    h = hashlib.sha256()
    buffer = bytearray(READ_CHUNK_BYTES)
    view = memoryview(buffer)
    with Path(path).open("rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(view[:n])
    return h.hexdigest()


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (any dtype, any device; copied to the CPU if needed)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]  # numpy arrays are buffers


def update_from_file(h: Any, path: str | Path, start: int, end: int) -> None:
    """Feed bytes ``[start, end)`` of a file to the hash ``h``, through one reused 1 MiB buffer."""
    buffer = bytearray(min(READ_CHUNK_BYTES, max(0, end - start)))
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY)
    try:
        while start < end:
            n = os.preadv(fd, [view[: min(len(buffer), end - start)]], start)
            if not n:
                raise OSError(f"{path}: unexpected end of file at byte {start}")
            h.update(view[:n])
            start += n
    finally:
        os.close(fd)
