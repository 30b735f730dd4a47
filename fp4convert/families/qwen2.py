"""Qwen2 / Qwen2.5 dense: Llama layout plus q/k/v biases (no o_proj bias) (checkpoint-formats.md 5.1)."""

from __future__ import annotations

from fp4convert.families._common import DENSE_MLP, GLOBALS, GQA_ATTENTION, gqa_dims, model_features
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["QWEN2"]


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    # transformers' Qwen2Attention builds q/k/v with bias=True unconditionally, o_proj without.
    return frozenset(model_features(config, qkv_bias=True) | {"dense_mlp"})


QWEN2 = Family(
    key=FamilyKey.QWEN2,
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *DENSE_MLP),
    dims=gqa_dims,
    features=_features,
)
