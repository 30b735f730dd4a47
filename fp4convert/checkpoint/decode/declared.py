"""What a source checkpoint's config.json declares about its weights: ``quantization_config``.

Four kinds of source are read: plain (no ``quantization_config``: BF16, FP16 or FP32 tensors),
FP8 block-scaled (``quant_method: fp8``, ``fmt: e4m3``, ``weight_block_size: [bm, bn]``, optional
``scale_fmt: ue8m0``), FP8 per channel (``quant_method: compressed-tensors``, ``format:
float-quantized``, ``strategy: channel``: llm-compressor's FP8 releases such as zai-org/GLM-4.5-FP8)
and MXFP4 (``quant_method: mxfp4``, gpt-oss's ``*_blocks`` / ``*_scales``).
Anything else is refused here, naming the field, before a tensor is read: an fp4convert output
(ModelOpt, compressed-tensors, SGLang MXFP8) must be dequantized first; other methods (bitsandbytes,
GPTQ, per-tensor or block compressed-tensors FP8 ...) are not sources fp4convert reads: the error says
to convert from the BF16 release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fp4convert.errors import CheckpointError

__all__ = ["E4M3_SPELLINGS", "OUTPUT_METHODS", "SourceQuantization", "is_source_release", "source_quantization"]

Method = Literal["none", "fp8", "fp8-channel", "mxfp4"]

#: how FP8 E4M3 releases spell ``fmt`` (DeepSeek, Kimi, Qwen3-FP8: ``e4m3``; MiniMax-M2: torch's name)
E4M3_SPELLINGS = ("e4m3", "float8_e4m3fn")

#: quant_method values of fp4convert's own output dialects (and engines' spellings of them)
OUTPUT_METHODS = ("modelopt", "compressed-tensors", "mxfp8", "modelopt_fp4", "modelopt_mxfp8")


@dataclass(frozen=True)
class SourceQuantization:
    """A source's declared weight encoding.

    Attributes:
        method: ``none`` (plain tensors), ``fp8`` (block-scaled E4M3), ``fp8-channel`` (compressed-tensors
            ``float-quantized`` E4M3 with one ``weight_scale`` per output row) or ``mxfp4``.
        block: FP8 ``weight_block_size`` ``(rows, cols)``; None otherwise.
        ue8m0: FP8 ``scale_fmt: ue8m0``: every scale is a power of two (checked when read).
        not_converted: ``modules_to_not_convert`` / ``ignored_layers`` as declared (informative:
            the tensors themselves say how they are stored).
    """

    method: Method = "none"
    block: tuple[int, int] | None = None
    ue8m0: bool = False
    not_converted: tuple[str, ...] = ()


def _field_error(field: str, found: Any, expected: str, hint: str) -> CheckpointError:
    return CheckpointError(
        f"config.json quantization_config.{field} is {found!r}, expected {expected}",
        hint=hint,
        file="config.json",
        field=f"quantization_config.{field}",
        found=found,
    )


def _block_size(value: Any) -> tuple[int, int]:
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if not ok:
        raise _field_error(
            "weight_block_size",
            value,
            "two positive integers such as [128, 128]",
            "per-tensor FP8 (no weight_block_size) is not a source fp4convert reads; DeepSeek, Kimi, MiniMax "
            "and Qwen3-FP8 releases give [128, 128]",
        )
    return int(value[0]), int(value[1])


def _is_float8(q: Mapping[str, Any]) -> bool:
    """A compressed-tensors config of llm-compressor's FP8 schemes (``format: float-quantized``, at the top
    or in a config group); fp4convert's own outputs say ``mxfp8-quantized`` / ``nvfp4-pack-quantized``."""
    groups = q.get("config_groups")
    formats = [q.get("format")]
    if isinstance(groups, Mapping):
        formats += [g.get("format") for g in groups.values() if isinstance(g, Mapping)]
    return "float-quantized" in formats


def is_source_release(config: Mapping[str, Any]) -> bool:
    """``config`` declares a release that shares an output dialect's ``quant_method`` but is a source
    format read here (compressed-tensors ``float-quantized`` FP8), so dialect readers must not take it.

    Example:
        >>> q = {"quant_method": "compressed-tensors", "format": "float-quantized"}
        >>> is_source_release({"quantization_config": q})
        True
    """
    q = config.get("quantization_config")
    return isinstance(q, Mapping) and q.get("quant_method") == "compressed-tensors" and _is_float8(q)


