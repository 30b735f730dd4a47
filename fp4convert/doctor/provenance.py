"""``--source``: which arithmetic produced each quantized tensor, and whether it is the contract's.

Every quantized module is re-derived from its BF16 source weight under every NVFP4 profile of
:mod:`fp4convert.formats.profiles` (``te``, ``te-2.13``, ``modelopt``, the ``te-4over6-*`` ones),
with the module's own amax and, for fused siblings, the group's shared amax, in 1x16 blocks and
16x16 tiles; a candidate counts only when data, block scales and global scale are byte-identical
to the stored ones (the global scale is compared first, so most candidates cost nothing). MXFP8
has one quantize chain. A module no candidate reproduces was not quantized from this source by
any known arithmetic (another source, stale bytes, a damaged scale); with a contract, a module
reproduced only by other arithmetic than the contract's (profile, tile, shared scale) breaks it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import SourceCheckpoint, open_checkpoint
from fp4convert.contract import Contract
from fp4convert.dialects import Dialect
from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding
from fp4convert.doctor.scales import ScaleValues
from fp4convert.formats import profiles
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4
from fp4convert.hub import resolve_source
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES
from fp4convert.plan import member_amax

__all__ = [
    "Arithmetic",
    "SourceWeights",
    "check_provenance",
    "encode_module",
    "expected_arithmetic",
    "group_amaxes",
    "provenance",
    "source_weights",
]


@dataclass(frozen=True)
class Arithmetic:
    """One way to quantize a module: profile, tile and whether the fused group's amax was used."""

    profile: str
    tile: str = "1x16"
    shared: bool = False

    def describe(self) -> str:
        return f"{self.profile} {self.tile}" + (", shared group amax" if self.shared else ", own amax")


class SourceWeights:
    """The BF16 source's weights by logical name, read one at a time (one fd per shard)."""

    def __init__(self, source: SourceCheckpoint) -> None:
        self.source = source
        self._files: dict[str, SafetensorsFile] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.source.tensor_file

    def read(self, name: str) -> torch.Tensor:
        shard = self.source.tensor_file[name]
        if shard not in self._files:
            self._files[shard] = self.source.open(shard)
        return self._files[shard].read(name)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


@contextmanager
def source_weights(source: str | Path) -> Iterator[SourceWeights]:
    """Open a BF16 source (folder or repo id) for reading weights by name, once it passes the checks
    a conversion makes of its source (names, shapes and dtypes against config.json: a header that
    lies is refused here as ``convert`` refuses it, not met later as a tensor no kernel takes).

    Raises:
        CheckpointError, MappingError: the source is not a checkpoint of its config's model.
    """
    checkpoint = open_checkpoint(resolve_source(source))
    checkpoint.inventory()
    weights = SourceWeights(checkpoint)
    try:
        yield weights
    finally:
        weights.close()


def encode_module(
    dialect: Dialect, fmt: str, module: str, x: torch.Tensor, arithmetic: Arithmetic, amax: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """A module's data, block-scale and global-scale tensors as ``dialect`` stores them, quantized
    from ``x`` with ``arithmetic`` (``amax`` imposed when the group shares one)."""
    suffixes, dtypes = dialect.suffixes[fmt], dialect.output_dtypes[fmt]
    if fmt == "mxfp8":
        q = quantize_mxfp8(x)
        values = {"data": q.data, "scale": q.scale}
    else:
        n = quantize_nvfp4(x, tile=arithmetic.tile, amax=amax, profile=arithmetic.profile)  # type: ignore[arg-type]
        assert n.data is not None and n.scale is not None
        values = {"data": n.data, "scale": n.scale, "global": dialect.global_scale(n).reshape(dialect.global_shape)}
    return {f"{module}.{suffixes[r]}": t.view(SAFETENSORS_DTYPES[dtypes[r]]) for r, t in values.items()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)
    )


def _global_matches(dialect: Dialect, stored: torch.Tensor, amax: torch.Tensor, profile: str) -> bool:
    """Whether ``profile`` gives the stored global scale from ``amax`` (checked before any block)."""
    outer = profiles.outer_scales(amax.float().reshape(()), profile)  # type: ignore[arg-type]
    return _same(stored.float(), outer.s_enc if dialect.stores_encode_scale else outer.s_dec)


def candidates(rows: int, shared: bool) -> list[Arithmetic]:
    """Every arithmetic a module of ``rows`` rows may have been quantized with."""
    tiles = ["1x16", "16x16"] if rows % 16 == 0 else ["1x16"]
    # shared first: the member holding its group's amax is reproduced both ways, and shared says why
    return [
        Arithmetic(p, t, s) for p in profiles.PROFILES for t in tiles for s in ((True, False) if shared else (False,))
    ]


