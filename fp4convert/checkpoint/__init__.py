"""Checkpoint files: streaming safetensors I/O and read-only source checkpoints."""

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, read_header
from fp4convert.checkpoint.source import SourceCheckpoint, inventory_from_checkpoint, open_checkpoint

__all__ = [
    "SafetensorsFile",
    "SourceCheckpoint",
    "StreamingWriter",
    "inventory_from_checkpoint",
    "open_checkpoint",
    "read_header",
]
