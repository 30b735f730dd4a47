"""A conversion split across 2 and 3 gloo ranks writes the single-process output, byte for byte.

The ranks are real processes (tests/_ranks.py: spawned, one gloo group, the store hosted by the
test process as torchrun's agent hosts it). Small output shards put fused siblings (gate/up,
q/k/v, MLA q_a/kv_a) on different ranks; each case asserts that some group really is split, so
the cross-rank agreement on the shared scale is what the equal bytes prove.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _helpers import CONTRACTS, NVFP4_EXPERTS
from _ranks import Cluster, assert_same_output, cross_rank_groups

from fp4convert.convert.execute import convert_checkpoint

DEEPSEEK_MXFP8 = CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml"

#: (model, dialect, contract, max shard size): fused groups land on several ranks in each
CASES = {
    "qwen3_moe": ("qwen3_moe", "modelopt", "all-linear", 40_000),
    "deepseek_v3": ("deepseek_v3", "compressed-tensors", "all-linear", 40_000),
}


def contract_path(name: str, all_linear: Path) -> Path:
    return {"all-linear": all_linear, "experts": NVFP4_EXPERTS}[name]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_write_the_single_process_output(case, world, clusters, tiny_checkpoint, all_linear, tmp_path):
    model, dialect, contract_name, size = CASES[case]
    src, contract = tiny_checkpoint(model), contract_path(contract_name, all_linear)
    assert cross_rank_groups(src, contract, dialect, size, world) > 0  # a shared scale agreed across ranks
    single = convert_checkpoint(src, tmp_path / "one", contract=contract, dialect=dialect, max_shard_size=size)
    out = clusters(world).run(
        "convert", str(src), str(tmp_path / "ranks"), contract=str(contract), dialect=dialect, max_shard_size=size
    )
    assert all(r["ok"] for r in out.values()), out
    assert {r["result"]["output_bytes"] for r in out.values()} == {single.output_bytes}
    assert_same_output(tmp_path / "one", tmp_path / "ranks")
    # every rank reports every rank's share: the shards and source bytes add up to the whole
    figures = out[0]["result"]["ranks"]
    assert all(r["result"]["ranks"] == figures for r in out.values())
    assert [f["rank"] for f in figures] == list(range(world)) and all(f["files"] > 0 for f in figures)
    assert sum(f["files"] for f in figures) == len(single.files) == single.ranks[0]["files"]
    assert sum(f["source_bytes"] for f in figures) == single.source_bytes == single.ranks[0]["source_bytes"]


def test_mxfp8_across_three_ranks(clusters, tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("deepseek_v3")
    convert_checkpoint(src, tmp_path / "one", contract=DEEPSEEK_MXFP8, dialect="sglang-mxfp8", max_shard_size=30_000)
    out = clusters(3).run(
        "convert",
        str(src),
        str(tmp_path / "ranks"),
        contract=str(DEEPSEEK_MXFP8),
        dialect="sglang-mxfp8",
        max_shard_size=30_000,
    )
    assert all(r["ok"] for r in out.values()), out
    assert_same_output(tmp_path / "one", tmp_path / "ranks")


def test_a_failing_rank_is_named_and_nothing_is_published(clusters, tiny_checkpoint, tmp_path):
    src, dst = tiny_checkpoint("qwen3_moe"), tmp_path / "out"
    out = clusters(2).run(
        "convert", str(src), str(dst), contract=str(NVFP4_EXPERTS), fail={"rank": 1, "after_tensors": 3}
    )
    assert out[1] == {"ok": False, "type": "RuntimeError", "message": "injected failure", "fields": {}}
    assert out[0]["type"] == "DistributedError" and out[0]["fields"]["rank"] == 1
    assert out[0]["message"].startswith("rank 1 failed: RuntimeError: injected failure; nothing was published")
    assert not dst.exists() and (tmp_path / "out.partial").is_dir()
    # The same command with --resume finishes it, on another number of ranks.
    done = clusters(3).run("convert", str(src), str(dst), contract=str(NVFP4_EXPERTS), resume=True)
    assert all(r["ok"] for r in done.values()), done
    convert_checkpoint(src, tmp_path / "one", contract=NVFP4_EXPERTS)
    assert_same_output(tmp_path / "one", dst)


def test_ranks_given_different_arguments_are_refused(clusters, tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    out = clusters(3).run(
        "convert", str(src), str(tmp_path / "out"), contract=str(NVFP4_EXPERTS), per_rank={2: {"overwrite": True}}
    )
    for r in range(3):
        assert out[r]["type"] == "DistributedError", out
        assert "different arguments: overwrite differs (rank 0: False, rank 2: True)" in out[r]["message"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_killed_rank_stops_the_others_and_resume_keeps_its_finished_shards(tiny_checkpoint, clusters, tmp_path):
    src, dst = tiny_checkpoint("qwen3_moe"), tmp_path / "out"
    doomed = Cluster(2)
    try:
        out = doomed.run(
            "convert",
            str(src),
            str(dst),
            contract=str(NVFP4_EXPERTS),
            rank_timeout=3.0,
            die={"rank": 1, "after_tensors": 20},
        )
    finally:
        doomed.close()
    assert out[1] == {"killed": True}
    assert out[0]["type"] == "DistributedError" and out[0]["fields"]["rank"] == 1
    assert "rank 1 stopped responding" in out[0]["message"]
    assert not dst.exists()
    partial = tmp_path / "out.partial"
    journal = json.loads((partial / ".fp4convert-journal.json").read_text())
    plan_files = sorted(p.name for p in partial.glob("*.safetensors"))
    assert plan_files and sorted(journal["files"]) == plan_files  # rank 1's finished shards reached rank 0's journal
    kept = shutil.copytree(partial, tmp_path / "kept")
    done = clusters(3).run("convert", str(src), str(dst), contract=str(NVFP4_EXPERTS), resume=True)
    assert all(r["ok"] for r in done.values()), done
    assert sorted(done[0]["result"]["resumed_files"]) == plan_files
    for name in plan_files:  # kept, not rewritten
        assert (kept / name).read_bytes() == (dst / name).read_bytes()
    convert_checkpoint(src, tmp_path / "one", contract=NVFP4_EXPERTS)
    assert_same_output(tmp_path / "one", dst)


def test_rank_0_shows_the_bytes_of_every_rank(clusters, tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("deepseek_v3")
    out = clusters(3).run(
        "convert",
        str(src),
        str(tmp_path / "out"),
        contract=str(NVFP4_EXPERTS),
        max_shard_size=40_000,
        count_progress=True,
    )
    assert all(r["ok"] for r in out.values()), out
    root = out[0]["progress"]
    total = out[0]["result"]["source_bytes"]
    assert root["total"] == total and root["tensor"] + root["bytes"] == total  # its own, plus the others'
    assert root["tensor"] < total and root["bytes"] > 0
    others = [out[r]["progress"] for r in (1, 2)]
    assert all("total" not in p and "bytes" not in p for p in others)  # one display: rank 0's
    assert root["tensor"] + sum(p.get("tensor", 0) for p in others) == total
