"""``fp4convert doctor``: exit status 0 healthy / 1 errors / 2 unreadable, JSON output, --fix."""

from __future__ import annotations

import json

import pytest
from doctor.corpus import copy_base
from doctor.damage import exclude

from fp4convert.cli import main


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_healthy_exits_0_and_says_so(base, capsys):
    code, out, _ = _run(["doctor", str(base("mo-nvfp4"))], capsys)
    assert code == 0
    assert out.startswith(
        "HEALTHY: 0 errors, 0 warnings (modelopt; 18 bf16, 24 nvfp4; judged for sglang, vllm, trtllm;"
    )


def test_errors_exit_1_with_grouped_tensors_engines_and_fix(base, tmp_path, capsys):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "d")
    exclude(lambda entries: [e for e in entries if e != "model.layers.*.self_attn.qkv_proj"])(folder)
    code, out, _ = _run(["doctor", str(folder), "--engine", "sglang"], capsys)
    assert code == 1
    assert out.splitlines()[:4] == [
        "error[exclude/fused-name-not-excluded]: the exclude list names the pieces of fused layers but not the fused "
        "name the engine builds (ignore)",
        "  model.layers.*.self_attn.qkv_proj (3)",
        "  sglang: decides by the fused name (qkv_proj, gate_up_proj), so it builds the layer quantized and fails on "
        "the BF16 pieces (SGLang #36596)",
        "  fix: add the fused engine names to the exclude list [--fix: config]",
    ]
    code, out, _ = _run(["doctor", str(folder), "--engine", "vllm"], capsys)
    assert code == 0  # vLLM decides fused layers by their pieces
    code, out, _ = _run(["doctor", str(folder), "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["exit_code"] == 1 and not report["ok"]
    [finding] = report["findings"]
    assert finding["code"] == "fused-name-not-excluded" and finding["count"] == 3
    assert finding["tensors"] == [
        {
            "pattern": "model.layers.*.self_attn.qkv_proj",
            "count": 3,
            "examples": [f"model.layers.{i}.self_attn.qkv_proj" for i in range(3)],
        }
    ]
    assert list(finding["engines"]) == ["sglang"] and finding["repair"] == "config"


def test_fix_writes_a_healthy_copy(base, tmp_path, capsys):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "d")
    exclude(lambda entries: [e for e in entries if e != "lm_head"])(folder)
    code, out, _ = _run(["doctor", str(folder), "--fix", str(tmp_path / "fixed"), "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["after"]["ok"] and result["after"]["findings"] == []
    assert "lm-head-not-excluded" in {f["code"] for f in result["before"]["findings"]}
    code, _, _ = _run(["doctor", str(tmp_path / "fixed")], capsys)
    assert code == 0


def test_unreadable_exits_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = _run(["doctor", str(tmp_path)], capsys)
    assert code == 2 and err.startswith("error[checkpoint]: ") and "config.json" in err
    (tmp_path / "config.json").write_text("{}")
    code, out, _ = _run(["doctor", str(tmp_path), "--json"], capsys)
    assert code == 2 and json.loads(out)["exit_code"] == 2 and "no readable *.safetensors" in json.loads(out)["error"]
    code, _, err = _run(["doctor", str(tmp_path / "absent")], capsys)
    assert code == 2 and err.startswith("error[hub]: ")
