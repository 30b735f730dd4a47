"""The host's share of a live sync (issue 15): export and validate every one of Qwen3-30B-A3B's 55,731
48-layer outputs with tiny dimensions (hidden 64, experts 32 wide), so the Python per tensor and per
group, not the quantize kernels, is most of what is timed. CPU. Steady state, and a new exporter's
(its buffers made at its first call, or at construction) and a new validator's construction and
first call (what the first sync of a run costs beyond later ones).

    python bench/sync_host.py [--layers 48] [--repeat 5]
    PYTHONPATH=_base python bench/sync_host.py   # another revision (bench/device/README.md: _base/)
"""

from __future__ import annotations

import argparse
import time

import torch

import fp4convert
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
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
    assert validator(update, master).ok
    print(f"{fp4convert.__file__}: {len(master)} master tensors, {len(update)} outputs, 1 thread")
    for what, call in (("export (LiveExporter)", lambda: exporter(master.items())),
                       ("validate (ExportValidator)", lambda: validator(update, master))):  # fmt: skip
        call()
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        print(f"{what:<31} steady {best * 1e3:8.1f} ms (best of {args.repeat})", flush=True)

    def made_with_buffers(**kw):  # type: ignore[no-untyped-def]  # LiveExporter(device=...): outputs at construction
        return LiveExporter(**kw, device="cpu")

    fresh_cases = (("export, new exporter", LiveExporter, lambda new: new(master.items())),
                   ("export, buffers at construction", made_with_buffers, lambda new: new(master.items())),
                   ("validate, new validator", ExportValidator, lambda new: new(update, master)))  # fmt: skip
    for what, make, call in fresh_cases:
        built, first = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fresh = make(**kwargs)
            middle = time.perf_counter()
            call(fresh)
            built.append(middle - start)
            first.append(time.perf_counter() - middle)
        print(f"{what:<31} construction {min(built) * 1e3:6.1f} ms, "
              f"first call {min(first) * 1e3:6.1f} ms (best of {args.repeat})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
