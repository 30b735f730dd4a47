"""``verify`` catches what broken converters and exporters produce."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from fp4convert.cli import cli
from fp4convert.errors import CheckpointError
from fp4convert.verify.checkpoint import verify_checkpoint

GATE = "model.layers.0.mlp.experts.2.gate_proj"


@pytest.fixture
def output(converted, tmp_path):
    """A private copy of a converted qwen3_moe checkpoint (ModelOpt NVFP4 experts)."""
    out = tmp_path / "out"
    shutil.copytree(converted("qwen3_moe", "modelopt", NVFP4_EXPERTS), out)
    return out


def _rewrite(out, edit, *, update_manifest: bool, holding: str = f"{GATE}.weight") -> None:
    """Apply ``edit(tensors) -> tensors`` to the shard holding ``holding`` (GATE's weight), optionally
    re-hashing the manifest."""
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shard = index["weight_map"][holding]
    tensors = edit(load_file(str(out / shard)))
    save_file(tensors, str(out / shard), metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard or k in tensors}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    if update_manifest:
        manifest = json.loads((out / "fp4convert.json").read_text())
        for info in manifest["tensors"].values():
            for name, o in list(info["outputs"].items()):
                if o["file"] != shard:
                    continue
                if name not in tensors:
                    del info["outputs"][name]
                    continue
                t = tensors[name]
                o["dtype"] = {
                    torch.uint8: "U8",
                    torch.float8_e4m3fn: "F8_E4M3",
                    torch.float32: "F32",
                    torch.bfloat16: "BF16",
                }[t.dtype]
                o["sha256"] = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        (out / "fp4convert.json").write_text(json.dumps(manifest))


def _flip(tensors):
    tensors[f"{GATE}.weight"] = tensors[f"{GATE}.weight"].clone()
    tensors[f"{GATE}.weight"][3, 5] ^= 0x10
    return tensors


def test_a_clean_output_verifies(output, tiny_checkpoint):
    assert verify_checkpoint(output, source=tiny_checkpoint("qwen3_moe")).ok


def test_flipped_byte_caught_by_hash(output):
    _rewrite(output, _flip, update_manifest=False)
    report = verify_checkpoint(output)
    assert [(f.check, f.name) for f in report.failures] == [("sha256", f"{GATE}.weight")]


def test_flipped_byte_caught_against_source_even_with_a_consistent_manifest(output, tiny_checkpoint):
    _rewrite(output, _flip, update_manifest=True)
    assert verify_checkpoint(output).ok  # hashes agree with the (forged) manifest...
    report = verify_checkpoint(output, source=tiny_checkpoint("qwen3_moe"))
    (failure,) = report.failures  # ...but re-quantizing the source does not
    assert failure.check == "source" and failure.name == f"{GATE}.weight"
    assert failure.detail.startswith("1 of ") and "first at row 3, block 0: " in failure.detail


def test_missing_tensor(output, tiny_checkpoint):
    def drop(tensors):
        del tensors[f"{GATE}.weight_scale"]
        return tensors

    _rewrite(output, drop, update_manifest=True)
    report = verify_checkpoint(output, source=tiny_checkpoint("qwen3_moe"))
    found = {(f.check, f.name) for f in report.failures}
    assert ("structure", f"{GATE}.weight_scale") in found
    assert ("source", f"{GATE}.weight_scale") in found


def test_wrong_scale_dtype(output):
    def as_u8(tensors):
        tensors[f"{GATE}.weight_scale"] = tensors[f"{GATE}.weight_scale"].view(torch.uint8).clone()
        return tensors

    _rewrite(output, as_u8, update_manifest=True)
    report = verify_checkpoint(output)
    assert [(f.check, f.name) for f in report.failures] == [("dtype", f"{GATE}.weight_scale")]
    assert "is U8, expected F8_E4M3" in report.failures[0].detail


@pytest.mark.parametrize(
    ("dialect", "global_scale"),
    [("modelopt", "weight_scale_2"), ("compressed-tensors", "weight_global_scale")],  # [] and [1]
)
def test_gate_up_scale_mismatch(converted, tmp_path, dialect, global_scale):
    output = tmp_path / "out"
    shutil.copytree(converted("qwen3_moe", dialect, NVFP4_EXPERTS), output)

    def separate_scales(tensors):
        tensors[f"{GATE}.{global_scale}"] = tensors[f"{GATE}.{global_scale}"] * 0.75
        return tensors

    _rewrite(output, separate_scales, update_manifest=True, holding=f"{GATE}.{global_scale}")
    report = verify_checkpoint(output)
    (failure,) = report.failures
    assert failure.check == "shared-scale" and failure.name == "model.layers.0.mlp.experts.2.gate_up"
    assert "fused siblings carry different global scales" in failure.detail


def test_unfinished_output_is_not_verifiable(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"has no fp4convert.json: it is not a finished fp4convert output"):
        verify_checkpoint(tmp_path)


def test_cli_verify_reports_and_exits(output, tiny_checkpoint):
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(output), "--source", str(tiny_checkpoint("qwen3_moe"))])
    assert ok.exit_code == 0 and ok.output.startswith("OK: ") and "source bytes" in ok.output
    _rewrite(output, _flip, update_manifest=False)
    bad = runner.invoke(cli, ["verify", str(output), "--json"])
    assert bad.exit_code == 1
    data = json.loads(bad.output)
    assert data["ok"] is False and data["failures"][0]["name"] == f"{GATE}.weight"
