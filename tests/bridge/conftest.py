"""Tiny real models as the learner holds them: HF tensors, their Megatron-Core form, exports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fp4convert.families import hf_to_megatron, load_config


@pytest.fixture(scope="session")
def hf_state(tiny_checkpoint) -> Callable[[str], dict[str, torch.Tensor]]:
    """``hf_state(key)``: every tensor of a tiny checkpoint, by HF name (a fresh dict per call)."""
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def get(key: str) -> dict[str, torch.Tensor]:
        if key not in cache:
            tensors: dict[str, torch.Tensor] = {}
            for path in sorted(tiny_checkpoint(key).glob("*.safetensors")):
                tensors.update(load_file(str(path)))
            cache[key] = tensors
        return dict(cache[key])

    return get


@pytest.fixture(scope="session")
def config(tiny_checkpoint) -> Callable[[str], dict]:
    """``config(key)``: the tiny checkpoint's config.json."""
    return lambda key: load_config(tiny_checkpoint(key))


@pytest.fixture(scope="session")
def megatron_state(hf_state, config) -> Callable[..., dict[str, torch.Tensor]]:
    """``megatron_state(key, ep_rank=0, ep_size=1, layout="grouped")``: the learner's tensors, made
    from the HF model by the family transforms (expert ids local to the EP rank)."""

    def get(key: str, *, ep_rank: int = 0, ep_size: int = 1, layout: str = "grouped") -> dict[str, torch.Tensor]:
        family = "qwen3_moe" if key.startswith("qwen3_moe") else key.split("_no_")[0]
        return hf_to_megatron(
            hf_state(key), family, config(key), expert_layout=layout, ep_rank=ep_rank, ep_size=ep_size
        )

    return get


@pytest.fixture(scope="session")
def converted_tensors(converted) -> Callable[..., dict[str, torch.Tensor]]:
    """``converted_tensors(key, dialect, contract)``: every tensor of the session's converted checkpoint."""
    cache: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}

    def get(key: str, dialect: str, contract: Path | str) -> dict[str, torch.Tensor]:
        cache_key = (key, dialect, str(contract))
        if cache_key not in cache:
            tensors: dict[str, torch.Tensor] = {}
            for path in sorted(converted(key, dialect, contract).glob("*.safetensors")):
                tensors.update(load_file(str(path)))
            cache[cache_key] = tensors
        return dict(cache[cache_key])

    return get
