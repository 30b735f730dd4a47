/*
 * fp4convert native CPU kernels: single-pass NVFP4 (1x16, 4over6) and MXFP8 (1x32) row quantizers.
 *
 * These are the fast paths of fp4convert.formats; the pure-torch code in nvfp4.py / mxfp8.py,
 * profiles.py and four_over_six.py is the specification (docs/formats.md), and tests compare every
 * byte of both. Build flags matter:
 * -ffp-contract=off (no fused multiply-add), no -ffast-math (IEEE division, denormals kept), so
 * every float operation below is one correctly rounded binary32 operation, as in TE's kernels.
 * Loaded through ctypes, which releases the GIL: Python threads run row ranges in parallel.
 * The entry points are built twice where the compiler can (x86-64 with GCC's ifunc): for AVX2 and
 * for the baseline, the loader picks by CPU. The same IEEE operations either way (contraction off, so
 * no FMA): only the vector width differs. AVX2 ran NVFP4 1.55x faster on one core of a bf16 expert.
 */
#include <stdint.h>
#include <string.h>

#define FP4C_ABI_VERSION 4

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FP4C_ENTRY __attribute__((target_clones("avx2", "default")))
#else
#define FP4C_ENTRY
#endif

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
/* kernels.PROFILE_CODES; 3 (4over6) has its own entry point, fp4c_nvfp4_4over6_rows */
enum { PROFILE_TE = 0, PROFILE_TE_2_13 = 1, PROFILE_MODELOPT = 2 };

static const float FLT_MAX_F = 3.40282346638528859812e+38f;

int fp4c_abi_version(void) { return FP4C_ABI_VERSION; }

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float half_to_float(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) return u2f(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in binary32 */
        float mag = (float)man * 5.9604644775390625e-8f;
        return u2f(f2u(mag) | sign);
    }
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Load element i of a row as float32 (widening is exact for every input dtype). */
static inline float load(const void *row, int dtype, int64_t i) {
    if (dtype == DT_BF16) return u2f(((uint32_t)((const uint16_t *)row)[i]) << 16);
    if (dtype == DT_F16) return half_to_float(((const uint16_t *)row)[i]);
    return ((const float *)row)[i];
}

/* NaN-ignoring |x| (TE's fmaxf/__hmax reductions skip NaN): NaN becomes 0. */
static inline float abs_nan0(float x) {
    float a = u2f(f2u(x) & 0x7FFFFFFFu);
    return (a == a) ? a : 0.0f;
}

/* float32 >= 0 (or NaN) -> E4M3 byte, satfinite RNE: >448 -> 0x7E, NaN -> 0x7F. */
static inline uint8_t e4m3_from_nonneg(float d) {
    if (!(d == d)) return 0x7F;
    if (d >= 448.0f) return 0x7E;
    if (d < 0.015625f) {
        /* below the smallest normal 2^-6: subnormal grid step 2^-9. d*512 is exact; adding and
         * subtracting 2^23 rounds it to an integer with ties to even (0..8; 8 encodes 2^-6). */
        float q = (d * 512.0f + 8388608.0f) - 8388608.0f;
        return (uint8_t)q;
    }
    uint32_t b = f2u(d);
    b += 0x7FFFFu + ((b >> 20) & 1u); /* round the 23-bit mantissa to 3 bits, ties to even */
    uint32_t code = ((((b >> 23) & 0xFFu) - 127u + 7u) << 3) | ((b >> 20) & 7u);
    return code > 0x7Eu ? 0x7E : (uint8_t)code;
}

static float E4M3_LUT[128];
static int lut_ready = 0;

static void init_lut(void) {
    if (lut_ready) return;
    for (int c = 0; c < 128; ++c) {
        int e = c >> 3, m = c & 7;
        float v = (e == 0) ? (float)m * 0.001953125f /* 2^-9 */
                           : (1.0f + (float)m * 0.125f) * u2f((uint32_t)(e - 7 + 127) << 23);
        E4M3_LUT[c] = v;
    }
    lut_ready = 1;
}

