"""Qwen3 dense: Llama layout plus per-head q/k RMSNorm; head_dim is explicit (checkpoint-formats.md 5.1)."""

from __future__ import annotations

from fp4convert.families._common import DENSE_MLP, GLOBALS, GQA_ATTENTION, QK_NORM, dense_features, gqa_dims
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["QWEN3"]


QWEN3 = Family(
    key=FamilyKey.QWEN3,
    architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    global_entries=GLOBALS,
    layer_entries=(*GQA_ATTENTION, *QK_NORM, *DENSE_MLP),
    dims=gqa_dims,
    features=dense_features(),
)
