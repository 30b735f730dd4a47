"""gpt-oss as published: MXFP4 fused experts (openai/gpt-oss-20b) and the BF16 fused form transformers saves.

The tiny model is transformers' own ``GptOssForCausalLM``; ``save_pretrained`` writes the BF16
fused layout every BF16 gpt-oss release has (``mlp.experts.gate_up_proj [E, H, 2I]``, gate and up
interleaved on the last axis, ``gate_up_proj_bias [E, 2I]``, ``down_proj [E, I, H]``,
``down_proj_bias [E, H]``; router weight and bias, attention sinks, q/k/v/o biases). The MXFP4
release is made from it here as openai's checkpoint stores it: ``*_blocks`` U8 ``[E, out, in/32,
16]`` and ``*_scales`` U8 ``[E, out, in/32]`` (``out`` = the 2I interleaved gate/up rows, or H),
biases BF16, two shards with an index, and openai's ``quantization_config``. The per-expert BF16
masters are derived by independent code (tests/_sources.py's bit-level MXFP4 decoder, then the
interleave undone as transformers' ``GptOssExperts`` reads it: ``gate_up[..., ::2]`` gate,
``[..., 1::2]`` up); every command's output on the release is compared byte for byte with the
same command on the master.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _helpers import CONTRACTS, MXFP8_ALL, NVFP4_EXPERTS
from _sources import all_tensors, assert_same_tensors, quantize_mxfp4, reference_mxfp4_dequant
from families.tiny import build_model, unfuse_gpt_oss
from safetensors.torch import save_file
from sources.cli_run import run

transformers = pytest.importorskip("transformers")

#: openai/gpt-oss-20b's quantization_config, as published
GPT_OSS_QUANTIZATION = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}
CASES = [
    ("nvfp4-experts-per-token", "modelopt"),
    ("nvfp4-experts-per-token", "compressed-tensors"),
    ("nvfp4-experts-per-token-last15pct-bf16", "modelopt"),
    ("nvfp4-experts-per-token-dequantized-backward", "modelopt"),
    ("mxfp8-end-to-end", "sglang-mxfp8"),
]


def _save(directory: Path, tensors: dict[str, torch.Tensor], config: dict, shards: int = 1) -> Path:
    """Write ``tensors`` as ``shards`` safetensors files (with an index when more than one)."""
    directory.mkdir(parents=True)
    names = list(tensors)
    size = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        file = "model.safetensors" if shards == 1 else f"model-{index:05d}-of-{shards:05d}.safetensors"
        chunk = {n: tensors[n].contiguous() for n in names[index * size : (index + 1) * size]}
        save_file(chunk, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, file))
    if shards > 1:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def _mxfp4_master(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert BF16 tensors of an MXFP4 gpt-oss checkpoint, decoded from the format's definition."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in stored.items():
        if name.endswith("_scales"):
            continue
        head, _, leaf = name.rpartition(".mlp.experts.")
        if not head:
            out[name] = tensor
            continue
        stem = f"{head}.mlp.experts."
        if leaf.endswith("_blocks"):
            values = reference_mxfp4_dequant(tensor, stored[name.replace("_blocks", "_scales")])  # [E, out, in]
            for e in range(values.shape[0]):
                if leaf == "gate_up_proj_blocks":  # rows g0, u0, g1, u1 ... as GptOssExperts reads them
                    out[f"{stem}{e}.gate_proj.weight"] = values[e, 0::2].clone()
                    out[f"{stem}{e}.up_proj.weight"] = values[e, 1::2].clone()
                else:
                    out[f"{stem}{e}.down_proj.weight"] = values[e].clone()
        elif leaf == "gate_up_proj_bias":
            for e in range(tensor.shape[0]):
                out[f"{stem}{e}.gate_proj.bias"] = tensor[e, 0::2].clone()
                out[f"{stem}{e}.up_proj.bias"] = tensor[e, 1::2].clone()
        elif leaf == "down_proj_bias":
            for e in range(tensor.shape[0]):
                out[f"{stem}{e}.down_proj.bias"] = tensor[e].clone()
        else:
            raise AssertionError(f"unexpected gpt-oss expert tensor {name}")
    return out


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``bf16``: transformers' save (the BF16 fused release layout); ``bf16-master``: its per-expert form
    (tests/families/tiny.py's ``unfuse_gpt_oss``); ``mxfp4``: the release as openai ships it;
    ``mxfp4-master``: that release decoded independently, per expert."""
    root = tmp_path_factory.mktemp("gpt-oss")
    build_model("gpt_oss").save_pretrained(str(root / "bf16"))
    config = json.loads((root / "bf16" / "config.json").read_text())
    fused = all_tensors(root / "bf16")
    release: dict[str, torch.Tensor] = {}
    for name, tensor in fused.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # transformers holds [E, in, out]; the release stores [E, out, in/32, 16] (its mxfp4 integration
            # dequantizes and transposes back)
            release[name + "_blocks"], release[name + "_scales"] = quantize_mxfp4(tensor.transpose(1, 2))
        else:
            release[name] = tensor
    mx_config = {**config, "quantization_config": GPT_OSS_QUANTIZATION}
    return {
        "bf16": root / "bf16",
        "bf16-master": _save(root / "bf16-master", unfuse_gpt_oss(fused), config),
        "mxfp4": _save(root / "mxfp4", release, mx_config, shards=2),
        "mxfp4-master": _save(root / "mxfp4-master", _mxfp4_master(release), config),
    }


