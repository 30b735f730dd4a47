"""Pure transforms: the exact QKV interleave of checkpoint-formats.md 5.4, gate/up, expert ids.

The expected layouts are built here independently, row by row from the spec's index formulas
("q rows of group g start at g·(h+2)·d; k rows at (g·(h+2)+h)·d; v rows at (g·(h+2)+h+1)·d"),
and every equality compares bytes.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4convert.errors import MappingError
from fp4convert.families.transforms import (
    global_to_local_expert,
    local_to_global_expert,
    merge_gate_up,
    merge_qkv,
    split_gate_up,
    split_qkv,
)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert_bytes_equal(actual, expected)


def _rows_by_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nq: int, ng: int) -> torch.Tensor:
    """Megatron linear_qkv assembled row by row from the spec's row-index formulas."""
    d = k.shape[0] // ng
    h = nq // ng
    out = torch.empty((nq + 2 * ng) * d, *q.shape[1:], dtype=q.dtype)
    for g in range(ng):
        q_start, k_start, v_start = g * (h + 2) * d, (g * (h + 2) + h) * d, (g * (h + 2) + h + 1) * d
        out[q_start : q_start + h * d] = q[g * h * d : (g + 1) * h * d]
        out[k_start : k_start + d] = k[g * d : (g + 1) * d]
        out[v_start : v_start + d] = v[g * d : (g + 1) * d]
    return out


def _distinct(rows: int, *rest: int, offset: int = 0) -> torch.Tensor:
    # Every element different (float32 holds these integers exactly), so a misplaced row shows.
    count = rows * torch.Size(rest).numel()
    return (torch.arange(count, dtype=torch.float32) + offset).reshape(rows, *rest)


@pytest.mark.parametrize(("nq", "ng", "d", "hidden"), [(4, 2, 3, 5), (8, 1, 2, 3), (6, 6, 2, 4), (12, 4, 4, 8)])
def test_merge_qkv_places_rows_as_the_spec_says(nq: int, ng: int, d: int, hidden: int) -> None:
    q = _distinct(nq * d, hidden)
    k = _distinct(ng * d, hidden, offset=10_000)
    v = _distinct(ng * d, hidden, offset=20_000)
    merged = merge_qkv(q, k, v, num_query_groups=ng)
    assert_same(merged, _rows_by_spec(q, k, v, nq, ng))


def test_merge_qkv_interleaves_biases_like_weight_rows() -> None:
    q, k, v = _distinct(8), _distinct(4, offset=100), _distinct(4, offset=200)
    merged = merge_qkv(q, k, v, num_query_groups=2)
    assert_same(merged, _rows_by_spec(q, k, v, nq=4, ng=2))


@settings(max_examples=60, deadline=None)
@given(
    ng=st.integers(1, 4),
    heads_per_group=st.integers(1, 4),
    d=st.integers(1, 5),
    rest=st.sampled_from([(), (3,), (7,)]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_split_undoes_merge_bit_for_bit(
    ng: int, heads_per_group: int, d: int, rest: tuple[int, ...], dtype: torch.dtype, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    nq = ng * heads_per_group
    q, k, v = (torch.randn(n * d, *rest, generator=generator).to(dtype) for n in (nq, ng, ng))
    q.view(-1)[0] = float("nan")  # NaN and -0.0 must survive as bytes
    k.view(-1)[0] = -0.0
    merged = merge_qkv(q, k, v, num_query_groups=ng)
    assert_same(merged, _rows_by_spec(q, k, v, nq, ng))
    for original, back in zip((q, k, v), split_qkv(merged, num_attention_heads=nq, num_query_groups=ng), strict=True):
        assert_same(back, original)


def test_split_pieces_own_their_memory() -> None:
    qkv = _distinct(16, 4)
    for piece in split_qkv(qkv, num_attention_heads=4, num_query_groups=2):
        assert piece.is_contiguous()
        assert piece.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    for piece in split_gate_up(qkv):
        assert piece.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()


def test_merge_qkv_refuses_shapes_that_are_not_one_projection() -> None:
    with pytest.raises(MappingError, match=r"^k has 6 rows, not a multiple of num_query_groups 4"):
        merge_qkv(_distinct(8, 2), _distinct(6, 2), _distinct(6, 2), num_query_groups=4)
    with pytest.raises(MappingError, match=r"do not form one QKV projection"):
        merge_qkv(_distinct(8, 2), _distinct(4, 2), _distinct(4, 3), num_query_groups=2)
    with pytest.raises(MappingError, match=r"^q has 6 rows, not a multiple of num_query_groups x head_dim"):
        merge_qkv(_distinct(6, 2), _distinct(4, 2), _distinct(4, 2), num_query_groups=1)


def test_split_qkv_refuses_row_counts_that_do_not_fit() -> None:
    with pytest.raises(MappingError, match=r"^linear_qkv has shape \(10, 2\); its rows are not a multiple"):
        split_qkv(_distinct(10, 2), num_attention_heads=4, num_query_groups=2)
    with pytest.raises(MappingError, match=r"^num_attention_heads 5 is not a multiple of num_query_groups 2"):
        split_qkv(_distinct(18, 2), num_attention_heads=5, num_query_groups=2)


def test_gate_up_is_a_row_concatenation_and_splits_back() -> None:
    gate, up = _distinct(6, 4), _distinct(6, 4, offset=1000)
    fc1 = merge_gate_up(gate, up)
    assert_same(fc1[:6], gate)
    assert_same(fc1[6:], up)
    back_gate, back_up = split_gate_up(fc1)
    assert_same(back_gate, gate)
    assert_same(back_up, up)


def test_gate_up_refuses_mismatches() -> None:
    with pytest.raises(MappingError, match=r"^gate \(6, 4\) torch.float32 and up \(6, 3\) torch.float32 differ"):
        merge_gate_up(_distinct(6, 4), _distinct(6, 3))
    with pytest.raises(MappingError, match=r"^linear_fc1 has shape \(5, 4\); gate and up need an even"):
        split_gate_up(_distinct(5, 4))


@given(num_local=st.integers(1, 64), ep_rank=st.integers(0, 31), local=st.integers(0, 63))
def test_expert_ids_round_trip(num_local: int, ep_rank: int, local: int) -> None:
    if local >= num_local:
        with pytest.raises(MappingError, match=r"^local expert .* is out of range"):
            local_to_global_expert(local, ep_rank=ep_rank, num_local_experts=num_local)
        return
    global_id = local_to_global_expert(local, ep_rank=ep_rank, num_local_experts=num_local)
    assert global_id == ep_rank * num_local + local
    assert global_to_local_expert(global_id, num_local_experts=num_local) == (ep_rank, local)


def test_global_to_local_refuses_bad_geometry() -> None:
    with pytest.raises(MappingError, match=r"^cannot place global expert 3 with 0 experts per rank"):
        global_to_local_expert(3, num_local_experts=0)
