"""Test data of the bridge tests: contracts and byte comparisons of whole tensor sets."""

from __future__ import annotations

from pathlib import Path

import torch
from _helpers import CONTRACTS, MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal

DATA = Path(__file__).parent / "data"
#: NVFP4 on every GEMM incl. attention (all fused-group kinds), kv_b_proj and the last layer BF16
NVFP4_ALL = DATA / "nvfp4-all-mla-bf16.yaml"
DEEPSEEK_MXFP8 = CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml"
LAST_LAYERS_BF16 = CONTRACTS / "nvfp4-experts-per-token-last15pct-bf16.yaml"
INPUT_SCALES = (".input_scale", ".input_global_scale")

#: (tiny model, dialect, contract): every dialect, both MoE families, every fused-group kind
CASES = [
    ("qwen3_moe", "modelopt", NVFP4_EXPERTS),
    ("qwen3_moe", "compressed-tensors", NVFP4_EXPERTS),
    ("qwen3_moe", "sglang-mxfp8", MXFP8_ALL),
    ("qwen3_moe", "modelopt", NVFP4_ALL),
    ("deepseek_v3", "modelopt", NVFP4_ALL),
    ("deepseek_v3", "compressed-tensors", NVFP4_ALL),
    ("deepseek_v3", "sglang-mxfp8", DEEPSEEK_MXFP8),
]
CASE_IDS = [f"{model}-{dialect}-{contract.stem}" for model, dialect, contract in CASES]


def assert_same_tensors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Same names, dtypes, shapes and bytes."""
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert_bytes_equal(actual[name], tensor)
