"""End-to-end conversion benchmark against llm-compressor's model_free_ptq, in one run (issue 5).

Input: a synthetic checkpoint with Qwen3-30B-A3B's tensor names and per-tensor shapes, 4 decoder
layers (~6.2 GB bf16, 1575 tensors, 3 shards), generated from the shipped config.json by the
model family inventory (hub layout: one tensor per expert projection), N(0, 0.02) weights.

Each case runs as its own process (page cache warm) and is measured with wait4: wall time, user
CPU time and peak RSS. The peer runs in its own virtual environment (its pins clash with ours):

    python bench/convert.py --peer-python .venv-peer/bin/python [--device cpu|cuda] [--workdir DIR]

Cases: fp4convert NVFP4 experts-only (the recipe contract, ModelOpt dialect); fp4convert NVFP4 on
every decoder Linear (compressed-tensors, the same work the peer does); fp4convert MXFP8 on the
whole model (SGLang dialect); fp4convert with a 500 MB output shard limit (RSS must not grow with
shard size); the peer ``model_free_ptq(scheme="NVFP4A16", max_workers=2, device="cpu")``.
Targets: NVFP4 experts-only >= 10x faster than the peer end to end, peak RSS <= 2 GB.
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

import torch

from fp4convert.checkpoint.safetensors_io import StreamingWriter
from fp4convert.families import inventory_from_config, load_config

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 4
SHARDS = 3

ALL_LINEAR = """version: 1
name: nvfp4-all-decoder-linears
description: NVFP4 on every decoder Linear (attention and experts), the peer's NVFP4A16 workload.
formats: {nvfp4: {per_token_activations: true}}
rules: [{kind: glob, namespace: hf, pattern: "model.layers.*", format: nvfp4}]
default: bf16
bf16_exceptions: {routers: true, lm_head: true}
"""

PEER_SCRIPT = """
import sys, warnings
warnings.filterwarnings("ignore")
from llmcompressor import model_free_ptq
model_free_ptq(sys.argv[1], sys.argv[2], scheme="NVFP4A16",
               ignore=["lm_head", "re:.*mlp.gate$", "re:.*embed_tokens$"], max_workers=2, device="cpu")
