"""The real models' shipped configs: `plan` totals against the published parameter counts, the shapes
and names that make each family what it is, and the shipped contracts linting clean on each of them.

Published figures count the main model (embedding and lm_head included) without MTP layers:
`plan` reports those as ``totals.decoder`` and the MTP layers apart (``totals.mtp_layers``). Where
a hub checkpoint holds MTP layers, the hub total is pinned too.
"""

from __future__ import annotations

import pytest

from fp4convert.contract import load_contract
from fp4convert.contract.lint import lint
from fp4convert.families import describe_name, inventory_from_config, load_config
from fp4convert.inventory import FusedKind, Role
from fp4convert.plan.footprint import build_plan

#: shipped config -> (family, published total parameters, exact main-model count fp4convert gives,
#: MTP-layer parameters). Sources: the model cards (GLM-4.5 355B / Air 106B; Qwen3-Next 80B;
#: gpt-oss 117B and 21B, whose cards give 116.83B / 20.91B; MiniMax-M2 230B; Kimi-K2 1.04T;
#: Mixtral 46.7B; Qwen1.5-MoE 14.3B).
PUBLISHED = {
    "GLM-4.5": ("glm4_moe", 355e9, 352_797_829_024, 5_539_962_272),
    "GLM-4.5-Air": ("glm4_moe", 106e9, 106_852_251_264, 3_616_573_568),
    "Qwen3-Next-80B-A3B-Instruct": ("qwen3_next", 80e9, 79_674_391_296, 1_650_471_424),
    "gpt-oss-120b": ("gpt_oss", 117e9, 116_829_156_672, 0),
    "gpt-oss-20b": ("gpt_oss", 21e9, 20_914_757_184, 0),
    "MiniMax-M2": ("minimax_m2", 230e9, 228_689_764_864, 0),
    "Kimi-K2-Instruct": ("deepseek_v3", 1.04e12, 1_026_408_232_448, 0),
    "Mixtral-8x7B-v0.1": ("mixtral", 46.7e9, 46_702_792_704, 0),
    "Qwen1.5-MoE-A2.7B": ("qwen2_moe", 14.3e9, 14_315_784_192, 0),
}

#: The MXFP8 contract for each model: MLA models (Kimi-K2 is DeepSeek-V3) keep kv_b_proj BF16.
MXFP8 = {name: "mxfp8-end-to-end" for name in PUBLISHED} | {"Kimi-K2-Instruct": "deepseek-v3-mxfp8-mla-bf16"}
NVFP4 = ["nvfp4-experts-per-token", "nvfp4-experts-per-token-dequantized-backward"]
NVFP4_LAST = "nvfp4-experts-per-token-last15pct-bf16"


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_counts_are_within_2_percent_of_the_published_count(name: str) -> None:
    family, published, main, mtp = PUBLISHED[name]
    inventory = inventory_from_config(name)
    counted = (sum(t.numel for t in inventory if not t.is_mtp), sum(t.numel for t in inventory if t.is_mtp))
    assert (inventory.family, counted) == (family, (main, mtp))
    print(f"{name}: {main:,} parameters vs published {published:,.0f} ({100 * (main / published - 1):+.2f}%)")
    assert abs(main / published - 1) < 0.02


@pytest.mark.parametrize("name", ["Mixtral-8x7B-v0.1", "gpt-oss-20b"])
def test_plan_reports_these_totals(name: str) -> None:
    # `plan` sums the inventory: decoder (embedding and lm_head included) apart from MTP layers.
    _, _, main, mtp = PUBLISHED[name]
    plan = build_plan(load_contract("nvfp4-experts-per-token"), inventory_from_config(name)).to_dict(tensors=False)
    assert (plan["totals"]["decoder"]["params"], plan["totals"]["mtp_layers"]["params"]) == (main, mtp)


def test_hub_totals_with_mtp_layers() -> None:
    # GLM-4.5's hub checkpoint is 358B (the 355B model plus MTP layer 92, which has its own copy of
    # the embedding and lm_head), GLM-4.5-Air's 110B, Qwen3-Next's 81B (MTP module without copies).
    hub = {name: (main + mtp) / 1e9 for name, (_, _, main, mtp) in PUBLISHED.items()}
    assert (round(hub["GLM-4.5"]), round(hub["GLM-4.5-Air"]), round(hub["Qwen3-Next-80B-A3B-Instruct"])) == (
        358,
        110,
        81,
    )


#: Expert-count and layer-count fields per family: the lint runs on each real config with fewer layers
#: and experts (same shapes, same kinds of tensors, same layer pattern), as linting 70k tensors four
#: times would dominate the suite.
_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


