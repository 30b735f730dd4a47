"""Exclude lists in each dialect's spelling, and configs read back by the dialect that wrote them."""

from __future__ import annotations

import pytest
from _helpers import MXFP8_ALL, NVFP4_EXPERTS

from fp4convert.contract import load_contract
from fp4convert.dialects import LM_HEAD, Planned, get_dialect
from fp4convert.families import inventory_from_config, load_config


def _items(model: str, contract_path, layers: int = 2) -> tuple[list[Planned], object]:
    config = dict(load_config(model))
    config["num_hidden_layers"] = layers
    inventory = inventory_from_config(config)
    contract = load_contract(contract_path)
    decisions = contract.decide_all(inventory)
    return [Planned(t, decisions[t.name]) for t in inventory], contract


def test_a_tied_lm_head_is_excluded_in_every_dialect():
    items, contract = _items("Qwen3-4B", MXFP8_ALL)  # tie_word_embeddings: no lm_head tensor
    assert not any(i.info.name.startswith("lm_head") for i in items)
    for name in ("modelopt", "sglang-mxfp8", "compressed-tensors"):
        dialect = get_dialect(name)
        config = dialect.quantization_config(contract, items)
        assert LM_HEAD in config.get("ignore", config.get("modules_to_not_convert")), name
    side = get_dialect("modelopt").side_files(contract, items)["hf_quant_config.json"]
    assert LM_HEAD in side["quantization"]["exclude_modules"]


def test_wildcards_only_where_the_engines_expand_them():
    items, contract = _items("Qwen3-30B-A3B", NVFP4_EXPERTS)
    modelopt = get_dialect("modelopt").quantization_config(contract, items)["ignore"]
    ct = get_dialect("compressed-tensors").quantization_config(contract, items)["ignore"]
    assert "model.layers.*.mlp.gate" in modelopt and not any("*" in e for e in ct)
    assert {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"} <= set(ct)
    mxfp8, plain = _items("Qwen3-30B-A3B", MXFP8_ALL)
    sglang = get_dialect("sglang-mxfp8").quantization_config(plain, mxfp8)["modules_to_not_convert"]
    assert not any("*" in e for e in sglang) and "model.layers.1.mlp.gate" in sglang


@pytest.mark.parametrize(
    ("name", "contract_path", "per_token"),
    [
        ("modelopt", NVFP4_EXPERTS, True),
        ("compressed-tensors", NVFP4_EXPERTS, True),
        ("compressed-tensors", NVFP4_EXPERTS, False),
        ("modelopt", MXFP8_ALL, True),
        ("sglang-mxfp8", MXFP8_ALL, True),
        ("compressed-tensors", MXFP8_ALL, True),
    ],
)
def test_read_config_gives_back_what_the_writer_wrote(name, contract_path, per_token):
    items, contract = _items("Qwen3-30B-A3B", contract_path)
    dialect = get_dialect(name, per_token_activations=per_token)
    view = dialect.read_config(dialect.quantization_config(contract, items))
    assert view.dialect == name and view.problems == ()
    assert view.excluded == tuple(dialect.exclude_patterns(items))
    quantized = {i.module: i.decision.format for i in items if i.quantized}
    for module, fmt in quantized.items():
        scheme = view.listed.get(module, view.default)
        assert scheme is not None and scheme.format == fmt, module
        expected = {"mxfp8": "dynamic", "nvfp4": "static" if name == "modelopt" or not per_token else "none"}[fmt]
        assert scheme.activations == expected
    # the note follows the contract (the dialect's own flag only decides the activation groups)
    assert view.per_token_note == (contract.formats.nvfp4.per_token_activations and "nvfp4" in quantized.values())


def test_read_config_names_what_loaders_miss():
    modelopt = get_dialect("modelopt")
    assert modelopt.read_config({"quant_algo": "MIXED_PRECISION"}).problems[0][0] == "sglang"
    nested = modelopt.read_config({"quantization": {"quant_algo": "NVFP4"}})
    assert nested.problems == (
        (
            "vllm",
            "the nested form lacks kv_cache_quant_algo, exclude_modules, group_size, which vLLM's parser requires",
        ),
    )
    assert get_dialect("sglang-mxfp8").read_config({"modules_to_not_convert": "lm_head"}).problems[-1] == (
        "all",
        "modules_to_not_convert is not a list of module names",
    )
