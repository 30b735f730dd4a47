"""FP8 block-scaled sources end to end: every output byte equals the conversion of the independently
dequantized BF16 master, and every consumer reads that same master."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, tree_hashes
from _sources import all_tensors, assert_same_tensors
from safetensors.torch import save_file

from fp4convert import export_hf, import_hf
from fp4convert.checkpoint import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.dequantize import dequantize_checkpoint
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.families import load_config
from fp4convert.megatron import validate_export_files
from fp4convert.plan import build_plan
from fp4convert.verify.checkpoint import verify_checkpoint

CASES = [
    ("fp8", NVFP4_EXPERTS, "modelopt"),
    ("fp8", NVFP4_EXPERTS, "compressed-tensors"),
    ("fp8-128", MXFP8_ALL, "sglang-mxfp8"),
    ("ue8m0", MXFP8_ALL, "modelopt"),
]


@pytest.mark.parametrize(("kind", "contract", "dialect"), CASES)
def test_conversion_equals_converting_the_dequantized_master(source, tmp_path, kind, contract, dialect):
    fp8, master = source(kind), source(kind, dequantized=True)
    before = tree_hashes(fp8)
    convert_checkpoint(fp8, tmp_path / "from-fp8", contract=contract, dialect=dialect)
    convert_checkpoint(master, tmp_path / "from-bf16", contract=contract, dialect=dialect)
    assert assert_same_tensors(tmp_path / "from-fp8", tmp_path / "from-bf16") > 90
    assert tree_hashes(fp8) == before
    report = verify_checkpoint(tmp_path / "from-fp8", source=fp8)
    assert report.ok and report.compared_with_source, report.summary()


def test_manifest_records_source_formats_and_the_dequantizer(source, tmp_path):
    convert_checkpoint(source("fp8"), tmp_path / "out", contract=NVFP4_EXPERTS)
    manifest = json.loads((tmp_path / "out" / "fp4convert.json").read_text())
    assert set(manifest["source"]["formats"]) == {"dense", "fp8-block"}
    assert "weight_dequant" in manifest["source"]["dequantizers"]["fp8-block"]
    tensors = manifest["tensors"]
    assert tensors["model.layers.0.mlp.experts.0.up_proj.weight"]["source_format"] == "fp8-block"
    assert tensors["model.layers.0.mlp.experts.0.up_proj.weight"]["lossless"] is False
    assert tensors["model.norm.weight"]["source_format"] == "dense"
    # FP8 weights the contract keeps high precision come out as their dequantized BF16 (lossless)
    attention = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert (attention["format"], attention["source_dtype"], attention["lossless"]) == ("bf16", "bfloat16", True)


def test_tensors_kept_high_precision_in_the_source_pass_through(source, tmp_path):
    fp8 = source("fp8")
    convert_checkpoint(fp8, tmp_path / "out", contract=NVFP4_EXPERTS)
    out, stored = all_tensors(tmp_path / "out"), all_tensors(fp8)
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight"):
        assert stored[name].dtype == torch.bfloat16
        assert torch.equal(out[name].view(torch.int16), stored[name].view(torch.int16)), name
    q = out["model.layers.0.self_attn.q_proj.weight"]
    master = all_tensors(source("fp8", dequantized=True))["model.layers.0.self_attn.q_proj.weight"]
    assert q.dtype == torch.bfloat16 and torch.equal(q.view(torch.int16), master.view(torch.int16))


def test_plan_prices_what_the_source_stores(source):
    fp8 = source("fp8")
    inventory = open_checkpoint(fp8).inventory()
    plan = build_plan(load_contract(NVFP4_EXPERTS), inventory)
    row = next(p for p in plan.tensors if p.info.name == "model.layers.0.mlp.experts.0.down_proj.weight")
    stored = all_tensors(fp8)
    weight, scale = stored[row.info.name], stored[row.info.name + "_scale_inv"]
    assert row.info.source_format == "fp8-block" and row.info.dtype == "bfloat16"
    assert row.bytes_before == weight.numel() + 4 * scale.numel()
    assert row.to_dict()["source_format"] == "fp8-block" and row.to_dict()["lossless"] is False
    assert set(plan.by_source_format()) == {"dense", "fp8-block"}


def test_ue8m0_to_mxfp8_is_lossless_and_verify_proves_it(source, tmp_path):
    convert_checkpoint(source("ue8m0"), tmp_path / "out", contract=MXFP8_ALL)
    manifest = json.loads((tmp_path / "out" / "fp4convert.json").read_text())
    fp8_weights = {n: t for n, t in manifest["tensors"].items() if t["source_format"] == "fp8-block-ue8m0"}
    assert fp8_weights and all(t["lossless"] is True for t in fp8_weights.values())
    report = verify_checkpoint(tmp_path / "out", source=source("ue8m0"))
    proofs = [c for c in report.checks if c.check == "lossless"]
    assert report.ok and len(proofs) == sum(t["format"] == "mxfp8" for t in fp8_weights.values()) > 20
    assert all(c.ok and "bit for bit" in c.detail for c in proofs)


def test_arbitrary_fp32_scales_to_mxfp8_are_not_called_lossless(source, tmp_path):
    convert_checkpoint(source("fp8-128"), tmp_path / "out", contract=MXFP8_ALL)
    manifest = json.loads((tmp_path / "out" / "fp4convert.json").read_text())
    fp8_weights = [t for t in manifest["tensors"].values() if t["source_format"] == "fp8-block"]
    assert fp8_weights and all(t["lossless"] is False and "arbitrary FP32" in t["lossless_why"] for t in fp8_weights)
    report = verify_checkpoint(tmp_path / "out", source=source("fp8-128"))
    assert report.ok and not [c for c in report.checks if c.check == "lossless"]


def test_the_learner_master_is_the_dequantized_master(source, tmp_path):
    import_hf(source("fp8"), tmp_path / "from-fp8", contract=NVFP4_EXPERTS)
    import_hf(source("fp8", dequantized=True), tmp_path / "from-bf16", contract=NVFP4_EXPERTS)
    assert assert_same_tensors(tmp_path / "from-fp8", tmp_path / "from-bf16") > 10
    config = json.loads((tmp_path / "from-fp8" / "config.json").read_text())
    assert "quantization_config" not in config  # the output holds BF16 masters
    meta = json.loads((tmp_path / "from-fp8" / "megatron.json").read_text())
    assert meta["source"]["formats"] == {"dense": 17, "fp8-block": 39}


def test_sampler_and_learner_agree_byte_for_byte(source, tmp_path):
    # The sampler converted from the FP8 release and the learner imported from it: a live export of
    # the learner's master validates against the FP8 release as its master, and equals the converter.
    fp8 = source("fp8")
    import_hf(fp8, tmp_path / "megatron")
    megatron = all_tensors(tmp_path / "megatron")
    config = load_config(fp8)
    update = dict(export_hf(megatron, contract=NVFP4_EXPERTS, family="qwen3_moe", config=config))
    (tmp_path / "dump").mkdir()
    save_file({n: t.contiguous() for n, t in update.items()}, str(tmp_path / "dump" / "bucket.safetensors"))
    report = validate_export_files(tmp_path / "dump", fp8, contract=NVFP4_EXPERTS)
    assert report.ok, report.findings[:3]
    convert_checkpoint(fp8, tmp_path / "converted", contract=NVFP4_EXPERTS)
    converted = all_tensors(tmp_path / "converted")
    for name, tensor in update.items():
        assert torch.equal(tensor.reshape(-1).view(torch.uint8), converted[name].reshape(-1).view(torch.uint8)), name


def test_validate_export_reads_an_fp8_master_through_the_dequantizer(source, tmp_path):
    fp8 = source("fp8")
    convert_checkpoint(fp8, tmp_path / "converted", contract=NVFP4_EXPERTS)
    dump = tmp_path / "dump"
    dump.mkdir()
    converted = all_tensors(tmp_path / "converted")
    save_file(converted, str(dump / "bucket.safetensors"))
    assert validate_export_files(dump, fp8, contract=NVFP4_EXPERTS, include_input_scale=True).ok
    # The same dump checked against the raw FP8 bytes taken as BF16 would fail: the dequantizer is used.
    name = "model.layers.0.mlp.experts.0.down_proj.weight"
    converted[name] = converted[name] ^ 0x11
    save_file(converted, str(dump / "bucket.safetensors"))
    report = validate_export_files(dump, fp8, contract=NVFP4_EXPERTS, include_input_scale=True)
    assert not report.ok and report.findings[0].tensor == name


def test_dequantize_writes_the_one_dequantization(source, tmp_path):
    report = dequantize_checkpoint(source("fp8"), tmp_path / "out")
    assert report.source_formats == {"fp8-block": 39} and report.copied_tensors == 17
    assert assert_same_tensors(tmp_path / "out", source("fp8", dequantized=True)) == 56
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config


def test_reads_follow_the_data_and_hash_every_shard(source, tmp_path):
    # An FP8 source keeps its F32 scales apart from its weights: the shards are hashed from disk
    # on a thread of their own, and the manifest's source hashes are the files' own.
    import hashlib

    fp8 = source("fp8")
    convert_checkpoint(fp8, tmp_path / "out", contract=NVFP4_EXPERTS)
    manifest = json.loads((tmp_path / "out" / "fp4convert.json").read_text())
    for path in sorted(Path(fp8).glob("*.safetensors")):
        assert manifest["source"]["files"][path.name] == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["fp8", "ue8m0"])
def test_cuda_converts_an_fp8_source_to_the_same_bytes(source, tmp_path, kind):
    contract = NVFP4_EXPERTS if kind == "fp8" else MXFP8_ALL
    convert_checkpoint(source(kind), tmp_path / "cpu", contract=contract)
    convert_checkpoint(source(kind), tmp_path / "cuda", contract=contract, device="cuda")
    assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu")
    assert verify_checkpoint(tmp_path / "cuda", source=source(kind), device="cuda").ok


def test_the_model_card_says_which_tensors_are_lossless(source, tmp_path):
    from fp4convert.checkpoint.manifest import read_manifest
    from fp4convert.publish.card import render_card

    convert_checkpoint(source("ue8m0"), tmp_path / "out", contract=MXFP8_ALL)
    card = render_card(read_manifest(tmp_path / "out"), repo_id="me/tiny-mxfp8", verification="OK")
    section = card.split("## Source formats, and what is lossless", 1)[1].split("\n## ", 1)[0]
    assert "weight_dequant" in section  # the dequantizer's definition
    row = next(line for line in section.splitlines() if line.startswith("| `fp8-block-ue8m0` | mxfp8 |"))
    assert "| lossless |" in row and "power-of-two block scales" in row
    plain = tmp_path / "plain"
    convert_checkpoint(source("fp8", dequantized=True), plain, contract=MXFP8_ALL)
    assert "## Source formats" not in render_card(read_manifest(plain), repo_id="me/x", verification="OK")
