"""MXFP4 expert sources (gpt-oss's ``*_blocks`` / ``*_scales`` layout) on a Qwen3-MoE-shaped model:
exact dequantization, the contract as usual, and ModelOpt's lossless cast as the opt-in profile."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal
from _sources import all_tensors, assert_same_tensors, mxfp4_checkpoint, mxfp4_dequantized
from safetensors.torch import save_file

from fp4convert.checkpoint.decode import fused
from fp4convert.contract import load_contract
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.model_source import load_model_inventory
from fp4convert.verify.checkpoint import verify_checkpoint


def _cast_contract(tmp_path: Path) -> Path:
    path = tmp_path / "cast.yaml"
    text = re.sub(r"^quantizer: .*$", "quantizer: mxfp4-cast", NVFP4_EXPERTS.read_text(), flags=re.M)
    path.write_text(text.replace("name: nvfp4-experts-per-token", "name: nvfp4-experts-mxfp4-cast"))
    return path


def test_te_conversion_equals_converting_the_dequantized_experts(source, tmp_path):
    mxfp4, master = source("mxfp4"), source("mxfp4", dequantized=True)
    convert_checkpoint(mxfp4, tmp_path / "mx", contract=NVFP4_EXPERTS)
    convert_checkpoint(master, tmp_path / "bf16", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "mx", tmp_path / "bf16") > 100
    assert verify_checkpoint(tmp_path / "mx", source=mxfp4).ok
    manifest = json.loads((tmp_path / "mx" / "fp4convert.json").read_text())
    gate = manifest["tensors"]["model.layers.0.mlp.experts.2.gate_proj.weight"]
    assert (gate["source_format"], gate["lossless"]) == ("mxfp4+fused-3d", False)
    assert "2**(scale - 127)" in manifest["source"]["dequantizers"]["mxfp4"]


def test_mxfp4_to_mxfp8_is_lossless_and_proven(source, tmp_path):
    convert_checkpoint(source("mxfp4"), tmp_path / "out", contract=MXFP8_ALL, dialect="sglang-mxfp8")
    report = verify_checkpoint(tmp_path / "out", source=source("mxfp4"))
    proofs = [c for c in report.checks if c.check == "lossless"]
    assert report.ok and len(proofs) == 24 and all("bit for bit" in c.detail for c in proofs)


def test_the_cast_profile_keeps_every_mxfp4_value(source, tmp_path):
    contract = _cast_contract(tmp_path)
    convert_checkpoint(source("mxfp4"), tmp_path / "out", contract=contract)
    manifest = json.loads((tmp_path / "out" / "fp4convert.json").read_text())
    assert manifest["quantizer_profile"] == "mxfp4-cast"
    experts = [t for t in manifest["tensors"].values() if t["format"] == "nvfp4"]
    assert len(experts) == 24 and all(t["lossless"] is None for t in experts)
    report = verify_checkpoint(tmp_path / "out", source=source("mxfp4"))
    proofs = [c for c in report.checks if c.check == "lossless"]
    assert report.ok and len(proofs) == 24 and all(c.detail.endswith("bit for bit") for c in proofs)
    out = all_tensors(tmp_path / "out")
    scale_2 = out["model.layers.0.mlp.experts.1.up_proj.weight_scale_2"]
    mantissa, _ = torch.frexp(scale_2)
    assert mantissa.item() == 0.5  # a power of two
    assert torch.equal(scale_2, out["model.layers.0.mlp.experts.1.gate_proj.weight_scale_2"])


def test_the_cast_reports_what_it_cannot_keep(source, tmp_path):
    # One block 2**-30 below the rest of its expert: beyond E4M3's 2**-9 .. 2**8 window, so the cast
    # loses it; verify says so and still passes (the contract promised nothing more).
    src = tmp_path / "src"
    shutil.copytree(source("mxfp4"), src)
    tensors = all_tensors(src)
    tensors["model.layers.0.mlp.experts.gate_up_proj_scales"][0, 0, 0] -= 30
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    convert_checkpoint(src, tmp_path / "out", contract=_cast_contract(tmp_path))
    report = verify_checkpoint(tmp_path / "out", source=src)
    lossy = [c for c in report.checks if c.check == "lossless" and "not lossless" in c.detail]
    assert report.ok and [c.name for c in lossy] == ["model.layers.0.mlp.experts.0.gate_proj.weight"]


@pytest.mark.peer
def test_the_cast_writes_modelopts_bytes(source):
    """ModelOpt's NVFP4 quantizer, given the scales its cast_mxfp4_to_nvfp4 computes (global
    2**(k_max - 8) over gate+up, block scale 2**(k_j - m) from each E8M0 byte), writes our bytes.
    The one difference by design: ModelOpt codes -0.0 as +0 (x < 0 sign), the cast keeps 0x8."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from fp4convert.formats import quantize_nvfp4

    stored = all_tensors(source("mxfp4"))
    master = all_tensors(source("mxfp4", dequantized=True))
    prefix = "model.layers.2.mlp.experts"
    k = stored[f"{prefix}.gate_up_proj_scales"].int() - 127  # [E, 2I, G]
    inter = k.shape[1] // 2
    for e in range(k.shape[0]):
        gate, up = master[f"{prefix}.{e}.gate_proj.weight"], master[f"{prefix}.{e}.up_proj.weight"]
        m = int(k[e].max()) - 8
        amax = torch.stack([gate.float().abs().amax(), up.float().abs().amax()]).amax()
        for rows, x in ((slice(0, inter), gate), (slice(inter, None), up)):
            block_scale = torch.exp2((k[e, rows] - m).float()).repeat_interleave(2, dim=-1)
            q, sf, s2 = NVFP4QTensor.quantize(x.float(), 16, block_scale.to(torch.float8_e4m3fn), torch.tensor(2.0**m))
            ours = quantize_nvfp4(x, amax=amax, profile="mxfp4-cast")
            assert_bytes_equal(ours.scale, sf.view(torch.uint8))
            assert ours.global_decode_scale().item() == s2.item()
            codes = torch.stack([ours.data & 0xF, ours.data >> 4], dim=-1)
            unsigned_zero = torch.where(codes == 0x8, torch.zeros_like(codes), codes)
            assert_bytes_equal(unsigned_zero[..., 0] | (unsigned_zero[..., 1] << 4), q._quantized_data)


