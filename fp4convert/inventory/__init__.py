"""What a model is made of: one :class:`TensorInfo` per tensor, and the :class:`ModelInventory`.

This is the meeting point of the three layers above the numeric core: model families
(:mod:`fp4convert.families`) produce inventories from a config.json or a checkpoint's tensors,
precision contracts (:mod:`fp4convert.contract`) decide a format for each :class:`TensorInfo`, and
the converter (:mod:`fp4convert.convert`) acts on those decisions. Plain frozen dataclasses, no
I/O. The dtype names a :class:`TensorInfo` carries are those of :mod:`fp4convert.inventory.dtypes`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FusedKind", "ModelInventory", "Role", "TensorInfo"]


class Role(str, enum.Enum):
    """The part a tensor plays in the model; contracts and plans group by it."""

    ROUTED_EXPERT = "routed_expert"  # MoE expert projections (gate/up/down per expert)
    SHARED_EXPERT = "shared_expert"  # always-active experts (DeepSeek shared_experts, Qwen2-MoE shared_expert)
    ATTENTION = "attention"  # q/k/v/o, and MLA's q_a/q_b/kv_a projections
    MLA_PROJECTION = "mla_projection"  # MLA kv_b_proj: used with two contraction axes (absorbed or not)
    DENSE_MLP = "dense_mlp"  # gate/up/down of a dense (non-MoE) MLP
    ROUTER = "router"  # MoE gate / router weights and biases
    NORM = "norm"  # every RMSNorm / LayerNorm weight
    EMBEDDING = "embedding"
    LM_HEAD = "lm_head"
    MTP = "mtp"  # multi-token-prediction glue (enorm, hnorm, eh_proj, shared_head)
    OTHER = "other"  # biases and anything a family does not classify further


class FusedKind(str, enum.Enum):
    """Sibling tensors that engines fuse into one GEMM, so they must share one outer scale."""

    GATE_UP = "gate_up"
    QKV = "qkv"
    MLA_QA_KVA = "mla_qa_kva"  # q_a_proj and kv_a_proj_with_mqa read the same input


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a model, as the HF checkpoint names it.

    Attributes:
        name: HF name, e.g. ``model.layers.3.mlp.experts.7.gate_proj.weight``.
        shape: logical shape in the checkpoint; ``()`` when only the name is known.
        dtype: torch dtype name in the checkpoint, e.g. ``"bfloat16"``.
        role: what the tensor does (see :class:`Role`).
        layer: decoder layer index in HF numbering (MTP layers count from ``num_layers``), or None.
        is_mtp: the tensor belongs to a multi-token-prediction layer.
        expert: global expert id for routed-expert tensors, else None.
        megatron_name: the Megatron-Core name that holds this tensor (a fused Megatron tensor such as
            ``linear_qkv.weight`` is named for each of its HF pieces), or None if unmapped.
        fused_group: key shared by siblings that must share one outer scale, e.g.
            ``model.layers.3.mlp.experts.7.gate_up``; None for tensors that are not fused.
        fused_kind: the kind of that group.
        gemm_weight: True for 2-D weights consumed by a GEMM (Linear weights, routers, lm_head):
            the only tensors a low-precision format can apply to.
        source_format: how the source checkpoint stores it (docs/sources.md): ``dense`` (as its
            dtype), ``fp8-block``, ``fp8-block-ue8m0``, ``fp8-channel`` or ``mxfp4`` (``dtype`` is then the BF16
            it is dequantized to), with ``+fused-3d`` (and ``-transposed`` / ``-interleaved``)
            when it is one expert's slice of a fused 3-D tensor; empty when no checkpoint was read.
        source_nbytes: bytes read from the source for it (weight and scales); None when it is
            ``numel x`` the size of ``dtype``.
    """

    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "bfloat16"
    role: Role = Role.OTHER
    layer: int | None = None
    is_mtp: bool = False
    expert: int | None = None
    megatron_name: str | None = None
    fused_group: str | None = None
    fused_kind: FusedKind | None = None
    gemm_weight: bool = False
    # How a checkpoint stores the tensor, not what the tensor is: left out of equality, so a
    # tensor read from an FP8 release describes the same as the one its config describes.
    source_format: str = field(default="", compare=False)
    source_nbytes: int | None = field(default=None, compare=False)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ModelInventory:
    """Every tensor of one model, in checkpoint order, plus the facts contracts need.

    Attributes:
        family: registered family key, e.g. ``"qwen3_moe"``.
        num_layers: decoder layers (``num_hidden_layers``), MTP layers excluded.
        num_mtp_layers: multi-token-prediction layers appended after the decoder layers.
        tensors: one entry per tensor.
        config: the parsed config.json it was built from.
    """

    family: str
    num_layers: int
    tensors: tuple[TensorInfo, ...]
    num_mtp_layers: int = 0
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}
