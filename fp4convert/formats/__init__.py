"""The numeric core: TransformerEngine-exact NVFP4 and MXFP8 quantizers (no I/O).

The arithmetic is specified in docs/formats.md. Modules: :mod:`~fp4convert.formats.spec` (bit
constants), :mod:`~fp4convert.formats.codecs` (element/scale codecs),
:mod:`~fp4convert.formats.profiles` (every scale chain, side by side),
:mod:`~fp4convert.formats.four_over_six` (TE's 4over6 candidate choice),
:mod:`~fp4convert.formats.nvfp4`, :mod:`~fp4convert.formats.mxfp8` (the quantizers; they choose
between the reference and a kernel), :mod:`~fp4convert.formats.layouts` (scale padding and
swizzling), :mod:`~fp4convert.formats.kernels` (fast exact CPU/CUDA paths only) and
:mod:`~fp4convert.formats.segments` (many tensors quantized by one launch, read in place).
"""

from __future__ import annotations

import torch

from fp4convert.formats.layouts import ScaleLayout, from_layout, to_layout
from fp4convert.formats.mxfp8 import MXFP8Tensor, dequantize_mxfp8, quantize_mxfp8
from fp4convert.formats.nvfp4 import NVFP4Tensor, dequantize_nvfp4, quantize_nvfp4
from fp4convert.formats.profiles import PROFILES, Profile

__all__ = [
    "PROFILES",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "Profile",
    "ScaleLayout",
    "dequantize",
    "from_layout",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "to_layout",
]


def dequantize(q: NVFP4Tensor | MXFP8Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize an :class:`NVFP4Tensor` (row-wise copy) or an :class:`MXFP8Tensor` to ``dtype``.

    Example:
        >>> import torch
        >>> from fp4convert import dequantize, quantize_nvfp4
        >>> dequantize(quantize_nvfp4(torch.full((1, 16), 3.0)))[0, :2].tolist()
        [3.0, 3.0]
    """
    if isinstance(q, NVFP4Tensor):
        return dequantize_nvfp4(q, dtype=dtype)
    return dequantize_mxfp8(q, dtype=dtype)
