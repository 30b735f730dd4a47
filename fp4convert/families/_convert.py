"""State-dict conversion HF <-> Megatron-Core for one family: names from the mapper, layouts from
:mod:`fp4convert.families.transforms`.

No files are touched: tensors in, tensors out. Every input tensor must be mapped, fused pieces must
arrive complete, and nothing is silently dropped: the only HF tensors without a Megatron tensor of
their own are :class:`~fp4convert.families._tables.SharedCopy` duplicates, which are checked to be
byte-identical to the tensor Megatron keeps. Megatron tensors are expected tensor-parallel-gathered
(whole); expert parallelism is handled through ``ep_rank`` / ``ep_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fp4convert.errors import MappingError
from fp4convert.families._builtin import get_family
from fp4convert.families._grammar import ExpertLayout, strip_module_prefix
from fp4convert.families._mapper import Match, NameMapper
from fp4convert.families._spelling import MegatronSpelling, pack, unpack
from fp4convert.families._tables import QKV, Direct, Entry, Family, FamilyKey, GatedMLP, SharedCopy
from fp4convert.families.transforms import (
    global_to_local_expert,
    local_to_global_expert,
    merge_gate_up,
    merge_qkv,
    split_gate_up,
    split_qkv,
)

__all__ = ["hf_to_megatron", "megatron_mapper", "megatron_to_hf", "same_bytes"]

FamilyLike = str | FamilyKey | Family


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors have the same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _experts_per_rank(mapper: NameMapper, ep_rank: int, ep_size: int) -> int | None:
    """Experts per EP rank, or None for a family without routed experts."""
    if ep_size < 1 or not 0 <= ep_rank < ep_size:
        raise MappingError(
            f"EP rank {ep_rank} of size {ep_size} is not a valid expert-parallel position",
            hint="0 <= ep_rank < ep_size",
        )
    num_experts = mapper.dims.get(mapper.family.num_experts_dim)
    if num_experts is None:
        return None
    if num_experts % ep_size:
        raise MappingError(
            f"{num_experts} experts cannot be split over EP size {ep_size}",
            hint="the EP size must divide the expert count",
        )
    return num_experts // ep_size


def megatron_mapper(family: FamilyLike, config: Mapping[str, Any]) -> NameMapper:
    """A mapper for a family whose Megatron-Core side is mapped.

    Raises:
        MappingError: the family converts HF -> HF only; the message says why.
    """
    chosen = get_family(family)
    if chosen.megatron_unsupported is not None:
        raise MappingError(
            f"family {chosen.key.value} has no Megatron-Core mapping in fp4convert: {chosen.megatron_unsupported}",
            hint="HF checkpoints of this family convert, verify, plan and dequantize; "
            "to-megatron and export_hf / validate-export from Megatron names are not available",
            family=chosen.key.value,
        )
    return NameMapper(chosen, config)


def _only(found: list[Match], name: str, mapper: NameMapper, side: str) -> Match:
    if len(found) == 1:
        return found[0]
    family = mapper.family.key.value
    if not found:
        raise MappingError(
            f"{side} tensor `{name}` is not a {family} tensor of this model",
            hint=f"check the name against `get_family({family!r}).describe()` and the config.json",
            tensor=name,
        )
    raise MappingError(
        f"{side} tensor `{name}` matches {len(found)} entries of family {family}",
        hint="the family table is ambiguous; make the entries' `requires` exclusive",
        tensor=name,
    )


def _fuse(entry: Entry, pieces: list[torch.Tensor], mapper: NameMapper) -> torch.Tensor:
    match entry:
        case QKV():
            return merge_qkv(*pieces, num_query_groups=mapper.dims["num_key_value_heads"])
        case GatedMLP():
            return merge_gate_up(*pieces)
        case Direct() | SharedCopy():
            return pieces[0]


def _split(entry: Entry, tensor: torch.Tensor, mapper: NameMapper) -> tuple[torch.Tensor, ...]:
    match entry:
        case QKV():
            return split_qkv(
                tensor,
                num_attention_heads=mapper.dims["num_attention_heads"],
                num_query_groups=mapper.dims["num_key_value_heads"],
            )
        case GatedMLP():
            return split_gate_up(tensor)
        case Direct() | SharedCopy():
            return (tensor,)


def _put(out: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, source: str) -> None:
    if name in out:
        raise MappingError(
            f"`{name}` is produced twice (again from `{source}`)",
            hint="pass each tensor once, in one expert layout and one spelling",
            tensor=name,
        )
    out[name] = tensor


def hf_to_megatron(
    tensors: Mapping[str, torch.Tensor],
    family: FamilyLike,
    config: Mapping[str, Any],
    *,
    expert_layout: ExpertLayout | str = ExpertLayout.GROUPED,
    ep_rank: int = 0,
    ep_size: int = 1,
    spelling: MegatronSpelling | None = None,
) -> dict[str, torch.Tensor]:
    """Convert an HF state dict to Megatron-Core names and layouts.

    q/k/v are interleaved into ``linear_qkv``, gate/up concatenated into ``linear_fc1``, everything
    else renamed. With ``ep_size > 1`` only the experts of ``ep_rank`` are returned, under ids local
    to that rank; the other tensors are returned on every rank (Megatron replicates them over EP).

    Args:
        tensors: HF name -> tensor (a whole model, or a subset holding complete fused groups).
        family: family key or :class:`~fp4convert.families.Family`.
        config: the model's config.json.
        expert_layout: ``"grouped"`` (TEGroupedMLP ``linear_fc1.weight{e}``), ``"sequential"``
            (SequentialMLP ``local_experts.{e}.linear_fc1.weight``), ``"single_grouped"`` or
            ``"legacy_grouped"`` (stacked; see :mod:`fp4convert.families._spelling`).
        ep_rank: expert-parallel rank to produce.
        ep_size: expert-parallel size.
        spelling: the whole Megatron spelling (norms, MTP inner name, experts, MLA fusion); when
            given it decides the expert layout and ``expert_layout`` must be left at its default
            or agree.

    Returns:
        Megatron name (no ``module.`` prefix) -> tensor. Renamed tensors are the input objects;
        fused ones are new tensors.

    Raises:
        MappingError: an unmapped or ambiguous name, an incomplete fused group, a shape that does
            not fit the config, an MTP copy that differs from the tensor Megatron shares, or a
            family without a Megatron-Core mapping.

    Example:
        >>> config = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
        ...           "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16, "intermediate_size": 8,
        ...           "num_hidden_layers": 1}
        >>> gate, up = torch.zeros(8, 8), torch.ones(8, 8)
        >>> out = hf_to_megatron({"model.layers.0.mlp.gate_proj.weight": gate,
        ...                       "model.layers.0.mlp.up_proj.weight": up}, "qwen3", config)
        >>> list(out), tuple(out["decoder.layers.0.mlp.linear_fc1.weight"].shape)
        (['decoder.layers.0.mlp.linear_fc1.weight'], (16, 8))
    """
    mapper = megatron_mapper(family, config)
    spelling = _resolve_spelling(spelling, ExpertLayout(expert_layout))
    layout = spelling.experts.per_expert
    per_rank = _experts_per_rank(mapper, ep_rank, ep_size)
    out: dict[str, torch.Tensor] = {}
    pending: dict[tuple[Entry, Any, int | None], dict[int, tuple[str, torch.Tensor]]] = {}
    copies: list[tuple[str, Match, torch.Tensor]] = []
    for name, tensor in tensors.items():
        match = _only(mapper.match_hf(name), name, mapper, "HF")
        if isinstance(match.entry, SharedCopy):
            copies.append((name, match, tensor))
            continue
        if match.expert is not None and per_rank is not None:
            rank, local = global_to_local_expert(match.expert, num_local_experts=per_rank)
            if rank != ep_rank:
                continue
            match = match.with_expert(local)
        key = (match.entry, match.location, match.expert)
        pieces = pending.setdefault(key, {})
        pieces[match.piece] = (name, tensor)
        if len(pieces) == len(match.entry.pieces):
            del pending[key]
            ordered = [pieces[index][1] for index in range(len(pieces))]
            target = mapper.megatron_name(match, layout, spelling)
            if target is None:  # only MTP names without a config; the config is required here
                raise MappingError(f"cannot name the Megatron tensor of `{name}`", tensor=name)
            _put(out, target, _fuse(match.entry, ordered, mapper), name)
    if pending:
        missing = sorted(
            mapper.hf_name(Match(mapper.family, entry, location, expert, index))
            for (entry, location, expert), pieces in pending.items()
            for index in range(len(entry.pieces))
            if index not in pieces
        )
        raise MappingError(
            f"fused tensors are incomplete: missing {', '.join(f'`{m}`' for m in missing[:6])}"
            + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""),
            hint="pass every piece of a fused group (q/k/v, gate/up) together",
            tensor=missing[0],
        )
    for name, match, tensor in copies:
        _check_copy(tensors, name, match, tensor, mapper)
    return pack(out, spelling, experts_per_rank=per_rank)


def _resolve_spelling(spelling: MegatronSpelling | None, layout: ExpertLayout) -> MegatronSpelling:
    if spelling is None:
        return MegatronSpelling(experts=layout)
    if layout is not ExpertLayout.GROUPED and layout is not spelling.experts:
        raise MappingError(
            f"expert_layout {layout.value!r} contradicts the spelling's {spelling.experts.value!r}",
            hint="pass the expert layout in the spelling only",
        )
    return spelling


def _check_copy(
    tensors: Mapping[str, torch.Tensor], name: str, match: Match, tensor: torch.Tensor, mapper: NameMapper
) -> None:
    """A tensor Megatron shares (MTP embed / head) is dropped only if it equals the original byte for byte."""
    original = mapper.shared_copy_source(match)
    if original not in tensors:
        raise MappingError(
            f"`{name}` copies `{original}`, which is not among the tensors",
            hint="convert the MTP copies together with the tensor they duplicate",
            tensor=name,
        )
    if not same_bytes(tensors[original], tensor):
        raise MappingError(
            f"`{name}` differs from `{original}`, but Megatron-Core stores them as one shared tensor",
            hint="this checkpoint cannot be represented in Megatron-Core without losing `" + name + "`",
            tensor=name,
        )


def megatron_to_hf(
    tensors: Mapping[str, torch.Tensor],
    family: FamilyLike,
    config: Mapping[str, Any],
    *,
    ep_rank: int = 0,
    ep_size: int = 1,
) -> dict[str, torch.Tensor]:
    """Convert a Megatron-Core state dict (TP-gathered) to HF names and layouts.

    ``linear_qkv`` is split per query group, ``linear_fc1`` into gate/up; both expert layouts
    (TEGroupedMLP, SequentialMLP) and both stacked ones (``moe_single_grouped_weight``, legacy
    GroupedMLP ``weight1`` / ``weight2``), both MTP spellings (``mtp_model_layer``,
    ``transformer_layer``), the local / ModelOpt spec norm spellings, MLA's fused
    ``linear_qkv_down_proj`` and ``module.`` wrappers are accepted. Expert ids in the input are
    local to ``ep_rank`` and come out global. Tensors Megatron shares with the MTP layers (embedding,
    output layer) are also written as the MTP layers' HF copies.

    Args:
        tensors: Megatron name -> tensor.
        family: family key or :class:`~fp4convert.families.Family`.
        config: the model's config.json.
        ep_rank: the EP rank these tensors come from.
        ep_size: expert-parallel size.

    Returns:
        HF name -> tensor. Renamed tensors are the input objects; split pieces and MTP copies are new
        tensors owning their memory.

    Raises:
        MappingError: an unmapped or ambiguous name, a local expert id out of range, a shape that
            does not fit the config, one HF tensor produced twice, or a family without a
            Megatron-Core mapping.

    Example:
        >>> config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
        ...           "num_key_value_heads": 1, "vocab_size": 16, "intermediate_size": 8,
        ...           "num_hidden_layers": 1}
        >>> out = megatron_to_hf({"module.module.decoder.layers.0.self_attention.linear_qkv.weight":
        ...                       torch.zeros(16, 8)}, "llama", config)
        >>> sorted((name, tuple(t.shape)) for name, t in out.items())  # doctest: +NORMALIZE_WHITESPACE
        [('model.layers.0.self_attn.k_proj.weight', (4, 8)),
         ('model.layers.0.self_attn.q_proj.weight', (8, 8)),
         ('model.layers.0.self_attn.v_proj.weight', (4, 8))]
    """
    mapper = megatron_mapper(family, config)
    per_rank = _experts_per_rank(mapper, ep_rank, ep_size)
    out: dict[str, torch.Tensor] = {}
    q_lora_rank = mapper.dims.get("q_lora_rank")
    for stored, value in tensors.items():
        unpacked = unpack(stored, value, experts_per_rank=per_rank, q_lora_rank=q_lora_rank)
        for name, tensor in unpacked or [(stored, value)]:
            _to_hf(out, mapper, name, tensor, ep_rank=ep_rank, per_rank=per_rank)
    return out


def _to_hf(
    out: dict[str, torch.Tensor],
    mapper: NameMapper,
    name: str,
    tensor: torch.Tensor,
    *,
    ep_rank: int,
    per_rank: int | None,
) -> None:
    """One table-spelled Megatron tensor into its HF pieces (and the MTP copies it stands for)."""
    match = _only(mapper.match_megatron(name, num_local_experts=per_rank), name, mapper, "Megatron")
    if match.expert is not None and per_rank is not None:
        match = match.with_expert(local_to_global_expert(match.expert, ep_rank=ep_rank, num_local_experts=per_rank))
    for index, piece in enumerate(_split(match.entry, tensor, mapper)):
        _put(out, mapper.hf_name(match, index), piece, name)
    for copy_name in mapper.shared_copy_names(strip_module_prefix(name)):
        _put(out, copy_name, tensor.clone(), name)
