"""Plans: what a precision contract does to every tensor of a model, decided before anything runs.

One core, three plans built on it:

* :mod:`~fp4convert.plan.tensors`: :class:`PlannedTensor` and :func:`plan_tensors`, the one
  place a contract's decisions meet a model's tensors (and a dialect's outputs); shared-scale
  groups.
* :mod:`~fp4convert.plan.checks`: what every plan must satisfy (dialect refusals, block fit,
  FusedMoE formats, calibration), shared by the converter and the live export.
* :mod:`~fp4convert.plan.conversion`: the converter's plan of a source checkpoint (source and
  output shards), also what ``verify --source`` re-derives from.
* :mod:`~fp4convert.plan.quantize`: the per-tensor quantize step every writer and checker uses.
* :mod:`~fp4convert.plan.footprint`: the ``fp4convert plan`` report (totals per role, rule,
  format and layer).

The live export's plan is :func:`fp4convert.megatron.export_plan`, built on the same core.
"""

from __future__ import annotations

from fp4convert.plan.checks import fused_moe_problems, plan_problems, refuse, shape_problem, uncalibrated_modules
from fp4convert.plan.conversion import (
    ConversionPlan,
    checked_calibration,
    load_calibration,
    plan_conversion,
    validate_conversion,
)
from fp4convert.plan.footprint import EXPERT_ROLES, Plan, PlanRow, Totals, build_plan, human_bytes
from fp4convert.plan.quantize import (
    SharedAmax,
    group_input_amax,
    input_amax,
    member_amax,
    quantize_members,
    quantize_tensor,
    shared_amax,
)
from fp4convert.plan.tensors import PlannedTensor, members_of, plan_tensors, shared_scale_groups, source_bytes

__all__ = [
    "EXPERT_ROLES",
    "ConversionPlan",
    "Plan",
    "PlanRow",
    "PlannedTensor",
    "SharedAmax",
    "Totals",
    "build_plan",
    "checked_calibration",
    "fused_moe_problems",
    "group_input_amax",
    "human_bytes",
    "input_amax",
    "load_calibration",
    "member_amax",
    "members_of",
    "plan_conversion",
    "plan_problems",
    "plan_tensors",
    "quantize_members",
    "quantize_tensor",
    "refuse",
    "shape_problem",
    "shared_amax",
    "shared_scale_groups",
    "source_bytes",
    "uncalibrated_modules",
    "validate_conversion",
]
