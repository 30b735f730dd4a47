"""Shared test helpers: byte comparisons (every equality is on uint8 bytes) and test data."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "contracts"
NVFP4_EXPERTS = CONTRACTS / "nvfp4-experts-per-token.yaml"
MXFP8_ALL = CONTRACTS / "mxfp8-end-to-end.yaml"


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


def adversarial(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Wide exponent spread, E2M1/E4M3 rounding ties, zeros of both signs, NaN, inf, subnormals."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.randn(shape, generator=g)
    exps = torch.randint(-12, 12, shape, generator=g)
    x = torch.ldexp(mant, exps)
    grid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 3.0])
    pick = torch.rand(shape, generator=g)
    ties = grid[torch.randint(0, len(grid), shape, generator=g)] * torch.ldexp(
        torch.ones(shape), torch.randint(-3, 3, shape, generator=g)
    )
    x = torch.where(pick < 0.3, ties, x)
    x = torch.where((pick > 0.30) & (pick < 0.32), torch.zeros(shape), x)
    x = torch.where((pick > 0.32) & (pick < 0.34), torch.full(shape, -0.0), x)
    if dtype == torch.float32:
        tiny = torch.finfo(torch.float32).tiny
        x = torch.where((pick > 0.34) & (pick < 0.35), mant * tiny * 0.1, x)
    x = x.to(dtype)
    flat = x.view(-1)
    flat[::997] = float("nan")
    return x


def tree_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file below ``directory`` (to prove a source was not modified)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
