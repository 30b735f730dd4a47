"""Distributed conversion and live export on the GPUs of one machine, every figure in one command (issue 14).

    python bench/multi_gpu.py [--gpus G] [--layers 16] [--export-layers 48] [--ep-ranks S]
        [--syncs 2] [--workdir DIR] [--out DIR] [--skip-convert] [--skip-export]

Part 1, convert (``--layers`` decoder layers, default 16, of Qwen3-30B-A3B's tensors, generated
here on the GPU and written as HF shards of ``--shard-gb``; the NVFP4 experts-only contract,
ModelOpt dialect, ``--device cuda``):

* ``python -m fp4convert convert`` in one process on one GPU: the reference;
* ``torchrun --standalone --nproc-per-node G -m fp4convert convert``: one rank per GPU (NCCL);
* each: wall time (the command, launcher included), the converter's own seconds and GB/s of
  source, and the per-rank figures of the report (``ranks``: shards, source bytes, seconds);
* the sha256 of every file of both outputs, compared (the manifest's ``created`` timestamp left
  out: it is the only field that differs between any two runs; docs/distributed.md).

Part 2, live export with expert parallelism EP = S (``--export-layers``, default all 48 layers of
Qwen3-30B-A3B, random BF16 masters built on the GPU, deterministic per layer):

* the single-process export (``export_hf`` with EP 1 of the whole model) and its ``validate_export``:
  the reference, timed;
* every EP rank r of S: its master as Megatron holds it (dense tensors, its own experts under local
  ids), ``export_hf(ep_rank=r, ep_size=S)`` + ``validate_export`` per weight sync (``--syncs``:
  the first builds the validator's plan, the others are what every later sync costs), and its
  export compared tensor by tensor (bytes) with the matching slice of the single-process export
  (the dense tensors and its experts' tensors, nothing else).
* With G GPUs, S = G: one process per GPU, all ranks start each sync together (a barrier); the
  total per sync is from the first start to the last end. With one GPU, the S ranks (default 4)
  run one after another on it: per-rank times, their sum, and their maximum (the total if each had
  its own GPU) are printed, labelled as such.

Raw figures go to ``--out`` (JSON per part); every equality is printed as ``identical: yes/NO``
and the script exits 1 if any is NO.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.safetensors_io import StreamingWriter
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "contracts/nvfp4-experts-per-token.yaml"
FAMILY = "qwen3_moe"
#: NVLink multicast off in NCCL, PyTorch and NVSHMEM (the device machines require it)
NO_MULTICAST = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")


#: the model whose shapes are used (``--config`` replaces it, e.g. a tiny one for a CPU smoke run)
DEFAULT_MODEL = MODEL = "Qwen3-30B-A3B"


def qwen3_config(layers: int) -> dict[str, Any]:
    config = dict(load_config(MODEL))
    config["num_hidden_layers"] = layers
    return config


def _draw(shape: tuple[int, ...], generator: torch.Generator, device: str, norm: bool) -> torch.Tensor:
    if norm:
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    return (torch.randn(shape, generator=generator, device=device) * 0.02).to(torch.bfloat16)


# -- part 1: convert --------------------------------------------------------------------------------


def make_source(directory: Path, layers: int, device: str, *, shard_bytes: int = 0, shards: int = 0) -> dict[str, Any]:
    """A Qwen3-30B-A3B-shaped HF checkpoint of ``layers`` layers in shards of about ``shard_bytes``
    (or in ``shards`` shards), kept if a complete one of the same shape is there. N(0, 0.02) BF16
    values (norms 1) are drawn on ``device``: a GPU draws 25 GB in seconds, one CPU core 0.1-0.3 GB/s."""
    config = qwen3_config(layers)
    inventory = list(inventory_from_config(config))
    total = sum(t.numel for t in inventory) * 2
    shard_bytes = shard_bytes or -(-total // max(1, shards))
    stamp = {"model": MODEL, "layers": layers, "shard_bytes": shard_bytes}
    done = directory / "done.json"
    if done.is_file() and json.loads(done.read_text()) == stamp:
        return {"tensors": len(inventory), "bytes": total, "files": len(list(directory.glob("*.safetensors")))}
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    shards: list[list[Any]] = [[]]
    size = 0
    for t in inventory:
        if size >= shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.numel * 2
    names = [f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors" for n in range(len(shards))]

    def write(n: int) -> None:
        generator = torch.Generator(device=device).manual_seed(n)
        writer = StreamingWriter(
            directory / names[n], [(t.name, "BF16", t.shape) for t in shards[n]], {"format": "pt"}
        )
        for t in shards[n]:
            writer.write(t.name, _draw(t.shape, generator, device, t.role.value == "norm").cpu())
        writer.close()

    with ThreadPoolExecutor(min(8, len(shards))) as pool:
        list(pool.map(write, range(len(shards))))
    weight_map = {t.name: names[n] for n, tensors in enumerate(shards) for t in tensors}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    done.write_text(json.dumps(stamp))
    return {"tensors": len(inventory), "bytes": total, "files": len(shards)}


def warm(directory: Path) -> None:
    """Read every shard once so the conversions start with the page cache warm."""

    def read(path: Path) -> None:
        with path.open("rb", buffering=0) as f:
            while f.read(1 << 24):
                pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(read, sorted(directory.glob("*.safetensors"))))


def convert_command(src: Path, out: Path, ranks: int | None, device: str) -> list[str]:
    args = ["convert", str(src), str(out), "--contract", str(CONTRACT), "--device", device, "--json", "--quiet"]
    if ranks is None:
        return [sys.executable, "-m", "fp4convert", *args]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return [*launcher, "-m", "fp4convert", *args]


def run_convert(cmd: list[str], log: Path) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - started
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:8])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout[done.stdout.index("{") :])
    return {"wall_s": wall, "report": report}


#: the manifest: compared without its ``created`` timestamp (the one field two runs never share)
MANIFEST = "fp4convert.json"


def output_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file (16 at a time), the manifest's of its JSON without ``created``."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    with ThreadPoolExecutor(16) as pool:
        digests = dict(zip([p.name for p in files], pool.map(file_sha256, files), strict=True))
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest.pop("created")
    canonical = json.dumps(manifest, sort_keys=True).encode()
    digests[f"{MANIFEST} (without created)"] = hashlib.sha256(canonical).hexdigest()
    return digests


def part_convert(args: argparse.Namespace, gpus: int, out: Path) -> bool:
    started = time.perf_counter()
    src = args.workdir / f"source-{args.layers}l"
    info = make_source(src, args.layers, args.device, shard_bytes=int(args.shard_gb * 1e9))
    gigabytes = info["bytes"] / 1e9
    print(f"[convert] source: {MODEL} shapes, {args.layers} layers, {info['tensors']} tensors, "
          f"{gigabytes:.2f} GB bf16 in {info['files']} shards; ready in {time.perf_counter() - started:.0f} s",
          flush=True)  # fmt: skip
    cases = [("1 process, 1 GPU", None), (f"torchrun {gpus} rank{'s' if gpus > 1 else ''}, 1 per GPU", gpus)]
    results: dict[str, Any] = {}
    digests: dict[str, dict[str, str]] = {}
    for n, (name, ranks) in enumerate(cases):
        dst = args.workdir / f"convert-out-{n}"
        shutil.rmtree(dst, ignore_errors=True)
        warm(src)
        r = run_convert(convert_command(src, dst, ranks, args.device), out / f"convert-case{n}.log")
        digests[name] = output_digests(dst)
        results[name] = r
        print(f"  {name}: {r['wall_s']:.1f} s wall", flush=True)
        if n > 0:
            shutil.rmtree(dst)  # its digests are kept; the disk is not
    reference = digests[cases[0][0]]
    print(f"\n{'case':34} {'wall s':>7} {'convert s':>9} {'GB/s':>6} {'identical':>9}")
    ok = True
    for name, r in results.items():
        same = reference == digests[name]
        ok &= same
        r["identical"] = same
        seconds = r["report"]["seconds"]
        flag = "ref" if name == cases[0][0] else ("yes" if same else "NO")
        print(f"{name:34} {r['wall_s']:7.1f} {seconds:9.2f} {gigabytes / seconds:6.2f} {flag:>9}")
    print(f"\nper rank ({cases[1][0]}):")
    print(f"{'rank':>5} {'device':>8} {'shards':>6} {'source GB':>9} {'seconds':>8} {'GB/s':>6} {'hashed files':>12}")
    for f in results[cases[1][0]]["report"]["ranks"]:
        print(f"{f['rank']:5} {f['device']:>8} {f['files']:6} {f['source_bytes'] / 1e9:9.2f} {f['seconds']:8.2f} "
              f"{f['source_bytes'] / 1e9 / max(f['seconds'], 1e-9):6.2f} {f['hashed_files']:12}")  # fmt: skip
    mismatched = [k for k in reference if reference[k] != digests[cases[1][0]].get(k)]
    print(f"files compared by sha256: {len(reference)}; differing: {mismatched or 'none'}")
    (out / "convert.json").write_text(json.dumps({"source": info, "results": results, "digests": digests}, indent=2))
    shutil.rmtree(args.workdir / "convert-out-0", ignore_errors=True)
    if not args.keep_source:
        shutil.rmtree(src, ignore_errors=True)
    print(f"[convert] done in {time.perf_counter() - started:.0f} s", flush=True)
    return ok


# -- part 2: live export with EP ------------------------------------------------------------------


def _layers(config: dict[str, Any]) -> list[list[Any]]:
    by_layer: dict[int | None, list[Any]] = {}
    for info in inventory_from_config(config):
        by_layer.setdefault(info.layer, []).append(info)
    return list(by_layer.values())


def build_master(config: dict[str, Any], device: str, ep_rank: int, ep_size: int) -> dict[str, torch.Tensor]:
    """EP rank ``ep_rank``'s master in Megatron-Core names: the same random values on every rank
    (one generator per layer), its own experts under local ids, the dense tensors on every rank."""
    master: dict[str, torch.Tensor] = {}
    for n, infos in enumerate(_layers(config)):
        generator = torch.Generator(device=device).manual_seed(1000 + n)
        hf = {i.name: _draw(i.shape, generator, device, i.role.value == "norm") for i in infos}
        master.update(hf_to_megatron(hf, FAMILY, config, ep_rank=ep_rank, ep_size=ep_size))
    return master


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))  # fmt: skip


def _slice(reference: dict[str, torch.Tensor], ep_rank: int, ep_size: int, experts: int) -> dict[str, torch.Tensor]:
    """The tensors of the single-process export that EP rank ``ep_rank`` exports: the dense ones
    and those of its experts (global ids ``ep_rank * per .. (ep_rank + 1) * per - 1``)."""
    per = experts // ep_size

    def mine(name: str) -> bool:
        m = _EXPERT.search(name)
        return m is None or int(m[1]) // per == ep_rank

    return {n: t for n, t in reference.items() if mine(n)}


def reference_export(config: dict[str, Any], device: str, kwargs: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """The single-process export (EP 1) of the whole model and its validation, timed."""
    from fp4convert import export_hf, validate_export

    master = build_master(config, device, 0, 1)
    nbytes = sum(t.numel() * t.element_size() for t in master.values())
    _sync(device)
    started = time.perf_counter()
    exported = dict(export_hf(master.items(), **kwargs))
    _sync(device)
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    report = validate_export(exported, master, **kwargs)
    _sync(device)
    figures = {"master_gb": nbytes / 1e9, "tensors": len(exported), "export_s": export_s,
               "validate_s": time.perf_counter() - started, "ok": report.ok}  # fmt: skip
    del master
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return exported, figures


def rank_syncs(
    config: dict[str, Any],
    device: str,
    ep_rank: int,
    ep_size: int,
    syncs: int,
    kwargs: dict[str, Any],
    reference: dict[str, torch.Tensor],
    barrier: Any = None,
) -> dict[str, Any]:
    """EP rank ``ep_rank``: build its master, then per weight sync export + validate it (timed, wall
    clock stamps for the total across ranks); compare its export with ``reference``'s slice."""
    from fp4convert import export_hf, validate_export

    master = build_master(config, device, ep_rank, ep_size)
    nbytes = sum(t.numel() * t.element_size() for t in master.values())
    figures: dict[str, Any] = {"rank": ep_rank, "device": device, "master_gb": nbytes / 1e9, "syncs": []}
    exported: dict[str, torch.Tensor] = {}
    for _ in range(syncs):
        if barrier is not None:
            barrier.wait(timeout=300)  # a rank that died breaks it: no rank waits forever
        _sync(device)
        start_stamp, started = time.time(), time.perf_counter()
        exported = dict(export_hf(master.items(), ep_rank=ep_rank, ep_size=ep_size, **kwargs))
        _sync(device)
        export_s = time.perf_counter() - started
        report = validate_export(exported, master, ep_rank=ep_rank, ep_size=ep_size, **kwargs)
        _sync(device)
        figures["syncs"].append({"export_s": export_s, "validate_s": time.perf_counter() - started - export_s,
                                 "ok": report.ok, "start": start_stamp, "end": time.time()})  # fmt: skip
    expected = _slice(reference, ep_rank, ep_size, int(config["num_experts"]))
    figures["tensors"] = len(exported)
    figures["names_match"] = set(exported) == set(expected)
    figures["differing"] = sorted(n for n in expected if n in exported and not _same(exported[n], expected[n]))[:10]
    figures["identical"] = figures["names_match"] and not figures["differing"]
    del master, exported
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return figures


