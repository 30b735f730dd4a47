"""``--model`` and bare names: tensor list files, configs, checkpoints and names, through the model families."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract.helpers import TOY_MLA

from fp4convert.errors import CheckpointError, MappingError
from fp4convert.inventory import FusedKind, Role
from fp4convert.model_source import (
    describe_tensor_name,
    inventory_from_tensor_list,
    layer_from_name,
    load_model_inventory,
)


def test_bare_list_with_defaults_for_what_no_family_knows(tmp_path: Path) -> None:
    path = tmp_path / "tensors.yaml"
    path.write_text(
        "- {name: custom.embed.weight, shape: [128, 64], role: embedding}\n"
        "- {name: custom.layers.0.down.weight, shape: [64, 128]}\n"
        "- {name: custom.layers.1.norm.weight, shape: [64], role: norm}\n"
        "- {name: custom.layers.1.up.weight, shape: [128, 64], dtype: float16, layer: 1}\n"
    )
    inventory = load_model_inventory(path)
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers) == ("tensor-list", 2, 0)
    embed, down, norm, up = inventory.tensors
    assert (embed.gemm_weight, embed.layer, embed.role) == (False, None, Role.EMBEDDING)
    assert (down.gemm_weight, down.layer, down.role, down.shape) == (True, 0, Role.OTHER, (64, 128))
    assert (norm.gemm_weight, norm.layer) == (False, 1)
    assert (up.dtype, up.megatron_name) == ("float16", None)


def test_mapping_form_carries_layer_counts_and_every_field() -> None:
    inventory = load_model_inventory(TOY_MLA)
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers, len(inventory)) == (
        "toy_deepseek_v3",
        4,
        1,
        123,
    )
    gate = inventory.by_name()["model.layers.4.mlp.experts.3.gate_proj.weight"]
    assert (gate.is_mtp, gate.expert, gate.fused_kind) == (True, 3, FusedKind.GATE_UP)
    assert gate.megatron_name == "mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight3"


def test_malformed_entries_name_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "tensors.yaml"
    path.write_text(
        "num_layers: 2\ntensors:\n"
        "  - {name: a.weight, shape: [4, 4]}\n"
        "  - {name: b.weight, shape: [4, 4], rol: norm}\n"
    )
    with pytest.raises(MappingError) as info:
        load_model_inventory(path)
    assert info.value.message == f"{path}:4: tensors[1].rol: unknown field 'rol'"
    assert info.value.hint is not None and info.value.hint.startswith("did you mean 'role'?")


def test_bare_list_errors_point_into_the_list(tmp_path: Path) -> None:
    path = tmp_path / "tensors.json"
    path.write_text('[\n {"name": "a.weight", "shape": [4, 4]},\n {"name": "b.weight", "shape": "4x4"}\n]')
    with pytest.raises(MappingError) as info:
        load_model_inventory(path)
    assert info.value.message == f"{path}:3: tensors[1].shape: input should be a list, found '4x4'"


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(MappingError, match=r"tensors\[0\]\.role: "):
        inventory_from_tensor_list([{"name": "a.weight", "shape": [4, 4], "role": "expert"}])


def test_configs_and_directories_go_through_the_families(tmp_path: Path, tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("qwen3_moe")
    from_directory = load_model_inventory(checkpoint)
    from_config = load_model_inventory(checkpoint / "config.json")
    assert (from_directory.family, from_directory.num_layers) == (from_config.family, from_config.num_layers)
    assert sorted(t.name for t in from_directory) == sorted(t.name for t in from_config)
    with pytest.raises(CheckpointError, match=r"^no config\.json at "):
        load_model_inventory(tmp_path)  # a directory that is no checkpoint
    with pytest.raises(CheckpointError) as info:
        load_model_inventory("Qwen3-9B")
    assert info.value.message == "no config.json at Qwen3-9B"
    assert info.value.hint is not None and "Qwen3-8B" in info.value.hint  # the shipped names are listed


def test_shipped_config_names_go_through_the_families() -> None:
    inventory = load_model_inventory("DeepSeek-V3")
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers) == ("deepseek_v3", 61, 1)
    kv_b = inventory.by_name()["model.layers.0.self_attn.kv_b_proj.weight"]
    assert (kv_b.role, kv_b.shape) == (Role.MLA_PROJECTION, (32768, 512))


def test_list_entries_are_completed_by_the_families() -> None:
    inventory = inventory_from_tensor_list(
        [{"name": "model.layers.3.mlp.experts.7.up_proj.weight", "shape": [32, 64]}]
    )
    (tensor,) = inventory.tensors
    assert (tensor.role, tensor.layer, tensor.expert, tensor.shape) == (Role.ROUTED_EXPERT, 3, 7, (32, 64))
    assert tensor.fused_group == "model.layers.3.mlp.experts.7.gate_up"


def test_bare_names_are_described_by_the_families_in_either_scheme() -> None:
    hf, hf_namespace, hf_notes = describe_tensor_name("model.layers.2.self_attn.kv_b_proj.weight")
    megatron, megatron_namespace, _ = describe_tensor_name("decoder.layers.2.self_attention.linear_kv_up_proj.weight")
    assert hf == megatron
    assert (hf.role, hf.layer, hf.megatron_name) == (
        Role.MLA_PROJECTION,
        2,
        "decoder.layers.2.self_attention.linear_kv_up_proj.weight",
    )
    assert (hf_namespace, megatron_namespace, hf_notes) == (None, None, ())


def test_a_name_no_family_knows_is_described_from_the_name_with_a_note() -> None:
    tensor, namespace, notes = describe_tensor_name("decoder.layers.3.custom_proj.weight", namespace="megatron")
    assert (tensor.layer, tensor.role, tensor.gemm_weight) == (3, Role.OTHER, True)
    assert (tensor.megatron_name, namespace) == ("decoder.layers.3.custom_proj.weight", "megatron")
    assert notes == (
        "'decoder.layers.3.custom_proj.weight' was described from its name alone: no model family recognises it "
        "(tensor `decoder.layers.3.custom_proj.weight` is not a tensor of any supported family (deepseek_v3, "
        "glm4_moe, gpt_oss, llama, minimax_m2, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, qwen3_next)); "
        "it is treated as a GEMM weight of unknown role, matched as a Megatron name only (pass a model for the "
        "full picture)",
    )
    hf_tensor, hf_namespace, _ = describe_tensor_name("model.layers.1.custom.weight")
    assert (hf_tensor.layer, hf_tensor.megatron_name, hf_namespace) == (1, None, "hf")


def test_layer_from_name() -> None:
    assert layer_from_name("model.layers.12.mlp.gate.weight") == 12
    assert layer_from_name("module.module.decoder.layers.7.mlp.router.weight") == 7
    assert layer_from_name("mtp.layers.0.eh_proj.weight") is None
    assert layer_from_name("lm_head.weight") is None
