"""SafetensorsFolder: update buckets without an index, checkpoints with one, duplicates, lazy reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from fp4convert.bridge.files import SafetensorsFolder, tensor_metas
from fp4convert.errors import CheckpointError


def test_buckets_duplicates_and_metas_from_headers(tmp_path):
    save_file({"a": torch.ones(2, 3), "b": torch.zeros(4, dtype=torch.uint8)}, str(tmp_path / "0.safetensors"))
    save_file(
        {"c": torch.full((1,), 7.0, dtype=torch.bfloat16), "a": torch.zeros(2, 3)}, str(tmp_path / "1.safetensors")
    )
    with SafetensorsFolder(tmp_path) as folder:
        assert sorted(folder) == ["a", "b", "c"] and len(folder) == 3 and "c" in folder
        assert folder.duplicates == {"a": ["0.safetensors", "1.safetensors"]}
        assert torch.equal(folder["a"], torch.ones(2, 3))  # the first file in name order is read
        assert tensor_metas(folder) == {"a": ("F32", (2, 3)), "b": ("U8", (4,)), "c": ("BF16", (1,))}
        assert folder.nbytes("a") == 24
    assert tensor_metas({"x": torch.zeros(2, dtype=torch.float8_e4m3fn)}) == {"x": ("F8_E4M3", (2,))}


def test_an_index_limits_a_checkpoint_to_its_files(tmp_path):
    save_file({"w": torch.ones(2)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    save_file({"stale": torch.ones(2)}, str(tmp_path / "leftover.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    )
    with SafetensorsFolder(tmp_path) as folder:
        assert list(folder) == ["w"]
    with SafetensorsFolder(tmp_path / "leftover.safetensors") as single:
        assert list(single) == ["stale"]


def test_an_empty_folder_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds no \*\.safetensors files; point at the folder the exporter"):
        SafetensorsFolder(tmp_path)
