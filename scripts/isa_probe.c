/* What each matrix instruction family reaches on this CPU, one core, operands resident in
 * L1/L2 (kc 256): the f32 FMA 8x32 micro-kernel shape ours uses, AVX512-BF16 `vdpbf16ps` on
 * pair-packed B, AVX512-VNNI `vpdpbusd` on quad-packed int8, and AMX-BF16 / AMX-INT8 on 2x2
 * tiles of 16x16. Every result is checked (bf16 against a float64 product of the same bf16
 * values; int8 exactly). Only the families this CPU and OS allow are run. Not part of the
 * build: a probe for choosing kernels (issue 35) on each machine the project meets.
 *
 *     gcc -O3 scripts/isa_probe.c -o /tmp/isa_probe -lm && /tmp/isa_probe
 *
 * On a Sapphire Rapids (2026-12-07, gcc 12): f32 210-213 GFLOP/s, vdpbf16ps 118-119 GFLOP/s
 * (slower than f32 FMA there), vpdpbusd 563-689 GOP/s, AMX-BF16 2588-2680 GFLOP/s, AMX-INT8
 * 4820-4850 GOP/s. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint16_t f2bf(float f) { uint32_t b; memcpy(&b, &f, 4); b += 0x7fff + ((b >> 16) & 1); return b >> 16; }
static float bf2f(uint16_t h) { uint32_t b = (uint32_t)h << 16; float f; memcpy(&f, &b, 4); return f; }

#define KC 256
/* f32: A packed [k][8], B packed [k][32] */
__attribute__((target("avx512f"))) static void uk_f32(const float *A, const float *B, float *C) {
    __m512 c[8][2];
    for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < KC; ++k) {
        __m512 b0 = _mm512_loadu_ps(B + k * 32), b1 = _mm512_loadu_ps(B + k * 32 + 16);
        for (int i = 0; i < 8; ++i) {
            __m512 a = _mm512_set1_ps(A[k * 8 + i]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
    }
    for (int i = 0; i < 8; ++i) { _mm512_storeu_ps(C + i * 32, c[i][0]); _mm512_storeu_ps(C + i * 32 + 16, c[i][1]); }
}
/* bf16 pairs: A packed [k/2][8] of uint32 (two bf16), B packed [k/2][32][2] bf16 */
__attribute__((target("avx512f,avx512bf16"))) static void uk_bf16(const uint32_t *A, const uint16_t *B, float *C) {
    __m512 c[8][2];
    for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < KC / 2; ++k) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + k * 64), b1 = (__m512bh)_mm512_loadu_si512(B + k * 64 + 32);
        for (int i = 0; i < 8; ++i) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[k * 8 + i]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], a, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], a, b1);
        }
    }
    for (int i = 0; i < 8; ++i) { _mm512_storeu_ps(C + i * 32, c[i][0]); _mm512_storeu_ps(C + i * 32 + 16, c[i][1]); }
}
/* AMX: a 32x32 C block as 2x2 tiles; A [32][KC] bf16 row-major, B [KC/2][32][2] bf16 */
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;
__attribute__((target("amx-tile"))) static void amx_config(void) {
    tilecfg cfg; memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; } /* C tiles: 16 x 16 f32 */
    for (int t = 4; t < 6; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; } /* A tiles: 16 rows x 32 bf16 */
    for (int t = 6; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; } /* B tiles: 16 k-pairs x 16 cols x 2 */
    /* (the barrier keeps the stores above: GCC 12 does not see the intrinsic read cfg) */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile,amx-bf16"))) static void uk_amx(const uint16_t *A, const uint16_t *B, float *C) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int k = 0; k < KC; k += 32) {
        _tile_loadd(4, A + k, KC * 2);               /* rows 0-15 */
        _tile_loadd(5, A + 16 * KC + k, KC * 2);     /* rows 16-31 */
        _tile_loadd(6, B + (k / 2) * 64, 128);       /* cols 0-15: 16 k-pairs, stride one pair row of 32 cols */
        _tile_loadd(7, B + (k / 2) * 64 + 32, 128);  /* cols 16-31 */
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, C, 128); _tile_stored(1, C + 16, 128); _tile_stored(2, C + 16 * 32, 128); _tile_stored(3, C + 16 * 32 + 16, 128);
}

