"""Where a steady validate_export (and export) spends its time on the GPU host (issue 15): host-bound
or GPU-bound? 48-layer Qwen3-30B-A3B master (bench/live_sync.py's), a constructed LiveExporter and
ExportValidator after two warm calls, then for each: wall time of a steady call (best of 5), the GPU
time of its kernels (torch.profiler: the sum of device time of every kernel and copy), the host time
with the final synchronization excluded, and cProfile's top functions by own time.

    python bench/device/validate_profile.py [LAYERS]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from live_sync import _master

from fp4convert.megatron import batches
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
config, master = _master(layers, "cuda", 0, 128)
master_bytes = sum(t.numel() * t.element_size() for t in master.values())
kwargs = {"contract": "nvfp4-experts-per-token", "config": config, "dialect": "modelopt"}
exporter = LiveExporter(**kwargs)
validator = ExportValidator(**kwargs)
update = dict(exporter(master.items()))
assert validator(update, master).ok


def steady(label: str, fn) -> None:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    gpu = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6
    kernels = sum(e.count for e in prof.key_averages())
    every = ", ".join(f"{w * 1e3:.0f}" for w in walls)
    rate = master_bytes / min(walls) / 1e9
    print(f"== {label}: wall best {min(walls) * 1e3:.1f} ms (all {every}), {rate:.0f} GB/s; "
          f"GPU busy {gpu * 1e3:.1f} ms in {kernels} kernels/copies")  # fmt: skip
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=60))
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


steady("LiveExporter", lambda: exporter(master.items()))
steady("ExportValidator", lambda: validator(update, master))
one_pass = getattr(batches, "nvfp4_segment_mismatches", None)  # absent from revisions before stop 27
if one_pass is not None:
    batches.nvfp4_segment_mismatches = lambda *args, **kwargs: None  # the path before: quantize, then compare
    steady("ExportValidator (NVFP4 batches: quantize into buffers, then compare)", lambda: validator(update, master))
    batches.nvfp4_segment_mismatches = one_pass
