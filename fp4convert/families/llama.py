"""Llama (Llama-2/3/3.1 dense): grouped-query attention, SwiGLU MLP (checkpoint-formats.md 5.1)."""

from __future__ import annotations

from fp4convert.families._common import DENSE_MLP, GLOBALS, GQA_ATTENTION, dense_features, gqa_dims
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["LLAMA"]


LLAMA = Family(
    key=FamilyKey.LLAMA,
    architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *DENSE_MLP),
    dims=gqa_dims,
    features=dense_features(),
)
