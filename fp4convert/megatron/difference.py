"""Where a failing tensor differs: the first differing block, dequantized on both sides.

For a quantized tensor the detail names the row and block, the exported and expected values as
the sampler would compute with them (dequantized through the dialect's decode scale), and the
master's BF16 values; for an FP32 scale, the two values and how many ulps apart they are.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fp4convert.formats.codecs import e2m1_decode, unpack_fp4
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.megatron.context import Context, same_bytes
from fp4convert.megatron.plan import ExportPlan
from fp4convert.plan import PlannedTensor

__all__ = ["difference", "ulps_apart"]


def _fmt(values: torch.Tensor) -> str:
    return "[" + " ".join(f"{v:.4g}" for v in values.float().tolist()) + "]"


def ulps_apart(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """How many float32 ulps the first value of ``actual`` lies above ``expected`` (negative: below)."""
    a = int(actual.float().reshape(-1)[0].view(torch.int32))
    e = int(expected.float().reshape(-1)[0].view(torch.int32))
    return a - e


def _block_values(
    plan: ExportPlan, item: PlannedTensor, outputs: Mapping[str, torch.Tensor], row: int, block: int
) -> torch.Tensor:
    names = [name for name, _, _ in item.outputs]
    if item.decision.format == "nvfp4":
        data = outputs[names[0]][row, block * 8 : block * 8 + 8]
        sf = outputs[names[1]].view(torch.uint8)[row, block].view(torch.float8_e4m3fn).float()
        return e2m1_decode(unpack_fp4(data)) * sf * plan.dialect.decode_scale(outputs[names[2]])
    data = outputs[names[0]].view(torch.uint8)[row, block * MXFP8_BLOCK : (block + 1) * MXFP8_BLOCK]
    exponent = outputs[names[1]][row, block].int() - 127
    return data.view(torch.float8_e4m3fn).float() * torch.ldexp(torch.ones(()), exponent)


def _where(item: PlannedTensor, role: int, flat: int, width: int) -> tuple[int, int]:
    """(row, block) of flat byte ``flat`` of output ``role`` (0 data, 1 scale) of ``width`` bytes a row."""
    row, col = divmod(flat, width)
    if role == 1:
        return row, col
    per_block = NVFP4_BLOCK // 2 if item.decision.format == "nvfp4" else MXFP8_BLOCK
    return row, col // per_block


def difference(
    ctx: Context, item: PlannedTensor, actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> tuple[str, str] | None:
    """``(tensor, detail)`` of the first output that differs, with its first differing block; None if equal."""
    for role, (name, tensor) in enumerate(expected.items()):
        got = actual[name]
        if same_bytes(got, tensor):
            continue
        if not item.quantized:
            a, e = got.reshape(-1), tensor.reshape(-1)
            bad = (a.view(torch.uint8) != e.view(torch.uint8)).reshape(len(a), -1).any(1).nonzero().flatten()
            i = int(bad[0])
            return name, (
                f"{bad.numel()} of {a.numel()} elements differ; first at flat index {i}: "
                f"exported {a[i].item():.6g} vs master {e[i].item():.6g}"
            )
        if role >= 2:  # the FP32 global (or input) scale
            return name, (
                f"{got.float().reshape(-1)[0].item():.9g} vs expected {tensor.float().reshape(-1)[0].item():.9g} "
                f"({ulps_apart(got, tensor):+d} ulp)"
            )
        a = got.contiguous().view(torch.uint8)
        e = tensor.contiguous().view(torch.uint8)
        bad = (a != e).reshape(-1).nonzero().flatten()
        row, block = _where(item, role, int(bad[0]), e.shape[-1])
        per = NVFP4_BLOCK if item.decision.format == "nvfp4" else MXFP8_BLOCK
        master = ctx.master_piece(item)[row, block * per : (block + 1) * per].cpu()
        return name, (
            f"{bad.numel()} of {e.numel()} bytes differ; first at row {row}, block {block}: "
            f"exported {_fmt(_block_values(ctx.plan, item, actual, row, block))} vs expected "
            f"{_fmt(_block_values(ctx.plan, item, expected, row, block))} (master {_fmt(master)})"
        )
    return None
