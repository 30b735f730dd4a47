"""A folder opened as a decoded source when it stores its tensors quantized or fused (docs/sources.md).

Commands that take a BF16 master (``validate-export --master``) accept an FP8 / MXFP4 release or a
fused-expert save in its place: :func:`decoded_source` opens such a folder through the one
dequantizer, and returns None for anything else (plain HF or Megatron-named safetensors), which the
caller reads as it always did.
"""

from __future__ import annotations

import json
from pathlib import Path

from fp4convert.checkpoint.decode.fused import FUSED_NAME
from fp4convert.checkpoint.decode.read import DecodedSource
from fp4convert.checkpoint.safetensors_io import read_header
from fp4convert.checkpoint.source import open_checkpoint

__all__ = ["decoded_source"]


def decoded_source(path: str | Path) -> DecodedSource | None:
    """``path`` as a :class:`~fp4convert.checkpoint.decode.DecodedSource` if it is an HF checkpoint
    folder with a ``quantization_config`` or fused 3-D experts, else None (headers only are read).

    Raises:
        CheckpointError: the folder declares a source format but is inconsistent.
    """
    root = Path(path)
    config_path = root / "config.json"
    if not root.is_dir() or not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    declared = isinstance(config, dict) and "quantization_config" in config
    fused = not declared and any(
        FUSED_NAME.match(name) for file in sorted(root.glob("*.safetensors")) for name in read_header(file)[0]
    )
    if not (declared or fused):
        return None
    source = open_checkpoint(root)
    return DecodedSource(source) if source.view().decodes else None
