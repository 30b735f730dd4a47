"""Who does what in a split run: shards by bytes, one hashing rank per source file, agreed group scales."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS

from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.distributed import hash_owners, shard_bytes, share_shards
from fp4convert.convert.group_amax import agree_group_amaxes, groups_to_agree
from fp4convert.dialects import get_dialect
from fp4convert.plan import plan_conversion, shared_amax
from fp4convert.ranks import Team


@pytest.fixture
def plan(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    return plan_conversion(ckpt, load_contract(NVFP4_EXPERTS), get_dialect("modelopt"), max_shard_size=40_000)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_every_shard_and_source_file_has_exactly_one_rank(plan, world):
    files = list(plan.by_output_file())
    owner = share_shards(plan, files, world)
    assert sorted(owner) == sorted(files) and set(owner.values()) <= set(range(world))
    ranks = [owner[f] for f in files]
    assert ranks == sorted(ranks)  # contiguous parts, in order
    hashers = hash_owners(plan, owner, world)
    assert sorted(hashers) == sorted(plan.source.shards)
    for source_file, rank in hashers.items():  # the rank reading most of the file hashes it
        read = {}
        for item in plan.items:
            if item.source_file == source_file:
                read[owner[item.output_file]] = read.get(owner[item.output_file], 0) + item.bytes_before
        assert read[rank] == max(read.values())


def test_files_nobody_reads_are_hashed_by_the_least_loaded_rank(plan):
    sizes = shard_bytes(plan)
    writing = list(sizes)[-1:]  # a resumed run with one shard left
    owner = share_shards(plan, writing, 3)
    hashers = hash_owners(plan, owner, 3)
    assert sorted(hashers) == sorted(plan.source.shards)
    assert len(set(hashers.values())) > 1  # the unread files are spread, not all on one rank


def test_a_resumed_run_reads_kept_siblings_for_the_scale_and_agrees_the_single_process_value(plan):
    items = {i.info.name: i for i in plan.items}
    group, members = next(
        (g, m) for g, m in plan.groups.items() if len({items[n].output_file for n in m}) > 1
    )  # a group split over two shards
    writing = [items[members[0]].output_file]  # the other member's shard is kept
    owner = share_shards(plan, writing, 2)
    agreed = groups_to_agree(plan, owner, writing)
    assert agreed[group] == {m: owner[writing[0]] for m in members}  # the writer reads the kept sibling
    reader = SourceReader(plan.source)
    try:
        expected = shared_amax([reader.read(m) for m in members])
    finally:
        reader.close()
    got = agree_group_amaxes(plan, {group: agreed[group]}, Team())
    assert torch.equal(got[group].view(torch.int32), expected.view(torch.int32))
