# mypy: disable-error-code="no-untyped-def"
# (Triton JIT functions take and return Triton tensors; Python annotations would not describe them.)
"""Triton kernels for one CUDA matrix whose scales are given: the per-row and 16x16-tile amaxes and
4over6 NVFP4 (te / te-2.13 / modelopt NVFP4 and MXFP8 run in :mod:`fp4convert.formats._triton_segments`,
one launch per matrix or group). The same arithmetic as ``_native.c`` and the torch reference.

Exactness rules for Triton: divisions use ``tl.math.div_rn`` (plain ``/`` on fp32 is approximate),
kernels launch with ``enable_fp_fusion=False`` (no mul+add -> FMA contraction), every conversion
to E4M3 / E2M1 / E8M0 is written out in integer bit operations, so the bytes do not depend on how
a GPU generation implements ``cvt``, and sums whose order matters (the 4over6 errors) are spelled
out element by element. Only :mod:`fp4convert.formats.kernels` calls this module, with contiguous
rows and the profile's scales already computed (docs/formats.md, "Kernels").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fp4convert.formats import profiles
from fp4convert.formats.spec import NVFP4_BLOCK


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
def _tile_amax_kernel(x_ptr, out_ptr, cols, ld, NB: tl.constexpr):
    # One 16-row group x NB tiles: the tile maximum, written to each of the tile's 16 rows.
    r = tl.program_id(0) * 16 + tl.arange(0, 16)
    blk = tl.program_id(1) * NB + tl.arange(0, NB)
    e = tl.arange(0, 16)
    nblocks = cols // 16
    bmask = blk < nblocks
    col = blk[None, :, None] * 16 + e[None, None, :]
    x = tl.load(x_ptr + r[:, None, None] * ld + col, mask=bmask[None, :, None], other=0.0).to(tl.float32)
    tile = tl.max(tl.max(_abs_nan0(x), axis=2), axis=0)  # max is exact in any order
    out = tl.broadcast_to(tile[None, :], (16, NB))
    tl.store(out_ptr + r[:, None] * nblocks + blk[None, :], out, mask=bmask[None, :])


@triton.jit
def _e2m1_value(code):
    """E2M1 code (int32 0..15) -> float32 value with its sign."""
    m = code & 7
    mf = m.to(tl.float32)
    mag = tl.where(m <= 4, mf * 0.5, tl.where(m == 7, 6.0, mf - 2.0))
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def _row_of(err, rows, j):
    """Row ``j`` of ``err [16, NB]`` (a masked sum of one value and zeros: exact)."""
    return tl.sum(tl.where(rows[:, None] == j, err, 0.0), axis=0)


@triton.jit
def _tile_sum(err, rows):
    """The 16 row errors of a tile summed in TE's warp-reduction order -> ``[NB]``."""
    t0 = _row_of(err, rows, 0) + _row_of(err, rows, 8)
    t1 = _row_of(err, rows, 1) + _row_of(err, rows, 9)
    t2 = _row_of(err, rows, 2) + _row_of(err, rows, 10)
    t3 = _row_of(err, rows, 3) + _row_of(err, rows, 11)
    t4 = _row_of(err, rows, 4) + _row_of(err, rows, 12)
    t5 = _row_of(err, rows, 5) + _row_of(err, rows, 13)
    t6 = _row_of(err, rows, 6) + _row_of(err, rows, 14)
    t7 = _row_of(err, rows, 7) + _row_of(err, rows, 15)
    u0 = t0 + t4
    u1 = t1 + t5
    u2 = t2 + t6
    u3 = t3 + t7
    return (u0 + u2) + (u1 + u3)


