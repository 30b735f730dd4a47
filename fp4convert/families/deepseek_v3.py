"""DeepSeek-V3 and Kimi-K2: MLA attention, dense first layers, routed + shared experts, MTP layers (5.3).

Kimi-K2 (``Kimi-K2-Instruct``) is this architecture at other sizes: 384 routed experts, one dense
layer (``first_k_dense_replace: 1``), 64 heads, no MTP layer (``num_nextn_predict_layers: 0``); its
config says ``architectures: [DeepseekV3ForCausalLM]`` with ``model_type: kimi_k2`` (Megatron-Bridge's
kimi_bridge.py uses the DeepSeek mapping list).

- Layers ``< first_k_dense_replace`` have a dense MLP (TE fuses its norm into ``linear_fc1``); the
  rest are MoE with a router (plus ``e_score_correction_bias``, float32 on disk), routed experts and
  ``n_shared_experts`` shared experts fused into one MLP of width ``moe_intermediate * n_shared``.
- MLA is not fused with the input norm: Megatron keeps ``input_layernorm``. TE fuses
  ``q_a_layernorm`` / ``kv_a_layernorm`` into the following up-projection; the local spec's
  ``q_layernorm`` / ``kv_layernorm`` spellings come from ``_spelling.SEPARATE_NORMS``, and
  ``mla_down_proj_fusion``'s ``linear_qkv_down_proj`` is unpacked there too.
- ``q_lora_rank: null`` (DeepSeek-V2-Lite style) replaces q_a/q_b by a single ``q_proj``.
- ``q_a_proj`` and ``kv_a_proj_with_mqa`` read the same normalized input and SGLang fuses them
  (``fused_qkv_a_proj_with_mqa``), so they form one scale group although Megatron keeps them apart.
- MTP layer ``k`` is HF ``model.layers.{num_hidden_layers + k}``: a full MoE decoder layer (Megatron
  ``mtp.layers.k.mtp_model_layer``) plus enorm / hnorm / eh_proj / shared_head.norm, and copies of
  the embedding and the output layer, which Megatron shares with the main model
  (``_common.DEEPSEEK_MTP_GLUE``, shared with GLM-4.5).
"""

from __future__ import annotations

from fp4convert.errors import MappingError
from fp4convert.families._common import (
    DEEPSEEK_MTP_GLUE,
    DENSE_MLP,
    GLOBALS,
    ROUTED_EXPERTS,
    SHARED_EXPERTS,
    dense_first_mlp_features,
    router_expert_bias,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Direct, Family, FamilyKey, ScaleGroup, linear, norm
from fp4convert.inventory import FusedKind, Role

__all__ = ["DEEPSEEK_V3"]

_MLA_ATTENTION = (
    Direct("input_layernorm.weight", norm("input_layernorm.weight")),
    Direct(
        "self_attention.linear_q_down_proj.weight",
        linear("self_attn.q_a_proj.weight", ("q_lora_rank", "hidden"), Role.ATTENTION),
        requires=("q_lora",),
    ),
    Direct(
        "self_attention.linear_q_up_proj.layer_norm_weight",
        norm("self_attn.q_a_layernorm.weight", "q_lora_rank"),
        requires=("q_lora",),
    ),
    Direct(
        "self_attention.linear_q_up_proj.weight",
        linear("self_attn.q_b_proj.weight", ("q_head_size", "q_lora_rank"), Role.ATTENTION),
        requires=("q_lora",),
    ),
    Direct(
        "self_attention.linear_q_proj.weight",
        linear("self_attn.q_proj.weight", ("q_head_size", "hidden"), Role.ATTENTION),
        requires=("no_q_lora",),
    ),
    Direct(
        "self_attention.linear_kv_down_proj.weight",
        linear("self_attn.kv_a_proj_with_mqa.weight", ("kv_a_size", "hidden"), Role.ATTENTION),
    ),
    Direct(
        "self_attention.linear_kv_up_proj.layer_norm_weight",
        norm("self_attn.kv_a_layernorm.weight", "kv_lora_rank"),
    ),
    Direct(
        "self_attention.linear_kv_up_proj.weight",
        linear("self_attn.kv_b_proj.weight", ("kv_b_size", "kv_lora_rank"), Role.MLA_PROJECTION),
    ),
    Direct(
        "self_attention.linear_proj.weight",
        linear("self_attn.o_proj.weight", ("hidden", "o_in"), Role.ATTENTION),
    ),
)


def _dims(config: ModelConfig) -> dict[str, int]:
    heads = config.get_int("num_attention_heads")
    nope = config.get_int("qk_nope_head_dim")
    rope = config.get_int("qk_rope_head_dim")
    v_head = config.get_int("v_head_dim")
    kv_lora_rank = config.get_int("kv_lora_rank")
    hidden = config.get_int("hidden_size")
    moe_intermediate = config.get_int("moe_intermediate_size")
    dims = {
        "hidden": hidden,
        "vocab": config.get_int("vocab_size"),
        "intermediate": config.get_int("intermediate_size"),
        "moe_intermediate": moe_intermediate,
        "num_experts": config.get_int("n_routed_experts"),
        "shared_intermediate": moe_intermediate * config.get_int("n_shared_experts", default=0),
        "q_head_size": heads * (nope + rope),
        "kv_lora_rank": kv_lora_rank,
        "kv_a_size": kv_lora_rank + rope,
        "kv_b_size": heads * (nope + v_head),
        "o_in": heads * v_head,
        "eh_in": 2 * hidden,
    }
    q_lora_rank = config.get_optional_int("q_lora_rank")
    if q_lora_rank is not None:
        dims["q_lora_rank"] = q_lora_rank
    return dims


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    if config.get_flag("attention_bias", False):
        raise MappingError(
            "config.json sets attention_bias: true for DeepSeek-V3; MLA biases are not mapped",
            hint="add the bias entries to the DeepSeek-V3 table",
            field="attention_bias",
        )
    found = {
        "tied_embeddings" if config.get_flag("tie_word_embeddings", False) else "lm_head",
        "no_q_lora" if config.get_optional_int("q_lora_rank") is None else "q_lora",
    }
    if layer is not None:
        found |= dense_first_mlp_features(config, layer)
    return frozenset(found)


DEEPSEEK_V3 = Family(
    key=FamilyKey.DEEPSEEK_V3,
    architectures=("DeepseekV3ForCausalLM",),
    # Kimi-K2 is this architecture (its config says DeepseekV3ForCausalLM, model_type kimi_k2).
    model_types=("deepseek_v3", "kimi_k2"),
    global_entries=GLOBALS,
    layer_entries=(
        *_MLA_ATTENTION,
        *DENSE_MLP,
        *ROUTED_EXPERTS,
        router_expert_bias("mlp.gate.e_score_correction_bias", "float32"),
        *SHARED_EXPERTS,
    ),
    dims=_dims,
    features=_features,
    mtp_glue_entries=DEEPSEEK_MTP_GLUE,
    scale_groups=(
        ScaleGroup(
            FusedKind.MLA_QA_KVA,
            members=("self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight"),
            requires=("q_lora",),
        ),
    ),
    mtp_layers_key="num_nextn_predict_layers",
    num_experts_dim="num_experts",
)
