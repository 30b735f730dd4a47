"""``contract emit``: exact output for every shipped contract and target, and what cannot be emitted."""

from __future__ import annotations

import fnmatch

import pytest
import yaml
from contract.helpers import CONTRACTS, SEED_ENVIRONMENT, SHIPPED, make_contract, rule

from fp4convert.contract import load_contract
from fp4convert.contract.emit import TARGETS, emit
from fp4convert.contract.resolve import decide_all, megatron_module_path
from fp4convert.errors import ContractError
from fp4convert.inventory import ModelInventory

TE_HEADER = (
    "# TransformerEngine precision config from fp4convert contract '{name}' (sha256 {hash}).\n"
    "# Matchers are tried in order and the first match wins: the contract's precedence, flattened.\n"
)
HF_RULES_COMMENT = "# HF-namespace rules (rules[0]) apply to checkpoint names, not here.\n"
TE_CONFIGS = {
    "nvfp4": "  nvfp4: {transformer_engine_config_type: TEQuantizationParams, "
    "training_recipe: {fp4_quantization_recipe: nvfp4}}\n",
    "mxfp8": "  mxfp8: {transformer_engine_config_type: TEQuantizationParams, "
    "training_recipe: {fp8_quantization_recipe: mxfp8}}\n",
    "bf16": "  bf16: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}\n",
}
# The TE file of the per-token recipe (docs/recipe.md): routed experts' fc1/fc2 NVFP4, everything else BF16.
PER_TOKEN_TE_BODY = (
    "configs:\n" + TE_CONFIGS["nvfp4"] + TE_CONFIGS["bf16"] + "matchers:\n"
    "  routed_experts_fc1_nvfp4: {type: glob, enabled: true, "
    'pattern: "*.mlp.experts.linear_fc1", config: nvfp4}\n'
    "  routed_experts_fc2_nvfp4: {type: glob, enabled: true, "
    'pattern: "*.mlp.experts.linear_fc2", config: nvfp4}\n'
    '  default_bf16: {type: glob, enabled: true, pattern: "*", config: bf16}\n'
)
PER_TOKEN_MEGATRON = (
    "--fp4-format e2m1\n"
    "--fp4-recipe nvfp4\n"
    "--extra-high-precision-layers-hf .shared_experts. .shared_expert.\n"
    "--extra-high-precision-layers-megatron .shared_experts.\n"
    "--expert-tensor-parallel-size 1\n"
)
NVFP4_SGLANG = "--quantization modelopt_fp4\n--kv-cache-dtype bf16\n"
MXFP8_SGLANG = "--quantization mxfp8\n--kv-cache-dtype bf16\n"
MXFP8_MEGATRON = "--fp8-format e4m3\n--fp8-recipe mxfp8\n"

