"""Live-export validation throughput (issue 6 target: >= 100 GB/s of BF16 master on an H200).

Builds a model with Qwen3-30B-A3B's tensor shapes (``--layers`` decoder layers, 128 experts each)
directly on the device, in Megatron-Core names as the learner holds it, exports it with
``fp4convert.export_hf`` and times ``fp4convert.validate_export`` of that export against the
master: the first call (plan, row maps and batch layouts are built) and the following ones (what
every weight sync after the first costs). Each validation must pass; the script says so.

    python bench/validate_export.py [--device cpu|cuda] [--layers N] [--repeat R]
        [--contract nvfp4-experts-per-token] [--dialect modelopt] [--master megatron|hf] [--json]

Prints GB/s of BF16 master (the bytes of every master tensor the export is checked against).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from fp4convert import export_hf, validate_export
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config


def _model(
    layers: int, device: str, seed: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(config, Megatron master, HF master) with random BF16 values, built one layer at a time."""
    config = dict(load_config("Qwen3-30B-A3B"))
    config["num_hidden_layers"] = layers
    generator = torch.Generator(device=device).manual_seed(seed)
    by_layer: dict[int | None, list[Any]] = {}
    for info in inventory_from_config(config):
        by_layer.setdefault(info.layer, []).append(info)
    megatron: dict[str, torch.Tensor] = {}
    hf: dict[str, torch.Tensor] = {}
    for infos in by_layer.values():
        tensors = {
            i.name: (torch.randn(i.shape, generator=generator, device=device) * 0.02).to(torch.bfloat16) for i in infos
        }
        megatron.update(hf_to_megatron(tensors, "qwen3_moe", config))
        hf.update(tensors)
    return config, megatron, hf


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 8 on cuda, 1 on cpu)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--contract", default="nvfp4-experts-per-token")
    parser.add_argument("--dialect", default="modelopt")
    parser.add_argument("--master", choices=["megatron", "hf"], default="megatron")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    layers = args.layers or (8 if args.device.startswith("cuda") else 1)

    config, megatron, hf = _model(layers, args.device, seed=0)
    master = megatron if args.master == "megatron" else hf
    if args.master == "megatron":
        hf.clear()  # keep one copy of the weights in memory
    nbytes = sum(t.numel() * t.element_size() for t in master.values())

    _sync(args.device)
    started = time.perf_counter()
    exported = dict(
        export_hf(megatron.items(), contract=args.contract, family="qwen3_moe", config=config, dialect=args.dialect)
    )
    _sync(args.device)
    export_s = time.perf_counter() - started

    kwargs = {"contract": args.contract, "family": "qwen3_moe", "config": config, "dialect": args.dialect}
    started = time.perf_counter()
    first = validate_export(exported, master, **kwargs)
    first_s = time.perf_counter() - started
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        report = validate_export(exported, master, **kwargs)
        times.append(time.perf_counter() - started)
        if not report.ok:
            raise SystemExit(f"validation failed: {report.summary()}")
    if not first.ok:
        raise SystemExit(f"validation failed: {first.summary()}")
    best = min(times)
    result = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "threads": torch.get_num_threads(),
        "layers": layers,
        "master": args.master,
        "contract": args.contract,
        "dialect": args.dialect,
        "master_gb": nbytes / 1e9,
        "exported_tensors": len(exported),
        "export_gbps": nbytes / export_s / 1e9,
        "validate_first_s": first_s,
        "validate_s": best,
        "validate_gbps": nbytes / best / 1e9,
        "validate_gbps_first": nbytes / first_s / 1e9,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['device']} ({result['threads']} threads): Qwen3-30B-A3B shapes, {layers} layers, "
        f"{result['master_gb']:.2f} GB BF16 master ({args.master} names), {len(exported)} exported tensors\n"
        f"export_hf:        {result['export_gbps']:8.2f} GB/s\n"
        f"validate (first): {result['validate_gbps_first']:8.2f} GB/s ({first_s:.3f} s: plan, row maps, layouts)\n"
        f"validate:         {result['validate_gbps']:8.2f} GB/s ({best:.3f} s, best of {args.repeat})"
        "; target >= 100 GB/s on an H200"
    )


if __name__ == "__main__":
    main()
