"""Read the tensor names, shapes and dtypes of a safetensors checkpoint from its headers only.

``safe_open`` memory-maps the file and ``get_slice`` reads the header entry; no tensor data is read
and nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from fp4convert.errors import CheckpointError

__all__ = ["TensorHeader", "read_checkpoint_headers"]

#: safetensors dtype codes -> torch dtype names.
SAFETENSORS_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}

TensorHeader = tuple[tuple[int, ...], str]


def _shard_files(directory: Path) -> list[Path]:
    # Names from an index are untrusted: plain shard names only, files inside the checkpoint.
    from fp4convert.checkpoint.source import INDEX_NAME, checked_file, read_weight_map

    index = directory / INDEX_NAME
    if index.exists():
        names = list(dict.fromkeys(read_weight_map(index).values()))
    else:
        names = sorted(p.name for p in directory.glob("*.safetensors"))
    if not names:
        raise CheckpointError(
            f"no *.safetensors files in {directory}",
            hint="pass a Hugging Face checkpoint directory (model.safetensors or an index plus shards)",
            file=str(directory),
        )
    return [checked_file(directory, name) for name in names]


def read_checkpoint_headers(directory: str | Path) -> dict[str, TensorHeader]:
    """Every tensor of a checkpoint directory as ``name -> (shape, torch dtype name)``, shard by shard.

    Args:
        directory: holds ``model.safetensors``, or ``model.safetensors.index.json`` and its shards.

    Returns:
        Names in shard order, then in each shard's header order.

    Raises:
        CheckpointError: a file is missing, a name appears twice, or a dtype is unknown.

    Example:
        >>> read_checkpoint_headers("ckpt")["model.norm.weight"]  # doctest: +SKIP
        ((4096,), 'bfloat16')
    """
    directory = Path(directory)
    headers: dict[str, TensorHeader] = {}
    for path in _shard_files(directory):
        if not path.exists():
            raise CheckpointError(f"shard {path} listed in the index is missing", file=str(path))
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                if name in headers:
                    raise CheckpointError(f"tensor `{name}` appears in more than one shard", file=str(path))
                header = handle.get_slice(name)
                code = header.get_dtype()
                if code not in SAFETENSORS_DTYPES:
                    raise CheckpointError(f"tensor `{name}` has unknown dtype {code}", file=str(path))
                headers[name] = (tuple(header.get_shape()), SAFETENSORS_DTYPES[code])
    return headers