/* Smallest power of two >= v as an E8M0 exponent (cvt.rp.satfinite.ue8m0x2.f32), v >= 0. */
static inline uint8_t e8m0_roundup(float v) {
    uint32_t b = f2u(v);
    uint32_t e = (b >> 23) & 0xFFu, m = b & 0x7FFFFFu;
    if (e == 0xFF) return m ? 0xFF : 0xFE;
    if (e == 0) return m > 0x400000u ? 1 : 0;
    if (m != 0 && e < 0xFE) ++e;
    return (uint8_t)e;
}

/*
 * The hot loops below are written branch-free over whole rows so the compiler vectorizes them
 * (no -ffast-math needed): maxima of non-negative floats are taken on their bit patterns (same
 * order as the values), conversions are selects. target_clones builds AVX-512, AVX2 and baseline
 * copies and picks one at load time; every copy performs the same IEEE operations.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP4C_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define FP4C_CLONES
#endif

#define MAX_COLS_STACK 8192

/* Widen one row to float32 (exact for every input dtype). */
static inline void widen_row(const void *row, int dtype, int64_t cols, float *out) {
    if (dtype == DT_BF16) {
        const uint16_t *h = (const uint16_t *)row;
        for (int64_t i = 0; i < cols; ++i) out[i] = u2f(((uint32_t)h[i]) << 16);
    } else if (dtype == DT_F16) {
        const uint16_t *h = (const uint16_t *)row;
        for (int64_t i = 0; i < cols; ++i) out[i] = half_to_float(h[i]);
    } else {
        memcpy(out, row, (size_t)cols * sizeof(float));
    }
}

/* NaN-ignoring |x| bits: NaN -> 0; non-negative float bits order like their values. */
static inline uint32_t abs_bits(float x) {
    uint32_t a = f2u(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 0u : a;
}

/*
 * Block maxima of |x| over blocks of `block` elements (even; NaN ignored), nb * block at most
 * MAX_COLS_STACK: first the larger of each block's two halves lane by lane (contiguous vectors),
 * then each block's maximum of those. Written as one loop over each block's elements, the compiler
 * vectorized across blocks with permutes and spills, a third of the NVFP4 kernel's time; this way
 * one core quantizes NVFP4 1.23-1.27x and MXFP8 2.0x as fast, the same bytes (bench/cpu_kernels.py,
 * bench/results/cpu-kernels-one-core-stop31.txt).
 */
static inline void blocks_amax(const float *x, int64_t nb, int block, float *out) {
    uint32_t a[MAX_COLS_STACK / 2];
    int w = block / 2;
    for (int64_t b = 0; b < nb; ++b) /* the larger half of each block, 8 or 16 lanes at a time */
        for (int k = 0; k < w; ++k) {
            uint32_t lo = abs_bits(x[2 * w * b + k]), hi = abs_bits(x[2 * w * b + w + k]);
            a[w * b + k] = lo > hi ? lo : hi;
        }
    for (int64_t b = 0; b < nb; ++b) {
        uint32_t m = 0;
        for (int k = 0; k < w; ++k) m = a[w * b + k] > m ? a[w * b + k] : m;
        out[b] = u2f(m);
    }
}

/* Branch-free E4M3 satfinite RNE of a float32 with its sign (NaN -> 0x7F), in a 32-bit lane. */
static inline uint32_t e4m3_code(float y) {
    uint32_t u = f2u(y);
    uint32_t a = u & 0x7FFFFFFFu;
    float af = u2f(a);
    float small = af < 0.015625f ? af : 0.0f;
    uint32_t sub = (uint32_t)(int32_t)((small * 512.0f + 8388608.0f) - 8388608.0f);
    uint32_t b = a + 0x7FFFFu + ((a >> 20) & 1u);
    uint32_t normal = (((b >> 23) - 120u) << 3) | ((b >> 20) & 7u);
    uint32_t code = af < 0.015625f ? sub : normal;
    code = (af < 0.015625f || code <= 0x7Eu) ? code : 0x7Eu;
    code = a > 0x7F800000u ? 0x7Fu : (code | ((u >> 24) & 0x80u));
    return code;
}

/* The same code as a byte. */
static inline uint8_t e4m3_any(float y) { return (uint8_t)e4m3_code(y); }

/* a < 6 ? a : 6: 6 where a is NaN too, the semantics of x86's minps (one instruction; fminf's) */
static inline float min6(float a) { return a < 6.0f ? a : 6.0f; }

/*
 * Branch-free E2M1 code of a float32 (RNE, saturating, NaN -> 0x7), in a 32-bit lane: the GPU
 * kernels' one-add rounding (_triton_segments._e2m1 says how), fewer vector operations than the
 * seven threshold comparisons it equals (tests/formats/test_native_units.py: every bf16 value and
 * the float32 patterns around each threshold; bench/e2m1_all_patterns.py: all 2^32 patterns).
 * |y| clamped by min6 is 6.0 for NaN too, and min6(y) keeps y's sign except for NaN (TE's +6):
 * no NaN compare and select.
 */
static inline uint32_t e2m1_code(float y, int signed_zero) {
    float a = min6(u2f(f2u(y) & 0x7FFFFFFFu)); /* |y| at most 6.0; inf and NaN too */
    uint32_t c = f2u(a);
    uint32_t e = (c > 0x3F800000u ? c : 0x3F800000u) & 0x7F800000u;
    uint32_t m = f2u(a + u2f(e + (e >> 22) + (0x0B000000u - 254u))) - e - 0x0B000000u;
    uint32_t neg = signed_zero ? (f2u(min6(y)) >> 31) : (uint32_t)(y < 0.0f);
    return m | (neg << 3);
}

/* The same code as a byte. */
static inline uint8_t e2m1_any(float y, int signed_zero) { return (uint8_t)e2m1_code(y, signed_zero); }

/*
 * Largest NaN-ignoring magnitude bits of n 16-bit floats (bf16: NaN above 0x7F80, fp16: above
 * 0x7C00). Non-negative bit patterns order like their values, so the maximum is taken on 16-bit
 * integers: twice the lanes of a float32 maximum, and no widening.
 */
static inline uint16_t absmax_bits16(const uint16_t *h, int64_t n, uint16_t inf_bits) {
    uint16_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint16_t a = (uint16_t)(h[i] & 0x7FFFu);
        uint16_t keep = (uint16_t)(0u - (unsigned)(a <= inf_bits)); /* NaN -> 0, as masks: vectorizes */
        a = (uint16_t)(a & keep);
        m = m > a ? m : a;
    }
    return m;
}

