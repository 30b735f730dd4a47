"""export_hf: a live update carries exactly the bytes the converter writes, from Megatron tensors.

Every equality is on uint8 bytes. The converter's output is the reference: a converted checkpoint
and a live update under the same contract must be interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal

from fp4convert import export_hf, validate_export
from fp4convert.errors import ConversionError, MappingError
from fp4convert.families import hf_to_megatron

DEEPSEEK_NVFP4 = Path(__file__).parent / "data" / "deepseek-nvfp4-mla-bf16.yaml"

CASES = [
    ("qwen3_moe", NVFP4_EXPERTS, "modelopt"),
    ("qwen3_moe", NVFP4_EXPERTS, "compressed-tensors"),
    ("qwen3_moe", MXFP8_ALL, "sglang-mxfp8"),
    ("qwen3_moe", MXFP8_ALL, "modelopt"),
    ("deepseek_v3", DEEPSEEK_NVFP4, "modelopt"),
    ("deepseek_v3", DEEPSEEK_NVFP4, "compressed-tensors"),
    ("deepseek_v3", "deepseek-v3-mxfp8-mla-bf16", "sglang-mxfp8"),
]


@pytest.fixture(scope="module")
def converted_tensors(converted, read_tensors) -> Callable[[str, Path | str, str], dict[str, torch.Tensor]]:
    """Every tensor ``fp4convert convert`` writes for (model, contract, dialect), read once."""
    cache: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}

    def get(key: str, contract: Path | str, dialect: str) -> dict[str, torch.Tensor]:
        index = (key, str(contract), dialect)
        if index not in cache:
            cache[index] = read_tensors(converted(key, dialect, contract))
        return cache[index]

    return get


def _without_input_scales(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t for n, t in tensors.items() if not n.endswith((".input_scale", ".input_global_scale"))}


def _assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype, name
        assert_bytes_equal(actual[name], tensor)


@pytest.mark.parametrize(("key", "contract", "dialect"), CASES)
@pytest.mark.parametrize("layout", ["grouped", "sequential"])
def test_live_update_equals_the_converted_checkpoint(key, contract, dialect, layout, model, converted_tensors):
    hf, config = model(key)
    megatron = hf_to_megatron(hf, key, config, expert_layout=layout)
    exported = dict(export_hf(megatron.items(), contract=contract, family=key, config=config, dialect=dialect))
    _assert_same(exported, _without_input_scales(converted_tensors(key, contract, dialect)))


@pytest.mark.parametrize(("key", "contract", "dialect"), [CASES[0], CASES[4], CASES[6]])
def test_ep_ranks_together_export_the_whole_model(key, contract, dialect, model, converted_tensors):
    hf, config = model(key)
    together: dict[str, torch.Tensor] = {}
    for rank in range(2):
        megatron = hf_to_megatron(hf, key, config, ep_rank=rank, ep_size=2)
        for name, tensor in export_hf(
            megatron, contract=contract, family=key, config=config, dialect=dialect, ep_rank=rank, ep_size=2
        ):
            if name in together:  # non-expert tensors come from every rank, identical
                assert_bytes_equal(tensor, together[name])
            together[name] = tensor
    _assert_same(together, _without_input_scales(converted_tensors(key, contract, dialect)))


def test_input_scales_are_sent_only_when_asked(model, converted_tensors):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exported = dict(export_hf(megatron, contract=NVFP4_EXPERTS, family=None, config=config, include_input_scale=True))
    # per-token contract: the 1.0 placeholder, exactly what the converted checkpoint holds
    _assert_same(exported, converted_tensors("qwen3_moe", NVFP4_EXPERTS, "modelopt"))
    assert_bytes_equal(exported["model.layers.0.mlp.experts.1.up_proj.input_scale"], torch.tensor(1.0))


def test_calibrated_input_scales_are_shared_by_fused_siblings(model):
    from fp4convert.contract import load_contract

    hf, config = model("qwen3_moe")
    contract = load_contract(NVFP4_EXPERTS)
    per_tensor = contract.model_copy(
        update={
            "formats": contract.formats.model_copy(
                update={"nvfp4": contract.formats.nvfp4.model_copy(update={"per_token_activations": False})}
            )
        }
    )
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    with pytest.raises(ConversionError, match=r"no calibrated amax"):
        next(export_hf(megatron, contract=per_tensor, family=None, config=config, include_input_scale=True))
    prefix = "model.layers.0.mlp.experts.2"
    calibration = {f"{prefix}.gate_proj": 12.0, f"{prefix}.up_proj": 24.0, f"{prefix}.down_proj": 6.0}
    calibration = {
        **{n.rsplit(".", 1)[0]: 1.0 for n in hf if ".experts." in n},
        **calibration,
    }
    exported = dict(
        export_hf(
            megatron,
            contract=per_tensor,
            family=None,
            config=config,
            include_input_scale=True,
            calibration=calibration,
        )
    )
    shared = torch.div(torch.tensor(24.0), torch.tensor(2688.0))  # ModelOpt's amax / (6 * 448), the max of the pair
    assert_bytes_equal(exported[f"{prefix}.gate_proj.input_scale"], shared)
    assert_bytes_equal(exported[f"{prefix}.up_proj.input_scale"], shared)
    assert_bytes_equal(exported[f"{prefix}.down_proj.input_scale"], torch.div(torch.tensor(6.0), torch.tensor(2688.0)))


def test_export_streams_one_group_at_a_time(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    pulled: list[str] = []

    def params() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in megatron.items():
            pulled.append(name)
            yield name, tensor

    stream = export_hf(params(), contract=NVFP4_EXPERTS, family="qwen3_moe", config=config)
    first = next(name for name, _ in stream if ".experts." in name)
    # One launch quantizes a layer's routed experts of one projection: their outputs come out as
    # soon as the last of their Megatron tensors is read, before anything after it.
    assert first == "model.layers.0.mlp.experts.0.down_proj.weight"
    group = [n for n in megatron if n.startswith("decoder.layers.0.mlp.experts.linear_fc2.")]
    assert len(group) == 4 and pulled[-1] == group[-1] and set(group) <= set(pulled)


def test_mla_pair_waits_for_its_second_member_only(model):
    hf, config = model("deepseek_v3")
    megatron = hf_to_megatron(hf, "deepseek_v3", config)
    order = list(megatron)
    q_down = "decoder.layers.1.self_attention.linear_q_down_proj.weight"
    kv_down = "decoder.layers.1.self_attention.linear_kv_down_proj.weight"
    seen: list[str] = []

    def params() -> Iterator[tuple[str, torch.Tensor]]:
        for name in order:
            seen.append(name)
            yield name, megatron[name]

    pair = ("model.layers.1.self_attn.q_a_proj.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight")
    for name, _ in export_hf(params(), contract=DEEPSEEK_NVFP4, family="deepseek_v3", config=config):
        if name in pair:
            # held until its sibling arrived, then sent right away
            assert q_down in seen and kv_down in seen
            assert seen[-1] in (q_down, kv_down)
            break
    else:
        raise AssertionError("the MLA pair was never exported")


def test_incomplete_group_is_an_error(model):
    hf, config = model("deepseek_v3")
    megatron = hf_to_megatron(hf, "deepseek_v3", config)
    del megatron["decoder.layers.1.self_attention.linear_kv_down_proj.weight"]
    with pytest.raises(MappingError, match=r"fused groups left incomplete: `model\.layers\.1\.self_attn\.kv_a_proj"):
        list(export_hf(megatron, contract=DEEPSEEK_NVFP4, family="deepseek_v3", config=config))


def test_tensor_parallel_shard_is_refused(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    name = "decoder.layers.0.mlp.experts.linear_fc2.weight1"
    shard = {name: megatron[name][:, :16]}
    with pytest.raises(
        MappingError,
        match=r"gives `model\.layers\.0\.mlp\.experts\.1\.down_proj\.weight` the shape "
        r"\(64, 16\), but the config says \(64, 32\)",
    ):
        list(export_hf(shard, contract=NVFP4_EXPERTS, family="qwen3_moe", config=config))


def test_unknown_names_and_bad_ep_positions_are_refused(model):
    _, config = model("qwen3_moe")
    with pytest.raises(MappingError, match=r"`decoder\.layers\.0\.mlp\.nonsense\.weight` is not a qwen3_moe tensor"):
        list(
            export_hf(
                {"decoder.layers.0.mlp.nonsense.weight": torch.zeros(2, 16)},
                contract=NVFP4_EXPERTS,
                family=None,
                config=config,
            )
        )
    with pytest.raises(MappingError, match=r"4 experts cannot be split over EP size 3"):
        next(export_hf({}, contract=NVFP4_EXPERTS, family=None, config=config, ep_size=3))
    with pytest.raises(MappingError, match=r"names expert 2, but there are 2 experts here"):
        list(
            export_hf(
                {"decoder.layers.0.mlp.experts.linear_fc2.weight2": torch.zeros(64, 32)},
                contract=NVFP4_EXPERTS,
                family=None,
                config=config,
                ep_rank=1,
                ep_size=2,
            )
        )


def test_family_must_match_the_config(model):
    _, config = model("qwen3_moe")
    with pytest.raises(MappingError, match=r"family 'deepseek_v3' does not match the config's architecture"):
        next(export_hf({}, contract=NVFP4_EXPERTS, family="deepseek_v3", config=config))


def test_dialect_that_cannot_hold_the_contract_is_refused_before_any_tensor(model):
    _, config = model("qwen3_moe")
    with pytest.raises(ConversionError, match=r"dialect 'sglang-mxfp8' cannot store nvfp4 tensors"):
        next(export_hf({}, contract=NVFP4_EXPERTS, family=None, config=config, dialect="sglang-mxfp8"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("key", "contract", "dialect"), [CASES[0], CASES[4], CASES[6]])
def test_cuda_export_equals_the_converted_checkpoint(key, contract, dialect, model, converted_tensors):
    hf, config = model(key)
    megatron = {n: t.cuda() for n, t in hf_to_megatron(hf, key, config).items()}
    exported = {
        n: t.cpu() for n, t in export_hf(megatron, contract=contract, family=key, config=config, dialect=dialect)
    }
    _assert_same(exported, _without_input_scales(converted_tensors(key, contract, dialect)))


def test_learner_parameters_export_without_autograd(model):
    hf, config = model("qwen3_moe")
    params = {n: torch.nn.Parameter(t.float()) for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    for name, tensor in export_hf(params, contract=NVFP4_EXPERTS, family=None, config=config):
        assert torch.is_grad_enabled()  # the caller's grad mode is untouched between tensors
        assert not tensor.requires_grad and type(tensor) is torch.Tensor, name
    report = validate_export(
        dict(export_hf(params, contract=NVFP4_EXPERTS, family=None, config=config)),
        params,
        contract=NVFP4_EXPERTS,
        family=None,
        config=config,
    )
    assert report.ok
