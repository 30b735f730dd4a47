"""Entries and config readers shared by several families (checkpoint-formats.md sections 5.1-5.3).

Every name is the TransformerEngine-spec Megatron-Core name (norms fused into the following Linear
as ``layer_norm_weight``) next to the Hugging Face name. Layer entries are relative to the layer
prefix (see :mod:`fp4convert.families._grammar`).
"""

from __future__ import annotations

from fp4convert.errors import MappingError
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import (
    QKV,
    Direct,
    Features,
    GatedMLP,
    HFTensor,
    SharedCopy,
    embedding,
    linear,
    norm,
    vector,
)
from fp4convert.inventory import Role

__all__ = [
    "BLOCK_SPARSE_MOE",
    "DEEPSEEK_MTP_GLUE",
    "DENSE_MLP",
    "GLOBALS",
    "GQA_ATTENTION",
    "QK_NORM",
    "ROUTED_EXPERTS",
    "SHARED_EXPERTS",
    "SHARED_EXPERT_GATED",
    "dense_features",
    "gqa_dims",
    "model_features",
    "router_expert_bias",
    "sparse_step_is_moe",
]

#: Embedding, final norm and (unless tied to the embedding) the output layer.
GLOBALS = (
    Direct("embedding.word_embeddings.weight", embedding("model.embed_tokens.weight")),
    Direct("decoder.final_layernorm.weight", norm("model.norm.weight")),
    Direct(
        "output_layer.weight",
        linear("lm_head.weight", ("vocab", "hidden"), Role.LM_HEAD),
        requires=("lm_head",),
    ),
)

#: Grouped-query attention with TE's fused input norm; q/k/v interleaved per query group (5.4).
GQA_ATTENTION = (
    Direct("self_attention.linear_qkv.layer_norm_weight", norm("input_layernorm.weight")),
    QKV(
        "self_attention.linear_qkv.weight",
        q=linear("self_attn.q_proj.weight", ("q_size", "hidden"), Role.ATTENTION),
        k=linear("self_attn.k_proj.weight", ("kv_size", "hidden"), Role.ATTENTION),
        v=linear("self_attn.v_proj.weight", ("kv_size", "hidden"), Role.ATTENTION),
    ),
    # Qwen2 always, Llama / Qwen3 with attention_bias: the bias interleaves like the weight rows.
    QKV(
        "self_attention.linear_qkv.bias",
        q=vector("self_attn.q_proj.bias", "q_size"),
        k=vector("self_attn.k_proj.bias", "kv_size"),
        v=vector("self_attn.v_proj.bias", "kv_size"),
        requires=("qkv_bias",),
    ),
    Direct(
        "self_attention.linear_proj.weight",
        linear("self_attn.o_proj.weight", ("hidden", "q_size"), Role.ATTENTION),
    ),
    Direct("self_attention.linear_proj.bias", vector("self_attn.o_proj.bias", "hidden"), requires=("o_bias",)),
)

#: Qwen3's per-head q/k RMSNorm (size head_dim).
QK_NORM = (
    Direct("self_attention.q_layernorm.weight", norm("self_attn.q_norm.weight", "head_dim")),
    Direct("self_attention.k_layernorm.weight", norm("self_attn.k_norm.weight", "head_dim")),
)

#: A dense SwiGLU MLP with TE's fused pre-MLP norm; fc1 = cat(gate, up).
DENSE_MLP = (
    Direct(
        "mlp.linear_fc1.layer_norm_weight",
        norm("post_attention_layernorm.weight"),
        requires=("dense_mlp",),
    ),
    GatedMLP(
        "mlp.linear_fc1.weight",
        gate=linear("mlp.gate_proj.weight", ("intermediate", "hidden"), Role.DENSE_MLP),
        up=linear("mlp.up_proj.weight", ("intermediate", "hidden"), Role.DENSE_MLP),
        requires=("dense_mlp",),
    ),
    Direct(
        "mlp.linear_fc2.weight",
        linear("mlp.down_proj.weight", ("hidden", "intermediate"), Role.DENSE_MLP),
        requires=("dense_mlp",),
    ),
)

#: A routed-expert MoE block: its norm is not fused (Megatron's pre_mlp_layernorm), a router, and
#: per-expert SwiGLU experts (TEGroupedMLP spelling; SequentialMLP is derived by the grammar).
ROUTED_EXPERTS = (
    Direct("pre_mlp_layernorm.weight", norm("post_attention_layernorm.weight"), requires=("moe",)),
    Direct(
        "mlp.router.weight",
        linear("mlp.gate.weight", ("num_experts", "hidden"), Role.ROUTER),
        requires=("moe",),
    ),
    GatedMLP(
        "mlp.experts.linear_fc1.weight{expert}",
        gate=linear("mlp.experts.{expert}.gate_proj.weight", ("moe_intermediate", "hidden"), Role.ROUTED_EXPERT),
        up=linear("mlp.experts.{expert}.up_proj.weight", ("moe_intermediate", "hidden"), Role.ROUTED_EXPERT),
        requires=("moe",),
    ),
    Direct(
        "mlp.experts.linear_fc2.weight{expert}",
        linear("mlp.experts.{expert}.down_proj.weight", ("hidden", "moe_intermediate"), Role.ROUTED_EXPERT),
        requires=("moe",),
    ),
)


