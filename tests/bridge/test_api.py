"""The public surface of fp4convert.bridge, and every docstring example in it runs."""

from __future__ import annotations

import doctest
import importlib

import pytest
from _helpers import ROOT

import fp4convert.bridge

MODULES = [
    "fp4convert.bridge.export",
    "fp4convert.bridge.tables",
    "fp4convert.bridge.validate",
    "fp4convert.convert.groups",
]


def test_public_names():
    assert fp4convert.bridge.__all__ == [
        "ExportReport",
        "ExportValidator",
        "Finding",
        "ImportReport",
        "TensorResult",
        "export_hf",
        "import_hf",
        "validate_export",
        "validate_export_files",
    ]
    for name in fp4convert.bridge.__all__:
        assert getattr(fp4convert.bridge, name) is not None


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