"""


def make_source(directory: Path, layers: int = LAYERS) -> dict[str, object]:
    """Write the synthetic checkpoint (skipped if a complete one is already there)."""
    config = dict(load_config("Qwen3-30B-A3B"))
    config["num_hidden_layers"] = layers
    inventory = inventory_from_config(config)
    done = directory / "done"
    if done.is_file() and json.loads((directory / "config.json").read_text())["num_hidden_layers"] == layers:
        return {"tensors": len(inventory), "bytes": sum(t.numel for t in inventory) * 2}
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    total = sum(t.numel for t in inventory) * 2
    per_shard, shards, current, size = total / SHARDS, [[]], 0, 0
    for t in inventory:
        if size >= per_shard * (current + 1) and current < SHARDS - 1:
            shards.append([])
            current += 1
        shards[-1].append(t)
        size += t.numel * 2
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    for n, tensors in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        writer = StreamingWriter(directory / name, [(t.name, "BF16", t.shape) for t in tensors], {"format": "pt"})
        for t in tensors:
            draw = torch.randn(t.shape, generator=generator) * 0.02 if t.role.value != "norm" else torch.ones(t.shape)
            writer.write(t.name, draw.to(torch.bfloat16))
            weight_map[t.name] = name
        writer.close()
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "done").write_text("ok")
    return {"tensors": len(inventory), "bytes": total}


def warm(directory: Path) -> None:
    for path in directory.glob("*.safetensors"):
        with path.open("rb") as f:
            while f.read(1 << 24):
                pass


def measure(command: list[str]) -> dict[str, float]:
    """Run ``command``; wall seconds, user CPU seconds and peak RSS (GB) of the child process.

    Called in a fresh helper process (:func:`run_child`) so RUSAGE_CHILDREN covers this command alone.
    """
    import resource

    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "user_s": usage.ru_utime, "peak_rss_gb": usage.ru_maxrss / 2**20}


def run_child(command: list[str]) -> dict[str, float]:
    """Measure ``command`` in a fresh helper process so RUSAGE_CHILDREN covers that command alone."""
    helper = [sys.executable, __file__, "--measure-one", json.dumps(command)]
    return json.loads(subprocess.run(helper, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def gate_up_mismatches(directory: Path, global_key: str) -> tuple[int, int]:
    """Experts whose gate_proj and up_proj carry different global scales (engines mis-load them)."""
    from safetensors import safe_open

    scales: dict[str, float] = {}
    for path in directory.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                if name.endswith(f".{global_key}") and ".experts." in name:
                    scales[name] = f.get_tensor(name).item()
    pairs = [(n, n.replace("gate_proj", "up_proj")) for n in scales if ".gate_proj." in n]
    return sum(scales[g] != scales[u] for g, u in pairs), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench"))
    parser.add_argument("--peer-python", default=None, help="python of a venv with llmcompressor installed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--only", default=None, help="run only cases whose name contains this text")
    parser.add_argument("--measure-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure(json.loads(args.measure_one))))
        return
    src = args.workdir / "source"
    info = make_source(src)
    gigabytes = info["bytes"] / 1e9
    (args.workdir / "all-linear.yaml").write_text(ALL_LINEAR)
    exe = [sys.executable, "-m", "fp4convert.cli"]
    cases = {
        "fp4convert nvfp4 experts-only (modelopt)": [
            *exe,
            "convert",
            str(src),
            "{out}",
            "--contract",
            str(ROOT / "contracts/nvfp4-experts-per-token.yaml"),
            "--dialect",
            "modelopt",
            "--device",
            args.device,
        ],
        "fp4convert nvfp4 all decoder linears (compressed-tensors)": [
            *exe,
            "convert",
            str(src),
            "{out}",
            "--contract",
            str(args.workdir / "all-linear.yaml"),
            "--dialect",
            "compressed-tensors",
            "--device",
            args.device,
        ],
        "fp4convert mxfp8 whole model (sglang-mxfp8)": [
            *exe,
            "convert",
            str(src),
            "{out}",
            "--contract",
            str(ROOT / "contracts/mxfp8-end-to-end.yaml"),
            "--dialect",
            "sglang-mxfp8",
            "--device",
            args.device,
        ],
        "fp4convert nvfp4 experts-only, 500MB shards": [
            *exe,
            "convert",
            str(src),
            "{out}",
            "--contract",
            str(ROOT / "contracts/nvfp4-experts-per-token.yaml"),
            "--max-shard-size",
            "500MB",
            "--device",
            args.device,
        ],
    }
    if args.peer_python and not args.skip_peer:
        script = args.workdir / "peer.py"
        script.write_text(PEER_SCRIPT)
        cases["llm-compressor model_free_ptq NVFP4A16 (peer)"] = [args.peer_python, str(script), str(src), "{out}"]
    if args.only:
        cases = {k: v for k, v in cases.items() if args.only in k or "peer" in k}
    print(
        f"input: {info['tensors']} tensors, {gigabytes:.2f} GB bf16, {SHARDS} shards; "
        f"{os.cpu_count()} CPUs; device {args.device}",
        flush=True,
    )
    results = {}
    for name, command in cases.items():
        out = args.workdir / ("out-" + "".join(c if c.isalnum() else "-" for c in name))
        shutil.rmtree(out, ignore_errors=True)
        warm(src)
        results[name] = run_child([part.replace("{out}", str(out)) for part in command])
        results[name]["out"] = str(out)
        print(f"  {name}: {results[name]['wall_s']:.1f} s", flush=True)
    peer = next((r for n, r in results.items() if "peer" in n), None)
    print(f"\n{'case':58} {'wall s':>8} {'user s':>8} {'GB/s':>7} {'peak RSS GB':>12} {'vs peer':>8}")
    for name, r in results.items():
        speedup = f"{peer['wall_s'] / r['wall_s']:.1f}x" if peer else "-"
        print(
            f"{name:58} {r['wall_s']:8.1f} {r['user_s']:8.1f} {gigabytes / r['wall_s']:7.3f} "
            f"{r['peak_rss_gb']:12.2f} {speedup:>8}"
        )
    ours = Path(results["fp4convert nvfp4 experts-only (modelopt)"]["out"])
    bad, pairs = gate_up_mismatches(ours, "weight_scale_2")
    print(f"\ngate/up pairs with different global scales: fp4convert {bad}/{pairs}", end="")
    if peer:
        bad, pairs = gate_up_mismatches(Path(peer["out"]), "weight_global_scale")
        print(f", peer {bad}/{pairs}")
    else:
        print()


if __name__ == "__main__":
    main()
