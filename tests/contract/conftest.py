"""Fixtures for the contract tests: the toy models, loaded once per session."""

from __future__ import annotations

import pytest
from contract.helpers import TOY_MLA, TOY_MOE

from fp4convert.inventory import ModelInventory
from fp4convert.model_source import load_model_inventory


@pytest.fixture(scope="session")
def toy_moe() -> ModelInventory:
    """Toy Qwen3-MoE: 4 layers x (qkv, o, router, 4 experts), no dense layer, no MTP."""
    return load_model_inventory(TOY_MOE)


@pytest.fixture(scope="session")
def toy_mla() -> ModelInventory:
    """Toy DeepSeek-V3: MLA, layer 0 dense, layers 1-3 MoE with shared experts, 1 MTP layer."""
    return load_model_inventory(TOY_MLA)
