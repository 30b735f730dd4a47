"""Where a constructed LiveExporter's (and ExportValidator's) first call spends its time on the GPU (issue 15).

Builds the 48-layer Qwen3-30B-A3B master on the GPU (bench/live_sync.py's), runs export_hf once
(kernels compiled, plan cached), then constructs a new exporter for a config the plan cache has not
seen and profiles its first call with cProfile (CUDA synchronised at the end), then the same for
a new validator. Prints the top functions by cumulative and by own time, the second call's time,
and the top functions of a steady call by own time.
Usage: python bench/device/first_call_profile.py [LAYERS]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

sys.path.insert(0, "bench")
from live_sync import _master

from fp4convert import export_hf
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
config, master = _master(layers, "cuda", 0, 128)
kwargs = {"contract": "nvfp4-experts-per-token", "family": "qwen3_moe", "config": config, "dialect": "modelopt"}
update = dict(export_hf(master.items(), **kwargs))
torch.cuda.synchronize()


def profile(label: str, fn) -> None:
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    first = time.perf_counter() - started
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    steady = time.perf_counter() - started
    print(f"== {label}: first call {first:.3f} s (under cProfile), second {steady:.3f} s", flush=True)
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(28)
    stats.sort_stats("tottime").print_stats(16)
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"== {label}: a steady call under cProfile", flush=True)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(16)


fresh = {**config, "bench_nonce": time.time_ns()}
exporter = LiveExporter(contract=kwargs["contract"], config=fresh, dialect="modelopt")
profile("constructed LiveExporter", lambda: exporter(master.items()))
exporter = None
validator = ExportValidator(contract=kwargs["contract"], config={**fresh, "n2": 1}, dialect="modelopt")
profile("constructed ExportValidator", lambda: validator(update, master))
