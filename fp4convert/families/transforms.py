"""Pure tensor transforms between HF and Megatron-Core layouts (checkpoint-formats.md section 5.4).

No names, no files, no globals: each function takes tensors and integers and returns new tensors.
Splits return contiguous tensors that own their memory (not views of the fused input), so the
pieces can be written with safetensors and compared byte for byte.

QKV interleave (grouped-query attention): with ``nq`` query heads, ``ng`` query groups (HF
``num_key_value_heads``), ``h = nq / ng`` heads per group and head size ``d``, Megatron's
``linear_qkv`` stacks, for each group ``g``, the ``h`` query heads of the group, then key head
``g``, then value head ``g``: rows ``[q(g·h … g·h+h−1) | k(g) | v(g)]``, each head ``d`` rows. The
trailing dims (``hidden`` for weights, none for biases) are carried along unchanged.
"""

from __future__ import annotations

import torch

from fp4convert.errors import MappingError

__all__ = [
    "global_to_local_expert",
    "local_to_global_expert",
    "merge_gate_up",
    "merge_qkv",
    "split_gate_up",
    "split_qkv",
]


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous copy: never a view that shares storage with the fused source.
    return tensor.clone(memory_format=torch.contiguous_format)


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_query_groups: int) -> torch.Tensor:
    """Interleave HF q/k/v projections into Megatron's ``linear_qkv`` (weight or bias).

    Args:
        q: ``[nq·d, *rest]`` query rows (HF ``q_proj``).
        k: ``[ng·d, *rest]`` key rows.
        v: ``[ng·d, *rest]`` value rows.
        num_query_groups: ``ng`` (HF ``num_key_value_heads``).

    Returns:
        ``[(nq + 2·ng)·d, *rest]``, group by group ``[q heads of g, k_g, v_g]``.

    Raises:
        MappingError: shapes or dtypes do not fit one GQA layout.

    Example:
        >>> q = torch.arange(4.0).view(4, 1)
        >>> k, v = torch.tensor([[10.0], [11.0]]), torch.tensor([[20.0], [21.0]])
        >>> merge_qkv(q, k, v, num_query_groups=2).flatten().tolist()  # d=1, h=2
        [0.0, 1.0, 10.0, 20.0, 2.0, 3.0, 11.0, 21.0]
    """
    rest = tuple(q.shape[1:])
    if k.shape != v.shape or tuple(k.shape[1:]) != rest or not (q.dtype == k.dtype == v.dtype):
        raise MappingError(
            f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype} "
            "do not form one QKV projection",
            hint="k and v must have equal shapes, and all three the same dtype and trailing dims",
        )
    if num_query_groups <= 0 or k.shape[0] % num_query_groups:
        raise MappingError(
            f"k has {k.shape[0]} rows, not a multiple of num_query_groups {num_query_groups}",
            hint="check num_key_value_heads in config.json",
        )
    head_dim = k.shape[0] // num_query_groups
    if q.shape[0] % (head_dim * num_query_groups):
        raise MappingError(
            f"q has {q.shape[0]} rows, not a multiple of num_query_groups x head_dim "
            f"({num_query_groups} x {head_dim})",
            hint="check num_attention_heads / num_key_value_heads in config.json",
        )
    heads_per_group = q.shape[0] // (head_dim * num_query_groups)
    grouped = torch.cat(
        [
            q.reshape(num_query_groups, heads_per_group, head_dim, *rest),
            k.reshape(num_query_groups, 1, head_dim, *rest),
            v.reshape(num_query_groups, 1, head_dim, *rest),
        ],
        dim=1,
    )
    return grouped.reshape(-1, *rest).contiguous()


