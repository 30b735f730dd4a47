"""SGLang / Miles MXFP8 dialect (docs/dialects.md, ``sglang-mxfp8``): ``quant_method: "mxfp8"``.

Modules: ``weight`` (F8_E4M3 ``[out, in]``) and ``weight_scale_inv`` (U8 E8M0 ``[out, in/32]``);
activations are quantized dynamically, so there is no input scale and no hf_quant_config.json.
BF16 modules are listed in ``modules_to_not_convert``. Stores MXFP8 only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import Dialect, Planned
from fp4convert.dialects.config_view import ConfigView, Scheme, string_list
from fp4convert.formats.nvfp4 import NVFP4Tensor

__all__ = ["SGLangMXFP8Dialect"]


class SGLangMXFP8Dialect(Dialect):
    name: ClassVar[str] = "sglang-mxfp8"
    quant_method: ClassVar[str] = "mxfp8"
    # SGLang's block-FP8 loader matches modules_to_not_convert by exact (dotted) module path: no `*`.
    exclude_wildcards: ClassVar[bool] = False
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
            "modules_to_not_convert": self.exclude_patterns(items),
        }

    def read_config(self, quantization: Mapping[str, Any]) -> ConfigView:
        """Every module not in ``modules_to_not_convert`` (or ``ignored_layers``) is MXFP8.

        Example:
            >>> view = SGLangMXFP8Dialect().read_config({"quant_method": "mxfp8", "weight_block_size": [128, 128]})
            >>> view.default.format, view.problems[0][1].split(":")[0]
            ('mxfp8', 'weight_block_size [128, 128]')
        """
        problems: list[tuple[str, str]] = []
        block = quantization.get("weight_block_size")
        if block != [1, 32]:
            problems.append(
                ("all", f"weight_block_size {block}: MXFP8 needs [1, 32] (one scale per 32 values of a row)")
            )
        key = "ignored_layers" if "ignored_layers" in quantization else "modules_to_not_convert"
        excluded = string_list(quantization.get(key)) if quantization.get(key) is not None else ()
        if excluded is None:
            problems.append(("all", f"{key} is not a list of module names"))
            excluded = ()
        return ConfigView(
            self.name,
            "mxfp8",
            default=Scheme("mxfp8", "dynamic", "mxfp8"),
            excluded=excluded,
            exclude_key=key,
            problems=tuple(problems),
        )