static inline uint32_t absmax_bits32(const float *x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t a = abs_bits(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

/* NaN-ignoring amax of one row as float32 (widening the 16-bit maximum is exact). */
static inline float row_absmax(const char *row, int dtype, int64_t cols) {
    if (dtype == DT_BF16) return u2f((uint32_t)absmax_bits16((const uint16_t *)row, cols, 0x7F80u) << 16);
    if (dtype == DT_F16) return half_to_float(absmax_bits16((const uint16_t *)row, cols, 0x7C00u));
    return u2f(absmax_bits32((const float *)row, cols));
}

/* Per-row NaN-ignoring amax of rows [r0, r1). */
FP4C_CLONES
FP4C_ENTRY void fp4c_absmax_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols,
                      int64_t ld, float *out) {
    int esize = dtype == DT_F32 ? 4 : 2;
    for (int64_t r = r0; r < r1; ++r) out[r] = row_absmax((const char *)src + r * ld * esize, dtype, cols);
}

/* NaN-ignoring amax of rows [r0, r1) as one value (a max of maxima: order-free, so task
 * partials combine to the same bits). */
FP4C_CLONES
FP4C_ENTRY float fp4c_absmax_range(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld) {
    int esize = dtype == DT_F32 ? 4 : 2;
    float m = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
        float a = row_absmax((const char *)src + r * ld * esize, dtype, cols);
        m = a > m ? a : m;
    }
    return m;
}

/*
 * NaN and infinity counts of n contiguous elements (out[0] NaN, out[1] +-inf), on the bit
 * patterns: all-ones exponent with a zero mantissa is inf, with any other mantissa NaN. A first
 * pass takes the largest magnitude bits (a vectorized integer maximum, at memory speed); only a
 * tensor that has a non-finite value is counted.
 */
