"""The source dequantizers: FP8 block-scaled, FP8 per-channel and MXFP4 weights to BF16, each defined once.

Every consumer of a quantized source reads its BF16 values from here (``convert``, ``to-megatron``,
``verify --source``, ``validate-export --master``, ``dequantize``), so the sampler converted from an
FP8 release and the learner imported from it start from the same bytes (docs/sources.md).

* **FP8 block-scaled** (DeepSeek's reference cast, ``inference/kernel.py`` ``weight_dequant`` as
  used by ``fp8_cast_bf16.py``): ``W[i, j] = bf16(rn32(float(w[i, j]) * s[i // bm, j // bn]))``,
  one IEEE fp32 multiply rounded to nearest even, then one round to nearest even to BF16. ``s`` is
  the stored ``weight_scale_inv`` (F32; BF16 and E8M0 scales widen to fp32 exactly). Edge blocks
  (dims not multiples of the block) use their grid cell like any other.
* **FP8 per channel** (compressed-tensors ``float-quantized``, ``strategy: channel``; GLM-4.5-FP8):
  ``W[i, j] = bf16(rn32(float(w[i, j]) * s[i]))`` with ``s`` the ``[out, 1]`` ``weight_scale``, as
  compressed-tensors' ``dequantize`` computes it (its product in the scale's dtype is exact).
* **MXFP4** (OCP MX; gpt-oss): ``W = bf16(e2m1(code) * 2**(e - 127))`` with the even element in the
  low nibble; exact (every such value is a BF16 value unless it overflows).

Scales are checked before any value is used (:func:`check_fp8_scales`, :func:`check_mxfp4_scales`):
NaN, infinite, zero or negative FP8 scales, a non-power-of-two scale under ``scale_fmt: ue8m0``,
and the E8M0 NaN code 0xFF are errors naming the tensor and the first bad block.
"""

from __future__ import annotations

import numpy as np
import torch

from fp4convert.errors import CheckpointError
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, e8m0_decode, unpack_fp4
from fp4convert.formats.spec import E8M0

__all__ = [
    "DEQUANTIZERS",
    "MXFP4_BLOCK",
    "check_fp8_scales",
    "check_mxfp4_scales",
    "dequantize_fp8_block",
    "dequantize_fp8_channel",
    "dequantize_mxfp4",
]

#: values per MXFP4 block (one E8M0 scale each), 16 bytes of two E2M1 codes
MXFP4_BLOCK = 32

_E4M3_VALUES = e4m3_decode(torch.arange(256, dtype=torch.uint8))  # code -> float32 (NaN at 0x7F, 0xFF)

#: source format -> the dequantizer's definition, as the manifest records it
DEQUANTIZERS = {
    "fp8-block": "bf16(rn32(float(fp8) * weight_scale_inv[i // bm, j // bn])): DeepSeek-V3 weight_dequant",
    "fp8-channel": "bf16(rn32(float(fp8) * weight_scale[i])): compressed-tensors float-quantized, channel strategy "
    "(llm-compressor FP8), as compressed-tensors' dequantize computes it",
    "mxfp4": "bf16(e2m1(code) * 2**(scale - 127)), even element in the low nibble: exact",
}


def _where(index: int, shape: tuple[int, ...]) -> str:
    coords = []
    for dim in reversed(shape):
        coords.append(index % dim)
        index //= dim
    return "block " + ", ".join(map(str, reversed(coords)))


def check_fp8_scales(name: str, scale: torch.Tensor, *, ue8m0: bool) -> None:
    """Check one ``weight_scale_inv`` (any shape): every scale finite and > 0, and a power of two
    under ``ue8m0``.

    Raises:
        CheckpointError: naming ``name`` and the first bad block.
    """
    s = scale.float().reshape(-1)
    bad = ~(torch.isfinite(s) & (s > 0))
    shape = tuple(scale.shape)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise CheckpointError(
            f"tensor {name!r}: scale {float(s[i])!r} at {_where(i, shape)} is not a finite positive number "
            f"({int(bad.sum())} of {s.numel()} scales are NaN, infinite, zero or negative)",
            hint="the checkpoint is corrupt: re-download it; an FP8 block scale must be a positive finite number",
            tensor=name,
        )
    if not ue8m0:
        return
    mantissa, _ = torch.frexp(s)
    if not bool((mantissa == 0.5).all()):
        i = int((mantissa != 0.5).nonzero()[0])
        raise CheckpointError(
            f"tensor {name!r}: scale {float(s[i])!r} at {_where(i, shape)} is not a power of two, but config.json "
            "declares scale_fmt: ue8m0",
            hint="the checkpoint and its config.json disagree: remove scale_fmt from config.json if its scales are "
            "arbitrary FP32, or re-download it",
            tensor=name,
        )


