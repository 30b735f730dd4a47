"""The convert / verify / dequantize / demo commands: exit codes, exact messages, JSON output."""

from __future__ import annotations

import json

import pytest
from _helpers import NVFP4_EXPERTS
from click.testing import CliRunner

from fp4convert.cli import cli


def test_convert_json_then_verify_then_dequantize(tiny_checkpoint, tmp_path):
    runner = CliRunner()
    src = tiny_checkpoint("qwen3_moe")
    out = tmp_path / "out"
    result = runner.invoke(cli, ["convert", str(src), str(out), "--contract", "nvfp4-experts-per-token", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["dialect"] == "modelopt" and report["formats"]["nvfp4"] == 24
    assert report["contract"] == "nvfp4-experts-per-token"
    verified = runner.invoke(cli, ["verify", str(out), "--source", str(src)])
    assert verified.exit_code == 0 and verified.output.startswith("OK: ")
    back = runner.invoke(cli, ["dequantize", str(out), str(tmp_path / "bf16")])
    assert back.exit_code == 0
    assert back.output.startswith("dequantized 24 NVFP4 and 0 MXFP8 modules into ")


def test_human_output_names_what_was_done(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(
        cli, ["convert", str(tiny_checkpoint("qwen3_moe")), str(tmp_path / "o"), "--contract", str(NVFP4_EXPERTS)]
    )
    assert result.exit_code == 0
    assert result.output.startswith("converted 56 tensors (32 bf16, 24 nvfp4) with contract nvfp4-experts-per-token")
    assert result.output.rstrip().endswith("verified")


def _main(argv: list[str], capsys) -> tuple[int, str]:
    """Run the real entry point (with its error rendering); return (exit code, stderr)."""
    from fp4convert.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_refusal_is_one_error_with_a_hint(tiny_checkpoint, tmp_path, capsys):
    code, err = _main(
        [
            "convert",
            str(tiny_checkpoint("qwen3_moe")),
            str(tmp_path / "o"),
            "--contract",
            "nvfp4-experts-per-token",
            "--dialect",
            "sglang-mxfp8",
            "--quiet",
        ],
        capsys,
    )
    assert code == 1
    assert err.startswith("error[conversion]: conversion refused before writing anything (1 problems):")
    assert "hint: fix the contract, pick another dialect (--dialect), or keep the listed tensors in BF16" in err


def test_bad_shard_size_is_explained(tiny_checkpoint, tmp_path, capsys):
    code, err = _main(
        [
            "convert",
            str(tiny_checkpoint("qwen3_moe")),
            str(tmp_path / "o"),
            "--contract",
            "nvfp4-experts-per-token",
            "--max-shard-size",
            "lots",
        ],
        capsys,
    )
    assert code == 1
    assert err.startswith("error[conversion]: --max-shard-size 'lots' is not a size")


def test_demo_runs_end_to_end(tmp_path):
    result = CliRunner().invoke(cli, ["demo", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("source      tiny Qwen3-MoE (4 layers, 8 experts)")
    assert lines[3].startswith("verified    OK: ") and "source bytes" in lines[3]
    assert "  FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1" in lines
    assert (tmp_path / "nvfp4-modelopt" / "fp4convert.json").is_file()
