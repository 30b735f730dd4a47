"""fp4convert: one precision contract for NVFP4 / MXFP8 / BF16 checkpoints, byte-exact with TE."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fp4convert.version import __version__

# Public name -> module that defines it. Imported lazily so `import fp4convert` stays cheap and
# optional dependencies (pydantic for contracts, transformers in tests) load only when used.
_EXPORTS: dict[str, str] = {
    "ConversionReport": "fp4convert.convert.execute",
    "DequantizeReport": "fp4convert.convert.dequantize",
    "DoctorReport": "fp4convert.doctor",
    "ExportReport": "fp4convert.megatron",
    "Fp4ConvertError": "fp4convert.errors",
    "ImportReport": "fp4convert.megatron",
    "VerifyReport": "fp4convert.verify.checkpoint",
    "MXFP8Tensor": "fp4convert.formats",
    "convert_checkpoint": "fp4convert.convert.execute",
    "dequantize_checkpoint": "fp4convert.convert.dequantize",
    "doctor_checkpoint": "fp4convert.doctor",
    "load_contract": "fp4convert.contract",
    "verify_checkpoint": "fp4convert.verify.checkpoint",
    "NVFP4Tensor": "fp4convert.formats",
    "dequantize": "fp4convert.formats",
    "export_hf": "fp4convert.megatron",
    "from_layout": "fp4convert.formats",
    "import_hf": "fp4convert.megatron",
    "quantize_mxfp8": "fp4convert.formats",
    "quantize_nvfp4": "fp4convert.formats",
    "to_layout": "fp4convert.formats",
    "validate_export": "fp4convert.megatron",
}

__all__ = [  # the public API; tests/test_public_api.py keeps it equal to _EXPORTS
    "ConversionReport",
    "DequantizeReport",
    "DoctorReport",
    "ExportReport",
    "Fp4ConvertError",
    "ImportReport",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "VerifyReport",
    "__version__",
    "convert_checkpoint",
    "dequantize",
    "dequantize_checkpoint",
    "doctor_checkpoint",
    "export_hf",
    "from_layout",
    "import_hf",
    "load_contract",
    "quantize_mxfp8",
    "quantize_nvfp4",
    "to_layout",
    "validate_export",
    "verify_checkpoint",
]

if TYPE_CHECKING:  # pragma: no cover
    from fp4convert.contract import load_contract
    from fp4convert.convert.dequantize import DequantizeReport, dequantize_checkpoint
    from fp4convert.convert.execute import ConversionReport, convert_checkpoint
    from fp4convert.doctor import DoctorReport, doctor_checkpoint
    from fp4convert.errors import Fp4ConvertError
    from fp4convert.formats import (
        MXFP8Tensor,
        NVFP4Tensor,
        dequantize,
        from_layout,
        quantize_mxfp8,
        quantize_nvfp4,
        to_layout,
    )
    from fp4convert.megatron import ExportReport, ImportReport, export_hf, import_hf, validate_export
    from fp4convert.verify.checkpoint import VerifyReport, verify_checkpoint


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fp4convert' has no attribute {name!r}")
    return getattr(import_module(module), name)
