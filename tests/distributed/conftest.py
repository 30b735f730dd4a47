"""Clusters of local gloo ranks (tests/_ranks.py), started once per session and shared by the tests;
the all-decoder-Linear contract as a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _ranks import ALL_LINEAR, Cluster


@pytest.fixture(scope="session")
def clusters() -> Iterator[Callable[[int], Cluster]]:
    """``clusters(world) -> Cluster``: a running cluster of ``world`` ranks (one per size)."""
    made: dict[int, Cluster] = {}

    def get(world: int) -> Cluster:
        if world not in made:
            made[world] = Cluster(world)
        return made[world]

    yield get
    for cluster in made.values():
        cluster.close()


@pytest.fixture(scope="session")
def all_linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:data:`_ranks.ALL_LINEAR` written to a file."""
    path = tmp_path_factory.mktemp("contracts") / "all-linear.yaml"
    path.write_text(ALL_LINEAR)
    return path
