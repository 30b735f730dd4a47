"""Quantized and fused sources split across ranks: the single-process bytes, and verify agrees.

An FP8 block-scaled DeepSeek-V3 (every Linear in FP8 with its ``weight_scale_inv``, MLA and the MTP
layer included) and an MXFP4 source whose experts are fused 3-D ``*_blocks`` / ``*_scales``
(one read unit yields an expert's gate and up, which are a fused group) go through the one
dequantizer on every rank; small output shards put fused groups, and the two halves of one
fused read unit, on different ranks.
"""

from __future__ import annotations

import _sources
import pytest
from _ranks import assert_same_output, cross_rank_groups

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.distributed import share_shards
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.dialects import get_dialect
from fp4convert.plan import plan_conversion
from fp4convert.verify.checkpoint import verify_checkpoint

#: kind -> (tiny model, builder of the source from its BF16 checkpoint, dialect)
SOURCES = {
    "fp8-deepseek_v3": ("deepseek_v3", _sources.fp8_checkpoint, "compressed-tensors"),
    "mxfp4-qwen3_moe": ("qwen3_moe", _sources.mxfp4_checkpoint, "modelopt"),
}


def split_read_units(source, contract, dialect: str, max_shard_size: int, world: int) -> int:
    """Read units yielding several tensors (a fused expert's gate and up) written by several ranks."""
    ckpt = open_checkpoint(source)
    plan = plan_conversion(ckpt, load_contract(contract), get_dialect(dialect), max_shard_size=max_shard_size)
    owner = share_shards(plan, list(plan.by_output_file()), world)
    rank_of = {item.info.name: owner[item.output_file] for item in plan.items}
    units = ckpt.view().units.values()
    return sum(len({rank_of[name] for name in unit.outputs if name in rank_of}) > 1 for unit in units)


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_quantized_source_across_three_ranks_writes_the_single_process_bytes(
    kind, clusters, tiny_checkpoint, all_linear, tmp_path
):
    model, make, dialect = SOURCES[kind]
    src = make(tiny_checkpoint(model), tmp_path / "source")
    assert cross_rank_groups(src, all_linear, dialect, 40_000, 3) > 0
    assert (split_read_units(src, all_linear, dialect, 40_000, 3) > 0) == kind.startswith("mxfp4")
    convert_checkpoint(src, tmp_path / "one", contract=all_linear, dialect=dialect, max_shard_size=40_000)
    out = clusters(3).run(
        "convert", str(src), str(tmp_path / "ranks"), contract=str(all_linear), dialect=dialect, max_shard_size=40_000
    )
    assert all(r["ok"] for r in out.values()), out
    assert_same_output(tmp_path / "one", tmp_path / "ranks")
    alone = verify_checkpoint(tmp_path / "ranks", source=src)
    assert alone.ok, alone.summary()
    got = clusters(3).run("verify", str(tmp_path / "ranks"), source=str(src))
    assert all(r["ok"] and r["result"]["ok"] for r in got.values()), got
    assert {r["result"]["checks"] for r in got.values()} == {len(alone.checks)}
