"""compressed-tensors dialect (docs/dialects.md, ``compressed-tensors``): loadable by plain transformers.

NVFP4 (``nvfp4-pack-quantized``): ``weight_packed`` (U8), ``weight_scale`` (F8_E4M3),
``weight_global_scale`` (F32 ``[1]``) and, when activations are calibrated, ``input_global_scale``.
compressed-tensors stores *encode* scales, the reciprocal of ModelOpt's: ``weight_global_scale`` is
``S_enc`` exactly as the quantizer used it: ``2688 / amax`` (``generate_gparam`` computes the same),
or ``1536 / amax`` under a 256-bound 4over6 profile, so its reciprocal still decodes the blocks.
MXFP8 (``mxfp8-quantized``): ``weight`` (F8_E4M3) and ``weight_scale`` (U8 E8M0). Both formats
together give the ``mixed-precision`` format with one config group per format.

Per-token NVFP4 activations have no compressed-tensors spelling: such contracts are written as
weight-only NVFP4 groups (``input_activations: null``), and the config records that the serving
engine must quantize activations per token itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import Dialect, Planned, activation_mode_note, exclude_list
from fp4convert.formats import profiles
from fp4convert.formats.nvfp4 import NVFP4Tensor
from fp4convert.formats.spec import NVFP4_GLOBAL_MAX

__all__ = ["CompressedTensorsDialect"]

_FORMAT = {"nvfp4": "nvfp4-pack-quantized", "mxfp8": "mxfp8-quantized"}
_WEIGHTS = {
    "nvfp4": {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "group_size": 16,
        "strategy": "tensor_group",
        "dynamic": False,
        "scale_dtype": "torch.float8_e4m3fn",
    },
    "mxfp8": {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "group_size": 32,
        "strategy": "group",
        "dynamic": False,
        "scale_dtype": "torch.uint8",
    },
}
# Activations are quantized as the weights are, but dynamically (NVFP4: a static global scale,
# dynamic local block scales).
_INPUTS = {
    "nvfp4": {**_WEIGHTS["nvfp4"], "dynamic": "local", "observer": "static_minmax"},
    "mxfp8": {**_WEIGHTS["mxfp8"], "dynamic": True},
}


class CompressedTensorsDialect(Dialect):
    name: ClassVar[str] = "compressed-tensors"
    quant_method: ClassVar[str] = "compressed-tensors"
    stores_encode_scale: ClassVar[bool] = True
    formats: ClassVar[frozenset[str]] = frozenset({"nvfp4", "mxfp8"})
    suffixes: ClassVar[dict[str, dict[str, str]]] = {
        "nvfp4": {
            "data": "weight_packed",
            "scale": "weight_scale",
            "global": "weight_global_scale",
            "input": "input_global_scale",
        },
        "mxfp8": {"data": "weight", "scale": "weight_scale"},
    }
    global_shape: ClassVar[tuple[int, ...]] = (1,)

    def __init__(self, *, per_token_activations: bool = True) -> None:
        self.per_token_activations = per_token_activations

    def writes_input_scale(self, item: Planned) -> bool:
        return item.decision.format == "nvfp4" and not self.per_token_activations

    def global_scale(self, q: NVFP4Tensor) -> torch.Tensor:
        return profiles.outer_scales(q.amax, q.profile).s_enc.float()  # type: ignore[arg-type]

    def input_scale(self, input_amax: float | None) -> torch.Tensor:
        if input_amax is None:
            return torch.tensor(1.0, dtype=torch.float32)
        return torch.div(torch.tensor(NVFP4_GLOBAL_MAX), torch.tensor(input_amax, dtype=torch.float32))

    def quantization_config(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        by_format: dict[str, list[str]] = {}
        for p in items:
            if p.quantized:
                by_format.setdefault(p.decision.format, []).append(p.module)
        groups: dict[str, Any] = {}
        for index, (fmt, modules) in enumerate(sorted(by_format.items())):
            inputs = None if (fmt == "nvfp4" and self.per_token_activations) else dict(_INPUTS[fmt])
            groups[f"group_{index}"] = {
                "targets": sorted(modules),
                "weights": dict(_WEIGHTS[fmt]),
                "input_activations": inputs,
                "output_activations": None,
                "format": _FORMAT[fmt],
            }
        top_format = _FORMAT[next(iter(by_format))] if len(by_format) == 1 else "mixed-precision"
        config: dict[str, Any] = {
            "quant_method": self.quant_method,
            "format": top_format,
            "quantization_status": "compressed",
            "config_groups": groups,
            "ignore": exclude_list(items),
            "kv_cache_scheme": None,
        }
        config.update(activation_mode_note(contract, items))
        return config
