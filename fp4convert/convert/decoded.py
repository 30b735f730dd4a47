"""``dequantize`` of a quantized or fused *source*: an FP8 / MXFP4 release or a fused-expert save to
a plain per-tensor checkpoint, through the one dequantizer every other command uses (docs/sources.md).

Each source shard becomes one output shard (under generated names), holding its logical tensors in
read order: dense tensors byte for byte, FP8 block-scaled and MXFP4 weights as their dequantized
BF16, fused 3-D experts split per expert. Scales, and for a model of a known family the tensors
against config.json, are checked before anything is written; output is
staged in ``DST.partial/`` (locked) and renamed when complete, removed on any failure (a full disk
or a read-only folder is one named error); the source is only read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from fp4convert.checkpoint.decode import DecodedSource
from fp4convert.checkpoint.io_errors import writing
from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.safetensors_io import StreamingWriter, dtype_name, shard_metadata
from fp4convert.checkpoint.source import INDEX_NAME, SourceCheckpoint, output_shard_names
from fp4convert.checkpoint.staging import discard, prepare_staging, publish, write_json_atomic
from fp4convert.errors import MappingError
from fp4convert.families import family_for_config
from fp4convert.version import __version__

__all__ = ["DEQUANTIZED_METADATA", "finish_high_precision", "write_decoded"]

#: the ``__metadata__`` of every shard a dequantization writes
DEQUANTIZED_METADATA = shard_metadata(f"fp4convert {__version__} dequantize")


def _known_family(source: SourceCheckpoint) -> bool:
    try:
        family_for_config(source.config)
    except MappingError:
        return False  # an FP8 release of a model fp4convert has no family for is still decoded as stored
    return True


def finish_high_precision(
    source: SourceCheckpoint, staging: Path, dtype: torch.dtype, shards: list[str], weight_map: dict[str, str]
) -> None:
    """The files around the written shards of a high-precision copy: config.json without its
    ``quantization_config`` (``torch_dtype`` set), the index when there are several shards, and the
    source's other files (its manifest left out: it describes the quantized files, not these)."""
    config = {k: v for k, v in source.config.items() if k != "quantization_config"}
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_json_atomic(staging / "config.json", config)
    if len(shards) > 1:
        total = sum((staging / s).stat().st_size for s in shards)
        write_json_atomic(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    for name in source.other_files:
        if name != MANIFEST:
            with writing(staging / name):
                shutil.copy2(source.root / name, staging / name)


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
        CheckpointError: a bad scale, tensors that disagree with config.json (a model of a known
            family; both before anything is written), unreadable files, a file that
            cannot be written (disk full, read-only).
        ConversionError: the destination exists (without ``overwrite``), overlaps the source or is
            locked by another run.
    """
    view = source.view()
    if _known_family(source):  # the tensors must be the model config.json describes (as for convert)
        source.inventory()
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
                writer = StreamingWriter(tmp, layout, metadata=DEQUANTIZED_METADATA)
                for name in tensors:
                    tensor = decoded[name]
                    writer.write(name, tensor if view.tensors[name].source_format == "dense" else tensor.to(dtype))
                    weight_map[name] = names[shard]
                writer.close()
                with writing(staging / names[shard]):
                    tmp.rename(staging / names[shard])
            finish_high_precision(source, staging, dtype, list(names.values()), weight_map)
            publish(staging, destination)
        except BaseException:
            discard(staging)
            raise
    formats = {f: n for f, n in view.formats().items() if f != "dense"}
    return formats, view.formats().get("dense", 0)
