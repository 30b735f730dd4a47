"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): GQA attention with full-width q/k RMSNorm, every layer a
``block_sparse_moe`` with sigmoid routing and an expert-bias correction, no shared expert.

- ``self_attn.q_norm`` / ``k_norm`` normalize the whole projection (``[heads * head_dim]`` and
  ``[kv_heads * head_dim]``), not each head; Megatron-Core's own QK norm is per head, so the
  Megatron model is built with Megatron-Bridge's ``minimax_m2_layer_spec``, which keeps the names
  ``self_attention.q_layernorm`` / ``k_layernorm``.
- ``block_sparse_moe.e_score_correction_bias`` is ``mlp.router.expert_bias``; routers stay in the
  router role.
- The hub checkpoint is FP8 block-scaled (``weight_scale_inv``); that source is read by the
  FP8 source reader; the table names the BF16 tensors. The MTP modules of the config
  (``use_mtp``, ``num_mtp_modules``) are not in the published weights and are not mapped.
"""

from __future__ import annotations

from fp4convert.families._common import (
    BLOCK_SPARSE_MOE,
    GLOBALS,
    GQA_ATTENTION,
    gqa_dims,
    model_features,
    router_expert_bias,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Direct, Family, FamilyKey, norm

__all__ = ["MINIMAX_M2"]

_FULL_QK_NORM = (
    Direct("self_attention.q_layernorm.weight", norm("self_attn.q_norm.weight", "q_size"), requires=("qk_norm",)),
    Direct("self_attention.k_layernorm.weight", norm("self_attn.k_norm.weight", "kv_size"), requires=("qk_norm",)),
)


def _dims(config: ModelConfig) -> dict[str, int]:
    return {
        **gqa_dims(config),
        "moe_intermediate": config.get_int("intermediate_size"),  # the experts' width
        "num_experts": config.get_int("num_local_experts"),
    }


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config)
    if config.get_flag("use_qk_norm", True):
        found.add("qk_norm")
    if layer is not None:
        found.add("moe")
    return frozenset(found)


MINIMAX_M2 = Family(
    key=FamilyKey.MINIMAX_M2,
    architectures=("MiniMaxM2ForCausalLM",),
    model_types=("minimax_m2",),
    global_entries=GLOBALS,
    layer_entries=(
        *GQA_ATTENTION,
        *_FULL_QK_NORM,
        *BLOCK_SPARSE_MOE,
        router_expert_bias("block_sparse_moe.e_score_correction_bias", None),
    ),
    dims=_dims,
    features=_features,
)
