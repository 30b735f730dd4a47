"""End-to-end conversion: every dialect, every byte re-derived, atomic and resumable output."""

from __future__ import annotations

import fnmatch
import json
import time

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal, tree_hashes
from safetensors import safe_open

from fp4convert.checkpoint.hashing import file_sha256
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import parse_contract
from fp4convert.convert.execute import convert_checkpoint
from fp4convert.convert.parallel import default_readers, split_files_ahead
from fp4convert.errors import ConversionError
from fp4convert.formats import quantize_mxfp8, quantize_nvfp4
from fp4convert.verify.checkpoint import verify_checkpoint


def _tensors(directory) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


@pytest.mark.parametrize(
    ("dialect", "contract"),
    [
        ("modelopt", NVFP4_EXPERTS),
        ("compressed-tensors", NVFP4_EXPERTS),
        ("sglang-mxfp8", MXFP8_ALL),
        ("modelopt", MXFP8_ALL),
        ("compressed-tensors", MXFP8_ALL),
    ],
)
def test_every_dialect_verifies_against_the_source(converted, tiny_checkpoint, dialect, contract):
    out = converted("qwen3_moe", dialect, contract)
    report = verify_checkpoint(out, source=tiny_checkpoint("qwen3_moe"))
    assert report.ok, report.summary()
    assert report.compared_with_source
    manifest = json.loads((out / "fp4convert.json").read_text())
    assert manifest["dialect"] == dialect and manifest["quantizer_profile"] == "te"


def test_modelopt_nvfp4_bytes_equal_the_reference_quantizer_with_shared_gate_up_scale(converted, tiny_checkpoint):
    src = _tensors(tiny_checkpoint("qwen3_moe"))
    out = _tensors(converted("qwen3_moe", "modelopt"))
    prefix = "model.layers.0.mlp.experts.1"
    gate, up = src[f"{prefix}.gate_proj.weight"], src[f"{prefix}.up_proj.weight"]
    shared = torch.maximum(gate.float().abs().amax(), up.float().abs().amax())
    for name, w in (("gate_proj", gate), ("up_proj", up)):
        q = quantize_nvfp4(w, amax=shared)
        assert_bytes_equal(out[f"{prefix}.{name}.weight"], q.data)
        assert_bytes_equal(out[f"{prefix}.{name}.weight_scale"], q.scale)
        assert out[f"{prefix}.{name}.weight_scale"].dtype == torch.float8_e4m3fn
        assert out[f"{prefix}.{name}.weight_scale"].shape == (w.shape[0], w.shape[1] // 16)  # unswizzled
        assert_bytes_equal(out[f"{prefix}.{name}.weight_scale_2"], q.global_decode_scale())
        assert out[f"{prefix}.{name}.weight_scale_2"].shape == ()
        assert out[f"{prefix}.{name}.input_scale"].item() == 1.0  # per-token activation contract
    down = src[f"{prefix}.down_proj.weight"]
    assert_bytes_equal(out[f"{prefix}.down_proj.weight"], quantize_nvfp4(down).data)
    # Everything the contract keeps BF16 is copied bit for bit.
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate.weight", "lm_head.weight"):
        assert_bytes_equal(out[name], src[name])


def test_modelopt_loader_rules(converted, tiny_checkpoint):
    out = converted("qwen3_moe", "modelopt")
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["quant_algo"]) == ("modelopt", "NVFP4")  # SGLang -> modelopt_fp4
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 16
    nested = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert {"group_size", "kv_cache_quant_algo", "exclude_modules"} <= set(nested)  # vLLM requires them
    manifest = json.loads((out / "fp4convert.json").read_text())
    bf16_modules = [
        n.rsplit(".", 1)[0]
        for n, t in manifest["tensors"].items()
        if t["format"] == "bf16" and t["role"] != "norm" and t["role"] != "embedding" and n.endswith(".weight")
    ]
    assert bf16_modules
    for module in bf16_modules:  # every BF16 Linear and router is excluded, as engines match it
        assert any(fnmatch.fnmatch(module, p) for p in config["ignore"]), module
    assert "model.layers.0.mlp.gate" in config["ignore"] or "model.layers.*.mlp.gate" in config["ignore"]
    tensors = _tensors(out)
    for e in range(4):
        g = tensors[f"model.layers.0.mlp.experts.{e}.gate_proj.weight_scale_2"]
        u = tensors[f"model.layers.0.mlp.experts.{e}.up_proj.weight_scale_2"]
        assert_bytes_equal(g, u)


