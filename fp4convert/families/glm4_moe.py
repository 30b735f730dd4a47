"""GLM-4.5 / 4.6 (``Glm4MoeForCausalLM``): GQA attention with q/k/v biases, dense first layers, routed
plus shared experts with an expert-bias correction, MTP layers after the decoder layers.

- ``attention_bias: true`` gives q/k/v biases (transformers' ``Glm4MoeAttention``; o_proj has
  none); ``use_qk_norm`` adds per-head q/k RMSNorm (GLM-4.5 has it, GLM-4.5-Air does not).
- Layers ``< first_k_dense_replace`` are dense; the rest are MoE: router ``mlp.gate`` with its
  ``e_score_correction_bias`` (float32 on disk, like DeepSeek's), routed experts and
  ``n_shared_experts`` shared experts ``mlp.shared_experts`` (plural) of width
  ``moe_intermediate * n_shared_experts``.
- MTP layer ``k`` (``num_nextn_predict_layers``) is HF ``model.layers.{num_hidden_layers + k}``:
  a full MoE decoder layer plus DeepSeek's glue (enorm, hnorm, eh_proj, shared_head.norm and copies
  of the embedding and output layer), the layout of Megatron-Bridge's ``glm45_bridge.py``.
"""

from __future__ import annotations

import dataclasses

from fp4convert.families._common import (
    DEEPSEEK_MTP_GLUE,
    DENSE_MLP,
    GLOBALS,
    GQA_ATTENTION,
    QK_NORM,
    ROUTED_EXPERTS,
    SHARED_EXPERTS,
    dense_first_mlp_features,
    gqa_dims,
    model_features,
    router_expert_bias,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["GLM4_MOE"]

_OPTIONAL_QK_NORM = tuple(dataclasses.replace(entry, requires=("qk_norm",)) for entry in QK_NORM)


def _dims(config: ModelConfig) -> dict[str, int]:
    moe_intermediate = config.get_int("moe_intermediate_size")
    return {
        **gqa_dims(config),
        "moe_intermediate": moe_intermediate,
        "num_experts": config.get_int("n_routed_experts"),
        "shared_intermediate": moe_intermediate * config.get_int("n_shared_experts", default=0),
        "eh_in": 2 * config.get_int("hidden_size"),
    }


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config, qkv_bias=config.get_flag("attention_bias", False))
    if config.get_flag("use_qk_norm", False):
        found.add("qk_norm")
    if layer is not None:
        found |= dense_first_mlp_features(config, layer)
    return frozenset(found)


GLM4_MOE = Family(
    key=FamilyKey.GLM4_MOE,
    architectures=("Glm4MoeForCausalLM",),
    model_types=("glm4_moe",),
    global_entries=GLOBALS,
    layer_entries=(
        *GQA_ATTENTION,
        *_OPTIONAL_QK_NORM,
        *DENSE_MLP,
        *ROUTED_EXPERTS,
        router_expert_bias("mlp.gate.e_score_correction_bias", "float32"),
        *SHARED_EXPERTS,
    ),
    dims=_dims,
    features=_features,
    mtp_glue_entries=DEEPSEEK_MTP_GLUE,
    mtp_layers_key="num_nextn_predict_layers",
)
