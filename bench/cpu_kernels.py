"""One core's throughput of the native CPU kernels, against another revision's build in the same run.

Times ``fp4c_nvfp4_unit_rows`` (te, te-2.13, modelopt), ``fp4c_mxfp8_rows`` and
``fp4c_absmax_range`` on one Qwen3-30B-A3B expert (768x2048 bf16) on one thread, for the kernel of
this tree and for ``_native.c`` of ``--against REV`` (built the same way, from git), alternating
the two builds round by round (this VM's cores are noisy) and keeping each one's best. The bytes
of both builds are compared too.

    python bench/cpu_kernels.py --against HEAD~1
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fp4convert.formats import profiles

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "fp4convert/formats/_native.c"
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno", "-fno-trapping-math",
         "-shared", "-fPIC"]  # fmt: skip  # the package's build flags (pyproject.toml)
PROFILES = {"te": 0, "te-2.13": 1, "modelopt": 2}


def build(source: str, out: Path) -> ctypes.CDLL:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", *FLAGS, "-o", str(out), str(src), "-lm", "-lpthread"], check=True)
    return ctypes.CDLL(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="HEAD~1", help="git revision of the other build")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    old = subprocess.run(["git", "show", f"{args.against}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    tmp = Path(tempfile.mkdtemp())
    libs = {"this tree": build((ROOT / SOURCE).read_text(), tmp / "new.so"), args.against: build(old, tmp / "old.so")}
    x = (torch.randn(768, 2048, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    rows, cols = x.shape
    amax = torch.tensor([float(x.float().abs().max())])
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    outputs: dict[tuple[str, str], bytes] = {}

    def calls(lib: ctypes.CDLL) -> dict[str, tuple[Callable[[], object], tuple[torch.Tensor, ...]]]:
        data = torch.empty(rows, cols // 2, dtype=torch.uint8)
        scale = torch.empty(rows, cols // 16, dtype=torch.uint8)
        mx_data = torch.empty(rows, cols, dtype=torch.uint8)
        mx_scale = torch.empty(rows, cols // 32, dtype=torch.uint8)
        lib.fp4c_nvfp4_unit_rows.argtypes = [p, ctypes.c_int, i64, i64, i64, i64, p, i64, f32, p, ctypes.c_int, p, p]
        lib.fp4c_mxfp8_rows.argtypes = [p, ctypes.c_int, i64, i64, i64, i64, p, p]
        lib.fp4c_absmax_range.argtypes = [p, ctypes.c_int, i64, i64, i64, i64]
        lib.fp4c_absmax_range.restype = f32
        out: dict[str, tuple[Callable[[], object], tuple[torch.Tensor, ...]]] = {}
        for name, code in PROFILES.items():
            gmax = profiles.profile_spec(name).global_max  # type: ignore[arg-type]

            def nvfp4(code: int = code, gmax: float = gmax) -> None:
                lib.fp4c_nvfp4_unit_rows(
                    x.data_ptr(), 1, 0, rows, cols, cols, amax.data_ptr(), rows, gmax, None, code,
                    data.data_ptr(), scale.data_ptr(),
                )  # fmt: skip

            out[f"NVFP4 {name}"] = (nvfp4, (data, scale))

        def mxfp8() -> None:
            lib.fp4c_mxfp8_rows(x.data_ptr(), 1, 0, rows, cols, cols, mx_data.data_ptr(), mx_scale.data_ptr())

        out["MXFP8"] = (mxfp8, (mx_data, mx_scale))
        out["tensor amax"] = (lambda: lib.fp4c_absmax_range(x.data_ptr(), 1, 0, rows, cols, cols), ())
        return out

    prepared = {label: calls(lib) for label, lib in libs.items()}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for label, kernels in prepared.items():
            for what, (fn, results) in kernels.items():
                fn()
                started = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                seconds = (time.perf_counter() - started) / args.calls
                best[(label, what)] = min(best.get((label, what), seconds), seconds)
                outputs[(label, what)] = b"".join(t.numpy().tobytes() for t in results)
    print(f"one core, {rows}x{cols} bf16 ({x.numel() * 2 / 1e6:.1f} MB), best of {args.rounds} rounds x {args.calls}")
    print(f"{'kernel':14s} {'this tree':>12s} {args.against:>14s}  ratio  bytes")
    for what in prepared["this tree"]:
        new, old_s = best[("this tree", what)], best[(args.against, what)]
        same = outputs[("this tree", what)] == outputs[(args.against, what)]
        gb = x.numel() * 2 / 1e9
        verdict = "same" if same else "DIFFERENT"
        print(f"{what:14s} {gb / new:8.2f} GB/s {gb / old_s:10.2f} GB/s  {old_s / new:5.2f}x  {verdict}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
