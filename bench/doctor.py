"""``fp4convert doctor`` on the 4-layer Qwen3-30B-A3B-shaped converted checkpoint: time and peak RSS.

Input: bench/convert.py's synthetic source (Qwen3-30B-A3B names and per-tensor shapes, 4 decoder
layers, ~6.2 GB bf16, 3 shards), converted once under ``nvfp4-experts-per-token`` to the ModelOpt
dialect (512 NVFP4 expert projections, everything else BF16). Each doctor run is its own process,
measured with wait4 (wall time, user CPU, peak RSS), page cache warm:

    python bench/doctor.py [--workdir DIR] [--device cpu|cuda]

Cases: the interpreter and import cost alone (``--version``), headers only (no tensor data), full
(every global, activation and block scale; never the packed data), and full judged for one
engine. The converted checkpoint must come out healthy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import make_source, warm

ROOT = Path(__file__).resolve().parents[1]


def measure(command: list[str]) -> dict[str, object]:
    """Run ``command`` (in a fresh helper process: RUSAGE_CHILDREN is this command alone)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{command[:5]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {
        "wall_s": wall,
        "user_s": usage.ru_utime,
        "peak_rss_gb": usage.ru_maxrss / 2**20,
        "rc": done.returncode,
        "stdout": done.stdout,
    }


def run_child(command: list[str]) -> dict[str, object]:
    helper = [sys.executable, __file__, "--measure-one", json.dumps(command)]
    out = subprocess.run(helper, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench-doctor"))
    parser.add_argument("--device", default="cpu", help="device of the one-time conversion")
    parser.add_argument("--measure-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure(json.loads(args.measure_one))))
        return
    src = args.workdir / "source"
    info = make_source(src)
    out = args.workdir / "nvfp4-experts-modelopt"
    exe = [sys.executable, "-m", "fp4convert.cli"]
    if not (out / "fp4convert.json").is_file():
        contract = str(ROOT / "contracts/nvfp4-experts-per-token.yaml")
        converted = run_child(
            [
                *exe,
                "convert",
                str(src),
                str(out),
                "--contract",
                contract,
                "--device",
                args.device,
                "--overwrite",
                "--quiet",
            ]
        )
        print(f"converted in {converted['wall_s']:.1f} s (peak RSS {converted['peak_rss_gb']:.2f} GB)", flush=True)
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(
        f"input: {info['tensors']} source tensors, converted checkpoint {size / 1e9:.2f} GB in "
        f"{len(list(out.glob('*.safetensors')))} shards; {os.cpu_count()} CPUs",
        flush=True,
    )
    cases = {
        "startup only (--version)": [*exe, "--version"],
        "doctor --headers-only": [*exe, "doctor", str(out), "--headers-only", "--json"],
        "doctor (full)": [*exe, "doctor", str(out), "--json"],
        "doctor --engine vllm (full)": [*exe, "doctor", str(out), "--engine", "vllm", "--json"],
    }
    print(f"\n{'case':30} {'wall s':>8} {'user s':>8} {'peak RSS GB':>12} {'MiB read':>9} {'findings':>9} {'rc':>3}")
    for name, command in cases.items():
        warm(out)
        result = run_child(command)
        if "--version" in command:
            print(f"{name:30} {result['wall_s']:8.2f} {result['user_s']:8.2f} {result['peak_rss_gb']:12.3f}")
            continue
        report = json.loads(str(result["stdout"]))
        print(
            f"{name:30} {result['wall_s']:8.2f} {result['user_s']:8.2f} {result['peak_rss_gb']:12.3f} "
            f"{report['bytes_read'] / 2**20:9.1f} {len(report['findings']):9d} {result['rc']:3}",
            flush=True,
        )
        if report["findings"]:
            raise SystemExit(f"the converted checkpoint is not healthy: {report['findings'][0]}")


if __name__ == "__main__":
    main()
