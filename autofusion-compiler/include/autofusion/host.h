/* autofusion host prelude: the helpers every generated host C file includes (af_expf and the
 * other vectorisable math, the per-ISA matmul micro-kernels and their run-time choice). Also
 * compiled into the host calibration, so the calibration measures the very GEMM tile the
 * kernels use. Part of autofusion-compiler; written next to the generated files by each build. */
#ifndef AUTOFUSION_HOST_H
#define AUTOFUSION_HOST_H
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* IEEE binary16 <-> binary32, round to nearest even; a NaN stays a NaN of the same sign with
 * its payload (shortened or widened) and the quiet bit set, as F16C's vcvtph2ps/vcvtps2ph and
 * the `half` crate do. Branch-free (selects, integer and float arithmetic only), so a loop
 * over them vectorises at the kernel's width (16 halves per instruction chain under
 * x86-64-v4): the branchy form kept f16 layers scalar, 8x slower than f32. */
static inline float af_bits_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t af_f32_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static inline float af_h2f(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    /* Normal (and inf/NaN): the exponent rebiased by adding 224 and scaling by 2^-112,
     * which keeps 255 for inf/NaN and quiets a signalling NaN. */
    const float normal = af_bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    /* Subnormal: the mantissa placed under the exponent of 0.5, minus 0.5 (exact). */
    const float subnormal = af_bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    return af_bits_f32(sign | (two_w < (1u << 27) ? af_f32_bits(subnormal) : af_f32_bits(normal)));
}
static inline uint16_t af_f2h(float x) {
    const uint32_t w = af_f32_bits(x), two_w = w + w, sign = w & 0x80000000u;
    /* Scaling by 2^112 then 2^-110 sends overflow to inf and leaves |x| otherwise, rounded
     * where needed; adding 2^(e+...) below makes the FPU's own round-to-nearest-even drop
     * the mantissa bits a half cannot hold. */
    float base = ((x < 0.0f ? -x : x) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = two_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = af_bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t b = af_f32_bits(base), finite = ((b >> 13) & 0x7C00u) + (b & 0x0FFFu);
    const uint32_t nan = 0x7E00u | ((w >> 13) & 0x3FFu);
    return (uint16_t)((sign >> 16) | (two_w > 0xFF000000u ? nan : finite));
}
/* bfloat16 <-> binary32, round to nearest even; NaN quieted, payload kept (as `half`). */
static inline float af_bf2f(uint16_t h) {
    const uint32_t f = (uint32_t)h << 16;
    return af_bits_f32((f & 0x7fffffffu) > 0x7f800000u ? f | 0x00400000u : f);
}
static inline uint16_t af_f2bf(float x) {
    const uint32_t f = af_f32_bits(x), rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    return (uint16_t)((f & 0x7fffffffu) > 0x7f800000u ? (f >> 16) | 0x40u : rounded);
}
/* x rounded to the nearest f16 value, as af_h2f(af_f2h(x)) but without leaving floats (every
 * op of an f16 layer rounds its result, so this is the hot path): adding 2^(e+15) to 4|x|
 * (x ~ 2^e, exponent clamped at f16's smallest normal) leaves 11 significant bits, which the
 * FPU rounds to nearest even; subtracting it again is exact. From 65520 (the tie between
 * 65504 and 2^16) on the result is inf, as the f16 encoding overflows. Equal to the round trip bit for bit except NaN payloads. */
static inline float af_round_f16(float x) {
    const uint32_t w = af_f32_bits(x), two_w = w + w, sign = w & 0x80000000u;
    const float ax = x < 0.0f ? -x : x, a = ax * 4.0f;
    uint32_t bias = two_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    const float magic = af_bits_f32((bias >> 1) + 0x07800000u);
    float r = ((magic + a) - magic) * 0.25f;
    r = ax >= 65520.0f ? INFINITY : r; /* 65520 is the tie between 65504 and 2^16: to inf */
    return x != x ? x : af_bits_f32(af_f32_bits(r) | sign);
}
static inline float af_round_bf16(float x) { return af_bf2f(af_f2bf(x)); }
/* a * b + c rounded once. The kernels are built as ISO C (no contraction of a * b + c), so
 * the polynomials ask for it: one instruction on every CPU a clone of AF_CLONES picks from
 * x86-64-v3 up, and on aarch64; the baseline x86-64 clone calls libm's fmaf (correct, slow).
 * About a quarter off af_expf and a third off af_gelu in a vectorised loop on a Sapphire
 * Rapids, at the same or better error. */
#define AF_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
/* exp(x) without a library call, branch-free so loops over it vectorise: x = n ln2 + r with
 * |r| <= ln2/2, exp(r) by a degree-6 polynomial (Cephes expf coefficients, about 1 ulp),
 * 2^n assembled in the exponent bits. Underflows to 0 below -87.3, overflows to +inf above
 * 88.7, propagates NaN. */
static inline float af_expf(float x) {
    float xc = x > 88.7228391116729996f ? 88.7228391116729996f : x;
    xc = xc < -87.3365447505531f ? -87.3365447505531f : xc;
    xc = (x == x) ? xc : 0.0f;
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = AF_FMA(n, 2.12194440e-4f, AF_FMA(n, -0.693359375f, xc));
    float p = 1.9875691500e-4f;
    p = AF_FMA(p, r, 1.3981999507e-3f);
    p = AF_FMA(p, r, 8.3334519073e-3f);
    p = AF_FMA(p, r, 4.1665795894e-2f);
    p = AF_FMA(p, r, 1.6666665459e-1f);
    p = AF_FMA(p, r, 5.0000001201e-1f);
    p = AF_FMA(p, r * r, r) + 1.0f;
    /* 2^n as 2^h * 2^(n-h): both factors stay normal for n in [-126, 128]. */
    const int32_t ni = (int32_t)n, h = ni / 2;
    const uint32_t b1 = (uint32_t)(h + 127) << 23, b2 = (uint32_t)(ni - h + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    float y = p * s1 * s2;
    y = x > 88.7228391116729996f ? INFINITY : y;
    y = x < -87.3365447505531f ? 0.0f : y;
    return (x == x) ? y : x;
}
static inline float af_sigmoid(float x) { return 1.0f / (1.0f + af_expf(-x)); }
static inline float af_silu(float x) { return x / (1.0f + af_expf(-x)); }
/* tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)), on af_expf (absolute error ~1e-7). */
static inline float af_tanhf(float x) {
    const float a = x < 0.0f ? -x : x, e = af_expf(2.0f * (a > 20.0f ? 20.0f : a));
    const float r = 1.0f - 2.0f / (e + 1.0f);
    return x < 0.0f ? -r : r;
}
/* sin and cos, branch-free (so loops over them vectorise): x reduced by 2 pi to r in
 * [-pi, pi] (k = round(x / 2 pi) by the 1.5 * 2^23 rounding trick, 2 pi split in two so that
 * k * C1 is exact), then the Taylor series to r^15 / r^16 (error below 1e-6 on [-pi, pi]).
 * Good for |x| below 2^22 * 2 pi; NaN and infinities give NaN. */
static inline float af_reduce_2pi(float x) {
    const float k = (x * 0.15915494309189535f + 12582912.0f) - 12582912.0f;
    return (x - k * 6.28125f) - k * 1.9353071795864769e-3f;
}
static inline float af_sinf(float x) {
    const float r = af_reduce_2pi(x), r2 = r * r;
    float p = -7.6471637318198164e-13f;
    p = p * r2 + 1.6059043836821613e-10f;
    p = p * r2 - 2.5052108385441720e-8f;
    p = p * r2 + 2.7557319223985893e-6f;
    p = p * r2 - 1.9841269841269841e-4f;
    p = p * r2 + 8.3333333333333332e-3f;
    p = p * r2 - 1.6666666666666666e-1f;
    p = p * r2 + 1.0f;
    return p * r;
}
static inline float af_cosf(float x) {
    const float r = af_reduce_2pi(x), r2 = r * r;
    float p = 4.7794773323873853e-14f;
    p = p * r2 - 1.1470745597729725e-11f;
    p = p * r2 + 2.0876756987868099e-9f;
    p = p * r2 - 2.7557319223985888e-7f;
    p = p * r2 + 2.4801587301587302e-5f;
    p = p * r2 - 1.3888888888888889e-3f;
    p = p * r2 + 4.1666666666666664e-2f;
    p = p * r2 - 0.5f;
    p = p * r2 + 1.0f;
    return p;
}
/* erfc(z) for z >= 0 from the Chebyshev fit in Numerical Recipes (fractional error below
 * 1.2e-7 everywhere), on af_expf: branch-free, so loops over it vectorise. */
static inline float af_erfc_pos(float z) {
    const float t = 1.0f / AF_FMA(0.5f, z, 1.0f);
    float p = 0.17087277f;
    p = AF_FMA(p, t, -0.82215223f);
    p = AF_FMA(p, t, 1.48851587f);
    p = AF_FMA(p, t, -1.13520398f);
    p = AF_FMA(p, t, 0.27886807f);
    p = AF_FMA(p, t, -0.18628806f);
    p = AF_FMA(p, t, 0.09678418f);
    p = AF_FMA(p, t, 0.37409196f);
    p = AF_FMA(p, t, 1.00002368f);
    p = AF_FMA(p, t, -1.26551223f);
    return t * af_expf(AF_FMA(-z, z, p));
}
static inline float af_erff(float x) {
    const float r = 1.0f - af_erfc_pos(x < 0.0f ? -x : x);
    return x < 0.0f ? -r : r;
}
/* x Phi(x) with Phi from erfc directly: Phi(x) = erfc(|x| / sqrt 2) / 2 below zero, one minus
 * that above. Through 1 + erf(x) instead, Phi of a negative x is a difference of two numbers
 * near 1 and loses its relative precision (6.7% off at x = -5, against 2e-6 this way). */
static inline float af_gelu(float x) {
    const float h = 0.5f * af_erfc_pos((x < 0.0f ? -x : x) * 0.70710678118654752f);
    return x * (x < 0.0f ? h : 1.0f - h);
}
static inline float af_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + af_tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
static inline int64_t af_min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* Integer values (i64, i32, bool) are computed in int64_t. Arithmetic wraps as two's complement
 * (through uint64_t: signed overflow would be undefined in C); division truncates toward zero,
 * wraps at INT64_MIN / -1 and gives 0 for a zero divisor instead of trapping. */
static inline int64_t af_iadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t af_isub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t af_imul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t af_ineg(int64_t a) { return (int64_t)(0u - (uint64_t)a); }
static inline int64_t af_idiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return af_ineg(a);
    return a / b;
}
static inline int64_t af_imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t af_imin(int64_t a, int64_t b) { return a < b ? a : b; }
/* A gather's index moved into a table of n rows: negative counts from the end; anything still
 * outside is clamped (the runtime rejects such ids of parameters before a call; computed ones
 * must not read out of bounds either). */
static inline int64_t af_gidx(int64_t i, int64_t n) {
    if (i < 0) i += n;
    return i < 0 ? 0 : (i >= n ? n - 1 : i);
}
/* An i32 value: the low 32 bits, sign-extended (two's complement wrap). */
static inline int64_t af_wrap32(int64_t a) {
    const uint32_t u = (uint32_t)(uint64_t)a;
    return u >= 0x80000000u ? (int64_t)u - 0x100000000ll : (int64_t)u;
}
/* float -> integer: truncated toward zero, saturated to the target's range, NaN -> 0 (as Rust's
 * `as`); a plain C conversion of an out-of-range value is undefined. */
static inline int64_t af_f2i64(float x) {
    if (x != x) return 0;
    if (x >= 9.2233720368547758e18f) return INT64_MAX;
    if (x <= -9.2233720368547758e18f) return INT64_MIN;
    return (int64_t)x;
}
static inline int64_t af_f2i32(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return INT32_MAX;
    if (x <= -2147483648.0f) return INT32_MIN;
    return (int64_t)x;
}
/* fmaxf/fminf semantics (a NaN operand yields the other), inline and vectorisable. */
static inline float af_fmax(float a, float b) { return ((b > a) | (a != a)) ? b : a; }
static inline float af_fmin(float a, float b) { return ((b < a) | (a != a)) ? b : a; }

/* Row helpers of the online softmax: the max of x[0..n) and m0 (NaN skipped), and
 * x[j] = exp(x[j] - m) returning the sum. Sixteen partial results make the reductions
 * independent chains the compiler vectorises (with eight, GCC 12 leaves them scalar under
 * AVX-512; see RED_LANES). */
/* Sixteen lanes in GCC's vector extension: written with scalar `p[l] = x > p[l] ? x : p[l]`
 * GCC keeps this loop scalar (sixteen vmaxss a step), as max is not a MAX_EXPR without
 * -ffinite-math-only. A NaN score is skipped, as in the scalar form. */
typedef float af_v16f __attribute__((vector_size(64)));
typedef int32_t af_v16i __attribute__((vector_size(64)));
static inline float af_vmax(const float *restrict x, int64_t n, float m0) {
    af_v16f v = {m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0, m0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        af_v16f a;
        memcpy(&a, x + j, sizeof a);
        const af_v16i gt = a > v;
        v = (af_v16f)(((af_v16i)a & gt) | ((af_v16i)v & ~gt));
    }
    float p[16];
    memcpy(p, &v, sizeof p);
    for (; j < n; ++j) p[0] = x[j] > p[0] ? x[j] : p[0];
    /* a tree, not a chain of fifteen dependent compares */
    for (int l = 8; l > 0; l /= 2)
        for (int i = 0; i < l; ++i) p[i] = p[i + l] > p[i] ? p[i + l] : p[i];
    return p[0];
}
static inline float af_vexp_sum(float *restrict x, int64_t n, float m) {
    for (int64_t j = 0; j < n; ++j) x[j] = af_expf(x[j] - m);
    float p[16];
    for (int l = 0; l < 16; ++l) p[l] = 0.0f;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; ++l) p[l] += x[j + l];
    for (; j < n; ++j) p[0] += x[j];
    for (int l = 8; l > 0; l /= 2)
        for (int i = 0; i < l; ++i) p[i] += p[i + l];
    return p[0];
}

