"""Fused siblings (gate/up, w1/w3, q/k/v, MLA q_a/kv_a) whose NVFP4 outer scales differ.

Engines load each group into one parameter and do not re-quantize NVFP4: a Linear takes the
largest ``weight_scale_2`` of the group (vLLM warns, SGLang does not), a MoE layer takes w1's
(gate's), TensorRT-LLM takes the max without rescaling; every other member then dequantizes
wrong by the ratio of the scales (vLLM #54974, TRT-LLM #18772, SGLang #18950; one community
checkpoint had 69% of its expert pairs mismatched, up to 10x). Groups come from the model family
(or the sibling names when no family describes the model); the finding gives how many groups
differ, of how many, and the largest ratio with its group. Differing activation scales are a
warning: engines take the maximum, which is what calibration should have given anyway.
"""

from __future__ import annotations

import torch

from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding
from fp4convert.doctor.scales import ScaleValues, scalar_problem

__all__ = ["check_siblings"]

_ENGINES = {
    "sglang": "Linear layers take the group's largest global scale, MoE layers take w1's (gate's), with no "
    "re-quantization: the other members dequantize wrong by the ratio",
    "vllm": "warns, then takes the max (Linear) or w1's (MoE) without re-quantizing: the other members are "
    "scaled wrong (vLLM #54974)",
    "trtllm": "takes the max without rescaling the other members (TRT-LLM #18772)",
}


def _ratio(values: list[float]) -> float:
    positive = [abs(v) for v in values if v == v and v not in (0.0,)]
    if len(positive) < 2:
        return float("inf")
    return max(positive) / min(positive)


def check_siblings(values: ScaleValues, model: Model) -> list[Finding]:
    """The sibling findings of the module docstring (reads the global and input scalars)."""
    mismatched: list[tuple[float, str, list[str]]] = []
    inputs_differ: list[str] = []
    groups = 0
    for group, members in sorted(model.fused_groups().items()):
        nvfp4 = [m for m in members if model.modules[m].format == "nvfp4"]
        if len(nvfp4) != len(members):
            continue  # mixed formats: the exclude checks name them (fused-inconsistent)
        names = [values.leaf_name(m, "global") for m in nvfp4]
        if any(n is None for n in names):
            continue  # incomplete modules: structure names them
        groups += 1
        stored = [values.tensor(n).view(torch.int32) for n in names if n is not None]
        if not all(s.shape == stored[0].shape and torch.equal(s, stored[0]) for s in stored[1:]):
            decoded = [values.decode(m) or 0.0 for m in nvfp4]
            mismatched.append((_ratio(decoded), group, [n for n in names if n is not None]))
        input_values = [values.stored(m, "input") for m in nvfp4]
        usable = all(v is not None and scalar_problem(v) is None for v in input_values)
        if usable and len(set(input_values)) > 1:  # an unusable one is a scale finding already
            inputs_differ += [n for m in nvfp4 if (n := values.leaf_name(m, "input")) is not None]
    findings = []
    if mismatched:
        worst, group, _ = max(mismatched)
        findings.append(
            Finding(
                "siblings",
                "fused-scale-mismatch",
                "error",
                f"fused siblings with different global scales: {len(mismatched)} of {groups} groups, largest ratio "
                f"{worst:.4g}x (in {group})",
                tuple(n for _, _, names in sorted(mismatched, key=lambda m: m[1]) for n in names),
                dict(_ENGINES),
                fix="quantize each group with one shared amax (the max of its members'); --fix with --source "
                "re-derives them",
                repair="rederive",
            )
        )
    if inputs_differ:
        findings.append(
            Finding(
                "siblings",
                "fused-input-scale-mismatch",
                "warning",
                "fused siblings with different activation scales (they read the same input)",
                tuple(inputs_differ),
                {"all": "takes the maximum of the group's input_scale"},
                fix="calibrate one activation amax per group (the max of its members')",
            )
        )
    return findings
