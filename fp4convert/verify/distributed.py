"""``verify`` split across ``torch.distributed`` ranks: each rank checks the bytes of its share of the shards.

Under ``torchrun`` (an initialized process group of several ranks), every rank calls
:func:`verify_distributed` with the same arguments. The output shards are cut into contiguous,
byte-balanced parts (:func:`fp4convert.ranks.split_by_bytes`, sizes from the manifest); each
rank hashes the tensors of its part and, with ``source``, re-quantizes them from the source and
compares every byte (:func:`~fp4convert.verify.checkpoint.verify_checkpoint` with ``files``).
Structure, config, index and shared-scale checks are cheap and made by every rank. Rank 0 adds
the others' byte checks to its own and every rank returns that one report: the same checks, and
the same verdict, as one process verifying alone. A rank that fails or is killed is named by the
others (:mod:`fp4convert.ranks.team`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fp4convert.checkpoint.manifest import read_manifest
from fp4convert.checkpoint.safetensors_io import tensor_nbytes
from fp4convert.ranks import current_team, split_by_bytes
from fp4convert.verify.checkpoint import TensorCheck, VerifyReport, verify_checkpoint

__all__ = ["verify_distributed"]

#: the checks restricted to a rank's share of the shards (all others are made by every rank)
_SHARED_OUT = ("sha256", "source", "lossless")


def verify_distributed(
    directory: str | Path,
    *,
    source: str | Path | None = None,
    device: str = "cpu",
    rank_timeout: float = 60.0,
) -> VerifyReport:
    """:func:`~fp4convert.verify.checkpoint.verify_checkpoint` with the work split across the ranks of
    the initialized process group (a process alone verifies everything itself).

    Args:
        directory: the converted checkpoint.
        source: the BF16 source, to compare every byte with.
        device: where the re-quantization runs (``cuda``: each rank's ``LOCAL_RANK`` GPU).
        rank_timeout: seconds without a heartbeat after which a rank is reported lost.

    Returns:
        The whole checkpoint's :class:`~fp4convert.verify.checkpoint.VerifyReport`, on every rank.

    Raises:
        DistributedError: another rank failed (named, with its error) or stopped responding.

    Example (not run: it needs ``torchrun`` and a converted checkpoint):
        >>> verify_distributed("out", source="Qwen3-30B-A3B").ok  # doctest: +SKIP
        True
    """
    team = current_team(rank_timeout=rank_timeout)
    try:
        if team.world == 1:
            return verify_checkpoint(directory, source=source, device=device)
        team.agree("verify arguments", {"directory": str(Path(directory).resolve()), "source": str(source)})
        sizes: dict[str, int] = {}
        for info in read_manifest(Path(directory))["tensors"].values():
            for out in info["outputs"].values():
                sizes[out["file"]] = sizes.get(out["file"], 0) + tensor_nbytes(out["dtype"], out["shape"])
        mine = split_by_bytes(dict(sorted(sizes.items())), team.world)[team.rank]
        report = verify_checkpoint(directory, source=source, device=team.device(device), files=mine)
        gathered = team.gather("verify", [c.__dict__ for c in report.checks if c.check in _SHARED_OUT])
        merged: dict[str, Any] | None = None
        if gathered is not None:
            others = [TensorCheck(**c) for checks in gathered[1:] for c in checks]
            merged = {"checks": [c.__dict__ for c in [*report.checks, *others]]}
        final = team.broadcast("verify-report", merged)
        return VerifyReport(
            str(directory),
            checks=[TensorCheck(**c) for c in final["checks"]],
            compared_with_source=report.compared_with_source,
        )
    except BaseException as exc:
        team.fail(exc)
        raise
    finally:
        team.close()
