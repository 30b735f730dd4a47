"""Qwen3-Next (``Qwen3NextForCausalLM``, e.g. Qwen3-Next-80B-A3B): hybrid linear / gated full
attention, routed experts plus one gated shared expert, one MTP module. HF -> HF only.

- ``layer_types`` (or, in the published configs, every ``full_attention_interval``-th layer) says
  which layers use full attention; the others use a gated delta net (``linear_attn``).
- Full attention: ``q_proj`` holds query and output gate per head (``[heads * head_dim * 2, H]``),
  k/v as usual, per-head ``q_norm`` / ``k_norm``; q/k/v share one outer scale (engines fuse them).
- Linear attention: the GEMM weights ``in_proj_qkvz``, ``in_proj_ba`` and ``out_proj`` carry the
  attention role (quantized where a contract quantizes attention, as ModelOpt does); ``conv1d``
  (a depthwise ``[C, 1, K]`` filter), ``A_log``, ``dt_bias`` and ``norm`` are not GEMM operands and
  stay BF16 under every contract.
- MoE as Qwen2-MoE: routed experts, ``shared_expert`` (singular) and ``shared_expert_gate`` (router
  role). The MTP module is spelled apart (``HfMtp.MTP_MODULE``): ``mtp.layers.0.*`` is a full-attention
  MoE layer, ``mtp.fc`` ``[H, 2H]``, ``mtp.pre_fc_norm_embedding`` / ``_hidden`` and ``mtp.norm`` its
  glue; the configs do not count it, and the checkpoints hold one (``mtp_layers_default``).

The Megatron patterns are Megatron-Bridge's (``qwen3_next_bridge.py``), but the layout is not mapped
(``megatron_unsupported``): Megatron-Core's GatedDeltaNet packs ``in_proj_qkvz`` and ``in_proj_ba``
into one ``in_proj`` and reorders ``conv1d`` per tensor-parallel rank, so its TP-gathered tensors
depend on the TP size, its ``out_norm`` is zero-centred (``w - 1``, not exact in BF16 for every
value) and ``attention_output_gate`` interleaves the gate into ``linear_qkv``.
"""

from __future__ import annotations

from fp4convert.errors import MappingError
from fp4convert.families._common import (
    DENSE_MLP,
    GLOBALS,
    ROUTED_EXPERTS,
    SHARED_EXPERT_GATED,
    gqa_dims,
    model_features,
    sparse_step_is_moe,
)
from fp4convert.families._config import ModelConfig
from fp4convert.families._grammar import HfMtp
from fp4convert.families._tables import QKV, Direct, Family, FamilyKey, HFTensor, linear, norm, vector
from fp4convert.inventory import Role

__all__ = ["QWEN3_NEXT"]

_FULL = ("full_attention",)
_LINEAR = ("linear_attention",)

_GATED_ATTENTION = (
    Direct("self_attention.linear_qkv.layer_norm_weight", norm("input_layernorm.weight"), requires=_FULL),
    QKV(
        "self_attention.linear_qkv.weight",
        q=linear("self_attn.q_proj.weight", ("q_gate_size", "hidden"), Role.ATTENTION),
        k=linear("self_attn.k_proj.weight", ("kv_size", "hidden"), Role.ATTENTION),
        v=linear("self_attn.v_proj.weight", ("kv_size", "hidden"), Role.ATTENTION),
        requires=_FULL,
    ),
    Direct(
        "self_attention.linear_proj.weight",
        linear("self_attn.o_proj.weight", ("hidden", "q_size"), Role.ATTENTION),
        requires=_FULL,
    ),
    Direct("self_attention.q_layernorm.weight", norm("self_attn.q_norm.weight", "head_dim"), requires=_FULL),
    Direct("self_attention.k_layernorm.weight", norm("self_attn.k_norm.weight", "head_dim"), requires=_FULL),
)