def check_mxfp4_scales(name: str, scales: torch.Tensor) -> None:
    """Check one MXFP4 ``*_scales`` tensor (uint8 E8M0): no NaN code (0xFF).

    Raises:
        CheckpointError: naming ``name`` and the first bad block.
    """
    codes = scales.reshape(-1).view(torch.uint8)
    nan = codes == E8M0.nan_code
    if bool(nan.any()):
        i = int(nan.nonzero()[0])
        raise CheckpointError(
            f"tensor {name!r}: E8M0 scale code 0xFF (NaN) at {_where(i, tuple(scales.shape))} "
            f"({int(nan.sum())} of {codes.numel()} scales)",
            hint="the checkpoint is corrupt: re-download it; an MXFP4 scale is 2**(code - 127), code 255 is NaN",
            tensor=name,
        )


def _fp8_elementwise(w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The definition, one fp32 multiply per element (any device)."""
    rows, cols = w.shape
    bm, bn = block
    out = torch.empty(rows, cols, dtype=torch.bfloat16, device=w.device)
    for r in range(0, rows, bm):  # one row block at a time: the fp32 temporary stays at bm x cols
        scale_row = s[r // bm].repeat_interleave(bn)[:cols]
        out[r : r + bm] = (w[r : r + bm].float() * scale_row).to(torch.bfloat16)
    return out


def _fp8_tables(w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The same bytes on the CPU through one 256-entry table per block: every element of a block
    shares its scale, so its BF16 value depends on its code alone. The tables are the definition
    applied to the 256 codes; each element is then one look-up (single-threaded numpy: it runs
    beside the quantizer's threads without contending for them)."""
    rows, cols = w.shape
    bm, bn = block
    codes = w.view(torch.uint8).numpy()
    tables = (_E4M3_VALUES * s.reshape(-1, 1)).to(torch.bfloat16).view(torch.int16).numpy()
    tables = tables.reshape(*s.shape, 256)
    out = np.empty((rows, cols), dtype=np.int16)
    for i in range(s.shape[0]):
        r = slice(i * bm, (i + 1) * bm)
        for j in range(s.shape[1]):
            c = slice(j * bn, (j + 1) * bn)
            out[r, c] = tables[i, j][codes[r, c]]
    return torch.from_numpy(out).view(torch.bfloat16)


def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek's reference cast of one FP8 block-scaled matrix to BF16 (see the module docstring).

    Args:
        weight: ``[rows, cols]`` float8_e4m3fn (or its uint8 bytes).
        scale_inv: ``[ceil(rows / bm), ceil(cols / bn)]`` scales (float32, bfloat16 or float8_e8m0fnu).
        block: ``(bm, bn)``, the ``weight_block_size``.

    Returns:
        ``[rows, cols]`` bfloat16 on ``weight``'s device (CPU: through per-block tables, the same
        bytes as the elementwise definition; both are tested against an independent reference).

    Example:
        >>> w = torch.tensor([[1.0, -2.0, 448.0]]).to(torch.float8_e4m3fn)
        >>> dequantize_fp8_block(w, torch.tensor([[0.5, 3.0]]), (1, 2)).tolist()
        [[0.5, -1.0, 1344.0]]
    """
    w = weight.view(torch.float8_e4m3fn) if weight.dtype == torch.uint8 else weight
    s = scale_inv.float().to(w.device)
    if w.is_cpu:
        return _fp8_tables(w, s, block)
    return _fp8_elementwise(w, s, block)


def dequantize_fp8_channel(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' per-channel FP8 cast to BF16: ``bf16(rn32(float(w[i, j]) * s[i]))``.

    compressed-tensors multiplies in the scale's dtype; an E4M3 value times a BF16 or FP32 scale is
    exact in fp32 (at most 4 + 8 significant bits), so both round once, to BF16, as here.

    Args:
        weight: ``[rows, cols]`` float8_e4m3fn (or its uint8 bytes).
        scale: ``[rows, 1]`` scales (float32 or bfloat16), one per output row.

    Example:
        >>> w = torch.tensor([[1.0, -2.0], [448.0, 0.5]]).to(torch.float8_e4m3fn)
        >>> dequantize_fp8_channel(w, torch.tensor([[0.5], [3.0]])).tolist()
        [[0.5, -1.0], [1344.0, 1.5]]
    """
    w = weight.view(torch.float8_e4m3fn) if weight.dtype == torch.uint8 else weight
    s = scale.float().to(w.device).reshape(-1, 1)
    rows = w.shape[0]
    out = torch.empty(w.shape, dtype=torch.bfloat16, device=w.device)
    step = max(1, (1 << 22) // max(1, w.shape[1]))  # rows per chunk: the fp32 temporary stays near 16 MiB
    for r in range(0, rows, step):
        out[r : r + step] = (w[r : r + step].float() * s[r : r + step]).to(torch.bfloat16)
    return out


def _mxfp4_elementwise(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    values = e2m1_decode(unpack_fp4(blocks))  # [..., G, 32] float32
    return (values * e8m0_decode(scales).unsqueeze(-1)).to(torch.bfloat16)


def _mxfp4_byte_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per byte (two E2M1 codes, low nibble first), the bits of its two BF16 values at scale code 1
    as one little-endian uint32, and which of the two are non-zero. A non-zero E2M1 value is
    ``f * 2**p`` (f in {1, 1.5}, p in -1..2), so at scale code ``e`` its BF16 exponent field is
    ``p + e`` (normal for ``2 <= e <= 252``): ``(e - 1) << 7`` added to a non-zero half of the
    table's entry gives its bits exactly, and no half carries into the other."""
    values = e2m1_decode(torch.arange(16, dtype=torch.uint8))
    mantissa, exponent = torch.frexp(values)  # |values| = |mantissa| * 2**exponent; exponent = p + 1 >= 0
    nonzero = values != 0
    magnitude = (exponent << 7) + (mantissa.abs() == 0.75).int() * 0x40
    bits = torch.where(nonzero, magnitude, torch.zeros_like(magnitude)) + torch.signbit(values).int() * 0x8000
    low, high = torch.arange(256) & 0xF, torch.arange(256) >> 4
    base = bits[low].long() | (bits[high].long() << 16)
    flags = nonzero[low].long() | (nonzero[high].long() << 16)
    return base.numpy().astype(np.uint32), flags.numpy().astype(np.uint32)


_MXFP4_BYTES = _mxfp4_byte_tables()
_MXFP4_NORMAL_CODES = (2, 252)  # scale codes whose every non-zero value is a normal BF16


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 to BF16, exactly (see the module docstring).

    Args:
        blocks: uint8 ``[..., G, 16]``: 32 E2M1 codes per block, two per byte, even element low.
        scales: uint8 ``[..., G]`` E8M0 codes (0xFF is refused by :func:`check_mxfp4_scales`).

    Returns:
        bfloat16 ``[..., G * 32]`` (CPU: the BF16 bits built from two byte tables, the same bytes as
        the elementwise definition).

    Example:
        >>> blocks = torch.zeros(1, 16, dtype=torch.uint8); blocks[0, 0] = 0x2F  # codes 0xF (-6), 0x2 (1.0)
        >>> dequantize_mxfp4(blocks, torch.tensor([126], dtype=torch.uint8))[:2].tolist()
        [-3.0, 0.5]
    """
    *lead, groups, width = blocks.shape
    b, e = blocks.view(torch.uint8), scales.view(torch.uint8)
    if not b.is_cpu:
        return _mxfp4_elementwise(b, e).reshape(*lead, groups * width * 2)
    codes = e.numpy()
    if codes.size and not (_MXFP4_NORMAL_CODES[0] <= codes.min() and codes.max() <= _MXFP4_NORMAL_CODES[1]):
        return _mxfp4_elementwise(b, e).reshape(*lead, groups * width * 2)  # subnormal or overflowing values
    base, nonzero = _MXFP4_BYTES
    data = b.numpy()
    pairs = np.take(base, data) + np.take(nonzero, data) * ((codes.astype(np.uint32) - 1) << 7)[..., None]
    return torch.from_numpy(pairs.view(np.int16)).view(torch.bfloat16).reshape(*lead, groups * width * 2)