@triton.jit
def _nvfp4_4over6_kernel(
    x_ptr,
    amax_ptr,
    senc_ptr,
    sdec_ptr,
    bamax_ptr,
    data_ptr,
    scale_ptr,
    choice_ptr,
    rows,
    cols,
    ld,
    denom,
    MSE: tl.constexpr,
    TILE2D: tl.constexpr,
    HAS_BAMAX: tl.constexpr,
    HAS_CHOICE: tl.constexpr,
    NB: tl.constexpr,
):
    # 16 rows (one 16x16 tile row-group when TILE2D) x NB blocks; element i of every block is one
    # [16, NB] tensor, so each block's error is accumulated in element order like the reference.
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    local = tl.arange(0, 16)
    r = pid_r * 16 + local
    blk = pid_c * NB + tl.arange(0, NB)
    nblocks = cols // 16
    mask2 = (r < rows)[:, None] & (blk < nblocks)[None, :]
    base_ptr = x_ptr + r[:, None] * ld + blk[None, :] * 16
    if HAS_BAMAX:
        amax = tl.load(bamax_ptr + r[:, None] * nblocks + blk[None, :], mask=mask2, other=0.0)
    else:
        amax = tl.zeros((16, NB), dtype=tl.float32)
        for i in tl.static_range(16):
            amax = tl.maximum(amax, _abs_nan0(tl.load(base_ptr + i, mask=mask2, other=0.0).to(tl.float32)))
    a_row = tl.load(amax_ptr + r, mask=r < rows, other=0.0)[:, None]
    senc = tl.load(senc_ptr + r, mask=r < rows, other=1.0)[:, None]
    sdec = tl.load(sdec_ptr + r, mask=r < rows, other=1.0)[:, None]
    base = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)) * senc
    sf6 = _e4m3_nonneg(base)
    sf4 = _e4m3_nonneg(base * 1.5)
    sfv4 = _e4m3_value(sf4)
    sfv6 = _e4m3_value(sf6)
    one = tl.full(amax.shape, 1.0, tl.float32)
    enc4 = tl.minimum(tl.math.div_rn(one, sfv4 * sdec), 3.4028234663852886e38)
    enc6 = tl.minimum(tl.math.div_rn(one, sfv6 * sdec), 3.4028234663852886e38)
    dn = tl.full(amax.shape, denom, tl.float32)
    err4 = tl.zeros((16, NB), dtype=tl.float32)
    err6 = tl.zeros((16, NB), dtype=tl.float32)
    for i in tl.static_range(16):
        x = tl.load(base_ptr + i, mask=mask2, other=0.0).to(tl.float32)
        d4 = tl.math.div_rn((_e2m1_value(_e2m1_code(x * enc4, True)) * sfv4) * a_row, dn) - x
        d6 = tl.math.div_rn((_e2m1_value(_e2m1_code(x * enc6, True)) * sfv6) * a_row, dn) - x
        if MSE:
            err4 = err4 + d4 * d4
            err6 = err6 + d6 * d6
        else:
            err4 = err4 + tl.abs(d4)
            err6 = err6 + tl.abs(d6)
    if TILE2D:
        pick4 = tl.broadcast_to((_tile_sum(err4, local) < _tile_sum(err6, local))[None, :], (16, NB))
    else:
        pick4 = err4 < err6
    enc = tl.where(pick4, enc4, enc6)
    tl.store(scale_ptr + r[:, None] * nblocks + blk[None, :], tl.where(pick4, sf4, sf6).to(tl.uint8), mask=mask2)
    if HAS_CHOICE:
        tl.store(choice_ptr + r[:, None] * nblocks + blk[None, :], pick4.to(tl.uint8), mask=mask2)
    out = data_ptr + r[:, None] * (cols // 2) + blk[None, :] * 8
    for k in tl.static_range(8):
        lo = _e2m1_code(tl.load(base_ptr + 2 * k, mask=mask2, other=0.0).to(tl.float32) * enc, True)
        hi = _e2m1_code(tl.load(base_ptr + 2 * k + 1, mask=mask2, other=0.0).to(tl.float32) * enc, True)
        tl.store(out + k, (lo | (hi << 4)).to(tl.uint8), mask=mask2)


def row_amax(x2d: torch.Tensor) -> torch.Tensor:
    rows, cols = x2d.shape
    out = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    if rows:
        _row_amax_kernel[(rows,)](x2d, out, cols, x2d.stride(0), BLOCK=1024, enable_fp_fusion=False)
    return out


def tile_amax(x2d: torch.Tensor) -> torch.Tensor:
    rows, cols = x2d.shape
    out = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.float32, device=x2d.device)
    nb = 16
    if rows and cols:
        grid = (rows // 16, triton.cdiv(cols // NVFP4_BLOCK, nb))
        _tile_amax_kernel[grid](x2d, out, cols, x2d.stride(0), NB=nb, enable_fp_fusion=False)
    return out


def nvfp4_4over6_matrix(
    x2d: torch.Tensor,
    outer: profiles.OuterScales,
    spec: profiles.ProfileSpec,
    block_amax: torch.Tensor | None,
    tile_rows: int,
    choice: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """4over6 NVFP4 of a contiguous-row matrix (the other chains: ``_triton_segments.nvfp4_dense``)."""
    rows, cols = x2d.shape
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows, cols // NVFP4_BLOCK, dtype=torch.uint8, device=x2d.device)
    if not (rows and cols):
        return data, scale
    s_dec = outer.s_dec.contiguous()
    blk = block_amax if block_amax is not None else s_dec  # dummy pointer when absent
    nb = 16
    grid = (triton.cdiv(rows, 16), triton.cdiv(cols // NVFP4_BLOCK, nb))
    _nvfp4_4over6_kernel[grid](
        x2d, outer.amax.contiguous(), outer.s_enc.contiguous(), s_dec, blk, data, scale,
        choice if choice is not None else scale, rows, cols, x2d.stride(0), spec.global_max,
        MSE=spec.error == "mse", TILE2D=tile_rows == NVFP4_BLOCK, HAS_BAMAX=block_amax is not None,
        HAS_CHOICE=choice is not None, NB=nb, enable_fp_fusion=False,
    )  # fmt: skip
    return data, scale
