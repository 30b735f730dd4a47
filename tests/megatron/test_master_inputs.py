"""What no master tensor may be: an integer, bool, complex or FP8 tensor, or one without values (the
meta device). ``export_hf``, ``LiveExporter`` and ``validate_export`` refuse it with one MappingError
naming the tensor, at a first sync and at a later one (what an earlier sync, or the constructor,
resolved for that name and shape never lets it through); an exported tensor without values is a
finding. Found by feeding such tensors to the live calls: each was an internal KeyError,
RuntimeError or NotImplementedError."""

from __future__ import annotations

import pytest
import torch
from _helpers import NVFP4_EXPERTS

from fp4convert import export_hf, validate_export
from fp4convert.errors import MappingError
from fp4convert.families import hf_to_megatron
from fp4convert.megatron.sync import LiveExporter

EXPERTS = "decoder.layers.0.mlp.experts.linear_fc1.weight1"  # quantized NVFP4 (TE grouped experts)
NORM = "decoder.final_layernorm.weight"  # sent BF16


def _bad(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "meta":
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
    return tensor.to(getattr(torch, kind))


@pytest.mark.parametrize("name", [EXPERTS, NORM])
@pytest.mark.parametrize("kind", ["int8", "bool", "complex64", "float8_e4m3fn", "float64", "meta"])
def test_a_tensor_no_master_may_be_is_refused_by_name(model, name, kind):
    hf, config = model("qwen3_moe")
    master = hf_to_megatron(hf, "qwen3_moe", config)
    exported = dict(export_hf(master, contract=NVFP4_EXPERTS, family=None, config=config))
    exporter = LiveExporter(contract=NVFP4_EXPERTS, config=config)
    exporter(master)  # a first, good sync: the name and shape are resolved from a real tensor
    bad = {**master, name: _bad(master[name], kind)}
    what = "on the meta device" if kind == "meta" else r"\S+, not BF16, F16 or F32"
    says = rf"master tensor `{name}` is {what}"
    calls = {
        "export_hf": lambda: list(export_hf(bad, contract=NVFP4_EXPERTS, family=None, config=config)),
        "LiveExporter": lambda: exporter(bad),
        "validate_export": lambda: validate_export(exported, bad, contract=NVFP4_EXPERTS, family=None, config=config),
    }
    for call in calls.values():
        with pytest.raises(MappingError, match=says):
            call()


@pytest.mark.parametrize("kind", ["int8", "float64", "meta"])
def test_a_new_exporters_first_sync_refuses_what_no_master_may_be(model, kind):
    # its records are predicted at construction as BF16 (no check needed for BF16): another dtype at
    # the first sync is checked all the same
    hf, config = model("qwen3_moe")
    master = hf_to_megatron(hf, "qwen3_moe", config)
    bad = {**master, EXPERTS: _bad(master[EXPERTS], kind)}
    what = "on the meta device" if kind == "meta" else r"\S+, not BF16, F16 or F32"
    with pytest.raises(MappingError, match=rf"master tensor `{EXPERTS}` is {what}"):
        LiveExporter(contract=NVFP4_EXPERTS, config=config)(bad)
    as_float32 = {name: tensor.float() for name, tensor in master.items()}  # a master dtype: passes
    assert len(LiveExporter(contract=NVFP4_EXPERTS, config=config)(as_float32)) > 0


def test_an_exported_tensor_on_the_meta_device_is_a_finding(model):
    hf, config = model("qwen3_moe")
    master = hf_to_megatron(hf, "qwen3_moe", config)
    exported = dict(export_hf(master, contract=NVFP4_EXPERTS, family=None, config=config))
    name = "model.layers.0.mlp.experts.1.up_proj.weight_scale_2"
    exported[name] = torch.empty(exported[name].shape, dtype=exported[name].dtype, device="meta")
    report = validate_export(exported, master, contract=NVFP4_EXPERTS, family=None, config=config)
    assert not report.ok
    assert [(f.tensor, f.check) for f in report.findings if "meta device" in f.detail] == [(name, "dtype")]
