"""SGLang / Miles MXFP8 dialect (docs/dialects.md, ``sglang-mxfp8``): ``quant_method: "mxfp8"``.

Modules: ``weight`` (F8_E4M3 ``[out, in]``) and ``weight_scale_inv`` (U8 E8M0 ``[out, in/32]``);
activations are quantized dynamically, so there is no input scale and no hf_quant_config.json.
BF16 modules are listed in ``modules_to_not_convert``. Stores MXFP8 only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import Dialect, Planned, exclude_list
from fp4convert.formats.nvfp4 import NVFP4Tensor

__all__ = ["SGLangMXFP8Dialect"]


class SGLangMXFP8Dialect(Dialect):
    name: ClassVar[str] = "sglang-mxfp8"
    quant_method: ClassVar[str] = "mxfp8"
    formats: ClassVar[frozenset[str]] = frozenset({"mxfp8"})
    suffixes: ClassVar[dict[str, dict[str, str]]] = {"mxfp8": {"data": "weight", "scale": "weight_scale_inv"}}

    def global_scale(self, q: NVFP4Tensor) -> torch.Tensor:  # pragma: no cover - refused before
        raise NotImplementedError("sglang-mxfp8 stores no NVFP4 tensors")

    def input_scale(self, input_amax: float | None) -> torch.Tensor:  # pragma: no cover - refused before
        raise NotImplementedError("sglang-mxfp8 stores no NVFP4 tensors")

    def quantization_config(self, contract: Contract, items: Sequence[Planned]) -> dict[str, Any]:
        return {
            "quant_method": self.quant_method,
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [1, 32],
            "scale_fmt": "ue8m0",
            "modules_to_not_convert": exclude_list(items),
        }
