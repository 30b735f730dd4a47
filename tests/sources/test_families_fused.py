"""Fused 3-D experts in every MoE family, as transformers 5 saves them, and the fused releases no family maps.

Each tiny model (tests/families/tiny.py: transformers' own classes) is saved twice from the same
weights: ``save_pretrained()`` writes the per-expert hub layout, ``save_pretrained(save_original_format=
False)`` transformers 5's own fused layout (``mlp.experts.gate_up_proj [E, 2I, H]`` / ``down_proj
[E, H, I]``; Mixtral's and MiniMax-M2's ``block_sparse_moe`` becomes ``mlp``, router included).
Llama-4 / Qwen3-VL-MoE releases store the transposed ``[E, H, 2I]`` / ``[E, I, H]``, made here from
the fused save by a transpose. Every command's output on a fused save equals its output on the
per-expert save, byte for byte. Qwen3.5-MoE (``model.language_model.`` prefix) and Llama 4
(``language_model.model.``) are fused releases of models fp4convert has no family for: refused,
naming the architecture, before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _sources import all_tensors, assert_same_tensors
from families.tiny import build_model
from safetensors.torch import save_file
from sources.cli_run import run

transformers = pytest.importorskip("transformers")

MOE_KEYS = ["mixtral", "qwen2_moe", "minimax_m2", "glm4_moe", "kimi_k2", "qwen3_next"]
MEGATRON_KEYS = [k for k in MOE_KEYS if k != "qwen3_next"]


def _kimi(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2"}, indent=2))


def _transposed(fused: Path, destination: Path) -> Path:
    """The fused save with experts stored ``[E, H, 2I]`` / ``[E, I, H]`` (Llama 4, Qwen3-VL-MoE)."""
    destination.mkdir(parents=True)
    (destination / "config.json").write_text((fused / "config.json").read_text())
    tensors = {
        name: tensor.transpose(1, 2).contiguous()
        if name.endswith(("experts.gate_up_proj", "experts.down_proj"))
        else tensor
        for name, tensor in all_tensors(fused).items()
    }
    save_file(tensors, str(destination / "model.safetensors"), metadata={"format": "pt"})
    return destination


@pytest.fixture(scope="module")
def saves(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Path]]:
    """``saves(key)``: ``per-expert``, ``fused`` and ``transposed`` saves of the same tiny model."""
    cache: dict[str, dict[str, Path]] = {}

    def get(key: str) -> dict[str, Path]:
        if key not in cache:
            root = tmp_path_factory.mktemp(f"fused-{key}")
            model = build_model(key)
            model.save_pretrained(str(root / "per-expert"))
            model.save_pretrained(str(root / "fused"), save_original_format=False)
            if key == "kimi_k2":
                _kimi(root / "per-expert")
                _kimi(root / "fused")
            cache[key] = {
                "per-expert": root / "per-expert",
                "fused": root / "fused",
                "transposed": _transposed(root / "fused", root / "transposed"),
            }
        return cache[key]

    return get


@pytest.mark.parametrize("key", MOE_KEYS)
def test_transformers_fused_save_converts_to_the_per_expert_bytes(saves, tmp_path, capsys, key):
    paths = saves(key)
    stored = all_tensors(paths["fused"])
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in stored) and not any(".experts.0." in n for n in stored)
    for layout in ("fused", "transposed", "per-expert"):
        argv = ["convert", str(paths[layout]), str(tmp_path / layout), "--contract", "nvfp4-experts-per-token"]
        code, out = run(argv, capsys)
        assert code == 0, out
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 100
    assert assert_same_tensors(tmp_path / "transposed", tmp_path / "per-expert") > 100
    for layout in ("fused", "transposed"):
        code, out = run(["verify", str(tmp_path / layout), "--source", str(paths[layout]), "--json"], capsys)
        assert code == 0 and json.loads(out)["ok"], out
    manifest = json.loads((tmp_path / "transposed" / "fp4convert.json").read_text())
    formats = {t["source_format"] for n, t in manifest["tensors"].items() if ".experts." in n}
    assert formats == {"dense+fused-3d-transposed"}


@pytest.mark.parametrize("key", ["mixtral", "qwen3_next"])
def test_mxfp8_and_dequantize_of_a_fused_save(saves, tmp_path, capsys, key):
    paths = saves(key)
    for layout in ("fused", "per-expert"):
        argv = ["convert", str(paths[layout]), str(tmp_path / layout), "--contract", "mxfp8-end-to-end"]
        code, out = run([*argv, "--dialect", "sglang-mxfp8"], capsys)
        assert code == 0, out
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 50
    code, out = run(["dequantize", str(paths["fused"]), str(tmp_path / "bf16")], capsys)
    assert code == 0, out
    assert assert_same_tensors(tmp_path / "bf16", paths["per-expert"]) > 40  # the per-expert save, names and bytes


@pytest.mark.parametrize("key", MEGATRON_KEYS)
def test_to_megatron_of_a_fused_save_equals_the_per_expert_import(saves, tmp_path, capsys, key):
    paths = saves(key)
    for layout in ("fused", "per-expert"):
        code, out = run(["to-megatron", str(paths[layout]), str(tmp_path / layout)], capsys)
        assert code == 0, out
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 10


def test_to_megatron_of_a_fused_qwen3_next_refuses_with_the_reason(saves, tmp_path, capsys):
    code, out = run(["to-megatron", str(saves("qwen3_next")["fused"]), str(tmp_path / "out")], capsys)
    assert code != 0 and "GatedDeltaNet" in out
    assert not (tmp_path / "out").exists()


def _qwen3_5_moe(directory: Path) -> Path:
    """Qwen3.5-MoE as its releases store it: fused experts under ``model.language_model.``, a vision tower."""
    text = {
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "layer_types": ["linear_attention", "full_attention"],
    }
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
    }
    config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(directory), save_original_format=False)
    return directory


def _llama4(directory: Path) -> Path:
    """Llama 4 as its releases store it: ``language_model.model.layers.N.feed_forward.experts.gate_up_proj``
    ``[E, H, 2I]`` (transposed), a vision model."""
    text = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 32,
        "intermediate_size_mlp": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "interleave_moe_layer_step": 1,
    }
    vision = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 16,
        "patch_size": 8,
        "vision_output_dim": 32,
        "projector_input_dim": 32,
        "projector_output_dim": 64,
    }
    config = transformers.Llama4Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize(
    ("build", "architecture", "fused_name"),
    [
        (_qwen3_5_moe, "Qwen3_5MoeForConditionalGeneration", "model.language_model.layers.0.mlp.experts.gate_up_proj"),
        (_llama4, "Llama4ForConditionalGeneration", "language_model.model.layers.0.feed_forward.experts.gate_up_proj"),
    ],
)
def test_fused_releases_of_unsupported_families_are_refused_by_name(tmp_path, capsys, build, architecture, fused_name):
    src = build(tmp_path / "src")
    assert fused_name in all_tensors(src)
    before = sorted((p.name, p.stat().st_size) for p in src.iterdir())
    for argv in (
        ["convert", str(src), str(tmp_path / "out"), "--contract", "nvfp4-experts-per-token"],
        ["plan", "nvfp4-experts-per-token", "--model", str(src)],
        ["dequantize", str(src), str(tmp_path / "out")],
    ):
        code, out = run(argv, capsys)
        assert code != 0 and f"unsupported model: architectures ['{architecture}']" in out, out
        assert "multimodal model" in out and "docs/families.md" in out
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    assert sorted((p.name, p.stat().st_size) for p in src.iterdir()) == before


def test_a_fused_save_with_a_second_copy_of_its_weights_is_refused(saves, tmp_path, capsys):
    # Mixtral's fused save names its router mlp.gate (read as block_sparse_moe.gate); a stray per-expert
    # copy or a block_sparse_moe.gate next to it would be the same logical tensor twice.
    fused, per_expert = all_tensors(saves("mixtral")["fused"]), all_tensors(saves("mixtral")["per-expert"])
    for extra in (
        "model.layers.0.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.experts.2.w3.weight",
    ):
        src = tmp_path / extra
        src.mkdir()
        (src / "config.json").write_text((saves("mixtral")["fused"] / "config.json").read_text())
        save_file({**fused, extra: per_expert[extra]}, str(src / "model.safetensors"), metadata={"format": "pt"})
        code, out = run(["convert", str(src), str(tmp_path / "out"), "--contract", "nvfp4-experts-per-token"], capsys)
        assert code != 0 and f"tensor '{extra}' is stored twice in this checkpoint" in out, out
        assert not (tmp_path / "out").exists()
