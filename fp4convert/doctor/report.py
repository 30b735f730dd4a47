"""What ``doctor`` reports: findings (severity, tensors grouped and counted, what each engine does, the
fix) and the verdict with its exit status (0 healthy, 1 errors found, 2 could not read)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ENGINES", "DoctorReport", "Finding", "Severity", "group_names"]

Severity = Literal["error", "warning"]
#: The engines doctor knows the loaders of, in the order it reports them.
ENGINES: tuple[str, ...] = ("sglang", "vllm", "trtllm")
#: How many names of one group a report shows.
_EXAMPLES = 3
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def group_names(names: Iterable[str]) -> list[dict[str, Any]]:
    """Tensor or module names grouped by their pattern with layer and expert indices as ``*``.

    Example:
        >>> names = ["model.layers.0.mlp.experts.1.up_proj", "model.layers.2.mlp.experts.0.up_proj", "lm_head"]
        >>> [(g["pattern"], g["count"]) for g in group_names(names)]
        [('model.layers.*.mlp.experts.*.up_proj', 2), ('lm_head', 1)]
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_INDEX.sub("*", name), []).append(name)
    return [
        {"pattern": pattern, "count": len(members), "examples": sorted(members)[:_EXAMPLES]}
        for pattern, members in groups.items()
    ]


@dataclass(frozen=True)
class Finding:
    """One problem of a checkpoint.

    Attributes:
        check: the family of checks (``structure``, ``index``, ``routing``, ``scales``,
            ``siblings``, ``activations``, ``exclude``, ``contract``, ``provenance``).
        code: the problem, e.g. ``global-scale-zero``; stable, for scripts and tests.
        severity: ``error`` (an engine fails or computes wrong values) or ``warning``.
        message: what is wrong, in one sentence.
        tensors: every tensor (or module) it concerns.
        engines: engine -> what that engine does with it.
        fix: what to do.
        repair: the ``--fix`` action that repairs it: ``config`` (config.json, exclude list,
            routing, side files, no tensor data), ``rederive`` (needs ``--source``), or None.
    """

    check: str
    code: str
    severity: Severity
    message: str
    tensors: tuple[str, ...] = ()
    engines: Mapping[str, str] = field(default_factory=dict)
    fix: str = ""
    repair: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "count": len(self.tensors),
            "tensors": group_names(self.tensors),
            "engines": dict(self.engines),
            "fix": self.fix,
            "repair": self.repair,
        }

    def lines(self) -> list[str]:
        """The finding as text: headline, grouped tensors, engines, fix."""
        out = [f"{self.severity}[{self.check}/{self.code}]: {self.message}"]
        for group in group_names(self.tensors):
            more = f" ({group['count']})" if group["count"] > 1 else ""
            out.append(f"  {group['pattern']}{more}")
        for engine, what in self.engines.items():
            out.append(f"  {engine}: {what}")
        if self.fix:
            out.append(f"  fix: {self.fix}" + (f" [--fix: {self.repair}]" if self.repair else ""))
        return out


@dataclass
class DoctorReport:
    """The diagnosis of one checkpoint.

    Attributes:
        path: the checkpoint folder read.
        dialect: the dialect its config routes engines to (None: no known quantization_config).
        spelling: the dialect its quantized tensors are spelled in (None: none, or several).
        engines: the engines it was judged against.
        loaders: engine -> the loader its config routes to, or why it has none.
        mode: ``headers`` (no tensor data read) or ``full``.
        formats: modules per stored format.
        bytes_read: tensor bytes read (headers excluded).
        findings: every problem found, errors first.
        notes: what doctor assumed or could not check.
    """

    path: str
    dialect: str | None = None
    spelling: str | None = None
    engines: tuple[str, ...] = ()
    loaders: dict[str, str] = field(default_factory=dict)
    mode: str = "full"
    formats: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """No error found (warnings allowed)."""
        return not self.errors

    @property
    def exit_code(self) -> int:
        """0 healthy, 1 errors found (2, could not read, is an exception: the report never exists)."""
        return 0 if self.ok else 1

    def codes(self) -> set[str]:
        """The codes of every finding."""
        return {f.code for f in self.findings}

    def find(self, code: str) -> list[Finding]:
        """The findings of one code."""
        return [f for f in self.findings if f.code == code]

    def summary(self) -> str:
        warnings = len(self.findings) - len(self.errors)
        verdict = "HEALTHY" if not self.findings else ("OK with warnings" if self.ok else "BROKEN")
        modules = ", ".join(f"{n} {fmt}" for fmt, n in sorted(self.formats.items()))
        return (
            f"{verdict}: {len(self.errors)} errors, {warnings} warnings ({self.dialect or 'no dialect'}; "
            f"{modules}; judged for {', '.join(self.engines) or 'no engine'}; {self.mode} mode, "
            f"{self.bytes_read / 2**20:.1f} MiB of tensor data read)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "dialect": self.dialect,
            "spelling": self.spelling,
            "engines": list(self.engines),
            "loaders": self.loaders,
            "mode": self.mode,
            "formats": self.formats,
            "bytes_read": self.bytes_read,
            "findings": [f.to_json() for f in self.findings],
            "notes": self.notes,
        }

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def sort(self) -> None:
        """Errors first; within a severity, in the order found."""
        self.findings.sort(key=lambda f: f.severity != "error")
