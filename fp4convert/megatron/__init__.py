"""The Megatron side: live weight export under the contract, and proof that an export followed it.

Modules, one job each:

* :mod:`~fp4convert.megatron.plan`: what an update must contain (decisions, outputs, groups).
* :mod:`~fp4convert.megatron.encode`: quantize one shared-scale group for a dialect (the
  converter's arithmetic).
* :mod:`~fp4convert.megatron.export`: :func:`export_hf`, Megatron parameters -> a dialect's HF
  tensors, streaming (the one-call form of :class:`LiveExporter`).
* :mod:`~fp4convert.megatron.sync`: :class:`LiveExporter`, the reusable exporter an RL loop calls
  every sync (whole update, stream, or buckets; output buffers reused when unreferenced).
* :mod:`~fp4convert.megatron.groups`: the quantized groups of an export (a layer's experts, a
  shared-scale unit) and running one with the segment kernels.
* :mod:`~fp4convert.megatron.resolve`: where a master holds each HF tensor (names -> pieces).
* :mod:`~fp4convert.megatron.import_`: :func:`import_hf`, an HF checkpoint -> Megatron-named BF16
  safetensors plus the TransformerEngine precision file.
* :mod:`~fp4convert.megatron.sources`: reading dumps and masters (dtypes and shapes from headers).
* :mod:`~fp4convert.megatron.validate`: :func:`validate_export`, the check of one export.
* :mod:`~fp4convert.megatron.batches`: the batched byte comparison it runs.
* :mod:`~fp4convert.megatron.context`: one validation run's state (both sides, references).
* :mod:`~fp4convert.megatron.diagnose`: findings for what failed, with
  :mod:`~fp4convert.megatron.difference` (the first differing block) and
  :mod:`~fp4convert.megatron.causes` (the likely exporter fault).
* :mod:`~fp4convert.megatron.report`: :class:`ExportReport`.
"""

from __future__ import annotations

from fp4convert.megatron.export import export_hf
from fp4convert.megatron.import_ import ImportReport, import_hf
from fp4convert.megatron.plan import ExportPlan, export_plan
from fp4convert.megatron.report import ExportReport, Finding
from fp4convert.megatron.sources import SafetensorsFolder
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator, validate_export, validate_export_files

__all__ = [
    "ExportPlan",
    "ExportReport",
    "ExportValidator",
    "Finding",
    "ImportReport",
    "LiveExporter",
    "SafetensorsFolder",
    "export_hf",
    "export_plan",
    "import_hf",
    "validate_export",
    "validate_export_files",
]
