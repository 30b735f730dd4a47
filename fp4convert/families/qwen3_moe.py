"""Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention, routed experts, no shared expert (section 5.2).

A layer is dense instead of MoE when it is listed in ``mlp_only_layers`` or when
``(layer + 1) % decoder_sparse_step != 0`` (the rule of transformers' ``Qwen3MoeDecoderLayer``);
Qwen3-30B-A3B has every layer MoE.
"""

from __future__ import annotations

from fp4convert.families._common import (
    DENSE_MLP,
    GLOBALS,
    GQA_ATTENTION,
    QK_NORM,
    ROUTED_EXPERTS,
    gqa_dims,
    model_features,
    sparse_step_is_moe,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["QWEN3_MOE"]


def _dims(config: ModelConfig) -> dict[str, int]:
    return {
        **gqa_dims(config),
        "moe_intermediate": config.get_int("moe_intermediate_size"),
        # transformers 5 writes num_local_experts; the published configs say num_experts.
        "num_experts": config.get_first_int("num_experts", "num_local_experts"),
    }


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config)
    if layer is not None:
        num_experts = config.get_first_int("num_experts", "num_local_experts")
        found.add("moe" if sparse_step_is_moe(config, layer, num_experts) else "dense_mlp")
    return frozenset(found)


QWEN3_MOE = Family(
    key=FamilyKey.QWEN3_MOE,
    architectures=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *QK_NORM, *DENSE_MLP, *ROUTED_EXPERTS),
    dims=_dims,
    features=_features,
)
