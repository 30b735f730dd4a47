"""Shared test helpers: byte comparisons (every equality is on uint8 bytes) and test data."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import pytest
import torch

from fp4convert.formats.mxfp8 import mxfp8_matrix_reference
from fp4convert.formats.nvfp4 import nvfp4_matrix_reference
from fp4convert.formats.segments import (
    SegmentLayout,
    Sources,
    mxfp8_segments,
    nvfp4_segment_mismatches,
    nvfp4_segments,
    unit_amax,
)

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


# -- grouped quantization (fp4convert.formats.segments), shared by the CPU and CUDA tests --


#: the tensor scope's NVFP4 launches on a device: (``_PERSISTENT``, ``_PREFETCH``) of
#: fp4convert.formats._triton_segments
NVFP4_LAUNCHES = {"grid": (False, False), "persistent": (True, False), "persistent-prefetch": (True, True)}


def segment_group(dtype: torch.dtype, device: str = "cpu") -> tuple[list[torch.Tensor], list[int]]:
    """Separate tensors, row slices of one tensor and rows with a stride wider than the row; units
    shared by the first two segments and by the last two."""
    big = adversarial((64, 160), dtype, seed=8).to(device)[:, :128]
    parts = [
        adversarial((32, 128), dtype, seed=5).to(device),
        (adversarial((48, 128), dtype, seed=6) * 3).to(device),
        adversarial((16, 128), dtype, seed=7).to(device),
        big[:32],
        big[32:],
    ]
    return parts, [0, 0, 1, 2, 2]


def _reference_amax(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return torch.where(x.isnan(), torch.zeros_like(x), x.abs()).amax()


def check_nvfp4_segments(parts: list[torch.Tensor], units: list[int], profile: str, tile: str) -> None:
    cols = parts[0].shape[1]
    layout = SegmentLayout.of([p.shape[0] for p in parts], units, cols=cols)
    sources = Sources(layout).bind(parts)
    amax = unit_amax(sources)
    for u in range(layout.num_units):
        members = [p for p, unit in zip(parts, units, strict=True) if unit == u]
        assert_bytes_equal(amax[u], torch.stack([_reference_amax(p) for p in members]).amax().to(amax.device))
    data = torch.empty(layout.total_rows, cols // 2, dtype=torch.uint8, device=parts[0].device)
    scale = torch.empty(layout.total_rows, cols // 16, dtype=torch.uint8, device=parts[0].device)
    nvfp4_segments(sources, amax, profile, tile=tile, data=data, scale=scale)
    for p, unit, row in zip(parts, units, layout.out_rows, strict=True):
        rows = p.shape[0]
        want_data, want_scale = nvfp4_matrix_reference(
            p.cpu().contiguous(), amax[unit].cpu().expand(rows), profile, tile=tile
        )
        assert_bytes_equal(data[row : row + rows], want_data)
        assert_bytes_equal(scale[row : row + rows], want_scale)


def check_mxfp8_segments(parts: list[torch.Tensor]) -> None:
    layout = SegmentLayout.of([p.shape[0] for p in parts], cols=128)
    sources = Sources(layout).bind(parts)
    data = torch.empty(layout.total_rows, 128, dtype=torch.uint8, device=parts[0].device)
    scale = torch.empty(layout.total_rows, 4, dtype=torch.uint8, device=parts[0].device)
    mxfp8_segments(sources, data=data, scale=scale)
    want_data, want_scale = mxfp8_matrix_reference(torch.cat([p.cpu() for p in parts]))
    assert_bytes_equal(data, want_data)
    assert_bytes_equal(scale, want_scale)


def check_nvfp4_segment_mismatches(parts: list[torch.Tensor], units: list[int], profile: str, tile: str) -> None:
    """The one-pass quantize-and-compare kernel (Triton) flags exactly the rows whose bytes differ
    from the group's NVFP4 bytes: none for the right bytes, then each planted difference (a data
    byte's high or low nibble, a scale byte) in its own row, first and last rows and columns included."""
    cols = parts[0].shape[1]
    layout = SegmentLayout.of([p.shape[0] for p in parts], units, cols=cols)
    sources = Sources(layout).bind(parts)
    amax = unit_amax(sources)
    device = parts[0].device
    data = torch.empty(layout.total_rows, cols // 2, dtype=torch.uint8, device=device)
    scale = torch.empty(layout.total_rows, cols // 16, dtype=torch.uint8, device=device)
    nvfp4_segments(sources, amax, profile, tile=tile, data=data, scale=scale)
    flags = nvfp4_segment_mismatches(sources, amax, profile, tile=tile, data=data, scale=scale)
    assert flags is not None, "no one-pass kernel here (run on CUDA or under Triton's interpreter)"
    assert_bytes_equal(flags, torch.zeros(layout.total_rows, 2, dtype=torch.int32))
    rows = layout.total_rows
    wrong_data, wrong_scale = data.clone(), scale.clone()
    for row, col, bit in ((0, 0, 0x01), (rows // 2, cols // 2 - 1, 0x80), (rows - 1, cols // 4 + 1, 0x10)):
        wrong_data[row, col] ^= bit
    for row, col in ((1, 0), (rows - 1, cols // 16 - 1)):
        wrong_scale[row, col] ^= 0x01
    flags = nvfp4_segment_mismatches(sources, amax, profile, tile=tile, data=wrong_data, scale=wrong_scale)
    want = torch.stack([(wrong_data != data).any(dim=1), (wrong_scale != scale).any(dim=1)], dim=1)
    assert flags is not None
    assert_bytes_equal(flags, want.to(torch.int32))


def e2m1_risky_patterns() -> torch.Tensor:
    """Float32 patterns (int64) where the rounding can go wrong, both signs: every bfloat16 value
    widened; 4096 patterns either side of each decision threshold, code point and binade edge; zeros,
    subnormals, infinities and NaNs with payloads; 2^16 random patterns."""
    bf16 = torch.arange(1 << 16, dtype=torch.int64) << 16
    points = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    centres = points.view(torch.int32).to(torch.int64)
    near = (centres[:, None] + torch.arange(-4096, 4097)).reshape(-1)
    special = torch.tensor(
        [0, 1, 2, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF],
        dtype=torch.int64,
    )
    rand = torch.randint(0, 1 << 32, (1 << 16,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    magnitudes = torch.cat([bf16 & 0x7FFFFFFF, near, special, rand & 0x7FFFFFFF])
    return torch.cat([magnitudes, magnitudes | (1 << 31)]).unique()


#: a ``device`` parameter value that runs on a CUDA device only (marked gpu: a skip is not a pass)
CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
)


def count_uploads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every table upload (:func:`fp4convert.formats.uploads.upload`) from here on, as the name of
    the function that made it."""
    from fp4convert.formats import segments
    from fp4convert.megatron import batches, context, groups

    made: list[str] = []
    for module in (batches, segments, context, groups):

        def counted(tables, device, real=module.upload):  # type: ignore[no-untyped-def]
            made.append(inspect.stack()[1].function)
            return real(tables, device)

        monkeypatch.setattr(module, "upload", counted)
    return made