/* Attention with few queries (decode): a score as the dot product of a query row and a key
 * row, sixteen partial sums as above; the value rows weighted by the probabilities. */
static inline float af_vdot(const float *restrict a, const float *restrict b, int64_t n) {
    float p[16];
    for (int l = 0; l < 16; ++l) p[l] = 0.0f;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; ++l) p[l] += a[j + l] * b[j + l];
    /* (the tail by lane: GCC's loop-bound check misfires on `for (; j < n; ++j)` here once
     * n is a constant inlined from the kernel) */
    for (int l = 0; l < n - j; ++l) p[l] += a[j + l] * b[j + l];
    for (int l = 8; l > 0; l /= 2)
        for (int i = 0; i < l; ++i) p[i] += p[i + l];
    return p[0];
}
/* o[c..c+w) += sum over j < m of p[j] * v[j * ldv + c..c+w), the w (<= 64) outputs held in
 * registers across all m value rows; w is a literal at every call, so the loops vectorise. */
static inline void af_vaxpy_chunk(float *restrict o, const float *restrict p, const float *restrict v,
                                  int64_t ldv, int64_t m, int64_t c, int w) {
    float acc[64];
    for (int l = 0; l < w; ++l) acc[l] = o[c + l];
    for (int64_t j = 0; j < m; ++j)
        for (int l = 0; l < w; ++l) acc[l] += p[j] * v[j * ldv + c + l];
    for (int l = 0; l < w; ++l) o[c + l] = acc[l];
}
/* o[0..n) += sum over j < m of p[j] * v[j * ldv + 0..n): a block of probabilities times its
 * value rows, in 64- then 16-lane chunks of the output (not loaded and stored once per value
 * row). */
