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

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from fp4convert.contract import Contract
from fp4convert.dialects.base import (
    Dialect,
    Planned,
    activation_mode_note,
    calibrated_decode_scale,
    producer,
)
from fp4convert.dialects.config_view import ConfigView, Scheme, mapping, string_list
from fp4convert.formats.nvfp4 import NVFP4Tensor

__all__ = ["ModelOptDialect"]

_ALGO = {"nvfp4": {"quant_algo": "NVFP4", "group_size": 16}, "mxfp8": {"quant_algo": "MXFP8", "group_size": 32}}
_GROUP = {
    "nvfp4": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
    "mxfp8": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": 32},
}
_KV = {"bf16": None, "fp8_e4m3": "FP8"}
# What each quant_algo a reader may meet means (ModelOpt's NVFP4 is W4A4 with a static activation
# scale; W4A16_NVFP4 is weight-only; MXFP8 activations are dynamic); anything else is not a format
# fp4convert stores (FP8 variants, AWQ ...).
_SCHEMES = {
    "NVFP4": Scheme("nvfp4", "static", "NVFP4"),
    "W4A16_NVFP4": Scheme("nvfp4", "none", "W4A16_NVFP4"),
    "MXFP8": Scheme("mxfp8", "dynamic", "MXFP8"),
}
_PER_TOKEN_KEY = "fp4convert_activation_mode"


def _scheme(algo: Any) -> Scheme:
    name = str(algo or "").upper()
    return _SCHEMES.get(name, Scheme("other", "static", name))


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
            config["ignore"] = self.exclude_patterns(items)
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
            quantization["exclude_modules"] = self.exclude_patterns(items)
        return {self.side_file_names[0]: {"producer": producer(), "quantization": quantization}}

    def read_config(self, quantization: Mapping[str, Any]) -> ConfigView:
        """Read the flat form (config.json) or the nested one (``hf_quant_config.json``, whose
        ``quantization`` block holds ``exclude_modules``).

        Example:
            >>> from fp4convert.dialects import get_dialect
            >>> view = get_dialect("modelopt").read_config({"quant_method": "modelopt", "quant_algo": "NVFP4",
            ...     "config_groups": {"g": {"weights": {"group_size": 16}}}, "ignore": ["lm_head"]})
            >>> view.default.format, view.default.activations, view.excluded, view.problems
            ('nvfp4', 'static', ('lm_head',), ())
        """
        nested = isinstance(quantization.get("quantization"), Mapping)
        inner = mapping(quantization.get("quantization")) if nested else quantization
        algo = str(inner.get("quant_algo") or "").upper()
        key = "exclude_modules" if nested else "ignore"
        problems: list[tuple[str, str]] = []
        excluded = string_list(inner.get(key)) if inner.get(key) is not None else ()
        if excluded is None:
            problems.append(("all", f"{key} is not a list of module names"))
            excluded = ()
        listed: dict[str, Scheme] = {}
        default = None
        if algo == "MIXED_PRECISION":
            layers = mapping(inner.get("quantized_layers"))
            listed = {name: _scheme(mapping(entry).get("quant_algo")) for name, entry in layers.items()}
            if not listed:
                problems.append(
                    (
                        "sglang",
                        "quant_algo MIXED_PRECISION without quantized_layers: SGLang takes its legacy w4afp8 "
                        "path (it reads quantized_layers from config.json, not hf_quant_config.json)",
                    )
                )
        elif not algo:
            problems.append(("all", "no quant_algo: the loaders cannot tell the format"))
        else:
            default = _scheme(algo)
            if nested:
                needed = ("kv_cache_quant_algo", "exclude_modules") + (
                    ("group_size",) if default.format == "nvfp4" else ()
                )
                missing = [k for k in needed if k not in inner]
                if missing:
                    problems.append(
                        ("vllm", f"the nested form lacks {', '.join(missing)}, which vLLM's parser requires")
                    )
            elif default.format == "nvfp4" and not _group_size(quantization):
                problems.append(
                    (
                        "sglang",
                        "no group_size (in config_groups.*.weights or at the top): SGLang's ModelOpt FP4 parser "
                        "raises without one",
                    )
                )
        return ConfigView(
            self.name,
            algo,
            default=default,
            listed=listed,
            excluded=excluded,
            exclude_key=key,
            per_token_note=_PER_TOKEN_KEY in quantization or _PER_TOKEN_KEY in inner,
            problems=tuple(problems),
        )


def _group_size(quantization: Mapping[str, Any]) -> bool:
    groups = mapping(quantization.get("config_groups")).values()
    return "group_size" in quantization or any("group_size" in mapping(mapping(g).get("weights")) for g in groups)
