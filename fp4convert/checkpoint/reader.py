"""Read a source checkpoint's tensors once, and hash its files on the way.

:class:`SourceReader` serves a source's logical tensors by name (one file descriptor per shard,
one positional read per stored range, no mmap; quantized and fused sources decoded on the way)
and computes every shard's sha256 from the bytes it reads anyway, so the manifest's source hashes
cost no second pass over the source in the usual, front-to-back order.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from fp4convert.checkpoint.decode.read import SourceDecoder
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import SourceCheckpoint

__all__ = ["SourceReader"]


class SourceReader:
    """Reads source tensors (one fd per shard, no mmap), hashing each shard front to back.

    A tensor read right after its predecessor in the file extends that file's sha256; any other
    read order marks the file for a separate hashing pass at the end. Reads are submitted in file
    order, so the separate pass only happens for siblings that sit far apart. Hashing runs on its
    own thread (sha256 is the costliest step after quantizing), at most a few tensors behind.
    Safe to call :meth:`read` from several threads.

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> reader = SourceReader(open_checkpoint("ckpt"))  # doctest: +SKIP
        >>> w = reader.read("model.norm.weight"); hashes = reader.shard_hashes(); reader.close()  # doctest: +SKIP
    """

    _HASH_BACKLOG = 4

    def __init__(self, source: SourceCheckpoint) -> None:
        self.source = source
        self._files: dict[str, SafetensorsFile] = {}
        self._hashers: dict[str, Any] = {}
        self._next_offset: dict[str, int] = {}
        self._broken: set[str] = set()  # shards not hashed in one sequential sweep
        self._lock = threading.Lock()
        self._hash_pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-hash")
        self._backlog: list[Future[None]] = []
        self._separate_pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-hash-file")
        self._separate: dict[str, Future[str]] = {}  # shards read out of order: hashed from disk
        self._decoder = SourceDecoder(source.view(), self.read_range)

    def _file(self, shard: str) -> SafetensorsFile:
        with self._lock:
            if shard not in self._files:
                self._files[shard] = self.source.open(shard)
                entries = self.source.shards[shard]
                first = min((e.start for e in entries.values()), default=0)
                with (self.source.root / shard).open("rb") as f:
                    self._hashers[shard] = hashlib.sha256(f.read(first))  # length prefix + JSON header
                self._next_offset[shard] = first
            return self._files[shard]

    def read(self, name: str) -> torch.Tensor:
        """Logical tensor ``name`` of the source (a fresh CPU tensor): a stored tensor as it is, or
        decoded where the source stores it quantized or fused (:meth:`SourceCheckpoint.view`)."""
        return self._decoder.read(name)

    def read_range(self, shard: str, start: int, end: int) -> torch.Tensor:
        """Bytes ``[start, end)`` of ``shard`` as uint8 (one expert's slice of a fused tensor, a scale).

        A shard first read out of order is hashed from disk right away, on a thread of its own,
        instead of after the conversion (FP8 sources keep their scales apart from their weights).
        """
        data = self._file(shard).read_range(start, end)
        with self._lock:  # queue hash updates in file order (the pool runs them in that order)
            if shard not in self._broken and start == self._next_offset[shard]:
                self._backlog.append(self._hash_pool.submit(self._hashers[shard].update, data.numpy()))
                self._next_offset[shard] = end
            elif shard not in self._broken:
                self._broken.add(shard)
                self._separate[shard] = self._separate_pool.submit(file_sha256, self.source.root / shard)
            while len(self._backlog) > self._HASH_BACKLOG or (self._backlog and self._backlog[0].done()):
                self._backlog.pop(0).result()
        return data

    def shard_hashes(self) -> dict[str, str]:
        """sha256 of every source shard file (a separate pass for any not read front to back)."""
        for pending in self._backlog:
            pending.result()
        out = {}
        for shard in self.source.shards:
            size = (self.source.root / shard).stat().st_size
            if shard in self._separate:
                out[shard] = self._separate[shard].result()
            elif shard in self._broken or self._next_offset.get(shard) != size:
                out[shard] = file_sha256(self.source.root / shard)  # fall back to a separate pass
            else:
                out[shard] = self._hashers[shard].hexdigest()
        return out

    def close(self) -> None:
        """Finish pending hash updates and close every file."""
        self._hash_pool.shutdown(wait=True)
        self._separate_pool.shutdown(wait=True)
        for f in self._files.values():
            f.close()
