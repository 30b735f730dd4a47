"""Source file names are untrusted: plain shard names only, files inside the source, generated output names."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from safetensors.torch import save_file

from fp4convert.checkpoint import inventory_from_checkpoint
from fp4convert.checkpoint.safetensors_io import StreamingWriter
from fp4convert.checkpoint.source import open_checkpoint, output_shard_names, shard_name_problem
from fp4convert.errors import CheckpointError
from fp4convert.verify.checkpoint import verify_checkpoint


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("model-00001-of-00002.safetensors", None),
        ("..evil.safetensors", None),  # a plain (if odd) file name
        ("../x.safetensors", "path separator"),
        ("/abs/x.safetensors", "path separator"),
        ("a\\b.safetensors", "path separator"),
        ("x\0.safetensors", "NUL"),
        ("..", "is not a file name"),
        ("", "is not a file name"),
        ("x.bin", "does not end with .safetensors"),
        (7, "JSON number"),
        (None, "JSON null"),
        ([], "JSON array"),
    ],
)
def test_shard_name_problem(name, problem):
    found = shard_name_problem(name)
    assert (found is None) if problem is None else (problem in found)


def test_output_shard_names():
    assert output_shard_names(1) == ["model.safetensors"]
    assert output_shard_names(3) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert output_shard_names(0) == []


def test_the_families_header_reader_refuses_a_crafted_index_too(tiny_checkpoint, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("qwen3_moe"), src)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    tensor = next(iter(index["weight_map"]))
    index["weight_map"][tensor] = "/etc/passwd"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    for read in (inventory_from_checkpoint, open_checkpoint):
        with pytest.raises(CheckpointError, match=rf"maps tensor '{tensor}' to '/etc/passwd'"):
            read(src)


def test_a_dangling_or_outside_symlink_among_other_files_is_refused(tiny_checkpoint, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("llama"), src)
    (tmp_path / "secret").write_text("x")
    (src / "vocab.txt").symlink_to(tmp_path / "secret")
    with pytest.raises(CheckpointError, match=r"vocab.txt resolves to .*secret, outside the source folder") as info:
        open_checkpoint(src)
    assert info.value.fields["file"] == "vocab.txt"


def test_the_writer_replaces_a_symlink_at_its_name_instead_of_writing_through_it(tmp_path):
    target = tmp_path / "source-shard.safetensors"
    target.write_bytes(b"precious")
    link = tmp_path / "out.safetensors.tmp"
    link.symlink_to(target)
    writer = StreamingWriter(link, [("a", "F32", (2,))])
    writer.write("a", torch.ones(2))
    writer.close()
    assert target.read_bytes() == b"precious" and not link.is_symlink()


def test_verify_never_reads_a_file_named_outside_the_checkpoint(converted, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(converted("qwen3_moe", "modelopt", NVFP4_EXPERTS), out)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "evil.safetensors"))
    manifest = json.loads((out / "fp4convert.json").read_text())
    info = next(iter(manifest["tensors"].values()))
    for output in info["outputs"].values():
        output["file"] = "../evil.safetensors"
    (out / "fp4convert.json").write_text(json.dumps(manifest))
    report = verify_checkpoint(out)
    assert not report.ok
    assert any(f.check == "file" and "path separator" in f.detail for f in report.failures)
