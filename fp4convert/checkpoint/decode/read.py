"""Reading a source's logical tensors: raw byte ranges in, decoded tensors out.

:class:`SourceDecoder` serves the logical tensors of a :class:`~fp4convert.checkpoint.decode.view.SourceView`
by name through any byte-range reader (the converter's hashing
:class:`~fp4convert.checkpoint.reader.SourceReader`, or plain positional reads): it reads a unit's
parts (one positional read each: a fused expert tensor is read one expert's slice at a time),
checks its scales, dequantizes (:mod:`~fp4convert.checkpoint.decode.dequant`) and splits it, and
keeps a unit's other outputs (an expert's up projection after its gate) until they are asked for,
so nothing is read twice and memory stays at the units in flight.

:class:`DecodedSource` is the same as a read-only mapping over a source checkpoint (masters for
``validate-export``, ``dequantize``); :func:`check_scales` reads every scale of a source before
anything is written, so a corrupt scale is refused up front.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from fp4convert.checkpoint.decode.declared import SourceQuantization
from fp4convert.checkpoint.decode.dequant import (
    check_fp8_scales,
    check_mxfp4_scales,
    dequantize_fp8_block,
    dequantize_fp8_channel,
    dequantize_mxfp4,
)
from fp4convert.checkpoint.decode.fused import split_bias, split_down, split_gate_up
from fp4convert.checkpoint.decode.units import RawPart, ReadUnit, SourceView
from fp4convert.checkpoint.safetensors_io import DTYPES, SafetensorsFile
from fp4convert.inventory.dtypes import safetensors_code, torch_dtype

if TYPE_CHECKING:
    from fp4convert.checkpoint.source import SourceCheckpoint

__all__ = ["DecodedSource", "RangeReader", "SourceDecoder", "check_scales", "decode_unit"]

#: reads bytes ``[start, end)`` of a shard file as a uint8 tensor
RangeReader = Callable[[str, int, int], torch.Tensor]


def _typed(part: RawPart, data: torch.Tensor) -> torch.Tensor:
    return data.view(DTYPES[part.dtype]).reshape(part.shape)


def _check(unit: ReadUnit, quantization: SourceQuantization, scale: torch.Tensor) -> None:
    name = unit.parts[1].tensor
    if unit.encoding in ("fp8-block", "fp8-channel"):
        check_fp8_scales(name, scale, ue8m0=quantization.ue8m0)
    else:
        check_mxfp4_scales(name, scale)


def decode_unit(
    unit: ReadUnit, raw: Sequence[torch.Tensor], quantization: SourceQuantization
) -> dict[str, torch.Tensor]:
    """Decode one read unit from its parts' bytes (uint8, in ``unit.parts`` order).

    Returns:
        Logical name -> tensor, in ``unit.outputs`` order.

    Raises:
        CheckpointError: a scale is NaN, infinite, zero, negative, or not a power of two where
            ``scale_fmt: ue8m0`` says it is (naming the scale tensor).
    """
    parts = [_typed(p, r) for p, r in zip(unit.parts, raw, strict=True)]
    if unit.encoding == "dense":
        matrix = parts[0]
    else:
        _check(unit, quantization, parts[1])
        if unit.encoding == "fp8-block":
            assert quantization.block is not None
            matrix = dequantize_fp8_block(parts[0], parts[1], quantization.block)
        elif unit.encoding == "fp8-channel":
            matrix = dequantize_fp8_channel(parts[0], parts[1])
        else:
            matrix = dequantize_mxfp4(parts[0], parts[1])
    if unit.split == "none":
        pieces: tuple[torch.Tensor, ...] = (matrix,)
    else:
        assert unit.layout is not None
        if unit.split == "gate_up":
            pieces = split_gate_up(matrix, unit.layout)
        elif unit.split == "down":
            pieces = (split_down(matrix, unit.layout),)
        elif unit.split == "bias_gate_up":
            pieces = split_bias(matrix, unit.layout)
        else:
            pieces = (matrix,)
    return dict(zip(unit.outputs, pieces, strict=True))


class SourceDecoder:
    """Logical tensors of ``view`` by name, read through ``read_range`` (see the module docstring).

    Safe to call :meth:`read` from several threads (reads of one unit are serialized, so a unit
    is read once).

    Args:
        view: the source's logical view.
        read_range: reads ``(file, start, end)`` as uint8 bytes.
    """

    def __init__(self, view: SourceView, read_range: RangeReader) -> None:
        self.view = view
        self._read_range = read_range
        self._lock = threading.Lock()
        self._waiting: dict[str, torch.Tensor] = {}

    def read(self, name: str) -> torch.Tensor:
        """Logical tensor ``name``, decoded (a fresh CPU tensor)."""
        with self._lock:
            early = self._waiting.pop(name, None)
            if early is not None:
                return early
            unit = self.view.unit_of(name)
            raw = [self._read_range(p.file, p.start, p.end) for p in unit.parts]
            decoded = decode_unit(unit, raw, self.view.quantization)
            for other, tensor in decoded.items():
                if other != name:
                    self._waiting[other] = tensor
            return decoded[name]


def check_scales(view: SourceView, read_range: RangeReader) -> None:
    """Read and check every scale tensor of ``view`` once, whole (see the module docstring).

    Raises:
        CheckpointError: the first bad scale, naming its tensor and block.
    """
    stored: dict[str, tuple[ReadUnit, list[RawPart]]] = {}
    for unit in view.units.values():
        if unit.encoding != "dense":
            stored.setdefault(unit.parts[1].tensor, (unit, []))[1].append(unit.parts[1])
    for unit, slices in stored.values():
        first = slices[0]
        start, end = min(p.start for p in slices), max(p.end for p in slices)
        shape = first.shape if len(slices) == 1 else (len(slices), *first.shape)
        whole = RawPart(first.file, first.tensor, first.dtype, shape, start, end)
        _check(unit, view.quantization, _typed(whole, read_range(whole.file, start, end)))


class DecodedSource(Mapping[str, torch.Tensor]):
    """A source checkpoint's logical tensors as a read-only mapping, read on access (no mmap).

    Args:
        source: the opened source checkpoint.

    Example (not run: it needs an FP8 checkpoint folder):
        >>> master = DecodedSource(open_checkpoint("DeepSeek-V3"))  # doctest: +SKIP
        >>> master["model.layers.0.self_attn.q_a_proj.weight"].dtype  # doctest: +SKIP
        torch.bfloat16
    """

    def __init__(self, source: SourceCheckpoint) -> None:
        self.source = source
        self.view = source.view()
        self.duplicates: dict[str, list[str]] = {}
        self._files: dict[str, SafetensorsFile] = {}
        self._decoder = SourceDecoder(self.view, self._read_range)

    def _read_range(self, file: str, start: int, end: int) -> torch.Tensor:
        if file not in self._files:
            self._files[file] = self.source.open(file)
        return self._files[file].read_range(start, end)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.view.tensors:
            raise KeyError(name)
        return self._decoder.read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.view.tensors)

    def __len__(self) -> int:
        return len(self.view.tensors)

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype, shape) of a logical tensor, from the headers alone."""
        t = self.view.tensors[name]
        dtype = torch_dtype(t.dtype)
        assert dtype is not None
        return safetensors_code(dtype) or t.dtype, t.shape

    def check_scales(self) -> None:
        """:func:`check_scales` over this source."""
        check_scales(self.view, self._read_range)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> DecodedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
