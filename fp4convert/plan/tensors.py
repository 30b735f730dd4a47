"""The tensor-plan core: every tensor of a model, its contract decision, what a dialect stores for it.

:func:`plan_tensors` is the one place a contract's decisions meet a model's tensors. The converter
(:func:`fp4convert.plan.plan_conversion`), the live export (:func:`fp4convert.megatron.export_plan`)
and the footprint report (:func:`fp4convert.plan.build_plan`, ``fp4convert plan``) all build their
plans from it, so the three agree on every tensor by construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fp4convert.checkpoint.safetensors_io import tensor_nbytes
from fp4convert.contract import Contract
from fp4convert.contract.footprint import storage_bytes
from fp4convert.contract.lossless import UNDECIDED, Lossless, lossless
from fp4convert.dialects import Dialect, OutputSpec, Planned
from fp4convert.errors import MappingError
from fp4convert.inventory import ModelInventory, Role, TensorInfo
from fp4convert.inventory.dtypes import itemsize

__all__ = ["PlannedTensor", "members_of", "plan_tensors", "shared_scale_groups", "source_bytes"]


def source_bytes(tensor: TensorInfo) -> int:
    """Bytes a tensor takes in its source checkpoint: what was read for it (an FP8 weight and its
    scales, an expert's slice of a fused tensor), else ``numel x`` the size of its dtype.

    Raises:
        MappingError: the dtype is not a known dtype name.

    Example:
        >>> source_bytes(TensorInfo("w", (4096, 1024), dtype="bfloat16"))
        8388608
    """
    if tensor.source_nbytes is not None:
        return tensor.source_nbytes
    size = itemsize(tensor.dtype)
    if size is None:
        raise MappingError(
            f"tensor `{tensor.name}` has dtype {tensor.dtype!r}, which is not a torch dtype",
            hint="use torch dtype names such as bfloat16, float32, float8_e4m3fn",
            tensor=tensor.name,
        )
    return tensor.numel * size


@dataclass(frozen=True)
class PlannedTensor(Planned):
    """One tensor of a model: its decision, what a dialect stores for it, where, and its bytes.

    Attributes:
        info: the tensor (HF name, shape, dtype, role ...).
        decision: the contract's decision for it.
        outputs: the tensors the dialect stores for it, ``(name, safetensors dtype, shape)`` in
            write order (empty in a footprint plan, which has no dialect).
        bytes_before: bytes in the source checkpoint.
        bytes_after: bytes of its weight storage under the decision
            (:func:`fp4convert.contract.footprint.storage_bytes`).
        source_file: the source shard holding it (conversion plans only).
        output_file: the output shard its outputs go to (conversion plans only).
        lossless: whether its output dequantizes to its source values exactly, and why
            (:func:`fp4convert.contract.lossless.lossless`).
    """

    outputs: tuple[OutputSpec, ...] = ()
    bytes_before: int = 0
    bytes_after: int = 0
    source_file: str = ""
    output_file: str = ""
    lossless: Lossless = UNDECIDED

    @property
    def format(self) -> str:
        return str(self.decision.format)

    @property
    def rule(self) -> str:
        return self.decision.rule

    @property
    def output_bytes(self) -> int:
        """Bytes of the dialect's outputs for this tensor (activation scales included)."""
        return sum(tensor_nbytes(dtype, shape) for _, dtype, shape in self.outputs)

    @property
    def is_expert(self) -> bool:
        """A routed expert's tensor with a known expert id."""
        return self.info.role is Role.ROUTED_EXPERT and self.info.expert is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, for ``plan --json``."""
        t = self.info
        return {
            "name": t.name,
            "megatron_name": t.megatron_name,
            "shape": list(t.shape),
            "dtype": t.dtype,
            "role": t.role.value,
            "layer": t.layer,
            "is_mtp": t.is_mtp,
            "expert": t.expert,
            "format": self.format,
            "rule": self.rule,
            "reason": self.decision.reason,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "source_format": t.source_format or None,
            "lossless": self.lossless.lossless,
            "lossless_why": self.lossless.why,
        }


def plan_tensors(contract: Contract, inventory: ModelInventory, dialect: Dialect | None = None) -> list[PlannedTensor]:
    """Decide, price and (given a dialect) lay out every tensor of ``inventory``, in inventory order.

    Args:
        contract: the precision contract.
        inventory: the model's tensors (shapes are needed for bytes).
        dialect: the dialect whose outputs each tensor gets; None for a footprint plan.

    Raises:
        ContractError: the contract cannot be applied (e.g. it splits a fused group).
        MappingError: a tensor has no shape or an unknown dtype.

    Example:
        >>> from fp4convert.contract import Contract
        >>> from fp4convert.dialects import get_dialect
        >>> rule = {"kind": "glob", "namespace": "hf", "pattern": "*.down_proj.*", "format": "nvfp4"}
        >>> contract = Contract.model_validate({"version": 1, "name": "c", "default": "bf16", "rules": [rule]})
        >>> w = TensorInfo("model.layers.0.mlp.down_proj.weight", (64, 128), layer=0, gemm_weight=True)
        >>> [item] = plan_tensors(contract, ModelInventory("toy", 1, (w,)), get_dialect("modelopt"))
        >>> item.format, item.bytes_after, [name.rsplit(".", 1)[1] for name, _, _ in item.outputs]
        ('nvfp4', 4612, ['weight', 'weight_scale', 'weight_scale_2', 'input_scale'])
    """
    decisions = contract.decide_all(inventory)
    profile = contract.nvfp4_profile
    planned = []
    for info in inventory:
        decision = decisions[info.name]
        outputs = () if dialect is None else tuple(dialect.layout(Planned(info, decision)))
        planned.append(
            PlannedTensor(
                info,
                decision,
                outputs=outputs,
                bytes_before=source_bytes(info),
                bytes_after=storage_bytes(info, decision),
                lossless=lossless(info, decision, profile),
            )
        )
    return planned


def shared_scale_groups(items: Iterable[PlannedTensor]) -> dict[str, tuple[str, ...]]:
    """Shared-scale group -> its members' names, in ``items`` order: quantized NVFP4 fused siblings
    (gate/up, q/k/v, MLA q_a/kv_a), groups of two or more only (a lone member shares nothing)."""
    groups: dict[str, list[str]] = {}
    for item in items:
        if item.quantized and item.decision.format == "nvfp4" and item.decision.fused_group:
            groups.setdefault(item.decision.fused_group, []).append(item.info.name)
    return {group: tuple(members) for group, members in groups.items() if len(members) > 1}


def members_of(groups: Mapping[str, tuple[str, ...]], item: PlannedTensor) -> tuple[str, ...]:
    """The names sharing ``item``'s outer scale in ``groups`` (``(name,)`` when it shares none)."""
    group = item.decision.fused_group
    return groups.get(group, (item.info.name,)) if group is not None else (item.info.name,)
