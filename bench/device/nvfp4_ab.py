"""The package's NVFP4 kernels on one 4096x14336 bf16 weight, to compare two revisions on one GPU
(run once per tree, alternating: ``PYTHONPATH=_base:...`` for the other one): GPU time from CUDA-graph
replays (kernel_lab.graph_time), bytes against the CPU kernel, % of the copy roofline.

    python bench/device/nvfp4_ab.py [--rows 4096 --cols 14336]   # NVFP4_AB_SHORT=1: te 1x16 alone
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_lab import graph_time, lab_weight, nan_free_amax, wall_time

from fp4convert import quantize_nvfp4
from fp4convert.formats import _triton_segments as ts
from fp4convert.formats import kernels


def main() -> None:
    x = lab_weight()
    rows, cols = x.shape
    gb = x.numel() * 2 / 1e9
    out_gb = (x.numel() // 2 + x.numel() // 16) / 1e9
    y = torch.empty_like(x)
    roof = 2 * gb / graph_time(lambda: y.copy_(x))
    l2 = torch.cuda.get_device_properties(x.device).L2_cache_size / 2**20
    name = torch.cuda.get_device_name()
    print(f"{name}  {rows}x{cols} bf16 {gb:.3f} GB; copy roofline {roof:.0f} GB/s; L2 {l2:.0f} MiB")

    def row(name: str, seconds: float, reads: int, note: str = "") -> None:
        moved = reads * gb + out_gb
        rate = f"{seconds * 1e6:7.1f} us {gb / seconds:6.0f} GB/s in {moved / seconds / roof:6.1%} roof"
        print(f"{name:52} {rate} {note}")

    amax = ts.tensor_amax(x)
    assert torch.equal(amax.cpu(), nan_free_amax(x.cpu()))
    row("tensor_amax", graph_time(lambda: ts.tensor_amax(x)), 1)
    gmax = 2688.0
    kinds = (("te", 0, False), ("modelopt", 2, False), ("te", 0, True))
    for profile, code, tile16 in kinds[:1] if os.environ.get("NVFP4_AB_SHORT") else kinds:
        want = kernels.nvfp4_units(x.cpu(), amax.cpu().reshape(1), rows, profile, tile16=tile16)
        got = ts.nvfp4_dense(x, amax.reshape(1), rows, code, gmax, tile16)
        same = all(torch.equal(g.cpu(), w) for g, w in zip(got, want, strict=True))
        seconds = graph_time(lambda c=code, t=tile16: ts.nvfp4_dense(x, amax.reshape(1), rows, c, gmax, t))
        label = f"nvfp4_dense {profile} {'16x16' if tile16 else '1x16'}"
        row(label, seconds, 1, "bytes == cpu" if same else "BYTES DIFFER")
    got, want = quantize_nvfp4(x), quantize_nvfp4(x.cpu())
    flat = [(getattr(got, k).cpu().reshape(-1), getattr(want, k).reshape(-1)) for k in ("data", "scale", "amax")]
    same = all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in flat)
    row("quantize_nvfp4 (amax + quantize), CUDA graph", graph_time(lambda: quantize_nvfp4(x)), 2,
        "bytes == cpu" if same else "BYTES DIFFER")  # fmt: skip
    row("quantize_nvfp4, Python calls back to back", wall_time(lambda: quantize_nvfp4(x)), 2)


if __name__ == "__main__":
    main()
