"""The collector is paused while a plan is built (tens of thousands of objects), and put back as it was."""

from __future__ import annotations

import gc

import pytest

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.dialects import get_dialect
from fp4convert.families import load_config
from fp4convert.megatron.plan import export_plan
from fp4convert.plan import plan_conversion
from fp4convert.plan.collector import gc_frozen, gc_paused


def test_the_collector_is_back_as_it_was_after_a_pause_nested_or_not():
    was = gc.isenabled()
    try:
        gc.enable()
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner pause does not switch it back on
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector the caller had off stays off
    finally:
        (gc.enable if was else gc.disable)()


@pytest.fixture
def collections():
    """Counts the collector's runs while the test runs (it is on, with a low threshold)."""
    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    threshold, was = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(100, 10, 10)
    gc.callbacks.append(count)
    try:
        yield runs
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
        (gc.enable if was else gc.disable)()


def test_an_export_plan_is_built_with_the_collector_paused(collections):
    config = {**load_config("Qwen3-30B-A3B"), "num_hidden_layers": 4, "test_nonce": id(collections)}
    before = len(collections)
    plan = export_plan(contract="nvfp4-experts-per-token", config=config)
    assert len(plan.items) > 1000  # thousands of objects made, and not one collection meanwhile
    assert len(collections) - before <= 1  # at most the one the allocations start once it is back on


def test_a_conversion_plan_is_built_with_the_collector_paused(collections, tiny_checkpoint):
    source = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    contract = load_contract("contracts/nvfp4-experts-per-token.yaml")
    before = len(collections)
    plan = plan_conversion(source, contract, get_dialect("modelopt"))
    assert plan.items
    assert len(collections) - before <= 1


def test_gc_frozen_leaves_the_live_heap_out_and_thaws_it_after():
    gc.unfreeze()
    with gc_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_conversion_runs_with_the_heap_it_started_with_frozen(tiny_checkpoint, tmp_path):
    frozen = []
    gc.unfreeze()
    convert_checkpoint(
        tiny_checkpoint("qwen3_moe"),
        tmp_path / "out",
        contract="contracts/nvfp4-experts-per-token.yaml",
        progress=lambda event, payload: frozen.append(gc.get_freeze_count()),
    )
    assert frozen and min(frozen) > 0  # a full collection never walks the imports and the plan
    assert gc.get_freeze_count() == 0  # and they are back in the collector's care after
