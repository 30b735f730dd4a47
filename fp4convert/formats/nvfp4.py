"""NVFP4: E2M1 values, one E4M3 scale per 16 values, an FP32 outer amax (docs/formats.md, "NVFP4").

:func:`quantize_nvfp4` is the public entry point. The arithmetic lives in
:mod:`fp4convert.formats.profiles`; this module handles shapes, scopes (which elements share one
outer amax), tiles (1x16 rows or 16x16 weight tiles), the column-wise copy, and the choice between
a fast kernel (:mod:`fp4convert.formats.kernels`) and the pure-torch reference path here, which
every kernel is tested against byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fp4convert.errors import FormatError
from fp4convert.formats import kernels, profiles
from fp4convert.formats.codecs import e2m1_decode, nan_ignoring_abs, pack_fp4, unpack_fp4
from fp4convert.formats.spec import NVFP4_BLOCK

__all__ = [
    "NVFP4Tensor",
    "dequantize_nvfp4",
    "four_over_six_choices",
    "nvfp4_matrix",
    "nvfp4_matrix_reference",
    "quantize_nvfp4",
    "row_amax",
    "tile_amax",
]

Tile = Literal["1x16", "16x16"]
Scope = Literal["tensor", "row", "expert"]
Backend = Literal["auto", "reference"]

TILES: tuple[str, ...] = get_args(Tile)
SCOPES: tuple[str, ...] = get_args(Scope)
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class NVFP4Tensor:
    """A tensor quantized to NVFP4, in the compact (unpadded, unswizzled) layout.

    Attributes:
        shape: logical shape of the source tensor ``(..., rows, cols)``.
        dtype: dtype of the source tensor.
        tile: ``"1x16"`` or ``"16x16"``.
        scope: what one outer amax covers: ``"tensor"``, ``"row"`` or ``"expert"`` (dim 0 of 3-D).
        profile: arithmetic profile (:mod:`fp4convert.formats.profiles`).
        amax: float32 raw amax: shape ``()`` (tensor), ``(M,)`` with M = product of all dims but
            the last (row), or ``(E,)`` (expert).
        data: uint8 ``(..., cols/2)``, two E2M1 codes per byte, even element in the low nibble.
        scale: uint8 E4M3 bytes ``(..., cols/16)``; ``scale[..., i, b]`` scales block b of row i.
        amax_t / data_t / scale_t: the column-wise copy, quantized from the source transposed over
            its last two dims, ``(..., cols, rows/2)`` and ``(..., cols, rows/16)``. Its amax equals
            ``amax`` except under row scope, where it is per column.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    tile: str
    scope: str
    profile: str
    amax: torch.Tensor
    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    amax_t: torch.Tensor | None = None
    data_t: torch.Tensor | None = None
    scale_t: torch.Tensor | None = None

    def global_decode_scale(self) -> torch.Tensor:
        """The float32 per-tensor decode scale a checkpoint stores as ``weight_scale_2``:
        TE's ``rn32(1 / S_enc)``, or ModelOpt's ``A / 2688`` under the modelopt profile."""
        native = kernels.outer_decode_scales(self.amax, self.profile)  # type: ignore[arg-type]
        if native is not None:
            return native
        return profiles.outer_scales(self.amax, self.profile).s_dec  # type: ignore[arg-type]


def _check_backend(backend: str) -> None:
    if backend not in get_args(Backend):
        raise FormatError(f"unknown backend {backend!r}", hint="use 'auto' or 'reference'", found=backend)


