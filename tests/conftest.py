"""Shared fixtures: tiny real checkpoints written by transformers' own model classes.

``tiny_checkpoint(key) -> Path`` builds (once per session) a checkpoint directory with config.json
and safetensors written by ``save_pretrained``. Weights are deterministic (``torch.manual_seed``
style generator, every tensor redrawn so no two tensors are equal and norms are not all ones),
bfloat16, and every model is small (hidden 64, 2-3 layers, 4 experts) so suites stay fast on CPU.

Keys (see :data:`TINY_MODELS`): ``llama``, ``llama_attention_bias``, ``qwen2``, ``qwen3`` (tied
embeddings, explicit head_dim != hidden / heads), ``qwen3_moe`` (one dense layer via
``mlp_only_layers``, saved in shards with an index), ``deepseek_v3`` (MLA with q-LoRA, one dense
layer, shared experts, one MTP layer), ``deepseek_v3_no_q_lora``.

transformers does not build DeepSeek's MTP layer, so for ``deepseek_v3`` the fixture appends it in
the layout of the published checkpoint: the inner decoder layer is taken from a transformers model
one layer deeper (real transformers names and shapes), the glue (``enorm``, ``hnorm``, ``eh_proj``
``[H, 2H]``, ``shared_head.norm``) is drawn at the published shapes, and ``embed_tokens`` /
``shared_head.head`` are copies of the main embedding and lm_head (DeepSeek shares them).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# Shapes shared by the tiny models: 4 heads in 2 query groups (GQA), vocab 128, hidden 64.
_DENSE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
_DEEPSEEK = {
    **_DENSE,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "num_nextn_predict_layers": 1,
}

#: key -> (transformers config class, model class, config kwargs, save_pretrained kwargs)
TINY_MODELS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DENSE, {}),
    "llama_attention_bias": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**_DENSE, "num_key_value_heads": 1, "attention_bias": True},
        {},
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DENSE, {}),
    # head_dim 32 != hidden / heads = 16, and tied embeddings (like Qwen3-4B).
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_DENSE, "head_dim": 32, "tie_word_embeddings": True}, {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            **_DENSE,
            "num_hidden_layers": 3,
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mlp_only_layers": [1],
        },
        {"max_shard_size": "40KB"},  # several shards and an index
    ),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK, {}),
    "deepseek_v3_no_q_lora": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            **_DEEPSEEK,
            "num_hidden_layers": 2,
            "n_shared_experts": 2,
            "n_group": 1,
            "q_lora_rank": None,
            "num_nextn_predict_layers": 0,
        },
        {},
    ),
}

#: The family each tiny model belongs to.
TINY_FAMILY = {
    "llama": "llama",
    "llama_attention_bias": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v3_no_q_lora": "deepseek_v3",
}


def _redraw(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter and buffer with seeded normal draws (deterministic, all distinct)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in sorted(model.state_dict().items()):
            draw = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            tensor.copy_(draw.to(tensor.dtype))


def _build_model(key: str, seed: int, **overrides: Any) -> torch.nn.Module:
    import transformers

    config_class, model_class, kwargs, _ = TINY_MODELS[key]
    config = getattr(transformers, config_class)(**{**kwargs, **overrides})
    model = getattr(transformers, model_class)._from_config(config, dtype=torch.bfloat16)
    _redraw(model, seed)
    return model


def _append_deepseek_mtp(directory: Path, key: str, seed: int) -> None:
    """Add MTP layer ``num_hidden_layers`` to a saved single-file DeepSeek checkpoint (hub layout)."""
    from safetensors.torch import load_file, save_file

    kwargs = TINY_MODELS[key][2]
    num_layers, hidden = kwargs["num_hidden_layers"], kwargs["hidden_size"]
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    # The inner layer comes from disk, not state_dict(): transformers 5 fuses experts in memory
    # (3-D gate_up_proj) and only save_pretrained writes the per-expert hub layout.
    deeper_dir = directory / "_deeper"
    _build_model(key, seed + 1, num_hidden_layers=num_layers + 1).save_pretrained(str(deeper_dir))
    prefix = f"model.layers.{num_layers}."
    for name, tensor in load_file(str(deeper_dir / "model.safetensors")).items():
        if name.startswith(prefix):
            tensors[name] = tensor
    shutil.rmtree(deeper_dir)
    generator = torch.Generator().manual_seed(seed + 2)
    glue_shapes = {
        "enorm.weight": (hidden,),
        "hnorm.weight": (hidden,),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.norm.weight": (hidden,),
    }
    for name, shape in glue_shapes.items():
        tensors[prefix + name] = torch.randn(shape, generator=generator).to(torch.bfloat16)
    tensors[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(path), metadata={"format": "pt"})


def build_tiny_checkpoint(key: str, directory: Path, seed: int = 0) -> Path:
    """Write tiny model ``key`` into ``directory`` with ``save_pretrained``; return the directory."""
    model = _build_model(key, seed)
    model.save_pretrained(str(directory), **TINY_MODELS[key][3])
    config = json.loads((directory / "config.json").read_text())
    if config.get("num_nextn_predict_layers"):
        _append_deepseek_mtp(directory, key, seed)
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``tiny_checkpoint("qwen3_moe") -> Path`` of a session-cached tiny checkpoint."""
    built: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in TINY_MODELS:
            raise KeyError(f"unknown tiny model {key!r}; choose from {sorted(TINY_MODELS)}")
        if key not in built:
            built[key] = build_tiny_checkpoint(key, tmp_path_factory.mktemp(key))
        return built[key]

    return get


@pytest.fixture(scope="session")
def converted(tiny_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``converted(model="qwen3_moe", dialect="modelopt", contract=NVFP4_EXPERTS) -> Path``: a converted
    tiny checkpoint, built once per session per argument triple; tests copy it before changing it."""
    from _helpers import NVFP4_EXPERTS

    from fp4convert.convert.execute import convert_checkpoint

    cache: dict[tuple[str, str, str], Path] = {}

    def get(model: str = "qwen3_moe", dialect: str = "modelopt", contract: str | Path = NVFP4_EXPERTS) -> Path:
        key = (model, dialect, str(contract))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{model}-{dialect}") / "out"
            convert_checkpoint(tiny_checkpoint(model), out, contract=contract, dialect=dialect)
            cache[key] = out
        return cache[key]

    return get
