"""What a group's first bind costs the host (issue 15: a sync's first call binds every group): the
address table of one group of 128 segments (a layer's experts) built from freshly bound tensors, and
a read of the layout's ``even_rows`` (every launch reads it). CPU; best of many.

    python bench/segment_tables.py
    PYTHONPATH=_base python bench/segment_tables.py   # another revision (bench/device/README.md: _base/)
"""

from __future__ import annotations

import time

import torch

import fp4convert
from fp4convert.formats.segments import SegmentLayout, Sources


def best_of(runs: int, setup, timed) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(runs):
        state = setup()
        started = time.perf_counter()
        timed(state)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    tensors = [torch.zeros(16, 64, dtype=torch.bfloat16) for _ in range(128)]
    layout = SegmentLayout.of([16] * 128, cols=64)
    table = best_of(500, lambda: Sources(layout).bind(tensors), lambda sources: sources.device_tables())
    even = best_of(5000, lambda: layout, lambda laid: laid.even_rows)
    print(f"{fp4convert.__file__}")
    print(f"address table, first build, 128 segments  {table * 1e6:7.1f} us (best of 500)")
    print(f"even_rows                                  {even * 1e6:7.2f} us (best of 5000)")


if __name__ == "__main__":
    main()
