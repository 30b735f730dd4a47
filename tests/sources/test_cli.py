"""What the commands say about a quantized source: plan, contract check, explain, dequantize."""

from __future__ import annotations

import json
import re

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS

from fp4convert.cli import main
from fp4convert.contract import load_contract
from fp4convert.contract.lossless import Lossless
from fp4convert.dialects import get_dialect
from fp4convert.families import describe_name, load_config
from fp4convert.formats import quantize_mxfp8
from fp4convert.plan import PlannedTensor
from fp4convert.verify.lossless import lossless_finding


def run(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def test_plan_shows_source_formats_and_what_is_lossless(source, capsys):
    code, out, _ = run(["plan", str(MXFP8_ALL), "--model", str(source("ue8m0")), "--summary"], capsys)
    assert code == 0
    assert "Per source format" in out and "fp8-block-ue8m0" in out
    counts = re.search(r"lossless \(dequantized output == dequantized source, docs/sources.md\): (.*)", out)
    assert counts is not None and counts.group(1) == "56 lossless"  # every tensor: power-of-two FP8 -> MXFP8
    code, out, _ = run(["plan", str(MXFP8_ALL), "--model", str(source("ue8m0")), "--json"], capsys)
    data = json.loads(out)
    assert data["by_source_format"]["fp8-block-ue8m0"]["tensors"] == 39
    row = next(t for t in data["tensors"] if t["name"] == "model.layers.0.mlp.experts.0.up_proj.weight")
    assert (row["source_format"], row["format"], row["lossless"]) == ("fp8-block-ue8m0", "mxfp8", True)


def test_contract_check_prices_each_source_format(source, capsys):
    code, out, _ = run(["contract", "check", str(MXFP8_ALL), "--model", str(source("fp8"))], capsys)
    assert code == 0
    assert re.search(r"source fp8-block: 39 tensors, [\d.]+ KiB read -> [\d.]+ KiB written", out)
    assert "lossy-fp8-requantize" in out  # arbitrary FP32 scales requantized to MXFP8
    code, out, _ = run(["contract", "check", str(MXFP8_ALL), "--model", str(source("fp8")), "--json"], capsys)
    assert json.loads(out)["source_formats"]["fp8-block"]["tensors"] == 39


def test_explain_names_the_source_format_and_the_bytes(source, capsys):
    name = "model.layers.0.mlp.experts.1.gate_proj.weight"
    code, out, _ = run(["explain", str(NVFP4_EXPERTS), name, "--model", str(source("fp8"))], capsys)
    assert code == 0
    assert re.search(r"source: fp8-block \([\d,]+ bytes read, [\d,]+ bytes written\); not lossless", out)


def test_the_cast_profile_is_flagged_for_rl(tmp_path, capsys):
    path = tmp_path / "cast.yaml"
    path.write_text(re.sub(r"^quantizer: .*$", "quantizer: mxfp4-cast", NVFP4_EXPERTS.read_text(), flags=re.M))
    code, out, _ = run(["contract", "check", str(path)], capsys)
    assert code == 0 and "mxfp4-cast-not-for-rl" in out


def test_dequantize_cli_says_what_it_decoded(source, tmp_path, capsys):
    code, out, _ = run(["dequantize", str(source("mxfp4")), str(tmp_path / "out")], capsys)
    assert code == 0 and out.startswith("decoded 24 mxfp4+fused-3d tensors")


def test_a_lossless_claim_that_does_not_hold_fails():
    # The proof can fail: an MXFP8 output whose values do not decode back to the source.
    config = load_config("Qwen3-30B-A3B")
    info = describe_name("model.layers.0.mlp.experts.0.down_proj.weight", config)
    contract = load_contract(MXFP8_ALL)
    decision = contract.decide(info, num_layers=48)
    item = PlannedTensor(info, decision, lossless=Lossless(True, "claimed"))
    x = torch.linspace(-3, 3, 64 * 32).reshape(64, 32).to(torch.bfloat16)
    dialect = get_dialect("sglang-mxfp8")
    tensors = dialect.encode(item, quantize_mxfp8(x), x, None)
    ok, detail = lossless_finding(item, x, tensors, dialect)
    assert not ok and "claimed lossless" in detail and "values differ" in detail
    exact = torch.ldexp(torch.ones(64, 32), torch.arange(64 * 32).reshape(64, 32) % 7).to(torch.bfloat16)
    ok, detail = lossless_finding(item, exact, dialect.encode(item, quantize_mxfp8(exact), exact, None), dialect)
    assert ok and "bit for bit" in detail
