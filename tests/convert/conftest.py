"""Converted tiny checkpoints, shared by the converter tests (built once per session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from _helpers import NVFP4_EXPERTS

from fp4convert.convert.execute import convert_checkpoint


@pytest.fixture(scope="session")
def converted(tiny_checkpoint, tmp_path_factory) -> Callable[[str, str, Path], Path]:
    """``converted(model_key, dialect, contract) -> output dir`` (cached per argument triple)."""
    cache: dict[tuple[str, str, Path], Path] = {}

    def get(model: str, dialect: str, contract: Path = NVFP4_EXPERTS) -> Path:
        key = (model, dialect, contract)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{model}-{dialect}") / "out"
            convert_checkpoint(tiny_checkpoint(model), out, contract=contract, dialect=dialect)
            cache[key] = out
        return cache[key]

    return get
