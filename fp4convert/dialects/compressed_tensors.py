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

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import Dialect, Planned, activation_mode_note
from fp4convert.dialects.config_view import Activations, ConfigView, Scheme, mapping, string_list
from fp4convert.formats import kernels, profiles
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
    # vLLM and SGLang match `ignore` entries exactly or as `re:` regexes, never as fnmatch patterns.
    exclude_wildcards: ClassVar[bool] = False
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
        fast = kernels.outer_encode_scales(q.amax, q.profile)  # type: ignore[arg-type]
        return fast if fast is not None else profiles.outer_scales(q.amax, q.profile).s_enc.float()  # type: ignore[arg-type]

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
            "ignore": self.exclude_patterns(items),
            "kv_cache_scheme": None,
        }
        config.update(activation_mode_note(contract, items))
        return config

    def read_config(self, quantization: Mapping[str, Any]) -> ConfigView:
        """Read ``config_groups`` back: exact targets are listed, ``re:`` targets are patterns, class
        targets (``Linear``) give the default scheme; ``ignore`` is the exclude list.

        Example:
            >>> from fp4convert.dialects import get_dialect
            >>> view = get_dialect("compressed-tensors").read_config({"config_groups": {"group_0": {
            ...     "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16,
            ...     "strategy": "tensor_group"}, "input_activations": None}}, "ignore": ["lm_head"]})
            >>> view.default.format, view.default.activations, view.excluded
            ('nvfp4', 'none', ('lm_head',))
        """
        problems: list[tuple[str, str]] = []
        default = None
        listed: dict[str, Scheme] = {}
        patterns: list[tuple[str, Scheme]] = []
        for group_name, group in mapping(quantization.get("config_groups")).items():
            group = mapping(group)
            scheme = _group_scheme(group, str(quantization.get("format", "")))
            if scheme.format == "nvfp4" and mapping(group.get("weights")).get("strategy") != "tensor_group":
                problems.append(
                    (
                        "all",
                        f"config group {group_name}: NVFP4 weights without strategy tensor_group are not "
                        "detected as NVFP4 by vLLM or SGLang",
                    )
                )
            for target in string_list(group.get("targets")) or ():
                if target.startswith("re:"):
                    patterns.append((target[3:], scheme))
                elif "." not in target and target[:1].isupper():
                    default = scheme  # a module class (Linear): every such module not ignored
                else:
                    listed[target] = scheme
        if not (default or listed or patterns):
            problems.append(("all", "config_groups targets no module"))
        excluded = string_list(quantization.get("ignore")) if quantization.get("ignore") is not None else ()
        if excluded is None:
            problems.append(("all", "ignore is not a list of module names"))
            excluded = ()
        return ConfigView(
            self.name,
            str(quantization.get("format", "")),
            default=default,
            listed=listed,
            patterns=tuple(patterns),
            excluded=excluded,
            per_token_note="fp4convert_activation_mode" in quantization,
            problems=tuple(problems),
        )


def _group_scheme(group: Mapping[str, Any], top_format: str) -> Scheme:
    """A config group's scheme from its weight and activation arguments."""
    weights = mapping(group.get("weights"))
    bits, size, kind = weights.get("num_bits"), weights.get("group_size"), weights.get("type")
    fmt = "other"
    if kind == "float" and (bits, size) == (4, 16):
        fmt = "nvfp4"
    elif kind == "float" and (bits, size) == (8, 32) and weights.get("strategy") == "group":
        fmt = "mxfp8"
    inputs = group.get("input_activations")
    activations: Activations = "none"
    if isinstance(inputs, Mapping):
        # "local": dynamic block scales under a static global one (input_global_scale)
        activations = "dynamic" if inputs.get("dynamic") is True else "static"
    return Scheme(fmt, activations, str(group.get("format") or top_format))
