"""The host's share of a live sync (issue 15): export and validate every one of Qwen3-30B-A3B's 55,731
48-layer outputs with tiny dimensions (hidden 64, experts 32 wide), so the Python per tensor and per
group, not the quantize kernels, is most of what is timed. CPU. Steady state, and a new exporter's
(its buffers made at its first call, or at construction) and a new validator's construction and
first call (what the first sync of a run costs beyond later ones).

``--stub-kernels`` takes the GPU's path instead (address tables, pinned uploads, the Triton segment
kernels' launches) with the launches made no-ops, a comparing launch finding every row equal, on
the CPU: what a GPU sync costs the host in Python, less the launch latency and the allocator's,
measurable without a GPU. First calls print as best / median / worst (the worst is where a garbage
collection fell). ``--profile``: cProfile of one first call of an exporter made with its buffers.

    python bench/sync_host.py [--layers 48] [--repeat 5] [--stub-kernels] [--profile]
    PYTHONPATH=_base python bench/sync_host.py   # another revision (bench/device/README.md: _base/)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import types

import torch

import fp4convert
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator


def _spread(seconds: list[float]) -> str:
    return " / ".join(f"{f(seconds) * 1e3:.1f}" for f in (min, statistics.median, max)) + " ms"


class _NoLaunch:
    """A Triton kernel whose launches write nothing (``kernel[grid](*args, **meta)``), but a
    comparing launch's flags, zeroed: every row found equal (the validator's rows)."""

    def __getitem__(self, grid: object) -> object:
        def launch(*args, **meta):  # type: ignore[no-untyped-def]
            if meta.get("VERIFY"):
                args[10].zero_()  # _launch_nvfp4: the flags of the rows that differ

        return launch


def stub_kernels() -> None:
    """Make the segment code take the Triton path on the CPU, every launch a no-op."""
    from fp4convert.formats import _triton_segments, segments

    stub = types.SimpleNamespace(
        _amax_seg_kernel=_NoLaunch(), _nvfp4_seg_kernel=_NoLaunch(), _mxfp8_seg_kernel=_NoLaunch(),
        launch_shape=_triton_segments.launch_shape, hardware_e4m3=lambda device: False,
        word_path=_triton_segments.word_path, _PREFETCH=_triton_segments._PREFETCH,
    )  # fmt: skip
    segments._on_triton = lambda device: True  # type: ignore[assignment]
    segments._cuda_kernels = lambda: stub  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stub-kernels", action="store_true", help="the GPU's path, launches stubbed (exporter rows)")
    parser.add_argument("--profile", action="store_true", help="cProfile one first call of a constructed exporter")
    args = parser.parse_args()
    if args.stub_kernels:
        stub_kernels()
    torch.set_num_threads(1)
    config = dict(load_config("Qwen3-30B-A3B"))
    config.update(num_hidden_layers=args.layers, hidden_size=64, moe_intermediate_size=32, intermediate_size=64,
                  vocab_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    by_layer: dict[int | None, list] = {}
    for info in inventory_from_config(config):
        by_layer.setdefault(info.layer, []).append(info)
    master: dict[str, torch.Tensor] = {}
    for infos in by_layer.values():
        hf = {i.name: (torch.randn(i.shape, generator=generator) * 0.02).to(torch.bfloat16) for i in infos}
        master.update(hf_to_megatron(hf, "qwen3_moe", config))
    kwargs = {"contract": "nvfp4-experts-per-token", "config": config, "dialect": "modelopt"}
    exporter = LiveExporter(**kwargs)
    validator = ExportValidator(**kwargs)
    update = dict(exporter(master.items()))
    path = "the GPU's path, launches stubbed" if args.stub_kernels else "the CPU kernels"
    print(f"{fp4convert.__file__}: {len(master)} master tensors, {len(update)} outputs, 1 thread, {path}")
    assert validator(update, master).ok  # stubbed: the quantized rows are found equal unread
    steady = [("export (LiveExporter)", lambda: exporter(master.items())),
              ("validate (ExportValidator)", lambda: validator(update, master))]  # fmt: skip
    for what, call in steady:
        call()
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        print(f"{what:<31} steady {best * 1e3:8.1f} ms (best of {args.repeat})", flush=True)

    def made_with_buffers(**kw):  # type: ignore[no-untyped-def]  # LiveExporter(device=...): outputs at construction
        return LiveExporter(**kw, device="cpu")

    fresh_cases = [
        ("export, new exporter", LiveExporter, lambda new: new(master.items())),
        ("export, buffers at construction", made_with_buffers, lambda new: new(master.items())),
        ("validate, new validator", ExportValidator, lambda new: new(update, master)),
    ]
    for what, make, call in fresh_cases:
        built, first = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fresh = make(**kwargs)
            middle = time.perf_counter()
            call(fresh)
            built.append(middle - start)
            first.append(time.perf_counter() - middle)
        print(f"{what:<31} construction {_spread(built)}, first call {_spread(first)} "
              f"(best / median / worst of {args.repeat})", flush=True)  # fmt: skip
    if args.profile:
        fresh = made_with_buffers(**kwargs)
        profiler = cProfile.Profile()
        profiler.runcall(fresh, master.items())
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
