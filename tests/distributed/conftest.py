"""Clusters of local gloo ranks (tests/_ranks.py), started once per session and shared by the tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from _ranks import Cluster


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