/* int8: A u8 quads [k/4][8] of uint32, B s8 [k/4][32][4]: vpdpbusd (AVX512-VNNI) */
__attribute__((target("avx512f,avx512vnni"))) static void uk_vnni(const uint32_t *A, const int8_t *B, int32_t *C) {
    __m512i c[8][2];
    for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < KC / 4; ++k) {
        __m512i b0 = _mm512_loadu_si512(B + k * 128), b1 = _mm512_loadu_si512(B + k * 128 + 64);
        for (int i = 0; i < 8; ++i) {
            __m512i a = _mm512_set1_epi32((int)A[k * 8 + i]);
            c[i][0] = _mm512_dpbusd_epi32(c[i][0], a, b0);
            c[i][1] = _mm512_dpbusd_epi32(c[i][1], a, b1);
        }
    }
    for (int i = 0; i < 8; ++i) { _mm512_storeu_si512(C + i * 32, c[i][0]); _mm512_storeu_si512(C + i * 32 + 16, c[i][1]); }
}
/* AMX-INT8: 32x32 int32 C as 2x2 tiles; A [32][KC] u8, B [KC/4][32][4] s8 */
__attribute__((target("amx-tile,amx-int8"))) static void uk_amx8(const uint8_t *A, const int8_t *B, int32_t *C) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int k = 0; k < KC; k += 64) {
        _tile_loadd(4, A + k, KC);
        _tile_loadd(5, A + 16 * KC + k, KC);
        _tile_loadd(6, B + (k / 4) * 128, 128);
        _tile_loadd(7, B + (k / 4) * 128 + 64, 128);
        _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, C, 128); _tile_stored(1, C + 16, 128); _tile_stored(2, C + 16 * 32, 128); _tile_stored(3, C + 16 * 32 + 16, 128);
}

__attribute__((target("amx-tile"))) static void amx_release(void) { _tile_release(); }

static double max_err(const float *C, const float *R, int rows) {
    double e = 0;
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < 32; ++j) {
            const double d = C[i * 32 + j] - R[i * 32 + j];
            e = d < 0 ? (-d > e ? -d : e) : (d > e ? d : e);
        }
    return e;
}

static int wrong(const int32_t *C, const int64_t *R, int rows) {
    int bad = 0;
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < 32; ++j) bad += C[i * 32 + j] != R[i * 32 + j];
    return bad;
}

