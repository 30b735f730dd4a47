"""import_hf / to-megatron: HF -> Megatron-named BF16 safetensors -> HF is byte-identical, the
precision files are the contract's, and the output is written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal

from fp4convert import import_hf
from fp4convert.contract import load_contract
from fp4convert.contract.emit import emit
from fp4convert.errors import ConversionError, MappingError
from fp4convert.families import hf_to_megatron, megatron_to_hf
from fp4convert.megatron.import_ import MANIFEST_NAME


@pytest.mark.parametrize("key", ["qwen3_moe", "deepseek_v3", "qwen3", "llama_attention_bias"])
@pytest.mark.parametrize("layout", ["grouped", "sequential"])
def test_hf_to_megatron_to_hf_is_byte_identical(key, layout, tiny_checkpoint, tmp_path, model, read_tensors):
    hf, _ = model(key)
    out = tmp_path / "megatron"
    report = import_hf(tiny_checkpoint(key), out, expert_layout=layout)
    written = read_tensors(out)
    config = json.loads((out / "config.json").read_text())
    # the files hold exactly what the family transforms make, under Megatron-Core names
    expected = hf_to_megatron(hf, report.family, config, expert_layout=layout)
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype
        assert_bytes_equal(written[name], tensor)
    back = megatron_to_hf(written, report.family, config)
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        assert back[name].dtype == tensor.dtype
        assert_bytes_equal(back[name], tensor)
    assert report.tensors == len(written) and report.source_tensors == len(hf)


def test_precision_files_are_the_contracts(tiny_checkpoint, tmp_path):
    out = tmp_path / "megatron"
    report = import_hf(tiny_checkpoint("deepseek_v3"), out, contract="deepseek-v3-mxfp8-mla-bf16")
    contract = load_contract("deepseek-v3-mxfp8-mla-bf16")
    assert (out / "te-precision.yaml").read_text() == emit(contract, "te-yaml").text
    assert (out / "megatron-args.txt").read_text() == emit(
        contract, "megatron-args", num_layers=3, num_mtp_layers=1
    ).text
    assert report.precision_files == ["megatron-args.txt", "te-precision.yaml"]
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["contract"]["name"] == "deepseek-v3-mxfp8-mla-bf16"
    assert manifest["family"] == "deepseek_v3" and manifest["expert_layout"] == "grouped"
    fc1 = manifest["tensors"]["decoder.layers.1.mlp.experts.linear_fc1.weight2"]
    assert fc1["hf"] == [
        "model.layers.1.mlp.experts.2.gate_proj.weight",
        "model.layers.1.mlp.experts.2.up_proj.weight",
    ]


def test_without_a_contract_no_precision_files(tiny_checkpoint, tmp_path):
    out = tmp_path / "megatron"
    import_hf(tiny_checkpoint("qwen3_moe"), out)
    assert not (out / "te-precision.yaml").exists()
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in names and "config.json" in names and MANIFEST_NAME in names
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(json.loads((out / MANIFEST_NAME).read_text())["tensors"])


def test_existing_destination_is_refused_unless_overwrite(tiny_checkpoint, tmp_path):
    out = tmp_path / "megatron"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(ConversionError, match=r"megatron already exists; pass overwrite=True \(--overwrite\)"):
        import_hf(tiny_checkpoint("qwen3_moe"), out)
    assert (out / "keep").read_text() == "x"
    import_hf(tiny_checkpoint("qwen3_moe"), out, overwrite=True, contract=NVFP4_EXPERTS)
    assert not (out / "keep").exists() and (out / "te-precision.yaml").exists()
    assert not out.with_name("megatron.partial").exists()


def test_a_failed_import_leaves_no_destination(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    source = tmp_path / "src"
    source.mkdir()
    original = tiny_checkpoint("deepseek_v3")
    for name in ("config.json", "model.safetensors"):
        (source / name).write_bytes((original / name).read_bytes())
    tensors = load_file(str(source / "model.safetensors"))
    # DeepSeek's MTP layer copies the embedding; a copy that differs cannot be one shared tensor
    tensors["model.layers.3.embed_tokens.weight"] = tensors["model.layers.3.embed_tokens.weight"] + 1
    save_file(tensors, str(source / "model.safetensors"))
    out = tmp_path / "megatron"
    with pytest.raises(MappingError, match=r"`model\.layers\.3\.embed_tokens\.weight` differs from"):
        import_hf(source, out)
    assert not out.exists()


def test_the_import_streams_one_megatron_tensor_at_a_time(tiny_checkpoint, tmp_path, monkeypatch):
    """Peak memory is one Megatron tensor's pieces: hf_to_megatron never sees more than one group."""
    import fp4convert.megatron.import_ as import_module

    seen: list[int] = []
    real = import_module.hf_to_megatron

    def spy(tensors, *args, **kwargs):
        if any(t.device.type != "meta" for t in tensors.values()):
            seen.append(len(tensors))
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(import_module, "hf_to_megatron", spy)
    report = import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "m")
    assert len(seen) == report.tensors and max(seen) == 3  # q, k, v of one linear_qkv


def test_megatron_tensors_keep_their_dtype(tiny_checkpoint, tmp_path, read_tensors):
    out = tmp_path / "megatron"
    import_hf(tiny_checkpoint("deepseek_v3"), out)
    written = read_tensors(out)
    assert written["decoder.layers.1.mlp.router.expert_bias"].dtype == torch.float32
    assert written["decoder.layers.1.mlp.experts.linear_fc1.weight0"].dtype == torch.bfloat16


def test_sequential_names(tiny_checkpoint, tmp_path, read_tensors):
    out = tmp_path / "megatron"
    import_hf(tiny_checkpoint("qwen3_moe"), out, expert_layout="sequential")
    assert "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight" in read_tensors(out)


def test_unknown_layout_is_refused(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"'stacked' is not a valid ExpertLayout"):
        import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "m", expert_layout="stacked")


def test_import_output_is_a_validate_export_master(tiny_checkpoint, tmp_path, model):
    from fp4convert import export_hf, validate_export
    from fp4convert.megatron import SafetensorsFolder

    out = tmp_path / "megatron"
    import_hf(tiny_checkpoint("qwen3_moe"), out)
    _, config = model("qwen3_moe")
    with SafetensorsFolder(out) as master:
        exported = dict(export_hf(dict(master), contract=NVFP4_EXPERTS, family=None, config=config))
        assert validate_export(exported, master, contract=NVFP4_EXPERTS, family=None, config=config).ok


def test_destination_inside_the_source_is_refused(tiny_checkpoint):
    source = tiny_checkpoint("qwen3_moe")
    with pytest.raises(ConversionError, match=r"overlaps the source"):
        import_hf(source, Path(source) / "inside")