static inline void af_vaxpy_rows(float *restrict o, const float *restrict p,
                                 const float *restrict v, int64_t ldv, int64_t m, int64_t n) {
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) af_vaxpy_chunk(o, p, v, ldv, m, c, 64);
    for (; c + 16 <= n; c += 16) af_vaxpy_chunk(o, p, v, ldv, m, c, 16);
    /* the tail by lane, as af_vdot's: GCC's loop-bound check misfires on `for (; c < n; ++c)`
     * once n is a constant inlined from the kernel */
    for (int l = 0; l < n - c; ++l) {
        float acc = o[c + l];
        for (int64_t j = 0; j < m; ++j) acc += p[j] * v[j * ldv + c + l];
        o[c + l] = acc;
    }
}

/* Every kernel is compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA) and the baseline,
 * and the loader picks the widest this CPU runs (GCC function multi-versioning), so the
 * elementwise and reduction loops vectorise at the machine's width without -march. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && !defined(AF_NO_CLONES)
#define AF_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AF_CLONES
#endif

/* ---- Matmul micro-kernels: C[mr x nr] (=|+=) A[mr x kc] x B-sliver over kc. A is read in
 * place, element (i, k) at A[i * rs + k * cs]: a packed sliver (rs 1, cs MR) or rows of a
 * row-major matrix (rs = its row stride, cs 1), so contiguous f32 operands need no packing;
 * rows past mr repeat row mr - 1 and are never stored. B is packed in slivers of NR columns
 * (B[k * NR + j], zero past the matrix), so a kernel always computes a full MR x NR tile in
 * registers and only the store honours mr x nr. One kernel per ISA, chosen once at run time
 * from CPUID (AUTOFUSION_ISA=portable|avx2 forces a narrower one the CPU has).
 *
 * B's elements are f32, or an f16 / bf16 weight's own bits (`uk_f16`, `uk_bf16`): a 16-bit
 * weight stays 16-bit in its packed copy and each B load widens it exactly (F16C's vcvtph2ps,
 * or a zero-extend and shift for bf16, NaNs quieted as af_bf2f does), so the products are those
 * of the widened weight. `widen_f16` / `widen_bf16` widen a whole sliver the same way. Each
 * ISA's kernel is written once, as an always-inline body taking the B type as a constant that
 * the three entry points fix. ---- */