def test_the_release_is_laid_out_as_published(gpt_oss):
    stored = all_tensors(gpt_oss["mxfp4"])
    prefix = "model.layers.0.mlp.experts."
    shapes = {n.removeprefix(prefix): (t.dtype, tuple(t.shape)) for n, t in stored.items() if n.startswith(prefix)}
    assert shapes == {
        "gate_up_proj_blocks": (torch.uint8, (4, 64, 2, 16)),  # [E, 2I, H/32, 16]
        "gate_up_proj_scales": (torch.uint8, (4, 64, 2)),
        "gate_up_proj_bias": (torch.bfloat16, (4, 64)),
        "down_proj_blocks": (torch.uint8, (4, 64, 1, 16)),  # [E, H, I/32, 16]
        "down_proj_scales": (torch.uint8, (4, 64, 1)),
        "down_proj_bias": (torch.bfloat16, (4, 64)),
    }
    for name in ("self_attn.sinks", "mlp.router.weight", "mlp.router.bias", "self_attn.o_proj.bias"):
        assert stored[f"model.layers.1.{name}"].dtype == torch.bfloat16
    assert len(list(gpt_oss["mxfp4"].glob("*.safetensors"))) == 2


def test_transformers_reads_the_experts_as_the_master_has_them(gpt_oss):
    """transformers' own MXFP4 decoder (integrations/mxfp4.py) and GptOssExperts' ``[..., ::2]`` split
    give the per-expert master bit for bit: the interleave and orientation are transformers'."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    stored, master = all_tensors(gpt_oss["mxfp4"]), all_tensors(gpt_oss["mxfp4-master"])
    for layer in (0, 1):
        prefix = f"model.layers.{layer}.mlp.experts"
        gate_up = convert_moe_packed_tensors(
            stored[f"{prefix}.gate_up_proj_blocks"], stored[f"{prefix}.gate_up_proj_scales"]
        )
        down = convert_moe_packed_tensors(stored[f"{prefix}.down_proj_blocks"], stored[f"{prefix}.down_proj_scales"])
        assert gate_up.shape == (4, 64, 64) and down.shape == (4, 32, 64)  # transformers' [E, H, 2I], [E, I, H]
        for e in range(4):
            for leaf, value in (
                ("gate_proj", gate_up[e][..., ::2].t()),
                ("up_proj", gate_up[e][..., 1::2].t()),
                ("down_proj", down[e].t()),
            ):
                expected = master[f"{prefix}.{e}.{leaf}.weight"]
                assert torch.equal(value.contiguous().view(torch.int16), expected.view(torch.int16)), (layer, e, leaf)


@pytest.mark.parametrize("release", ["mxfp4", "bf16"])
@pytest.mark.parametrize(("contract", "dialect"), CASES)
def test_convert_equals_converting_the_per_expert_master(gpt_oss, tmp_path, capsys, release, contract, dialect):
    src, master = gpt_oss[release], gpt_oss[f"{release}-master"]
    for name, path in (("release", src), ("master", master)):
        code, out = run(
            ["convert", str(path), str(tmp_path / name), "--contract", contract, "--dialect", dialect], capsys
        )
        assert code == 0, out
    assert assert_same_tensors(tmp_path / "release", tmp_path / "master") > 70
    code, out = run(["verify", str(tmp_path / "release"), "--source", str(src), "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"], out
    # a live update made from the per-expert master, checked against the release as the BF16 master
    argv = ["validate-export", str(tmp_path / "master"), "--master", str(src), "--contract", contract]
    code, out = run([*argv, "--dialect", dialect, "--include-input-scale"], capsys)
    assert code == 0, out
    manifest = json.loads((tmp_path / "release" / "fp4convert.json").read_text())
    gate = manifest["tensors"]["model.layers.1.mlp.experts.3.gate_proj.weight"]
    bias = manifest["tensors"]["model.layers.1.mlp.experts.3.up_proj.bias"]
    layout = "fused-3d-interleaved" if release == "mxfp4" else "fused-3d-transposed-interleaved"
    assert gate["source_format"] == ("mxfp4+" if release == "mxfp4" else "dense+") + layout
    assert bias["source_format"] == f"dense+{layout}" and bias["format"] == "bf16"
    assert manifest["tensors"]["model.layers.0.self_attn.sinks"]["format"] == "bf16"


@pytest.mark.parametrize("release", ["mxfp4", "bf16"])
def test_dequantize_writes_the_per_expert_master(gpt_oss, tmp_path, capsys, release):
    code, out = run(["dequantize", str(gpt_oss[release]), str(tmp_path / "out")], capsys)
    assert code == 0, out
    assert assert_same_tensors(tmp_path / "out", gpt_oss[f"{release}-master"]) == 77


@pytest.mark.parametrize("release", ["mxfp4", "bf16"])
def test_to_megatron_equals_importing_the_master(gpt_oss, tmp_path, capsys, release):
    for name, path in (("release", gpt_oss[release]), ("master", gpt_oss[f"{release}-master"])):
        code, out = run(
            ["to-megatron", str(path), str(tmp_path / name), "--contract", "nvfp4-experts-per-token"], capsys
        )
        assert code == 0, out
    assert assert_same_tensors(tmp_path / "release", tmp_path / "master") == 53
    megatron = all_tensors(tmp_path / "release")
    assert megatron["decoder.layers.0.mlp.experts.linear_fc1.bias1"].shape == (64,)  # cat(gate, up) bias
    assert "decoder.layers.0.self_attention.core_attention.softmax_offset" in megatron


def test_plan_and_explain_read_the_release(gpt_oss, capsys):
    src = str(gpt_oss["mxfp4"])
    code, out = run(["plan", "nvfp4-experts-per-token", "--model", src, "--json"], capsys)
    assert code == 0, out
    plan = json.loads(out)
    assert plan["by_source_format"]["mxfp4+fused-3d-interleaved"]["tensors"] == 24
    assert plan["by_source_format"]["dense+fused-3d-interleaved"]["tensors"] == 24  # the expert biases
    rows = {row["name"]: row for row in plan["tensors"]}
    assert rows["model.layers.0.mlp.experts.2.down_proj.weight"]["format"] == "nvfp4"
    assert rows["model.layers.0.mlp.router.weight"]["format"] == "bf16"
    code, out = run(["plan", str(MXFP8_ALL), "--model", src, "--json"], capsys)
    rows = {row["name"]: row for row in json.loads(out)["tensors"]}
    assert rows["model.layers.0.mlp.experts.2.down_proj.weight"]["lossless"] is True  # MXFP4 -> MXFP8
    name = "model.layers.1.mlp.experts.0.up_proj.weight"
    code, out = run(["explain", str(NVFP4_EXPERTS), name, "--model", src], capsys)
    assert code == 0 and "source: mxfp4+fused-3d-interleaved" in out, out
    code, out = run(["contract", "check", str(CONTRACTS / "nvfp4-experts-per-token.yaml"), "--model", src], capsys)
    assert code == 0 and "source mxfp4+fused-3d-interleaved: 24 tensors" in out, out


def test_an_mxfp4_release_without_its_declaration_is_refused(gpt_oss, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(gpt_oss["mxfp4"], src)
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    code, out = run(["convert", str(src), str(tmp_path / "out"), "--contract", "nvfp4-experts-per-token"], capsys)
    assert code != 0 and "declares no mxfp4 quantization_config" in out and "_proj_blocks" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("release", ["mxfp4", "bf16"])
@pytest.mark.parametrize("contract", [NVFP4_EXPERTS, MXFP8_ALL])
def test_cuda_converts_the_release_to_the_cpu_bytes(gpt_oss, tmp_path, release, contract):
    from fp4convert.convert.execute import convert_checkpoint
    from fp4convert.verify.checkpoint import verify_checkpoint

    convert_checkpoint(gpt_oss[release], tmp_path / "cpu", contract=contract)
    convert_checkpoint(gpt_oss[release], tmp_path / "cuda", contract=contract, device="cuda")
    assert assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu") > 70
    assert verify_checkpoint(tmp_path / "cuda", source=gpt_oss[release], device="cuda").ok
