"""The faults real exporters make, injected into exports of tiny real models: validate_export catches
each one, and its message points at the cause.

Each faulty export is produced the way a faulty exporter would produce it (a contract with the
exception dropped, another quantizer profile, members quantized one by one, an older master, the
wrong EP rank's naming), never by editing expected strings into a report.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from _helpers import NVFP4_EXPERTS

from fp4convert import export_hf, validate_export
from fp4convert.contract import load_contract
from fp4convert.families import hf_to_megatron
from fp4convert.formats import profiles
from fp4convert.formats.codecs import nan_ignoring_abs, pack_fp4
from fp4convert.megatron import ExportReport
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.plan import export_plan

DEEPSEEK_NVFP4 = Path(__file__).parent / "data" / "deepseek-nvfp4-mla-bf16.yaml"
LAST_15PCT = "nvfp4-experts-per-token-last15pct-bf16"
EXPERT = "model.layers.0.mlp.experts.1"


def _export(model, key, contract, **kwargs) -> dict[str, torch.Tensor]:
    hf, config = model(key)
    return dict(export_hf(hf_to_megatron(hf, key, config), contract=contract, family=key, config=config, **kwargs))


def _validate(model, key, exported, contract, **kwargs) -> ExportReport:
    hf, config = model(key)
    report = validate_export(
        exported, hf_to_megatron(hf, key, config), contract=contract, family=key, config=config, **kwargs
    )
    assert not report.ok
    return report


def _causes(report: ExportReport) -> set[str]:
    return {f.cause for f in report.findings}


def _separately(model, key, contract, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors of one fused group exported the faulty way: each member with its own amax."""
    hf, config = model(key)
    plan = export_plan(contract=contract, config=config)
    return dict(encode_group(plan, [plan.item(n) for n in names], [hf[n] for n in names], shared=False))