typedef void (*af_uk_fn)(int64_t kc, const float *restrict A, int64_t rs, int64_t cs, const float *restrict B,
                         float *restrict C, int64_t ldc, int64_t mr, int64_t nr, int acc);
typedef void (*af_uk16_fn)(int64_t kc, const float *restrict A, int64_t rs, int64_t cs, const uint16_t *restrict B,
                           float *restrict C, int64_t ldc, int64_t mr, int64_t nr, int acc);
/* dst[0..n) = src[0..n) widened from f16 / bf16 bits to f32, exactly. */
typedef void (*af_widen_fn)(const uint16_t *restrict src, float *restrict dst, int64_t n);
typedef struct af_isa_info {
    af_uk_fn uk;
    af_uk16_fn uk_f16, uk_bf16;
    af_widen_fn widen_f16, widen_bf16;
    int64_t mr, nr;
    const char *name;
} af_isa_info;
#define AF_MR_MAX 8
#define AF_NR_MAX 32
/* Element types of a packed B. */
#define AF_B_F32 0
#define AF_B_F16 1
#define AF_B_BF16 2
/* Row i of A for a tile of mr valid rows. */
#define AF_AROW(i) (A + ((i) < mr ? (i) : mr - 1) * rs)
/* The three entry points of a micro-kernel body `base##_t` (same parameters, then the B type). */
#define AF_UK_ENTRIES(attr, base)                                                                                      \
    attr static void base(int64_t kc, const float *restrict A, int64_t rs, int64_t cs, const float *restrict B,        \
                          float *restrict C, int64_t ldc, int64_t mr, int64_t nr, int acc) {                           \
        base##_t(kc, A, rs, cs, B, C, ldc, mr, nr, acc, AF_B_F32);                                                     \
    }                                                                                                                  \
    attr static void base##_f16(int64_t kc, const float *restrict A, int64_t rs, int64_t cs,                           \
                                const uint16_t *restrict B, float *restrict C, int64_t ldc, int64_t mr, int64_t nr,   \
                                int acc) {                                                                             \
        base##_t(kc, A, rs, cs, B, C, ldc, mr, nr, acc, AF_B_F16);                                                     \
    }                                                                                                                  \
    attr static void base##_bf16(int64_t kc, const float *restrict A, int64_t rs, int64_t cs,                          \
                                 const uint16_t *restrict B, float *restrict C, int64_t ldc, int64_t mr, int64_t nr,  \
                                 int acc) {                                                                            \
        base##_t(kc, A, rs, cs, B, C, ldc, mr, nr, acc, AF_B_BF16);                                                    \
    }

