"""Read a source checkpoint's tensors once, and hash its files on the way.

:class:`SourceReader` serves tensors by name (one file descriptor per shard, one positional read
per tensor, no mmap) and offers every byte it reads to :class:`~fp4convert.checkpoint.file_hashes.SourceHashes`,
which computes every shard's sha256 from them (one thread per file, so files hash in parallel):
the manifest's source hashes cost no second pass over the source in the usual, front-to-back order.
"""

from __future__ import annotations

import threading

import torch

from fp4convert.checkpoint.file_hashes import SourceHashes
from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import SourceCheckpoint

__all__ = ["SourceReader"]


class SourceReader:
    """Reads source tensors (one fd per shard, no mmap), hashing each shard from the bytes read.

    Safe to call :meth:`read` from several threads.

    Args:
        source: the source checkpoint.
        hashes: where read bytes go; default: every file hashed, reads ahead of a file's hash held
            until it gets there (see :class:`~fp4convert.checkpoint.file_hashes.SourceHashes`).
            ``SourceHashes(source, files=())`` reads without hashing.

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> reader = SourceReader(open_checkpoint("ckpt"))  # doctest: +SKIP
        >>> w = reader.read("model.norm.weight"); hashes = reader.shard_hashes(); reader.close()  # doctest: +SKIP
    """

    def __init__(self, source: SourceCheckpoint, *, hashes: SourceHashes | None = None) -> None:
        self.source = source
        self.hashes = SourceHashes(source) if hashes is None else hashes
        self._files: dict[str, SafetensorsFile] = {}
        self._lock = threading.Lock()

    def _file(self, shard: str) -> SafetensorsFile:
        with self._lock:
            if shard not in self._files:
                self._files[shard] = self.source.open(shard)
            return self._files[shard]

    def read(self, name: str) -> torch.Tensor:
        """Source tensor ``name`` with its dtype and shape (a fresh CPU tensor)."""
        shard = self.source.tensor_file[name]
        tensor = self._file(shard).read(name)
        self.hashes.offer(shard, self.source.shards[shard][name].start, tensor)
        return tensor

    def shard_hashes(self) -> dict[str, str]:
        """sha256 of every source shard file hashed (what was not read is read from disk now)."""
        return self.hashes.hexdigests()

    def close(self) -> None:
        """Finish pending hash updates and close every file."""
        self.hashes.close()
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
