"""The lossless proof of ``verify --source``: dequantize(output) == dequantize(source), bit for bit.

For every quantized tensor the plan calls lossless (:func:`fp4convert.contract.lossless.lossless`),
the dialect's tensors are decoded the way engines decode them (NVFP4: ``e2m1 * float(weight_scale)
* decode_scale``, MXFP8: ``e4m3 * 2**(e - 127)``, in float32) and compared bit for bit with the
source's own dequantized values (the BF16 master every consumer reads). A ``lossless: True`` tensor
that differs fails verification; a value-dependent one (``None``, e.g. the mxfp4-cast profile)
reports what it measured and passes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fp4convert.dialects import Dialect
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, e8m0_decode, unpack_fp4
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.plan import PlannedTensor

__all__ = ["decoded_output", "lossless_finding"]


def decoded_output(item: PlannedTensor, tensors: Mapping[str, torch.Tensor], dialect: Dialect) -> torch.Tensor:
    """The float32 values ``item``'s quantized outputs decode to (see the module docstring)."""
    fmt = item.decision.format

    def role(name: str) -> torch.Tensor:
        out = dialect.output_name(item.module, fmt, name)
        assert out is not None
        return tensors[out].cpu()

    data, scale = role("data"), role("scale").reshape(-1).view(torch.uint8)
    rows = data.shape[0]
    if fmt == "nvfp4":
        values = e2m1_decode(unpack_fp4(data)).reshape(rows, -1, NVFP4_BLOCK)
        factor = e4m3_decode(scale).reshape(rows, -1, 1) * dialect.decode_scale(role("global")).reshape(())
        return (values * factor).reshape(rows, -1)
    values = e4m3_decode(data.reshape(-1).view(torch.uint8)).reshape(rows, -1)
    factor = e8m0_decode(scale).reshape(rows, -1).repeat_interleave(MXFP8_BLOCK, dim=1)[:, : values.shape[1]]
    return values * factor


def lossless_finding(
    item: PlannedTensor, source: torch.Tensor, tensors: Mapping[str, torch.Tensor], dialect: Dialect
) -> tuple[bool, str] | None:
    """``(ok, detail)`` of the lossless check of one quantized tensor, or None where there is none
    (lossy by construction, or copied as is: the byte comparison already covers a copy).

    Args:
        item: the planned tensor (its ``lossless`` verdict).
        source: its source values (the dequantized BF16 master).
        tensors: its dialect tensors, as written (or as re-derived: they are compared byte for byte too).
        dialect: the dialect they are in.
    """
    if item.lossless.lossless is False or not item.quantized:
        return None
    got = decoded_output(item, tensors, dialect).reshape(source.shape).contiguous()
    want = source.cpu().float().contiguous()
    differ = got.view(torch.int32) != want.view(torch.int32)
    count = int(differ.sum())
    if count == 0:
        return True, "dequantized output equals the dequantized source bit for bit"
    first = tuple(int(i) for i in differ.nonzero()[0])
    detail = (
        f"{count} of {want.numel()} values differ from the dequantized source; first at {first}: "
        f"{float(got[first])!r} != {float(want[first])!r}"
    )
    if item.lossless.lossless is None:
        return True, f"not lossless ({item.lossless.why}): {detail}"
    return False, f"claimed lossless ({item.lossless.why}), but {detail}"