/* The f16 and bf16 entry points of a widening body `base##_t` (source, destination, count, type). */
#define AF_WIDEN_ENTRIES(attr, base)                                                                                   \
    attr static void base##_f16(const uint16_t *restrict s, float *restrict d, int64_t n) {                           \
        base##_t(s, d, n, AF_B_F16);                                                                                   \
    }                                                                                                                  \
    attr static void base##_bf16(const uint16_t *restrict s, float *restrict d, int64_t n) {                          \
        base##_t(s, d, n, AF_B_BF16);                                                                                  \
    }

/* Ask for row k + AF_PF_AHEAD of a packed-B sliver of `w` columns of type bt into L2, while it is
 * still one of the kc rows this call reads. A weight larger than the caches is streamed from
 * memory the first time a sliver is read, and the hardware prefetcher stops at every 4 KiB page.
 * The tile paths ask, the one-row (decode) paths do not: measured on a Sapphire Rapids,
 * bert_embed's short sentences (weight-bound, one thread) went 0.92x -> 1.27-1.30x of
 * onnxruntime, batches of 32 (B in cache) did not move, while a decode step, already near the
 * memory's bandwidth with the hardware's prefetch, lost 2-7% with it in the one-row path in
 * every variant tried (into L1 or L2, within the call's rows or past them). Past the call's
 * rows is the sliver's next K block, read only after every other sliver: not asked for. */
