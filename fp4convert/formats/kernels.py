"""Fast exact kernels behind :mod:`fp4convert.formats`: fast paths only, no fallback.

* CPU: ``_native.c`` (built with the package, loaded through ctypes), one pass per 16/32-element
  block, rows split over threads (ctypes releases the GIL).
* CUDA: Triton kernels (:mod:`fp4convert.formats._triton_segments`; row / tile amax and 4over6 in
  :mod:`fp4convert.formats._triton`) when Triton is importable.

The format modules (:mod:`~fp4convert.formats.nvfp4`, :mod:`~fp4convert.formats.mxfp8`) ask
:func:`has_fast_path` and otherwise run their pure-torch reference, which every kernel is tested
against byte for byte (tests/formats/test_kernels.py). The scale chain's per-row values come from
:mod:`fp4convert.formats.profiles`; the kernels only apply them per block.
FlashInfer's quantize kernels are deliberately not used below compute capability 10: on Hopper
they launch and return unwritten memory without an error (see :func:`flashinfer_quantize_usable`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cache, lru_cache
from typing import Any

import torch

from fp4convert.formats import profiles
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK

__all__ = [
    "CPU_DTYPES",
    "PROFILE_CODES",
    "flashinfer_quantize_usable",
    "has_fast_path",
    "mxfp8_col_matrix",
    "mxfp8_matrix",
    "mxfp8_segments",
    "native_available",
    "nonfinite_counts",
    "nvfp4_matrix",
    "nvfp4_segments",
    "nvfp4_units",
    "outer_decode_scales",
    "outer_encode_scales",
    "row_amax",
    "segment_amax",
    "set_split_threshold",
    "split_only_above",
    "tensor_amax",
    "tile_amax",
    "triton_available",
]

_NATIVE_ABI = 4
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: input dtypes the CPU kernels read
CPU_DTYPES = frozenset(_DTYPE_CODES)
#: Block chain -> the integer both kernels (``_native.c`` enum, ``_triton.py`` constexpr) switch on.
PROFILE_CODES = {"te": 0, "te-2.13": 1, "modelopt": 2, "4over6": 3}
# Rows per task: large enough to amortize the ctypes call, small enough to balance threads.
_MIN_ELEMENTS_PER_TASK = 1 << 20


# Inputs smaller than this run through a handle that keeps the GIL (ctypes.PyDLL): the call
# takes tens of microseconds, less than handing the GIL to another thread and waiting to get it
# back, which is what releasing it costs when a conversion's many threads all want it. (The
# writer's read-back memcmp follows the same rule.)
HOLD_GIL_BELOW_BYTES = 64 << 10


def _declare(lib: Any) -> Any:
    """``lib`` with the native entry points' argument and result types set; None when its ABI differs."""
    if lib.fp4c_abi_version() != _NATIVE_ABI:
        return None
    i64, ptr, i32, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.fp4c_absmax_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr]
    lib.fp4c_absmax_range.argtypes = [ptr, i32, i64, i64, i64, i64]
    lib.fp4c_absmax_range.restype = f32
    lib.fp4c_nonfinite_count.argtypes = [ptr, i32, i64, ptr]
    lib.fp4c_nvfp4_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, ptr, ptr, i32, ptr, ptr]
    lib.fp4c_nvfp4_unit_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, i64, f32, ptr, i32, ptr, ptr]
    lib.fp4c_nvfp4_4over6_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, ptr, ptr, ptr, i32, i32, f32]
    lib.fp4c_nvfp4_4over6_rows.argtypes += [ptr, ptr, ptr]
    lib.fp4c_mxfp8_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, ptr]
    lib.fp4c_tile_amax_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr]
    lib.fp4c_outer_scales.argtypes = [ptr, i64, i32, f32, ptr, ptr]
    for fn in (
        lib.fp4c_outer_scales,
        lib.fp4c_absmax_rows,
        lib.fp4c_tile_amax_rows,
        lib.fp4c_nonfinite_count,
        lib.fp4c_nvfp4_rows,
        lib.fp4c_nvfp4_unit_rows,
        lib.fp4c_nvfp4_4over6_rows,
        lib.fp4c_mxfp8_rows,
    ):
        fn.restype = None
    return lib


def _native_lib(hold_gil: bool = False) -> Any | None:
    """The built kernel library (None when it is not built, disabled or of another ABI); its
    functions release the GIL, or keep it with ``hold_gil`` (the same library, a PyDLL handle)."""
    return _load_native(bool(hold_gil))


