"""From a contract and a tensor to one decision, with every rule that matched and the one that won.

Precedence (highest first). The first tier that matches decides; within a tier the order below is
only the order ``explain`` lists the matches in, because every tier above "rules" gives ``bf16``:

1. ``non_gemm``: a tensor that is not a GEMM weight (norms, embeddings, biases:
   ``TensorInfo.gemm_weight`` is False) is never quantized.
2. ``bf16_exceptions.names.hf[i]`` / ``bf16_exceptions.names.megatron[i]``: name substrings
   (MLA ``.kv_b_proj.`` / ``.linear_kv_up_proj``).
3. Role exceptions: ``bf16_exceptions.shared_experts``, ``.routers``, ``.lm_head``, ``.embeddings``,
   ``.norms`` (by :class:`fp4convert.inventory.Role`).
4. ``bf16_exceptions.mtp_layers``: every tensor of a multi-token-prediction layer.
5. ``bf16_exceptions.first_layers`` then ``.last_layers``: decoder layer ``i`` is BF16 when
   ``i < first`` or ``i >= num_layers - last``. MTP layers are never counted as decoder layers.
6. ``rules[i]``: among the rules that match, the most specific wins: kind first
   (``exact`` > ``regex`` > ``glob``), then the number of literal characters in the pattern
   (:func:`fp4convert.contract.patterns.literal_length`). Two equally specific rules that give
   different formats are an error (:class:`~fp4convert.errors.ContractError`), never a coin flip;
   this is checked even where an exception decides, so a latent conflict cannot surface later
   when the exception is removed. Equally specific rules that agree are both listed; the earlier
   is named the winner.
7. ``default``: the contract default, if not null; otherwise the tensor is uncovered, an error.

Nothing depends on the order of keys in the contract file, and the order of ``rules`` can only
change which of two agreeing, equally specific rules is reported as the winner, never a format.

HF rules and HF name substrings look at ``TensorInfo.name``. Megatron rules look at the module path
(``TensorInfo.megatron_name`` without its last component), Megatron name substrings at the full
``megatron_name``; a tensor without a Megatron name is never matched by either.

Fused siblings (``TensorInfo.fused_group``) must get one format: :func:`decide_all` refuses a
contract that splits them. Whether they also share one outer scale is ``fused_groups``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fp4convert.contract.decision import Decision, RuleMatch
from fp4convert.contract.patterns import KIND_RANK, literal_length, matches
from fp4convert.contract.sections import LayerFraction, Namespace, Rule
from fp4convert.errors import ContractError, MappingError
from fp4convert.inventory import ModelInventory, Role, TensorInfo

if TYPE_CHECKING:  # the contract model calls into this module; at run time it only passes itself in
    from fp4convert.contract.model import Contract

__all__ = [
    "ALL_NAMESPACES",
    "FUSED_CONFLICT_HINT",
    "decide",
    "decide_all",
    "describe_conflict",
    "fused_conflicts",
    "megatron_module_path",
    "resolve",
]

ALL_NAMESPACES: frozenset[Namespace] = frozenset({"hf", "megatron"})

# Role -> the bf16_exceptions switch that keeps it BF16 (precedence tier 3).
_ROLE_EXCEPTIONS: dict[Role, str] = {
    Role.SHARED_EXPERT: "shared_experts",
    Role.ROUTER: "routers",
    Role.LM_HEAD: "lm_head",
    Role.EMBEDDING: "embeddings",
    Role.NORM: "norms",
}


def megatron_module_path(megatron_name: str) -> str:
    """The module path TransformerEngine matches: the parameter name minus its last component.

    Example:
        >>> megatron_module_path("decoder.layers.3.mlp.experts.linear_fc1.weight7")
        'decoder.layers.3.mlp.experts.linear_fc1'
    """
    return megatron_name.rsplit(".", 1)[0]


def _name_exception_matches(
    contract: Contract, tensor: TensorInfo, namespaces: frozenset[Namespace]
) -> list[RuleMatch]:
    found: list[RuleMatch] = []
    names = contract.bf16_exceptions.names
    if "hf" in namespaces:
        for i, sub in enumerate(names.hf):
            if sub in tensor.name:
                found.append(RuleMatch(f"bf16_exceptions.names.hf[{i}]", "bf16", f"HF name contains '{sub}'"))
    if "megatron" in namespaces and tensor.megatron_name is not None:
        for i, sub in enumerate(names.megatron):
            if sub in tensor.megatron_name:
                found.append(
                    RuleMatch(f"bf16_exceptions.names.megatron[{i}]", "bf16", f"Megatron name contains '{sub}'")
                )
    return found


def _layer_matches(
    contract: Contract, tensor: TensorInfo, is_mtp: bool, num_layers: int | None, notes: list[str]
) -> list[RuleMatch]:
    exceptions = contract.bf16_exceptions
    found: list[RuleMatch] = []
    if is_mtp:
        if exceptions.mtp_layers:
            found.append(RuleMatch("bf16_exceptions.mtp_layers", "bf16", "tensor belongs to an MTP layer"))
        return found
    layer = tensor.layer
    if layer is None:
        return found
    for which in ("first_layers", "last_layers"):
        spec = getattr(exceptions, which)
        if spec == 0:
            continue
        if num_layers is None and (which == "last_layers" or isinstance(spec, LayerFraction)):
            notes.append(
                f"bf16_exceptions.{which} was not evaluated: the model's layer count is unknown "
                "(pass a model to include it)"
            )
            continue
        count = spec if isinstance(spec, int) else spec.count(num_layers or 0)
        shown = f"{count}" if isinstance(spec, int) else f"{count} ({spec.describe()})"
        total = f" of {num_layers}" if num_layers is not None else ""
        if which == "first_layers" and layer < count:
            detail = f"layer {layer} is among the first {shown}{total} decoder layers"
        elif which == "last_layers" and num_layers is not None and layer >= num_layers - count:
            detail = f"layer {layer} is among the last {shown}{total} decoder layers"
        else:
            continue
        found.append(RuleMatch(f"bf16_exceptions.{which}", "bf16", detail))
    return found


def _ranked_rule_matches(
    contract: Contract, tensor: TensorInfo, namespaces: frozenset[Namespace]
) -> list[tuple[tuple[int, int], int, Rule]]:
    module_path = megatron_module_path(tensor.megatron_name) if tensor.megatron_name else None
    ranked = []
    for index, rule in enumerate(contract.rules):
        if rule.namespace not in namespaces:
            continue
        subject = tensor.name if rule.namespace == "hf" else module_path
        if subject is not None and matches(rule.kind, rule.pattern, subject):
            ranked.append(((KIND_RANK[rule.kind], literal_length(rule.kind, rule.pattern)), index, rule))
    ranked.sort(key=lambda item: (-item[0][0], -item[0][1], item[1]))
    return ranked


def _check_unambiguous(tensor: TensorInfo, ranked: list[tuple[tuple[int, int], int, Rule]]) -> None:
    top_key, top_index, top_rule = ranked[0]
    for key, index, rule in ranked[1:]:
        if key != top_key:
            return
        if rule.format != top_rule.format:
            raise ContractError(
                f"rules[{top_index}] ({top_rule.label}) and rules[{index}] ({rule.label}) match "
                f"'{tensor.name}' equally specifically but give {top_rule.format} and {rule.format}",
                hint="make one pattern more specific (more literal characters, or kind exact/regex) "
                "or give both the same format",
                tensor=tensor.name,
                field=f"rules[{index}]",
                reason="ambiguous-rules",
            )


def _effective_is_mtp(tensor: TensorInfo, num_layers: int | None, num_mtp_layers: int) -> bool:
    if tensor.is_mtp or tensor.layer is None or num_layers is None or tensor.layer < num_layers:
        return tensor.is_mtp
    if tensor.layer < num_layers + num_mtp_layers:
        return True  # HF numbers MTP layers after the decoder layers (model.layers.{L+k})
    raise MappingError(
        f"tensor '{tensor.name}' is in layer {tensor.layer}, but the model has {num_layers} decoder "
        f"layers and {num_mtp_layers} MTP layers",
        hint="check num_hidden_layers / num_nextn_predict_layers of the model",
        tensor=tensor.name,
    )


def resolve(
    contract: Contract,
    tensor: TensorInfo,
    *,
    num_layers: int | None,
    num_mtp_layers: int = 0,
    namespaces: frozenset[Namespace] = ALL_NAMESPACES,
) -> tuple[Decision, tuple[str, ...]]:
    """Decide one tensor, tolerating an unknown layer count; the engine under :func:`decide`.

    Args:
        contract: the contract.
        tensor: the tensor.
        num_layers: decoder layers of the model, or None when unknown (then ``last_layers`` and
            fractional counts are skipped and a note says so).
        num_mtp_layers: MTP layers after the decoder layers.
        namespaces: evaluate only rules and name exceptions of these namespaces (``explain
            --namespace`` and the lint comparing the HF and Megatron views use this).

    Returns:
        The decision and the notes on what could not be evaluated.

    Raises:
        ContractError: two equally specific rules disagree, or nothing covers a GEMM weight.
        MappingError: the tensor's layer is outside the model.

    Example:
        >>> from fp4convert.contract.model import Contract
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "bf16_exceptions": {"last_layers": 2},
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}]})
        >>> t = TensorInfo("model.layers.9.mlp.down_proj.weight", layer=9, gemm_weight=True)
        >>> decision, notes = resolve(c, t, num_layers=None)
        >>> decision.format, notes[0].startswith("bf16_exceptions.last_layers was not evaluated")
        ('mxfp8', True)
    """
    notes: list[str] = []
    found: list[RuleMatch] = []
    if not tensor.gemm_weight:
        found.append(RuleMatch("non_gemm", "bf16", f"not a GEMM weight (role {tensor.role.value}): never quantized"))
    found += _name_exception_matches(contract, tensor, namespaces)
    switch = _ROLE_EXCEPTIONS.get(tensor.role)
    if switch is not None and getattr(contract.bf16_exceptions, switch):
        found.append(RuleMatch(f"bf16_exceptions.{switch}", "bf16", f"role {tensor.role.value} is kept bf16"))
    is_mtp = _effective_is_mtp(tensor, num_layers, num_mtp_layers)
    found += _layer_matches(contract, tensor, is_mtp, num_layers, notes)
    ranked = _ranked_rule_matches(contract, tensor, namespaces)
    if ranked:
        _check_unambiguous(tensor, ranked)
    found += [RuleMatch(f"rules[{index}]", rule.format, rule.label) for _, index, rule in ranked]
    if contract.default is not None:
        found.append(RuleMatch("default", contract.default, "the contract default"))
    if not found:
        raise ContractError(
            f"no rule covers GEMM weight '{tensor.name}' and the contract default is null",
            hint="add a rule that matches it, or set `default:` to a format",
            tensor=tensor.name,
            field="rules",
            reason="uncovered-tensor",
        )
    return _decision(contract, tensor, found, outranked=max(len(ranked) - 1, 0)), tuple(notes)


def _decision(contract: Contract, tensor: TensorInfo, found: list[RuleMatch], outranked: int) -> Decision:
    winner = found[0]
    reason = f"{winner.format} from {winner.rule}: {winner.detail}"
    if winner.rule.startswith("rules[") and outranked:
        reason += f"; the most specific of {outranked + 1} matching rules"
    shares_scale = (
        tensor.fused_group is not None
        and tensor.fused_kind is not None
        and winner.format != "bf16"
        and contract.fused_groups.shares_scale(tensor.fused_kind.value)
    )
    return Decision(
        tensor=tensor.name,
        format=winner.format,
        recipe=contract.recipe_for(winner.format),
        rule=winner.rule,
        reason=reason,
        matched=tuple(found),
        fused_group=tensor.fused_group if shares_scale else None,
    )


def decide(contract: Contract, tensor: TensorInfo, *, num_layers: int, num_mtp_layers: int = 0) -> Decision:
    """Decide the format of one tensor under the precedence in this module's docstring.

    Args:
        contract: the contract.
        tensor: the tensor (``TensorInfo.layer`` / ``is_mtp`` / ``role`` / names are used).
        num_layers: decoder layers of the model (``ModelInventory.num_layers``).
        num_mtp_layers: MTP layers numbered after the decoder layers.

    Returns:
        The decision, with every matching entry in precedence order.

    Raises:
        ContractError: two equally specific rules disagree, or nothing covers a GEMM weight.

    Example:
        >>> from fp4convert.contract.model import Contract
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "bf16_exceptions": {"names": {"hf": [".kv_b_proj."]}},
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}]})
        >>> t = TensorInfo("model.layers.3.self_attn.kv_b_proj.weight", layer=3, gemm_weight=True)
        >>> d = c.decide(t, num_layers=61)
        >>> d.format, d.rule, [m.rule for m in d.matched]
        ('bf16', 'bf16_exceptions.names.hf[0]', ['bf16_exceptions.names.hf[0]', 'rules[0]', 'default'])
    """
    decision, _ = resolve(contract, tensor, num_layers=num_layers, num_mtp_layers=num_mtp_layers)
    return decision


def fused_conflicts(
    decisions: dict[str, Decision], tensors: Iterable[TensorInfo]
) -> list[tuple[str, tuple[TensorInfo, ...]]]:
    """Fused groups whose members were given different formats, as (group, members) pairs.

    Example:
        >>> gate = TensorInfo("g", fused_group="e0.gate_up")
        >>> up = TensorInfo("u", fused_group="e0.gate_up")
        >>> decisions = {"g": Decision("g", "bf16", None, "default", "", ()),
        ...              "u": Decision("u", "nvfp4", None, "rules[0]", "", ())}
        >>> [(group, [m.name for m in members]) for group, members in fused_conflicts(decisions, [gate, up])]
        [('e0.gate_up', ['g', 'u'])]
        >>> describe_conflict("e0.gate_up", (gate, up), decisions)
        "fused group 'e0.gate_up' splits into different formats: g=bf16 (default), u=nvfp4 (rules[0])"
    """
    groups: dict[str, list[TensorInfo]] = defaultdict(list)
    for tensor in tensors:
        if tensor.fused_group is not None and tensor.name in decisions:
            groups[tensor.fused_group].append(tensor)
    return [
        (group, tuple(members))
        for group, members in groups.items()
        if len({decisions[m.name].format for m in members}) > 1
    ]


FUSED_CONFLICT_HINT = (
    "the engines run fused siblings as one GEMM whose outer scale they must share, so the siblings need one "
    "format: put every sibling under the same rule or exception"
)


def describe_conflict(group: str, members: tuple[TensorInfo, ...], decisions: dict[str, Decision]) -> str:
    """``a=nvfp4 (rules[0]), b=bf16 (bf16_exceptions...)`` for one conflicting fused group."""
    parts = ", ".join(f"{m.name}={decisions[m.name].format} ({decisions[m.name].rule})" for m in members)
    return f"fused group '{group}' splits into different formats: {parts}"


def decide_all(contract: Contract, inventory: ModelInventory) -> dict[str, Decision]:
    """Decide every tensor of a model, refusing to split fused siblings.

    Args:
        contract: the contract.
        inventory: the model.

    Returns:
        HF name -> decision, in inventory order.

    Raises:
        ContractError: fused siblings get different formats, rules are ambiguous for some tensor,
            or a GEMM weight is uncovered.

    Example:
        >>> from fp4convert.contract.model import Contract
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}]})
        >>> inv = ModelInventory("toy", 1, (TensorInfo("model.norm.weight", (8,)),))
        >>> c.decide_all(inv)["model.norm.weight"].rule
        'non_gemm'
    """
    decisions = {
        t.name: decide(contract, t, num_layers=inventory.num_layers, num_mtp_layers=inventory.num_mtp_layers)
        for t in inventory
    }
    conflicts = fused_conflicts(decisions, inventory)
    if conflicts:
        group, members = conflicts[0]
        raise ContractError(
            describe_conflict(group, members, decisions),
            hint=FUSED_CONFLICT_HINT,
            tensor=group,
            field="rules",
            reason="fused-format-mismatch",
        )
    return decisions
