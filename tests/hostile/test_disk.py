"""A full disk and a read-only destination: one error naming the file and what to do, no traceback,
the source unchanged, no complete-looking output; a conversion continues with ``--resume`` once
there is space, to the same bytes as an uninterrupted run.

Where this machine lets the test mount a tmpfs (root with ``mount``), the disk is real: a small
tmpfs fills up, a read-only tmpfs refuses writes. Everywhere, the same conditions are also simulated
at the operating-system boundary (``Path.open`` / ``Path.mkdir`` raising ENOSPC / EROFS), so the
behaviour is tested on every machine.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import NVFP4_EXPERTS, tree_hashes
from hostile.corpus import MANIFEST, assert_error, assert_same_output, run_cli

from fp4convert.checkpoint.staging import release
from fp4convert.convert.execute import convert_checkpoint


def _mount(path: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return result.returncode == 0


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)  # never leave a mount


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 KiB tmpfs (a converted tiny checkpoint needs about 300 KiB)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount(disk, "size=128k"):
        pytest.skip("no tmpfs can be mounted here; test_a_simulated_full_disk covers the behaviour")
    try:
        yield disk
    finally:
        _umount(disk)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder nothing can be written in: a read-only tmpfs, or (not root) a folder without write bits."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if not _mount(folder, "ro,size=64k"):
        pytest.skip("root, and no read-only tmpfs can be mounted: test_a_simulated_read_only_destination covers it")
    try:
        yield folder
    finally:
        _umount(folder)


@pytest.fixture
def source(good_inputs, tmp_path) -> tuple[Path, Path]:
    """(a copy of the tiny source, its uninterrupted conversion)."""
    src = tmp_path / "src"
    shutil.copytree(good_inputs[0], src)
    ref = tmp_path / "ref"
    convert_checkpoint(src, ref, contract=NVFP4_EXPERTS)
    return src, ref


def _convert(src: Path, dst: Path, *extra: str) -> list[object]:
    return ["convert", src, dst, "--contract", NVFP4_EXPERTS, "-q", *extra]


def test_a_full_disk_is_one_error_and_resume_finishes_once_there_is_space(small_disk, source):
    src, ref = source
    before = tree_hashes(src)
    dst = small_disk / "out"
    outcome = run_cli(_convert(src, dst))
    assert_error(outcome, r"cannot write .*out\.partial/.*: no space left on device \(ENOSPC\)")
    assert "continue with resume=True (--resume)" in outcome.stderr
    assert not dst.exists() and not (dst.with_name("out.partial") / MANIFEST).exists()
    assert tree_hashes(src) == before
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    assert run_cli(_convert(src, dst, "--resume")).code == 0
    assert_same_output(dst, ref)


def test_a_full_disk_under_dequantize_and_to_megatron(small_disk, source):
    src, ref = source
    assert_error(run_cli(["dequantize", ref, small_disk / "deq"]), r"no space left on device \(ENOSPC\)")
    assert not (small_disk / "deq").exists() and not (small_disk / "deq.partial").exists()
    assert_error(run_cli(["to-megatron", src, small_disk / "meg"]), r"no space left on device \(ENOSPC\)")
    assert not (small_disk / "meg").exists() and not (small_disk / "meg.partial" / "megatron.json").exists()
    release(small_disk / "meg.partial")  # to-megatron keeps its failed folder (and, in this process, its lock)


def _filling_pwrite(budget: list[int]):
    """``os.pwrite`` for a disk that takes ``budget`` more bytes of output shards, then raises ENOSPC."""
    real_pwrite = os.pwrite

    def pwrite(fd: int, data, offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".safetensors.tmp"):
            size = memoryview(data).nbytes
            if size > budget[0]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            budget[0] -= size
        return real_pwrite(fd, data, offset)

    return pwrite


def test_a_simulated_full_disk(source, tmp_path, monkeypatch):
    src, ref = source
    budget = [80_000]  # bytes of shards the "disk" still takes
    monkeypatch.setattr(os, "pwrite", _filling_pwrite(budget))  # the shard writer's only write call
    dst = tmp_path / "out"
    outcome = run_cli(_convert(src, dst))
    assert_error(
        outcome, r"cannot write .*out\.partial/model-0000\d-of-00008\.safetensors\.tmp: no space left on device"
    )
    assert "free space on that filesystem" in outcome.stderr and "--resume" in outcome.stderr
    staging = tmp_path / "out.partial"
    assert not dst.exists() and not list(staging.glob("*.tmp")) and not (staging / MANIFEST).exists()
    kept = sorted(p.name for p in staging.glob("*.safetensors"))
    assert kept and len(kept) < 8  # the shards written before the disk filled
    budget[0] = 1 << 30
    assert run_cli(_convert(src, dst, "--resume")).code == 0
    assert_same_output(dst, ref)


def test_a_read_only_destination(read_only, source):
    src, ref = source
    for argv in (
        _convert(src, read_only / "out"),
        ["dequantize", ref, read_only / "deq"],
        ["to-megatron", src, read_only / "meg"],
    ):
        assert_error(run_cli(argv), r"cannot create .*\.partial: (read-only file system|permission denied)")
    outcome = run_cli(["plan", NVFP4_EXPERTS, "--model", src, "--plot", read_only / "plan.png"])
    assert_error(outcome, r"plan\.png: (read-only file system|permission denied)")
    assert list(read_only.iterdir()) == []


def test_a_simulated_read_only_destination(source, tmp_path, monkeypatch):
    src, _ = source
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.endswith(".partial"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    outcome = run_cli(_convert(src, tmp_path / "out"))
    assert_error(outcome, r"cannot create .*out\.partial: read-only file system \(EROFS\)")
    assert "choose a writable destination" in outcome.stderr
