"""validate_export: exact exports pass, and each fault real exporters make is caught and explained.

Every export here is made from the tiny real models' Megatron tensors (built from the HF model by
the family transforms); faults are injected the way a faulty exporter would produce them (the same
quantizer with the mistake replayed), never by hand-written expected bytes.
"""

from __future__ import annotations

import re

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from bridge.helpers import CASE_IDS, CASES, INPUT_SCALES, LAST_LAYERS_BF16, NVFP4_ALL

from fp4convert.bridge import export_hf
from fp4convert.bridge import validate_export as validate_export_default
from fp4convert.bridge.tables import model_tables
from fp4convert.contract import load_contract
from fp4convert.convert.groups import quantize_members
from fp4convert.dialects import get_dialect
from fp4convert.errors import MappingError, VerificationError

EXPERT = "model.layers.0.mlp.experts.1"


def _export(megatron_state, config, model="qwen3_moe", contract=NVFP4_EXPERTS, **kwargs):
    ep = {k: kwargs.pop(k) for k in ("ep_rank", "ep_size") if k in kwargs}
    state = kwargs.pop("state", None) or megatron_state(model, **ep)
    return dict(export_hf(state, contract=contract, config=config(model), **ep, **kwargs))


def _requantize(exported, hf, names, *, contract=NVFP4_EXPERTS, model_config, profile="te", separately=False):
    """Replace the exported tensors of ``names`` by what a faulty exporter computes from ``hf``."""
    tables = model_tables(contract, model_config)
    groups = [[n] for n in names] if separately else [names]
    for group in groups:
        items = [tables.planned(n) for n in group]
        out = quantize_members(items, [hf[n] for n in group], dialect=get_dialect("modelopt"), profile=profile)
        exported.update({k: v for k, v in out.items() if not k.endswith(INPUT_SCALES)})
    return exported


@pytest.fixture(autouse=True, params=[False, True], ids=["per-tensor", "stacked"])
def stack(request):
    """Every test runs both reference strategies: one quantizer call per tensor (the CPU default)
    and per stacked batch (the CUDA default); the verdicts and findings must be the same."""
    return request.param


@pytest.fixture
def validate_export(stack):
    return lambda *args, **kwargs: validate_export_default(*args, stack=stack, **kwargs)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def _failures(report) -> dict[str, list]:
    return {r.name: r.findings for r in report.failures}


@pytest.mark.parametrize(("model", "dialect", "contract"), CASES, ids=CASE_IDS)
def test_an_exact_export_passes_against_megatron_and_hf_masters(
    validate_export, model, dialect, contract, megatron_state, hf_state, config
):
    exported = _export(megatron_state, config, model, contract, dialect=dialect)
    kwargs = {"contract": contract, "config": config(model), "dialect": dialect}
    for master in (megatron_state(model), hf_state(model)):
        report = validate_export(exported, master, **kwargs)
        assert report.ok, "\n".join(report.lines())
        assert report.counts()["expected"] == len(hf_state(model))
        assert report.summary().startswith(f"OK: {len(hf_state(model))} tensors follow contract ")
        report.raise_for_failures()  # no-op


def test_a_converted_checkpoint_passes_when_input_scales_are_expected(
    validate_export, converted_tensors, hf_state, config
):
    checkpoint = converted_tensors("qwen3_moe", "modelopt", NVFP4_EXPERTS)
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    assert validate_export(checkpoint, hf_state("qwen3_moe"), include_input_scale=True, **kwargs).ok
    report = validate_export(checkpoint, hf_state("qwen3_moe"), **kwargs)  # a live update must not carry them
    assert {f.check for fs in _failures(report).values() for f in fs} == {"input-scale"}
    assert report.counts()["input-scale"] == 24


def test_gate_and_up_quantized_with_separate_scales(validate_export, megatron_state, hf_state, config):
    hf = hf_state("qwen3_moe")
    gate, up = f"{EXPERT}.gate_proj.weight", f"{EXPERT}.up_proj.weight"
    exported = _requantize(
        _export(megatron_state, config), hf, [gate, up], model_config=config("qwen3_moe"), separately=True
    )
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    failures = _failures(report)
    (group,) = failures[f"{EXPERT}.gate_up"]
    assert group.check == "shared-scale"
    assert group.detail.startswith("gate/up global scales differ: gate_proj ")
    assert group.cause == (
        "exporter quantized gate_proj and up_proj separately: each weight_scale_2 is its own tensor's amax "
        "scale, not the group's shared one"
    )
    # The sibling with the larger amax is unchanged; the other one's bytes are explained.
    smaller = gate if hf[gate].float().abs().amax() < hf[up].float().abs().amax() else up
    assert set(failures) == {f"{EXPERT}.gate_up", smaller}
    (finding,) = failures[smaller]
    assert finding.check == "bytes"
    assert finding.cause == (
        f"the exporter quantized gate_proj and up_proj separately: these bytes use {smaller.split('.')[-2]}'s own "
        "amax instead of the gate/up group's shared amax"
    )


