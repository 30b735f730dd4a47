"""Each dialect owns its on-disk spelling, and the spelling round-trips: what ``layout`` declares is
what ``encode`` produces, the config routes back to the dialect, the stored global scale decodes to
the quantizer's decode scale, and every dialect's tensors are recognised by their format."""

from __future__ import annotations

import pytest
import torch
from _helpers import assert_bytes_equal

from fp4convert.contract import load_contract
from fp4convert.dialects import DIALECTS, Planned, dialect_for_config, get_dialect, stored_format
from fp4convert.errors import ConversionError
from fp4convert.families import describe_name, load_config
from fp4convert.formats import quantize_mxfp8, quantize_nvfp4
from fp4convert.inventory.dtypes import safetensors_code

CONFIG = load_config("Qwen3-30B-A3B")
NAME = "model.layers.0.mlp.experts.3.up_proj.weight"


def _planned(fmt: str) -> Planned:
    contract = load_contract("nvfp4-experts-per-token" if fmt == "nvfp4" else "mxfp8-end-to-end")
    info = describe_name(NAME, CONFIG)
    info = type(info)(**{**info.__dict__, "shape": (32, 64)})
    return Planned(info, contract.decide(info, num_layers=48))


def _cases() -> list[tuple[str, str]]:
    return [(name, fmt) for name, cls in DIALECTS.items() for fmt in sorted(cls.formats)]


@pytest.mark.parametrize(("name", "fmt"), _cases())
def test_encode_produces_exactly_what_layout_declares(name, fmt):
    dialect = get_dialect(name, per_token_activations=False)
    item = _planned(fmt)
    assert item.quantized and item.decision.format == fmt
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q = quantize_nvfp4(x) if fmt == "nvfp4" else quantize_mxfp8(x)
    encoded = dialect.encode(item, q, x, 3.5)
    declared = dialect.layout(item)
    assert [(n, safetensors_code(t.dtype), tuple(t.shape)) for n, t in encoded.items()] == declared
    for (out, dtype, _), role in zip(declared, dialect.output_dtypes[fmt], strict=False):
        assert out == dialect.output_name(item.module, fmt, role)
        assert dtype == dialect.output_dtypes[fmt][role]


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_the_config_routes_back_to_the_dialect(name):
    dialect = get_dialect(name)
    fmt = sorted(dialect.formats)[0]
    contract = load_contract("nvfp4-experts-per-token" if fmt == "nvfp4" else "mxfp8-end-to-end")
    config = dialect.quantization_config(contract, [_planned(fmt)])
    assert config["quant_method"] == dialect.quant_method
    assert dialect_for_config({"quantization_config": config}).name == name
    assert sorted(dialect.side_files(contract, [_planned(fmt)])) == sorted(dialect.side_file_names)


def test_no_two_dialects_share_a_quant_method():
    methods = [cls.quant_method for cls in DIALECTS.values()]
    assert len(set(methods)) == len(methods)
    assert dialect_for_config({}) is None
    assert dialect_for_config({"quantization_config": {"quant_method": "gptq"}}) is None
    assert dialect_for_config({"quantization_config": "modelopt"}) is None


@pytest.mark.parametrize(
    ("name", "profile"),
    [("modelopt", "te"), ("modelopt", "te-2.13"), ("modelopt", "modelopt"), ("compressed-tensors", "te")],
)
def test_the_stored_global_scale_decodes_to_the_quantizers_decode_scale(name, profile):
    dialect = get_dialect(name)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2)) * 7
    q = quantize_nvfp4(x, profile=profile)
    stored = dialect.global_scale(q)
    assert_bytes_equal(dialect.decode_scale(stored), q.global_decode_scale())
    assert dialect.stores_encode_scale == (name == "compressed-tensors")


@pytest.mark.parametrize(("name", "fmt"), _cases())
def test_every_dialects_tensors_are_recognised_by_their_format(name, fmt):
    dialect = get_dialect(name, per_token_activations=False)
    leaves = {out.rsplit(".", 1)[1]: dtype for out, dtype, _ in dialect.layout(_planned(fmt))}
    assert stored_format(leaves) == fmt
    assert stored_format({"weight": "BF16"}) == "bf16" and stored_format({"bias": "BF16"}) == "absent"


def test_an_unknown_dialect_lists_the_known_ones():
    with pytest.raises(ConversionError, match=r"unknown dialect 'gguf'; use one of modelopt, sglang-mxfp8"):
        get_dialect("gguf")


def test_dialects_spell_the_tensors_engines_load():
    """The spelling itself, pinned: engines' loaders look these names up."""
    spelled = {name: {fmt: dict(cls.suffixes[fmt]) for fmt in cls.formats} for name, cls in DIALECTS.items()}
    assert spelled == {
        "modelopt": {
            "nvfp4": {"data": "weight", "scale": "weight_scale", "global": "weight_scale_2", "input": "input_scale"},
            "mxfp8": {"data": "weight", "scale": "weight_scale"},
        },
        "sglang-mxfp8": {"mxfp8": {"data": "weight", "scale": "weight_scale_inv"}},
        "compressed-tensors": {
            "nvfp4": {
                "data": "weight_packed",
                "scale": "weight_scale",
                "global": "weight_global_scale",
                "input": "input_global_scale",
            },
            "mxfp8": {"data": "weight", "scale": "weight_scale"},
        },
    }
    methods = {name: cls.quant_method for name, cls in DIALECTS.items()}
    assert methods == {"modelopt": "modelopt", "sglang-mxfp8": "mxfp8", "compressed-tensors": "compressed-tensors"}
