"""NVFP4 "4over6": two candidate block scales per block, the one with the lower error wins.

TransformerEngine >= 2.17 (``NVFP4QuantizerRef(nvfp4_use_4over6=True)`` and its kernel
``quantize_4over6_nvfp4.cuh``) quantizes each block twice and keeps the better one
(docs/formats.md, "4over6"). With the tensor's encode scale ``S_enc = rn32(6 * B / A)``
(``B`` = 448 or 256, the E4M3 bound of the global scale) and the block amax ``a_b``:

* ``base = rn32(rn32(a_b / 6) * S_enc)`` (divide by 6 first, as TE <= 2.13 did for plain NVFP4);
* map-to-6: scale byte ``sf6 = E4M3(base)``; map-to-4: ``sf4 = E4M3(rn32(base * 1.5))``, so the
  block's largest value lands on E2M1 4 instead of 6 (with ``B = 448`` it saturates at 448);
* each candidate encodes as plain NVFP4: ``y = x * min(rn32(1 / rn32(sf * S_dec)), FLT_MAX)``;
* each candidate's error is measured in the input domain, element by element in order:
  ``d = rn32(rn32(rn32(rn32(q * sf) * A) / (6 * B)) - x)`` and ``err = rn32(err + |d|)`` (MAE) or
  ``rn32(err + rn32(d * d))`` (MSE), starting from 0;
* 16x16 tiles: the 16 row errors of a tile are summed as TE's warp reduction does
  (rows ``i + 8``, then ``+ 4``, ``+ 2``, ``+ 1``), one choice per tile;
* ``err4 < err6`` picks map-to-4; a tie, or a NaN error (a NaN input), picks map-to-6.

This module is the pure-torch reference; ``_native.c`` and ``_triton.py`` implement the same
operations and are tested against it byte for byte. TE's optional fast-math error path
(``nvfp4_4over6_err_use_fast_math``, FP16 products) is not reproduced.
"""

from __future__ import annotations

from typing import Literal

import torch

from fp4convert.formats.codecs import e2m1_decode, e2m1_encode, e4m3_decode, e4m3_encode, scalar_like
from fp4convert.formats.spec import E2M1, FLT_MAX, NVFP4_BLOCK

__all__ = ["ErrorMode", "candidate_scale_bytes", "quantize_blocks", "tile_error_sum"]

ErrorMode = Literal["mae", "mse"]

#: How far map-to-4 widens the block scale: 6 / 4.
MAP4_EXPANSION = 1.5


def candidate_scale_bytes(block_amax: torch.Tensor, s_enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 bytes of the two candidates ``(sf4, sf6)`` for block amaxes ``[..., nb]`` and ``S_enc [..., 1]``."""
    base = torch.div(block_amax, scalar_like(E2M1.max, block_amax)) * s_enc
    sf6 = e4m3_encode(base)
    sf4 = e4m3_encode(base * scalar_like(MAP4_EXPANSION, base))
    return sf4, sf6


def _encode(blocks: torch.Tensor, sf: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    enc = torch.div(scalar_like(1.0, blocks), e4m3_decode(sf) * s_dec).clamp_max(FLT_MAX)
    return e2m1_encode(blocks * enc.unsqueeze(-1))


def _block_error(
    blocks: torch.Tensor, codes: torch.Tensor, sf: torch.Tensor, amax: torch.Tensor, denom: torch.Tensor, mode: str
) -> torch.Tensor:
    """Sum over each block's 16 elements, in element order, of the candidate's error."""
    values = e2m1_decode(codes) * e4m3_decode(sf).unsqueeze(-1)
    values = torch.div(values * amax.unsqueeze(-1), denom)
    diff = values - blocks
    per_element = diff * diff if mode == "mse" else diff.abs()
    err = torch.zeros(blocks.shape[:-1], dtype=torch.float32, device=blocks.device)
    for i in range(NVFP4_BLOCK):  # sequential, as the kernels accumulate
        err = err + per_element[..., i]
    return err


def tile_error_sum(err: torch.Tensor) -> torch.Tensor:
    """Sum the errors of each group of 16 rows ``[rows, nb] -> [rows / 16, nb]`` in TE's tree order
    (``__shfl_down_sync`` offsets 8, 4, 2, 1: the same as the reference's halving sums)."""
    rows = err.reshape(-1, NVFP4_BLOCK, err.shape[-1])
    rows = rows[:, 0:8] + rows[:, 8:16]
    rows = rows[:, 0:4] + rows[:, 4:8]
    rows = rows[:, 0:2] + rows[:, 2:4]
    return rows[:, 0] + rows[:, 1]


def quantize_blocks(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    amax: torch.Tensor,
    s_enc: torch.Tensor,
    s_dec: torch.Tensor,
    *,
    mode: ErrorMode,
    global_max: float,
    tile_rows: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize float32 ``blocks [rows, nb, 16]`` with 4over6 candidate selection.

    Args:
        blocks: the values, widened exactly to float32.
        block_amax: ``[rows, nb]`` NaN-ignoring block (or 16x16 tile) amaxes.
        amax, s_enc, s_dec: ``[rows, 1]`` outer amax ``A``, ``S_enc`` and ``S_dec`` of each row.
        mode: ``"mae"`` or ``"mse"``.
        global_max: ``6 * B`` (2688 or 1536), the error's denominator.
        tile_rows: 1 (1x16 blocks) or 16 (16x16 tiles: one choice per tile; rows % 16 == 0).

    Returns:
        ``(codes [rows, nb, 16] uint8, scale [rows, nb] uint8, map4 [rows, nb] bool)``; ``map4``
        is True where the block (tile) took the map-to-4 candidate.
    """
    sf4, sf6 = candidate_scale_bytes(block_amax, s_enc)
    codes4 = _encode(blocks, sf4, s_dec)
    codes6 = _encode(blocks, sf6, s_dec)
    denom = scalar_like(global_max, blocks)
    err4 = _block_error(blocks, codes4, sf4, amax, denom, mode)
    err6 = _block_error(blocks, codes6, sf6, amax, denom, mode)
    if tile_rows == NVFP4_BLOCK:
        map4 = (tile_error_sum(err4) < tile_error_sum(err6)).repeat_interleave(NVFP4_BLOCK, dim=0)
    else:
        map4 = err4 < err6
    codes = torch.where(map4.unsqueeze(-1), codes4, codes6)
    return codes, torch.where(map4, sf4, sf6), map4
