"""kill -9 and Ctrl-C at several points of a conversion, then ``--resume``: the output is byte-identical
to an uninterrupted run (the manifest's creation time aside); two runs on one DST never interleave.

One helper process (:mod:`hostile.interrupt_driver`) forks a child per interrupted run; everything
else (the reference conversion, the concurrent attempts, the resumes) runs in this process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import NVFP4_EXPERTS, tree_hashes
from hostile.corpus import MANIFEST, assert_error, assert_same_output, run_cli

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.convert.integrity import shard_inputs, source_stats, unchanged_inputs
from fp4convert.dialects import get_dialect
from fp4convert.plan import plan_conversion

DRIVER = Path(__file__).with_name("interrupt_driver.py")
JOURNAL = ".fp4convert-journal.json"

# name -> (point, signal): where each conversion is stopped
CONVERSIONS = {
    "kill-first-read": ("read:1", "KILL"),
    "kill-mid-shard": ("read:9", "KILL"),
    "kill-between-shards": ("record:2", "KILL"),
    "kill-before-verify": ("verify", "KILL"),
    "kill-before-publish": ("publish", "KILL"),
    "ctrl-c-mid-shard": ("read:12", "INT"),
    "ctrl-c-between-shards": ("record:1", "INT"),
}


def _convert_argv(src: Path, dst: Path, *extra: str) -> list[str]:
    return ["convert", str(src), str(dst), "--contract", str(NVFP4_EXPERTS), "-q", *extra]


@pytest.fixture(scope="module")
def interrupted(good_inputs, tmp_path_factory):
    """Run the driver once: every interrupted run, and one paused run other runs collide with."""
    root = tmp_path_factory.mktemp("interrupts")
    src = root / "src"
    shutil.copytree(good_inputs[0], src)
    ref = root / "ref"
    convert_checkpoint(src, ref, contract=NVFP4_EXPERTS)
    source_before = tree_hashes(src)
    runs = [
        {"name": name, "point": point, "signal": sig, "argv": _convert_argv(src, root / name)}
        for name, (point, sig) in CONVERSIONS.items()
    ]
    runs += [
        {
            "name": "kill-dequantize",
            "point": "write:5",
            "signal": "KILL",
            "argv": ["dequantize", str(ref), str(root / "kill-dequantize")],
        },
        {
            "name": "ctrl-c-dequantize",
            "point": "write:5",
            "signal": "INT",
            "argv": ["dequantize", str(ref), str(root / "ctrl-c-dequantize")],
        },
        {
            "name": "kill-to-megatron",
            "point": "write:5",
            "signal": "KILL",
            "argv": ["to-megatron", str(src), str(root / "kill-to-megatron")],
        },
    ]
    ready, go = root / "ready", root / "go"
    runs.append({"name": "paused", "pause": [str(ready), str(go)], "argv": _convert_argv(src, root / "shared")})
    for run in runs:
        run["stderr"] = str(root / f"{run['name']}.stderr")
    spec = root / "spec.json"
    spec.write_text(json.dumps({"runs": runs}))
    driver = subprocess.Popen([sys.executable, str(DRIVER), str(spec)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not ready.exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    collisions = {}
    if ready.exists():  # the paused run holds root/shared.partial: every other run on it is refused
        before = tree_hashes(root / "shared.partial")
        for label, argv in {
            "convert": _convert_argv(src, root / "shared"),
            "convert --resume": _convert_argv(src, root / "shared", "--resume"),
            "convert --overwrite": _convert_argv(src, root / "shared", "--overwrite"),
            "dequantize": ["dequantize", str(ref), str(root / "shared")],
            "to-megatron --overwrite": ["to-megatron", str(src), str(root / "shared"), "--overwrite"],
        }.items():
            collisions[label] = run_cli(argv)
        collisions["untouched"] = tree_hashes(root / "shared.partial") == before
    go.touch()
    out, _ = driver.communicate(timeout=240)
    assert driver.returncode == 0, out
    ended = {r["name"]: r for r in json.loads(out)}
    assert tree_hashes(src) == source_before  # no run, interrupted or refused, touched the source
    shutil.copytree(root / "kill-between-shards.partial", root / "kept.partial", symlinks=True)
    return root, src, ref, ended, collisions


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_an_interrupted_conversion_resumes_to_the_same_bytes(interrupted, name):
    root, src, ref, ended, _ = interrupted
    point, sig = CONVERSIONS[name]
    dst, staging = root / name, root / f"{name}.partial"
    if sig == "KILL":
        assert ended[name]["ended"] == "signal 9"
    else:
        assert ended[name]["ended"] == "exit 130" and ended[name]["stderr"].strip().endswith("Aborted.")
        assert "Traceback" not in ended[name]["stderr"]
    assert not dst.exists() and staging.is_dir()
    if point not in ("verify", "publish"):  # the manifest is written last, just before verification
        assert not (staging / MANIFEST).exists()
    without_resume = run_cli(_convert_argv(src, dst))
    assert without_resume.code == 1 and "holds an interrupted conversion" in without_resume.stderr
    resumed = run_cli(_convert_argv(src, dst, "--resume"))
    assert resumed.code == 0, resumed.text()
    assert not staging.exists()
    assert_same_output(dst, ref)


def test_shards_finished_before_an_interruption_are_kept(interrupted, tmp_path):
    root, src, ref, _, _ = interrupted
    copy = tmp_path / "dst"
    shutil.copytree(root / "kept.partial", tmp_path / "dst.partial")
    finished = sorted(json.loads((root / "kept.partial" / JOURNAL).read_text())["files"])
    report = convert_checkpoint(src, copy, contract=NVFP4_EXPERTS, resume=True)
    # Every finished shard is kept: the source files it was made from were hashed whole by the
    # interrupted run, or keep the stat fingerprint that run recorded when it began.
    assert finished and sorted(report.resumed_files) == finished
    assert_same_output(copy, ref)


def test_a_copied_source_keeps_only_the_shards_made_from_files_hashed_whole(interrupted, tmp_path):
    """A copy of the source has other inodes and ctimes, so the stat fingerprints the interrupted run
    recorded no longer vouch for it: only the finished shards whose every input the interrupted run
    hashed whole (and that still hash the same) are kept; the output is the same bytes."""
    root, src, ref, _, _ = interrupted
    journal = json.loads((root / "kept.partial" / JOURNAL).read_text())
    copied = shutil.copytree(src, tmp_path / "src")
    plan = plan_conversion(open_checkpoint(copied), load_contract(NVFP4_EXPERTS), get_dialect("modelopt"))
    by_file = plan.by_output_file()
    vouched = sorted(f for f in journal["files"] if shard_inputs(plan, by_file[f]) <= set(journal["sources"]))
    shutil.copytree(root / "kept.partial", tmp_path / "dst.partial")
    report = convert_checkpoint(copied, tmp_path / "dst", contract=NVFP4_EXPERTS, resume=True)
    assert sorted(report.resumed_files) == vouched
    for path in sorted(ref.iterdir()):  # the same bytes (the manifest names the other source folder)
        got = tmp_path / "dst" / path.name
        if path.name == MANIFEST:
            assert json.loads(got.read_text())["tensors"] == json.loads(path.read_text())["tensors"]
        else:
            assert got.read_bytes() == path.read_bytes(), path.name


def test_stat_fingerprints_vouch_only_for_unchanged_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"1234")
    b.write_bytes(b"5678")
    before = source_stats(tmp_path, ["a", "b"])
    assert unchanged_inputs(["a", "b"], {}, before, source_stats(tmp_path, ["a", "b"]))
    time.sleep(0.05)  # past the filesystem's timestamp granularity
    b.write_bytes(b"5678")  # the same bytes, written again: the ctime moves
    now = source_stats(tmp_path, ["a", "b"])
    assert not unchanged_inputs(["a", "b"], {}, before, now)
    assert unchanged_inputs(["a", "b"], {"b": "hashed whole"}, before, now)  # a recorded sha256 vouches for it
    assert not unchanged_inputs(["c"], {}, before, now)  # never recorded at all


@pytest.mark.parametrize("name", ["kill-dequantize", "ctrl-c-dequantize", "kill-to-megatron"])
def test_other_writers_leave_no_complete_looking_output(interrupted, name):
    root, _, _, ended, _ = interrupted
    assert ended[name]["ended"] == ("exit 130" if name.startswith("ctrl-c") else "signal 9")
    assert not (root / name).exists()
    staging = root / f"{name}.partial"
    if name.startswith("ctrl-c"):
        assert not staging.exists()  # not resumable: removed on the way out
    else:
        assert not (staging / "megatron.json").exists() and not (staging / MANIFEST).exists()


@pytest.mark.parametrize(
    "label", ["convert", "convert --resume", "convert --overwrite", "dequantize", "to-megatron --overwrite"]
)
def test_a_second_run_on_a_busy_destination_is_refused(interrupted, label):
    _, _, _, ended, collisions = interrupted
    assert ended["paused"]["ended"] == "exit 0"
    assert_error(collisions[label], r"shared\.partial is being written by another fp4convert run")
    assert collisions["untouched"]  # nobody removed or wrote the running conversion's files


def test_the_run_that_held_the_lock_finished_and_verifies(interrupted):
    root, src, ref, _, _ = interrupted
    assert not (root / "shared.partial").exists()
    assert_same_output(root / "shared", ref)
    assert run_cli(["verify", root / "shared", "--source", src]).code == 0
