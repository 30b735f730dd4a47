"""``contract check``: one test per finding code, with and without a model."""

from __future__ import annotations

import dataclasses

from contract.helpers import make_contract, rule

from fp4convert.contract.lint import Finding, lint
from fp4convert.inventory import ModelInventory, Role, TensorInfo


def _codes(findings: tuple[Finding, ...]) -> list[tuple[str, str]]:
    return [(f.severity, f.code) for f in findings]


def _only(findings: tuple[Finding, ...], code: str) -> Finding:
    matching = [f for f in findings if f.code == code]
    assert len(matching) == 1, _codes(findings)
    return matching[0]


# --- the contract alone ------------------------------------------------------------------------


def test_a_plain_contract_is_clean() -> None:
    assert lint(make_contract()) == ()


def test_per_token_scales_need_an_etp_size() -> None:
    findings = lint(make_contract(formats={"nvfp4": {"per_token_activations": True}}))
    finding = _only(findings, "per-token-without-etp")
    assert finding.severity == "error"
    assert finding.message == "NVFP4 per-token activation scales are on but expert_tensor_parallel_size is unset"
    fixed = make_contract(formats={"nvfp4": {"per_token_activations": True}}, expert_tensor_parallel_size=1)
    assert lint(fixed) == ()


def test_megatron_rule_on_a_parameter_name_can_never_match() -> None:
    contract = make_contract(rules=[rule("*.mlp.experts.linear_fc1.weight", "nvfp4", namespace="megatron")])
    finding = _only(lint(contract), "rule-cannot-match")
    assert (finding.severity, finding.rule) == ("error", "rules[0]")
    assert finding.message == (
        "rules[0] (megatron glob '*.mlp.experts.linear_fc1.weight') ends in a parameter name; "
        "Megatron rules match module paths"
    )
    assert finding.hint == "drop the last component: '*.mlp.experts.linear_fc1'"


def test_hf_exact_rule_naming_a_module_is_a_warning() -> None:
    contract = make_contract(rules=[rule("model.layers.0.mlp.down_proj", "bf16", kind="exact")])
    finding = _only(lint(contract), "rule-cannot-match")
    assert finding.severity == "warning"


def test_duplicate_rules() -> None:
    agreeing = make_contract(rules=[rule("*", "bf16"), rule("*", "bf16")])
    assert _codes(lint(agreeing)) == [("warning", "duplicate-rule")]
    conflicting = make_contract(rules=[rule("*", "bf16"), rule("*", "mxfp8")])
    finding = _only(lint(conflicting), "duplicate-rule")
    assert finding.severity == "error"
    assert (
        finding.message == "rules[1] repeats the pattern of rules[0] (hf glob '*') with another format (bf16 vs mxfp8)"
    )


def test_mla_probe_without_a_model() -> None:
    finding = _only(lint(make_contract(rules=[rule("*", "mxfp8")])), "mla-1d-blocks")
    assert finding.severity == "warning"
    assert finding.message == (
        "on an MLA model (DeepSeek naming) kv_b_proj / linear_kv_up_proj would be mxfp8 with 1-D blocks (rules[0])"
    )
    two_d = make_contract(rules=[rule("*", "nvfp4")], formats={"nvfp4": {"tile": "16x16"}})
    assert lint(two_d) == ()
    excepted = make_contract(rules=[rule("*", "mxfp8")], bf16_exceptions={"names": {"hf": [".kv_b_proj."]}})
    assert lint(excepted) == ()


# --- against a model ---------------------------------------------------------------------------


def test_uncovered_tensors_are_grouped(toy_moe: ModelInventory) -> None:
    contract = make_contract(rules=[rule("*.mlp.experts.*", "nvfp4")], default=None)
    finding = _only(lint(contract, toy_moe), "uncovered-tensor")
    # q, k, v, o and the router of 4 layers, and lm_head (routers and lm_head are bf16 exceptions,
    # so they are covered): 4 x 4 = 16 attention weights.
    assert len(finding.tensors) == 16
    assert finding.message.startswith(
        "model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.k_proj.weight, "
        "model.layers.0.self_attn.v_proj.weight, ... (16 tensors): no rule covers GEMM weight"
    )


def test_ambiguous_rules_on_a_model(toy_moe: ModelInventory) -> None:
    contract = make_contract(rules=[rule("*.experts.*", "nvfp4"), rule("*.layers.0*", "mxfp8")])
    finding = _only(lint(contract, toy_moe), "ambiguous-rules")
    assert len(finding.tensors) == 12  # the experts of layer 0, matched by both
    assert finding.rule == "rules[1]"


