"""Timeline of one conversion process: which threads do what, when (issue 13's one-process bound).

Wraps the conversion's steps (read, quantize, write, hash, budget waits) with timers by
monkeypatching, runs ``fp4convert convert`` with the given arguments, then prints for each step
its thread-seconds and, over time, how many threads were in it (a coarse utilisation chart).
Usage: [TRACE_BUDGET_MB=N] python bench/device/trace_convert.py SRC DST --contract C [convert options]
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time

from fp4convert.checkpoint import file_hashes, positional_writer, reader
from fp4convert.cli import cli
from fp4convert.convert import parallel

EVENTS: list[tuple[str, str, float, float]] = []
T0 = time.perf_counter()


NAMES: dict[int, str] = {}  # event index -> what it worked on (for the longest ones)


def traced(owner: object, name: str, label: str, what=None) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((threading.current_thread().name, label, start - T0, time.perf_counter() - T0))
            if what is not None:
                NAMES[len(EVENTS) - 1] = what(*args)

    setattr(owner, name, wrapper)


if os.environ.get("TRACE_BUDGET_MB"):  # try another in-flight budget
    _budget_init = parallel._Budget.__init__
    parallel._Budget.__init__ = lambda self, limit, stopped: _budget_init(  # type: ignore[method-assign]
        self, int(os.environ["TRACE_BUDGET_MB"]) << 20, stopped
    )
traced(parallel._Budget, "take", "budget wait")
traced(reader.SourceReader, "read", "read", lambda r, name: name)
traced(reader.SourceReader, "read_range", "read: pread + hash offer")
traced(parallel._Run, "quantize", "quantize task")
traced(parallel, "quantize_tensor", "quantize_tensor")
traced(positional_writer.PositionalWriter, "write_many", "write (sha256, pwrite, check)", lambda w, pairs: pairs[0][0])
traced(positional_writer.PositionalWriter, "_compare_on_disk", "read back + compare")
traced(positional_writer.PositionalWriter, "__init__", "open shard (header)")
traced(parallel._Run, "sync", "shard fsync + header", lambda run, path: path.name)
traced(parallel._Run, "tensor_done", "tensor done (shard close)")
# whole-file hashes run in child processes (FileHashes): not on this timeline
traced(file_hashes.SourceHashes, "offer", "hash offer")

start = time.perf_counter()
try:
    cli.main(args=["convert", *sys.argv[1:]], standalone_mode=False)
finally:
    end = time.perf_counter() - T0
    busy = collections.Counter()
    for _, label, a, b in EVENTS:
        busy[label] += b - a
    first = min((a for _, _, a, _ in EVENTS), default=0.0)
    last = max((b for _, _, _, b in EVENTS), default=0.0)
    print(f"\nsteps traced from {first:.2f} s to {last:.2f} s (process time {end:.2f} s)")
    for label, seconds in busy.most_common():
        print(f"  {label:28s} {seconds:8.2f} thread-s  ({seconds / max(last - first, 1e-9):5.1f} threads on average)")
    print("the longest steps:")
    longest = sorted(NAMES, key=lambda i: EVENTS[i][2] - EVENTS[i][3])[:8]
    for i in sorted(longest, key=lambda i: EVENTS[i][2]):
        thread, label, a, b = EVENTS[i]
        print(f"  {a:6.2f}-{b:6.2f} s {label:24s} {NAMES[i]} ({thread})")
    step = max((last - first) / 20, 1e-3)
    labels = ["read", "quantize_tensor", "write (sha256, pwrite, check)", "read back + compare", "budget wait"]
    print(f"threads in each step per time slice of {step:.2f} s:")
    print("  t(s)  " + " ".join(f"{lab[:12]:>12s}" for lab in labels))
    for i in range(20):
        lo, hi = first + i * step, first + (i + 1) * step
        row = []
        for lab in labels:
            overlap = sum(max(0.0, min(b, hi) - max(a, lo)) for _, l2, a, b in EVENTS if l2 == lab)
            row.append(overlap / step)
        print(f"  {lo:5.2f} " + " ".join(f"{v:12.1f}" for v in row))
