# mypy: disable-error-code="no-untyped-def"
# (Triton JIT functions take and return Triton tensors; Python annotations would not describe them.)
"""Triton kernels over row segments: many 2-D sources quantized by one launch, read in place.

A *segment* is a run of rows of one source tensor (its address, row stride and row count are
loaded from small device tables), written at a given row of one output matrix; a *unit* is what
one outer amax covers (a shared-scale group of segments). A launch takes a table of
``(segment, first row)`` blocks, so tensors of different sizes and addresses share one grid, and
a single dense tensor is the one-segment case. The arithmetic is ``_triton.py``'s, byte for byte,
written with fewer instructions per element: NaN-ignoring maxima are ``max`` (which skips NaN),
the E4M3 rounding works on the float's bits (round-to-nearest-even of the mantissa by an integer
add), the E2M1 rounding by one float add (``_e2m1``), outer scales are computed in the kernel from
the unit's amax with ``div_rn`` (the same IEEE operations as
:func:`fp4convert.formats.profiles.outer_scales`), and 16x16 tile amaxes come from the rows each
program holds. Launches use ``enable_fp_fusion=False``.
"""

from __future__ import annotations

import functools
import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from fp4convert.formats.spec import KERNEL_BLOCK_ROWS as BLOCK_ROWS

FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _absmax(x):
    # max(|x|) of the last axis ignoring NaN: ``max`` (maxnum, PTX max.f32) returns the other
    # operand when one is NaN, as TE's fmaxf does; only an all-NaN block gives NaN, and its amax is 0
    m = tl.max(tl.abs(x), axis=-1)
    return tl.where(m == m, m, 0.0)


@triton.jit
def _absmax2(x):
    # ``_absmax`` of the last two axes, the all-NaN test once: a max of maxima skips NaN the same way
    return _absmax(tl.max(tl.abs(x), axis=-1))


#: Triton's interpreter (read once, as Triton does): it runs kernels on CPU tensors with numpy, whose
#: ``minimum`` returns NaN where PTX ``min.f32`` (C's ``fminf``) returns the other operand
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_NUMPY_MIN = tl.constexpr(_INTERPRETED)

#: the te NVFP4 kernels read bf16 as 32-bit words and round them by PTX (``_bf16_amax``,
#: ``_e2m1_word``: 9% fewer instructions per column step, 56 registers instead of 71; bench/kernel_sass.py)
#: where :func:`word_path` allows. Alone it was not faster on an H100 (65.6 against 63.6 us): the grid of a large
#: weight then ends 0.02 waves past its third (the fewer registers let 9 programs share an SM instead
#: of 7). With the persistent launch (:data:`PERSISTENT_BY_DEFAULT`) the dense te kernel takes 57.0
#: against 63.6 us, 16x16 62.9 against 68.2 us, amax + quantize 99.0 against 103.5 us (the persistent
#: launch alone: 61.1, 66.5, 104.1; bench/results/nvfp4-ab-h100-stop36.txt). ``FP4CONVERT_BF16_WORDS=0``
#: (read once, at import) turns it off.
BF16_WORDS_BY_DEFAULT = True
_BF16_WORDS = os.environ.get("FP4CONVERT_BF16_WORDS", "1" if BF16_WORDS_BY_DEFAULT else "0") == "1"

#: one matrix under one outer amax (``quantize_nvfp4``'s tensor scope) quantized by a persistent launch
#: (``_nvfp4_tensor_kernel``, :func:`launch_persistent`): as many programs as the SMs hold at once,
#: each taking one column step after another, instead of a grid of 4-step programs whose last wave
#: may leave most SMs idle (a 4096x14336 weight: 3584 programs = 3.02 waves of the 9 per SM that the
#: word path's 56 registers allow, 3.88 waves of 7 without it; bench/device/wave_lab.py: persistent
#: with 8 or 9 programs per SM 57.7 / 57.2 us, 4 per SM 70.7 us). ``FP4CONVERT_PERSISTENT=0`` (read
#: once, at import) turns it off.
PERSISTENT_BY_DEFAULT = True
_PERSISTENT = os.environ.get("FP4CONVERT_PERSISTENT", "1" if PERSISTENT_BY_DEFAULT else "0") == "1"
#: the NVFP4 loops read their next column step before they encode the current one (``PREFETCH`` of
#: ``_nvfp4_tensor_kernel`` and ``_nvfp4_seg_kernel``), for a pass bound by latency rather than bytes
#: (an H200 and an H100 took the same ~62 us on a 4096x14336 weight, stop 31). Off: the values read
#: ahead cost 10 registers (66: 7 programs per SM instead of 9), and on an H100 the te 1x16 pass took
#: 64.9-65.3 against 56.9 us, the 36-layer LiveExporter 46.9 against 44.5 ms
#: (bench/results/nvfp4-ab-h100-stop37.txt). ``FP4CONVERT_PREFETCH=1`` (read once, at import) turns it on.
PREFETCH_BY_DEFAULT = False
_PREFETCH = os.environ.get("FP4CONVERT_PREFETCH", "1" if PREFETCH_BY_DEFAULT else "0") == "1"
#: the tensor-scope amax + quantize pair as programmatic dependent launches (sm_90 and later):
#: ``FP4CONVERT_PDL`` 2 (the default) launches the amax pass before the zero fill of its output ends
#: (it waits for the fill only before its atomic max) and the quantize pass before the amax pass ends
#: (it waits in its first instruction), so each launch overlaps the tail of the kernel before; 1 only
#: the quantize pass, 0 neither. An H100, 4096x14336 bf16, amax + quantize replayed in a CUDA graph:
#: 91.3-91.9 us with 2 against 92.2-93.0 us with 0, same bytes (bench/results/nvfp4-ab-h100-stop44.txt).
#: A/B knobs that did not help there (read once, at import; off by default):
#: ``FP4CONVERT_L2_KEEP_MB`` the amax pass reads its last that many MiB with L2 evict_last (what the
#: reversed quantize pass reads first: 93.7-95.5 us); ``FP4CONVERT_IN_POLICY`` / ``FP4CONVERT_OUT_POLICY``
#: the quantize pass's load / store eviction policy ("evict_first", "evict_last"). Pipelining the loops
#: by ``tl.range(num_stages=3)`` (loads copied into shared memory by cp.async) took the quantize
#: pass from 55.5 to 98 us and was removed.
PDL_BY_DEFAULT = 2
_PDL = int(os.environ.get("FP4CONVERT_PDL", str(PDL_BY_DEFAULT)))
_L2_KEEP = int(os.environ.get("FP4CONVERT_L2_KEEP_MB", "0")) << 20
_IN_POLICY = os.environ.get("FP4CONVERT_IN_POLICY", "")
_OUT_POLICY = os.environ.get("FP4CONVERT_OUT_POLICY", "")
#: programs of a persistent launch under Triton's interpreter (CPU tensors, no SMs): few enough that
#: each takes several steps, an uneven share included
INTERPRETED_PROGRAMS = 3


@triton.jit
def _min6(v):
    """``min(v, 6.0)``, NaN -> 6.0 (``fminf``: one instruction on the GPU, written out for numpy)."""
    if _NUMPY_MIN:
        return tl.where(v == v, tl.minimum(v, 6.0), 6.0)
    return tl.minimum(v, 6.0)


@triton.jit
def _e2m1(y, SIGNED_ZERO: tl.constexpr):
    """float32 -> E2M1 code (int32), the same bytes as ``_triton._e2m1_code``, in ten operations.
    |y| is clamped to 6.0 by ``fminf`` (saturation; NaN lands there too: TE encodes NaN as +6), then
    one float add rounds it: adding ``2^(22+e)`` (``e`` = 0 below 2, else |y|'s binade) leaves a grid
    of ``2^(e-1)``, the E2M1 spacing, with ties to even; ``2e`` more units in that constant make the
    sum's low bits the code itself (0-7). The sign comes from ``fminf(y, 6)``, whose sign bit is y's
    except for NaN (+6). Fewer integer operations, which Hopper issues at half the float rate
    (bench/kernel_sass.py counts them); tests/formats/test_cuda.py checks all 2^32 patterns."""
    a = _min6(tl.abs(y))  # |y| at most 6.0, NaN -> 6.0
    ab = a.to(tl.uint32, bitcast=True)
    u = tl.maximum(ab, 0x3F800000) & 0x7F800000  # 2^e as bits: (127 + e) << 23, e in {0, 1, 2}
    c = u + (u >> 22) + (0x0B000000 - 254)  # 2^(22+e) + 2e * 2^(e-1) as bits: (149 + e) << 23 | 2e
    t = (a + c.to(tl.float32, bitcast=True)).to(tl.uint32, bitcast=True)
    m = t - u - 0x0B000000  # the sum's units above 2^(22+e): the rounded |y| in steps, plus 2e
    if SIGNED_ZERO:  # the sign bit into bit 3 (-0.0 too); NaN (of either sign) encodes as +6
        return (m | ((_min6(y).to(tl.uint32, bitcast=True) >> 28) & 8)).to(tl.int32)
    return (m | ((y < 0.0).to(tl.uint32) << 3)).to(tl.int32)


