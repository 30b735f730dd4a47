"""Every docstring example of fp4convert.megatron runs (those that need files or models are skipped)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["diagnose", "encode", "export", "import_", "plan", "report", "sources", "validate"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    imported = importlib.import_module(f"fp4convert.megatron.{module}")
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
