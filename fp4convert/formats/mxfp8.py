"""MXFP8: E4M3 values, one E8M0 power-of-two scale per 32 values, no outer scale (quantizers.md 5).

Row-wise blocks are 32 consecutive values of a row; column-wise blocks are 32 consecutive rows of a
column. The two copies are quantized independently from high precision (they differ numerically).
The column-wise data keep the source shape (not transposed), as in TransformerEngine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError
from fp4convert.formats.codecs import (
    e4m3_decode,
    e4m3_encode,
    e8m0_decode,
    e8m0_encode_roundup,
    e8m0_inverse,
    nan_ignoring_abs,
)
from fp4convert.formats.spec import E4M3, MXFP8_BLOCK

__all__ = ["MXFP8Tensor", "dequantize_mxfp8", "mxfp8_matrix_reference", "quantize_mxfp8"]

Axis = Literal["row", "col"]
AXES: tuple[str, ...] = get_args(Axis)
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class MXFP8Tensor:
    """A tensor quantized to MXFP8 (compact, unswizzled layout).

    Attributes:
        shape: logical shape of the source tensor.
        dtype: source dtype.
        axis: ``"row"`` (1x32 blocks along the last dim) or ``"col"`` (32x1 along dim -2).
        data: uint8 E4M3 bytes, same shape as the source (also for ``axis="col"``).
        scale: uint8 E8M0 exponents: ``(..., rows, cols/32)`` for row, ``(..., rows/32, cols)``
            for col; the block's scale is ``2**(e - 127)``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    axis: str
    data: torch.Tensor
    scale: torch.Tensor


def mxfp8_matrix_reference(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``x2d (M, N)`` in 1x32 blocks: the pure-torch reference.

    Per block: ``a = max|x|`` ignoring NaN; ``v = rn32(a * rn32(1/448))`` (a multiply, as TE);
    ``e`` = E8M0 round-up of ``v``; data = E4M3 satfinite RNE of ``rn32(x * 2**(127 - e))``.

    Returns:
        ``(data (M, N) uint8 E4M3, scale (M, N/32) uint8 E8M0)``.
    """
    rows, cols = x2d.shape
    blocks = x2d.float().reshape(rows, cols // MXFP8_BLOCK, MXFP8_BLOCK)
    amax = nan_ignoring_abs(blocks).amax(dim=-1)
    one = torch.tensor(1.0, dtype=torch.float32, device=x2d.device)
    r448 = torch.div(one, torch.tensor(E4M3.max, dtype=torch.float32, device=x2d.device))
    e = e8m0_encode_roundup(amax * r448)
    data = e4m3_encode(blocks * e8m0_inverse(e).unsqueeze(-1))
    return data.reshape(rows, cols), e


def _check_input(x: torch.Tensor, axis: str) -> None:
    if x.dtype not in INPUT_DTYPES:
        raise FormatError(
            f"MXFP8 input has dtype {x.dtype}, expected bfloat16, float16 or float32",
            hint="cast the tensor first (x.float())",
            found=str(x.dtype),
        )
    if axis not in AXES:
        raise FormatError(f"unknown MXFP8 axis {axis!r}", hint="use 'row' or 'col'", found=axis)
    if x.ndim < 2:
        raise FormatError(
            f"MXFP8 input has shape {tuple(x.shape)}: at least 2 dims are needed (rows, cols)",
            hint="1-D tensors (biases, norms) stay in high precision",
            found=tuple(x.shape),
        )
    dim = -1 if axis == "row" else -2
    if x.shape[dim] % MXFP8_BLOCK:
        raise FormatError(
            f"shape {tuple(x.shape)}: {'last dim' if axis == 'row' else 'rows'} {x.shape[dim]} "
            f"not divisible by the MXFP8 block size 32 (axis={axis!r})",
            hint="keep this tensor in BF16 or pad it",
            found=tuple(x.shape),
            expected=f"shape[{dim}] % 32 == 0",
        )


def quantize_mxfp8(
    x: torch.Tensor, *, axis: Axis = "row", backend: Literal["auto", "reference"] = "auto"
) -> MXFP8Tensor:
    """Quantize ``x`` to MXFP8, byte-identical to TransformerEngine's ``MXFP8Quantizer`` (E4M3).

    Args:
        x: bf16, fp16 or fp32 tensor of 2 or more dims, CPU or CUDA.
        axis: ``"row"`` (blocks of 32 along the last dim) or ``"col"`` (32 rows of a column).
        backend: ``"auto"`` (fastest exact kernel) or ``"reference"`` (pure torch).

    Returns:
        An :class:`MXFP8Tensor`.

    Raises:
        FormatError: wrong dtype, too few dims, or the blocked dim not divisible by 32.

    Example:
        >>> import torch
        >>> from fp4convert import quantize_mxfp8
        >>> q = quantize_mxfp8(torch.ones(1, 32))
        >>> hex(q.scale[0, 0].item()), hex(q.data[0, 0].item())
        ('0x77', '0x78')
    """
    _check_input(x, axis)
    from fp4convert.formats import kernels

    matrix = mxfp8_matrix_reference if backend == "reference" else kernels.mxfp8_matrix
    src = x if axis == "row" else x.transpose(-1, -2).contiguous()
    cols = src.shape[-1]
    data, scale = matrix(src.reshape(-1, cols))
    data = data.reshape(src.shape)
    scale = scale.reshape(*src.shape[:-1], cols // MXFP8_BLOCK)
    if axis == "col":
        data = data.transpose(-1, -2).contiguous()
        scale = scale.transpose(-1, -2).contiguous()
    return MXFP8Tensor(shape=tuple(x.shape), dtype=x.dtype, axis=axis, data=data, scale=scale)


def dequantize_mxfp8(q: MXFP8Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize: ``e4m3(data) * 2**(scale - 127)``, in float32, cast once to ``dtype``."""
    values = e4m3_decode(q.data)
    factor = e8m0_decode(q.scale)
    dim = -1 if q.axis == "row" else -2
    factor = factor.repeat_interleave(MXFP8_BLOCK, dim=dim)
    return (values * factor).to(dtype)
