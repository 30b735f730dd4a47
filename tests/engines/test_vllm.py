"""vLLM (its CPU build, in its own venv) loads fp4convert's outputs and computes with the same weights.

For each dense output of each dialect vLLM reads (ModelOpt: NVFP4 per-token, NVFP4 W4A4 with calibrated
activation scales, MXFP8, NVFP4+MXFP8 mixed; compressed-tensors: NVFP4 W4A4, MXFP8) ``vllm_probe.py``
loads it with ``vllm.LLM`` (vLLM's own NVFP4 / MXFP8 software-emulation kernels registered for the CPU
through its public ``register_linear_kernel``), runs a forward over fixed prompt ids, and dumps every
linear module's weight as vLLM computes with it after ``process_weights_after_loading``. Those weights
equal ``fp4convert dequantize`` of the same output byte for byte (uint8 views; vLLM's fused ``qkv_proj``
/ ``gate_up_proj`` are the concatenated HF pieces). The prompt logprobs against the BF16 source model
are printed (``-s``), not asserted: quantization moves them.

compressed-tensors NVFP4 without calibrated activations (per-token contracts) is weight-only
(W4A16) in vLLM, and none of vLLM's W4A16 kernels runs on the CPU: that refusal is asserted.
The sglang-mxfp8 dialect is SGLang's: vLLM reads its ``quant_method: mxfp8`` as ModelOpt MXFP8 and
must refuse it, which is what the README says. ``contract emit --target vllm-args`` is parsed by
vLLM's own argument parser.

Not covered: MoE outputs. vLLM's CPU build has no MoE backend for NVFP4 (``select_nvfp4_moe_backend``
raises NotImplementedError before any weight is read: every candidate needs CUDA or Triton), so no
MoE checkpoint can be constructed, let alone loaded, on this machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _helpers import MXFP8_ALL, assert_bytes_equal
from conftest import _build_model
from engines.envs import engine_python, run_in_env
from safetensors.torch import load_file

from fp4convert import convert_checkpoint, dequantize_checkpoint, load_contract
from fp4convert.contract.emit import emit

HERE = Path(__file__).parent
DATA = HERE / "data"
PER_TOKEN = DATA / "nvfp4-linears-per-token.yaml"
W4A4 = DATA / "nvfp4-linears-w4a4.yaml"
MIXED = DATA / "mixed-nvfp4-mlp-mxfp8-attention.yaml"

#: (dialect, contract, the quantization config class vLLM must pick)
CASES = [
    ("modelopt", PER_TOKEN, "ModelOptNvFp4Config"),
    ("modelopt", W4A4, "ModelOptNvFp4Config"),
    ("modelopt", MXFP8_ALL, "ModelOptMxFp8Config"),
    ("modelopt", MIXED, "ModelOptMixedPrecisionConfig"),
    ("compressed-tensors", W4A4, "CompressedTensorsConfig"),
    ("compressed-tensors", MXFP8_ALL, "CompressedTensorsConfig"),
]

#: compressed-tensors NVFP4 without calibrated activations is weight-only (W4A16) in vLLM, whose
#: kernels (Marlin, CuTe-DSL, Humming, B12x) all need a GPU: vLLM's CPU build cannot load it at all
#: (its emulation kernel is not a W4A16 candidate). Asserted as the refusal it is.
WEIGHT_ONLY_IN_VLLM = [("compressed-tensors", PER_TOKEN), ("compressed-tensors", MIXED)]

#: vLLM's fused modules -> the HF modules whose rows they hold, in order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def vllm_env() -> str:
    return str(engine_python("vllm"))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny untied Llama with head_dim 32 (vLLM's CPU attention takes 32, 64, ...; not 16)."""
    directory = tmp_path_factory.mktemp("llama-hd32")
    _build_model("llama", 0, head_dim=32).save_pretrained(str(directory))
    return directory


def _calibration(source: Path, path: Path) -> Path:
    """Fixed positive activation amaxes for every linear module (W4A4 needs one per module)."""
    names = [n.removesuffix(".weight") for n in load_file(str(source / "model.safetensors")) if "_proj." in n]
    path.write_text(json.dumps({name: 3.0 + (i % 7) for i, name in enumerate(sorted(names))}))
    return path


