"""A crafted source (index naming files outside it, symlinks out of it) is refused before anything is
read outside SRC or written outside DST, and output shard names are always fp4convert's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, tree_hashes

from fp4convert.convert.dequantize import dequantize_checkpoint
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.errors import CheckpointError
from fp4convert.verify.checkpoint import verify_checkpoint

INDEX = "model.safetensors.index.json"


@pytest.fixture
def workspace(tiny_checkpoint, tmp_path):
    """``tmp/src`` (a copy of the sharded tiny Qwen3-MoE), ``tmp/victim`` (a file a crafted index
    aims at, itself a valid safetensors shard) and the path ``tmp/dst``."""
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("qwen3_moe"), src)
    victim = tmp_path / "victim"
    victim.mkdir()
    first = sorted(set(json.loads((src / INDEX).read_text())["weight_map"].values()))[0]
    shutil.copy(src / first, victim / "evil.safetensors")
    return src, victim, tmp_path / "dst", first


def _retarget(src: Path, shard: str, value: object) -> str:
    """Point every tensor of ``shard`` in the index at ``value``; return one such tensor's name."""
    index = json.loads((src / INDEX).read_text())
    moved = [t for t, f in index["weight_map"].items() if f == shard]
    index["weight_map"].update(dict.fromkeys(moved, value))
    (src / INDEX).write_text(json.dumps(index))
    return moved[0]


def _refused(src: Path, dst: Path, match: str) -> CheckpointError:
    root = src.parent
    before = tree_hashes(root)
    with pytest.raises(CheckpointError, match=match) as info:
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    assert tree_hashes(root) == before  # nothing read-write anywhere: source and victim unchanged
    assert not dst.exists() and not dst.with_name(dst.name + ".partial").exists()
    return info.value


@pytest.mark.parametrize(
    "crafted",
    [
        "../victim/evil.safetensors",
        "../src/{first}",
        "..\\victim\\evil.safetensors",
        "{victim}/evil.safetensors",
        "sub/{first}",
        "/etc/passwd",
        "evil\0.safetensors",
        "..",
        "{first}.json",
    ],
)
def test_an_index_naming_anything_but_a_plain_shard_file_is_refused(workspace, crafted):
    src, victim, dst, first = workspace
    name = crafted.format(first=first, victim=victim)
    tensor = _retarget(src, first, name)
    error = _refused(src, dst, r"maps tensor .* which (is not a plain file name|contains a NUL|does not end|is not a)")
    assert error.fields["tensor"] == tensor and tensor in error.message


@pytest.mark.parametrize("value", [3, None, ["x.safetensors"], {"file": "x.safetensors"}, True])
def test_a_weight_map_value_that_is_not_a_string_names_the_tensor(workspace, value):
    src, _, dst, first = workspace
    tensor = _retarget(src, first, value)
    error = _refused(src, dst, r"is a JSON (number|null|array|object|boolean), not a file name string")
    assert error.fields["tensor"] == tensor


def test_a_shard_symlinked_out_of_the_source_is_refused(workspace):
    src, victim, dst, first = workspace
    (src / first).unlink()
    (src / first).symlink_to(victim / "evil.safetensors")
    _refused(src, dst, r"resolves to .*victim.*, outside the source folder")


def test_a_single_file_source_symlinked_out_is_refused(tiny_checkpoint, tmp_path):
    src, outside = tmp_path / "src", tmp_path / "outside"
    shutil.copytree(tiny_checkpoint("llama"), src)
    outside.mkdir()
    (src / "model.safetensors").rename(outside / "model.safetensors")
    (src / "model.safetensors").symlink_to(outside / "model.safetensors")
    _refused(src, tmp_path / "dst", r"outside the source folder")


def test_a_side_file_symlinked_out_of_the_source_is_never_copied(workspace):
    src, victim, dst, _ = workspace
    (victim / "secret.txt").write_text("not for publishing")
    (src / "tokenizer_config.json").symlink_to(victim / "secret.txt")
    _refused(src, dst, r"tokenizer_config.json resolves to .*secret.txt, outside the source folder")


def test_the_cli_answers_a_crafted_index_with_one_error_line(workspace, capsys, monkeypatch):
    from fp4convert.cli import DEBUG_ENV, main

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    src, _, dst, first = workspace
    _retarget(src, first, "../victim/evil.safetensors")
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(src), str(dst), "--contract", str(NVFP4_EXPERTS), "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.startswith("error[checkpoint]: ") and "maps tensor" in err and "Traceback" not in err
    assert not dst.exists()


def test_symlinks_inside_the_source_are_followed(workspace):
    src, _, dst, first = workspace
    (src / "store").mkdir()
    (src / first).rename(src / "store" / first)
    (src / first).symlink_to(Path("store") / first)
    convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    assert verify_checkpoint(dst, source=src).ok


def test_a_hub_snapshot_may_point_into_its_blobs_but_nowhere_else(tiny_checkpoint, tmp_path):
    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for n, path in enumerate(sorted(tiny_checkpoint("llama").iterdir())):
        shutil.copy(path, blobs / f"blob{n}")
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{n}")
    dst = tmp_path / "dst"
    convert_checkpoint(snapshot, dst, contract=MXFP8_ALL)
    assert verify_checkpoint(dst, source=snapshot).ok
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(snapshot / "model.safetensors", tmp_path / "elsewhere" / "model.safetensors")
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(tmp_path / "elsewhere" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"outside the source folder"):
        convert_checkpoint(snapshot, tmp_path / "dst2", contract=MXFP8_ALL)


def test_output_shard_names_are_generated_in_source_order(tiny_checkpoint, tmp_path):
    """Source shards with names of their own: the output names are fp4convert's, in source order."""
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("qwen3_moe"), src)
    index = json.loads((src / INDEX).read_text())
    old = sorted(set(index["weight_map"].values()))
    renamed = {name: f"weights-{chr(ord('a') + n)}.safetensors" for n, name in enumerate(old)}
    for name, new in renamed.items():
        (src / name).rename(src / new)
    index["weight_map"] = {t: renamed[f] for t, f in index["weight_map"].items()}
    (src / INDEX).write_text(json.dumps(index))
    dst = tmp_path / "dst"
    convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    expected = [f"model-{n + 1:05d}-of-{len(old):05d}.safetensors" for n in range(len(old))]
    assert sorted(p.name for p in dst.glob("*.safetensors")) == expected
    out_map = json.loads((dst / INDEX).read_text())["weight_map"]
    for tensor, source_file in index["weight_map"].items():  # source shard k -> output shard k
        if tensor in out_map:
            assert out_map[tensor] == expected[sorted(renamed.values()).index(source_file)]
    assert verify_checkpoint(dst, source=src).ok
    deq = tmp_path / "deq"
    dequantize_checkpoint(dst, deq)
    assert sorted(p.name for p in deq.glob("*.safetensors")) == expected


def test_one_source_shard_of_any_name_becomes_model_safetensors(tiny_checkpoint, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint("llama"), src)
    (src / "model.safetensors").rename(src / "consolidated.safetensors")
    convert_checkpoint(src, tmp_path / "dst", contract=MXFP8_ALL)
    assert [p.name for p in (tmp_path / "dst").glob("*.safetensors")] == ["model.safetensors"]
    assert not (tmp_path / "dst" / INDEX).exists()
