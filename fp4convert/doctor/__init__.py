"""``doctor``: diagnose any NVFP4 / MXFP8 checkpoint before an engine loads it.

Reads the headers first and tensor data only where a check needs it (one tensor at a time), for
ModelOpt, compressed-tensors and SGLang-MXFP8 checkpoints whether fp4convert wrote them or not,
and reports findings: severity, the tensors concerned (grouped, counted), what SGLang, vLLM and
TensorRT-LLM do with them, and the fix. Modules, one job each:

* :mod:`~fp4convert.doctor.report`: :class:`Finding` and :class:`DoctorReport`.
* :mod:`~fp4convert.doctor.scan`: the lenient scan (config, side files, headers, index problems).
* :mod:`~fp4convert.doctor.model`: logical weights described by the model family; engine layers.
* :mod:`~fp4convert.doctor.engines`: each engine's routing, exclude matching and layer building.
* :mod:`~fp4convert.doctor.structure`: routing vs tensors, complete modules, dtypes, shapes.
* :mod:`~fp4convert.doctor.building`: the exclude list against what is stored.
* :mod:`~fp4convert.doctor.scales`: global, input and block scale values.
* :mod:`~fp4convert.doctor.siblings`: fused siblings' outer scales.
* :mod:`~fp4convert.doctor.activations`: the activation contract (W4A4, placeholders).
* :mod:`~fp4convert.doctor.contract_check`: ``--contract``.
* :mod:`~fp4convert.doctor.provenance`: ``--source``, which arithmetic made each tensor.
* :mod:`~fp4convert.doctor.repair`: ``--fix DST``.
* :mod:`~fp4convert.doctor.run`: :func:`doctor_checkpoint`, all of it in order.
"""

from fp4convert.doctor.repair import RepairReport, repair_checkpoint
from fp4convert.doctor.report import ENGINES, DoctorReport, Finding
from fp4convert.doctor.run import doctor_checkpoint

__all__ = ["ENGINES", "DoctorReport", "Finding", "RepairReport", "doctor_checkpoint", "repair_checkpoint"]
