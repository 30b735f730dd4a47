"""The public surface of fp4convert.contract, and the examples in its docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest

import fp4convert.contract

MODULES = [
    "diff",
    "emit",
    "footprint",
    "lint",
    "loader",
    "model",
    "model_source",
    "names",
    "patterns",
    "resolve",
]


def test_public_names_are_exactly_these() -> None:
    assert fp4convert.contract.__all__ == [
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
    for name in fp4convert.contract.__all__:
        assert getattr(fp4convert.contract, name) is not None


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from contract.helpers import REPO

    monkeypatch.chdir(REPO)  # examples name files relative to the repository root
    imported = importlib.import_module(f"fp4convert.contract.{module}")
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
