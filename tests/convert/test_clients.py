"""Real clients: transformers loads what fp4convert writes.

* Dense: transformers + compressed-tensors load the compressed-tensors NVFP4 output of a tiny Llama
  on CPU; its logits stay close to the BF16 model's.
* MoE: transformers 5 fuses experts into 3-D parameters in memory and does not map per-expert
  compressed-tensors NVFP4 weights onto them (it loads without error and computes garbage), so
  MoE checkpoints take the ``dequantize`` route, tested here.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _helpers import NVFP4_EXPERTS, assert_bytes_equal
from safetensors.torch import load_file

from fp4convert.contract import parse_contract
from fp4convert.convert.dequantize import dequantize_checkpoint
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, unpack_fp4

transformers = pytest.importorskip("transformers")

ALL_LINEAR = parse_contract(
    """version: 1
name: nvfp4-all-linear
formats: {nvfp4: {per_token_activations: true}}
rules: [{kind: glob, namespace: hf, pattern: "model.layers.*", format: nvfp4}]
default: bf16
bf16_exceptions: {lm_head: true, routers: true}
"""
)


def _logit_agreement(model_a, model_b) -> tuple[float, float]:
    ids = torch.randint(0, model_a.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model_a(ids).logits.float(), model_b(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
    return cosine, ((a - b).norm() / b.norm()).item()


# Small shapes shared by both test models.
_SMALL = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "tie_word_embeddings": False}  # fmt: skip


def _saved_model(tmp_path_factory, name: str, config_class: str, model_class: str, **extra):
    """A tiny model with transformers' own init (std 0.02, a realistic weight distribution), saved."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**_SMALL, **extra)
    model = getattr(transformers, model_class)(config).to(torch.bfloat16).eval()
    path = tmp_path_factory.mktemp(name) / "bf16"
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return _saved_model(tmp_path_factory, "llama", "LlamaConfig", "LlamaForCausalLM")


def test_transformers_loads_compressed_tensors_dense_nvfp4_on_cpu(tiny_llama, tmp_path):
    model, src = tiny_llama
    convert_checkpoint(src, tmp_path / "ct", contract=ALL_LINEAR, dialect="compressed-tensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "ct", quantization_config=transformers.CompressedTensorsConfig(dequantize=True)
        ).eval()
    weight = loaded.model.layers[0].mlp.down_proj.weight
    assert weight.dtype == torch.bfloat16 and weight.shape == (128, 256)
    cosine, rel = _logit_agreement(loaded, model)
    print(f"dense compressed-tensors NVFP4 (all decoder linears) vs BF16: logits cosine {cosine:.4f}, rel {rel:.3f}")
    assert cosine > 0.97


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    moe = {"moe_intermediate_size": 64, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2}
    return _saved_model(tmp_path_factory, "moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", **moe)


def test_moe_takes_the_dequantize_route(tiny_moe, tmp_path):
    model, src = tiny_moe
    convert_checkpoint(src, tmp_path / "nvfp4", contract=NVFP4_EXPERTS, dialect="modelopt")
    report = dequantize_checkpoint(tmp_path / "nvfp4", tmp_path / "bf16")
    assert report.nvfp4_modules == 2 * 4 * 3
    # The dequantized expert is exactly e2m1 * weight_scale * weight_scale_2, cast once to bf16.
    q = load_file(str(tmp_path / "nvfp4" / "model.safetensors"))
    d = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    name = "model.layers.1.mlp.experts.3.down_proj"
    values = e2m1_decode(unpack_fp4(q[f"{name}.weight"])).reshape(128, 4, 16)
    factor = e4m3_decode(q[f"{name}.weight_scale"].view(torch.uint8)) * q[f"{name}.weight_scale_2"]
    assert_bytes_equal(d[f"{name}.weight"], (values * factor.unsqueeze(-1)).reshape(128, 64).to(torch.bfloat16))
    assert not any(k.endswith(("weight_scale", "weight_scale_2", "input_scale")) for k in d)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16).eval()
    cosine, rel = _logit_agreement(loaded, model)
    print(f"MoE NVFP4 experts -> dequantized BF16 vs BF16: logits cosine {cosine:.4f}, rel {rel:.3f}")
    assert cosine > 0.97
