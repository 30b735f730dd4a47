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
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from fp4convert.checkpoint.io_errors import writing
from fp4convert.errors import CheckpointError
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES, safetensors_code

__all__ = [
    "DTYPES",
    "TORCH_FORMAT",
    "SafetensorsFile",
    "StreamingWriter",
    "TensorEntry",
    "check_declared",
    "dtype_name",
    "header_bytes",
    "read_header",
    "shard_metadata",
    "tensor_nbytes",
]

#: safetensors dtype code -> torch dtype (the one table: :mod:`fp4convert.inventory.dtypes`)
DTYPES = SAFETENSORS_DTYPES
_MAX_HEADER = 100 * 2**20  # the format's own limit
#: ``format`` in the header metadata of every safetensors file written here (and checked by
#: ``verify``): transformers 4.x refuses a shard whose metadata names no format it knows ("does not
#: contain the valid metadata"), and "pt" is PyTorch's
TORCH_FORMAT = "pt"


def shard_metadata(producer: str | None = None) -> dict[str, str]:
    """Header metadata for a file fp4convert writes: the PyTorch format, and who wrote it.

    Example:
        >>> shard_metadata("fp4convert 1.0")
        {'format': 'pt', 'producer': 'fp4convert 1.0'}
    """
    return {"format": TORCH_FORMAT} if producer is None else {"format": TORCH_FORMAT, "producer": producer}


def dtype_name(dtype: torch.dtype) -> str:
    """torch dtype -> safetensors dtype code (``torch.bfloat16`` -> ``"BF16"``).

    Raises:
        CheckpointError: the dtype has no safetensors code.
    """
    code = safetensors_code(dtype)
    if code is None:
        raise CheckpointError(f"dtype {dtype} has no safetensors name", hint="cast it first")
    return code


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes of a tensor of safetensors ``dtype`` and ``shape``."""
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


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, so duplicate keys are seen rather than overwritten."""


def _as_dict(pairs: Any, where: str) -> Any:
    """Nested JSON with objects as dicts; a key given twice is an error naming ``where``."""
    if not isinstance(pairs, _Pairs):
        return [_as_dict(v, where) for v in pairs] if isinstance(pairs, list) else pairs
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Malformed(f"{where} gives {key!r} twice")
        out[key] = _as_dict(value, where)
    return out