def split_qkv(
    qkv: torch.Tensor, *, num_attention_heads: int, num_query_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Undo :func:`merge_qkv`: Megatron ``linear_qkv`` -> HF (q, k, v).

    Args:
        qkv: ``[(nq + 2·ng)·d, *rest]``.
        num_attention_heads: ``nq``.
        num_query_groups: ``ng``.

    Returns:
        ``(q [nq·d, *rest], k [ng·d, *rest], v [ng·d, *rest])``, each owning its memory.

    Raises:
        MappingError: the row count does not fit the head counts.

    Example:
        >>> qkv = torch.tensor([0., 1., 10., 20., 2., 3., 11., 21.]).view(8, 1)
        >>> [t.flatten().tolist() for t in split_qkv(qkv, num_attention_heads=4, num_query_groups=2)]
        [[0.0, 1.0, 2.0, 3.0], [10.0, 11.0], [20.0, 21.0]]
    """
    if num_query_groups <= 0 or num_attention_heads % num_query_groups:
        raise MappingError(
            f"num_attention_heads {num_attention_heads} is not a multiple of num_query_groups {num_query_groups}",
            hint="check num_attention_heads / num_key_value_heads in config.json",
        )
    heads_per_group = num_attention_heads // num_query_groups
    rows_per_head_dim = num_attention_heads + 2 * num_query_groups
    if qkv.dim() == 0 or qkv.shape[0] % rows_per_head_dim:
        raise MappingError(
            f"linear_qkv has shape {tuple(qkv.shape)}; its rows are not a multiple of "
            f"num_attention_heads + 2 x num_query_groups = {rows_per_head_dim}",
            hint="check the head counts in config.json",
        )
    head_dim = qkv.shape[0] // rows_per_head_dim
    rest = tuple(qkv.shape[1:])
    grouped = qkv.reshape(num_query_groups, heads_per_group + 2, head_dim, *rest)
    q = grouped[:, :heads_per_group].reshape(num_attention_heads * head_dim, *rest)
    k = grouped[:, heads_per_group].reshape(num_query_groups * head_dim, *rest)
    v = grouped[:, heads_per_group + 1].reshape(num_query_groups * head_dim, *rest)
    return _owned(q), _owned(k), _owned(v)


def merge_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Megatron ``linear_fc1 = cat([gate, up], dim=0)``.

    Raises:
        MappingError: gate and up differ in shape or dtype.

    Example:
        >>> merge_gate_up(torch.zeros(2, 3), torch.ones(2, 3)).shape
        torch.Size([4, 3])
    """
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise MappingError(
            f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ",
            hint="gate_proj and up_proj of one MLP must have the same shape and dtype",
        )
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Undo :func:`merge_gate_up`: the first half of the rows is gate, the second up.

    Raises:
        MappingError: the row count is odd.

    Example:
        >>> gate, up = split_gate_up(torch.arange(4.).view(4, 1))
        >>> gate.flatten().tolist(), up.flatten().tolist()
        ([0.0, 1.0], [2.0, 3.0])
    """
    if fc1.dim() == 0 or fc1.shape[0] % 2:
        raise MappingError(
            f"linear_fc1 has shape {tuple(fc1.shape)}; gate and up need an even number of rows",
            hint="linear_fc1 must be cat([gate, up], dim=0)",
        )
    gate, up = fc1.chunk(2, dim=0)
    return _owned(gate), _owned(up)


def local_to_global_expert(local: int, *, ep_rank: int, num_local_experts: int) -> int:
    """The global expert id of expert ``local`` on EP rank ``ep_rank``.

    Megatron-Core gives each of the ``ep_size`` expert-parallel ranks a contiguous block of
    ``num_local_experts`` experts, so ``global = ep_rank * num_local_experts + local``.

    Raises:
        MappingError: an index is out of range.

    Example:
        >>> local_to_global_expert(3, ep_rank=2, num_local_experts=32)
        67
    """
    if not 0 <= local < num_local_experts or ep_rank < 0:
        raise MappingError(
            f"local expert {local} on EP rank {ep_rank} is out of range (each rank holds {num_local_experts} experts)",
            hint="check the EP rank / size against the expert count",
        )
    return ep_rank * num_local_experts + local


def global_to_local_expert(global_id: int, *, num_local_experts: int) -> tuple[int, int]:
    """``(ep_rank, local)`` of a global expert id; the inverse of :func:`local_to_global_expert`.

    Raises:
        MappingError: ``num_local_experts`` is not positive or ``global_id`` is negative.

    Example:
        >>> global_to_local_expert(67, num_local_experts=32)
        (2, 3)
    """
    if num_local_experts <= 0 or global_id < 0:
        raise MappingError(
            f"cannot place global expert {global_id} with {num_local_experts} experts per rank",
            hint="check the EP size against the expert count",
        )
    return divmod(global_id, num_local_experts)
