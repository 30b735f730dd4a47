"""The footprint report (``fp4convert plan``): what a contract does to every tensor of a model, and its bytes.

:func:`build_plan` decides every tensor of a :class:`~fp4convert.inventory.ModelInventory` under a
:class:`~fp4convert.contract.Contract` through the tensor-plan core
(:func:`fp4convert.plan.plan_tensors`) and totals it: bytes before are the checkpoint's own
(``numel x`` dtype size), bytes after come from :func:`fp4convert.contract.footprint.storage_bytes`
(NVFP4 = numel/2 data + numel/16 E4M3 block scales + 4 bytes per FP32 outer scale; MXFP8 = numel +
numel/32 E8M0 scales; BF16 = 2 x numel for GEMM weights, other tensors keep their dtype).

Totals per role, rule and format cover the *decoder model*: multi-token-prediction layers are
counted on their own (``Plan.total(mtp=True)``), because published model sizes leave them out
(DeepSeek-V3: 671B without its 14B MTP layer). Totals per layer cover every layer.

Example (not run: deciding DeepSeek-V3's 46k tensors takes seconds):
    >>> from fp4convert.contract import load_contract
    >>> from fp4convert.families import inventory_from_config
    >>> plan = build_plan(load_contract("contracts/nvfp4-experts-per-token.yaml"),
    ...                   inventory_from_config("DeepSeek-V3"))  # doctest: +SKIP
    >>> plan.experts().params  # doctest: +SKIP
    656463101952
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from fp4convert.contract import Contract
from fp4convert.inventory import ModelInventory, Role, TensorInfo
from fp4convert.plan.tensors import PlannedTensor, plan_tensors

__all__ = ["EXPERT_ROLES", "Plan", "PlanRow", "Totals", "build_plan", "human_bytes"]

#: Roles whose parameters make up a model's "experts" (routed + shared), as published figures count them.
EXPERT_ROLES = (Role.ROUTED_EXPERT, Role.SHARED_EXPERT)
_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def human_bytes(count: int) -> str:
    """``2046820352`` -> ``1.906 GiB``.

    Example:
        >>> human_bytes(2046820352), human_bytes(512)
        ('1.906 GiB', '512 B')
    """
    for size, unit in _UNITS:
        if count >= size:
            return f"{count / size:.3f} {unit}"
    return f"{count} B"


@dataclass(frozen=True)
class Totals:
    """Sums over a set of planned tensors."""

    tensors: int = 0
    params: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    @classmethod
    def of(cls, planned: Iterable[PlannedTensor]) -> Totals:
        """The sums over ``planned``."""
        tensors = params = before = after = 0
        for item in planned:
            tensors += 1
            params += item.info.numel
            before += item.bytes_before
            after += item.bytes_after
        return cls(tensors, params, before, after)

    def to_dict(self) -> dict[str, int]:
        return {
            "tensors": self.tensors,
            "params": self.params,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
        }


@dataclass(frozen=True)
class Plan:
    """Every tensor of a model under one contract (see the module docstring for what totals cover).

    Attributes:
        contract: the contract's name.
        family: the model's family key.
        num_layers: decoder layers.
        num_mtp_layers: multi-token-prediction layers.
        tensors: one entry per tensor, in inventory order.
    """

    contract: str
    family: str
    num_layers: int
    num_mtp_layers: int
    tensors: tuple[PlannedTensor, ...]

    def decoder(self) -> list[PlannedTensor]:
        """The tensors of the decoder model (everything outside MTP layers)."""
        return [p for p in self.tensors if not p.info.is_mtp]

    def total(self, *, mtp: bool | None = False) -> Totals:
        """Totals of the decoder model (``mtp=False``), of the MTP layers (True), or of all (None)."""
        return Totals.of(p for p in self.tensors if mtp is None or p.info.is_mtp == mtp)

    def experts(self) -> Totals:
        """Routed plus shared experts of the decoder model."""
        return Totals.of(p for p in self.decoder() if p.info.role in EXPERT_ROLES)

    def by_role(self) -> dict[str, Totals]:
        """Decoder-model totals per role, in :class:`~fp4convert.inventory.Role` order."""
        order = {role.value: index for index, role in enumerate(Role)}
        grouped = _group(self.decoder(), lambda p: p.info.role.value)
        return dict(sorted(grouped.items(), key=lambda item: order[item[0]]))

    def by_rule(self) -> dict[str, Totals]:
        """Decoder-model totals per winning rule, largest ``bytes_after`` first."""
        grouped = _group(self.decoder(), lambda p: p.rule)
        return dict(sorted(grouped.items(), key=lambda item: -item[1].bytes_after))

    def by_format(self) -> dict[str, Totals]:
        """Decoder-model totals per format."""
        return dict(sorted(_group(self.decoder(), lambda p: p.format).items()))

    def by_source_format(self) -> dict[str, Totals]:
        """Decoder-model totals per source format (docs/sources.md): bytes read and written; empty
        when the inventory came from a config alone (no source was read)."""
        if not any(p.info.source_format for p in self.tensors):
            return {}
        return dict(sorted(_group(self.decoder(), lambda p: p.info.source_format).items()))

    def lossless_counts(self) -> dict[str, int]:
        """Tensors (all layers) per lossless verdict: ``lossless``, ``value-dependent``, ``lossy``."""
        words = {True: "lossless", None: "value-dependent", False: "lossy"}
        counts: dict[str, int] = {}
        for p in self.tensors:
            word = words[p.lossless.lossless]
            counts[word] = counts.get(word, 0) + 1
        return counts

    def by_layer(self) -> dict[int | None, Totals]:
        """Totals per layer (HF numbering, MTP layers included); None holds the tensors outside layers."""
        grouped = _group(self.tensors, lambda p: p.info.layer)
        return dict(sorted(grouped.items(), key=lambda item: -1 if item[0] is None else item[0]))

    def rows(self) -> list[PlanRow]:
        """The tensors with routed experts folded: one row per (name with ``*`` for the expert id,
        format, rule), counting how many tensors it stands for. Order is inventory order."""
        rows: dict[tuple[str, str, str], PlanRow] = {}
        for p in self.tensors:
            key = (_expert_wildcard(p.info), p.format, p.rule)
            if key in rows:
                rows[key] = rows[key].plus(p)
            else:
                rows[key] = PlanRow(
                    key[0],
                    p.info.shape,
                    p.info.role.value,
                    p.format,
                    p.rule,
                    1,
                    p.bytes_before,
                    p.bytes_after,
                )
        return list(rows.values())

    def grid(self) -> dict[tuple[int | None, str], set[str]]:
        """(layer, role) -> the formats its GEMM weights get (empty: only non-GEMM tensors there)."""
        cells: dict[tuple[int | None, str], set[str]] = {}
        for p in self.tensors:
            cell = cells.setdefault((p.info.layer, p.info.role.value), set())
            if p.info.gemm_weight:
                cell.add(p.format)
        return cells

    def to_dict(self, *, tensors: bool = True) -> dict[str, Any]:
        """Plain JSON types, for ``plan --json``."""
        decoder = self.total()
        experts = self.experts()
        data: dict[str, Any] = {
            "contract": self.contract,
            "model": {
                "family": self.family,
                "num_layers": self.num_layers,
                "num_mtp_layers": self.num_mtp_layers,
            },
            "totals": {
                "decoder": decoder.to_dict(),
                "mtp_layers": self.total(mtp=True).to_dict(),
                "all": self.total(mtp=None).to_dict(),
                "experts": {
                    **experts.to_dict(),
                    "share_of_params": experts.params / decoder.params if decoder.params else 0.0,
                },
            },
            "by_role": {key: value.to_dict() for key, value in self.by_role().items()},
            "by_rule": {key: value.to_dict() for key, value in self.by_rule().items()},
            "by_format": {key: value.to_dict() for key, value in self.by_format().items()},
            "by_source_format": {key: value.to_dict() for key, value in self.by_source_format().items()},
            "lossless": self.lossless_counts(),
            "by_layer": [
                {"layer": layer, "is_mtp": layer is not None and layer >= self.num_layers, **value.to_dict()}
                for layer, value in self.by_layer().items()
            ],
        }
        if tensors:
            data["tensors"] = [p.to_dict() for p in self.tensors]
        return data


@dataclass(frozen=True)
class PlanRow:
    """A row of the human plan: one tensor, or ``count`` experts' tensors folded under ``*``."""

    name: str
    shape: tuple[int, ...]
    role: str
    format: str
    rule: str
    count: int
    bytes_before: int
    bytes_after: int

    def plus(self, other: PlannedTensor) -> PlanRow:
        return PlanRow(
            self.name,
            self.shape,
            self.role,
            self.format,
            self.rule,
            self.count + 1,
            self.bytes_before + other.bytes_before,
            self.bytes_after + other.bytes_after,
        )


