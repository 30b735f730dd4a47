"""Run inside the vLLM (CPU build) virtual environment: load checkpoints with vLLM, dump what it holds.

Not a test module (pytest never imports it; ``tests/engines/test_vllm.py`` runs it with the engine's
own Python). It imports nothing from fp4convert: what it reports is vLLM's own reading of the files.

vLLM's CPU build has no NVFP4 / MXFP8 GEMM kernel, so every quantized checkpoint stops at kernel
selection. vLLM ships software-emulation kernels (``EmulationNvFp4LinearKernel``,
``EmulationMxfp8LinearKernel``: dequantize, then a BF16 matmul) and a public
``register_linear_kernel`` that adds a kernel class to a platform's candidates; this registers them
for the CPU platform. MoE layers pick their experts through vLLM's own oracles: the MXFP8 one
already picks ``Mxfp8EmulationTritonExperts`` on the CPU; the NVFP4 one needs the one shim in
:func:`_let_nvfp4_emulation_experts_load_on_cpu` (its docstring says why). That is the whole of the
adaptation. Every load runs with vLLM's strict weight tracking (``enable_weights_track``).

Writes into each OUT:
- ``weights.safetensors``: for every linear module, the BF16 weight vLLM computes with after
  ``process_weights_after_loading`` (NVFP4: vLLM's own ``dequantize_to_dtype`` over the packed
  weight, block scales and global scale it holds; MXFP8: the weight its emulation kernel
  dequantized at load; BF16 modules: the weight as held, which vLLM's CPU GEMM may have repacked
  away, leaving it empty), under vLLM's module names.
- ``experts.safetensors`` / ``experts_raw.safetensors`` (MoE models): see :func:`_held_experts`.
- ``report.json``: the quantization config class vLLM chose, each linear module's quant method and
  kernel, each experts module's method, backend and experts class, the checkpoint tensors vLLM's
  loader ignored, the per-token switch vLLM parsed, and the prompt logprobs of fixed token ids.

Usage: ``python vllm_probe.py [--load-only] MODEL_DIR OUT [MODEL_DIR OUT ...]``: one process for
several models (vLLM's import is most of the time). Without ``--load-only`` any failure is raised.
With it (MoE models, whose experts vLLM computes only with Triton, absent on the CPU) a load error
is written as ``report.json`` ``{"load_error": ...}`` and the next model is loaded; a loaded model
still gets one forward tried, and its error is reported as ``forward_error``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model lives in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

PROMPT_IDS = [[1, 17, 33, 5, 90, 64, 2, 101], [7, 7, 120, 3, 45, 18, 77, 9]]


def _register_emulation_kernels() -> list[str]:
    from vllm.model_executor.kernels.linear import register_linear_kernel
    from vllm.model_executor.kernels.linear.mxfp8.emulation import EmulationMxfp8LinearKernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum

    register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")
    register_linear_kernel(EmulationMxfp8LinearKernel, PlatformEnum.CPU, "mxfp8")
    return [EmulationNvFp4LinearKernel.__name__, EmulationMxfp8LinearKernel.__name__]


def _let_nvfp4_emulation_experts_load_on_cpu() -> str:
    """The one MoE shim: vLLM's NVFP4 emulation experts also accept the CPU platform.

    ``select_nvfp4_moe_backend`` tries every NVFP4 MoE backend and asks each expert class
    ``is_supported_config``; ``Nvfp4QuantizationEmulationTritonExperts`` inherits TritonExperts'
    device check (CUDA-alike or XPU), so on the CPU every candidate refuses and vLLM raises
    NotImplementedError before a weight is read. vLLM's MXFP8 emulation experts already answer
    ``_supports_current_device() -> True``; this gives the NVFP4 ones the same answer on the CPU
    (every other check of ``is_supported_config`` still runs), so the oracle's own last choice,
    ``NvFp4MoeBackend.EMULATION``, is picked. It makes loading possible, not the forward: those
    experts compute with Triton kernels, and vLLM disables Triton without a CPU backend.
    """
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts as experts,
    )
    from vllm.platforms import current_platform

    inherited = experts._supports_current_device
    experts._supports_current_device = staticmethod(lambda: inherited() or current_platform.is_cpu())
    return experts.__name__


def _held_weights(model):  # runs where the model lives
    import torch
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    weights, modules = {}, {}
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase):
            continue
        method = type(module.quant_method).__name__
        scheme = getattr(module, "scheme", None)  # compressed-tensors keeps its kernel on the scheme
        kernel = getattr(module.quant_method, "kernel", None) or getattr(scheme, "kernel", None)
        info = {
            "quant_method": method,
            "scheme": None if scheme is None else type(scheme).__name__,
            "kernel": None if kernel is None else type(kernel).__name__,
        }
        weight = module.weight
        if weight.dtype == torch.uint8:  # NVFP4: two E2M1 values per byte
            global_scale = module.weight_global_scale if hasattr(module, "weight_global_scale") else None
            if global_scale is None:
                raise RuntimeError(f"{name}: NVFP4 weight without weight_global_scale")
            info["weight_dtype"] = "nvfp4"
            info["weight_global_scale"] = float(global_scale.float().reshape(-1)[0])
            # exactly the call vLLM's emulation kernel makes in apply_weights
            dense = dequantize_to_dtype(
                weight.data, module.weight_scale.data, global_scale.data, torch.bfloat16, 16, swizzle=False
            )
        else:
            info["weight_dtype"] = str(weight.dtype).removeprefix("torch.")
            dense = weight.data
        for attr in ("input_global_scale", "input_global_scale_inv", "input_scale"):
            value = getattr(module, attr, None)
            if value is not None and hasattr(value, "numel") and value.numel() == 1:
                info[attr] = float(value.float().reshape(-1)[0])
        weights[name] = dense.to(torch.bfloat16).contiguous().cpu()
        modules[name] = info
    return weights, modules


def _held_experts(model):  # runs where the model lives
    """Every routed-experts module as vLLM holds it after ``process_weights_after_loading``.

    Returns (dense, raw, modules). ``dense[f"{module}.w13_weight" | ".w2_weight"]`` is the BF16
    weight the experts compute with, rebuilt from exactly the tensors the experts kernel was given
    (its ``w1_scale_val`` / ``w2_scale_val`` and ``quant_config.g1_alphas`` / ``g2_alphas``):
    NVFP4 packed bytes through vLLM's ``dequantize_to_dtype`` (the arithmetic of its emulation
    Triton kernel: E2M1 x (E4M3 scale x per-expert global scale) in FP32, then BF16); MXFP8
    (1-byte) weights through vLLM's ``dequant_mxfp8_to_bf16`` (what its emulation experts call each
    step); BF16 weights (ModelOpt MXFP8, dequantized at load) as held. ``raw[f"{module}.{param}"]``
    is every parameter held, 1-byte dtypes as uint8 views. ``modules`` names the quant method,
    backend and experts class, and the activation global scales the experts were given.
    """
    import torch
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import dequant_mxfp8_to_bf16
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    dense, raw, modules = {}, {}, {}
    for name, module in model.named_modules():
        if not isinstance(module, RoutedExperts):
            continue
        method = module.quant_method
        backend = next(
            (getattr(method, a) for a in ("nvfp4_backend", "mxfp8_backend", "fp8_backend") if hasattr(method, a)), None
        )
        kernel = method.moe_kernel.fused_experts
        config = kernel.quant_config
        info: dict = {
            "quant_method": type(method).__name__,
            "backend": None if backend is None else backend.name,
            "experts": type(kernel).__name__,
            "params": {},
        }
        for attr in ("a1_gscale", "a2_gscale"):
            value = getattr(config, attr, None)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                info[attr] = float(value.float().reshape(-1)[0])
        held = dict(module.named_parameters(recurse=False))
        for param, value in held.items():
            info["params"][param] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
            data = value.data.contiguous().cpu()
            raw[f"{name}.{param}"] = data.view(torch.uint8) if data.element_size() == 1 else data
        for weight, scale, global_scale in (
            ("w13_weight", kernel.w1_scale_val, config.g1_alphas),
            ("w2_weight", kernel.w2_scale_val, config.g2_alphas),
        ):
            value = held[weight].data
            if value.dtype == torch.uint8:  # NVFP4, two E2M1 values per byte
                value = dequantize_to_dtype(value, scale, global_scale.float(), torch.bfloat16, 16, swizzle=False)
            elif value.element_size() == 1:  # MXFP8 E4M3 values, E8M0 block scales
                value = dequant_mxfp8_to_bf16(value, scale)
            dense[f"{name}.{weight}"] = value.to(torch.bfloat16).contiguous().cpu()
        modules[name] = info
    return dense, raw, modules


class _IgnoredCheckpointTensors:
    """vLLM's own record of checkpoint tensors its loader skipped without loading them.

    ``AutoWeightsLoader`` drops unexpected names with an ignorable suffix (``.weight_scale``,
    ``.input_scale``, ``.bias``, ...) and tied aliases, and says so only at DEBUG level
    ("Ignoring weight ...", "Ignoring missing ...", "Skipping ..."). This wraps the ``debug`` method
    of that module's logger (vLLM reconfigures logging while the engine starts, which resets
    handlers and levels, but leaves the logger object and its methods alone) and keeps those lines.
    """

    MESSAGES = ("Ignoring weight", "Ignoring missing", "Skipping weight", "Skipping param", "Skipping missing")

    def __init__(self) -> None:
        from vllm.model_executor.models import utils

        self.names: list[str] = []
        self.logger = utils.logger
        self.original = utils.logger.debug

        def debug(msg: object, *args: object, **kwargs: object) -> None:
            if isinstance(msg, str) and msg.startswith(self.MESSAGES):
                self.names.append(msg % args)
            self.original(msg, *args, **kwargs)

        self.logger.debug = debug  # type: ignore[method-assign]

    def close(self) -> list[str]:
        self.logger.debug = self.original  # type: ignore[method-assign]
        return self.names


def _describe(error: BaseException) -> dict[str, str]:
    """An engine error as data: its type, message and the innermost vLLM frame (``vllm/...py:LINE``)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "site-packages/vllm/" in f.filename]
    frame = (frames or traceback.extract_tb(error.__traceback__))[-1]
    where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
    return {"type": type(error).__name__, "message": str(error), "where": where}