def test_sglang_mxfp8_layout_and_config(converted, tiny_checkpoint):
    out = converted("qwen3_moe", "sglang-mxfp8", MXFP8_ALL)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "mxfp8" and config["weight_block_size"] == [1, 32]
    assert config["scale_fmt"] == "ue8m0" and "lm_head" in config["modules_to_not_convert"]
    assert not (out / "hf_quant_config.json").exists()
    src = _tensors(tiny_checkpoint("qwen3_moe"))
    tensors = _tensors(out)
    name = "model.layers.0.self_attn.o_proj"
    q = quantize_mxfp8(src[f"{name}.weight"])
    assert tensors[f"{name}.weight"].dtype == torch.float8_e4m3fn
    assert_bytes_equal(tensors[f"{name}.weight"], q.data)
    assert_bytes_equal(tensors[f"{name}.weight_scale_inv"], q.scale)
    assert not any(k.endswith("input_scale") for k in tensors)


def test_compressed_tensors_uses_reciprocal_global_scale(converted, tiny_checkpoint):
    out = converted("qwen3_moe", "compressed-tensors")
    tensors = _tensors(out)
    mo = _tensors(converted("qwen3_moe", "modelopt"))
    name = "model.layers.2.mlp.experts.3.down_proj"
    assert_bytes_equal(tensors[f"{name}.weight_packed"], mo[f"{name}.weight"])
    assert tensors[f"{name}.weight_global_scale"].shape == (1,)
    # compressed-tensors stores the encode scale S_enc, ModelOpt the decode scale rn32(1 / S_enc) (te profile).
    s_enc = tensors[f"{name}.weight_global_scale"]
    assert_bytes_equal(mo[f"{name}.weight_scale_2"], torch.div(torch.ones(()), s_enc.reshape(())))
    assert f"{name}.input_global_scale" not in tensors  # per-token: weight-only NVFP4 group
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "nvfp4-pack-quantized"
    assert config["config_groups"]["group_0"]["input_activations"] is None


def test_workers_set_torch_threads_for_the_run_only(tiny_checkpoint, tmp_path):
    before = torch.get_num_threads()
    seen = []
    convert_checkpoint(
        tiny_checkpoint("llama"),
        tmp_path / "o",
        contract=MXFP8_ALL,
        workers=before + 1,
        progress=lambda event, payload: seen.append(torch.get_num_threads()),
    )
    assert set(seen) == {before + 1} and torch.get_num_threads() == before


def test_report_times_each_phase_in_order(tiny_checkpoint, tmp_path):
    started = time.perf_counter()
    report = convert_checkpoint(tiny_checkpoint("llama"), tmp_path / "o", contract=MXFP8_ALL)
    elapsed = time.perf_counter() - started
    assert list(report.phases) == ["plan", "staging", "shards", "manifest", "verify", "publish"]
    assert all(seconds >= 0 for seconds in report.phases.values())
    # laps of one clock inside the run: together no longer than the run itself
    assert sum(report.phases.values()) <= report.seconds <= elapsed


