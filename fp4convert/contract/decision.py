"""What resolving a contract gives: one :class:`Decision` per tensor, and its :class:`Explanation`.

Plain frozen dataclasses, no logic: :mod:`fp4convert.contract.resolve` computes decisions,
:mod:`fp4convert.contract.explain` wraps one in an explanation, and every consumer (converter, live
export, plan, diff, lint) reads them.

Example:
    >>> match = RuleMatch("rules[0]", "nvfp4", "hf glob '*.mlp.experts.*'")
    >>> Decision("w", "nvfp4", None, match.rule, "nvfp4 from rules[0]", (match,)).fused_group is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fp4convert.contract.sections import Format, MXFP8Recipe, Namespace, NVFP4Recipe
from fp4convert.inventory import TensorInfo

__all__ = ["Decision", "Explanation", "RuleMatch"]


@dataclass(frozen=True)
class RuleMatch:
    """One contract entry that matched a tensor.

    Attributes:
        rule: its id: ``rules[2]``, ``bf16_exceptions.last_layers``, ``default``, ``non_gemm``...
        format: the format it gives.
        detail: why it matched, e.g. ``HF name contains '.kv_b_proj.'``.
    """

    rule: str
    format: Format
    detail: str


@dataclass(frozen=True)
class Decision:
    """The format one tensor gets, and why.

    Attributes:
        tensor: the tensor's name (HF name when known).
        format: ``nvfp4``, ``mxfp8`` or ``bf16``.
        recipe: the contract's recipe object for ``format``; None for ``bf16``.
        rule: id of the winning entry (``matched[0].rule``).
        reason: one human sentence.
        matched: every entry that matched, in precedence order; the first one won.
        fused_group: the fused group whose siblings share this tensor's outer scale, or None
            (not fused, sharing switched off in ``fused_groups``, or ``bf16``).
    """

    tensor: str
    format: Format
    recipe: NVFP4Recipe | MXFP8Recipe | None
    rule: str
    reason: str
    matched: tuple[RuleMatch, ...]
    fused_group: str | None = None


@dataclass(frozen=True)
class Explanation:
    """A decision together with what it was computed from.

    Attributes:
        tensor: the tensor as the contract saw it (from the model, a family, or the name alone).
        decision: the decision.
        num_layers: the decoder layer count used, or None when unknown.
        namespaces: the namespaces whose rules and name exceptions were evaluated.
        notes: what could not be evaluated or was assumed, one sentence each.
    """

    tensor: TensorInfo
    decision: Decision
    num_layers: int | None
    namespaces: frozenset[Namespace]
    notes: tuple[str, ...] = field(default=())

    @property
    def winner(self) -> RuleMatch:
        """The entry that decided."""
        return self.decision.matched[0]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (what ``explain --json`` prints)."""
        t = self.tensor
        return {
            "tensor": t.name,
            "megatron_name": t.megatron_name,
            "role": t.role.value,
            "layer": t.layer,
            "is_mtp": t.is_mtp,
            "gemm_weight": t.gemm_weight,
            "num_layers": self.num_layers,
            "namespaces": sorted(self.namespaces),
            "format": self.decision.format,
            "rule": self.decision.rule,
            "reason": self.decision.reason,
            "fused_group": self.decision.fused_group,
            "matched": [{"rule": m.rule, "format": m.format, "detail": m.detail} for m in self.decision.matched],
            "notes": list(self.notes),
        }