FP4C_CLONES
FP4C_ENTRY void fp4c_nonfinite_count(const void *src, int dtype, int64_t n, int64_t *out) {
    int64_t nan = 0, inf = 0;
    if (dtype == DT_F32) {
        const uint32_t *u = (const uint32_t *)src;
        uint32_t m = 0;
        for (int64_t i = 0; i < n; ++i) {
            uint32_t a = u[i] & 0x7FFFFFFFu;
            m = a > m ? a : m;
        }
        if (m >= 0x7F800000u) {
            for (int64_t i = 0; i < n; ++i) {
                uint32_t a = u[i] & 0x7FFFFFFFu;
                nan += a > 0x7F800000u;
                inf += a == 0x7F800000u;
            }
        }
    } else {
        const uint16_t exp = dtype == DT_BF16 ? 0x7F80u : 0x7C00u;
        const uint16_t *h = (const uint16_t *)src;
        uint16_t m = 0;
        for (int64_t i = 0; i < n; ++i) {
            uint16_t a = h[i] & 0x7FFFu;
            m = a > m ? a : m;
        }
        if (m >= exp) {
            for (int64_t i = 0; i < n; ++i) {
                uint16_t a = h[i] & 0x7FFFu;
                nan += a > exp;
                inf += a == exp;
            }
        }
    }
    out[0] = nan;
    out[1] = inf;
}

/*
 * NaN-ignoring 16x16 tile amaxes of rows [r0, r1) (multiples of 16), each tile's value written to
 * all 16 of its rows: out is (rows, cols/16), the block_amax the NVFP4 kernels take for 16x16 tiles.
 */
FP4C_CLONES
FP4C_ENTRY void fp4c_tile_amax_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld, float *out) {
    int esize = dtype == DT_F32 ? 4 : 2;
    int64_t nb = cols / 16;
    for (int64_t g = r0; g < r1; g += 16) {
        for (int64_t c0 = 0; c0 < cols; c0 += MAX_COLS_STACK) {
            int64_t width = cols - c0 < MAX_COLS_STACK ? cols - c0 : MAX_COLS_STACK;
            int64_t nbc = width / 16;
            float x[MAX_COLS_STACK], row[MAX_COLS_STACK / 16], tile[MAX_COLS_STACK / 16];
            for (int64_t b = 0; b < nbc; ++b) tile[b] = 0.0f;
            for (int j = 0; j < 16; ++j) {
                widen_row((const char *)src + ((g + j) * ld + c0) * esize, dtype, width, x);
                blocks_amax(x, nbc, 16, row);
                for (int64_t b = 0; b < nbc; ++b) tile[b] = row[b] > tile[b] ? row[b] : tile[b];
            }
            for (int j = 0; j < 16; ++j) memcpy(out + (g + j) * nb + c0 / 16, tile, (size_t)nbc * sizeof(float));
        }
    }
}

/* Scale byte and per-block multiplier (te: encode scale; modelopt: divisor) of one NVFP4 block. */
static inline uint8_t nvfp4_block_scale(float amax, float sdec, float mlt, int profile, float *factor) {
    if (profile == PROFILE_MODELOPT) {
        if (sdec == 0.0f) { /* all-zero tensor: defined as scale 1.0, zero data */
            *factor = 0.0f;
            return 0x38;
        }
        float psc = amax / mlt;
        if (psc == 0.0f) psc = 1.0f;
        if (psc < 0.001953125f) psc = 0.001953125f; /* clamp to [2^-9, 448] */
        if (psc > 448.0f) psc = 448.0f;
        uint8_t sf = e4m3_from_nonneg(psc);
        *factor = E4M3_LUT[sf] * sdec;
        return sf;
    }
    float d = (profile == PROFILE_TE) ? amax * mlt : (amax / 6.0f) * mlt;
    uint8_t sf = e4m3_from_nonneg(d);
    float enc = 1.0f / (E4M3_LUT[sf] * sdec);
    *factor = enc > FLT_MAX_F ? FLT_MAX_F : enc;
    return sf;
}

/* The value of an E4M3 byte's magnitude (0..0x7F) as E4M3_LUT holds it, computed: no table, so
 * a loop over blocks vectorizes (the LUT's (1 + m/8) * 2^(e-7) is this bit pattern exactly). */