@cache
def _load_native(hold_gil: bool) -> Any | None:
    spec = importlib.util.find_spec("fp4convert.formats._native")
    if spec is None or spec.origin is None or os.environ.get("FP4CONVERT_DISABLE_NATIVE"):
        return None
    return _declare((ctypes.PyDLL if hold_gil else ctypes.CDLL)(spec.origin))


def _lib(nbytes: int | None = None) -> Any:
    """The kernel library for an input of ``nbytes``: small ones keep the GIL (see above)."""
    lib = _native_lib(nbytes is not None and nbytes < HOLD_GIL_BELOW_BYTES)
    if lib is None:
        raise RuntimeError("the native fp4convert kernel is not built (callers check has_fast_path first)")
    return lib


def _input_bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def native_available() -> bool:
    """True when the compiled CPU kernel is built and loadable."""
    return _native_lib() is not None


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton can be imported (it is only used for CUDA tensors)."""
    return importlib.util.find_spec("triton") is not None


def has_fast_path(x2d: torch.Tensor) -> bool:
    """Whether a kernel here handles ``x2d``: a CUDA tensor with Triton, or a bf16/fp16/fp32 CPU
    tensor with the native kernel built."""
    if x2d.is_cuda:
        return triton_available()
    return x2d.device.type == "cpu" and x2d.dtype in _DTYPE_CODES and native_available()


def flashinfer_quantize_usable(device: torch.device | int | None = None) -> bool:
    """Whether FlashInfer's FP4/MXFP8 quantize kernels may be trusted on ``device``.

    They are compiled out below compute capability 10.0 (Hopper and older) yet still launch and
    return whatever memory held, with no error. fp4convert never calls them there.
    """
    if not torch.cuda.is_available():
        return False
    major, _minor = torch.cuda.get_device_capability(device)
    return major >= 10 and importlib.util.find_spec("flashinfer") is not None


_THREAD = threading.local()


@contextmanager
def split_only_above(nbytes: int) -> Iterator[None]:
    """Within the block, this thread runs a kernel on a tensor of fewer than ``nbytes`` input bytes
    itself, in one call, instead of splitting its rows over the kernel pool.

    For callers that are already one of many threads (a conversion's workers): there the cores are
    busy with other tensors, and splitting each one again only adds futures, wake-ups and GIL
    round trips per tensor. A tensor at least ``nbytes`` large is still split, so one huge tensor
    (an embedding) does not leave the other cores idle at the end of a run.
    """
    previous = _split_threshold()
    set_split_threshold(nbytes)
    try:
        yield
    finally:
        set_split_threshold(previous)


def set_split_threshold(nbytes: int | None) -> None:
    """:func:`split_only_above` for the rest of this thread's life (a pool's initializer); None
    restores the default (every tensor of 1M elements or more is split)."""
    _THREAD.split_above = nbytes


def _split_threshold() -> int | None:
    return getattr(_THREAD, "split_above", None)


def _row_tasks(rows: int, cols: int, align: int = 1, element_size: int = 2) -> list[tuple[int, int]]:
    """Split rows into nearly equal tasks: one per thread for small tensors (an expert projection
    is a few MB: an uneven split would leave a core idle), four per thread for large ones (load
    balance when other threads compete for the cores). Bounds are multiples of ``align`` (16 when
    a task must hold whole 16x16 tiles). One task under :func:`split_only_above` below its size."""
    threads = max(1, torch.get_num_threads())
    elements = rows * cols
    threshold = _split_threshold()
    if elements < _MIN_ELEMENTS_PER_TASK or (threshold is not None and elements * element_size < threshold):
        return [(0, rows)]
    units = rows // align
    count = max(1, min(units, threads * (4 if elements >= 16 * _MIN_ELEMENTS_PER_TASK else 1)))
    bounds = [units * i // count * align for i in range(count)] + [rows]
    return [(bounds[i], bounds[i + 1]) for i in range(count) if bounds[i] < bounds[i + 1]]


_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _pool(size: int) -> ThreadPoolExecutor:
    """One long-lived pool for row tasks: a conversion makes thousands of kernel calls, and
    starting threads per call costs more than quantizing a small expert tensor."""
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE != size:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL, _POOL_SIZE = ThreadPoolExecutor(max_workers=size, thread_name_prefix="fp4convert-kernel"), size
        return _POOL


def _run_rows(fn: Any, rows: int, cols: int, align: int = 1, element_size: int = 2) -> None:
    tasks = _row_tasks(rows, cols, align, element_size)
    if len(tasks) == 1:
        fn(*tasks[0])
        return
    # The caller's thread takes the first task itself; the pool runs the rest.
    pool = _pool(max(1, torch.get_num_threads()))
    pending = [pool.submit(fn, *t) for t in tasks[1:]]
    fn(*tasks[0])
    for future in pending:
        future.result()


def contiguous_rows(x2d: torch.Tensor) -> torch.Tensor:
    """``x2d`` if its rows are contiguous (row stride free), else a contiguous copy."""
    return x2d if x2d.stride(-1) == 1 else x2d.contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def row_amax(x2d: torch.Tensor) -> torch.Tensor:
    """NaN-ignoring per-row amax ``(M,)`` float32 (TE's amax kernels skip NaN, keep inf)."""
    x2d = contiguous_rows(x2d)
    if x2d.is_cuda:
        from fp4convert.formats import _triton

        return _triton.row_amax(x2d)
    lib = _lib(_input_bytes(x2d))
    rows, cols = x2d.shape
    out = torch.empty(rows, dtype=torch.float32)
    code = _DTYPE_CODES[x2d.dtype]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_absmax_rows(x2d.data_ptr(), code, r0, r1, cols, x2d.stride(0), out.data_ptr())

    _run_rows(run, rows, cols, element_size=x2d.element_size())
    return out


def tensor_amax(x2d: torch.Tensor) -> torch.Tensor | None:
    """NaN-ignoring amax of a whole matrix in one pass (float32 0-d), or None where there is no such
    kernel (the caller reduces :func:`row_amax`): on CUDA with Triton, and on the CPU with the native
    kernel, which returns the value itself (no per-row array, no torch reduction)."""
    if x2d.is_cuda:
        if not triton_available():
            return None
        from fp4convert.formats import _triton_segments

        return _triton_segments.tensor_amax(contiguous_rows(x2d))
    if not has_fast_path(x2d):
        return None
    x2d = contiguous_rows(x2d)
    lib = _lib(_input_bytes(x2d))
    rows, cols = x2d.shape
    code, src, ld = _DTYPE_CODES[x2d.dtype], x2d.data_ptr(), x2d.stride(0)
    partial: list[float] = []

    def run(r0: int, r1: int) -> None:
        partial.append(lib.fp4c_absmax_range(src, code, r0, r1, cols, ld))  # list.append is atomic

    _run_rows(run, rows, cols, element_size=x2d.element_size())
    # float32 -> Python float -> float32 is exact, and a max of maxima is the max.
    return torch.tensor(max(partial, default=0.0), dtype=torch.float32)


def nonfinite_counts(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``(NaN count, infinity count)`` of a contiguous bf16/fp16/fp32 CPU tensor in one native pass,
    or None where the kernel does not apply (the caller counts with torch)."""
    if tensor.device.type != "cpu" or tensor.dtype not in _DTYPE_CODES or not tensor.is_contiguous():
        return None
    lib = _native_lib(_input_bytes(tensor) < HOLD_GIL_BELOW_BYTES)
    if lib is None:
        return None
    out = (ctypes.c_int64 * 2)()
    lib.fp4c_nonfinite_count(tensor.data_ptr(), _DTYPE_CODES[tensor.dtype], tensor.numel(), out)
    return int(out[0]), int(out[1])


def tile_amax(x2d: torch.Tensor) -> torch.Tensor:
    """Fast path of :func:`fp4convert.formats.nvfp4.tile_amax` for a 2-D ``(M, N)`` matrix."""
    x2d = contiguous_rows(x2d)
    if x2d.is_cuda:
        from fp4convert.formats import _triton

        return _triton.tile_amax(x2d)
    lib = _lib(_input_bytes(x2d))
    rows, cols = x2d.shape
    out = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.float32)
    code = _DTYPE_CODES[x2d.dtype]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_tile_amax_rows(x2d.data_ptr(), code, r0, r1, cols, x2d.stride(0), out.data_ptr())

    _run_rows(run, rows, cols, align=NVFP4_BLOCK, element_size=x2d.element_size())
    return out


def _triton_outer_scales(amax: torch.Tensor, profile: profiles.Profile) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(s_dec, s_enc)`` of float32 CUDA amaxes from the Triton kernels' own scale chain (one launch);
    None where it does not apply."""
    spec = profiles.profile_spec(profile)
    if not (amax.is_cuda and amax.dtype == torch.float32 and spec.chain in PROFILE_CODES and triton_available()):
        return None
    from fp4convert.formats import _triton_segments

    return _triton_segments.outer_scales(amax.contiguous(), PROFILE_CODES[spec.chain], spec.global_max)


def outer_encode_scales(amax: torch.Tensor, profile: profiles.Profile) -> torch.Tensor | None:
    """``profiles.outer_scales(amax, profile).s_enc`` in one launch for float32 CUDA amaxes (a
    group's units at every sync: one launch instead of a dozen torch operations); None elsewhere."""
    pair = _triton_outer_scales(amax, profile)
    return None if pair is None else pair[1]


def outer_decode_scales(amax: torch.Tensor, profile: profiles.Profile) -> torch.Tensor | None:
    """``profiles.outer_scales(amax, profile).s_dec`` from the kernels' own scale chain (the one
    their row kernels apply): the native kernel's for float32 CPU amaxes under te / te-2.13 /
    modelopt, one Triton launch for float32 CUDA amaxes; None where it does not apply (the caller
    takes :func:`profiles.outer_scales`). Fewer operations per tensor than the torch chain, which
    matters with a conversion's many threads and a live sync's ~100 groups."""
    pair = _triton_outer_scales(amax, profile)
    if pair is not None:
        return pair[0]
    spec = profiles.profile_spec(profile)
    if amax.device.type != "cpu" or amax.dtype != torch.float32 or spec.chain not in ("te", "te-2.13", "modelopt"):
        return None
    lib = _native_lib(hold_gil=True)  # a few floats: never worth a GIL hand-off
    if lib is None:
        return None
    a = amax.contiguous()
    s_dec = torch.empty_like(a)
    mult = torch.empty_like(a)
    lib.fp4c_outer_scales(a.data_ptr(), a.numel(), PROFILE_CODES[spec.chain], spec.global_max, s_dec.data_ptr(),
                          mult.data_ptr())  # fmt: skip
    return s_dec


def nvfp4_matrix(
    x2d: torch.Tensor,
    row_amax: torch.Tensor,
    profile: profiles.Profile,
    block_amax: torch.Tensor | None = None,
    *,
    choice: torch.Tensor | None = None,
    tile16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nvfp4_units` for callers that hold one outer amax per row (``row_amax`` float32
    ``(M,)``): a row amax expanded from one value (stride 0, as tensor scope passes it) is one unit
    of ``M`` rows, so the kernel computes its outer scales once, not per row."""
    rows = x2d.shape[0]
    amax = row_amax.reshape(rows)
    if rows and amax.stride(0) == 0:
        return nvfp4_units(x2d, amax[:1], rows, profile, block_amax, choice=choice, tile16=tile16)
    return nvfp4_units(x2d, amax, 1, profile, block_amax, choice=choice, tile16=tile16)


def nvfp4_units(
    x2d: torch.Tensor,
    unit_amax: torch.Tensor,
    unit_rows: int,
    profile: profiles.Profile,
    block_amax: torch.Tensor | None = None,
    *,
    choice: torch.Tensor | None = None,
    tile16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path of :func:`fp4convert.formats.nvfp4.nvfp4_matrix_reference`; row ``i`` takes the outer
    amax ``unit_amax[i // unit_rows]``.

    Args:
        x2d: ``(M, N)`` matrix on the CPU or a CUDA device (:func:`has_fast_path` must hold).
        unit_amax: float32 outer amaxes, one per unit of ``unit_rows`` rows: one for tensor scope
            (``unit_rows = M``), one per expert, or one per row (``unit_rows = 1``).
        unit_rows: rows per unit (>= 1).
        profile: arithmetic profile.
        block_amax: optional float32 ``(M, N/16)`` 16x16 tile amaxes (:func:`tile_amax`), used
            instead of each block's own; rows then come in whole tiles (M % 16 == 0) and 4over6
            makes one choice per tile, as TE's 2-D quantization does.
        choice: optional uint8 ``(M, N/16)`` tensor on ``x2d``'s device; 4over6 writes 1 where a
            block took map-to-4, 0 where it took map-to-6.
        tile16: 16x16 tiles whose amaxes the kernel takes itself (CUDA, not 4over6) or computes
            first with :func:`tile_amax` (instead of passing ``block_amax``).

    Returns:
        ``(data (M, N/2) uint8, scale (M, N/16) uint8)``.
    """
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    unit_rows = max(1, unit_rows)
    spec = profiles.profile_spec(profile)
    code = PROFILE_CODES[spec.chain]
    units = (unit_amax if unit_amax.dim() == 1 else unit_amax.reshape(-1)).to(x2d.device, torch.float32)
    if x2d.is_cuda and spec.chain != "4over6" and block_amax is None:
        # One launch: the scales come from each unit's amax in the kernel, the 16x16 tile amaxes
        # from the 16 rows each program holds (bench/device/kernel_lab.py measures the shapes).
        from fp4convert.formats import _triton_segments

        return _triton_segments.nvfp4_dense(x2d, units.contiguous(), unit_rows, code, spec.global_max, tile16)
    if tile16 and block_amax is None:
        block_amax = tile_amax(x2d)
    blk = None if block_amax is None else block_amax.float().contiguous()
    tile_rows = 1 if blk is None else NVFP4_BLOCK
    if x2d.is_cuda or spec.chain == "4over6":  # per-row outer scales from torch (profiles.outer_scales)
        per_row = units.expand(rows) if unit_rows >= rows else units.repeat_interleave(unit_rows)[:rows]
        outer = profiles.outer_scales(per_row, profile)
    if x2d.is_cuda:
        if spec.chain != "4over6":
            raise ValueError("imposed tile amaxes on CUDA are for 4over6 (callers pass tile16 otherwise)")
        from fp4convert.formats import _triton

        return _triton.nvfp4_4over6_matrix(x2d, outer, spec, blk, tile_rows, choice)
    lib = _lib(_input_bytes(x2d))
    data = torch.empty(rows, cols // 2, dtype=torch.uint8)
    scale = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.uint8)
    dtype = _DTYPE_CODES[x2d.dtype]
    src, ld = x2d.data_ptr(), x2d.stride(0)

    if spec.chain == "4over6":
        mse = int(spec.error == "mse")
        amax, s_enc, s_dec = (t.contiguous() for t in (outer.amax, outer.s_enc, outer.s_dec))

        def run(r0: int, r1: int) -> None:
            lib.fp4c_nvfp4_4over6_rows(
                src, dtype, r0, r1, cols, ld, amax.data_ptr(), s_enc.data_ptr(), s_dec.data_ptr(), _ptr(blk),
                tile_rows, mse, spec.global_max, data.data_ptr(), scale.data_ptr(), _ptr(choice),
            )  # fmt: skip

    else:  # the kernel computes each row's outer scales from its unit's amax (no torch op per tensor)
        units = units.contiguous()

        def run(r0: int, r1: int) -> None:
            lib.fp4c_nvfp4_unit_rows(
                src, dtype, r0, r1, cols, ld, units.data_ptr(), unit_rows, spec.global_max, _ptr(blk), code,
                data.data_ptr(), scale.data_ptr(),
            )  # fmt: skip

    _run_rows(run, rows, cols, align=tile_rows, element_size=x2d.element_size())
    return data, scale


def mxfp8_col_matrix(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """MXFP8 column blocks of ``x2d (M, N)`` (M % 32 == 0) read in place on CUDA: ``(data (M, N),
    scale (M/32, N))``; None where there is no such kernel (the caller transposes)."""
    if not (x2d.is_cuda and triton_available()):
        return None
    from fp4convert.formats import _triton_segments

    return _triton_segments.mxfp8_col_dense(contiguous_rows(x2d))


def mxfp8_matrix(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path of :func:`fp4convert.formats.mxfp8.mxfp8_matrix_reference` (same contract)."""
    x2d = contiguous_rows(x2d)
    if x2d.is_cuda:
        from fp4convert.formats import _triton_segments

        return _triton_segments.mxfp8_dense(x2d)
    lib = _lib(_input_bytes(x2d))
    rows, cols = x2d.shape
    data = torch.empty(rows, cols, dtype=torch.uint8)
    scale = torch.empty(rows, cols // MXFP8_BLOCK, dtype=torch.uint8)
    code = _DTYPE_CODES[x2d.dtype]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_mxfp8_rows(x2d.data_ptr(), code, r0, r1, cols, x2d.stride(0), data.data_ptr(), scale.data_ptr())

    _run_rows(run, rows, cols, element_size=x2d.element_size())
    return data, scale


# -- groups of tensors (fp4convert.formats.segments): the same kernels, run from each tensor's memory --


def _segment_tasks(tensors: list[torch.Tensor], align: int) -> list[tuple[int, int, int]]:
    """(segment, first row, end row) tasks: whole segments, large ones split in row ranges, so a
    group of many small tensors keeps every thread busy with one task per tensor."""
    tasks: list[tuple[int, int, int]] = []
    for index, t in enumerate(tensors):
        rows, cols = t.shape
        tasks += [(index, r0, r1) for r0, r1 in _row_tasks(rows, cols, align, t.element_size())]
    return tasks


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _run_tasks(fn: Any, tasks: list[tuple[int, int, int]], nbytes: int) -> None:
    threads = max(1, torch.get_num_threads())
    threshold = _split_threshold()
    if threads == 1 or len(tasks) == 1 or (threshold is not None and nbytes < threshold):
        for task in tasks:
            fn(*task)
        return
    # One pool task per thread, each taking every threads-th task: no per-tensor future.
    pool = _pool(threads)

    def stripe(first: int) -> None:
        for task in tasks[first::threads]:
            fn(*task)

    pending = [pool.submit(stripe, i) for i in range(1, min(threads, len(tasks)))]
    stripe(0)
    for future in pending:
        future.result()


def segment_amax(tensors: list[torch.Tensor]) -> torch.Tensor:
    """NaN-ignoring amax of each CPU tensor (2-D, contiguous rows): float32 ``(len(tensors),)``."""
    lib = _lib()
    rows_out = [torch.empty(t.shape[0], dtype=torch.float32) for t in tensors]

    def run(index: int, r0: int, r1: int) -> None:
        t = tensors[index]
        lib.fp4c_absmax_rows(
            t.data_ptr(), _DTYPE_CODES[t.dtype], r0, r1, t.shape[1], t.stride(0), rows_out[index].data_ptr()
        )

    _run_tasks(run, _segment_tasks(tensors, 1), _nbytes(tensors))
    return torch.stack([r.amax() if r.numel() else r.new_zeros(()) for r in rows_out])


def nvfp4_segments(
    tensors: list[torch.Tensor],
    out_rows: tuple[int, ...],
    row_amax: torch.Tensor,
    profile: profiles.Profile,
    tile16: bool,
    data: torch.Tensor,
    scale: torch.Tensor,
) -> None:
    """NVFP4 (te, te-2.13, modelopt) of CPU tensors stacked at ``out_rows`` of ``data`` / ``scale``;
    ``row_amax`` holds each output row's outer amax."""
    lib = _lib()
    spec = profiles.profile_spec(profile)
    outer = profiles.outer_scales(row_amax, profile)
    s_dec, mult = outer.s_dec.contiguous(), outer.mult.contiguous()
    code = PROFILE_CODES[spec.chain]
    cols = data.shape[1] * 2
    nb = cols // NVFP4_BLOCK
    tiles = [tile_amax(t) if tile16 else None for t in tensors]

    def run(index: int, r0: int, r1: int) -> None:
        t, o, blk = tensors[index], out_rows[index], tiles[index]
        lib.fp4c_nvfp4_rows(
            t.data_ptr(), _DTYPE_CODES[t.dtype], r0, r1, cols, t.stride(0), s_dec.data_ptr() + 4 * o,
            mult.data_ptr() + 4 * o, _ptr(blk), code, data.data_ptr() + o * (cols // 2), scale.data_ptr() + o * nb,
        )  # fmt: skip

    _run_tasks(run, _segment_tasks(tensors, NVFP4_BLOCK if tile16 else 1), _nbytes(tensors))


def mxfp8_segments(
    tensors: list[torch.Tensor], out_rows: tuple[int, ...], data: torch.Tensor, scale: torch.Tensor
) -> None:
    """MXFP8 of CPU tensors stacked at ``out_rows`` of ``data`` / ``scale``."""
    lib = _lib()
    cols = data.shape[1]
    nb = cols // MXFP8_BLOCK

    def run(index: int, r0: int, r1: int) -> None:
        t, o = tensors[index], out_rows[index]
        lib.fp4c_mxfp8_rows(
            t.data_ptr(), _DTYPE_CODES[t.dtype], r0, r1, cols, t.stride(0), data.data_ptr() + o * cols,
            scale.data_ptr() + o * nb,
        )  # fmt: skip

    _run_tasks(run, _segment_tasks(tensors, 1), _nbytes(tensors))
