"""Tiny real checkpoints of the families RL teams train now, written by transformers' own classes.

``family_checkpoint(key) -> Path`` builds (once per session) a checkpoint with ``save_pretrained``
(transformers 5 writes the per-expert hub layout by default), bfloat16, hidden 64, 2-4 layers,
4 experts: small enough for the 2-core CI, with every dimension a multiple of 32 so MXFP8 and NVFP4
blocks fit. Weights keep transformers' own initialisation (std 0.02, so logits compare
meaningfully); tensors it initialises to one constant (norms, biases, zero-initialised routers and
expert biases) are shifted by seeded noise so that no two tensors are alike. Deterministic.

Where the published checkpoint holds tensors transformers does not build, the fixture adds them in
the published layout, with real transformers names and shapes:

- ``glm4_moe``: MTP layer ``model.layers.{L}`` (inner layer from a transformers model one layer
  deeper, glue drawn at its shapes, ``embed_tokens`` / ``shared_head.head`` copies of the main ones).
- ``qwen3_next``: the MTP module ``mtp.*`` (inner full-attention MoE layer from a deeper model,
  ``fc`` ``[H, 2H]`` and three norms drawn).

``kimi_k2`` is a DeepSeek-V3 model saved with Kimi-K2's ``model_type: kimi_k2`` (transformers has
no class of that name; :func:`transformers_view` points a copy back at DeepSeek-V3's for loading).

``gpt_oss``: transformers saves gpt-oss experts fused (``mlp.experts.gate_up_proj`` ``[E, H, 2I]``,
gate and up interleaved on the last axis, and ``down_proj`` ``[E, I, H]``), which is also the
published BF16 layout. :func:`unfuse_gpt_oss` turns that save into the per-expert layout the
gpt-oss family names (independent code, here in the tests), :func:`fuse_gpt_oss` turns per-expert
tensors back so that transformers can load them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

_BASE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}

#: key -> (transformers config class, model class, config kwargs)
FAMILY_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {**_BASE, "num_hidden_layers": 2, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    # Layer 1 dense (mlp_only_layers), layers 0 and 2 MoE with the gated shared expert.
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 3,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mlp_only_layers": [1],
        },
    ),
    "minimax_m2": (
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # GLM-4.5's switches: q/k/v biases, per-head q/k norm, one dense layer, one MTP layer.
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 3,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "attention_bias": True,
            "use_qk_norm": True,
            "num_nextn_predict_layers": 1,
        },
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
        },
    ),
    # Kimi-K2 is DeepSeek-V3 (MLA with q-LoRA, one dense layer, a shared expert, no MTP layer); its
    # config names the DeepSeek-V3 architecture with model_type kimi_k2, set after saving.
    "kimi_k2": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 3,
            "num_key_value_heads": 4,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "num_nextn_predict_layers": 0,
        },
    ),
    # Three gated-delta-net layers then one gated full-attention layer (the published 3:1 pattern).
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            **_BASE,
            "num_hidden_layers": 4,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
    ),
}


#: The fp4convert family of each tiny model.
FAMILY_OF = {key: key for key in FAMILY_MODELS} | {"kimi_k2": "deepseek_v3"}


def _vary_constants(model: torch.nn.Module, seed: int) -> None:
    """Shift every tensor transformers fills with one constant by seeded noise (others stay)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in sorted(model.state_dict().items()):
            flat = tensor.reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                scale = 0.1 if tensor.dim() == 1 else 0.02
                noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * scale
                tensor.copy_((tensor.float() + noise).to(tensor.dtype))


