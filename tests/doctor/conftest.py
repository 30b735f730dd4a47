"""Fixtures for doctor's corpus: every base checkpoint built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from doctor.corpus import BASES
from doctor.peer import write_peer


@pytest.fixture(scope="session")
def base(
    tiny_checkpoint: Callable[[str], Path], converted: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``base("mo-nvfp4")`` or ``base("peer-modelopt|no-input-scale")``: a healthy (or peer-faulty)
    checkpoint of the corpus; tests copy it before damaging it."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            key, _, faults = name.partition("|")
            kind, model, how, extra = BASES[key]
            if kind == "converted":
                built[name] = converted(model, how, extra)
            else:
                folder = tmp_path_factory.mktemp(key.replace("|", "-")) / "peer"
                built[name] = write_peer(
                    tiny_checkpoint(model), folder, how, frozenset(filter(None, faults.split(",")))
                )
        return built[name]

    return get


@pytest.fixture(scope="session")
def source_of(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], Path]:
    """The BF16 source a base checkpoint was made from."""
    return lambda name: tiny_checkpoint(BASES[name.partition("|")[0]][1])