#define TIME(N, CALL) ({ const double t0_ = now(); for (int r_ = 0; r_ < (N); ++r_) { CALL; __asm__ volatile("" ::: "memory"); } now() - t0_; })

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) {
        puts("isa_probe: no AVX-512 on this CPU; the kernels bench's micro-kernel line is the measure here");
        return 0;
    }
    static float a[32][KC], b[KC][32], Af[KC * 8], Bf[KC * 32], C[32 * 32], R[32 * 32];
    static uint32_t Ap[KC / 2 * 8];
    static uint16_t Bp[KC * 32], Aa[32 * KC];
    srand(1);
    /* bf16-representable values, so the f32 and bf16 kernels compute the same products */
    for (int i = 0; i < 32; ++i) for (int k = 0; k < KC; ++k) a[i][k] = bf2f(f2bf((float)rand() / RAND_MAX - 0.5f));
    for (int k = 0; k < KC; ++k) for (int j = 0; j < 32; ++j) b[k][j] = bf2f(f2bf((float)rand() / RAND_MAX - 0.5f));
    for (int k = 0; k < KC; ++k) for (int i = 0; i < 8; ++i) Af[k * 8 + i] = a[i][k];
    for (int k = 0; k < KC; ++k) for (int j = 0; j < 32; ++j) Bf[k * 32 + j] = b[k][j];
    for (int k = 0; k < KC / 2; ++k) for (int i = 0; i < 8; ++i) Ap[k * 8 + i] = f2bf(a[i][2 * k]) | (uint32_t)f2bf(a[i][2 * k + 1]) << 16;
    for (int k = 0; k < KC / 2; ++k) for (int j = 0; j < 32; ++j) { Bp[(k * 32 + j) * 2] = f2bf(b[2 * k][j]); Bp[(k * 32 + j) * 2 + 1] = f2bf(b[2 * k + 1][j]); }
    for (int i = 0; i < 32; ++i) for (int k = 0; k < KC; ++k) Aa[i * KC + k] = f2bf(a[i][k]);
    for (int i = 0; i < 32; ++i) for (int j = 0; j < 32; ++j) { double s = 0; for (int k = 0; k < KC; ++k) s += (double)a[i][k] * b[k][j]; R[i * 32 + j] = (float)s; }
    static uint8_t a8[32][KC]; static int8_t b8[KC][32], Bq[KC * 32]; static uint32_t Aq[KC / 4 * 8];
    static int32_t Ci[32 * 32]; static int64_t Ri[32 * 32];
    for (int i = 0; i < 32; ++i) for (int k = 0; k < KC; ++k) a8[i][k] = rand() & 255;
    for (int k = 0; k < KC; ++k) for (int j = 0; j < 32; ++j) b8[k][j] = (int8_t)(rand() & 255);
    for (int k = 0; k < KC / 4; ++k) for (int i = 0; i < 8; ++i) Aq[k * 8 + i] = a8[i][4 * k] | a8[i][4 * k + 1] << 8 | a8[i][4 * k + 2] << 16 | (uint32_t)a8[i][4 * k + 3] << 24;
    for (int k = 0; k < KC / 4; ++k) for (int j = 0; j < 32; ++j) for (int q = 0; q < 4; ++q) Bq[(k * 32 + j) * 4 + q] = b8[4 * k + q][j];
    for (int i = 0; i < 32; ++i) for (int j = 0; j < 32; ++j) { int64_t s = 0; for (int k = 0; k < KC; ++k) s += (int64_t)a8[i][k] * b8[k][j]; Ri[i * 32 + j] = s; }

    const int N = 200000, NA = N / 4;
    const double small = 2.0 * 8 * 32 * KC * N, tile = 2.0 * 32 * 32 * KC * NA;
    double t = TIME(N, uk_f32(Af, Bf, C));
    printf("f32 FMA 8x32:           %7.1f GFLOP/s one core (max err %.1e)\n", small / t / 1e9, max_err(C, R, 8));
    if (__builtin_cpu_supports("avx512bf16")) {
        t = TIME(N, uk_bf16(Ap, Bp, C));
        printf("avx512_bf16 vdpbf16ps:  %7.1f GFLOP/s one core (max err %.1e)\n", small / t / 1e9, max_err(C, R, 8));
    } else puts("avx512_bf16: not on this CPU");
    if (__builtin_cpu_supports("avx512vnni")) {
        t = TIME(N, uk_vnni(Aq, Bq, Ci));
        printf("avx512_vnni vpdpbusd:   %7.1f GOP/s one core (%d wrong)\n", small / t / 1e9, wrong(Ci, Ri, 8));
    } else puts("avx512_vnni: not on this CPU");
    if (!__builtin_cpu_supports("amx-tile")) {
        puts("amx: not on this CPU");
        return 0;
    }
    /* Linux: tile data must be requested once per process (ARCH_REQ_XCOMP_PERM, XTILEDATA) */
    if (syscall(SYS_arch_prctl, 0x1023, 18)) {
        puts("amx: the OS refused tile data");
        return 0;
    }
    amx_config();
    if (__builtin_cpu_supports("amx-bf16")) {
        t = TIME(NA, uk_amx(Aa, Bp, C));
        printf("amx_bf16 tdpbf16ps:     %7.1f GFLOP/s one core (max err %.1e)\n", tile / t / 1e9, max_err(C, R, 32));
    }
    if (__builtin_cpu_supports("amx-int8")) {
        t = TIME(NA, uk_amx8(&a8[0][0], Bq, Ci));
        printf("amx_int8 tdpbusd:       %7.1f GOP/s one core (%d wrong)\n", tile / t / 1e9, wrong(Ci, Ri, 32));
    }
    amx_release();
    return 0;
}
