"""Session fixtures over the tiny family checkpoints of :mod:`families.tiny`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from families.tiny import build_family_checkpoint


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``family_checkpoint("glm4_moe") -> Path`` of a session-cached tiny checkpoint."""
    built: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in built:
            built[key] = build_family_checkpoint(key, tmp_path_factory.mktemp(f"family-{key}"))
        return built[key]

    return get


@pytest.fixture(scope="session")
def family_converted(
    family_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str, str | Path], Path]:
    """``family_converted(key, dialect, contract) -> Path``: converted once per session per triple."""
    from fp4convert.convert.execute import convert_checkpoint

    cache: dict[tuple[str, str, str], Path] = {}

    def get(key: str, dialect: str, contract: str | Path) -> Path:
        index = (key, dialect, str(contract))
        if index not in cache:
            out = tmp_path_factory.mktemp(f"family-{key}-{dialect}") / "out"
            convert_checkpoint(family_checkpoint(key), out, contract=contract, dialect=dialect)
            cache[index] = out
        return cache[index]

    return get