def _probe(vllm_env: str, model: Path, out: Path) -> dict:
    done = run_in_env("vllm", HERE / "vllm_probe.py", str(model), str(out))
    if done.returncode:
        raise AssertionError(f"vLLM failed on {model.name}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def bf16_report(vllm_env: str, source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _probe(vllm_env, source, tmp_path_factory.mktemp("vllm-bf16"))


def _expected(dequantized: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    parent, leaf = module.rsplit(".", 1)
    pieces = FUSED.get(leaf, (leaf,))
    return torch.cat([dequantized[f"{parent}.{piece}.weight"] for piece in pieces])


def _print_logprobs(label: str, report: dict, reference: dict) -> float:
    worst = 0.0
    for ids, got, ref in zip(
        report["prompt_ids"], report["prompt_logprobs"], reference["prompt_logprobs"], strict=True
    ):
        diffs = [abs(a - b) for a, b in zip(got[1:], ref[1:], strict=True)]
        worst = max(worst, *diffs)
        shown = " ".join(f"{a:7.3f}/{b:7.3f}" for a, b in zip(got[1:], ref[1:], strict=True))
        print(f"{label}: prompt {ids}: logprob quantized/bf16 {shown}")
    print(f"{label}: max |logprob - bf16 logprob| = {worst:.4f}")
    return worst


@pytest.mark.parametrize(("dialect", "contract", "config_class"), CASES, ids=lambda v: getattr(v, "stem", v))
def test_vllm_loads_and_holds_the_dequantized_weights(
    dialect, contract, config_class, vllm_env, source, bf16_report, tmp_path
) -> None:
    calibration = _calibration(source, tmp_path / "calibration.json") if contract == W4A4 else None
    converted = tmp_path / "converted"
    convert_checkpoint(source, converted, contract=contract, dialect=dialect, calibration=calibration)
    dequantize_checkpoint(converted, tmp_path / "dequantized")
    dequantized = load_file(str(tmp_path / "dequantized" / "model.safetensors"))

    report = _probe(vllm_env, converted, tmp_path / "vllm")
    assert report["vllm_quant_config"] == config_class
    held = load_file(str(tmp_path / "vllm" / "weights.safetensors"))
    assert sorted(held) == sorted(report["modules"])
    assert len(held) == 8  # q/k/v, o, gate/up, down in 2 layers: every linear module was checked
    for module, weight in held.items():
        assert_bytes_equal(weight, _expected(dequantized, module))
        info = report["modules"][module]
        assert info["quant_method"] != "UnquantizedLinearMethod", info  # every linear is low precision
        assert info["kernel"] in ("EmulationNvFp4LinearKernel", "EmulationMxfp8LinearKernel"), info
    worst = _print_logprobs(f"{dialect}/{contract.stem}", report, bf16_report)
    assert math.isfinite(worst)


@pytest.mark.parametrize(("dialect", "contract"), WEIGHT_ONLY_IN_VLLM, ids=lambda v: getattr(v, "stem", v))
def test_vllm_cpu_cannot_run_per_token_compressed_tensors_nvfp4(dialect, contract, vllm_env, source, tmp_path) -> None:
    converted = tmp_path / "converted"
    convert_checkpoint(source, converted, contract=contract, dialect=dialect)
    done = run_in_env("vllm", HERE / "vllm_probe.py", str(converted), str(tmp_path / "vllm"))
    assert done.returncode != 0
    assert "Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported" in done.stdout + done.stderr


def test_bf16_source_logprobs_are_finite(bf16_report) -> None:
    assert bf16_report["vllm_quant_config"] is None
    assert all(math.isfinite(v) for row in bf16_report["prompt_logprobs"] for v in row[1:])


def test_vllm_refuses_the_sglang_mxfp8_dialect(vllm_env, source, tmp_path) -> None:
    """sglang-mxfp8 is SGLang's: vLLM maps `quant_method: mxfp8` to ModelOpt MXFP8, which wants
    `weight_scale` and `ignored_layers`; the README's engine table says SGLang only."""
    converted = tmp_path / "converted"
    convert_checkpoint(source, converted, contract=MXFP8_ALL, dialect="sglang-mxfp8")
    done = run_in_env("vllm", HERE / "vllm_probe.py", str(converted), str(tmp_path / "vllm"))
    assert done.returncode != 0
    assert "weight_scale" in done.stdout + done.stderr


def test_tied_lm_head_is_excluded_for_vllm(vllm_env, tmp_path) -> None:
    """A tied-embedding model (Qwen3-4B style) has no `lm_head` tensor, but vLLM still builds a
    quantized `lm_head` unless the exclude list names it (it does since the exclude list names a tied
    lm_head: it used to be `[]`, and vLLM failed on the never-loaded `weight_scale`)."""
    model = tmp_path / "qwen3"
    _build_model("qwen3", 0).save_pretrained(str(model))
    converted = tmp_path / "converted"
    convert_checkpoint(model, converted, contract=PER_TOKEN, dialect="modelopt")
    done = run_in_env("vllm", HERE / "vllm_probe.py", str(converted), str(tmp_path / "vllm"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]


def test_emitted_vllm_args_parse_in_vllm(vllm_env) -> None:
    import shlex

    emitted = emit(load_contract("nvfp4-experts-per-token"), "vllm-args")
    args = [part for line in emitted.text.splitlines() for part in shlex.split(line)]
    done = run_in_env("vllm", HERE / "vllm_args_probe.py", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {
        "kv_cache_dtype": "bfloat16",
        "quantization": None,
        "moe_activation": "nvfp4_per_token",
        "linear_activation": None,
    }
    plain = emit(load_contract(MXFP8_ALL), "vllm-args")
    assert "--quantization-config" not in plain.text