@triton.jit
def _e4m3_nonneg(d):
    """float32 >= 0 (or NaN) -> E4M3 code (int32), satfinite RNE; NaN -> 0x7F (``_triton._e4m3_nonneg``)."""
    b = d.to(tl.uint32, bitcast=True)
    normal = ((b + 0x7FFFF + ((b >> 20) & 1)) >> 20) - 960  # (exp - 120) << 3 | mantissa, rounded
    sub = ((d * 512.0) + 8388608.0).to(tl.uint32, bitcast=True) - 0x4B000000  # grid 2^-9
    code = tl.minimum(tl.where(d < 0.015625, sub, normal), 0x7E)
    return tl.where(b > 0x7F800000, 0x7F, code).to(tl.int32)


@triton.jit
def _e4m3_scale_code(d, HW: tl.constexpr):
    """``_e4m3_nonneg(d)`` for any float32 ``d`` (an NVFP4 block scale). ``HW`` (sm_89 and later,
    never interpreted) takes it from the conversion instruction: its byte is ``_e4m3_signed``'s, and
    where that has the sign bit (d negative or -0.0: a negative outer amax someone imposed),
    ``_e4m3_nonneg`` gives 0x7F, as it does for NaN: the smaller of the two. One conversion and one
    minimum instead of about a dozen integer operations per block, written as PTX: Triton's own fp8
    conversion (which packs values in pairs) took more instructions here (bench/kernel_sass.py: 800
    against 792 in the dense kernel, 1320 against 1256 under modelopt). tests/formats/test_cuda.py
    compares the two on all 2^32 float32 patterns."""
    if HW:
        # cvt.rn.satfinite.e4m3x2.f32 d, a, b: b -> the low byte (a = 0 -> the high byte, dropped)
        return tl.inline_asm_elementwise(
            """{ .reg .b16 c; .reg .f32 z; mov.f32 z, 0f00000000;
            cvt.rn.satfinite.e4m3x2.f32 c, z, $1; cvt.u32.u16 $0, c; and.b32 $0, $0, 255; min.u32 $0, $0, 127; }""",
            "=r,f", [d], dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    return _e4m3_nonneg(d)


@triton.jit
def _e4m3_scale_value(code, HW: tl.constexpr):
    """``_e4m3_value(code)`` for the codes ``_e4m3_scale_code`` gives (0..0x7F; 0x7F decodes as 480,
    the bit arithmetic's value, not NaN). ``HW`` converts by instruction (exact: every E4M3 value is
    a float16)."""
    if HW:
        return tl.inline_asm_elementwise(
            """{ .reg .b16 c, lo, hi; .reg .b32 h; .reg .f32 v; .reg .pred nan; cvt.u16.u32 c, $1;
            cvt.rn.f16x2.e4m3x2 h, c; mov.b32 {lo, hi}, h; cvt.f32.f16 v, lo;
            setp.eq.u32 nan, $1, 127; selp.f32 $0, 0f43F00000, v, nan; }""",
            "=f,r", [code], dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    return _e4m3_value(code)


@triton.jit
def _e4m3_signed(y):
    """float32 -> E4M3 byte with its sign (int32), satfinite RNE; NaN -> 0x7F, one NaN test."""
    yb = y.to(tl.uint32, bitcast=True)
    a = yb & 0x7FFFFFFF
    d = a.to(tl.float32, bitcast=True)
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
    sub = ((d * 512.0) + 8388608.0).to(tl.uint32, bitcast=True) - 0x4B000000
    code = tl.minimum(tl.where(d < 0.015625, sub, normal), 0x7E) | ((yb >> 24) & 0x80)
    return tl.where(a > 0x7F800000, 0x7F, code).to(tl.int32)


@triton.jit
def _e4m3_byte(y, HW: tl.constexpr):
    """float32 -> E4M3 byte with its sign (int32), satfinite RNE, NaN -> 0x7F: ``_e4m3_signed``'s bytes.
    ``HW`` (sm_89 and later, never interpreted) takes them from the conversion instruction
    (``cvt.rn.satfinite.e4m3x2.f32``, one per two values) instead of ~15 integer operations per
    value: MXFP8 then stops being bound by arithmetic. tests/formats/test_cuda.py compares the two
    on every one of the 2^32 float32 bit patterns; the launchers pass ``hardware_e4m3(device)``."""
    if HW:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    return _e4m3_signed(y)


@triton.jit
def _e4m3_pair(lo, hi, HW: tl.constexpr):
    """Two float32 -> their E4M3 bytes (``_e4m3_byte``'s) in one uint16, ``lo``'s in the low byte.
    ``HW`` issues the conversion instruction itself, which packs exactly this pair: written through
    ``_e4m3_byte`` (convert, widen, shift, or), Triton's lowering on an H100 stored wrong bytes in every
    fourth column (byte 2 of each 32-bit word, bench/results/e4m3-pair-h100.txt) although each
    conversion alone was right; tests/formats/test_cuda.py checks this pair on all 2^32 patterns."""
    if HW:
        # cvt.rn.satfinite.e4m3x2.f32 d, a, b: a -> the high byte of d, b -> the low byte
        return tl.inline_asm_elementwise(
            "cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,f,f", [lo, hi], dtype=tl.uint16, is_pure=True, pack=1
        )
    return (_e4m3_signed(lo) | (_e4m3_signed(hi) << 8)).to(tl.uint16)


@triton.jit
def _e4m3_value(code):
    """E4M3 code (int32, 0..0x7E) -> float32."""
    e = code >> 3
    m = code & 7
    sub = m.to(tl.float32) * 0.001953125
    normal = (((e + 120) << 23) | (m << 20)).to(tl.uint32).to(tl.float32, bitcast=True)
    return tl.where(e == 0, sub, normal)


@triton.jit
def _e8m0(v):
    """MXFP8 block scale of ``v = amax * rn32(1/448)``: the E8M0 byte (RCEIL: the exponent rounded up
    unless ``v`` is a power of two) and the exact power-of-two reciprocal the values are multiplied by."""
    b = v.to(tl.uint32, bitcast=True)
    ex = (b >> 23) & 0xFF
    man = b & 0x7FFFFF
    up = tl.where(ex == 0, (man > 0x400000).to(tl.uint32), ((man != 0) & (ex < 0xFE)).to(tl.uint32))
    sc = tl.where(ex == 0xFF, 0xFE, ex + up)
    inv = tl.where(sc == 254, 0x00400000, (254 - sc) << 23).to(tl.float32, bitcast=True)
    return sc, inv


@triton.jit
def _outer_pair(amax, PROFILE: tl.constexpr, GMAX: tl.constexpr):
    """(s_dec, s_enc) of an outer amax: ``profiles.outer_scales``' operations, one by one."""
    g = tl.full(amax.shape, GMAX, tl.float32)
    one = tl.full(amax.shape, 1.0, tl.float32)
    if PROFILE == 2:  # modelopt: s2 = A / 2688 decodes, 1 / s2 encodes
        s2 = tl.math.div_rn(amax, g)
        return s2, tl.math.div_rn(one, s2)
    s_enc = tl.math.div_rn(g, amax)
    s_enc = tl.where(tl.abs(s_enc) == float("inf"), FLT_MAX, s_enc)  # torch.isinf: either sign
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    return tl.math.div_rn(one, s_enc), s_enc


@triton.jit
def _outer(amax, PROFILE: tl.constexpr, GMAX: tl.constexpr):
    """(s_dec, mult) of an outer amax: ``profiles.outer_scales``' operations, one by one."""
    s_dec, s_enc = _outer_pair(amax, PROFILE, GMAX)
    if PROFILE == 2:  # modelopt: mult = s2 * 6
        return s_dec, s_dec * 6.0
    if PROFILE == 0:
        return s_dec, s_enc * tl.math.div_rn(
            tl.full(amax.shape, 1.0, tl.float32), tl.full(amax.shape, 6.0, tl.float32)
        )
    return s_dec, s_enc


@triton.jit
def _outer_scales_kernel(
    amax_ptr, s_dec_ptr, s_enc_ptr, n, PROFILE: tl.constexpr, GMAX: tl.constexpr, BLOCK: tl.constexpr
):
    """``(s_dec, s_enc)`` of ``n`` outer amaxes (a group's units: one launch, not a dozen torch ops)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    s_dec, s_enc = _outer_pair(tl.load(amax_ptr + i, mask=mask, other=1.0), PROFILE, GMAX)
    tl.store(s_dec_ptr + i, s_dec, mask=mask)
    tl.store(s_enc_ptr + i, s_enc, mask=mask)


@triton.jit
def _nvfp4_chunk(x, sdec, mult, PROFILE: tl.constexpr, TILE16: tl.constexpr, HW: tl.constexpr):
    """Codes and scale bytes of ``x [BR, NB, 2, 8]`` (float32: rows, blocks, two halves of a
    block) with per-row ``sdec``/``mult [BR, 1]``; ``HW``: scale bytes by the conversion instruction."""
    amax = _tile_amax(_absmax2(x), TILE16)  # [BR, NB]
    if PROFILE == 2:  # modelopt
        psc = tl.math.div_rn(amax, mult)
        psc = tl.where(psc == 0.0, 1.0, psc)
        psc = tl.minimum(tl.maximum(psc, 0.001953125), 448.0)
        sf = _e4m3_scale_code(psc, HW)
        sf = tl.where(sdec == 0.0, 0x38, sf)
        y = tl.math.div_rn(x, (_e4m3_scale_value(sf, HW) * sdec)[:, :, None, None])
        y = tl.where(sdec[:, :, None, None] == 0.0, 0.0, y)
        codes = _e2m1(y, False)
    else:
        sf, enc = _nvfp4_block_scales(amax, sdec, mult, PROFILE, HW)
        codes = _e2m1(x * enc[:, :, None, None], True)
    return codes, sf


@triton.jit
def _tile_amax(amax, TILE16: tl.constexpr):
    """Block amaxes ``[BR, NB]``, or with ``TILE16`` the 16x16 tile's amax for each of its 16 rows
    (BR == 16: one tile row-group)."""
    if TILE16:
        return tl.broadcast_to(tl.max(amax, axis=0)[None, :], amax.shape)
    return amax


@triton.jit
def _nvfp4_block_scales(amax, sdec, mult, PROFILE: tl.constexpr, HW: tl.constexpr):
    """te / te-2.13 block scales of block (or tile) amaxes ``[BR, NB]``: the scale byte and the
    encode factor the values are multiplied by."""
    if PROFILE == 0:
        d = amax * mult
    else:
        d = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)) * mult
    sf = _e4m3_scale_code(d, HW)
    enc = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), _e4m3_scale_value(sf, HW) * sdec)
    return sf, tl.minimum(enc, FLT_MAX)


#: how ``_bf16_amax`` clears the eight values' signs (``FP4CONVERT_BF16_AMAX``, read once, at import):
#: ``mask``, an ``and`` per word before ``max.bf16x2`` (ptxas then fuses two maxima into one three-input
#: ``VHMNMX``); ``xorsign``, ``max.xorsign.abs.bf16x2``, which ptxas issues as ``HMNMX2.XORSIGN`` with
#: both operands' absolute values taken for free: no mask, one more maximum per four words, the
#: stray signs cleared by the last float maximum's ``|.|``. The same maxima (NaN-NaN lanes give NaN,
#: ignored as before; tests/formats/test_cuda.py checks every bf16 in every position and NaN in both
#: lanes), 12 fewer instructions a step of the persistent loop, all of them on the ALU pipe
#: (bench/kernel_sass.py). Those tests passed on an H200 with both ways, which timed the same there
#: (te 1x16: mask 50.6 us, xorsign 51.2; amax + quantize 79.9 and 79.8: bench/results/nvfp4-ab-h200-stop42.txt;
#: the pass waits on memory, not on the ALU), so the default stays the plainer ``mask``.
BF16_AMAX_BY_DEFAULT = "mask"
_BF16_AMAX = os.environ.get("FP4CONVERT_BF16_AMAX", BF16_AMAX_BY_DEFAULT)


def bf16_amax_ptx(way: str) -> str:
    """The PTX of ``_bf16_amax`` under ``way`` (:data:`BF16_AMAX_BY_DEFAULT`'s choices)."""
    if way == "mask":
        body = [
            ".reg .b32 a<4>, m, lo, hi;",
            " ".join(f"and.b32 a{k}, ${k + 1}, 2147450879;" for k in range(4)),
            "max.bf16x2 a0, a0, a1; max.bf16x2 a2, a2, a3; max.bf16x2 m, a0, a2;",
            "shl.b32 lo, m, 16; and.b32 hi, m, 4294901760; max.f32 $0, lo, hi;",
        ]
    elif way == "xorsign":  # each maximum's sign is the xor of its operands': junk, cleared at the end
        body = [
            ".reg .b32 a0, a2, m; .reg .f32 lo, hi;",
            "max.xorsign.abs.bf16x2 a0, $1, $2; max.xorsign.abs.bf16x2 a2, $3, $4;",
            "max.xorsign.abs.bf16x2 m, a0, a2;",
            "shl.b32 lo, m, 16; and.b32 hi, m, 4294901760; abs.f32 lo, lo; abs.f32 hi, hi; max.f32 $0, lo, hi;",
        ]
    else:
        raise ValueError(f"FP4CONVERT_BF16_AMAX={way!r}: expected mask or xorsign")
    return "{\n" + "\n".join(body) + "\n}"


_BF16_AMAX_PTX = tl.constexpr(bf16_amax_ptx(_BF16_AMAX))


@triton.jit
def _bf16_amax(w0, w1, w2, w3):
    """max |x| of the eight bf16 in four words (float32), NaN ignored (all NaN: NaN), as PTX
    (:func:`bf16_amax_ptx`): ``max.bf16x2``, two values per instruction, then the larger half.
    (Written as float32 maxima of the unpacked values, ptxas clears each sign with an integer mask
    instead of folding ``abs`` into the maximum: two instructions per value.)"""
    return _bf16_amax_as(w0, w1, w2, w3, _BF16_AMAX_PTX)


@triton.jit
def _bf16_amax_as(w0, w1, w2, w3, PTX: tl.constexpr):
    """``_bf16_amax`` by the PTX given (:func:`bf16_amax_ptx`: tests check each way)."""
    return tl.inline_asm_elementwise(PTX, "=f,r,r,r,r", [w0, w1, w2, w3], dtype=tl.float32, is_pure=True, pack=1)


#: how ``_e2m1_word`` gathers the eight code magnitudes into one word (``FP4CONVERT_E2M1_PACK``, read
#: once, at import): ``shift``, a funnel shift per value (the ALU pipe, which every other integer step
#: of the encode also takes); ``horner``, ``m = m * 16 + t`` per value by integer multiply-adds (the
#: FMA pipe), the rounded sums' exponent bits subtracted after; ``horner-hi``, that and each sum's
#: offset ``u + (u >> 22)`` by one ``mul.hi`` with 1025 (``u * 1025 >> 32``: no power of two, so ptxas
#: keeps it a multiply) instead of a shift and an add. The same bytes (bench/e2m1_word_model.py,
#: tests/formats/test_cuda.py). ``horner`` by default: 268 instead of 296 ALU instructions a step of the
#: persistent loop (bench/kernel_sass.py), the same 56 registers, and on an H100, where the pass is near
#: its bytes, no slower (two rounds: te 1x16 56.1-56.3 against 56.4-56.7 us, amax + quantize 92.9-93.2
#: against 93.8-94.5; ``horner-hi``, 62 registers, 58.6 and 95.7; bench/results/e2m1-pack-h100-stop40.txt).
E2M1_PACK_BY_DEFAULT = "horner"
_E2M1_PACK = os.environ.get("FP4CONVERT_E2M1_PACK", E2M1_PACK_BY_DEFAULT)


def e2m1_word_ptx(pack: str) -> str:
    """The PTX of ``_e2m1_word`` under ``pack`` (:data:`E2M1_PACK_BY_DEFAULT`'s choices)."""
    if pack not in ("shift", "horner", "horner-hi"):
        raise ValueError(f"FP4CONVERT_E2M1_PACK={pack!r}: expected shift, horner or horner-hi")

    def each(template: str) -> str:
        return " ".join(template.format(i=i) for i in range(8))

    if pack == "horner-hi":  # u * 1025 = (u << 10) + u: its high word is u >> 22 (u's low 23 bits are 0)
        offsets = [each("mul.hi.u32 c{i}, u{i}, 1025;")]
    else:
        offsets = [each("shr.u32 c{i}, u{i}, 22;")]
    if pack == "shift":  # each sum's low nibble in at the top
        gather = ["shf.r.wrap.b32 m, t0, t0, 4;", " ".join(f"shf.r.wrap.b32 m, m, t{i}, 4;" for i in range(1, 8))]
    else:
        # sum j is u_j + 0x0B000000 + code_j: what the multiply-adds carry above the codes is
        # 16^j (u_j + 0x0B000000) mod 2^32, which is 0 from j = 3 on (u_j is u's exponent field,
        # bits 23-30), 0xBB000000 + u_0 + 16 u_1 + 256 u_2 in all
        gather = [
            "mad.lo.u32 m, t7, 16, t6;",
            " ".join(f"mad.lo.u32 m, m, 16, t{i};" for i in range(5, -1, -1)),
            "mad.lo.u32 m, u2, 0xFFFFFF00, m; mad.lo.u32 m, u1, 0xFFFFFFF0, m; sub.u32 m, m, u0;",
            "add.u32 m, m, 0x45000000;",
        ]
    body = [
        ".reg .b32 x<8>, y<8>, a<8>, u<8>, c<8>, t<8>, m, s;",
        " ".join(f"shl.b32 x{2 * k}, ${k + 1}, 16; and.b32 x{2 * k + 1}, ${k + 1}, 4294901760;" for k in range(4)),
        each("mul.rn.f32 y{i}, x{i}, $5;"),
        each("abs.f32 a{i}, y{i};"),
        each("min.f32 a{i}, a{i}, 0f40C00000;"),
        each("max.u32 u{i}, a{i}, 1065353216;"),
        each("and.b32 u{i}, u{i}, 2139095040;"),
        *offsets,
        each("add.u32 c{i}, c{i}, u{i};"),
        each("add.u32 c{i}, c{i}, 184549122;"),
        each("add.rn.f32 t{i}, a{i}, c{i};"),
        *gather,
        # each product's top nibble in at the bottom: its sign bit lands on bit 3 of its nibble
        "shf.l.wrap.b32 s, y7, y7, 4;",
        " ".join(f"shf.l.wrap.b32 s, y{i}, s, 4;" for i in range(6, -1, -1)),
        "and.b32 s, s, 2290649224; or.b32 $0, m, s;",
    ]
    return "{\n" + "\n".join(body) + "\n}"


_E2M1_WORD_PTX = tl.constexpr(e2m1_word_ptx(_E2M1_PACK))


@triton.jit
def _e2m1_word(w0, w1, w2, w3, enc):
    """``_e2m1(x_j * enc, True)`` of the eight bf16 ``x_j`` of four words (``x_2k`` the low half of
    word k) packed into one word, value j in nibble j (the NVFP4 data layout): the
    same rounding as ``_e2m1``, written as PTX (:func:`e2m1_word_ptx`; compiled kernels only, the
    interpreter runs ``_e2m1``). Each product's code magnitude is the low nibble of its rounded sum
    (see ``_e2m1``: the sum's bits are ``u + 0x0B000000 + code``, whose low 23 bits are the code),
    gathered as :data:`E2M1_PACK_BY_DEFAULT` says; its sign is the product's sign bit, moved into
    place by funnel shifts: a NaN product is the canonical NaN 0x7FFFFFFF on the GPU, positive
    whatever the operands' signs, which is the +6 the specification gives NaN
    (tests/formats/test_cuda.py checks every bf16 value in every nibble). No packing arithmetic for
    the signs: one shift per value instead of a shift, a mask, a minimum and an add."""
    return _e2m1_word_as(w0, w1, w2, w3, enc, _E2M1_WORD_PTX)


@triton.jit
def _e2m1_word_as(w0, w1, w2, w3, enc, PTX: tl.constexpr):
    """``_e2m1_word`` by the PTX given (:func:`e2m1_word_ptx`: tests check each way)."""
    return tl.inline_asm_elementwise(PTX, "=r,r,r,r,r,f", [w0, w1, w2, w3, enc], dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _nvfp4_rows(
    src, ld, r, rmask, orow, sdec, mult, data_ptr, scale_ptr, cols, c0,
    PROFILE: tl.constexpr, TILE16: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr, VERIFY: tl.constexpr, HW: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """Quantize columns ``[c0, c0 + BC)`` of rows ``r`` of ``src`` into output rows ``orow``. (The
    column loop is the caller's: the Triton interpreter runs ``range`` loops in kernels only.)
    ``WORDS`` (:func:`word_path`): ``src`` is bf16 read as 32-bit words and rounded by PTX
    (``_bf16_amax``, ``_e2m1_word``). ``VERIFY`` compares with the bytes already at the outputs
    instead of writing them; returns, per block, whether its data words and its scale byte differ
    (int32 0/1 ``[BR, BC // 16]``; zeros when writing)."""
    v = _nvfp4_load(src, ld, r, rmask, cols, c0, EVEN_R, EVEN_C, BC, WORDS, "")
    return _nvfp4_encode(
        v, rmask, orow, sdec, mult, data_ptr, scale_ptr, cols, c0, PROFILE, TILE16, EVEN_R, EVEN_C, BR, BC, VERIFY,
        HW, WORDS, "",
    )  # fmt: skip


@triton.jit
def _nvfp4_load(
    src, ld, r, rmask, cols, c0,
    EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BC: tl.constexpr, WORDS: tl.constexpr, POLICY: tl.constexpr,
):  # fmt: skip
    """Columns ``[c0, c0 + BC)`` of rows ``r`` of ``src`` as ``_nvfp4_encode`` takes them: [rows,
    blocks, half, 4] 32-bit words of bf16 pairs (``WORDS``), else [rows, blocks, half, 8] values
    as stored; a thread holds one 16-byte load of each half block. Zeros where masked."""
    NB: tl.constexpr = BC // 16
    h = tl.arange(0, 2)
    blk = c0 // 16 + tl.arange(0, NB)
    if WORDS:
        # a bf16's float32 is its bits shifted up, so the encode issues no conversion
        k = tl.arange(0, 4)
        wcol = blk[None, :, None, None] * 8 + h[None, None, :, None] * 4 + k[None, None, None, :]
        ptrs = src.to(tl.pointer_type(tl.uint32)) + r.to(tl.int64)[:, None, None, None] * (ld // 2) + wcol
    else:
        j = tl.arange(0, 8)
        col = blk[None, :, None, None] * 16 + h[None, None, :, None] * 8 + j[None, None, None, :]
        ptrs = src + r.to(tl.int64)[:, None, None, None] * ld + col  # 64-bit: tensors past 2^31 elements
    if EVEN_R and EVEN_C:
        v = tl.load(ptrs, eviction_policy=POLICY)
    else:
        v = tl.load(
            ptrs, mask=rmask[:, None, None, None] & (blk < cols // 16)[None, :, None, None], other=0,
            eviction_policy=POLICY,
        )  # fmt: skip
    return v


@triton.jit
def _step_origin(step, col_steps, BR: tl.constexpr, BC: tl.constexpr):
    """Rows and first column of step ``step`` of a matrix cut into ``BR`` x ``BC`` steps, row-major
    (the persistent kernels' steps)."""
    q = tl.cast(tl.cast(step, tl.uint32) // tl.cast(col_steps, tl.uint32), tl.int32)  # both >= 0: no sign fix-ups
    return q * BR + tl.arange(0, BR), (step - q * col_steps) * BC


@triton.jit
def _nvfp4_encode(
    v, rmask, orow, sdec, mult, data_ptr, scale_ptr, cols, c0,
    PROFILE: tl.constexpr, TILE16: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr, VERIFY: tl.constexpr, HW: tl.constexpr, WORDS: tl.constexpr,
    POLICY: tl.constexpr,
):  # fmt: skip
    """``_nvfp4_rows`` of the values ``_nvfp4_load`` read (a separate step so that a loop can read
    its next step's values before it encodes these)."""
    NB: tl.constexpr = BC // 16
    h = tl.arange(0, 2)
    nblocks = cols // 16
    blk = c0 // 16 + tl.arange(0, NB)
    if WORDS:
        w02, w13 = tl.split(tl.reshape(v, (BR, NB, 2, 2, 2)))  # registers renamed, no data moves
        w0, w2 = tl.split(w02)
        w1, w3 = tl.split(w13)
        half = tl.max(_bf16_amax(w0, w1, w2, w3), axis=2)  # NaN-ignoring, as _absmax
        amax = _tile_amax(tl.where(half == half, half, 0.0), TILE16)
        sf, enc = _nvfp4_block_scales(amax, sdec, mult, PROFILE, HW)
        words = _e2m1_word(w0, w1, w2, w3, enc[:, :, None])
    else:
        # each thread packs the codes of its 8 consecutive values into one 32-bit word (little
        # endian: element 2i in the low nibble of byte i)
        j = tl.arange(0, 8)
        codes, sf = _nvfp4_chunk(v.to(tl.float32), sdec, mult, PROFILE, TILE16, HW)
        words = tl.sum(codes.to(tl.uint32) << (j * 4).to(tl.uint32)[None, None, None, :], axis=3)
    sptr = scale_ptr + orow.to(tl.int64)[:, None] * nblocks + blk[None, :]
    wptr = (
        data_ptr.to(tl.pointer_type(tl.uint32))
        + orow.to(tl.int64)[:, None, None] * (cols // 8)
        + blk[None, :, None] * 2
        + h[None, None, :]
    )
    if VERIFY:
        if EVEN_R and EVEN_C:
            bad_s = tl.load(sptr) != sf.to(tl.uint8)
            bad_w = tl.load(wptr) != words
        else:
            m2 = rmask[:, None] & (blk < nblocks)[None, :]
            bad_s = (tl.load(sptr, mask=m2, other=0) != sf.to(tl.uint8)) & m2
            bad_w = (tl.load(wptr, mask=m2[:, :, None], other=0) != words) & m2[:, :, None]
        # per block, each thread's own values: a caller's loop reduces across threads (and warps, through
        # shared memory and a barrier) once, after its last step
        block_w = tl.max(bad_w.to(tl.int32), axis=2)
        block_s = bad_s.to(tl.int32)
    else:
        if EVEN_R and EVEN_C:
            tl.store(sptr, sf.to(tl.uint8), eviction_policy=POLICY)
            tl.store(wptr, words, eviction_policy=POLICY)
        else:
            m2 = rmask[:, None] & (blk < nblocks)[None, :]
            tl.store(sptr, sf.to(tl.uint8), mask=m2, eviction_policy=POLICY)
            tl.store(wptr, words, mask=m2[:, :, None], eviction_policy=POLICY)
        block_w = tl.zeros((BR, NB), dtype=tl.int32)
        block_s = block_w
    return block_w, block_s


@triton.jit
def _nvfp4_seg_kernel(
    tab_ptr, src_ptr, ld_ptr, rows_ptr, out_ptr, unit_ptr, amax_ptr, data_ptr, scale_ptr, cols, bad_ptr,
    DT: tl.constexpr, PROFILE: tl.constexpr, GMAX: tl.constexpr, TILE16: tl.constexpr, EVEN_R: tl.constexpr,
    EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr, VERIFY: tl.constexpr,
    HW: tl.constexpr, WORDS: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """One ``(segment, first row)`` block per program, and one span of ``CH`` column steps (``CH``
    0: the whole row, as grouped launches run); the segment's unit amax gives its scales.
    ``WORDS``: :func:`word_path` (every source bf16 on a 16-byte boundary, as the tables require).
    ``VERIFY`` (with ``CH`` 0) compares with the bytes at ``data``/``scale`` instead of writing
    them, and writes ``bad[row] = (data differs, scale differs)`` (int32 0/1) for every output row.
    ``PREFETCH`` (with ``CH`` 0): each column step's loads are issued before the previous step is
    encoded (as ``_nvfp4_tensor_kernel``'s)."""
    pid = tl.program_id(0)
    seg = tl.load(tab_ptr + 2 * pid)
    r0 = tl.load(tab_ptr + 2 * pid + 1)
    src = tl.multiple_of(tl.load(src_ptr + seg).to(tl.pointer_type(DT)), 16)
    ld = tl.multiple_of(tl.load(ld_ptr + seg), 16)
    nrows = tl.load(rows_ptr + seg)
    r = r0 + tl.arange(0, BR)
    rmask = r < nrows
    orow = tl.load(out_ptr + seg) + r
    amax = tl.load(amax_ptr + tl.load(unit_ptr + seg))
    sdec, mult = _outer(tl.full((BR, 1), 0.0, tl.float32) + amax, PROFILE, GMAX)
    if CH == 0:  # the whole row
        bad_w = tl.zeros((BR, BC // 16), dtype=tl.int32)
        bad_s = tl.zeros((BR, BC // 16), dtype=tl.int32)
        if PREFETCH:
            v = _nvfp4_load(src, ld, r, rmask, cols, 0, EVEN_R, EVEN_C, BC, WORDS, "")
        for c0 in range(0, cols, BC):
            if PREFETCH:
                c1 = c0 + BC * (c0 + BC < cols)  # past the last step: this step again
                ahead = _nvfp4_load(src, ld, r, rmask, cols, c1, EVEN_R, EVEN_C, BC, WORDS, "")
            else:
                v = _nvfp4_load(src, ld, r, rmask, cols, c0, EVEN_R, EVEN_C, BC, WORDS, "")
            w, sc = _nvfp4_encode(
                v, rmask, orow, sdec, mult, data_ptr, scale_ptr, cols, c0, PROFILE, TILE16, EVEN_R, EVEN_C, BR, BC,
                VERIFY, HW, WORDS, "",
            )  # fmt: skip
            bad_w = tl.maximum(bad_w, w)
            bad_s = tl.maximum(bad_s, sc)
            if PREFETCH:
                v = ahead
        if VERIFY:
            tl.store(bad_ptr + 2 * orow.to(tl.int64), tl.max(bad_w, axis=1), mask=rmask)
            tl.store(bad_ptr + 2 * orow.to(tl.int64) + 1, tl.max(bad_s, axis=1), mask=rmask)
    else:
        for step in range(CH):
            c0 = (tl.program_id(1) * CH + step) * BC
            if c0 < cols:
                _nvfp4_rows(
                    src, ld, r, rmask, orow, sdec, mult, data_ptr, scale_ptr, cols, c0, PROFILE, TILE16, EVEN_R,
                    EVEN_C, BR, BC, False, HW, WORDS,
                )  # fmt: skip


@triton.jit
def _nvfp4_dense_kernel(
    x_ptr, ld, rows, amax_ptr, data_ptr, scale_ptr, cols, unit_rows,
    PROFILE: tl.constexpr, GMAX: tl.constexpr, TILE16: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr, REVERSE: tl.constexpr, HW: tl.constexpr,
    WORDS: tl.constexpr,
):  # fmt: skip
    """One matrix, ``BR`` rows x ``CH`` column steps per program; row ``i`` takes outer amax
    ``amax[i // unit_rows]`` (tensor, expert or row scope). ``REVERSE`` runs the programs last to
    first: right after the amax pass, which ran first to last, the first reads then hit the L2
    cache that pass left filled (the bytes do not depend on the order)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    if REVERSE:
        pid_r = tl.num_programs(0) - 1 - pid_r
        pid_c = tl.num_programs(1) - 1 - pid_c
    r = pid_r * BR + tl.arange(0, BR)
    rmask = r < rows
    amax = tl.load(amax_ptr + r // unit_rows, mask=rmask, other=1.0)[:, None]
    sdec, mult = _outer(amax, PROFILE, GMAX)
    for step in range(CH):
        c0 = (pid_c * CH + step) * BC
        if c0 < cols:
            _nvfp4_rows(
                x_ptr, ld, r, rmask, r, sdec, mult, data_ptr, scale_ptr, cols, c0, PROFILE, TILE16, EVEN_R, EVEN_C,
                BR, BC, False, HW, WORDS,
            )  # fmt: skip


@triton.jit(do_not_specialize=["nprog"])
def _nvfp4_tensor_kernel(
    x_ptr, ld, rows, amax_ptr, data_ptr, scale_ptr, cols, nprog,
    PROFILE: tl.constexpr, GMAX: tl.constexpr, TILE16: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr,
    BR: tl.constexpr, BC: tl.constexpr, HW: tl.constexpr, WORDS: tl.constexpr, PREFETCH: tl.constexpr,
    PDL: tl.constexpr, IN_POLICY: tl.constexpr, OUT_POLICY: tl.constexpr,
):  # fmt: skip
    """One matrix under the one outer amax ``amax[0]``, persistent: ``nprog`` programs (the grid, at
    most one per step; ``nprog`` is not specialized, so the kernel measured for its occupancy is the
    one launched), each computing the outer scales once and then taking steps of ``BR`` rows x ``BC``
    columns ``nprog`` apart, last to first (as ``_nvfp4_dense_kernel`` with ``REVERSE``).
    ``PREFETCH``: a program issues its next step's loads before it encodes this step's values, so
    its warps wait on memory while they compute rather than after (its last step reads its own
    values again, which the L1 cache holds). ``WORDS``: :func:`word_path`."""
    if PDL:  # launched before the amax pass ended: nothing it wrote is read before this
        gdc_wait()
    col_steps = tl.cdiv(cols, BC)
    n = tl.cdiv(rows, BR) * col_steps
    sdec, mult = _outer(tl.load(amax_ptr + tl.zeros((BR,), tl.int32))[:, None], PROFILE, GMAX)
    if PREFETCH:
        r, c0 = _step_origin(n - 1 - tl.program_id(0), col_steps, BR, BC)
        v = _nvfp4_load(x_ptr, ld, r, r < rows, cols, c0, EVEN_R, EVEN_C, BC, WORDS, IN_POLICY)
    for t in range(tl.program_id(0), n, nprog):
        r, c0 = _step_origin(n - 1 - t, col_steps, BR, BC)
        if PREFETCH:
            nxt = t + nprog * (t + nprog < n)  # past the last step: this step again
            rn, cn = _step_origin(n - 1 - nxt, col_steps, BR, BC)
            ahead = _nvfp4_load(x_ptr, ld, rn, rn < rows, cols, cn, EVEN_R, EVEN_C, BC, WORDS, IN_POLICY)
        else:
            v = _nvfp4_load(x_ptr, ld, r, r < rows, cols, c0, EVEN_R, EVEN_C, BC, WORDS, IN_POLICY)
        _nvfp4_encode(
            v, r < rows, r, sdec, mult, data_ptr, scale_ptr, cols, c0, PROFILE, TILE16, EVEN_R, EVEN_C, BR, BC,
            False, HW, WORDS, OUT_POLICY,
        )  # fmt: skip
        if PREFETCH:
            v = ahead


@triton.jit
def _mxfp8_rows(
    src, ld, r, rmask, orow, data_ptr, scale_ptr, cols, c0,
    EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    NB: tl.constexpr = BC // 32
    q = tl.arange(0, 4)
    j = tl.arange(0, 8)
    nblocks = cols // 32
    blk = c0 // 32 + tl.arange(0, NB)
    # [rows, blocks, quarter, 8]: a thread holds 8 consecutive values (one 16-byte load)
    col = blk[None, :, None, None] * 32 + q[None, None, :, None] * 8 + j[None, None, None, :]
    if EVEN_R and EVEN_C:
        x = tl.load(src + r.to(tl.int64)[:, None, None, None] * ld + col).to(tl.float32)
    else:
        m4 = rmask[:, None, None, None] & (blk < nblocks)[None, :, None, None]
        x = tl.load(src + r.to(tl.int64)[:, None, None, None] * ld + col, mask=m4, other=0.0).to(tl.float32)
    v = _absmax2(x) * 0.002232142956927418  # rn32(1/448) = 0x3B124925, a multiply as in TE
    sc, inv = _e8m0(v)
    code = _e4m3_byte(x * inv[:, :, None, None], HW)
    sptr = scale_ptr + orow.to(tl.int64)[:, None] * nblocks + blk[None, :]
    dptr = data_ptr + orow.to(tl.int64)[:, None, None, None] * cols + col
    if EVEN_R and EVEN_C:
        tl.store(sptr, sc.to(tl.uint8))
        tl.store(dptr, code.to(tl.uint8))
    else:
        m2 = rmask[:, None] & (blk < nblocks)[None, :]
        tl.store(sptr, sc.to(tl.uint8), mask=m2)
        tl.store(dptr, code.to(tl.uint8), mask=m2[:, :, None, None])


@triton.jit
def _mxfp8_seg_kernel(
    tab_ptr, src_ptr, ld_ptr, rows_ptr, out_ptr, data_ptr, scale_ptr, cols,
    DT: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    CH: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    seg = tl.load(tab_ptr + 2 * pid)
    r0 = tl.load(tab_ptr + 2 * pid + 1)
    src = tl.multiple_of(tl.load(src_ptr + seg).to(tl.pointer_type(DT)), 16)
    ld = tl.multiple_of(tl.load(ld_ptr + seg), 16)
    r = r0 + tl.arange(0, BR)
    rmask = r < tl.load(rows_ptr + seg)
    orow = tl.load(out_ptr + seg) + r
    if CH == 0:  # the whole row
        for c0 in range(0, cols, BC):
            _mxfp8_rows(src, ld, r, rmask, orow, data_ptr, scale_ptr, cols, c0, EVEN_R, EVEN_C, BR, BC, HW)
    else:
        for step in range(CH):
            c0 = (tl.program_id(1) * CH + step) * BC
            if c0 < cols:
                _mxfp8_rows(src, ld, r, rmask, orow, data_ptr, scale_ptr, cols, c0, EVEN_R, EVEN_C, BR, BC, HW)


@triton.jit
def _mxfp8_dense_kernel(
    x_ptr, ld, rows, data_ptr, scale_ptr, cols,
    EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr,
    HW: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    for step in range(CH):
        c0 = (tl.program_id(1) * CH + step) * BC
        if c0 < cols:
            _mxfp8_rows(x_ptr, ld, r, r < rows, r, data_ptr, scale_ptr, cols, c0, EVEN_R, EVEN_C, BR, BC, HW)


@triton.jit
def _mxfp8_bf16_dense_kernel(
    x_ptr, ld, rows, data_ptr, scale_ptr, cols,
    EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, NB: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """MXFP8 of a bf16 matrix read as 32-bit words, two values each (``ld`` even): a bf16's float32
    is its bits shifted up, so both halves come from one load without conversions, and their two
    E4M3 bytes go out as one 16-bit store (1.9 TB/s on the H200 against 1.5 for ``_mxfp8_rows``:
    bench/device/kernel_lab.py). BR rows x NB blocks of 32 per program."""
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    blk = tl.program_id(1) * NB + tl.arange(0, NB)
    k = tl.arange(0, 16)
    nblocks = cols // 32
    words = r.to(tl.int64)[:, None, None] * (ld // 2) + blk[None, :, None] * 16 + k[None, None, :]
    wp = x_ptr.to(tl.pointer_type(tl.uint32))
    if EVEN_R and EVEN_C:
        w = tl.load(wp + words)
    else:
        m3 = (r < rows)[:, None, None] & (blk < nblocks)[None, :, None]
        w = tl.load(wp + words, mask=m3, other=0)
    lo = (w << 16).to(tl.float32, bitcast=True)
    hi = (w & 0xFFFF0000).to(tl.float32, bitcast=True)
    # each half's NaN-ignoring max first (an elementwise maximum may propagate NaN: Triton's
    # interpreter does), then the larger of the two
    v = tl.maximum(_absmax(lo), _absmax(hi)) * 0.002232142956927418  # rn32(1/448), as in TE
    sc, inv = _e8m0(v)
    inv = inv[:, :, None]
    pair = _e4m3_pair(lo * inv, hi * inv, HW)
    dp = data_ptr.to(tl.pointer_type(tl.uint16)) + r.to(tl.int64)[:, None, None] * (cols // 2)
    sp = scale_ptr + r.to(tl.int64)[:, None] * nblocks + blk[None, :]
    if EVEN_R and EVEN_C:
        tl.store(dp + blk[None, :, None] * 16 + k[None, None, :], pair)
        tl.store(sp, sc.to(tl.uint8))
    else:
        tl.store(dp + blk[None, :, None] * 16 + k[None, None, :], pair, mask=m3)
        tl.store(sp, sc.to(tl.uint8), mask=(r < rows)[:, None] & (blk < nblocks)[None, :])


@triton.jit
def _mxfp8_col_kernel(x_ptr, ld, data_ptr, scale_ptr, cols, EVEN_C: tl.constexpr, BC: tl.constexpr, HW: tl.constexpr):
    """MXFP8 column blocks (32 consecutive rows of a column) of a row-major matrix, read and written
    in its own layout: one program holds 32 rows x BC columns and takes each column's block amax."""
    r = tl.program_id(0) * 32 + tl.arange(0, 32)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ptrs = x_ptr + r.to(tl.int64)[:, None] * ld + c[None, :]
    if EVEN_C:
        x = tl.load(ptrs).to(tl.float32)
    else:
        x = tl.load(ptrs, mask=(c < cols)[None, :], other=0.0).to(tl.float32)
    m = tl.max(tl.abs(x), axis=0)
    v = tl.where(m == m, m, 0.0) * 0.002232142956927418  # rn32(1/448), a multiply as in TE
    sc, inv = _e8m0(v)
    code = _e4m3_byte(x * inv[None, :], HW)
    dptr = data_ptr + r.to(tl.int64)[:, None] * cols + c[None, :]
    sptr = scale_ptr + tl.program_id(0).to(tl.int64) * cols + c
    if EVEN_C:
        tl.store(dptr, code.to(tl.uint8))
        tl.store(sptr, sc.to(tl.uint8))
    else:
        tl.store(dptr, code.to(tl.uint8), mask=(c < cols)[None, :])
        tl.store(sptr, sc.to(tl.uint8), mask=c < cols)


@triton.jit
def _amax_seg_kernel(
    tab_ptr, src_ptr, ld_ptr, rows_ptr, out_ptr, cols,
    DT: tl.constexpr, EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Each segment's NaN-ignoring amax into ``out[segment]`` (int32 bits of the float; ``out``
    starts at 0); one program per block of rows."""
    pid = tl.program_id(0)
    seg = tl.load(tab_ptr + 2 * pid)
    r0 = tl.load(tab_ptr + 2 * pid + 1)
    src = tl.multiple_of(tl.load(src_ptr + seg).to(tl.pointer_type(DT)), 16)
    ld = tl.multiple_of(tl.load(ld_ptr + seg), 16)
    r = r0 + tl.arange(0, BR)
    rmask = r < tl.load(rows_ptr + seg)
    acc = tl.zeros((BR, BC), dtype=tl.float32)
    c = tl.arange(0, BC)
    for c0 in range(0, cols, BC):
        ptrs = src + r.to(tl.int64)[:, None] * ld + (c0 + c)[None, :]
        if EVEN_R and EVEN_C:
            x = tl.load(ptrs).to(tl.float32)
        else:
            x = tl.load(ptrs, mask=rmask[:, None] & ((c0 + c) < cols)[None, :], other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(x))  # max skips NaN; the accumulator starts at 0
    # non-negative floats order as their bits, and max is exact in any order: an integer atomic max
    best = tl.max(tl.max(acc, axis=1), axis=0)
    tl.atomic_max(out_ptr + seg, best.to(tl.int32, bitcast=True))


@triton.jit(do_not_specialize=["nprog"])
def _amax_dense_kernel(
    x_ptr, ld, rows, out_ptr, keep_from, cols, nprog,
    EVEN_R: tl.constexpr, EVEN_C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, KEEP: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """One matrix's amax into ``out[0]`` (int32 bits), persistent: ``nprog`` programs (as
    ``_nvfp4_tensor_kernel``), each taking steps of ``BR`` rows x ``BC`` columns ``nprog`` apart,
    first to last (the quantize pass that follows runs last to first)."""
    col_steps = tl.cdiv(cols, BC)
    n = tl.cdiv(rows, BR) * col_steps
    acc = tl.zeros((BR, BC), dtype=tl.float32)
    c = tl.arange(0, BC)
    for t in range(tl.program_id(0), n, nprog):
        r, c0 = _step_origin(t, col_steps, BR, BC)
        col = c0 + c
        ptrs = x_ptr + r.to(tl.int64)[:, None] * ld + col[None, :]
        if KEEP and t >= keep_from:  # the steps the reversed quantize pass reads first: kept in L2
            if EVEN_R and EVEN_C:
                x = tl.load(ptrs, eviction_policy="evict_last").to(tl.float32)
            else:
                x = tl.load(
                    ptrs, mask=(r < rows)[:, None] & (col < cols)[None, :], other=0.0, eviction_policy="evict_last"
                ).to(tl.float32)
        elif EVEN_R and EVEN_C:
            x = tl.load(ptrs).to(tl.float32)
        else:
            x = tl.load(ptrs, mask=(r < rows)[:, None] & (col < cols)[None, :], other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(x))  # max skips NaN; the accumulator starts at 0
    best = tl.max(tl.max(acc, axis=1), axis=0)
    if PDL:  # launched before the zero fill of out ended
        gdc_wait()
    tl.atomic_max(out_ptr, best.to(tl.int32, bitcast=True))


def outer_scales(amax, code: int, gmax: float):
    """``(s_dec, s_enc)`` float32 of the float32 ``amax`` (contiguous, any shape) under block chain ``code``."""
    import torch

    s_dec = torch.empty_like(amax)
    s_enc = torch.empty_like(amax)
    n = amax.numel()
    if n:
        block = min(1024, triton.next_power_of_2(n))
        _outer_scales_kernel[(triton.cdiv(n, block),)](
            amax, s_dec, s_enc, n, PROFILE=code, GMAX=gmax, BLOCK=block, enable_fp_fusion=False
        )
    return s_dec, s_enc


def tensor_amax(x2d):
    """NaN-ignoring amax of a contiguous-row matrix: a float32 0-d tensor, two launches (zero, max).
    Persistent (bench/device/wave_lab.py, 4096x14336 bf16 on an H100: 40.7 against 42.6 us for a grid
    of 3584 four-step programs, 3.39 waves of the 8 per SM its 64 registers allow; 98% of the copy
    roofline)."""
    import torch

    rows, cols = x2d.shape
    out = torch.zeros(1, dtype=torch.int32, device=x2d.device)
    if rows and cols:
        bc = launch_shape(cols, 16)
        steps = triton.cdiv(rows, BLOCK_ROWS) * triton.cdiv(cols, bc)
        keep = min(steps, _L2_KEEP // (BLOCK_ROWS * bc * x2d.element_size()))
        pdl = _PDL >= 2 and _pdl_on(x2d.device)
        constexprs = dict(
            EVEN_R=rows % BLOCK_ROWS == 0,
            EVEN_C=cols % bc == 0,
            BR=BLOCK_ROWS,
            BC=bc,
            KEEP=keep > 0,
            PDL=pdl,
        )
        args = (x2d, x2d.stride(0), rows, out, steps - keep, cols)
        launch_persistent(_amax_dense_kernel, args, constexprs, x2d.device, pdl=pdl)
    return out.view(torch.float32).reshape(())


def nvfp4_dense(x2d, amax, unit_rows: int, code: int, gmax: float, tile16: bool):
    """NVFP4 of one contiguous-row matrix; row ``i`` takes outer amax ``amax[i // unit_rows]``
    (float32 on the device: the scales are computed in the kernel). The programs run in reverse:
    the amax pass that measures a call's outer amax ran first to last just before."""
    import torch

    rows, cols = x2d.shape
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows, cols // 16, dtype=torch.uint8, device=x2d.device)
    bc = launch_shape(cols, 16)
    hw = hardware_e4m3(x2d.device)
    words = word_path(_bf16_words(x2d), hw, code)
    if rows and cols and _PERSISTENT and unit_rows >= rows:
        pdl = _PDL >= 1 and _pdl_on(x2d.device)
        constexprs = dict(
            PROFILE=code, GMAX=gmax, TILE16=tile16, EVEN_R=rows % BLOCK_ROWS == 0, EVEN_C=cols % bc == 0,
            BR=BLOCK_ROWS, BC=bc, HW=hw, WORDS=words, PREFETCH=_PREFETCH, PDL=pdl, IN_POLICY=_IN_POLICY,
            OUT_POLICY=_OUT_POLICY,
        )  # fmt: skip
        args = (x2d, x2d.stride(0), rows, amax, data, scale, cols)
        launch_persistent(_nvfp4_tensor_kernel, args, constexprs, x2d.device, pdl=pdl)
    elif rows and cols:
        steps = nvfp4_steps(rows, cols, bc)
        _nvfp4_dense_kernel[(triton.cdiv(rows, BLOCK_ROWS), spans(cols, bc, steps))](
            x2d, x2d.stride(0), rows, amax, data, scale, cols, unit_rows, PROFILE=code, GMAX=gmax, TILE16=tile16,
            EVEN_R=rows % BLOCK_ROWS == 0, EVEN_C=cols % bc == 0, BR=BLOCK_ROWS, BC=bc, CH=steps,
            REVERSE=True, HW=hw, WORDS=words, enable_fp_fusion=False,
        )  # fmt: skip
    return data, scale


_RESIDENT: dict[tuple, int] = {}


def _pdl_on(device) -> bool:
    """Whether kernels on ``device`` can be programmatic dependent launches (sm_90+, compiled)."""
    import torch

    return device.type == "cuda" and not _INTERPRETED and torch.cuda.get_device_capability(device) >= (9, 0)


def launch_persistent(kernel, args: tuple, constexprs: dict, device, pdl: bool = False) -> None:
    """Launch a persistent ``kernel`` over one matrix (``args[2]`` rows, ``args[-1]`` columns; its
    last argument the grid's size) in steps of ``BR`` x ``BC``: as many programs as all SMs of
    ``device`` hold at once (:func:`programs_per_sm` of the compiled kernel, counted once per kernel,
    device and constants), at most one per step; :data:`INTERPRETED_PROGRAMS` off CUDA."""
    import torch

    steps = triton.cdiv(args[2], constexprs["BR"]) * triton.cdiv(args[-1], constexprs["BC"])
    if device.type != "cuda" or _INTERPRETED:
        resident = INTERPRETED_PROGRAMS
    else:
        key = (kernel, device.index, *constexprs.values())  # the callers build the dict in one order
        if key not in _RESIDENT:
            compiled = kernel.warmup(*args, 1, **constexprs, grid=(1,), enable_fp_fusion=False, launch_pdl=pdl)
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            _RESIDENT[key] = programs_per_sm(compiled, device) * sms
        resident = _RESIDENT[key]
    programs = min(steps, resident)
    kernel[(programs,)](*args, programs, **constexprs, enable_fp_fusion=False, launch_pdl=pdl)


def programs_per_sm(compiled, device) -> int:
    """Programs of a compiled Triton kernel that one SM of ``device`` holds at once, from its
    registers, warps and shared memory (at least 1)."""
    import torch

    compiled._init_handles()  # loads the binary: its register count is known from here
    props = torch.cuda.get_device_properties(device)
    warps = compiled.metadata.num_warps
    # registers are allocated per warp in units of 256 (8 per thread); every SM since sm_50 has 64 Ki
    # of them (torch lists the figure on newer builds only); 1 KiB of shared memory is reserved per
    # program; at most 32 programs per SM (sm_90)
    regs = -(-compiled.n_regs // 8) * 8 * 32 * warps
    per_sm = min(
        getattr(props, "regs_per_multiprocessor", 65536) // max(regs, 1),
        props.max_threads_per_multi_processor // (32 * warps),
        props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024),
        32,
    )
    return max(1, per_sm)


def word_path(bf16_words: bool, hw: bool, code: int) -> bool:
    """Whether the NVFP4 kernels read their bf16 values as 32-bit words and round them by PTX
    (``WORDS``): values that are bf16 on 4-byte boundaries (``bf16_words``), the E4M3 instruction
    (``hw``: the PTX needs sm_89+, not Triton's interpreter), a te chain (``code`` 0 or 1: the PTX
    rounds the product ``x * s_enc``; modelopt divides), and :data:`BF16_WORDS_BY_DEFAULT` or
    ``FP4CONVERT_BF16_WORDS``."""
    return _BF16_WORDS and bf16_words and hw and code in (0, 1)


def _bf16_words(x2d) -> bool:
    """Whether ``x2d`` is bf16 readable as 32-bit words: rows on 4-byte boundaries (the segment
    tables require 16)."""
    import torch

    return x2d.dtype == torch.bfloat16 and x2d.stride(0) % 2 == 0 and x2d.data_ptr() % 4 == 0


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


def has_e4m3_instruction(device) -> bool:
    """Whether ``device`` has the E4M3 conversion instruction: CUDA, compute capability 8.9 or later,
    not under Triton's interpreter."""
    if device.type != "cuda" or _INTERPRETED:
        return False
    import torch

    return _capability(torch.cuda.current_device() if device.index is None else device.index) >= (8, 9)


#: MXFP8 kernels take E4M3 bytes from the instruction where the GPU has it: tests/formats/test_cuda.py
#: compared it with the integer rounding on all 2^32 float32 patterns, alone and as either half of a
#: packed pair, and ran every CUDA test with it, on an H100 (bench/results/e4m3-pair-h100.txt).
#: ``FP4CONVERT_E4M3_INSTRUCTION=0`` keeps the integer rounding (say, to test a new Triton's lowering).
E4M3_INSTRUCTION_BY_DEFAULT = True
_E4M3_INSTRUCTION = os.environ.get("FP4CONVERT_E4M3_INSTRUCTION", "1" if E4M3_INSTRUCTION_BY_DEFAULT else "0") == "1"


def hardware_e4m3(device) -> bool:
    """Whether MXFP8 kernels on ``device`` take their E4M3 bytes from the conversion instruction
    (``_e4m3_byte``): see :data:`E4M3_INSTRUCTION_BY_DEFAULT` (the variable is read once, at import)."""
    return _E4M3_INSTRUCTION and has_e4m3_instruction(device)


def mxfp8_dense(x2d):
    """MXFP8 (1x32 row blocks) of one contiguous-row matrix."""
    import torch

    rows, cols = x2d.shape
    data = torch.empty(rows, cols, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows, cols // 32, dtype=torch.uint8, device=x2d.device)
    hw = hardware_e4m3(x2d.device)
    # the bf16 kernel reads 32-bit words: rows must start on 4-byte boundaries
    if rows and cols and _bf16_words(x2d):
        nb = 8
        _mxfp8_bf16_dense_kernel[(triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols // 32, nb))](
            x2d, x2d.stride(0), rows, data, scale, cols, EVEN_R=rows % BLOCK_ROWS == 0, EVEN_C=cols % (32 * nb) == 0,
            BR=BLOCK_ROWS, NB=nb, HW=hw, enable_fp_fusion=False,
            num_warps=8 if hw else 4,  # H100, 14336x4096: 1755 GB/s with 8 warps, 1703 with 4 (live_sync.py)
        )  # fmt: skip
    elif rows and cols:
        bc = launch_shape(cols, 32)
        _mxfp8_dense_kernel[(triton.cdiv(rows, BLOCK_ROWS), spans(cols, bc, MXFP8_STEPS))](
            x2d, x2d.stride(0), rows, data, scale, cols, EVEN_R=rows % BLOCK_ROWS == 0, EVEN_C=cols % bc == 0,
            BR=BLOCK_ROWS, BC=bc, CH=MXFP8_STEPS, HW=hw, enable_fp_fusion=False,
        )  # fmt: skip
    return data, scale


def mxfp8_col_dense(x2d):
    """MXFP8 column blocks of a contiguous-row matrix (rows % 32 == 0): data in its layout,
    scales ``(rows / 32, cols)``."""
    import torch

    rows, cols = x2d.shape
    data = torch.empty(rows, cols, dtype=torch.uint8, device=x2d.device)
    scale = torch.empty(rows // 32, cols, dtype=torch.uint8, device=x2d.device)
    if rows and cols:
        bc = 128
        _mxfp8_col_kernel[(rows // 32, triton.cdiv(cols, bc))](
            x2d, x2d.stride(0), data, scale, cols, EVEN_C=cols % bc == 0, BC=bc, HW=hardware_e4m3(x2d.device),
            enable_fp_fusion=False,
        )  # fmt: skip
    return data, scale


#: column steps of ``launch_shape`` columns per program of a dense launch, along the second grid axis:
#: a 4096x14336 weight then gets thousands of programs (bench/device/kernel_lab.py on the H200: NVFP4
#: 69 us, 105 us with one program per 16 rows looping over the row). Per kernel: the amax pass reads
#: only, so longer spans. Grouped launches (many tensors: thousands of row blocks already) keep one
#: program per block of rows (``CH`` 0), as measured in bench/live_sync.py.
NVFP4_STEPS = 2
#: column steps per program of the dense NVFP4 kernel on large matrices: each program computes its
#: rows' outer scales (three IEEE divisions) once, so more steps spread that over more work. 14336x4096
#: bf16 (bench/live_sync.py's sweep, BC=256): 4 steps 1793 against 1701 GB/s with 2 on an H200, 1807
#: against 1800 on an H100 (bench/results/live-sync-h*-stop31-kernels.txt)
NVFP4_LARGE_STEPS = 4
#: programs the grid keeps with the large steps: about 16 per SM of an H100 or H200 (132 SMs), so
#: smaller matrices keep their parallelism instead
NVFP4_LARGE_GRID = 2048
MXFP8_STEPS = 1


def nvfp4_steps(rows: int, cols: int, bc: int) -> int:
    """Column steps per program of the dense NVFP4 kernel: :data:`NVFP4_LARGE_STEPS` where the grid
    still has :data:`NVFP4_LARGE_GRID` programs, else :data:`NVFP4_STEPS`."""
    large = triton.cdiv(rows, BLOCK_ROWS) * spans(cols, bc, NVFP4_LARGE_STEPS)
    return NVFP4_LARGE_STEPS if large >= NVFP4_LARGE_GRID else NVFP4_STEPS


def spans(cols: int, bc: int, steps: int) -> int:
    """Programs along a row: spans of ``steps`` steps of ``bc`` columns."""
    return triton.cdiv(cols, bc * steps)


def launch_shape(cols: int, block: int) -> int:
    """Columns per inner step: up to 256 for NVFP4 (16 blocks of 16) and MXFP8 (8 blocks of 32),
    never past the row (a power of two; triton ranges must be)."""
    bc = 256
    while bc > block and bc // 2 >= cols:
        bc //= 2
    return bc


__all__ = [
    "MXFP8_STEPS",
    "NVFP4_LARGE_GRID",
    "NVFP4_LARGE_STEPS",
    "NVFP4_STEPS",
    "_amax_dense_kernel",
    "_amax_seg_kernel",
    "_mxfp8_bf16_dense_kernel",
    "_mxfp8_dense_kernel",
    "_mxfp8_seg_kernel",
    "_nvfp4_dense_kernel",
    "_nvfp4_seg_kernel",
    "_nvfp4_tensor_kernel",
    "hardware_e4m3",
    "has_e4m3_instruction",
    "launch_persistent",
    "launch_shape",
    "mxfp8_col_dense",
    "mxfp8_dense",
    "nvfp4_dense",
    "nvfp4_steps",
    "outer_scales",
    "programs_per_sm",
    "spans",
    "tensor_amax",
    "word_path",
]