def _check_input(x: torch.Tensor, tile: str, scope: str, columnwise: bool, profile: str) -> None:
    if x.dtype not in INPUT_DTYPES:
        raise FormatError(
            f"NVFP4 input has dtype {x.dtype}, expected bfloat16, float16 or float32",
            hint="cast the tensor first (x.float())",
            found=str(x.dtype),
        )
    if x.ndim < 2:
        raise FormatError(
            f"NVFP4 input has shape {tuple(x.shape)}: at least 2 dims are needed (rows, cols)",
            hint="1-D tensors (biases, norms) stay in high precision",
            found=tuple(x.shape),
        )
    if tile not in TILES:
        raise FormatError(f"unknown NVFP4 tile {tile!r}", hint=f"use one of {TILES}", found=tile)
    if scope not in SCOPES:
        raise FormatError(f"unknown NVFP4 scope {scope!r}", hint=f"use one of {SCOPES}", found=scope)
    if scope == "expert" and x.ndim != 3:
        raise FormatError(
            f"scope='expert' needs a 3-D (experts, rows, cols) tensor, got shape {tuple(x.shape)}",
            hint="use scope='tensor' for a single expert's weight",
            found=tuple(x.shape),
        )
    if tile == "16x16" and scope == "row":
        raise FormatError(
            "16x16 tiles cannot be combined with per-row outer scales (TE forbids 2-D row-scaled NVFP4)",
            hint="use tile='1x16' for per-row scales",
        )
    if scope == "row" and columnwise and profiles.profile_spec(profile).chain == "4over6":
        raise FormatError(
            f"profile {profile!r}: a row-scaled 4over6 tensor has no column-wise copy (TE's 4over6 kernel "
            "refuses it: it does not consume the per-column amaxes)",
            hint="quantize the column-wise copy with scope='tensor', or use columnwise=False",
        )
    rows, cols = x.shape[-2], x.shape[-1]
    if cols % NVFP4_BLOCK:
        raise FormatError(
            f"shape {tuple(x.shape)}: last dim {cols} is not divisible by the NVFP4 block size 16",
            hint="keep this tensor in BF16 or pad its input dimension",
            found=tuple(x.shape),
            expected="last dim % 16 == 0",
        )
    if (tile == "16x16" or columnwise) and rows % NVFP4_BLOCK:
        raise FormatError(
            f"shape {tuple(x.shape)}: rows {rows} not divisible by 16, needed by "
            f"{'16x16 tiles' if tile == '16x16' else 'the column-wise copy'}",
            hint="use tile='1x16' rowwise only, or keep the tensor in BF16",
            found=tuple(x.shape),
            expected="rows % 16 == 0",
        )


def row_amax(x2d: torch.Tensor, *, backend: Backend = "auto") -> torch.Tensor:
    """NaN-ignoring amax of each row of ``x2d (M, N)``: float32 ``(M,)`` (TE's amax kernels skip NaN,
    keep inf). ``backend="auto"`` uses the fast kernel where there is one."""
    if backend == "auto" and kernels.has_fast_path(x2d):
        return kernels.row_amax(x2d)
    return nan_ignoring_abs(x2d).amax(dim=-1)


def _scope_amax(x: torch.Tensor, scope: str, backend: Backend) -> torch.Tensor:
    """NaN-ignoring amax per scope unit: ``()`` tensor, ``(M,)`` row, ``(E,)`` expert."""
    if scope == "tensor" and backend == "auto":
        whole = kernels.tensor_amax(x.reshape(-1, x.shape[-1]))
        if whole is not None:
            return whole
    rows = row_amax(x.reshape(-1, x.shape[-1]), backend=backend)
    if scope == "tensor":
        return rows.amax()
    if scope == "row":
        return rows
    return rows.reshape(x.shape[0], -1).amax(dim=1)  # expert


def _check_amax(amax: torch.Tensor, expected: tuple[int, ...], scope: str) -> torch.Tensor:
    amax = torch.as_tensor(amax, dtype=torch.float32)
    shape = tuple(amax.shape)
    if shape == expected:
        return amax
    if not (expected == () and amax.numel() == 1):
        raise FormatError(
            f"amax= has shape {shape}, expected {expected} for scope={scope!r}",
            hint="pass one amax per scope unit (a scalar for 'tensor', one per row or per expert)",
            found=shape,
            expected=expected,
        )
    return amax.reshape(expected)


def _per_row(amax: torch.Tensor, scope: str, shape: torch.Size) -> torch.Tensor:
    """Expand a scope amax to one value per row of the flattened ``(M, cols)`` matrix."""
    rows_total = 1
    for d in shape[:-1]:
        rows_total *= d
    if scope == "tensor":
        return amax.reshape(1).expand(rows_total)
    if scope == "row":
        return amax
    return amax.repeat_interleave(shape[-2])


