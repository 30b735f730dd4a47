"""Precedence: each tier beats the next, specificity inside the rules, and no dependence on order."""

from __future__ import annotations

import dataclasses

import pytest
from contract.helpers import TOY_MOE, base_contract, make_contract, rule
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4convert.contract import Contract
from fp4convert.contract.resolve import decide_all, resolve
from fp4convert.errors import ContractError, MappingError
from fp4convert.inventory import FusedKind, ModelInventory, Role, TensorInfo
from fp4convert.model_source import load_model_inventory

EXPERT_UP = TensorInfo(
    "model.layers.3.mlp.experts.7.up_proj.weight",
    (32, 64),
    role=Role.ROUTED_EXPERT,
    layer=3,
    expert=7,
    megatron_name="decoder.layers.3.mlp.experts.linear_fc1.weight7",
    fused_group="model.layers.3.mlp.experts.7.gate_up",
    fused_kind=FusedKind.GATE_UP,
    gemm_weight=True,
)
EXPERT_GATE = dataclasses.replace(EXPERT_UP, name="model.layers.3.mlp.experts.7.gate_proj.weight")


def _tensor(name: str, role: Role = Role.OTHER, *, layer: int | None = 3, **fields: object) -> TensorInfo:
    return TensorInfo(name, (64, 64), role=role, layer=layer, gemm_weight=True, **fields)  # type: ignore[arg-type]


def _rules(decision_contract: Contract, tensor: TensorInfo, num_layers: int = 8) -> list[str]:
    return [m.rule for m in decision_contract.decide(tensor, num_layers=num_layers).matched]


# --- each tier beats the next ------------------------------------------------------------------


def test_non_gemm_tensors_are_never_quantized_whatever_the_rules() -> None:
    contract = make_contract(rules=[rule("*", "nvfp4")], default="nvfp4")
    norm = TensorInfo("model.layers.3.input_layernorm.weight", (64,), role=Role.NORM, layer=3)
    decision = contract.decide(norm, num_layers=8)
    assert (decision.format, decision.rule) == ("bf16", "non_gemm")
    assert _rules(contract, norm) == ["non_gemm", "bf16_exceptions.norms", "rules[0]", "default"]


def test_name_exception_beats_role_exception_and_rules() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")], bf16_exceptions={"names": {"hf": [".shared_experts."]}})
    shared = _tensor("model.layers.3.mlp.shared_experts.up_proj.weight", Role.SHARED_EXPERT)
    assert _rules(contract, shared) == [
        "bf16_exceptions.names.hf[0]",
        "bf16_exceptions.shared_experts",
        "rules[0]",
        "default",
    ]
    assert contract.decide(shared, num_layers=8).reason == (
        "bf16 from bf16_exceptions.names.hf[0]: HF name contains '.shared_experts.'"
    )


def test_role_exception_beats_mtp_and_layer_counts() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")], bf16_exceptions={"mtp_layers": True, "last_layers": 2})
    router = _tensor("model.layers.8.mlp.gate.weight", Role.ROUTER, layer=8, is_mtp=True)
    assert _rules(contract, router) == [
        "bf16_exceptions.routers",
        "bf16_exceptions.mtp_layers",
        "rules[0]",
        "default",
    ]


def test_mtp_layers_are_not_decoder_layers_for_counts() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")], bf16_exceptions={"last_layers": 2})
    mtp_proj = _tensor("model.layers.8.eh_proj.weight", Role.MTP, layer=8, is_mtp=True)
    decision = contract.decide(mtp_proj, num_layers=8, num_mtp_layers=1)
    assert (decision.format, decision.rule) == ("mxfp8", "rules[0]")


def test_layer_counts_beat_the_most_specific_rule() -> None:
    exact = rule(EXPERT_UP.name, "nvfp4", kind="exact")
    contract = make_contract(rules=[exact], bf16_exceptions={"first_layers": 1, "last_layers": 5})
    decision = contract.decide(EXPERT_UP, num_layers=8)
    assert (decision.format, decision.rule) == ("bf16", "bf16_exceptions.last_layers")
    assert decision.matched[0].detail == "layer 3 is among the last 5 of 8 decoder layers"
    assert contract.decide(EXPERT_UP, num_layers=9).format == "nvfp4"  # layer 3 < 9 - 5


def test_first_layers_and_fractional_last_layers() -> None:
    contract = make_contract(
        bf16_exceptions={"first_layers": 4, "last_layers": {"fraction": 0.15, "rounding": "ceil"}}
    )
    decision = contract.decide(EXPERT_UP, num_layers=48)
    assert decision.matched[0].detail == "layer 3 is among the first 4 of 48 decoder layers"
    last = dataclasses.replace(EXPERT_UP, layer=40)
    assert contract.decide(last, num_layers=48).matched[0].detail == (
        "layer 40 is among the last 8 (15% (ceil)) of 48 decoder layers"
    )
    assert contract.decide(dataclasses.replace(EXPERT_UP, layer=39), num_layers=48).format == "nvfp4"


