"""A steady sync's GPU work replayed as one CUDA graph.

At every weight sync a validator (or exporter) issues the same few thousand kernels on the same
addresses: the learner updates its parameters in place, a :class:`~fp4convert.megatron.sync.LiveExporter`
reuses its output buffers. Launching them one by one from Python, not the GPU, is what bounds such a
sync (bench/results/validate-profile-h100-36-layers-stop31.txt: 92.5 ms of wall time, 43.7 ms of it
GPU work). Captured once, the same work is one graph launch.

The rule that keeps it exact: a graph is replayed only for the very addresses it was captured on
(the caller's ``key``: every tensor the work reads or writes), after the work ran once eagerly on
them (so every table it uploads and every kernel it compiles already exists: nothing new is made
during capture, :func:`~fp4convert.formats.uploads.upload` refuses to). A replay then reads and
writes what an eager run would, with the same kernels, so its bytes are the eager run's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

__all__ = ["GraphReplay"]

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    owner: object
    key: list[Any]
    captured: tuple[Any, T] | None = None  # (torch.cuda.CUDAGraph, what work returned)


class GraphReplay(Generic[T]):
    """The caller runs its work eagerly the first time a key is seen (:meth:`saw`), has it captured
    into a CUDA graph the second time (:meth:`capture`), and replays it while the key holds
    (:meth:`holds`, :meth:`replay`).

    Up to ``slots`` keys are kept, the least recently used dropped first: an exporter whose caller
    keeps one update while the next sync runs alternates between two sets of output buffers. The
    value ``work`` returns is kept with the graph: a replay rewrites the same tensors, so the caller
    reads them after each call (it should hold no tensor the caller could keep alive). A capture
    that fails (something in ``work`` cannot be captured) turns replays off for good.
    """

    def __init__(self, slots: int = 2) -> None:
        self.slots = slots
        self._entries: list[_Entry[T]] = []  # most recently used last
        self.failed: BaseException | None = None  # why a capture failed, if one did

    @property
    def graphs(self) -> int:
        """How many captured graphs are held."""
        return sum(e.captured is not None for e in self._entries)

    @property
    def captured(self) -> bool:
        """Whether a graph is held (for any key)."""
        return self.graphs > 0

    def _find(self, owner: object, key: list[Any]) -> _Entry[T] | None:
        for entry in self._entries:
            if entry.owner is owner and entry.key == key:
                self._entries.remove(entry)
                self._entries.append(entry)
                return entry
        return None

    def holds(self, owner: object, key: list[Any]) -> bool:
        """Whether a call with ``owner`` and ``key`` would replay a captured graph."""
        return any(e.owner is owner and e.captured is not None and e.key == key for e in self._entries)

    def seen(self, owner: object, key: list[Any]) -> bool:
        """Whether ``key`` ran eagerly before (so a call now captures it), captures not failed."""
        return self.failed is None and any(e.owner is owner and e.key == key for e in self._entries)

    def saw(self, owner: object, key: list[Any]) -> None:
        """Record an eager run of the work for ``key`` (the caller's own, equivalent way)."""
        if self._find(owner, key) is None:
            self._entries.append(_Entry(owner, key))
            del self._entries[: -self.slots]  # the least recently used go, with their graphs

    def drop(self) -> None:
        """Forget every key and graph (their memory pools are released with them)."""
        self._entries.clear()

    def replay(self, owner: object, key: list[Any]) -> T:
        """Launch the graph captured for ``owner`` and ``key`` (:meth:`holds` says there is one);
        returns what the work returned when captured, rewritten by this replay."""
        entry = self._find(owner, key)
        assert entry is not None and entry.captured is not None
        graph, out = entry.captured
        graph.replay()
        return out

    def capture(self, owner: object, key: list[Any], device: torch.device, work: Callable[[], T]) -> T | None:
        """Capture ``work`` for a key :meth:`seen` before, then replay it once (capturing records the
        kernels without running them); returns what it returned. None: the capture failed (the
        caller then runs the work eagerly, which raises any real error), and no capture is tried again.

        Args:
            owner: the object the work was built from (compared by identity: another one, even an
                equal one, is another work).
            key: what fixes the work (the addresses of every tensor it touches), in a fixed order.
            device: the CUDA device it runs on.
            work: issues the kernels, never waits for the GPU, returns its outputs.
        """
        entry = self._find(owner, key)
        assert entry is not None and self.failed is None
        captured = _capture(device, work)
        if isinstance(captured, BaseException):
            self.failed = captured
            self.drop()
            return None
        entry.captured = captured
        captured[0].replay()
        return captured[1]


def _capture(device: torch.device, work: Callable[[], T]) -> tuple[Any, T] | BaseException:
    """``work`` captured on a side stream ordered after the current one (as torch.cuda.graph does,
    less its emptying of the allocator's cache: a learner's process keeps what it reserved).
    ``thread_local``: other threads of the learner may use CUDA meanwhile."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = work()
            finally:
                graph.capture_end()
    except Exception as error:  # any failure means: run it eagerly (which raises real errors)
        current.wait_stream(stream)
        return error
    current.wait_stream(stream)
    return graph, out