def _reduced(name: str) -> dict[str, object]:
    config = load_config(name)
    first_dense = int(config.get("first_k_dense_replace", 0))  # type: ignore[call-overload]
    layers = first_dense + 8
    config["num_hidden_layers"] = layers
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:layers]  # type: ignore[index]
    for key in _EXPERT_KEYS:
        if key in config:
            config[key] = 8
    return config


@pytest.mark.parametrize("name", PUBLISHED)
def test_shipped_contracts_lint_clean(name: str) -> None:
    inventory = inventory_from_config(_reduced(name))
    for contract in [*NVFP4, NVFP4_LAST, MXFP8[name]]:
        findings = lint(load_contract(contract), inventory)
        assert [(f.severity, f.code, f.message) for f in findings] == [], contract


@pytest.mark.parametrize("name", PUBLISHED)
def test_nvfp4_experts_contract_quantizes_exactly_the_routed_experts(name: str) -> None:
    inventory = inventory_from_config(_reduced(name))
    decisions = load_contract("nvfp4-experts-per-token").decide_all(inventory)
    by_name = inventory.by_name()
    quantized = {n for n, d in decisions.items() if d.format == "nvfp4"}
    routed = {t.name for t in inventory if t.role is Role.ROUTED_EXPERT and t.gemm_weight}
    assert quantized == routed and routed
    kept = {by_name[n].role for n, d in decisions.items() if d.format == "bf16" and by_name[n].gemm_weight}
    assert Role.ROUTED_EXPERT not in kept and Role.ROUTER in kept


def test_the_full_size_lint_agrees_with_the_reduced_one() -> None:
    # One real config at full size, so the reduction above hides nothing layer counts decide.
    findings = lint(load_contract(NVFP4_LAST), inventory_from_config("Qwen1.5-MoE-A2.7B"))
    assert list(findings) == []


def test_glm_structure() -> None:
    inventory = inventory_from_config("GLM-4.5")
    by_name = inventory.by_name()
    assert (inventory.num_layers, inventory.num_mtp_layers) == (92, 1)
    assert "model.layers.2.mlp.gate_proj.weight" in by_name  # first_k_dense_replace: 3
    assert "model.layers.3.mlp.experts.159.down_proj.weight" in by_name
    shared = by_name["model.layers.3.mlp.shared_experts.up_proj.weight"]
    assert (shared.shape, shared.role, shared.megatron_name) == (
        (1536, 5120),
        Role.SHARED_EXPERT,
        "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
    )
    bias = by_name["model.layers.3.self_attn.k_proj.bias"]
    assert (bias.shape, bias.megatron_name) == ((1024,), "decoder.layers.3.self_attention.linear_qkv.bias")
    assert "model.layers.3.self_attn.o_proj.bias" not in by_name
    assert by_name["model.layers.5.self_attn.q_norm.weight"].shape == (128,)
    assert "model.layers.5.self_attn.q_norm.weight" not in inventory_from_config("GLM-4.5-Air").by_name()
    correction = by_name["model.layers.3.mlp.gate.e_score_correction_bias"]
    assert (correction.dtype, correction.role, correction.megatron_name) == (
        "float32",
        Role.ROUTER,
        "decoder.layers.3.mlp.router.expert_bias",
    )
    mtp = by_name["model.layers.92.shared_head.head.weight"]
    assert (mtp.is_mtp, mtp.megatron_name) == (True, "output_layer.weight")
    inner = by_name["model.layers.92.mlp.experts.7.gate_proj.weight"]
    assert inner.megatron_name == "mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight7"


def test_kimi_k2_is_deepseek_v3_with_384_experts_one_dense_layer_and_64_heads() -> None:
    config = load_config("Kimi-K2-Instruct")
    assert (config["architectures"], config["model_type"]) == (["DeepseekV3ForCausalLM"], "kimi_k2")
    inventory = inventory_from_config(config)
    by_name = inventory.by_name()
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers) == ("deepseek_v3", 61, 0)
    assert "model.layers.0.mlp.gate_proj.weight" in by_name and "model.layers.1.mlp.gate_proj.weight" not in by_name
    assert "model.layers.1.mlp.experts.383.up_proj.weight" in by_name
    assert "model.layers.1.mlp.experts.384.up_proj.weight" not in by_name
    assert by_name["model.layers.1.mlp.gate.weight"].shape == (384, 7168)
    # 64 heads of (128 nope + 64 rope) query dims and (128 nope + 128 v) kv_b rows.
    assert by_name["model.layers.0.self_attn.q_b_proj.weight"].shape == (64 * 192, 1536)
    assert by_name["model.layers.0.self_attn.kv_b_proj.weight"].shape == (64 * 256, 512)