class _Malformed(Exception):
    """A header that parses as JSON but breaks the format (message, tensor name or None)."""

    def __init__(self, message: str, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, info: Any, base: int) -> TensorEntry:
    """One header entry, checked field by field."""
    if not isinstance(info, dict):
        raise _Malformed(f"the header entry of tensor {name!r} is not an object", name)
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in info]
    if missing:
        raise _Malformed(f"the header entry of tensor {name!r} has no {', '.join(missing)}", name)
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _Malformed(f"tensor {name!r} has unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})", name)
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _Malformed(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers", name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise _Malformed(f"tensor {name!r} has data_offsets {offsets!r}, not two non-negative integers", name)
    begin, end = offsets
    if end < begin or end - begin != tensor_nbytes(dtype, shape):
        raise _Malformed(
            f"tensor {name!r} byte range {begin}..{end} does not fit its dtype {dtype} and shape {shape}", name
        )
    return TensorEntry(name, dtype, tuple(shape), base + begin, base + end)


def _parse_header(raw: bytes, base: int, data_size: int) -> tuple[list[TensorEntry], dict[str, str]]:
    """Entries in data order and the metadata, or :class:`_Malformed`. The data section must be
    covered exactly: entries back to back from offset 0 to its end (no overlap, hole or trailing
    bytes), as the safetensors library itself requires."""
    try:
        parsed = json.loads(raw.decode("utf-8"), object_pairs_hook=_Pairs)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _Malformed(f"the header is not JSON ({exc})") from exc
    if not isinstance(parsed, _Pairs):
        raise _Malformed(f"the header is a JSON {type(parsed).__name__}, not an object")
    header: dict[str, Any] = {}
    for name, info in parsed:
        if name in header:
            raise _Malformed(f"tensor {name!r} is listed twice in the header", name)
        header[name] = _as_dict(info, f"the header entry of {name!r}")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _Malformed("__metadata__ is not an object of strings")
    entries = sorted((_entry(name, info, base) for name, info in header.items()), key=lambda e: (e.start, e.end))
    position = base
    for entry in entries:
        if entry.start != position:
            what = "overlaps the previous tensor" if entry.start < position else "leaves a hole before it"
            raise _Malformed(f"tensor {entry.name!r} at data offset {entry.start - base} {what}", entry.name)
        position = entry.end
    if position != base + data_size:
        raise _Malformed(f"the tensors cover {position - base} bytes of a {data_size}-byte data section")
    return entries, metadata


def read_header(path: str | Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Parse a safetensors header: ``({name: TensorEntry}, metadata)``, in data-offset order.

    Every malformation is a :class:`CheckpointError` naming the file (and the tensor where there is
    one): a length prefix past the file, a header that is not a JSON object, a tensor listed twice,
    an entry without dtype / shape / data_offsets or with ill-typed ones, a byte range that does not
    fit the dtype and shape, overlapping tensors, holes, trailing bytes, non-string metadata.

    Raises:
        CheckpointError: the file is not safetensors, is truncated, or its header is inconsistent.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
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
            raw = f.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})", file=str(path)) from exc
    key = (size, raw)  # all the parse depends on: an unchanged header in a file of the same size
    cached = _cached_header(key)
    if cached is not None:
        return dict(cached[0]), dict(cached[1])
    try:
        entries, metadata = _parse_header(raw, 8 + header_len, size - 8 - header_len)
    except _Malformed as exc:
        fields = {"file": str(path)} if exc.tensor is None else {"file": str(path), "tensor": exc.tensor}
        raise CheckpointError(
            f"{path}: not a valid safetensors file: {exc}",
            hint="the file is truncated, corrupt or not safetensors; re-download it",
            **fields,
        ) from None
    parsed = {e.name: e for e in entries}, dict(metadata)
    _remember_header(key, parsed)
    return dict(parsed[0]), dict(parsed[1])


# Parsed headers by (file size, header bytes): a conversion reads each header several times
# (planning, writing, reading back, verifying: serial Python JSON parsing and checking of every
# entry), while reading the header bytes again is cheap. Keyed on the bytes themselves, a changed
# file can never be served a stale parse (file timestamps are too coarse for that). Callers get
# fresh dicts (entries are frozen).
_HeaderKey = tuple[int, bytes]
_HEADER_CACHE: OrderedDict[_HeaderKey, tuple[dict[str, TensorEntry], dict[str, str]]] = OrderedDict()
_HEADER_CACHE_FILES = 256
_HEADER_CACHE_LOCK = threading.Lock()


def _cached_header(key: _HeaderKey) -> tuple[dict[str, TensorEntry], dict[str, str]] | None:
    with _HEADER_CACHE_LOCK:
        found = _HEADER_CACHE.get(key)
        if found is not None:
            _HEADER_CACHE.move_to_end(key)
        return found


def _remember_header(key: _HeaderKey, parsed: tuple[dict[str, TensorEntry], dict[str, str]]) -> None:
    with _HEADER_CACHE_LOCK:
        _HEADER_CACHE[key] = parsed
        while len(_HEADER_CACHE) > _HEADER_CACHE_FILES:
            _HEADER_CACHE.popitem(last=False)


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
        return self.read_range(entry.start, entry.end, what=name)

    def read_range(
        self, start: int, end: int, *, what: str | None = None, into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bytes ``[start, end)`` of the file (absolute offsets) as a uint8 tensor: one positional
        read, e.g. one expert's slice of a fused tensor. ``what`` names the tensor in errors;
        ``into`` is a uint8 CPU tensor of ``end - start`` bytes to read into (a fresh one if None)."""
        buf = torch.empty(end - start, dtype=torch.uint8) if into is None else into
        view = memoryview(buf.numpy())  # type: ignore[arg-type]  # numpy arrays are buffers
        done = 0
        while done < end - start:
            n = os.preadv(self._fd, [view[done:]], start + done)
            if n <= 0:
                where = repr(what) if what else f"bytes {start}..{end}"
                raise CheckpointError(f"{self.path}: unexpected end of file reading {where}", tensor=what)
            done += n
        return buf

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` with its dtype and shape."""
        entry = self.entries[name]
        return self.read_bytes(name).view(DTYPES[entry.dtype]).reshape(entry.shape)


def check_declared(path: object, name: str, tensor: torch.Tensor, declared: tuple[str, tuple[int, ...]]) -> None:
    """Refuse a tensor written to ``path`` whose dtype or shape is not the ``(dtype, shape)`` declared for it."""
    dtype, shape = declared
    if dtype_name(tensor.dtype) != dtype or tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"{path}: tensor {name!r} is {dtype_name(tensor.dtype)} {tuple(tensor.shape)}, declared {dtype} {shape}",
            tensor=name,
        )