EXPECTED: dict[tuple[str, str], str] = {
    ("bf16-all", "te-yaml"): TE_HEADER.format(name="bf16-all", hash="ae8d7f6c93be419b")
    + HF_RULES_COMMENT
    + "configs:\n"
    + TE_CONFIGS["bf16"]
    + "matchers:\n"
    '  every_module_bf16: {type: glob, enabled: true, pattern: "*", config: bf16}\n',
    ("bf16-all", "megatron-args"): "",
    ("bf16-all", "sglang-args"): "--kv-cache-dtype bf16\n",
    ("bf16-all", "env"): "",
    ("deepseek-v3-mxfp8-mla-bf16", "te-yaml"): TE_HEADER.format(
        name="deepseek-v3-mxfp8-mla-bf16", hash="17ebd90b81f50c7a"
    )
    + HF_RULES_COMMENT
    + "configs:\n"
    + TE_CONFIGS["mxfp8"]
    + TE_CONFIGS["bf16"]
    + "matchers:\n"
    '  linear_kv_up_proj_bf16: {type: glob, enabled: true, pattern: "*.linear_kv_up_proj*", config: bf16}\n'
    '  linear_k_up_proj_bf16: {type: glob, enabled: true, pattern: "*.linear_k_up_proj*", config: bf16}\n'
    '  linear_v_up_proj_bf16: {type: glob, enabled: true, pattern: "*.linear_v_up_proj*", config: bf16}\n'
    '  routers_bf16: {type: glob, enabled: true, pattern: "*.mlp.router", config: bf16}\n'
    '  lm_head_bf16: {type: glob, enabled: true, pattern: "*output_layer", config: bf16}\n'
    '  mtp_layers_bf16: {type: glob, enabled: true, pattern: "*mtp.layers.*", config: bf16}\n'
    '  all_linear_modules_mxfp8: {type: glob, enabled: true, pattern: "*", config: mxfp8}\n',
    # with the toy DeepSeek-V3 (4 decoder layers, 1 MTP layer numbered 4 in HF names)
    ("deepseek-v3-mxfp8-mla-bf16", "megatron-args"): MXFP8_MEGATRON
    + "--extra-high-precision-layers-hf .kv_b_proj. model.layers.4.\n"
    "--extra-high-precision-layers-megatron .linear_kv_up_proj .linear_k_up_proj .linear_v_up_proj "
    "mtp.layers.\n",
    ("deepseek-v3-mxfp8-mla-bf16", "sglang-args"): MXFP8_SGLANG,
    ("deepseek-v3-mxfp8-mla-bf16", "env"): "NVTE_BACKWARD_OVERRIDE=high_precision\n",
    ("mxfp8-end-to-end", "te-yaml"): TE_HEADER.format(name="mxfp8-end-to-end", hash="345e409c95f3f94f")
    + HF_RULES_COMMENT
    + "configs:\n"
    + TE_CONFIGS["mxfp8"]
    + TE_CONFIGS["bf16"]
    + "matchers:\n"
    '  routers_bf16: {type: glob, enabled: true, pattern: "*.mlp.router", config: bf16}\n'
    '  lm_head_bf16: {type: glob, enabled: true, pattern: "*output_layer", config: bf16}\n'
    '  all_linear_modules_mxfp8: {type: glob, enabled: true, pattern: "*", config: mxfp8}\n',
    ("mxfp8-end-to-end", "megatron-args"): MXFP8_MEGATRON,
    ("mxfp8-end-to-end", "sglang-args"): MXFP8_SGLANG,
    ("mxfp8-end-to-end", "env"): "NVTE_BACKWARD_OVERRIDE=high_precision\n",
    ("nvfp4-experts-per-token", "te-yaml"): TE_HEADER.format(name="nvfp4-experts-per-token", hash="612daf1c849378e0")
    + HF_RULES_COMMENT
    + PER_TOKEN_TE_BODY,
    ("nvfp4-experts-per-token", "megatron-args"): PER_TOKEN_MEGATRON,
    ("nvfp4-experts-per-token", "sglang-args"): NVFP4_SGLANG,
    ("nvfp4-experts-per-token", "env"): SEED_ENVIRONMENT,
    ("nvfp4-experts-per-token-dequantized-backward", "te-yaml"): TE_HEADER.format(
        name="nvfp4-experts-per-token-dequantized-backward", hash="d4852e4a7deb261e"
    )
    + HF_RULES_COMMENT
    + PER_TOKEN_TE_BODY,
    ("nvfp4-experts-per-token-dequantized-backward", "megatron-args"): PER_TOKEN_MEGATRON,
    ("nvfp4-experts-per-token-dequantized-backward", "sglang-args"): NVFP4_SGLANG,
    ("nvfp4-experts-per-token-dequantized-backward", "env"): SEED_ENVIRONMENT.replace(
        "=high_precision", "=dequantized"
    ),
    ("nvfp4-experts-per-token-last15pct-bf16", "te-yaml"): TE_HEADER.format(
        name="nvfp4-experts-per-token-last15pct-bf16", hash="ae4b415144bad198"
    )
    + "# First/last-layer BF16 counts are not matchers: see `--target megatron-args`.\n"
    + HF_RULES_COMMENT
    + PER_TOKEN_TE_BODY,
    # with the toy Qwen3-MoE (4 layers): ceil(0.15 x 4) = 1
    ("nvfp4-experts-per-token-last15pct-bf16", "megatron-args"): "--fp4-format e2m1\n--fp4-recipe nvfp4\n"
    "--first-last-layers-bf16\n--num-layers-at-start-in-bf16 0\n--num-layers-at-end-in-bf16 1\n"
    "--extra-high-precision-layers-hf .shared_experts. .shared_expert.\n"
    "--extra-high-precision-layers-megatron .shared_experts.\n--expert-tensor-parallel-size 1\n",
    ("nvfp4-experts-per-token-last15pct-bf16", "sglang-args"): NVFP4_SGLANG,
    ("nvfp4-experts-per-token-last15pct-bf16", "env"): SEED_ENVIRONMENT,
}
# vllm-args: vLLM's KV-cache dtype, and its own per-token switch where the contract asks for per-token NVFP4
VLLM_PLAIN = "--kv-cache-dtype bfloat16\n"
VLLM_PER_TOKEN = VLLM_PLAIN + '--quantization-config \'{"moe": {"activation": "nvfp4_per_token"}}\'\n'
EXPECTED |= {
    (stem, "vllm-args"): VLLM_PER_TOKEN if stem.startswith("nvfp4-experts-per-token") else VLLM_PLAIN
    for stem in SHIPPED
}
MODEL_FOR = {"deepseek-v3-mxfp8-mla-bf16": (4, 1), "nvfp4-experts-per-token-last15pct-bf16": (4, 0)}


def test_every_shipped_contract_and_target_is_pinned() -> None:
    assert {(stem, target) for stem in SHIPPED for target in TARGETS} == set(EXPECTED)


@pytest.mark.parametrize(("stem", "target"), sorted(EXPECTED))
def test_emitted_text_is_exact(stem: str, target: str) -> None:
    num_layers, num_mtp = MODEL_FOR.get(stem, (None, 0))
    result = emit(load_contract(CONTRACTS / f"{stem}.yaml"), target, num_layers=num_layers, num_mtp_layers=num_mtp)  # type: ignore[arg-type]
    assert result.text == EXPECTED[(stem, target)]


