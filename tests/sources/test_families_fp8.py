"""FP8 block-scaled releases of the families that ship them: Kimi-K2, MiniMax-M2, Qwen3 ``-FP8`` (MoE and
dense), each with its release's own ``quantization_config``; and GLM-4.5-FP8, a compressed-tensors release,
refused with the way out. (DeepSeek-V3: tests/sources/test_deepseek.py.)

Each source is a tiny family checkpoint (transformers' own classes) whose Linear weights are made
FP8 E4M3 with 128x128 ``weight_scale_inv`` blocks, as the releases store them (routers, embeddings,
lm_head and norms stay BF16), by tests/_sources.py's independent quantizer; its master is the
bit-level reference dequantization. Every command's output on the release equals its output on
the master byte for byte, and ``verify --source`` re-derives it from the release.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _sources import (
    all_tensors,
    assert_same_tensors,
    fp8_checkpoint,
    fp8_dequantized,
    quantize_fp8_block,
    reference_fp8_dequant,
)
from families.tiny import build_family_checkpoint
from safetensors.torch import save_file
from sources.cli_run import run

#: family key -> (tiny fixture, the release's quantization_config as its config.json spells it)
RELEASES: dict[str, tuple[str, dict]] = {
    # moonshotai/Kimi-K2-Instruct (model_type kimi_k2, DeepseekV3ForCausalLM)
    "kimi_k2": (
        "family",
        {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    ),
    # MiniMaxAI/MiniMax-M2: torch's dtype name for fmt, and the modules it keeps high-precision
    "minimax_m2": (
        "family",
        {
            "activation_scheme": "dynamic",
            "fmt": "float8_e4m3fn",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
        },
    ),
    # Qwen/Qwen3-30B-A3B-FP8 and Qwen/Qwen3-8B-FP8
    "qwen3_moe": (
        "tiny",
        {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    ),
    "qwen3": (
        "tiny",
        {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    ),
}
_HIGH = ("embed_tokens", "lm_head", "norm", "shared_head.head")


def is_release_fp8(name: str, tensor: torch.Tensor) -> bool:
    """The releases' FP8 tensors: 2-D Linear weights but embeddings, lm_head, norms and routers (``*.gate``)."""
    return (
        tensor.dim() == 2
        and name.endswith(".weight")
        and not name.endswith(".gate.weight")
        and not any(k in name for k in _HIGH)
    )


@pytest.fixture(scope="module")
def family_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """tests/families' tiny checkpoints (tests/families/tiny.py), built here for this module."""
    built: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in built:
            built[key] = build_family_checkpoint(key, tmp_path_factory.mktemp(f"family-{key}"))
        return built[key]

    return get


