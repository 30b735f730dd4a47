"""``Contract.explain`` from a model or a described tensor, and ``explain_name`` from a bare name."""

from __future__ import annotations

import pytest
from contract.helpers import make_contract, rule

from fp4convert.errors import MappingError
from fp4convert.inventory import ModelInventory, Role, TensorInfo
from fp4convert.model_source import explain_name

MLA_CONTRACT = {
    "rules": [rule("*", "mxfp8"), rule("*", "mxfp8", namespace="megatron")],
    "bf16_exceptions": {"names": {"hf": [".kv_b_proj."], "megatron": [".linear_kv_up_proj"]}},
}


def test_explain_by_hf_name_lists_every_match_and_the_winner(toy_mla: ModelInventory) -> None:
    explanation = make_contract(**MLA_CONTRACT).explain("model.layers.2.self_attn.kv_b_proj.weight", toy_mla)
    assert explanation.tensor.role is Role.MLA_PROJECTION
    assert explanation.winner.rule == "bf16_exceptions.names.hf[0]"
    assert [(m.rule, m.format) for m in explanation.decision.matched] == [
        ("bf16_exceptions.names.hf[0]", "bf16"),
        ("bf16_exceptions.names.megatron[0]", "bf16"),
        ("rules[0]", "mxfp8"),
        ("rules[1]", "mxfp8"),
        ("default", "bf16"),
    ]
    assert explanation.num_layers == 4
    assert explanation.notes == ()


def test_explain_by_megatron_name_of_a_fused_tensor(toy_mla: ModelInventory) -> None:
    explanation = make_contract(**MLA_CONTRACT).explain("decoder.layers.1.mlp.experts.linear_fc1.weight2", toy_mla)
    assert explanation.tensor.name == "model.layers.1.mlp.experts.2.gate_proj.weight"
    assert explanation.decision.format == "mxfp8"
    assert explanation.decision.fused_group == "model.layers.1.mlp.experts.2.gate_up"
    assert explanation.notes == (
        "Megatron tensor 'decoder.layers.1.mlp.experts.linear_fc1.weight2' holds 2 HF tensors "
        "(model.layers.1.mlp.experts.2.gate_proj.weight, model.layers.1.mlp.experts.2.up_proj.weight); "
        "explained the first",
    )


def test_explain_an_unknown_name_suggests_close_ones(toy_mla: ModelInventory) -> None:
    with pytest.raises(MappingError) as info:
        make_contract().explain("model.layers.2.self_attn.kv_b_prj.weight", toy_mla)
    assert info.value.message == (
        "tensor 'model.layers.2.self_attn.kv_b_prj.weight' is not in the model (123 tensors, family toy_deepseek_v3)"
    )
    assert info.value.hint is not None
    assert info.value.hint.startswith("did you mean 'model.layers.2.self_attn.kv_b_proj.weight'")


def test_explain_namespace_restricts_rules_and_name_exceptions(toy_mla: ModelInventory) -> None:
    contract = make_contract(**MLA_CONTRACT)
    megatron_view = contract.explain("model.layers.2.self_attn.kv_b_proj.weight", toy_mla, namespace="megatron")
    assert [m.rule for m in megatron_view.decision.matched] == [
        "bf16_exceptions.names.megatron[0]",
        "rules[1]",
        "default",
    ]
    assert megatron_view.namespaces == frozenset({"megatron"})


def test_explain_a_name_no_family_knows_uses_the_name_alone() -> None:
    contract = make_contract(rules=MLA_CONTRACT["rules"], bf16_exceptions={"last_layers": 2})
    explanation = explain_name(contract, "decoder.layers.3.self_attention.custom_up_proj.weight", namespace="megatron")
    assert explanation.tensor.layer == 3
    assert explanation.tensor.role is Role.OTHER
    assert explanation.decision.format == "mxfp8"  # no name exception in this contract; rules[1] wins
    assert explanation.decision.rule == "rules[1]"
    assert explanation.notes == (
        "'decoder.layers.3.self_attention.custom_up_proj.weight' was described from its name alone: "
        "no model family recognises it (tensor `decoder.layers.3.self_attention.custom_up_proj.weight` is not a "
        "tensor of any supported family (deepseek_v3, glm4_moe, gpt_oss, llama, minimax_m2, mixtral, "
        "qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next)); it is treated "
        "as a GEMM weight of unknown role, matched as a Megatron name only (pass a model for the full picture)",
        "bf16_exceptions.last_layers was not evaluated: the model's layer count is unknown "
        "(pass a model to include it)",
    )


def test_explain_without_a_model_uses_the_families() -> None:
    explanation = explain_name(make_contract(**MLA_CONTRACT), "model.layers.2.self_attn.kv_b_proj.weight")
    assert explanation.tensor.role is Role.MLA_PROJECTION
    assert explanation.tensor.megatron_name == "decoder.layers.2.self_attention.linear_kv_up_proj.weight"
    assert explanation.namespaces == frozenset({"hf", "megatron"})
    assert explanation.winner.rule == "bf16_exceptions.names.hf[0]"
    assert explanation.notes == ()


def test_explain_names_no_family_knows_fall_back_with_the_reason() -> None:
    explanation = explain_name(make_contract(), "model.layers.1.custom.weight")
    assert explanation.namespaces == frozenset({"hf"})
    assert explanation.notes[0].startswith(
        "'model.layers.1.custom.weight' was described from its name alone: no model family recognises it "
        "(tensor `model.layers.1.custom.weight` is not a tensor of any supported family"
    )


def test_a_bare_name_without_the_model_is_refused() -> None:
    with pytest.raises(MappingError) as info:
        make_contract().explain("model.layers.1.mlp.up_proj.weight")
    assert info.value.message == (
        "tensor 'model.layers.1.mlp.up_proj.weight' is only a name: without the model it belongs to, the "
        "contract cannot tell its role, layer or Megatron name"
    )


def test_a_described_tensor_carries_the_callers_notes() -> None:
    tensor = TensorInfo("model.layers.1.mlp.up_proj.weight", layer=1, gemm_weight=True)
    explanation = make_contract().explain(tensor, notes=("described by hand",))
    assert explanation.notes == ("described by hand",)
    assert explanation.num_layers is None


def test_explanation_to_json_is_plain_data(toy_mla: ModelInventory) -> None:
    data = make_contract(**MLA_CONTRACT).explain("model.layers.0.mlp.up_proj.weight", toy_mla).to_json()
    assert data == {
        "tensor": "model.layers.0.mlp.up_proj.weight",
        "megatron_name": "decoder.layers.0.mlp.linear_fc1.weight",
        "role": "dense_mlp",
        "layer": 0,
        "is_mtp": False,
        "gemm_weight": True,
        "num_layers": 4,
        "namespaces": ["hf", "megatron"],
        "format": "mxfp8",
        "rule": "rules[0]",
        "reason": "mxfp8 from rules[0]: hf glob '*'; the most specific of 2 matching rules",
        "fused_group": "model.layers.0.mlp.gate_up",
        "matched": [
            {"rule": "rules[0]", "format": "mxfp8", "detail": "hf glob '*'"},
            {"rule": "rules[1]", "format": "mxfp8", "detail": "megatron glob '*'"},
            {"rule": "default", "format": "bf16", "detail": "the contract default"},
        ],
        "notes": [],
    }
