"""Megatron-Core (0.16.1, its own venv) builds a real GPTModel on the CPU that loads ``to-megatron`` output.

For each family Megatron-Core's local spec builds here (Llama; Qwen3 with tied and with untied
embeddings; Qwen3-MoE with SequentialMLP experts and a dense layer; Mixtral; Qwen2-MoE with its
gated shared expert, q/k/v biases and a dense layer; GLM-4.5 with q/k/v biases, q/k norm, a dense
first layer, shared experts and sigmoid routing with the expert bias; DeepSeek-V3's MLA as Kimi-K2
configures it (q-LoRA, one dense layer, a shared expert) and without q-LoRA; gpt-oss with learnable
softmax offsets, biased experts and the clamped quick-GELU GLU) ``megatron_probe.py`` builds the
``GPTModel``, loads the output of ``to-megatron --spec local --megatron-version 0.16.1`` with
``load_state_dict(strict=True)``, and computes logits that must equal transformers' to 1e-4 (both in
float32 from the same BF16 weights). Then ``export_hf`` over that live model's ``named_parameters()``
(names and bytes as the model holds them, in its order, plus the routers' ``expert_bias`` buffers)
must equal what ``fp4convert convert`` writes, byte for byte.

Not covered here: the MTP layers (DeepSeek-V3's, GLM-4.5's; Megatron-Core 0.16's MTP block is not
built by this probe); MiniMax-M2 (its full-width q/k norm is Megatron-Bridge's layer spec, not
Megatron-Core's); Qwen3-Next (no Megatron mapping); and Megatron-Core 0.17+ (Python 3.12 only, with
no CPU torch wheel for it on these machines). Their spellings are tested without the
engine in tests/families/test_spelling.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal
from conftest import _build_model
from engines.envs import engine_python, run_in_env
from families.tiny import FAMILY_MODELS, transformers_view, unfuse_gpt_oss
from families.tiny import build_model as build_family_model
from safetensors.torch import load_file, save_file

from fp4convert import convert_checkpoint, export_hf
from fp4convert.families import MegatronSpelling, load_config
from fp4convert.megatron import import_hf

HERE = Path(__file__).parent
DENSE_CONTRACT = HERE / "data" / "nvfp4-linears-per-token.yaml"
LOCAL_016 = MegatronSpelling.parse("local", megatron_version="0.16.1")

#: case -> (tiny model key, config overrides, contract, family); keys of tests/conftest.py's models,
#: or of tests/families/tiny.py's for the families added with issue 12.
CASES = {
    "llama": ("llama", {}, DENSE_CONTRACT, "llama"),
    "qwen3-tied": ("qwen3", {}, DENSE_CONTRACT, "qwen3"),
    "qwen3-untied": ("qwen3", {"tie_word_embeddings": False}, DENSE_CONTRACT, "qwen3"),
    "qwen3-moe-sequential": ("qwen3_moe", {}, NVFP4_EXPERTS, "qwen3_moe"),
    "mixtral": ("mixtral", {}, NVFP4_EXPERTS, "mixtral"),
    "qwen2-moe-shared-gate": ("qwen2_moe", {}, NVFP4_EXPERTS, "qwen2_moe"),
    # GLM-4.5 without its MTP layer (Megatron-Core 0.16's MTP block is not built here).
    "glm4-moe": ("glm4_moe", {"num_nextn_predict_layers": 0}, NVFP4_EXPERTS, "glm4_moe"),
    # gpt-oss with plain RoPE (YaRN is a position-embedding choice, not a weight) and a prompt shorter
    # than its sliding window, so every layer attends alike.
    # Kimi-K2 is DeepSeek-V3's architecture: MLA with q-LoRA, a dense first layer, a shared expert.
    "kimi-k2-mla": ("kimi_k2", {}, NVFP4_EXPERTS, "deepseek_v3"),
    "deepseek-v3-mla-no-q-lora": ("deepseek_v3_no_q_lora", {}, NVFP4_EXPERTS, "deepseek_v3"),
    "gpt-oss": (
        "gpt_oss",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
        NVFP4_EXPERTS,
        "gpt_oss",
    ),
}


def _routers_in_bf16(source: Path) -> None:
    """GLM's and DeepSeek's published router weights are BF16; transformers keeps (and saves) them in
    float32, which a BF16 Megatron-Core router would round. Store them as published."""
    path = source / "model.safetensors"
    tensors = load_file(str(path))
    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        tensors[name] = tensors[name].to(torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _unfuse_in_place(source: Path) -> None:
    """gpt-oss experts one tensor per projection, the layout the family names (tests/families/tiny.py)."""
    path = source / "model.safetensors"
    save_file(unfuse_gpt_oss(load_file(str(path))), str(path), metadata={"format": "pt"})


def _build(key: str, **overrides: object) -> torch.nn.Module:
    return build_family_model(key, 0, **overrides) if key in FAMILY_MODELS else _build_model(key, 0, **overrides)


@pytest.fixture(scope="module")
def megatron_env() -> str:
    return str(engine_python("megatron"))


def _read(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


@pytest.mark.parametrize("case", list(CASES))
def test_real_gpt_model_loads_to_megatron_output_and_exports_the_converter_bytes(case, megatron_env, tmp_path) -> None:
    key, overrides, contract, family = CASES[case]
    source = tmp_path / "hf"
    _build(key, **overrides).save_pretrained(str(source))
    reference: list[str] = []
    if family in ("glm4_moe", "deepseek_v3"):
        _routers_in_bf16(source)
    if family == "gpt_oss":  # transformers reads the fused original; fp4convert the per-expert layout
        reference = [str(tmp_path / "hf-fused")]
        shutil.copytree(source, reference[0])
        _unfuse_in_place(source)
    if key == "kimi_k2":  # saved as Kimi-K2 names it (model_type kimi_k2); transformers reads DeepSeek-V3
        config_path = source / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "model_type": "kimi_k2"}))
        reference = [str(transformers_view(source, tmp_path / "hf-deepseek"))]
    megatron_dir = tmp_path / "megatron"
    import_hf(source, megatron_dir, spelling=LOCAL_016)

    probe = [str(source), str(megatron_dir), str(tmp_path / "out"), *reference]
    done = run_in_env("megatron", HERE / "megatron_probe.py", *probe)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    order = json.loads((tmp_path / "out" / "order.json").read_text())
    assert order["missing"] == [] and order["unexpected"] == []

    logits = load_file(str(tmp_path / "out" / "logits.safetensors"))
    difference = (logits["megatron"] - logits["transformers"]).abs().max().item()
    print(f"{case}: max |Megatron-Core logits - transformers logits| = {difference:.2e}")
    assert logits["megatron"].shape == logits["transformers"].shape
    assert difference <= 1e-4

    named = load_file(str(tmp_path / "out" / "named_parameters.safetensors"))
    config = load_config(source)
    live = [(name, named[name]) for name in order["order"]]
    exported = dict(export_hf(live, contract=contract, family=family, config=config, dialect="modelopt"))
    converted = tmp_path / "converted"
    convert_checkpoint(source, converted, contract=contract, dialect="modelopt")
    expected = {n: t for n, t in _read(converted).items() if not n.endswith(".input_scale")}
    assert sorted(exported) == sorted(expected)
    # Megatron-Core's local-spec RMSNorm keeps its weight in float32 inside a BF16 model, and export_hf
    # passes BF16-format tensors through in the live dtype: the norms arrive as F32 holding the same
    # values. Everything else, and every quantized byte, is identical.
    float32_norms = sorted(n for n, t in exported.items() if t.dtype != expected[n].dtype)
    print(f"{case}: exported in the live model's float32: {float32_norms}")
    assert all(n.endswith("norm.weight") and exported[n].dtype == torch.float32 for n in float32_norms)
    for name, tensor in expected.items():
        assert_bytes_equal(exported[name].to(tensor.dtype), tensor)
        if name not in float32_norms:
            assert_bytes_equal(exported[name], tensor)
