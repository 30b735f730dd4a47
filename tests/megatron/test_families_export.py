"""The live exporter on the newer families' Megatron spellings: bytes == ``fp4convert convert``.

Mixtral, Qwen2-MoE (gated shared expert, a dense layer), MiniMax-M2 (w1/w3 experts, expert bias),
GLM-4.5 (q/k/v biases, q/k norms, dense first layer, shared expert, MTP layer), gpt-oss (expert
biases, attention sinks as ``softmax_offset``) and Kimi-K2 (MLA with q-LoRA, shared expert) on the
tiny transformers checkpoints of tests/families/tiny.py. Every Megatron expert layout (per-expert
TEGroupedMLP, SequentialMLP, the stacked ``[E, 2I, H]`` and legacy ``[H, E*2I]`` ones), the local
spec's separate norms and old MTP name, MLA's fused down projection, EP ranks, every dialect, and a
reused exporter (the second sync of changed weights equals a fresh export). Every equality is on
uint8 bytes; tests/families/test_family_checkpoints.py covers the SequentialMLP layout per dialect.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal
from families.tiny import FAMILY_OF, build_family_checkpoint
from safetensors.torch import load_file

from fp4convert import export_hf, validate_export
from fp4convert.families import MegatronSpelling, hf_to_megatron, load_config
from fp4convert.megatron.sync import LiveExporter

pytest.importorskip("transformers")

KEYS = ["mixtral", "qwen2_moe", "minimax_m2", "glm4_moe", "gpt_oss", "kimi_k2"]
LAYOUTS = ["grouped", "sequential", "single_grouped", "legacy_grouped"]
DIALECTS = [(NVFP4_EXPERTS, "modelopt"), (NVFP4_EXPERTS, "compressed-tensors"), ("mxfp8", "sglang-mxfp8")]


def _contract(key: str, contract: Path | str) -> Path | str:
    if contract != "mxfp8":
        return contract
    return "deepseek-v3-mxfp8-mla-bf16" if FAMILY_OF[key] == "deepseek_v3" else MXFP8_ALL


def _read(directory: Path) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        found.update(load_file(str(path)))
    return {n: t for n, t in found.items() if not n.endswith((".input_scale", ".input_global_scale"))}


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Callable[[str], tuple[dict[str, torch.Tensor], dict[str, Any], Path]]:
    """``family(key) -> (HF tensors, config, checkpoint directory)``, built once per module."""
    cache: dict[str, tuple[dict[str, torch.Tensor], dict[str, Any], Path]] = {}

    def get(key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path]:
        if key not in cache:
            directory = build_family_checkpoint(key, tmp_path_factory.mktemp(f"live-{key}"))
            tensors: dict[str, torch.Tensor] = {}
            for path in sorted(directory.glob("*.safetensors")):
                tensors.update(load_file(str(path)))
            cache[key] = (tensors, load_config(directory), directory)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def converted(family, tmp_path_factory) -> Callable[[str, Path | str, str], dict[str, torch.Tensor]]:
    """What ``fp4convert convert`` writes for (key, contract, dialect), read once."""
    from fp4convert.convert.execute import convert_checkpoint

    cache: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}

    def get(key: str, contract: Path | str, dialect: str) -> dict[str, torch.Tensor]:
        index = (key, str(contract), dialect)
        if index not in cache:
            out = tmp_path_factory.mktemp(f"live-{key}-{dialect}") / "out"
            convert_checkpoint(family(key)[2], out, contract=contract, dialect=dialect)
            cache[index] = _read(out)
        return cache[index]

    return get


def _assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert_bytes_equal(actual[name], tensor)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("key", KEYS)
def test_every_expert_layout_exports_the_converted_bytes(key, layout, family, converted):
    hf, config, _ = family(key)
    name = FAMILY_OF[key]
    megatron = hf_to_megatron(hf, name, config, expert_layout=layout)
    kwargs = {"contract": NVFP4_EXPERTS, "family": name, "config": config}
    exported = dict(export_hf(megatron.items(), **kwargs))
    _assert_same(exported, converted(key, NVFP4_EXPERTS, "modelopt"))
    report = validate_export(exported, megatron, **kwargs)
    assert report.ok, report.findings[:3]


@pytest.mark.parametrize(("contract", "dialect"), DIALECTS)
@pytest.mark.parametrize("key", KEYS)
def test_every_dialect_from_the_te_spelling_with_a_reused_exporter(key, contract, dialect, family, converted):
    """The TE spelling (per-expert grouped experts, norms fused into the next Linear), exported
    twice by one exporter: once from other weights, then from the model's (the second sync runs on
    what the first built and must not keep anything of the first's values)."""
    hf, config, _ = family(key)
    name, contract = FAMILY_OF[key], _contract(key, contract)
    megatron = hf_to_megatron(hf, name, config)
    exporter = LiveExporter(contract=contract, config=config, dialect=dialect, family=name)
    other = {n: (t.flip(0) if t.is_floating_point() and t.dim() else t) for n, t in megatron.items()}
    first = dict(exporter(other))
    assert sorted(first) == sorted(converted(key, contract, dialect))
    del first
    _assert_same(dict(exporter(megatron)), converted(key, contract, dialect))


