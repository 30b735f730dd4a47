"""Split ordered work into contiguous, byte-balanced parts, one per rank.

Contiguous, because neighbouring output shards read neighbouring bytes of the same source files:
each source file is then read (and hashed) by one rank, two at a boundary. Balanced, because the
slowest rank sets the wall time: :func:`contiguous_split` minimizes the largest part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["contiguous_split", "split_by_bytes"]


def _parts_needed(sizes: Sequence[int], capacity: int) -> int:
    parts, load = 1, 0
    for size in sizes:
        if load and load + size > capacity:
            parts, load = parts + 1, 0
        load += size
    return parts


def contiguous_split(sizes: Sequence[int], parts: int) -> list[range]:
    """Indices ``0..len(sizes)-1`` cut into ``parts`` contiguous ranges whose largest sum is the smallest
    possible (ranges may be empty when there are fewer items than parts).

    Example:
        >>> [list(r) for r in contiguous_split([5, 1, 1, 1, 1, 1], 2)]
        [[0], [1, 2, 3, 4, 5]]
        >>> [list(r) for r in contiguous_split([1, 1], 3)]
        [[0], [1], []]
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if not sizes:
        return [range(0, 0)] * parts
    low, high = max(sizes), max(sum(sizes), 1)
    while low < high:  # the smallest capacity that fits in `parts` ranges
        mid = (low + high) // 2
        if _parts_needed(sizes, mid) <= parts:
            high = mid
        else:
            low = mid + 1
    cuts, load = [0], 0
    for index, size in enumerate(sizes):
        # Cut when the capacity is reached, or when the items left are just enough for one per part.
        left = len(sizes) - index
        if index > cuts[-1] and (load + size > low or left <= parts - len(cuts)):
            cuts.append(index)
            load = 0
        load += size
    cuts.append(len(sizes))
    ranges = [range(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    return ranges + [range(len(sizes), len(sizes))] * (parts - len(ranges))


def split_by_bytes(sizes: Mapping[str, int], parts: int) -> list[list[str]]:
    """The keys of ``sizes`` (in their order) split by :func:`contiguous_split`.

    Example:
        >>> split_by_bytes({"a": 4, "b": 2, "c": 2}, 2)
        [['a'], ['b', 'c']]
    """
    names = list(sizes)
    return [[names[i] for i in r] for r in contiguous_split([sizes[n] for n in names], parts)]
