"""Bad source input: one clear error naming the tensor or field, before any output is written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _helpers import NVFP4_EXPERTS, tree_hashes
from _sources import all_tensors
from safetensors.torch import save_file

from fp4convert import import_hf
from fp4convert.convert.dequantize import dequantize_checkpoint
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.errors import CheckpointError, MappingError

DOWN = "model.layers.0.mlp.experts.1.down_proj.weight"


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None], config=None) -> Path:
    """A one-shard copy of ``src`` with its tensors edited (and its config.json, if given)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, dst / f.name)
    tensors = all_tensors(src)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data)
        (dst / "config.json").write_text(json.dumps(data))
    return dst


def _refused(source: Path, tmp_path: Path, error=CheckpointError, commands=("convert", "to-megatron", "dequantize")):
    """Every writing command refuses ``source`` with ``error`` and writes nothing; the source is untouched."""
    before = tree_hashes(source)
    found = []
    runs = {
        "convert": lambda out: convert_checkpoint(source, out, contract=NVFP4_EXPERTS),
        "to-megatron": lambda out: import_hf(source, out),
        "dequantize": lambda out: dequantize_checkpoint(source, out),
    }
    for name in commands:
        run = runs[name]
        out = tmp_path / name
        with pytest.raises(error) as err:
            run(out)
        assert not out.exists() and not out.with_name(out.name + ".partial").exists(), name
        found.append(err.value)
    assert tree_hashes(source) == before
    assert len({str(e) for e in found}) == 1, [str(e) for e in found]  # one and the same error
    return found[0]


def test_a_missing_weight_scale_inv(source, tmp_path):
    bad = _rewrite(source("fp8"), tmp_path / "src", lambda t: t.pop(DOWN + "_scale_inv"))
    err = _refused(bad, tmp_path)
    assert err.tensor == DOWN and "has no" in err.message and "weight_scale_inv" in err.message


def test_a_scale_grid_that_does_not_match_its_weight(source, tmp_path):
    def edit(t):
        t[DOWN + "_scale_inv"] = torch.ones(5, 5)

    err = _refused(_rewrite(source("fp8"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == DOWN + "_scale_inv"
    assert "[5, 5]" in err.message and "[64, 32]" in err.message and "needs F32 [2, 1]" in err.message


@pytest.mark.parametrize(("value", "word"), [(float("nan"), "nan"), (float("inf"), "inf"), (0.0, "0.0")])
def test_nan_inf_or_zero_scales(source, tmp_path, value, word):
    def edit(t):
        t[DOWN + "_scale_inv"][1, 0] = value

    err = _refused(_rewrite(source("fp8"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == DOWN + "_scale_inv" and word in err.message and "block 1, 0" in err.message


def test_ue8m0_declared_but_scales_not_powers_of_two(source, tmp_path):
    def edit(t):
        t[DOWN + "_scale_inv"][0, 0] = 0.3

    err = _refused(_rewrite(source("ue8m0"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == DOWN + "_scale_inv" and "scale_fmt: ue8m0" in err.message


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("quant_method", "bitsandbytes", "fp8 (block-scaled E4M3) or mxfp4"),
        ("quant_method", "modelopt", "fp4convert dequantize"),
        ("fmt", "e5m2", "'e4m3'"),
        ("scale_fmt", "e4m3", "'ue8m0'"),
        ("weight_block_size", None, "two positive integers"),
    ],
)
def test_an_unknown_quant_method_or_fmt(source, tmp_path, field, value, expected):
    def config(c):
        c["quantization_config"][field] = value

    # `dequantize` reads a modelopt checkpoint as the dialect it names (and finds nothing quantized)
    commands = ("convert", "to-megatron") if value == "modelopt" else ("convert", "to-megatron", "dequantize")
    err = _refused(_rewrite(source("fp8"), tmp_path / "src", lambda t: None, config), tmp_path, commands=commands)
    assert err.field == f"quantization_config.{field}" and expected in str(err)


def test_fp8_tensors_without_a_declaration(source, tmp_path):
    bad = _rewrite(source("fp8"), tmp_path / "src", lambda t: None, lambda c: c.pop("quantization_config"))
    err = _refused(bad, tmp_path)
    assert "declares no FP8 quantization_config" in err.message and err.tensor.startswith("model.layers.")


def test_a_scale_whose_weight_is_not_fp8(source, tmp_path):
    def edit(t):
        t["model.norm.weight_scale_inv"] = torch.ones(1, 1)

    err = _refused(_rewrite(source("fp8"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == "model.norm.weight_scale_inv" and "not an F8_E4M3 tensor" in err.message


def test_mxfp4_blocks_without_scales(source, tmp_path):
    name = "model.layers.0.mlp.experts.gate_up_proj"
    err = _refused(_rewrite(source("mxfp4"), tmp_path / "src", lambda t: t.pop(name + "_scales")), tmp_path)
    assert err.tensor == name + "_blocks" and "_scales" in err.message


def test_mxfp4_nan_scale(source, tmp_path):
    name = "model.layers.2.mlp.experts.down_proj_scales"

    def edit(t):
        t[name][3, 10, 0] = 0xFF

    err = _refused(_rewrite(source("mxfp4"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == name and "0xFF" in err.message and "block 3, 10, 0" in err.message


def test_a_fused_gate_up_without_its_down(source, tmp_path):
    name = "model.layers.0.mlp.experts.down_proj"
    err = _refused(_rewrite(source("fused"), tmp_path / "src", lambda t: t.pop(name)), tmp_path)
    assert err.tensor == "model.layers.0.mlp.experts.gate_up_proj" and "no model.layers.0.mlp.experts.down_proj" in (
        err.message
    )


def test_fused_shapes_that_fit_no_layout(source, tmp_path):
    name = "model.layers.0.mlp.experts.down_proj"

    def edit(t):
        t[name] = t[name][:, :, :16].contiguous()

    err = _refused(_rewrite(source("fused"), tmp_path / "src", edit), tmp_path)
    assert err.tensor == "model.layers.0.mlp.experts.gate_up_proj" and "fit neither" in err.message


def test_fused_experts_the_family_cannot_name(source, tmp_path):
    def edit(t):
        t["model.layers.0.mlp.shared.experts.gate_up_proj"] = t.pop("model.layers.0.mlp.experts.gate_up_proj")
        t["model.layers.0.mlp.shared.experts.down_proj"] = t.pop("model.layers.0.mlp.experts.down_proj")

    err = _refused(_rewrite(source("fused"), tmp_path / "src", edit), tmp_path, error=MappingError)
    assert err.tensor == "model.layers.0.mlp.shared.experts.gate_up_proj"
