"""Scale values (tensor data, read one module at a time): global, input and block scales.

* FP32 global and activation scales: NaN, inf, zero, negative or subnormal values. Engines
  build ``alpha = input_scale * weight_scale_2`` and quantize activations with ``1 / input_scale``:
  a zero turns into inf and then NaN (vLLM #45212), a subnormal flushes to zero in the kernels
  (vLLM #42601 dead-expert scales). compressed-tensors stores the reciprocal (encode) scales;
  each is judged as stored, the decode scale comes from the dialect.
* E4M3 block scales: NaN or negative codes; a module whose blocks are all zero (dequantizes to 0).
* Block scales that cannot come from the stated global scale: every profile maps the largest
  block of the tensor (of the group that shares one global scale) to the E4M3 maximum 448
  (a 256-bound 4over6 global: 256 to 384). A largest block below that means the global scale was
  computed from another amax than the one these blocks were encoded for.
* E8M0 (MXFP8) block scales: the NaN code 0xFF.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from fp4convert.dialects import Dialect
from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding, Severity
from fp4convert.doctor.scan import Scan
from fp4convert.doctor.structure import partial_spelling
from fp4convert.formats.codecs import e4m3_decode
from fp4convert.formats.spec import E8M0

__all__ = ["ScaleValues", "check_scales", "scalar_problem"]

#: The E4M3 codes the largest block scale of a tensor (or of a group sharing one global scale) can
#: take: 448 (0x7E) under every profile with the 448 bound (a 4over6 map-to-4 amax block saturates
#: there too); with the 256 bound the amax block takes 256 (map-to-6) or 384 (map-to-4) and a
#: smaller block's map-to-4 scale may lie between, so 256..384 (0x78..0x7C).
_BLOCK_MAXIMA = frozenset({0x7E, *range(0x78, 0x7D)})
_FLT_MIN_NORMAL = torch.finfo(torch.float32).tiny


def scalar_problem(value: float) -> str | None:
    """``nan``, ``inf``, ``zero``, ``negative`` or ``subnormal`` (float32), None for a usable scale.

    Example:
        >>> [scalar_problem(v) for v in (1.0, 0.0, -2.0, float("inf"), 1e-40)]
        [None, 'zero', 'negative', 'inf', 'subnormal']
    """
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf"
    if value == 0:
        return "zero"
    if value < 0:
        return "negative"
    if value < _FLT_MIN_NORMAL:
        return "subnormal"
    return None


@dataclass
class ScaleValues:
    """Scalar scales read once and shared by the checks that need them (siblings, activations)."""

    scan: Scan
    model: Model
    prefer: str | None

    def __post_init__(self) -> None:
        self._cache: dict[str, torch.Tensor] = {}

    def spelling(self, module: str) -> tuple[Dialect, str] | None:
        return partial_spelling(self.model.modules[module], self.prefer)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            self._cache[name] = self.scan.read(name).float().reshape(-1)
        return self._cache[name]

    def leaf_name(self, module: str, role: str) -> str | None:
        found = self.spelling(module)
        if found is None:
            return None
        dialect, fmt = found
        leaf = dialect.suffixes[fmt].get(role)
        return f"{module}.{leaf}" if leaf is not None and leaf in self.model.modules[module].leaves else None

    def stored(self, module: str, role: str) -> float | None:
        """The (first) value of a module's ``global`` / ``input`` scale as stored, None if absent."""
        name = self.leaf_name(module, role)
        if name is None or self.scan.tensors[name][1].nbytes == 0:
            return None
        return float(self.tensor(name)[0])

    def decode(self, module: str) -> float | None:
        """The global *decode* scale of an NVFP4 module (``e2m1 * block * it`` is the weight)."""
        found = self.spelling(module)
        name = self.leaf_name(module, "global")
        if found is None or name is None:
            return None
        return float(found[0].decode_scale(self.tensor(name)[:1]))


_SCALAR_TEXT = {
    "global": (
        "NVFP4 global weight scales that are {what}",
        "decodes every weight of the module as 0, inf or NaN (NaN logits, prompt-dependent when only some experts "
        "are hit: vLLM #45212, #42601)",
    ),
    "input": (
        "activation (input) scales that are {what}",
        "quantizes activations with 1 / input_scale and multiplies by input_scale * weight_scale_2: inf, then NaN "
        "(vLLM #45212); a subnormal flushes to zero in the kernels",
    ),
}


