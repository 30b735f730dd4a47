"""Mixtral (``MixtralForCausalLM``): Llama attention, every layer a ``block_sparse_moe``, no shared expert.

HF names keep Mixtral's ``block_sparse_moe`` prefix with per-expert ``w1`` (gate), ``w3`` (up) and
``w2`` (down), as the hub checkpoints and transformers 5's ``save_pretrained`` (which renames its
in-memory ``mlp.experts.gate_up_proj`` back) write them; ``w1``/``w3`` fuse into Megatron-Core's
``linear_fc1`` and share one outer scale. Megatron-Core builds Mixtral as a GPT model with
``num_moe_experts`` (router ``mlp.router``, no shared expert).
"""

from __future__ import annotations

from fp4convert.families._common import BLOCK_SPARSE_MOE, GLOBALS, GQA_ATTENTION, gqa_dims, model_features
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["MIXTRAL"]


def _dims(config: ModelConfig) -> dict[str, int]:
    return {
        **gqa_dims(config),
        "moe_intermediate": config.get_int("intermediate_size"),  # Mixtral's experts use intermediate_size
        "num_experts": config.get_int("num_local_experts"),
    }


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    found = model_features(config)
    if layer is not None:
        found.add("moe")
    return frozenset(found)


MIXTRAL = Family(
    key=FamilyKey.MIXTRAL,
    architectures=("MixtralForCausalLM",),
    model_types=("mixtral",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *BLOCK_SPARSE_MOE),
    dims=_dims,
    features=_features,
)
