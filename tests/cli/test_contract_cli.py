"""``fp4convert contract check|schema|emit``: exit codes and exact output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from contract.helpers import CONTRACTS, SEED_ENVIRONMENT, TOY_MLA, TOY_MOE

from fp4convert.cli import cli, main
from fp4convert.contract import Contract

PER_TOKEN = str(CONTRACTS / "nvfp4-experts-per-token.yaml")
MXFP8 = str(CONTRACTS / "mxfp8-end-to-end.yaml")


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_check_a_clean_contract() -> None:
    code, out, _ = _run("contract", "check", PER_TOKEN, "--model", str(TOY_MOE))
    assert code == 0
    assert out == (
        f"{PER_TOKEN}: contract 'nvfp4-experts-per-token' (sha256 612daf1c849378e0) on toy_qwen3_moe "
        "(4 layers, 87 tensors): 0 error(s), 0 warning(s)\n"
    )


def test_check_warnings_exit_zero_and_errors_exit_one() -> None:
    code, out, _ = _run("contract", "check", MXFP8)
    assert code == 0
    assert out == (
        "warning[mla-1d-blocks]: on an MLA model (DeepSeek naming) kv_b_proj / linear_kv_up_proj would be "
        "mxfp8 with 1-D blocks (rules[0])\n"
        "  hint: keep it bf16: add '.kv_b_proj.' to bf16_exceptions.names.hf and '.linear_kv_up_proj', "
        "'.linear_k_up_proj', '.linear_v_up_proj' to bf16_exceptions.names.megatron\n"
        f"{MXFP8}: contract 'mxfp8-end-to-end' (sha256 345e409c95f3f94f): 0 error(s), 1 warning(s)\n"
    )
    code, out, _ = _run("contract", "check", MXFP8, "--model", str(TOY_MLA))
    assert code == 1
    assert out.splitlines()[0] == (
        "error[mla-1d-blocks]: model.layers.0.self_attn.kv_b_proj.weight, "
        "model.layers.1.self_attn.kv_b_proj.weight, model.layers.2.self_attn.kv_b_proj.weight, "
        "... (5 tensors): MLA projection gets mxfp8 1-D blocks but is used with two contraction axes"
    )
    assert out.splitlines()[-1].endswith(
        "on toy_deepseek_v3 (4 + 1 MTP layers, 123 tensors): 1 error(s), 0 warning(s)"
    )


def test_check_json() -> None:
    code, out, _ = _run("contract", "check", MXFP8, "--model", str(TOY_MLA), "--json")
    assert code == 1
    report = json.loads(out)
    assert (report["contract"], report["errors"], report["warnings"]) == ("mxfp8-end-to-end", 1, 0)
    assert report["model"] == "toy_deepseek_v3 (4 + 1 MTP layers, 123 tensors)"
    assert report["findings"][0]["code"] == "mla-1d-blocks"
    assert len(report["findings"][0]["tensors"]) == 5
    assert len(report["sha256"]) == 64


def test_bad_contract_is_one_line_on_stderr_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(PER_TOKEN).read_text().replace("    tile: 1x16", "    tile: 1x32"))
    with pytest.raises(SystemExit) as exit_info:
        main(["contract", "check", str(bad)])
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error[contract]: {bad}:12: formats.nvfp4.tile: found '1x32', expected '1x16' or '16x16'\n"
        "  hint: use one of 1x16, 16x16\n"
    )


def test_schema_is_the_model_schema() -> None:
    code, out, _ = _run("contract", "schema")
    assert code == 0
    assert json.loads(out) == Contract.model_json_schema()


def test_emit_env_prints_the_seed_environment() -> None:
    code, out, err = _run("contract", "emit", PER_TOKEN, "--target", "env")
    assert (code, err) == (0, "")
    assert out == SEED_ENVIRONMENT


def test_emit_notes_go_to_stderr() -> None:
    code, out, err = _run("contract", "emit", PER_TOKEN, "--target", "sglang-args")
    assert code == 0
    assert out == "--quantization modelopt_fp4\n--kv-cache-dtype bf16\n"
    assert err == (
        "note: SGLang has no flag for the expert-tensor-parallel size: launch it so that its expert TP is 1, "
        "like the learner's\n"
        "note: per-token NVFP4 activations are switched on by the environment (`--target env`)\n"
    )


def test_emit_uses_the_model_for_layer_counts(capsys: pytest.CaptureFixture[str]) -> None:
    last15 = str(CONTRACTS / "nvfp4-experts-per-token-last15pct-bf16.yaml")
    code, out, _ = _run("contract", "emit", last15, "--target", "megatron-args", "--model", str(TOY_MOE))
    assert code == 0
    assert "--num-layers-at-end-in-bf16 1\n" in out
    with pytest.raises(SystemExit):
        main(["contract", "emit", last15, "--target", "megatron-args"])
    assert capsys.readouterr().err == (
        "error[contract]: contract 'nvfp4-experts-per-token-last15pct-bf16': a fractional first/last layer "
        "count depends on the model's layer count\n"
        "  hint: give the model: --model CONFIG_OR_DIR, or num_layers= (and num_mtp_layers=) in Python\n"
    )


def test_emit_refuses_an_unknown_target() -> None:
    code, _, err = _run("contract", "emit", PER_TOKEN, "--target", "trtllm-args")
    assert code == 2
    assert "Invalid value for '--target': 'trtllm-args' is not one of" in err
