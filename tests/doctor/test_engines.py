"""The engines' routing and exclude matching as doctor models them (docs/dialects.md; each case is a
behaviour read in the engine's source)."""

from __future__ import annotations

import pytest

from fp4convert.dialects import ConfigView, Scheme
from fp4convert.doctor.engines import Inconsistent, built_scheme, excluded, loader
from fp4convert.doctor.model import Layer

NVFP4 = Scheme("nvfp4", "static", "NVFP4")
QKV = Layer("model.layers.0.self_attn.qkv_proj", tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv"), "fused")
ROUTER = Layer("model.layers.0.mlp.gate", ("model.layers.0.mlp.gate",), "linear")
GATE_UP = Layer(
    "model.layers.0.mlp.gate_up_proj", ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"), "fused"
)


def _view(dialect: str, *entries: str) -> ConfigView:
    return ConfigView(dialect, "NVFP4", default=NVFP4, excluded=entries)


def test_sglang_modelopt_decides_a_fused_layer_by_its_own_name():
    pieces = _view("modelopt", *QKV.pieces)
    assert not excluded("sglang", pieces, QKV)  # SGLang #36596
    assert excluded("vllm", pieces, QKV) and excluded("trtllm", pieces, QKV)  # both look at the pieces
    assert excluded("sglang", _view("modelopt", "model.layers.0.self_attn.qkv_proj"), QKV)
    assert excluded("sglang", _view("modelopt", "model.layers.0.self_attn*"), QKV)  # ModelOpt's prefix wildcard


def test_an_entry_without_the_model_prefix():
    short = _view("modelopt", "layers.0.mlp.gate")
    assert not excluded("sglang", short, ROUTER)  # full match only
    assert excluded("vllm", short, ROUTER)  # vLLM also takes substrings
    assert not excluded("trtllm", short, ROUTER)


def test_vllm_substring_rule_and_its_trailing_star_rewrite():
    assert excluded("vllm", _view("modelopt", "model.layers.0.mlp*"), ROUTER)
    assert not excluded("vllm", _view("modelopt", "model.layers.*.mlp.gate"), GATE_UP)  # fnmatch is a full match
    with pytest.raises(Inconsistent):
        excluded("vllm", _view("modelopt", "model.layers.0.self_attn.q_proj"), QKV)


def test_compressed_tensors_takes_exact_names_and_re_regexes():
    assert excluded("vllm", _view("compressed-tensors", "re:.*mlp.gate$"), ROUTER)
    assert not excluded("vllm", _view("compressed-tensors", "re:.*mlp.gate$"), GATE_UP)
    assert not excluded("vllm", _view("compressed-tensors", "model.layers.*.mlp.gate"), ROUTER)  # no fnmatch


def test_sglang_mxfp8_matches_dotted_paths_without_wildcards():
    assert excluded("sglang", _view("sglang-mxfp8", "mlp.gate"), ROUTER)
    assert not excluded("sglang", _view("sglang-mxfp8", "mlp.gate"), GATE_UP)  # SGLang PR #23467
    assert not excluded("sglang", _view("sglang-mxfp8", "model.layers.*.mlp.gate"), ROUTER)


def test_mixed_precision_builds_what_quantized_layers_lists():
    view = ConfigView("modelopt", "MIXED_PRECISION", listed={p: NVFP4 for p in QKV.pieces})
    assert built_scheme("vllm", view, QKV) == NVFP4
    assert built_scheme("vllm", view, ROUTER) is None
    moe = Layer("model.layers.0.mlp.experts", ("model.layers.0.mlp.experts.0.up_proj",), "moe")
    listed = ConfigView("modelopt", "MIXED_PRECISION", listed={moe.pieces[0]: NVFP4})
    assert built_scheme("sglang", listed, moe) == NVFP4


@pytest.mark.parametrize(
    ("engine", "view", "method", "refused"),
    [
        ("sglang", ConfigView("modelopt", "MXFP8"), None, "#32538"),
        ("vllm", ConfigView("modelopt", "MXFP8"), "modelopt_mxfp8", None),
        ("sglang", ConfigView("modelopt", "MIXED_PRECISION"), None, "w4afp8"),
        ("sglang", ConfigView("modelopt", "NVFP4"), "modelopt_fp4", None),
        ("vllm", ConfigView("sglang-mxfp8", "mxfp8"), None, "weight_scale_inv"),
        ("trtllm", ConfigView("compressed-tensors", "nvfp4-pack-quantized"), None, "not a TensorRT-LLM"),
    ],
)
def test_routing(engine, view, method, refused):
    found = loader(engine, view, view.dialect)
    assert found.method == method
    assert (found.refusal is None) if refused is None else (refused in found.refusal)
