"""The process-wide registry and the families fp4convert ships, registered in one visible tuple."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fp4convert.families._registry import FamilyRegistry
from fp4convert.families._tables import Family, FamilyKey
from fp4convert.families.deepseek_v3 import DEEPSEEK_V3
from fp4convert.families.glm4_moe import GLM4_MOE
from fp4convert.families.gpt_oss import GPT_OSS
from fp4convert.families.llama import LLAMA
from fp4convert.families.minimax_m2 import MINIMAX_M2
from fp4convert.families.mixtral import MIXTRAL
from fp4convert.families.qwen2 import QWEN2
from fp4convert.families.qwen2_moe import QWEN2_MOE
from fp4convert.families.qwen3 import QWEN3
from fp4convert.families.qwen3_moe import QWEN3_MOE
from fp4convert.families.qwen3_next import QWEN3_NEXT

__all__ = ["BUILTIN_FAMILIES", "REGISTRY", "family_for_config", "get_family", "register_family"]

#: The families fp4convert ships, registered in this order (tests/families/test_registry.py pins it).
BUILTIN_FAMILIES: tuple[Family, ...] = (
    LLAMA,
    QWEN2,
    QWEN3,
    QWEN3_MOE,
    DEEPSEEK_V3,
    MIXTRAL,
    QWEN2_MOE,
    MINIMAX_M2,
    GLM4_MOE,
    GPT_OSS,
    QWEN3_NEXT,
)

#: The registry every public function of :mod:`fp4convert.families` uses.
REGISTRY = FamilyRegistry()
for _family in BUILTIN_FAMILIES:
    REGISTRY.register(_family)


def register_family(family: Family) -> None:
    """Register another family (its key must be a :class:`FamilyKey` member not registered yet).

    Raises:
        MappingError: the key, an architecture or a model type is already taken.
    """
    REGISTRY.register(family)


def get_family(key: str | FamilyKey | Family) -> Family:
    """The family registered under ``key`` (a :class:`Family` is returned as is).

    Raises:
        MappingError: unknown key; the message lists the valid ones.

    Example:
        >>> get_family("qwen3_moe").architectures
        ('Qwen3MoeForCausalLM',)
    """
    return REGISTRY.get(key)


def family_for_config(config: Mapping[str, Any]) -> Family:
    """The family of a parsed config.json, found from ``architectures`` then ``model_type``.

    Raises:
        MappingError: unsupported model; the message lists the supported architectures and types.

    Example:
        >>> family_for_config({"architectures": ["DeepseekV3ForCausalLM"]}).key.value
        'deepseek_v3'
    """
    return REGISTRY.for_config(config)
