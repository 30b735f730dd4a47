"""bench/quantize.py with dense CUDA matrices routed through the segment kernels (as h/livesync had it)."""

import runpy
import sys

import torch

from fp4convert.formats import _triton_segments, kernels, profiles

old_nvfp4, old_mxfp8 = kernels.nvfp4_matrix, kernels.mxfp8_matrix


def nvfp4_matrix(x2d, row_amax, profile, block_amax=None, *, choice=None, tile16=False):
    spec = profiles.profile_spec(profile)
    if x2d.is_cuda and spec.chain != "4over6" and block_amax is None:
        x2d = kernels.contiguous_rows(x2d)
        rows = x2d.shape[0]
        amax = row_amax.reshape(rows).to(x2d.device, torch.float32)
        unit_rows = rows if rows and amax.stride(0) == 0 else 1
        amax = amax[:1].contiguous() if unit_rows > 1 else amax.contiguous()
        return _triton_segments.nvfp4_dense(
            x2d, amax, max(unit_rows, 1), kernels.PROFILE_CODES[spec.chain], spec.global_max, tile16
        )
    return old_nvfp4(x2d, row_amax, profile, block_amax, choice=choice, tile16=tile16)


def mxfp8_matrix(x2d):
    if x2d.is_cuda:
        return _triton_segments.mxfp8_dense(kernels.contiguous_rows(x2d))
    return old_mxfp8(x2d)


kernels.nvfp4_matrix, kernels.mxfp8_matrix = nvfp4_matrix, mxfp8_matrix
sys.argv = ["bench/quantize.py", *sys.argv[1:]]
runpy.run_path("bench/quantize.py", run_name="__main__")