static inline float e4m3_value(uint32_t c) {
    uint32_t e = (c >> 3) & 15u, m = c & 7u;
    float normal = u2f(((e + 120u) << 23) | (m << 20));
    float sub = (float)(int32_t)m * 0.001953125f;
    return e ? normal : sub;
}

/* nvfp4_block_scale's te / te-2.13 branch over a row's blocks at once, branch-free: the same
 * operations per block (e4m3_any equals e4m3_from_nonneg on the non-negative or NaN scales here),
 * vectorized instead of one scalar division and a few branches per 16 elements. */
static inline void te_block_scales(const float *amax, int64_t nbc, float sdec, float mlt, int profile,
                                   uint8_t *scale, float *factor) {
    const int te = profile == PROFILE_TE;
    for (int64_t b = 0; b < nbc; ++b) {
        float d = te ? amax[b] * mlt : (amax[b] / 6.0f) * mlt;
        uint32_t sf = e4m3_any(d);
        float enc = 1.0f / (e4m3_value(sf) * sdec);
        factor[b] = enc > FLT_MAX_F ? FLT_MAX_F : enc;
        scale[b] = (uint8_t)sf;
    }
}

/*
 * The outer scales (profiles.outer_scales: s_dec, mult) of one unit amax, with exactly its float32
 * operations (and _triton_segments._outer's): te / te-2.13 S_enc = gmax / A, inf -> FLT_MAX, 1 where
 * A == 0 or S_enc == 0, S_dec = 1 / S_enc, mult = S_enc * rn(1/6) (te) or S_enc (te-2.13); modelopt
 * s2 = A / gmax, mult = s2 * 6.
 */
static inline void outer_scale(float a, int profile, float gmax, float *s_dec, float *mult) {
    if (profile == PROFILE_MODELOPT) {
        float s2 = a / gmax;
        *s_dec = s2;
        *mult = s2 * 6.0f;
        return;
    }
    float s_enc = gmax / a;
    if ((f2u(s_enc) & 0x7FFFFFFFu) == 0x7F800000u) s_enc = FLT_MAX_F; /* torch.isinf: either sign */
    if (a == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
    *s_dec = 1.0f / s_enc;
    *mult = profile == PROFILE_TE ? s_enc * (1.0f / 6.0f) : s_enc;
}

/* The outer scales of n unit amaxes (s_dec, mult; outer_scale): what the converter stores as the
 * global scale, from the same operations the row kernels use. */
FP4C_ENTRY void fp4c_outer_scales(const float *amax, int64_t n, int profile, float gmax, float *s_dec, float *mult) {
    for (int64_t i = 0; i < n; i++) outer_scale(amax[i], profile, gmax, &s_dec[i], &mult[i]);
}

/*
 * NVFP4 1x16 rows [r0, r1) of a (rows, cols) matrix with row stride ld (elements). The outer scales
 * of row r come from s_dec[r] / mult[r] (profiles.OuterScales) or, when unit_amax is not NULL, are
 * computed here from unit_amax[r / unit_rows] (outer_scale). block_amax: NULL, or a (rows, cols/16)
 * float array used instead of each block's own amax (16x16 tiles).
 * Writes data (rows, cols/2) and scale (rows, cols/16).
 */
/* always inlined: each entry point's AVX2 clone then compiles it for AVX2 (a call would reach the baseline copy) */
static inline __attribute__((always_inline)) void nvfp4_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld,
                              const float *s_dec, const float *mult, const float *unit_amax, int64_t unit_rows,
                              float gmax, const float *block_amax, int profile, uint8_t *out_data,
                              uint8_t *out_scale) {
    init_lut();
    int esize = dtype == DT_F32 ? 4 : 2;
    int64_t nb = cols / 16;
    int signed_zero = profile != PROFILE_MODELOPT;
    for (int64_t c0 = 0; c0 < cols; c0 += MAX_COLS_STACK) {
        /* rows are processed in column chunks so the scratch buffers stay on the stack */
        int64_t width = cols - c0 < MAX_COLS_STACK ? cols - c0 : MAX_COLS_STACK;
        int64_t nbc = width / 16;
        float x[MAX_COLS_STACK], fx[MAX_COLS_STACK], amax[MAX_COLS_STACK / 16], factor[MAX_COLS_STACK / 16];
        uint32_t codes[MAX_COLS_STACK];
        for (int64_t r = r0; r < r1; ++r) {
            float row_sdec, row_mult;
            if (unit_amax) outer_scale(unit_amax[r / unit_rows], profile, gmax, &row_sdec, &row_mult);
            else { row_sdec = s_dec[r]; row_mult = mult[r]; }
            const char *row = (const char *)src + (r * ld + c0) * esize;
            widen_row(row, dtype, width, x);
            if (block_amax) memcpy(amax, block_amax + r * nb + c0 / 16, (size_t)nbc * sizeof(float));
            else blocks_amax(x, nbc, 16, amax);
            uint8_t *scale = out_scale + r * nb + c0 / 16;
            if (profile == PROFILE_MODELOPT)
                for (int64_t b = 0; b < nbc; ++b) scale[b] = nvfp4_block_scale(amax[b], row_sdec, row_mult, profile, &factor[b]);
            else
                te_block_scales(amax, nbc, row_sdec, row_mult, profile, scale, factor);
            /* each block's factor spread over its 16 elements, then one flat loop over the row:
             * the compiler vectorizes that at the full vector width (a 16-element loop per block
             * got 4-wide vectors and spilled) */
            for (int64_t b = 0; b < nbc; ++b)
                for (int i = 0; i < 16; ++i) fx[b * 16 + i] = factor[b];
            /* codes kept in 32-bit lanes until the pack: narrowing each compare to bytes cost more */
            if (profile == PROFILE_MODELOPT) {
                for (int64_t i = 0; i < width; ++i) codes[i] = fx[i] == 0.0f ? 0 : e2m1_code(x[i] / fx[i], 0);
            } else if (signed_zero) {
                for (int64_t i = 0; i < width; ++i) codes[i] = e2m1_code(x[i] * fx[i], 1);
            }
            uint8_t *dst = out_data + r * (cols / 2) + c0 / 2;
            for (int64_t i = 0; i < width / 2; ++i) dst[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
        }
    }
}

/* NVFP4 rows with per-row outer scales given (s_dec[r], mult[r]): the segment kernels' entry point. */
FP4C_CLONES
FP4C_ENTRY void fp4c_nvfp4_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld,
                     const float *s_dec, const float *mult, const float *block_amax, int profile,
                     uint8_t *out_data, uint8_t *out_scale) {
    nvfp4_rows(src, dtype, r0, r1, cols, ld, s_dec, mult, NULL, 1, 0.0f, block_amax, profile, out_data, out_scale);
}