_LINEAR_ATTENTION = (
    Direct("self_attention.in_proj.layer_norm_weight", norm("input_layernorm.weight"), requires=_LINEAR),
    # Megatron-Core packs these two into one in_proj, per TP rank (see the module docstring).
    Direct(
        "self_attention.in_proj.weight",
        linear("linear_attn.in_proj_qkvz.weight", ("qkvz_size", "hidden"), Role.ATTENTION),
        requires=_LINEAR,
    ),
    Direct(
        "self_attention.in_proj.weight",
        linear("linear_attn.in_proj_ba.weight", ("ba_size", "hidden"), Role.ATTENTION),
        requires=_LINEAR,
    ),
    Direct(
        "self_attention.conv1d.weight",
        HFTensor("linear_attn.conv1d.weight", ("conv_size", "one", "conv_kernel"), Role.ATTENTION),
        requires=_LINEAR,
    ),
    Direct(
        "self_attention.A_log", vector("linear_attn.A_log", "linear_value_heads", Role.ATTENTION), requires=_LINEAR
    ),
    Direct(
        "self_attention.dt_bias", vector("linear_attn.dt_bias", "linear_value_heads", Role.ATTENTION), requires=_LINEAR
    ),
    Direct(
        "self_attention.out_norm.weight", norm("linear_attn.norm.weight", "linear_value_head_dim"), requires=_LINEAR
    ),
    Direct(
        "self_attention.out_proj.weight",
        linear("linear_attn.out_proj.weight", ("hidden", "linear_value_size"), Role.ATTENTION),
        requires=_LINEAR,
    ),
)

_MTP_GLUE = (
    Direct("eh_proj.weight", linear("fc.weight", ("hidden", "eh_in"), Role.MTP)),
    Direct("enorm.weight", norm("pre_fc_norm_embedding.weight", role=Role.MTP)),
    Direct("hnorm.weight", norm("pre_fc_norm_hidden.weight", role=Role.MTP)),
    Direct("final_layernorm.weight", norm("norm.weight", role=Role.MTP)),
)


def _dims(config: ModelConfig) -> dict[str, int]:
    dims = gqa_dims(config)
    key_size = config.get_int("linear_num_key_heads") * config.get_int("linear_key_head_dim")
    value_heads = config.get_int("linear_num_value_heads")
    value_size = value_heads * config.get_int("linear_value_head_dim")
    return {
        **dims,
        "q_gate_size": 2 * dims["q_size"],
        "moe_intermediate": config.get_int("moe_intermediate_size"),
        "num_experts": config.get_int("num_experts"),
        "shared_intermediate": config.get_int("shared_expert_intermediate_size"),
        "one": 1,
        "qkvz_size": 2 * key_size + 2 * value_size,
        "ba_size": 2 * value_heads,
        "conv_size": 2 * key_size + value_size,
        "conv_kernel": config.get_int("linear_conv_kernel_dim"),
        "linear_value_heads": value_heads,
        "linear_value_head_dim": config.get_int("linear_value_head_dim"),
        "linear_value_size": value_size,
        "eh_in": 2 * dims["hidden"],
    }


def _is_full_attention(config: ModelConfig, layer: int) -> bool:
    num_layers = config.get_int("num_hidden_layers")
    if layer >= num_layers:  # the MTP layer: full attention (mtp.layers.0.self_attn)
        return True
    layer_types = config.data.get("layer_types")
    if layer_types is None:
        return (layer + 1) % config.get_int("full_attention_interval", default=4, minimum=1) == 0
    if (
        not isinstance(layer_types, list)
        or len(layer_types) != num_layers
        or not set(layer_types) <= {"full_attention", "linear_attention"}
    ):
        raise MappingError(
            f"config.json `layer_types` is {layer_types!r}; expected {num_layers} entries, each "
            "'full_attention' or 'linear_attention'",
            field="layer_types",
        )
    return bool(layer_types[layer] == "full_attention")


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config)
    if layer is not None:
        found.add("full_attention" if _is_full_attention(config, layer) else "linear_attention")
        moe = sparse_step_is_moe(config, layer, config.get_int("num_experts"))
        found.add("moe" if moe else "dense_mlp")
    return frozenset(found)


QWEN3_NEXT = Family(
    key=FamilyKey.QWEN3_NEXT,
    architectures=("Qwen3NextForCausalLM",),
    model_types=("qwen3_next",),
    global_entries=GLOBALS,
    layer_entries=(*_GATED_ATTENTION, *_LINEAR_ATTENTION, *DENSE_MLP, *ROUTED_EXPERTS, *SHARED_EXPERT_GATED),
    dims=_dims,
    features=_features,
    mtp_glue_entries=_MTP_GLUE,
    mtp_layers_key="num_nextn_predict_layers",
    mtp_layers_default=1,
    hf_mtp=HfMtp.MTP_MODULE,
    megatron_unsupported=(
        "Megatron-Core's GatedDeltaNet packs in_proj_qkvz / in_proj_ba and conv1d per tensor-parallel rank, "
        "keeps a zero-centred out_norm and interleaves the attention output gate into linear_qkv, "
        "none of which fp4convert maps yet"
    ),
)
