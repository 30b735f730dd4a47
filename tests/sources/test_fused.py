"""Fused 3-D experts: read as sources, split exactly, written per expert: byte-identical to converting
the per-expert save of the same model (same names, same bytes)."""

from __future__ import annotations

import json

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS
from _sources import all_tensors, assert_same_tensors, fp8_checkpoint, fp8_dequantized, fused_checkpoint

from fp4convert import import_hf
from fp4convert.checkpoint import open_checkpoint
from fp4convert.checkpoint.decode import fused
from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.verify.checkpoint import verify_checkpoint


@pytest.fixture(scope="module")
def transformers_fused(tiny_checkpoint, tmp_path_factory):
    """The tiny Qwen3-MoE saved by transformers itself in its fused layout (save_original_format=False)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint("qwen3_moe")), dtype=torch.bfloat16)
    out = tmp_path_factory.mktemp("fused-transformers") / "ckpt"
    model.save_pretrained(str(out), save_original_format=False)
    return out


def test_transformers_fused_save_converts_to_the_per_expert_bytes(tiny_checkpoint, transformers_fused, tmp_path):
    stored = all_tensors(transformers_fused)
    assert stored["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)  # [E, 2I, H]
    assert not any(".experts.0." in n for n in stored)
    for contract in (NVFP4_EXPERTS, MXFP8_ALL):
        convert_checkpoint(transformers_fused, tmp_path / contract.stem / "fused", contract=contract)
        convert_checkpoint(tiny_checkpoint("qwen3_moe"), tmp_path / contract.stem / "per-expert", contract=contract)
        assert assert_same_tensors(tmp_path / contract.stem / "fused", tmp_path / contract.stem / "per-expert") > 90
    assert verify_checkpoint(tmp_path / NVFP4_EXPERTS.stem / "fused", source=transformers_fused).ok


@pytest.mark.parametrize("kind", ["fused", "fused-transposed"])
def test_each_layout_converts_to_the_per_expert_bytes(tiny_checkpoint, source, tmp_path, kind):
    convert_checkpoint(source(kind), tmp_path / "fused", contract=NVFP4_EXPERTS)
    convert_checkpoint(tiny_checkpoint("qwen3_moe"), tmp_path / "per-expert", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 100
    manifest = json.loads((tmp_path / "fused" / "fp4convert.json").read_text())
    expected = "dense+fused-3d" + ("-transposed" if kind == "fused-transposed" else "")
    assert manifest["tensors"]["model.layers.2.mlp.experts.3.down_proj.weight"]["source_format"] == expected


def test_interleaved_rows(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("fp4convert.checkpoint.decode.view.INTERLEAVED_MODEL_TYPES", frozenset({"qwen3_moe"}))
    src = fused_checkpoint(tiny_checkpoint("qwen3_moe"), tmp_path / "src", transposed=True, interleaved=True)
    convert_checkpoint(src, tmp_path / "fused", contract=NVFP4_EXPERTS)
    convert_checkpoint(tiny_checkpoint("qwen3_moe"), tmp_path / "per-expert", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 100


def test_the_layout_is_read_from_shapes_never_guessed():
    layout = fused.fused_layout("x", (8, 512, 2048), (8, 2048, 256), interleaved=False)
    assert not layout.transposed
    assert fused.fused_layout("x", (8, 2048, 512), (8, 256, 2048), interleaved=False).transposed


def test_fp8_fused_experts(tiny_checkpoint, tmp_path):
    # transformers' fused layout with FP8 block-scaled expert tensors (scale grid per expert)
    per_expert = tiny_checkpoint("qwen3_moe")
    fp8 = fp8_checkpoint(
        fused_checkpoint(per_expert, tmp_path / "fused"),
        tmp_path / "fp8",
        block=(32, 48),
        which=lambda name, t: name.endswith(("gate_up_proj", "down_proj")),
    )
    stored = all_tensors(fp8)
    assert stored["model.layers.0.mlp.experts.gate_up_proj_scale_inv"].shape == (4, 2, 2)
    master = fp8_dequantized(fp8, tmp_path / "master")  # still fused, dequantized by the reference
    convert_checkpoint(fp8, tmp_path / "a", contract=NVFP4_EXPERTS)
    convert_checkpoint(master, tmp_path / "b", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "a", tmp_path / "b") > 100
    assert open_checkpoint(fp8).view().formats()["fp8-block+fused-3d"] == 24


def test_the_learner_import_of_a_fused_save_equals_the_per_expert_import(
    tiny_checkpoint, transformers_fused, tmp_path
):
    import_hf(transformers_fused, tmp_path / "fused")
    import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "per-expert")
    assert assert_same_tensors(tmp_path / "fused", tmp_path / "per-expert") > 10


def test_a_fused_tensor_is_read_one_expert_slice_at_a_time(source, tmp_path, monkeypatch):
    reads: list[int] = []
    original = SafetensorsFile.read_range

    def spy(self, start, end, **kwargs):
        reads.append(end - start)
        return original(self, start, end, **kwargs)

    monkeypatch.setattr(SafetensorsFile, "read_range", spy)
    src = source("fused")
    fused_bytes = all_tensors(src)["model.layers.0.mlp.experts.gate_up_proj"].numel() * 2
    convert_checkpoint(src, tmp_path / "out", contract=NVFP4_EXPERTS)
    embed = all_tensors(src)["model.embed_tokens.weight"].numel() * 2
    assert max(reads) <= max(embed, fused_bytes // 4)  # an expert's slice, or the largest plain tensor
    assert fused_bytes // 4 in reads and fused_bytes not in reads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_converts_a_fused_source_to_the_same_bytes(source, tmp_path):
    convert_checkpoint(source("fused-transposed"), tmp_path / "cpu", contract=NVFP4_EXPERTS)
    convert_checkpoint(source("fused-transposed"), tmp_path / "cuda", contract=NVFP4_EXPERTS, device="cuda")
    assert assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu") > 100
