"""What the hostile-input checks cost a conversion (issue 16): measured, not assumed.

Input: bench/convert.py's synthetic Qwen3-30B-A3B-shaped checkpoint with ``--layers`` decoder
layers (default 1: ~2.5 GB bf16). Prints, each the best of ``--repeat`` runs:

* the non-finite count of every source tensor (``nonfinite_counts``: one aminmax pass), in GB/s;
* the config.json check (``source_problems``), in seconds;
* ``fp4convert convert`` end to end, in the same invocation, alternating, page cache warm:
  ``checked`` (this tree as shipped) against ``plain`` (this tree with the two data-dependent
  checks switched off in the child process: no non-finite count, no config.json check; the
  name, symlink, header, lock and stray-file checks stay, they cost microseconds), each with wall
  seconds, GB/s of source, user CPU seconds and peak RSS; then the overhead ``checked / plain - 1``;
* with ``--baseline-tree DIR`` (e.g. a checkout of an older main) that tree's fp4convert too.

    python bench/hostile_overhead.py [--layers 1] [--repeat 3] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the child process of a run: ``plain`` switches the data-dependent checks off, then runs the CLI
_CHILD = """
import json, resource, sys, time
mode, argv = sys.argv[1], json.loads(sys.argv[2])
if mode == "plain":
    import fp4convert.checkpoint.reader as reader
    import fp4convert.checkpoint.source as source
    reader.nonfinite_counts = lambda tensor: {}
    source.source_problems = lambda inventory: None
from fp4convert.cli import main
started = time.perf_counter()
try:
    main(argv)
except SystemExit as exc:
    if exc.code:
        raise
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "user_s": usage.ru_utime, "peak_rss_gb": usage.ru_maxrss / 2**20}))
"""


def _source(workdir: Path, layers: int) -> tuple[Path, int]:
    sys.path.insert(0, str(ROOT / "bench"))
    import convert as bench_convert  # bench/convert.py: the synthetic checkpoint

    bench_convert.LAYERS = layers
    source = workdir / f"source-{layers}"
    info = bench_convert.make_source(source)
    total = int(info["bytes"])  # type: ignore[call-overload]
    print(f"source: {source} ({info['tensors']} tensors, {total / 1e9:.2f} GB bf16)")
    bench_convert.warm(source)
    return source, total


def _convert(tree: Path, mode: str, source: Path, out: Path) -> dict[str, float]:
    """One ``fp4convert convert`` in a fresh process of ``tree``'s fp4convert (``mode``: checked / plain)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = ["convert", str(source), str(out), "-q"]
    argv += ["--contract", str(ROOT / "contracts" / "nvfp4-experts-per-token.yaml")]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, json.dumps(argv)], env=env, capture_output=True, text=True, cwd=tree
    )
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"convert ({mode}, {tree}) failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _check_costs(source: Path, total: int, repeat: int) -> None:
    import torch

    from fp4convert.checkpoint.consistency import source_problems
    from fp4convert.checkpoint.reader import nonfinite_counts
    from fp4convert.checkpoint.source import open_checkpoint

    ckpt = open_checkpoint(source)
    tensors = []
    for shard in ckpt.shards:
        with ckpt.open(shard) as f:
            tensors += [f.read(name) for name in f.entries]
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for t in tensors:
            nonfinite_counts(t)
        best = min(best, time.perf_counter() - started)
    threads = torch.get_num_threads()
    rate = total / best / 1e9
    print(f"non-finite count: {rate:.2f} GB/s ({best:.2f} s for {total / 1e9:.2f} GB, {threads} threads)")
    del tensors
    inventory = ckpt.inventory()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        assert not source_problems(inventory)
        best = min(best, time.perf_counter() - started)
    print(f"config.json check: {best * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench"))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None, help="a checkout whose fp4convert to compare")
    args = parser.parse_args()
    print(f"# python bench/hostile_overhead.py --layers {args.layers} --repeat {args.repeat}; {os.cpu_count()} CPUs")
    source, total = _source(args.workdir, args.layers)
    _check_costs(source, total, args.repeat)
    runs = [("checked", ROOT, "checked"), ("plain", ROOT, "plain")]
    if args.baseline_tree:
        runs.append(("baseline", args.baseline_tree, "checked"))
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):  # alternating, so drifting load hits every variant alike
        for name, tree, mode in runs:
            result = _convert(tree, mode, source, args.workdir / "out")
            if name not in best or result["wall_s"] < best[name]["wall_s"]:
                best[name] = result
    for name, _, _ in runs:
        r = best[name]
        print(
            f"convert ({name}): {r['wall_s']:.2f} s, {total / r['wall_s'] / 1e9:.3f} GB/s, "
            f"user {r['user_s']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB"
        )
    overhead = best["checked"]["wall_s"] / best["plain"]["wall_s"] - 1
    print(f"checks overhead (checked / plain - 1): {overhead * 100:+.1f}% wall")
    if args.baseline_tree:
        print(f"checked / baseline: {best['checked']['wall_s'] / best['baseline']['wall_s']:.3f}")


if __name__ == "__main__":
    main()
