"""``dequantize``: an NVFP4 / MXFP8 checkpoint back to a high-precision HF checkpoint.

Reads any of the three dialects (ModelOpt, SGLang MXFP8, compressed-tensors), whether fp4convert
wrote it or not, and the quantized sources (FP8 block-scaled, MXFP4, fused 3-D experts:
:mod:`fp4convert.convert.decoded`), and writes plain BF16 weights that transformers loads on any device (it cannot
load NVFP4 MoE checkpoints on CPU today). The decode is the one engines use:
``W = e2m1 * float(weight_scale) * global_decode`` for NVFP4 (``global_decode`` is ModelOpt's
``weight_scale_2``, or ``1 / weight_global_scale`` for compressed-tensors) and
``W = e4m3 * 2**(e - 127)`` for MXFP8, in float32, cast once. Activation and KV scales are dropped.

When the checkpoint carries fp4convert's manifest it is verified first (structure, no stray file,
every tensor's sha256 as the manifest records it; :func:`fp4convert.verify.verify_checkpoint`), so
a modified or damaged output is refused with the first failure named instead of decoded. On any
failure ``DST.partial/`` is removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp4convert.checkpoint.decode.declared import is_source_release
from fp4convert.checkpoint.io_errors import writing
from fp4convert.checkpoint.manifest import MANIFEST
from fp4convert.checkpoint.safetensors_io import (
    SafetensorsFile,
    StreamingWriter,
    TensorEntry,
    dtype_name,
)
from fp4convert.checkpoint.source import SourceCheckpoint, open_checkpoint, output_shard_names
from fp4convert.checkpoint.staging import discard, prepare_staging, publish
from fp4convert.convert.decoded import DEQUANTIZED_METADATA, finish_high_precision, write_decoded
from fp4convert.dialects import DIALECTS, Dialect, dialect_for_config
from fp4convert.errors import CheckpointError, ConversionError
from fp4convert.formats.codecs import e2m1_decode, e4m3_decode, e8m0_decode, unpack_fp4
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK
from fp4convert.verify.checkpoint import verify_checkpoint

__all__ = ["DequantizeReport", "dequantize_checkpoint"]


@dataclass
class DequantizeReport:
    """What ``dequantize`` wrote: the folder, the modules decoded per format, the tensors copied, and
    for a quantized source the tensors decoded per source format."""

    destination: str
    nvfp4_modules: int
    mxfp8_modules: int
    copied_tensors: int
    source_formats: dict[str, int] = field(default_factory=dict)  # decoded source tensors per format


def _dequant_nvfp4(packed: torch.Tensor, scale: torch.Tensor, decode: torch.Tensor) -> torch.Tensor:
    rows, half = packed.shape
    values = e2m1_decode(unpack_fp4(packed)).reshape(rows, half * 2 // NVFP4_BLOCK, NVFP4_BLOCK)
    factor = e4m3_decode(scale.reshape(-1).view(torch.uint8)).reshape(rows, -1) * decode
    return (values * factor.unsqueeze(-1)).reshape(rows, half * 2)


def _dequant_mxfp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    values = e4m3_decode(data.reshape(-1).view(torch.uint8)).reshape(data.shape)
    return values * e8m0_decode(scale.view(torch.uint8)).repeat_interleave(MXFP8_BLOCK, dim=-1)[:, : data.shape[1]]


# One output tensor: (name, safetensors dtype, shape, how): how is None (copy as is) or the
# (format, module) whose weight is decoded.
_Output = tuple[str, str, tuple[int, ...], "tuple[str, str] | None"]


def _shard_outputs(
    entries: Mapping[str, TensorEntry], dialect: Dialect, all_names: set[str], dtype: torch.dtype
) -> list[_Output]:
    """What one dequantized shard holds: each module's weight, decoded, and every other tensor."""
    outputs: list[_Output] = []
    consumed = {
        dialect.suffixes[fmt][role]
        for fmt in dialect.formats
        for role in ("scale", "global")
        if role in dialect.suffixes[fmt]
    }
    for name, entry in entries.items():
        module, _, leaf = name.rpartition(".")
        nvfp4 = "nvfp4" in dialect.formats and name == dialect.output_name(module, "nvfp4", "data")
        if nvfp4 and dialect.output_name(module, "nvfp4", "global") in all_names:
            shape = (entry.shape[0], entry.shape[1] * 2)
            outputs.append((f"{module}.weight", dtype_name(dtype), shape, ("nvfp4", module)))
        elif (
            "mxfp8" in dialect.formats
            and name == dialect.output_name(module, "mxfp8", "data")
            and entry.dtype == dialect.output_dtypes["mxfp8"]["data"]
            and dialect.output_name(module, "mxfp8", "scale") in all_names
        ):
            outputs.append((f"{module}.weight", dtype_name(dtype), entry.shape, ("mxfp8", module)))
        elif leaf not in consumed and leaf not in dialect.activation_scale_names:
            outputs.append((name, entry.dtype, entry.shape, None))
        # else: a scale consumed with its module, or an activation / KV scale (dropped)
    return outputs


