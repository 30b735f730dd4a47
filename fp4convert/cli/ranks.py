"""What a command needs to run under ``torchrun``: the rank options, the process group, who renders.

``torchrun --nnodes N --nproc-per-node P -m fp4convert convert ...`` runs the same command in every
rank. :func:`joined` starts the process group for the command (gloo for CPU ranks, NCCL for GPU
ranks, :func:`fp4convert.ranks.process_group`); only rank 0 draws progress and prints the result,
every rank prints its own error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import click

from fp4convert.ranks import process_group

__all__ = ["collective_timeout", "is_root", "joined", "rank_timeout"]

rank_timeout = click.option(
    "--rank-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Under torchrun: seconds without a heartbeat after which a rank counts as lost and the others stop.",
)

#: seconds a collective on the process group may take (the one max-reduce of fused-group scales)
collective_timeout = 600.0


def is_root() -> bool:
    """Whether this process renders: a process alone, or rank 0 of a ``torchrun`` job."""
    return os.environ.get("RANK", "0") == "0"


@contextmanager
def joined(device: str) -> Iterator[None]:
    """The command's process group when ``torchrun`` started it (nothing otherwise)."""
    with process_group(device, timeout=collective_timeout):
        yield
