"""Qwen2 / Qwen2.5 dense: Llama layout plus q/k/v biases (no o_proj bias) (checkpoint-formats.md 5.1)."""

from __future__ import annotations

from fp4convert.families._common import DENSE_MLP, GLOBALS, GQA_ATTENTION, dense_features, gqa_dims
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["QWEN2"]


QWEN2 = Family(
    key=FamilyKey.QWEN2,
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *DENSE_MLP),
    dims=gqa_dims,
    # transformers' Qwen2Attention builds q/k/v with bias=True unconditionally, o_proj without.
    features=dense_features(qkv_bias=True),
)
