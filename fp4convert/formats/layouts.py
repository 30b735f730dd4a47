"""Scale-tensor layouts and their inverses (docs/formats.md, "Layouts").

* ``compact``: ``(rows, blocks)``, row-major, no padding. What checkpoints store (ModelOpt
  ``weight_scale``, compressed-tensors, SGLang ``weight_scale_inv``) and fp4convert returns.
* ``te-padded``: TE's allocation, rows rounded up to 128 and blocks to 4, padding zero-filled
  (TE leaves it undefined; consumers read only the valid region).
* ``swizzled``: the cuBLAS / FlashInfer 128x4 block layout, from the padded tensor: element
  ``(r, c)`` lands at ``((r//128)*(C/4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``.

The MXFP8 column-wise scale ``(rows/32, cols)`` is swizzled through its transpose, as TE does.
Leading dims of 3-D scales are flattened into rows first, as TE flattens its input.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError

__all__ = [
    "ScaleLayout",
    "from_layout",
    "pad_scale",
    "swizzle_scale",
    "to_layout",
    "unpad_scale",
    "unswizzle_scale",
]

ScaleLayout = Literal["compact", "te-padded", "swizzled"]
LAYOUTS: tuple[str, ...] = get_args(ScaleLayout)
ROW_TILE = 128
COL_TILE = 4


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def pad_scale(scale: torch.Tensor) -> torch.Tensor:
    """Compact ``(..., rows, blocks)`` -> zero-padded ``(roundup(R,128), roundup(blocks,4))``
    where R is the product of all dims but the last."""
    s2d = scale.reshape(-1, scale.shape[-1])
    rows, cols = s2d.shape
    out = torch.zeros(_round_up(rows, ROW_TILE), _round_up(cols, COL_TILE), dtype=scale.dtype, device=scale.device)
    out[:rows, :cols] = s2d
    return out


def unpad_scale(padded: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`pad_scale`: cut the valid region and restore the compact ``shape``."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return padded[:rows, : shape[-1]].reshape(shape).contiguous()


def _check_tiled(padded: torch.Tensor) -> tuple[int, int]:
    if padded.ndim != 2 or padded.shape[0] % ROW_TILE or padded.shape[1] % COL_TILE:
        raise FormatError(
            f"scale of shape {tuple(padded.shape)} is not a padded 2-D tile grid",
            hint="pad it first with pad_scale (rows to 128, blocks to 4)",
            found=tuple(padded.shape),
        )
    return padded.shape[0], padded.shape[1]


def swizzle_scale(padded: torch.Tensor) -> torch.Tensor:
    """Padded ``(R, C)`` -> the 128x4 swizzled layout, returned with the same ``(R, C)`` shape."""
    rows, cols = _check_tiled(padded)
    tiles = padded.reshape(rows // ROW_TILE, 4, 32, cols // COL_TILE, COL_TILE)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows, cols).contiguous()


def unswizzle_scale(swizzled: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`swizzle_scale` (returns the padded layout)."""
    rows, cols = _check_tiled(swizzled)
    tiles = swizzled.reshape(rows // ROW_TILE, cols // COL_TILE, 32, 4, COL_TILE)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows, cols).contiguous()


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise FormatError(f"unknown scale layout {layout!r}", hint=f"use one of {', '.join(LAYOUTS)}")


def to_layout(scale: torch.Tensor, layout: ScaleLayout) -> torch.Tensor:
    """Compact scale -> ``layout``.

    Example:
        >>> import torch
        >>> to_layout(torch.ones(3, 2, dtype=torch.uint8), "te-padded").shape
        torch.Size([128, 4])
    """
    _check_layout(layout)
    if layout == "compact":
        return scale
    padded = pad_scale(scale)
    return padded if layout == "te-padded" else swizzle_scale(padded)


def from_layout(scale: torch.Tensor, layout: ScaleLayout, shape: tuple[int, ...]) -> torch.Tensor:
    """``layout`` -> compact scale of ``shape`` (the compact shape, needed to cut the padding)."""
    _check_layout(layout)
    if layout == "compact":
        return scale
    padded = scale if layout == "te-padded" else unswizzle_scale(scale)
    return unpad_scale(padded, shape)
