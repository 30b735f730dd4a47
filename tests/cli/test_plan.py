"""``plan``: the library (decisions priced per tensor, totals) and the command (text, JSON, plot).

The DeepSeek-V3 checks reproduce the published figures from config.json alone: routed + shared
experts = (61 - 3) x (256 + 1) x 3 x 7168 x 2048 = 656.5B parameters, about 97.8% of the 671B
model, and MLA's kv_b_proj kept BF16 costs 32768 x 512 x 61 layers x 2 bytes = 1.906 GiB.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fp4convert.cli import main
from fp4convert.contract import Contract, load_contract
from fp4convert.families import inventory_from_config
from fp4convert.inventory import ModelInventory, Role, TensorInfo
from fp4convert.plan import Plan, build_plan, source_bytes

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
EXPERT_PARAMS = (61 - 3) * (256 + 1) * 3 * 7168 * 2048
KV_B_BF16_BYTES = 32768 * 512 * 61 * 2


def _contract(**fields: Any) -> Contract:
    return Contract.model_validate({"version": 1, "name": "test", "default": "bf16", **fields})


MXFP8_KEEP_KV_B = _contract(
    rules=[{"kind": "glob", "namespace": "hf", "pattern": "*", "format": "mxfp8"}],
    bf16_exceptions={"names": {"hf": [".kv_b_proj."]}, "mtp_layers": True, "shared_experts": False},
)


@pytest.fixture(scope="module")
def deepseek_plan() -> Plan:
    return build_plan(MXFP8_KEEP_KV_B, inventory_from_config("DeepSeek-V3"))


def test_deepseek_v3_experts_are_656_5b_params_97_8_percent(deepseek_plan: Plan) -> None:
    experts = deepseek_plan.experts()
    assert experts.params == EXPERT_PARAMS == 656_463_101_952
    assert round(experts.params / deepseek_plan.total().params, 3) == 0.978
    assert round(deepseek_plan.total().params / 1e9) == 671


def test_deepseek_v3_kv_b_proj_in_bf16_costs_1_906_gib(deepseek_plan: Plan) -> None:
    kv_b = [p for p in deepseek_plan.decoder() if p.info.name.endswith("self_attn.kv_b_proj.weight")]
    assert len(kv_b) == 61 and {p.format for p in kv_b} == {"bf16"}
    rules = {p.rule for p in kv_b}
    assert len(rules) == 1
    rule_totals = deepseek_plan.by_rule()[rules.pop()]
    assert rule_totals.bytes_after == KV_B_BF16_BYTES
    assert round(rule_totals.bytes_after / 2**30, 3) == 1.906


def test_totals_add_up(deepseek_plan: Plan) -> None:
    every = deepseek_plan.total(mtp=None)
    assert every.params == deepseek_plan.total().params + deepseek_plan.total(mtp=True).params
    assert sum(t.bytes_after for t in deepseek_plan.by_layer().values()) == every.bytes_after
    assert sum(t.tensors for t in deepseek_plan.by_role().values()) == deepseek_plan.total().tensors
    assert sum(t.bytes_before for t in deepseek_plan.by_rule().values()) == deepseek_plan.total().bytes_before
    assert sum(t.params for t in deepseek_plan.by_format().values()) == deepseek_plan.total().params


def test_bytes_per_format() -> None:
    tensors = (
        TensorInfo("model.layers.0.mlp.experts.0.down_proj.weight", (64, 128), layer=0, gemm_weight=True),
        TensorInfo("model.layers.0.mlp.down_proj.weight", (64, 128), layer=0, gemm_weight=True),
        TensorInfo("model.layers.0.self_attn.o_proj.weight", (64, 128), dtype="float32", layer=0, gemm_weight=True),
        TensorInfo("model.layers.0.mlp.gate.e_score_correction_bias", (64,), dtype="float32", layer=0),
    )
    contract = _contract(
        rules=[
            {"kind": "glob", "namespace": "hf", "pattern": "*.experts.*", "format": "nvfp4"},
            {
                "kind": "exact",
                "namespace": "hf",
                "pattern": "model.layers.0.mlp.down_proj.weight",
                "format": "mxfp8",
            },
        ],
    )
    plan = build_plan(contract, ModelInventory("toy", 1, tensors))
    numel = 64 * 128
    assert [(p.format, p.bytes_before, p.bytes_after) for p in plan.tensors] == [
        ("nvfp4", 2 * numel, numel // 2 + numel // 16 + 4),  # data + E4M3 block scales + FP32 outer scale
        ("mxfp8", 2 * numel, numel + numel // 32),  # data + E8M0 block scales
        ("bf16", 4 * numel, 2 * numel),  # a float32 GEMM weight kept high-precision is written as BF16
        ("bf16", 4 * 64, 4 * 64),  # a non-GEMM tensor keeps its dtype
    ]


def test_source_bytes_refuses_unknown_dtypes() -> None:
    with pytest.raises(KeyError, match=r"has dtype 'bf17', which is not a torch dtype"):
        source_bytes(TensorInfo("w", (2, 2), dtype="bf17"))


def test_rows_fold_experts_only() -> None:
    plan = build_plan(
        load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml"), inventory_from_config("Qwen3-30B-A3B")
    )
    rows = plan.rows()
    folded = [row for row in rows if row.count > 1]
    assert len(folded) == 48 * 3 and {row.count for row in folded} == {128}
    assert folded[0].name == "model.layers.0.mlp.experts.*.gate_proj.weight"
    assert sum(row.count for row in rows) == len(plan.tensors)
    assert sum(row.bytes_after for row in rows) == plan.total(mtp=None).bytes_after


def test_grid_marks_formats_per_layer_and_role(deepseek_plan: Plan) -> None:
    grid = deepseek_plan.grid()
    assert grid[(5, Role.ROUTED_EXPERT.value)] == {"mxfp8"}
    assert grid[(5, Role.MLA_PROJECTION.value)] == {"bf16"}
    assert grid[(61, Role.ROUTED_EXPERT.value)] == {"bf16"}  # the MTP layer is kept BF16
    assert grid[(5, Role.NORM.value)] == set()  # nothing quantizable there
    assert (1, Role.ROUTED_EXPERT.value) not in grid  # dense first layers have no experts


# -- the command ----------------------------------------------------------------------------------


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what building a fixture printed (transformers' progress bars)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def test_plan_json_reproduces_the_deepseek_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["plan", str(CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml"), "--model", "DeepSeek-V3", "--json"],
        capsys,
    )
    assert code == 0
    data = json.loads(out)
    assert data["model"] == {"family": "deepseek_v3", "num_layers": 61, "num_mtp_layers": 1}
    assert data["totals"]["experts"]["params"] == EXPERT_PARAMS
    assert round(data["totals"]["experts"]["share_of_params"], 3) == 0.978
    kv_b = [t for t in data["tensors"] if t["name"].endswith("kv_b_proj.weight") and not t["is_mtp"]]
    assert sum(t["bytes_after"] for t in kv_b) == KV_B_BF16_BYTES
    assert data["by_rule"][kv_b[0]["rule"]]["bytes_after"] == KV_B_BF16_BYTES
    assert len(data["tensors"]) == data["totals"]["all"]["tensors"] == 46183
    first = data["tensors"][0]
    assert set(first) == {
        "name",
        "megatron_name",
        "shape",
        "dtype",
        "role",
        "layer",
        "is_mtp",
        "expert",
        "format",
        "rule",
        "reason",
        "bytes_before",
        "bytes_after",
        "source_format",  # None: a config alone says nothing of how a checkpoint stores it
        "lossless",
        "lossless_why",
    }
    assert first["source_format"] is None


def test_plan_text_shows_tensors_and_totals(
    capsys: pytest.CaptureFixture[str], tiny_checkpoint: Callable[[str], Path]
) -> None:
    directory = tiny_checkpoint("qwen3_moe")
    code, out, _ = run(["plan", str(CONTRACTS / "nvfp4-experts-per-token.yaml"), "--model", str(directory)], capsys)
    assert code == 0
    assert out.startswith("plan: contract 'nvfp4-experts-per-token' on qwen3_moe (3 layers, 56 tensors)\n")
    assert "model.layers.0.mlp.experts.*.gate_proj.weight (x4)" in out
    for title in ("Per role", "Per winning rule", "Per format", "Per layer"):
        assert title in out
    summary = run(
        ["plan", str(CONTRACTS / "nvfp4-experts-per-token.yaml"), "--model", str(directory), "--summary"],
        capsys,
    )[1]
    assert "experts.*" not in summary and "Per layer" in summary


def test_plan_summary_json_has_no_tensor_list(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(CONTRACTS / "bf16-all.yaml"), "--model", "Qwen3-8B", "--json", "--summary"]
    data = json.loads(run(argv, capsys)[1])
    assert "tensors" not in data
    assert data["totals"]["decoder"]["bytes_after"] == data["totals"]["decoder"]["bytes_before"]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plan_plot(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str], tiny_checkpoint: Callable[[str], Path]
) -> None:
    path = tmp_path / f"plan{suffix}"
    model = str(tiny_checkpoint("deepseek_v3"))
    argv = ["plan", str(CONTRACTS / "deepseek-v3-mxfp8-mla-bf16.yaml"), "--model", model, "--summary"]
    code, _, err = run([*argv, "--plot", str(path)], capsys)
    assert code == 0 and err == f"wrote {path}\n"
    content = path.read_bytes()
    if suffix == ".png":
        assert content.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        text = content.decode()
        for label in ("mxfp8", "bf16", "3 (MTP)", "routed_expert", "mla_projection", "GiB per layer"):
            assert f">{label}<" in text, label


def test_plan_plot_refuses_other_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(CONTRACTS / "bf16-all.yaml"), "--model", "Qwen3-4B", "--summary", "--plot"]
    code, _, err = run([*argv, str(tmp_path / "plan.pdf")], capsys)
    assert code == 1
    assert err == (
        "error[fp4convert]: cannot draw a plot as 'plan.pdf'\n  hint: use a file name ending in .png or .svg\n"
    )


def test_plan_unsupported_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    code, _, err = run(["plan", str(CONTRACTS / "bf16-all.yaml"), "--model", str(config)], capsys)
    assert code == 1
    assert err.startswith("error[mapping]: unsupported model: architectures ['GPT2LMHeadModel'], model_type 'gpt2'\n")
    assert "supported architectures: DeepseekV3ForCausalLM" in err
