"""Hostile checkpoints are diagnosed, never trusted: index names outside the folder are never opened,
corrupt shards and missing files become findings, an unreadable folder is one error (exit 2)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from _helpers import tree_hashes
from doctor.corpus import copy_base
from doctor.damage import INDEX
from hostile.corpus import edit_header, shard_of
from safetensors.torch import save_file

from fp4convert.doctor import doctor_checkpoint
from fp4convert.doctor.repair import repair_checkpoint
from fp4convert.errors import CheckpointError


def _index(folder):
    return json.loads((folder / INDEX).read_text())


def _write_index(folder, index):
    (folder / INDEX).write_text(json.dumps(index))


def test_an_index_name_outside_the_folder_is_never_opened(base, tmp_path):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "c")
    secret = tmp_path / "secret.safetensors"
    save_file({"x": torch.zeros(1)}, str(secret))
    index = _index(folder)
    index["weight_map"]["model.norm.weight"] = "../secret.safetensors"
    _write_index(folder, index)
    report = doctor_checkpoint(folder)
    [bad] = report.find("index-bad-name")
    assert bad.tensors == ("model.norm.weight",) and "'../secret.safetensors'" in bad.message
    assert "x" not in {t for f in report.findings for t in f.tensors}


def test_a_symlinked_shard_leading_outside_is_a_finding(base, tmp_path):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "c")
    outside = tmp_path / "elsewhere.safetensors"
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    shard.rename(outside)
    shard.symlink_to(outside)
    report = doctor_checkpoint(folder)
    [unreadable] = report.find("shard-unreadable")
    assert unreadable.tensors == (shard.name,) and "outside the source folder" in unreadable.message
    assert report.exit_code == 1


def test_truncated_missing_and_duplicated_shards_are_findings(base, tmp_path):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "c")
    shards = sorted(folder.glob("model-*.safetensors"))
    shards[0].write_bytes(shards[0].read_bytes()[:-3])
    shards[1].unlink()
    save_file({"model.norm.weight": torch.ones(64, dtype=torch.bfloat16)}, str(folder / "extra.safetensors"))
    report = doctor_checkpoint(folder)
    assert {"shard-unreadable", "shard-missing", "tensor-twice"} <= report.codes()
    assert report.find("shard-missing")[0].tensors  # the tensors the index says it held
    assert report.find("tensor-twice")[0].tensors == ("model.norm.weight",)


@pytest.mark.parametrize("content", ["[1, 2]", "{broken", None])
def test_no_usable_config_is_unreadable(tmp_path, content):
    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=r"config\.json"):
        doctor_checkpoint(tmp_path)


def test_pickles_only_is_unreadable(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not unpickled")
    with pytest.raises(CheckpointError, match="no readable"):
        doctor_checkpoint(tmp_path)


def test_a_source_whose_header_lies_is_refused_as_convert_refuses_it(base, source_of, tmp_path):
    # --source is read for the provenance check: a weight its header calls I16 (the same bytes) was an
    # internal KeyError in the NVFP4 kernel; it is refused up front, naming the tensor, as convert does
    folder = copy_base(base("mo-nvfp4"), tmp_path / "c")
    source = tmp_path / "src"
    shutil.copytree(source_of("mo-nvfp4"), source)
    expert = "model.layers.0.mlp.experts.1.up_proj.weight"
    edit_header(shard_of(source, expert), lambda h: h[expert].update(dtype="I16"))
    with pytest.raises(CheckpointError, match=rf"{re.escape(expert)} is int16"):
        doctor_checkpoint(folder, source=source)


def test_fix_on_a_header_that_traded_names_finishes_and_publishes_only_a_healthy_copy(base, source_of, tmp_path):
    # a weight and its block scale trade names (each header entry well formed). Re-derived from the
    # source, each new tensor keeps the dialect's own shape and dtype (the stored ones cannot hold
    # it): both were internal errors (a reshape to the lying shape, a shard laid out from it). What
    # doctor cannot mend is reported and nothing is published
    folder = copy_base(base("mo-nvfp4"), tmp_path / "c")
    weight = "model.layers.0.mlp.experts.1.up_proj.weight"
    scale = weight + "_scale"
    edit_header(shard_of(folder, weight), lambda h: h.update({weight: h[scale], scale: h[weight]}))
    before = tree_hashes(folder)
    report = repair_checkpoint(folder, tmp_path / "fixed", source=source_of("mo-nvfp4"))
    assert tree_hashes(folder) == before and report.before is not None and report.after is not None
    assert report.published == (report.after.findings == []) == (tmp_path / "fixed").is_dir()