def _scalar_findings(values: ScaleValues, modules: Iterable[str]) -> list[Finding]:
    bad: dict[tuple[str, str], list[str]] = {}
    for module in modules:
        for role in ("global", "input"):
            name = values.leaf_name(module, role)
            if name is None or values.scan.tensors[name][1].nbytes == 0:
                continue
            problems = {p for v in values.tensor(name).tolist() if (p := scalar_problem(v)) is not None}
            for problem in problems:
                bad.setdefault((role, problem), []).append(name)
    findings = []
    for (role, problem), names in sorted(bad.items()):
        message, effect = _SCALAR_TEXT[role]
        findings.append(
            Finding(
                "scales",
                f"{role}-scale-{problem}",
                "error",
                message.format(what=problem),
                tuple(sorted(names)),
                {"all": effect},
                fix="re-derive these modules from the BF16 source (--fix with --source), or re-export them",
                repair="rederive" if role == "global" else None,
            )
        )
    return findings


def _block_stats(values: ScaleValues, module: str) -> tuple[str, str, torch.Tensor, str] | None:
    """(scale tensor name, format, its bytes, global-scale key) of one quantized module."""
    found = values.spelling(module)
    name = values.leaf_name(module, "scale")
    if found is None or name is None:
        return None
    raw = values.scan.read(name).reshape(-1).view(torch.uint8)
    glob = values.leaf_name(module, "global")
    key = (
        values.tensor(glob)[:1].view(torch.int32).item()
        if glob is not None and values.scan.tensors[glob][1].nbytes
        else ""
    )
    return name, found[1], raw, str(key)


def _group_key(model: Model, module: str) -> str:
    """Modules that may share one global scale: a fused group, or one MoE layer's experts."""
    info = model.weight(module)
    if ".experts." in module:
        return module.split(".experts.", 1)[0] + ".experts"
    return (info.fused_group if info is not None and info.fused_group else None) or module


def _block_findings(values: ScaleValues, modules: Iterable[str]) -> list[Finding]:
    bad: dict[str, list[str]] = {"block-scale-nan": [], "block-scale-negative": [], "block-scale-zero": []}
    maxima: dict[tuple[str, str], tuple[int, list[str]]] = {}
    for module in modules:
        stats = _block_stats(values, module)
        if stats is None:
            continue
        name, fmt, raw, key = stats
        if fmt == "mxfp8":
            if bool((raw == E8M0.nan_code).any()):
                bad["block-scale-nan"].append(name)
            continue
        nan = (raw & 0x7F) == 0x7F
        negative = ((raw & 0x80) != 0) & ~nan
        if bool(nan.any()):
            bad["block-scale-nan"].append(name)
        if bool(negative.any()):
            bad["block-scale-negative"].append(name)
        usable = raw[~nan & ~negative]
        top = int(usable.max()) if usable.numel() else 0
        if top == 0:
            bad["block-scale-zero"].append(name)
            continue
        group = (_group_key(values.model, module), key)
        best, members = maxima.get(group, (0, []))
        maxima[group] = (max(best, top), [*members, name])
    findings = []
    texts = {
        "block-scale-nan": "NVFP4/MXFP8 block scales holding the NaN code",
        "block-scale-negative": "NVFP4 block scales with the sign bit set (negative or -0)",
        "block-scale-zero": "modules whose block scales are all zero: the weight dequantizes to 0",
    }
    for code, names in bad.items():
        if names:
            severity: Severity = "warning" if code == "block-scale-zero" else "error"
            findings.append(
                Finding(
                    "scales",
                    code,
                    severity,
                    texts[code],
                    tuple(sorted(names)),
                    fix="re-derive from the BF16 source (--fix with --source), or re-export",
                    repair="rederive",
                )
            )
    short = {g: v for g, v in maxima.items() if v[0] not in _BLOCK_MAXIMA}
    if short:
        worst = min(v[0] for v in short.values())
        largest = float(e4m3_decode(torch.tensor([worst], dtype=torch.uint8))[0])
        findings.append(
            Finding(
                "scales",
                "block-scale-max",
                "error",
                f"block scales that cannot come from their global scale: no block reaches the E4M3 maximum 448 "
                f"(the lowest largest block is {largest:g}), so the global scale was computed from another amax "
                "than these blocks were encoded for",
                tuple(sorted(n for _, members in short.values() for n in members)),
                {"all": "decodes e2m1 * block scale * global scale: weights come out scaled by the mismatch"},
                fix="re-derive from the BF16 source (--fix with --source)",
                repair="rederive",
            )
        )
    return findings


def check_scales(values: ScaleValues) -> list[Finding]:
    """Every scale finding of the module docstring (reads scalar and block scales, never packed data)."""
    quantized = [
        m for m, mod in values.model.modules.items() if mod.format in ("nvfp4", "mxfp8") or values.spelling(m)
    ]
    return _scalar_findings(values, quantized) + _block_findings(values, quantized)