#define AF_PF_AHEAD 16
static inline __attribute__((always_inline)) void af_prefetch_b(const void *B, int64_t k, int64_t kc, int64_t w, int bt) {
    if (k + AF_PF_AHEAD >= kc) return;
    const int64_t esz = bt == AF_B_F32 ? 4 : 2;
    const char *at = (const char *)B + (k + AF_PF_AHEAD) * w * esz;
    for (int64_t o = 0; o < w * esz; o += 64) __builtin_prefetch(at + o, 0, 2);
}
/* Element i of a packed B of type bt, widened to f32. */
static inline __attribute__((always_inline)) float af_b_at(const void *restrict B, int64_t i, int bt) {
    if (bt == AF_B_F32) return ((const float *)B)[i];
    const uint16_t h = ((const uint16_t *)B)[i];
    return bt == AF_B_F16 ? af_h2f(h) : af_bf2f(h);
}
static inline __attribute__((always_inline)) void af_uk_portable_t(int64_t kc, const float *restrict A, int64_t rs,
                                                                    int64_t cs, const void *restrict B,
                                                                    float *restrict C, int64_t ldc, int64_t mr,
                                                                    int64_t nr, int acc, int bt) {
    float c[4][16], b[16];
    memset(c, 0, sizeof c);
    const float *a[4] = {AF_AROW(0), AF_AROW(1), AF_AROW(2), AF_AROW(3)};
    for (int64_t k = 0; k < kc; ++k) {
        for (int j = 0; j < 16; ++j) b[j] = af_b_at(B, k * 16 + j, bt);
        for (int i = 0; i < 4; ++i) {
            const float x = a[i][k * cs];
            for (int j = 0; j < 16; ++j) c[i][j] += x * b[j];
        }
    }
    for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j) C[i * ldc + j] = acc ? C[i * ldc + j] + c[i][j] : c[i][j];
}
AF_UK_ENTRIES(__attribute__((unused)), af_uk_portable)
static inline __attribute__((always_inline)) void af_widen_portable_t(const uint16_t *restrict s, float *restrict d,
                                                                       int64_t n, int bt) {
    for (int64_t i = 0; i < n; ++i) d[i] = af_b_at(s, i, bt);
}
AF_WIDEN_ENTRIES(__attribute__((unused)), af_widen_portable)

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AF_HAVE_X86 1
#define AF_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
/* Eight elements of a packed B from element i, widened to f32. */
static inline __attribute__((always_inline)) AF_TARGET_AVX2 __m256 af_b8(const void *restrict B, int64_t i, int bt) {
    if (bt == AF_B_F32) return _mm256_loadu_ps((const float *)B + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)B + i));
    if (bt == AF_B_F16) return _mm256_cvtph_ps(h);
    /* bf16: the bits shifted up, NaNs quieted as af_bf2f does */
    const __m256i f = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    return _mm256_castsi256_ps(_mm256_or_si256(f, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000))));
}
/* AVX2 + FMA: 6 x 16 tile, 12 ymm accumulators. */
#define AF_UK256_ROW(i) \
    x = _mm256_broadcast_ss(a##i + o); c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0); c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);
static inline __attribute__((always_inline)) AF_TARGET_AVX2 void af_uk_avx2_t(int64_t kc, const float *restrict A, int64_t rs,
                                                                               int64_t cs, const void *restrict B,
                                                                               float *restrict C, int64_t ldc, int64_t mr,
                                                                               int64_t nr, int acc, int bt) {
    if (mr == 1) { /* one row (decode): four k-steps in flight instead of five idle rows */
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
        int64_t k = 0;
        for (; k + 4 <= kc; k += 4) {
            const int64_t b = k * 16;
            const __m256 x0 = _mm256_broadcast_ss(A + k * cs), x1 = _mm256_broadcast_ss(A + (k + 1) * cs);
            const __m256 x2 = _mm256_broadcast_ss(A + (k + 2) * cs), x3 = _mm256_broadcast_ss(A + (k + 3) * cs);
            s0 = _mm256_fmadd_ps(x0, af_b8(B, b, bt), s0);
            s1 = _mm256_fmadd_ps(x0, af_b8(B, b + 8, bt), s1);
            s2 = _mm256_fmadd_ps(x1, af_b8(B, b + 16, bt), s2);
            s3 = _mm256_fmadd_ps(x1, af_b8(B, b + 24, bt), s3);
            s4 = _mm256_fmadd_ps(x2, af_b8(B, b + 32, bt), s4);
            s5 = _mm256_fmadd_ps(x2, af_b8(B, b + 40, bt), s5);
            s6 = _mm256_fmadd_ps(x3, af_b8(B, b + 48, bt), s6);
            s7 = _mm256_fmadd_ps(x3, af_b8(B, b + 56, bt), s7);
        }
        for (; k < kc; ++k) {
            const __m256 x = _mm256_broadcast_ss(A + k * cs);
            s0 = _mm256_fmadd_ps(x, af_b8(B, k * 16, bt), s0);
            s1 = _mm256_fmadd_ps(x, af_b8(B, k * 16 + 8, bt), s1);
        }
        const __m256 r0 = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s4, s6));
        const __m256 r1 = _mm256_add_ps(_mm256_add_ps(s1, s3), _mm256_add_ps(s5, s7));
        float t[16];
        _mm256_storeu_ps(t, r0);
        _mm256_storeu_ps(t + 8, r1);
        for (int64_t j = 0; j < nr; ++j) C[j] = acc ? C[j] + t[j] : t[j];
        return;
    }
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a0 = AF_AROW(0), *a1 = AF_AROW(1), *a2 = AF_AROW(2), *a3 = AF_AROW(3), *a4 = AF_AROW(4), *a5 = AF_AROW(5);
    for (int64_t k = 0; k < kc; ++k) {
        af_prefetch_b(B, k, kc, 16, bt);
        const __m256 b0 = af_b8(B, k * 16, bt), b1 = af_b8(B, k * 16 + 8, bt);
        const int64_t o = k * cs;
        __m256 x;
        AF_UK256_ROW(0) AF_UK256_ROW(1) AF_UK256_ROW(2) AF_UK256_ROW(3) AF_UK256_ROW(4) AF_UK256_ROW(5)
    }
    const __m256 rows[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (nr == 16) {
        for (int64_t i = 0; i < mr; ++i) {
            float *c = C + i * ldc;
            __m256 r0 = rows[i][0], r1 = rows[i][1];
            if (acc) { r0 = _mm256_add_ps(r0, _mm256_loadu_ps(c)); r1 = _mm256_add_ps(r1, _mm256_loadu_ps(c + 8)); }
            _mm256_storeu_ps(c, r0);
            _mm256_storeu_ps(c + 8, r1);
        }
    } else {
        float t[16];
        for (int64_t i = 0; i < mr; ++i) {
            _mm256_storeu_ps(t, rows[i][0]);
            _mm256_storeu_ps(t + 8, rows[i][1]);
            for (int64_t j = 0; j < nr; ++j) C[i * ldc + j] = acc ? C[i * ldc + j] + t[j] : t[j];
        }
    }
}
#undef AF_UK256_ROW
AF_UK_ENTRIES(__attribute__((unused)) AF_TARGET_AVX2, af_uk_avx2)
static inline __attribute__((always_inline)) AF_TARGET_AVX2 void af_widen_avx2_t(const uint16_t *restrict s, float *restrict d,
                                                                                  int64_t n, int bt) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, af_b8(s, i, bt));
    for (; i < n; ++i) d[i] = af_b_at(s, i, bt);
}
AF_WIDEN_ENTRIES(__attribute__((unused)) AF_TARGET_AVX2, af_widen_avx2)

