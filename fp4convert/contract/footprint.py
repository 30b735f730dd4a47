"""What a decision means for a tensor's bytes and block fit (used by ``diff`` and ``lint``).

Bytes are the weight storage a checkpoint writes for one tensor (the layouts of ``docs/dialects.md``):

* ``bf16``: 2 bytes per value for GEMM weights; tensors that are never quantized keep their
  checkpoint dtype.
* ``nvfp4``: one byte per two values, one E4M3 byte per 16 values of a row (the on-disk layout is
  ``[rows, cols/16]`` for both tiles; a 16x16 tile repeats its scale over its 16 rows), and
  4 bytes per FP32 outer scale: one per tensor, per expert (the leading dimension of a 3-D
  grouped tensor), or per row. Per-tensor activation scales (``input_scale``) are not counted:
  they belong to the output dialect, not to the weight.
* ``mxfp8``: one byte per value plus one E8M0 byte per 32 values of a row.
"""

from __future__ import annotations

import math

from fp4convert.contract.decision import Decision
from fp4convert.contract.sections import MXFP8Recipe, NVFP4Recipe
from fp4convert.errors import MappingError
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.inventory import TensorInfo

__all__ = ["fits_blocks", "storage_bytes"]

_DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e8m0fnu": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def fits_blocks(shape: tuple[int, ...], block_shape: tuple[int, int]) -> bool:
    """True if the last two dims of ``shape`` divide into ``(rows, cols)`` blocks.

    Example:
        >>> fits_blocks((4096, 11000), (1, 16)), fits_blocks((24, 64), (16, 16))
        (False, False)
    """
    rows, cols = block_shape
    if not shape or shape[-1] % cols:
        return False
    return rows == 1 or (len(shape) >= 2 and shape[-2] % rows == 0)


def storage_bytes(tensor: TensorInfo, decision: Decision) -> int:
    """Bytes ``tensor`` takes in a checkpoint under ``decision`` (see the module docstring).

    Raises:
        MappingError: the shape is unknown, or a kept tensor's dtype is not a known torch dtype.

    Example:
        >>> from fp4convert.contract.sections import NVFP4Recipe
        >>> t = TensorInfo("w", (256, 128), gemm_weight=True)
        >>> d = Decision("w", "nvfp4", NVFP4Recipe(), "rules[0]", "", ())
        >>> storage_bytes(t, d)  # 128*256/2 values + 256*8 scales + 4 outer scale
        18436
    """
    if not tensor.shape:
        raise MappingError(
            f"tensor '{tensor.name}' has no shape, so its size is unknown",
            hint="give every tensor a shape in the model's tensor list",
            tensor=tensor.name,
        )
    numel = tensor.numel
    cols = tensor.shape[-1]
    rows = numel // cols if cols else 0
    recipe = decision.recipe
    if isinstance(recipe, NVFP4Recipe):
        outer = {"tensor": 1, "expert": tensor.shape[0] if len(tensor.shape) == 3 else 1, "row": rows}
        return math.ceil(numel / 2) + rows * math.ceil(cols / NVFP4_BLOCK) + 4 * outer[recipe.weight_scale_scope]
    if isinstance(recipe, MXFP8Recipe):
        return numel + rows * math.ceil(cols / MXFP8_BLOCK)
    if tensor.gemm_weight:
        return 2 * numel
    if tensor.dtype not in _DTYPE_BYTES:
        raise MappingError(
            f"tensor '{tensor.name}' has unknown dtype '{tensor.dtype}'",
            hint=f"use a torch dtype name: {', '.join(_DTYPE_BYTES)}",
            tensor=tensor.name,
        )
    return _DTYPE_BYTES[tensor.dtype] * numel