def _export_worker(rank: int, config: dict[str, Any], args: dict[str, Any], barrier: Any, out: str) -> None:
    """One process per GPU: the reference slice on this GPU, then this EP rank's syncs."""
    device = f"cuda:{rank}" if args["device"] == "cuda" else "cpu"
    if args["device"] == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // args["ep_size"]))
    kwargs = {"contract": str(CONTRACT), "family": FAMILY, "config": config, "dialect": "modelopt"}
    reference, ref_figures = reference_export(config, device, kwargs)
    figures = rank_syncs(config, device, rank, args["ep_size"], args["syncs"], kwargs, reference, barrier)
    figures["reference"] = ref_figures
    Path(out, f"export-rank{rank}.json").write_text(json.dumps(figures, indent=2))


def part_export(args: argparse.Namespace, gpus: int, out: Path) -> bool:
    started = time.perf_counter()
    config = qwen3_config(args.export_layers)
    ep_size = gpus if gpus > 1 else args.ep_ranks
    kwargs = {"contract": str(CONTRACT), "family": FAMILY, "config": config, "dialect": "modelopt"}
    if gpus > 1:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        barrier = context.Barrier(gpus)
        settings = {"ep_size": ep_size, "syncs": args.syncs, "device": args.device}
        procs = [
            context.Process(target=_export_worker, args=(r, config, settings, barrier, str(out))) for r in range(gpus)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"export ranks failed: exit codes {[p.exitcode for p in procs]}")
        ranks = [json.loads((out / f"export-rank{r}.json").read_text()) for r in range(gpus)]
        ref = ranks[0]["reference"]
        mode = f"{gpus} GPUs, one EP rank each, all at once"
    else:
        device = "cuda:0" if args.device == "cuda" else "cpu"
        reference, ref = reference_export(config, device, kwargs)
        ranks = [rank_syncs(config, device, r, ep_size, args.syncs, kwargs, reference) for r in range(ep_size)]
        del reference
        mode = f"1 GPU: the {ep_size} EP ranks one after another on it"
    print(f"[export] {MODEL} shapes, {args.export_layers} layers, {ref['master_gb']:.1f} GB BF16 master; "
          f"EP = {ep_size} ({mode})")  # fmt: skip
    print(f"single process, EP 1 (1 GPU): export_hf {ref['export_s']:.2f} s "
          f"({ref['master_gb'] / ref['export_s']:.1f} GB/s), validate_export {ref['validate_s']:.2f} s, "
          f"{ref['tensors']} tensors, valid: {'yes' if ref['ok'] else 'NO'}")  # fmt: skip
    print(f"\n{'rank':>4} {'sync':>4} {'master GB':>9} {'export s':>8} {'validate s':>10} {'total s':>8} {'valid':>5}"
          f" {'== slice':>8}")  # fmt: skip
    ok = ref["ok"]
    for figures in ranks:
        for n, s in enumerate(figures["syncs"]):
            ok &= s["ok"]
            same = "yes" if figures["identical"] else "NO"
            print(f"{figures['rank']:4} {n + 1:4} {figures['master_gb']:9.1f} {s['export_s']:8.2f} "
                  f"{s['validate_s']:10.2f} {s['export_s'] + s['validate_s']:8.2f} {'yes' if s['ok'] else 'NO':>5} "
                  f"{same:>8}")  # fmt: skip
        ok &= figures["identical"]
        if not figures["identical"]:
            names, differing = figures["names_match"], figures["differing"]
            print(f"     rank {figures['rank']}: names match: {names}; differing: {differing}")
    print()
    for n in range(args.syncs):
        per_rank = [f["syncs"][n]["export_s"] + f["syncs"][n]["validate_s"] for f in ranks]
        if gpus > 1:
            total = max(f["syncs"][n]["end"] for f in ranks) - min(f["syncs"][n]["start"] for f in ranks)
            print(f"sync {n + 1}: total {total:.2f} s (first start to last end, {gpus} GPUs at once); "
                  f"slowest rank {max(per_rank):.2f} s")  # fmt: skip
        else:
            print(f"sync {n + 1}: ranks one after another {sum(per_rank):.2f} s; slowest rank {max(per_rank):.2f} s "
                  f"(the total if each rank had its own GPU)")  # fmt: skip
    (out / "export.json").write_text(json.dumps({"reference": ref, "ranks": ranks, "ep_size": ep_size}, indent=2))
    print(f"[export] done in {time.perf_counter() - started:.0f} s", flush=True)
    return ok


