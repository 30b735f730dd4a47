"""Quantizer throughput and peak memory on a 4096x14336 bf16 weight (issue 2 and 18 targets).

Prints GB/s of bf16 input for NVFP4 (profile ``te``, 1x16 and 16x16 tiles), TE's 4over6 profiles
next to it (``te-4over6-mae``, ``te-4over6-mse-256``: two candidates and their errors per block)
and MXFP8, on the CPU (native kernel) and on CUDA (Triton) when present, each against peers run in
the same process: fp4convert's own pure-torch reference, ModelOpt's NVFP4QTensor.quantize and
torchao's to_mx (RCEIL), when installed. ``vs te`` is a 4over6 row's time over the ``te`` row of
the same tile and device.

    python bench/quantize.py [--device cpu|cuda|all] [--repeat 5] [--json]

Targets: >= 0.3 GB/s on the 2-core CPU, >= 200 GB/s on an H200 (NVFP4 te).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import warnings
from collections.abc import Callable

import torch

from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4

SHAPE = (4096, 14336)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _time(fn: Callable[[], object], device: str, repeat: int) -> float:
    fn()  # warm-up (kernel compilation, allocator)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def _peers(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    peers: dict[str, Callable[[], object]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from modelopt.torch.quantization.qtensor import NVFP4QTensor

            peers["nvfp4:modelopt NVFP4QTensor"] = lambda: NVFP4QTensor.quantize(x, 16)
        except ImportError:
            pass
        try:
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_mx

            peers["mxfp8:torchao to_mx RCEIL"] = lambda: to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
        except ImportError:
            pass
    return peers


FOUR_OVER_SIX = ("te-4over6-mae", "te-4over6-mse-256")


def run(device: str, repeat: int) -> list[dict[str, object]]:
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(device)
    gigabytes = x.numel() * x.element_size() / 1e9
    cases: dict[str, Callable[[], object]] = {
        "nvfp4:fp4convert": lambda: quantize_nvfp4(x),
        "nvfp4:fp4convert 16x16": lambda: quantize_nvfp4(x, tile="16x16"),
    }
    for profile in FOUR_OVER_SIX:
        cases[f"nvfp4:fp4convert {profile}"] = lambda p=profile: quantize_nvfp4(x, profile=p)
        cases[f"nvfp4:fp4convert 16x16 {profile}"] = lambda p=profile: quantize_nvfp4(x, tile="16x16", profile=p)
    cases |= {
        "mxfp8:fp4convert": lambda: quantize_mxfp8(x),
        "nvfp4:fp4convert reference (eager torch)": lambda: quantize_nvfp4(x, backend="reference"),
        "nvfp4:fp4convert reference te-4over6-mae": lambda: quantize_nvfp4(
            x, profile="te-4over6-mae", backend="reference"
        ),
        "mxfp8:fp4convert reference (eager torch)": lambda: quantize_mxfp8(x, backend="reference"),
        **_peers(x),
    }
    rows = []
    for name, fn in cases.items():
        fmt, impl = name.split(":", 1)
        slow = "reference" in impl or "modelopt" in impl or "torchao" in impl
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = _time(fn, device, 1 if (slow and device == "cpu") else repeat)
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else _peak_rss_mb()
        rows.append(
            {
                "device": device,
                "format": fmt,
                "impl": impl,
                "seconds": seconds,
                "gb_per_s": gigabytes / seconds,
                "peak_mb": peak,
            }
        )
    for fmt in ("nvfp4", "mxfp8"):
        ours = next(r for r in rows if r["format"] == fmt and r["impl"] == "fp4convert")
        for r in rows:
            if r["format"] == fmt:
                r["speedup_of_fp4convert"] = r["seconds"] / ours["seconds"]
    for r in rows:
        impl = str(r["impl"])
        for profile in FOUR_OVER_SIX:
            if impl.startswith("fp4convert") and impl.endswith(profile) and "reference" not in impl:
                te = next(t for t in rows if t["impl"] == impl[: -len(profile)].rstrip())
                r["vs_te"] = r["seconds"] / te["seconds"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    rows = [row for d in devices for row in run(d, args.repeat)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    gigabytes = SHAPE[0] * SHAPE[1] * 2 / 1e9
    print(f"input: {SHAPE[0]}x{SHAPE[1]} bf16 ({gigabytes:.3f} GB), torch threads {torch.get_num_threads()}")
    print(
        f"{'device':6} {'format':6} {'implementation':42} {'GB/s':>9} {'ms':>9} {'peak MB':>9} "
        f"{'fp4convert x':>12} {'vs te':>6}"
    )
    for r in rows:
        vs_te = f"{r['vs_te']:6.2f}" if "vs_te" in r else ""
        print(
            f"{r['device']:6} {r['format']:6} {r['impl']:42} {r['gb_per_s']:9.3f} {r['seconds'] * 1e3:9.1f} "
            f"{r['peak_mb']:9.0f} {r['speedup_of_fp4convert']:12.1f} {vs_te}"
        )
    print("peak MB: CUDA max allocated per case; CPU peak RSS of the process so far (cumulative)")
    print("fp4convert x: time / time of the plain fp4convert row of the format; vs te: 4over6 time / te time")


if __name__ == "__main__":
    main()
