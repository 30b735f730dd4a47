"""Checkpoint files on disk: reading sources, writing outputs atomically.

* :mod:`~fp4convert.checkpoint.safetensors_io`: the one safetensors header reader, positional
  tensor reads, and the streaming writer.
* :mod:`~fp4convert.checkpoint.source`: a source checkpoint opened read-only (untrusted names
  checked), and its inventory from the headers read.
* :mod:`~fp4convert.checkpoint.decode`: source formats (FP8 block-scaled, MXFP4, fused 3-D
  experts): the logical view of a source and the one dequantizer of each format (docs/sources.md);
  :mod:`~fp4convert.checkpoint.decoded` opens a folder through it when it needs one.
* :mod:`~fp4convert.checkpoint.reader`: reading a source's tensors while hashing its files.
* :mod:`~fp4convert.checkpoint.staging`: ``DST.partial/``, the resume journal, atomic publish.
* :mod:`~fp4convert.checkpoint.manifest`: the ``fp4convert.json`` file's name, version, reader.
* :mod:`~fp4convert.checkpoint.hashing`: the sha256 of files and tensors.
"""

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
