"""The Megatron side: live weight export under a contract, import into Megatron, and proof that an
export followed the contract.

* :func:`export_hf`: Megatron-Core BF16 tensors -> the HF tensors of a dialect, quantized per contract
  (what a sampler receives at a live weight update).
* :func:`import_hf`: an HF checkpoint -> Megatron-named BF16 safetensors plus the TransformerEngine
  precision file of the contract.
* :func:`validate_export` / :class:`ExportValidator`: an export compared byte for byte with the
  reference quantizer applied to the BF16 master, with a per-tensor :class:`ExportReport` and the
  likely cause of each difference; :func:`validate_export_files` does the same from files.

Modules: ``tables`` (the model under a contract, and where each HF tensor sits in a Megatron
tensor), ``export``, ``import_``, ``validate`` (the batched fast path), ``diagnose`` (findings and
causes), ``report``, ``files`` (safetensors folders read on access).
"""

from __future__ import annotations

from fp4convert.bridge.export import export_hf
from fp4convert.bridge.import_ import ImportReport, import_hf
from fp4convert.bridge.report import ExportReport, Finding, TensorResult
from fp4convert.bridge.validate import ExportValidator, validate_export, validate_export_files

__all__ = [
    "ExportReport",
    "ExportValidator",
    "Finding",
    "ImportReport",
    "TensorResult",
    "export_hf",
    "import_hf",
    "validate_export",
    "validate_export_files",
]
