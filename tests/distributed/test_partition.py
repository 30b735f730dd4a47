"""The work split: contiguous parts whose largest sum is the smallest possible, every item once."""

from __future__ import annotations

import itertools
import random

import pytest

from fp4convert.ranks import contiguous_split, split_by_bytes


def best_max(sizes: list[int], parts: int) -> int:
    """The smallest largest-part sum over every contiguous split (brute force)."""
    n = len(sizes)
    best = sum(sizes)
    for cuts in itertools.combinations(range(1, n), min(parts - 1, n - 1)):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_contiguous_split_is_optimal_and_covers_every_item_once(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 3, 50, 100, 400]) for _ in range(rng.randint(1, 9))]
    parts = rng.randint(1, 5)
    ranges = contiguous_split(sizes, parts)
    assert len(ranges) == parts
    assert [i for r in ranges for i in r] == list(range(len(sizes)))  # contiguous, in order, each once
    assert max(sum(sizes[i] for i in r) for r in ranges) == best_max(sizes, parts)
    assert sum(1 for r in ranges if r) == min(parts, len(sizes))  # nobody idle while items are left


def test_split_by_bytes_names_and_edge_cases():
    assert split_by_bytes({"a": 4, "b": 2, "c": 2}, 2) == [["a"], ["b", "c"]]
    assert split_by_bytes({}, 3) == [[], [], []]
    assert split_by_bytes({"a": 0, "b": 0}, 2) == [["a"], ["b"]]
    with pytest.raises(ValueError, match="parts must be at least 1"):
        contiguous_split([1], 0)
