"""sha256 of a source checkpoint's files, computed from the bytes a conversion reads anyway.

sha256 is a chain: a file's hash takes its bytes in order, on one core (about 1.3 GB/s). So
:class:`SourceHashes` keeps one chain per file, each on its own thread, and files hash in
parallel. Readers *offer* the bytes they read (``offer(file, start, data)``); an offer that
continues a file's chain extends it, an offer behind it is a repeat and is ignored, and an offer
ahead of it is handled one of two ways:

* held (the default, for readers that come back for what they skipped: a fused sibling read
  early, a shard read out of order), up to ``hold_bytes`` in all, and hashed when the chain gets
  there; past the limit it is dropped and read again from disk at the end;
* or, with ``fill_gaps``, the bytes in between are read from disk right away (for a reader that
  reads each file front to back and leaves out what other ranks, or a resumed run, take care of).

Whatever no reader offered is read from disk when the hashes are asked for, so the result is
always the sha256 of the whole file, whatever was read. ``files`` limits the hashing to the files
this process is responsible for (in a run split across ranks, each file is hashed by one rank).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from fp4convert.checkpoint.hashing import file_sha256, update_from_file
from fp4convert.checkpoint.source import SourceCheckpoint
from fp4convert.errors import CheckpointError

__all__ = ["FileHashes", "SourceHashes"]


class _Chain:
    """One file's running sha256: the bytes hashed so far are ``[0, position)``."""

    def __init__(self, path: str, header_end: int) -> None:
        self.path = path
        self.size = os.stat(path).st_size
        self.sha = hashlib.sha256()
        self.position = 0
        self.held: dict[int, tuple[int, Any]] = {}  # start -> (end, bytes) offered ahead of the chain
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fp4convert-hash")
        self.pending: deque[Future[None]] = deque()
        self.fill(header_end)  # the length prefix and JSON header (and any gap before the data)

    def _check_end(self, end: int) -> None:
        if end > self.size:
            raise CheckpointError(
                f"{self.path} ends at byte {self.size}, before byte {end} that its header gives a tensor",
                hint="the file is truncated or was changed during the run: download it again",
                file=self.path,
            )

    def submit(self, data: Any, end: int) -> None:
        self._check_end(end)
        self.pending.append(self.pool.submit(self.sha.update, data))
        self.position = end
        self._retire()

    def fill(self, end: int) -> None:
        """Hash ``[position, end)`` from disk (on the file's thread, in order)."""
        if end > self.position:
            self._check_end(end)
            self.pending.append(self.pool.submit(self._read_into_hash, self.position, end))
            self.position = end
            self._retire()

    def _retire(self) -> None:
        if self.position >= self.size:  # every byte is queued: the thread ends once they are hashed
            self.pool.shutdown(wait=False)

    def _read_into_hash(self, start: int, end: int) -> None:
        update_from_file(self.sha, self.path, start, end)

    def done(self) -> list[Future[None]]:
        """Futures still pending (finished ones are dropped; errors surface in :meth:`wait`)."""
        while self.pending and self.pending[0].done() and self.pending[0].exception() is None:
            self.pending.popleft()
        return list(self.pending)

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()


