"""describe_name: one name, HF or Megatron, classified with or without a model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fp4convert.errors import MappingError
from fp4convert.families import describe_name, inventory_from_config, load_config
from fp4convert.families._inventory import _merge
from fp4convert.inventory import FusedKind, Role, TensorInfo

# name -> (role, layer, expert, is_mtp, megatron_name, fused_group), without any model.
CONFIG_FREE = {
    "model.embed_tokens.weight": (
        Role.EMBEDDING,
        None,
        None,
        False,
        "embedding.word_embeddings.weight",
        None,
    ),
    "lm_head.weight": (Role.LM_HEAD, None, None, False, "output_layer.weight", None),
    # q_proj is fused into linear_qkv (GQA families) or is DeepSeek's own linear_q_proj: no agreement.
    "model.layers.4.self_attn.q_proj.weight": (Role.ATTENTION, 4, None, False, None, None),
    "model.layers.4.self_attn.k_proj.weight": (
        Role.ATTENTION,
        4,
        None,
        False,
        "decoder.layers.4.self_attention.linear_qkv.weight",
        "model.layers.4.self_attn.qkv",
    ),
    "model.layers.4.self_attn.o_proj.weight": (
        Role.ATTENTION,
        4,
        None,
        False,
        "decoder.layers.4.self_attention.linear_proj.weight",
        None,
    ),
    "model.layers.4.mlp.up_proj.weight": (
        Role.DENSE_MLP,
        4,
        None,
        False,
        "decoder.layers.4.mlp.linear_fc1.weight",
        "model.layers.4.mlp.gate_up",
    ),
    "model.layers.4.post_attention_layernorm.weight": (Role.NORM, 4, None, False, None, None),
    "model.layers.9.mlp.gate.weight": (
        Role.ROUTER,
        9,
        None,
        False,
        "decoder.layers.9.mlp.router.weight",
        None,
    ),
    "model.layers.9.mlp.experts.31.down_proj.weight": (
        Role.ROUTED_EXPERT,
        9,
        31,
        False,
        "decoder.layers.9.mlp.experts.linear_fc2.weight31",
        None,
    ),
    "model.layers.9.mlp.shared_experts.gate_proj.weight": (
        Role.SHARED_EXPERT,
        9,
        None,
        False,
        "decoder.layers.9.mlp.shared_experts.linear_fc1.weight",
        "model.layers.9.mlp.shared_experts.gate_up",
    ),
    "model.layers.2.self_attn.kv_b_proj.weight": (
        Role.MLA_PROJECTION,
        2,
        None,
        False,
        "decoder.layers.2.self_attention.linear_kv_up_proj.weight",
        None,
    ),
    "model.layers.61.eh_proj.weight": (Role.MTP, 61, None, True, None, None),
    "decoder.layers.4.self_attention.linear_qkv.weight": (
        Role.ATTENTION,
        4,
        None,
        False,
        "decoder.layers.4.self_attention.linear_qkv.weight",
        "model.layers.4.self_attn.qkv",
    ),
    "module.module.decoder.layers.5.mlp.experts.local_experts.3.linear_fc1.weight": (
        Role.ROUTED_EXPERT,
        5,
        3,
        False,
        "decoder.layers.5.mlp.experts.local_experts.3.linear_fc1.weight",
        "model.layers.5.mlp.experts.3.gate_up",
    ),
    "decoder.final_layernorm.weight": (Role.NORM, None, None, False, "decoder.final_layernorm.weight", None),
}


@pytest.mark.parametrize("name", list(CONFIG_FREE))
def test_config_free_descriptions(name: str) -> None:
    info = describe_name(name)
    assert (info.role, info.layer, info.expert, info.is_mtp, info.megatron_name, info.fused_group) == (
        CONFIG_FREE[name]
    )
    assert info.shape == ()


def test_fused_megatron_names_describe_their_first_hf_piece() -> None:
    assert describe_name("decoder.layers.0.mlp.linear_fc1.weight").name == "model.layers.0.mlp.gate_proj.weight"
    qkv = describe_name("decoder.layers.0.self_attention.linear_qkv.bias")
    assert (qkv.name, qkv.role, qkv.gemm_weight) == (
        "model.layers.0.self_attn.q_proj.bias",
        Role.OTHER,
        False,
    )


def test_family_narrows_a_config_free_lookup() -> None:
    llama = describe_name("model.layers.4.self_attn.q_proj.weight", family="llama")
    assert (llama.megatron_name, llama.fused_kind) == (
        "decoder.layers.4.self_attention.linear_qkv.weight",
        FusedKind.QKV,
    )
    deepseek = describe_name("model.layers.4.self_attn.q_proj.weight", family="deepseek_v3")
    assert (deepseek.megatron_name, deepseek.fused_kind) == (
        "decoder.layers.4.self_attention.linear_q_proj.weight",
        None,
    )


@pytest.mark.parametrize("model", ["DeepSeek-V3", "Qwen3-30B-A3B", "Qwen3-4B", "Llama-3.1-8B", "Qwen2.5-7B"])
def test_with_a_config_every_inventory_name_describes_as_in_the_inventory(model: str) -> None:
    config = load_config(model)
    inventory = inventory_from_config(config)
    # every name once: the expert-heavy models are sampled on the first and last expert of each layer.
    sample = [t for t in inventory if t.expert is None or t.expert in (0, 255, 127)]
    for tensor in sample:
        assert describe_name(tensor.name, config) == replace(tensor, shape=(), dtype="bfloat16")


@pytest.mark.parametrize("model", ["DeepSeek-V3", "Qwen3-30B-A3B", "Llama-3.1-8B"])
def test_with_a_config_megatron_names_describe_back(model: str) -> None:
    config = load_config(model)
    for tensor in inventory_from_config(config):
        if tensor.expert not in (None, 0) or tensor.megatron_name is None:
            continue
        info = describe_name(tensor.megatron_name, config)
        if info.name != tensor.name and tensor.is_mtp and not info.is_mtp:
            continue  # an MTP copy of the embedding / head: Megatron holds the original only
        assert info.megatron_name == tensor.megatron_name
        assert (info.role, info.layer, info.is_mtp, info.expert, info.fused_group) == (
            tensor.role,
            tensor.layer,
            tensor.is_mtp,
            tensor.expert,
            tensor.fused_group,
        )


def test_mtp_layers_with_a_config() -> None:
    config = load_config("DeepSeek-V3")
    inner = describe_name("mtp.layers.0.transformer_layer.self_attention.linear_kv_up_proj.weight", config)
    assert (inner.name, inner.is_mtp, inner.layer, inner.megatron_name) == (
        "model.layers.61.self_attn.kv_b_proj.weight",
        True,
        61,
        "mtp.layers.0.mtp_model_layer.self_attention.linear_kv_up_proj.weight",
    )
    hf = describe_name("model.layers.61.self_attn.kv_b_proj.weight", config)
    assert hf.is_mtp and hf.megatron_name == inner.megatron_name


def test_unknown_names_are_errors() -> None:
    with pytest.raises(MappingError, match=r"^tensor `model.layers.0.mlp.fc9.weight` is not a tensor of any") as e:
        describe_name("model.layers.0.mlp.fc9.weight")
    assert e.value.hint == "pass config= (or family=) to check it against one model"
    assert isinstance(e.value, KeyError)


def test_mtp_megatron_names_need_a_config() -> None:
    with pytest.raises(MappingError, match=r"^tensor `mtp.layers.0.eh_proj.weight` is in MTP layer 0, whose HF"):
        describe_name("mtp.layers.0.eh_proj.weight")


def test_a_config_checks_layers_experts_and_optional_parts() -> None:
    config = load_config("Qwen3-30B-A3B")
    with pytest.raises(MappingError, match=r"^tensor `model.layers.48.input_layernorm.weight` is in layer 48, but"):
        describe_name("model.layers.48.input_layernorm.weight", config)
    with pytest.raises(MappingError, match=r"names expert 128, but there are 128 experts here"):
        describe_name("model.layers.0.mlp.experts.128.up_proj.weight", config)
    with pytest.raises(MappingError, match=r"^tensor `model.layers.0.mlp.gate_proj.weight` is not a qwen3_moe") as e:
        describe_name("model.layers.0.mlp.gate_proj.weight", config)  # every layer is MoE
    assert "['dense_mlp'] apply" in (e.value.hint or "")
    with pytest.raises(MappingError, match=r"^tensor `lm_head.weight` is not a qwen3 tensor"):
        describe_name("lm_head.weight", load_config("Qwen3-4B"))  # tied embeddings


def test_config_free_candidates_must_agree_on_role() -> None:
    a = TensorInfo("x", role=Role.ATTENTION, megatron_name="a")
    with pytest.raises(MappingError, match=r"^tensor `x` is ambiguous without a model: its role could be any of"):
        _merge("x", [a, replace(a, role=Role.NORM)])
    assert _merge("x", [a, replace(a, megatron_name="b")]).megatron_name is None
    assert _merge("x", [a, a]).megatron_name == "a"
