"""Plain helpers for the contract tests (imported as ``contract.helpers``; ``tests/`` is on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fp4convert.contract import Contract

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
CONTRACTS = REPO / "contracts"
TOY_MOE = DATA / "toy_qwen3_moe.yaml"
TOY_MLA = DATA / "toy_deepseek_v3.yaml"

#: The reference environment of the per-token NVFP4 recipe with high-precision backward
#: (docs/recipe.md, "The environment"), line for line.
SEED_ENVIRONMENT = """\
NVTE_NVFP4_ROW_SCALED_ACTIVATION=1
NVTE_BACKWARD_OVERRIDE=high_precision
NVTE_NVFP4_DISABLE_2D_QUANTIZATION=1
NVTE_NVFP4_DISABLE_RHT=1
NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=1
TRTLLM_DISABLE_FP4_QUANT_FAST_MATH=1
FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH=1
SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1
"""

#: Every shipped contract file, by stem.
SHIPPED = sorted(path.stem for path in CONTRACTS.glob("*.yaml"))


def base_contract(**fields: Any) -> dict[str, Any]:
    """The smallest valid contract as a dict, with ``fields`` replacing its top-level entries."""
    data: dict[str, Any] = {
        "version": 1,
        "name": "test",
        "default": "bf16",
        "rules": [rule("*.mlp.experts.*", "nvfp4")],
    }
    data.update(fields)
    return data


def make_contract(**fields: Any) -> Contract:
    """``make_contract(rules=[...], bf16_exceptions={...})`` -> a validated :class:`Contract`."""
    return Contract.model_validate(base_contract(**fields))


def rule(
    pattern: str, fmt: str, *, kind: str = "glob", namespace: str = "hf", name: str | None = None
) -> dict[str, Any]:
    """One rule as a dict."""
    data = {"kind": kind, "namespace": namespace, "pattern": pattern, "format": fmt}
    if name is not None:
        data["name"] = name
    return data
