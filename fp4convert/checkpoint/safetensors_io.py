"""Streaming safetensors I/O with bounded memory: header parsing, positional reads, and a writer
that lays out the header first and then takes tensors one at a time.

Why not ``safetensors.safe_open``: it memory-maps the file, and every page a conversion touches
then counts in the process's resident set until the file is closed, so peak RSS grows with the
shard size. Reading each tensor with one positional read into a fresh buffer keeps RSS to the
tensors in flight. The file format is the documented one (8-byte little-endian header length,
JSON header, 8-byte aligned, then the raw little-endian data); nothing here unpickles anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from fp4convert.errors import CheckpointError

__all__ = [
    "DTYPES",
    "SafetensorsFile",
    "StreamingWriter",
    "TensorEntry",
    "dtype_name",
    "read_header",
    "tensor_nbytes",
]

#: safetensors dtype string -> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 2**20  # the format's own limit


def dtype_name(dtype: torch.dtype) -> str:
    """torch dtype -> safetensors dtype string (``torch.bfloat16`` -> ``"BF16"``)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise CheckpointError(f"dtype {dtype} has no safetensors name", hint="cast it first") from None


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    n = DTYPES[dtype].itemsize
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: name, dtype string, shape and absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: str | Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Parse a safetensors header: ``({name: TensorEntry}, metadata)``, in data-offset order.

    Raises:
        CheckpointError: the file is not safetensors, is truncated, or its offsets are inconsistent.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file", file=str(path))
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: header length {header_len} exceeds the file size {size}",
                    hint="the file is truncated or not safetensors",
                    file=str(path),
                )
            header = json.loads(f.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors header ({exc})", file=str(path)) from exc
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + header_len
    entries = []
    for name, info in header.items():
        if info.get("dtype") not in DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}",
                hint=f"supported: {', '.join(DTYPES)}",
                file=str(path),
                tensor=name,
            )
        begin, end = info["data_offsets"]
        entry = TensorEntry(name, info["dtype"], tuple(info["shape"]), base + begin, base + end)
        if entry.nbytes != tensor_nbytes(entry.dtype, entry.shape) or entry.end > size:
            raise CheckpointError(
                f"{path}: tensor {name!r} byte range {begin}..{end} does not fit its dtype/shape or the file",
                hint="the file is truncated or corrupt; re-download it",
                file=str(path),
                tensor=name,
            )
        entries.append(entry)
    entries.sort(key=lambda e: e.start)
    return {e.name: e for e in entries}, dict(metadata)


class SafetensorsFile:
    """A safetensors file opened read-only for positional reads of single tensors."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries, self.metadata = read_header(self.path)
        self._fd = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_bytes(self, name: str) -> torch.Tensor:
        """The raw bytes of tensor ``name`` as a uint8 tensor (one positional read, no mmap)."""
        entry = self.entries[name]
        buf = torch.empty(entry.nbytes, dtype=torch.uint8)
        view = memoryview(buf.numpy())  # type: ignore[arg-type]  # numpy arrays are buffers
        done = 0
        while done < entry.nbytes:
            n = os.preadv(self._fd, [view[done:]], entry.start + done)
            if n <= 0:
                raise CheckpointError(f"{self.path}: unexpected end of file reading {name!r}", tensor=name)
            done += n
        return buf

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` with its dtype and shape."""
        entry = self.entries[name]
        return self.read_bytes(name).view(DTYPES[entry.dtype]).reshape(entry.shape)


class StreamingWriter:
    """Write a safetensors file whose tensor names, dtypes and shapes are known up front.

    The header is written first; tensors are then written one at a time, in the declared order,
    each hashed (sha256) on the way. The file is written under ``path`` as given (callers write
    to a temporary name and rename once :meth:`close` succeeded).

    Example:
        >>> w = StreamingWriter(path, [("a", "F32", (2,))])  # doctest: +SKIP
        >>> w.write("a", torch.ones(2)); w.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path,
        layout: Iterable[tuple[str, str, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self._order: list[str] = []
        self._expected: dict[str, tuple[str, tuple[int, ...]]] = {}
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = metadata
        offset = 0
        for name, dtype, shape in layout:
            if name in self._expected:
                raise CheckpointError(f"tensor {name!r} declared twice for {self.path}", tensor=name)
            nbytes = tensor_nbytes(dtype, shape)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._order.append(name)
            self._expected[name] = (dtype, tuple(shape))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
        self.sha256: dict[str, str] = {}
        self.nbytes = 8 + len(raw) + offset
        # A fresh file, never through a symlink left at this name (it could point into the source).
        self.path.unlink(missing_ok=True)
        self._file: BinaryIO = self.path.open("xb")
        self._file.write(struct.pack("<Q", len(raw)) + raw)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write the next tensor; it must be the next declared name, with its dtype and shape."""
        if self._next >= len(self._order) or self._order[self._next] != name:
            expected = self._order[self._next] if self._next < len(self._order) else "nothing"
            raise CheckpointError(f"{self.path}: wrote {name!r} but the layout expects {expected!r}", tensor=name)
        dtype, shape = self._expected[name]
        if dtype_name(tensor.dtype) != dtype or tuple(tensor.shape) != shape:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} is {dtype_name(tensor.dtype)} {tuple(tensor.shape)}, "
                f"declared {dtype} {shape}",
                tensor=name,
            )
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        self.sha256[name] = hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]  # a buffer
        self._file.write(memoryview(data))  # type: ignore[arg-type]
        self._next += 1

    def close(self, *, sync: bool = True) -> None:
        """Flush and close; raises if a declared tensor was never written.

        Args:
            sync: fsync before returning. A caller that syncs later (off its critical path)
                passes False.
        """
        if self._next != len(self._order):
            self._file.close()
            raise CheckpointError(
                f"{self.path}: {len(self._order) - self._next} declared tensors were not written "
                f"(next: {self._order[self._next]!r})"
            )
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        """Close without checks and delete the partial file."""
        self._file.close()
        self.path.unlink(missing_ok=True)
