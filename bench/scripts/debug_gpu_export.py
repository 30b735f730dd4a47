"""Device diagnostic: does export_hf quantize the experts of the tiny Qwen3-MoE on CPU and CUDA?"""

import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from conftest import build_tiny_checkpoint

from fp4convert.contract import load_contract
from fp4convert.families import hf_to_megatron, inventory_from_checkpoint, load_config
from fp4convert.megatron import export_hf

d = build_tiny_checkpoint("qwen3_moe", Path(tempfile.mkdtemp()) / "m")
inv = inventory_from_checkpoint(d)
contract = load_contract("contracts/nvfp4-experts-per-token.yaml")
decisions = contract.decide_all(inv)
print("decisions:", Counter(x.format for x in decisions.values()))
from safetensors.torch import load_file  # noqa: E402

hf = {}
for f in sorted(d.glob("*.safetensors")):
    hf.update(load_file(str(f)))
config = dict(load_config(d))
for device in ("cpu", "cuda"):
    meg = {n: t.to(device) for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    out = dict(export_hf(meg, contract=contract, family="qwen3_moe", config=config, dialect="modelopt"))
    print(device, len(out), Counter(str(t.dtype) for t in out.values()))
print(torch.__version__)
