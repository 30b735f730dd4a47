"""Atomic output folders, the resume journal, and the hashing source reader."""

from __future__ import annotations

import json

import pytest

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.checkpoint.staging import JOURNAL, Journal, prepare_staging, publish, write_json_atomic
from fp4convert.errors import ConversionError
from fp4convert.inventory.dtypes import safetensors_code


@pytest.fixture
def folders(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("source")
    return src, tmp_path / "dst"


def test_staging_is_created_next_to_the_destination(folders):
    src, dst = folders
    staging = prepare_staging(src, dst, overwrite=False)
    assert staging == dst.with_name("dst.partial") and staging.is_dir() and not dst.exists()


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_a_destination_overlapping_the_source_is_refused(folders, where):
    src, _ = folders
    dst = {"same": src, "inside": src / "out", "around": src.parent}[where]
    with pytest.raises(ConversionError, match=r"overlaps the source"):
        prepare_staging(src, dst, overwrite=True)
    assert sorted(p.name for p in src.iterdir()) == ["a.txt"]


def test_an_existing_destination_needs_overwrite_and_the_hint_speaks_to_both_callers(folders):
    src, dst = folders
    dst.mkdir()
    with pytest.raises(ConversionError) as info:
        prepare_staging(src, dst, overwrite=False)
    assert info.value.hint == "pass overwrite=True (--overwrite) to replace it, or choose another folder"
    assert prepare_staging(src, dst, overwrite=True).is_dir()


def test_an_interrupted_run_is_kept_for_resume_and_cleared_by_overwrite(folders):
    src, dst = folders
    staging = prepare_staging(src, dst, overwrite=False)
    (staging / "model.safetensors").write_bytes(b"half")
    with pytest.raises(ConversionError, match=r"interrupted conversion; pass resume=True \(--resume\)"):
        prepare_staging(src, dst, overwrite=False)
    with pytest.raises(ConversionError) as info:
        prepare_staging(src, dst, overwrite=False, resumable=False)
    assert "resume" not in (info.value.hint or "")
    assert (prepare_staging(src, dst, overwrite=False, resume=True) / "model.safetensors").read_bytes() == b"half"
    assert list(prepare_staging(src, dst, overwrite=True).iterdir()) == []


def test_publish_swaps_the_finished_folder_into_place(folders):
    src, dst = folders
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    staging = prepare_staging(src, dst, overwrite=True)
    (staging / "new.txt").write_text("new")
    publish(staging, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in dst.parent.iterdir()) == ["dst", "src"]  # no .partial, no .old-* left


def test_write_json_atomic_replaces_a_symlink_left_at_its_temporary_name(folders):
    src, dst = folders
    staging = prepare_staging(src, dst, overwrite=False)
    (staging / "config.json.tmp").symlink_to(src / "a.txt")
    write_json_atomic(staging / "config.json", {"x": 1})
    assert json.loads((staging / "config.json").read_text()) == {"x": 1}
    assert (src / "a.txt").read_text() == "source" and not (staging / "config.json.tmp").exists()


def test_the_journal_remembers_finished_shards_of_the_same_job_only(folders):
    src, dst = folders
    staging = prepare_staging(src, dst, overwrite=False)
    journal = Journal(staging, "job-1", resume=False)
    assert (staging / JOURNAL).is_file() and journal.finished("model.safetensors") is None
    journal.record("model.safetensors", {"w": "ab"})
    assert Journal(staging, "job-1", resume=True).finished("model.safetensors") == {"w": "ab"}
    assert Journal(staging, "job-1", resume=False).finished("model.safetensors") is None  # starts afresh
    Journal(staging, "job-1", resume=False).record("x.safetensors", {})
    with pytest.raises(ConversionError, match=r"was started with another contract"):
        Journal(staging, "job-2", resume=True)
    (staging / JOURNAL).write_text("{truncated")
    with pytest.raises(ConversionError, match=r"is unreadable: the interrupted run cannot be resumed"):
        Journal(staging, "job-1", resume=True)
    (staging / JOURNAL).write_text("[]")
    with pytest.raises(ConversionError, match=r"is unreadable"):
        Journal(staging, "job-1", resume=True)


@pytest.mark.parametrize("order", ["file", "reversed"])
def test_the_reader_hashes_every_shard_whatever_the_read_order(tiny_checkpoint, order):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    names = [n for entries in ckpt.shards.values() for n in entries]
    reader = SourceReader(ckpt)
    try:
        for name in names if order == "file" else names[::-1]:
            tensor = reader.read(name)
            entry = ckpt.entry(name)
            assert (tuple(tensor.shape), safetensors_code(tensor.dtype)) == (entry.shape, entry.dtype)
        hashes = reader.shard_hashes()
    finally:
        reader.close()
    assert hashes == {shard: file_sha256(ckpt.root / shard) for shard in ckpt.shards}
