"""What :func:`~fp4convert.bridge.validate_export` found: one result per tensor, findings, counts.

A finding names the check that failed, what was found against what was expected (for differing
bytes: the first differing block with the dequantized values of both sides and of the master),
and, where the validator could tell, the likely cause (``cause``), e.g. "exporter quantized
gate_proj and up_proj separately" or "bytes match expert 7 of the master: EP offset missing?".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fp4convert.errors import VerificationError

__all__ = ["CHECKS", "ExportReport", "Finding", "TensorResult"]

#: every check, in the order a report lists its counts
CHECKS: tuple[str, ...] = (
    "missing",  # an expected tensor is not in the export
    "extra",  # the export holds a tensor the contract does not produce from this master
    "format",  # the export holds another format than the contract decides (e.g. NVFP4 for a BF16 layer)
    "dtype",  # an expected tensor has the wrong dtype
    "shape",  # an expected tensor has the wrong shape
    "bytes",  # bytes differ from the reference quantizer applied to the master
    "shared-scale",  # fused siblings carry different outer scales
    "input-scale",  # an input_scale in a live update (the engine keeps the one loaded from disk)
    "duplicate",  # one tensor in several update buckets
)


@dataclass(frozen=True)
class Finding:
    """One failed check.

    Attributes:
        check: one of :data:`CHECKS`.
        detail: what was found and what was expected.
        cause: the likely cause, when the validator could establish one.
    """

    check: str
    detail: str
    cause: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "detail": self.detail, "cause": self.cause}


@dataclass
class TensorResult:
    """The verdict on one HF tensor (or a fused group, or an unexpected tensor).

    Attributes:
        name: HF tensor name (``...gate_proj.weight``), a fused group key (``...gate_up``) for a
            shared-scale finding, or the exported name of an unexpected tensor.
        kind: ``tensor`` (expected from the master), ``group`` (a shared-scale group) or
            ``unexpected`` (in the export, not produced by the contract from this master).
        format: the format the contract decides (None for unexpected tensors).
        rule: the contract entry that decided it.
        outputs: the exported tensors checked for it.
        findings: the failed checks; empty when the tensor is exactly what the contract gives.
    """

    name: str
    kind: str = "tensor"
    format: str | None = None
    rule: str | None = None
    outputs: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "ok": self.ok,
            "format": self.format,
            "rule": self.rule,
            "outputs": list(self.outputs),
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class ExportReport:
    """The outcome of validating one export against its master.

    Attributes:
        contract: contract name.
        dialect: the dialect the export was checked as.
        device: where the reference was computed.
        results: one per expected tensor, in model order, then fused-group and unexpected results.
        master_bytes: bytes of master tensors the reference was computed from.
        seconds: wall time of the validation.
        ep_rank / ep_size: the expert-parallel position the export was checked for.
    """

    contract: str
    dialect: str
    device: str
    results: list[TensorResult]
    master_bytes: int
    seconds: float
    ep_rank: int = 0
    ep_size: int = 1

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[TensorResult]:
        return [r for r in self.results if not r.ok]

    def counts(self) -> dict[str, int]:
        """``expected``, ``ok``, ``failed`` tensors and the number of findings per check."""
        expected = [r for r in self.results if r.kind == "tensor"]
        checks = Counter(f.check for r in self.results for f in r.findings)
        return {
            "expected": len(expected),
            "ok": sum(r.ok for r in expected),
            "failed": len(self.failures),
            **{check: checks[check] for check in CHECKS},
        }

    def formats(self) -> dict[str, int]:
        """Expected tensors per contract format."""
        return dict(Counter(r.format for r in self.results if r.kind == "tensor" and r.format))

    @property
    def gb_per_s(self) -> float:
        return self.master_bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line: the verdict, counts, and the speed (GB of BF16 master per second)."""
        counts = self.counts()
        speed = f"{self.master_bytes / 1e9:.3f} GB of master in {self.seconds:.2f} s ({self.gb_per_s:.1f} GB/s)"
        if self.ok:
            formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(self.formats().items()))
            return f"OK: {counts['expected']} tensors follow contract {self.contract} ({formats}); {speed}"
        checks = ", ".join(f"{counts[c]} {c}" for c in CHECKS if counts[c])
        return f"FAILED: {counts['failed']} of {len(self.results)} results fail ({checks}); {speed}"

    def lines(self) -> list[str]:
        """One line per finding: ``FAIL <check> <tensor>: <detail>`` and its cause on the next."""
        out = []
        for result in self.failures:
            for finding in result.findings:
                out.append(f"FAIL {finding.check:12} {result.name}: {finding.detail}")
                if finding.cause:
                    out.append(f"     cause: {finding.cause}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "contract": self.contract,
            "dialect": self.dialect,
            "device": self.device,
            "ep_rank": self.ep_rank,
            "ep_size": self.ep_size,
            "counts": self.counts(),
            "formats": self.formats(),
            "master_bytes": self.master_bytes,
            "seconds": self.seconds,
            "gb_per_s": self.gb_per_s,
            "results": [r.to_json() for r in self.results],
        }

    def raise_for_failures(self) -> None:
        """Raise :class:`~fp4convert.errors.VerificationError` unless the export is exact.

        Raises:
            VerificationError: with the summary and the first finding.
        """
        if self.ok:
            return
        first = self.failures[0]
        finding = first.findings[0]
        raise VerificationError(
            f"{self.summary()}; first: {finding.check} {first.name}: {finding.detail}",
            hint=finding.cause or "run `fp4convert validate-export` on a dump of this update for the full report",
            tensor=first.name,
        )
