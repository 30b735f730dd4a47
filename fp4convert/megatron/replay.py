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
from typing import Any, Generic, TypeVar, cast

import torch

__all__ = ["GraphReplay"]

T = TypeVar("T")


class GraphReplay(Generic[T]):
    """Run ``work`` eagerly the first time a key is seen, capture it into a CUDA graph the second
    time (and replay that), and replay it while the key holds.

    The value ``work`` returns (tensors it allocated) is kept with the graph: a replay rewrites
    those same tensors, so the caller reads them after each call. A capture that fails (something in
    ``work`` cannot be captured) turns replays off for good, and ``work`` runs eagerly instead.
    """

    def __init__(self) -> None:
        self._owner: object | None = None
        self._key: list[int] | None = None
        self._eager_runs = 0
        self._captured: tuple[Any, T] | None = None  # (torch.cuda.CUDAGraph, what work returned)
        self.failed: BaseException | None = None  # why capture failed, if it did

    @property
    def captured(self) -> bool:
        return self._captured is not None

    def holds(self, owner: object, key: list[int]) -> bool:
        """Whether a call with ``owner`` and ``key`` would replay the captured graph."""
        return self._captured is not None and self._owner is owner and self._key == key

    def seen(self, owner: object, key: list[int]) -> bool:
        """Whether ``key`` ran eagerly last time (so a call now captures it), captures not failed."""
        return self._owner is owner and self._key == key and self._eager_runs > 0 and self.failed is None

    def saw(self, owner: object, key: list[int]) -> None:
        """Record an eager run of the work for ``key`` made by the caller (its own, equivalent way)."""
        if self._owner is not owner or self._key != key:
            self.drop()
            self._owner, self._key = owner, key
        self._eager_runs += 1

    def drop(self) -> None:
        """Forget the graph (its memory pool is released with it)."""
        self._owner = self._key = self._captured = None
        self._eager_runs = 0

    def __call__(self, owner: object, key: list[int], device: torch.device, work: Callable[[], T]) -> T:
        """``work()``, or a replay of it.

        Args:
            owner: the object the work was built from (compared by identity: another one, even an
                equal one, is another work).
            key: the addresses of every tensor ``work`` touches, in a fixed order.
            device: the CUDA device it runs on.
            work: issues the kernels, never waits for the GPU, returns its outputs.
        """
        if self.holds(owner, key):
            graph, out = cast(tuple[Any, T], self._captured)
            graph.replay()
            return out
        if not self.seen(owner, key):
            self.saw(owner, key)
            return work()
        captured = _capture(device, work)
        if isinstance(captured, BaseException):
            self.failed = captured
            return work()
        self._captured = captured
        captured[0].replay()  # capturing records the kernels without running them
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