def build_model(key: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The transformers model of tiny family ``key`` (bfloat16, deterministic, eval mode)."""
    import transformers

    config_class, model_class, kwargs = FAMILY_MODELS[key]
    config = getattr(transformers, config_class)(**{**kwargs, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)._from_config(config, dtype=torch.bfloat16)
    _vary_constants(model, seed)
    return model.eval()


def _draw(shape: tuple[int, ...], generator: torch.Generator, *, around: float = 0.0) -> torch.Tensor:
    return (around + 0.05 * torch.randn(shape, generator=generator)).to(torch.bfloat16)


def _deeper_layer(key: str, seed: int, num_layers: int, **overrides: Any) -> dict[str, torch.Tensor]:
    """Layer ``num_layers`` of a transformers model one layer deeper, as ``save_pretrained`` writes it."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        build_model(key, seed + 1, num_hidden_layers=num_layers + 1, **overrides).save_pretrained(scratch)
        prefix = f"model.layers.{num_layers}."
        saved = load_file(str(Path(scratch) / "model.safetensors"))
    return {name.removeprefix(prefix): tensor for name, tensor in saved.items() if name.startswith(prefix)}


def _append_glm_mtp(tensors: dict[str, torch.Tensor], key: str, seed: int) -> None:
    num_layers, hidden = FAMILY_MODELS[key][2]["num_hidden_layers"], FAMILY_MODELS[key][2]["hidden_size"]
    prefix = f"model.layers.{num_layers}."
    for rest, tensor in _deeper_layer(key, seed, num_layers).items():
        tensors[prefix + rest] = tensor
    generator = torch.Generator().manual_seed(seed + 2)
    tensors[prefix + "enorm.weight"] = _draw((hidden,), generator, around=1.0)
    tensors[prefix + "hnorm.weight"] = _draw((hidden,), generator, around=1.0)
    tensors[prefix + "eh_proj.weight"] = _draw((hidden, 2 * hidden), generator)
    tensors[prefix + "shared_head.norm.weight"] = _draw((hidden,), generator, around=1.0)
    tensors[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()


def _append_qwen3_next_mtp(tensors: dict[str, torch.Tensor], config: dict[str, Any], key: str, seed: int) -> None:
    num_layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    layer_types = [*config["layer_types"], "full_attention"]
    for rest, tensor in _deeper_layer(key, seed, num_layers, layer_types=layer_types).items():
        tensors["mtp.layers.0." + rest] = tensor
    generator = torch.Generator().manual_seed(seed + 2)
    tensors["mtp.fc.weight"] = _draw((hidden, 2 * hidden), generator)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = _draw((hidden,), generator)


def unfuse_gpt_oss(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-oss fused experts (transformers / published BF16 layout) -> one tensor per expert projection."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        head, _, leaf = name.rpartition(".mlp.experts.")
        if not head:
            out[name] = tensor
            continue
        for expert in range(tensor.shape[0]):
            stem = f"{head}.mlp.experts.{expert}."
            value = tensor[expert]
            if leaf == "gate_up_proj":  # [H, 2I], gate = even columns, up = odd columns
                out[stem + "gate_proj.weight"] = value[:, 0::2].t().contiguous()
                out[stem + "up_proj.weight"] = value[:, 1::2].t().contiguous()
            elif leaf == "gate_up_proj_bias":
                out[stem + "gate_proj.bias"] = value[0::2].contiguous()
                out[stem + "up_proj.bias"] = value[1::2].contiguous()
            elif leaf == "down_proj":  # [I, H] -> Linear orientation [H, I]
                out[stem + "down_proj.weight"] = value.t().contiguous()
            elif leaf == "down_proj_bias":
                out[stem + "down_proj.bias"] = value.contiguous()
            else:
                raise AssertionError(f"unexpected gpt-oss expert tensor {name}")
    return out


def fuse_gpt_oss(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`unfuse_gpt_oss` (per-expert tensors -> transformers' fused layout)."""
    out = {name: t for name, t in tensors.items() if ".mlp.experts." not in name}
    heads = sorted({name.split(".mlp.experts.")[0] for name in tensors if ".mlp.experts." in name})
    for head in heads:

        def pieces(leaf: str, head: str = head) -> torch.Tensor:
            return torch.stack([tensors[f"{head}.mlp.experts.{e}.{leaf}"] for e in range(num_experts)])

        gate, up = pieces("gate_proj.weight").transpose(1, 2), pieces("up_proj.weight").transpose(1, 2)
        out[f"{head}.mlp.experts.gate_up_proj"] = torch.stack([gate, up], dim=-1).flatten(-2).contiguous()
        gate_bias, up_bias = pieces("gate_proj.bias"), pieces("up_proj.bias")
        out[f"{head}.mlp.experts.gate_up_proj_bias"] = torch.stack([gate_bias, up_bias], dim=-1).flatten(-2)
        out[f"{head}.mlp.experts.down_proj"] = pieces("down_proj.weight").transpose(1, 2).contiguous()
        out[f"{head}.mlp.experts.down_proj_bias"] = pieces("down_proj.bias")
    return out


def transformers_view(directory: Path, scratch: Path) -> Path:
    """A folder transformers loads for the checkpoint in ``directory``: the folder itself, or (gpt-oss:
    experts fused back; Kimi-K2: model_type deepseek_v3) a copy in ``scratch``."""
    config = json.loads((directory / "config.json").read_text())
    if config["model_type"] not in ("gpt_oss", "kimi_k2"):
        return directory
    scratch.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if config["model_type"] == "gpt_oss":
        tensors = fuse_gpt_oss(tensors, config["num_local_experts"])
    config["model_type"] = "deepseek_v3" if config["model_type"] == "kimi_k2" else config["model_type"]
    (scratch / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(scratch / "model.safetensors"), metadata={"format": "pt"})
    return scratch


def build_family_checkpoint(key: str, directory: Path, seed: int = 0) -> Path:
    """Write tiny family ``key`` into ``directory`` (see the module docstring); return the directory."""
    build_model(key, seed).save_pretrained(str(directory))
    path = directory / "model.safetensors"
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(path))
    if key == "glm4_moe":
        _append_glm_mtp(tensors, key, seed)
    elif key == "qwen3_next":
        _append_qwen3_next_mtp(tensors, config, key, seed)
    elif key == "gpt_oss":
        tensors = unfuse_gpt_oss(tensors)
    elif key == "kimi_k2":
        (directory / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2"}, indent=2))
    save_file(tensors, str(path), metadata={"format": "pt"})
    return directory
