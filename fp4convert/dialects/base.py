"""What every on-disk dialect provides, and the pieces they share.

A dialect maps one planned tensor (its :class:`~fp4convert.inventory.TensorInfo` and contract
:class:`~fp4convert.contract.Decision`) to the tensors an engine expects on disk, and writes the
``quantization_config`` and side files that route the engine to its loader
(checkpoint-formats.md sections 1-3). It never reads or writes files itself.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract, Decision
from fp4convert.errors import ConversionError
from fp4convert.formats.mxfp8 import MXFP8Tensor
from fp4convert.formats.nvfp4 import NVFP4Tensor
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK, NVFP4_GLOBAL_MAX
from fp4convert.inventory import Role, TensorInfo
from fp4convert.inventory.dtypes import safetensors_code, torch_dtype
from fp4convert.version import __version__

__all__ = ["Dialect", "OutputSpec", "Planned", "exclude_list", "module_of", "producer"]

#: (name, safetensors dtype, shape) of one output tensor
OutputSpec = tuple[str, str, tuple[int, ...]]


PER_TOKEN_NOTE = (
    "per-token NVFP4 activations: input_scale is a 1.0 placeholder; the serving engine must quantize "
    "activations per token (SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1, fast-math off)"
)


def activation_mode_note(contract: Contract, items: Iterable[Planned]) -> dict[str, str]:
    """The config entry recording that per-token activation mode is required (empty otherwise)."""
    uses_nvfp4 = any(p.quantized and p.decision.format == "nvfp4" for p in items)
    if uses_nvfp4 and contract.formats.nvfp4.per_token_activations:
        return {"fp4convert_activation_mode": PER_TOKEN_NOTE}
    return {}


def producer() -> dict[str, str]:
    return {"name": "fp4convert", "version": __version__}


def module_of(tensor_name: str) -> str:
    """``model.layers.0.mlp.down_proj.weight`` -> ``model.layers.0.mlp.down_proj``."""
    return tensor_name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Planned:
    """One source tensor with its decision, as a dialect sees it."""

    info: TensorInfo
    decision: Decision

    @property
    def module(self) -> str:
        return module_of(self.info.name)

    @property
    def quantized(self) -> bool:
        return self.decision.format != "bf16" and self.info.gemm_weight


class Dialect(abc.ABC):
    """An on-disk checkpoint dialect (ModelOpt, SGLang MXFP8, compressed-tensors)."""

    name: ClassVar[str]
    #: the formats this dialect can store
    formats: ClassVar[frozenset[str]]
    #: name of the global scale / block scale / data tensors per format (for verify and dequantize)
    suffixes: ClassVar[Mapping[str, Mapping[str, str]]]

    def refusals(self, contract: Contract, items: Iterable[Planned]) -> list[str]:
        """Why this dialect cannot express the contract on this model (empty: it can)."""
        problems: list[str] = []
        used = {p.decision.format for p in items if p.quantized}
        for fmt in sorted(used - self.formats):
            problems.append(
                f"dialect {self.name!r} cannot store {fmt} tensors (it stores {', '.join(sorted(self.formats))})"
            )
        if "nvfp4" in used and contract.formats.nvfp4.weight_scale_scope == "row":
            problems.append(
                f"dialect {self.name!r} stores one FP32 outer scale per weight tensor; the contract's "
                "weight_scale_scope 'row' (one per row) cannot be written"
            )
        return problems

    def layout(self, item: Planned) -> list[OutputSpec]:
        """The output tensors for one source tensor, in write order."""
        if not item.quantized:
            return [(item.info.name, _safetensors_code(item.info.dtype), item.info.shape)]
        if item.decision.format not in self.formats or len(item.info.shape) != 2:
            return []  # unstorable here: validation refuses the plan before anything is written
        rows, cols = item.info.shape
        module = item.module
        names = self.suffixes[item.decision.format]
        if item.decision.format == "nvfp4":
            specs = [
                (f"{module}.{names['data']}", "U8", (rows, cols // 2)),
                (f"{module}.{names['scale']}", "F8_E4M3", (rows, cols // NVFP4_BLOCK)),
                (f"{module}.{names['global']}", "F32", self.global_shape),
            ]
            if self.writes_input_scale(item):
                specs.append((f"{module}.{names['input']}", "F32", self.global_shape))
            return specs
        return [
            (f"{module}.{names['data']}", "F8_E4M3", (rows, cols)),
            (f"{module}.{names['scale']}", "U8", (rows, cols // MXFP8_BLOCK)),
        ]

    #: shape of FP32 global scales: ``()`` (ModelOpt) or ``(1,)`` (compressed-tensors)
    global_shape: ClassVar[tuple[int, ...]] = ()

    def writes_input_scale(self, item: Planned) -> bool:
        return item.decision.format == "nvfp4"

    def encode(
        self, item: Planned, q: NVFP4Tensor | MXFP8Tensor | None, source: torch.Tensor, input_amax: float | None
    ) -> dict[str, torch.Tensor]:
        """The output tensors for one source tensor (``q`` is None when it stays high precision)."""
        if q is None:
            return {item.info.name: source}
        names = self.suffixes[item.decision.format]
        module = item.module
        if isinstance(q, MXFP8Tensor):
            return {
                f"{module}.{names['data']}": q.data.view(torch.float8_e4m3fn),
                f"{module}.{names['scale']}": q.scale,
            }
        assert q.data is not None and q.scale is not None  # rowwise copies are always requested
        out = {
            f"{module}.{names['data']}": q.data,
            f"{module}.{names['scale']}": q.scale.view(torch.float8_e4m3fn),
            f"{module}.{names['global']}": self.global_scale(q).reshape(self.global_shape),
        }
        if self.writes_input_scale(item):
            out[f"{module}.{names['input']}"] = self.input_scale(input_amax).reshape(self.global_shape)
        return out

    @abc.abstractmethod
    def global_scale(self, q: NVFP4Tensor) -> torch.Tensor:
        """The FP32 per-tensor scale this dialect stores for an NVFP4 weight."""

    @abc.abstractmethod
    def input_scale(self, input_amax: float | None) -> torch.Tensor:
        """The FP32 activation scale for a calibrated amax (None: per-token mode placeholder)."""

    @abc.abstractmethod
    def quantization_config(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        """The ``quantization_config`` block merged into config.json."""

    def side_files(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        """Extra JSON files (name -> content), e.g. ModelOpt's hf_quant_config.json."""
        return {}


