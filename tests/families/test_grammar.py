"""The name grammar: wildcard patterns, scope prefixes, expert layouts, module wrappers."""

from __future__ import annotations

import pytest

from fp4convert.errors import MappingError
from fp4convert.families._grammar import (
    Scope,
    check_same_wildcards,
    compile_pattern,
    megatron_layer_prefix,
    sequential_expert_spelling,
    split_hf_layer_name,
    split_megatron_layer_name,
    strip_module_prefix,
)


def test_expert_wildcard_matches_and_formats_back() -> None:
    pattern = compile_pattern("mlp.experts.{expert}.gate_proj.weight")
    assert pattern.match("mlp.experts.17.gate_proj.weight") == {"expert": 17}
    assert pattern.format(expert=17) == "mlp.experts.17.gate_proj.weight"


@pytest.mark.parametrize(
    "name",
    [
        "mlp.experts.07.gate_proj.weight",  # leading zero: would not format back to itself
        "mlp.experts.x.gate_proj.weight",
        "mlp.experts.1.gate_proj.weight.extra",
        "xmlp.experts.1.gate_proj.weight",
        "mlp.expertsX1.gate_proj.weight",  # dots are literal, not regex wildcards
    ],
)
def test_expert_wildcard_rejects_near_misses(name: str) -> None:
    assert compile_pattern("mlp.experts.{expert}.gate_proj.weight").match(name) is None


def test_grouped_spelling_glues_the_expert_id_to_weight() -> None:
    pattern = compile_pattern("mlp.experts.linear_fc1.weight{expert}")
    assert pattern.match("mlp.experts.linear_fc1.weight12") == {"expert": 12}
    assert pattern.match("mlp.experts.linear_fc1.weight") is None


@pytest.mark.parametrize("text", ["layers.{layer}.x", "a.{expert}.b.{expert}"])
def test_only_one_expert_wildcard_is_allowed(text: str) -> None:
    with pytest.raises(MappingError, match=r"^pattern .* uses wildcards"):
        compile_pattern(text)


def test_both_sides_must_capture_the_same_wildcards() -> None:
    with pytest.raises(MappingError, match=r"^Megatron pattern 'mlp.experts.linear_fc2.weight\{expert\}' has"):
        check_same_wildcards(
            compile_pattern("mlp.experts.linear_fc2.weight{expert}"), compile_pattern("mlp.down_proj.weight")
        )


def test_sequential_spelling_is_derived_from_the_grouped_one() -> None:
    assert (
        sequential_expert_spelling("mlp.experts.linear_fc1.weight{expert}")
        == "mlp.experts.local_experts.{expert}.linear_fc1.weight"
    )
    with pytest.raises(MappingError, match=r"^Megatron expert pattern .* is not in TEGroupedMLP form"):
        sequential_expert_spelling("mlp.experts.local_experts.{expert}.linear_fc1.weight")


def test_module_wrappers_are_stripped() -> None:
    assert strip_module_prefix("module.module.decoder.layers.0.x") == "decoder.layers.0.x"
    assert strip_module_prefix("decoder.layers.0.module.x") == "decoder.layers.0.module.x"


def test_layer_prefixes_split_both_ways() -> None:
    assert split_hf_layer_name("model.layers.12.mlp.gate.weight") == (12, "mlp.gate.weight")
    assert split_hf_layer_name("model.norm.weight") is None
    assert split_megatron_layer_name("decoder.layers.3.mlp.router.weight") == (
        Scope.DECODER,
        3,
        "mlp.router.weight",
    )
    assert split_megatron_layer_name("mtp.layers.0.transformer_layer.input_layernorm.weight") == (
        Scope.MTP_LAYER,
        0,
        "input_layernorm.weight",
    )
    assert split_megatron_layer_name("mtp.layers.1.eh_proj.weight") == (Scope.MTP_GLUE, 1, "eh_proj.weight")
    assert split_megatron_layer_name("output_layer.weight") is None


def test_megatron_prefixes_write_the_current_mtp_spelling() -> None:
    assert megatron_layer_prefix(Scope.DECODER, 4) == "decoder.layers.4."
    assert megatron_layer_prefix(Scope.MTP_LAYER, 0) == "mtp.layers.0.mtp_model_layer."
    assert megatron_layer_prefix(Scope.MTP_GLUE, 0) == "mtp.layers.0."
