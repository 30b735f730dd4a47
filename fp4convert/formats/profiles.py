"""Arithmetic profiles: every NVFP4 scale chain and the MXFP8 scale decodes, side by side.

This module is the one description of each chain (docs/formats.md, "Profiles"); quantizers,
kernels, dequantizers and diagnostics all take their scales from here. All NVFP4 profiles produce
packed E2M1 data and E4M3 block scales from the same inputs; they differ in the order of the fp32
operations that turn amaxes into scales and, for 4over6, in choosing between two candidate scales
per block. Every step is one IEEE fp32 operation (``rn32``); tensors are divided by tensors on
their own device, never by Python scalars (``2688.0 / t`` is ``reciprocal(t) * 2688`` in PyTorch).

=================  =====================================  ==============================  =============
profile            block decode scale ``d`` -> E4M3 ``sf``  encode multiplier for the block  zero block
=================  =====================================  ==============================  =============
te                 ``a_b * rn32(S_enc * rn32(1/6))``        ``rn32(1 / rn32(sf * S_dec))``  ``sf = 0x00``
te-2.13            ``rn32(a_b / 6) * S_enc``                same as te                      ``sf = 0x00``
modelopt           ``a_b / rn32(6 * s2)``, 0 -> 1.0,        divide: ``x / rn32(sf * s2)``   ``sf = 0x38``
                   clamped to [2**-9, 448]
mxfp4-cast         ``2**(e_b - m)``, clamped to             same as te (exact: powers of    ``sf = 0x00``
                   [2**-9, 2**8]                            two)
te-4over6-mae      ``rn32(a_b / 6) * S_enc`` (map-to-6) or  same as te, per candidate       ``sf = 0x00``
te-4over6-mse      ``rn32(that * 1.5)`` (map-to-4), the
                   lower MAE / MSE wins, ties to 6
te-4over6-*-256    as above with ``S_enc = rn32(1536/A)``   same as te                      ``sf = 0x00``
=================  =====================================  ==============================  =============

with ``S_enc = rn32(6 * B / A)``, ``B = 448`` (``256`` for the ``-256`` profiles), inf -> FLT_MAX,
A == 0 or S_enc == 0 -> 1.0; ``S_dec = rn32(1 / S_enc)``; ModelOpt's ``s2 = rn32(A / 2688)``.
For ``mxfp4-cast``, ``e(a)`` is the least integer with ``a <= 6 * 2**e(a)``, ``e_b = e`` of the larger
amax of the block's 32-value pair (blocks 2j, 2j+1: one MXFP4 block), ``m = e(A) - 8`` and
``S_dec = 2**m`` (exponent clamped to [-126, 127]).

* ``te``: TransformerEngine >= 2.14 (PR #2555) kernels and python reference, and FlashInfer with
  ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1``. The default.
* ``te-2.13``: TE <= 2.13's python reference and transpose kernel, which divide by 6 first.
* ``modelopt``: ``modelopt.torch.quantization.qtensor.NVFP4QTensor.quantize`` on CPU. ModelOpt leaves
  ``-0.0`` unsigned (code 0x0). For an all-zero tensor ModelOpt computes ``0 / 0`` and writes NaN
  scales; this profile defines that case as scale 1.0 (0x38) with zero data. (On CUDA ModelOpt's
  ``amax / 2688`` multiplies by a reciprocal, so its ``s2`` can differ by one ulp from this profile.)
* ``mxfp4-cast``: ModelOpt's lossless MXFP4 -> NVFP4 cast (``--cast_mxfp4_to_nvfp4``,
  ``examples/{llm_ptq,deepseek}/cast_mxfp4_to_nvfp4.py``): power-of-two global and block scales, so
  an MXFP4 value ``c * 2**k`` keeps its E2M1 code wherever ``e_b - m >= -9``. It takes the block
  exponent from the values (ModelOpt from the source's E8M0 byte: the same wherever a block's
  largest code is 4 or 6), keeps the sign of -0.0 and writes 0x00 for an all-zero block. Opt-in,
  for serving a released MXFP4 checkpoint; not for RL weight updates (docs/sources.md).
* ``te-4over6-{mae,mse}[-256]``: TE >= 2.17 4over6 (``nvfp4_use_4over6``, ``nvfp4_4over6_err_mode``,
  ``nvfp4_e4m3_max`` 448 or 256, exact error path), :mod:`fp4convert.formats.four_over_six`.

MXFP8 has no outer scale and one quantize chain; its profiles differ only in decoding the E8M0
scale: ``te`` (TE >= 2.19, PR #3262: code 0 is 2**-127, code 255 NaN) and ``te-2.18`` (TE <= 2.18's
``ptx::exp2f`` shifted the code into the exponent field: code 0 decoded as 0.0, code 255 as +inf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError
from fp4convert.formats import four_over_six
from fp4convert.formats.codecs import e2m1_encode, e4m3_decode, e4m3_encode, e8m0_decode, scalar_like
from fp4convert.formats.spec import E2M1, E4M3, FLT_MAX, FOUR_OVER_SIX_E4M3_MAX, NVFP4_BLOCK, NVFP4_GLOBAL_MAX

__all__ = [
    "BASE_PROFILES",
    "FOUR_OVER_SIX_PROFILES",
    "MXFP8_PROFILES",
    "PROFILES",
    "MXFP8Profile",
    "OuterScales",
    "Profile",
    "ProfileSpec",
    "block_scale_bytes",
    "check_mxfp8_profile",
    "check_profile",
    "dequant_block_scale",
    "encode_blocks",
    "four_over_six_profile",
    "mxfp8_scale_decode",
    "outer_scales",
    "profile_spec",
    "quantize_blocks",
]

Profile = Literal[
    "te",
    "te-2.13",
    "modelopt",
    "mxfp4-cast",
    "te-4over6-mae",
    "te-4over6-mse",
    "te-4over6-mae-256",
    "te-4over6-mse-256",
]
PROFILES: tuple[str, ...] = get_args(Profile)
#: The profiles without candidate selection: what a contract's ``quantizer`` names.
BASE_PROFILES: tuple[str, ...] = PROFILES[:4]
FOUR_OVER_SIX_PROFILES: tuple[str, ...] = PROFILES[4:]

MXFP8Profile = Literal["te", "te-2.18"]
MXFP8_PROFILES: tuple[str, ...] = get_args(MXFP8Profile)

Chain = Literal["te", "te-2.13", "modelopt", "pow2", "4over6"]

_MODELOPT_MIN_SCALE = 2.0**-9  # ModelOpt clamps block scales to the smallest E4M3 subnormal
# The powers of two E4M3 holds exactly: 2**-9 (its smallest subnormal) to 2**8 (256).
_E4M3_POW2_MIN, _E4M3_POW2_MAX = -9, 8


@dataclass(frozen=True)
class ProfileSpec:
    """What distinguishes one NVFP4 profile.

    Attributes:
        chain: which block chain of the module table it follows.
        global_e4m3_max: ``B``, the E4M3 bound of the global scale: ``S_enc = 6 * B / A``.
        error: the 4over6 candidate error (``"mae"`` / ``"mse"``), None for the other chains.
        description: the chain in a few words, for diagnostics ("the exporter uses ...").
    """

    chain: Chain
    global_e4m3_max: float = E4M3.max
    error: four_over_six.ErrorMode | None = None
    description: str = ""

    @property
    def global_max(self) -> float:
        """``6 * B``: the amax that maps to the largest encodable value (2688 or 1536)."""
        return E2M1.max * self.global_e4m3_max


_SPECS: dict[str, ProfileSpec] = {
    "te": ProfileSpec("te", description="TransformerEngine >= 2.14's order (block amax times S_enc/6)"),
    "te-2.13": ProfileSpec("te-2.13", description="TransformerEngine <= 2.13's order (block amax / 6 first)"),
    "modelopt": ProfileSpec("modelopt", description="ModelOpt's division order (x / (sf * s2))"),
    "mxfp4-cast": ProfileSpec(
        "pow2", description="ModelOpt's lossless MXFP4 cast (power-of-two global and block scales)"
    ),
    "te-4over6-mae": ProfileSpec(
        "4over6", error="mae", description="TransformerEngine's 4over6 (map-to-4 or 6 by MAE, global bound 448)"
    ),
    "te-4over6-mse": ProfileSpec(
        "4over6", error="mse", description="TransformerEngine's 4over6 (map-to-4 or 6 by MSE, global bound 448)"
    ),
    "te-4over6-mae-256": ProfileSpec(
        "4over6",
        FOUR_OVER_SIX_E4M3_MAX,
        "mae",
        "TransformerEngine's 4over6 (map-to-4 or 6 by MAE, global bound 256)",
    ),
    "te-4over6-mse-256": ProfileSpec(
        "4over6",
        FOUR_OVER_SIX_E4M3_MAX,
        "mse",
        "TransformerEngine's 4over6 (map-to-4 or 6 by MSE, global bound 256)",
    ),
}


def check_profile(profile: str) -> Profile:
    """Return ``profile`` if it is a known NVFP4 profile name, else raise a :class:`FormatError`."""
    if profile not in PROFILES:
        raise FormatError(
            f"unknown quantizer profile {profile!r}",
            hint=f"use one of {', '.join(PROFILES)}",
            field="profile",
            found=profile,
        )
    return profile  # type: ignore[return-value]


def check_mxfp8_profile(profile: str) -> MXFP8Profile:
    """Return ``profile`` if it is a known MXFP8 profile name, else raise a :class:`FormatError`."""
    if profile not in MXFP8_PROFILES:
        raise FormatError(
            f"unknown MXFP8 profile {profile!r}",
            hint=f"use one of {', '.join(MXFP8_PROFILES)}",
            field="profile",
            found=profile,
        )
    return profile  # type: ignore[return-value]


def profile_spec(profile: str) -> ProfileSpec:
    """The :class:`ProfileSpec` of a profile name (raises :class:`FormatError` for an unknown one)."""
    return _SPECS[check_profile(profile)]


def four_over_six_profile(error: str, global_e4m3_max: int) -> Profile:
    """The profile name for TE's 4over6 with ``error`` ("mae"/"mse") and bound 448 or 256.

    Example:
        >>> four_over_six_profile("mse", 256)
        'te-4over6-mse-256'
    """
    if error not in ("mae", "mse") or global_e4m3_max not in (448, 256):
        raise FormatError(
            f"no 4over6 profile for error {error!r} and E4M3 bound {global_e4m3_max!r}",
            hint="use error 'mae' or 'mse' and a bound of 448 or 256",
            found=(error, global_e4m3_max),
        )
    return check_profile(f"te-4over6-{error}" + ("-256" if global_e4m3_max == 256 else ""))


@dataclass(frozen=True)
class OuterScales:
    """Per-row outer (second-level) scales, all float32 of one shape (one entry per scope unit).

    Attributes:
        amax: the raw amax (what TE stores as ``_amax_rowwise``).
        s_enc: global encode scale (te profiles) or ``1 / s2`` (modelopt; informative only).
        s_dec: global decode scale: TE's ``rn32(1 / S_enc)``, or ModelOpt's ``s2 = A / 2688``.
            This is what a checkpoint stores as ``weight_scale_2``.
        mult: the per-tensor factor the block amax is combined with: ``S_enc * rn32(1/6)`` (te),
            ``S_enc`` (te-2.13 and 4over6), ``rn32(6 * s2)`` (modelopt).
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
    spec = profile_spec(profile)
    a = amax.float()
    if spec.chain == "pow2":
        if encode_scale is not None:
            raise FormatError("the mxfp4-cast profile has no encode scale to impose", hint="impose decode_scale")
        s_dec = _pow2_global(a) if decode_scale is None else decode_scale.float().expand_as(a)
        return OuterScales(a, torch.div(scalar_like(1.0, a), s_dec), s_dec, s_dec)
    if spec.chain == "modelopt":
        if encode_scale is not None:
            raise FormatError("the modelopt profile has no encode scale to impose", hint="impose decode_scale (s2)")
        s2 = torch.div(a, scalar_like(NVFP4_GLOBAL_MAX, a)) if decode_scale is None else decode_scale.float()
        return OuterScales(a, torch.div(scalar_like(1.0, a), s2), s2, s2 * E2M1.max)
    if encode_scale is None:
        s_enc = torch.div(scalar_like(spec.global_max, a), a)
        s_enc = torch.where(s_enc.isinf(), scalar_like(FLT_MAX, a), s_enc)
        s_enc = torch.where((a == 0) | (s_enc == 0), scalar_like(1.0, a), s_enc)
    else:
        s_enc = encode_scale.float().expand_as(a)
    s_dec = torch.div(scalar_like(1.0, a), s_enc) if decode_scale is None else decode_scale.float().expand_as(a)
    if spec.chain == "te":
        mult = s_enc * torch.div(scalar_like(1.0, a), scalar_like(E2M1.max, a))
    else:  # te-2.13 and 4over6 multiply by S_enc after dividing the block amax by 6
        mult = s_enc
    return OuterScales(a, s_enc, s_dec, mult)


