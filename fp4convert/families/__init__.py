"""Model families: HF <-> Megatron-Core names, tensor inventories, and layout transforms.

A family is a table (``llama.py``, ``qwen2.py``, ``qwen3.py``, ``qwen3_moe.py``, ``deepseek_v3.py``
(also Kimi-K2), ``mixtral.py``, ``qwen2_moe.py``, ``minimax_m2.py``, ``glm4_moe.py``, ``gpt_oss.py``,
``qwen3_next.py``) registered in ``_builtin.py``. The name grammar shared by all tables is
``_grammar.py``, the typed entries ``_tables.py``, the entries several tables share ``_common.py``,
name resolution ``_mapper.py``, inventories and descriptions ``_inventory.py``, Megatron-Core's other
spellings (local / ModelOpt specs, MTP names across versions, stacked experts, MLA's fused down
projection) ``_spelling.py``, state-dict conversion ``_convert.py``, and the pure tensor transforms
:mod:`fp4convert.families.transforms`. Adding a family is a new table plus one line in
``BUILTIN_FAMILIES`` (docs/families.md walks through one).

Example:
    >>> info = describe_name("model.layers.3.mlp.experts.7.up_proj.weight")
    >>> info.role.value, info.layer, info.expert, info.fused_group
    ('routed_expert', 3, 7, 'model.layers.3.mlp.experts.7.gate_up')
    >>> inventory_from_config("DeepSeek-V3").num_mtp_layers
    1
"""

from __future__ import annotations

from fp4convert.families._builtin import (
    BUILTIN_FAMILIES,
    REGISTRY,
    family_for_config,
    get_family,
    register_family,
)
from fp4convert.families._config import load_config, shipped_config_names
from fp4convert.families._convert import hf_to_megatron, megatron_to_hf
from fp4convert.families._grammar import ExpertLayout, MtpInner
from fp4convert.families._inventory import describe_name, inventory_from_config, inventory_from_tensors
from fp4convert.families._registry import FamilyRegistry
from fp4convert.families._spelling import SEPARATE_NORMS, MegatronSpelling, packed_name, unpack
from fp4convert.families._tables import Family, FamilyKey
from fp4convert.families.transforms import (
    global_to_local_expert,
    local_to_global_expert,
    merge_gate_up,
    merge_qkv,
    split_gate_up,
    split_qkv,
)

__all__ = [
    "BUILTIN_FAMILIES",
    "REGISTRY",
    "SEPARATE_NORMS",
    "ExpertLayout",
    "Family",
    "FamilyKey",
    "FamilyRegistry",
    "MegatronSpelling",
    "MtpInner",
    "describe_name",
    "family_for_config",
    "get_family",
    "global_to_local_expert",
    "hf_to_megatron",
    "inventory_from_config",
    "inventory_from_tensors",
    "load_config",
    "local_to_global_expert",
    "megatron_to_hf",
    "merge_gate_up",
    "merge_qkv",
    "packed_name",
    "register_family",
    "shipped_config_names",
    "split_gate_up",
    "split_qkv",
    "unpack",
]