@pytest.mark.parametrize("layout", ["grouped", "single_grouped"])
@pytest.mark.parametrize("key", KEYS)
def test_ep_ranks_together_export_the_whole_model(key, layout, family, converted):
    hf, config, _ = family(key)
    name = FAMILY_OF[key]
    together: dict[str, torch.Tensor] = {}
    for rank in range(2):
        shard = hf_to_megatron(hf, name, config, expert_layout=layout, ep_rank=rank, ep_size=2)
        kwargs = {"contract": NVFP4_EXPERTS, "family": name, "config": config, "ep_rank": rank, "ep_size": 2}
        exported = dict(export_hf(shard, **kwargs))
        report = validate_export(exported, shard, **kwargs)
        assert report.ok, report.findings[:3]
        for tensor_name, tensor in exported.items():
            if tensor_name in together:  # replicated over EP: identical from every rank
                assert_bytes_equal(tensor, together[tensor_name])
            together[tensor_name] = tensor
    _assert_same(together, converted(key, NVFP4_EXPERTS, "modelopt"))


@pytest.mark.parametrize(
    ("key", "spelling"),
    [
        ("glm4_moe", MegatronSpelling.parse("local", megatron_version="0.16.1")),
        ("glm4_moe", MegatronSpelling.parse("modelopt")),
        ("qwen2_moe", MegatronSpelling.parse("local")),
        ("gpt_oss", MegatronSpelling.parse("local", experts="single_grouped")),
        ("kimi_k2", MegatronSpelling.parse("te", mla_down_proj_fusion=True)),
        ("kimi_k2", MegatronSpelling.parse("local", experts="legacy_grouped", megatron_version="0.16")),
        ("kimi_k2", MegatronSpelling.parse("local", experts="single_grouped", mla_down_proj_fusion=True)),
    ],
    ids=[
        "glm-local-0.16",
        "glm-modelopt",
        "qwen2moe-local",
        "gptoss-local-single",
        "kimi-fused-down",
        "kimi-local-legacy",
        "kimi-local-single-fused",
    ],
)
@pytest.mark.parametrize(("contract", "dialect"), [DIALECTS[0], DIALECTS[2]])
def test_other_megatron_spellings_export_the_converted_bytes(key, spelling, contract, dialect, family, converted):
    hf, config, _ = family(key)
    name, contract = FAMILY_OF[key], _contract(key, contract)
    megatron = hf_to_megatron(hf, name, config, spelling=spelling)
    kwargs = {"contract": contract, "family": name, "config": config, "dialect": dialect}
    exported = dict(export_hf(megatron, **kwargs))
    _assert_same(exported, converted(key, contract, dialect))
    report = validate_export(exported, megatron, **kwargs)
    assert report.ok, report.findings[:3]


def test_the_new_families_tensors_the_exporter_must_place(family):
    """The names that only these families have reach the exporter and come out where HF has them."""
    expected = {
        "gpt_oss": (
            "decoder.layers.0.self_attention.core_attention.softmax_offset",
            "decoder.layers.1.mlp.experts.linear_fc1.bias3",
            "model.layers.1.mlp.experts.3.up_proj.bias",
        ),
        "qwen2_moe": (
            "decoder.layers.2.mlp.shared_experts.gate_weight",
            "",
            "model.layers.2.mlp.shared_expert_gate.weight",
        ),
        "glm4_moe": (
            "mtp.layers.0.eh_proj.weight",
            "decoder.layers.0.mlp.linear_fc1.weight",
            "model.layers.0.mlp.up_proj.weight",
        ),
        "kimi_k2": (
            "decoder.layers.1.mlp.shared_experts.linear_fc2.weight",
            "",
            "model.layers.1.mlp.shared_experts.down_proj.weight",
        ),
    }
    for key, (megatron_name, also, hf_name) in expected.items():
        hf, config, _ = family(key)
        megatron = hf_to_megatron(hf, FAMILY_OF[key], config)
        assert megatron_name in megatron and (not also or also in megatron), key
        exported = dict(export_hf(megatron, contract=NVFP4_EXPERTS, family=FAMILY_OF[key], config=config))
        assert hf_name in exported, (key, hf_name)
        if hf_name in hf:  # high precision: the HF tensor itself
            assert_bytes_equal(exported[hf_name], hf[hf_name])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("contract", "dialect"), [DIALECTS[0], DIALECTS[2]])
@pytest.mark.parametrize("key", KEYS)
def test_cuda_export_of_the_new_families_equals_convert(key, contract, dialect, family, converted):
    hf, config, _ = family(key)
    name, contract = FAMILY_OF[key], _contract(key, contract)
    on_gpu = {n: t.cuda() for n, t in hf_to_megatron(hf, name, config, expert_layout="single_grouped").items()}
    kwargs = {"contract": contract, "family": name, "config": config, "dialect": dialect}
    exported = dict(export_hf(on_gpu, **kwargs))
    assert all(t.is_cuda for t in exported.values())
    _assert_same(exported, converted(key, contract, dialect))
    report = validate_export(exported, on_gpu, **kwargs)
    assert report.ok, report.findings[:3]
