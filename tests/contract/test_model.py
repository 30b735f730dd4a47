"""The contract model: defaults, strictness, layer fractions, canonical form and hash."""

from __future__ import annotations

import json
from typing import get_args

import pytest
import yaml
from contract.helpers import CONTRACTS, SHIPPED, base_contract, make_contract, rule
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fp4convert.contract import Contract, LayerFraction, contract_hash, load_contract, parse_contract
from fp4convert.contract.sections import BF16Exceptions, QuantizerProfile


def test_minimal_contract_gets_documented_defaults() -> None:
    contract = make_contract()
    assert contract.quantizer == "te"
    assert (contract.formats.nvfp4.tile, contract.formats.nvfp4.weight_scale_scope) == ("1x16", "tensor")
    assert contract.formats.nvfp4.per_token_activations is False
    assert contract.formats.mxfp8.tile == "1x32"
    assert contract.backward == "high_precision"
    assert contract.kv_cache == "bf16"
    assert contract.expert_tensor_parallel_size is None
    exceptions = contract.bf16_exceptions
    assert (exceptions.first_layers, exceptions.last_layers, exceptions.mtp_layers) == (0, 0, False)
    assert (exceptions.shared_experts, exceptions.routers, exceptions.lm_head) == (True, True, True)
    assert (contract.fused_groups.gate_up, contract.fused_groups.qkv, contract.fused_groups.mla_qa_kva) == (
        True,
        True,
        True,
    )


def test_quantizer_profiles_are_the_numeric_core_profiles() -> None:
    from fp4convert.formats.profiles import BASE_PROFILES

    assert get_args(QuantizerProfile) == BASE_PROFILES


def test_contract_is_frozen() -> None:
    contract = make_contract()
    with pytest.raises(ValidationError, match="frozen"):
        contract.backward = "dequantized"  # type: ignore[misc]


def test_block_shapes_follow_the_tile() -> None:
    assert make_contract().formats.nvfp4.block_shape == (1, 16)
    assert make_contract(formats={"nvfp4": {"tile": "16x16"}}).formats.nvfp4.block_shape == (16, 16)
    assert make_contract().formats.mxfp8.block_shape == (1, 32)


def test_formats_used_counts_rules_and_default_only() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")], default=None)
    assert contract.formats_used == frozenset({"mxfp8"})
    assert make_contract().formats_used == frozenset({"nvfp4", "bf16"})
    assert contract.recipe_for("mxfp8") is contract.formats.mxfp8
    assert contract.recipe_for("bf16") is None


def test_rule_names_must_be_unique() -> None:
    with pytest.raises(ValidationError, match=r"rule name 'a' is used by rules\[0\] and rules\[2\]"):
        make_contract(rules=[rule("*", "bf16", name="a"), rule("x*", "bf16"), rule("y*", "bf16", name="a")])


@pytest.mark.parametrize(
    ("fraction", "rounding", "num_layers", "expected"),
    [
        (0.15, "ceil", 48, 8),  # 7.2
        (0.15, "floor", 48, 7),
        (0.15, "ceil", 61, 10),  # 9.15: DeepSeek-V3
        (0.15, "ceil", 20, 3),  # exactly 3: binary 0.15 * 20 is 3.0000000000000004
        (0.15, "floor", 20, 3),
        (0.1, "ceil", 30, 3),  # 0.1 * 30 is 3.0000000000000004 in binary too
        (1.0, "floor", 7, 7),
        (0.5, "ceil", 0, 0),
    ],
)
def test_layer_fraction_counts_on_the_decimal_as_written(
    fraction: float, rounding: str, num_layers: int, expected: int
) -> None:
    assert LayerFraction(fraction=fraction, rounding=rounding).count(num_layers) == expected  # type: ignore[arg-type]


@given(percent=st.integers(1, 100), num_layers=st.integers(0, 400))
def test_layer_fraction_matches_integer_arithmetic(percent: int, num_layers: int) -> None:
    fraction = float(f"0.{percent:02d}") if percent < 100 else 1.0
    ceil = LayerFraction(fraction=fraction, rounding="ceil").count(num_layers)
    floor = LayerFraction(fraction=fraction, rounding="floor").count(num_layers)
    assert ceil == -(-percent * num_layers // 100)
    assert floor == percent * num_layers // 100


def test_layer_fraction_describes_itself() -> None:
    assert LayerFraction(fraction=0.15, rounding="ceil").describe() == "15% (ceil)"


def test_layer_counts_accept_a_count_or_a_fraction() -> None:
    exceptions = BF16Exceptions(first_layers=2, last_layers={"fraction": 0.15, "rounding": "ceil"})
    assert exceptions.layer_counts(61) == (2, 10)
    assert exceptions.counts_depend_on_model
    assert not BF16Exceptions(first_layers=1, last_layers=3).counts_depend_on_model


@pytest.mark.parametrize("stem", SHIPPED)
def test_canonical_yaml_round_trips(stem: str) -> None:
    contract = load_contract(CONTRACTS / f"{stem}.yaml")
    again = parse_contract(contract.to_yaml(), source="canonical")
    assert again == contract
    assert contract_hash(again) == contract_hash(contract)


def test_hash_ignores_spelling_but_not_meaning() -> None:
    data = base_contract()
    reordered = dict(reversed(list(data.items())))
    explicit_defaults = {**data, "kv_cache": "bf16", "quantizer": "te", "fused_groups": {"qkv": True}}
    as_json = parse_contract(json.dumps(data), source="c.json", json_text=True)
    hashes = {contract_hash(Contract.model_validate(d)) for d in (data, reordered, explicit_defaults)}
    assert hashes == {contract_hash(as_json)}
    assert contract_hash(make_contract(backward="dequantized")) not in hashes


def test_shipped_contract_hash_is_pinned() -> None:
    # Converters embed this hash in output manifests: a change to the canonical form (or to the
    # shipped file) must be deliberate, and shows up here.
    contract = load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml")
    assert contract_hash(contract) == "612daf1c849378e0f91c42ad7a4a1e59b9d3ab3fcec0a3f51547c7f1e1fb5ee5"


def test_json_schema_is_strict_and_complete() -> None:
    schema = Contract.model_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(Contract.model_fields)
    assert set(schema["required"]) == {"version", "name", "rules", "default"}
    assert schema["properties"]["rules"]["minItems"] == 1
    # The schema is itself valid YAML/JSON data (what `contract schema` prints).
    assert yaml.safe_load(json.dumps(schema)) == schema