def reproducing(
    values: ScaleValues,
    weights: SourceWeights,
    model: Model,
    module: str,
    group_amax: dict[str, torch.Tensor],
    device: str,
) -> list[Arithmetic] | None:
    """The arithmetics that reproduce ``module``'s stored bytes from the source (None: no source weight)."""
    found = values.spelling(module)
    name = f"{module}.weight"
    if found is None or name not in weights:
        return None
    dialect, fmt = found
    x = weights.read(name).to(device)
    stored = {
        n: values.scan.read(n)
        for n in (
            f"{module}.{dialect.suffixes[fmt][r]}" for r in ("data", "scale", "global") if r in dialect.suffixes[fmt]
        )
    }
    if fmt == "mxfp8":
        made = encode_module(dialect, fmt, module, x, Arithmetic("te"), None)
        return [Arithmetic("te")] if all(_same(stored[n], made[n].cpu()) for n in made) else []
    info = model.weight(module)
    group = info.fused_group if info is not None else None
    own = member_amax(x)
    amaxes = {False: own, True: group_amax.get(group, own) if group else own}
    glob = stored[f"{module}.{dialect.suffixes[fmt]['global']}"]
    matched = []
    for arithmetic in candidates(x.shape[0], group in group_amax):
        amax = amaxes[arithmetic.shared]
        if not _global_matches(dialect, glob, amax.cpu(), arithmetic.profile):
            continue
        made = encode_module(dialect, fmt, module, x, arithmetic, amax)
        if all(_same(stored[n], made[n].cpu()) for n in made):
            matched.append(arithmetic)
    return matched


def group_amaxes(model: Model, weights: SourceWeights, device: str) -> dict[str, torch.Tensor]:
    """Each NVFP4 fused group's shared amax (the max of its members' source amaxes)."""
    out = {}
    for group, members in model.fused_groups().items():
        names = [f"{m}.weight" for m in members if model.modules[m].format == "nvfp4"]
        if len(names) == len(members) and all(n in weights for n in names):
            out[group] = torch.stack([member_amax(weights.read(n).to(device)) for n in names]).amax()
    return out


def expected_arithmetic(contract: Contract, model: Model, module: str) -> Arithmetic:
    """The arithmetic ``contract`` prescribes for an NVFP4 module."""
    info = model.weight(module)
    kind = info.fused_kind.value if info is not None and info.fused_kind is not None else None
    shared = (
        kind is not None
        and bool(getattr(contract.fused_groups, kind, False))
        and module in {m for members in model.fused_groups().values() for m in members}
    )
    return Arithmetic(contract.nvfp4_profile, contract.formats.nvfp4.tile, shared)


def provenance(
    values: ScaleValues, model: Model, weights: SourceWeights, device: str
) -> dict[str, list[Arithmetic] | None]:
    """Quantized module -> the arithmetics reproducing it (None: the source lacks its weight)."""
    shared = group_amaxes(model, weights, device)
    quantized = [m for m in model.gemm_modules() if model.modules[m].format in ("nvfp4", "mxfp8")]
    return {m: reproducing(values, weights, model, m, shared, device) for m in quantized}


def check_provenance(
    values: ScaleValues, model: Model, source: str | Path, contract: Contract | None, device: str
) -> list[Finding]:
    """The provenance findings of the module docstring."""
    with source_weights(source) as weights:
        found = provenance(values, model, weights, device)
    unknown = [m for m, matched in found.items() if matched == []]
    absent = [m for m, matched in found.items() if matched is None]
    off_contract: dict[tuple[str, str], list[str]] = {}
    for module, matched in found.items():
        if matched and contract is not None and model.modules[module].format == "nvfp4":
            prescribed = expected_arithmetic(contract, model, module)
            if prescribed not in matched:
                off_contract.setdefault((prescribed.describe(), matched[0].describe()), []).append(module)
    findings = []
    if unknown:
        findings.append(
            Finding(
                "provenance",
                "provenance-unknown",
                "error",
                "no known arithmetic reproduces these modules from the source (every profile, own and "
                "shared amax, 1x16 and 16x16): another source, stale or damaged bytes",
                tuple(unknown),
                fix="re-derive them from the source (--fix with --source)",
                repair="rederive",
            )
        )
    for (expected, actual), modules in sorted(off_contract.items()):
        findings.append(
            Finding(
                "provenance",
                "provenance-contract",
                "error",
                f"bytes come from {actual}; the contract prescribes {expected}",
                tuple(modules),
                fix="re-derive them under the contract (--fix with --source)",
                repair="rederive",
            )
        )
    if absent:
        findings.append(
            Finding(
                "provenance",
                "source-missing",
                "warning",
                "quantized modules whose weight the source does not have",
                tuple(absent),
                fix="pass the checkpoint's own BF16 source",
            )
        )
    return findings
