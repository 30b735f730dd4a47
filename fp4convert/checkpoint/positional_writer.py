"""A safetensors file written tensor by tensor in any order, from several threads at once.

The converter knows every output tensor's name, dtype and shape before it quantizes anything, so
each tensor's place in the file is fixed up front (:func:`~fp4convert.checkpoint.safetensors_io.header_bytes`,
the one layout rule :class:`~fp4convert.checkpoint.safetensors_io.StreamingWriter` also follows):
:class:`PositionalWriter` writes the header first and then each tensor at its offset with
``pwrite`` as soon as it is ready, hashing it (sha256) on the calling thread. The bytes are those
:class:`StreamingWriter` writes for the same layout, whatever the order of the writes.

Each write is read back at once and compared, byte for byte, with what was hashed: so the hash
recorded for a tensor is that of the bytes in the file, at the cost of a read and a ``memcmp``
rather than a second sha256 of every output (which, run when a shard closed, was the tail of a
conversion on 16 cores). The layout fixes disjoint spans, so no later write can change a span
already compared; the shard is fsynced when it is closed.

Every ``writeback_every`` bytes written, :meth:`PositionalWriter.writeback_due` says so, and the
caller runs :meth:`PositionalWriter.writeback` (an ``fdatasync``) on a thread of its own: the disk
writes the file while the conversion goes on, instead of all at once when the file is closed and
synced (the kernel would otherwise hold gigabytes of dirty pages until then).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from fp4convert.checkpoint.io_errors import writing
from fp4convert.checkpoint.safetensors_io import check_declared, header_bytes
from fp4convert.errors import CheckpointError
from fp4convert.formats.kernels import HOLD_GIL_BELOW_BYTES

__all__ = ["PositionalWriter"]


class PositionalWriter:
    """Write a safetensors file of a known layout, tensors in any order (thread-safe).

    The file is written under ``path`` as given (callers write to a temporary name and rename
    once :meth:`close` succeeded); a file or symlink left at that name is replaced, never followed.
    An OS error (a full disk, a read-only folder) is one CheckpointError naming the file.

    Example:
        >>> import tempfile
        >>> from fp4convert.checkpoint.safetensors_io import read_header
        >>> path = Path(tempfile.mkdtemp()) / "a.safetensors"
        >>> w = PositionalWriter(path, [("a", "F32", (2,)), ("b", "U8", (1,))])
        >>> _ = w.write("b", torch.ones(1, dtype=torch.uint8)); _ = w.write("a", torch.ones(2)); w.close()
        >>> read_header(path)[0]["a"].shape, w.sha256["a"][:12]
        ((2,), '80b8fd6d60fa')
    """

    def __init__(
        self,
        path: str | Path,
        layout: Iterable[tuple[str, str, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
        *,
        writeback_every: int = 0,
    ) -> None:
        self.path = Path(path)
        self._writeback_every = writeback_every
        self._unsynced = 0  # bytes written since the last writeback was asked for
        self._fd_lock = threading.Lock()  # the fd is not closed while a writeback uses it
        layout = list(layout)
        raw, spans = header_bytes(layout, metadata, where=str(self.path))
        self._spans = {name: (len(raw) + start, len(raw) + end) for name, (start, end) in spans.items()}
        self._expected = {name: (dtype, tuple(shape)) for name, dtype, shape in layout}
        self.nbytes = len(raw) + max((end for _, end in spans.values()), default=0)
        self.sha256: dict[str, str] = {}
        self._lock = threading.Lock()
        with writing(self.path):
            self.path.unlink(missing_ok=True)
            # read and write: every write is read back (module docstring)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            self._pwritev([memoryview(bytearray(raw))], 0)
        except BaseException:
            self.abort()
            raise

    def _pwrite(self, data: memoryview, offset: int) -> None:
        with writing(self.path):
            while data:
                n = os.pwrite(self._fd, data, offset)
                data, offset = data[n:], offset + n

    def write(self, name: str, tensor: torch.Tensor) -> str:
        """Write tensor ``name`` (declared, with its dtype and shape) at its place; returns its sha256."""
        return self.write_many([(name, tensor)])[0]

    def write_many(self, pairs: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
        """Write several declared tensors (one source tensor's outputs); returns their sha256s.

        Tensors that lie back to back in the file go out in one ``pwritev``: with many threads
        converting, every call that releases the GIL costs a hand-off, and a quantized weight has
        four outputs (data, block scales, global and input scale) next to each other. Each run is
        read back and compared with the bytes hashed.

        Raises:
            CheckpointError: a tensor is not declared, does not match its declaration, was
                written before, or reads back different from what was written.
        """
        checked: list[tuple[str, memoryview]] = []
        for name, tensor in pairs:
            if name not in self._expected:
                raise CheckpointError(f"{self.path}: wrote {name!r}, which the layout does not declare", tensor=name)
            check_declared(self.path, name, tensor, self._expected[name])
            checked.append((name, _bytes_of(tensor)))
        with self._lock:
            for name, _ in checked:
                if name in self.sha256:
                    raise CheckpointError(f"{self.path}: tensor {name!r} written twice", tensor=name)
                self.sha256[name] = ""  # claimed: a second write of it is refused
        digests = [hashlib.sha256(view).hexdigest() for _, view in checked]
        run: list[memoryview] = []
        run_start = run_end = -1
        for name, view in checked:
            start, end = self._spans[name]
            if run and start != run_end:
                self._pwritev(run, run_start)
                run = []
            if not run:
                run_start = start
            run.append(view)
            run_end = end
        if run:
            self._pwritev(run, run_start)
        with self._lock:
            for (name, view), digest in zip(checked, digests, strict=True):
                self.sha256[name] = digest
                self._unsynced += view.nbytes
        return digests

    def _pwritev(self, views: list[memoryview], offset: int) -> None:
        if len(views) == 1:
            self._pwrite(views[0], offset)
        else:
            with writing(self.path):
                written = os.pwritev(self._fd, views, offset)
            at = offset
            for view in views:  # a short write: the rest one buffer at a time
                if written >= view.nbytes:
                    written -= view.nbytes
                else:
                    self._pwrite(view[written:], at + written)
                    written = 0
                at += view.nbytes
        self._compare_on_disk(views, offset)

    def _compare_on_disk(self, views: list[memoryview], offset: int) -> None:
        """Read back the bytes just written at ``offset`` and compare them with ``views``."""
        scratch = _scratch()
        for view in views:
            done = 0
            while done < view.nbytes:
                n = min(len(scratch.buffer), view.nbytes - done)
                with writing(self.path):
                    got = os.preadv(self._fd, [scratch.view[:n]], offset + done)
                if got != n or not _equal(scratch.address, view, done, n):
                    name = next((k for k, (s, e) in self._spans.items() if s <= offset + done < e), "?")
                    raise CheckpointError(
                        f"{self.path}: tensor {name!r} reads back different from what was written "
                        f"(at byte {offset + done})",
                        hint="the disk or file system changed the data: check the storage and run again",
                        tensor=name,
                        file=str(self.path),
                    )
                done += n
            offset += view.nbytes

    def writeback_due(self) -> bool:
        """Whether ``writeback_every`` bytes were written since the last time this said so (0: never)."""
        with self._lock:
            if not self._writeback_every or self._unsynced < self._writeback_every:
                return False
            self._unsynced = 0
            return True

    def writeback(self) -> None:
        """``fdatasync`` what is written so far (blocks until the disk has it; a closed file: nothing)."""
        with self._fd_lock, writing(self.path):
            if self._fd >= 0:
                os.fdatasync(self._fd)

    def close(self, *, sync: bool = True) -> None:
        """Check that every declared tensor was written, then close (fsync first unless ``sync=False``).

        Raises:
            CheckpointError: a declared tensor was never written (the file is left for :meth:`abort`).
        """
        missing = [name for name in self._expected if not self.sha256.get(name)]
        if missing:
            raise CheckpointError(
                f"{self.path}: {len(missing)} declared tensors were not written (first: {missing[0]!r})"
            )
        with self._fd_lock, writing(self.path):
            try:
                if sync:
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1

    def abort(self) -> None:
        """Close without checks and delete the partial file."""
        with self._fd_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self.path.unlink(missing_ok=True)


_SCRATCH_BYTES = 4 << 20  # bytes read back per call: large enough for few calls, small enough for the cache
_LIBC = ctypes.CDLL(None)  # releases the GIL around each call
_LIBC_HOLDING_GIL = ctypes.PyDLL(None)
for _memcmp in (_LIBC.memcmp, _LIBC_HOLDING_GIL.memcmp):
    _memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    _memcmp.restype = ctypes.c_int
_per_thread = threading.local()


class _Scratch:
    """One thread's read-back buffer (reused: a fresh buffer per read would fault every page in)."""

    def __init__(self) -> None:
        self.buffer = bytearray(_SCRATCH_BYTES)
        self.view = memoryview(self.buffer)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))


def _scratch() -> _Scratch:
    scratch: _Scratch | None = getattr(_per_thread, "scratch", None)
    if scratch is None:
        scratch = _per_thread.scratch = _Scratch()
    return scratch


def _equal(address: int, view: memoryview, start: int, nbytes: int) -> bool:
    """Whether ``nbytes`` bytes at ``address`` equal ``view[start:start + nbytes]``."""
    theirs = ctypes.addressof(ctypes.c_char.from_buffer(view)) + start
    memcmp = _LIBC_HOLDING_GIL.memcmp if nbytes < HOLD_GIL_BELOW_BYTES else _LIBC.memcmp
    return bool(memcmp(address, theirs, nbytes) == 0)


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` as a flat memoryview (it keeps the tensor alive), without a torch
    op for a contiguous CPU tensor: every torch call releases the GIL, and with a conversion's
    many threads each release is a hand-off."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        tensor = tensor.detach().cpu().contiguous()
    nbytes = tensor.numel() * tensor.element_size()
    if not nbytes:
        return memoryview(bytearray())
    raw = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    raw._owner = tensor  # type: ignore[attr-defined]  # the storage lives as long as the view
    return memoryview(raw).cast("B")