def test_a_last_layer_the_contract_keeps_bf16_was_quantized(validate_export, megatron_state, config):
    exported = _export(megatron_state, config, contract=NVFP4_EXPERTS)  # the exporter ignores last_layers
    report = validate_export(
        exported, megatron_state("qwen3_moe"), contract=LAST_LAYERS_BF16, config=config("qwen3_moe")
    )
    failures = _failures(report)
    assert sorted(failures) == sorted(
        f"model.layers.2.mlp.experts.{e}.{p}_proj.weight" for e in range(4) for p in ("gate", "up", "down")
    )
    (finding,) = failures["model.layers.2.mlp.experts.3.down_proj.weight"]
    assert finding.check == "format"
    assert finding.detail == (
        "exported as nvfp4 (weight U8, weight_scale F8_E4M3, weight_scale_2 F32), but the contract keeps it BF16: "
        "bf16 from bf16_exceptions.last_layers: layer 2 is among the last 1 (15% (ceil)) of 3 decoder layers"
    )
    assert finding.cause.startswith(
        "the exporter quantized a tensor the contract keeps in BF16: it ignores bf16_exceptions.last_layers"
    )
    assert report.counts()["extra"] == 0  # the stray scales are part of the format finding


def test_mla_kv_b_proj_quantized(validate_export, megatron_state, config):
    strict = load_contract(NVFP4_ALL)
    loose = strict.model_validate(
        {
            **strict.canonical_dict(),
            "bf16_exceptions": {**strict.canonical_dict()["bf16_exceptions"], "names": {"hf": [], "megatron": []}},
        }
    )
    exported = _export(megatron_state, config, "deepseek_v3", contract=loose)
    report = validate_export(exported, megatron_state("deepseek_v3"), contract=NVFP4_ALL, config=config("deepseek_v3"))
    failures = _failures(report)
    # Layer 2 is BF16 anyway (last layer); layers 0, 1 and the MTP layer 3 carry a quantized kv_b_proj.
    assert sorted(failures) == [f"model.layers.{n}.self_attn.kv_b_proj.weight" for n in (0, 1, 3)]
    (finding,) = failures["model.layers.0.self_attn.kv_b_proj.weight"]
    assert finding.check == "format"
    assert finding.detail.endswith(
        "but the contract keeps it BF16: bf16 from bf16_exceptions.names.hf[0]: HF name contains '.kv_b_proj.'"
    )
    assert "ignores bf16_exceptions.names.hf[0] (HF name contains '.kv_b_proj.')" in finding.cause


