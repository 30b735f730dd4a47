"""The to-megatron and validate-export commands: exit codes, exact messages, JSON output."""

from __future__ import annotations

import json

import pytest
import torch
from _helpers import NVFP4_EXPERTS
from click.testing import CliRunner
from safetensors.torch import save_file

from fp4convert import export_hf
from fp4convert.cli import cli
from fp4convert.families import hf_to_megatron, load_config


@pytest.fixture(scope="module")
def exported(tiny_checkpoint) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    directory = tiny_checkpoint("qwen3_moe")
    hf: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        hf.update(load_file(str(path)))
    config = load_config(directory)
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    return dict(export_hf(megatron, contract=NVFP4_EXPERTS, family=None, config=config))


def _dump(tensors, directory, buckets=3):
    directory.mkdir()
    names = list(tensors)
    size = -(-len(names) // buckets)
    for i in range(buckets):
        save_file(
            {n: tensors[n].contiguous() for n in names[i * size : (i + 1) * size]},
            str(directory / f"update-{i}.safetensors"),
        )
    return directory


def test_to_megatron_then_validate_against_it(tiny_checkpoint, tmp_path, exported):
    runner = CliRunner()
    megatron = tmp_path / "megatron"
    result = runner.invoke(
        cli, ["to-megatron", str(tiny_checkpoint("qwen3_moe")), str(megatron), "--contract", "nvfp4-experts-per-token"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        f"wrote 41 Megatron tensors (qwen3_moe, grouped experts) from 56 HF tensors into {megatron}; "
        "megatron-args.txt, te-precision.yaml from contract nvfp4-experts-per-token\n"
    )
    dump = _dump(exported, tmp_path / "dump")
    checked = runner.invoke(
        cli, ["validate-export", str(dump), "--master", str(megatron), "--contract", "nvfp4-experts-per-token"]
    )
    assert checked.exit_code == 0, checked.output
    assert checked.output.startswith(
        "OK: all 104 exported tensors follow contract nvfp4-experts-per-token (32 bf16, 24 nvfp4); "
    )


def test_to_megatron_json(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(
        cli,
        [
            "to-megatron",
            str(tiny_checkpoint("deepseek_v3")),
            str(tmp_path / "m"),
            "--expert-layout",
            "sequential",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["family"] == "deepseek_v3" and report["expert_layout"] == "sequential"
    assert report["precision_files"] == [] and report["contract"] is None


def test_validate_export_failure_names_block_and_cause(tiny_checkpoint, tmp_path, exported):
    bad = dict(exported)
    name = "model.layers.0.mlp.experts.1.down_proj.weight_scale_2"
    bad[name] = torch.nextafter(bad[name], torch.tensor(1.0))
    del bad["model.layers.2.mlp.experts.0.up_proj.weight_scale"]
    dump = _dump(bad, tmp_path / "dump")
    result = CliRunner().invoke(
        cli,
        [
            "validate-export",
            str(dump),
            "--master",
            str(tiny_checkpoint("qwen3_moe")),
            "--contract",
            str(NVFP4_EXPERTS),
        ],
    )
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == (
        "FAIL missing      model.layers.2.mlp.experts.0.up_proj.weight_scale: not in the export "
        "(no update bucket holds it)"
    )
    assert lines[1].startswith(f"FAIL bytes        {name}: ") and lines[1].endswith(" (+1 ulp)")
    assert lines[2] == (
        "     cause: weight_scale_2 is 1 ulp above the reference while data and block scales match: "
        "the exporter computes the global scale with an approximate reciprocal or division (fast math)"
    )
    assert lines[3] == "causes:"
    assert lines[-1].startswith("FAILED: 2 tensors fail (missing 1, bytes 1) of 104 expected; ")


def test_validate_export_json_and_ep(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file

    directory = tiny_checkpoint("qwen3_moe")
    hf: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        hf.update(load_file(str(path)))
    config = load_config(directory)
    rank_one = hf_to_megatron(hf, "qwen3_moe", config, ep_rank=1, ep_size=2)
    faulty = dict(export_hf(rank_one, contract=NVFP4_EXPERTS, family=None, config=config, ep_rank=0, ep_size=2))
    dump = _dump(faulty, tmp_path / "dump")
    args = ["validate-export", str(dump), "--master", str(directory), "--contract", str(NVFP4_EXPERTS), "--json"]
    result = CliRunner().invoke(cli, [*args, "--ep-rank", "1", "--ep-size", "2"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["ep_rank"] == 1 and data["counts"]["extra"] == 36 == data["counts"]["missing"]
    assert set(data["causes"]) == {
        f"matches expert {2 + e} of the master, named expert {e}: EP offset missing? (EP rank 1 holds experts 2-3; "
        "global id = ep_rank x experts per rank + local id)"
        for e in (0, 1)
    }
    assert {t["status"] for t in data["tensors"]} == {"ok", "missing", "extra"}


def test_validate_export_needs_a_config(tmp_path, exported):
    from fp4convert.cli import main

    dump = _dump(exported, tmp_path / "dump")
    master = tmp_path / "master"
    master.mkdir()
    save_file({"x": torch.zeros(1)}, str(master / "m.safetensors"))
    with pytest.raises(SystemExit) as exit_info:
        main(["validate-export", str(dump), "--master", str(master), "--contract", str(NVFP4_EXPERTS)])
    assert exit_info.value.code == 1
