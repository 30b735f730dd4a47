"""Every bit-level constant of the formats, in one table (docs/formats.md, "The formats").

No other module defines exponent widths, biases or maxima: they import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "E2M1",
    "E4M3",
    "E8M0",
    "FLT_MAX",
    "FOUR_OVER_SIX_E4M3_MAX",
    "KERNEL_BLOCK_ROWS",
    "MXFP8_BLOCK",
    "NVFP4_BLOCK",
    "NVFP4_GLOBAL_MAX",
    "ElementFormat",
    "ScaleFormat",
]


@dataclass(frozen=True)
class ElementFormat:
    """A small floating-point element format (sign + ``ebits`` exponent + ``mbits`` mantissa)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float  # largest finite magnitude
    min_normal: float
    min_subnormal: float


@dataclass(frozen=True)
class ScaleFormat:
    """A power-of-two scale format (E8M0: exponent only, no sign, no mantissa)."""

    name: str
    ebits: int
    bias: int
    nan_code: int


#: FP4 E2M1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 at codes 0..7; bit 3 is the sign.
E2M1 = ElementFormat("e2m1", ebits=2, mbits=1, bias=1, max=6.0, min_normal=1.0, min_subnormal=0.5)
#: FP8 E4M3 ("fn": no infinities, 0x7F/0xFF are NaN): NVFP4 block scales and MXFP8 data.
E4M3 = ElementFormat("e4m3", ebits=4, mbits=3, bias=7, max=448.0, min_normal=2.0**-6, min_subnormal=2.0**-9)
#: E8M0: MXFP8 block scale 2**(e - 127); 0xFF is NaN.
E8M0 = ScaleFormat("e8m0", ebits=8, bias=127, nan_code=0xFF)

#: Elements per NVFP4 block (1x16, or 16x16 tiles for weights).
NVFP4_BLOCK = 16
#: Elements per MXFP8 block (1x32 along a row, or 32x1 along a column).
MXFP8_BLOCK = 32
#: Rows per program of the segment kernels and per entry of their block tables: one 16x16 tile's rows.
KERNEL_BLOCK_ROWS = NVFP4_BLOCK
#: E2M1 max x E4M3 max = 6 * 448: the amax that maps to the largest encodable value.
NVFP4_GLOBAL_MAX = E2M1.max * E4M3.max
#: The smaller E4M3 bound TE's 4over6 may use for the global scale (``nvfp4_e4m3_max=256``), so that
#: a map-to-4 block scale (1.5 x the map-to-6 one) never saturates at 448.
FOUR_OVER_SIX_E4M3_MAX = 256.0
#: Largest finite float32; TE clamps +inf scales to it.
FLT_MAX = 3.4028234663852886e38
