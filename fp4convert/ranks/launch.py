"""The process group a command starts when ``torchrun`` (or any ``env://`` launcher) runs it.

``torchrun --nnodes N --nproc-per-node P -m fp4convert convert ...`` starts N x P processes with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. Each one joins
the group here: gloo for CPU ranks, NCCL for GPU ranks (with gloo beside it for CPU tensors), each
GPU rank on its ``LOCAL_RANK`` device (ranks share the GPUs when a node has fewer), collectives
under ``timeout`` seconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch

__all__ = ["launched_by_torchrun", "process_group"]


def launched_by_torchrun() -> bool:
    """Whether this process is one of several started by an ``env://`` launcher (``WORLD_SIZE`` > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


@contextmanager
def process_group(device: str, *, timeout: float = 600.0) -> Iterator[bool]:
    """Join the launcher's process group for the duration of a command (and leave it after).

    Yields whether a group is up. Nothing happens when the process was not started by a launcher,
    or when a group is initialized already (the caller's own).
    """
    import torch.distributed as dist

    if not launched_by_torchrun() or dist.is_initialized():
        yield dist.is_initialized()
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))
    try:
        yield True
    finally:
        dist.destroy_process_group()