def test_dead_rules(toy_moe: ModelInventory) -> None:
    contract = make_contract(
        rules=[
            rule("*.mlp.experts.*", "nvfp4"),
            rule("*.mlp.shared_experts.*", "nvfp4"),
            rule("*.mlp.gate.*", "mxfp8"),
        ]
    )
    findings = lint(contract, toy_moe)
    assert _codes(findings) == [("warning", "rule-never-matches"), ("warning", "rule-always-overridden")]
    assert findings[0].rule == "rules[1]"
    assert findings[1].message == ("rules[2] (hf glob '*.mlp.gate.*') matches tensors, but none of them gets mxfp8")


def test_mirrored_rules_are_not_dead(toy_moe: ModelInventory) -> None:
    contract = make_contract(
        rules=[
            rule("*.mlp.experts.*", "nvfp4"),
            rule("*.mlp.experts.linear_fc*", "nvfp4", namespace="megatron"),
        ]
    )
    assert lint(contract, toy_moe) == ()


def test_shapes_not_divisible_by_the_block(toy_moe: ModelInventory) -> None:
    odd = TensorInfo(
        "model.layers.0.mlp.experts.9.down_proj.weight",
        (64, 40),
        role=Role.ROUTED_EXPERT,
        layer=0,
        gemm_weight=True,
    )
    tall = TensorInfo(
        "model.layers.0.mlp.experts.9.up_proj.weight",
        (40, 64),
        role=Role.ROUTED_EXPERT,
        layer=0,
        gemm_weight=True,
    )
    inventory = dataclasses.replace(toy_moe, tensors=(*toy_moe.tensors, odd, tall))
    finding = _only(lint(make_contract(), inventory), "shape-not-divisible")
    assert finding.tensors == (odd.name,)
    assert finding.message == (
        "model.layers.0.mlp.experts.9.down_proj.weight: shape (64, 40) does not divide into nvfp4 1x16 blocks"
    )
    two_d = lint(make_contract(formats={"nvfp4": {"tile": "16x16"}}), inventory)
    assert _only(two_d, "shape-not-divisible").tensors == (odd.name, tall.name)


def test_unknown_shapes_are_reported_not_assumed(toy_moe: ModelInventory) -> None:
    shapeless = dataclasses.replace(toy_moe, tensors=tuple(dataclasses.replace(t, shape=()) for t in toy_moe))
    finding = _only(lint(make_contract(), shapeless), "shape-unknown")
    assert finding.message == "48 quantized tensors have no shape; block divisibility was not checked"


def test_mla_projection_with_1d_blocks(toy_mla: ModelInventory) -> None:
    findings = lint(
        make_contract(rules=[rule("*", "mxfp8")], default=None, bf16_exceptions={"shared_experts": False}),
        toy_mla,
    )
    finding = _only(findings, "mla-1d-blocks")
    assert finding.severity == "error"
    assert len(finding.tensors) == 5  # four decoder layers and the MTP layer


def test_fused_siblings_with_different_formats(toy_moe: ModelInventory) -> None:
    contract = make_contract(
        rules=[rule("*.mlp.experts.*", "nvfp4"), rule(r".*\.up_proj\.weight", "mxfp8", kind="regex")]
    )
    finding = _only(lint(contract, toy_moe), "fused-format-mismatch")
    assert len(finding.tensors) == 16  # every expert's gate_up group in 4 layers
    assert finding.tensors[0] == "model.layers.0.mlp.experts.0.gate_up"


def test_hf_and_megatron_views_must_agree(toy_moe: ModelInventory) -> None:
    contract = make_contract(
        rules=[
            rule("*.mlp.experts.*", "nvfp4"),
            rule("*.mlp.experts.linear_fc1", "nvfp4", namespace="megatron"),
        ]
    )
    finding = _only(lint(contract, toy_moe), "namespace-disagreement")
    assert finding.severity == "error"
    assert len(finding.tensors) == 16  # every down_proj: linear_fc2 has no Megatron rule
    assert finding.message == (
        "model.layers.0.mlp.experts.0.down_proj.weight, model.layers.0.mlp.experts.1.down_proj.weight, "
        "model.layers.0.mlp.experts.2.down_proj.weight, ... (16 tensors): HF rules give nvfp4 (rules[0]), "
        "Megatron rules give bf16 (default)"
    )
