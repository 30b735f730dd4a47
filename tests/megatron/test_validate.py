"""validate_export: what passes (exports, converted checkpoints, both master namings, EP ranks), the
structural checks, the report, and that a validator reused across syncs never caches a verdict."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _helpers import CUDA, MXFP8_ALL, NVFP4_EXPERTS, count_uploads
from safetensors.torch import save_file

from fp4convert import export_hf, validate_export
from fp4convert.contract import load_contract
from fp4convert.errors import VerificationError
from fp4convert.families import hf_to_megatron
from fp4convert.megatron import ExportValidator, validate_export_files
from fp4convert.megatron import validate as validate_module
from fp4convert.megatron.sources import tensor_meta
from fp4convert.megatron.sync import LiveExporter

DEEPSEEK_NVFP4 = Path(__file__).parent / "data" / "deepseek-nvfp4-mla-bf16.yaml"


def _export(model, key, contract, dialect="modelopt", **kwargs):
    hf, config = model(key)
    megatron = hf_to_megatron(hf, key, config)
    return dict(export_hf(megatron, contract=contract, family=key, config=config, dialect=dialect, **kwargs))


@pytest.mark.parametrize(
    ("key", "contract", "dialect"),
    [
        ("qwen3_moe", NVFP4_EXPERTS, "modelopt"),
        ("qwen3_moe", NVFP4_EXPERTS, "compressed-tensors"),
        ("qwen3_moe", MXFP8_ALL, "sglang-mxfp8"),
        ("deepseek_v3", DEEPSEEK_NVFP4, "modelopt"),
        ("deepseek_v3", DEEPSEEK_NVFP4, "compressed-tensors"),
        ("deepseek_v3", "deepseek-v3-mxfp8-mla-bf16", "modelopt"),
    ],
)
@pytest.mark.parametrize("master_names", ["hf", "grouped", "sequential"])
def test_a_correct_export_passes_against_either_master(key, contract, dialect, master_names, model):
    hf, config = model(key)
    exported = _export(model, key, contract, dialect)
    master = hf if master_names == "hf" else hf_to_megatron(hf, key, config, expert_layout=master_names)
    report = validate_export(exported, master, contract=contract, family=key, config=config, dialect=dialect)
    assert report.ok, report.findings[:3]
    assert report.counts() == {"expected": len(exported), "received": len(exported), "ok": len(exported), "failed": 0}


def test_master_bytes_count_every_hf_tensor_once(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    report = validate_export(exported, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    assert report.master_bytes == sum(t.numel() * t.element_size() for t in hf.values())
    assert report.formats == {"bf16": 32, "nvfp4": 24}
    assert report.summary().startswith(
        "OK: all 104 exported tensors follow contract nvfp4-experts-per-token (32 bf16, 24 nvfp4); "
    )


@pytest.mark.parametrize("key", ["qwen3_moe", "deepseek_v3"])
def test_each_ep_rank_passes_against_its_megatron_master_and_the_hf_master(key, model):
    hf, config = model(key)
    contract = NVFP4_EXPERTS if key == "qwen3_moe" else DEEPSEEK_NVFP4
    for rank in range(2):
        megatron = hf_to_megatron(hf, key, config, ep_rank=rank, ep_size=2)
        exported = dict(export_hf(megatron, contract=contract, family=key, config=config, ep_rank=rank, ep_size=2))
        for master in (megatron, hf):
            report = validate_export(
                exported, master, contract=contract, family=key, config=config, ep_rank=rank, ep_size=2
            )
            assert report.ok, report.findings[:3]
            assert any(f".experts.{2 * rank}." in n for n in report.expected)
            assert not any(f".experts.{2 * (1 - rank)}." in n for n in report.expected)


def test_the_converted_checkpoint_validates_as_a_live_update(converted, model, read_tensors):
    """Interchangeable: the converter's tensors pass as an export, input scales included on request."""
    _, config = model("deepseek_v3")
    tensors = read_tensors(converted("deepseek_v3", "modelopt", DEEPSEEK_NVFP4))
    master = model("deepseek_v3")[0]
    kwargs = {"contract": DEEPSEEK_NVFP4, "family": None, "config": config}
    assert validate_export(tensors, master, include_input_scale=True, **kwargs).ok
    live = {n: t for n, t in tensors.items() if not n.endswith(".input_scale")}
    assert validate_export(live, master, **kwargs).ok


