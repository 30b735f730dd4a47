"""Arithmetic profiles: the three NVFP4 scale chains, side by side (quantizers.md sections 1.2, 7).

All three produce packed E2M1 data and E4M3 block scales from the same inputs; they differ only in
the order of the fp32 operations that turn amaxes into scales, which moves a few scale bytes and
nibbles (about 0.1% of blocks on random data). Every step below is one IEEE fp32 operation
(``rn32``); tensors are divided by tensors on their own device, never by Python scalars
(quantizers.md section 9: ``2688.0 / t`` is ``reciprocal(t) * 2688`` in PyTorch).

=========  =====================================  =====================================  =============
profile    block decode scale ``d`` -> E4M3 ``sf``  encode multiplier for the block        zero block
=========  =====================================  =====================================  =============
te         ``a_b * rn32(S_enc * rn32(1/6))``        ``rn32(1 / rn32(sf * S_dec))``         ``sf = 0x00``
te-2.13    ``rn32(a_b / 6) * S_enc``                same as te                              ``sf = 0x00``
modelopt   ``a_b / rn32(6 * s2)``, 0 -> 1.0,        divide: ``x / rn32(sf * s2)``          ``sf = 0x38``
           clamped to [2**-9, 448]
=========  =====================================  =====================================  =============

with ``S_enc = rn32(2688 / A)`` (inf -> FLT_MAX; A == 0 or S_enc == 0 -> 1.0), ``S_dec = rn32(1 / S_enc)``
and ModelOpt's ``s2 = rn32(A / 2688)``.

* ``te``: TransformerEngine >= 2.14 (PR #2555) kernels and python reference, and FlashInfer with
  ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1``. The default.
* ``te-2.13``: TE <= 2.13's python reference and transpose kernel, which divide by 6 first.
* ``modelopt``: ``modelopt.torch.quantization.qtensor.NVFP4QTensor.quantize`` on CPU. ModelOpt leaves
  ``-0.0`` unsigned (code 0x0). For an all-zero tensor ModelOpt computes ``0 / 0`` and writes NaN
  scales; this profile defines that case as scale 1.0 (0x38) with zero data. (On CUDA ModelOpt's
  ``amax / 2688`` multiplies by a reciprocal, so its ``s2`` can differ by one ulp from this profile.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError
from fp4convert.formats.codecs import e2m1_encode, e4m3_decode, e4m3_encode
from fp4convert.formats.spec import E2M1, E4M3, FLT_MAX, NVFP4_GLOBAL_MAX

__all__ = ["PROFILES", "OuterScales", "Profile", "check_profile", "outer_scales"]

Profile = Literal["te", "te-2.13", "modelopt"]
PROFILES: tuple[str, ...] = get_args(Profile)

_MODELOPT_MIN_SCALE = 2.0**-9  # ModelOpt clamps block scales to the smallest E4M3 subnormal


def check_profile(profile: str) -> Profile:
    """Return ``profile`` if it is a known profile name, else raise a :class:`FormatError`."""
    if profile not in PROFILES:
        raise FormatError(
            f"unknown quantizer profile {profile!r}",
            hint=f"use one of {', '.join(PROFILES)}",
            field="profile",
            found=profile,
        )
    return profile  # type: ignore[return-value]


@functools.lru_cache(maxsize=64)
def _device_const(value: float, device: torch.device) -> torch.Tensor:
    # Cached: building a CUDA scalar from a Python number is a blocking host-to-device copy, and
    # the scale chain needs a handful per call. The tensors are never written to.
    return torch.tensor(value, dtype=torch.float32, device=device)


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    return _device_const(value, like.device)


@dataclass(frozen=True)
class OuterScales:
    """Per-row outer (second-level) scales, all float32 of one shape (one entry per scope unit).

    Attributes:
        amax: the raw amax (what TE stores as ``_amax_rowwise``).
        s_enc: global encode scale (te profiles) or ``1 / s2`` (modelopt; informative only).
        s_dec: global decode scale: TE's ``rn32(1 / S_enc)``, or ModelOpt's ``s2 = A / 2688``.
            This is what a checkpoint stores as ``weight_scale_2``.
        mult: the per-tensor factor the block amax is combined with: ``S_enc * rn32(1/6)`` (te),
            ``S_enc`` (te-2.13), ``rn32(6 * s2)`` (modelopt).
    """

    amax: torch.Tensor
    s_enc: torch.Tensor
    s_dec: torch.Tensor
    mult: torch.Tensor


def outer_scales(
    amax: torch.Tensor,
    profile: Profile,
    *,
    encode_scale: torch.Tensor | None = None,
    decode_scale: torch.Tensor | None = None,
) -> OuterScales:
    """Compute the outer scales for each amax under ``profile`` (see the module table).

    Args:
        amax: float32 amaxes, any shape (one per scope unit).
        profile: the profile.
        encode_scale: impose ``S_enc`` (not modelopt): ``S_dec`` and ``mult`` then follow from it,
            as in an exporter that computed ``S_enc`` its own way.
        decode_scale: impose the decode scale the blocks are encoded with: TE's ``S_dec`` (the
            block scales still follow ``S_enc`` from the amax: an exporter whose ``1 / S_enc`` is
            approximate), or ModelOpt's ``s2`` (its ``mult`` follows from it).
    """
    a = amax.float()
    if profile == "modelopt":
        if encode_scale is not None:
            raise FormatError("the modelopt profile has no encode scale to impose", hint="impose decode_scale (s2)")
        s2 = torch.div(a, _const(NVFP4_GLOBAL_MAX, a)) if decode_scale is None else decode_scale.float()
        return OuterScales(a, torch.div(_const(1.0, a), s2), s2, s2 * E2M1.max)
    if encode_scale is None:
        s_enc = torch.div(_const(NVFP4_GLOBAL_MAX, a), a)
        s_enc = torch.where(s_enc.isinf(), _const(FLT_MAX, a), s_enc)
        s_enc = torch.where((a == 0) | (s_enc == 0), _const(1.0, a), s_enc)
    else:
        s_enc = encode_scale.float().expand_as(a)
    s_dec = torch.div(_const(1.0, a), s_enc) if decode_scale is None else decode_scale.float().expand_as(a)
    if profile == "te":
        mult = s_enc * torch.div(_const(1.0, a), _const(E2M1.max, a))
    else:  # te-2.13 multiplies by S_enc after dividing the block amax by 6
        mult = s_enc
    return OuterScales(a, s_enc, s_dec, mult)


def block_scale_bytes(block_amax: torch.Tensor, outer: OuterScales, profile: Profile) -> torch.Tensor:
    """E4M3 block decode-scale bytes from block amaxes ``[..., nb]`` and per-row ``outer`` ``[..., 1]``."""
    if profile == "te":
        return e4m3_encode(block_amax * outer.mult)
    if profile == "te-2.13":
        return e4m3_encode(torch.div(block_amax, _const(E2M1.max, block_amax)) * outer.mult)
    psc = torch.div(block_amax, outer.mult)
    psc = torch.where(psc == 0, _const(1.0, psc), psc)
    psc = torch.where(outer.s_dec == 0, _const(1.0, psc), psc)  # all-zero tensor: 0/0 in ModelOpt
    return e4m3_encode(psc.clamp(_MODELOPT_MIN_SCALE, E4M3.max))


def encode_blocks(
    blocks: torch.Tensor, scale_bytes: torch.Tensor, outer: OuterScales, profile: Profile
) -> torch.Tensor:
    """E2M1 codes for float32 ``blocks [..., nb, 16]`` given their scale bytes ``[..., nb]``."""
    sf = e4m3_decode(scale_bytes).unsqueeze(-1)
    s_dec = outer.s_dec.unsqueeze(-1)
    if profile == "modelopt":
        y = torch.div(blocks, sf * s_dec)
        y = torch.where(s_dec == 0, torch.zeros_like(y), y)  # all-zero tensor
        return e2m1_encode(y, signed_zero=False)
    enc = torch.div(_const(1.0, sf), sf * s_dec).clamp_max(FLT_MAX)  # 1/0 = inf -> FLT_MAX
    return e2m1_encode(blocks * enc)


def dequant_block_scale(scale_bytes: torch.Tensor, outer: OuterScales, profile: Profile) -> torch.Tensor:
    """The float32 factor one block's E2M1 values are multiplied by to dequantize.

    te profiles follow TE's ``dequantize_fp4_kernel``: ``rn32(rn32(sf * A) * rn32(1/2688))``;
    modelopt follows ``NVFP4QTensor.dequantize``: ``rn32(sf * s2)``.
    """
    sf = e4m3_decode(scale_bytes)
    if profile == "modelopt":
        return sf * outer.s_dec
    inv_global_max = torch.div(_const(1.0, sf), _const(NVFP4_GLOBAL_MAX, sf))
    return (sf * outer.amax) * inv_global_max
