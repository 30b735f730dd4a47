"""What a conversion checks of its source on the way: a resumed run's source bytes, and NaN / inf.

* ``resume`` keeps a finished shard only if the source files its tensors (and their fused
  siblings) are decoded from (:func:`shard_inputs`) are unchanged: a file the interrupted run
  hashed whole must still have that sha256 (:func:`check_source_unchanged`: a source whose bytes
  changed is refused, as one whose headers changed always was); a file it never hashed whole (a
  run killed mid-file, or a rank that did not get to its end) must still have the ``stat``
  fingerprint the run recorded when it began (:func:`source_stats`; size, mtime, ctime and inode:
  any write since changes the ctime), else the shards made from it are converted again.
* NaN / infinite source values are counted per tensor while reading
  (:attr:`fp4convert.checkpoint.reader.SourceReader.nonfinite`); a conversion that met any is
  refused at the end of the shards (:func:`refuse_nonfinite`), naming the tensors and counts,
  unless ``allow_nonfinite`` (``--allow-nonfinite``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fp4convert.checkpoint.file_hashes import FileHashes
from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.errors import ConversionError
from fp4convert.plan import ConversionPlan, PlannedTensor, members_of

__all__ = ["check_source_unchanged", "refuse_nonfinite", "shard_inputs", "source_stats", "unchanged_inputs"]


def shard_inputs(plan: ConversionPlan, items: Iterable[PlannedTensor]) -> set[str]:
    """The source files an output shard's bytes depend on: its tensors' and their fused siblings'
    (every stored part they are decoded from: an FP8 weight's scales may sit in another shard)."""
    view = plan.source.view()
    names = {name for item in items for name in members_of(plan.groups, item)}
    return {part.file for name in names for part in view.unit_of(name).parts}


def source_stats(root: Path, files: Iterable[str]) -> dict[str, list[int]]:
    """``[size, mtime_ns, ctime_ns, inode]`` of each source file (the ctime moves on any write)."""
    out = {}
    for file in files:
        st = (root / file).stat()
        out[file] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return out


def unchanged_inputs(
    inputs: Iterable[str],
    hashed: Mapping[str, str],
    recorded_stats: Mapping[str, list[int]],
    now: Mapping[str, list[int]],
) -> bool:
    """Whether a kept shard's inputs are the bytes it was made from: each was hashed whole by the
    interrupted run (checked against the file up front), or keeps the ``stat`` it had when that run began."""
    return all(f in hashed or (f in recorded_stats and recorded_stats[f] == now.get(f)) for f in inputs)


def check_source_unchanged(
    plan: ConversionPlan,
    recorded_hashes: Mapping[str, str],
    *,
    workers: int = 1,
    under_way: FileHashes | None = None,
) -> None:
    """A resumed run continues from the same source bytes, or not at all.

    The recorded files are hashed ``workers`` at a time (a checkpoint of hundreds of files is
    minutes of one core's sha256); a file ``under_way`` hashes already is taken from it. Once this
    passed, the run takes the recorded hashes as the files' own and does not hash them again.

    Raises:
        ConversionError: naming the first source file (by name) whose sha256 differs from the one
            recorded.
    """
    files = sorted(recorded_hashes)

    def now(shard: str) -> str | None:
        path = plan.source.root / shard
        if shard not in plan.source.shards or not path.is_file():
            return None
        if under_way is not None and shard in under_way.files:
            return under_way.digest(shard)
        return file_sha256(path)

    with ThreadPoolExecutor(max(1, min(workers, len(files))), thread_name_prefix="fp4convert-recheck") as pool:
        digests = list(pool.map(now, files))
    for shard, digest in zip(files, digests, strict=True):
        recorded = recorded_hashes[shard]
        if digest != recorded:
            raise ConversionError(
                f"the source changed since the interrupted run: {shard} had sha256 {recorded[:16]}..., "
                f"now {digest[:16] + '...' if digest else 'it is gone'}; the finished shards were made from the old "
                "bytes",
                hint="pass overwrite=True (--overwrite) to convert the new source from the start",
                file=shard,
            )


def refuse_nonfinite(nonfinite: Mapping[str, Mapping[str, int]], staging: Path) -> None:
    """Raise the one error for source tensors holding NaN / inf values.

    Raises:
        ConversionError: listing the first tensors and their counts.
    """
    total = {kind: sum(c.get(kind, 0) for c in nonfinite.values()) for kind in ("nan", "inf")}
    listing = "\n  - ".join(
        f"{name}: {', '.join(f'{n} {kind}' for kind, n in counts.items())}"
        for name, counts in sorted(nonfinite.items())[:8]
    )
    more = f"\n  - ... and {len(nonfinite) - 8} more tensors" if len(nonfinite) > 8 else ""
    raise ConversionError(
        f"{len(nonfinite)} source tensor{'s' if len(nonfinite) > 1 else ''} hold{'' if len(nonfinite) > 1 else 's'} "
        f"non-finite values ({total['nan']} NaN, {total['inf']} inf):"
        f"\n  - {listing}{more}",
        hint="fix the source weights; or, to convert them as they are (under the quantizers' documented NaN/inf "
        "policy, recorded in the manifest), pass allow_nonfinite=True (--allow-nonfinite) with resume=True "
        f"(--resume): the converted shards stay in {staging}",
        tensors={k: dict(v) for k, v in nonfinite.items()},
    )
