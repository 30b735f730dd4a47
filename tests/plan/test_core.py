"""One tensor-plan core: the converter, the live export and the footprint report agree on every tensor."""

from __future__ import annotations

import pytest
from _helpers import CONTRACTS, NVFP4_EXPERTS

from fp4convert.checkpoint import open_checkpoint
from fp4convert.contract import load_contract, parse_contract
from fp4convert.dialects import get_dialect
from fp4convert.errors import ConversionError
from fp4convert.megatron import export_plan
from fp4convert.plan import build_plan, plan_conversion, plan_tensors, shape_problem, validate_conversion

DEEPSEEK_MXFP8 = CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml"


@pytest.mark.parametrize(("model", "contract"), [("qwen3_moe", NVFP4_EXPERTS), ("deepseek_v3", DEEPSEEK_MXFP8)])
@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_converter_export_and_footprint_plans_agree_on_every_tensor(tiny_checkpoint, model, contract, dialect):
    ckpt = open_checkpoint(tiny_checkpoint(model))
    the_contract = load_contract(contract)
    the_dialect = get_dialect(dialect, per_token_activations=the_contract.formats.nvfp4.per_token_activations)
    converter = plan_conversion(ckpt, the_contract, the_dialect)
    export = export_plan(contract=the_contract, config=ckpt.config, dialect=the_dialect, include_input_scale=True)
    footprint = build_plan(the_contract, ckpt.inventory())
    by_name = {item.info.name: item for item in converter.items}
    assert set(by_name) == set(export.items) == {p.info.name for p in footprint.tensors}
    for planned in footprint.tensors:
        item, sent = by_name[planned.info.name], export.items[planned.info.name]
        assert item.decision == sent.decision == planned.decision
        assert (item.bytes_before, item.bytes_after) == (planned.bytes_before, planned.bytes_after)
        if item.info.dtype == sent.info.dtype:
            assert item.outputs == sent.outputs  # the same tensors, names, dtypes, shapes
        else:  # transformers keeps DeepSeek's router in float32; the config describes bfloat16
            assert item.info.name.endswith("mlp.gate.weight") and not item.quantized
            assert [(n, s) for n, _, s in item.outputs] == [(n, s) for n, _, s in sent.outputs]
    assert {g: set(m) for g, m in converter.groups.items()} == {g: set(m) for g, m in export.groups.items()}
    assert all(len(members) > 1 for members in converter.groups.values())


def test_a_conversion_plan_follows_the_source_data_order_and_names_its_own_shards(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    plan = plan_conversion(ckpt, load_contract(NVFP4_EXPERTS), get_dialect("modelopt"))
    order = list(ckpt.shards)
    positions = [(order.index(i.source_file), ckpt.entry(i.info.name).start) for i in plan.items]
    assert positions == sorted(positions)
    assert list(plan.by_output_file()) == [f"model-{n:05d}-of-{len(order):05d}.safetensors" for n in range(1, 9)]


SPLIT_EXPERTS = """version: 1
name: split-experts
formats: {nvfp4: {per_token_activations: true}}
rules:
  - {kind: glob, namespace: hf, pattern: "*.mlp.experts.0.*", format: mxfp8}
  - {kind: glob, namespace: hf, pattern: "*.mlp.experts.*", format: nvfp4}
default: bf16
"""


def test_the_converter_and_the_export_refuse_the_same_plan_with_the_same_problems(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    contract = parse_contract(SPLIT_EXPERTS)
    with pytest.raises(ConversionError) as converter:
        validate_conversion(plan_conversion(ckpt, contract, get_dialect("modelopt")))
    with pytest.raises(ConversionError) as export:
        export_plan(contract=contract, config=ckpt.config)
    assert converter.value.fields["problems"] == export.value.fields["problems"]
    assert any("routed experts split across formats ['mxfp8', 'nvfp4']" in p for p in export.value.fields["problems"])


def test_shape_problems_name_the_tensor_and_the_block(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint("qwen3_moe"))
    contract = load_contract(NVFP4_EXPERTS)
    items = [i for i in plan_tensors(contract, ckpt.inventory(), get_dialect("modelopt")) if i.quantized]
    assert items and all(shape_problem(i) is None for i in items)
    narrow = type(items[0])(type(items[0].info)(**{**items[0].info.__dict__, "shape": (32, 40)}), items[0].decision)
    assert shape_problem(narrow) == (
        f"{narrow.info.name}: shape (32, 40), in-features 40 not divisible by the NVFP4 block 16"
    )