def test_interleaved_gate_up_rows(tiny_checkpoint, tmp_path, monkeypatch):
    # gpt-oss interleaves gate and up rows; the fact is the model's (model_type), so this Qwen3-MoE
    # checkpoint is declared interleaved for the test.
    monkeypatch.setattr(fused, "INTERLEAVED_MODEL_TYPES", frozenset({"qwen3_moe"}))
    monkeypatch.setattr("fp4convert.checkpoint.decode.view.INTERLEAVED_MODEL_TYPES", frozenset({"qwen3_moe"}))
    src = mxfp4_checkpoint(tiny_checkpoint("qwen3_moe"), tmp_path / "src", interleaved=True)
    master = mxfp4_dequantized(src, tmp_path / "master", interleaved=True)
    convert_checkpoint(src, tmp_path / "mx", contract=NVFP4_EXPERTS)
    convert_checkpoint(master, tmp_path / "bf16", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "mx", tmp_path / "bf16") > 100
    manifest = json.loads((tmp_path / "mx" / "fp4convert.json").read_text())
    assert manifest["tensors"]["model.layers.0.mlp.experts.0.up_proj.weight"]["source_format"] == (
        "mxfp4+fused-3d-interleaved"
    )


def test_explain_says_where_the_cast_differs_from_te(source, tmp_path):
    contract = load_contract(_cast_contract(tmp_path))
    inventory = load_model_inventory(str(source("mxfp4")))
    explanation = contract.explain("model.layers.0.mlp.experts.1.down_proj.weight", inventory)
    notes = " ".join(explanation.notes)
    assert "source: mxfp4+fused-3d" in notes and "lossless if its values allow" in notes
    assert "differ from te's" in notes and "not for RL weight updates" in notes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cast", [False, True])
def test_cuda_converts_an_mxfp4_source_to_the_same_bytes(source, tmp_path, cast):
    contract = _cast_contract(tmp_path) if cast else NVFP4_EXPERTS
    convert_checkpoint(source("mxfp4"), tmp_path / "cpu", contract=contract)
    convert_checkpoint(source("mxfp4"), tmp_path / "cuda", contract=contract, device="cuda")
    assert assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu") > 100
    assert verify_checkpoint(tmp_path / "cuda", source=source("mxfp4"), device="cuda").ok
