"""Run inside the vLLM (CPU build) virtual environment: load one checkpoint with vLLM, dump what it holds.

Not a test module (pytest never imports it; ``tests/engines/test_vllm.py`` runs it with the engine's
own Python). It imports nothing from fp4convert: what it reports is vLLM's own reading of the files.

vLLM's CPU build has no NVFP4 / MXFP8 GEMM kernel, so every quantized checkpoint stops at kernel
selection. vLLM ships software-emulation kernels (``EmulationNvFp4LinearKernel``,
``EmulationMxfp8LinearKernel``: dequantize, then a BF16 matmul) and a public
``register_linear_kernel`` that adds a kernel class to a platform's candidates; this registers them
for the CPU platform, which is the whole of the adaptation.

Writes into OUT:
- ``weights.safetensors``: for every linear module, the BF16 weight vLLM computes with after
  ``process_weights_after_loading`` (NVFP4: vLLM's own ``dequantize_to_dtype`` over the packed
  weight, block scales and global scale it holds; MXFP8: the weight its emulation kernel
  dequantized at load; BF16 modules: the weight as held), under vLLM's module names.
- ``report.json``: the quantization config class vLLM chose, each linear module's quant method and
  kernel, the per-token switch vLLM parsed, and the prompt logprobs of fixed token ids.

Usage: ``python vllm_probe.py MODEL_DIR OUT [--load-only]`` (``--load-only``: MoE models, which have no
non-Triton MoE forward on CPU: load and report, no generation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--load-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from safetensors.torch import save_file

    kernels = _register_emulation_kernels()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=64,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        seed=0,
    )
    [(weights, modules)] = llm.apply_model(_held_weights)
    vllm_config = llm.llm_engine.vllm_config
    quant = vllm_config.quant_config
    report: dict = {
        "vllm_quant_config": None if quant is None else type(quant).__name__,
        "registered_kernels": kernels,
        "modules": modules,
        "moe_activation": None,
    }
    moe_config = getattr(quant, "moe_quant_config", None) or getattr(quant, "moe", None)
    if moe_config is not None:
        report["moe_activation"] = str(getattr(moe_config, "activation", moe_config))
    if not args.load_only:
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in PROMPT_IDS], params, use_tqdm=False)
        report["prompt_ids"] = PROMPT_IDS
        report["prompt_logprobs"] = [
            [None if step is None else step[ids[i]].logprob for i, step in enumerate(o.prompt_logprobs)]
            for o, ids in zip(outputs, PROMPT_IDS, strict=True)
        ]
    save_file({n: t for n, t in weights.items()}, str(out / "weights.safetensors"))
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    del torch
    return 0


if __name__ == "__main__":
    sys.exit(main())
