"""Wave lab (issue 15): is the dense NVFP4 kernel losing time to its last, partial wave of programs?

A 4096x14336 weight gets 256 x 14 = 3584 programs of 16 rows x 4 column steps. How many run at once
on an SM depends on the registers a build needs (71 without the bf16 word path: 7 programs of four
warps; 56 with it: 9), so the grid is 3.9 or 3.0 waves, and a grid just past a whole number of waves
leaves most SMs idle at the end. This times, on one GPU, the grid launch (``_nvfp4_dense_kernel``)
against the persistent launches (``_nvfp4_tensor_kernel``, ``_amax_dense_kernel``) at several programs
per SM: each program computes the tensor's outer scales once and takes one column step after another
(strided, last to first), word path on and off, next step read ahead or not (``PREFETCH``); every
launch's bytes against the grid launch's (torch.equal on uint8). (Run at 257d721, before the
persistent launches were the package's, with its own copies of them:
bench/results/nvfp4-ab-h100-stop36.txt.)

    python bench/device/wave_lab.py [--rows 4096 --cols 14336]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from kernel_lab import graph_time, lab_weight

from fp4convert.formats import _triton_segments as ts


def main() -> None:
    x = lab_weight()
    rows, cols = x.shape
    gb = x.numel() * 2 / 1e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    y = torch.empty_like(x)
    roof = 2 * gb / graph_time(lambda: y.copy_(x))
    amax = ts.tensor_amax(x).reshape(1)
    words_on = ts._BF16_WORDS
    print(f"{torch.cuda.get_device_name()}, {sms} SMs; {rows}x{cols} bf16; roofline {roof:.0f} GB/s; words {words_on}")
    bc = ts.launch_shape(cols, 16)
    ch = ts.nvfp4_steps(rows, cols, bc)
    grid = (triton.cdiv(rows, ts.BLOCK_ROWS), ts.spans(cols, bc, ch))
    want = [torch.empty(rows, n, dtype=torch.uint8, device="cuda") for n in (cols // 2, cols // 16)]
    common = dict(PROFILE=0, GMAX=2688.0, TILE16=False, EVEN_R=True, EVEN_C=True, BR=ts.BLOCK_ROWS, BC=bc, HW=True)
    grid_args = (x, x.stride(0), rows, amax, *want, cols, rows)
    grid_kw = dict(common, CH=ch, REVERSE=True, WORDS=True, enable_fp_fusion=False)
    ts._nvfp4_dense_kernel[grid](*grid_args, **grid_kw)
    t = graph_time(lambda: ts._nvfp4_dense_kernel[grid](*grid_args, **grid_kw))
    occ = ts.programs_per_sm(ts._nvfp4_dense_kernel.warmup(*grid_args, **grid_kw, grid=(1,)), x.device)
    waves = grid[0] * grid[1] / (occ * sms)
    print(f"grid launch, {ch} steps  {t * 1e6:7.1f} us {gb / t:6.0f} GB/s  {occ} per SM: {waves:.2f} waves")
    for words, prefetch in ((True, False), (True, True), (False, False), (False, True)):
        data, scale = torch.empty_like(want[0]), torch.empty_like(want[1])
        args = (x, x.stride(0), rows, amax, data, scale, cols)
        kw = dict(common, WORDS=words, PREFETCH=prefetch, PDL=False, IN_POLICY="", OUT_POLICY="",
                  enable_fp_fusion=False)  # fmt: skip
        k = ts._nvfp4_tensor_kernel.warmup(*args, 1, **kw, grid=(1,))
        occ = ts.programs_per_sm(k, x.device)
        for per_sm in sorted({occ, max(1, occ - 1), max(1, occ // 2), 2 * occ}):
            launch = ts._nvfp4_tensor_kernel[(sms * per_sm,)]
            data.zero_()
            scale.zero_()
            launch(*args, sms * per_sm, **kw)
            same = torch.equal(data, want[0]) and torch.equal(scale, want[1])
            t = graph_time(lambda f=launch, p=per_sm, a=args, o=kw: f(*a, sms * p, **o))
            print(
                f"persistent words={words!s:5} prefetch={prefetch!s:5} {per_sm:2d}/SM ({k.n_regs} regs, {occ} fit) "
                f"{t * 1e6:7.1f} us {gb / t:6.0f} GB/s  {'bytes == grid launch' if same else 'BYTES DIFFER'}"
            )
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    akw = dict(EVEN_R=True, EVEN_C=True, BR=ts.BLOCK_ROWS, BC=bc, KEEP=False, PDL=False,
               enable_fp_fusion=False)  # fmt: skip
    keep_from = 0  # unread: KEEP is off
    compiled = ts._amax_dense_kernel.warmup(x, x.stride(0), rows, out, keep_from, cols, 1, **akw, grid=(1,))
    occ = ts.programs_per_sm(compiled, x.device)
    for per_sm in sorted({occ, max(1, occ // 2), max(1, occ // 4)}):
        launch = ts._amax_dense_kernel[(sms * per_sm,)]
        out.zero_()
        launch(x, x.stride(0), rows, out, keep_from, cols, sms * per_sm, **akw)
        same = torch.equal(out.view(torch.float32).reshape(1), amax)
        t = graph_time(lambda f=launch, p=per_sm: f(x, x.stride(0), rows, out, keep_from, cols, sms * p, **akw))
        print(
            f"persistent amax {per_sm:2d}/SM ({occ} fit) {t * 1e6:7.1f} us {gb / t:6.0f} GB/s "
            f"{gb / t / roof:6.1%} of the roofline  {'amax == tensor_amax' if same else 'AMAX DIFFERS'}"
        )


if __name__ == "__main__":
    main()