def _expert_wildcard(tensor: TensorInfo) -> str:
    """``model.layers.3.mlp.experts.7.up_proj.weight`` -> ``model.layers.3.mlp.experts.*.up_proj.weight``."""
    if tensor.expert is None:
        return tensor.name
    parts = tensor.name.split(".")
    for index in range(1, len(parts)):
        if parts[index] == str(tensor.expert) and parts[index - 1] == "experts":
            parts[index] = "*"
            break
    return ".".join(parts)


def _group(planned: Iterable[PlannedTensor], key: Callable[[PlannedTensor], Hashable]) -> dict[Any, Totals]:
    buckets: dict[Any, list[PlannedTensor]] = {}
    for item in planned:
        buckets.setdefault(key(item), []).append(item)
    return {name: Totals.of(items) for name, items in buckets.items()}


def build_plan(contract: Contract, inventory: ModelInventory) -> Plan:
    """Decide and price every tensor of ``inventory`` under ``contract``.

    Args:
        contract: a loaded precision contract.
        inventory: the model (shapes are needed for bytes).

    Returns:
        The :class:`Plan`.

    Raises:
        ContractError: the contract cannot be applied (e.g. it splits a fused group).
        MappingError: a tensor has no shape or an unknown dtype.

    Example:
        >>> from fp4convert.contract import Contract
        >>> rule = {"kind": "glob", "namespace": "hf", "pattern": "*.down_proj.*", "format": "nvfp4"}
        >>> fields = {"version": 1, "name": "c", "default": "bf16", "rules": [rule]}
        >>> contract = Contract.model_validate(fields)
        >>> tensor = TensorInfo("model.layers.0.mlp.down_proj.weight", (64, 128), layer=0, gemm_weight=True)
        >>> planned = build_plan(contract, ModelInventory("toy", 1, (tensor,))).tensors[0]
        >>> planned.format, planned.bytes_before, planned.bytes_after  # 8192/2 + 8192/16 + 4
        ('nvfp4', 16384, 4612)
    """
    return Plan(
        contract=contract.name,
        family=inventory.family,
        num_layers=inventory.num_layers,
        num_mtp_layers=inventory.num_mtp_layers,
        tensors=tuple(plan_tensors(contract, inventory)),
    )
