"""``fp4convert explain FILE TENSOR_NAME``: exact output."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from contract.helpers import CONTRACTS, TOY_MLA

from fp4convert.cli import cli, main

DEEPSEEK = str(CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml")


def test_explain_an_hf_name_in_a_model() -> None:
    result = CliRunner().invoke(
        cli, ["explain", DEEPSEEK, "model.layers.2.self_attn.kv_b_proj.weight", "--model", str(TOY_MLA)]
    )
    assert result.exit_code == 0
    assert result.stdout == (
        "tensor    model.layers.2.self_attn.kv_b_proj.weight\n"
        "megatron  decoder.layers.2.self_attention.linear_kv_up_proj.weight\n"
        "role      mla_projection, layer 2\n"
        "format    bf16\n"
        "reason    bf16 from bf16_exceptions.names.hf[0]: HF name contains '.kv_b_proj.'\n"
        "matched, in precedence order (* won):\n"
        "  * bf16_exceptions.names.hf[0]        bf16   HF name contains '.kv_b_proj.'\n"
        "    bf16_exceptions.names.megatron[0]  bf16   Megatron name contains '.linear_kv_up_proj'\n"
        "    rules[0]                           mxfp8  'all_linears_mxfp8': hf glob '*'\n"
        "    rules[1]                           mxfp8  'all_linear_modules_mxfp8': megatron glob '*'\n"
    )


def test_explain_a_megatron_name_of_fused_siblings() -> None:
    result = CliRunner().invoke(
        cli, ["explain", DEEPSEEK, "decoder.layers.0.mlp.linear_fc1.weight", "--model", str(TOY_MLA)]
    )
    assert result.exit_code == 0
    assert result.stdout == (
        "tensor    model.layers.0.mlp.gate_proj.weight\n"
        "megatron  decoder.layers.0.mlp.linear_fc1.weight\n"
        "role      dense_mlp, layer 0\n"
        "fused     model.layers.0.mlp.gate_up (gate_up; one outer scale for the group)\n"
        "format    mxfp8\n"
        "reason    mxfp8 from rules[0]: 'all_linears_mxfp8': hf glob '*'; "
        "the most specific of 2 matching rules\n"
        "matched, in precedence order (* won):\n"
        "  * rules[0]  mxfp8  'all_linears_mxfp8': hf glob '*'\n"
        "    rules[1]  mxfp8  'all_linear_modules_mxfp8': megatron glob '*'\n"
        "note: Megatron tensor 'decoder.layers.0.mlp.linear_fc1.weight' holds 2 HF tensors "
        "(model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj.weight); explained the first\n"
    )


def test_explain_mtp_layer_json() -> None:
    result = CliRunner().invoke(
        cli, ["explain", DEEPSEEK, "mtp.layers.0.eh_proj.weight", "--model", str(TOY_MLA), "--json"]
    )
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert (data["tensor"], data["format"], data["rule"]) == (
        "model.layers.4.eh_proj.weight",
        "bf16",
        "bf16_exceptions.mtp_layers",
    )
    assert data["is_mtp"] is True


def test_explain_a_bare_name_the_families_know() -> None:
    result = CliRunner().invoke(cli, ["explain", DEEPSEEK, "decoder.layers.2.self_attention.linear_kv_up_proj.weight"])
    assert result.exit_code == 0
    assert result.stdout == (
        "tensor    model.layers.2.self_attn.kv_b_proj.weight\n"
        "megatron  decoder.layers.2.self_attention.linear_kv_up_proj.weight\n"
        "role      mla_projection, layer 2\n"
        "format    bf16\n"
        "reason    bf16 from bf16_exceptions.names.hf[0]: HF name contains '.kv_b_proj.'\n"
        "matched, in precedence order (* won):\n"
        "  * bf16_exceptions.names.hf[0]        bf16   HF name contains '.kv_b_proj.'\n"
        "    bf16_exceptions.names.megatron[0]  bf16   Megatron name contains '.linear_kv_up_proj'\n"
        "    rules[0]                           mxfp8  'all_linears_mxfp8': hf glob '*'\n"
        "    rules[1]                           mxfp8  'all_linear_modules_mxfp8': megatron glob '*'\n"
    )


def test_explain_a_bare_name_no_family_knows() -> None:
    name = "decoder.layers.2.self_attention.linear_kv_up_proj_extra.weight"
    result = CliRunner().invoke(cli, ["explain", DEEPSEEK, name, "--namespace", "megatron"])
    assert result.exit_code == 0
    assert result.stdout == (
        f"tensor    {name}\n"
        "role      other, layer 2\n"
        "format    bf16\n"
        "reason    bf16 from bf16_exceptions.names.megatron[0]: Megatron name contains '.linear_kv_up_proj'\n"
        "matched, in precedence order (* won):\n"
        "  * bf16_exceptions.names.megatron[0]  bf16   Megatron name contains '.linear_kv_up_proj'\n"
        "    rules[1]                           mxfp8  'all_linear_modules_mxfp8': megatron glob '*'\n"
        f"note: '{name}' was described from its name alone: no model family recognises it (tensor `{name}` is "
        "not a tensor of any supported family (deepseek_v3, glm4_moe, gpt_oss, llama, minimax_m2, mixtral, "
        "qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next)); "
        "it is treated as a GEMM weight of unknown role, "
        "matched as a Megatron name only (pass a model for the full picture)\n"
    )


def test_explain_an_unknown_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", DEEPSEEK, "model.layers.2.self_attn.kv_b_prj.weight", "--model", str(TOY_MLA)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error[mapping]: tensor 'model.layers.2.self_attn.kv_b_prj.weight' is not in the model "
        "(123 tensors, family toy_deepseek_v3)\n"
        "  hint: did you mean 'model.layers.2.self_attn.kv_b_proj.weight', "
        "'model.layers.4.self_attn.kv_b_proj.weight', 'model.layers.3.self_attn.kv_b_proj.weight'?\n"
    )
