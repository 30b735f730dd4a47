"""How a conversion is split across ranks: which rank writes, checks and hashes what.

Every rank makes the same plan from the same headers (and :meth:`fp4convert.ranks.Team.agree`
checks that it did), so every decision here is a pure function of the plan, the finished shards
and the world size, computed identically on every rank:

* :func:`share_shards`: the output shards still to write, cut into contiguous, byte-balanced parts
  (:func:`fp4convert.ranks.split_by_bytes`), one per rank;
* :func:`hash_owners`: each source file is hashed by one rank, the one that reads most of it
  (its stream offers the bytes; what it does not read itself it reads for the hash only); a file
  nobody reads (a resumed run keeps everything made from it) goes to the rank with least to hash;
* :func:`check_finished`: a resumed run's finished shards are read back and compared with the
  journal by all ranks at once, each taking a byte-balanced share;
* :func:`merge_results`: rank 0 adds up every rank's records;
* :func:`check_shared_staging`: every rank sees rank 0's ``DST.partial/`` (a filesystem all nodes share).

With one process all of this reduces to the single-process conversion: one part, every file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from fp4convert.convert.parallel import ShardResults
from fp4convert.errors import ConversionError
from fp4convert.plan import ConversionPlan
from fp4convert.ranks import Team, split_by_bytes

__all__ = [
    "check_finished",
    "check_shared_staging",
    "hash_owners",
    "merge_results",
    "shard_bytes",
    "share_shards",
]


def shard_bytes(plan: ConversionPlan) -> dict[str, int]:
    """Output shard -> the source bytes it is made from, in plan order."""
    sizes: dict[str, int] = {}
    for item in plan.items:
        sizes[item.output_file] = sizes.get(item.output_file, 0) + item.bytes_before
    return sizes


def share_shards(plan: ConversionPlan, writing: Collection[str], world: int) -> dict[str, int]:
    """Output shard -> the rank writing it, for every shard in ``writing``."""
    sizes = {f: n for f, n in shard_bytes(plan).items() if f in set(writing)}
    return {f: rank for rank, files in enumerate(split_by_bytes(sizes, world)) for f in files}


def hash_owners(plan: ConversionPlan, owner: Mapping[str, int], world: int) -> dict[str, int]:
    """Source file -> the rank that hashes it (see the module docstring).

    Args:
        plan: the conversion plan.
        owner: output shard -> rank, for the shards written in this run.
        world: the number of ranks.
    """
    read: dict[str, dict[int, int]] = {f: {} for f in plan.source.shards}
    for item in plan.items:
        rank = owner.get(item.output_file)
        if rank is not None:
            per_rank = read[item.source_file]
            per_rank[rank] = per_rank.get(rank, 0) + item.bytes_before
    out: dict[str, int] = {}
    load = [0] * world
    for file, per_rank in read.items():
        if per_rank:
            out[file] = min(per_rank, key=lambda r: (-per_rank[r], r))
            load[out[file]] += sum(e.nbytes for e in plan.source.shards[file].values())
    for file, per_rank in read.items():
        if not per_rank:
            out[file] = min(range(world), key=lambda r: (load[r], r))
            load[out[file]] += sum(e.nbytes for e in plan.source.shards[file].values())
    return out


def check_finished(
    candidates: Mapping[str, int], check: Callable[[str], dict[str, str] | None], team: Team
) -> dict[str, dict[str, str]]:
    """The finished shards that may be kept, with their tensors' sha256 read back from disk.

    Args:
        candidates: shard -> its size, for the shards the journal lists as finished.
        check: the sha256 of a shard's tensors read back from disk if it may be kept, else None.
        team: the ranks; each checks a byte-balanced share of the candidates.
    """
    share = split_by_bytes(dict(candidates), team.world)[team.rank]
    mine = {file: check(file) for file in share}
    kept: dict[str, dict[str, str]] = {}
    for results in team.exchange("finished-shards", {f: d for f, d in mine.items() if d is not None}):
        kept.update(results)
    return {f: kept[f] for f in candidates if f in kept}


def merge_results(records: Sequence[Mapping[str, Any]]) -> ShardResults:
    """Every rank's :class:`ShardResults` (as JSON data) added up, rank 0 first."""
    out = ShardResults()
    for record in records:
        out.sha.update(record["sha"])
        out.source_hashes.update(record["source_hashes"])
        out.written.extend(record["written"])
        out.nonfinite.update(record["nonfinite"])
    return out


def check_shared_staging(staging: Path, team: Team) -> None:
    """Every rank sees rank 0's ``DST.partial/``: the destination is on a filesystem all nodes share."""
    if team.world == 1:
        return
    marker = staging / f".fp4convert-ranks-{team.broadcast('marker', os.urandom(8).hex())}"
    if team.is_root:
        marker.touch()
    seen = team.exchange("staging-seen", marker.parent.is_dir() and _wait_for_name(marker))
    if team.is_root:
        marker.unlink(missing_ok=True)
    blind = [r for r, ok in enumerate(seen) if not ok]
    if blind:
        raise ConversionError(
            f"ranks {blind} do not see {staging}, which rank 0 created: the destination must be on a filesystem "
            "that every node mounts at the same path",
            hint="write to shared storage (NFS, Lustre, GPFS ...), or see docs/distributed.md for runs without one",
            file=str(staging),
        )


def _wait_for_name(path: Path, seconds: float = 10.0) -> bool:
    """Whether ``path`` shows up within ``seconds`` (network filesystems publish new names with a delay)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