def test_source_is_never_modified(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    before = tree_hashes(src)
    convert_checkpoint(src, tmp_path / "out", contract=NVFP4_EXPERTS)
    assert tree_hashes(src) == before


def test_existing_destination_and_overlap_are_refused(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConversionError, match=r"already exists; pass overwrite=True \(--overwrite\) to replace it"):
        convert_checkpoint(src, tmp_path / "taken", contract=NVFP4_EXPERTS)
    with pytest.raises(ConversionError, match=r"overlaps the source"):
        convert_checkpoint(src, src / "inside", contract=NVFP4_EXPERTS)
    report = convert_checkpoint(src, tmp_path / "taken", contract=NVFP4_EXPERTS, overwrite=True)
    assert verify_checkpoint(report.destination).ok


class _Interrupt(Exception):
    pass


def test_interrupted_run_leaves_nothing_that_looks_complete_and_resumes(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")  # 8 source shards
    seen = []

    def stop_midway(event, payload):
        if event == "tensor":
            seen.append(payload["name"])
            if len(seen) == 30:
                raise _Interrupt

    dst = tmp_path / "out"
    with pytest.raises(_Interrupt):
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, progress=stop_midway)
    assert not dst.exists()
    partial = tmp_path / "out.partial"
    assert not (partial / "fp4convert.json").exists() and not (partial / "config.json").exists()
    assert not list(partial.glob("*.tmp"))  # the shard being written was removed
    with pytest.raises(ConversionError, match=r"holds an interrupted conversion; pass resume=True \(--resume\)"):
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    report = convert_checkpoint(src, dst, contract=NVFP4_EXPERTS, resume=True)
    assert report.resumed_files  # finished shards were kept
    assert verify_checkpoint(dst, source=src).ok
    assert not partial.exists()


def test_a_write_that_reads_back_different_fails_the_run_naming_it_and_publishes_nothing(
    tiny_checkpoint, tmp_path, monkeypatch
):
    # every write is read back and compared (PositionalWriter); storage that returns other bytes
    # for one tensor stops the conversion there, with that tensor named, and nothing is published
    from fp4convert.checkpoint import positional_writer
    from fp4convert.errors import CheckpointError

    src = tiny_checkpoint("qwen3_moe")
    real = positional_writer._equal
    calls = []

    def differs_once(address, view, start, nbytes):
        calls.append(nbytes)
        return real(address, view, start, nbytes) and len(calls) != 40

    monkeypatch.setattr(positional_writer, "_equal", differs_once)
    dst = tmp_path / "out"
    with pytest.raises(CheckpointError, match=r"reads back different from what was written") as info:
        convert_checkpoint(src, dst, contract=NVFP4_EXPERTS)
    assert info.value.tensor
    assert not dst.exists()
    assert not (tmp_path / "out.partial" / "fp4convert.json").exists()


def test_resume_refuses_a_different_contract(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")

    def stop(event, payload):
        if event == "tensor":
            raise _Interrupt

    with pytest.raises(_Interrupt):
        convert_checkpoint(src, tmp_path / "o", contract=NVFP4_EXPERTS, progress=stop)
    with pytest.raises(ConversionError, match=r"was started with another contract"):
        convert_checkpoint(src, tmp_path / "o", contract=MXFP8_ALL, resume=True)


def test_max_shard_size_reshards(tiny_checkpoint, tmp_path):
    report = convert_checkpoint(
        tiny_checkpoint("qwen3_moe"), tmp_path / "o", contract=NVFP4_EXPERTS, max_shard_size=60_000
    )
    files = sorted(p.name for p in (tmp_path / "o").glob("*.safetensors"))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert verify_checkpoint(report.destination, source=tiny_checkpoint("qwen3_moe")).ok


def test_refusals_are_listed_before_anything_is_written(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    with pytest.raises(ConversionError, match=r"dialect 'sglang-mxfp8' cannot store nvfp4 tensors") as info:
        convert_checkpoint(src, tmp_path / "o", contract=NVFP4_EXPERTS, dialect="sglang-mxfp8")
    assert "conversion refused before writing anything" in str(info.value)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors", "sglang-mxfp8"])
def test_a_contract_that_quantizes_nothing_is_refused_before_writing(tiny_checkpoint, tmp_path, dialect):
    with pytest.raises(ConversionError, match=r"keeps every tensor of this llama model in high precision"):
        convert_checkpoint(tiny_checkpoint("llama"), tmp_path / "o", contract=NVFP4_EXPERTS, dialect=dialect)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


CALIBRATED = """version: 1
name: nvfp4-experts-calibrated
formats: {nvfp4: {per_token_activations: false}}
rules: [{kind: glob, namespace: hf, pattern: "*.mlp.experts.*", format: nvfp4}]
default: bf16
bf16_exceptions: {routers: true, lm_head: true}
"""


def test_per_tensor_activations_need_calibration(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    contract = parse_contract(CALIBRATED)
    with pytest.raises(ConversionError, match=r"needs calibrated activation amaxes; \d+ modules have none"):
        convert_checkpoint(src, tmp_path / "o", contract=contract)
    modules = [
        f"model.layers.{layer}.mlp.experts.{e}.{p}"
        for layer in (0, 2)
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    amaxes = {m: 1.0 + i for i, m in enumerate(modules)}
    (tmp_path / "calib.json").write_text(json.dumps(amaxes))
    convert_checkpoint(src, tmp_path / "o", contract=contract, calibration=tmp_path / "calib.json")
    tensors = _tensors(tmp_path / "o")
    gate = "model.layers.0.mlp.experts.0.gate_proj"
    up = "model.layers.0.mlp.experts.0.up_proj"
    shared = max(amaxes[gate], amaxes[up])  # fused siblings read one activation: one input scale
    expected = torch.div(torch.tensor(shared), torch.tensor(2688.0))
    assert_bytes_equal(tensors[f"{gate}.input_scale"], expected)
    assert_bytes_equal(tensors[f"{up}.input_scale"], expected)
    assert verify_checkpoint(tmp_path / "o", source=src).ok


def test_deepseek_mla_kv_b_proj_stays_bf16(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("deepseek_v3")
    contract = next(p for p in NVFP4_EXPERTS.parent.glob("deepseek*.yaml"))
    convert_checkpoint(src, tmp_path / "o", contract=contract, dialect="sglang-mxfp8")
    manifest = json.loads((tmp_path / "o" / "fp4convert.json").read_text())
    kv_b = [n for n in manifest["tensors"] if ".kv_b_proj." in n]
    assert kv_b and all(manifest["tensors"][n]["format"] == "bf16" for n in kv_b)
    config = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert any(fnmatch.fnmatch(kv_b[0].rsplit(".", 1)[0], p) for p in config["modules_to_not_convert"])
    assert verify_checkpoint(tmp_path / "o", source=src).ok


def test_output_is_a_complete_hf_folder(converted, tiny_checkpoint):
    src, out = tiny_checkpoint("qwen3_moe"), converted("qwen3_moe", "modelopt")
    assert (out / "generation_config.json").read_bytes() == (src / "generation_config.json").read_bytes()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    config = json.loads((out / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "quantization_config"} == json.loads(
        (src / "config.json").read_text()
    )


MIXED = """version: 1
name: nvfp4-experts-mxfp8-attention
formats: {nvfp4: {per_token_activations: true}}
rules:
  - {kind: glob, namespace: hf, pattern: "*.mlp.experts.*", format: nvfp4}
  - {kind: glob, namespace: hf, pattern: "*.self_attn.*", format: mxfp8}
default: bf16
bf16_exceptions: {routers: true, lm_head: true}
"""


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_mixed_precision_configs(tiny_checkpoint, tmp_path, dialect):
    src = tiny_checkpoint("qwen3_moe")
    convert_checkpoint(src, tmp_path / "o", contract=parse_contract(MIXED), dialect=dialect)
    config = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    if dialect == "modelopt":
        # quantized_layers must be in config.json itself, or SGLang silently takes its w4afp8 path.
        assert config["quant_algo"] == "MIXED_PRECISION"
        layers = config["quantized_layers"]
        assert layers["model.layers.0.mlp.experts.0.gate_proj"] == {"quant_algo": "NVFP4", "group_size": 16}
        assert layers["model.layers.0.self_attn.q_proj"] == {"quant_algo": "MXFP8", "group_size": 32}
        assert "lm_head" not in layers and "model.layers.0.mlp.gate" not in layers
        nested = json.loads((tmp_path / "o" / "hf_quant_config.json").read_text())["quantization"]
        assert nested["quant_algo"] == "MIXED_PRECISION" and nested["quantized_layers"] == layers
    else:
        assert config["format"] == "mixed-precision"
        formats = {g["format"] for g in config["config_groups"].values()}
        assert formats == {"nvfp4-pack-quantized", "mxfp8-quantized"}
    assert verify_checkpoint(tmp_path / "o", source=src).ok


@pytest.mark.parametrize("contract", [NVFP4_EXPERTS, MXFP8_ALL])
def test_compressed_tensors_config_parses_with_the_library(converted, contract):
    ct = pytest.importorskip("compressed_tensors.quantization")
    out = converted("qwen3_moe", "compressed-tensors", contract)
    config = ct.QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    assert config.quantization_status == "compressed"
    assert all(len(group.targets) > 0 for group in config.config_groups.values())


@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_per_token_activation_mode_is_recorded_in_the_config(converted, dialect):
    out = converted("qwen3_moe", dialect)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION=1" in config["fp4convert_activation_mode"]
    assert json.loads((out / "fp4convert.json").read_text())["activation_mode"] == "per-token"


def _files_equal_but_created(one, other) -> None:
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        if name == "fp4convert.json":
            a, b = (json.loads((d / name).read_text()) for d in (one, other))
            a.pop("created"), b.pop("created")
            assert a == b
        else:
            assert (one / name).read_bytes() == (other / name).read_bytes(), name


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_many_readers_cut_files_into_streams_and_write_the_same_bytes(tiny_checkpoint, tmp_path, family):
    # 64 workers give 32 readers, four times the tiny checkpoints' 8 files: each file is read in runs
    # (fused pairs kept whole) and hashed from disk; one worker reads each file in one stream
    src = tiny_checkpoint(family)
    convert_checkpoint(src, tmp_path / "one", contract=NVFP4_EXPERTS, workers=1)
    convert_checkpoint(src, tmp_path / "many", contract=NVFP4_EXPERTS, workers=64)
    _files_equal_but_created(tmp_path / "one", tmp_path / "many")
    manifest = json.loads((tmp_path / "many" / "fp4convert.json").read_text())
    # the files cut into runs were hashed whole by child processes started before the plan
    assert split_files_ahead(open_checkpoint(src), default_readers(64))
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert {f: manifest["source"]["files"][f] for f in shards} == {f: file_sha256(src / f) for f in shards}
