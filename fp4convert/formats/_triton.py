# mypy: disable-error-code="no-untyped-def"
# (Triton JIT functions take and return Triton tensors; Python annotations would not describe them.)
"""Triton kernels for CUDA tensors: the same arithmetic as ``_native.c`` and the torch reference.

Exactness rules for Triton: divisions use ``tl.math.div_rn`` (plain ``/`` on fp32 is approximate),
kernels launch with ``enable_fp_fusion=False`` (no mul+add -> FMA contraction), and every
conversion to E4M3 / E2M1 / E8M0 is written out in integer bit operations, so the bytes do not
depend on how a GPU generation implements ``cvt``. Imported only when Triton and a CUDA tensor
are both present.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4convert.formats import profiles
from fp4convert.formats.kernels import contiguous_rows
from fp4convert.formats.spec import MXFP8_BLOCK, NVFP4_BLOCK

_PROFILE_CODES = {"te": 0, "te-2.13": 1, "modelopt": 2}
_FLT_MAX = 3.4028234663852886e38


@triton.jit
def _abs_nan0(x):
    a = tl.abs(x)
    return tl.where(a == a, a, 0.0)


@triton.jit
def _e4m3_nonneg(d):
    """float32 >= 0 (or NaN) -> E4M3 code (int32), satfinite RNE; NaN -> 0x7F."""
    sub = (d * 512.0 + 8388608.0) - 8388608.0  # subnormal grid 2^-9, RNE via the 2^23 trick
    b = d.to(tl.uint32, bitcast=True)
    b = b + 0x7FFFF + ((b >> 20) & 1)
    normal = (((b >> 23) & 0xFF) - 120) * 8 + ((b >> 20) & 7)  # (exp - 127 + 7) << 3 | mantissa
    code = tl.where(d < 0.015625, sub.to(tl.int32), normal.to(tl.int32))
    code = tl.minimum(code, 0x7E)
    code = tl.where(d >= 448.0, 0x7E, code)
    return tl.where(d == d, code, 0x7F)


@triton.jit
def _e4m3_value(code):
    """E4M3 code (int32, 0..0x7E, non-negative) -> float32."""
    e = code >> 3
    m = code & 7
    sub = m.to(tl.float32) * 0.001953125
    normal_bits = ((e + 120) << 23) | (m << 20)
    normal = normal_bits.to(tl.uint32).to(tl.float32, bitcast=True)
    return tl.where(e == 0, sub, normal)


@triton.jit
def _e2m1_code(y, SIGNED_ZERO: tl.constexpr):
    a = tl.abs(y)
    m = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    if SIGNED_ZERO:
        neg = (y.to(tl.uint32, bitcast=True) >> 31).to(tl.int32)
    else:
        neg = (y < 0.0).to(tl.int32)
    code = m | (neg << 3)
    return tl.where(a == a, code, 7)


@triton.jit
def _row_amax_kernel(x_ptr, out_ptr, cols, ld, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * ld + offs, mask=offs < cols, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, _abs_nan0(x))
    tl.store(out_ptr + row, tl.max(acc, axis=0))


@triton.jit
def _nvfp4_kernel(
    x_ptr,
    sdec_ptr,
    mult_ptr,
    bamax_ptr,
    data_ptr,
    scale_ptr,
    rows,
    cols,
    ld,
    PROFILE: tl.constexpr,
    HAS_BAMAX: tl.constexpr,
    BR: tl.constexpr,
    NB: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r = pid_r * BR + tl.arange(0, BR)
    blk = pid_c * NB + tl.arange(0, NB)
    e = tl.arange(0, 16)
    nblocks = cols // 16
    col = blk[None, :, None] * 16 + e[None, None, :]
    rmask = r < rows
    bmask = blk < nblocks
    mask3 = rmask[:, None, None] & bmask[None, :, None]
    x = tl.load(x_ptr + r[:, None, None] * ld + col, mask=mask3, other=0.0).to(tl.float32)
    mask2 = rmask[:, None] & bmask[None, :]
    if HAS_BAMAX:
        amax = tl.load(bamax_ptr + r[:, None] * nblocks + blk[None, :], mask=mask2, other=0.0)
    else:
        amax = tl.max(_abs_nan0(x), axis=2)
    sdec = tl.load(sdec_ptr + r, mask=rmask, other=1.0)[:, None]
    mult = tl.load(mult_ptr + r, mask=rmask, other=1.0)[:, None]
    if PROFILE == 2:  # modelopt
        psc = tl.math.div_rn(amax, mult)
        psc = tl.where(psc == 0.0, 1.0, psc)
        psc = tl.minimum(tl.maximum(psc, 0.001953125), 448.0)
        sf = _e4m3_nonneg(psc)
        sf = tl.where(sdec == 0.0, 0x38, sf)
        denom = _e4m3_value(sf) * sdec
        y = tl.math.div_rn(x, denom[:, :, None])
        y = tl.where(sdec[:, :, None] == 0.0, 0.0, y)
        codes = _e2m1_code(y, False)
    else:
        if PROFILE == 0:
            d = amax * mult
        else:
            d = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)) * mult
        sf = _e4m3_nonneg(d)
        enc = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), _e4m3_value(sf) * sdec)
        enc = tl.minimum(enc, 3.4028234663852886e38)
        codes = _e2m1_code(x * enc[:, :, None], True)
    tl.store(scale_ptr + r[:, None] * nblocks + blk[None, :], sf.to(tl.uint8), mask=mask2)
    pairs = tl.reshape(codes, (BR, NB, 8, 2))
    lo, hi = tl.split(pairs)
    packed = (lo | (hi << 4)).to(tl.uint8)
    k = tl.arange(0, 8)
    out = data_ptr + r[:, None, None] * (cols // 2) + blk[None, :, None] * 8 + k[None, None, :]
    tl.store(out, packed, mask=mask2[:, :, None] & (k < 8)[None, None, :])


@triton.jit
def _mxfp8_kernel(x_ptr, data_ptr, scale_ptr, rows, cols, ld, BR: tl.constexpr, NB: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    r = pid_r * BR + tl.arange(0, BR)
    blk = pid_c * NB + tl.arange(0, NB)
    e = tl.arange(0, 32)
    nblocks = cols // 32
    col = blk[None, :, None] * 32 + e[None, None, :]
    rmask = r < rows
    bmask = blk < nblocks
    mask3 = rmask[:, None, None] & bmask[None, :, None]
    x = tl.load(x_ptr + r[:, None, None] * ld + col, mask=mask3, other=0.0).to(tl.float32)
    v = tl.max(_abs_nan0(x), axis=2) * 0.002232142956927418  # rn32(1/448) = 0x3B124925
    b = v.to(tl.uint32, bitcast=True)
    ex = ((b >> 23) & 0xFF).to(tl.int32)
    man = (b & 0x7FFFFF).to(tl.int32)
    up = tl.where(ex == 0, (man > 0x400000).to(tl.int32), ((man != 0) & (ex < 0xFE)).to(tl.int32))
    sc = tl.where(ex == 0xFF, 0xFE, ex + up)
    inv_bits = tl.where(sc == 254, 0x00400000, (254 - sc) << 23)
    inv = inv_bits.to(tl.uint32).to(tl.float32, bitcast=True)
    y = x * inv[:, :, None]
    ybits = y.to(tl.uint32, bitcast=True)
    mag = _e4m3_nonneg(tl.abs(y))
    q = tl.where(y == y, mag | ((ybits >> 24) & 0x80).to(tl.int32), 0x7F)
    tl.store(scale_ptr + r[:, None] * nblocks + blk[None, :], sc.to(tl.uint8), mask=rmask[:, None] & bmask[None, :])
    tl.store(data_ptr + r[:, None, None] * cols + col, q.to(tl.uint8), mask=mask3)


def row_amax(x2d: torch.Tensor) -> torch.Tensor:
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    out = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    if rows:
        _row_amax_kernel[(rows,)](x2d, out, cols, x2d.stride(0), BLOCK=1024, enable_fp_fusion=False)
    return out


def nvfp4_matrix(
    x2d: torch.Tensor,
    row_amax: torch.Tensor,
    profile: profiles.Profile,
    block_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    outer = profiles.outer_scales(row_amax.reshape(rows).to(x2d.device), profile)
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.uint8, device=x2d.device)
    blk = block_amax.float().contiguous() if block_amax is not None else outer.s_dec  # dummy ptr
    br, nb = 16, 16
    grid = (triton.cdiv(rows, br), triton.cdiv(cols // NVFP4_BLOCK, nb))
    if rows and cols:
        _nvfp4_kernel[grid](
            x2d,
            outer.s_dec.contiguous(),
            outer.mult.contiguous(),
            blk,
            data,
            scale,
            rows,
            cols,
            x2d.stride(0),
            PROFILE=_PROFILE_CODES[profile],
            HAS_BAMAX=block_amax is not None,
            BR=br,
            NB=nb,
            enable_fp_fusion=False,
        )
    return data, scale


def mxfp8_matrix(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x2d = contiguous_rows(x2d)
    rows, cols = x2d.shape
    data = torch.empty(rows, cols, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows, cols // MXFP8_BLOCK, dtype=torch.uint8, device=x2d.device)
    br, nb = 16, 8
    grid = (triton.cdiv(rows, br), triton.cdiv(cols // MXFP8_BLOCK, nb))
    if rows and cols:
        _mxfp8_kernel[grid](x2d, data, scale, rows, cols, x2d.stride(0), BR=br, NB=nb, enable_fp_fusion=False)
    return data, scale
