"""export_plan: the converter's decisions, a live update's outputs, groups and EP placement."""

from __future__ import annotations

import pytest
from _helpers import NVFP4_EXPERTS

from fp4convert.checkpoint import inventory_from_checkpoint
from fp4convert.contract import load_contract
from fp4convert.errors import ConversionError, MappingError
from fp4convert.megatron import export_plan


@pytest.mark.parametrize(
    ("key", "contract"), [("qwen3_moe", NVFP4_EXPERTS), ("deepseek_v3", "deepseek-v3-mxfp8-mla-bf16")]
)
def test_decisions_are_the_converters(key, contract, tiny_checkpoint, model):
    _, config = model(key)
    plan = export_plan(contract=contract, config=config)
    converter = load_contract(contract).decide_all(inventory_from_checkpoint(tiny_checkpoint(key)))
    assert sorted(plan.items) == sorted(converter)
    for name, decision in converter.items():
        mine = plan.items[name].decision
        assert (mine.format, mine.rule, mine.fused_group) == (decision.format, decision.rule, decision.fused_group)


def test_live_updates_carry_no_input_scale_unless_asked(model):
    _, config = model("qwen3_moe")
    name = "model.layers.0.mlp.experts.3.gate_proj.weight"
    live = export_plan(contract=NVFP4_EXPERTS, config=config).item(name)
    full = export_plan(contract=NVFP4_EXPERTS, config=config, include_input_scale=True).item(name)
    module = name.removesuffix(".weight")
    assert [o[0] for o in live.outputs] == [f"{module}.weight", f"{module}.weight_scale", f"{module}.weight_scale_2"]
    assert [o[0] for o in full.outputs] == [o[0] for o in live.outputs] + [f"{module}.input_scale"]
    assert [o[1:] for o in live.outputs] == [("U8", (32, 32)), ("F8_E4M3", (32, 4)), ("F32", ())]


def test_groups_and_members(model):
    _, config = model("deepseek_v3")
    plan = export_plan(contract="tests/megatron/data/deepseek-nvfp4-mla-bf16.yaml", config=config)
    q_a = plan.item("model.layers.1.self_attn.q_a_proj.weight")
    assert plan.members(q_a) == (
        "model.layers.1.self_attn.q_a_proj.weight",
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
    )
    assert plan.members(plan.item("model.layers.1.self_attn.o_proj.weight")) == (
        "model.layers.1.self_attn.o_proj.weight",
    )
    # the last layer is BF16 under this contract: nothing there shares a scale
    assert not any(group.startswith("model.layers.2.") for group in plan.groups)


def test_plans_are_cached_per_arguments(model):
    _, config = model("qwen3_moe")
    first = export_plan(contract=NVFP4_EXPERTS, config=config)
    assert export_plan(contract=load_contract(NVFP4_EXPERTS), config=dict(config)) is first
    assert export_plan(contract=NVFP4_EXPERTS, config=config, dialect="compressed-tensors") is not first


def test_ep_placement(model):
    _, config = model("qwen3_moe")
    plan = export_plan(contract=NVFP4_EXPERTS, config=config)
    rank_one = {i.info.name for i in plan.expected(1, 2)}
    assert "model.layers.0.mlp.experts.2.up_proj.weight" in rank_one
    assert "model.layers.0.mlp.experts.1.up_proj.weight" not in rank_one
    assert "model.layers.0.self_attn.q_proj.weight" in rank_one  # replicated over EP
    assert plan.experts_per_rank(4) == 1
    with pytest.raises(MappingError, match=r"4 experts cannot be split over EP size 3"):
        plan.experts_per_rank(3)
    with pytest.raises(MappingError, match=r"EP rank 2 of size 2 is not a valid expert-parallel position"):
        plan.expected(2, 2)


@pytest.mark.parametrize("amax", [float("inf"), 1e39, float("nan"), 0.0, -1.0, True, "12"])
def test_a_calibration_that_no_float32_input_scale_can_hold_is_refused(amax, model):
    _, config = model("qwen3_moe")
    module = "model.layers.0.mlp.experts.3.gate_proj"
    with pytest.raises(ConversionError, match=rf"the activation amax of '{module}' is .*expected a positive number"):
        export_plan(contract=NVFP4_EXPERTS, config=config, include_input_scale=True, calibration={module: amax})
