"""``explain --model CHECKPOINT_DIR`` under a 4over6 contract counts the candidates the blocks take."""

from __future__ import annotations

import json

import torch
import yaml
from _helpers import NVFP4_EXPERTS
from click.testing import CliRunner
from safetensors import safe_open

from fp4convert.cli import cli
from fp4convert.contract import load_contract
from fp4convert.formats.nvfp4 import four_over_six_choices

GATE = "model.layers.0.mlp.experts.1.gate_proj.weight"
UP = "model.layers.0.mlp.experts.1.up_proj.weight"


def _contract(tmp_path, tile: str = "1x16"):
    data = load_contract(NVFP4_EXPERTS).canonical_dict()
    data["formats"]["nvfp4"] |= {"four_over_six": "mae", "four_over_six_e4m3_max": 448, "tile": tile}
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _expected(checkpoint, tile: str) -> torch.Tensor:
    tensors = {}
    for path in checkpoint.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            tensors |= {n: f.get_tensor(n) for n in f.keys() if n in (GATE, UP)}
    shared = torch.maximum(tensors[GATE].float().abs().amax(), tensors[UP].float().abs().amax())
    return four_over_six_choices(tensors[GATE], profile="te-4over6-mae", tile=tile, amax=shared)


def test_explain_counts_the_candidates_of_a_checkpoint_tensor(tmp_path, tiny_checkpoint):
    checkpoint = tiny_checkpoint("qwen3_moe")
    result = CliRunner().invoke(cli, ["explain", str(_contract(tmp_path)), GATE, "--model", str(checkpoint)])
    assert result.exit_code == 0, result.output
    map4 = _expected(checkpoint, "1x16")
    n, k = map4.numel(), int(map4.sum())
    assert 0 < k < n
    assert result.stdout.splitlines()[-1] == (
        f"4over6    te-4over6-mae: map-to-4 in {k} of {n} blocks ({100 * k / n:.1f}%), map-to-6 in {n - k}"
    )


def test_explain_json_counts_16x16_tiles(tmp_path, tiny_checkpoint):
    checkpoint = tiny_checkpoint("qwen3_moe")
    args = ["explain", str(_contract(tmp_path, "16x16")), GATE, "--model", str(checkpoint), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    map4 = _expected(checkpoint, "16x16")
    counts = json.loads(result.stdout)["four_over_six"]
    assert counts == {
        "profile": "te-4over6-mae",
        "tile": "16x16",
        "blocks": map4.numel(),
        "map4": int(map4.sum()),
        "map6": map4.numel() - int(map4.sum()),
    }


def test_explain_without_a_checkpoint_says_how_to_get_counts(tmp_path, tiny_checkpoint):
    config = tiny_checkpoint("qwen3_moe") / "config.json"
    result = CliRunner().invoke(cli, ["explain", str(_contract(tmp_path)), GATE, "--model", str(config)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "4over6    te-4over6-mae: pass --model CHECKPOINT_DIR to count the candidates its blocks take"
    )


def test_explain_of_a_bf16_tensor_has_no_4over6_line(tmp_path, tiny_checkpoint):
    checkpoint = tiny_checkpoint("qwen3_moe")
    name = "model.layers.0.self_attn.q_proj.weight"
    result = CliRunner().invoke(cli, ["explain", str(_contract(tmp_path)), name, "--model", str(checkpoint)])
    assert result.exit_code == 0, result.output
    assert "4over6" not in result.stdout
