"""``dequantize`` of a quantized or fused *source*: an FP8 / MXFP4 release or a fused-expert save to
a plain per-tensor checkpoint, through the one dequantizer every other command uses (docs/sources.md).

Each source shard becomes one output shard (under generated names), holding its logical tensors in
read order: dense tensors byte for byte, FP8 block-scaled and MXFP4 weights as their dequantized
BF16, fused 3-D experts split per expert. Scales are checked before anything is written; output is
staged in ``DST.partial/`` and renamed when complete; the source is only read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from fp4convert.checkpoint.decode import DecodedSource
from fp4convert.checkpoint.safetensors_io import StreamingWriter, dtype_name
from fp4convert.checkpoint.source import INDEX_NAME, SourceCheckpoint, output_shard_names
from fp4convert.checkpoint.staging import prepare_staging, publish, write_json_atomic
from fp4convert.version import __version__

__all__ = ["write_decoded"]


def write_decoded(
    source: SourceCheckpoint, destination: Path, *, dtype: torch.dtype, overwrite: bool
) -> tuple[dict[str, int], int]:
    """Write ``source``'s logical tensors to ``destination`` (see the module docstring).

    Args:
        source: the opened source (its view decodes something).
        destination: the output folder.
        dtype: the dtype dequantized tensors are written in (BF16 is the definition; float32
            widens it exactly).
        overwrite: replace an existing destination.

    Returns:
        (decoded tensors per source format, tensors copied as stored).

    Raises:
        CheckpointError: a bad scale (before anything is written), unreadable files.
        ConversionError: the destination exists (without ``overwrite``) or overlaps the source.
    """
    view = source.view()
    by_file: dict[str, list[str]] = {}
    for t in view:
        by_file.setdefault(view.file_of(t.name), []).append(t.name)
    names = dict(zip(by_file, output_shard_names(len(by_file)), strict=True))

    def out_dtype(name: str) -> str:
        t = view.tensors[name]
        return t.dtype if t.source_format == "dense" else str(dtype).removeprefix("torch.")

    with DecodedSource(source) as decoded:
        decoded.check_scales()
        staging = prepare_staging(source.root, destination, overwrite=overwrite, resumable=False)
        weight_map: dict[str, str] = {}
        try:
            for shard, tensors in by_file.items():
                tmp = staging / (names[shard] + ".tmp")
                layout = []
                for name in tensors:
                    meta_dtype = getattr(torch, out_dtype(name))
                    layout.append((name, dtype_name(meta_dtype), view.tensors[name].shape))
                metadata = {"format": "pt", "producer": f"fp4convert {__version__} dequantize"}
                writer = StreamingWriter(tmp, layout, metadata=metadata)
                for name in tensors:
                    tensor = decoded[name]
                    writer.write(name, tensor if view.tensors[name].source_format == "dense" else tensor.to(dtype))
                    weight_map[name] = names[shard]
                writer.close()
                tmp.rename(staging / names[shard])
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    config = {k: v for k, v in source.config.items() if k != "quantization_config"}
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_json_atomic(staging / "config.json", config)
    if len(names) > 1:
        total = sum((staging / s).stat().st_size for s in names.values())
        write_json_atomic(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    for name in source.other_files:
        shutil.copy2(source.root / name, staging / name)
    publish(staging, destination)
    formats = {f: n for f, n in view.formats().items() if f != "dense"}
    return formats, view.formats().get("dense", 0)