def _probe_one(model: str, out: Path, load_only: bool, kernels: list[str]) -> None:
    """Load ``model`` with vLLM (strict weight tracking), dump what it holds into ``out``."""
    from safetensors.torch import save_file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out.mkdir(parents=True, exist_ok=True)
    ignored = _IgnoredCheckpointTensors()
    try:
        llm = LLM(
            model=model,
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            max_model_len=64,
            max_num_seqs=2,
            max_num_batched_tokens=64,
            seed=0,
            # vLLM checks this only for unquantized models by default: every parameter must come
            # from the checkpoint, or DefaultModelLoader raises "Following weights were not initialized".
            model_loader_extra_config={"enable_weights_track": True},
        )
    except Exception as error:  # recorded, not hidden: with --load-only the report says why
        if not load_only:
            raise
        (out / "report.json").write_text(json.dumps({"load_error": _describe(error)}, indent=2))
        return
    finally:
        ignored_names = ignored.close()
    [(weights, modules)] = llm.apply_model(_held_weights)
    [(experts, experts_raw, experts_info)] = llm.apply_model(_held_experts)
    vllm_config = llm.llm_engine.vllm_config
    quant = vllm_config.quant_config
    report: dict = {
        "vllm_quant_config": None if quant is None else type(quant).__name__,
        "registered_kernels": kernels,
        "modules": modules,
        "experts": experts_info,
        "weights_track": vllm_config.load_config.model_loader_extra_config.get("enable_weights_track"),
        "ignored_checkpoint_tensors": ignored_names,
        "moe_activation": None,
    }
    moe_config = getattr(quant, "moe_quant_config", None) or getattr(quant, "moe", None)
    if moe_config is not None:
        report["moe_activation"] = str(getattr(moe_config, "activation", moe_config))
    save_file(weights, str(out / "weights.safetensors"))
    if experts:
        save_file(experts, str(out / "experts.safetensors"))
        save_file(experts_raw, str(out / "experts_raw.safetensors"))
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in PROMPT_IDS]
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as error:  # recorded, not hidden: with --load-only the report says why
        if not load_only:
            raise
        report["forward_error"] = _describe(error)
    else:
        report["prompt_ids"] = PROMPT_IDS
        report["prompt_logprobs"] = [
            [None if step is None else step[ids[i]].logprob for i, step in enumerate(o.prompt_logprobs)]
            for o, ids in zip(outputs, PROMPT_IDS, strict=True)
        ]
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    del llm


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("pairs", nargs="+", metavar="MODEL_DIR OUT")
    parser.add_argument("--load-only", action="store_true")
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("expected MODEL_DIR OUT pairs")
    kernels = [*_register_emulation_kernels(), _let_nvfp4_emulation_experts_load_on_cpu()]
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    for model, out in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        _probe_one(model, Path(out), args.load_only, kernels)
        cleanup_dist_env_and_memory()  # the next LLM builds its own (single-rank) process group
    return 0


if __name__ == "__main__":
    sys.exit(main())
