"""The public surface of ``fp4convert`` is exactly ``__all__``, and every name resolves."""

from __future__ import annotations

import fp4convert


def test_all_matches_the_lazy_exports():
    assert sorted(fp4convert.__all__) == sorted(["__version__", *fp4convert._EXPORTS])


def test_every_public_name_resolves():
    for name in fp4convert.__all__:
        assert getattr(fp4convert, name) is not None


def test_unknown_names_raise_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match=r"module 'fp4convert' has no attribute 'nope'"):
        fp4convert.nope  # noqa: B018


def test_every_report_a_public_function_returns_is_public():
    import typing

    returns = {
        "convert_checkpoint": "ConversionReport",
        "verify_checkpoint": "VerifyReport",
        "dequantize_checkpoint": "DequantizeReport",
        "import_hf": "ImportReport",
        "validate_export": "ExportReport",
        "doctor_checkpoint": "DoctorReport",
    }
    for function, report in returns.items():
        assert typing.get_type_hints(getattr(fp4convert, function))["return"] is getattr(fp4convert, report)
        assert report in fp4convert.__all__
