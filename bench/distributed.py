"""Conversion throughput in one process (threads) and across torchrun ranks, on one machine (issue 13).

Input: the synthetic Qwen3-30B-A3B-shaped checkpoint of bench/convert.py (4 decoder layers, ~6.2 GB
bf16, 1575 tensors, 3 shards; drawn on the GPU when there is one, bench/multi_gpu.py), converted
under the NVFP4 experts-only contract (ModelOpt dialect) into output shards of at most 500 MB
(the same in every case; 6 shards, so 2 and 4 ranks get balanced shares).

Cases, each a fresh process tree with the page cache warm, measured with wait4 (wall, user CPU,
peak RSS of the largest process) and by the converter itself (``seconds`` of ``--json``: from the
plan to the published output, without interpreter start-up):

* 1 process, every core (the default): the reference;
* 1 process, ``--workers 1`` (one quantizing thread; the per-file hash and read threads still run);
* P CPU processes under ``torchrun --standalone --nproc-per-node P`` (``--procs``, each rank gets
  the cores divided by P);
* with ``cuda`` in ``--devices``: 1 process on one GPU, ``torchrun`` with one rank per GPU there is,
  and the ``--procs`` counts above it (ranks then share the GPUs);
* the hardware limits it works against, measured first (``--no-probe`` skips): sha256 on one
  core, one core's NVFP4 quantization of expert-sized tensors, one thread's read of the warm
  source, and writing 1 GB to the work directory with fsync;
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
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert import ROOT, make_source, warm  # bench/convert.py, beside this file
from multi_gpu import NO_MULTICAST
from multi_gpu import make_source as draw_source  # the same checkpoint, drawn on a GPU

CONTRACT = ROOT / "contracts/nvfp4-experts-per-token.yaml"
DEEPSEEK_V3_BYTES = 1.342e12  # 671B parameters in BF16
DEEPSEEK_V3_FP8_BYTES = 0.689e12  # the published FP8 checkpoint (read, then decoded to BF16)


#: output shards of at most this size in every case: 6 shards of the 2.8 GB output, so 2 and 4 ranks
#: get balanced shares (mirroring the 3 source shards would leave a 4th rank idle)
MAX_SHARD_SIZE = "500MB"


def command(src: Path, out: Path, *, procs: int, device: str, workers: int | None, launcher: bool) -> list[str]:
    args = ["convert", str(src), str(out), "--contract", str(CONTRACT), "--device", device, "--json", "--quiet"]
    args += ["--max-shard-size", MAX_SHARD_SIZE]
    if workers is not None:
        args += ["--workers", str(workers)]
    if not launcher:
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
            "convert_s": report["seconds"], "output_bytes": report["output_bytes"],
            "ranks": report["ranks"]}  # fmt: skip


def same_output(one: Path, other: Path, *, also_differs: tuple[str, ...] = ()) -> bool:
    """Every file byte for byte; the manifest but its ``created`` (and ``also_differs``: ``device``
    between a CPU and a GPU run)."""
    names = sorted(p.name for p in one.iterdir())
    if names != sorted(p.name for p in other.iterdir()):
        return False
    for name in names:
        if name == "fp4convert.json":
            a, b = (json.loads((d / name).read_text()) for d in (one, other))
            for key in ("created", *also_differs):
                a.pop(key), b.pop(key)
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


def probe(src: Path, workdir: Path) -> dict[str, float]:
    """GB/s of the steps every byte goes through, each on one core / thread (see the module docstring)."""
    from fp4convert.formats import quantize_nvfp4

    def rate(nbytes: int, fn: Any, repeat: int = 3) -> float:
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - started)
        return nbytes / best / 1e9

    data = os.urandom(256 << 20)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    x = (torch.randn(16 * 768, 2048) * 0.02).to(torch.bfloat16)  # 16 experts' gate_proj, one tensor each
    experts = list(x.split(768))
    quantize = rate(x.numel() * 2, lambda: [quantize_nvfp4(e) for e in experts])
    torch.set_num_threads(previous)
    shard = max(src.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    chunk = bytearray(16 << 20)

    def read() -> None:
        with shard.open("rb", buffering=0) as f:
            while f.readinto(chunk):
                pass

    target = workdir / "probe-write.bin"

    def write() -> None:
        with target.open("wb", buffering=0) as f:
            for _ in range(64):
                f.write(chunk)
            os.fsync(f.fileno())

    figures = {
        "sha256_gbps": rate(len(data), lambda: hashlib.sha256(data).digest()),
        "nvfp4_quantize_gbps": quantize,
        "read_warm_gbps": rate(shard.stat().st_size, read, repeat=1),
        "write_fsync_gbps": rate(64 * len(chunk), write, repeat=2),
    }
    target.unlink()
    return figures


def estimate(results: dict[str, dict[str, Any]], storage_gbps: float) -> None:
    """DeepSeek-V3 on N nodes of 8 GPUs (8 ranks a node), from the per-rank throughput measured here.

    T(N) = max(B / (8 N r), (R + w B) / S) + t0: B the BF16 bytes converted, R the bytes read from
    storage (B for a BF16 source, about B/2 for the FP8 one), w B the bytes written (w measured:
    output / source), r the per-rank throughput (each rank's source bytes over its shard phase,
    the slowest rank of the case with one rank per GPU, or with the most CPU ranks when there is no
    GPU), S the storage bandwidth, t0 the fixed start and finish (measured: wall minus the slowest
    rank's shard phase: launcher, imports, plan, agreement, index/manifest, verify, publish).
    """
    rates = {
        n: min(f["source_bytes"] / 1e9 / f["seconds"] for f in r["ranks"] if f["files"]) for n, r in results.items()
    }
    gpu = [n for n in results if "1 rank per GPU" in n]
    cpu = [n for n in results if ", cpu" in n and "--workers" not in n and "cold" not in n]
    basis = gpu[0] if gpu else max(cpu, key=lambda n: (results[n]["procs"], -rates[n]))
    r_rank = rates[basis]
    source = sum(f["source_bytes"] for f in results[basis]["ranks"])
    w = results[basis]["output_bytes"] / source
    t0 = results[basis]["wall_s"] - max(f["seconds"] for f in results[basis]["ranks"])
    print(f"\nper-rank throughput (slowest rank): {', '.join(f'{n}: {v:.2f} GB/s' for n, v in rates.items())}")
    print(f"estimate from '{basis}': r = {r_rank:.2f} GB/s per rank, S = {storage_gbps:.0f} GB/s, w = {w:.2f}, "
          f"t0 = {t0:.0f} s")  # fmt: skip
    estimate_table(r_rank, w, t0, storage_gbps)


def estimate_table(r_rank: float, w: float, t0: float, storage_gbps: float) -> None:
    """The table of :func:`estimate` for given figures (``--estimate R,W,T0`` prints it alone)."""
    print(f"{'nodes x 8 ranks':>16} {'BF16 source (min)':>18} {'FP8 source (min)':>17} {'bound':>8}")
    for nodes in (1, 2, 4, 8, 16, 32):
        compute = DEEPSEEK_V3_BYTES / 1e9 / (8 * nodes * r_rank)
        times = [max(compute, (read + w * DEEPSEEK_V3_BYTES) / 1e9 / storage_gbps) + t0
                 for read in (DEEPSEEK_V3_BYTES, DEEPSEEK_V3_FP8_BYTES)]  # fmt: skip
        bound = "ranks" if compute + t0 >= times[0] else "storage"
        print(f"{nodes:>16} {times[0] / 60:18.1f} {times[1] / 60:17.1f} {bound:>8}")


#: (name, processes, device, --workers, under torchrun)
Case = tuple[str, int, str, int | None, bool]


def build_cases(args: argparse.Namespace, gpus: int) -> list[Case]:
    procs = [int(p) for p in args.procs.split(",")]
    cases: list[Case] = [("1 process, cpu", 1, "cpu", None, False)]  # the reference
    cores = len(os.sched_getaffinity(0))
    if torch.get_num_threads() < cores:  # torch counts physical cores: also every logical one
        cases.append((f"1 process, cpu, --workers {cores}", 1, "cpu", cores, False))
    if not args.no_single_thread:
        cases.append(("1 process, cpu, --workers 1", 1, "cpu", 1, False))
    if "cpu" in args.devices.split(","):
        cases += [(f"{p} processes, cpu", p, "cpu", None, True) for p in procs if p > 1]
    if gpus:
        cases.append(("1 process, cuda", 1, "cuda", None, False))  # the reference of the cuda runs
        cases.append((f"torchrun, 1 rank per GPU ({gpus}), cuda", gpus, "cuda", None, True))
        shared = [int(p) for p in args.cuda_procs.split(",") if p] if args.cuda_procs is not None else procs
        cases += [(f"{p} processes on {gpus} GPU(s), cuda", p, "cuda", None, True) for p in shared if p > gpus]
    return cases


def run_cases(args: argparse.Namespace, src: Path, cases: list[Case]) -> dict[str, dict[str, Any]]:
    """Run every case; each output compared with its device's 1-process output (that one with the CPU's)."""
    results: dict[str, dict[str, Any]] = {}
    references: dict[str, Path] = {}
    for name, p, device, workers, launcher in cases:
        out = args.workdir / ("out-" + "".join(c if c.isalnum() else "-" for c in name))
        shutil.rmtree(out, ignore_errors=True)
        warm(src)
        r = run_case(command(src, out, procs=p, device=device, workers=workers, launcher=launcher))
        r["procs"] = p
        if p == 1 and workers is None and device not in references:
            references[device], r["reference"] = out, device == "cpu"
        ref = references.get(device, references["cpu"])
        if ref == out:
            ref = references["cpu"]  # the first GPU output against the CPU's: all but the recorded device
        across = ("device",) if ref == references["cpu"] and device != "cpu" else ()
        r["identical"] = ref != out and same_output(ref, out, also_differs=across)
        results[name] = r
        print(f"  {name}: {r['wall_s']:.1f} s", flush=True)
        if out not in references.values() and r["identical"]:
            shutil.rmtree(out)  # keep the disk: only the reference outputs are needed further
    if args.cold:
        if drop_page_cache():
            read = cold_read_gbps(src)
            drop_page_cache()
            out = args.workdir / "out-cold"
            shutil.rmtree(out, ignore_errors=True)
            r = run_case(command(src, out, procs=1, device="cpu", workers=None, launcher=False))
            r["procs"], r["identical"] = 1, same_output(references["cpu"], out)
            results[f"1 process, cpu, cold cache (storage reads {read:.2f} GB/s)"] = r
            shutil.rmtree(out)
        else:
            print("  cold cache: skipped (dropping the page cache needs root)")
    return results


def print_tables(results: dict[str, dict[str, Any]], gigabytes: float) -> None:
    print(f"\n{'case':52} {'wall s':>7} {'convert s':>9} {'GB/s':>6} {'user s':>7} {'RSS GB':>7} {'identical':>9}")
    for name, r in results.items():
        same = "ref" if r.get("reference") else ("yes" if r["identical"] else "NO")
        print(f"{name:52} {r['wall_s']:7.1f} {r['convert_s']:9.2f} {gigabytes / r['convert_s']:6.2f} "
              f"{r['user_s']:7.1f} {r['peak_rss_gb']:7.2f} {same:>9}")  # fmt: skip
    print(
        "(identical: every file byte for byte with the 1-process output of the same device, the manifest but its\n"
        " created time; the 1-process cuda output with the cpu one, the manifest also but its recorded device)"
    )
    print(f"\n{'case':52} {'rank':>4} {'threads':>7} {'shards':>6} {'source GB':>9} {'seconds':>8} {'GB/s':>6}")
    for name, r in results.items():
        for f in r["ranks"]:
            print(f"{name:52} {f['rank']:4} {f['workers']:7} {f['files']:6} {f['source_bytes'] / 1e9:9.2f} "
                  f"{f['seconds']:8.2f} {f['source_bytes'] / 1e9 / max(f['seconds'], 1e-9):6.2f}")  # fmt: skip


def main() -> None:
    for key in NO_MULTICAST:  # NVLink multicast stays off in every process started from here
        os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench"))
    parser.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda")
    parser.add_argument("--procs", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--cuda-procs", default=None, help="cuda ranks sharing the GPUs (default: --procs)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the synthetic source")
    parser.add_argument("--cold", action="store_true", help="also a cold-cache run (needs root)")
    parser.add_argument("--storage-gbps", type=float, default=20.0, help="aggregate storage read bandwidth")
    parser.add_argument("--no-probe", action="store_true", help="skip measuring the hardware limits")
    parser.add_argument("--no-single-thread", action="store_true", help="skip the --workers 1 case")
    parser.add_argument("--estimate", default=None, help="R,W,T0: print the DeepSeek-V3 table for these figures")
    parser.add_argument("--measure-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_with_report(json.loads(args.measure_one))))
        return
    if args.estimate:
        r_rank, w, t0 = (float(v) for v in args.estimate.split(","))
        print(f"r = {r_rank:.2f} GB/s per rank, S = {args.storage_gbps:.0f} GB/s, w = {w:.2f}, t0 = {t0:.0f} s")
        estimate_table(r_rank, w, t0, args.storage_gbps)
        return
    src = args.workdir / "source"
    started = time.perf_counter()
    gpus = torch.cuda.device_count() if "cuda" in args.devices.split(",") and torch.cuda.is_available() else 0
    info = draw_source(src, args.layers, "cuda", shards=3) if gpus else make_source(src, layers=args.layers)
    gigabytes = info["bytes"] / 1e9
    cores = len(os.sched_getaffinity(0))
    print(f"input: {info['tensors']} tensors, {gigabytes:.2f} GB bf16; {cores} cores (torch threads "
          f"{torch.get_num_threads()}), {gpus} GPUs; source ready in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    if not args.no_probe:
        warm(src)
        limits = probe(src, args.workdir)
        print("one core / thread: " + ", ".join(f"{k.removesuffix('_gbps')} {v:.2f} GB/s" for k, v in limits.items()))
    results = run_cases(args, src, build_cases(args, gpus))
    print_tables(results, gigabytes)
    estimate(results, args.storage_gbps)
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
