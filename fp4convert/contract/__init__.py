"""Precision contracts: one declarative file that decides every tensor's format for every consumer.

The public surface is listed in ``__all__`` (a test guards it). Modules, one job each:

* :mod:`~fp4convert.contract.model`: the strict, frozen pydantic model and its canonical form.
* :mod:`~fp4convert.contract.loader`: YAML/JSON files -> :class:`Contract`, errors with file/line/field.
* :mod:`~fp4convert.contract.resolve`: the precedence, :class:`Decision`, ``explain``.
* :mod:`~fp4convert.contract.lint`: ``contract check``.
* :mod:`~fp4convert.contract.diff`: ``diff`` between two contracts on one model.
* :mod:`~fp4convert.contract.emit`: TransformerEngine YAML, Megatron/Miles and SGLang flags, env.
* :mod:`~fp4convert.contract.model_source`: ``--model`` (families, or a tensor list file).

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

from fp4convert.contract.loader import load_contract, parse_contract
from fp4convert.contract.model import (
    BF16Exceptions,
    Contract,
    Format,
    FormatRecipes,
    FusedGroups,
    LayerFraction,
    MXFP8Recipe,
    NameExceptions,
    NVFP4Recipe,
    Rule,
    contract_hash,
)
from fp4convert.contract.resolve import Decision, Explanation, RuleMatch

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
