"""The precision contract: one frozen, strict pydantic model that every consumer reads.

A contract says, for every tensor of a model, which format it gets (``nvfp4``, ``mxfp8`` or
``bf16``) and with which recipe, plus the training / serving knobs that must agree with that
choice (backward mode, KV-cache precision, expert-tensor-parallel size): field by field, the
recipe decisions of ``docs/recipe.md``. Its sections (recipes, rules, exceptions, fused groups) are
:mod:`fp4convert.contract.sections`; how the fields combine into one decision per tensor is
:mod:`fp4convert.contract.resolve`; this module holds the contract itself, its derived values and
its canonical form (YAML and the hash converters embed).

Strictness: unknown fields are errors (``extra="forbid"``), numbers and booleans are never coerced
from strings (``"8"`` is not ``8``, ``1`` is not ``true``), and instances are frozen. Everything a
file may omit has a default written here, and :meth:`Contract.to_yaml` writes every value out.

Example:
    >>> contract = Contract.model_validate({
    ...     "version": 1, "name": "experts-nvfp4", "default": "bf16",
    ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*.mlp.experts.*",
    ...                "format": "nvfp4"}],
    ... })
    >>> contract.formats.nvfp4.tile, contract.bf16_exceptions.shared_experts
    ('1x16', True)
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, StrictInt, StrictStr, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from fp4convert.contract import explain as explain_module
from fp4convert.contract import resolve as resolve_module
from fp4convert.contract.decision import Decision, Explanation
from fp4convert.contract.sections import (
    BackwardMode,
    BF16Exceptions,
    Format,
    FormatRecipes,
    FusedGroups,
    Identifier,
    KVCachePrecision,
    MXFP8Recipe,
    Namespace,
    NVFP4Recipe,
    QuantizerProfile,
    Rule,
    StrictModel,
    exact_type,
)
from fp4convert.inventory import ModelInventory, TensorInfo

__all__ = ["Contract", "contract_hash"]


class Contract(StrictModel):
    """A precision contract. See the module docstring, and ``resolve`` for the precedence.

    Attributes:
        version: the contract file format version; only 1 exists.
        name: short identifier, shown in reports and emitted files.
        description: free text.
        quantizer: the NVFP4 arithmetic profile (``fp4convert.formats.profiles``): ``te`` (default,
            TransformerEngine >= 2.14 and FlashInfer without fast math), ``te-2.13``, ``modelopt``,
            or the opt-in ``mxfp4-cast`` (ModelOpt's lossless MXFP4 cast: for serving an MXFP4
            release, not for RL weight updates; docs/sources.md).
        formats: the recipe of each low-precision format.
        rules: matchers, at least one. Their order in the file never changes a format.
        default: format of GEMM weights no rule or exception covers; ``null`` makes an uncovered
            GEMM weight an error instead.
        bf16_exceptions: tensors kept BF16 regardless of the rules.
        fused_groups: which fused sibling kinds share one outer scale.
        backward: training backward mode: ``high_precision`` (BF16 operands) or ``dequantized``
            (BF16 dequantization of the forward's low-precision operands).
        kv_cache: KV-cache precision at serving time.
        expert_tensor_parallel_size: the ETP size learner and sampler must both use; required
            when NVFP4 uses per-token activation scales (lint checks it).
    """

    version: Annotated[Literal[1], exact_type(int, "1")]
    name: Identifier
    description: StrictStr = ""
    quantizer: QuantizerProfile = "te"
    formats: FormatRecipes = FormatRecipes()
    rules: Annotated[tuple[Rule, ...], Field(min_length=1)]
    default: Format | None
    bf16_exceptions: BF16Exceptions = BF16Exceptions()
    fused_groups: FusedGroups = FusedGroups()
    backward: BackwardMode = "high_precision"
    kv_cache: KVCachePrecision = "bf16"
    expert_tensor_parallel_size: Annotated[StrictInt, Field(ge=1)] | None = None

    @field_validator("formats")
    @classmethod
    def _four_over_six_is_te_arithmetic(cls, formats: FormatRecipes, info: ValidationInfo) -> FormatRecipes:
        quantizer = info.data.get("quantizer", "te")
        if formats.nvfp4.four_over_six is not None and quantizer != "te":
            raise PydanticCustomError(
                "four_over_six_quantizer",
                "nvfp4.four_over_six is TransformerEngine >= 2.17 arithmetic and needs quantizer 'te', not "
                "'{quantizer}'",
                {"quantizer": quantizer},
            )
        return formats

    @property
    def nvfp4_profile(self) -> str:
        """The arithmetic profile NVFP4 tensors are quantized with (``fp4convert.formats.profiles``):
        ``quantizer``, or TransformerEngine's 4over6 profile ``te-4over6-<mode>[-256]``."""
        recipe = self.formats.nvfp4
        if recipe.four_over_six is None:
            return self.quantizer
        return f"te-4over6-{recipe.four_over_six}" + ("-256" if recipe.four_over_six_e4m3_max == 256 else "")

    @field_validator("rules")
    @classmethod
    def _rule_names_are_unique(cls, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        seen: dict[str, int] = {}
        for index, rule in enumerate(rules):
            if rule.name is None:
                continue
            if rule.name in seen:
                raise PydanticCustomError(
                    "duplicate_rule_name",
                    "rule name '{name}' is used by rules[{first}] and rules[{second}]",
                    {"name": rule.name, "first": seen[rule.name], "second": index},
                )
            seen[rule.name] = index
        return rules

    # Derived values ---------------------------------------------------------------------------

    @property
    def formats_used(self) -> frozenset[Format]:
        """Formats any rule or the default can assign (BF16 exceptions only ever add ``bf16``)."""
        used: set[Format] = {rule.format for rule in self.rules}
        if self.default is not None:
            used.add(self.default)
        return frozenset(used)

    def recipe_for(self, fmt: Format) -> NVFP4Recipe | MXFP8Recipe | None:
        """The recipe object of ``fmt``, or None for ``bf16``."""
        if fmt == "nvfp4":
            return self.formats.nvfp4
        if fmt == "mxfp8":
            return self.formats.mxfp8
        return None

    # Resolution (implemented in fp4convert.contract.resolve and .explain) ----------------------

    def decide(self, tensor: TensorInfo, *, num_layers: int, num_mtp_layers: int = 0) -> Decision:
        """Decide the format of one tensor. See :func:`fp4convert.contract.resolve.decide`."""
        return resolve_module.decide(self, tensor, num_layers=num_layers, num_mtp_layers=num_mtp_layers)

    def decide_all(self, inventory: ModelInventory) -> dict[str, Decision]:
        """Decide every tensor of a model. See :func:`fp4convert.contract.resolve.decide_all`."""
        return resolve_module.decide_all(self, inventory)

    def explain(
        self,
        tensor: str | TensorInfo,
        inventory: ModelInventory | None = None,
        *,
        namespace: Namespace | None = None,
        notes: tuple[str, ...] = (),
    ) -> Explanation:
        """Explain one tensor's decision. See :func:`fp4convert.contract.explain.explain`."""
        return explain_module.explain(self, tensor, inventory, namespace=namespace, notes=notes)

    # Canonical form -------------------------------------------------------------------------

    def canonical_dict(self) -> dict[str, Any]:
        """Every field, defaults included, as plain JSON types in field order; the 4over6 fields
        only when set, so contracts written before they existed keep their hash."""
        data = self.model_dump(mode="json")
        nvfp4 = data["formats"]["nvfp4"]
        for key in ("four_over_six", "four_over_six_e4m3_max"):
            if nvfp4[key] is None:
                del nvfp4[key]
        return data

    def to_yaml(self) -> str:
        """The canonical YAML form: every field written out, field order, loadable again.

        Example:
            >>> c = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
            ...     "rules": [{"kind": "exact", "namespace": "hf", "pattern": "lm_head.weight",
            ...                "format": "bf16"}]})
            >>> Contract.model_validate(yaml.safe_load(c.to_yaml())) == c
            True
        """
        return yaml.safe_dump(self.canonical_dict(), sort_keys=False, default_flow_style=False, width=100)


def contract_hash(contract: Contract) -> str:
    """SHA-256 (hex) of the contract's canonical JSON: sorted keys, defaults written out, no spaces.

    Two files that spell the same contract differently (key order, omitted defaults, YAML or
    JSON) hash the same; any change to a decision-relevant value changes the hash. Converters
    embed it in output manifests.

    Example:
        >>> a = Contract.model_validate({"version": 1, "name": "x", "default": "bf16",
        ...     "rules": [{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "bf16"}]})
        >>> b = Contract.model_validate({"rules": [{"format": "bf16", "pattern": "*", "namespace": "hf",
        ...     "kind": "glob"}], "default": "bf16", "name": "x", "version": 1, "kv_cache": "bf16"})
        >>> contract_hash(a) == contract_hash(b), len(contract_hash(a))
        (True, 64)
    """
    canonical = json.dumps(contract.canonical_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
