"""The families RL teams train now, end to end on tiny transformers checkpoints (tests/families/conftest.py).

Per family: the config inventory is what ``save_pretrained`` wrote; HF -> Megatron -> HF is
byte-identical; each dialect's conversion re-verifies against the source; the dequantized output
loads in transformers and its logits stay close to the BF16 model's; a live export from the
Megatron tensors is the converted checkpoint byte for byte and passes ``validate_export``.
Qwen3-Next is HF -> HF only: its Megatron paths refuse with the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal
from families.tiny import FAMILY_OF, transformers_view
from safetensors import safe_open
from safetensors.torch import load_file

from fp4convert import export_hf, validate_export
from fp4convert.checkpoint import inventory_from_checkpoint
from fp4convert.convert.dequantize import dequantize_checkpoint
from fp4convert.errors import MappingError
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config, megatron_to_hf
from fp4convert.inventory import Role
from fp4convert.megatron import import_hf
from fp4convert.verify.checkpoint import verify_checkpoint

transformers = pytest.importorskip("transformers")

MEGATRON_KEYS = ["mixtral", "qwen2_moe", "minimax_m2", "glm4_moe", "gpt_oss", "kimi_k2"]
ALL_KEYS = [*MEGATRON_KEYS, "qwen3_next"]
#: (contract, dialect): NVFP4 routed experts in the two dialects that hold NVFP4, MXFP8 end to end
#: (``"mxfp8"`` stands for the model's MXFP8 contract: MLA models keep kv_b_proj BF16).
CASES = [(NVFP4_EXPERTS, "modelopt"), (NVFP4_EXPERTS, "compressed-tensors"), ("mxfp8", "sglang-mxfp8")]


def _contract(key: str, contract: Path | str) -> Path | str:
    if contract != "mxfp8":
        return contract
    return "deepseek-v3-mxfp8-mla-bf16" if FAMILY_OF[key] == "deepseek_v3" else MXFP8_ALL


_DTYPES = {"BF16": "bfloat16", "F32": "float32"}


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        found.update(load_file(str(path)))
    return found


@pytest.fixture(scope="module")
def model(family_checkpoint: Callable[[str], Path]) -> Callable[[str], tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    cache: dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {}

    def get(key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if key not in cache:
            directory = family_checkpoint(key)
            cache[key] = (_tensors(directory), load_config(directory))
        return cache[key]

    return get


def _assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert_bytes_equal(actual[name], tensor)


# -- inventories ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ALL_KEYS)
def test_config_inventory_equals_the_saved_checkpoint(key: str, family_checkpoint: Callable[[str], Path]) -> None:
    directory = family_checkpoint(key)
    disk = {}
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            header = handle.get_slice(name)
            disk[name] = (tuple(header.get_shape()), _DTYPES[header.get_dtype()])
    listed = {t.name: (t.shape, t.dtype) for t in inventory_from_config(directory)}
    # transformers keeps the GLM and DeepSeek router weights in float32 (_keep_in_fp32_modules_strict, as
    # tests/families/test_inventory.py notes); the published checkpoints store them in bfloat16, as described.
    routers = {n for n in disk if key in ("glm4_moe", "kimi_k2") and n.endswith("mlp.gate.weight")}
    assert {n: disk[n][1] for n in routers} == dict.fromkeys(routers, "float32")
    assert {n: (s, "float32" if n in routers else d) for n, (s, d) in listed.items()} == disk


@pytest.mark.parametrize("key", ALL_KEYS)
def test_checkpoint_inventory_classifies_like_the_config_inventory(
    key: str, family_checkpoint: Callable[[str], Path]
) -> None:
    directory = family_checkpoint(key)
    from_config = inventory_from_config(directory)
    from_disk = inventory_from_checkpoint(directory)
    assert (from_disk.family, from_disk.num_mtp_layers) == (FAMILY_OF[key], from_config.num_mtp_layers)
    by_name = from_config.by_name()
    for info in from_disk:
        assert info == type(info)(**{**by_name[info.name].__dict__, "dtype": info.dtype})


# -- HF <-> Megatron-Core ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["grouped", "sequential"])
@pytest.mark.parametrize("key", MEGATRON_KEYS)
def test_round_trip_is_byte_identical(key: str, layout: str, model) -> None:
    hf, config = model(key)
    family = FAMILY_OF[key]
    megatron = hf_to_megatron(hf, family, config, expert_layout=layout)
    assert len(megatron) < len(hf)  # gate/up (and q/k/v) fused, MTP copies shared on the way
    _assert_same_state(megatron_to_hf(megatron, family, config), hf)


@pytest.mark.parametrize("key", MEGATRON_KEYS)
def test_megatron_names_are_the_inventory_names(key: str, model, family_checkpoint) -> None:
    hf, config = model(key)
    names = {t.megatron_name for t in inventory_from_config(family_checkpoint(key))}
    assert set(hf_to_megatron(hf, FAMILY_OF[key], config)) == names


@pytest.mark.parametrize("key", MEGATRON_KEYS)
def test_expert_parallel_shards_reassemble(key: str, model) -> None:
    hf, config = model(key)
    merged: dict[str, torch.Tensor] = {}
    for rank in range(2):
        shard = hf_to_megatron(hf, FAMILY_OF[key], config, ep_rank=rank, ep_size=2)
        for name, tensor in megatron_to_hf(shard, FAMILY_OF[key], config, ep_rank=rank, ep_size=2).items():
            if name in merged:  # replicated over EP
                assert_bytes_equal(tensor, merged[name])
            merged[name] = tensor
    _assert_same_state(merged, hf)


def test_megatron_layouts_hold_the_hf_pieces(model) -> None:
    # gpt-oss: fc1 = cat(gate, up) for weights and biases; sinks are core_attention.softmax_offset.
    hf, config = model("gpt_oss")
    megatron = hf_to_megatron(hf, "gpt_oss", config)
    fc1 = megatron["decoder.layers.1.mlp.experts.linear_fc1.weight3"]
    assert_bytes_equal(fc1, torch.cat([hf[f"model.layers.1.mlp.experts.3.{p}_proj.weight"] for p in ("gate", "up")]))
    bias = megatron["decoder.layers.1.mlp.experts.linear_fc1.bias3"]
    assert_bytes_equal(bias, torch.cat([hf[f"model.layers.1.mlp.experts.3.{p}_proj.bias"] for p in ("gate", "up")]))
    sinks = megatron["decoder.layers.0.self_attention.core_attention.softmax_offset"]
    assert_bytes_equal(sinks, hf["model.layers.0.self_attn.sinks"])
    # Mixtral / MiniMax-M2: w1 is the gate, w3 the up projection.
    hf, config = model("minimax_m2")
    megatron = hf_to_megatron(hf, "minimax_m2", config)
    fc1 = megatron["decoder.layers.0.mlp.experts.linear_fc1.weight2"]
    experts = "model.layers.0.block_sparse_moe.experts.2"
    assert_bytes_equal(fc1, torch.cat([hf[f"{experts}.w1.weight"], hf[f"{experts}.w3.weight"]]))
    expert_bias = hf["model.layers.1.block_sparse_moe.e_score_correction_bias"]
    assert_bytes_equal(megatron["decoder.layers.1.mlp.router.expert_bias"], expert_bias)
    # Qwen2-MoE: the shared expert gate is Megatron's shared_experts.gate_weight.
    hf, config = model("qwen2_moe")
    megatron = hf_to_megatron(hf, "qwen2_moe", config)
    gate = megatron["decoder.layers.2.mlp.shared_experts.gate_weight"]
    assert_bytes_equal(gate, hf["model.layers.2.mlp.shared_expert_gate.weight"])
    assert "decoder.layers.1.mlp.linear_fc1.weight" in megatron  # mlp_only_layers=[1]


def test_glm_mtp_layer_shares_embedding_and_head(model) -> None:
    hf, config = model("glm4_moe")
    megatron = hf_to_megatron(hf, "glm4_moe", config)
    assert "mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight0" in megatron
    assert "mtp.layers.0.eh_proj.weight" in megatron
    assert not any("embed_tokens" in name or "shared_head.head" in name for name in megatron)
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in megatron  # use_qk_norm


def test_qwen3_next_refuses_megatron_both_ways_with_the_reason(model, family_checkpoint, tmp_path) -> None:
    hf, config = model("qwen3_next")
    megatron = {"decoder.layers.3.self_attention.linear_proj.weight": hf["model.layers.3.self_attn.o_proj.weight"]}
    reason = r"^family qwen3_next has no Megatron-Core mapping in fp4convert: Megatron-Core's GatedDeltaNet packs"
    with pytest.raises(MappingError, match=reason):
        hf_to_megatron(hf, "qwen3_next", config)
    with pytest.raises(MappingError, match=reason):
        megatron_to_hf(megatron, "qwen3_next", config)
    with pytest.raises(MappingError, match=reason):
        list(export_hf(megatron, contract=NVFP4_EXPERTS, family="qwen3_next", config=config))
    with pytest.raises(MappingError, match=reason):
        import_hf(family_checkpoint("qwen3_next"), tmp_path / "megatron")
    assert not (tmp_path / "megatron").exists()
    with pytest.raises(MappingError, match=reason):  # a Megatron-named master
        validate_export({}, megatron, contract=NVFP4_EXPERTS, family="qwen3_next", config=config)


def test_qwen3_next_live_update_validates_against_an_hf_master(model, family_converted) -> None:
    hf, config = model("qwen3_next")
    update = _without_input_scales(_tensors(family_converted("qwen3_next", "modelopt", NVFP4_EXPERTS)))
    report = validate_export(update, hf, contract=NVFP4_EXPERTS, family="qwen3_next", config=config)
    assert report.ok and report.formats["nvfp4"] > 0, report.findings[:3]


def test_qwen3_next_roles_and_mtp_names(family_checkpoint) -> None:
    inventory = inventory_from_config(family_checkpoint("qwen3_next"))
    by_name = inventory.by_name()
    assert (inventory.num_layers, inventory.num_mtp_layers) == (4, 1)
    conv = by_name["model.layers.0.linear_attn.conv1d.weight"]
    assert (conv.shape, conv.gemm_weight, conv.role) == ((128, 1, 4), False, Role.ATTENTION)
    assert not any(by_name[f"model.layers.2.linear_attn.{n}"].gemm_weight for n in ("A_log", "dt_bias", "norm.weight"))
    assert by_name["model.layers.1.linear_attn.in_proj_qkvz.weight"].gemm_weight
    assert by_name["model.layers.3.self_attn.q_proj.weight"].shape == (2 * 4 * 16, 64)  # query and gate per head
    assert by_name["model.layers.3.mlp.shared_expert_gate.weight"].role is Role.ROUTER
    fc = by_name["mtp.fc.weight"]
    assert (fc.layer, fc.is_mtp, fc.role, fc.megatron_name) == (4, True, Role.MTP, "mtp.layers.0.eh_proj.weight")
    inner = by_name["mtp.layers.0.mlp.experts.1.up_proj.weight"]
    assert (inner.layer, inner.is_mtp, inner.fused_group) == (4, True, "mtp.layers.0.mlp.experts.1.gate_up")


# -- conversion, verification, dequantization -------------------------------------------------------


@pytest.mark.parametrize(("contract", "dialect"), CASES)
@pytest.mark.parametrize("key", ALL_KEYS)
def test_conversion_verifies_against_the_source(key, contract, dialect, family_converted, family_checkpoint) -> None:
    out = family_converted(key, dialect, _contract(key, contract))
    report = verify_checkpoint(out, source=family_checkpoint(key))
    assert report.ok, report
    decisions = inventory_from_config(family_checkpoint(key))
    experts = [t for t in decisions if t.role is Role.ROUTED_EXPERT and t.gemm_weight]
    tensors = _tensors(out)
    scale = "weight_scale_inv" if dialect == "sglang-mxfp8" else "weight_scale"
    # Every routed-expert weight was quantized (it carries a block scale), whatever its HF spelling.
    assert experts and all(f"{t.name.removesuffix('.weight')}.{scale}" in tensors for t in experts)


def _load_in_transformers(directory: Path, scratch: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_pretrained(
            transformers_view(directory, scratch), dtype=torch.bfloat16
        ).eval()


def _logits(model: Any) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize(
    ("contract", "dialect", "floor"), [(NVFP4_EXPERTS, "modelopt", 0.98), ("mxfp8", "sglang-mxfp8", 0.99)]
)
@pytest.mark.parametrize("key", ALL_KEYS)
def test_dequantized_output_loads_in_transformers_with_close_logits(
    key, contract, dialect, floor, family_converted, family_checkpoint, tmp_path
) -> None:
    contract = _contract(key, contract)
    reference = _logits(_load_in_transformers(family_checkpoint(key), tmp_path / "source"))
    dequantize_checkpoint(family_converted(key, dialect, contract), tmp_path / "bf16")
    logits = _logits(_load_in_transformers(tmp_path / "bf16", tmp_path / "view"))
    cosine = torch.nn.functional.cosine_similarity(logits.flatten(), reference.flatten(), dim=0).item()
    relative = ((logits - reference).norm() / reference.norm()).item()
    name = Path(contract).stem
    print(f"{key} {name} via {dialect} -> dequantized BF16 vs BF16: cosine {cosine:.5f}, rel {relative:.4f}")
    assert relative > 0  # something was quantized
    assert cosine >= floor


# -- live export (Megatron side) --------------------------------------------------------------------


def _without_input_scales(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t for n, t in tensors.items() if not n.endswith((".input_scale", ".input_global_scale"))}


@pytest.mark.parametrize(("contract", "dialect"), CASES)
@pytest.mark.parametrize("key", MEGATRON_KEYS)
def test_export_hf_equals_the_converted_checkpoint_and_validates(key, contract, dialect, model, family_converted):
    hf, config = model(key)
    family, contract = FAMILY_OF[key], _contract(key, contract)
    megatron = hf_to_megatron(hf, family, config, expert_layout="sequential")
    exported = dict(export_hf(megatron.items(), contract=contract, family=family, config=config, dialect=dialect))
    _assert_same_state(exported, _without_input_scales(_tensors(family_converted(key, dialect, contract))))
    for master in (hf, megatron):
        report = validate_export(exported, master, contract=contract, family=family, config=config, dialect=dialect)
        assert report.ok, report.findings[:3]