/*
 * NVFP4 rows whose outer scales are computed here: row r takes the outer amax
 * unit_amax[r / unit_rows] (tensor scope: one amax, unit_rows = rows; expert scope: one per
 * expert; row scope: unit_rows = 1) and gmax, the profile's global bound (profiles.ProfileSpec).
 */
FP4C_CLONES
FP4C_ENTRY void fp4c_nvfp4_unit_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld,
                          const float *unit_amax, int64_t unit_rows, float gmax, const float *block_amax,
                          int profile, uint8_t *out_data, uint8_t *out_scale) {
    nvfp4_rows(src, dtype, r0, r1, cols, ld, NULL, NULL, unit_amax, unit_rows, gmax, block_amax, profile, out_data,
               out_scale);
}

/* Magnitude of E2M1 code m (0..7): 0, .5, 1, 1.5, 2, 3, 4, 6 (select chain: vectorizes). */
static inline float e2m1_magnitude(uint32_t m) {
    float half_steps = (float)m * 0.5f;
    float whole = (float)m - 2.0f;
    return m <= 4u ? half_steps : (m == 7u ? 6.0f : whole);
}

#define FOUR_OVER_SIX_CHUNK 512 /* columns per pass: 16 rows x 2 candidates of codes stay in L1 */
#define FOS_NB (FOUR_OVER_SIX_CHUNK / 16)

/*
 * Both 4over6 candidates of every block of one row chunk. The element loop is outside the block
 * loop, so each block's error is still accumulated in element order (four_over_six.py) while the
 * compiler vectorizes across blocks. xt[i][b] is element i of block b; codes come out the same way.
 */
