"""The public surface of fp4convert.contract (its docstring examples run in tests/test_doctests.py)."""

from __future__ import annotations

import fp4convert.contract


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