def router_expert_bias(hf_name: str, dtype: str | None) -> Direct:
    """The router's aux-loss-free balancing bias (``e_score_correction_bias``): Megatron-Core's
    ``mlp.router.expert_bias``; a router tensor, not a GEMM operand."""
    return Direct(
        "mlp.router.expert_bias", vector(hf_name, "num_experts", Role.ROUTER, dtype=dtype), requires=("moe",)
    )


#: DeepSeek-V3 / GLM-4.5 shared experts (``mlp.shared_experts``, plural): one SwiGLU MLP of width
#: ``moe_intermediate * n_shared_experts`` (Megatron-Bridge deepseek/common.py, glm/glm45_bridge.py).
SHARED_EXPERTS = (
    GatedMLP(
        "mlp.shared_experts.linear_fc1.weight",
        gate=linear("mlp.shared_experts.gate_proj.weight", ("shared_intermediate", "hidden"), Role.SHARED_EXPERT),
        up=linear("mlp.shared_experts.up_proj.weight", ("shared_intermediate", "hidden"), Role.SHARED_EXPERT),
        requires=("shared_experts",),
    ),
    Direct(
        "mlp.shared_experts.linear_fc2.weight",
        linear("mlp.shared_experts.down_proj.weight", ("hidden", "shared_intermediate"), Role.SHARED_EXPERT),
        requires=("shared_experts",),
    ),
)

#: Qwen2-MoE / Qwen3-Next: one shared expert (``mlp.shared_expert``, singular) whose output is scaled
#: by ``sigmoid(shared_expert_gate(x))``; Megatron-Core's ``moe_shared_expert_gate`` keeps that
#: ``[1, hidden]`` weight as ``shared_experts.gate_weight`` (Megatron-Bridge qwen3_next_bridge.py).
#: The gate is a router-like decision, so it carries the router role a contract keeps BF16.
SHARED_EXPERT_GATED = (
    GatedMLP(
        "mlp.shared_experts.linear_fc1.weight",
        gate=linear("mlp.shared_expert.gate_proj.weight", ("shared_intermediate", "hidden"), Role.SHARED_EXPERT),
        up=linear("mlp.shared_expert.up_proj.weight", ("shared_intermediate", "hidden"), Role.SHARED_EXPERT),
        requires=("moe",),
    ),
    Direct(
        "mlp.shared_experts.linear_fc2.weight",
        linear("mlp.shared_expert.down_proj.weight", ("hidden", "shared_intermediate"), Role.SHARED_EXPERT),
        requires=("moe",),
    ),
    Direct(
        "mlp.shared_experts.gate_weight",
        linear("mlp.shared_expert_gate.weight", ("one", "hidden"), Role.ROUTER),
        requires=("moe",),
    ),
)

#: Mixtral / MiniMax-M2's ``block_sparse_moe``: router ``gate`` and per-expert ``w1`` (gate), ``w3``
#: (up), ``w2`` (down), as the hub checkpoints and transformers' ``save_pretrained`` write them.
BLOCK_SPARSE_MOE = (
    Direct("pre_mlp_layernorm.weight", norm("post_attention_layernorm.weight"), requires=("moe",)),
    Direct(
        "mlp.router.weight",
        linear("block_sparse_moe.gate.weight", ("num_experts", "hidden"), Role.ROUTER),
        requires=("moe",),
    ),
    GatedMLP(
        "mlp.experts.linear_fc1.weight{expert}",
        gate=linear("block_sparse_moe.experts.{expert}.w1.weight", ("moe_intermediate", "hidden"), Role.ROUTED_EXPERT),
        up=linear("block_sparse_moe.experts.{expert}.w3.weight", ("moe_intermediate", "hidden"), Role.ROUTED_EXPERT),
        requires=("moe",),
    ),
    Direct(
        "mlp.experts.linear_fc2.weight{expert}",
        linear("block_sparse_moe.experts.{expert}.w2.weight", ("hidden", "moe_intermediate"), Role.ROUTED_EXPERT),
        requires=("moe",),
    ),
)