static inline void four_over_six_row(const float (*xt)[FOS_NB], const float *amax, int64_t nbc, float a_row,
                                     float s_enc, float s_dec, float denom, int mse, uint8_t *sf4, uint8_t *sf6,
                                     float *err4, float *err6, uint8_t (*c4)[FOS_NB], uint8_t (*c6)[FOS_NB]) {
    float enc4[FOS_NB], enc6[FOS_NB], v4[FOS_NB], v6[FOS_NB];
    for (int64_t b = 0; b < nbc; ++b) {
        float base = (amax[b] / 6.0f) * s_enc;
        sf6[b] = e4m3_from_nonneg(base);
        sf4[b] = e4m3_from_nonneg(base * 1.5f);
        v4[b] = E4M3_LUT[sf4[b]];
        v6[b] = E4M3_LUT[sf6[b]];
        float e4 = 1.0f / (v4[b] * s_dec), e6 = 1.0f / (v6[b] * s_dec);
        enc4[b] = e4 > FLT_MAX_F ? FLT_MAX_F : e4;
        enc6[b] = e6 > FLT_MAX_F ? FLT_MAX_F : e6;
        err4[b] = 0.0f;
        err6[b] = 0.0f;
    }
    for (int i = 0; i < 16; ++i) {
        for (int64_t b = 0; b < nbc; ++b) {
            const float x = xt[i][b];
            uint8_t k4 = e2m1_any(x * enc4[b], 1), k6 = e2m1_any(x * enc6[b], 1);
            c4[i][b] = k4;
            c6[i][b] = k6;
            float q4 = e2m1_magnitude(k4 & 7u), q6 = e2m1_magnitude(k6 & 7u);
            q4 = (k4 & 8u) ? -q4 : q4;
            q6 = (k6 & 8u) ? -q6 : q6;
            float d4 = ((q4 * v4[b]) * a_row) / denom - x;
            float d6 = ((q6 * v6[b]) * a_row) / denom - x;
            float m4 = d4 < 0.0f ? -d4 : d4, m6 = d6 < 0.0f ? -d6 : d6;
            err4[b] = err4[b] + (mse ? d4 * d4 : m4);
            err6[b] = err6[b] + (mse ? d6 * d6 : m6);
        }
    }
}

/*
 * NVFP4 4over6 rows [r0, r1): for each block both candidates (map-to-6: E4M3(rn(a/6) * S_enc),
 * map-to-4: E4M3(rn(that * 1.5))), the lower error wins, ties (and NaN errors) go to map-to-6.
 * tile_rows 16: block_amax holds the 16x16 tile amaxes, r0 and r1 are multiples of 16, and the
 * 16 row errors of a tile are summed in TE's warp-reduction order before the one choice.
 * amax/s_enc/s_dec[r]: the row's outer scales; denom: 6 * B (2688 or 1536); choice: NULL or
 * (rows, cols/16) bytes, 1 where a block took map-to-4.
 */
