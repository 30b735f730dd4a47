"""What the hostile-input checks cost a conversion (issue 16): measured, not assumed.

Input: bench/convert.py's synthetic Qwen3-30B-A3B-shaped checkpoint with ``--layers`` decoder
layers (default 1: ~1.6 GB bf16). Prints, each the best of ``--repeat`` runs:

* the non-finite count of every source tensor (``nonfinite_counts``: one aminmax pass), in GB/s;
* the config.json check (``source_problems``), in seconds;
* ``fp4convert convert`` end to end with this tree, and (``--baseline-tree DIR``, e.g. a checkout
  of main) with that tree's fp4convert, in the same run, alternating, page cache warm.

    python bench/hostile_overhead.py [--baseline-tree /work/main] [--layers 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _source(workdir: Path, layers: int) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    import convert as bench_convert  # bench/convert.py: the synthetic checkpoint

    bench_convert.LAYERS = layers
    source = workdir / f"source-{layers}"
    info = bench_convert.make_source(source)
    print(f"source: {source} ({info['tensors']} tensors, {info['bytes'] / 1e9:.2f} GB bf16)")
    bench_convert.warm(source)
    return source


def _convert_seconds(tree: Path, source: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-c", "from fp4convert.cli import main; main()", "convert", str(source), str(out)]
    command += ["--contract", str(ROOT / "contracts" / "nvfp4-experts-per-token.yaml"), "-q"]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, capture_output=True, cwd=tree)
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench"))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None, help="a checkout whose fp4convert to compare")
    args = parser.parse_args()
    import torch

    from fp4convert.checkpoint.consistency import source_problems
    from fp4convert.checkpoint.reader import nonfinite_counts
    from fp4convert.checkpoint.source import open_checkpoint

    source = _source(args.workdir, args.layers)
    ckpt = open_checkpoint(source)
    total, best = 0, float("inf")
    tensors = []
    for shard in ckpt.shards:
        with ckpt.open(shard) as f:
            tensors += [f.read(name) for name in f.entries]
    total = sum(t.numel() * t.element_size() for t in tensors)
    for _ in range(args.repeat):
        started = time.perf_counter()
        for t in tensors:
            nonfinite_counts(t)
        best = min(best, time.perf_counter() - started)
    print(
        f"non-finite count: {total / best / 1e9:.2f} GB/s ({best:.2f} s for {total / 1e9:.2f} GB, "
        f"{torch.get_num_threads()} threads)"
    )
    del tensors
    inventory_seconds = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        assert not source_problems(ckpt.inventory())
        inventory_seconds = min(inventory_seconds, time.perf_counter() - started)
    print(f"inventory + config.json check: {inventory_seconds:.2f} s")
    trees = {"this tree": ROOT} | ({"baseline": args.baseline_tree} if args.baseline_tree else {})
    seconds: dict[str, float] = {name: float("inf") for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            seconds[name] = min(seconds[name], _convert_seconds(tree, source, args.workdir / "out"))
    for name, value in seconds.items():
        print(f"convert ({name}): {value:.2f} s, {total / value / 1e9:.3f} GB/s")
    if args.baseline_tree:
        print(f"this tree / baseline: {seconds['this tree'] / seconds['baseline']:.3f}")


if __name__ == "__main__":
    main()
