"""FP8 block-scaled source vs BF16 source: NVFP4 experts-only conversion of the same model (issue 11).

Input: bench/convert.py's synthetic Qwen3-30B-A3B-shaped checkpoint (hub layout, N(0, 0.02)
weights; 4 decoder layers by default), and the same checkpoint made FP8 the way the official
``-FP8`` releases are: every Linear weight but the router as F8_E4M3 with F32 ``weight_scale_inv``
per 128x128 block (``--ue8m0``: power-of-two scales), embeddings, norms, router and lm_head kept
BF16, the data of each shard ordered as safetensors orders it (F32 scales first, then BF16, then
FP8), so the converter reads scales apart from their weights as it does on a real release.

Each case runs as its own process (page cache warm), measured with wait4 (wall, user CPU, peak
RSS); cases alternate ``--repeat`` times and the table gives the best and the median wall time.
Goal: the FP8 source converts in no more than 1.3x the BF16 source's time.

    python bench/fp8_source.py [--layers 4] [--device cpu|cuda] [--repeat 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convert as bench_convert  # bench/convert.py: the BF16 source and the measuring

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, read_header

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 128
_KEEP_BF16 = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight")
_ORDER = {"F32": 0, "BF16": 1, "F8_E4M3": 2}  # safetensors writes data by dtype (descending), then name


def fp8_block(x: torch.Tensor, *, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One weight (dims multiples of 128) to E4M3 and its F32 ``weight_scale_inv`` grid."""
    rows, cols = x.shape
    blocks = x.float().reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(rows, cols), scale


def make_fp8(src: Path, dst: Path, *, ue8m0: bool) -> dict[str, float]:
    """The FP8 release of ``src`` (skipped if a complete one is there); returns its size."""
    if (dst / "done").is_file():
        return {"bytes": sum(p.stat().st_size for p in dst.glob("*.safetensors"))}
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    weight_map = {}
    for path in sorted(src.glob("*.safetensors")):
        entries, _ = read_header(path)
        layout = []
        for name, e in entries.items():
            quantize = len(e.shape) == 2 and name.endswith(".weight") and not any(k in name for k in _KEEP_BF16)
            if quantize:
                layout.append((name, "F8_E4M3", e.shape))
                layout.append((name + "_scale_inv", "F32", (e.shape[0] // BLOCK, e.shape[1] // BLOCK)))
            else:
                layout.append((name, e.dtype, e.shape))
        layout.sort(key=lambda spec: (_ORDER[spec[1]], spec[0]))
        writer = StreamingWriter(dst / path.name, layout, {"format": "pt"})
        with SafetensorsFile(path) as f:
            for name, dtype, _ in layout:
                if dtype == "F32" and name.endswith("_scale_inv"):
                    tensor = fp8_block(f.read(name.removesuffix("_scale_inv")), ue8m0=ue8m0)[1]
                elif dtype == "F8_E4M3":  # quantized again rather than held: memory stays at one tensor
                    tensor = fp8_block(f.read(name), ue8m0=ue8m0)[0]
                else:
                    tensor = f.read(name)
                writer.write(name, tensor)
                weight_map[name] = path.name
        writer.close()
    total = sum(p.stat().st_size for p in dst.glob("*.safetensors"))
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
        **({"scale_fmt": "ue8m0"} if ue8m0 else {}),
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    (dst / "done").write_text("ok")
    return {"bytes": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp4convert-bench-fp8"))
    parser.add_argument("--layers", type=int, default=bench_convert.LAYERS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--ue8m0", action="store_true", help="power-of-two scales (scale_fmt: ue8m0)")
    args = parser.parse_args()
    bench_convert.LAYERS = args.layers
    started = time.perf_counter()
    src = args.workdir / f"bf16-{args.layers}l"
    info = bench_convert.make_source(src)
    fp8 = args.workdir / f"fp8{'-ue8m0' if args.ue8m0 else ''}-{args.layers}l"
    fp8_info = make_fp8(src, fp8, ue8m0=args.ue8m0)
    print(
        f"input: {info['tensors']} tensors, {args.layers} layers, bf16 {info['bytes'] / 1e9:.2f} GB, "
        f"fp8 release {fp8_info['bytes'] / 1e9:.2f} GB (made in {time.perf_counter() - started:.0f} s); "
        f"{os.cpu_count()} CPUs; device {args.device}",
        flush=True,
    )
    contract = str(ROOT / "contracts/nvfp4-experts-per-token.yaml")
    exe = [sys.executable, "-m", "fp4convert.cli", "convert"]
    cases = {"bf16 source": src, "fp8 source": fp8}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for index in range(args.repeat):
        for name, source in cases.items():
            out = args.workdir / "out"
            shutil.rmtree(out, ignore_errors=True)
            bench_convert.warm(source)
            command = [*exe, str(source), str(out), "--contract", contract, "--device", args.device]
            runs[name].append(bench_convert.run_child(command))
            manifest = json.loads((out / "fp4convert.json").read_text())
            formats = manifest["source"]["formats"]
            print(f"  run {index + 1} {name}: {runs[name][-1]['wall_s']:.1f} s (source formats {formats})", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    print(f"\n{'case':14} {'best s':>8} {'median s':>9} {'user s':>8} {'bf16 GB/s':>10} {'peak RSS GB':>12}")
    for name, results in runs.items():
        walls = [r["wall_s"] for r in results]
        print(
            f"{name:14} {min(walls):8.1f} {statistics.median(walls):9.1f} {min(r['user_s'] for r in results):8.1f} "
            f"{info['bytes'] / 1e9 / min(walls):10.3f} {max(r['peak_rss_gb'] for r in results):12.2f}"
        )
    best = {name: min(r["wall_s"] for r in results) for name, results in runs.items()}
    ratio = best["fp8 source"] / best["bf16 source"]
    print(f"\nfp8 / bf16 wall time (best of {args.repeat}): {ratio:.2f}x (goal <= 1.30x)")


if __name__ == "__main__":
    main()
