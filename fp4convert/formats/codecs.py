"""Element and scale codecs: float32 <-> E2M1 codes, E4M3 bytes, E8M0 exponents (pure torch).

Each encoder is the exact hardware conversion TransformerEngine's kernels use
(docs/formats.md, "Element codecs"): round to nearest, ties to even, saturating to the largest
finite value. Decoders are exact. Every function works on any device; constants are created
on the input's device (:func:`scalar_like`) so no CPU-scalar fast path (multiply by a
reciprocal) can sneak in.
"""

from __future__ import annotations

import functools

import torch

from fp4convert.formats.spec import E4M3

__all__ = [
    "E2M1_VALUES",
    "e2m1_decode",
    "e2m1_encode",
    "e4m3_decode",
    "e4m3_encode",
    "e8m0_decode",
    "e8m0_encode_roundup",
    "e8m0_inverse",
    "nan_ignoring_abs",
    "pack_fp4",
    "scalar_like",
    "unpack_fp4",
]

#: E2M1 code -> value, codes 0..15 (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Round-to-nearest-even decision points on the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}. A tie goes to
# the even code: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5.0->4.0; above 5 -> 6.
# ">" at a threshold means the tie rounds down, ">=" means it rounds up.
_E2M1_STRICT = (0.25, 1.25, 2.5, 5.0)
_E2M1_INCLUSIVE = (0.75, 1.75, 3.5)

_E4M3_NAN = 0x7F
_E2M1_NAN_CODE = 0x7  # cvt.rn.satfinite.e2m1x2.f32 maps NaN to +6 (TE ptx.cuh comment)


@functools.lru_cache(maxsize=64)
def _device_scalar(value: float, device: torch.device) -> torch.Tensor:
    # Cached: building a CUDA scalar from a Python number is a blocking host-to-device copy, and
    # a scale chain needs a handful per call. The tensors are never written to.
    return torch.tensor(value, dtype=torch.float32, device=device)


def scalar_like(value: float, like: torch.Tensor) -> torch.Tensor:
    """A float32 0-d tensor holding ``value`` on ``like``'s device (read only).

    Scale arithmetic divides tensors by tensors: PyTorch turns ``2688.0 / t`` into
    ``reciprocal(t) * 2688``, which is not correctly rounded (docs/formats.md, "Pitfalls").
    """
    return _device_scalar(value, like.device)


def nan_ignoring_abs(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` as float32 with NaN replaced by 0, so every max over it ignores NaN like TE's
    ``fmaxf``/``__hmax`` reductions do (docs/formats.md, "NVFP4" step 1); +inf is kept."""
    return x.float().abs().nan_to_num(nan=0.0, posinf=float("inf"))


def e2m1_encode(y: torch.Tensor, *, signed_zero: bool = True) -> torch.Tensor:
    """float32 -> E2M1 codes (uint8 0..15), RNE, saturating at +-6.

    Args:
        y: float32 values already multiplied by the encode scale.
        signed_zero: take the sign from the sign bit, so -0.0 and small negatives give 0x8 (the
            hardware ``cvt`` and FlashInfer's reference). False takes it from ``y < 0`` (ModelOpt:
            -0.0 gives 0x0). NaN always gives 0x7, as the hardware does.

    Returns:
        uint8 codes with the sign in bit 3.
    """
    mag = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for t in _E2M1_STRICT:
        code += mag > t
    for t in _E2M1_INCLUSIVE:
        code += mag >= t
    negative = torch.signbit(y) if signed_zero else y < 0
    nan = y.isnan()
    code |= (negative & ~nan).to(torch.uint8) << 3
    return torch.where(nan, torch.full_like(code, _E2M1_NAN_CODE), code)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> float32 values."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return lut[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack pairs of E2M1 codes along the last dim: the even element goes in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: uint8 ``[..., n/2]`` -> codes ``[..., n]``."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def e4m3_encode(d: torch.Tensor) -> torch.Tensor:
    """float32 -> E4M3 bytes with ``satfinite`` semantics: RNE, subnormals kept, |d| > 448 -> 448,
    +-inf -> +-448, NaN -> 0x7F (``__nv_cvt_float_to_fp8(..., __NV_SATFINITE, E4M3)``)."""
    clamped = d.clamp(-E4M3.max, E4M3.max)  # the cast itself would map overflow to NaN
    raw = clamped.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(d.isnan(), torch.full_like(raw, _E4M3_NAN), raw)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes (uint8) -> float32."""
    return codes.view(torch.float8_e4m3fn).float()


def e8m0_encode_roundup(v: torch.Tensor) -> torch.Tensor:
    """float32 ``v >= 0`` -> E8M0 exponent of the smallest power of two >= v
    (``cvt.rp.satfinite.ue8m0x2.f32``, docs/formats.md, "MXFP8" step 3).

    NaN -> 0xFF; +inf and anything above 2**127 -> 0xFE; 0 and v <= 2**-127 -> 0x00.
    """
    bits = v.float().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    normal = exponent > 0
    # A normal value with a mantissa rounds up one exponent, unless it is already 254 (satfinite).
    bump_normal = normal & (mantissa != 0) & (exponent < 0xFE)
    # A subnormal above 2**-127 (mantissa > 0x400000) rounds up to 2**-126.
    bump_subnormal = ~normal & (mantissa > 0x400000)
    e = exponent + bump_normal.int() + bump_subnormal.int()
    e = torch.where(exponent == 0xFF, torch.full_like(e, 0xFE), e)  # +inf -> 2**127
    e = torch.where(v.isnan(), torch.full_like(e, 0xFF), e)
    return e.to(torch.uint8)


def e8m0_decode(e: torch.Tensor) -> torch.Tensor:
    """E8M0 byte -> the float32 scale ``2**(e - 127)`` (0x00 -> 2**-127, 0xFF -> NaN)."""
    out = torch.ldexp(torch.ones(e.shape, dtype=torch.float32, device=e.device), e.int() - 127)
    return torch.where(e == 0xFF, torch.full_like(out, float("nan")), out)


def e8m0_inverse(e: torch.Tensor) -> torch.Tensor:
    """E8M0 byte -> ``2**(127 - e)`` exactly (TE ``exp2f_rcp``; 0xFF -> NaN)."""
    out = torch.ldexp(torch.ones(e.shape, dtype=torch.float32, device=e.device), 127 - e.int())
    return torch.where(e == 0xFF, torch.full_like(out, float("nan")), out)
