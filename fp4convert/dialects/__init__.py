"""On-disk dialects, looked up by name: ``modelopt``, ``sglang-mxfp8``, ``compressed-tensors``."""

from __future__ import annotations

from fp4convert.dialects.base import Dialect, OutputSpec, Planned, exclude_list, module_of
from fp4convert.dialects.compressed_tensors import CompressedTensorsDialect
from fp4convert.dialects.modelopt import ModelOptDialect
from fp4convert.dialects.sglang_mxfp8 import SGLangMXFP8Dialect
from fp4convert.errors import ConversionError

__all__ = [
    "DIALECTS",
    "CompressedTensorsDialect",
    "Dialect",
    "ModelOptDialect",
    "OutputSpec",
    "Planned",
    "SGLangMXFP8Dialect",
    "exclude_list",
    "get_dialect",
    "module_of",
]

DIALECTS: dict[str, type[Dialect]] = {
    ModelOptDialect.name: ModelOptDialect,
    SGLangMXFP8Dialect.name: SGLangMXFP8Dialect,
    CompressedTensorsDialect.name: CompressedTensorsDialect,
}


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