#: DeepSeek-V3 / GLM-4.5 MTP glue: HF ``model.layers.{L + k}.`` holds enorm / hnorm / eh_proj /
#: shared_head.norm and copies of the embedding and output layer, which Megatron-Core shares with the
#: main model (Megatron-Bridge deepseek/common.py and glm45_bridge.py; Miles megatron_to_hf).
DEEPSEEK_MTP_GLUE = (
    Direct("enorm.weight", norm("enorm.weight", role=Role.MTP)),
    Direct("hnorm.weight", norm("hnorm.weight", role=Role.MTP)),
    Direct("eh_proj.weight", linear("eh_proj.weight", ("hidden", "eh_in"), Role.MTP)),
    Direct("final_layernorm.weight", norm("shared_head.norm.weight", role=Role.MTP)),
    SharedCopy(embedding("embed_tokens.weight", role=Role.MTP), megatron="embedding.word_embeddings.weight"),
    SharedCopy(
        HFTensor("shared_head.head.weight", ("vocab", "hidden"), Role.MTP, gemm=True),
        megatron="output_layer.weight",
        requires=("lm_head",),
    ),
    SharedCopy(
        HFTensor("shared_head.head.weight", ("vocab", "hidden"), Role.MTP, gemm=True),
        megatron="embedding.word_embeddings.weight",
        requires=("tied_embeddings",),
    ),
)


def sparse_step_is_moe(config: ModelConfig, layer: int, num_experts: int) -> bool:
    """Qwen2-MoE / Qwen3-MoE / Qwen3-Next: a layer is MoE unless listed in ``mlp_only_layers`` or
    ``(layer + 1) % decoder_sparse_step != 0`` (transformers' decoder layers), and only with experts."""
    sparse_step = config.get_int("decoder_sparse_step", default=1, minimum=1)
    return layer not in config.get_int_list("mlp_only_layers") and num_experts > 0 and (layer + 1) % sparse_step == 0


def dense_first_mlp_features(config: ModelConfig, layer: int) -> set[str]:
    """The MLP of decoder layer ``layer`` in DeepSeek-V3-style configs (DeepSeek-V3, Kimi-K2, GLM-4.5):
    dense below ``first_k_dense_replace``, MoE from there on, with shared experts when
    ``n_shared_experts`` > 0."""
    if layer < config.get_int("first_k_dense_replace", default=0):
        return {"dense_mlp"}
    return {"moe", "shared_experts"} if config.get_int("n_shared_experts", default=0) > 0 else {"moe"}


def gqa_dims(config: ModelConfig) -> dict[str, int]:
    """Dimensions of a Llama-style decoder: hidden, vocab, heads, head_dim, q/kv sizes, intermediate.

    ``head_dim`` is read when present (Qwen3: 128 with hidden 2048 and 32 heads, so it must not be
    derived) and derived as ``hidden_size / num_attention_heads`` otherwise.

    Example:
        >>> dims = gqa_dims(ModelConfig({"hidden_size": 64, "num_attention_heads": 4,
        ...     "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 96}))
        >>> dims["head_dim"], dims["q_size"], dims["kv_size"]
        (16, 64, 32)
    """
    hidden = config.get_int("hidden_size")
    heads = config.get_int("num_attention_heads", minimum=1)
    kv_heads = config.get_int("num_key_value_heads", default=heads, minimum=1)
    head_dim = config.get_optional_int("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise MappingError(
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}",
                hint="set head_dim explicitly",
                field="head_dim",
            )
        head_dim = hidden // heads
    if heads % kv_heads:
        raise MappingError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            field="num_key_value_heads",
        )
    return {
        "hidden": hidden,
        "vocab": config.get_int("vocab_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "q_size": heads * head_dim,
        "kv_size": kv_heads * head_dim,
        "intermediate": config.get_int("intermediate_size"),
    }


def model_features(config: ModelConfig, *, qkv_bias: bool | None = None) -> set[str]:
    """Model-wide features of a Llama-style family.

    Args:
        config: the model config.
        qkv_bias: force q/k/v biases on (Qwen2 always has them, without an o_proj bias); None reads
            ``attention_bias``, which adds biases to q/k/v and o_proj (Llama, Qwen3).

    Returns:
        ``{"lm_head" | "tied_embeddings"}`` plus ``"qkv_bias"`` / ``"o_bias"`` where present.
    """
    found = {"tied_embeddings" if config.get_flag("tie_word_embeddings", False) else "lm_head"}
    if qkv_bias is None:
        if config.get_flag("attention_bias", False):
            found |= {"qkv_bias", "o_bias"}
    elif qkv_bias:
        found.add("qkv_bias")
    if config.get_flag("mlp_bias", False):
        raise MappingError(
            "config.json sets mlp_bias: true; MLP biases are not mapped by any family yet",
            hint="add the bias entries to the family table",
            field="mlp_bias",
        )
    return found


def dense_features(*, qkv_bias: bool | None = None) -> Features:
    """The ``features`` function of a dense family: :func:`model_features` plus a dense MLP everywhere.

    Args:
        qkv_bias: as in :func:`model_features` (Qwen2 passes True).
    """

    def features(config: ModelConfig, layer: int | None) -> frozenset[str]:
        return frozenset(model_features(config, qkv_bias=qkv_bias) | {"dense_mlp"})

    return features
