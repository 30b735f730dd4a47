"""Inventories: from config.json alone they equal what transformers writes; real configs give the
published parameter counts."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fp4convert.checkpoint import inventory_from_checkpoint
from fp4convert.errors import CheckpointError, MappingError
from fp4convert.families import (
    describe_name,
    inventory_from_config,
    load_config,
    shipped_config_names,
)
from fp4convert.inventory import FusedKind, Role

TINY_KEYS = [
    "llama",
    "llama_attention_bias",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "deepseek_v3",
    "deepseek_v3_no_q_lora",
]

_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F32": "float32"}


def _on_disk(directory: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names, shapes and dtypes of every tensor, read here with safetensors directly."""
    found = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                header = handle.get_slice(name)
                found[name] = (tuple(header.get_shape()), _SAFETENSORS_DTYPES[header.get_dtype()])
    return found


@pytest.mark.parametrize("key", TINY_KEYS)
def test_config_inventory_equals_the_saved_checkpoint(key: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    directory = tiny_checkpoint(key)
    disk = _on_disk(directory)
    inventory = inventory_from_config(directory / "config.json")
    listed = {t.name: (t.shape, t.dtype) for t in inventory}
    assert len(listed) == len(inventory), "duplicate names in the inventory"
    assert {name: shape for name, (shape, _) in listed.items()} == {name: shape for name, (shape, _) in disk.items()}
    # dtypes too, with one documented difference: transformers keeps DeepSeek's router weight in
    # float32 (_keep_in_fp32_modules_strict) while the published checkpoint stores it in bfloat16,
    # which is what the config inventory describes.
    routers = {name for name in disk if name.endswith("mlp.gate.weight") and key.startswith("deepseek")}
    assert {name: disk[name][1] for name in routers} == dict.fromkeys(routers, "float32")
    assert {n: d for n, (_, d) in listed.items() if n not in routers} == {
        n: d for n, (_, d) in disk.items() if n not in routers
    }


@pytest.mark.parametrize("key", TINY_KEYS)
def test_checkpoint_inventory_classifies_like_the_config_inventory(
    key: str, tiny_checkpoint: Callable[[str], Path]
) -> None:
    directory = tiny_checkpoint(key)
    from_config = inventory_from_config(directory).by_name()
    from_disk = inventory_from_checkpoint(directory)
    assert from_disk.family == inventory_from_config(directory).family
    for info in from_disk:
        expected = from_config[info.name]
        assert info.shape == expected.shape
        if info.dtype != expected.dtype:  # the router weight, see the test above
            assert info.name.endswith("mlp.gate.weight")
        assert info == type(info)(**{**expected.__dict__, "dtype": info.dtype})


def test_checkpoint_inventory_reads_sharded_checkpoints(tiny_checkpoint: Callable[[str], Path]) -> None:
    directory = tiny_checkpoint("qwen3_moe")
    assert (directory / "model.safetensors.index.json").exists()
    assert len(list(directory.glob("*.safetensors"))) > 1
    assert len(inventory_from_checkpoint(directory)) == len(inventory_from_config(directory))


def test_checkpoint_inventory_counts_mtp_layers_present(tiny_checkpoint: Callable[[str], Path]) -> None:
    inventory = inventory_from_checkpoint(tiny_checkpoint("deepseek_v3"))
    assert (inventory.num_layers, inventory.num_mtp_layers) == (3, 1)
    assert {t.layer for t in inventory if t.is_mtp} == {3}


def test_checkpoint_inventory_names_a_foreign_tensor(tmp_path: Path, tiny_checkpoint: Callable[[str], Path]) -> None:
    source = tiny_checkpoint("llama")
    shutil.copy(source / "config.json", tmp_path / "config.json")
    shutil.copy(source / "model.safetensors", tmp_path / "model.safetensors")
    foreign = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    save_file({foreign: torch.ones(1)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(MappingError, match=rf"^tensor `{foreign}` is not a llama tensor") as raised:
        inventory_from_checkpoint(tmp_path)
    hint = raised.value.hint or ""
    # what is read directly (and what config.json must say), and what to do otherwise
    assert "looks like a quantized tensor" in hint and "quant_method fp8 with weight_block_size" in hint
    assert "convert from the BF16 release" in hint and "dequantize first" not in hint


def test_fused_expert_layout_is_named_with_the_way_out() -> None:
    config = load_config("Qwen3-30B-A3B")
    with pytest.raises(MappingError, match=r"^tensor `model.layers.0.mlp.experts.gate_up_proj` is not a") as err:
        describe_name("model.layers.0.mlp.experts.gate_up_proj", config)
    assert "split it into the family's per-expert tensors" in (err.value.hint or "")


def test_checkpoint_without_weights_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(load_config("Llama-3.1-8B")))
    with pytest.raises(CheckpointError, match=r"^no \*\.safetensors files in"):
        inventory_from_checkpoint(tmp_path)


def test_missing_config_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"^no config.json at") as raised:
        inventory_from_config(tmp_path)
    assert "DeepSeek-V3" in (raised.value.hint or "")


def test_a_missing_field_is_named() -> None:
    config = load_config("Llama-3.1-8B")
    del config["intermediate_size"]
    with pytest.raises(MappingError, match=r"^config.json has no `intermediate_size`"):
        inventory_from_config(config)


def test_unsupported_switches_are_refused_not_ignored() -> None:
    config = {**load_config("Llama-3.1-8B"), "mlp_bias": True}
    with pytest.raises(MappingError, match=r"^config.json sets mlp_bias: true"):
        inventory_from_config(config)


# -- the real models' configs ------------------------------------------------------------------------


def test_shipped_configs() -> None:
    assert shipped_config_names() == [
        "DeepSeek-V3",
        "GLM-4.5",
        "GLM-4.5-Air",
        "Kimi-K2-Instruct",
        "Llama-3.1-8B",
        "MiniMax-M2",
        "Mixtral-8x7B-v0.1",
        "Qwen1.5-MoE-A2.7B",
        "Qwen2.5-7B",
        "Qwen3-30B-A3B",
        "Qwen3-4B",
        "Qwen3-8B",
        "Qwen3-Next-80B-A3B-Instruct",
        "gpt-oss-120b",
        "gpt-oss-20b",
    ]


def _params(name: str, *, mtp: bool = False) -> int:
    return sum(t.numel for t in inventory_from_config(name) if t.is_mtp == mtp)


def test_exact_published_parameter_counts() -> None:
    # Meta's and Qwen's model cards / safetensors metadata report these exact totals.
    assert _params("Llama-3.1-8B") == 8_030_261_248
    assert _params("Qwen2.5-7B") == 7_615_616_512


@pytest.mark.parametrize(
    ("name", "billions"),
    [("Qwen3-30B-A3B", 30.5), ("Qwen3-8B", 8.2), ("Qwen3-4B", 4.0), ("DeepSeek-V3", 671.0)],
)
def test_rounded_published_parameter_counts(name: str, billions: float) -> None:
    assert round(_params(name) / 1e9, 1) == billions


def test_deepseek_v3_mtp_layer_makes_the_685b_hub_total() -> None:
    # The hub checkpoint (685B) is the 671B model plus MTP layer 61 (its own copy of embedding and head).
    assert round((_params("DeepSeek-V3") + _params("DeepSeek-V3", mtp=True)) / 1e9) == 684


def test_deepseek_v3_structure() -> None:
    inventory = inventory_from_config("DeepSeek-V3")
    by_name = inventory.by_name()
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers) == ("deepseek_v3", 61, 1)
    kv_b = by_name["model.layers.0.self_attn.kv_b_proj.weight"]
    assert (kv_b.shape, kv_b.role, kv_b.megatron_name) == (
        (32768, 512),
        Role.MLA_PROJECTION,
        "decoder.layers.0.self_attention.linear_kv_up_proj.weight",
    )
    assert "model.layers.2.mlp.gate_proj.weight" in by_name  # dense first layers 0..2
    assert "model.layers.2.mlp.experts.0.gate_proj.weight" not in by_name
    expert = by_name["model.layers.3.mlp.experts.255.down_proj.weight"]
    assert (expert.shape, expert.expert, expert.role) == ((7168, 2048), 255, Role.ROUTED_EXPERT)
    assert by_name["model.layers.3.mlp.gate.e_score_correction_bias"].dtype == "float32"
    shared = by_name["model.layers.60.mlp.shared_experts.up_proj.weight"]
    assert (shared.shape, shared.fused_group) == ((2048, 7168), "model.layers.60.mlp.shared_experts.gate_up")
    q_a = by_name["model.layers.7.self_attn.q_a_proj.weight"]
    kv_a = by_name["model.layers.7.self_attn.kv_a_proj_with_mqa.weight"]
    assert q_a.fused_group == kv_a.fused_group == "model.layers.7.self_attn.qa_kva"
    assert q_a.fused_kind is kv_a.fused_kind is FusedKind.MLA_QA_KVA
    assert kv_a.shape == (576, 7168)


