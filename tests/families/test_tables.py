"""Family tables are validated when they are built, and read both ways."""

from __future__ import annotations

import dataclasses

import pytest

import fp4convert.families as families
from fp4convert.errors import MappingError
from fp4convert.families import get_family
from fp4convert.families._grammar import ExpertLayout
from fp4convert.families._tables import Direct, GatedMLP, SharedCopy, linear, norm
from fp4convert.inventory import Role

EXPECTED_PUBLIC_API = [
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


def test_public_api_is_pinned() -> None:
    assert families.__all__ == EXPECTED_PUBLIC_API
    assert all(hasattr(families, name) for name in families.__all__)


def test_an_entry_whose_sides_capture_different_wildcards_is_refused() -> None:
    with pytest.raises(MappingError, match=r"^Megatron pattern 'mlp.linear_fc2.weight' has wildcards \[\]"):
        Direct(
            "mlp.linear_fc2.weight",
            linear("mlp.experts.{expert}.down_proj.weight", ("h", "i"), Role.ROUTED_EXPERT),
        )


def test_an_expert_entry_must_use_the_grouped_spelling() -> None:
    with pytest.raises(MappingError, match=r"is not in TEGroupedMLP form"):
        GatedMLP(
            "mlp.experts.local_experts.{expert}.linear_fc1.weight",
            gate=linear("mlp.experts.{expert}.gate_proj.weight", ("i", "h"), Role.ROUTED_EXPERT),
            up=linear("mlp.experts.{expert}.up_proj.weight", ("i", "h"), Role.ROUTED_EXPERT),
        )


def test_expert_entries_are_read_in_both_layouts_and_written_in_the_asked_one() -> None:
    entry = next(e for e in get_family("qwen3_moe").layer_entries if "linear_fc2.weight{expert}" in e.megatron)
    assert isinstance(entry, Direct)
    assert [(s.pattern.text, s.layout) for s in entry.spellings] == [
        ("mlp.experts.linear_fc2.weight{expert}", ExpertLayout.GROUPED),
        ("mlp.experts.local_experts.{expert}.linear_fc2.weight", ExpertLayout.SEQUENTIAL),
    ]
    assert entry.spelling(ExpertLayout.SEQUENTIAL).format(expert=3) == "mlp.experts.local_experts.3.linear_fc2.weight"


def test_family_refuses_wildcards_in_globals_and_copies_outside_mtp() -> None:
    qwen3 = get_family("qwen3")
    with pytest.raises(MappingError, match=r"global entry 'mlp.experts.linear_fc2.weight\{expert\}' has a wildcard"):
        expert = Direct(
            "mlp.experts.linear_fc2.weight{expert}",
            linear("mlp.experts.{expert}.down_proj.weight", ("hidden", "moe_intermediate"), Role.ROUTED_EXPERT),
        )
        dataclasses.replace(qwen3, global_entries=(expert,))
    copy = SharedCopy(norm("model.norm_copy.weight"), megatron="decoder.final_layernorm.weight")
    with pytest.raises(MappingError, match=r"SharedCopy 'model.norm_copy.weight' outside the MTP glue entries"):
        dataclasses.replace(qwen3, layer_entries=(*qwen3.layer_entries, copy))


def test_describe_lists_every_entry() -> None:
    table = get_family("deepseek_v3").describe().splitlines()
    assert table[0].split() == ["scope", "megatron", "kind", "hf", "[requires]"]
    assert any(
        line.split()[:3] == ["mtp", "output_layer.weight", "SharedCopy"] and "shared_head.head.weight" in line
        for line in table
    )
    family = get_family("deepseek_v3")
    entries = len(family.global_entries) + len(family.layer_entries) + len(family.mtp_glue_entries)
    assert len(table) == 1 + entries