@pytest.fixture(scope="module")
def release(family_checkpoint, tiny_checkpoint, tmp_path_factory) -> Callable[[str], tuple[Path, Path]]:
    """``release(key) -> (fp8 release, its independently dequantized master)``."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(key: str) -> tuple[Path, Path]:
        if key not in cache:
            fixture, quantization = RELEASES[key]
            bf16 = family_checkpoint(key) if fixture == "family" else tiny_checkpoint(key)
            root = tmp_path_factory.mktemp(f"fp8-{key}")
            fp8 = fp8_checkpoint(bf16, root / "fp8", which=is_release_fp8)
            config = json.loads((fp8 / "config.json").read_text())
            (fp8 / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}, indent=2))
            cache[key] = (fp8, fp8_dequantized(fp8, root / "master"))
        return cache[key]

    return get


def _mxfp8(key: str) -> str:
    return "deepseek-v3-mxfp8-mla-bf16" if key == "kimi_k2" else "mxfp8-end-to-end"


@pytest.mark.parametrize("key", list(RELEASES))
def test_the_release_converts_as_its_dequantized_master(release, tmp_path, capsys, key):
    fp8, master = release(key)
    stored = all_tensors(fp8)
    scales = [n for n in stored if n.endswith("_scale_inv")]
    assert len(scales) > 10 and all(stored[n].dtype == torch.float32 for n in scales)
    assert not any(n.endswith(".gate.weight_scale_inv") or "lm_head" in n for n in scales)  # routers stay BF16
    cases = [("nvfp4-experts-per-token", "modelopt"), (_mxfp8(key), "sglang-mxfp8")]
    if key == "qwen3":  # dense: no experts for the expert contract to quantize
        cases = [("mxfp8-end-to-end", "sglang-mxfp8"), ("mxfp8-end-to-end", "compressed-tensors")]
    for contract, dialect in cases:
        out = tmp_path / f"{contract}-{dialect}"
        for name, path in (("release", fp8), ("master", master)):
            argv = ["convert", str(path), str(out / name), "--contract", contract, "--dialect", dialect]
            code, text = run(argv, capsys)
            assert code == 0, text
        assert assert_same_tensors(out / "release", out / "master") > 20
        code, text = run(["verify", str(out / "release"), "--source", str(fp8), "--json"], capsys)
        assert code == 0 and json.loads(text)["ok"], text
    manifest = json.loads((tmp_path / f"{cases[0][0]}-{cases[0][1]}" / "release" / "fp4convert.json").read_text())
    assert "fp8-block" in manifest["source"]["dequantizers"]
    formats = {t["source_format"] for t in manifest["tensors"].values()}
    assert formats == {"fp8-block", "dense"}


@pytest.mark.parametrize("key", ["kimi_k2", "minimax_m2", "qwen3_moe"])
def test_the_learner_import_equals_the_import_of_the_master(release, tmp_path, capsys, key):
    fp8, master = release(key)
    for name, path in (("release", fp8), ("master", master)):
        code, text = run(
            ["to-megatron", str(path), str(tmp_path / name), "--contract", "nvfp4-experts-per-token"], capsys
        )
        assert code == 0, text
    assert assert_same_tensors(tmp_path / "release", tmp_path / "master") > 10


def test_plan_counts_the_fp8_tensors_of_each_release(release, capsys):
    for key in RELEASES:
        fp8, _ = release(key)
        code, text = run(["plan", "mxfp8-end-to-end", "--model", str(fp8), "--json"], capsys)
        assert code == 0, text
        stored = all_tensors(fp8)
        expected = sum(1 for n in stored if n.endswith("_scale_inv"))
        assert json.loads(text)["by_source_format"]["fp8-block"]["tensors"] == expected, key


def test_dequantize_of_a_release_is_its_master(release, tmp_path, capsys):
    fp8, master = release("minimax_m2")
    code, text = run(["dequantize", str(fp8), str(tmp_path / "out")], capsys)
    assert code == 0, text
    assert assert_same_tensors(tmp_path / "out", master) > 20


#: zai-org/GLM-4.5-FP8 / -Air-FP8 are llm-compressor releases: compressed-tensors, format float-quantized,
#: E4M3 weights with one static scale per output row, dynamic per-token activations; lm_head and the
#: routers (mlp.gate) left out
GLM_FP8_QUANTIZATION = {
    "config_groups": {
        "group_0": {
            "input_activations": {
                "dynamic": True,
                "num_bits": 8,
                "strategy": "token",
                "symmetric": True,
                "type": "float",
            },
            "targets": ["Linear"],
            "weights": {"dynamic": False, "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "float"},
        }
    },
    "format": "float-quantized",
    "ignore": ["lm_head", *[f"model.layers.{n}.mlp.gate" for n in range(1, 4)]],
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}


@pytest.fixture(scope="module")
def glm_fp8(family_checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """GLM-4.5-FP8 as stored: ``X.weight`` F8_E4M3 + ``X.weight_scale`` F32 ``[out, 1]``; and its master
    (tests/_sources.py's reference cast with one block per row)."""
    bf16 = family_checkpoint("glm4_moe")
    root = tmp_path_factory.mktemp("glm-fp8")
    src, master = root / "GLM-4.5-FP8", root / "master"
    src.mkdir()
    master.mkdir()
    config = json.loads((bf16 / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": GLM_FP8_QUANTIZATION}, indent=2))
    (master / "config.json").write_text(json.dumps(config, indent=2))
    stored, decoded = {}, {}
    for name, tensor in all_tensors(bf16).items():
        if is_release_fp8(name, tensor):
            codes, scale = quantize_fp8_block(tensor, (1, tensor.shape[1]))  # one float32 scale per row
            stored[name], stored[name[: -len("weight")] + "weight_scale"] = codes, scale
            decoded[name] = reference_fp8_dequant(codes, scale, (1, tensor.shape[1]))
        else:
            stored[name] = decoded[name] = tensor
    save_file(stored, str(src / "model.safetensors"), metadata={"format": "pt"})
    save_file(decoded, str(master / "model.safetensors"), metadata={"format": "pt"})
    return src, master


def test_glm_fp8_converts_as_its_dequantized_master(glm_fp8, tmp_path, capsys):
    src, master = glm_fp8
    stored = all_tensors(src)
    scale = stored["model.layers.1.mlp.experts.2.up_proj.weight_scale"]
    assert scale.dtype == torch.float32 and scale.shape == (32, 1)
    assert stored["model.layers.1.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.layers.1.mlp.gate.weight"].dtype != torch.float8_e4m3fn  # the router, as saved
    for contract, dialect in (("nvfp4-experts-per-token", "modelopt"), ("mxfp8-end-to-end", "sglang-mxfp8")):
        out = tmp_path / contract
        for name, path in (("release", src), ("master", master)):
            argv = ["convert", str(path), str(out / name), "--contract", contract, "--dialect", dialect]
            code, text = run(argv, capsys)
            assert code == 0, text
        assert assert_same_tensors(out / "release", out / "master") > 100
        code, text = run(["verify", str(out / "release"), "--source", str(src), "--json"], capsys)
        assert code == 0 and json.loads(text)["ok"], text
    manifest = json.loads((tmp_path / "nvfp4-experts-per-token" / "release" / "fp4convert.json").read_text())
    assert "compressed-tensors" in manifest["source"]["dequantizers"]["fp8-channel"]
    assert manifest["tensors"]["model.layers.3.eh_proj.weight"]["source_format"] == "fp8-channel"  # MTP glue
    for name, path in (("release", src), ("master", master)):
        assert run(["to-megatron", str(path), str(tmp_path / "megatron" / name)], capsys)[0] == 0
    assert assert_same_tensors(tmp_path / "megatron" / "release", tmp_path / "megatron" / "master") > 10
    assert run(["dequantize", str(src), str(tmp_path / "bf16")], capsys)[0] == 0
    assert assert_same_tensors(tmp_path / "bf16", master) > 100
    code, text = run(["plan", "mxfp8-end-to-end", "--model", str(src), "--json"], capsys)
    decoder = sum(1 for n in stored if n.endswith(".weight_scale") and not n.startswith("model.layers.3."))
    assert json.loads(text)["by_source_format"]["fp8-channel"]["tensors"] == decoder  # the MTP layer apart


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda g: g["weights"].update(strategy="tensor"), "config_groups.group_0.weights"),
        (lambda g: g["input_activations"].update(dynamic=False), "config_groups.group_0.input_activations.dynamic"),
    ],
)
def test_compressed_tensors_fp8_that_is_not_read_is_refused_with_the_way_out(glm_fp8, tmp_path, capsys, change, field):
    src = tmp_path / "src"
    src.mkdir()
    config = json.loads((glm_fp8[0] / "config.json").read_text())
    change(config["quantization_config"]["config_groups"]["group_0"])
    (src / "config.json").write_text(json.dumps(config))
    (src / "model.safetensors").write_bytes((glm_fp8[0] / "model.safetensors").read_bytes())
    code, text = run(["convert", str(src), str(tmp_path / "out"), "--contract", "nvfp4-experts-per-token"], capsys)
    assert code != 0 and f"quantization_config.{field} is" in text, text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["scale", "wrong-shape", "nan"])
