"""What a live weight update must contain, decided once per (contract, model, dialect).

An :class:`ExportPlan` is the converter's plan without files: every HF tensor of the model (from
its config.json alone), the contract's decision for it, the tensors the dialect sends for it and
the fused groups whose members share one outer scale. Decisions are made on the HF inventory
exactly as the converter makes them (``Contract.decide_all``; Megatron-namespace rules and name
exceptions see each tensor's canonical Megatron name), so a converted checkpoint and a live update
under the same contract hold the same bytes.

A live update differs from a checkpoint in one way: RL frameworks never re-send NVFP4
``input_scale`` (Miles' ``quantize_params_nvfp4`` emits ``weight``, ``weight_scale`` and
``weight_scale_2`` only; the engine keeps the activation scale it loaded from disk). Plans leave
it out unless ``include_input_scale=True``.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fp4convert.contract import Contract, contract_hash, load_contract
from fp4convert.contract.shipped import resolve_contract_path
from fp4convert.dialects import Dialect, get_dialect
from fp4convert.errors import MappingError
from fp4convert.families import family_for_config, get_family, inventory_from_config, load_config
from fp4convert.plan import (
    PlannedTensor,
    checked_calibration,
    members_of,
    plan_problems,
    plan_tensors,
    refuse,
    shared_scale_groups,
    uncalibrated_modules,
)
from fp4convert.plan.collector import gc_paused

__all__ = ["ExportPlan", "export_plan", "fused_members_phrase", "gc_paused", "loaded_contract"]

ContractLike = Contract | str | Path
DialectLike = Dialect | str


@dataclass
class ExportPlan:
    """Decisions and expected outputs for every HF tensor of one model (see the module docstring).

    Attributes:
        contract: the contract.
        family: the family key (``"qwen3_moe"``).
        config: the model's config.json.
        dialect: the dialect the update is written in.
        include_input_scale: whether NVFP4 ``input_scale`` tensors are part of the update.
        items: HF name -> :class:`~fp4convert.plan.PlannedTensor` (its outputs: what an update
            sends), in HF order.
        groups: shared-scale group -> member HF names (NVFP4 groups of two or more only).
        num_experts: routed experts per MoE layer (0 without experts).
        calibration: activation amaxes per HF module, used only for sent input scales.
    """

    contract: Contract
    family: str
    config: dict[str, Any]
    dialect: Dialect
    include_input_scale: bool
    items: dict[str, PlannedTensor]
    groups: dict[str, tuple[str, ...]]
    num_experts: int
    calibration: Mapping[str, float] | None = None

    @property
    def profile(self) -> str:
        """The contract's NVFP4 arithmetic profile."""
        return self.contract.nvfp4_profile

    def item(self, name: str) -> PlannedTensor:
        """The item of HF tensor ``name``.

        Raises:
            MappingError: the model has no such tensor.
        """
        try:
            return self.items[name]
        except KeyError:
            raise MappingError(
                f"`{name}` is not a tensor of this {self.family} model",
                hint="check the tensor against the model's config.json",
                tensor=name,
            ) from None

    def members(self, item: PlannedTensor) -> tuple[str, ...]:
        """The HF names sharing ``item``'s outer scale (``(name,)`` when it shares none)."""
        return members_of(self.groups, item)

    def experts_per_rank(self, ep_size: int) -> int:
        """Routed experts each of ``ep_size`` expert-parallel ranks holds.

        Raises:
            MappingError: ``ep_size`` does not divide the expert count.
        """
        if ep_size < 1 or (self.num_experts and self.num_experts % ep_size):
            raise MappingError(
                f"{self.num_experts} experts cannot be split over EP size {ep_size}",
                hint="the EP size must divide the expert count",
            )
        return self.num_experts // ep_size if self.num_experts else 0

    def on_rank(self, item: PlannedTensor, ep_rank: int, ep_size: int) -> bool:
        """Whether EP rank ``ep_rank`` exports ``item`` (every rank exports non-expert tensors)."""
        if ep_size == 1 or not item.is_expert:
            return True
        return item.info.expert // self.experts_per_rank(ep_size) == ep_rank  # type: ignore[operator]

    def expected(self, ep_rank: int = 0, ep_size: int = 1) -> list[PlannedTensor]:
        """The items EP rank ``ep_rank`` of ``ep_size`` exports, in HF order.

        Raises:
            MappingError: an invalid EP position.
        """
        if not 0 <= ep_rank < ep_size:
            raise MappingError(
                f"EP rank {ep_rank} of size {ep_size} is not a valid expert-parallel position",
                hint="0 <= ep_rank < ep_size",
            )
        return [i for i in self.items.values() if self.on_rank(i, ep_rank, ep_size)]


def fused_members_phrase(names: Iterable[str]) -> str:
    """``gate_proj and up_proj`` for a group's HF names.

    Example:
        >>> fused_members_phrase(["m.q_proj.weight", "m.k_proj.weight", "m.v_proj.weight"])
        'q_proj, k_proj and v_proj'
    """
    parts = [name.rsplit(".", 2)[-2] for name in names]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _refusals(plan: ExportPlan) -> list[str]:
    """Everything the converter's plan validation would refuse, for this model and dialect."""
    items = list(plan.items.values())
    problems = plan_problems(plan.contract, plan.dialect, items)
    if plan.include_input_scale and not plan.contract.formats.nvfp4.per_token_activations:
        missing = uncalibrated_modules(items, plan.dialect, plan.calibration)
        if missing:
            problems.append(
                f"input scales are to be sent, but contract {plan.contract.name!r} quantizes NVFP4 "
                f"activations per tensor and {len(missing)} modules have no calibrated amax "
                f"(first: {missing[0]}); pass calibration= or leave include_input_scale off"
            )
    return problems


