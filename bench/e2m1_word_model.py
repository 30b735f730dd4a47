"""A numpy model of ``_triton_segments._e2m1_word``'s PTX (bf16 words -> eight E2M1 codes in one word),
each way ``e2m1_word_ptx`` gathers the codes, against the specification's threshold comparisons, on
every bf16 value at each of the eight positions times 12 encode factors: a check of the sequence's
arithmetic (constants, shift order) on a machine without a GPU. The GPU's own bytes:
tests/formats/test_cuda.py (the word path is on by default).

    python bench/e2m1_word_model.py
"""

from __future__ import annotations

import numpy as np

TINY = float(np.finfo(np.float32).tiny)
ENCODE_FACTORS = [
    1.0,
    0.5,
    2.0,
    1 / 3,
    6 / 448,
    448.0,
    1e-30,
    TINY,
    TINY / 1024,
    2.0**-149,
    1e30,
    3.4028234663852886e38,
]


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def specification(y: np.ndarray) -> np.ndarray:
    """``_triton._e2m1_code(y, True)``: seven thresholds, the sign bit, NaN -> 7."""
    a = np.abs(y)
    m = sum((a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5.0), np.zeros(a.shape, np.uint32))
    return np.where(a == a, m | ((_bits(y) >> 31) << 3), 7).astype(np.uint32)


def model(words: list[np.ndarray], enc: np.float32, pack: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """The PTX under ``pack`` (``e2m1_word_ptx``'s choices), instruction by instruction: (code words,
    the eight products)."""
    xs = [f(w) for w in words for f in (lambda w: _f32(w << 16), lambda w: _f32(w & 0xFFFF0000))]
    ys = []
    for x in xs:
        y = (x * enc).astype(np.float32)
        y.view(np.uint32)[np.isnan(y)] = 0x7FFFFFFF  # a NaN product on the GPU: the canonical NaN
        ys.append(y)
    sums, us = [], []
    for y in ys:
        a = np.fmin(np.abs(y), np.float32(6.0))  # min.f32: NaN -> 6
        u = np.maximum(_bits(a), 0x3F800000) & 0x7F800000
        if pack == "horner-hi":  # mul.hi.u32 c, u, 1025
            offset = ((u.astype(np.uint64) * 1025) >> 32).astype(np.uint32)
        else:
            offset = u >> 22
        c = u + offset + 184549122
        sums.append(_bits((a + _f32(c)).astype(np.float32)))
        us.append(u)
    m = np.zeros(words[0].shape, np.uint32)
    if pack == "shift":
        for t in sums:  # shf.r.wrap m, m, t, 4: t's low nibble in at the top
            m = (m >> 4) | (t << 28)
    else:  # mad.lo m, m, 16, t from the last sum to the first (mod 2^32), then what they carried
        for t in reversed(sums):
            m = m * np.uint32(16) + t
        m = m - us[2] * np.uint32(256) - us[1] * np.uint32(16) - us[0] + np.uint32(0x45000000)
    s = np.zeros(words[0].shape, np.uint32)
    for y in reversed(ys):  # shf.l.wrap s, y, s, 4: y's top nibble in at the bottom
        s = (s << 4) | (_bits(y) >> 28)
    return (m | (s & 0x88888888)).astype(np.uint32), ys


def main() -> None:
    np.seterr(all="ignore")
    v = np.arange(65536, dtype=np.uint32)
    values = [(v + 8191 * j) & 0xFFFF for j in range(8)]  # every bf16 at every position
    words = [values[2 * k] | (values[2 * k + 1] << 16) for k in range(4)]
    for pack in ("shift", "horner", "horner-hi"):
        differing = 0
        for enc in ENCODE_FACTORS:
            got, ys = model(words, np.float32(enc), pack)
            want = sum((specification(y) << (4 * j) for j, y in enumerate(ys)), np.zeros(got.shape, np.uint32))
            differing += int((got != want).sum())
        print(f"{pack:9}: {len(ENCODE_FACTORS)} encode factors x 65536 words of eight bf16: {differing} words differ")


if __name__ == "__main__":
    main()
