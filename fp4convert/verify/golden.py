"""Golden byte fixtures: deterministic inputs, expected bytes on disk, and their verification.

Inputs are never stored: they are regenerated from parameters with the constructions TE and
FlashInfer use in their exact-quantizer tests (docs/formats.md, "Golden fixtures"): ``random`` (randn, seed
42, row 0 zeroed so the zero-row path of per-row scales runs), ``boundary`` (TE's interleaved
linspace(-12, 12) +- 1e-3), ``zeros`` and ``maxes`` (the dtype's largest finite value). The
expected bytes (data, scales, amax) live in ``golden/fixtures.safetensors``; ``golden/manifest.json``
records each fixture's parameters and the sha256 of every tensor and of the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from fp4convert.checkpoint.hashing import file_sha256, tensor_sha256
from fp4convert.errors import CheckpointError
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4
from fp4convert.formats.profiles import FOUR_OVER_SIX_PROFILES
from fp4convert.version import __version__

__all__ = [
    "FixtureResult",
    "FixtureSpec",
    "default_specs",
    "fixture_input",
    "quantize_fixture",
    "regenerate",
    "verify",
]

MANIFEST = "manifest.json"
TENSORS = "fixtures.safetensors"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# format variant -> quantizer keyword arguments
VARIANTS: dict[str, dict[str, object]] = {
    "nvfp4-1x16-tensor": {"format": "nvfp4", "tile": "1x16", "scope": "tensor"},
    "nvfp4-1x16-row": {"format": "nvfp4", "tile": "1x16", "scope": "row"},
    "nvfp4-16x16": {"format": "nvfp4", "tile": "16x16", "scope": "tensor"},
    "nvfp4-colwise": {"format": "nvfp4", "tile": "1x16", "scope": "tensor", "columnwise": True},
    "mxfp8-row": {"format": "mxfp8", "axis": "row"},
    "mxfp8-col": {"format": "mxfp8", "axis": "col"},
}


@dataclass(frozen=True)
class FixtureSpec:
    """Everything needed to regenerate one fixture's input and expected bytes."""

    kind: str  # random | boundary | zeros | maxes
    variant: str  # a key of VARIANTS
    dtype: str  # bfloat16 | float16 | float32
    shape: tuple[int, int]
    profile: str = "te"
    seed: int = 42

    @property
    def name(self) -> str:
        rows, cols = self.shape
        suffix = "" if self.profile == "te" else f"-{self.profile}"
        return f"{self.kind}-{self.variant}-{self.dtype}-{rows}x{cols}{suffix}"