def _channel_fp8_groups(q: Mapping[str, Any]) -> tuple[str, ...]:
    """Check a compressed-tensors ``float-quantized`` config is what is read (E4M3 weights, one static
    scale per output row, dynamic or no activation scales); return its ``ignore`` list."""
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise _field_error("config_groups", groups, "one or more quantization groups", "re-download config.json")
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        weights = weights if isinstance(weights, Mapping) else {}
        found = {k: weights.get(k) for k in ("num_bits", "type", "strategy", "dynamic")}
        if found != {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False}:
            raise _field_error(
                f"config_groups.{key}.weights",
                found,
                "num_bits 8, type float, strategy channel, dynamic false (one E4M3 weight_scale per output row)",
                "per-tensor and block compressed-tensors FP8 are not read; convert from the model's BF16 release",
            )
        inputs = group.get("input_activations")
        if isinstance(inputs, Mapping) and inputs.get("dynamic") is not True:
            raise _field_error(
                f"config_groups.{key}.input_activations.dynamic",
                inputs.get("dynamic"),
                "true (dynamic activation scales)",
                "static FP8 activation scales (input_scale tensors) are not read; the weights' row scales are",
            )
    ignored = q.get("ignore") or ()
    return tuple(str(m) for m in ignored) if isinstance(ignored, list | tuple) else ()


def source_quantization(config: Mapping[str, Any]) -> SourceQuantization:
    """The weight encoding ``config`` declares.

    Raises:
        CheckpointError: an unknown ``quant_method``, ``fmt`` or ``scale_fmt``, a missing or
            malformed ``weight_block_size``, static FP8 activation scales, or an fp4convert output
            dialect given as a source; the error names the field.

    Example:
        >>> source_quantization({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
        ...     "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}})
        SourceQuantization(method='fp8', block=(128, 128), ue8m0=True, not_converted=())
        >>> source_quantization({}).method
        'none'
    """
    q = config.get("quantization_config")
    if q is None:
        return SourceQuantization()
    if not isinstance(q, Mapping):
        raise _field_error("", q, "an object", "remove the field or re-download config.json")
    method = q.get("quant_method")
    ignored = q.get("modules_to_not_convert") or q.get("ignored_layers") or ()
    not_converted = tuple(str(m) for m in ignored) if isinstance(ignored, list | tuple) else ()
    if method == "fp8":
        fmt = q.get("fmt", "e4m3")
        if fmt not in E4M3_SPELLINGS:
            raise _field_error(
                "fmt", fmt, "'e4m3' (or 'float8_e4m3fn')", "only FP8 E4M3 weights are read (E5M2 weights are not)"
            )
        scale_fmt = q.get("scale_fmt")
        if scale_fmt not in (None, "ue8m0"):
            raise _field_error(
                "scale_fmt", scale_fmt, "absent (FP32 scales) or 'ue8m0' (power-of-two scales)", "check the release"
            )
        scheme = q.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise _field_error(
                "activation_scheme",
                scheme,
                "'dynamic'",
                "static FP8 activation scales (input_scale tensors) are not read; the weights' block scales are",
            )
        return SourceQuantization("fp8", _block_size(q.get("weight_block_size")), scale_fmt == "ue8m0", not_converted)
    if method == "mxfp4":
        return SourceQuantization("mxfp4", not_converted=not_converted)
    if method == "compressed-tensors" and _is_float8(q):
        return SourceQuantization("fp8-channel", not_converted=_channel_fp8_groups(q))
    if method in OUTPUT_METHODS:
        raise _field_error(
            "quant_method",
            method,
            "fp8 or mxfp4 (or no quantization_config)",
            "this is already a converted checkpoint; run `fp4convert dequantize` on it first, or convert its source",
        )
    raise _field_error(
        "quant_method",
        method,
        "fp8 (block-scaled E4M3) or mxfp4, or no quantization_config (BF16/FP16/FP32)",
        "fp4convert reads BF16/FP16/FP32, FP8 block-scaled (quant_method fp8) and MXFP4 (quant_method mxfp4) "
        "sources, experts per tensor or fused 3-D; for other formats (GPTQ, AWQ, bitsandbytes, per-tensor FP8) "
        "convert from the model's BF16 release, or dequantize to BF16 with the tool that made the checkpoint",
    )
