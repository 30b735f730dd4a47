"""Library exception -> the one line a user sees (plus the hint saying what to do next)."""

from __future__ import annotations

from fp4convert.errors import Fp4ConvertError


def render_error(exc: Fp4ConvertError) -> str:
    """Format an error as ``error[code]: message`` and, on its own line, ``hint: ...``."""
    text = f"error[{exc.code}]: {exc.message}"
    if exc.hint:
        text += f"\n  hint: {exc.hint}"
    return text
