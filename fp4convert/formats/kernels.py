"""Fast exact kernels behind :mod:`fp4convert.formats`, and the choice between them.

* CPU: ``_native.c`` (built with the package, loaded through ctypes), one pass per 16/32-element
  block, rows split over threads (ctypes releases the GIL).
* CUDA: Triton kernels (:mod:`fp4convert.formats._triton`) when Triton is importable.
* Anything else, or a missing kernel: the pure-torch reference.

Every kernel is tested byte for byte against the reference (tests/formats/test_kernels.py).
FlashInfer's quantize kernels are deliberately not used below compute capability 10: on Hopper
they launch and return unwritten memory without an error (see :func:`flashinfer_quantize_usable`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import torch

from fp4convert.formats import profiles
from fp4convert.formats.codecs import nan_ignoring_abs
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK

__all__ = [
    "flashinfer_quantize_usable",
    "mxfp8_matrix",
    "native_available",
    "nvfp4_matrix",
    "row_amax",
    "triton_available",
]

_NATIVE_ABI = 1
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_PROFILE_CODES = {"te": 0, "te-2.13": 1, "modelopt": 2}
# Rows per task: large enough to amortize the ctypes call, small enough to balance threads.
_MIN_ELEMENTS_PER_TASK = 1 << 20


@lru_cache(maxsize=1)
def _native_lib() -> Any | None:
    spec = importlib.util.find_spec("fp4convert.formats._native")
    if spec is None or spec.origin is None or os.environ.get("FP4CONVERT_DISABLE_NATIVE"):
        return None
    lib = ctypes.CDLL(spec.origin)
    if lib.fp4c_abi_version() != _NATIVE_ABI:
        return None
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.fp4c_absmax_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr]
    lib.fp4c_nvfp4_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, ptr, ptr, i32, ptr, ptr]
    lib.fp4c_mxfp8_rows.argtypes = [ptr, i32, i64, i64, i64, i64, ptr, ptr]
    for fn in (lib.fp4c_absmax_rows, lib.fp4c_nvfp4_rows, lib.fp4c_mxfp8_rows):
        fn.restype = None
    return lib


def _lib() -> Any:
    lib = _native_lib()
    if lib is None:  # callers check native_available() first
        raise RuntimeError("the native fp4convert kernel is not built")
    return lib


def native_available() -> bool:
    """True when the compiled CPU kernel is built and loadable."""
    return _native_lib() is not None


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton can be imported (it is only used for CUDA tensors)."""
    return importlib.util.find_spec("triton") is not None


def flashinfer_quantize_usable(device: torch.device | int | None = None) -> bool:
    """Whether FlashInfer's FP4/MXFP8 quantize kernels may be trusted on ``device``.

    They are compiled out below compute capability 10.0 (Hopper and older) yet still launch and
    return whatever memory held, with no error. fp4convert never calls them there.
    """
    if not torch.cuda.is_available():
        return False
    major, _minor = torch.cuda.get_device_capability(device)
    return major >= 10 and importlib.util.find_spec("flashinfer") is not None


def _row_tasks(rows: int, cols: int) -> list[tuple[int, int]]:
    """Split rows into nearly equal tasks: one per thread for small tensors (an expert projection
    is a few MB: an uneven split would leave a core idle), four per thread for large ones (load
    balance when other threads compete for the cores)."""
    threads = max(1, torch.get_num_threads())
    elements = rows * cols
    if elements < _MIN_ELEMENTS_PER_TASK:
        return [(0, rows)]
    count = min(rows, threads * (4 if elements >= 16 * _MIN_ELEMENTS_PER_TASK else 1))
    bounds = [rows * i // count for i in range(count + 1)]
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


def _run_rows(fn: Any, rows: int, cols: int) -> None:
    tasks = _row_tasks(rows, cols)
    if len(tasks) == 1:
        fn(*tasks[0])
        return
    # The caller's thread takes the first task itself; the pool runs the rest.
    pool = _pool(max(1, torch.get_num_threads()))
    pending = [pool.submit(fn, *t) for t in tasks[1:]]
    fn(*tasks[0])
    for future in pending:
        future.result()


def _native_ok(x2d: torch.Tensor) -> bool:
    return x2d.device.type == "cpu" and x2d.dtype in _DTYPE_CODES and native_available()


def contiguous_rows(x2d: torch.Tensor) -> torch.Tensor:
    """``x2d`` if its rows are contiguous (row stride free), else a contiguous copy."""
    return x2d if x2d.stride(-1) == 1 else x2d.contiguous()


def row_amax(x2d: torch.Tensor) -> torch.Tensor:
    """NaN-ignoring per-row amax ``(M,)`` float32 (TE's amax kernels skip NaN, keep inf)."""
    if x2d.is_cuda and triton_available():
        from fp4convert.formats import _triton

        return _triton.row_amax(x2d)
    if not _native_ok(x2d):
        return nan_ignoring_abs(x2d).amax(dim=-1)
    lib = _lib()
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    out = torch.empty(rows, dtype=torch.float32)
    code = _DTYPE_CODES[x2d.dtype]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_absmax_rows(x2d.data_ptr(), code, r0, r1, cols, x2d.stride(0), out.data_ptr())

    _run_rows(run, rows, cols)
    return out


def nvfp4_matrix(
    x2d: torch.Tensor,
    row_amax: torch.Tensor,
    profile: profiles.Profile,
    block_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path of :func:`fp4convert.formats.nvfp4.nvfp4_matrix_reference` (same contract)."""
    from fp4convert.formats.nvfp4 import nvfp4_matrix_reference

    if x2d.is_cuda and triton_available():
        from fp4convert.formats import _triton

        return _triton.nvfp4_matrix(x2d, row_amax, profile, block_amax)
    if not _native_ok(x2d):
        return nvfp4_matrix_reference(x2d, row_amax, profile, block_amax)
    lib = _lib()
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    outer = profiles.outer_scales(row_amax.reshape(rows), profile)
    s_dec = outer.s_dec.contiguous()
    mult = outer.mult.contiguous()
    blk = None if block_amax is None else block_amax.float().contiguous()
    data = torch.empty(rows, cols // 2, dtype=torch.uint8)
    scale = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.uint8)
    code = _DTYPE_CODES[x2d.dtype]
    prof = _PROFILE_CODES[profile]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_nvfp4_rows(
            x2d.data_ptr(),
            code,
            r0,
            r1,
            cols,
            x2d.stride(0),
            s_dec.data_ptr(),
            mult.data_ptr(),
            None if blk is None else blk.data_ptr(),
            prof,
            data.data_ptr(),
            scale.data_ptr(),
        )

    _run_rows(run, rows, cols)
    return data, scale


def mxfp8_matrix(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast path of :func:`fp4convert.formats.mxfp8.mxfp8_matrix_reference` (same contract)."""
    from fp4convert.formats.mxfp8 import mxfp8_matrix_reference

    if x2d.is_cuda and triton_available():
        from fp4convert.formats import _triton

        return _triton.mxfp8_matrix(x2d)
    if not _native_ok(x2d):
        return mxfp8_matrix_reference(x2d)
    lib = _lib()
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    data = torch.empty(rows, cols, dtype=torch.uint8)
    scale = torch.empty(rows, cols // MXFP8_BLOCK, dtype=torch.uint8)
    code = _DTYPE_CODES[x2d.dtype]

    def run(r0: int, r1: int) -> None:
        lib.fp4c_mxfp8_rows(x2d.data_ptr(), code, r0, r1, cols, x2d.stride(0), data.data_ptr(), scale.data_ptr())

    _run_rows(run, rows, cols)
    return data, scale
