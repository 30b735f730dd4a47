"""``fp4convert bridge validate-export``: dumps in update buckets, HF and Megatron masters, exit codes."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from fp4convert.bridge import export_hf, import_hf
from fp4convert.bridge.files import SafetensorsFolder
from fp4convert.bridge.tables import model_tables
from fp4convert.cli import cli
from fp4convert.convert.groups import quantize_members
from fp4convert.dialects import get_dialect

CONTRACT = "nvfp4-experts-per-token"


@pytest.fixture(scope="module")
def megatron_dir(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-megatron") / "m"
    import_hf(tiny_checkpoint("qwen3_moe"), out, contract=CONTRACT)
    return out


def _exported(megatron_dir) -> dict[str, torch.Tensor]:
    with SafetensorsFolder(megatron_dir) as folder:
        return dict(export_hf({n: folder[n] for n in folder}, contract=CONTRACT, config=megatron_dir))


def _dump(tensors: dict[str, torch.Tensor], directory, buckets: int = 3):
    """Write an update the way an exporter sends it: several buckets, no index."""
    directory.mkdir()
    names = list(tensors)
    for b in range(buckets):
        save_file({n: tensors[n].contiguous() for n in names[b::buckets]}, str(directory / f"bucket-{b}.safetensors"))
    return directory


def _run(*args: str):
    return CliRunner().invoke(cli, ["bridge", "validate-export", *args])


def test_an_exact_dump_passes_against_megatron_and_hf_masters(megatron_dir, tiny_checkpoint, tmp_path):
    dump = _dump(_exported(megatron_dir), tmp_path / "dump")
    for master in (megatron_dir, tiny_checkpoint("qwen3_moe")):
        result = _run(str(dump), "--master", str(master), "--contract", CONTRACT)
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"OK: 56 tensors follow contract {CONTRACT} (32 bf16, 24 nvfp4); ")


def test_separate_gate_up_scales_and_a_duplicate_fail_with_causes(megatron_dir, tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file

    exported = _exported(megatron_dir)
    hf = {}
    for path in tiny_checkpoint("qwen3_moe").glob("*.safetensors"):
        hf.update(load_file(str(path)))
    tables = model_tables(CONTRACT, megatron_dir)
    for proj in ("gate_proj", "up_proj"):  # the faulty exporter quantizes each on its own
        name = f"model.layers.2.mlp.experts.0.{proj}.weight"
        out = quantize_members([tables.planned(name)], [hf[name]], dialect=get_dialect("modelopt"), profile="te")
        exported.update({k: v for k, v in out.items() if not k.endswith("input_scale")})
    dump = _dump(exported, tmp_path / "dump")
    save_file({"model.norm.weight": exported["model.norm.weight"]}, str(dump / "bucket-9.safetensors"))
    result = _run(str(dump), "--master", str(megatron_dir), "--contract", CONTRACT)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert "FAIL shared-scale model.layers.2.mlp.experts.0.gate_up: gate/up global scales differ: gate_proj " in (
        "\n".join(lines)
    )
    assert (
        "     cause: exporter quantized gate_proj and up_proj separately: each weight_scale_2 is its own "
        "tensor's amax scale, not the group's shared one"
    ) in lines
    assert (
        "FAIL duplicate    model.norm.weight: in 2 update buckets: bucket-1.safetensors, bucket-9.safetensors; "
        "the last one sent wins"
    ) in lines
    assert lines[-1].startswith("FAILED: 3 of 58 results fail (1 bytes, 1 shared-scale, 1 duplicate); ")
    data = json.loads(_run(str(dump), "--master", str(megatron_dir), "--contract", CONTRACT, "--json").output)
    assert (data["ok"], data["counts"]["failed"], data["counts"]["expected"]) == (False, 3, 56)


def test_ep_rank_dump_against_a_megatron_master_file_needs_a_config(tiny_checkpoint, tmp_path, capsys):
    from fp4convert.cli import main

    rank1 = tmp_path / "rank1"
    import_hf(tiny_checkpoint("qwen3_moe"), rank1, ep_rank=1, ep_size=2)
    with SafetensorsFolder(rank1) as folder:
        state = {n: folder[n] for n in folder}
    exported = dict(export_hf(state, contract=CONTRACT, config=rank1, ep_rank=1, ep_size=2))
    dump = _dump(exported, tmp_path / "dump", buckets=2)
    lone = tmp_path / "lone" / "model.safetensors"
    lone.parent.mkdir()
    lone.write_bytes((rank1 / "model.safetensors").read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        main(["bridge", "validate-export", str(dump), "--master", str(lone), "--contract", CONTRACT])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        f"error[checkpoint]: no config.json next to the master {lone}\n"
        "  hint: pass the model's config.json with --config\n"
    )
    args = [str(dump), "--master", str(lone), "--contract", CONTRACT, "--config", str(rank1 / "config.json")]
    assert _run(*args, "--ep-rank", "1", "--ep-size", "2").exit_code == 0
    wrong = _run(*args, "--ep-rank", "0", "--ep-size", "2")  # the master holds rank 1's experts as local ids
    assert wrong.exit_code == 1
    assert "expert 2 is not on EP rank 0 of 2, which holds experts 0-1" in wrong.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_validate_export_on_cuda(megatron_dir, tmp_path):
    dump = _dump(_exported(megatron_dir), tmp_path / "dump")
    result = _run(str(dump), "--master", str(megatron_dir), "--contract", CONTRACT, "--device", "cuda", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["device"].startswith("cuda")
