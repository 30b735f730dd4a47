"""sha256 of files and tensors: the one definition every manifest, fixture and verifier uses.

A tensor's hash is the sha256 of its raw little-endian bytes in row-major order, which is what
the bytes of a safetensors entry are, so a tensor and its stored entry hash alike.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

__all__ = ["file_sha256", "tensor_sha256"]


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
