"""``fp4convert diff A B --model M``: exact output."""

from __future__ import annotations

import json

from click.testing import CliRunner
from contract.helpers import CONTRACTS, TOY_MLA, TOY_MOE

from fp4convert.cli import cli

PER_TOKEN = str(CONTRACTS / "nvfp4-experts-per-token.yaml")
LAST15 = str(CONTRACTS / "nvfp4-experts-per-token-last15pct-bf16.yaml")


def test_diff_summary() -> None:
    result = CliRunner().invoke(cli, ["diff", PER_TOKEN, LAST15, "--model", str(TOY_MOE), "--summary"])
    assert result.exit_code == 0
    assert result.stdout == (
        "nvfp4-experts-per-token -> nvfp4-experts-per-token-last15pct-bf16 "
        "on toy_qwen3_moe (4 layers, 87 tensors)\n"
        "layer 3: 12 tensor(s) change, 39,280 -> 74,560 bytes\n"
        "total: 12 of 87 tensors change, 190,016 -> 225,296 bytes\n"
    )


def test_diff_lists_tensors_per_layer() -> None:
    result = CliRunner().invoke(cli, ["diff", PER_TOKEN, LAST15, "--model", str(TOY_MOE)])
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 1 + 12 + 1
    assert lines[2] == (
        "  model.layers.3.mlp.experts.0.gate_proj.weight  nvfp4 -> bf16  "
        "[rules[1] -> bf16_exceptions.last_layers]  1,156 -> 4,096"
    )
    assert lines[4] == (
        "  model.layers.3.mlp.experts.0.down_proj.weight  nvfp4 -> bf16  "
        "[rules[2] -> bf16_exceptions.last_layers]  1,156 -> 4,096"
    )


def test_diff_json_and_mtp_layers() -> None:
    deepseek = str(CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml")
    mxfp8 = str(CONTRACTS / "mxfp8-end-to-end.yaml")
    result = CliRunner().invoke(cli, ["diff", mxfp8, deepseek, "--model", str(TOY_MLA), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    # kv_b_proj of the 4 decoder layers, and every quantized tensor of the MTP layer (layer 4):
    # q_a, q_b, kv_a, kv_b, o, eh_proj, 12 expert and 3 shared-expert weights.
    assert [(layer["layer"], len(layer["changes"])) for layer in data["layers"]] == [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 21),
    ]
    assert data["changed_tensors"] == 25
    assert {c["after"] for layer in data["layers"] for c in layer["changes"]} == {"bf16"}


def test_diff_requires_a_model() -> None:
    result = CliRunner().invoke(cli, ["diff", PER_TOKEN, LAST15])
    assert result.exit_code == 2
    assert "Missing option '--model'" in result.stderr