def test_the_seed_recipe_emits_exactly_the_background_environment() -> None:
    text = emit(load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml"), "env").text
    assert text.splitlines() == SEED_ENVIRONMENT.splitlines()
    assert len(text.splitlines()) == 8
    assert "NVTE_BACKWARD_OVERRIDE=high_precision" in text.splitlines()


def test_env_switches_follow_the_recipe() -> None:
    contract = make_contract(formats={"nvfp4": {"tile": "16x16"}}, backward="dequantized")
    lines = emit(contract, "env").text.splitlines()
    assert "NVTE_NVFP4_DISABLE_2D_QUANTIZATION=0" in lines
    assert "NVTE_NVFP4_ROW_SCALED_ACTIVATION=0" in lines
    assert "SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=0" in lines
    assert "NVTE_BACKWARD_OVERRIDE=dequantized" in lines


@pytest.mark.parametrize("stem", [s for s in SHIPPED if s != "bf16-all"])
@pytest.mark.parametrize("model", ["toy_moe", "toy_mla"])
def test_te_yaml_read_the_way_te_reads_it_gives_the_contract_decisions(
    stem: str, model: str, request: pytest.FixtureRequest
) -> None:
    """Interpret the emitted file like TE (first matching fnmatch glob on the module path wins) and
    compare with the contract for every GEMM weight that layer counts do not decide."""
    inventory: ModelInventory = request.getfixturevalue(model)
    contract = load_contract(CONTRACTS / f"{stem}.yaml")
    te = yaml.safe_load(emit(contract, "te-yaml").text)
    matchers = [(m["pattern"], m["config"]) for m in te["matchers"].values() if m["enabled"]]
    compared = 0
    for name, decision in decide_all(contract, inventory).items():
        tensor = inventory.by_name()[name]
        if not tensor.gemm_weight or tensor.megatron_name is None or decision.rule.endswith("_layers"):
            continue
        module = megatron_module_path(tensor.megatron_name)
        te_format = next(config for pattern, config in matchers if fnmatch.fnmatchcase(module, pattern))
        assert te_format == decision.format, (name, module)
        compared += 1
    assert compared > 40


def test_te_yaml_needs_megatron_rules_and_globs() -> None:
    with pytest.raises(ContractError) as info:
        emit(make_contract(), "te-yaml")
    assert info.value.message == (
        "contract 'test' has no Megatron-namespace rule, and TransformerEngine only sees Megatron module paths"
    )
    regex = make_contract(rules=[rule(r".*\.linear_fc1", "nvfp4", kind="regex", namespace="megatron")])
    with pytest.raises(ContractError, match=r"^rules\[0\]: TransformerEngine matchers are globs"):
        emit(regex, "te-yaml")


def test_te_yaml_escapes_exact_rules() -> None:
    contract = make_contract(
        rules=[rule("decoder.layers.0.mlp.linear_fc1", "bf16", kind="exact", namespace="megatron")]
    )
    matchers = yaml.safe_load(emit(contract, "te-yaml").text)["matchers"]
    assert matchers["rule_0_bf16"]["pattern"] == "decoder.layers.0.mlp.linear_fc1"
    assert list(matchers) == ["rule_0_bf16", "default_bf16"]


def test_megatron_args_need_the_layer_count_for_fractions_and_mtp() -> None:
    last = make_contract(bf16_exceptions={"last_layers": {"fraction": 0.15, "rounding": "ceil"}})
    with pytest.raises(ContractError) as info:
        emit(last, "megatron-args")
    assert info.value.message == (
        "contract 'test': a fractional first/last layer count depends on the model's layer count"
    )
    assert info.value.hint == "give the model: --model CONFIG_OR_DIR, or num_layers= (and num_mtp_layers=) in Python"
    assert "--num-layers-at-end-in-bf16 10" in emit(last, "megatron-args", num_layers=61).text
    mtp = make_contract(bf16_exceptions={"mtp_layers": True})
    with pytest.raises(ContractError, match="keeping MTP layers bf16"):
        emit(mtp, "megatron-args")


def test_megatron_args_refuse_what_miles_cannot_do() -> None:
    with pytest.raises(ContractError) as info:
        emit(make_contract(bf16_exceptions={"routers": False}), "megatron-args")
    assert info.value.message == (
        "bf16_exceptions.routers is false, but Miles' converters and exporters never quantize it"
    )


def test_sglang_args_refuse_mixed_low_precision_formats() -> None:
    mixed = make_contract(rules=[rule("*.mlp.experts.*", "nvfp4"), rule("*", "mxfp8")])
    with pytest.raises(ContractError, match="mixes NVFP4 and MXFP8"):
        emit(mixed, "sglang-args")


def test_notes_say_what_the_target_cannot_carry() -> None:
    contract = load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml")
    assert emit(contract, "sglang-args").notes == (
        "SGLang has no flag for the expert-tensor-parallel size: launch it so that its expert TP is 1, "
        "like the learner's",
        "per-token NVFP4 activations are switched on by the environment (`--target env`)",
    )
    row = make_contract(formats={"nvfp4": {"weight_scale_scope": "row"}})
    assert emit(row, "env").notes[0].startswith("weight_scale_scope 'row' is applied by fp4convert's converter")
