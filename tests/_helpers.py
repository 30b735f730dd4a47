"""Shared helpers for the numeric-core tests: every equality is on uint8 bytes."""

from __future__ import annotations

import torch


def hexbytes(t: torch.Tensor) -> str:
    """Space-separated hex of a uint8 tensor (for readable expected values)."""
    return " ".join(f"{b:02x}" for b in t.contiguous().view(torch.uint8).flatten().tolist())


def from_hex(text: str) -> torch.Tensor:
    return torch.tensor([int(b, 16) for b in text.split()], dtype=torch.uint8)


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    a = actual.reshape(-1).contiguous().view(torch.uint8).cpu()
    e = expected.reshape(-1).contiguous().view(torch.uint8).cpu()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if not torch.equal(a, e):
        diff = (a != e).nonzero()
        first = tuple(diff[0].tolist())
        raise AssertionError(
            f"{diff.shape[0]} of {a.numel()} bytes differ; first at {first}: "
            f"{a[first].item():#04x} != {e[first].item():#04x}"
        )
