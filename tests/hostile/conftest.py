"""Fixtures of the hostile-input corpus: the good inputs (built once per session) and one
workspace per case holding copies of them."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from _helpers import NVFP4_EXPERTS
from hostile.corpus import Workspace, copy_tree


@pytest.fixture(scope="session")
def good_inputs(tiny_checkpoint: Callable[[str], Path], converted: Callable[..., Path]) -> tuple[Path, Path]:
    """(the tiny sharded Qwen3-MoE source, its conversion under the per-token NVFP4 experts contract)."""
    return tiny_checkpoint("qwen3_moe"), converted("qwen3_moe", "modelopt", NVFP4_EXPERTS)


@pytest.fixture
def workspace(good_inputs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    """A fresh workspace: copies of the good source and output, a victim folder, a contract file."""
    monkeypatch.delenv("FP4CONVERT_DEBUG", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source, output = good_inputs
    ws = Workspace(
        root=tmp_path,
        src=tmp_path / "src",
        out=tmp_path / "out",
        victim=tmp_path / "victim",
        contract=tmp_path / "contract.yaml",
        dst=tmp_path / "dst",
    )
    copy_tree(source, ws.src)
    copy_tree(output, ws.out)
    ws.victim.mkdir()
    first = sorted(p.name for p in source.glob("*.safetensors"))[0]
    shutil.copy(source / first, ws.victim / "evil.safetensors")
    (ws.victim / "secret.txt").write_text("not for reading")
    shutil.copy(NVFP4_EXPERTS, ws.contract)
    return ws