def _covering_exponent(a: torch.Tensor) -> torch.Tensor:
    """The least integer ``e`` with ``a <= 6 * 2**e`` (int32), exactly: ``a = f * 2**p`` with
    ``f`` in [0.5, 1) needs ``e = p - 3`` when ``f <= 0.75``, else ``p - 2``."""
    f, p = torch.frexp(torch.where(a.isinf(), scalar_like(FLT_MAX, a), a))
    return p - 3 + (f > 0.75).int()


def _pow2_global(a: torch.Tensor) -> torch.Tensor:
    """mxfp4-cast's global decode scale ``2**(e(A) - 8)``, the exponent clamped to fp32's normals."""
    m = (_covering_exponent(a) - _E4M3_POW2_MAX).clamp(-126, 127)
    return torch.ldexp(torch.ones_like(a), m)


def _pow2_block_scales(block_amax: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """mxfp4-cast's E4M3 block scales ``2**(e_b - m)``: one exponent per 32-value pair of blocks."""
    nb = block_amax.shape[-1]
    padded = torch.nn.functional.pad(block_amax, (0, nb % 2))
    pair = padded.reshape(*padded.shape[:-1], -1, 2).amax(dim=-1).repeat_interleave(2, dim=-1)[..., :nb]
    _, q = torch.frexp(s_dec)  # s_dec = 2**(q - 1)
    d = (_covering_exponent(pair) - (q - 1)).clamp(_E4M3_POW2_MIN, _E4M3_POW2_MAX)
    scale = e4m3_encode(torch.ldexp(torch.ones_like(pair), d))
    return torch.where(pair == 0, torch.zeros_like(scale), scale)


def _single_chain(profile: Profile, what: str) -> ProfileSpec:
    spec = profile_spec(profile)
    if spec.chain == "4over6":
        raise FormatError(
            f"{what} of profile {profile!r}: a 4over6 block's scale depends on its encoding",
            hint="use profiles.quantize_blocks, which picks between the two candidates",
            found=profile,
        )
    return spec


def block_scale_bytes(block_amax: torch.Tensor, outer: OuterScales, profile: Profile) -> torch.Tensor:
    """E4M3 block decode-scale bytes from block amaxes ``[..., nb]`` and per-row ``outer`` ``[..., 1]``
    (profiles without candidate selection)."""
    spec = _single_chain(profile, "block scales")
    if spec.chain == "te":
        return e4m3_encode(block_amax * outer.mult)
    if spec.chain == "pow2":
        return _pow2_block_scales(block_amax, outer.s_dec)
    if spec.chain == "te-2.13":
        return e4m3_encode(torch.div(block_amax, scalar_like(E2M1.max, block_amax)) * outer.mult)
    psc = torch.div(block_amax, outer.mult)
    psc = torch.where(psc == 0, scalar_like(1.0, psc), psc)
    psc = torch.where(outer.s_dec == 0, scalar_like(1.0, psc), psc)  # all-zero tensor: 0/0 in ModelOpt
    return e4m3_encode(psc.clamp(_MODELOPT_MIN_SCALE, E4M3.max))


def encode_blocks(
    blocks: torch.Tensor, scale_bytes: torch.Tensor, outer: OuterScales, profile: Profile
) -> torch.Tensor:
    """E2M1 codes for float32 ``blocks [..., nb, 16]`` given their scale bytes ``[..., nb]``."""
    sf = e4m3_decode(scale_bytes).unsqueeze(-1)
    s_dec = outer.s_dec.unsqueeze(-1)
    if profile_spec(profile).chain == "modelopt":
        y = torch.div(blocks, sf * s_dec)
        y = torch.where(s_dec == 0, torch.zeros_like(y), y)  # all-zero tensor
        return e2m1_encode(y, signed_zero=False)
    enc = torch.div(scalar_like(1.0, sf), sf * s_dec).clamp_max(FLT_MAX)  # 1/0 = inf -> FLT_MAX
    return e2m1_encode(blocks * enc)


def quantize_blocks(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    outer: OuterScales,
    profile: Profile,
    *,
    tile_rows: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The whole block chain of ``profile``: scale bytes and E2M1 codes of float32 ``blocks``.

    Args:
        blocks: ``[rows, nb, 16]`` values widened exactly to float32.
        block_amax: ``[rows, nb]`` NaN-ignoring amax of each block, or of its 16x16 tile.
        outer: per-row :class:`OuterScales` of shape ``[rows, 1]``.
        profile: the profile.
        tile_rows: 16 when ``block_amax`` holds 16x16 tile amaxes (4over6 then makes one choice per
            tile, as TE does), else 1.

    Returns:
        ``(codes [rows, nb, 16] uint8, scale [rows, nb] uint8, map4)``: ``map4`` is the bool
        ``[rows, nb]`` "took the map-to-4 candidate" of a 4over6 profile, None otherwise.
    """
    spec = profile_spec(profile)
    if tile_rows not in (1, NVFP4_BLOCK):
        raise FormatError(f"tile_rows must be 1 or 16, got {tile_rows}", found=tile_rows)
    if spec.chain == "4over6":
        assert spec.error is not None
        return four_over_six.quantize_blocks(
            blocks,
            block_amax,
            outer.amax,
            outer.s_enc,
            outer.s_dec,
            mode=spec.error,
            global_max=spec.global_max,
            tile_rows=tile_rows,
        )
    scale = block_scale_bytes(block_amax, outer, profile)
    return encode_blocks(blocks, scale, outer, profile), scale, None


def dequant_block_scale(scale_bytes: torch.Tensor, outer: OuterScales, profile: Profile) -> torch.Tensor:
    """The float32 factor one block's E2M1 values are multiplied by to dequantize.

    te profiles follow TE's ``dequantize_fp4_kernel``: ``rn32(rn32(sf * A) * rn32(1/(6 * B)))``;
    modelopt follows ``NVFP4QTensor.dequantize``: ``rn32(sf * s2)``; mxfp4-cast too (exact there).
    """
    spec = profile_spec(profile)
    sf = e4m3_decode(scale_bytes)
    if spec.chain in ("modelopt", "pow2"):
        return sf * outer.s_dec
    inv_global_max = torch.div(scalar_like(1.0, sf), scalar_like(spec.global_max, sf))
    return (sf * outer.amax) * inv_global_max


def mxfp8_scale_decode(e: torch.Tensor, profile: MXFP8Profile = "te") -> torch.Tensor:
    """E8M0 byte -> the float32 block scale a dequantizer multiplies by, under an MXFP8 profile.

    ``te``: ``2**(e - 127)``, code 0 is 2**-127 and code 255 NaN (TE >= 2.19). ``te-2.18``: TE <= 2.18
    built the float by shifting the code into the exponent field, so code 0 gave 0.0 (every element
    of such a block dequantized to zero) and code 255 gave +inf.
    """
    decoded = e8m0_decode(e)
    if check_mxfp8_profile(profile) == "te":
        return decoded
    decoded = torch.where(e == 0, torch.zeros_like(decoded), decoded)
    return torch.where(e == 0xFF, torch.full_like(decoded, float("inf")), decoded)
