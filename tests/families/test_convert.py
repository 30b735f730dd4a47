"""HF -> Megatron-Core -> HF on tiny transformers checkpoints: byte-identical for every tensor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import assert_bytes_equal
from conftest import TINY_FAMILY
from safetensors.torch import load_file

from fp4convert.errors import MappingError
from fp4convert.families import (
    hf_to_megatron,
    inventory_from_config,
    load_config,
    megatron_to_hf,
)

MOE_KEYS = ["qwen3_moe", "deepseek_v3", "deepseek_v3_no_q_lora"]
DENSE_KEYS = ["llama", "llama_attention_bias", "qwen2", "qwen3"]


def _load(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors, load_config(directory)


def _assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert_bytes_equal(actual[name], tensor)


@pytest.mark.parametrize(
    ("key", "layout"),
    [*((key, "grouped") for key in DENSE_KEYS + MOE_KEYS), *((key, "sequential") for key in MOE_KEYS)],
)
def test_round_trip_is_byte_identical(key: str, layout: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint(key))
    megatron = hf_to_megatron(hf, TINY_FAMILY[key], config, expert_layout=layout)
    _assert_same_state(megatron_to_hf(megatron, TINY_FAMILY[key], config), hf)


@pytest.mark.parametrize("key", DENSE_KEYS + MOE_KEYS)
def test_megatron_names_are_the_inventory_names(key: str, tiny_checkpoint: Callable[[str], Path]) -> None:
    directory = tiny_checkpoint(key)
    hf, config = _load(directory)
    megatron = hf_to_megatron(hf, TINY_FAMILY[key], config)
    assert set(megatron) == {t.megatron_name for t in inventory_from_config(directory)}


def test_megatron_layouts_have_megatron_shapes(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("qwen3_moe"))
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    heads, groups, head_dim = 4, 2, 16
    assert megatron["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (
        (heads + 2 * groups) * head_dim,
        64,
    )
    assert megatron["decoder.layers.0.mlp.experts.linear_fc1.weight3"].shape == (2 * 32, 64)
    assert megatron["decoder.layers.1.mlp.linear_fc1.weight"].shape == (2 * 96, 64)  # mlp_only_layers=[1]
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in megatron  # MoE layer: norm not fused
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in megatron  # dense layer: fused


def test_fused_tensors_hold_the_hf_pieces_in_megatron_order(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("qwen2"))
    megatron = hf_to_megatron(hf, "qwen2", config)
    fc1 = megatron["decoder.layers.1.mlp.linear_fc1.weight"]
    assert_bytes_equal(fc1[:96], hf["model.layers.1.mlp.gate_proj.weight"])
    assert_bytes_equal(fc1[96:], hf["model.layers.1.mlp.up_proj.weight"])
    # 4 heads in 2 groups of head_dim 16: group 1 is q heads 2-3, then k head 1, then v head 1.
    qkv_bias = megatron["decoder.layers.0.self_attention.linear_qkv.bias"]
    group_1 = qkv_bias[64:128]
    assert_bytes_equal(group_1[:32], hf["model.layers.0.self_attn.q_proj.bias"][32:64])
    assert_bytes_equal(group_1[32:48], hf["model.layers.0.self_attn.k_proj.bias"][16:32])
    assert_bytes_equal(group_1[48:64], hf["model.layers.0.self_attn.v_proj.bias"][16:32])


@pytest.mark.parametrize("ep_size", [2, 4])
@pytest.mark.parametrize("key", MOE_KEYS)
def test_expert_parallel_shards_reassemble(key: str, ep_size: int, tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint(key))
    per_rank = 4 // ep_size
    merged: dict[str, torch.Tensor] = {}
    for rank in range(ep_size):
        shard = hf_to_megatron(hf, TINY_FAMILY[key], config, ep_rank=rank, ep_size=ep_size)
        local_ids = {int(name.rsplit("weight", 1)[1]) for name in shard if ".experts.linear_fc" in name}
        assert local_ids == set(range(per_rank))
        for name, tensor in megatron_to_hf(shard, TINY_FAMILY[key], config, ep_rank=rank, ep_size=ep_size).items():
            if name in merged:  # non-expert tensors are replicated on every EP rank
                assert_bytes_equal(tensor, merged[name])
            merged[name] = tensor
    _assert_same_state(merged, hf)


def test_local_expert_ids_map_to_the_rank_block(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("qwen3_moe"))
    shard = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2, expert_layout="sequential")
    fc2 = shard["decoder.layers.2.mlp.experts.local_experts.0.linear_fc2.weight"]
    assert_bytes_equal(fc2, hf["model.layers.2.mlp.experts.2.down_proj.weight"])  # global = 1 * 2 + 0
    back = megatron_to_hf(
        {"decoder.layers.2.mlp.experts.local_experts.1.linear_fc2.weight": fc2},
        "qwen3_moe",
        config,
        ep_rank=1,
        ep_size=2,
    )
    assert list(back) == ["model.layers.2.mlp.experts.3.down_proj.weight"]


def test_megatron_spellings_from_other_tools_are_read(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("deepseek_v3"))
    megatron = hf_to_megatron(hf, "deepseek_v3", config)
    renames = {
        ".mtp_model_layer.": ".transformer_layer.",  # older Megatron-Core / Miles
        ".linear_q_up_proj.layer_norm_weight": ".q_layernorm.weight",  # local (non-TE) spec
        ".linear_kv_up_proj.layer_norm_weight": ".kv_layernorm.weight",
    }
    other: dict[str, torch.Tensor] = {}
    for name, tensor in megatron.items():
        for old, new in renames.items():
            name = name.replace(old, new)
        other["module.module." + name] = tensor  # DDP / Float16Module wrappers, as Miles names them
    assert any(".transformer_layer." in name for name in other)
    _assert_same_state(megatron_to_hf(other, "deepseek_v3", config), hf)


def test_incomplete_fused_group_is_named(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("llama"))
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        MappingError, match=r"^fused tensors are incomplete: missing `model.layers.1.mlp.up_proj.weight`;"
    ):
        hf_to_megatron(hf, "llama", config)


def test_unknown_names_are_refused_both_ways(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("llama"))
    with pytest.raises(MappingError, match=r"^HF tensor `model.layers.0.mlp.fc9.weight` is not a llama tensor"):
        hf_to_megatron({**hf, "model.layers.0.mlp.fc9.weight": torch.zeros(1)}, "llama", config)
    with pytest.raises(MappingError, match=r"^Megatron tensor `decoder.layers.0.mlp.router.weight` is not a llama"):
        megatron_to_hf({"decoder.layers.0.mlp.router.weight": torch.zeros(1)}, "llama", config)
    with pytest.raises(MappingError, match=r"^tensor `decoder.layers.2.mlp.linear_fc2.weight` is in decoder layer 2"):
        megatron_to_hf({"decoder.layers.2.mlp.linear_fc2.weight": torch.zeros(1)}, "llama", config)


def test_mtp_copies_must_equal_the_shared_tensor(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("deepseek_v3"))
    hf["model.layers.3.shared_head.head.weight"] = hf["model.layers.3.shared_head.head.weight"].clone()
    hf["model.layers.3.shared_head.head.weight"][0, 0] += 1
    with pytest.raises(MappingError, match=r"^`model.layers.3.shared_head.head.weight` differs from `lm_head.weight`"):
        hf_to_megatron(hf, "deepseek_v3", config)
    del hf["lm_head.weight"]
    with pytest.raises(MappingError, match=r"copies `lm_head.weight`, which is not among the tensors"):
        hf_to_megatron(hf, "deepseek_v3", config)


def test_a_tensor_given_in_both_expert_layouts_is_refused(tiny_checkpoint: Callable[[str], Path]) -> None:
    _, config = _load(tiny_checkpoint("qwen3_moe"))
    weight = torch.zeros(64, 32, dtype=torch.bfloat16)
    both = {
        "decoder.layers.0.mlp.experts.linear_fc2.weight1": weight,
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight": weight,
    }
    with pytest.raises(MappingError, match=r"^`model.layers.0.mlp.experts.1.down_proj.weight` is produced twice"):
        megatron_to_hf(both, "qwen3_moe", config)


def test_expert_parallel_geometry_is_checked(tiny_checkpoint: Callable[[str], Path]) -> None:
    hf, config = _load(tiny_checkpoint("qwen3_moe"))
    with pytest.raises(MappingError, match=r"^4 experts cannot be split over EP size 3"):
        hf_to_megatron(hf, "qwen3_moe", config, ep_rank=0, ep_size=3)
    with pytest.raises(MappingError, match=r"^EP rank 2 of size 2 is not a valid expert-parallel position"):
        megatron_to_hf({}, "qwen3_moe", config, ep_rank=2, ep_size=2)
    with pytest.raises(MappingError, match=r"names expert 2, but there are 2 experts here"):
        megatron_to_hf(
            {"decoder.layers.0.mlp.experts.linear_fc2.weight2": torch.zeros(64, 32)},
            "qwen3_moe",
            config,
            ep_rank=0,
            ep_size=2,
        )