def test_16x16_tiles_validate_with_the_batched_path(model):
    contract = load_contract(NVFP4_EXPERTS)
    tiles = contract.model_copy(
        update={
            "formats": contract.formats.model_copy(
                update={"nvfp4": contract.formats.nvfp4.model_copy(update={"tile": "16x16"})}
            )
        }
    )
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", tiles)
    plain = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    name = "model.layers.0.mlp.experts.1.down_proj.weight_scale"
    assert not torch.equal(exported[name].view(torch.uint8), plain[name].view(torch.uint8))  # tiles matter
    assert validate_export(exported, hf, contract=tiles, family=None, config=config).ok
    assert not validate_export(plain, hf, contract=tiles, family=None, config=config).ok


def test_batch_size_does_not_change_the_verdict(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    bad = dict(exported)
    bad["model.layers.2.mlp.experts.3.down_proj.weight"] = bad["model.layers.2.mlp.experts.3.down_proj.weight"] ^ 1
    for max_batch_bytes in (1, 1 << 30):
        validator = ExportValidator(contract=NVFP4_EXPERTS, config=config, max_batch_bytes=max_batch_bytes)
        assert validator(exported, hf).ok
        report = validator(bad, hf)
        assert [(f.tensor, f.check) for f in report.findings] == [
            ("model.layers.2.mlp.experts.3.down_proj.weight", "bytes")
        ]


def _qwen3_validated(model):
    """(Megatron master, its export, a validator that passed it once) of the tiny Qwen3-MoE."""
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    assert validator(exported, megatron).ok
    return megatron, exported, validator


def test_a_reused_validator_judges_every_sync_afresh(model):
    megatron, exported, validator = _qwen3_validated(model)
    bad = dict(exported)
    del bad["model.layers.0.mlp.experts.0.up_proj.weight_scale_2"]
    assert [f.check for f in validator(bad, megatron).findings] == ["missing"]
    # the learner's weights moved: the same export is now stale, and the validator sees it
    stepped = {
        n: (t.float() * 1.5).to(t.dtype) if ".experts.linear_fc2.weight1" in n else t for n, t in megatron.items()
    }
    failed = validator(exported, stepped)
    assert {f.tensor for f in failed.findings} >= {f"model.layers.{i}.mlp.experts.1.down_proj.weight" for i in (0, 2)}
    assert validator(exported, megatron).ok


def test_a_validator_moved_between_master_layouts_still_compares_the_right_tensors(model):
    # each master layout compiles its own check order; what a batch picks from the fetched tensors
    # must follow it (a stale pick would compare the wrong tensors)
    megatron, exported, validator = _qwen3_validated(model)
    gone = sorted(n for n in megatron if ".mlp.experts.linear_fc2.weight" in n)[-1]
    partial = {n: t for n, t in megatron.items() if n != gone}
    assert not validator(exported, partial).ok  # the master cannot give one tensor
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    bad = dict(exported)
    bad[name] = bad[name].clone()
    bad[name][0, 0] ^= 0x11
    assert {f.tensor for f in validator(bad, megatron).findings} == {name}
    assert validator(exported, megatron).ok


def test_a_validator_builds_each_master_layout_once(model, monkeypatch):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    built: list[int] = []
    original = validate_module._Compiled.__post_init__
    monkeypatch.setattr(validate_module._Compiled, "__post_init__", lambda self: built.append(1) or original(self))
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    assert len(built) == 1  # the canonical BF16 layout, built by the constructor
    assert validator(exported, megatron).ok
    assert len(built) == 1  # the learner's master has that layout: the first sync builds nothing
    shuffled = dict(reversed(list(megatron.items())))
    assert validator.prepare(shuffled)(exported, shuffled).ok
    assert len(built) == 1  # the same layout in another order
    gone = sorted(n for n in megatron if ".mlp.experts.linear_fc2.weight" in n)[-1]
    assert not validator(exported, {n: t for n, t in megatron.items() if n != gone}).ok
    assert len(built) == 2  # another layout is built afresh
    assert validator.prepare(hf)(exported, hf).ok
    assert len(built) == 3  # and an HF-named one
    assert validator(exported, hf).ok
    assert len(built) == 3


def _fields(compiled) -> dict[str, object]:
    return {f: getattr(compiled, f) for f in ("sources", "outputs", "problems", "expected_names", "master_bytes",
                                              "checks", "layer_ends")} | {"steps": repr(compiled.steps)}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "contract", "dtype"),
    [
        ("qwen3_moe", NVFP4_EXPERTS, torch.bfloat16),
        ("qwen3_moe", MXFP8_ALL, torch.float32),
        ("deepseek_v3", DEEPSEEK_NVFP4, torch.bfloat16),
    ],
)
def test_the_canonical_layouts_plan_is_the_one_built_from_the_master(key, contract, dtype, model):
    # the constructor's plan for the canonical layout stands in for the one the master's own names,
    # dtypes and shapes give: they must be the same, field for field
    hf, config = model(key)
    megatron = {n: t.to(dtype) for n, t in hf_to_megatron(hf, key, config).items()}
    validator = ExportValidator(contract=contract, config=config)

    def canonical(master):
        tensors = list(master.values())
        return validator._canonical_layout(list(master), [t.dtype for t in tensors], [t.shape for t in tensors])

    assert canonical(megatron) is not None
    built = validator._compile_layout({n: tensor_meta(megatron, n) for n in megatron})
    assert _fields(canonical(megatron)) == _fields(built)
    assert canonical(hf_to_megatron(hf, key, config, expert_layout="sequential")) is None
    assert canonical({**megatron, "extra.weight": torch.zeros(2, dtype=dtype)}) is None


