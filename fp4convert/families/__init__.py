"""Model families: HF <-> Megatron-Core names, tensor inventories, and layout transforms.

A family is a table (``llama.py``, ``qwen2.py``, ``qwen3.py``, ``qwen3_moe.py``, ``deepseek_v3.py``);
the grammar shared by all tables is in ``_grammar.py``, name resolution in ``_mapper.py``, the pure
tensor transforms in :mod:`fp4convert.families.transforms`, and the state-dict conversions in
``_convert.py``. Adding a family means writing a table and adding it to :data:`BUILTIN_FAMILIES`.

Example:
    >>> info = describe_name("model.layers.3.mlp.experts.7.up_proj.weight")
    >>> info.role.value, info.layer, info.expert, info.fused_group
    ('routed_expert', 3, 7, 'model.layers.3.mlp.experts.7.gate_up')
    >>> inventory_from_config("DeepSeek-V3").num_mtp_layers
    1
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fp4convert.families._config import load_config, shipped_config_names
from fp4convert.families._grammar import ExpertLayout
from fp4convert.families._inventory import (
    describe_with,
    inventory_from_checkpoint_with,
    inventory_from_config_with,
)
from fp4convert.families._registry import FamilyRegistry
from fp4convert.families._tables import Family, FamilyKey
from fp4convert.families.deepseek_v3 import DEEPSEEK_V3
from fp4convert.families.llama import LLAMA
from fp4convert.families.qwen2 import QWEN2
from fp4convert.families.qwen3 import QWEN3
from fp4convert.families.qwen3_moe import QWEN3_MOE
from fp4convert.families.transforms import (
    global_to_local_expert,
    local_to_global_expert,
    merge_gate_up,
    merge_qkv,
    split_gate_up,
    split_qkv,
)
from fp4convert.inventory import ModelInventory, TensorInfo

__all__ = [
    "BUILTIN_FAMILIES",
    "REGISTRY",
    "ExpertLayout",
    "Family",
    "FamilyKey",
    "FamilyRegistry",
    "describe_name",
    "family_for_config",
    "get_family",
    "global_to_local_expert",
    "inventory_from_checkpoint",
    "inventory_from_config",
    "load_config",
    "local_to_global_expert",
    "merge_gate_up",
    "merge_qkv",
    "register_family",
    "shipped_config_names",
    "split_gate_up",
    "split_qkv",
]

#: The families fp4convert ships, registered in this order (tests/families/test_registry.py pins it).
BUILTIN_FAMILIES: tuple[Family, ...] = (LLAMA, QWEN2, QWEN3, QWEN3_MOE, DEEPSEEK_V3)

#: The process-wide registry the functions below use.
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
    """The family registered under ``key``.

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


def inventory_from_config(source: str | Path | Mapping[str, Any]) -> ModelInventory:
    """Every tensor of a model, from its config.json alone (no weights).

    Args:
        source: a parsed config, a config.json path, a checkpoint directory, or a shipped config name
            (:func:`shipped_config_names`).

    Returns:
        The inventory: embedding, then each decoder layer, then MTP layers, then the final norm and
        lm_head; experts expanded; shapes from the config; dtype from ``torch_dtype`` (or the fixed
        dtype a family declares, e.g. DeepSeek's float32 ``e_score_correction_bias``).

    Raises:
        MappingError: unsupported model, or a field the family needs is missing.
        CheckpointError: the config file cannot be read.

    Example:
        >>> inv = inventory_from_config("Qwen3-30B-A3B")
        >>> inv.family, inv.num_layers, len(inv)
        ('qwen3_moe', 48, 18867)
    """
    return inventory_from_config_with(REGISTRY, source)


def inventory_from_checkpoint(directory: str | Path) -> ModelInventory:
    """Every tensor of a checkpoint directory, classified, from its config.json and safetensors headers.

    Reads only headers (``safe_open`` metadata): no tensor data is loaded and nothing is unpickled.

    Args:
        directory: holds config.json and ``model.safetensors`` (or an index and shards).

    Returns:
        The inventory in checkpoint order with on-disk shapes and dtypes; ``num_mtp_layers`` counts
        the MTP layers actually present.

    Raises:
        MappingError: a tensor is not part of the family, or is ambiguous.
        CheckpointError: files are missing or unreadable.

    Example:
        >>> inventory_from_checkpoint("path/to/Qwen3-8B").num_layers  # doctest: +SKIP
        36
    """
    return inventory_from_checkpoint_with(REGISTRY, directory)


def describe_name(
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    family: str | FamilyKey | Family | None = None,
) -> TensorInfo:
    """Classify one HF or Megatron-Core name without loading a model.

    With ``config`` the name is checked against that model (layer range, dense/MoE layers, MTP
    layers, tied embeddings) and must match exactly one entry. Without it every family is tried
    (or only ``family``): role, layer, expert and MTP-ness must agree across the candidates, and the
    Megatron name / fused group are given only where they agree (HF ``q_proj`` is fused into
    ``linear_qkv`` for Llama but not for DeepSeek). Without a config an HF layer past the decoder is
    taken as a decoder layer unless the name is MTP glue (``enorm``, ``eh_proj`` ...), and Megatron
    MTP names cannot be resolved.

    For a fused Megatron tensor (``linear_qkv``, ``linear_fc1``) the description is that of its first
    HF piece (q, gate); siblings share role, layer, expert and fused group. Megatron expert ids are
    taken as global (EP rank 0). The shape is ``()``.

    Args:
        name: an HF name (``model.layers.3.self_attn.q_proj.weight``) or a Megatron-Core name
            (``decoder.layers.3.self_attention.linear_qkv.weight``, ``module.`` wrappers allowed).
        config: the model's parsed config.json, if known.
        family: restrict a config-free lookup to one family (or override the config's family).

    Returns:
        The :class:`TensorInfo` (name = HF name).

    Raises:
        MappingError: unmapped or ambiguous name.

    Example:
        >>> describe_name("decoder.layers.0.mlp.experts.linear_fc2.weight5").name
        'model.layers.0.mlp.experts.5.down_proj.weight'
        >>> describe_name("model.layers.2.self_attn.kv_b_proj.weight").role.value
        'mla_projection'
    """
    return describe_with(REGISTRY, name, config, family)
