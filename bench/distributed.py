"""Conversion throughput in one process (threads) and across torchrun ranks, on one machine (issue 13).

Input: bench/convert.py's synthetic Qwen3-30B-A3B-shaped checkpoint (4 decoder layers, ~6.2 GB
bf16, 1575 tensors, 3 shards), converted under the NVFP4 experts-only contract (ModelOpt dialect).

Cases, each a fresh process tree with the page cache warm, measured with wait4 (wall, user CPU,
peak RSS of the largest process) and by the converter itself (``seconds`` of ``--json``: from the
plan to the published output, without interpreter start-up):

* 1 process, ``--workers 1`` (one quantizing thread; the per-file hash and read threads still run);
* 1 process, every core (the default);
* P processes under ``torchrun --standalone --nproc-per-node P`` (P = 2, 4: each rank gets the
  cores divided by P), for each device in ``--devices`` (``cuda`` ranks share the GPUs there are);
* optionally ``--cold``: the 1-process case after dropping the page cache (root only), next to the
  storage's own cold sequential read of the same files: how close the conversion is to I/O bound.

Every multi-process output is compared with the 1-process output: every file byte for byte, the
manifest but for its creation time. The last table estimates DeepSeek-V3 (671B parameters, 1.34 TB
in BF16) on N nodes of 8 GPUs from the measured per-rank throughput and a stated storage bandwidth
(``--storage-gbps``): see README "Benchmarks" for the formula.

    python bench/distributed.py [--devices cpu,cuda] [--procs 1,2,4] [--cold] [--workdir DIR]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import ROOT, make_source, warm  # bench/convert.py, beside this file

CONTRACT = ROOT / "contracts/nvfp4-experts-per-token.yaml"
DEEPSEEK_V3_BYTES = 1.342e12  # 671B parameters in BF16
DEEPSEEK_V3_FP8_BYTES = 0.689e12  # the published FP8 checkpoint (read, then decoded to BF16)


def command(src: Path, out: Path, *, procs: int, device: str, workers: int | None) -> list[str]:
    args = ["convert", str(src), str(out), "--contract", str(CONTRACT), "--device", device, "--json", "--quiet"]
    if workers is not None:
        args += ["--workers", str(workers)]
    if procs == 1:
        return [sys.executable, "-m", "fp4convert", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", "-m",
            "fp4convert", *args]  # fmt: skip


def run_case(cmd: list[str]) -> dict[str, float]:
    """Measure ``cmd`` in a fresh helper process (RUSAGE_CHILDREN then covers this command alone)."""
    helper = [sys.executable, __file__, "--measure-one", json.dumps(cmd)]
    done = subprocess.run(helper, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def measure_with_report(cmd: list[str]) -> dict[str, float]:
    import resource

    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:6]} failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
    text = done.stdout.decode()
    report = json.loads(text[text.index("{") :])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "user_s": usage.ru_utime, "peak_rss_gb": usage.ru_maxrss / 2**20,
            "convert_s": report["seconds"], "output_bytes": report["output_bytes"]}  # fmt: skip


def same_output(one: Path, other: Path) -> bool:
    names = sorted(p.name for p in one.iterdir())
    if names != sorted(p.name for p in other.iterdir()):
        return False
    for name in names:
        if name == "fp4convert.json":
            a, b = (json.loads((d / name).read_text()) for d in (one, other))
            a.pop("created"), b.pop("created")
            if a != b:
                return False
        elif subprocess.run(["cmp", "-s", str(one / name), str(other / name)]).returncode != 0:
            return False
    return True


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def cold_read_gbps(src: Path) -> float:
    files = sorted(src.glob("*.safetensors"))
    start = time.perf_counter()
    total = 0
    for path in files:
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total / 1e9 / (time.perf_counter() - start)


def estimate(results: dict[str, dict[str, float]], gigabytes: float, storage_gbps: float) -> None:
    """DeepSeek-V3 on N nodes of 8 GPUs (8 ranks a node), from the per-rank throughput measured here.

    T(N) = max(B / (8 N r), (R + w B) / S) + t0: B the BF16 bytes converted, R the bytes read from
    storage (B for a BF16 source, about B/2 for the FP8 one), w B the bytes written (w measured:
    output / source), r the per-rank throughput, S the storage bandwidth, t0 the fixed start and
    finish (measured: wall minus conversion time).
    """
    ranked = {n: r for n, r in results.items() if "--workers" not in n and "cold" not in n}
    per_rank = {n: gigabytes / r["convert_s"] / r["procs"] for n, r in ranked.items()}
    most = max(r["procs"] for r in ranked.values())
    # The most ranks on this machine, each with the fewest cores: the conservative per-rank figure.
    r_rank = min(v for n, v in per_rank.items() if ranked[n]["procs"] == most)
    w = max(r["output_bytes"] for r in ranked.values()) / (gigabytes * 1e9)
    t0 = max(r["wall_s"] - r["convert_s"] for r in ranked.values())
    print(f"\nper-rank throughput: {', '.join(f'{n}: {v:.2f} GB/s' for n, v in per_rank.items())}")
    print(f"estimate: r = {r_rank:.2f} GB/s per rank ({most} ranks on {len(os.sched_getaffinity(0))} cores), "
          f"S = {storage_gbps:.0f} GB/s, w = {w:.2f}, t0 = {t0:.0f} s")  # fmt: skip
    print(f"{'nodes x 8 ranks':>16} {'BF16 source (min)':>18} {'FP8 source (min)':>17} {'bound':>8}")
    for nodes in (1, 2, 4, 8, 16, 32):
        compute = DEEPSEEK_V3_BYTES / 1e9 / (8 * nodes * r_rank)
        times = [max(compute, (read + w * DEEPSEEK_V3_BYTES) / 1e9 / storage_gbps) + t0
                 for read in (DEEPSEEK_V3_BYTES, DEEPSEEK_V3_FP8_BYTES)]  # fmt: skip
        bound = "ranks" if compute + t0 >= times[0] else "storage"
        print(f"{nodes:>16} {times[0] / 60:18.1f} {times[1] / 60:17.1f} {bound:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench"))
    parser.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda")
    parser.add_argument("--procs", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the synthetic source")
    parser.add_argument("--cold", action="store_true", help="also a cold-cache run (needs root)")
    parser.add_argument("--storage-gbps", type=float, default=20.0, help="aggregate storage read bandwidth")
    parser.add_argument("--measure-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_with_report(json.loads(args.measure_one))))
        return
    src = args.workdir / "source"
    started = time.perf_counter()
    info = make_source(src, layers=args.layers)
    gigabytes = info["bytes"] / 1e9
    cores = len(os.sched_getaffinity(0))
    print(f"input: {info['tensors']} tensors, {gigabytes:.2f} GB bf16; {cores} cores; source ready in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    procs = [int(p) for p in args.procs.split(",")]
    cases: list[tuple[str, int, str, int | None]] = [("1 process, cpu", 1, "cpu", None)]  # the reference
    cases.append(("1 process, --workers 1", 1, "cpu", 1))
    for device in args.devices.split(","):
        cases += [(f"{p} process{'es' if p > 1 else ''}, {device}", p, device, None) for p in procs]
    cases = list(dict.fromkeys(cases))  # the reference once
    results: dict[str, dict[str, float]] = {}
    reference: Path | None = None
    for name, p, device, workers in cases:
        out = args.workdir / ("out-" + "".join(c if c.isalnum() else "-" for c in name))
        shutil.rmtree(out, ignore_errors=True)
        warm(src)
        r = run_case(command(src, out, procs=p, device=device, workers=workers))
        r["procs"] = p
        if p == 1 and device == "cpu" and workers is None:
            reference, r["reference"] = out, True
        r["identical"] = reference is not None and out != reference and same_output(reference, out)
        results[name] = r
        print(f"  {name}: {r['wall_s']:.1f} s", flush=True)
        if out != reference and r["identical"]:
            shutil.rmtree(out)  # keep the disk: only the reference output is needed further
    if args.cold:
        if drop_page_cache():
            read = cold_read_gbps(src)
            drop_page_cache()
            out = args.workdir / "out-cold"
            shutil.rmtree(out, ignore_errors=True)
            r = run_case(command(src, out, procs=1, device="cpu", workers=None))
            r["procs"], r["identical"] = 1, reference is not None and same_output(reference, out)
            results[f"1 process, cpu, cold cache (storage reads {read:.2f} GB/s)"] = r
            shutil.rmtree(out)
        else:
            print("  cold cache: skipped (dropping the page cache needs root)")

    print(f"\n{'case':52} {'wall s':>7} {'convert s':>9} {'GB/s':>6} {'user s':>7} {'RSS GB':>7} {'== 1 proc':>9}")
    for name, r in results.items():
        same = "ref" if r.get("reference") else ("yes" if r["identical"] else "NO")
        print(f"{name:52} {r['wall_s']:7.1f} {r['convert_s']:9.2f} {gigabytes / r['convert_s']:6.2f} "
              f"{r['user_s']:7.1f} {r['peak_rss_gb']:7.2f} {same:>9}")  # fmt: skip
    estimate(results, gigabytes, args.storage_gbps)
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