def _decode(
    dialect: Dialect, how: tuple[str, str], read: Callable[[str], torch.Tensor], dtype: torch.dtype
) -> torch.Tensor:
    fmt, module = how

    def tensor(role: str) -> torch.Tensor:
        return read(f"{module}.{dialect.suffixes[fmt][role]}")

    if fmt == "nvfp4":
        w = _dequant_nvfp4(tensor("data"), tensor("scale"), dialect.decode_scale(tensor("global")))
    else:
        w = _dequant_mxfp8(tensor("data"), tensor("scale"))
    return w.to(dtype)


def _check_manifest(ckpt: SourceCheckpoint, source: str | Path) -> None:
    """An fp4convert output is verified (structure, files, every tensor's sha256) before decoding."""
    if not (ckpt.root / MANIFEST).is_file():
        return  # another tool's checkpoint: nothing recorded to check it against
    report = verify_checkpoint(ckpt.root)
    if not report.ok:
        raise CheckpointError(
            f"{source} does not match its {MANIFEST}: {report.summary()}",
            hint=f"the checkpoint was modified or damaged: `fp4convert verify {source}` lists every failure; "
            "convert it again",
            failures=[c.__dict__ for c in report.failures],
        )


def dequantize_checkpoint(
    source: str | Path, destination: str | Path, *, dtype: torch.dtype = torch.bfloat16, overwrite: bool = False
) -> DequantizeReport:
    """Write a high-precision copy of a quantized checkpoint (see the module docstring).

    Raises:
        CheckpointError: the source has no quantization_config of a known dialect, a module
            lacks one of its scale tensors, a checkpoint with a manifest does not verify against
            it, or a file cannot be written (disk full, read-only).
        ConversionError: nothing to dequantize, or the destination exists (without ``overwrite``),
            overlaps the source or is locked by another run.
    """
    ckpt = open_checkpoint(source)
    # a compressed-tensors FP8 release is a source format, not one of fp4convert's output dialects
    dialect = None if is_source_release(ckpt.config) else dialect_for_config(ckpt.config)
    if dialect is None and ckpt.view().decodes:  # an FP8 / MXFP4 / fused-expert source (docs/sources.md)
        formats, copied = write_decoded(ckpt, Path(destination), dtype=dtype, overwrite=overwrite)
        return DequantizeReport(str(destination), 0, 0, copied, formats)
    if dialect is None:
        quantization = ckpt.config.get("quantization_config")
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise CheckpointError(
            f"{source}: config.json has no quantization_config of a known dialect (quant_method={method!r})",
            hint=f"expected one of {', '.join(d.quant_method for d in DIALECTS.values())}; "
            "a BF16 checkpoint needs no dequantization",
        )
    _check_manifest(ckpt, source)
    all_names = set(ckpt.tensor_file)
    plans = {shard: _shard_outputs(e, dialect, all_names, dtype) for shard, e in ckpt.shards.items()}
    kinds = [out[3][0] for outputs in plans.values() for out in outputs if out[3] is not None]
    if not kinds:
        raise ConversionError(f"{source}: no quantized module was found", hint="nothing to dequantize")
    destination = Path(destination)
    staging = prepare_staging(Path(source), destination, overwrite=overwrite, resumable=False)
    files = {name: SafetensorsFile(ckpt.root / name) for name in ckpt.shards}

    def read(tensor: str) -> torch.Tensor:
        if tensor not in ckpt.tensor_file:
            raise CheckpointError(
                f"{source}: tensor {tensor!r} is missing", hint="the checkpoint is incomplete", tensor=tensor
            )
        return files[ckpt.tensor_file[tensor]].read(tensor)

    weight_map: dict[str, str] = {}
    # One output shard per source shard, in source order, under generated names (never the source's).
    out_names = dict(zip(plans, output_shard_names(len(plans)), strict=True))
    try:
        for shard, outputs in plans.items():
            tmp = staging / (out_names[shard] + ".tmp")
            writer = StreamingWriter(tmp, [(n, d, s) for n, d, s, _ in outputs], metadata=DEQUANTIZED_METADATA)
            for name, _, _, how in outputs:
                writer.write(name, read(name) if how is None else _decode(dialect, how, read, dtype))
                weight_map[name] = out_names[shard]
            writer.close()
            with writing(staging / out_names[shard]):
                tmp.rename(staging / out_names[shard])
        finish_high_precision(ckpt, staging, dtype, list(out_names.values()), weight_map)
        publish(staging, destination)
    except BaseException:
        discard(staging)
        raise
    finally:
        for f in files.values():
            f.close()
    copied = sum(out[3] is None for outputs in plans.values() for out in outputs)
    return DequantizeReport(str(destination), kinds.count("nvfp4"), kinds.count("mxfp8"), copied)
