"""Host time of one public quantize call on CUDA (issue 15): what a back-to-back loop of calls costs
the CPU, on a weight small enough (16x4096 bf16) that the GPU is never the bound.

Prints microseconds per call for torch's two output allocations, one bare Triton launch of the
dense kernels, the kernels module's entry points, and the public calls; then cProfile's top
functions of the public NVFP4 (amax given) and MXFP8 calls.

    python bench/device/call_overhead.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import torch

from fp4convert.formats import _triton_segments as ts
from fp4convert.formats import kernels
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4


def per_call(fn: Callable[[], object], calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    x = (torch.randn(16, 4096, device="cuda") * 0.02).to(torch.bfloat16)
    rows, cols = x.shape
    amax = torch.ones(1, device="cuda")
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device="cuda")
    scale = torch.empty(rows, cols // 16, dtype=torch.uint8, device="cuda")
    data8 = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
    scale8 = torch.empty(rows, cols // 32, dtype=torch.uint8, device="cuda")
    hw = ts.hardware_e4m3(x.device)

    def bare_nvfp4() -> None:
        ts._nvfp4_dense_kernel[(1, 8)](
            x, cols, rows, amax, data, scale, cols, rows, PROFILE=0, GMAX=2688.0, TILE16=False, EVEN_R=True,
            EVEN_C=True, BR=16, BC=256, CH=2, REVERSE=True, HW=hw, WORDS=ts.word_path(True, hw, 0),
            enable_fp_fusion=False,
        )  # fmt: skip

    def bare_mxfp8() -> None:
        ts._mxfp8_bf16_dense_kernel[(1, cols // 256)](
            x, cols, rows, data8, scale8, cols, EVEN_R=True, EVEN_C=True, BR=16, NB=8, HW=hw, enable_fp_fusion=False
        )

    rows_ = [
        ("torch.empty x2 (the outputs)", lambda: (torch.empty_like(data), torch.empty_like(scale))),
        ("bare Triton launch, NVFP4 dense kernel", bare_nvfp4),
        ("bare Triton launch, MXFP8 bf16 kernel", bare_mxfp8),
        ("ts.nvfp4_dense (outputs + launch)", lambda: ts.nvfp4_dense(x, amax, rows, 0, 2688.0, False)),
        ("ts.mxfp8_dense (outputs + launch)", lambda: ts.mxfp8_dense(x)),
        ("ts.tensor_amax (zero + launch)", lambda: ts.tensor_amax(x)),
        ("kernels.nvfp4_units", lambda: kernels.nvfp4_units(x, amax, rows, "te")),
        ("quantize_nvfp4(x, amax=device tensor)", lambda: quantize_nvfp4(x, amax=amax[0])),
        ("quantize_nvfp4(x, amax=1.0)", lambda: quantize_nvfp4(x, amax=1.0)),
        ("quantize_nvfp4(x)", lambda: quantize_nvfp4(x)),
        ("quantize_mxfp8(x)", lambda: quantize_mxfp8(x)),
    ]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    for what, fn in rows_:
        print(f"{what:<48} {per_call(fn, args.calls) * 1e6:8.1f} us per call", flush=True)
    for what, fn in (
        ("quantize_nvfp4(x, amax=device tensor)", lambda: quantize_nvfp4(x, amax=amax[0])),
        ("quantize_nvfp4(x)", lambda: quantize_nvfp4(x)),
        ("quantize_mxfp8(x)", lambda: quantize_mxfp8(x)),
    ):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        profiler.disable()
        print(f"== cProfile, {args.calls} calls of {what}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