def fixture_input(spec: FixtureSpec) -> torch.Tensor:
    """Regenerate a fixture's input on the CPU (deterministic across runs and machines)."""
    rows, cols = spec.shape
    dtype = _DTYPES[spec.dtype]
    if spec.kind == "random":
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(spec.seed))
        if rows > 1:
            x[0] = 0
        return x.to(dtype)
    if spec.kind == "boundary":
        base = torch.linspace(-12.0, 12.0, cols // 2, dtype=torch.float32)
        row = torch.stack((base - 1e-3, base + 1e-3), dim=1).flatten()
        return row.repeat(rows, 1).to(dtype)
    if spec.kind == "zeros":
        return torch.zeros(rows, cols, dtype=dtype)
    if spec.kind == "maxes":
        return torch.full((rows, cols), torch.finfo(dtype).max, dtype=dtype)
    raise CheckpointError(f"unknown golden fixture kind {spec.kind!r}", hint="use random, boundary, zeros or maxes")


def _valid(variant: str, shape: tuple[int, int]) -> bool:
    rows, cols = shape
    params = VARIANTS[variant]
    if params["format"] == "mxfp8":
        return (cols if params["axis"] == "row" else rows) % 32 == 0
    needs_rows = params.get("tile") == "16x16" or params.get("columnwise")
    return cols % 16 == 0 and (not needs_rows or rows % 16 == 0)


def default_specs() -> list[FixtureSpec]:
    """The shipped fixture set: every variant x dtype x kind, several shapes (some not x128)."""
    shapes = {
        "random": [(1, 64), (3, 128), (32, 64), (128, 128), (256, 272), (320, 256)],
        "boundary": [(16, 128), (32, 128)],
        "zeros": [(3, 128), (128, 128)],
        "maxes": [(3, 128), (128, 128)],
    }
    specs = [
        FixtureSpec(kind, variant, dtype, shape)
        for kind, kind_shapes in shapes.items()
        for variant in VARIANTS
        for dtype in _DTYPES
        for shape in kind_shapes
        if _valid(variant, shape)
    ]
    # FlashInfer-sized tensors, bf16 only, to keep golden/ well under 20 MB.
    specs += [FixtureSpec("random", variant, "bfloat16", (1024, 2048)) for variant in VARIANTS]
    # Pin the other arithmetic profiles on one tensor each (they differ from te on ~0.2% of blocks).
    for profile in ("te-2.13", "modelopt"):
        for dtype in ("bfloat16", "float32"):
            specs.append(FixtureSpec("random", "nvfp4-1x16-tensor", dtype, (320, 256), profile=profile))
    # TE's 4over6 profiles: every NVFP4 variant x dtype x kind, at smaller shapes.
    four_over_six_shapes = {
        "random": [(3, 128), (128, 128), (256, 272)],
        "boundary": [(16, 128)],
        "zeros": [(16, 128)],
        "maxes": [(16, 128)],
    }
    specs += [
        FixtureSpec(kind, variant, dtype, shape, profile=profile)
        for profile in FOUR_OVER_SIX_PROFILES
        for kind, kind_shapes in four_over_six_shapes.items()
        for variant in VARIANTS
        if VARIANTS[variant]["format"] == "nvfp4"
        for dtype in _DTYPES
        for shape in kind_shapes
        if _valid(variant, shape)
    ]
    return specs


def quantize_fixture(spec: FixtureSpec, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Quantize a fixture's input on ``device``; returns its named output tensors (on CPU)."""
    x = fixture_input(spec).to(device)
    params = dict(VARIANTS[spec.variant])
    if params.pop("format") == "mxfp8":
        q = quantize_mxfp8(x, axis=params["axis"])  # type: ignore[arg-type]
        out: dict[str, torch.Tensor | None] = {"data": q.data, "scale": q.scale}
    else:
        columnwise = bool(params.pop("columnwise", False))
        q4 = quantize_nvfp4(x, columnwise=columnwise, profile=spec.profile, **params)  # type: ignore[arg-type]
        out = {"data": q4.data, "scale": q4.scale, "amax": q4.amax.reshape(-1)}
        if columnwise:
            out.update(data_t=q4.data_t, scale_t=q4.scale_t)
    return {k: v.contiguous().cpu() for k, v in out.items() if v is not None}


def regenerate(directory: str | Path, specs: list[FixtureSpec] | None = None) -> dict[str, Any]:
    """Recompute every fixture on the CPU and (re)write the tensors file and the manifest.

    Files are written under temporary names and renamed, so an interrupted run leaves the old
    fixtures intact.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specs = default_specs() if specs is None else specs
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for spec in specs:
        outputs = quantize_fixture(spec)
        for key, value in outputs.items():
            tensors[f"{spec.name}/{key}"] = value
        entries.append(
            {"name": spec.name, **asdict(spec), "tensors": {k: tensor_sha256(v) for k, v in outputs.items()}}
        )
    tmp_tensors = directory / (TENSORS + ".tmp")
    save_file(tensors, str(tmp_tensors), metadata={"generator": f"fp4convert {__version__}"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_tensors, 0o666 & ~umask)  # safetensors creates the file 0600; fixtures are shared data
    manifest = {
        "generator": f"fp4convert {__version__}",
        "torch": torch.__version__,
        "description": "Expected NVFP4/MXFP8 bytes; inputs are regenerated from each entry's parameters.",
        "file": TENSORS,
        "file_sha256": file_sha256(tmp_tensors),
        "fixtures": entries,
    }
    tmp_manifest = directory / (MANIFEST + ".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp_tensors, directory / TENSORS)
    os.replace(tmp_manifest, directory / MANIFEST)
    return manifest


@dataclass
class FixtureResult:
    """Outcome of one fixture: equal, or which tensors differ and where."""

    name: str
    equal: bool
    mismatches: dict[str, str] = field(default_factory=dict)


def _load(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    manifest_path, tensors_path = directory / MANIFEST, directory / TENSORS
    for path in (manifest_path, tensors_path):
        if not path.is_file():
            raise CheckpointError(
                f"golden fixtures not found: {path} is missing",
                hint="run `fp4convert golden regenerate` to create them",
                file=str(path),
            )
    manifest = json.loads(manifest_path.read_text())
    if file_sha256(tensors_path) != manifest["file_sha256"]:
        raise CheckpointError(
            f"{tensors_path} does not match the sha256 recorded in {manifest_path}",
            hint="the fixture file was modified; restore it from git or regenerate deliberately",
            file=str(tensors_path),
        )
    return manifest, load_file(str(tensors_path))


def _describe_difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    a = actual.reshape(-1).contiguous().view(torch.uint8)
    e = expected.reshape(-1).contiguous().view(torch.uint8)
    diff = (a != e).nonzero().flatten()
    first = int(diff[0])
    got, want = int(a[first]), int(e[first])
    return f"{diff.numel()} of {a.numel()} bytes differ; first at byte {first}: {got:#04x} != {want:#04x}"


def verify(directory: str | Path, device: str | torch.device = "cpu") -> Iterator[FixtureResult]:
    """Recompute every fixture of the manifest on ``device`` and compare bytes with the stored ones."""
    manifest, stored = _load(Path(directory))
    for entry in manifest["fixtures"]:
        spec = FixtureSpec(
            kind=entry["kind"],
            variant=entry["variant"],
            dtype=entry["dtype"],
            shape=tuple(entry["shape"]),
            profile=entry["profile"],
            seed=entry["seed"],
        )
        outputs = quantize_fixture(spec, device)
        mismatches = {}
        for key in entry["tensors"]:
            expected = stored.get(f"{spec.name}/{key}")
            actual = outputs.get(key)
            if expected is None or actual is None:
                mismatches[key] = "missing"
                continue
            if not torch.equal(actual.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)):
                mismatches[key] = _describe_difference(actual, expected)
        yield FixtureResult(spec.name, not mismatches, mismatches)
