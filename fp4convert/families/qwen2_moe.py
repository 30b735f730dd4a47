"""Qwen2-MoE (``Qwen2MoeForCausalLM``, e.g. Qwen1.5-MoE-A2.7B): Qwen2 attention with q/k/v biases,
routed experts plus one gated shared expert.

- q/k/v carry biases when ``qkv_bias`` (transformers 5's field; absent in the published configs,
  where it defaults to true); o_proj has none.
- A layer is MoE by the Qwen rule (``decoder_sparse_step``, ``mlp_only_layers``), else a dense MLP
  of ``intermediate_size``.
- The shared expert (``mlp.shared_expert``, singular, width ``shared_expert_intermediate_size``) is
  Megatron-Core's ``mlp.shared_experts``; its ``shared_expert_gate`` ``[1, hidden]`` is
  ``shared_experts.gate_weight`` (``moe_shared_expert_gate``) and carries the router role.
"""

from __future__ import annotations

from fp4convert.families._common import (
    DENSE_MLP,
    GLOBALS,
    GQA_ATTENTION,
    ROUTED_EXPERTS,
    SHARED_EXPERT_GATED,
    gqa_dims,
    model_features,
    sparse_step_is_moe,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["QWEN2_MOE"]


def _dims(config: ModelConfig) -> dict[str, int]:
    return {
        **gqa_dims(config),
        "moe_intermediate": config.get_int("moe_intermediate_size"),
        "num_experts": config.get_int("num_experts"),
        "shared_intermediate": config.get_int("shared_expert_intermediate_size"),
        "one": 1,
    }


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config, qkv_bias=config.get_flag("qkv_bias", True))
    if layer is not None:
        moe = sparse_step_is_moe(config, layer, config.get_int("num_experts"))
        found.add("moe" if moe else "dense_mlp")
    return frozenset(found)


QWEN2_MOE = Family(
    key=FamilyKey.QWEN2_MOE,
    architectures=("Qwen2MoeForCausalLM",),
    model_types=("qwen2_moe",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *DENSE_MLP, *ROUTED_EXPERTS, *SHARED_EXPERT_GATED),
    dims=_dims,
    features=_features,
)
