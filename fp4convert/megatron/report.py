"""What ``validate-export`` found: one finding per failing tensor, the cause where it could tell.

A :class:`Finding` names the exported tensor, the check that failed, what differs (for bytes: the
first differing block with both sides' dequantized values and the master's) and, where the
diagnosis recognised a known exporter fault, its cause. :class:`ExportReport` holds the findings,
the tensors that passed, summary counts and the throughput.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fp4convert.errors import VerificationError

__all__ = ["CHECKS", "ExportReport", "Finding"]

#: Every check a finding can come from, in the order reports list them.
CHECKS: tuple[str, ...] = (
    "master",  # the master lacks the tensor the export should have been made from
    "missing",  # an expected tensor is not in the export
    "extra",  # the export holds a tensor the contract does not give this rank
    "duplicate",  # a tensor was sent in more than one update bucket
    "dtype",  # wrong dtype for the contract's format
    "shape",  # wrong shape
    "shared-scale",  # fused siblings carry different outer scales
    "bytes",  # bytes differ from the reference quantizer applied to the master
    "input-scale",  # an input_scale whose value differs from the contract's
)


@dataclass(frozen=True)
class Finding:
    """One failed check.

    Attributes:
        tensor: the exported (HF) tensor name.
        check: one of :data:`CHECKS`.
        detail: what was found against what was expected.
        cause: the diagnosed exporter fault, or ``""`` when none was recognised.
    """

    tensor: str
    check: str
    detail: str
    cause: str = ""

    def to_json(self) -> dict[str, str]:
        return {"tensor": self.tensor, "check": self.check, "detail": self.detail, "cause": self.cause}


@dataclass
class ExportReport:
    """The verdict on one live export.

    Attributes:
        contract: the contract's name.
        dialect: the dialect name.
        ep_rank: the EP rank the export was checked as.
        ep_size: the EP size.
        expected: every tensor the export should hold, in HF order.
        received: how many tensors the export held.
        formats: expected HF tensors per format (``nvfp4``, ``mxfp8``, ``bf16``).
        master_bytes: bytes of master tensors the export was compared against.
        seconds: wall time of the validation.
        findings: the failed checks, in the order they were made.
    """

    contract: str
    dialect: str
    ep_rank: int
    ep_size: int
    expected: list[str]
    received: int
    formats: dict[str, int]
    master_bytes: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.findings

    @property
    def gbps(self) -> float:
        """Master bytes checked per second, in GB/s."""
        return self.master_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def failed(self) -> dict[str, Finding]:
        """Tensor -> its first finding."""
        out: dict[str, Finding] = {}
        for finding in self.findings:
            out.setdefault(finding.tensor, finding)
        return out

    def tensors(self) -> Iterator[tuple[str, str, Finding | None]]:
        """Every expected tensor and every extra one as ``(name, status, first finding)``;
        status is ``ok`` or the first failed check."""
        failed = self.failed()
        for name in self.expected:
            finding = failed.get(name)
            yield name, finding.check if finding else "ok", finding
        expected = set(self.expected)
        for name, finding in failed.items():
            if name not in expected:
                yield name, finding.check, finding

    def counts(self) -> dict[str, int]:
        """``expected``, ``received``, ``ok``, ``failed`` and, per check, the tensors it failed first."""
        failed = self.failed()
        by_check = Counter(f.check for f in failed.values())
        counts = {
            "expected": len(self.expected),
            "received": self.received,
            "ok": sum(1 for name in self.expected if name not in failed),
            "failed": len(failed),
        }
        counts.update({check: by_check[check] for check in CHECKS if by_check[check]})
        return counts

    def causes(self) -> dict[str, int]:
        """Each diagnosed cause and how many findings it explains, most frequent first."""
        return dict(Counter(f.cause for f in self.findings if f.cause).most_common())

    def summary(self) -> str:
        """One line: the verdict and the counts."""
        counts = self.counts()
        speed = f"{self.master_bytes / 1e9:.3g} GB of master in {self.seconds:.3g} s"
        if self.ok:
            formats = ", ".join(f"{n} {fmt}" for fmt, n in sorted(self.formats.items()))
            return (
                f"OK: all {counts['expected']} exported tensors follow contract {self.contract} ({formats}); {speed}"
            )
        checks = ", ".join(f"{c} {counts[c]}" for c in CHECKS if counts.get(c))
        return f"FAILED: {counts['failed']} tensors fail ({checks}) of {counts['expected']} expected; {speed}"

    def to_json(self, *, per_tensor: bool = True) -> dict[str, Any]:
        """Plain JSON types: verdict, counts, causes, findings and (by default) every tensor's status."""
        out: dict[str, Any] = {
            "ok": self.ok,
            "contract": self.contract,
            "dialect": self.dialect,
            "ep_rank": self.ep_rank,
            "ep_size": self.ep_size,
            "counts": self.counts(),
            "formats": dict(self.formats),
            "causes": self.causes(),
            "master_bytes": self.master_bytes,
            "seconds": self.seconds,
            "findings": [f.to_json() for f in self.findings],
        }
        if per_tensor:
            out["tensors"] = [{"tensor": name, "status": status} for name, status, _ in self.tensors()]
        return out

    def raise_if_failed(self) -> None:
        """Raise a :class:`~fp4convert.errors.VerificationError` naming the first finding.

        Example:
            >>> ExportReport("c", "modelopt", 0, 1, [], 0, {}).raise_if_failed()  # passes silently
        """
        if self.ok:
            return
        first = self.findings[0]
        cause = f" ({first.cause})" if first.cause else ""
        raise VerificationError(
            f"live export breaks contract {self.contract}: {self.summary()}; first: {first.check} "
            f"`{first.tensor}`: {first.detail}{cause}",
            hint="do not push these weights to the sampler; fix the exporter",
            tensor=first.tensor,
            findings=self.findings,
        )
