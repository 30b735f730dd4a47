"""doctor's corpus: healthy checkpoints (fp4convert's own outputs and peer-style ones) and one fault each.

A :class:`Fault` names its base checkpoint, the damage (a function of the copied folder, from
:mod:`doctor.damage`), the finding it must produce and tensors that finding must name, how doctor
is run (engine, with the source, with a contract), and how ``--fix`` repairs it (``config``,
``rederive``, or None).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _helpers import MXFP8_ALL, NVFP4_EXPERTS
from doctor.damage import (
    config_edit,
    ct_static_inputs,
    ct_untarget,
    delete_quantization,
    drop,
    exclude,
    flip_byte,
    index_edit,
    modelopt_config_for_mxfp8,
    mtp_dropped,
    requantize,
    retype,
    set_value,
    side_differs,
    swizzle,
    without,
)

HERE = Path(__file__).parent
MIXED = HERE / "data" / "nvfp4-experts-mxfp8-attention.yaml"
CALIBRATED = HERE / "data" / "nvfp4-experts-calibrated.yaml"
FOUR_OVER_SIX = HERE / "data" / "nvfp4-experts-4over6-mse-256.yaml"
DEEPSEEK_MXFP8 = NVFP4_EXPERTS.parent / "deepseek-v3-mxfp8-mla-bf16.yaml"
E = "model.layers.{layer}.mlp.experts.{expert}.{proj}"

#: base name -> how it is made: ("converted", model, dialect, contract) or ("peer", model, style, faults)
BASES: dict[str, tuple[Any, ...]] = {
    "mo-nvfp4": ("converted", "qwen3_moe", "modelopt", NVFP4_EXPERTS),
    "ct-nvfp4": ("converted", "qwen3_moe", "compressed-tensors", NVFP4_EXPERTS),
    "mo-nvfp4-4over6": ("converted", "qwen3_moe", "modelopt", FOUR_OVER_SIX),
    "mo-mxfp8": ("converted", "qwen3_moe", "modelopt", MXFP8_ALL),
    "sg-mxfp8": ("converted", "qwen3_moe", "sglang-mxfp8", MXFP8_ALL),
    "ct-mxfp8": ("converted", "qwen3_moe", "compressed-tensors", MXFP8_ALL),
    "mo-mixed": ("converted", "qwen3_moe", "modelopt", MIXED),
    "ct-mixed": ("converted", "qwen3_moe", "compressed-tensors", MIXED),
    "ds-nvfp4": ("converted", "deepseek_v3", "modelopt", NVFP4_EXPERTS),
    "ds-mxfp8": ("converted", "deepseek_v3", "sglang-mxfp8", DEEPSEEK_MXFP8),
    "tied-mxfp8": ("converted", "qwen3", "modelopt", MXFP8_ALL),
    "peer-modelopt": ("peer", "qwen3_moe", "modelopt", frozenset()),
    "peer-llmcompressor": ("peer", "qwen3_moe", "llmcompressor", frozenset()),
    "peer-miles": ("peer", "qwen3_moe", "miles-mxfp8", frozenset()),
}


# -- the faults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    base: str
    damage: Callable[[Path], None] | None
    code: str
    tensors: tuple[str, ...]
    engine: str | None = None
    with_source: bool = False
    contract: Path | None = None
    fix: str | None = None
    also: frozenset[str] = field(default_factory=frozenset)  # other codes the fault brings along

    def __str__(self) -> str:
        return self.name


_ATTN = "model.layers.{layer}.self_attn.{proj}"
FAULTS: tuple[Fault, ...] = (
    Fault(
        "lm-head-not-excluded",
        "mo-nvfp4",
        exclude(without("lm_head")),
        "lm-head-not-excluded",
        ("lm_head",),
        fix="config",
    ),
    Fault(
        "tied-lm-head-not-excluded",
        "tied-mxfp8",
        exclude(without("lm_head")),
        "lm-head-not-excluded",
        ("lm_head",),
        engine="vllm",
        fix="config",
    ),
    Fault(
        "router-not-excluded",
        "mo-nvfp4",
        exclude(without("model.layers.0.mlp.gate")),
        "bf16-not-excluded",
        ("model.layers.0.mlp.gate",),
        fix="config",
    ),
    Fault(
        "fused-name-missing",
        "mo-nvfp4",
        exclude(without("model.layers.*.self_attn.qkv_proj")),
        "fused-name-not-excluded",
        (_ATTN.format(layer=0, proj="qkv_proj"), _ATTN.format(layer=2, proj="qkv_proj")),
        engine="sglang",
        fix="config",
    ),
    Fault(
        "exclude-without-prefix",
        "mo-nvfp4",
        exclude(lambda es: [e.removeprefix("model.") for e in es]),
        "exclude-prefix",
        (_ATTN.format(layer=1, proj="o_proj"),),
        engine="sglang",
        fix="config",
        also=frozenset({"exclude-dead-entry"}),
    ),
    Fault(
        "quantized-excluded",
        "mo-nvfp4",
        exclude(lambda es: [*es, "model.layers.0.mlp.experts"]),
        "quantized-excluded",
        ("model.layers.0.mlp.experts",),
        fix="config",
    ),
    Fault(
        "mtp-not-excluded",
        "ds-nvfp4",
        exclude(mtp_dropped),
        "mtp-not-excluded",
        ("model.layers.3.eh_proj",),
        fix="config",
    ),
    Fault(
        "mtp-missing",
        "ds-nvfp4",
        drop("model.layers.3.", prefix=True),
        "tensor-missing",
        ("model.layers.3.eh_proj.weight",),
        also=frozenset({"exclude-dead-entry"}),
    ),
    Fault(
        "dead-exclude-entry",
        "mo-nvfp4",
        exclude(lambda es: [*es, "model.layers.0.mlp.shared_expert"]),
        "exclude-dead-entry",
        ("model.layers.0.mlp.shared_expert",),
        fix="config",
    ),
    Fault(
        "global-scale-zero",
        "mo-nvfp4",
        set_value(E.format(layer=0, expert=1, proj="down_proj") + ".weight_scale_2", 0.0),
        "global-scale-zero",
        (E.format(layer=0, expert=1, proj="down_proj") + ".weight_scale_2",),
        with_source=True,
        fix="rederive",
        also=frozenset({"block-scale-max"}),
    ),
    Fault(
        "global-scale-nan",
        "mo-nvfp4",
        set_value(E.format(layer=2, expert=2, proj="down_proj") + ".weight_scale_2", float("nan")),
        "global-scale-nan",
        (E.format(layer=2, expert=2, proj="down_proj") + ".weight_scale_2",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "global-scale-subnormal",
        "ct-nvfp4",
        set_value(E.format(layer=0, expert=3, proj="down_proj") + ".weight_global_scale", 1e-40),
        "global-scale-subnormal",
        (E.format(layer=0, expert=3, proj="down_proj") + ".weight_global_scale",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "global-scale-negative",
        "mo-nvfp4",
        set_value(E.format(layer=0, expert=0, proj="down_proj") + ".weight_scale_2", -0.001),
        "global-scale-negative",
        (E.format(layer=0, expert=0, proj="down_proj") + ".weight_scale_2",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "input-scale-zero",
        "mo-nvfp4",
        set_value(E.format(layer=2, expert=1, proj="gate_proj") + ".input_scale", 0.0),
        "input-scale-zero",
        (E.format(layer=2, expert=1, proj="gate_proj") + ".input_scale",),
    ),
    Fault(
        "input-scale-missing",
        "mo-nvfp4",
        drop(*(E.format(layer=0, expert=0, proj=p) + ".input_scale" for p in ("gate_proj", "up_proj"))),
        "input-scale-missing",
        (E.format(layer=0, expert=0, proj="gate_proj"),),
    ),
    Fault(
        "placeholder-without-mode",
        "mo-nvfp4",
        config_edit(lambda q: q.pop("fp4convert_activation_mode")),
        "placeholder-input-scale",
        (E.format(layer=0, expert=0, proj="up_proj") + ".input_scale",),
        fix="config",
    ),
    Fault(
        "block-scale-nan",
        "mo-nvfp4",
        flip_byte(E.format(layer=2, expert=3, proj="gate_proj") + ".weight_scale", 0x7F),
        "block-scale-nan",
        (E.format(layer=2, expert=3, proj="gate_proj") + ".weight_scale",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "block-scale-negative",
        "ct-nvfp4",
        flip_byte(E.format(layer=0, expert=2, proj="down_proj") + ".weight_scale", 0xB8, 3),
        "block-scale-negative",
        (E.format(layer=0, expert=2, proj="down_proj") + ".weight_scale",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "block-scale-max",
        "mo-nvfp4",
        requantize(E.format(layer=0, expert=2, proj="down_proj"), amax_factor=8.0),
        "block-scale-max",
        (E.format(layer=0, expert=2, proj="down_proj") + ".weight_scale",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "fused-scale-mismatch",
        "mo-nvfp4",
        requantize(E.format(layer=2, expert=0, proj="up_proj"), amax_factor=2.0),
        "fused-scale-mismatch",
        tuple(E.format(layer=2, expert=0, proj=p) + ".weight_scale_2" for p in ("gate_proj", "up_proj")),
        with_source=True,
        fix="rederive",
        also=frozenset({"block-scale-max", "provenance-unknown"}),
    ),
    Fault(
        "scale-swizzled",
        "mo-nvfp4",
        swizzle(E.format(layer=0, expert=0, proj="down_proj") + ".weight_scale"),
        "scale-swizzled",
        (E.format(layer=0, expert=0, proj="down_proj") + ".weight_scale",),
    ),
    Fault(
        "incomplete-module",
        "mo-nvfp4",
        drop(E.format(layer=2, expert=3, proj="down_proj") + ".weight_scale_2"),
        "incomplete-module",
        (E.format(layer=2, expert=3, proj="down_proj") + ".weight_scale_2",),
    ),
    Fault(
        "dtype-mismatch",
        "mo-nvfp4",
        retype(E.format(layer=2, expert=2, proj="gate_proj") + ".weight_scale"),
        "dtype-mismatch",
        (E.format(layer=2, expert=2, proj="gate_proj") + ".weight_scale",),
    ),
    Fault(
        "orphan-scale",
        "mo-nvfp4",
        drop(E.format(layer=0, expert=3, proj="down_proj") + ".weight"),
        "orphan-scale",
        (E.format(layer=0, expert=3, proj="down_proj") + ".weight_scale",),
        also=frozenset({"tensor-missing"}),
    ),
    Fault(
        "index-wrong-shard",
        "mo-nvfp4",
        index_edit(lambda m: m.__setitem__("model.norm.weight", sorted(set(m.values()))[0])),
        "index-wrong-shard",
        ("model.norm.weight",),
        fix="config",
    ),
    Fault(
        "index-unlisted",
        "mo-nvfp4",
        index_edit(lambda m: m.pop("model.layers.1.mlp.up_proj.weight")),
        "index-tensor-unlisted",
        ("model.layers.1.mlp.up_proj.weight",),
        fix="config",
    ),
    Fault(
        "index-ghost",
        "mo-nvfp4",
        index_edit(lambda m: m.__setitem__("model.layers.0.mlp.ghost.weight", sorted(set(m.values()))[0])),
        "index-tensor-missing",
        ("model.layers.0.mlp.ghost.weight",),
        fix="config",
    ),
    Fault(
        "no-quantization-config",
        "mo-nvfp4",
        delete_quantization,
        "no-quantization-config",
        (E.format(layer=0, expert=0, proj="gate_proj"),),
        fix="config",
    ),
    Fault("mxfp8-modelopt-for-sglang", "mo-mxfp8", None, "engine-refuses", (), engine="sglang"),
    Fault("sglang-mxfp8-for-vllm", "sg-mxfp8", None, "engine-refuses", (), engine="vllm"),
    Fault(
        "spelling-mismatch",
        "sg-mxfp8",
        modelopt_config_for_mxfp8,
        "spelling-mismatch",
        (_ATTN.format(layer=0, proj="q_proj"),),
        fix="config",
        also=frozenset({"quantized-not-routed", "format-mismatch", "side-file-missing"}),
    ),
    Fault(
        "mixed-without-quantized-layers",
        "mo-mixed",
        config_edit(lambda q: q.pop("quantized_layers")),
        "quantized-not-routed",
        (E.format(layer=0, expert=0, proj="gate_proj")[: -len(".0.gate_proj")],),
        fix="config",
        also=frozenset({"config-key", "side-file-differs"}),
    ),
    Fault(
        "ct-weight-only-labelled-w4a4",
        "ct-nvfp4",
        config_edit(ct_static_inputs),
        "weight-only-labelled-w4a4",
        (E.format(layer=0, expert=0, proj="gate_proj"),),
        fix="config",
    ),
    Fault(
        "ct-untargeted",
        "ct-mixed",
        config_edit(ct_untarget),
        "quantized-not-routed",
        (_ATTN.format(layer=0, proj="o_proj"),),
        fix="config",
    ),
    Fault("side-file-differs", "mo-nvfp4", side_differs, "side-file-differs", ("hf_quant_config.json",), fix="config"),
    Fault(
        "stale-bytes",
        "mo-nvfp4",
        flip_byte(E.format(layer=2, expert=1, proj="down_proj") + ".weight", 0x11, 5),
        "provenance-unknown",
        (E.format(layer=2, expert=1, proj="down_proj"),),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "contract-mismatch",
        "mo-nvfp4",
        None,
        "contract-format",
        ("model.layers.0.self_attn.q_proj",),
        contract=MXFP8_ALL,
    ),
    Fault(
        "mxfp8-block-nan",
        "ct-mxfp8",
        flip_byte(_ATTN.format(layer=1, proj="o_proj") + ".weight_scale", 0xFF),
        "block-scale-nan",
        (_ATTN.format(layer=1, proj="o_proj") + ".weight_scale",),
        with_source=True,
        fix="rederive",
    ),
    # peer-style checkpoints
    Fault(
        "peer-separate-gate-up",
        "peer-llmcompressor|separate-gate-up",
        None,
        "fused-scale-mismatch",
        (E.format(layer=0, expert=0, proj="gate_proj") + ".weight_global_scale",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "peer-modelopt-separate-gate-up",
        "peer-modelopt|separate-gate-up",
        None,
        "fused-scale-mismatch",
        (E.format(layer=2, expert=3, proj="up_proj") + ".weight_scale_2",),
        with_source=True,
        fix="rederive",
    ),
    Fault(
        "peer-no-input-scale",
        "peer-modelopt|no-input-scale",
        None,
        "weight-only-labelled-w4a4",
        (E.format(layer=0, expert=1, proj="down_proj"),),
        fix="config",
    ),
    Fault(
        "peer-input-placeholders",
        "peer-modelopt|input-ones",
        None,
        "placeholder-input-scale",
        (E.format(layer=2, expert=0, proj="up_proj") + ".input_scale",),
        fix="config",
    ),
    Fault(
        "peer-no-model-prefix",
        "peer-modelopt|no-model-prefix",
        None,
        "exclude-prefix",
        ("model.layers.0.mlp.gate",),
        engine="sglang",
        fix="config",
        also=frozenset({"exclude-dead-entry"}),
    ),
    Fault(
        "peer-no-fused-names",
        "peer-modelopt|no-fused-names",
        None,
        "fused-name-not-excluded",
        (_ATTN.format(layer=1, proj="qkv_proj"),),
        engine="sglang",
        fix="config",
    ),
    # ModelOpt's division order gives other bytes than TE's for some modules (not all: on others they agree)
    Fault(
        "peer-modelopt-arithmetic",
        "peer-modelopt",
        None,
        "provenance-contract",
        (E.format(layer=0, expert=1, proj="down_proj"), E.format(layer=2, expert=2, proj="gate_proj")),
        with_source=True,
        contract=CALIBRATED,
        fix="rederive",
    ),
)


def copy_base(base: Path, folder: Path) -> Path:
    shutil.copytree(base, folder)
    return folder