def test_deepseek_v3_mtp_layer() -> None:
    mtp = {t.name: t for t in inventory_from_config("DeepSeek-V3") if t.is_mtp}
    assert {t.layer for t in mtp.values()} == {61}
    assert mtp["model.layers.61.eh_proj.weight"].shape == (7168, 14336)
    assert mtp["model.layers.61.eh_proj.weight"].megatron_name == "mtp.layers.0.eh_proj.weight"
    assert mtp["model.layers.61.embed_tokens.weight"].megatron_name == "embedding.word_embeddings.weight"
    assert mtp["model.layers.61.shared_head.head.weight"].megatron_name == "output_layer.weight"
    assert mtp["model.layers.61.shared_head.norm.weight"].megatron_name == "mtp.layers.0.final_layernorm.weight"
    inner = mtp["model.layers.61.mlp.experts.9.gate_proj.weight"]
    assert (inner.role, inner.expert, inner.megatron_name) == (
        Role.ROUTED_EXPERT,
        9,
        "mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight9",
    )
    glue_roles = {mtp[f"model.layers.61.{n}"].role for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight")}
    assert glue_roles == {Role.MTP}


def test_qwen3_4b_ties_embeddings_and_qwen3_8b_does_not() -> None:
    assert "lm_head.weight" not in inventory_from_config("Qwen3-4B").by_name()
    assert inventory_from_config("Qwen3-8B").by_name()["lm_head.weight"].role is Role.LM_HEAD


def test_qwen3_head_dim_is_read_not_derived() -> None:
    q = inventory_from_config("Qwen3-30B-A3B").by_name()["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (32 * 128, 2048)  # not 2048 x 2048


def test_qwen2_has_qkv_biases_but_no_o_bias() -> None:
    names = inventory_from_config("Qwen2.5-7B").by_name()
    bias = names["model.layers.0.self_attn.k_proj.bias"]
    assert (bias.shape, bias.role, bias.gemm_weight, bias.fused_group) == ((512,), Role.OTHER, False, None)
    assert bias.megatron_name == "decoder.layers.0.self_attention.linear_qkv.bias"
    assert "model.layers.0.self_attn.o_proj.bias" not in names


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-30B-A3B", "Qwen3-8B", "Llama-3.1-8B", "Qwen2.5-7B"])
def test_gemm_weights_are_exactly_the_2d_linear_weights(name: str) -> None:
    for t in inventory_from_config(name):
        linear = len(t.shape) == 2 and t.role not in (Role.EMBEDDING,) and not t.name.endswith("embed_tokens.weight")
        assert t.gemm_weight == linear, t.name
        if t.role is Role.NORM:
            assert len(t.shape) == 1


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-30B-A3B", "Llama-3.1-8B"])
def test_fused_groups_are_complete(name: str) -> None:
    sizes = {FusedKind.QKV: 3, FusedKind.GATE_UP: 2, FusedKind.MLA_QA_KVA: 2}
    groups: dict[str, list[FusedKind]] = {}
    for t in inventory_from_config(name):
        if t.fused_group is not None:
            assert t.fused_kind is not None
            groups.setdefault(t.fused_group, []).append(t.fused_kind)
    assert groups
    for members in groups.values():
        assert len(set(members)) == 1 and len(members) == sizes[members[0]]
