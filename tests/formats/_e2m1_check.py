"""The segment kernels' E2M1 rounding (``_triton_segments._e2m1``, one float add on the bits) against
the specification's threshold comparisons (``_triton._e2m1_code``), pattern for pattern: compiled for
the GPU over all 2^32 float32 patterns (tests/formats/test_cuda.py), interpreted on the CPU over the
patterns where a rounding can go wrong (``_helpers.e2m1_risky_patterns``; tests/formats/_triton_interpreted.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4convert.formats import _triton, _triton_segments

BLOCK = 4096


@triton.jit
def _disagreements(out_ptr, table_ptr, start, n, BLOCK: tl.constexpr, TABLE: tl.constexpr, SIGNED: tl.constexpr):
    """How many of ``n`` float32 patterns take another code from ``_e2m1`` than from the thresholds
    (``out[0]``), and the smallest such pattern (``out[1]``). The patterns are ``table[i]`` with
    ``TABLE``, else ``start + i``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    if TABLE:
        bits = tl.load(table_ptr + i, mask=inside, other=0).to(tl.uint32)
    else:
        bits = (start + i).to(tl.uint32)
    y = bits.to(tl.float32, bitcast=True)
    differ = (_triton_segments._e2m1(y, SIGNED) != _triton._e2m1_code(y, SIGNED)) & inside
    tl.atomic_add(out_ptr, tl.sum(differ.to(tl.int64)))
    tl.atomic_min(out_ptr + 1, tl.min(tl.where(differ, bits.to(tl.int64), 1 << 40)))


def disagreements(signed_zero: bool, *, table: torch.Tensor | None = None, device: str = "cuda") -> tuple[int, int]:
    """(patterns that differ, the first of them) over ``table`` (int64 bit patterns) or all 2^32."""
    out = torch.tensor([0, 1 << 40], dtype=torch.int64, device=device)
    if table is not None:
        n = table.numel()
        grid = (triton.cdiv(n, BLOCK),)
        _disagreements[grid](out, table, 0, n, BLOCK=BLOCK, TABLE=True, SIGNED=signed_zero, enable_fp_fusion=False)
    else:
        chunk = 1 << 30
        for start in range(0, 1 << 32, chunk):
            _disagreements[(chunk // BLOCK,)](
                out, out, start, chunk, BLOCK=BLOCK, TABLE=False, SIGNED=signed_zero, enable_fp_fusion=False
            )
    differing, first = out.tolist()
    return differing, first