@pytest.mark.parametrize("profile", ["modelopt", "te-2.13"])
def test_an_arithmetic_profile_mismatch_is_named(validate_export, profile, megatron_state, hf_state, config):
    hf = hf_state("qwen3_moe")
    master = megatron_state("qwen3_moe")
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    reference = _export(megatron_state, config)
    # The exporter runs the other profile on every expert; some tensors' bytes differ (te-2.13: ~0.1% of blocks).
    prefixes = [f"model.layers.{layer}.mlp.experts.{e}" for layer in (0, 2) for e in range(4)]
    names = [f"{prefix}.{p}_proj.weight" for prefix in prefixes for p in ("gate", "up", "down")]
    exported = dict(reference)
    for prefix in prefixes:
        _requantize(
            exported,
            hf,
            [f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"],
            model_config=config("qwen3_moe"),
            profile=profile,
        )
        _requantize(exported, hf, [f"{prefix}.down_proj.weight"], model_config=config("qwen3_moe"), profile=profile)
    changed = [
        n for n in names if any(not _same(exported[k], reference[k]) for k in (n, n + "_scale", n + "_scale_2"))
    ]
    assert changed  # precondition: the profiles differ on these weights
    report = validate_export(exported, master, **kwargs)
    failures = _failures(report)
    assert sorted(failures) == sorted(changed)
    for name in changed:
        (finding,) = failures[name]
        assert finding.cause.startswith(
            f"bytes match the {profile} profile, not te (the contract's quantizer): "
            f"the exporter uses {profile}'s scale arithmetic"
        )


def test_a_scale_one_ulp_off_points_at_an_approximate_reciprocal(validate_export, megatron_state, config):
    exported = _export(megatron_state, config)
    name = f"{EXPERT}.down_proj.weight_scale_2"
    exported[name] = torch.nextafter(exported[name], torch.tensor(float("inf")))
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    (finding,) = _failures(report)[f"{EXPERT}.down_proj.weight"]
    assert re.fullmatch(
        r"weight_scale_2 \S+ \(0x[0-9a-f]{8}\) != expected \S+ \(0x[0-9a-f]{8}\), \+1 ulp; every "
        r"block scale and element matches",
        finding.detail,
    )
    assert finding.cause == (
        "weight_scale_2 is +1 ulp from the reference while every block scale and element matches: the exporter "
        "computes the outer scale with an approximate reciprocal (e.g. rcp.approx or fast-math 1/x) instead of "
        "a correctly rounded division"
    )


def test_a_stale_tensor_from_an_older_step(validate_export, megatron_state, config):
    master = megatron_state("qwen3_moe")
    fc1 = "decoder.layers.0.mlp.experts.linear_fc1.weight2"
    older = dict(master)
    noise = torch.randn(master[fc1].shape, generator=torch.Generator().manual_seed(7))
    older[fc1] = (master[fc1].float() + 0.05 * noise).to(torch.bfloat16)  # one optimizer step behind
    exported = _export(megatron_state, config)
    exported.update(dict(export_hf({fc1: older[fc1]}, contract=NVFP4_EXPERTS, config=config("qwen3_moe"))))
    report = validate_export(exported, master, contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    failures = _failures(report)
    assert sorted(failures) == [f"model.layers.0.mlp.experts.2.{p}_proj.weight" for p in ("gate", "up")]
    (finding,) = failures["model.layers.0.mlp.experts.2.gate_proj.weight"]
    assert "quantized from other weights (a stale tensor from an older step, or another master)" in finding.cause
    assert re.search(r"the outer scale encodes an amax of \S+ where the master's is \S+", finding.cause)
    # The first differing block, read independently from the bytes.
    gate = "model.layers.0.mlp.experts.2.gate_proj"
    reference = _export(megatron_state, config)
    ex_scale, ref_scale = (t[f"{gate}.weight_scale"].view(torch.uint8) for t in (exported, reference))
    ex_data, ref_data = (t[f"{gate}.weight"] for t in (exported, reference))
    differ = (ex_data != ref_data).reshape(32, 4, 8).any(-1) | (ex_scale != ref_scale)
    row, block = (int(i) for i in differ.nonzero()[0])
    assert finding.detail.startswith(
        f"{int(differ.sum())} of 128 blocks differ; first: row {row}, block {block} (cols {16 * block}-"
        f"{16 * block + 15}): scale {int(ex_scale[row, block]):#04x} vs expected {int(ref_scale[row, block]):#04x}, "
        "values ["
    )
    master_gate = master[fc1][:32].float()[row, 16 * block : 16 * block + 16]
    assert f"(master [{', '.join(f'{v:.4g}' for v in master_gate.tolist())}])" in finding.detail
    assert re.search(
        r"; weight_scale_2 \S+ \(0x[0-9a-f]{8}\) != expected \S+ \(0x[0-9a-f]{8}\), [+-]\d+ ulp$", finding.detail
    )


def test_a_corrupted_byte_is_located_without_blaming_the_weights(validate_export, megatron_state, config):
    exported = _export(megatron_state, config)
    name = f"{EXPERT}.down_proj.weight"
    exported[name] = exported[name].clone()
    exported[name][5, 9] ^= 0x70  # the high nibble of byte 9 is element 19 of row 5: block 1 (down_proj: 64 x 32)
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    (finding,) = _failures(report)[name]
    scale = exported[f"{EXPERT}.down_proj.weight_scale"].view(torch.uint8)[5, 1]
    assert finding.detail.startswith(
        f"1 of 128 blocks differ; first: row 5, block 1 (cols 16-31): scale {int(scale):#04x} vs expected "
        f"{int(scale):#04x}, values ["
    )
    assert "the outer scale matches and 1 of 128 blocks differ" in finding.cause
    assert "stale" in finding.cause and "corrupted bytes" in finding.cause


def test_a_bf16_tensor_from_another_master(validate_export, megatron_state, hf_state, config):
    exported = _export(megatron_state, config)
    router = "model.layers.0.mlp.gate.weight"
    exported[router] = hf_state("qwen3_moe")["model.layers.2.mlp.gate.weight"]
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    (finding,) = _failures(report)[router]
    assert re.fullmatch(
        r"\d+ of 256 values differ; first at \[0, 0\]: exported \S+, master \S+; max \|difference\| "
        r"\S+",
        finding.detail,
    )
    assert finding.cause == "not the master's values: a stale tensor from an older step, or another master"


def test_expert_ids_not_offset_by_the_ep_rank(validate_export, megatron_state, hf_state, config):
    rank1 = megatron_state("qwen3_moe", ep_rank=1, ep_size=2)  # global experts 2, 3 as local 0, 1
    # The faulty exporter names rank 1's local experts as if it were rank 0.
    exported = _export(megatron_state, config, state=rank1, ep_rank=0, ep_size=2)
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    report = validate_export(exported, rank1, ep_rank=1, ep_size=2, **kwargs)
    failures = _failures(report)
    where = "EP rank 1 of 2 holds experts 2-3; global id = local id + 1 x 2"
    (extra,) = failures["model.layers.0.mlp.experts.0.gate_proj.weight"]
    assert extra.check == "extra"
    assert extra.detail.endswith("expert 0 is not on EP rank 1 of 2, which holds experts 2-3")
    assert extra.cause == f"bytes match expert 2 of the master, exported as expert 0: EP offset missing? ({where})"
    (missing,) = failures["model.layers.2.mlp.experts.3.down_proj.weight"]
    assert missing.check == "missing"
    assert missing.cause == (
        f"its bytes were exported as `model.layers.2.mlp.experts.1.down_proj.weight`: EP offset missing? ({where})"
    )
    # Checked as a whole model against the HF master: the misnamed experts differ and are explained.
    report = validate_export(exported, hf_state("qwen3_moe"), **kwargs)
    (wrong,) = _failures(report)["model.layers.0.mlp.experts.1.up_proj.weight"]
    assert wrong.check == "bytes"
    assert wrong.cause == (
        "bytes match expert 3 of the master, expected expert 1: EP offset missing? (global id = local id + "
        "ep_rank x experts per rank)"
    )


def test_an_hf_master_is_restricted_to_the_experts_of_the_ep_rank(validate_export, megatron_state, hf_state, config):
    exported = _export(megatron_state, config, ep_rank=1, ep_size=2)
    kwargs = {"contract": NVFP4_EXPERTS, "config": config("qwen3_moe")}
    report = validate_export(exported, hf_state("qwen3_moe"), ep_rank=1, ep_size=2, **kwargs)
    assert report.ok, "\n".join(report.lines())
    assert report.counts()["expected"] == len(hf_state("qwen3_moe")) - 12  # experts 0 and 1 of 2 MoE layers
    whole = validate_export(exported, hf_state("qwen3_moe"), **kwargs)  # as if one rank held every expert
    assert whole.counts()["missing"] == 12 and whole.counts()["failed"] == 12


def test_input_scale_in_a_live_update(validate_export, megatron_state, config):
    exported = _export(megatron_state, config, include_input_scale=True)
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    (finding,) = _failures(report)[f"{EXPERT}.up_proj.weight"]
    assert finding.check == "input-scale"
    assert finding.detail.startswith(f"`{EXPERT}.up_proj.input_scale` is in the export, but a live update must not")
    assert report.counts() == {**report.counts(), "input-scale": 24, "extra": 0, "bytes": 0}


def test_missing_wrong_dtype_and_unknown_tensors(validate_export, megatron_state, config):
    exported = _export(megatron_state, config)
    del exported[f"{EXPERT}.gate_proj.weight_scale_2"]
    exported[f"{EXPERT}.down_proj.weight_scale_2"] = exported[f"{EXPERT}.down_proj.weight_scale_2"].half()
    del exported["model.norm.weight"]
    exported["model.layers.0.mlp.shared_expert.weight"] = torch.zeros(2)
    report = validate_export(exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    failures = _failures(report)
    assert [f.detail for f in failures[f"{EXPERT}.gate_proj.weight"]] == [
        "lacks weight_scale_2 (2 of 3 tensors present)"
    ]
    assert [f.detail for f in failures[f"{EXPERT}.down_proj.weight"]] == [
        f"`{EXPERT}.down_proj.weight_scale_2` is F16, expected F32"
    ]
    assert [f.detail for f in failures["model.norm.weight"]] == ["not in the export (expected `model.norm.weight`)"]
    assert [f.detail for f in failures["model.layers.0.mlp.shared_expert.weight"]] == [
        "not a tensor of this qwen3_moe model in dialect modelopt: `model.layers.0.mlp.shared_expert.weight`"
    ]
    counts = report.counts()
    assert (counts["missing"], counts["dtype"], counts["extra"], counts["failed"]) == (2, 1, 1, 4)
    with pytest.raises(VerificationError, match=r"^FAILED: 4 of \d+ results fail \(2 missing, 1 extra, 1 dtype\)"):
        report.raise_for_failures()


def test_the_report_as_json(validate_export, megatron_state, config):
    exported = _export(megatron_state, config)
    del exported["model.norm.weight"]
    data = validate_export(
        exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe")
    ).to_json()
    assert (data["ok"], data["dialect"], data["contract"], data["counts"]["missing"]) == (
        False,
        "modelopt",
        "nvfp4-experts-per-token",
        1,
    )
    norm = next(r for r in data["results"] if r["name"] == "model.norm.weight")
    assert norm == {
        "name": "model.norm.weight",
        "kind": "tensor",
        "ok": False,
        "format": "bf16",
        "rule": "non_gemm",
        "outputs": ["model.norm.weight"],
        "findings": [
            {"check": "missing", "cause": None, "detail": "not in the export (expected `model.norm.weight`)"}
        ],
    }


def test_an_incomplete_master_group_is_an_error(validate_export, megatron_state, config):
    master = megatron_state("deepseek_v3")
    del master["decoder.layers.0.self_attention.linear_kv_down_proj.weight"]
    with pytest.raises(
        MappingError,
        match=r"^the master lacks `model\.layers\.0\.self_attn\.kv_a_proj_with_mqa\."
        r"weight`, which shares one outer scale with",
    ):
        validate_export({}, master, contract=NVFP4_ALL, config=config("deepseek_v3"))


def test_the_diagnosis_limit_keeps_big_failures_cheap(validate_export, megatron_state, config):
    exported = _export(megatron_state, config)
    for name in [n for n in exported if n.endswith("weight_scale_2")]:
        exported[name] = exported[name] * 2
    report = validate_export(
        exported, megatron_state("qwen3_moe"), contract=NVFP4_EXPERTS, config=config("qwen3_moe"), diagnose=2
    )
    causes = [f.cause for r in report.failures for f in r.findings if f.check == "bytes"]
    assert len(causes) == 24 and sum(c is not None for c in causes) == 2
    assert any(
        f.detail == "bytes differ from the reference (not analysed: the diagnosis limit of 2 tensors was reached)"
        for r in report.failures
        for f in r.findings
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_validation_passes_and_catches_a_fault(validate_export, megatron_state, config):
    master = {n: t.cuda() for n, t in megatron_state("deepseek_v3").items()}
    kwargs = {"contract": NVFP4_ALL, "config": config("deepseek_v3")}
    exported = dict(export_hf(master, **kwargs))
    report = validate_export(exported, master, **kwargs)
    assert report.ok and report.device.startswith("cuda"), "\n".join(report.lines())
    name = "model.layers.0.mlp.experts.1.up_proj.weight_scale_2"
    exported[name] = torch.nextafter(exported[name], torch.tensor(float("inf"), device="cuda"))
    (finding,) = _failures(validate_export(exported, master, **kwargs))["model.layers.0.mlp.experts.1.up_proj.weight"]
    assert "+1 ulp" in finding.cause


def test_expert_fc1_batches_stack_whole_megatron_tensors(megatron_state, config):
    from fp4convert.bridge import ExportValidator

    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config("qwen3_moe"))
    plan = validator._plan(megatron_state("qwen3_moe"))
    wholes = [b.whole for unit in plan.units for b in unit.batches if b.whole is not None]
    # gate/up pairs come straight from each expert's linear_fc1 (no slicing); down_proj from linear_fc2
    assert [
        "decoder.layers.0.mlp.experts.linear_fc1.weight0",
        "decoder.layers.0.mlp.experts.linear_fc1.weight1",
        "decoder.layers.0.mlp.experts.linear_fc1.weight2",
        "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    ] in wholes
    assert len(wholes) == 4  # fc1 and fc2 batches of the 2 MoE layers
