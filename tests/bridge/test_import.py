"""import_hf: HF -> Megatron-Core safetensors -> HF is byte-identical; output is atomic and described."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from _helpers import NVFP4_EXPERTS, tree_hashes
from bridge.helpers import assert_same_tensors

from fp4convert.bridge.files import SafetensorsFolder
from fp4convert.bridge.import_ import MEGATRON_MANIFEST, TE_PRECISION_FILE, import_hf
from fp4convert.contract import load_contract
from fp4convert.contract.emit import emit
from fp4convert.errors import ConversionError
from fp4convert.families import megatron_to_hf


def _read(directory) -> dict[str, torch.Tensor]:
    with SafetensorsFolder(directory) as folder:
        return {name: folder[name] for name in folder}


@pytest.mark.parametrize(
    ("model", "layout"),
    [("qwen3_moe", "grouped"), ("qwen3_moe", "sequential"), ("deepseek_v3", "grouped"), ("qwen3", "grouped")],
)
def test_hf_megatron_hf_round_trip_is_byte_identical(model, layout, tiny_checkpoint, hf_state, config, tmp_path):
    source = tiny_checkpoint(model)
    before = tree_hashes(source)
    report = import_hf(source, tmp_path / "megatron", expert_layout=layout)
    assert tree_hashes(source) == before  # the source is only read
    megatron = _read(tmp_path / "megatron")
    assert report.tensors == len(megatron) and report.source_tensors == len(hf_state(model))
    if layout == "sequential":
        assert any(".local_experts." in name for name in megatron)
    family = json.loads((tmp_path / "megatron" / MEGATRON_MANIFEST).read_text())["family"]
    assert_same_tensors(megatron_to_hf(megatron, family, config(model)), hf_state(model))


def test_an_ep_rank_gets_its_experts_under_local_ids(tiny_checkpoint, hf_state, config, tmp_path):
    import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "rank1", ep_rank=1, ep_size=2)
    megatron = _read(tmp_path / "rank1")
    experts = sorted({n.rsplit("weight", 1)[1] for n in megatron if ".experts.linear_fc" in n})
    assert experts == ["0", "1"]
    back = megatron_to_hf(megatron, "qwen3_moe", config("qwen3_moe"), ep_rank=1, ep_size=2)
    hf = hf_state("qwen3_moe")
    on_rank = {n: t for n, t in hf.items() if ".experts." not in n or n.split(".experts.")[1][0] in "23"}
    assert_same_tensors(back, on_rank)


def test_the_te_precision_file_and_manifest(tiny_checkpoint, tmp_path):
    report = import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "m", contract=NVFP4_EXPERTS, max_shard_size=20_000)
    out = tmp_path / "m"
    assert (out / TE_PRECISION_FILE).read_text() == emit(load_contract(NVFP4_EXPERTS), "te-yaml").text
    assert report.te_precision_file == TE_PRECISION_FILE and len(report.files) > 1  # sharded, with an index
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    manifest = json.loads((out / MEGATRON_MANIFEST).read_text())
    assert manifest["contract"]["name"] == "nvfp4-experts-per-token" and manifest["expert_layout"] == "grouped"
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (tiny_checkpoint("qwen3_moe") / "config.json").read_text()
    )
    with SafetensorsFolder(out) as folder:
        assert sorted(folder) == sorted(index) == sorted(manifest["tensors"])
        for name, entry in manifest["tensors"].items():
            assert index[name] == entry["file"]
            assert hashlib.sha256(folder[name].reshape(-1).view(torch.uint8).numpy()).hexdigest() == entry["sha256"]
    qkv = manifest["tensors"]["decoder.layers.0.self_attention.linear_qkv.weight"]["hf"]
    assert sorted(qkv) == [f"model.layers.0.self_attn.{p}_proj.weight" for p in "kqv"]


def test_the_output_appears_only_when_complete(tiny_checkpoint, tmp_path, monkeypatch):
    import fp4convert.bridge.import_ as module

    calls = {"n": 0}
    real = module.hf_to_megatron

    def failing(tensors, *args, **kwargs):
        if not next(iter(tensors.values())).is_meta:
            calls["n"] += 1
            if calls["n"] == 5:
                raise OSError("disk full")
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(module, "hf_to_megatron", failing)
    destination = tmp_path / "m"
    with pytest.raises(OSError, match="disk full"):
        import_hf(tiny_checkpoint("qwen3_moe"), destination)
    assert not destination.exists() and (tmp_path / "m.partial").is_dir()
    assert not list((tmp_path / "m.partial").glob("*.safetensors"))  # the unfinished file was removed
    monkeypatch.setattr(module, "hf_to_megatron", real)
    with pytest.raises(ConversionError, match=r"m\.partial holds an interrupted import; pass --overwrite"):
        import_hf(tiny_checkpoint("qwen3_moe"), destination)
    import_hf(tiny_checkpoint("qwen3_moe"), destination, overwrite=True)
    assert destination.is_dir() and not (tmp_path / "m.partial").exists()
    with pytest.raises(ConversionError, match=r"already exists; pass --overwrite to replace it"):
        import_hf(tiny_checkpoint("qwen3_moe"), destination)
