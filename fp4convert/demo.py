"""``fp4convert demo``: the main job end to end on a small embedded model, no download.

Builds a tiny Qwen3-MoE checkpoint (the embedded config, deterministic N(0, 0.02) weights, the
model's real tensor names, two shards), converts it under the shipped per-token NVFP4 experts
contract into the ModelOpt dialect, verifies every byte against the source, and shows what the
contract tells each consumer (the environment block).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fp4convert.checkpoint.safetensors_io import StreamingWriter, shard_metadata
from fp4convert.checkpoint.source import INDEX_NAME
from fp4convert.convert.execute import ConversionReport, convert_checkpoint
from fp4convert.families import inventory_from_config
from fp4convert.verify.checkpoint import VerifyReport, verify_checkpoint

__all__ = ["DEMO_CONFIG", "DemoReport", "build_demo_checkpoint", "run_demo"]

DEMO_CONFIG = Path(__file__).parent / "data" / "demo" / "qwen3-moe-tiny.json"
DEMO_CONTRACT = "nvfp4-experts-per-token"


@dataclass
class DemoReport:
    """What the demo did: the source it built, the conversion, the verification, the serving environment."""

    source: str
    conversion: ConversionReport
    verification: VerifyReport
    environment: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types (what ``demo --json`` prints)."""
        return {
            "source": self.source,
            "conversion": asdict(self.conversion),
            "verification": self.verification.to_json(),
            "environment": self.environment,
        }


def build_demo_checkpoint(directory: Path, *, shards: int = 2, seed: int = 0) -> Path:
    """Write the embedded tiny model as an HF checkpoint (config.json, shards, index)."""
    config = json.loads(DEMO_CONFIG.read_text())
    inventory = inventory_from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    per_shard = -(-len(inventory) // shards)
    weight_map = {}
    for n in range(shards):
        part = inventory.tensors[n * per_shard : (n + 1) * per_shard]
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        writer = StreamingWriter(directory / name, [(t.name, "BF16", t.shape) for t in part], shard_metadata())
        for t in part:
            weights = (
                torch.ones(t.shape) if t.role.value == "norm" else torch.randn(t.shape, generator=generator) * 0.02
            )
            writer.write(t.name, weights.to(torch.bfloat16))
            weight_map[t.name] = name
        writer.close()
    total = sum(t.numel * 2 for t in inventory)
    (directory / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def run_demo(workdir: str | Path) -> DemoReport:
    """Build, convert, verify; returns what happened (the CLI prints it)."""
    from fp4convert.contract import load_contract
    from fp4convert.contract.emit import emit

    workdir = Path(workdir)
    source = workdir / "source"
    if source.exists():
        shutil.rmtree(source)
    build_demo_checkpoint(source)
    contract = load_contract(DEMO_CONTRACT)
    conversion = convert_checkpoint(source, workdir / "nvfp4-modelopt", contract=contract, overwrite=True)
    verification = verify_checkpoint(conversion.destination, source=source)
    return DemoReport(str(source), conversion, verification, emit(contract, "env").text)
