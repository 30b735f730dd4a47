"""ModelTables: decisions per HF tensor, and the rows each HF tensor takes in a Megatron tensor."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal
from bridge.helpers import NVFP4_ALL

from fp4convert.bridge.tables import Piece, model_tables
from fp4convert.errors import MappingError
from fp4convert.families import megatron_to_hf


@pytest.mark.parametrize(
    ("model", "ep_rank", "ep_size"), [("qwen3_moe", 0, 1), ("qwen3_moe", 1, 2), ("deepseek_v3", 0, 1)]
)
def test_pieces_take_exactly_what_megatron_to_hf_gives(model, ep_rank, ep_size, megatron_state, config):
    tables = model_tables(NVFP4_ALL, config(model))
    family = tables.family
    for name, tensor in megatron_state(model, ep_rank=ep_rank, ep_size=ep_size).items():
        expected = megatron_to_hf({name: tensor}, family, config(model), ep_rank=ep_rank, ep_size=ep_size)
        pieces = tables.pieces(name, tuple(tensor.shape), ep_rank=ep_rank, ep_size=ep_size)
        assert [p.name for p in pieces] == list(expected)
        for piece in pieces:
            assert_bytes_equal(piece.take(tensor).contiguous(), expected[piece.name])


def test_row_ranges_are_views_and_qkv_rows_are_gathered(config):
    tables = model_tables(NVFP4_EXPERTS, config("qwen3_moe"))
    gate, up = tables.pieces("decoder.layers.0.mlp.experts.linear_fc1.weight1", (64, 64))
    assert (gate.rows, up.rows) == (slice(0, 32), slice(32, 64))
    fc1 = torch.randn(64, 64)
    assert gate.take(fc1).data_ptr() == fc1.data_ptr()  # a view, no copy
    q, k, v = tables.pieces("decoder.layers.0.self_attention.linear_qkv.weight", (128, 64))
    # 2 query groups of 2 heads (head_dim 16): [q0 q1 k0 v0 | q2 q3 k1 v1]
    assert q.rows.tolist() == [*range(0, 32), *range(64, 96)]
    assert (k.rows.tolist(), v.rows.tolist()) == (
        [*range(32, 48), *range(96, 112)],
        [*range(48, 64), *range(112, 128)],
    )
    norm = tables.pieces("decoder.final_layernorm.weight", (64,))
    assert [(p.name, p.rows, p.shape) for p in norm] == [("model.norm.weight", None, (64,))]
    assert tables.pieces("decoder.final_layernorm.weight", (64,)) is norm  # cached


def test_decisions_groups_and_naming(config):
    tables = model_tables(NVFP4_EXPERTS, config("qwen3_moe"))
    assert tables is model_tables(NVFP4_EXPERTS, config("qwen3_moe"))  # one build per contract and model
    gate = "model.layers.0.mlp.experts.1.gate_proj.weight"
    assert tables.members(gate) == (gate, gate.replace("gate_proj", "up_proj"))
    assert tables.members("model.layers.0.mlp.experts.1.down_proj.weight") == (
        "model.layers.0.mlp.experts.1.down_proj.weight",
    )
    assert tables.experts_on_rank(1, 2) == range(2, 4) and tables.num_experts == 4
    assert tables.naming(["model.norm.weight"]) == "hf"
    assert tables.naming(["decoder.final_layernorm.weight"]) == "megatron"
    with pytest.raises(MappingError, match=r"^the tensors mix HF names \(`model\.norm\.weight`\) and other names"):
        tables.naming(["model.norm.weight", "decoder.final_layernorm.weight"])
    with pytest.raises(MappingError, match=r"^4 experts cannot be split over EP size 3"):
        tables.experts_on_rank(0, 3)
    with pytest.raises(MappingError, match=r"^family 'llama' was given, but config\.json describes a qwen3_moe model"):
        model_tables(NVFP4_EXPERTS, config("qwen3_moe"), "llama")


def test_a_tensor_parallel_shard_is_refused_with_its_shapes(config):
    tables = model_tables(NVFP4_EXPERTS, config("qwen3_moe"))
    with pytest.raises(
        MappingError,
        match=r"^`decoder\.layers\.0\.mlp\.experts\.linear_fc1\.weight1` \(64, 32\) gives "
        r"`model\.layers\.0\.mlp\.experts\.1\.gate_proj\.weight` of shape \(32, 32\), "
        r"but the config says \(32, 64\)",
    ):
        tables.pieces("decoder.layers.0.mlp.experts.linear_fc1.weight1", (64, 32))
    assert isinstance(Piece("a", "b", None, (1,)).take(torch.zeros(1)), torch.Tensor)