def header_bytes(
    layout: Iterable[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None, *, where: str = ""
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The bytes a safetensors file starts with (length prefix and JSON header, tensors in ``layout``
    order, the data section 8-byte aligned), and each tensor's ``(start, end)`` within the data section.

    Raises:
        CheckpointError: a name is declared twice (``where`` names the file).

    Example:
        >>> raw, spans = header_bytes([("a", "F32", (2,)), ("b", "U8", (3,))])
        >>> len(raw) % 8, spans
        (0, {'a': (0, 8), 'b': (8, 11)})
    """
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    spans: dict[str, tuple[int, int]] = {}
    offset = 0
    for name, dtype, shape in layout:
        if name in spans:
            raise CheckpointError(f"tensor {name!r} declared twice for {where}", tensor=name)
        nbytes = tensor_nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        spans[name] = (offset, offset + nbytes)
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, spans


class StreamingWriter:
    """Write a safetensors file whose tensor names, dtypes and shapes are known up front.

    The header is written first; tensors are then written one at a time, in the declared order,
    each hashed (sha256) on the way. The file is written under ``path`` as given (callers write
    to a temporary name and rename once :meth:`close` succeeded).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "a.safetensors"
        >>> w = StreamingWriter(path, [("a", "F32", (2,))])
        >>> w.write("a", torch.ones(2)); w.close()
        >>> read_header(path)[0]["a"].shape, w.sha256["a"][:12]
        ((2,), '80b8fd6d60fa')
    """

    def __init__(
        self,
        path: str | Path,
        layout: Iterable[tuple[str, str, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        layout = list(layout)
        self._order: list[str] = [name for name, _, _ in layout]
        self._expected = {name: (dtype, tuple(shape)) for name, dtype, shape in layout}
        raw, spans = header_bytes(layout, metadata, where=str(self.path))
        raw = raw[8:]
        offset = max((end for _, end in spans.values()), default=0)
        self.sha256: dict[str, str] = {}
        self.nbytes = 8 + len(raw) + offset
        with writing(self.path):
            # A fresh file, never through a symlink left at this name (it could point into the source).
            self.path.unlink(missing_ok=True)
            self._file: BinaryIO = self.path.open("xb")
            try:
                self._file.write(struct.pack("<Q", len(raw)) + raw)
            except BaseException:
                self.abort()
                raise
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write the next tensor; it must be the next declared name, with its dtype and shape."""
        if self._next >= len(self._order) or self._order[self._next] != name:
            expected = self._order[self._next] if self._next < len(self._order) else "nothing"
            raise CheckpointError(f"{self.path}: wrote {name!r} but the layout expects {expected!r}", tensor=name)
        check_declared(self.path, name, tensor, self._expected[name])
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        self.sha256[name] = hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]  # a buffer
        with writing(self.path):
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
        with writing(self.path):
            try:
                self._file.flush()
                if sync:
                    os.fsync(self._file.fileno())
            finally:
                self._file.close()

    def abort(self) -> None:
        """Close without checks and delete the partial file (never raises for a full disk)."""
        try:
            self._file.close()
        except OSError:
            pass  # the buffered tail could not be written: the file goes anyway
        self.path.unlink(missing_ok=True)
