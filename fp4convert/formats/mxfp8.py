"""MXFP8: E4M3 values, one E8M0 power-of-two scale per 32 values, no outer scale (docs/formats.md, "MXFP8").

Row-wise blocks are 32 consecutive values of a row; column-wise blocks are 32 consecutive rows of a
column. The two copies are quantized independently from high precision (they differ numerically).
The column-wise data keep the source shape (not transposed), as in TransformerEngine. This module
chooses between the fast kernel (:mod:`fp4convert.formats.kernels`) and the reference here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError
from fp4convert.formats import kernels, profiles
from fp4convert.formats.codecs import (
    e4m3_decode,
    e4m3_encode,
    e8m0_encode_roundup,
    e8m0_inverse,
    nan_ignoring_abs,
    scalar_like,
)
from fp4convert.formats.spec import E4M3, MXFP8_BLOCK

__all__ = ["MXFP8Tensor", "dequantize_mxfp8", "mxfp8_matrix", "mxfp8_matrix_reference", "quantize_mxfp8"]

Backend = Literal["auto", "reference"]
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
    r448 = torch.div(scalar_like(1.0, blocks), scalar_like(E4M3.max, blocks))
    e = e8m0_encode_roundup(amax * r448)
    data = e4m3_encode(blocks * e8m0_inverse(e).unsqueeze(-1))
    return data.reshape(rows, cols), e


def mxfp8_matrix(x2d: torch.Tensor, *, backend: Backend = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mxfp8_matrix_reference` through the fastest exact path for the device (same bytes)."""
    if backend == "auto" and kernels.has_fast_path(x2d):
        return kernels.mxfp8_matrix(x2d)
    return mxfp8_matrix_reference(x2d)


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


def quantize_mxfp8(x: torch.Tensor, *, axis: Axis = "row", backend: Backend = "auto") -> MXFP8Tensor:
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
    if backend not in get_args(Backend):
        raise FormatError(f"unknown backend {backend!r}", hint="use 'auto' or 'reference'", found=backend)
    if axis == "col" and backend == "auto":
        found = kernels.mxfp8_col_matrix(x.reshape(-1, x.shape[-1]))  # 32-row blocks never straddle matrices
        if found is not None:
            data, scale = found
            lead, rows, cols = tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]
            return MXFP8Tensor(
                shape=tuple(x.shape),
                dtype=x.dtype,
                axis=axis,
                data=data.reshape(x.shape),
                scale=scale.reshape(*lead, rows // MXFP8_BLOCK, cols),
            )
    src = x if axis == "row" else x.transpose(-1, -2).contiguous()
    cols = src.shape[-1]
    if src.dim() == 2:  # (the public calls are host-bound on a GPU: no views where none is needed)
        data, scale = mxfp8_matrix(src, backend=backend)
    else:
        data, scale = mxfp8_matrix(src.reshape(-1, cols), backend=backend)
        data = data.reshape(src.shape)
        scale = scale.reshape(*src.shape[:-1], cols // MXFP8_BLOCK)
    if axis == "col":
        data = data.transpose(-1, -2).contiguous()
        scale = scale.transpose(-1, -2).contiguous()
    return MXFP8Tensor(shape=tuple(x.shape), dtype=x.dtype, axis=axis, data=data, scale=scale)


def dequantize_mxfp8(
    q: MXFP8Tensor, *, dtype: torch.dtype = torch.float32, profile: profiles.MXFP8Profile = "te"
) -> torch.Tensor:
    """Dequantize: ``e4m3(data) * 2**(scale - 127)``, in float32, cast once to ``dtype``.

    ``profile="te-2.18"`` decodes the E8M0 scale as TE <= 2.18 did (code 0 -> 0.0, code 255 -> +inf;
    :func:`fp4convert.formats.profiles.mxfp8_scale_decode`), e.g. to reproduce what such a TE's
    ``dequantize()`` gave for a block of subnormal values.

    Example:
        >>> import torch
        >>> q = quantize_mxfp8(torch.full((1, 32), 1e-40))
        >>> q.scale[0, 0].item(), dequantize_mxfp8(q)[0, 0].item() > 0
        (0, True)
        >>> dequantize_mxfp8(q, profile="te-2.18")[0, 0].item()
        0.0
    """
    values = e4m3_decode(q.data)
    factor = profiles.mxfp8_scale_decode(q.scale, profile)
    dim = -1 if q.axis == "row" else -2
    factor = factor.repeat_interleave(MXFP8_BLOCK, dim=dim)
    return (values * factor).to(dtype)