def tile_amax(x: torch.Tensor) -> torch.Tensor:
    """16x16 tile amax (NaN ignored) repeated for each of the tile's 16 rows: ``(M, cols/16)``, with
    M the product of all dims but the last (rows % 16 == 0)."""
    a = nan_ignoring_abs(x).reshape(-1, NVFP4_BLOCK, x.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    tiles = a.amax(dim=(1, 3))
    return tiles.repeat_interleave(NVFP4_BLOCK, dim=0)


def _reference_matrix(
    x2d: torch.Tensor, row_amax: torch.Tensor, profile: profiles.Profile, tile: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    rows, cols = x2d.shape
    blocks = x2d.float().reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    block_amax = tile_amax(x2d) if tile == "16x16" else nan_ignoring_abs(blocks).amax(dim=-1)
    outer = profiles.outer_scales(row_amax.reshape(rows, 1), profile)
    tile_rows = NVFP4_BLOCK if tile == "16x16" else 1
    codes, scale, map4 = profiles.quantize_blocks(blocks, block_amax, outer, profile, tile_rows=tile_rows)
    return pack_fp4(codes.reshape(rows, cols)), scale, map4


def nvfp4_matrix_reference(
    x2d: torch.Tensor, row_amax: torch.Tensor, profile: profiles.Profile, *, tile: Tile = "1x16"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``x2d (M, N)`` in 16-element blocks: the pure-torch reference.

    Args:
        x2d: bf16/fp16/fp32 matrix, N divisible by 16 (M too for 16x16 tiles).
        row_amax: float32 ``(M,)`` outer amax for each row (already expanded from its scope).
        profile: arithmetic profile.
        tile: ``"1x16"``, or ``"16x16"``: each block takes its 16x16 tile's amax (and under 4over6
            the tile's 16 rows make one choice).

    Returns:
        ``(data (M, N/2) uint8, scale (M, N/16) uint8)``.
    """
    data, scale, _ = _reference_matrix(x2d, row_amax, profile, tile)
    return data, scale


def _block_amax_for_kernel(x2d: torch.Tensor, tile: str) -> torch.Tensor | None:
    return kernels.tile_amax(x2d) if tile == "16x16" else None


def nvfp4_matrix(
    x2d: torch.Tensor,
    row_amax: torch.Tensor,
    profile: profiles.Profile,
    *,
    tile: Tile = "1x16",
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nvfp4_matrix_reference` through the fastest exact path for the device (same bytes);
    the opt-in mxfp4-cast profile has no kernel and always takes the reference path."""
    if _has_kernel(x2d, profile, backend):
        return kernels.nvfp4_matrix(x2d, row_amax, profile, tile16=tile == "16x16")
    return nvfp4_matrix_reference(x2d, row_amax, profile, tile=tile)


def _has_kernel(x2d: torch.Tensor, profile: profiles.Profile, backend: Backend) -> bool:
    return backend == "auto" and kernels.has_fast_path(x2d) and profiles.profile_spec(profile).chain != "pow2"


def _quantize_rowwise(
    x: torch.Tensor, amax: torch.Tensor, scope: str, tile: Tile, profile: profiles.Profile, backend: Backend
) -> tuple[torch.Tensor, torch.Tensor]:
    cols = x.shape[-1]
    matrix = x.dim() == 2  # (the public calls are host-bound on a GPU: no views where none is needed)
    x2d = x if matrix else x.reshape(-1, cols)
    if _has_kernel(x2d, profile, backend):  # one amax per scope unit: the kernel expands it, not torch
        rows = x2d.shape[0]
        if scope == "tensor":
            unit_rows = max(rows, 1)
        else:
            unit_rows = 1 if scope == "row" else max(rows // max(x.shape[0], 1), 1)
        data, scale = kernels.nvfp4_units(x2d, amax, unit_rows, profile, tile16=tile == "16x16")
    else:
        data, scale = nvfp4_matrix(x2d, _per_row(amax, scope, x.shape), profile, tile=tile, backend=backend)
    if matrix:
        return data, scale
    lead = tuple(x.shape[:-1])
    return data.reshape(*lead, cols // 2), scale.reshape(*lead, cols // NVFP4_BLOCK)


def _outer_amax(x: torch.Tensor, scope: str, amax: torch.Tensor | float | None, backend: Backend) -> torch.Tensor:
    if amax is None:
        return _scope_amax(x, scope, backend)
    if scope == "tensor":
        expected: tuple[int, ...] = ()
    else:
        expected = (x.numel() // x.shape[-1],) if scope == "row" else (x.shape[0],)
    if isinstance(amax, (int, float)):
        # a fill on the device, not torch.as_tensor: a CUDA tensor built from a Python number is a
        # blocking copy from pageable host memory, and stalls every call issued behind it
        return _check_amax(torch.full((), amax, dtype=torch.float32, device=x.device), expected, scope)
    return _check_amax(torch.as_tensor(amax, device=x.device), expected, scope)


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    tile: Tile = "1x16",
    scope: Scope = "tensor",
    amax: torch.Tensor | float | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
    profile: profiles.Profile = "te",
    backend: Backend = "auto",
) -> NVFP4Tensor:
    """Quantize ``x`` to NVFP4, byte-identical to TransformerEngine's NVFP4 quantizer.

    Args:
        x: bf16, fp16 or fp32 tensor of 2 or more dims; the last dim is the block (contraction)
            axis and must be divisible by 16. CPU or CUDA: both give the same bytes.
        tile: ``"1x16"`` (16 consecutive values of a row) or ``"16x16"`` (TE's 2-D weight tiles:
            one scale per 16x16 tile, repeated for its 16 rows).
        scope: which elements share one outer amax: the whole ``"tensor"``, each ``"row"``
            (per-token activations; TE ``row_scaled_nvfp4``), or each ``"expert"`` of a 3-D tensor.
        amax: impose the outer amax instead of measuring it, e.g. ``max(amax(gate), amax(up))``
            so fused siblings share one scale. Shape ``()``, ``(M,)`` or ``(E,)`` by scope.
        rowwise: produce ``data`` / ``scale``.
        columnwise: also produce ``data_t`` / ``scale_t``, quantized from ``x`` transposed over its
            last two dims (never derived from the row-wise bytes, as in TE).
        profile: ``"te"`` (TE >= 2.14, FlashInfer exact mode), ``"te-2.13"``, ``"modelopt"``, or
            TE's 4over6 ``"te-4over6-mae"``, ``"te-4over6-mse"`` (global E4M3 bound 448) and
            ``"te-4over6-mae-256"``, ``"te-4over6-mse-256"`` (bound 256); see
            :mod:`fp4convert.formats.profiles`.
        backend: ``"auto"`` picks the fastest exact kernel for the device; ``"reference"`` forces
            the pure-torch path (the specification the kernels are tested against).

    Returns:
        An :class:`NVFP4Tensor` in the compact layout (see :mod:`fp4convert.formats.layouts`).

    Raises:
        FormatError: wrong dtype, too few dims, a dim not divisible by the block, an unknown
            tile/scope/profile, an ``amax`` of the wrong shape, or a combination TE refuses
            (16x16 tiles with row scope; a 4over6 row-scaled tensor with a column-wise copy).

    Example:
        >>> import torch
        >>> from fp4convert import quantize_nvfp4
        >>> q = quantize_nvfp4(torch.ones(2, 16, dtype=torch.bfloat16))
        >>> q.data[0, 0].item(), q.scale[0, 0].item(), q.amax.item()
        (119, 126, 1.0)
    """
    profile = profiles.check_profile(profile)
    _check_input(x, tile, scope, columnwise, profile)
    _check_backend(backend)
    amax_t = _outer_amax(x, scope, amax, backend)
    data = scale = data_t = scale_t = col_amax = None
    if rowwise:
        data, scale = _quantize_rowwise(x, amax_t, scope, tile, profile, backend)
    if columnwise:
        xt = x.transpose(-1, -2).contiguous()
        col_amax = _scope_amax(xt, "row", backend) if scope == "row" else amax_t
        data_t, scale_t = _quantize_rowwise(xt, col_amax, scope, tile, profile, backend)
    return NVFP4Tensor(
        shape=tuple(x.shape),
        dtype=x.dtype,
        tile=tile,
        scope=scope,
        profile=profile,
        amax=amax_t,
        data=data,
        scale=scale,
        amax_t=col_amax,
        data_t=data_t,
        scale_t=scale_t,
    )


def four_over_six_choices(
    x: torch.Tensor,
    *,
    profile: profiles.Profile,
    tile: Tile = "1x16",
    scope: Scope = "tensor",
    amax: torch.Tensor | float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Which candidate each row-wise block of ``x`` takes under a 4over6 profile.

    Arguments as :func:`quantize_nvfp4`. Returns a bool tensor ``(..., rows, cols/16)``: True where
    the block (for 16x16 tiles: its tile, repeated over the tile's rows) took map-to-4. The bytes
    :func:`quantize_nvfp4` writes are exactly that candidate's.

    Example:
        >>> import torch
        >>> x = torch.tensor([[4.0] + [1.0] * 15, [6.0] + [0.1] * 15])
        >>> four_over_six_choices(x, profile="te-4over6-mse").flatten().tolist()
        [True, False]
    """
    profile = profiles.check_profile(profile)
    if profiles.profile_spec(profile).chain != "4over6":
        raise FormatError(
            f"profile {profile!r} has no candidate choice", hint="use a te-4over6-* profile", found=profile
        )
    _check_input(x, tile, scope, False, profile)
    _check_backend(backend)
    cols = x.shape[-1]
    x2d = x.reshape(-1, cols)
    amax_rows = _per_row(_outer_amax(x, scope, amax, backend), scope, x.shape)
    if backend == "auto" and kernels.has_fast_path(x2d):
        choice = torch.empty(x2d.shape[0], cols // NVFP4_BLOCK, dtype=torch.uint8, device=x.device)
        kernels.nvfp4_matrix(x2d, amax_rows, profile, _block_amax_for_kernel(x2d, tile), choice=choice)
        map4 = choice.bool()
    else:
        _, _, picked = _reference_matrix(x2d, amax_rows, profile, tile)
        assert picked is not None
        map4 = picked
    return map4.reshape(*x.shape[:-1], cols // NVFP4_BLOCK)


def dequantize_nvfp4(q: NVFP4Tensor, *, dtype: torch.dtype = torch.float32, columnwise: bool = False) -> torch.Tensor:
    """Dequantize an :class:`NVFP4Tensor` (TE's ``dequantize_fp4_kernel`` arithmetic).

    Args:
        q: the quantized tensor.
        dtype: output dtype (values are computed in float32 and cast once).
        columnwise: dequantize the column-wise copy and transpose it back to ``q.shape``.

    Returns:
        A tensor of ``q.shape``.
    """
    data, scale, amax = (q.data_t, q.scale_t, q.amax_t) if columnwise else (q.data, q.scale, q.amax)
    if data is None or scale is None or amax is None:
        raise FormatError(
            f"this NVFP4Tensor has no {'column' if columnwise else 'row'}-wise copy",
            hint=f"quantize with {'columnwise' if columnwise else 'rowwise'}=True",
        )
    shape = list(q.shape)
    if columnwise:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    cols = shape[-1]
    values = e2m1_decode(unpack_fp4(data)).reshape(-1, cols // NVFP4_BLOCK, NVFP4_BLOCK)
    row_amax = _per_row(amax, "row" if (columnwise and q.scope == "row") else q.scope, torch.Size(shape))
    outer = profiles.outer_scales(row_amax.reshape(-1, 1), q.profile)  # type: ignore[arg-type]
    factor = profiles.dequant_block_scale(scale.reshape(-1, cols // NVFP4_BLOCK), outer, q.profile)  # type: ignore[arg-type]
    out = (values * factor.unsqueeze(-1)).reshape(shape)
    if columnwise:
        out = out.transpose(-1, -2)
    return out.to(dtype)