def test_rules_beat_the_default_and_the_default_covers_the_rest() -> None:
    contract = make_contract()
    assert contract.decide(EXPERT_UP, num_layers=8).rule == "rules[0]"
    attention = _tensor("model.layers.3.self_attn.o_proj.weight", Role.ATTENTION)
    decision = contract.decide(attention, num_layers=8)
    assert (decision.format, decision.rule, decision.reason) == (
        "bf16",
        "default",
        "bf16 from default: the contract default",
    )


def test_null_default_makes_an_uncovered_gemm_weight_an_error() -> None:
    contract = make_contract(default=None)
    attention = _tensor("model.layers.3.self_attn.o_proj.weight", Role.ATTENTION)
    with pytest.raises(ContractError) as info:
        contract.decide(attention, num_layers=8)
    assert info.value.message == (
        "no rule covers GEMM weight 'model.layers.3.self_attn.o_proj.weight' and the contract default is null"
    )
    assert info.value.hint == "add a rule that matches it, or set `default:` to a format"


# --- specificity inside the rules ------------------------------------------------------------


def test_exact_beats_regex_beats_glob_whatever_the_literal_length() -> None:
    glob = rule("model.layers.3.mlp.experts.7.up_proj.weigh?", "mxfp8")  # 42 literal characters
    regex = rule(r".*up_proj.*", "nvfp4", kind="regex")  # 7
    exact = rule(EXPERT_UP.name, "bf16", kind="exact")
    assert make_contract(rules=[glob, regex]).decide(EXPERT_UP, num_layers=8).rule == "rules[1]"
    assert make_contract(rules=[glob, regex, exact]).decide(EXPERT_UP, num_layers=8).rule == "rules[2]"


def test_more_literal_characters_win_within_a_kind() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8"), rule("*.mlp.experts.*", "nvfp4")])
    decision = contract.decide(EXPERT_UP, num_layers=8)
    assert (decision.format, decision.rule) == ("nvfp4", "rules[1]")
    assert decision.reason == "nvfp4 from rules[1]: hf glob '*.mlp.experts.*'; the most specific of 2 matching rules"


def test_equally_specific_rules_that_disagree_are_an_error() -> None:
    # ".experts.7." and ".layers.3.m" are both 11 literal characters.
    contract = make_contract(rules=[rule("*.experts.7.*", "nvfp4"), rule("*.layers.3.m*", "mxfp8")])
    with pytest.raises(ContractError) as info:
        contract.decide(EXPERT_UP, num_layers=8)
    assert info.value.message == (
        "rules[0] (hf glob '*.experts.7.*') and rules[1] (hf glob '*.layers.3.m*') match "
        "'model.layers.3.mlp.experts.7.up_proj.weight' equally specifically but give nvfp4 and mxfp8"
    )
    assert info.value.fields["field"] == "rules[1]"


def test_equally_specific_rules_that_agree_are_both_listed_earlier_first() -> None:
    contract = make_contract(rules=[rule("*.layers.3.m*", "nvfp4"), rule("*.experts.7.*", "nvfp4")])
    assert _rules(contract, EXPERT_UP) == ["rules[0]", "rules[1]", "default"]


def test_megatron_rules_see_the_module_path() -> None:
    module = rule("*.mlp.experts.linear_fc1", "nvfp4", namespace="megatron")
    parameter = rule("*.mlp.experts.linear_fc1.weight7", "mxfp8", namespace="megatron")
    contract = make_contract(rules=[module, parameter])
    assert _rules(contract, EXPERT_UP) == ["rules[0]", "default"]
    unmapped = dataclasses.replace(EXPERT_UP, megatron_name=None)
    assert _rules(contract, unmapped) == ["default"]


def test_megatron_name_exceptions_see_the_full_parameter_name() -> None:
    contract = make_contract(bf16_exceptions={"names": {"megatron": ["linear_fc1.weight7"]}})
    assert contract.decide(EXPERT_UP, num_layers=8).rule == "bf16_exceptions.names.megatron[0]"
    assert make_contract().decide(dataclasses.replace(EXPERT_UP, megatron_name=None), num_layers=8).format == ("nvfp4")


# --- order independence -----------------------------------------------------------------------

RULES = [
    rule("*", "mxfp8", name="everything"),
    rule("*", "mxfp8", namespace="megatron"),
    rule("*.mlp.experts.*", "nvfp4", name="experts"),
    rule("*.mlp.experts.linear_fc1", "nvfp4", namespace="megatron"),
    rule("*.mlp.experts.linear_fc2", "nvfp4", namespace="megatron"),
    rule(r".*\.layers\.0\..*", "bf16", kind="regex"),
    rule("lm_head.weight", "bf16", kind="exact"),
]


