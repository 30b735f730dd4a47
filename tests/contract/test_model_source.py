"""``--model``: tensor list files (always available) and the model families (when present)."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract.helpers import TOY_MLA

from fp4convert.contract import model_source, names
from fp4convert.contract.model_source import inventory_from_tensor_list, load_model_inventory
from fp4convert.errors import MappingError
from fp4convert.inventory import FusedKind, Role


@pytest.fixture
def no_families(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as if fp4convert.families provided nothing (the state before that issue lands)."""
    monkeypatch.setattr(names, "family_function", lambda name: None)
    monkeypatch.setattr(model_source, "family_function", lambda name: None)


@pytest.mark.usefixtures("no_families")
def test_bare_list_with_defaults_for_what_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "tensors.yaml"
    path.write_text(
        "- {name: model.embed_tokens.weight, shape: [128, 64], role: embedding}\n"
        "- {name: model.layers.0.mlp.down_proj.weight, shape: [64, 128]}\n"
        "- {name: model.layers.1.input_layernorm.weight, shape: [64], role: norm}\n"
        "- {name: model.layers.1.mlp.up_proj.weight, shape: [128, 64], dtype: float16, layer: 1}\n"
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


@pytest.mark.usefixtures("no_families")
def test_configs_and_directories_need_the_families(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "qwen3", "num_hidden_layers": 2}')
    with pytest.raises(MappingError) as info:
        load_model_inventory(config)
    assert info.value.message == (
        f"{config}: reading a config.json needs fp4convert.families.inventory_from_config, which is not available yet"
    )
    assert info.value.hint == "pass a tensor list file instead: a JSON/YAML list of {name, shape, role?, layer?}"
    with pytest.raises(MappingError, match="reading a checkpoint directory needs"):
        load_model_inventory(tmp_path)
    with pytest.raises(MappingError) as info:
        load_model_inventory("Qwen3-8B")
    assert info.value.message == "Qwen3-8B: no such file or directory"


def test_shipped_config_names_and_configs_go_through_the_families() -> None:
    if model_source.family_function("inventory_from_config") is None:
        pytest.skip("fp4convert.families.inventory_from_config is not available in this tree")
    inventory = load_model_inventory("DeepSeek-V3")
    assert (inventory.family, inventory.num_layers, inventory.num_mtp_layers) == ("deepseek_v3", 61, 1)
    kv_b = inventory.by_name()["model.layers.0.self_attn.kv_b_proj.weight"]
    assert (kv_b.role, kv_b.shape) == (Role.MLA_PROJECTION, (32768, 512))


def test_list_entries_are_completed_by_the_families_when_present() -> None:
    if names.family_function("describe_name") is None:
        pytest.skip("fp4convert.families.describe_name is not available in this tree")
    inventory = inventory_from_tensor_list(
        [{"name": "model.layers.3.mlp.experts.7.up_proj.weight", "shape": [32, 64]}]
    )
    (tensor,) = inventory.tensors
    assert (tensor.role, tensor.layer, tensor.expert, tensor.shape) == (Role.ROUTED_EXPERT, 3, 7, (32, 64))
    assert tensor.fused_group == "model.layers.3.mlp.experts.7.gate_up"