def test_gate_and_up_quantized_with_separate_scales(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    names = [f"{EXPERT}.gate_proj.weight", f"{EXPERT}.up_proj.weight"]
    faulty = {**exported, **_separately(model, "qwen3_moe", NVFP4_EXPERTS, names)}
    report = _validate(model, "qwen3_moe", faulty, NVFP4_EXPERTS)
    assert {f.check for f in report.findings} == {"shared-scale", "bytes"}
    shared = next(f for f in report.findings if f.check == "shared-scale")
    assert re.fullmatch(r"fused siblings carry different weight_scale_2 \(gate_proj \S+, up_proj \S+\)", shared.detail)
    assert _causes(report) == {
        "gate_proj and up_proj global scales differ: the exporter quantized gate_proj and up_proj separately "
        "(each its own amax) instead of with one shared amax"
    }


def test_mla_q_a_and_kv_a_quantized_with_separate_scales(model, deepseek_nvfp4):
    exported = _export(model, "deepseek_v3", DEEPSEEK_NVFP4)
    names = ["model.layers.1.self_attn.q_a_proj.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]
    faulty = {**exported, **_separately(model, "deepseek_v3", DEEPSEEK_NVFP4, names)}
    report = _validate(model, "deepseek_v3", faulty, DEEPSEEK_NVFP4)
    assert _causes(report) == {
        "q_a_proj and kv_a_proj_with_mqa global scales differ: the exporter quantized q_a_proj and "
        "kv_a_proj_with_mqa separately (each its own amax) instead of with one shared amax"
    }


def test_a_last_n_bf16_layer_quantized(model):
    contract = load_contract(LAST_15PCT)
    ignores_counts = contract.model_copy(
        update={"bf16_exceptions": contract.bf16_exceptions.model_copy(update={"last_layers": 0})}
    )
    report = _validate(model, "qwen3_moe", _export(model, "qwen3_moe", ignores_counts), contract)
    cause = (
        "the contract keeps it BF16 (bf16 from bf16_exceptions.last_layers: layer 2 is among the last 1 "
        "(15% (ceil)) of 3 decoder layers), but the export quantized it to nvfp4: the exporter ignores this BF16 "
        "exception"
    )
    assert _causes(report) == {cause}
    assert {f.check for f in report.findings} == {"dtype", "extra"}
    assert all(".layers.2.mlp.experts." in f.tensor for f in report.findings)
    weight = next(f for f in report.findings if f.tensor == "model.layers.2.mlp.experts.0.up_proj.weight")
    assert weight.detail == "U8 [32, 32], expected BF16 [32, 64]"


def test_mla_kv_b_proj_quantized(model):
    contract = load_contract(DEEPSEEK_NVFP4)
    names = contract.bf16_exceptions.names.model_copy(update={"hf": (), "megatron": ()})
    ignores_names = contract.model_copy(
        update={"bf16_exceptions": contract.bf16_exceptions.model_copy(update={"names": names})}
    )
    report = _validate(model, "deepseek_v3", _export(model, "deepseek_v3", ignores_names), contract)
    assert {f.tensor.rsplit(".", 2)[-2] for f in report.findings} == {"kv_b_proj"}
    assert _causes(report) == {
        "the contract keeps it BF16 (bf16 from bf16_exceptions.names.hf[0]: HF name contains '.kv_b_proj.'), "
        "but the export quantized it to nvfp4: the exporter ignores this BF16 exception"
    }


def test_a_tensor_the_contract_quantizes_sent_in_bf16(model):
    hf, _ = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    module = f"{EXPERT}.down_proj"
    for suffix in ("weight_scale", "weight_scale_2"):
        del exported[f"{module}.{suffix}"]
    exported[f"{module}.weight"] = hf[f"{module}.weight"]
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS)
    assert {f.check for f in report.findings} == {"dtype", "missing"}
    assert _causes(report) == {
        "the contract gives it nvfp4 (nvfp4 from rules[2]: 'routed_experts_fc2_nvfp4': megatron glob "
        "'*.mlp.experts.linear_fc2'; the most specific of 2 matching rules), but the export sent BF16: the exporter "
        "skipped it"
    }


def test_modelopt_division_order(model):
    modelopt = load_contract(NVFP4_EXPERTS).model_copy(update={"quantizer": "modelopt"})
    report = _validate(model, "qwen3_moe", _export(model, "qwen3_moe", modelopt), NVFP4_EXPERTS)
    assert {f.check for f in report.findings} == {"bytes"}
    assert _causes(report) == {
        "bytes match the modelopt profile, not te: the exporter uses ModelOpt's division order (x / (sf * s2)), "
        "the contract TransformerEngine >= 2.14's order (block amax times S_enc/6)"
    }


def test_exporter_using_4over6_against_a_plain_contract(model):
    contract = load_contract(NVFP4_EXPERTS)
    recipe = contract.formats.nvfp4.model_copy(update={"four_over_six": "mse", "four_over_six_e4m3_max": 256})
    four = contract.model_copy(update={"formats": contract.formats.model_copy(update={"nvfp4": recipe})})
    report = _validate(model, "qwen3_moe", _export(model, "qwen3_moe", four), NVFP4_EXPERTS)
    assert {f.check for f in report.findings} == {"bytes"}
    assert _causes(report) == {
        "bytes match the te-4over6-mse-256 profile, not te: the exporter uses TransformerEngine's 4over6 "
        "(map-to-4 or 6 by MSE, global bound 256), the contract TransformerEngine >= 2.14's order "
        "(block amax times S_enc/6)"
    }


def test_global_scale_one_ulp_off(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    name = f"{EXPERT}.down_proj.weight_scale_2"
    expected = exported[name]
    exported[name] = torch.nextafter(expected, torch.tensor(1.0))
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS)
    [finding] = report.findings
    assert (finding.tensor, finding.check) == (name, "bytes")
    assert finding.detail == f"{exported[name].item():.9g} vs expected {expected.item():.9g} (+1 ulp)"
    assert finding.cause == (
        "weight_scale_2 is 1 ulp above the reference while data and block scales match: the exporter computes the "
        "global scale with an approximate reciprocal or division (fast math)"
    )


def _encode_with_decode_scale(x: torch.Tensor, nudge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TE's chain for one tensor, but with S_dec ``nudge`` ulps off rn(1/S_enc), used to encode too."""
    x = x.float()
    rows, cols = x.shape
    outer = profiles.outer_scales(nan_ignoring_abs(x).amax().reshape(1, 1), "te")
    s_dec = outer.s_dec
    for _ in range(abs(nudge)):
        s_dec = torch.nextafter(s_dec, torch.tensor(0.0 if nudge < 0 else 1.0))
    outer = replace(outer, s_dec=s_dec)
    blocks = x.reshape(rows, cols // 16, 16)
    scale = profiles.block_scale_bytes(nan_ignoring_abs(blocks).amax(dim=-1), outer, "te")
    data = pack_fp4(profiles.encode_blocks(blocks, scale, outer, "te").reshape(rows, cols))
    return data, scale.view(torch.float8_e4m3fn), s_dec.reshape(())


def test_approximate_reciprocal_used_to_encode(model):
    """The exporter's S_dec is rn(1/S_enc) minus one ulp, and it encodes the blocks with it."""
    hf, _ = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    # a lone tensor (no fused sibling) whose codes the one-ulp error moves; on most tensors it moves none
    for module in (n.removesuffix(".weight") for n in hf if ".experts." in n and n.endswith(".down_proj.weight")):
        data, scale, s_dec = _encode_with_decode_scale(hf[f"{module}.weight"], -1)
        if not torch.equal(data, exported[f"{module}.weight"]):
            break
    else:
        raise AssertionError("no tensor of the fixture is sensitive to a one-ulp decode scale")
    exported.update({f"{module}.weight": data, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": s_dec})
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS)
    assert _causes(report) == {
        "weight_scale_2 is 1 ulp below the reference, and the data is what that scale encodes: the exporter's "
        "scale chain uses an approximate reciprocal (fast math) instead of round-to-nearest 1/S_enc"
    }


def test_stale_tensors_from_an_older_step(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    generator = torch.Generator().manual_seed(7)
    older = {
        n: (t.float() - 1e-2 * torch.randn(t.shape, generator=generator)).to(t.dtype) for n, t in megatron.items()
    }
    stale = dict(export_hf(older, contract=NVFP4_EXPERTS, family=None, config=config))
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    names = [n for n in stale if n.startswith(f"{EXPERT}.down_proj.") or n == "model.layers.1.mlp.up_proj.weight"]
    report = _validate(model, "qwen3_moe", {**exported, **{n: stale[n] for n in names}}, NVFP4_EXPERTS)
    assert {f.tensor for f in report.findings} == {f"{EXPERT}.down_proj.weight", "model.layers.1.mlp.up_proj.weight"}
    assert _causes(report) == {
        "bytes match no variant of the master's tensor (the contract's arithmetic, other profiles, separate scales, "
        "other experts): the export holds other values than this master: a stale tensor from an older step, or an "
        "export of another master?",
        "the BF16 values differ from the master's and match no other expert: a stale tensor from an older step, "
        "or an export of another master?",
    }
    bf16 = next(f for f in report.findings if f.tensor == "model.layers.1.mlp.up_proj.weight")
    assert re.fullmatch(
        r"\d+ of 6144 elements differ; first at flat index \d+: exported \S+ vs master \S+", bf16.detail
    )


def test_first_differing_block_shows_both_sides_dequantized_and_the_master(model):
    hf, _ = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    name = f"{EXPERT}.down_proj.weight"
    data = exported[name].clone()
    data[3, 5] ^= 0x0F  # element 10 of block 0 of row 3 gets the other low nibble code
    exported[name] = data
    [finding] = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS).findings
    master = " ".join(f"{v:.4g}" for v in hf[name][3, :16].float().tolist())
    assert finding.detail.startswith("1 of 1024 bytes differ; first at row 3, block 0: exported [")
    assert finding.detail.endswith(f"(master [{master}])")
    exported_values, expected_values = re.findall(r"\[([^\]]*)\]", finding.detail)[:2]
    differ = [
        i for i, (a, b) in enumerate(zip(exported_values.split(), expected_values.split(), strict=True)) if a != b
    ]
    assert differ == [10]


@pytest.mark.parametrize("master_names", ["hf", "megatron"])
def test_expert_ids_not_offset_by_the_ep_rank(master_names, model):
    hf, config = model("qwen3_moe")
    rank_one = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2)
    # the exporter holds EP rank 1's experts but names them as rank 0 would (local ids 0-1)
    faulty = dict(export_hf(rank_one, contract=NVFP4_EXPERTS, family=None, config=config, ep_rank=0, ep_size=2))
    master = hf if master_names == "hf" else rank_one
    report = validate_export(faulty, master, contract=NVFP4_EXPERTS, family=None, config=config, ep_rank=1, ep_size=2)
    assert {f.check for f in report.findings} == {"missing", "extra"}
    extra = next(f for f in report.findings if f.tensor == "model.layers.0.mlp.experts.0.up_proj.weight")
    assert extra.detail == "expert 0 belongs to EP rank 0, not rank 1 (experts 2-3)"
    assert extra.cause == (
        "matches expert 2 of the master, named expert 0: EP offset missing? (EP rank 1 holds experts 2-3; "
        "global id = ep_rank x experts per rank + local id)"
    )
    missing = next(f for f in report.findings if f.tensor == "model.layers.2.mlp.experts.3.down_proj.weight_scale")
    assert missing.check == "missing" and missing.cause.startswith("matches expert 3 of the master, named expert 1")
    assert all(f.cause for f in report.findings)


def test_expert_ids_not_offset_seen_without_ep_arguments(model):
    hf, config = model("qwen3_moe")
    rank_one = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2)
    faulty = dict(export_hf(rank_one, contract=NVFP4_EXPERTS, family=None, config=config, ep_rank=0, ep_size=2))
    report = validate_export(faulty, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    bytes_finding = next(f for f in report.findings if f.check == "bytes")
    assert bytes_finding.cause.startswith(
        "matches expert 2 of the master, named expert 0: EP offset missing? (the "
        "export holds 2 experts per layer named 0-1"
    )
    assert all(f.cause for f in report.findings)


def test_input_scale_sent_in_a_live_update(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS, include_input_scale=True)
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS)
    assert {f.check for f in report.findings} == {"input-scale"} and len(report.findings) == 24
    assert _causes(report) == {
        "live updates never re-send input_scale: the engine keeps the activation scale loaded with the converted "
        "checkpoint (pass include_input_scale=True if this exporter is meant to send it)"
    }
    hf, config = model("qwen3_moe")
    assert validate_export(
        exported, hf, contract=NVFP4_EXPERTS, family=None, config=config, include_input_scale=True
    ).ok


def test_input_scale_the_contract_forbids(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS, dialect="compressed-tensors")
    name = f"{EXPERT}.up_proj.input_global_scale"
    exported[name] = torch.ones(1)
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS, dialect="compressed-tensors")
    assert [(f.tensor, f.check, f.cause) for f in report.findings] == [
        (
            name,
            "input-scale",
            "the contract forbids it: activations are scaled per token (per_token_activations: "
            "true), and dialect compressed-tensors stores no input_global_scale",
        )
    ]


def test_a_wrong_input_scale_value_when_input_scales_are_sent(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS, include_input_scale=True)
    name = f"{EXPERT}.up_proj.input_scale"
    exported[name] = torch.tensor(0.5)
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS, include_input_scale=True)
    assert [(f.tensor, f.check, f.detail) for f in report.findings] == [(name, "input-scale", "0.5, expected 1")]


def test_a_broken_shared_scale_is_reported_on_the_member_that_broke_it(model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    gate = f"{EXPERT}.gate_proj.weight_scale_2"  # the group's first member is the wrong one
    exported[gate] = torch.nextafter(exported[gate], torch.tensor(1.0))
    report = _validate(model, "qwen3_moe", exported, NVFP4_EXPERTS)
    assert [(f.tensor, f.check) for f in report.findings] == [(gate, "shared-scale"), (gate, "bytes")]
