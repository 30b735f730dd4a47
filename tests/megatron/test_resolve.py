"""Where the master holds each HF tensor: every Megatron spelling, EP ranks, HF masters, and the
plan-derived fast path agreeing with the families' ``megatron_to_hf``."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal

from fp4convert.errors import MappingError
from fp4convert.families import hf_to_megatron, unpack
from fp4convert.megatron import export_plan
from fp4convert.megatron.groups import piece_value
from fp4convert.megatron.resolve import MasterNames, row_runs

LAYOUTS = ["grouped", "sequential", "single_grouped", "legacy_grouped"]


def _values(master: dict[str, torch.Tensor], names: MasterNames, piece) -> torch.Tensor:
    tensor = master[piece.key]
    if piece.sub is not None:
        tensor = unpack(piece.key, tensor, experts_per_rank=names.per_rank, q_lora_rank=names.q_lora_rank)[piece.sub][
            1
        ]
    return piece_value(tensor, piece)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_hf_tensor_comes_from_the_megatron_master(layout, model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    names = MasterNames(export_plan(contract=NVFP4_EXPERTS, config=config), 0, 1)
    sources = names.sources({k: tuple(t.shape) for k, t in megatron.items()})
    assert sorted(sources) == sorted(hf)
    for name, piece in sources.items():
        assert piece.shape == tuple(hf[name].shape)
        assert_bytes_equal(_values(megatron, names, piece), hf[name])
    # gate/up are the halves of one tensor's rows; q/k/v runs of rows, query group by query group
    up = sources["model.layers.0.mlp.experts.3.up_proj.weight"]
    assert up.runs == ((32, 32),) and not up.whole
    assert len(sources["model.layers.0.self_attn.k_proj.weight"].runs) == config["num_key_value_heads"]
    assert sources["model.layers.0.self_attn.o_proj.weight"].whole


@pytest.mark.parametrize("module_prefix", ["", "module.module."])
def test_an_ep_rank_names_global_experts(module_prefix, model):
    hf, config = model("qwen3_moe")
    rank_one = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2)
    names = MasterNames(export_plan(contract=NVFP4_EXPERTS, config=config), 1, 2)
    sources = names.sources({module_prefix + k: tuple(t.shape) for k, t in rank_one.items()})
    assert sources["model.layers.2.mlp.experts.3.down_proj.weight"].key == (
        f"{module_prefix}decoder.layers.2.mlp.experts.linear_fc2.weight1"
    )
    assert not any(".experts.0." in name for name in sources)


def test_deepseek_fused_down_projection_and_mtp(model):
    hf, config = model("deepseek_v3")
    from fp4convert.families import MegatronSpelling

    spelling = MegatronSpelling(mla_down_proj_fusion=True)
    megatron = hf_to_megatron(hf, "deepseek_v3", config, spelling=spelling)
    names = MasterNames(export_plan(contract="deepseek-v3-mxfp8-mla-bf16", config=config), 0, 1)
    sources = names.sources({k: tuple(t.shape) for k, t in megatron.items()})
    assert sorted(sources) == sorted(hf)
    for name, piece in sources.items():
        assert_bytes_equal(_values(megatron, names, piece), hf[name])


def test_hf_master_names_map_to_themselves(model):
    hf, config = model("deepseek_v3")
    names = MasterNames(export_plan(contract="deepseek-v3-mxfp8-mla-bf16", config=config), 0, 1)
    sources = names.sources({k: tuple(t.shape) for k, t in hf.items()})
    assert all(p.key == name and p.whole for name, p in sources.items())


def test_unknown_names_and_duplicates_are_refused(model):
    hf, config = model("qwen3_moe")
    names = MasterNames(export_plan(contract=NVFP4_EXPERTS, config=config), 0, 1)
    with pytest.raises(MappingError, match=r"`decoder\.layers\.0\.mlp\.nonsense\.weight` is not a qwen3_moe tensor"):
        names.sources({"decoder.layers.0.mlp.nonsense.weight": (2, 16)})
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    both = {k: tuple(t.shape) for k, t in megatron.items()}
    both["model.layers.0.mlp.experts.0.gate_proj.weight"] = tuple(
        hf["model.layers.0.mlp.experts.0.gate_proj.weight"].shape
    )
    with pytest.raises(MappingError, match=r"is produced twice"):
        names.sources(both)


def test_row_runs():
    assert row_runs(torch.tensor([3, 4, 5, 9, 10, 0])) == ((3, 3), (9, 2), (0, 1))
    assert row_runs(torch.zeros(0, dtype=torch.long)) == ()


@pytest.mark.parametrize(
    "runs, gathered_by_one_view",
    [
        (((0, 4), (12, 4), (24, 4)), True),  # q of linear_qkv: a run per query group
        (((8, 2), (20, 2), (32, 2)), True),  # v: the last run ends at the tensor's last row
        (((0, 4), (12, 4), (20, 4)), False),  # unevenly spaced
        (((0, 4), (12, 2)), False),  # runs of other lengths
        (((12, 4), (0, 4)), False),  # out of order
        (((0, 4), (2, 4)), False),  # overlapping
        (((0, 4), (32, 4)), False),  # past the tensor's rows
        (((3, 5),), False),  # one run: a slice
    ],
)
def test_evenly_spaced_runs_are_gathered_by_one_strided_view(runs, gathered_by_one_view):
    from fp4convert.megatron.resolve import Piece

    for tensor in (torch.arange(34 * 3, dtype=torch.int32).reshape(34, 3), torch.arange(34, dtype=torch.int32)):
        piece = Piece("q", "qkv", None, runs, False)
        view = piece.strided(tensor)
        assert (view is not None) == gathered_by_one_view
        if view is not None:
            want = torch.cat([tensor[s : s + n] for s, n in runs])
            assert_bytes_equal(view.reshape(-1, *tensor.shape[1:]), want)
            assert_bytes_equal(piece_value(tensor, piece), want)