/* Sixteen elements of a packed B from element i, widened to f32 (all AVX-512F). */
static inline __attribute__((always_inline, target("avx512f"))) __m512 af_b16(const void *restrict B, int64_t i, int bt) {
    if (bt == AF_B_F32) return _mm512_loadu_ps((const float *)B + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)B + i));
    if (bt == AF_B_F16) return _mm512_cvtph_ps(h);
    /* bf16: the bits shifted up, NaNs quieted as af_bf2f does */
    const __m512i f = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(f, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(f, nan, f, _mm512_set1_epi32(0x00400000)));
}
/* AVX-512F: 8 x 32 tile, 16 zmm accumulators; tails stored under a lane mask. */
#define AF_UK512_ROW(i) \
    x = _mm512_set1_ps(a##i[o]); c##i##0 = _mm512_fmadd_ps(x, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(x, b1, c##i##1);
static inline __attribute__((always_inline, target("avx512f"))) void af_uk_avx512_t(int64_t kc, const float *restrict A, int64_t rs,
                                                                                    int64_t cs, const void *restrict B,
                                                                                    float *restrict C, int64_t ldc, int64_t mr,
                                                                                    int64_t nr, int acc, int bt) {
    if (mr == 1) { /* one row (decode): four k-steps in flight instead of eight idle rows */
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
        int64_t k = 0;
        for (; k + 4 <= kc; k += 4) {
            const int64_t b = k * 32;
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * cs]), af_b16(B, b, bt), s0);
            s1 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * cs]), af_b16(B, b + 16, bt), s1);
            s2 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 1) * cs]), af_b16(B, b + 32, bt), s2);
            s3 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 1) * cs]), af_b16(B, b + 48, bt), s3);
            s4 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 2) * cs]), af_b16(B, b + 64, bt), s4);
            s5 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 2) * cs]), af_b16(B, b + 80, bt), s5);
            s6 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 3) * cs]), af_b16(B, b + 96, bt), s6);
            s7 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 3) * cs]), af_b16(B, b + 112, bt), s7);
        }
        for (; k < kc; ++k) {
            s0 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * cs]), af_b16(B, k * 32, bt), s0);
            s1 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * cs]), af_b16(B, k * 32 + 16, bt), s1);
        }
        __m512 r0 = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s4, s6));
        __m512 r1 = _mm512_add_ps(_mm512_add_ps(s1, s3), _mm512_add_ps(s5, s7));
        const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
        const __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1u);
        if (acc) {
            r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, C));
            r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, C + 16));
        }
        _mm512_mask_storeu_ps(C, m0, r0);
        _mm512_mask_storeu_ps(C + 16, m1, r1);
        return;
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    const float *a0 = AF_AROW(0), *a1 = AF_AROW(1), *a2 = AF_AROW(2), *a3 = AF_AROW(3);
    const float *a4 = AF_AROW(4), *a5 = AF_AROW(5), *a6 = AF_AROW(6), *a7 = AF_AROW(7);
