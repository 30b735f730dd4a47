"""The contracts fp4convert ships, found by name (``nvfp4-experts-per-token``) as well as by path.

They live in the repository's ``contracts/`` folder; a wheel installs them under
``<prefix>/share/fp4convert/contracts`` (pyproject ``data-files``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["resolve_contract_path", "shipped_contract_dirs", "shipped_contracts"]


def shipped_contract_dirs() -> list[Path]:
    """Folders that hold the shipped contracts, checkout first."""
    candidates = [Path(__file__).resolve().parents[2] / "contracts", Path(sys.prefix) / "share/fp4convert/contracts"]
    return [d for d in candidates if d.is_dir()]


def shipped_contracts() -> dict[str, Path]:
    """Shipped contract name -> file."""
    found: dict[str, Path] = {}
    for directory in shipped_contract_dirs():
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def resolve_contract_path(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``path`` itself if it exists or looks like a path; the shipped file if it is a shipped name."""
    text = os.fspath(path)
    if Path(text).exists() or os.sep in text or Path(text).suffix:
        return path
    return shipped_contracts().get(text, path)