def test_a_prepared_validator_uploads_no_table_at_its_first_sync(model, monkeypatch):
    # the byte check's index and address tables are made by prepare(), not by the first sync
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    uploads = count_uploads(monkeypatch)
    validator.prepare(megatron)
    assert len(uploads) > 0
    made = len(uploads)
    assert validator(exported, megatron).ok
    assert len(uploads) == made


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_validator_told_its_device_makes_its_tables_at_construction(device, model, monkeypatch):
    # ExportValidator(device=...): the index tables, segment tables and QKV row indices are made by
    # the constructor; the first sync uploads only the master segments' addresses (on a GPU)
    hf, config = model("qwen3_moe")
    megatron = {n: t.to(device) for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    exported = {n: t.to(device) for n, t in _export(model, "qwen3_moe", NVFP4_EXPERTS).items()}
    uploads = count_uploads(monkeypatch)
    told = ExportValidator(contract=NVFP4_EXPERTS, config=config, device=device)
    assert {"on", "rows_index"} <= set(uploads)
    uploads.clear()
    assert told(exported, megatron).ok
    assert set(uploads) == ({"device_tables"} if device == "cuda" else set())
    untold = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    assert uploads.count("on") == 0
    assert untold(exported, megatron).ok
    assert {"on", "rows_index"} <= set(uploads)


def test_a_bf16_tensor_is_accepted_as_the_masters_own_memory_and_no_other(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    pairs = export_hf(megatron.items(), contract=NVFP4_EXPERTS, family=None, config=config)
    exported = dict(pairs)
    final_norm = "model.norm.weight"
    assert exported[final_norm].data_ptr() == megatron["decoder.final_layernorm.weight"].data_ptr()
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    assert validator(exported, megatron).ok
    # another master tensor's memory (same shape and dtype, other bytes) is compared, and fails
    other = "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"
    assert megatron[other].shape == exported[final_norm].shape
    assert not torch.equal(megatron[other], exported[final_norm])
    report = validator({**exported, final_norm: megatron[other]}, megatron)
    assert [(f.tensor, f.check) for f in report.findings] == [(final_norm, "bytes")]


# -- structure --------------------------------------------------------------------------------------


def test_structural_findings_name_the_tensor_and_what_was_expected(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    bad = dict(exported)
    del bad["model.layers.0.mlp.experts.0.down_proj.weight"]
    bad["model.layers.0.mlp.experts.1.down_proj.weight_scale"] = bad[
        "model.layers.0.mlp.experts.1.down_proj.weight_scale"
    ].view(torch.uint8)
    bad["model.layers.0.mlp.experts.2.down_proj.weight_scale_2"] = bad[
        "model.layers.0.mlp.experts.2.down_proj.weight_scale_2"
    ].reshape(1)
    bad["model.layers.0.mlp.experts.9.up_proj.weight"] = torch.zeros(1)
    report = validate_export(bad, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    found = {(f.tensor, f.check, f.detail) for f in report.findings}
    assert found == {
        ("model.layers.0.mlp.experts.0.down_proj.weight", "missing", "not in the export (no update bucket holds it)"),
        ("model.layers.0.mlp.experts.1.down_proj.weight_scale", "dtype", "U8 [64, 2], expected F8_E4M3 [64, 2]"),
        ("model.layers.0.mlp.experts.2.down_proj.weight_scale_2", "shape", "[1], expected F32 []"),
        ("model.layers.0.mlp.experts.9.up_proj.weight", "extra", "not a tensor of this model in this dialect"),
    }
    assert report.counts() == {
        "expected": 104,
        "received": 104,
        "ok": 101,
        "failed": 4,
        "missing": 1,
        "extra": 1,
        "dtype": 1,
        "shape": 1,
    }


@pytest.mark.parametrize(
    "missing", ["model.layers.2.mlp.experts.3.down_proj.weight_scale_2", "lm_head.weight", "model.norm.weight"]
)
def test_a_fault_found_after_earlier_layers_ran_gives_the_full_report(model, missing):
    # the structure is checked layer by layer as the byte checks are issued; a fault in a later
    # layer (or in the embedding's layer, checked last) restarts with the whole structure check
    megatron, exported, validator = _qwen3_validated(model)
    wrong = "model.layers.0.mlp.experts.1.down_proj.weight"
    bad = {n: t for n, t in exported.items() if n != missing}
    bad[wrong] = bad[wrong] ^ 0x01
    report = validator(bad, megatron)
    assert [(f.tensor, f.check) for f in report.findings] == [(missing, "missing"), (wrong, "bytes")]
    assert report.counts()["failed"] == 2
    assert validator(exported, megatron).ok  # and the next sync is judged afresh


def test_a_master_without_the_tensor_is_a_finding(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    master = {n: t for n, t in hf.items() if n != "model.layers.1.mlp.down_proj.weight"}
    report = validate_export(exported, master, contract=NVFP4_EXPERTS, family=None, config=config)
    assert [(f.tensor, f.check) for f in report.findings] == [("model.layers.1.mlp.down_proj.weight", "master")]
    assert report.findings[0].detail.startswith(
        "the master has no tensor holding `model.layers.1.mlp.down_proj.weight`"
    )


def test_a_tensor_parallel_shard_in_the_master_is_a_finding(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    master = dict(hf)
    master["model.layers.0.self_attn.o_proj.weight"] = master["model.layers.0.self_attn.o_proj.weight"][:32]
    report = validate_export(exported, master, contract=NVFP4_EXPERTS, family=None, config=config)
    assert [f.detail for f in report.findings] == [
        "master `model.layers.0.self_attn.o_proj.weight` gives it shape [32, 64], the config says [64, 64] "
        "(pass tensor-parallel-gathered tensors)"
    ]


# -- files ------------------------------------------------------------------------------------------


def _dump(tensors: dict[str, torch.Tensor], directory: Path, buckets: int) -> Path:
    directory.mkdir()
    names = list(tensors)
    size = -(-len(names) // buckets)
    for i in range(buckets):
        part = {n: tensors[n].contiguous() for n in names[i * size : (i + 1) * size]}
        save_file(part, str(directory / f"bucket-{i:03d}.safetensors"))
    return directory


def test_files_in_update_buckets_against_an_hf_or_megatron_master(tiny_checkpoint, tmp_path, model):
    from fp4convert import import_hf

    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    dump = _dump(exported, tmp_path / "dump", buckets=5)
    import_hf(tiny_checkpoint("qwen3_moe"), tmp_path / "megatron")
    for master in (tiny_checkpoint("qwen3_moe"), tmp_path / "megatron"):
        report = validate_export_files(dump, master, contract=NVFP4_EXPERTS)
        assert report.ok, report.findings[:3]
        assert report.received == len(exported)


def test_a_tensor_sent_in_two_buckets_is_a_duplicate(tiny_checkpoint, tmp_path, model):
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    dump = _dump(exported, tmp_path / "dump", buckets=2)
    name = "model.layers.0.mlp.experts.0.up_proj.weight_scale_2"
    save_file({name: exported[name]}, str(dump / "bucket-again.safetensors"))
    report = validate_export_files(dump, tiny_checkpoint("qwen3_moe"), contract=NVFP4_EXPERTS)
    assert [(f.tensor, f.check, f.detail) for f in report.findings] == [
        (name, "duplicate", "sent in more than one update bucket (bucket-000.safetensors, bucket-again.safetensors)")
    ]


# -- the report ---------------------------------------------------------------------------------------


def test_report_json_per_tensor_and_raise(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    bad = dict(exported)
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    bad[name] = bad[name] ^ 0x10
    report = validate_export(bad, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    data = report.to_json()
    assert data["ok"] is False and data["counts"]["bytes"] == 1 and data["counts"]["ok"] == 103
    statuses = {t["tensor"]: t["status"] for t in data["tensors"]}
    assert statuses[name] == "bytes" and statuses["model.norm.weight"] == "ok" and len(statuses) == 104
    assert data["findings"][0]["detail"].startswith("1024 of 1024 bytes differ; first at row 0, block 0: exported [")
    with pytest.raises(VerificationError, match=re.escape(f"first: bytes `{name}`: 1024 of 1024 bytes differ")):
        report.raise_if_failed()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("key", "contract", "dialect"),
    [
        ("qwen3_moe", NVFP4_EXPERTS, "modelopt"),
        ("deepseek_v3", DEEPSEEK_NVFP4, "compressed-tensors"),
        ("deepseek_v3", "deepseek-v3-mxfp8-mla-bf16", "sglang-mxfp8"),
    ],
)
def test_cuda_validation_passes_and_catches_a_flipped_byte(key, contract, dialect, model):
    hf, config = model(key)
    megatron = {n: t.cuda() for n, t in hf_to_megatron(hf, key, config).items()}
    exported = dict(export_hf(megatron, contract=contract, family=key, config=config, dialect=dialect))
    kwargs = {"contract": contract, "family": key, "config": config, "dialect": dialect}
    assert validate_export(exported, megatron, **kwargs).ok
    cpu = {n: t.cpu() for n, t in exported.items()}
    assert validate_export(cpu, hf, **kwargs).ok  # the CPU reference accepts what CUDA exported
    # the quantized data tensor: `weight` (ModelOpt, SGLang MXFP8) or `weight_packed` (compressed-tensors NVFP4)
    data = (".weight", ".weight_packed")
    name = next(n for n in exported if n.endswith(data) and exported[n].dtype != torch.bfloat16)
    exported[name] = (exported[name].view(torch.uint8) ^ 1).view(exported[name].dtype)
    assert [f.tensor for f in validate_export(exported, megatron, **kwargs).findings] == [name]


def _flip_in_place(tensor: torch.Tensor) -> torch.Tensor:
    """Flip the low bit of ``tensor``'s first byte where it lies (the address a graph captured);
    returns the byte's old value."""
    first = tensor.view(-1).view(torch.uint8)[:1]
    old = first.clone()
    first.bitwise_xor_(1)
    return old


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replays_find_what_the_eager_check_finds(model):
    hf, config = model("qwen3_moe")
    megatron = {n: t.cuda() for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    exporter = LiveExporter(contract=NVFP4_EXPERTS, config=config)
    exported = dict(exporter(megatron))
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    eager = ExportValidator(contract=NVFP4_EXPERTS, config=config, cuda_graphs=False)
    for _ in range(3):  # eager, captured (and replayed), replayed
        assert validator(exported, megatron).ok
    assert validator._replay.captured and validator._replay.failed is None

    def same_verdicts() -> set[str]:
        got = validator(exported, megatron)
        assert validator._replay.captured  # still the one graph: the addresses did not move
        assert [(f.tensor, f.check) for f in got.findings] == [
            (f.tensor, f.check) for f in eager(exported, megatron).findings
        ]
        return {f.tensor for f in got.findings}

    # faults made in place, at the captured addresses: every replay reads them
    expert = "model.layers.0.mlp.experts.1.up_proj"
    for name in (f"{expert}.weight", f"{expert}.weight_scale", f"{expert}.weight_scale_2",
                 "model.layers.1.self_attn.q_proj.weight"):  # fmt: skip
        assert exported[name].data_ptr() not in {t.data_ptr() for t in megatron.values()}  # a copy, not the master
        old = _flip_in_place(exported[name])
        assert name in same_verdicts()
        exported[name].view(-1).view(torch.uint8)[:1].copy_(old)
        assert validator(exported, megatron).ok
    # the same memory under another shape: the key holds (address, size), the replay is launched, and
    # the structure check that runs meanwhile finds the fault
    reshaped = {**exported, f"{expert}.weight": exported[f"{expert}.weight"].view(-1)}
    assert [(f.tensor, f.check) for f in validator(reshaped, megatron).findings] == [(f"{expert}.weight", "shape")]
    del reshaped  # (it holds the exporter's buffers: its next sync would take others)
    assert validator._replay.captured and validator(exported, megatron).ok
    # the learner's step, in place: the stale export fails; the exporter's next sync (same buffers) passes
    fc2 = next(n for n in megatron if ".mlp.experts.linear_fc2.weight" in n)
    megatron[fc2].mul_(1.5)
    assert len(same_verdicts()) > 0
    pointers = [t.data_ptr() for t in exported.values()]
    exported = {}  # the sampler took the update: the exporter's next sync reuses its buffers
    exported = dict(exporter(megatron))  # (the replay held none of them)
    assert [t.data_ptr() for t in exported.values()] == pointers
    assert validator(exported, megatron).ok and validator._replay.captured
    # tensors elsewhere (a copy of the export): a first sight runs eagerly, the second is captured too
    moved = {n: t.clone() for n, t in exported.items()}
    assert validator._replay.graphs == 1
    assert validator(moved, megatron).ok and validator._replay.graphs == 1  # eager: a first sight
    assert validator(moved, megatron).ok and validator._replay.graphs == 2  # captured, the first graph kept
    moved[f"{expert}.weight"].view(torch.uint8)[0, 0] ^= 1
    assert [f.tensor for f in validator(moved, megatron).findings] == [f"{expert}.weight"]
    assert validator(exported, megatron).ok and validator._replay.graphs == 2  # alternating: both replayed


def test_a_group_with_a_broken_member_still_checks_the_others(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    expert = "model.layers.0.mlp.experts.2"
    bad = dict(exported)
    del bad[f"{expert}.gate_proj.weight_scale"]
    report = validate_export(bad, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    assert [(f.tensor, f.check) for f in report.findings] == [(f"{expert}.gate_proj.weight_scale", "missing")]
    bad[f"{expert}.up_proj.weight"] = bad[f"{expert}.up_proj.weight"] ^ 0x01  # the sibling is wrong too
    report = validate_export(bad, hf, contract=NVFP4_EXPERTS, family=None, config=config)
    assert [(f.tensor, f.check) for f in report.findings] == [
        (f"{expert}.gate_proj.weight_scale", "missing"),
        (f"{expert}.up_proj.weight", "bytes"),
    ]


def test_failures_past_the_diagnosis_budget_are_reported_with_their_counts(model):
    hf, config = model("qwen3_moe")
    exported = _export(model, "qwen3_moe", NVFP4_EXPERTS)
    for expert in (0, 1):
        name = f"model.layers.0.mlp.experts.{expert}.down_proj.weight"
        exported[name] = exported[name] ^ 0x01
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config, max_diagnosed=1)
    first, second = validator(exported, hf).findings
    assert first.cause and first.detail.startswith("1024 of 1024 bytes differ; first at row 0, block 0")
    assert (second.detail, second.cause) == (
        "differs from the reference (data 64); not diagnosed (max_diagnosed)",
        "",
    )