/* Four k-steps per loop trip: more B loads and broadcasts in flight ahead of the FMAs that wait
 * on them (bert_embed at batch 1 on a Sapphire Rapids: fused/onnxruntime 0.87x -> 0.92-0.95x). */
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
        af_prefetch_b(B, k, kc, 32, bt);
        const __m512 b0 = af_b16(B, k * 32, bt), b1 = af_b16(B, k * 32 + 16, bt);
        const int64_t o = k * cs;
        __m512 x;
        AF_UK512_ROW(0) AF_UK512_ROW(1) AF_UK512_ROW(2) AF_UK512_ROW(3)
        AF_UK512_ROW(4) AF_UK512_ROW(5) AF_UK512_ROW(6) AF_UK512_ROW(7)
    }
    const __m512 rows[8][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
    const __mmask16 k0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
    const __mmask16 k1 = nr >= 32 ? (__mmask16)0xffff : nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1u);
    for (int64_t i = 0; i < mr; ++i) {
        float *c = C + i * ldc;
        __m512 r0 = rows[i][0], r1 = rows[i][1];
        if (acc) {
            r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(k0, c));
            r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(k1, c + 16));
        }
        _mm512_mask_storeu_ps(c, k0, r0);
        _mm512_mask_storeu_ps(c + 16, k1, r1);
    }
}
#undef AF_UK512_ROW
AF_UK_ENTRIES(__attribute__((unused, target("avx512f"))), af_uk_avx512)
static inline __attribute__((always_inline, target("avx512f"))) void af_widen_avx512_t(const uint16_t *restrict s,
                                                                                      float *restrict d, int64_t n, int bt) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, af_b16(s, i, bt));
    for (; i < n; ++i) d[i] = af_b_at(s, i, bt);
}
AF_WIDEN_ENTRIES(__attribute__((unused, target("avx512f"))), af_widen_avx512)
#undef AF_TARGET_AVX2
#endif
#undef AF_UK_ENTRIES
#undef AF_WIDEN_ENTRIES
#undef AF_AROW

/* The micro-kernel for this CPU, chosen once (a benign, atomic first-use race). */
__attribute__((unused)) static af_isa_info af_isa(void) {
    static const af_isa_info portable = {af_uk_portable, af_uk_portable_f16, af_uk_portable_bf16,
                                         af_widen_portable_f16, af_widen_portable_bf16, 4, 16, "portable"};
#ifdef AF_HAVE_X86
    static const af_isa_info avx2 = {af_uk_avx2, af_uk_avx2_f16, af_uk_avx2_bf16,
                                     af_widen_avx2_f16, af_widen_avx2_bf16, 6, 16, "avx2"};
    static const af_isa_info avx512 = {af_uk_avx512, af_uk_avx512_f16, af_uk_avx512_bf16,
                                       af_widen_avx512_f16, af_widen_avx512_bf16, 8, 32, "avx512"};
#endif
    static int chosen = -1;
    int c = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (c < 0) {
        c = 0;
#ifdef AF_HAVE_X86
        __builtin_cpu_init();
        const int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        const int has512 = __builtin_cpu_supports("avx512f");
        c = has512 ? 2 : has2 ? 1 : 0;
        const char *want = getenv("AUTOFUSION_ISA");
        if (want && strcmp(want, "portable") == 0) c = 0;
        if (want && strcmp(want, "avx2") == 0 && has2) c = 1;
#endif
        __atomic_store_n(&chosen, c, __ATOMIC_RELAXED);
    }
#ifdef AF_HAVE_X86
    if (c == 2) return avx512;
    if (c == 1) return avx2;
#endif
    return portable;
}

#endif /* AUTOFUSION_HOST_H */
