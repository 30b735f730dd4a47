"""One model under one contract: every HF tensor, its decision, its fused group, and where each HF
tensor sits inside a Megatron-Core tensor.

The live export and its validator both start from here. Building the tables decides every tensor of
the model once (about a second for a 30B MoE), so :func:`model_tables` keeps the last few in a small
cache: an RL loop that exports and validates at every weight sync pays that cost once.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.convert.plan import PlannedTensor
from fp4convert.errors import MappingError
from fp4convert.families import (
    Family,
    FamilyKey,
    get_family,
    inventory_from_config,
    load_config,
    megatron_to_hf,
)
from fp4convert.inventory import TensorInfo

__all__ = ["ModelTables", "Piece", "model_tables"]

ContractLike = Contract | str | Path
FamilyLike = str | FamilyKey | Family | None
ConfigLike = Mapping[str, Any] | str | Path


class Piece:
    """Where one HF tensor sits in a master tensor: the whole tensor, a row range, or chosen rows.

    The family transforms only move whole rows (QKV interleave per query group, gate/up halves), so
    every HF piece of a Megatron tensor is a set of its rows.

    Attributes:
        name: the HF tensor name.
        source: the master tensor it is taken from (a Megatron name, or the HF name itself).
        rows: None (all rows), a ``slice`` (a contiguous range: a view, no copy), or a CPU int64
            tensor of row indices (QKV pieces: gathered).
        shape: the HF tensor's shape.
    """

    __slots__ = ("_on_device", "name", "rows", "shape", "source")

    def __init__(self, name: str, source: str, rows: slice | torch.Tensor | None, shape: tuple[int, ...]) -> None:
        self.name = name
        self.source = source
        self.rows = rows
        self.shape = shape
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """This piece of the master tensor (a view unless rows are gathered)."""
        if self.rows is None:
            return tensor
        if isinstance(self.rows, slice):
            return tensor[self.rows]
        index = self._on_device.get(tensor.device)
        if index is None:  # moved once per device: an index upload would synchronize every call
            index = self._on_device[tensor.device] = self.rows.to(tensor.device)
        return tensor.index_select(0, index)

    def __repr__(self) -> str:
        return f"Piece({self.name!r} <- {self.source!r} rows {self.rows!r})"


def _rows_of(ids: torch.Tensor, total: int) -> slice | torch.Tensor | None:
    n = ids.numel()
    if n == 0:
        return slice(0, 0)
    start = int(ids[0])
    if torch.equal(ids, torch.arange(start, start + n, dtype=torch.int64)):
        return None if (start == 0 and n == total) else slice(start, start + n)
    return ids.clone()


class ModelTables:
    """Every HF tensor of a model (from its config.json) with its contract decision.

    Args:
        contract: the precision contract.
        config: the model's parsed config.json.
        family: the family, when given; it must be the config's family.

    Attributes:
        family: family key, e.g. ``"qwen3_moe"``.
        infos: HF name -> :class:`~fp4convert.inventory.TensorInfo` (shapes from the config).
        decisions: HF name -> :class:`~fp4convert.contract.Decision`.
        groups: shared-scale group -> its NVFP4 members' HF names (the converter's grouping).
        num_experts: routed experts per MoE layer, or None.

    Raises:
        MappingError: unsupported model, or ``family`` is not the config's family.
        ContractError: the contract splits a fused group or leaves a GEMM weight uncovered.
    """

    def __init__(self, contract: Contract, config: Mapping[str, Any], family: FamilyLike = None) -> None:
        inventory = inventory_from_config(config)
        if family is not None and get_family(family).key.value != inventory.family:
            raise MappingError(
                f"family {get_family(family).key.value!r} was given, but config.json describes a "
                f"{inventory.family} model",
                hint="pass the model's own config.json, or leave family out",
            )
        self.contract = contract
        self.config = dict(config)
        self.family = inventory.family
        self.num_layers = inventory.num_layers
        self.num_mtp_layers = inventory.num_mtp_layers
        self.infos: dict[str, TensorInfo] = inventory.by_name()
        self.decisions = contract.decide_all(inventory)
        self.groups: dict[str, tuple[str, ...]] = {}
        grouped: dict[str, list[str]] = {}
        for info in inventory:
            item = self.planned(info.name)
            if item.quantized and item.decision.format == "nvfp4" and item.decision.fused_group:
                grouped.setdefault(item.decision.fused_group, []).append(info.name)
        self.groups = {group: tuple(names) for group, names in grouped.items()}
        experts = [i.expert for i in inventory if i.expert is not None]
        self.num_experts: int | None = max(experts) + 1 if experts else None
        self._pieces: dict[tuple[str, tuple[int, ...], int, int], tuple[Piece, ...]] = {}
        #: export settings already checked against this model (see ``export.check_can_export``)
        self.checked: set[tuple[object, ...]] = set()

    def planned(self, name: str) -> PlannedTensor:
        """The HF tensor ``name`` with its decision.

        Raises:
            MappingError: ``name`` is not a tensor of this model.
        """
        info = self.infos.get(name)
        if info is None:
            raise MappingError(
                f"`{name}` is not a tensor of this {self.family} model",
                hint="check the name against the model's config.json",
                tensor=name,
            )
        return PlannedTensor(info, self.decisions[name])

    def members(self, name: str) -> tuple[str, ...]:
        """The HF names quantized together with ``name``: its shared-scale group, or just itself."""
        group = self.decisions[name].fused_group
        members = self.groups.get(group or "")
        return members if members and name in members else (name,)

    def check_shape(self, name: str, shape: tuple[int, ...], source: str, source_shape: tuple[int, ...]) -> None:
        """Raise unless HF tensor ``name`` taken from ``source`` has the shape the config gives it.

        Raises:
            MappingError: the shapes differ (typically a tensor-parallel shard that was not gathered).
        """
        expected = self.planned(name).info.shape
        if tuple(shape) != expected:
            raise MappingError(
                f"`{source}` {tuple(source_shape)} gives `{name}` of shape {tuple(shape)}, but the config "
                f"says {expected}",
                hint="pass tensor-parallel-gathered tensors of this model (gather TP shards first)",
                tensor=source,
            )

    def experts_on_rank(self, ep_rank: int, ep_size: int) -> range | None:
        """Global ids of the experts EP rank ``ep_rank`` holds (None for a model without experts).

        Raises:
            MappingError: the rank is out of range or the EP size does not divide the expert count.
        """
        if ep_size < 1 or not 0 <= ep_rank < ep_size:
            raise MappingError(
                f"EP rank {ep_rank} of size {ep_size} is not a valid expert-parallel position",
                hint="0 <= ep_rank < ep_size",
            )
        if self.num_experts is None:
            return None
        if self.num_experts % ep_size:
            raise MappingError(
                f"{self.num_experts} experts cannot be split over EP size {ep_size}",
                hint="the EP size must divide the expert count",
            )
        per_rank = self.num_experts // ep_size
        return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)

    def naming(self, names: Iterable[str]) -> str:
        """``"hf"`` when every name is an HF tensor of this model, ``"megatron"`` when none is.

        Raises:
            MappingError: the names mix both schemes.
        """
        hf: list[str] = []
        other: list[str] = []
        for name in names:
            (hf if name in self.infos else other).append(name)
        if hf and other:
            raise MappingError(
                f"the tensors mix HF names (`{hf[0]}`) and other names (`{other[0]}`)",
                hint="pass either HF names or Megatron-Core names, not both",
                tensor=other[0],
            )
        return "hf" if hf else "megatron"

    def pieces(
        self, megatron_name: str, shape: tuple[int, ...], *, ep_rank: int = 0, ep_size: int = 1
    ) -> tuple[Piece, ...]:
        """The HF tensors a Megatron tensor of ``shape`` holds, with their rows (cached).

        The rows come from the family's own transforms applied to a column of row ids, so they
        follow :func:`~fp4convert.families.megatron_to_hf` exactly (QKV split, gate/up halves, local
        expert ids made global, MTP copies of shared tensors).

        Raises:
            MappingError: the name is not a Megatron tensor of this model, or a piece's shape does
                not fit the config (e.g. a tensor-parallel shard that was not gathered).
        """
        key = (megatron_name, shape, ep_rank, ep_size)
        found = self._pieces.get(key)
        if found is None:
            found = self._pieces[key] = self._probe(megatron_name, shape, ep_rank, ep_size)
        return found

    def _probe(self, megatron_name: str, shape: tuple[int, ...], ep_rank: int, ep_size: int) -> tuple[Piece, ...]:
        rows = shape[0] if shape else 1
        probe = torch.arange(rows, dtype=torch.float64).reshape(rows, 1)
        out = megatron_to_hf({megatron_name: probe}, self.family, self.config, ep_rank=ep_rank, ep_size=ep_size)
        pieces = []
        for name, ids in out.items():
            ids = ids.reshape(-1).to(torch.int64)
            piece_shape = (ids.numel(), *shape[1:]) if shape else ()
            self.check_shape(name, piece_shape, megatron_name, shape)
            pieces.append(Piece(name, megatron_name, _rows_of(ids, rows) if shape else None, piece_shape))
        return tuple(pieces)


_CACHE: OrderedDict[tuple[str, str, str], ModelTables] = OrderedDict()
_CACHE_SIZE = 4


def model_tables(contract: ContractLike, config: ConfigLike, family: FamilyLike = None) -> ModelTables:
    """The :class:`ModelTables` of a model under a contract, from a small cache.

    Args:
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json (parsed, a path, a checkpoint folder or a shipped name).
        family: optional family key; must match the config.

    Returns:
        The tables (shared by later calls with an equal contract and config).

    Example:
        >>> tables = model_tables("nvfp4-experts-per-token", "Qwen3-30B-A3B")
        >>> tables.decisions["model.layers.0.mlp.experts.5.up_proj.weight"].fused_group
        'model.layers.0.mlp.experts.5.gate_up'
        >>> [p.name for p in tables.pieces("decoder.layers.0.mlp.experts.linear_fc1.weight5", (1536, 2048))]
        ['model.layers.0.mlp.experts.5.gate_proj.weight', 'model.layers.0.mlp.experts.5.up_proj.weight']
    """
    the_contract = contract if isinstance(contract, Contract) else load_contract(contract)
    the_config = load_config(config)
    family_key = "" if family is None else get_family(family).key.value
    key = (contract_hash(the_contract), family_key, json.dumps(the_config, sort_keys=True, default=str))
    tables = _CACHE.get(key)
    if tables is None:
        tables = ModelTables(the_contract, the_config, family)
        _CACHE[key] = tables
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    return tables
