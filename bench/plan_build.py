"""How long an export plan takes to build, with Python's cyclic collector paused (as export_plan
builds it) and on (as it did before), alternating, for shipped model configs.

    python bench/plan_build.py [--repeat N] [MODEL ...]   (default: Qwen3-30B-A3B DeepSeek-V3)

A plan is built once per (contract, config, dialect) and cached; this is what the first sync of a
training job (or ``fp4convert convert``'s plan phase, which pauses it the same way) pays.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import fp4convert.megatron.plan as export_plans
from fp4convert.families import load_config
from fp4convert.plan.collector import gc_paused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["Qwen3-30B-A3B", "DeepSeek-V3"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--contract", default="nvfp4-experts-per-token")
    args = parser.parse_args()
    try:
        for model in args.models:
            config = dict(load_config(model))
            export_plans.export_plan(contract=args.contract, config=config)  # contract parsed, imports warm
            best: dict[str, float] = {}
            items = 0
            for _ in range(args.repeat):
                for label, pause in (("collector paused", gc_paused), ("collector on", contextlib.nullcontext)):
                    export_plans.gc_paused = pause  # type: ignore[assignment]
                    config["bench_nonce"] = time.time_ns()  # a config the plan cache has not seen
                    started = time.perf_counter()
                    items = len(export_plans.export_plan(contract=args.contract, config=config).items)
                    best[label] = min(best.get(label, float("inf")), time.perf_counter() - started)
            paused, on = best["collector paused"], best["collector on"]
            print(f"{model:<16} {items:>6} tensors  paused {paused:6.2f} s  on {on:6.2f} s  ({on / paused:.2f}x)")
    finally:
        export_plans.gc_paused = gc_paused
    print(f"(best of {args.repeat}, alternating)")


if __name__ == "__main__":
    main()
