"""gpt-oss (``GptOssForCausalLM``, gpt-oss-20b / -120b): biased GQA attention with learned sinks,
every layer a MoE whose router and experts carry biases.

- q/k/v and o_proj all have biases (``attention_bias: true``); ``self_attn.sinks`` (one logit per
  head, Megatron-Core's ``core_attention.softmax_offset`` with ``softmax_type: learnable``) is not a
  GEMM operand, so no contract quantizes it.
- The router is ``mlp.router`` (weight and bias, Megatron-Core ``mlp.router.weight`` / ``.bias``).
- Experts are named one tensor per expert, ``mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}``
  (``[I, H]``, ``[I, H]``, ``[H, I]``; Linear orientation), the layout fp4convert writes for every
  MoE family. Megatron-Core's ``linear_fc1`` is ``cat(gate, up)`` (weight and bias) and
  ``linear_fc2`` is down (Megatron-Bridge ``gpt_oss_bridge.py``); gate and up share one outer scale.
  The published checkpoints store the experts fused instead: BF16 ``mlp.experts.gate_up_proj``
  ``[E, H, 2I]`` with gate and up interleaved along the last axis (``[..., 0::2]`` gate,
  ``[..., 1::2]`` up) plus ``gate_up_proj_bias`` ``[E, 2I]``, ``down_proj`` ``[E, I, H]``,
  ``down_proj_bias`` ``[E, H]``; the MXFP4 release (openai/gpt-oss-20b, -120b) stores
  ``gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` / ``_scales`` ``[E, 2I, H/32]`` (rows interleaved)
  and ``down_proj_blocks`` ``[E, H, I/32, 16]`` / ``_scales`` instead of the BF16 weights. Those are
  source layouts, decoded and split into these tensors by ``fp4convert.checkpoint.decode`` for
  every command (docs/families.md "Source formats each family accepts").
"""

from __future__ import annotations

from fp4convert.families._common import GLOBALS, GQA_ATTENTION, gqa_dims, model_features
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Direct, Family, FamilyKey, GatedMLP, linear, norm, vector
from fp4convert.inventory import Role

__all__ = ["GPT_OSS"]

_SINKS = (
    Direct(
        "self_attention.core_attention.softmax_offset",
        vector("self_attn.sinks", "num_attention_heads", Role.ATTENTION),
    ),
)

_MOE = (
    Direct("pre_mlp_layernorm.weight", norm("post_attention_layernorm.weight")),
    Direct("mlp.router.weight", linear("mlp.router.weight", ("num_experts", "hidden"), Role.ROUTER)),
    Direct("mlp.router.bias", vector("mlp.router.bias", "num_experts", Role.ROUTER)),
    GatedMLP(
        "mlp.experts.linear_fc1.weight{expert}",
        gate=linear("mlp.experts.{expert}.gate_proj.weight", ("intermediate", "hidden"), Role.ROUTED_EXPERT),
        up=linear("mlp.experts.{expert}.up_proj.weight", ("intermediate", "hidden"), Role.ROUTED_EXPERT),
    ),
    GatedMLP(
        "mlp.experts.linear_fc1.bias{expert}",
        gate=vector("mlp.experts.{expert}.gate_proj.bias", "intermediate", Role.ROUTED_EXPERT),
        up=vector("mlp.experts.{expert}.up_proj.bias", "intermediate", Role.ROUTED_EXPERT),
    ),
    Direct(
        "mlp.experts.linear_fc2.weight{expert}",
        linear("mlp.experts.{expert}.down_proj.weight", ("hidden", "intermediate"), Role.ROUTED_EXPERT),
    ),
    Direct(
        "mlp.experts.linear_fc2.bias{expert}",
        vector("mlp.experts.{expert}.down_proj.bias", "hidden", Role.ROUTED_EXPERT),
    ),
)


def _dims(config: ModelConfig) -> dict[str, int]:
    return {**gqa_dims(config), "num_experts": config.get_int("num_local_experts")}


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    # attention_bias (true in every release) gives q/k/v and o_proj biases, as transformers builds them.
    return frozenset(model_features(config))


GPT_OSS = Family(
    key=FamilyKey.GPT_OSS,
    architectures=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *_SINKS, *_MOE),
    dims=_dims,
    features=_features,
)