def test_gpt_oss_structure() -> None:
    by_name = inventory_from_config("gpt-oss-120b").by_name()
    sinks = by_name["model.layers.0.self_attn.sinks"]
    assert (sinks.shape, sinks.gemm_weight, sinks.megatron_name) == (
        (64,),
        False,
        "decoder.layers.0.self_attention.core_attention.softmax_offset",
    )
    gate = by_name["model.layers.35.mlp.experts.127.gate_proj.weight"]
    up_bias = by_name["model.layers.35.mlp.experts.127.up_proj.bias"]
    assert (gate.shape, gate.fused_kind, gate.fused_group) == (
        (2880, 2880),
        FusedKind.GATE_UP,
        "model.layers.35.mlp.experts.127.gate_up",
    )
    assert (up_bias.shape, up_bias.gemm_weight, up_bias.megatron_name) == (
        (2880,),
        False,
        "decoder.layers.35.mlp.experts.linear_fc1.bias127",
    )
    router_bias = by_name["model.layers.0.mlp.router.bias"]
    assert (router_bias.role, router_bias.megatron_name) == (Role.ROUTER, "decoder.layers.0.mlp.router.bias")
    assert by_name["model.layers.0.self_attn.o_proj.bias"].shape == (2880,)


def test_mixtral_and_minimax_experts_are_w1_w3_w2() -> None:
    by_name = inventory_from_config("Mixtral-8x7B-v0.1").by_name()
    w1, w3 = (by_name[f"model.layers.31.block_sparse_moe.experts.7.{w}.weight"] for w in ("w1", "w3"))
    assert w1.fused_group == w3.fused_group == "model.layers.31.block_sparse_moe.experts.7.gate_up"
    assert w1.megatron_name == "decoder.layers.31.mlp.experts.linear_fc1.weight7"
    assert by_name["model.layers.31.block_sparse_moe.experts.7.w2.weight"].shape == (4096, 14336)
    assert by_name["model.layers.0.block_sparse_moe.gate.weight"].role is Role.ROUTER
    minimax = inventory_from_config("MiniMax-M2").by_name()
    assert minimax["model.layers.0.self_attn.q_norm.weight"].shape == (48 * 128,)  # full width, not per head
    assert minimax["model.layers.0.self_attn.k_norm.weight"].shape == (8 * 128,)
    assert minimax["model.layers.61.block_sparse_moe.e_score_correction_bias"].megatron_name == (
        "decoder.layers.61.mlp.router.expert_bias"
    )


def test_qwen2_moe_shared_expert_and_gate() -> None:
    by_name = inventory_from_config("Qwen1.5-MoE-A2.7B").by_name()
    shared = by_name["model.layers.0.mlp.shared_expert.down_proj.weight"]
    assert (shared.shape, shared.role) == ((2048, 5632), Role.SHARED_EXPERT)
    gate = by_name["model.layers.0.mlp.shared_expert_gate.weight"]
    assert (gate.shape, gate.role, gate.megatron_name) == (
        (1, 2048),
        Role.ROUTER,
        "decoder.layers.0.mlp.shared_experts.gate_weight",
    )
    assert by_name["model.layers.0.self_attn.q_proj.bias"].shape == (2048,)
    assert "model.layers.23.mlp.experts.59.gate_proj.weight" in by_name


def test_qwen3_next_layer_pattern_and_mtp_module() -> None:
    inventory = inventory_from_config("Qwen3-Next-80B-A3B-Instruct")
    by_name = inventory.by_name()
    full = sorted({t.layer for t in inventory if ".self_attn." in t.name and not t.is_mtp})
    assert full == list(range(3, 48, 4))  # full_attention_interval: 4
    assert by_name["model.layers.0.linear_attn.in_proj_qkvz.weight"].shape == (2 * 2048 + 2 * 4096, 2048)
    assert by_name["model.layers.0.linear_attn.in_proj_ba.weight"].shape == (64, 2048)
    assert by_name["model.layers.0.linear_attn.conv1d.weight"].shape == (8192, 1, 4)
    assert by_name["model.layers.3.self_attn.q_proj.weight"].shape == (2 * 16 * 256, 2048)
    assert (inventory.num_mtp_layers, by_name["mtp.fc.weight"].shape) == (1, (2048, 4096))
    assert by_name["mtp.layers.0.mlp.experts.511.down_proj.weight"].layer == 48


def test_a_megatron_name_without_a_model_takes_the_first_family_spelling() -> None:
    # Mixtral spells routed experts w1/w3/w2 under block_sparse_moe, Qwen3-MoE gate/up/down under mlp.
    info = describe_name("decoder.layers.0.mlp.experts.linear_fc2.weight5")
    assert (info.name, info.role, info.expert) == (
        "model.layers.0.mlp.experts.5.down_proj.weight",
        Role.ROUTED_EXPERT,
        5,
    )
    mixtral = describe_name("decoder.layers.0.mlp.experts.linear_fc2.weight5", family="mixtral")
    assert mixtral.name == "model.layers.0.block_sparse_moe.experts.5.w2.weight"
