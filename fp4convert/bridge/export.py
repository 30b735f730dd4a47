"""Live Megatron -> HF weight export under a contract: exactly the tensors a sampler receives.

RL frameworks push the learner's weights to the sampler after every update
(checkpoint-formats.md section 4.5). :func:`export_hf` takes Megatron-Core tensors as the learner
holds them (tensor-parallel shards gathered, expert ids local to the EP rank), applies the family
transforms on the BF16 tensors first (QKV split, fc1 split into gate/up, local expert ids made
global: section 5.4), then quantizes every HF tensor as the contract decides, with the arithmetic,
scale sharing and dialect names of :func:`~fp4convert.convert.execute.convert_checkpoint`. A live
update therefore carries the bytes a converted checkpoint holds for the same weights.

Memory stays bounded: a Megatron ``linear_qkv`` or ``linear_fc1`` tensor is its whole fused group,
so groups complete as they arrive; only MLA's q_a/kv_a pair, two Megatron tensors sharing one
scale, waits for its second member.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch

from fp4convert.bridge.tables import ConfigLike, ContractLike, FamilyLike, ModelTables, model_tables
from fp4convert.convert.groups import group_input_amax, quantize_members
from fp4convert.convert.plan import PlannedTensor
from fp4convert.dialects import Dialect, get_dialect
from fp4convert.errors import ConversionError
from fp4convert.families import megatron_to_hf

__all__ = ["check_can_export", "export_hf", "input_scale_name"]


def input_scale_name(item: PlannedTensor, dialect: Dialect) -> str | None:
    """The activation-scale tensor name ``dialect`` writes for ``item`` (None: it writes none)."""
    if not item.quantized or not dialect.writes_input_scale(item):
        return None
    suffix = dialect.suffixes[item.decision.format].get("input")
    return None if suffix is None else f"{item.module}.{suffix}"


def check_can_export(
    tables: ModelTables, dialect: Dialect, include_input_scale: bool, calibration: Mapping[str, float] | None
) -> None:
    """Raise before any tensor is touched when ``dialect`` cannot carry what the contract decides.

    Raises:
        ConversionError: every problem at once (a format the dialect cannot store, a per-row outer
            scale, activation scales asked for without calibration on a calibrated contract).
    """
    key = (dialect.name, getattr(dialect, "per_token_activations", None), include_input_scale, calibration is None)
    if key in tables.checked:  # once per model and settings: every sync exports again
        return
    items = [tables.planned(name) for name in tables.infos]
    problems = dialect.refusals(tables.contract, items)
    nvfp4 = tables.contract.formats.nvfp4
    needs_calibration = include_input_scale and not nvfp4.per_token_activations and calibration is None
    if needs_calibration and any(input_scale_name(i, dialect) for i in items):
        problems.append(
            f"contract {tables.contract.name!r} quantizes activations per tensor, so an exported "
            "input_scale needs calibrated activation amaxes; pass calibration= (or leave "
            "include_input_scale off: the engine keeps the input_scale it loaded from disk)"
        )
    if problems:
        raise ConversionError(
            f"export refused ({len(problems)} problems):\n  - " + "\n  - ".join(problems),
            hint="pick another dialect, or fix the contract",
            problems=problems,
        )
    tables.checked.add(key)


def export_hf(
    named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    contract: ContractLike,
    config: ConfigLike,
    family: FamilyLike = None,
    dialect: str = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    calibration: Mapping[str, float] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Convert Megatron-Core BF16 tensors into the HF tensors of ``dialect``, quantized per contract.

    Each Megatron tensor is split into its HF tensors (``linear_qkv`` -> q/k/v, ``linear_fc1`` ->
    gate/up, grouped or sequential experts with ids local to ``ep_rank`` -> global ids), then each
    HF tensor is kept BF16 or quantized as the contract decides, in the Megatron namespace too
    (count- and name-based BF16 exceptions, e.g. ``.linear_kv_up_proj``). Fused siblings share one
    outer scale. Tensors stay on their device (CPU or CUDA: the bytes are identical).

    ``input_scale`` is not sent by default: a live update never re-sends it (Miles'
    ``quantize_params_nvfp4`` emits weight, weight_scale and weight_scale_2 only), because the
    engine keeps the activation scale it loaded from disk. ``include_input_scale=True`` yields
    exactly the tensors a converted checkpoint holds.

    Args:
        named_params: ``(megatron_name, tensor)`` pairs or a mapping (``module.`` wrappers allowed),
            consumed one at a time.
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        config: the model's config.json (parsed, a path, a checkpoint folder or a shipped name).
        family: the model family; default: the config's.
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors``.
        ep_rank: the expert-parallel rank the tensors come from.
        ep_size: the expert-parallel size.
        include_input_scale: also yield the dialect's activation scales, as the converter writes them.
        calibration: ``{module: activation amax}``, needed with ``include_input_scale`` when the
            contract quantizes activations per tensor.

    Returns:
        An iterator of ``(hf_name, tensor)``, the dialect's tensors in the order they complete.

    Raises:
        ConversionError: the dialect cannot express the contract (raised before any tensor), or a
            shared-scale group is incomplete when the input ends.
        MappingError: a name that is not a Megatron tensor of this model, or a tensor whose shape
            does not fit the config (e.g. tensor-parallel shards not gathered).
        FormatError: a tensor the contract quantizes has a dimension the block does not divide.

    Example:
        >>> import torch
        >>> fc1 = torch.randn(1536, 2048).to(torch.bfloat16)
        >>> out = dict(export_hf([("decoder.layers.0.mlp.experts.linear_fc1.weight3", fc1)],
        ...                      contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B",
        ...                      ep_rank=1, ep_size=4))
        >>> for name in out:  # local expert 3 of EP rank 1 (32 experts per rank) is global expert 35
        ...     print(name)
        model.layers.0.mlp.experts.35.gate_proj.weight
        model.layers.0.mlp.experts.35.gate_proj.weight_scale
        model.layers.0.mlp.experts.35.gate_proj.weight_scale_2
        model.layers.0.mlp.experts.35.up_proj.weight
        model.layers.0.mlp.experts.35.up_proj.weight_scale
        model.layers.0.mlp.experts.35.up_proj.weight_scale_2
        >>> torch.equal(out["model.layers.0.mlp.experts.35.gate_proj.weight_scale_2"],
        ...             out["model.layers.0.mlp.experts.35.up_proj.weight_scale_2"])
        True
    """
    tables = model_tables(contract, config, family)
    the_dialect = get_dialect(dialect, per_token_activations=tables.contract.formats.nvfp4.per_token_activations)
    tables.experts_on_rank(ep_rank, ep_size)  # rank/size errors now, not at the first expert
    check_can_export(tables, the_dialect, include_input_scale, calibration)
    pairs = named_params.items() if isinstance(named_params, Mapping) else named_params
    return _export(pairs, tables, the_dialect, ep_rank, ep_size, include_input_scale, calibration)


