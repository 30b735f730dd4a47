"""DeepSeek-V3 tiny (MLA with q-LoRA, shared experts, a dense layer, one MTP layer) from an FP8
release-style source (128x128 blocks, edges not multiples of 128), end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import NVFP4_EXPERTS
from _sources import all_tensors, assert_same_tensors

from fp4convert import import_hf
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.verify.checkpoint import verify_checkpoint

MLA_NVFP4 = Path(__file__).parents[1] / "megatron" / "data" / "deepseek-nvfp4-mla-bf16.yaml"


@pytest.mark.parametrize("contract", [NVFP4_EXPERTS, MLA_NVFP4])
def test_deepseek_v3_fp8_converts_as_its_dequantized_master(source, tmp_path, contract):
    fp8, master = source("fp8-128", "deepseek_v3"), source("fp8-128", "deepseek_v3", dequantized=True)
    stored = all_tensors(fp8)
    assert stored["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].dtype.itemsize == 1  # MLA in FP8
    assert stored["model.layers.3.eh_proj.weight_scale_inv"].shape == (1, 1)  # the MTP layer too
    convert_checkpoint(fp8, tmp_path / "fp8", contract=contract)
    convert_checkpoint(master, tmp_path / "bf16", contract=contract)
    assert assert_same_tensors(tmp_path / "fp8", tmp_path / "bf16") > 100
    report = verify_checkpoint(tmp_path / "fp8", source=fp8)
    assert report.ok and report.compared_with_source, report.summary()
    manifest = json.loads((tmp_path / "fp8" / "fp4convert.json").read_text())
    mtp = {n: t for n, t in manifest["tensors"].items() if n.startswith("model.layers.3.")}
    assert mtp["model.layers.3.eh_proj.weight"]["source_format"] == "fp8-block"
    assert mtp["model.layers.3.shared_head.head.weight"]["source_format"] == "dense"


def test_deepseek_v3_fp8_learner_import_equals_the_dequantized_import(source, tmp_path):
    fp8, master = source("fp8-128", "deepseek_v3"), source("fp8-128", "deepseek_v3", dequantized=True)
    import_hf(fp8, tmp_path / "fp8", contract=NVFP4_EXPERTS)
    import_hf(master, tmp_path / "bf16", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "fp8", tmp_path / "bf16") > 20
    names = set(all_tensors(tmp_path / "fp8"))
    assert any(n.startswith("mtp.") for n in names) and any("linear_q_down_proj" in n for n in names)
