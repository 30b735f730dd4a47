"""Reused memory for source reads: a conversion reads gigabytes into buffers it frees right after.

A fresh buffer per read costs a page fault for every 4 KiB the read fills (``perf record -e
page-faults`` on a conversion: 94% of its million faults were in ``preadv``'s copy), and every
thread faulting or unmapping takes the process's address-space lock. :class:`ReadBuffers` hands
out buffers that are reused once nothing refers to them any more, and maps new ones with
transparent huge pages where the kernel allows (one fault per 2 MiB).

A buffer is free again only when no tensor, view or array made from it is alive: every one of
them keeps a reference to the buffer object, so the pool counts references (a source tensor
still queued for hashing, or written as it is, is never handed out twice).
"""

from __future__ import annotations

import mmap
import sys
import threading

import torch

__all__ = ["ReadBuffers"]

_HUGE_PAGE = 2 << 20


def _mapped_size(nbytes: int) -> int:
    """The length mapped for a read of ``nbytes``: from 2 MiB on, a whole number of huge pages.

    The kernel places an anonymous map on a huge-page boundary only when its length is a multiple
    of 2 MiB; otherwise a 3 MiB buffer (one expert's projection) may hold no aligned 2 MiB page at
    all and faults 4 KiB at a time (measured on Linux 6.18: ~520 faults per 3 MiB unrounded, 1-2
    rounded). At most 2 MiB per buffer is mapped but never touched, and counted against the pool.
    """
    if nbytes < _HUGE_PAGE:
        return nbytes
    return -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE


def _map(nbytes: int) -> mmap.mmap:
    # private: Python's default for an anonymous map is MAP_SHARED, i.e. shmem, which takes huge
    # pages only where the host enables them for shmem (``shmem_enabled``, usually "never"), so
    # MADV_HUGEPAGE did nothing and every 4 KiB still faulted (measured: 64 MiB filled 20 times,
    # 327,703 faults and 0.87 s of system time shared; 640 faults and 0.16 s private)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes)  # page-aligned
    if nbytes >= _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buffer.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # the kernel has no transparent huge pages: 4 KiB pages then
    return buffer


def _idle_references() -> int:
    """``sys.getrefcount`` of a pooled buffer nobody else holds, as :meth:`ReadBuffers.take` sees it
    (measured, not assumed: the count differs between interpreter versions)."""
    pool = [_map(mmap.PAGESIZE)]
    for buffer in pool:
        return sys.getrefcount(buffer)
    raise AssertionError("unreachable")


class ReadBuffers:
    """Buffers for reads of up to ``keep_bytes`` in all (thread-safe).

    Args:
        keep_bytes: bytes of buffers the pool owns at most, in use and free; a read that finds no
            free buffer of its size and no room gets a buffer of its own, freed as usual.
        keep_below: reads of at least this many bytes always get a buffer of their own (an
            embedding or lm_head is read once; kept, it would hold its memory for the whole run).

    Example:
        >>> pool = ReadBuffers(1 << 20)
        >>> a = pool.take(4096); p = a.data_ptr(); del a
        >>> pool.take(4096).data_ptr() == p
        True
    """

    def __init__(self, keep_bytes: int, *, keep_below: int | None = None) -> None:
        self._keep = keep_bytes
        self._keep_below = keep_bytes if keep_below is None else keep_below
        self._owned = 0
        self._by_size: dict[int, list[mmap.mmap]] = {}
        self._lock = threading.Lock()
        self._idle = _idle_references()

    def take(self, nbytes: int) -> torch.Tensor:
        """An uninitialized uint8 tensor of ``nbytes`` (64-byte aligned)."""
        if nbytes <= 0:
            return torch.empty(0, dtype=torch.uint8)
        size = _mapped_size(nbytes)  # reads of sizes that round alike share buffers
        if nbytes >= self._keep_below:
            return torch.frombuffer(_map(size), dtype=torch.uint8, count=nbytes)
        with self._lock:
            buffers = self._by_size.setdefault(size, [])
            for buffer in buffers:
                if sys.getrefcount(buffer) == self._idle:
                    return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes)
            if self._owned + size > self._keep:
                self._evict(self._owned + size - self._keep)
            if self._owned + size > self._keep:
                return torch.frombuffer(_map(size), dtype=torch.uint8, count=nbytes)
            buffer = _map(size)
            buffers.append(buffer)
            self._owned += size
            return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes)

    def _evict(self, nbytes: int) -> None:
        """Drop free buffers of any size until ``nbytes`` are released (or none is free)."""
        for size, buffers in self._by_size.items():
            for buffer in list(buffers):
                if nbytes <= 0:
                    return
                if sys.getrefcount(buffer) == self._idle + 1:  # + the loop's own reference
                    buffers.remove(buffer)
                    self._owned -= size
                    nbytes -= size