@settings(max_examples=25, deadline=None)
@given(order=st.permutations(range(len(RULES))), key_order=st.permutations(range(5)))
def test_formats_do_not_depend_on_rule_or_key_order(order: list[int], key_order: list[int]) -> None:
    toy_moe = load_model_inventory(TOY_MOE)  # not a fixture: hypothesis would print its 87 tensors
    data = base_contract(rules=RULES, bf16_exceptions={"last_layers": 1, "names": {"hf": [".o_proj."]}})
    keys = list(data)
    shuffled = {keys[i]: data[keys[i]] for i in key_order}
    shuffled["rules"] = [RULES[i] for i in order]
    reference = decide_all(Contract.model_validate(data), toy_moe)
    permuted = decide_all(Contract.model_validate(shuffled), toy_moe)
    assert {n: d.format for n, d in permuted.items()} == {n: d.format for n, d in reference.items()}


# --- layers, MTP, fused groups ----------------------------------------------------------------


def test_layers_past_the_decoder_are_mtp_when_the_model_has_mtp_layers() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")], bf16_exceptions={"mtp_layers": True})
    glue = _tensor("model.layers.61.eh_proj.weight", layer=61)  # described without is_mtp
    assert contract.decide(glue, num_layers=61, num_mtp_layers=1).rule == "bf16_exceptions.mtp_layers"
    with pytest.raises(MappingError) as info:
        contract.decide(glue, num_layers=60, num_mtp_layers=1)
    assert info.value.message == (
        "tensor 'model.layers.61.eh_proj.weight' is in layer 61, but the model has 60 decoder layers and 1 MTP layers"
    )


def test_fused_siblings_share_the_outer_scale_unless_switched_off() -> None:
    assert make_contract().decide(EXPERT_UP, num_layers=8).fused_group == "model.layers.3.mlp.experts.7.gate_up"
    off = make_contract(fused_groups={"gate_up": False})
    assert off.decide(EXPERT_UP, num_layers=8).fused_group is None
    bf16 = make_contract(rules=[rule("*", "bf16")])
    assert bf16.decide(EXPERT_UP, num_layers=8).fused_group is None


def test_decide_all_refuses_to_split_fused_siblings() -> None:
    contract = make_contract(bf16_exceptions={"names": {"hf": [".gate_proj."]}})
    inventory = ModelInventory("toy", 8, (EXPERT_GATE, EXPERT_UP))
    with pytest.raises(ContractError) as info:
        decide_all(contract, inventory)
    assert info.value.message == (
        "fused group 'model.layers.3.mlp.experts.7.gate_up' splits into different formats: "
        "model.layers.3.mlp.experts.7.gate_proj.weight=bf16 (bf16_exceptions.names.hf[0]), "
        "model.layers.3.mlp.experts.7.up_proj.weight=nvfp4 (rules[0])"
    )


def test_decide_all_on_a_model(toy_mla: ModelInventory) -> None:
    contract = make_contract(
        rules=[rule("*", "mxfp8")],
        bf16_exceptions={"names": {"hf": [".kv_b_proj."]}, "mtp_layers": True, "shared_experts": False},
    )
    decisions = decide_all(contract, toy_mla)
    assert list(decisions) == [t.name for t in toy_mla]
    by_format = {fmt: sum(d.format == fmt for d in decisions.values()) for fmt in ("mxfp8", "bf16")}
    # GEMM weights of layers 0-3: layer 0: q_a, q_b, kv_a, o, gate, up, down (kv_b is bf16);
    # layers 1-3: q_a, q_b, kv_a, o + 12 expert + 3 shared-expert weights (router is bf16).
    assert by_format == {"mxfp8": 7 + 3 * 19, "bf16": len(toy_mla) - 7 - 3 * 19}


# --- resolve with an unknown layer count, and namespaces ---------------------------------------


def test_unknown_layer_count_skips_last_layers_with_a_note() -> None:
    contract = make_contract(bf16_exceptions={"first_layers": 4, "last_layers": 2})
    decision, notes = resolve(contract, EXPERT_UP, num_layers=None)
    assert decision.rule == "bf16_exceptions.first_layers"
    assert decision.matched[0].detail == "layer 3 is among the first 4 decoder layers"
    assert notes == (
        "bf16_exceptions.last_layers was not evaluated: the model's layer count is unknown "
        "(pass a model to include it)",
    )


def test_namespace_restriction_shows_one_engine_view() -> None:
    contract = make_contract(rules=[rule("*", "mxfp8"), rule("*", "bf16", namespace="megatron", name="learner_bf16")])
    hf_view, _ = resolve(contract, EXPERT_UP, num_layers=8, namespaces=frozenset({"hf"}))
    megatron_view, _ = resolve(contract, EXPERT_UP, num_layers=8, namespaces=frozenset({"megatron"}))
    assert (hf_view.format, megatron_view.format) == ("mxfp8", "bf16")
    with pytest.raises(ContractError, match="equally specifically"):
        contract.decide(EXPERT_UP, num_layers=8)
