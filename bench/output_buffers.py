"""What a sync's output set costs to make (issue 15): every group's output matrices and the views of
them that a sync hands out (``GroupBuffers.allocate``), for Qwen3-30B-A3B's 48 layers (55,731 outputs)
on the CPU. A first sync of an exporter not told its device pays this; one told it (the default on a
GPU) pays it at construction. Best of ``--repeat``, the collector paused as the exporter pauses it.

    python bench/output_buffers.py [--layers 48] [--repeat 7]
    PYTHONPATH=_base python bench/output_buffers.py   # another revision (bench/device/README.md: _base/)
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

import fp4convert
from fp4convert.families import load_config
from fp4convert.megatron.groups import GroupBuffers, plan_groups
from fp4convert.megatron.plan import export_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    config = {**load_config("Qwen3-30B-A3B"), "num_hidden_layers": args.layers}
    plan = export_plan(contract="nvfp4-experts-per-token", config=config, dialect="modelopt")
    groups = plan_groups(plan, plan.expected(0, 1))
    device = torch.device("meta")  # no memory: the Python and the views, not the allocator, are timed
    outputs = 0
    best = float("inf")
    gc.disable()
    try:
        for _ in range(args.repeat):
            start = time.perf_counter()
            made = [GroupBuffers.allocate(plan, group, device) for group in groups]
            best = min(best, time.perf_counter() - start)
            outputs = sum(len(member) for buffers in made for member in buffers.outputs)
            del made
            gc.collect()
    finally:
        gc.enable()
    print(f"{fp4convert.__file__}: {len(groups)} groups, {outputs} quantized outputs: "
          f"{best * 1e3:.1f} ms (best of {args.repeat}), {best / outputs * 1e6:.2f} us an output")  # fmt: skip


if __name__ == "__main__":
    main()
