"""Read a source checkpoint's tensors once, and hash its files and count non-finite values on the way.

:class:`SourceReader` serves a source's logical tensors by name (one file descriptor per shard,
one positional read per stored range, no mmap; quantized and fused sources decoded on the way,
:mod:`fp4convert.checkpoint.decode`) and offers every byte it reads to
:class:`~fp4convert.checkpoint.file_hashes.SourceHashes`, which computes every shard's sha256 from
them (one thread per file, so files hash in parallel): the manifest's source hashes cost no second
pass over the source in the usual, front-to-back order. It also counts the NaN and infinite
values of every logical tensor it serves (:func:`nonfinite_counts`: one native pass over the bits,
or a torch min/max pass with an exact count only for a tensor that has any), so a conversion can
refuse NaN weights, or record them, without a pass of its own.
"""

from __future__ import annotations

import threading

import torch

from fp4convert.checkpoint.decode.read import SourceDecoder, decode_unit
from fp4convert.checkpoint.file_hashes import SourceHashes
from fp4convert.checkpoint.read_buffers import ReadBuffers
from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.checkpoint.source import SourceCheckpoint
from fp4convert.formats import kernels

__all__ = ["SourceReader", "nonfinite_counts"]


def nonfinite_counts(tensor: torch.Tensor) -> dict[str, int]:
    """``{"nan": n, "inf": m}`` of a tensor, empty when every value is finite (or it is not floating).

    A bf16/fp16/fp32 tensor is counted in one native pass (no torch op, which matters on reader
    threads that run next to many quantizing ones); otherwise one ``aminmax`` pass decides (NaN
    propagates into both, an infinity shows as one of them) and only a tensor with a non-finite
    value is counted exactly.

    Example:
        >>> nonfinite_counts(torch.tensor([1.0, float("nan"), float("-inf"), float("inf")]))
        {'nan': 1, 'inf': 2}
        >>> nonfinite_counts(torch.ones(3, dtype=torch.bfloat16))
        {}
    """
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.element_size() == 1:
        return {}  # FP8 sources are decoded (or refused) before this; one-byte floats have no aminmax
    counted = kernels.nonfinite_counts(tensor)
    if counted is not None:
        return {k: v for k, v in zip(("nan", "inf"), counted, strict=True) if v}
    low, high = torch.aminmax(tensor)
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return {}
    nan = int(torch.isnan(tensor).sum())
    inf = int(torch.isinf(tensor).sum())
    return {k: v for k, v in (("nan", nan), ("inf", inf)) if v}


class SourceReader:
    """Reads source tensors (one fd per shard, no mmap), hashing each shard from the bytes read.

    Safe to call :meth:`read` from several threads: a read unit of one logical tensor (a dense
    tensor, an FP8 weight with its scales) is read and decoded outside any lock, so reads run in
    parallel; a unit that yields several tensors (a fused expert's gate and up) goes through the
    decoder, which reads it once and keeps the other tensors until they are asked for.

    Args:
        source: the source checkpoint.
        hashes: where read bytes go; default: every file hashed, reads ahead of a file's hash held
            until it gets there (see :class:`~fp4convert.checkpoint.file_hashes.SourceHashes`).
            ``SourceHashes(source, files=())`` reads without hashing.
        buffers: where bytes are read into (reused once free); default: a fresh tensor per read.

    Example (not run: it needs a checkpoint folder ``ckpt``):
        >>> reader = SourceReader(open_checkpoint("ckpt"))  # doctest: +SKIP
        >>> w = reader.read("model.norm.weight"); hashes = reader.shard_hashes(); reader.close()  # doctest: +SKIP
    """

    def __init__(
        self, source: SourceCheckpoint, *, hashes: SourceHashes | None = None, buffers: ReadBuffers | None = None
    ) -> None:
        self.source = source
        self._buffers = buffers
        self.hashes = SourceHashes(source) if hashes is None else hashes
        self._files: dict[str, SafetensorsFile] = {}
        self.nonfinite: dict[str, dict[str, int]] = {}  # tensor -> {"nan": n, "inf": m}, where any
        self._lock = threading.Lock()
        self._view = source.view()
        self._decoder = SourceDecoder(self._view, self.read_range)

    def _file(self, shard: str) -> SafetensorsFile:
        with self._lock:
            if shard not in self._files:
                self._files[shard] = self.source.open(shard)
            return self._files[shard]

    def read(self, name: str) -> torch.Tensor:
        """Logical tensor ``name`` of the source (a fresh CPU tensor): a stored tensor as it is, or
        decoded where the source stores it quantized or fused (:meth:`SourceCheckpoint.view`)."""
        unit = self._view.unit_of(name)
        if len(unit.outputs) > 1:
            tensor = self._decoder.read(name)
        else:
            raw = [self.read_range(p.file, p.start, p.end) for p in unit.parts]
            tensor = decode_unit(unit, raw, self._view.quantization)[name]
        counts = nonfinite_counts(tensor)
        if counts:
            with self._lock:
                self.nonfinite[name] = counts
        return tensor

    def read_range(self, shard: str, start: int, end: int) -> torch.Tensor:
        """Bytes ``[start, end)`` of ``shard`` as uint8 (a tensor, one expert's slice of a fused
        tensor, a scale), offered to the shard's hash."""
        into = None if self._buffers is None else self._buffers.take(end - start)
        data = self._file(shard).read_range(start, end, into=into)
        self.hashes.offer(shard, start, data)
        return data

    def finished_hashes(self) -> dict[str, str]:
        """sha256 of the source files (of those this reader hashes) whose every byte has been read
        or hashed so far: what a resume journal may record once a shard made from them is done."""
        return self.hashes.finished()

    def shard_hashes(self) -> dict[str, str]:
        """sha256 of every source shard file hashed (what was not read is read from disk now)."""
        return self.hashes.hexdigests()

    def close(self) -> None:
        """Finish pending hash updates and close every file."""
        self.hashes.close()
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