def _export(
    pairs: Iterable[tuple[str, torch.Tensor]],
    tables: ModelTables,
    dialect: Dialect,
    ep_rank: int,
    ep_size: int,
    include_input_scale: bool,
    calibration: Mapping[str, float] | None,
) -> Iterator[tuple[str, torch.Tensor]]:
    profile = tables.contract.quantizer
    pending: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}  # group members -> pieces so far

    def emit(members: tuple[str, ...], tensors: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        items = [tables.planned(name) for name in members]
        input_amax = group_input_amax(members, calibration)
        out = quantize_members(
            items,
            [tensors[name] for name in members],
            dialect=dialect,
            profile=profile,
            input_amax=input_amax,
        )
        dropped = set() if include_input_scale else {input_scale_name(item, dialect) for item in items}
        device = tensors[members[0]].device  # activation scales are made on the CPU: send them along
        yield from ((name, tensor.to(device)) for name, tensor in out.items() if name not in dropped)

    for megatron_name, tensor in pairs:
        for hf_name, piece in megatron_to_hf(
            {megatron_name: tensor}, tables.family, tables.config, ep_rank=ep_rank, ep_size=ep_size
        ).items():
            tables.check_shape(hf_name, tuple(piece.shape), megatron_name, tuple(tensor.shape))
            members = tables.members(hf_name)
            if len(members) == 1:
                yield from emit(members, {hf_name: piece})
                continue
            got = pending.setdefault(members, {})
            got[hf_name] = piece
            if len(got) == len(members):
                del pending[members]
                yield from emit(members, got)
    if pending:
        members, got = next(iter(pending.items()))
        missing = [name for name in members if name not in got]
        raise ConversionError(
            f"{len(pending)} shared-scale groups are incomplete; e.g. `{missing[0]}` never arrived "
            f"(its sibling `{next(iter(got))}` did)",
            hint="export every member of a fused group in one call: they share one outer scale",
            tensor=missing[0],
        )
