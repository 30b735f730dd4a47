"""Tiny real models for the Megatron-side tests: HF tensors, their config, and exports of them.

Megatron tensors are always made from the HF model by the family transforms (``hf_to_megatron``),
as the issue asks; nothing is drawn by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file


def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in ``directory``."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


@pytest.fixture(scope="session")
def read_tensors() -> Callable[[Path], dict[str, torch.Tensor]]:
    """``read_tensors(directory)``: every tensor of a folder of safetensors files."""
    return load_tensors


@pytest.fixture(scope="session")
def deepseek_nvfp4() -> Path:
    """Test contract: NVFP4 on every GEMM of DeepSeek-V3 (MLA q_a/kv_a share a scale), kv_b_proj and
    the last decoder layer BF16."""
    return Path(__file__).parent / "data" / "deepseek-nvfp4-mla-bf16.yaml"


@pytest.fixture(scope="session")
def model(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """``model("qwen3_moe") -> (HF tensors, config)`` of a session-cached tiny checkpoint."""
    from fp4convert.families import load_config

    cache: dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {}

    def get(key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if key not in cache:
            directory = tiny_checkpoint(key)
            cache[key] = (load_tensors(directory), dict(load_config(directory)))
        return cache[key]

    return get


class RecordedGraph:
    """What CPU tests capture in place of a CUDA graph (``megatron.replay._capture`` patched): the
    work runs once, eagerly, when captured; a replay only counts, so what a replayed sync hands out
    is what the capturing sync computed (the GPU tests run real graphs)."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def captures(monkeypatch):
    """Captures made by recording: ``captures.made`` lists the graphs; set ``captures.fail`` to an
    error to make every capture fail with it."""
    from fp4convert.megatron import replay as replay_module

    made: list[RecordedGraph] = []

    def capture(device: Any, work: Callable[[], Any]) -> Any:
        if capture.fail is not None:  # type: ignore[attr-defined]
            return capture.fail  # type: ignore[attr-defined]
        out = work()
        made.append(RecordedGraph())
        return made[-1], out

    capture.fail = None  # type: ignore[attr-defined]
    capture.made = made  # type: ignore[attr-defined]
    monkeypatch.setattr(replay_module, "_capture", capture)
    return capture
