"""On-disk dialects, looked up by name: ``modelopt``, ``sglang-mxfp8``, ``compressed-tensors``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fp4convert.dialects.base import FUSED_ENGINE_NAMES, LM_HEAD, Dialect, OutputSpec, Planned, exclude_list, module_of
from fp4convert.dialects.compressed_tensors import CompressedTensorsDialect
from fp4convert.dialects.config_view import ConfigView, Scheme
from fp4convert.dialects.modelopt import ModelOptDialect
from fp4convert.dialects.sglang_mxfp8 import SGLangMXFP8Dialect
from fp4convert.errors import ConversionError

__all__ = [
    "DIALECTS",
    "FUSED_ENGINE_NAMES",
    "LM_HEAD",
    "CompressedTensorsDialect",
    "ConfigView",
    "Dialect",
    "ModelOptDialect",
    "OutputSpec",
    "Planned",
    "SGLangMXFP8Dialect",
    "Scheme",
    "dialect_for_config",
    "exclude_list",
    "get_dialect",
    "module_of",
    "spellings_of",
    "stored_format",
]

DIALECTS: dict[str, type[Dialect]] = {
    ModelOptDialect.name: ModelOptDialect,
    SGLangMXFP8Dialect.name: SGLangMXFP8Dialect,
    CompressedTensorsDialect.name: CompressedTensorsDialect,
}


def dialect_for_config(config: Mapping[str, Any]) -> Dialect | None:
    """The dialect whose loader a checkpoint's config.json routes engines to (by ``quant_method``),
    or None for a checkpoint without a quantization_config of a known dialect.

    Example:
        >>> dialect_for_config({"quantization_config": {"quant_method": "mxfp8"}}).name
        'sglang-mxfp8'
        >>> dialect_for_config({"torch_dtype": "bfloat16"}) is None
        True
    """
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    for cls in DIALECTS.values():
        if cls.quant_method == method:
            return get_dialect(cls.name)
    return None


def stored_format(leaf_dtypes: Mapping[str, str]) -> str:
    """The format one module's stored tensors are in, whichever dialect spelled them.

    Args:
        leaf_dtypes: the module's tensors, leaf name -> safetensors dtype (``{"weight": "U8", ...}``).

    Returns:
        ``nvfp4`` or ``mxfp8`` when some dialect's data tensor of that format is there with its
        dtype; else ``bf16`` when there is a ``weight``, ``absent`` when there is none.

    Example:
        >>> stored_format({"weight_packed": "U8", "weight_scale": "F8_E4M3"}), stored_format({"weight": "BF16"})
        ('nvfp4', 'bf16')
    """
    for fmt in ("nvfp4", "mxfp8"):
        for cls in DIALECTS.values():
            if fmt in cls.formats and leaf_dtypes.get(cls.suffixes[fmt]["data"]) == cls.output_dtypes[fmt]["data"]:
                return fmt
    return "absent" if "weight" not in leaf_dtypes else "bf16"


def spellings_of(leaf_dtypes: Mapping[str, str]) -> list[tuple[str, str]]:
    """Every ``(dialect, format)`` whose data, block-scale and global-scale tensors one module holds,
    each with the dialect's dtype (stricter than :func:`stored_format`, which looks at the data
    tensor alone: an FP8 block-scaled ``weight`` with an F32 ``weight_scale_inv`` is no MXFP8).

    Example:
        >>> spellings_of({"weight": "F8_E4M3", "weight_scale_inv": "U8"})
        [('sglang-mxfp8', 'mxfp8')]
        >>> spellings_of({"weight": "F8_E4M3", "weight_scale": "U8"})
        [('modelopt', 'mxfp8'), ('compressed-tensors', 'mxfp8')]
        >>> spellings_of({"weight": "F8_E4M3", "weight_scale_inv": "F32"})
        []
    """
    found = []
    for cls in DIALECTS.values():
        for fmt in sorted(cls.formats, reverse=True):  # nvfp4 before mxfp8
            roles = [r for r in ("data", "scale", "global") if r in cls.suffixes[fmt]]
            if all(leaf_dtypes.get(cls.suffixes[fmt][r]) == cls.output_dtypes[fmt][r] for r in roles):
                found.append((cls.name, fmt))
    return found


def get_dialect(name: str, *, per_token_activations: bool = True) -> Dialect:
    """The dialect registered as ``name``; an unknown name is an error listing the known ones."""
    if name not in DIALECTS:
        raise ConversionError(
            f"unknown dialect {name!r}",
            hint=f"use one of {', '.join(DIALECTS)}",
            field="dialect",
            found=name,
        )
    if name == CompressedTensorsDialect.name:
        return CompressedTensorsDialect(per_token_activations=per_token_activations)
    return DIALECTS[name]()
