"""The family registry: golden contents (checked in a fresh interpreter), duplicates, lookups."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fp4convert.errors import MappingError
from fp4convert.families import (
    BUILTIN_FAMILIES,
    FamilyRegistry,
    family_for_config,
    get_family,
    register_family,
)
from fp4convert.families.llama import LLAMA

#: key -> where the table is defined, and the config.json values that select it.
EXPECTED_REGISTRY = {
    "llama": {
        "table": "fp4convert.families.llama:LLAMA",
        "architectures": ["LlamaForCausalLM"],
        "model_types": ["llama"],
    },
    "qwen2": {
        "table": "fp4convert.families.qwen2:QWEN2",
        "architectures": ["Qwen2ForCausalLM"],
        "model_types": ["qwen2"],
    },
    "qwen3": {
        "table": "fp4convert.families.qwen3:QWEN3",
        "architectures": ["Qwen3ForCausalLM"],
        "model_types": ["qwen3"],
    },
    "qwen3_moe": {
        "table": "fp4convert.families.qwen3_moe:QWEN3_MOE",
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_types": ["qwen3_moe"],
    },
    "deepseek_v3": {
        "table": "fp4convert.families.deepseek_v3:DEEPSEEK_V3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_types": ["deepseek_v3", "kimi_k2"],
    },
    "mixtral": {
        "table": "fp4convert.families.mixtral:MIXTRAL",
        "architectures": ["MixtralForCausalLM"],
        "model_types": ["mixtral"],
    },
    "qwen2_moe": {
        "table": "fp4convert.families.qwen2_moe:QWEN2_MOE",
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_types": ["qwen2_moe"],
    },
    "minimax_m2": {
        "table": "fp4convert.families.minimax_m2:MINIMAX_M2",
        "architectures": ["MiniMaxM2ForCausalLM"],
        "model_types": ["minimax_m2"],
    },
    "glm4_moe": {
        "table": "fp4convert.families.glm4_moe:GLM4_MOE",
        "architectures": ["Glm4MoeForCausalLM"],
        "model_types": ["glm4_moe"],
    },
    "gpt_oss": {
        "table": "fp4convert.families.gpt_oss:GPT_OSS",
        "architectures": ["GptOssForCausalLM"],
        "model_types": ["gpt_oss"],
    },
    "qwen3_next": {
        "table": "fp4convert.families.qwen3_next:QWEN3_NEXT",
        "architectures": ["Qwen3NextForCausalLM"],
        "model_types": ["qwen3_next"],
    },
}

_DUMP_REGISTRY = """
import json, sys
from fp4convert.families import REGISTRY
tables = {}
for module_name, module in list(sys.modules.items()):
    if module_name.startswith("fp4convert.families.") and not module_name.rsplit(".", 1)[1].startswith("_"):
        for attribute, value in vars(module).items():
            if any(value is family for family in REGISTRY):
                tables[id(value)] = f"{module_name}:{attribute}"
print(json.dumps({
    family.key.value: {
        "table": tables.get(id(family)),
        "architectures": list(family.architectures),
        "model_types": list(family.model_types),
    }
    for family in REGISTRY
}))
"""


def test_registry_contents_are_the_golden_table() -> None:
    # A fresh interpreter: what registers is what `import fp4convert.families` does, nothing a test did.
    result = subprocess.run([sys.executable, "-c", _DUMP_REGISTRY], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == EXPECTED_REGISTRY


def test_builtin_order_is_the_registry_order() -> None:
    assert [family.key.value for family in BUILTIN_FAMILIES] == list(EXPECTED_REGISTRY)


def test_duplicate_registration_raises() -> None:
    with pytest.raises(MappingError, match=r"^family `llama` is already registered"):
        register_family(LLAMA)


def test_a_second_family_cannot_claim_an_architecture() -> None:
    registry = FamilyRegistry()
    registry.register(get_family("qwen3"))
    impostor = get_family("qwen3_moe")
    clone = type(impostor)(**{**impostor.__dict__, "architectures": ("Qwen3ForCausalLM",)})
    with pytest.raises(MappingError, match=r"^`Qwen3ForCausalLM` already selects family `qwen3`"):
        registry.register(clone)


def test_unknown_key_lists_the_valid_ones() -> None:
    with pytest.raises(MappingError, match=r"^unknown model family `gpt2`") as raised:
        get_family("gpt2")
    assert raised.value.hint == (
        "valid families: deepseek_v3, glm4_moe, gpt_oss, llama, minimax_m2, mixtral, qwen2, qwen2_moe, qwen3, "
        "qwen3_moe, qwen3_next"
    )
    assert isinstance(raised.value, KeyError)


def test_family_is_found_by_architecture_then_model_type() -> None:
    assert family_for_config({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3"}).key.value == (
        "qwen3_moe"
    )
    assert family_for_config({"architectures": ["SomethingElse"], "model_type": "qwen2"}).key.value == "qwen2"
    # Kimi-K2 names the DeepSeek-V3 architecture and its own model type; either finds DeepSeek-V3.
    assert family_for_config({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"}).key.value == (
        "deepseek_v3"
    )
    assert family_for_config({"model_type": "kimi_k2"}).key.value == "deepseek_v3"


def test_unsupported_model_lists_supported_ones() -> None:
    with pytest.raises(MappingError, match=r"^unsupported model: architectures \['GPT2LMHeadModel'\]") as raised:
        family_for_config({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    assert raised.value.hint == (
        "supported architectures: DeepseekV3ForCausalLM, Glm4MoeForCausalLM, GptOssForCausalLM, LlamaForCausalLM, "
        "MiniMaxM2ForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, "
        "Qwen3MoeForCausalLM, Qwen3NextForCausalLM; model types: deepseek_v3, glm4_moe, gpt_oss, kimi_k2, llama, "
        "minimax_m2, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next"
    )