def test_a_channel_scale_missing_or_misshapen_is_named(glm_fp8, tmp_path, capsys, missing):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text((glm_fp8[0] / "config.json").read_text())
    stored = all_tensors(glm_fp8[0])
    name = "model.layers.2.self_attn.o_proj.weight_scale"
    if missing == "scale":
        del stored[name]
    elif missing == "nan":
        stored[name][5, 0] = float("nan")
    else:
        stored[name] = stored[name].reshape(1, -1).contiguous()
    save_file(stored, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, text = run(["convert", str(src), str(tmp_path / "out"), "--contract", "nvfp4-experts-per-token"], capsys)
    expected = {"scale": "has no", "wrong-shape": "per output row", "nan": "is not a finite positive number"}[missing]
    assert code != 0 and "o_proj.weight" in text and expected in text, text
    assert not (tmp_path / "out").exists()


def test_an_fp4convert_mxfp8_output_is_still_sent_to_dequantize(release, tmp_path, capsys):
    # fp4convert's compressed-tensors MXFP8 (format mxfp8-quantized, 8-bit float weights) is no FP8 release
    fp8, _ = release("qwen3")
    out = tmp_path / "ct"
    argv = ["convert", str(fp8), str(out), "--contract", "mxfp8-end-to-end", "--dialect", "compressed-tensors"]
    assert run(argv, capsys)[0] == 0
    code, text = run(["convert", str(out), str(tmp_path / "again"), "--contract", "mxfp8-end-to-end"], capsys)
    assert code != 0 and "already a converted checkpoint" in text and "fp4convert dequantize" in text, text


def test_contract_check_warns_that_row_scaled_fp8_to_mxfp8_is_lossy(glm_fp8, capsys):
    code, text = run(["contract", "check", "mxfp8-end-to-end", "--model", str(glm_fp8[0])], capsys)
    assert code == 0 and "lossy-fp8-requantize" in text and "source fp8-channel:" in text, text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reads_and_converts_the_channel_release_to_the_cpu_bytes(glm_fp8, tmp_path):
    from fp4convert.checkpoint.decode.dequant import dequantize_fp8_channel
    from fp4convert.convert.execute import convert_checkpoint
    from fp4convert.verify.checkpoint import verify_checkpoint

    src, _ = glm_fp8
    stored = all_tensors(src)
    name = "model.layers.1.mlp.experts.0.down_proj.weight"
    cpu = dequantize_fp8_channel(stored[name], stored[name + "_scale"])
    cuda = dequantize_fp8_channel(stored[name].cuda(), stored[name + "_scale"].cuda())
    assert torch.equal(cuda.cpu().view(torch.int16), cpu.view(torch.int16))
    convert_checkpoint(src, tmp_path / "cpu", contract="nvfp4-experts-per-token")
    convert_checkpoint(src, tmp_path / "cuda", contract="nvfp4-experts-per-token", device="cuda")
    assert assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu") > 100
    assert verify_checkpoint(tmp_path / "cuda", source=src, device="cuda").ok


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("key", ["kimi_k2", "minimax_m2"])
def test_cuda_converts_the_release_to_the_cpu_bytes(release, tmp_path, key):
    from fp4convert.convert.execute import convert_checkpoint
    from fp4convert.verify.checkpoint import verify_checkpoint

    fp8, _ = release(key)
    convert_checkpoint(fp8, tmp_path / "cpu", contract="nvfp4-experts-per-token")
    convert_checkpoint(fp8, tmp_path / "cuda", contract="nvfp4-experts-per-token", device="cuda")
    assert assert_same_tensors(tmp_path / "cuda", tmp_path / "cpu") > 50
    assert verify_checkpoint(tmp_path / "cuda", source=fp8, device="cuda").ok
