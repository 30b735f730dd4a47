"""The activation contract: what the config says about NVFP4 activations against the scales stored.

A W4A4 scheme (ModelOpt ``NVFP4``, compressed-tensors NVFP4 groups with static
``input_activations``) makes the engine quantize activations with the stored global activation
scale, so each such module needs a usable one:

* none stored anywhere: weight-only NVFP4 labelled W4A4; the engine folds an uninitialised
  activation scale into its alpha and zeroes every expert (vLLM #54189);
* missing for some modules: those run with uninitialised scales (inf, then NaN: vLLM #45212);
* all ``1.0`` with no per-token activation mode recorded: placeholders (Miles/slime write them)
  that are only right when the engine quantizes activations per token
  (``SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1``; vLLM's MoE switch
  ``quantization_config.moe.activation: nvfp4_per_token``); with the 1.0 scale the activation
  block scales are ``amax / 6`` cast to E4M3 and small blocks fall into subnormals.
"""

from __future__ import annotations

from fp4convert.dialects import ConfigView
from fp4convert.doctor.engines import Inconsistent, built_scheme
from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding
from fp4convert.doctor.scales import ScaleValues
from fp4convert.doctor.structure import partial_spelling

__all__ = ["check_activations", "static_modules"]


def static_modules(view: ConfigView, model: Model, engine: str) -> list[str]:
    """NVFP4 modules the config gives static (stored) activation scales, as ``engine`` builds them."""
    found = []
    for layer in model.layers():
        try:
            scheme = built_scheme(engine, view, layer)
        except Inconsistent:
            continue
        if scheme is not None and scheme.format == "nvfp4" and scheme.activations == "static":
            found += [p for p in layer.pieces if model.modules[p].format == "nvfp4"]
    return sorted(found)


def check_activations(view: ConfigView, model: Model, values: ScaleValues | None, engine: str) -> list[Finding]:
    """The findings of the module docstring; ``values`` None (headers only) skips the value checks."""
    modules = static_modules(view, model, engine)
    if not modules:
        return []
    missing = [m for m in modules if "input" not in _roles(view, model, m)]
    label = "W4A4 (ModelOpt NVFP4)" if view.dialect == "modelopt" else "W4A4 (static input_activations)"
    if len(missing) == len(modules):
        placeholder_fix = (
            "mark the groups weight-only (input_activations: null)"
            if view.dialect == "compressed-tensors"
            else "write input_scale = 1.0 placeholders and record that activations are quantized per token"
        )
        return [
            Finding(
                "activations",
                "weight-only-labelled-w4a4",
                "error",
                f"no activation scale is stored, yet the config labels these NVFP4 modules {label}",
                tuple(modules),
                {
                    "vllm": "folds the uninitialised activation scale into alpha: every expert outputs zeros "
                    "(vLLM #54189)",
                    "sglang": "runs W4A4 with uninitialised activation scales (inf/NaN or zeros)",
                },
                fix=f"{placeholder_fix}, or re-export with calibrated activation scales",
                repair="config",
            )
        ]
    findings = []
    if missing:
        findings.append(
            Finding(
                "activations",
                "input-scale-missing",
                "error",
                f"{label} modules without an activation scale",
                tuple(missing),
                {"all": "leaves their activation scale uninitialised: inf, then NaN (vLLM #45212, #45320)"},
                fix="re-export with an activation scale for every module (the group's max for fused siblings)",
            )
        )
    if values is None or view.per_token_note:
        return findings
    stored = [values.stored(m, "input") for m in modules if m not in missing]
    if stored and all(v == 1.0 for v in stored):
        findings.append(
            Finding(
                "activations",
                "placeholder-input-scale",
                "warning",
                "every activation scale is 1.0 (a per-token placeholder) and the config records no per-token "
                "activation mode",
                tuple(n for m in modules if (n := values.leaf_name(m, "input")) is not None),
                {
                    "sglang": "without SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1 it quantizes activations with "
                    "global scale 1.0: small activation blocks fall into E4M3 subnormals",
                    "vllm": "dense layers run W4A4 with the 1.0 scale; MoE layers need --quantization-config "
                    '\'{"moe": {"activation": "nvfp4_per_token"}}\'',
                    "trtllm": "quantizes activations with the 1.0 global scale",
                },
                fix="serve with per-token activations and record it (fp4convert_activation_mode), or calibrate",
                repair="config",
            )
        )
    return findings


def _roles(view: ConfigView, model: Model, module: str) -> set[str]:
    """Roles a module's tensors cover in the config's dialect (headers only)."""
    found = partial_spelling(model.modules[module], view.dialect)
    if found is None:
        return set()
    dialect, fmt = found
    return {role for role, leaf in dialect.suffixes[fmt].items() if leaf in model.modules[module].leaves}