def main() -> None:
    for key in NO_MULTICAST:  # NVLink multicast stays off in every process started from here
        os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all there are)")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers of the converted checkpoint")
    parser.add_argument("--shard-gb", type=float, default=2.0, help="source shard size")
    parser.add_argument("--export-layers", type=int, default=48)
    parser.add_argument("--ep-ranks", type=int, default=4, help="EP ranks run one after another on one GPU")
    parser.add_argument("--syncs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-multi-gpu"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/multi-gpu"))
    parser.add_argument("--keep-source", action="store_true")
    parser.add_argument("--skip-convert", action="store_true")
    parser.add_argument("--skip-export", action="store_true")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run of the code")
    parser.add_argument(
        "--config", default=DEFAULT_MODEL, help="shipped config name or config.json whose shapes are used"
    )
    args = parser.parse_args()
    global MODEL
    MODEL = args.config
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs CUDA GPUs (--device cpu for a smoke run)")
    gpus = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 1)
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{gpus} x {name}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}; model shapes: {MODEL}")
    ok = True
    if not args.skip_convert:
        ok &= part_convert(args, gpus, args.out)
    if not args.skip_export:
        ok &= part_export(args, gpus, args.out)
    print(f"\nall identical and valid: {'yes' if ok else 'NO'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
