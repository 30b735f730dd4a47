"""The shipped contracts in contracts/: each loads, lints clean, and decides what its name says."""

from __future__ import annotations

from collections import Counter

import pytest
from contract.helpers import CONTRACTS, SHIPPED

from fp4convert.contract import load_contract
from fp4convert.contract.lint import lint
from fp4convert.contract.resolve import decide_all
from fp4convert.inventory import ModelInventory, Role


def test_the_issue_s_recipes_are_all_shipped() -> None:
    assert SHIPPED == [
        "bf16-all",
        "deepseek-v3-mxfp8-mla-bf16",
        "mxfp8-end-to-end",
        "nvfp4-experts-per-token",
        "nvfp4-experts-per-token-dequantized-backward",
        "nvfp4-experts-per-token-last15pct-bf16",
    ]


@pytest.mark.parametrize("stem", SHIPPED)
def test_name_matches_file(stem: str) -> None:
    assert load_contract(CONTRACTS / f"{stem}.yaml").name == stem


@pytest.mark.parametrize("stem", SHIPPED)
def test_lint_alone(stem: str) -> None:
    codes = [(f.severity, f.code) for f in lint(load_contract(CONTRACTS / f"{stem}.yaml"))]
    # The generic MXFP8 contract says in its header that MLA models need the DeepSeek one.
    assert codes == ([("warning", "mla-1d-blocks")] if stem == "mxfp8-end-to-end" else [])


@pytest.mark.parametrize("stem", SHIPPED)
@pytest.mark.parametrize("model", ["toy_moe", "toy_mla"])
def test_lint_on_the_toy_models(stem: str, model: str, request: pytest.FixtureRequest) -> None:
    inventory: ModelInventory = request.getfixturevalue(model)
    findings = lint(load_contract(CONTRACTS / f"{stem}.yaml"), inventory)
    expected = [("error", "mla-1d-blocks")] if (stem, model) == ("mxfp8-end-to-end", "toy_mla") else []
    assert [(f.severity, f.code) for f in findings] == expected


def _low_precision_roles(stem: str, inventory: ModelInventory) -> Counter[tuple[str, str]]:
    decisions = decide_all(load_contract(CONTRACTS / f"{stem}.yaml"), inventory)
    by_name = inventory.by_name()
    return Counter((d.format, by_name[name].role.value) for name, d in decisions.items() if d.format != "bf16")


def test_per_token_experts_quantize_routed_experts_only(toy_mla: ModelInventory) -> None:
    # 3 MoE decoder layers and the MTP layer, 4 experts x (gate, up, down) each.
    expected = Counter({("nvfp4", "routed_expert"): 4 * 12})
    for stem in ("nvfp4-experts-per-token", "nvfp4-experts-per-token-dequantized-backward"):
        assert _low_precision_roles(stem, toy_mla) == expected
    contract = load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml")
    assert contract.formats.nvfp4.per_token_activations
    assert contract.backward == "high_precision"
    assert load_contract(CONTRACTS / "nvfp4-experts-per-token-dequantized-backward.yaml").backward == "dequantized"


def test_last_15_percent_are_bf16(toy_mla: ModelInventory) -> None:
    # ceil(0.15 x 4) = 1: decoder layer 3 is BF16; the MTP layer is not a decoder layer.
    assert _low_precision_roles("nvfp4-experts-per-token-last15pct-bf16", toy_mla) == Counter(
        {("nvfp4", "routed_expert"): 3 * 12}
    )
    decisions = decide_all(load_contract(CONTRACTS / "nvfp4-experts-per-token-last15pct-bf16.yaml"), toy_mla)
    assert decisions["model.layers.3.mlp.experts.0.up_proj.weight"].rule == "bf16_exceptions.last_layers"
    assert decisions["model.layers.4.mlp.experts.0.up_proj.weight"].format == "nvfp4"


def test_deepseek_contract_keeps_mla_and_mtp_bf16(toy_mla: ModelInventory) -> None:
    assert _low_precision_roles("deepseek-v3-mxfp8-mla-bf16", toy_mla) == Counter(
        {
            ("mxfp8", "attention"): 4 * 4,  # q_a, q_b, kv_a, o in the 4 decoder layers
            ("mxfp8", "dense_mlp"): 3,
            ("mxfp8", "routed_expert"): 3 * 12,
            ("mxfp8", "shared_expert"): 3 * 3,
        }
    )


def test_mxfp8_end_to_end_on_a_gqa_model(toy_moe: ModelInventory) -> None:
    roles = _low_precision_roles("mxfp8-end-to-end", toy_moe)
    assert roles == Counter({("mxfp8", "attention"): 4 * 4, ("mxfp8", "routed_expert"): 4 * 12})
    assert Role.ROUTER.value not in {role for _, role in roles}


def test_bf16_all_quantizes_nothing(toy_mla: ModelInventory) -> None:
    assert _low_precision_roles("bf16-all", toy_mla) == Counter()
