"""Checkpoint files: streaming safetensors I/O and read-only source checkpoints."""

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, read_header
from fp4convert.checkpoint.source import SourceCheckpoint, open_checkpoint

__all__ = ["SafetensorsFile", "SourceCheckpoint", "StreamingWriter", "open_checkpoint", "read_header"]
