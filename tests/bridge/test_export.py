"""export_hf: a live update carries exactly the bytes the converter writes for the same contract."""

from __future__ import annotations

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal
from bridge.helpers import CASE_IDS, CASES, INPUT_SCALES, NVFP4_ALL, assert_same_tensors

from fp4convert.bridge import export_hf
from fp4convert.errors import ConversionError, MappingError


@pytest.mark.parametrize(("model", "dialect", "contract"), CASES, ids=CASE_IDS)
def test_a_live_update_is_the_converted_checkpoint(
    model, dialect, contract, megatron_state, config, converted_tensors
):
    checkpoint = converted_tensors(model, dialect, contract)
    kwargs = {"contract": contract, "config": config(model), "dialect": dialect}
    full = dict(export_hf(megatron_state(model), include_input_scale=True, **kwargs))
    assert_same_tensors(full, checkpoint)
    live = dict(export_hf(megatron_state(model), **kwargs))  # the default: no activation scales
    assert_same_tensors(live, {n: t for n, t in checkpoint.items() if not n.endswith(INPUT_SCALES)})
    if dialect == "modelopt" and contract != MXFP8_ALL:
        assert len(full) > len(live)  # the default really drops something here


def test_ep_rank_exports_its_experts_under_global_ids(megatron_state, config, converted_tensors):
    checkpoint = converted_tensors("qwen3_moe", "modelopt", NVFP4_EXPERTS)
    rank1 = megatron_state("qwen3_moe", ep_rank=1, ep_size=2)
    assert "decoder.layers.0.mlp.experts.linear_fc1.weight1" in rank1  # local id 1 = global expert 3
    out = dict(export_hf(rank1, contract=NVFP4_EXPERTS, config=config("qwen3_moe"), ep_rank=1, ep_size=2))
    experts = {name.split(".experts.")[1].split(".")[0] for name in out if ".experts." in name}
    assert experts == {"2", "3"}
    for name, tensor in out.items():
        assert_bytes_equal(tensor, checkpoint[name])


def test_sequential_expert_layout_gives_the_same_tensors(megatron_state, config):
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    grouped = dict(export_hf(megatron_state("qwen3_moe"), **kwargs))
    sequential_state = megatron_state("qwen3_moe", layout="sequential")
    assert any(".local_experts." in n for n in sequential_state)
    assert_same_tensors(dict(export_hf(sequential_state, **kwargs)), grouped)


def test_export_streams_one_megatron_tensor_at_a_time(megatron_state, config):
    state = megatron_state("qwen3_moe")
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    pulled: list[str] = []

    def source():
        for name, tensor in state.items():
            pulled.append(name)
            yield name, tensor

    out = export_hf(source(), **kwargs)
    assert pulled == []  # nothing is read before the first tensor is asked for
    yielded_after = {name: len(pulled) for name, _ in out}
    for index, (name, tensor) in enumerate(state.items()):
        # Each Megatron tensor's outputs come out before the next tensor is read.
        alone = dict(export_hf({name: tensor}, **kwargs))
        assert alone and all(yielded_after[hf] == index + 1 for hf in alone), name


def test_mla_q_a_and_kv_a_share_a_scale_across_two_megatron_tensors(megatron_state, config):
    state = megatron_state("deepseek_v3")
    kwargs = {"contract": NVFP4_ALL, "config": config("deepseek_v3")}
    q_down = "decoder.layers.0.self_attention.linear_q_down_proj.weight"
    kv_down = "decoder.layers.0.self_attention.linear_kv_down_proj.weight"
    with pytest.raises(
        ConversionError,
        match=r"^1 shared-scale groups are incomplete; e\.g\. "
        r"`model\.layers\.0\.self_attn\.kv_a_proj_with_mqa\.weight`",
    ):
        list(export_hf({q_down: state[q_down]}, **kwargs))
    out = dict(export_hf({q_down: state[q_down], kv_down: state[kv_down]}, **kwargs))
    q_a, kv_a = (out[f"model.layers.0.self_attn.{m}.weight_scale_2"] for m in ("q_a_proj", "kv_a_proj_with_mqa"))
    assert_bytes_equal(q_a, kv_a)
    amaxes = [state[n].float().abs().amax() for n in (q_down, kv_down)]
    assert amaxes[0] != amaxes[1]  # the shared scale is not a coincidence


def test_a_dialect_that_cannot_carry_the_contract_is_refused_before_any_tensor(config):
    with pytest.raises(
        ConversionError,
        match=r"^export refused \(1 problems\):\n  - dialect 'sglang-mxfp8' cannot "
        r"store nvfp4 tensors",
    ):
        export_hf(iter(()), contract=NVFP4_EXPERTS, config=config("qwen3_moe"), dialect="sglang-mxfp8")


def test_an_ungathered_tensor_parallel_shard_is_named(megatron_state, config):
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    half = megatron_state("qwen3_moe")[qkv][:64]
    with pytest.raises(MappingError, match=r"gather TP shards first"):
        list(export_hf({qkv: half}, contract=NVFP4_ALL, config=config("qwen3_moe")))


def test_activation_scales_of_a_calibrated_contract_need_calibration(megatron_state, config, tmp_path):
    from fp4convert.contract import load_contract

    base = load_contract(NVFP4_EXPERTS)
    calibrated = base.model_validate({**base.canonical_dict(), "formats": {"nvfp4": {"per_token_activations": False}}})
    kwargs = {"contract": calibrated, "config": config("qwen3_moe"), "include_input_scale": True}
    with pytest.raises(ConversionError, match=r"needs calibrated activation amaxes; pass calibration="):
        export_hf(megatron_state("qwen3_moe"), **kwargs)
    fc1 = "decoder.layers.0.mlp.experts.linear_fc1.weight1"
    prefix = "model.layers.0.mlp.experts.1"
    calibration = {f"{prefix}.gate_proj": 3.0, f"{prefix}.up_proj": 5.0}
    out = dict(export_hf({fc1: megatron_state("qwen3_moe")[fc1]}, calibration=calibration, **kwargs))
    expected = torch.div(torch.tensor(5.0), torch.tensor(2688.0))  # siblings share the larger amax
    for proj in ("gate_proj", "up_proj"):
        assert_bytes_equal(out[f"{prefix}.{proj}.input_scale"], expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_export_is_byte_identical_to_cpu(megatron_state, config):
    kwargs = {"contract": NVFP4_ALL, "config": config("deepseek_v3"), "include_input_scale": True}
    state = megatron_state("deepseek_v3")
    cpu = dict(export_hf(state, **kwargs))
    cuda = dict(export_hf({n: t.cuda() for n, t in state.items()}, **kwargs))
    assert all(t.is_cuda for t in cuda.values())
    assert_same_tensors({n: t.cpu() for n, t in cuda.items()}, cpu)
