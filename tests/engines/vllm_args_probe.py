"""Run inside the vLLM venv: parse engine arguments with vLLM's own CLI parser, print what vLLM made of them.

Usage: ``python vllm_args_probe.py ARG ...`` (the output of ``fp4convert contract emit --target vllm-args``).
Prints JSON: the KV-cache dtype and the MoE / linear activation quantization vLLM resolved.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from vllm.config.quantization import QUANT_KEY_NAMES
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", "unused", *sys.argv[1:]]))
    names = {key: name for name, key in QUANT_KEY_NAMES.items()}
    resolved = args.quantization_config
    report = {
        "kv_cache_dtype": args.kv_cache_dtype,
        "quantization": args.quantization,
        "moe_activation": None,
        "linear_activation": None,
    }
    if resolved is not None and not isinstance(resolved, dict):
        for part in ("moe", "linear"):
            spec = getattr(resolved, part, None)
            if spec is not None and spec.activation is not None:
                report[f"{part}_activation"] = names.get(spec.activation, str(spec.activation))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
