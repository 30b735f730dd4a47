"""Llama (Llama-2/3/3.1 dense): grouped-query attention, SwiGLU MLP (checkpoint-formats.md 5.1)."""

from __future__ import annotations

from fp4convert.families._common import DENSE_MLP, GLOBALS, GQA_ATTENTION, gqa_dims, model_features
from fp4convert.families._config import ModelConfig
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["LLAMA"]


def _features(config: ModelConfig, layer: int | None) -> frozenset[str]:
    return frozenset(model_features(config) | {"dense_mlp"})


LLAMA = Family(
    key=FamilyKey.LLAMA,
    architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *DENSE_MLP),
    dims=gqa_dims,
    features=_features,
)
