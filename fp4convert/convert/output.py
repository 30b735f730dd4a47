"""The files of a converted checkpoint besides its shards, written once every shard is done.

config.json with the dialect's ``quantization_config``, the index (unless there is one shard,
``model.safetensors``), the dialect's side files, the source's other files (tokenizer, generation
config ...) copied unchanged, and last the manifest, whose presence marks a finished output.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fp4convert.checkpoint.io_errors import writing
from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.source import INDEX_NAME
from fp4convert.checkpoint.staging import write_json_atomic
from fp4convert.plan import ConversionPlan

__all__ = ["finish_output", "output_names"]


def output_names(plan: ConversionPlan) -> list[str]:
    """Every file name a conversion under ``plan`` may write (the shards first)."""
    side = plan.dialect.side_file_names
    return [*plan.by_output_file(), "config.json", INDEX_NAME, *side, *plan.source.other_files, MANIFEST]


def finish_output(staging: Path, plan: ConversionPlan, manifest: dict[str, Any]) -> int:
    """Write everything but the shards into ``staging``; returns the shards' total size in bytes.

    Raises:
        CheckpointError: a file cannot be written (disk full, read-only, no permission).
    """
    source = plan.source
    config = dict(source.config)
    config["quantization_config"] = plan.dialect.quantization_config(plan.contract, plan.items)
    write_json_atomic(staging / "config.json", config)
    weight_map = {name: item.output_file for item in plan.items for name, _, _ in item.outputs}
    files = sorted(set(weight_map.values()))
    total = sum((staging / f).stat().st_size for f in files)
    if files != ["model.safetensors"]:
        write_json_atomic(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    for name, content in plan.dialect.side_files(plan.contract, plan.items).items():
        write_json_atomic(staging / name, content)
    for name in source.other_files:
        target = staging / name
        with writing(target):
            target.unlink(missing_ok=True)  # never copy through a symlink left at this name
            shutil.copy2(source.root / name, target)
    write_json_atomic(staging / MANIFEST, manifest)  # last: its presence marks a finished output
    return total
