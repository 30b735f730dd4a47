"""Where a constructed LiveExporter's (and ExportValidator's) first call spends its time on the GPU (issue 15).

Builds the Qwen3-30B-A3B master on the GPU (bench/live_sync.py's), runs export_hf once (kernels
compiled, plan cached), then constructs a new exporter for a config the plan cache has not seen,
with its output buffers made at construction (``device=``, live_sync.py's "buffers made at
construction" row), and profiles its first call with cProfile: the host's time until the call
returns, until the GPU is done, the Triton compilations it triggered, the top functions by
cumulative and by own time. Then the same for an exporter issuing kernel by kernel (its steady
eager call, what a first call cannot beat without a graph), and for a new validator.
Usage: python bench/device/first_call_profile.py [LAYERS]
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys
import time

import torch
from triton.runtime.jit import JITFunction

sys.path.insert(0, "bench")
from live_sync import _master

from fp4convert import export_hf
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator

compiles: list[tuple[str, float]] = []
_do_compile = JITFunction._do_compile


def _counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    try:
        return _do_compile(self, *args, **kwargs)
    finally:
        compiles.append((self.fn.__name__, time.perf_counter() - started))


JITFunction._do_compile = _counted  # type: ignore[method-assign]

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
config, master = _master(layers, "cuda", 0, 128)
kwargs = {"contract": "nvfp4-experts-per-token", "family": "qwen3_moe", "config": config, "dialect": "modelopt"}
update = dict(export_hf(master.items(), **kwargs))
torch.cuda.synchronize()


def pinned() -> tuple[int, float]:
    """(pinned host blocks made, ms spent making them) so far: torch's host allocator grows its
    pool with cudaHostAlloc when every cached block of a size is still in flight (a first sync's
    table uploads, queued ahead of the GPU)."""
    stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    return int(stats.get("num_host_alloc", -1)), stats.get("host_alloc_time.total", 0) / 1e3


def pinned_since(before: tuple[int, float]) -> str:
    made, ms = pinned()
    return f"; pinned blocks made {made - before[0]} in {ms - before[1]:.1f} ms"


def call(label: str, fn, top: int = 24) -> None:
    compiles.clear()
    host = pinned()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    fn()
    returned = time.perf_counter() - started
    torch.cuda.synchronize()
    profiler.disable()
    done = time.perf_counter() - started
    print(f"== {label}: returned after {returned * 1e3:.1f} ms, GPU done {done * 1e3:.1f} ms (under cProfile); "
          f"{len(compiles)} Triton compilations {sum(s for _, s in compiles) * 1e3:.1f} ms "
          f"{sorted({n for n, _ in compiles})}{pinned_since(host)}", flush=True)  # fmt: skip
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def timed(label: str, fn) -> None:
    host = pinned()
    started = time.perf_counter()
    fn()
    returned = time.perf_counter() - started
    torch.cuda.synchronize()
    done = time.perf_counter() - started
    print(f"== {label}: returned after {returned * 1e3:.1f} ms, GPU done {done * 1e3:.1f} ms{pinned_since(host)}",
          flush=True)  # fmt: skip


def fresh(**more):  # type: ignore[no-untyped-def]
    return {**config, "bench_nonce": time.time_ns(), **more}


def new_exporter(**more):  # type: ignore[no-untyped-def]
    more = {"device": "cuda", **more}
    made = LiveExporter(contract=kwargs["contract"], config=fresh(), dialect="modelopt", **more)
    torch.cuda.synchronize()
    return made


def new_validator(n: int, **more):  # type: ignore[no-untyped-def]
    return ExportValidator(contract=kwargs["contract"], config=fresh(n2=n), dialect="modelopt", **more)


def timed_calls() -> None:
    """A new exporter's first call and the three after it, without cProfile (the row's own figures)."""
    exporter = new_exporter()
    timed("exporter (buffers at construction), first call", lambda: exporter(master.items()))
    for i in range(3):
        timed(f"  its call {i + 2}", lambda: exporter(master.items()))


def profiled_call() -> None:
    exporter = new_exporter()
    call("exporter (buffers at construction), first call", lambda: exporter(master.items()))


def unallocated_call() -> None:
    """A constructed exporter not told its device: its first call makes the output buffers and views."""
    exporter = new_exporter(device=None)
    call("exporter (buffers at the first call), first call", lambda: exporter(master.items()))


def eager_call() -> None:
    exporter = new_exporter(cuda_graphs=False)
    exporter(master.items())
    torch.cuda.synchronize()
    call("exporter without graphs, a steady (eager) call", lambda: exporter(master.items()))


def exporter_rows() -> None:
    for rows in (timed_calls, profiled_call, unallocated_call, eager_call):
        rows()
        gc.collect()  # each exporter's buffers (17 GB at 48 layers) freed before the next one's are made


def validator_rows() -> None:
    validator = new_validator(1)
    timed("constructed validator, first call", lambda: validator(update, master))
    for i in range(3):
        timed(f"  its call {i + 2}", lambda: validator(update, master))
    profiled = new_validator(2)
    call("constructed validator, first call", lambda: profiled(update, master))
    told = new_validator(4, device="cuda")
    timed("validator told its device, first call", lambda: told(update, master))
    told = new_validator(5, device="cuda")
    call("validator told its device, first call", lambda: told(update, master))
    eager = new_validator(3, cuda_graphs=False)
    eager(update, master)
    torch.cuda.synchronize()
    call("validator without graphs, a steady (eager) call", lambda: eager(update, master))


exporter_rows()
gc.collect()
validator_rows()
