"""What every writer of output shards shares: the progress hook type, the shard metadata, the read-back.

The shards themselves are written by :mod:`fp4convert.convert.parallel` (every core, positional
writes). :func:`tensor_hashes` reads a finished shard back from disk (verify compares these
hashes with those taken while writing; ``resume`` decides with them which shards to keep).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.hashing import tensor_sha256
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, shard_metadata
from fp4convert.version import __version__

__all__ = ["SHARD_METADATA", "ProgressHook", "tensor_hashes"]

#: progress callback: (event, payload); events: "plan", "shard", "tensor", "bytes" (another rank's), "done"
ProgressHook = Callable[[str, Mapping[str, Any]], None]

#: the ``__metadata__`` of every output shard
SHARD_METADATA = shard_metadata(f"fp4convert {__version__}")


def tensor_hashes(path: Path, *, sync: bool = False) -> dict[str, str]:
    """sha256 of every tensor of a finished shard, read back from disk.

    Args:
        path: the shard.
        sync: fsync the file first (the converter closes shards without syncing).
    """
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with SafetensorsFile(path) as f:
        return {name: tensor_sha256(f.read_bytes(name)) for name in f.entries}
