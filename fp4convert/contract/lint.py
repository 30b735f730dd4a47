"""``contract check``: what is wrong or suspicious in a contract, alone or applied to one model.

Without a model (checks on the contract alone):

* ``per-token-without-etp`` (error): NVFP4 uses per-token activation scales but
  ``expert_tensor_parallel_size`` is unset; learner and sampler must slice experts the same way.
* ``rule-cannot-match`` (error): a Megatron rule written against a parameter name
  (``...linear_fc1.weight``); Megatron rules see module paths, so it can never match.
  (warning) an HF ``exact`` rule naming a module instead of a tensor (no ``.weight``/``.bias``).
* ``duplicate-rule``: two rules with the same kind, namespace and pattern (error if their
  formats differ, warning if they agree).
* ``mla-1d-blocks`` (warning): probed on DeepSeek-style names, MLA ``kv_b_proj`` would get 1-D
  blocks (MXFP8 1x32 or NVFP4 1x16) although it is used with two contraction axes.
* ``mxfp4-cast-not-for-rl`` (warning): ``quantizer: mxfp4-cast`` is for serving an MXFP4 release.

With a model, every tensor is resolved, and:

* ``uncovered-tensor`` / ``ambiguous-rules`` / ``layer-out-of-range`` (errors): resolution failed.
* ``rule-never-matches`` (warning): a rule matches no tensor of this model.
* ``rule-always-overridden`` (warning): a rule matches tensors but none of them gets its format
  (exceptions or more specific rules decide all of them). A rule that agrees with the decision,
  such as the Megatron mirror of an HF rule, is not overridden.
* ``shape-not-divisible`` (error): a quantized tensor whose shape does not divide into its blocks;
  ``shape-unknown`` (warning) when the model gives no shape.
* ``mla-1d-blocks`` (error): an MLA projection gets 1-D blocks.
* ``fused-format-mismatch`` (error): fused siblings get different formats.
* ``namespace-disagreement`` (error): the HF rules alone and the Megatron rules alone give a tensor
  different formats, i.e. the converter/sampler and the learner would disagree.
* ``lossy-fp8-requantize`` (warning): an FP8 source tensor with arbitrary FP32 scales goes to MXFP8
  (docs/sources.md); ``mxfp4-cast-not-mxfp4`` (warning): the MXFP4 cast on a tensor whose source is
  not MXFP4.

Findings about many tensors are reported once, with the count and the first few names.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from fp4convert.contract.decision import Decision
from fp4convert.contract.footprint import fits_blocks
from fp4convert.contract.lossless import MXFP4_CAST, base_source_format
from fp4convert.contract.model import Contract
from fp4convert.contract.resolve import FUSED_CONFLICT_HINT, describe_conflict, fused_conflicts, resolve
from fp4convert.contract.sections import MXFP8Recipe, Namespace, NVFP4Recipe
from fp4convert.errors import ContractError, MappingError
from fp4convert.inventory import ModelInventory, Role, TensorInfo

__all__ = ["Finding", "Severity", "lint"]

Severity = Literal["error", "warning"]

# A Megatron pattern ending in a parameter attribute can never match a module path.
_PARAMETER_SUFFIX = re.compile(r"\.(weight\d*|bias|layer_norm_weight|layer_norm_bias|expert_bias)$")
# HF checkpoint keys are parameters: they end in weight/bias (e_score_correction_bias included).
_HF_TENSOR_SUFFIX = re.compile(r"(weight|bias)$")
# DeepSeek-V3 naming of MLA's kv_b_proj in both schemes (docs/live-export.md, "HF and Megatron-Core names").
_MLA_PROBE = TensorInfo(
    name="model.layers.0.self_attn.kv_b_proj.weight",
    megatron_name="decoder.layers.0.self_attention.linear_kv_up_proj.weight",
    role=Role.MLA_PROJECTION,
    gemm_weight=True,
)
_EXAMPLES = 3


@dataclass(frozen=True)
class Finding:
    """One problem found by :func:`lint`.

    Attributes:
        severity: ``error`` (the contract cannot be used as is) or ``warning``.
        code: stable identifier, e.g. ``shape-not-divisible``.
        message: one line saying what was found.
        hint: what to do about it.
        rule: the contract entry concerned (``rules[2]``), if one is.
        tensors: every tensor concerned (the message names the first few).
    """

    severity: Severity
    code: str
    message: str
    hint: str
    rule: str | None = None
    tensors: tuple[str, ...] = ()


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_EXAMPLES])
    return f"{shown}, ... ({len(names)} tensors)" if len(names) > _EXAMPLES else shown


def _is_one_dimensional(decision: Decision) -> bool:
    recipe = decision.recipe
    return isinstance(recipe, MXFP8Recipe) or (isinstance(recipe, NVFP4Recipe) and recipe.tile == "1x16")


def _static_findings(contract: Contract) -> list[Finding]:
    findings: list[Finding] = []
    nvfp4 = contract.formats.nvfp4
    if contract.quantizer == MXFP4_CAST:
        findings.append(
            Finding(
                "warning",
                "mxfp4-cast-not-for-rl",
                "quantizer mxfp4-cast (ModelOpt's lossless MXFP4 cast) is for serving a released MXFP4 checkpoint: "
                "the learner quantizes its BF16 master with te arithmetic, not with this one",
                "use quantizer te for a contract an RL run updates weights under",
                rule="quantizer",
            )
        )
    if (
        "nvfp4" in contract.formats_used
        and nvfp4.per_token_activations
        and contract.expert_tensor_parallel_size is None
    ):
        findings.append(
            Finding(
                "error",
                "per-token-without-etp",
                "NVFP4 per-token activation scales are on but expert_tensor_parallel_size is unset",
                "set expert_tensor_parallel_size to the ETP size both learner and sampler use "
                "(with a different ETP they see different row slices)",
                rule="expert_tensor_parallel_size",
            )
        )
    seen: dict[tuple[str, str, str], int] = {}
    for index, rule in enumerate(contract.rules):
        rule_id = f"rules[{index}]"
        if rule.namespace == "megatron" and rule.kind != "regex" and _PARAMETER_SUFFIX.search(rule.pattern):
            findings.append(
                Finding(
                    "error",
                    "rule-cannot-match",
                    f"{rule_id} ({rule.label}) ends in a parameter name; Megatron rules match module paths",
                    f"drop the last component: '{rule.pattern.rsplit('.', 1)[0]}'",
                    rule=rule_id,
                )
            )
        if rule.namespace == "hf" and rule.kind == "exact" and not _HF_TENSOR_SUFFIX.search(rule.pattern):
            findings.append(
                Finding(
                    "warning",
                    "rule-cannot-match",
                    f"{rule_id} ({rule.label}) names no tensor: HF checkpoint keys end in .weight or .bias",
                    "use the full tensor name, or a glob such as '<module>.*'",
                    rule=rule_id,
                )
            )
        key = (rule.kind, rule.namespace, rule.pattern)
        if key in seen:
            first = contract.rules[seen[key]]
            conflicting = first.format != rule.format
            findings.append(
                Finding(
                    "error" if conflicting else "warning",
                    "duplicate-rule",
                    f"{rule_id} repeats the pattern of rules[{seen[key]}] ({rule.label})"
                    + (f" with another format ({first.format} vs {rule.format})" if conflicting else ""),
                    "remove one of the two rules",
                    rule=rule_id,
                )
            )
        else:
            seen[key] = index
    return findings


def _mla_probe(contract: Contract) -> list[Finding]:
    try:
        decision, _ = resolve(contract, _MLA_PROBE, num_layers=None)
    except (ContractError, MappingError):
        return []  # the probe is only a probe; real resolution problems show up with a model
    if decision.format == "bf16" or not _is_one_dimensional(decision):
        return []
    return [
        Finding(
            "warning",
            "mla-1d-blocks",
            f"on an MLA model (DeepSeek naming) kv_b_proj / linear_kv_up_proj would be {decision.format} "
            f"with 1-D blocks ({decision.rule})",
            "keep it bf16: add '.kv_b_proj.' to bf16_exceptions.names.hf and '.linear_kv_up_proj', "
            "'.linear_k_up_proj', '.linear_v_up_proj' to bf16_exceptions.names.megatron",
            rule=decision.rule,
        )
    ]


class _ModelLint:
    """Resolves every tensor once and collects findings grouped by code and rule."""

    def __init__(self, contract: Contract, inventory: ModelInventory) -> None:
        self.contract = contract
        self.inventory = inventory
        self.decisions: dict[str, Decision] = {}
        self.grouped: dict[tuple[Severity, str, str | None], list[str]] = defaultdict(list)
        self.first_message: dict[tuple[Severity, str, str | None], tuple[str, str]] = {}

    def add(self, severity: Severity, code: str, rule: str | None, tensor: str, message: str, hint: str) -> None:
        key = (severity, code, rule)
        self.grouped[key].append(tensor)
        self.first_message.setdefault(key, (message, hint))

    def resolve_all(self) -> None:
        inv = self.inventory
        for tensor in inv:
            try:
                decision, _ = resolve(
                    self.contract, tensor, num_layers=inv.num_layers, num_mtp_layers=inv.num_mtp_layers
                )
            except ContractError as exc:
                code = exc.fields.get("reason", "contract-error")
                self.add("error", code, exc.fields.get("field"), tensor.name, exc.message, exc.hint or "")
                continue
            except MappingError as exc:
                self.add("error", "layer-out-of-range", None, tensor.name, exc.message, exc.hint or "")
                continue
            self.decisions[tensor.name] = decision
            self.check_tensor(tensor, decision)

    def check_tensor(self, tensor: TensorInfo, decision: Decision) -> None:
        recipe = decision.recipe
        if not isinstance(recipe, (NVFP4Recipe, MXFP8Recipe)):
            return
        if not tensor.shape:
            self.add("warning", "shape-unknown", None, tensor.name, "quantized tensors without a shape", "")
        elif not fits_blocks(tensor.shape, recipe.block_shape):
            block = "x".join(map(str, recipe.block_shape))
            self.add(
                "error",
                "shape-not-divisible",
                decision.rule,
                tensor.name,
                f"shape {tensor.shape} does not divide into {decision.format} {block} blocks",
                "keep these tensors bf16 (a rule or bf16_exceptions.names) or pad them before conversion",
            )
        source = base_source_format(tensor)
        if decision.format == "mxfp8" and source in ("fp8-block", "fp8-channel"):
            self.add(
                "warning",
                "lossy-fp8-requantize",
                decision.rule,
                tensor.name,
                "FP8 source with arbitrary FP32 block or row scales requantized to MXFP8: values are rounded again "
                "(sampler and learner must both start from the same dequantized BF16 master)",
                "keep them nvfp4 or bf16, or convert from a release with power-of-two scales (scale_fmt: ue8m0)",
            )
        if decision.format == "nvfp4" and self.contract.quantizer == MXFP4_CAST and tensor.source_format:
            if source != "mxfp4":
                self.add(
                    "warning",
                    "mxfp4-cast-not-mxfp4",
                    decision.rule,
                    tensor.name,
                    f"quantizer mxfp4-cast on a {source} source tensor: its power-of-two scales keep values "
                    "exactly only for MXFP4 sources",
                    "use quantizer te for these tensors' model, or convert the MXFP4 release itself",
                )
        if tensor.role is Role.MLA_PROJECTION and _is_one_dimensional(decision):
            self.add(
                "error",
                "mla-1d-blocks",
                decision.rule,
                tensor.name,
                f"MLA projection gets {decision.format} 1-D blocks but is used with two contraction axes",
                "keep it bf16 (bf16_exceptions.names: hf '.kv_b_proj.', megatron '.linear_kv_up_proj') "
                "or use a 16x16 NVFP4 tile",
            )

    def rule_usage(self) -> list[Finding]:
        matched: set[str] = set()
        honoured: set[str] = set()  # rules whose format some matching tensor actually gets
        for decision in self.decisions.values():
            for match in decision.matched:
                matched.add(match.rule)
                if match.format == decision.format:
                    honoured.add(match.rule)
        findings = []
        for index, rule in enumerate(self.contract.rules):
            rule_id = f"rules[{index}]"
            if rule_id not in matched:
                message = f"{rule_id} ({rule.label}) matches no tensor of this model"
                hint = "check the pattern and its namespace, or drop the rule"
                findings.append(Finding("warning", "rule-never-matches", message, hint, rule=rule_id))
            elif rule_id not in honoured:
                message = f"{rule_id} ({rule.label}) matches tensors, but none of them gets {rule.format}"
                hint = "exceptions or more specific rules override it everywhere; drop it or narrow the others"
                findings.append(Finding("warning", "rule-always-overridden", message, hint, rule=rule_id))
        return findings

    def fused(self) -> None:
        for group, members in fused_conflicts(self.decisions, self.inventory):
            self.add(
                "error",
                "fused-format-mismatch",
                None,
                group,
                describe_conflict(group, members, self.decisions),
                FUSED_CONFLICT_HINT,
            )

    def namespaces(self) -> None:
        spaces = {rule.namespace for rule in self.contract.rules}
        if len(spaces) < 2:
            return
        inv = self.inventory
        for tensor in inv:
            if tensor.megatron_name is None or tensor.name not in self.decisions:
                continue
            formats: dict[Namespace, str] = {}
            try:
                for space in ("hf", "megatron"):
                    view, _ = resolve(
                        self.contract,
                        tensor,
                        num_layers=inv.num_layers,
                        num_mtp_layers=inv.num_mtp_layers,
                        namespaces=frozenset({space}),
                    )
                    formats[space] = f"{view.format} ({view.rule})"
            except ContractError:
                continue  # e.g. uncovered in one view only; the full resolution already passed
            if formats["hf"].split()[0] != formats["megatron"].split()[0]:
                self.add(
                    "error",
                    "namespace-disagreement",
                    None,
                    tensor.name,
                    f"HF rules give {formats['hf']}, Megatron rules give {formats['megatron']}",
                    "the converter/sampler (HF names) and the learner (Megatron names) must agree: "
                    "mirror each rule and name exception in both namespaces",
                )

    def findings(self) -> list[Finding]:
        self.resolve_all()
        self.fused()
        self.namespaces()
        findings = []
        for (severity, code, rule), tensors in self.grouped.items():
            message, hint = self.first_message[(severity, code, rule)]
            if code == "shape-unknown":
                message = f"{len(tensors)} quantized tensors have no shape; block divisibility was not checked"
                hint = "give shapes in the model's tensor list"
            else:
                message = f"{_some(tensors)}: {message}"
            findings.append(Finding(severity, code, message, hint, rule=rule, tensors=tuple(tensors)))
        return findings + self.rule_usage()


def lint(contract: Contract, inventory: ModelInventory | None = None) -> tuple[Finding, ...]:
    """Check a contract, and optionally its application to one model.

    Args:
        contract: the contract.
        inventory: the model; without it only the contract-alone checks run (plus the MLA probe).

    Returns:
        Findings, errors first, then warnings, each group in check order.

    Example:
        >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "formats": {"nvfp4": {"per_token_activations": True}},
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*.mlp.experts.*",
        ...                "format": "nvfp4"}]})
        >>> [f.code for f in lint(c)]
        ['per-token-without-etp']
    """
    findings = _static_findings(contract)
    if inventory is None:
        findings += _mla_probe(contract)
    else:
        findings += _ModelLint(contract, inventory).findings()
    return tuple(sorted(findings, key=lambda f: f.severity != "error"))
