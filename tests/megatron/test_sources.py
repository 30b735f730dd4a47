"""Where the master holds each HF tensor, and reading folders of safetensors."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal
from safetensors.torch import save_file

from fp4convert.errors import CheckpointError
from fp4convert.families import hf_to_megatron
from fp4convert.megatron import SafetensorsFolder, export_plan
from fp4convert.megatron.sources import piece_sources


@pytest.mark.parametrize("layout", ["grouped", "sequential"])
def test_row_maps_take_every_hf_tensor_from_the_megatron_master(layout, model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    plan = export_plan(contract=NVFP4_EXPERTS, config=config)
    sources = piece_sources({k: tuple(t.shape) for k, t in megatron.items()}, plan, ep_rank=0, ep_size=1)
    assert sorted(sources) == sorted(hf)
    for name, source in sources.items():
        assert_bytes_equal(source.take(megatron[source.key]), hf[name])
    # gate/up are halves of linear_fc1 (views); q/k/v an interleaved row index
    assert sources["model.layers.0.mlp.experts.3.up_proj.weight"].rows == slice(32, 64)
    assert isinstance(sources["model.layers.0.self_attn.k_proj.weight"].rows, torch.Tensor)
    assert sources["model.layers.0.self_attn.o_proj.weight"].rows is None


def test_row_maps_of_an_ep_rank_name_global_experts(model):
    hf, config = model("qwen3_moe")
    rank_one = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2)
    plan = export_plan(contract=NVFP4_EXPERTS, config=config)
    sources = piece_sources({k: tuple(t.shape) for k, t in rank_one.items()}, plan, ep_rank=1, ep_size=2)
    source = sources["model.layers.2.mlp.experts.3.down_proj.weight"]
    assert source.key == "decoder.layers.2.mlp.experts.linear_fc2.weight1"
    assert not any(".experts.0." in name for name in sources)


def test_hf_master_names_map_to_themselves(model):
    hf, config = model("deepseek_v3")
    plan = export_plan(contract="deepseek-v3-mxfp8-mla-bf16", config=config)
    sources = piece_sources({k: tuple(t.shape) for k, t in hf.items()}, plan, ep_rank=0, ep_size=1)
    assert all(s.key == name and s.rows is None for name, s in sources.items())


def test_folder_reads_on_access_and_reports_duplicates(tmp_path):
    a, b = torch.arange(4.0).reshape(2, 2), torch.ones(3, dtype=torch.bfloat16)
    save_file({"a": a, "b": b}, str(tmp_path / "one.safetensors"))
    save_file({"a": a * 2}, str(tmp_path / "two.safetensors"))
    with SafetensorsFolder(tmp_path) as folder:
        assert sorted(folder) == ["a", "b"] and len(folder) == 2
        assert folder.meta("b") == ("BF16", (3,))
        assert_bytes_equal(folder["a"], a)  # the first file in name order wins
        assert folder.duplicates == {"a": ["one.safetensors", "two.safetensors"]}
    with SafetensorsFolder(tmp_path / "two.safetensors") as single:
        assert_bytes_equal(single["a"], a * 2)


def test_folder_errors(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds no \*\.safetensors files"):
        SafetensorsFolder(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        SafetensorsFolder(tmp_path / "nope")