FP4C_CLONES
FP4C_ENTRY void fp4c_nvfp4_4over6_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld,
                            const float *amax_row, const float *s_enc, const float *s_dec,
                            const float *block_amax, int tile_rows, int mse, float denom, uint8_t *out_data,
                            uint8_t *out_scale, uint8_t *out_choice) {
    init_lut();
    int esize = dtype == DT_F32 ? 4 : 2;
    int64_t nb = cols / 16;
    float x[FOUR_OVER_SIX_CHUNK], xt[16][FOS_NB], amax[FOS_NB];
    float err4[16][FOS_NB], err6[16][FOS_NB];
    uint8_t sf4[16][FOS_NB], sf6[16][FOS_NB];
    uint8_t c4[16][16][FOS_NB], c6[16][16][FOS_NB];
    for (int64_t g = r0; g < r1; g += tile_rows) {
        for (int64_t c0 = 0; c0 < cols; c0 += FOUR_OVER_SIX_CHUNK) {
            int64_t width = cols - c0 < FOUR_OVER_SIX_CHUNK ? cols - c0 : FOUR_OVER_SIX_CHUNK;
            int64_t nbc = width / 16;
            for (int j = 0; j < tile_rows; ++j) {
                int64_t r = g + j;
                widen_row((const char *)src + (r * ld + c0) * esize, dtype, width, x);
                if (block_amax) memcpy(amax, block_amax + r * nb + c0 / 16, (size_t)nbc * sizeof(float));
                else blocks_amax(x, nbc, 16, amax);
                for (int64_t b = 0; b < nbc; ++b)
                    for (int i = 0; i < 16; ++i) xt[i][b] = x[b * 16 + i];
                four_over_six_row((const float (*)[FOS_NB])xt, amax, nbc, amax_row[r], s_enc[r], s_dec[r], denom,
                                  mse, sf4[j], sf6[j], err4[j], err6[j], c4[j], c6[j]);
            }
            for (int64_t b = 0; b < nbc; ++b) {
                int pick4;
                if (tile_rows == 16) {
                    float t4[8], t6[8];
                    for (int i = 0; i < 8; ++i) { t4[i] = err4[i][b] + err4[i + 8][b]; t6[i] = err6[i][b] + err6[i + 8][b]; }
                    for (int i = 0; i < 4; ++i) { t4[i] = t4[i] + t4[i + 4]; t6[i] = t6[i] + t6[i + 4]; }
                    for (int i = 0; i < 2; ++i) { t4[i] = t4[i] + t4[i + 2]; t6[i] = t6[i] + t6[i + 2]; }
                    pick4 = (t4[0] + t4[1]) < (t6[0] + t6[1]);
                } else {
                    pick4 = err4[0][b] < err6[0][b];
                }
                for (int j = 0; j < tile_rows; ++j) {
                    int64_t r = g + j;
                    uint8_t (*codes)[FOS_NB] = pick4 ? c4[j] : c6[j];
                    out_scale[r * nb + c0 / 16 + b] = pick4 ? sf4[j][b] : sf6[j][b];
                    if (out_choice) out_choice[r * nb + c0 / 16 + b] = (uint8_t)pick4;
                    uint8_t *dst = out_data + r * (cols / 2) + c0 / 2 + b * 8;
                    for (int k = 0; k < 8; ++k) dst[k] = (uint8_t)(codes[2 * k][b] | (codes[2 * k + 1][b] << 4));
                }
            }
        }
    }
}

/* MXFP8 1x32 rows [r0, r1): data (rows, cols) E4M3 bytes, scale (rows, cols/32) E8M0. */
FP4C_CLONES
FP4C_ENTRY void fp4c_mxfp8_rows(const void *src, int dtype, int64_t r0, int64_t r1, int64_t cols, int64_t ld,
                     uint8_t *out_data, uint8_t *out_scale) {
    const float r448 = 1.0f / 448.0f; /* rn32(1/448) = 0x3B124925, TE's max_norm_rcp */
    int esize = dtype == DT_F32 ? 4 : 2;
    int64_t nb = cols / 32;
    for (int64_t c0 = 0; c0 < cols; c0 += MAX_COLS_STACK) {
        int64_t width = cols - c0 < MAX_COLS_STACK ? cols - c0 : MAX_COLS_STACK;
        int64_t nbc = width / 32;
        float x[MAX_COLS_STACK], fx[MAX_COLS_STACK], amax[MAX_COLS_STACK / 32];
        uint32_t codes[MAX_COLS_STACK];
        for (int64_t r = r0; r < r1; ++r) {
            const char *row = (const char *)src + (r * ld + c0) * esize;
            widen_row(row, dtype, width, x);
            blocks_amax(x, nbc, 32, amax);
            uint8_t *scale = out_scale + r * nb + c0 / 32;
            for (int64_t b = 0; b < nbc; ++b) {
                uint8_t e = e8m0_roundup(amax[b] * r448);
                scale[b] = e;
                float inv = (e == 254) ? u2f(0x00400000u) : u2f((uint32_t)(254 - e) << 23); /* 2^(127-e) */
                for (int i = 0; i < 32; ++i) fx[b * 32 + i] = inv;
            }
            /* as in nvfp4_rows: one flat loop at the full vector width, codes in 32-bit lanes */
            for (int64_t i = 0; i < width; ++i) codes[i] = e4m3_code(x[i] * fx[i]);
            uint8_t *dst = out_data + r * cols + c0;
            for (int64_t i = 0; i < width; ++i) dst[i] = (uint8_t)codes[i];
        }
    }
}
