"""Small host-built tables (row -> unit maps, address tables) moved to a GPU without waiting for it.

A copy from ordinary (pageable) host memory blocks the host until the GPU has run everything
queued before it: on an exporter's first sync, every group's few index tables made the host wait
for the kernels of the group before, so the first call ran host and GPU one after the other. Here
a set of tables goes out as one copy from pinned memory, queued behind the kernels without the
host waiting (torch's pinned-memory allocator keeps the staging buffer until the copy is done).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["upload"]

_ALIGN = 256  # each table starts on this boundary: the kernels' pointer arguments stay aligned as before


def upload(tables: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """``tables`` (CPU tensors) on ``device``, in one asynchronous copy for a CUDA device.

    Example:
        >>> a, b = upload([torch.arange(3), torch.ones(2, 2, dtype=torch.int32)], "cpu")
        >>> a.tolist(), b.dtype
        ([0, 1, 2], torch.int32)
    """
    device = torch.device(device)
    if device.type != "cuda":
        return [t.to(device) for t in tables]
    if torch.cuda.is_current_stream_capturing():
        # a CUDA graph would record the copy, not make it, and replay it from a freed staging buffer:
        # the work being captured must have made its tables in an eager run before (megatron.replay)
        raise RuntimeError("a table upload while a CUDA graph is being captured")
    spans: list[tuple[int, int]] = []
    total = 0
    for t in tables:
        nbytes = t.numel() * t.element_size()
        spans.append((total, nbytes))
        total += -(-nbytes // _ALIGN) * _ALIGN
    staging = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=True)
    for t, (start, nbytes) in zip(tables, spans, strict=True):
        if nbytes:
            staging[start : start + nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    on_device = staging.to(device, non_blocking=True)
    return [
        on_device[start : start + nbytes].view(t.dtype).reshape(t.shape)
        for t, (start, nbytes) in zip(tables, spans, strict=True)
    ]
