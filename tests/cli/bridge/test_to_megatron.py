"""``fp4convert bridge to-megatron``: exit codes, exact output, JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fp4convert.cli import cli


def test_to_megatron_writes_the_weights_and_the_te_precision_file(tiny_checkpoint, tmp_path):
    out = tmp_path / "megatron"
    result = CliRunner().invoke(
        cli,
        [
            "bridge",
            "to-megatron",
            str(tiny_checkpoint("qwen3_moe")),
            str(out),
            "--contract",
            "nvfp4-experts-per-token",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        f"wrote 41 Megatron tensors from 56 HF tensors (qwen3_moe, grouped experts) into {out}: "
    )
    assert result.output.endswith(" GB in 1 files; TransformerEngine precision file te_precision.yaml\n")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "fp4convert-megatron.json",
        "model.safetensors",
        "te_precision.yaml",
    ]


def test_to_megatron_json_and_ep_rank(tiny_checkpoint, tmp_path):
    args = [
        "bridge",
        "to-megatron",
        str(tiny_checkpoint("qwen3_moe")),
        str(tmp_path / "r1"),
        "--ep-rank",
        "1",
        "--ep-size",
        "2",
        "--expert-layout",
        "sequential",
        "--json",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["ep_rank"], report["ep_size"], report["expert_layout"], report["tensors"]) == (
        1,
        2,
        "sequential",
        33,  # 25 tensors besides experts, plus 2 of 4 experts x (fc1, fc2) x 2 MoE layers
    )
    assert report["te_precision_file"] is None


def test_an_existing_destination_is_one_error_with_a_hint(tiny_checkpoint, tmp_path, capsys):
    from fp4convert.cli import main

    (tmp_path / "m").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["bridge", "to-megatron", str(tiny_checkpoint("qwen3_moe")), str(tmp_path / "m")])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        f"error[conversion]: destination {tmp_path / 'm'} already exists\n"
        "  hint: pass --overwrite to replace it, or choose another folder\n"
    )
