"""Stream one output shard: read, quantize, hash and write each tensor, with bounded memory.

:func:`write_shard` writes a shard's header first (the plan fixed every output's name, dtype and
shape) and then its tensors in order, under a temporary name renamed once complete.
:func:`tensor_hashes` reads a finished shard back from disk (verify compares these hashes with
those taken while writing; ``resume`` decides with them which shards to keep).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.hashing import tensor_sha256
from fp4convert.checkpoint.reader import SourceReader
from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter
from fp4convert.plan import ConversionPlan, PlannedTensor, SharedAmax, input_amax, quantize_tensor
from fp4convert.version import __version__

__all__ = ["ProgressHook", "tensor_hashes", "write_shard"]

#: progress callback: (event, payload); events: "plan", "shard", "tensor", "done"
ProgressHook = Callable[[str, Mapping[str, Any]], None]


def write_shard(
    path: Path,
    items: list[PlannedTensor],
    plan: ConversionPlan,
    reader: SourceReader,
    amaxes: SharedAmax,
    *,
    device: str,
    calibration: Mapping[str, float] | None,
    hook: ProgressHook,
) -> dict[str, str]:
    """Write the output shard ``path`` holding ``items``; returns each output tensor's sha256.

    Three stages overlap: one thread reads (and hashes the source), the calling thread quantizes
    (the kernel itself is multi-threaded), one thread hashes the outputs and writes. hashlib, file
    I/O and the native kernel release the GIL. Read-ahead is two tensors and at most two writes
    are in flight, so memory stays bounded whatever the shard size. On any failure the partial
    file is removed.
    """
    layout = [spec for item in items for spec in item.outputs]
    tmp = path.with_name(path.name + ".tmp")
    writer = StreamingWriter(tmp, layout, metadata={"format": "pt", "producer": f"fp4convert {__version__}"})
    profile = plan.contract.nvfp4_profile

    def write(item: PlannedTensor, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, _, _ in item.outputs:
            writer.write(name, tensors[name])  # per-tensor sha256 + file write
        hook("tensor", {"name": item.info.name, "bytes": item.bytes_before})

    with (
        ThreadPoolExecutor(1, thread_name_prefix="fp4convert-read") as read_pool,
        ThreadPoolExecutor(1, thread_name_prefix="fp4convert-write") as write_pool,
    ):
        ahead: dict[str, Future[torch.Tensor]] = {}

        def read_ahead(start: int) -> None:
            for item in items[start : start + 2]:
                name = item.info.name
                if name not in ahead and not amaxes.waiting(name):
                    ahead[name] = read_pool.submit(reader.read, name)

        def fetch(name: str) -> torch.Tensor:
            future = ahead.pop(name, None)
            return future.result() if future is not None else reader.read(name)

        amaxes.fetch = fetch
        writes: list[Future[None]] = []
        try:
            for index, item in enumerate(items):
                read_ahead(index)
                early = amaxes.take(item.info.name)
                x = early if early is not None else fetch(item.info.name)
                amax = amaxes.amax_for(item, x)
                read_ahead(index + 1)
                tensors = quantize_tensor(
                    item,
                    x,
                    dialect=plan.dialect,
                    profile=profile,
                    amax=amax,
                    input_amax=input_amax(item, plan.groups, calibration),
                    device=device,
                )
                writes.append(write_pool.submit(write, item, tensors))
                while len(writes) > 2 or (writes and writes[0].done()):
                    writes.pop(0).result()
            for pending in writes:
                pending.result()
            writer.close(sync=False)  # the read-back stage fsyncs it, off the critical path
        except BaseException:
            unfinished: list[Future[Any]] = [*ahead.values(), *writes]
            for future in unfinished:
                future.cancel()
            amaxes.fetch = reader.read
            write_pool.shutdown(wait=True)
            writer.abort()
            raise
    os.replace(tmp, path)
    return writer.sha256


def tensor_hashes(path: Path, *, sync: bool = False) -> dict[str, str]:
    """sha256 of every tensor of a finished shard, read back from disk.

    Args:
        path: the shard.
        sync: fsync the file first (the converter closes shards without syncing).
    """
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with SafetensorsFile(path) as f:
        return {name: tensor_sha256(f.read_bytes(name)) for name in f.entries}