def _build(
    contract: Contract,
    family: str | None,
    config: dict[str, Any],
    dialect: Dialect,
    include_input_scale: bool,
    calibration: Mapping[str, float] | None,
) -> ExportPlan:
    fam = get_family(family) if family is not None else family_for_config(config)
    if family is not None and family_for_config(config).key != fam.key:
        raise MappingError(
            f"family {fam.key.value!r} does not match the config's architecture "
            f"({family_for_config(config).key.value})",
            hint="pass the family of this config.json, or family=None to take it from the config",
        )
    items: dict[str, PlannedTensor] = {}
    for item in plan_tensors(contract, inventory_from_config(config), dialect):
        input_scale = dialect.output_name(item.module, item.decision.format, "input")
        outputs = tuple(spec for spec in item.outputs if include_input_scale or spec[0] != input_scale)
        items[item.info.name] = replace(item, outputs=outputs)
    experts = {i.info.expert for i in items.values() if i.is_expert}
    plan = ExportPlan(
        contract=contract,
        family=fam.key.value,
        config=config,
        dialect=dialect,
        include_input_scale=include_input_scale,
        items=items,
        groups=shared_scale_groups(items.values()),
        num_experts=len(experts),
        calibration=calibration,
    )
    refuse(
        _refusals(plan),
        f"the contract cannot be exported in dialect {dialect.name!r}",
        "fix the contract, pick another dialect, or keep the listed tensors in BF16",
    )
    return plan


_CACHE_SIZE = 8
_CONTRACTS: OrderedDict[tuple[str, int], Contract] = OrderedDict()


def loaded_contract(contract: ContractLike) -> Contract:
    """``contract`` as a :class:`~fp4convert.contract.Contract`: a file or shipped name is parsed
    once per version of the file (a training loop names the same contract at every sync).

    Raises:
        ContractError: as :func:`~fp4convert.contract.load_contract`.
    """
    if isinstance(contract, Contract):
        return contract
    path = Path(os.fspath(resolve_contract_path(contract)))
    try:
        key = (str(path.resolve()), path.stat().st_mtime_ns)
    except OSError:
        return load_contract(contract)  # the loader names what is wrong with it
    found = _CONTRACTS.get(key)
    if found is None:
        found = _CONTRACTS[key] = load_contract(path)
        while len(_CONTRACTS) > _CACHE_SIZE:
            _CONTRACTS.popitem(last=False)
    return found


_CACHE: OrderedDict[tuple[Any, ...], ExportPlan] = OrderedDict()


def export_plan(
    *,
    contract: ContractLike,
    config: Mapping[str, Any] | str | Path,
    dialect: DialectLike = "modelopt",
    family: str | None = None,
    include_input_scale: bool = False,
    calibration: Mapping[str, float] | None = None,
) -> ExportPlan:
    """The :class:`ExportPlan` of a model under a contract (cached: a training loop asks every sync).

    Args:
        contract: a :class:`~fp4convert.contract.Contract`, a contract file, or a shipped name.
        config: the model's parsed config.json (or its path / checkpoint folder / shipped name).
        dialect: dialect name or instance.
        family: family key; None takes it from the config.
        include_input_scale: plan NVFP4 input scales too (live updates do not send them).
        calibration: activation amax per HF module, for input scales of per-tensor contracts.

    Returns:
        The plan (the same object for the same arguments, up to 8 plans are kept).

    Raises:
        ConversionError: the converter would refuse this contract on this model and dialect.
        ContractError, MappingError: bad contract, unsupported model, or a family mismatch.

    Example:
        >>> plan = export_plan(contract="nvfp4-experts-per-token", config="Qwen3-30B-A3B")
        >>> item = plan.item("model.layers.0.mlp.experts.5.up_proj.weight")
        >>> item.decision.format, [name.rsplit(".", 1)[1] for name, _, _ in item.outputs]
        ('nvfp4', ['weight', 'weight_scale', 'weight_scale_2'])
    """
    with gc_paused():  # tens of thousands of plan objects: see fp4convert.plan.collector
        the_contract = loaded_contract(contract)
        the_config = dict(config) if isinstance(config, Mapping) else load_config(config)
        per_token = the_contract.formats.nvfp4.per_token_activations
        the_dialect = get_dialect(dialect, per_token_activations=per_token) if isinstance(dialect, str) else dialect
        calibration = None if calibration is None else checked_calibration(calibration)
        key = (
            contract_hash(the_contract),
            family,
            json.dumps(the_config, sort_keys=True, default=str),
            the_dialect.name,
            getattr(the_dialect, "per_token_activations", None),
            include_input_scale,
            None if calibration is None else tuple(sorted(calibration.items())),
        )
        plan = _CACHE.get(key)
        if plan is None:
            plan = _build(the_contract, family, the_config, the_dialect, include_input_scale, calibration)
            _CACHE[key] = plan
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
        _CACHE.move_to_end(key)
        return plan
