"""Throughput of fp4convert.bridge.validate_export (issue 6 target: >= 100 GB/s of BF16 master, H200).

Builds ``--layers`` decoder layers with Qwen3-30B-A3B's shapes (from the shipped config: 128
experts of 768 x 2048 per layer, GQA attention 32/4 heads of 128) directly on the device, in
Megatron-Core names as the learner holds them (TEGroupedMLP ``linear_fc1.weight{e}``), exports
them with ``export_hf`` and times ``ExportValidator.validate`` of that export against the master:
the first call (builds the plan: row maps, expected tensors, batches) and the following ones (what
each weight sync after the first costs). Every validation must pass, and one with a corrupted scale
must fail, or the script exits 1.

    python bench/bridge_validate_export.py [--device cpu|cuda] [--layers N] [--repeat R]
        [--contract nvfp4-experts-per-token] [--dialect modelopt] [--json]

GB/s counts the BF16 master bytes the export is checked against (embedding and lm_head left out:
they are plain copies and would flatter the figure).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from fp4convert.bridge import ExportValidator, export_hf
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config


def _master(layers: int, device: str, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, Megatron-named BF16 decoder layers) with random values, made on ``device``."""
    config = dict(load_config("Qwen3-30B-A3B"), num_hidden_layers=layers)
    generator = torch.Generator(device=device).manual_seed(seed)
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    for info in inventory_from_config(config):
        if info.layer is None:
            continue
        values = torch.randn(info.shape, generator=generator, device=device, dtype=torch.float32)
        by_layer.setdefault(info.layer, {})[info.name] = values.to(torch.bfloat16)
    master: dict[str, torch.Tensor] = {}
    for tensors in by_layer.values():  # one layer at a time: fused pieces are complete per layer
        master.update(hf_to_megatron(tensors, "qwen3_moe", config))
    return config, master


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (1.26 GB of BF16 each)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--contract", default="nvfp4-experts-per-token")
    parser.add_argument("--dialect", default="modelopt")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    config, master = _master(args.layers, args.device, seed=0)
    kwargs = {"contract": args.contract, "config": config, "dialect": args.dialect}
    _sync(args.device)
    started = time.perf_counter()
    exported = dict(export_hf(master, **kwargs))
    _sync(args.device)
    export_seconds = time.perf_counter() - started

    validator = ExportValidator(**kwargs)
    started = time.perf_counter()
    first = validator.validate(exported, master)
    cold = time.perf_counter() - started
    warm = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        report = validator.validate(exported, master)  # returns after the one device -> host read
        warm.append(time.perf_counter() - started)
        if not report.ok:
            raise SystemExit("validation of an exact export failed:\n" + "\n".join(report.lines()[:10]))
    name = next(n for n in exported if n.endswith(".experts.7.up_proj.weight_scale_2"))
    exported[name] = exported[name] * 2  # a fault must be caught at full speed too
    caught = not validator.validate(exported, master).ok
    gigabytes = first.master_bytes / 1e9
    best = min(warm)
    result = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "torch_threads": torch.get_num_threads(),
        "layers": args.layers,
        "contract": args.contract,
        "dialect": args.dialect,
        "master_gb": round(gigabytes, 3),
        "tensors_checked": first.counts()["expected"],
        "export_s": round(export_seconds, 3),
        "first_validate_s": round(cold, 3),
        "validate_s_best": round(best, 4),
        "validate_s_median": round(sorted(warm)[len(warm) // 2], 4),
        "gb_per_s": round(gigabytes / best, 2),
        "fault_caught": caught,
        "peak_mb": round(
            torch.cuda.max_memory_allocated() / 2**20
            if args.device.startswith("cuda")
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['device']} ({result['torch_threads']} threads): {args.layers} Qwen3-30B-A3B layers, "
            f"{gigabytes:.3f} GB BF16 master, {result['tensors_checked']} HF tensors, contract {args.contract}, "
            f"{args.dialect}"
        )
        print(f"export_hf {export_seconds:.2f} s; first validate {cold:.3f} s (builds the plan)")
        print(
            f"validate_export: best {best * 1e3:.1f} ms, median {result['validate_s_median'] * 1e3:.1f} ms "
            f"-> {result['gb_per_s']:.2f} GB/s of BF16 master; a corrupted scale caught: {caught}; "
            f"peak {result['peak_mb']} MB"
        )
    if not caught:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
