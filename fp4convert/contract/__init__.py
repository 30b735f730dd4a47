"""Precision contracts: one declarative file that decides every tensor's format for every consumer.

The public surface is listed in ``__all__`` (a test guards it). Modules, one job each:

* :mod:`~fp4convert.contract.sections`: the sections of a contract file (recipes, rules, exceptions).
* :mod:`~fp4convert.contract.model`: the strict, frozen :class:`Contract` and its canonical form.
* :mod:`~fp4convert.contract.loader`: YAML/JSON files -> :class:`Contract`, errors with file/line/field.
* :mod:`~fp4convert.contract.shipped`: the contracts fp4convert ships, found by name.
* :mod:`~fp4convert.contract.patterns`: the three rule kinds (glob, regex, exact) and their specificity.
* :mod:`~fp4convert.contract.decision`: :class:`Decision`, :class:`RuleMatch`, :class:`Explanation`.
* :mod:`~fp4convert.contract.resolve`: the precedence, from a described tensor to one decision.
* :mod:`~fp4convert.contract.explain`: one tensor's decision with every entry that matched.
* :mod:`~fp4convert.contract.footprint`: the bytes a decision stores, and block fit.
* :mod:`~fp4convert.contract.lint`: ``contract check``.
* :mod:`~fp4convert.contract.diff`: ``diff`` between two contracts on one model.
* :mod:`~fp4convert.contract.emit`: TransformerEngine YAML, Megatron/Miles and SGLang flags, env.

A contract works on described tensors (:class:`~fp4convert.inventory.TensorInfo`) and never
imports the model families; turning a model or a bare name into them is
:mod:`fp4convert.model_source`. The format and precedence are written down in ``docs/contracts.md``.

Example:
    >>> from fp4convert.contract import load_contract
    >>> from fp4convert.inventory import Role, TensorInfo
    >>> contract = load_contract("contracts/nvfp4-experts-per-token.yaml")
    >>> expert = TensorInfo("model.layers.3.mlp.experts.7.up_proj.weight", (768, 2048),
    ...                     role=Role.ROUTED_EXPERT, layer=3, gemm_weight=True)
    >>> contract.decide(expert, num_layers=48).format
    'nvfp4'
"""

from __future__ import annotations

from fp4convert.contract.decision import Decision, Explanation, RuleMatch
from fp4convert.contract.loader import load_contract, parse_contract
from fp4convert.contract.model import Contract, contract_hash
from fp4convert.contract.sections import (
    BF16Exceptions,
    Format,
    FormatRecipes,
    FusedGroups,
    LayerFraction,
    MXFP8Recipe,
    NameExceptions,
    NVFP4Recipe,
    Rule,
)

__all__ = [
    "BF16Exceptions",
    "Contract",
    "Decision",
    "Explanation",
    "Format",
    "FormatRecipes",
    "FusedGroups",
    "LayerFraction",
    "MXFP8Recipe",
    "NVFP4Recipe",
    "NameExceptions",
    "Rule",
    "RuleMatch",
    "contract_hash",
    "load_contract",
    "parse_contract",
]