def _safetensors_code(name: str) -> str:
    """The safetensors code a tensor of torch dtype ``name`` is stored with."""
    dtype = torch_dtype(name)
    code = None if dtype is None else safetensors_code(dtype)
    if code is None:
        raise ConversionError(f"dtype {name!r} has no safetensors spelling", hint="cast the tensor first")
    return code


def calibrated_decode_scale(input_amax: float | None) -> torch.Tensor:
    """ModelOpt's activation decode scale ``amax / (6 * 448)``; 1.0 is the per-token placeholder."""
    if input_amax is None:
        return torch.tensor(1.0, dtype=torch.float32)
    return torch.div(torch.tensor(input_amax, dtype=torch.float32), torch.tensor(NVFP4_GLOBAL_MAX))


# Fused siblings engines load into one parameter: if all listed HF modules are excluded, the fused
# engine-side name is excluded too (Miles `_augment_ignore_list`).
_FUSED_ENGINE_NAMES = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
)


def exclude_list(items: Iterable[Planned]) -> list[str]:
    """HF module names engines must load in high precision: every BF16 GEMM module.

    A layer whose routed experts stay BF16 is excluded as its ``...mlp.experts`` container
    (engines decide per FusedMoE). A module excluded in every decoder layer is written once with
    ``*`` for the layer index (fnmatch, as ModelOpt / SGLang / vLLM match it).
    """
    excluded: set[str] = set()
    per_layer: dict[str, set[int]] = {}
    layers: set[int] = set()
    for item in items:
        info = item.info
        if info.layer is not None:
            layers.add(info.layer)
        if not info.gemm_weight or item.quantized:
            continue
        module = item.module
        if info.role is Role.ROUTED_EXPERT and info.layer is not None:
            module = module.split(".experts.", 1)[0] + ".experts"
        excluded.add(module)
    for module in list(excluded):
        for parts, fused in _FUSED_ENGINE_NAMES:
            head, _, last = module.rpartition(".")
            if last == parts[0] and all(f"{head}.{p}" in excluded for p in parts):
                excluded.add(f"{head}.{fused}")
    # Collapse "model.layers.N.<rest>" when <rest> is excluded for every layer index.
    result: set[str] = set()
    for module in excluded:
        pieces = module.split(".")
        if len(pieces) > 3 and pieces[1] == "layers" and pieces[2].isdigit():
            rest = ".".join(pieces[3:])
            per_layer.setdefault(f"{pieces[0]}.layers.*.{rest}", set()).add(int(pieces[2]))
        else:
            result.add(module)
    for pattern, seen in per_layer.items():
        if layers and seen == layers:
            result.add(pattern)
        else:
            result.update(pattern.replace("*", str(i), 1) for i in seen)
    return sorted(result)
