"""Source file hashes from the bytes read: the sha256 of the whole file whatever was offered, in any order."""

from __future__ import annotations

import random

import pytest
import torch

from fp4convert.checkpoint.file_hashes import SourceHashes
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.errors import CheckpointError


def offers(ckpt):
    """(file, start, tensor bytes) for every stored tensor, in file and data order."""
    out = []
    for file, entries in ckpt.shards.items():
        with SafetensorsFile(ckpt.root / file) as f:
            out += [(file, e.start, f.read_bytes(name)) for name, e in entries.items()]
    return out


@pytest.mark.parametrize("fill_gaps", [False, True])
@pytest.mark.parametrize("order", ["file", "reversed", "shuffled", "every-other", "none"])
def test_every_file_hashes_whole_whatever_was_offered(tiny_checkpoint, order, fill_gaps):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    chosen = offers(ckpt)
    if order == "reversed":
        chosen = chosen[::-1]
    elif order == "shuffled":
        random.Random(0).shuffle(chosen)
    elif order == "every-other":
        chosen = chosen[::2]
    elif order == "none":
        chosen = []
    hashes = SourceHashes(ckpt, fill_gaps=fill_gaps)
    try:
        for file, start, data in chosen * 2:  # repeated offers are ignored
            hashes.offer(file, start, data)
        got = hashes.hexdigests()
    finally:
        hashes.close()
    assert got == {file: file_sha256(ckpt.root / file) for file in ckpt.shards}


def test_only_the_files_in_scope_are_hashed_and_a_small_hold_limit_still_hashes_right(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    mine = list(ckpt.shards)[1::2]
    hashes = SourceHashes(ckpt, files=mine, hold_bytes=1000)  # most offers ahead are dropped, then re-read
    try:
        for file, start, data in offers(ckpt)[::-1]:
            hashes.offer(file, start, data)
        assert hashes.hexdigests() == {file: file_sha256(ckpt.root / file) for file in mine}
    finally:
        hashes.close()


def test_finished_lists_only_files_read_to_their_end(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    first, second = list(ckpt.shards)[:2]
    hashes = SourceHashes(ckpt)
    try:
        for file, start, data in offers(ckpt):
            if file == first or (file == second and start == min(e.start for e in ckpt.shards[second].values())):
                hashes.offer(file, start, data)
        assert hashes.finished() == {first: file_sha256(ckpt.root / first)}
    finally:
        hashes.close()


def test_a_file_shorter_than_its_header_says_is_an_error(tiny_checkpoint, tmp_path):
    import shutil

    src = shutil.copytree(tiny_checkpoint("qwen3_moe"), tmp_path / "src")
    ckpt = open_checkpoint(src)
    file = next(iter(ckpt.shards))
    with (src / file).open("r+b") as f:  # cut the file after its headers were read
        f.truncate((src / file).stat().st_size // 2)
    hashes = SourceHashes(ckpt, files=[file], fill_gaps=True)
    try:
        last = list(ckpt.shards[file].values())[-1]
        with pytest.raises(CheckpointError, match=r"ends at byte \d+, before byte \d+ that its header gives a tensor"):
            hashes.offer(file, last.start, torch.zeros(last.nbytes, dtype=torch.uint8))
            hashes.hexdigests()
    finally:
        hashes.close()


def test_whole_file_hashes_in_child_processes_match_and_threads_may_ask_at_once(tiny_checkpoint):
    from concurrent.futures import ThreadPoolExecutor

    from fp4convert.checkpoint.file_hashes import FileHashes

    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    files = list(ckpt.shards)
    hashes = FileHashes(ckpt.root, files)
    # shards finishing on several threads ask at once: each child's output is collected once
    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(lambda _: hashes.hexdigests(), range(16)))
    expected = {f: file_sha256(ckpt.root / f) for f in files}
    assert all(s == expected for s in seen)
    assert hashes.finished() == expected
    hashes.close()


def test_a_file_the_child_cannot_read_is_an_error_naming_it(tmp_path):
    from fp4convert.checkpoint.file_hashes import FileHashes

    hashes = FileHashes(tmp_path, ["gone.safetensors"])
    with pytest.raises(CheckpointError, match=r"gone\.safetensors: could not be read") as info:
        hashes.hexdigests()
    assert info.value.file == "gone.safetensors"
    hashes.close()


def test_close_stops_a_child_still_hashing(tmp_path):
    import time

    from fp4convert.checkpoint.file_hashes import FileHashes

    with (tmp_path / "huge.safetensors").open("wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte: minutes of hashing
    hashes = FileHashes(tmp_path, ["huge.safetensors"])
    assert hashes.finished() == {}
    started = time.monotonic()
    hashes.close()
    assert time.monotonic() - started < 10
    assert all(child.returncode is not None and child.returncode < 0 for child in hashes._children.values())


def test_a_file_whose_bytes_differ_from_its_size_is_an_error_not_a_hash():
    # a file that grows or shrinks while it is hashed would give the sha256 of other bytes than
    # the ones converted; /proc files say 0 bytes and read more: the child's check, deterministically
    from fp4convert.checkpoint.file_hashes import FileHashes

    changed = r"cmdline: .*changed while it was hashed: 0 bytes when opened, \d+ read"
    with FileHashes("/proc/self", ["cmdline"]) as hashes, pytest.raises(CheckpointError, match=changed):
        hashes.hexdigests()


def test_hashes_started_later_join_those_under_way(tiny_checkpoint):
    from fp4convert.checkpoint.file_hashes import FileHashes

    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    files = list(ckpt.shards)
    with FileHashes(ckpt.root, files[:3]) as hashes:
        hashes.start(files[1:])  # a file started twice is hashed once
        assert hashes.files == files
        assert hashes.hexdigests() == {f: file_sha256(ckpt.root / f) for f in files}
