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
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from fp4convert.checkpoint.hashing import READ_CHUNK_BYTES, file_sha256, update_from_file
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


# What a hashing child process runs: sha256 of one file, printed in hex. It reads the file through
# one reused buffer of READ_CHUNK_BYTES (1 MiB): sha256 of bytes in the core's L2 runs 1.87 GB/s
# on the 2-core box where the same bytes in memory (a mapped file's page-cache pages, a 64 MiB
# buffer) hash at 1.1-1.2 GB/s, so the copy costs less than it saves: 1.30 GB/s read and hashed
# against 1.05 for the mapped file (`python bench/device/hash_probe.py --children FILE`). It stops
# when its parent is gone (a killed conversion leaves no reader behind), and a file whose size
# changes while it is hashed is an error, not the hash of other bytes. ``-I`` keeps the child to
# the standard library: nothing of the environment or working folder.
_CHILD = """
import hashlib, os, sys
path, parent, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sha, buffer, done = hashlib.sha256(), bytearray(chunk), 0
view = memoryview(buffer)
with open(path, "rb", buffering=0) as f:
    size = os.fstat(f.fileno()).st_size
    while n := f.readinto(buffer):
        sha.update(view[:n])
        done += n
        if os.getppid() != parent:
            sys.exit(1)
if done != size:
    sys.exit(f"the file changed while it was hashed: {size} bytes when opened, {done} read")
print(sha.hexdigest())
"""


class FileHashes:
    """The sha256 of whole files, each read from disk front to back in a child process of its own,
    started at once: for files that several streams read at the same time, in pieces, where no read
    order feeds one chain (:class:`SourceHashes` serves files read front to back). The files are read
    a second time, usually from the page cache, as the streams have just read them.

    A process, not a thread: a 2 GB file takes one core about two seconds (sha256 is a chain),
    the longest single step of a conversion on 16 cores, and in the converting process its
    reads wait for the interpreter lock after every chunk; a child hashes at the full speed of
    its core (``bench/device/hash_probe.py``).

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> hashes = FileHashes(Path("ckpt"), ["model-00001-of-00002.safetensors"])  # doctest: +SKIP
        >>> hashes.hexdigests()  # doctest: +SKIP
    """

    def __init__(self, root: os.PathLike[str] | str, files: Collection[str] = ()) -> None:
        self.root = root
        self.files: list[str] = []
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()  # a child's output is collected once, by one thread
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.start(files)

    def start(self, files: Iterable[str]) -> None:
        """Start hashing each of ``files`` not started yet (a conversion starts the files it can
        tell from the headers before it plans, and the rest once the plan shows them)."""
        for f in files:
            if f in self._children:
                continue
            argv = [os.path.join(self.root, f), str(os.getpid()), str(READ_CHUNK_BYTES)]
            self._children[f] = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            self.files.append(f)

    def __enter__(self) -> FileHashes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def digest(self, file: str) -> str:
        """sha256 of ``file`` (one of :attr:`files`; waits for its child, whose output is
        collected once, whichever thread asks first)."""
        with self._lock:
            if file not in self._digests:
                child = self._children[file]
                out, err = child.communicate()
                if child.returncode != 0:
                    code = child.returncode
                    status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                    reason = err.decode(errors="replace").strip().splitlines()[-1:] or [status]
                    raise CheckpointError(
                        f"{file}: could not be read to hash it ({reason[0]})",
                        hint="check that the file exists and is readable, and was not changed during the run",
                        file=file,
                    )
                self._digests[file] = out.decode().strip()
            return self._digests[file]

    def finished(self) -> dict[str, str]:
        """sha256 of the files hashed whole so far."""
        return {f: self.digest(f) for f, child in self._children.items() if child.poll() is not None}

    def hexdigests(self) -> dict[str, str]:
        """sha256 of every file (waits for the ones still being hashed)."""
        return {f: self.digest(f) for f in self.files}

    def close(self) -> None:
        """Stop the children still hashing and wait for them to end."""
        with self._lock:
            for child in self._children.values():
                if child.poll() is None:
                    child.kill()
                child.communicate()
