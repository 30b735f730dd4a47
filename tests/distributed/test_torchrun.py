"""The command line under ``torchrun``: ``-m fp4convert convert`` on 2 ranks, one report, the same bytes;
``verify --source`` on 2 ranks, one report, the single-process verdict."""

from __future__ import annotations

import json
import subprocess
import sys

from _helpers import NVFP4_EXPERTS
from _ranks import assert_same_output

from fp4convert.convert.execute import convert_checkpoint
from fp4convert.verify.checkpoint import verify_checkpoint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "fp4convert"]


def test_torchrun_two_ranks_print_one_report_and_write_the_single_process_bytes(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    single = convert_checkpoint(src, tmp_path / "one", contract=NVFP4_EXPERTS, max_shard_size=40_000)
    command = [
        *TORCHRUN, "convert", str(src), str(tmp_path / "two"), "--contract", str(NVFP4_EXPERTS),
        "--max-shard-size", "40KB", "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])  # rank 0's, and only rank 0's
    assert done.stdout.count('"destination"') == 1
    assert report["output_bytes"] == single.output_bytes and report["files"] == single.files
    assert_same_output(tmp_path / "one", tmp_path / "two")

    checked = subprocess.run(
        [*TORCHRUN, "verify", str(tmp_path / "two"), "--source", str(src), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    verdict = json.loads(checked.stdout[checked.stdout.index("{") :])
    assert checked.stdout.count('"compared_with_source"') == 1  # rank 0 prints, rank 1 does not
    alone = verify_checkpoint(tmp_path / "two", source=src)
    assert verdict["ok"] and verdict["compared_with_source"] and verdict["checks"] == len(alone.checks)
