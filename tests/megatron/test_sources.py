"""Reading folders of safetensors."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal
from safetensors.torch import save_file

from fp4convert.errors import CheckpointError
from fp4convert.megatron import SafetensorsFolder


def test_folder_reads_on_access_and_reports_duplicates(tmp_path):
    a, b = torch.arange(4.0).reshape(2, 2), torch.ones(3, dtype=torch.bfloat16)
    save_file({"a": a, "b": b}, str(tmp_path / "one.safetensors"))
    save_file({"a": a * 2}, str(tmp_path / "two.safetensors"))
    with SafetensorsFolder(tmp_path) as folder:
        assert sorted(folder) == ["a", "b"] and len(folder) == 2
        assert folder.meta("b") == ("BF16", (3,))
        assert_bytes_equal(folder["a"], a)  # the first file in name order wins
        assert folder.duplicates == {"a": ["one.safetensors", "two.safetensors"]}
    with SafetensorsFolder(tmp_path / "two.safetensors") as single:
        assert_bytes_equal(single["a"], a * 2)


def test_folder_errors(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds no \*\.safetensors files"):
        SafetensorsFolder(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        SafetensorsFolder(tmp_path / "nope")