class SourceHashes:
    """The sha256 of every source file (of ``files``), from offered bytes plus what is missing.

    Args:
        source: the source checkpoint.
        files: the files to hash (None: all of them); offers for other files are ignored.
        fill_gaps: read skipped bytes from disk at once instead of holding offers ahead.
        hold_bytes: most bytes held ahead of the chains, over all files.
        backlog: hash updates queued per file before an offer waits (bounds the memory in flight).

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> hashes = SourceHashes(open_checkpoint("ckpt"))  # doctest: +SKIP
        >>> hashes.offer("model.safetensors", start, tensor); hashes.hexdigests()  # doctest: +SKIP
    """

    def __init__(
        self,
        source: SourceCheckpoint,
        *,
        files: Collection[str] | None = None,
        fill_gaps: bool = False,
        hold_bytes: int = 256 << 20,
        backlog: int = 4,
    ) -> None:
        self.source = source
        self.files = list(source.shards) if files is None else [f for f in source.shards if f in set(files)]
        self._scope = set(self.files)
        self._fill_gaps = fill_gaps
        self._hold_limit = hold_bytes
        self._held_bytes = 0
        self._backlog = backlog
        self._chains: dict[str, _Chain] = {}
        self._lock = threading.Lock()

    def _chain(self, file: str) -> _Chain:
        chain = self._chains.get(file)
        if chain is None:
            entries = self.source.shards[file]
            header_end = min((e.start for e in entries.values()), default=0)
            chain = self._chains[file] = _Chain(str(self.source.root / file), header_end)
        return chain

    def offer(self, file: str, start: int, data: torch.Tensor) -> None:
        """Bytes ``data`` (a CPU tensor, any dtype) read from ``file`` at byte ``start``."""
        if file not in self._scope:
            return
        raw = data.detach().reshape(-1).view(torch.uint8).numpy()
        end = start + raw.nbytes
        with self._lock:
            chain = self._chain(file)
            if start < chain.position or start in chain.held:
                return  # bytes hashed (or held) already: a repeated read
            if start > chain.position:
                if not self._fill_gaps:
                    if self._held_bytes + raw.nbytes <= self._hold_limit:
                        chain.held[start] = (end, raw)
                        self._held_bytes += raw.nbytes
                    return  # dropped: read from disk when the hashes are asked for
                chain.fill(start)
            chain.submit(raw, end)
            while chain.position in chain.held:  # offers held for the bytes that come next
                held_end, held = chain.held.pop(chain.position)
                self._held_bytes -= held.nbytes
                chain.submit(held, held_end)
            pending = chain.done()
        for future in pending[: max(0, len(pending) - self._backlog)]:
            future.result()  # outside the lock: other files keep hashing meanwhile

    def finished(self) -> dict[str, str]:
        """sha256 of the files whose every byte was offered so far (nothing is read for the rest)."""
        with self._lock:
            complete = {f: c for f, c in self._chains.items() if c.position >= c.size}
            for chain in complete.values():
                chain.wait()
            return {f: c.sha.copy().hexdigest() for f, c in complete.items()}

    def hexdigests(self) -> dict[str, str]:
        """sha256 of every file in scope, in the source's order (what was not offered is read now)."""
        with self._lock:
            for chain in self._chains.values():
                for start in sorted(chain.held):
                    held_end, held = chain.held.pop(start)
                    self._held_bytes -= held.nbytes
                    if start >= chain.position:
                        chain.fill(start)
                        chain.submit(held, held_end)
                chain.fill(chain.size)
            untouched = [f for f in self.files if f not in self._chains]
            with ThreadPoolExecutor(max(1, min(8, len(untouched)))) as pool:
                digests = pool.map(file_sha256, [self.source.root / f for f in untouched])
                whole = dict(zip(untouched, digests, strict=True))
            for chain in self._chains.values():
                chain.wait()
            return {f: whole[f] if f in whole else self._chains[f].sha.hexdigest() for f in self.files}

    def close(self) -> None:
        """Finish pending updates and stop every file's thread."""
        with self._lock:
            for chain in self._chains.values():
                chain.pool.shutdown(wait=True)
            self._held_bytes = 0


class FileHashes:
    """The sha256 of whole files, each read from disk front to back on a thread of its own, started
    at once: for files that several streams read at the same time, in pieces, where no read order
    feeds one chain (:class:`SourceHashes` serves files read front to back). The files are read a
    second time, usually from the page cache, as the streams have just read them.

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> hashes = FileHashes(Path("ckpt"), ["model-00001-of-00002.safetensors"])  # doctest: +SKIP
        >>> hashes.hexdigests()  # doctest: +SKIP
    """

    def __init__(self, root: os.PathLike[str] | str, files: Collection[str]) -> None:
        self.files = list(files)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, len(self.files)), thread_name_prefix="fp4convert-hash")
        self._futures = {f: self._pool.submit(self._hash, os.path.join(root, f)) for f in self.files}

    def _hash(self, path: str) -> str:
        sha = hashlib.sha256()
        size = os.stat(path).st_size
        position = 0
        while position < size and not self._stop.is_set():
            end = min(size, position + (64 << 20))
            update_from_file(sha, path, position, end)
            position = end
        return sha.hexdigest()

    def finished(self) -> dict[str, str]:
        """sha256 of the files hashed whole so far."""
        return {f: fut.result() for f, fut in self._futures.items() if fut.done() and not self._stop.is_set()}

    def hexdigests(self) -> dict[str, str]:
        """sha256 of every file (waits for the ones still being hashed)."""
        return {f: fut.result() for f, fut in self._futures.items()}

    def close(self) -> None:
        """Stop hashing (a file in progress stops at its next 64 MiB) and end the threads."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
