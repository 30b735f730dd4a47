"""How one process cuts the source files into read streams (fp4convert.convert.parallel.split_streams)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from _helpers import NVFP4_EXPERTS

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.parallel import ShardJob, split_files_ahead, split_streams
from fp4convert.dialects import get_dialect
from fp4convert.plan import plan_conversion


def _by_source(plan):
    view = plan.source.view()
    out: dict = {}
    for item in plan.items:
        out.setdefault(item.source_file, []).append(item)
    for items in out.values():
        items.sort(key=lambda i: view.tensors[i.info.name].position)
    return out


@pytest.mark.parametrize("readers", [1, 2, 5, 64])
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "llama"])
def test_streams_cover_each_file_in_order_and_keep_fused_groups_whole(tiny_checkpoint, tmp_path, family, readers):
    plan = plan_conversion(
        open_checkpoint(tiny_checkpoint(family)), load_contract(NVFP4_EXPERTS), get_dialect("modelopt")
    )
    job = ShardJob(plan, tmp_path, sorted(plan.by_output_file()), (), {}, "cpu", None, workers=1, readers=readers)
    by_source = _by_source(plan)
    streams = split_streams(by_source, job)
    # every stream is a run of one file; the runs of a file, in order, are the file's items exactly
    for file, items in by_source.items():
        runs = [s for s in streams if s[0].source_file == file]
        assert [i.info.name for run in runs for i in run] == [i.info.name for i in items]
        assert all(i.source_file == file for run in runs for i in run)
        if readers == 1:
            assert len(runs) == 1
    alone = sum(len(s) == 1 for s in streams)  # large tensors add a cut before and after them
    assert len(streams) <= max(readers, len(by_source)) + 2 * alone
    if readers >= 2 * len(by_source):
        assert len(streams) > len(by_source)  # the files were cut
    # no fused group of one file has members in two streams (a group across files has its amax
    # agreed beforehand: groups_to_agree)
    where = {i.info.name: n for n, s in enumerate(streams) for i in s}
    file_of = {i.info.name: i.source_file for i in plan.items}
    checked = 0
    for members in plan.groups.values():
        if len({file_of[m] for m in members}) == 1:
            assert len({where[m] for m in members}) == 1
            checked += 1
    if family == "deepseek_v3":  # its tiny checkpoint keeps fused pairs in one file (the others spread them)
        assert checked


def test_groups_with_an_agreed_amax_may_be_cut(tiny_checkpoint, tmp_path):
    plan = plan_conversion(
        open_checkpoint(tiny_checkpoint("qwen3_moe")), load_contract(NVFP4_EXPERTS), get_dialect("modelopt")
    )
    agreed = dict.fromkeys(plan.groups, None)
    job = ShardJob(plan, tmp_path, sorted(plan.by_output_file()), (), agreed, "cpu", None, workers=1, readers=64)
    by_source = _by_source(plan)
    streams = split_streams(by_source, job)
    # nothing holds a cut back: as many runs as there are tensors, up to the readers' share
    assert len(streams) >= min(64, len(plan.items)) // 2


def test_a_tensor_of_half_a_runs_share_is_read_in_a_run_of_its_own():
    # two runs of a 190-byte file: the 50-byte tensor mid-file (over half a run's 95) gets a run of
    # its own (write_shards starts the runs with the largest tensors first); a cut by bytes alone
    # would leave it inside one
    def item(name: str, nbytes: int) -> SimpleNamespace:
        return SimpleNamespace(info=SimpleNamespace(name=name), bytes_before=nbytes,
                               decision=SimpleNamespace(fused_group=None))  # fmt: skip

    items = [item(n, b) for n, b in [("a", 30), ("b", 30), ("big", 50), ("c", 40), ("d", 20), ("e", 20)]]
    job = SimpleNamespace(readers=2, plan=SimpleNamespace(groups={}), group_amax={})
    streams = split_streams({"f.safetensors": items}, job)  # type: ignore[arg-type]
    assert [[i.info.name for i in s] for s in streams] == [["a", "b"], ["big"], ["c", "d", "e"]]


@pytest.mark.parametrize("readers", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "llama"])
def test_the_files_guessed_from_the_headers_are_the_files_cut_into_runs(tiny_checkpoint, tmp_path, family, readers):
    # convert starts hashing these before it plans; a wrong guess costs time, never bytes, so the
    # guess must match on checkpoints whose every tensor is converted
    ckpt = open_checkpoint(tiny_checkpoint(family))
    plan = plan_conversion(ckpt, load_contract(NVFP4_EXPERTS), get_dialect("modelopt"))
    job = ShardJob(plan, tmp_path, sorted(plan.by_output_file()), (), {}, "cpu", None, workers=1, readers=readers)
    streams = split_streams(_by_source(plan), job)
    runs_per_file = Counter(s[0].source_file for s in streams)
    assert set(split_files_ahead(ckpt, readers)) == {f for f, n in runs_per_file.items() if n > 1}
