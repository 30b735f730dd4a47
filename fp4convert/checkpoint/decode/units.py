"""What a source's logical view is made of: stored byte ranges, read units, logical tensors, the view.

:class:`SourceView` is built by :func:`fp4convert.checkpoint.decode.view.source_view` from a
checkpoint's headers; its readers are :mod:`fp4convert.checkpoint.decode.read`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from fp4convert.checkpoint.decode.declared import SourceQuantization
from fp4convert.checkpoint.decode.dequant import DEQUANTIZERS
from fp4convert.checkpoint.decode.fused import FusedLayout
from fp4convert.families import inventory_from_tensors
from fp4convert.inventory import ModelInventory

__all__ = ["Encoding", "LogicalTensor", "RawPart", "ReadUnit", "SourceView", "Split"]

Encoding = Literal["dense", "fp8-block", "fp8-channel", "mxfp4"]
Split = Literal["none", "gate_up", "down", "bias_gate_up", "bias_down"]


@dataclass(frozen=True)
class RawPart:
    """A byte range of one stored tensor: all of it, or one expert's slice of a fused tensor."""

    file: str
    tensor: str
    dtype: str  # safetensors code
    shape: tuple[int, ...]  # shape of the range
    start: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ReadUnit:
    """What is read and decoded together: its parts (the data, then its scales) and the logical
    tensors it yields, in order."""

    key: str
    encoding: Encoding
    parts: tuple[RawPart, ...]
    outputs: tuple[str, ...]
    split: Split = "none"
    layout: FusedLayout | None = None


@dataclass(frozen=True)
class LogicalTensor:
    """One tensor of the model as the source provides it.

    Attributes:
        name: the per-tensor HF name.
        shape: the decoded shape.
        dtype: the decoded torch dtype name (``bfloat16`` for FP8 and MXFP4 sources).
        source_format: :attr:`fp4convert.inventory.TensorInfo.source_format`.
        unit: the key of its :class:`ReadUnit`.
        nbytes: source bytes read for it (its share of its unit's).
        position: ``(file index, byte offset, index in its unit)``: the order reads follow.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    source_format: str
    unit: str
    nbytes: int
    position: tuple[int, int, int]


class SourceView:
    """A source checkpoint's logical tensors (see the module docstring); built by :func:`source_view`.

    Attributes:
        config: the parsed config.json.
        quantization: what it declares (:func:`~fp4convert.checkpoint.decode.declared.source_quantization`).
        units: read unit key -> unit.
        tensors: logical name -> tensor, in read order.
        files: the shard files, in order.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        quantization: SourceQuantization,
        units: dict[str, ReadUnit],
        tensors: dict[str, LogicalTensor],
        files: list[str],
    ) -> None:
        self.config = config
        self.quantization = quantization
        self.units = units
        self.tensors = tensors
        self.files = files

    def __iter__(self) -> Iterator[LogicalTensor]:
        return iter(self.tensors.values())

    def file_of(self, name: str) -> str:
        """The shard holding (the data of) logical tensor ``name``."""
        return self.files[self.tensors[name].position[0]]

    def unit_of(self, name: str) -> ReadUnit:
        return self.units[self.tensors[name].unit]

    @property
    def decodes(self) -> bool:
        """Whether any tensor is not simply a stored tensor read as is."""
        return any(t.source_format != "dense" for t in self)

    def formats(self) -> dict[str, int]:
        """Source format -> number of logical tensors."""
        counts: dict[str, int] = {}
        for t in self:
            counts[t.source_format] = counts.get(t.source_format, 0) + 1
        return dict(sorted(counts.items()))

    def dequantizers(self) -> dict[str, str]:
        """The dequantizer of each quantized encoding this source uses (docs/sources.md)."""
        used = {u.encoding for u in self.units.values()} - {"dense"}
        return {encoding: DEQUANTIZERS[encoding] for encoding in sorted(used)}

    def inventory(self) -> ModelInventory:
        """The model's tensors, classified by its family, in read order, with source formats and bytes.

        Raises:
            MappingError: a tensor is not part of the config's family, or is ambiguous.
        """
        tensors = list(self)
        inventory = inventory_from_tensors(self.config, [(t.name, t.shape, t.dtype) for t in tensors])
        described = tuple(
            replace(info, source_format=t.source_format, source_nbytes=t.nbytes)
            for info, t in zip(inventory.tensors, tensors, strict=True)
        )
        return replace(inventory, tensors=described)
