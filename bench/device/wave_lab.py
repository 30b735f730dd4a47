"""Wave lab (issue 15): is the dense NVFP4 kernel losing time to its last, partial wave of programs?

A 4096x14336 weight gets 256 x 14 = 3584 programs of 16 rows x 4 column steps. How many run at once
on an SM depends on the registers a build needs (71 without the bf16 word path: 7 programs of four
warps; 56 with it: 9), so the grid is 3.9 or 3.0 waves, and a grid just past a whole number of waves
leaves most SMs idle at the end. This times, on one GPU, the package's launch against persistent
launches of the same per-step code (``_nvfp4_rows``) that keep ``SMs x k`` programs and hand each
one column step after another (strided, last to first as the package runs them), with the tensor's
outer scales computed once per program, word path on and off; every launch's bytes against the
package's (torch.equal on uint8).

    FP4CONVERT_BF16_WORDS=1 python bench/device/wave_lab.py [--rows 4096 --cols 14336]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from kernel_lab import graph_time, lab_weight

from fp4convert.formats import _triton_segments as ts


@triton.jit
def persistent_nvfp4(
    x_ptr, ld, rows, amax_ptr, data_ptr, scale_ptr, cols, nprog,
    BR: tl.constexpr, BC: tl.constexpr, HW: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """te profile, tensor-scope outer amax: one (BR rows, BC columns) step per loop turn; ``nprog``:
    the grid's size (Triton's interpreter cannot step a range by ``tl.num_programs``)."""
    col_steps = tl.cdiv(cols, BC)
    n = tl.cdiv(rows, BR) * col_steps
    a = tl.load(amax_ptr + tl.zeros((BR,), tl.int32))[:, None]
    sdec, mult = ts._outer(a, 0, 2688.0)
    for t in range(tl.program_id(0), n, nprog):
        u = n - 1 - t
        r = (u // col_steps) * BR + tl.arange(0, BR)
        ts._nvfp4_rows(
            x_ptr, ld, r, r < rows, r, sdec, mult, data_ptr, scale_ptr, cols, (u % col_steps) * BC, 0, False,
            True, True, BR, BC, False, HW, WORDS,
        )  # fmt: skip


@triton.jit
def persistent_amax(x_ptr, ld, rows, out_ptr, cols, nprog, BR: tl.constexpr, BC: tl.constexpr):
    """``_amax_dense_kernel``'s maximum (int32 bits into ``out[0]``), one (BR, BC) step per loop turn."""
    col_steps = tl.cdiv(cols, BC)
    n = tl.cdiv(rows, BR) * col_steps
    acc = tl.zeros((BR, BC), dtype=tl.float32)
    for t in range(tl.program_id(0), n, nprog):
        r = (t // col_steps) * BR + tl.arange(0, BR)
        c = (t % col_steps) * BC + tl.arange(0, BC)
        acc = tl.maximum(acc, tl.abs(tl.load(x_ptr + r.to(tl.int64)[:, None] * ld + c[None, :]).to(tl.float32)))
    tl.atomic_max(out_ptr, tl.max(tl.max(acc, axis=1), axis=0).to(tl.int32, bitcast=True))


def occupancy(kernel) -> int:
    """Programs of ``kernel`` (a compiled Triton kernel) one SM holds: registers, warps, shared memory."""
    kernel._init_handles()  # loads the binary: n_regs is known from then on
    props = torch.cuda.get_device_properties(0)
    warps = kernel.metadata.num_warps
    regs = -(-kernel.n_regs // 8) * 8 * 32 * warps
    # every Hopper SM: 64 Ki registers, 228 KiB shared memory (read from torch where it says)
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // regs if regs else 32
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // kernel.metadata.shared if kernel.metadata.shared else 32
    return min(by_regs, by_smem, 64 // warps, 32)


def main() -> None:
    x = lab_weight()
    rows, cols = x.shape
    gb = x.numel() * 2 / 1e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    y = torch.empty_like(x)
    roof = 2 * gb / graph_time(lambda: y.copy_(x))
    amax = ts.tensor_amax(x).reshape(1)
    words_on = ts._BF16_WORDS.value
    print(f"{torch.cuda.get_device_name()}, {sms} SMs; {rows}x{cols} bf16; roofline {roof:.0f} GB/s; words {words_on}")
    want = ts.nvfp4_dense(x, amax, rows, 0, 2688.0, False)
    package = graph_time(lambda: ts.nvfp4_dense(x, amax, rows, 0, 2688.0, False))
    bc = ts.launch_shape(cols, 16)
    grid = triton.cdiv(rows, ts.BLOCK_ROWS) * ts.spans(cols, bc, ts.nvfp4_steps(rows, cols, bc))
    dense = ts._nvfp4_dense_kernel.warmup(
        x, x.stride(0), rows, amax, *want, cols, rows, PROFILE=0, GMAX=2688.0, TILE16=False, EVEN_R=True, EVEN_C=True,
        BR=ts.BLOCK_ROWS, BC=bc, CH=ts.nvfp4_steps(rows, cols, bc), REVERSE=True, HW=True, WORDS=True, grid=(1,),
        enable_fp_fusion=False,
    )  # fmt: skip
    occ = occupancy(dense)
    print(
        f"package launch        {package * 1e6:7.1f} us {gb / package:6.0f} GB/s  {dense.n_regs} regs, {occ} per SM: "
        f"{grid} programs = {grid / (occ * sms):.2f} waves"
    )
    for words in (True, False):
        data = torch.empty_like(want[0])
        scale = torch.empty_like(want[1])
        args = (x, x.stride(0), rows, amax, data, scale, cols)
        kw = dict(BR=ts.BLOCK_ROWS, BC=bc, HW=True, WORDS=words, enable_fp_fusion=False)
        k = persistent_nvfp4.warmup(*args, 1, **kw, grid=(1,))
        occ = occupancy(k)
        for per_sm in sorted({occ, max(1, occ - 1), max(1, occ // 2), 2 * occ}):
            data.zero_()
            scale.zero_()
            persistent_nvfp4[(sms * per_sm,)](*args, sms * per_sm, **kw)
            same = torch.equal(data, want[0]) and torch.equal(scale, want[1])
            t = graph_time(lambda p=per_sm, a=args, o=kw: persistent_nvfp4[(sms * p,)](*a, sms * p, **o))
            both = graph_time(
                lambda p=per_sm, a=args, o=kw: (ts.tensor_amax(x), persistent_nvfp4[(sms * p,)](*a, sms * p, **o))
            )
            print(
                f"persistent words={words!s:5} {per_sm:2d}/SM ({k.n_regs} regs, {occ} fit) {t * 1e6:7.1f} us "
                f"{gb / t:6.0f} GB/s; with amax {both * 1e6:6.1f} us {gb / both:6.0f} GB/s  "
                f"{'bytes == package' if same else 'BYTES DIFFER'}"
            )
    t = graph_time(lambda: ts.tensor_amax(x))
    print(f"package amax          {t * 1e6:7.1f} us {gb / t:6.0f} GB/s {gb / t / roof:6.1%} of the roofline")
    out = torch.zeros(1, dtype=torch.int32, device=x.device)
    k = persistent_amax.warmup(x, x.stride(0), rows, out, cols, 1, BR=ts.BLOCK_ROWS, BC=bc, grid=(1,))
    occ = occupancy(k)
    for per_sm in sorted({occ, max(1, occ // 2), max(1, occ // 4)}):
        out.zero_()
        persistent_amax[(sms * per_sm,)](x, x.stride(0), rows, out, cols, sms * per_sm, BR=ts.BLOCK_ROWS, BC=bc)
        same = torch.equal(out.view(torch.float32).reshape(1), amax)
        t = graph_time(
            lambda p=per_sm: persistent_amax[(sms * p,)](
                x, x.stride(0), rows, out, cols, sms * p, BR=ts.BLOCK_ROWS, BC=bc
            )
        )
        print(
            f"persistent amax {per_sm:2d}/SM ({k.n_regs} regs, {occ} fit) {t * 1e6:7.1f} us {gb / t:6.0f} GB/s "
            f"{gb / t / roof:6.1%} of the roofline  {'amax == package' if same else 'AMAX DIFFERS'}"
        )
    both = graph_time(lambda: (ts.tensor_amax(x), ts.nvfp4_dense(x, amax, rows, 0, 2688.0, False)))
    print(f"package amax + quantize {both * 1e6:6.1f} us {gb / both:6.0f} GB/s")


if __name__ == "__main__":
    main()
