"""ModelOpt HF export dialect (docs/dialects.md, ``modelopt``): what SGLang, vLLM and TRT-LLM load.

NVFP4 modules: ``weight`` (U8 ``[out, in/2]``), ``weight_scale`` (F8_E4M3 ``[out, in/16]``,
row-major, unswizzled), ``weight_scale_2`` (F32 ``[]``, the global *decode* scale) and
``input_scale`` (F32 ``[]``). MXFP8 modules: ``weight`` (F8_E4M3) and ``weight_scale`` (U8 E8M0).
One algorithm gives ``quant_algo`` NVFP4 or MXFP8 with an exclude list covering every BF16 GEMM
module; NVFP4 together with MXFP8 gives ``MIXED_PRECISION`` with ``quantized_layers`` written into
config.json too (without it SGLang silently picks its legacy ``w4afp8`` path).

``weight_scale_2`` is the decode scale the quantizer actually used: TE's ``rn32(1 / S_enc)``
(``profile=te``), or ModelOpt's ``amax / 2688`` under the modelopt profile, so
``e2m1 * weight_scale * weight_scale_2`` inverts the encoding exactly as it was done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import (
    Dialect,
    Planned,
    activation_mode_note,
    calibrated_decode_scale,
    exclude_list,
    producer,
)
from fp4convert.formats.nvfp4 import NVFP4Tensor

__all__ = ["ModelOptDialect"]

_ALGO = {"nvfp4": {"quant_algo": "NVFP4", "group_size": 16}, "mxfp8": {"quant_algo": "MXFP8", "group_size": 32}}
_GROUP = {
    "nvfp4": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
    "mxfp8": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": 32},
}
_KV = {"bf16": None, "fp8_e4m3": "FP8"}


class ModelOptDialect(Dialect):
    name: ClassVar[str] = "modelopt"
    quant_method: ClassVar[str] = "modelopt"
    side_file_names: ClassVar[tuple[str, ...]] = ("hf_quant_config.json",)
    formats: ClassVar[frozenset[str]] = frozenset({"nvfp4", "mxfp8"})
    suffixes: ClassVar[dict[str, dict[str, str]]] = {
        "nvfp4": {"data": "weight", "scale": "weight_scale", "global": "weight_scale_2", "input": "input_scale"},
        "mxfp8": {"data": "weight", "scale": "weight_scale"},
    }

    def global_scale(self, q: NVFP4Tensor) -> torch.Tensor:
        return q.global_decode_scale().float()

    def input_scale(self, input_amax: float | None) -> torch.Tensor:
        return calibrated_decode_scale(input_amax)

    def _algo(self, items: Sequence[Planned]) -> tuple[str, set[str]]:
        used: set[str] = {p.decision.format for p in items if p.quantized}
        if used == {"nvfp4", "mxfp8"}:
            return "MIXED_PRECISION", used
        algo = str(_ALGO[next(iter(used))]["quant_algo"]) if used else "NONE"
        return algo, used

    def _quantized_layers(self, items: Sequence[Planned]) -> dict[str, dict[str, Any]]:
        return {p.module: dict(_ALGO[p.decision.format]) for p in items if p.quantized}

    def quantization_config(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        algo, used = self._algo(items)
        config: dict[str, Any] = {
            "quant_method": self.quant_method,
            "quant_algo": algo,
            "producer": producer(),
            "kv_cache_quant_algo": _KV[contract.kv_cache],
        }
        if algo == "MIXED_PRECISION":
            config["quantized_layers"] = self._quantized_layers(items)
        else:
            fmt = used.pop()
            group: dict[str, Any] = {"weights": dict(_GROUP[fmt]), "targets": ["Linear"]}
            if fmt == "nvfp4":
                group["input_activations"] = dict(_GROUP[fmt])
            config["config_groups"] = {"group_0": group}
            config["ignore"] = exclude_list(items)
            config["group_size"] = _ALGO[fmt]["group_size"]
        if contract.kv_cache == "fp8_e4m3":
            config["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
        config.update(activation_mode_note(contract, items))
        return config

    def side_files(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        algo, used = self._algo(items)
        quantization: dict[str, Any] = {"quant_algo": algo, "kv_cache_quant_algo": _KV[contract.kv_cache]}
        if algo == "MIXED_PRECISION":
            quantization["quantized_layers"] = self._quantized_layers(items)
        else:
            # vLLM's nested NVFP4/MXFP8 parser requires these keys to exist (null is fine).
            quantization["group_size"] = _ALGO[used.pop()]["group_size"] if used else None
            quantization["exclude_modules"] = exclude_list(items)
        return {self.side_file_names[0]: {"producer": producer(), "quantization": quantization}}
