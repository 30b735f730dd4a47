"""Which tensors a conversion reproduces exactly: a source format, a decision, and the arithmetic between.

A tensor is *lossless* when dequantizing what the converter writes gives back, bit for bit, the
source's own dequantized values (docs/sources.md, "Lossless casts"). That is decided by the source
format (:attr:`fp4convert.inventory.TensorInfo.source_format`), the decision and the quantizer
profile, before anything is read:

* a BF16 decision stores the source's (dequantized) values as they are: lossless;
* FP8 with power-of-two scales (``scale_fmt: ue8m0``) -> MXFP8: every 1x32 block lies in one source
  block; TE's E8M0 scale ``roundup(rn32(amax * rn32(1/448)))`` is at most the source's scale, so
  each E4M3 value times a power of two >= 1 stays an E4M3 value: lossless;
* MXFP4 -> MXFP8: an E2M1 value times ``2**k`` is an E4M3 value times the smaller E8M0 scale: lossless;
* MXFP4 -> NVFP4 under ``mxfp4-cast``: power-of-two scales keep every value whose block exponent lies
  within 17 of its scale group's largest (E4M3's ``2**-9 .. 2**8``); only the values tell, so
  ``verify --source`` measures it (``lossless: None``);
* anything else rounds values to the target's grid (FP8 with arbitrary FP32 scales -> MXFP8 is
  lossy: SGLang #40435 reports importance-ratio drift from doing it inconsistently).

``verify --source`` proves every ``lossless: True`` tensor and measures every ``None`` one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp4convert.contract.decision import Decision
from fp4convert.contract.footprint import storage_bytes
from fp4convert.inventory import TensorInfo

__all__ = ["MXFP4_CAST", "MXFP4_CAST_NOTE", "UNDECIDED", "Lossless", "base_source_format", "lossless", "source_notes"]

#: the quantizer profile of ModelOpt's lossless MXFP4 -> NVFP4 cast (fp4convert.formats.profiles)
MXFP4_CAST = "mxfp4-cast"
#: where mxfp4-cast's bytes differ from te's, and why it is not for RL weight updates
MXFP4_CAST_NOTE = (
    "quantizer mxfp4-cast (ModelOpt's lossless MXFP4 cast) writes power-of-two scales: weight_scale_2 = "
    "2^(e(A) - 8) and block scales 2^(e_b - m), where te derives them from the amaxes (S_enc = 2688 / A, "
    "E4M3(a_b * S_enc / 6)); so its global and block scales differ from te's nearly everywhere, and its E2M1 "
    "codes wherever te's scale rounds a value differently. It keeps MXFP4 values exactly, which te does not. "
    "It is not for RL weight updates: the learner (TransformerEngine) quantizes its BF16 master with te "
    "arithmetic, so after an update the sampler would hold other bytes than the learner computes with"
)


@dataclass(frozen=True)
class Lossless:
    """Whether a tensor's output dequantizes to its source values exactly.

    Attributes:
        lossless: True (by construction: ``verify --source`` proves it), None (depends on the
            values: ``verify --source`` measures it), False (values are rounded).
        why: one sentence.
    """

    lossless: bool | None
    why: str


#: the verdict of a planned tensor nobody has judged (a plan built by hand)
UNDECIDED = Lossless(None, "")


def base_source_format(info: TensorInfo) -> str:
    """The element encoding of a tensor's source, without its fused-container suffix (``dense``
    when no checkpoint was read).

    Example:
        >>> base_source_format(TensorInfo("w", source_format="mxfp4+fused-3d-interleaved"))
        'mxfp4'
    """
    return info.source_format.split("+", 1)[0] or "dense"


def lossless(info: TensorInfo, decision: Decision, profile: str) -> Lossless:
    """Whether ``info`` converted under ``decision`` (and NVFP4 ``profile``) is lossless (see the module docstring).

    Example:
        >>> from fp4convert.contract.decision import Decision
        >>> w = TensorInfo("w", (128, 128), source_format="fp8-block-ue8m0", gemm_weight=True)
        >>> lossless(w, Decision("w", "mxfp8", None, "rules[0]", "", ()), "te").lossless
        True
    """
    source = base_source_format(info)
    fmt = decision.format
    if fmt == "bf16" or not info.gemm_weight:  # copied: only GEMM weights are quantized
        if source == "dense":
            return Lossless(True, "stored as the source stores it")
        return Lossless(True, f"stored as its dequantized BF16 values ({source} source)")
    if fmt == "mxfp8":
        if source == "fp8-block-ue8m0":
            return Lossless(
                True,
                "FP8 with power-of-two block scales: each 1x32 MXFP8 block takes an E8M0 scale no larger than "
                "its source block's, so every E4M3 value survives",
            )
        if source == "mxfp4":
            return Lossless(True, "MXFP4 values (E2M1 x 2^k) are E4M3 values under a smaller E8M0 scale")
        if source == "fp8-block":
            return Lossless(
                False,
                "FP8 with arbitrary FP32 block scales: the dequantized values are not on the MXFP8 grid, so "
                "requantizing rounds them (declare scale_fmt: ue8m0 only if the scales are powers of two)",
            )
        return Lossless(False, f"MXFP8 rounds the {info.dtype} values to E4M3 x 2^k")
    if source == "mxfp4" and profile == MXFP4_CAST:
        return Lossless(
            None,
            "mxfp4-cast keeps every value whose MXFP4 block exponent is within 17 of its scale group's "
            "largest; verify --source measures it",
        )
    what = "dequantized BF16" if source != "dense" else info.dtype
    return Lossless(False, f"NVFP4 rounds the {what} values to E2M1 with E4M3 block scales")


def source_notes(info: TensorInfo, decision: Decision, profile: str) -> tuple[str, ...]:
    """What ``explain`` says about a tensor's source: its format, the bytes in and out, whether it is
    lossless; and, under ``mxfp4-cast``, where its bytes differ from te's (:data:`MXFP4_CAST_NOTE`)."""
    notes = []
    if info.source_format:
        verdict = lossless(info, decision, profile)
        state = {True: "lossless", False: "not lossless", None: "lossless if its values allow"}[verdict.lossless]
        read = f"{info.source_nbytes:,} bytes read" if info.source_nbytes is not None else "bytes unknown"
        notes.append(
            f"source: {info.source_format} ({read}, {storage_bytes(info, decision):,} bytes written); "
            f"{state}: {verdict.why}"
        )
    if profile == MXFP4_CAST and decision.format == "nvfp4" and info.gemm_weight:
        notes.append(MXFP4_CAST_NOTE)
    return tuple(notes)
