/* Host calibration for the autofusion cost model. Prints one JSON object:
 *   threads, triad bandwidth (B/us, all threads), FMA peak per core (FLOP/us, with the widest
 *   of AVX-512F, AVX2+FMA, SSE the CPU has), the GEMM rate per core (FLOP/us) of the same
 *   micro-kernel the generated code picks on this CPU, the rate of its vectorisable exp, an elementwise rate per core (FLOP/us), and the cost of one
 *   fork/join of all threads (us). Short: about a second in all. */
/* (calibrate.rs defines _POSIX_C_SOURCE and prepends the code generator's prelude) */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static volatile float sink;

/* ---- FMA peak: 8 independent vector accumulators ---- */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
    __m512 a[12], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    double t0 = now_us();
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    double t = now_us() - t0;
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    float out[16];
    _mm512_storeu_ps(out, s);
    sink = out[0];
    return (double)iters * 12 * 16 * 2 / t;
}
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
    __m256 a[8], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 8; i++) a[i] = _mm256_set1_ps((float)i);
    double t0 = now_us();
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    double t = now_us() - t0;
    __m256 s = a[0];
    for (int i = 1; i < 8; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    sink = out[0];
    return (double)iters * 8 * 8 * 2 / t;
}
#endif
static double fma_sse(long iters) {
    float a[32] = {0}, b = 1.0000001f, c = 1e-7f;
    double t0 = now_us();
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < 32; i++) a[i] = a[i] * b + c;
    double t = now_us() - t0;
    sink = a[3];
    return (double)iters * 32 * 2 / t;
}

/* ---- the generated code's matmul micro-kernel (af_isa() from the code generator's prelude,
 * prepended to this file) over cache-resident packed panels, as the template runs it ---- */
static double gemm_rate(void) {
    const af_isa_info isa = af_isa();
    enum { MC = 64, NC = 256, KC = 256 };
    float *A = calloc(MC * KC, 4), *B = calloc(KC * NC, 4), *C = calloc(MC * NC, 4);
    for (int i = 0; i < MC * KC; i++) A[i] = 1e-3f * (i % 7);
    for (int i = 0; i < KC * NC; i++) B[i] = 1e-3f * (i % 5);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        for (int it = 0; it < 20; it++)
            for (int64_t jr = 0; jr < NC; jr += isa.nr)
                for (int64_t ir = 0; ir + isa.mr <= MC; ir += isa.mr)
                    isa.uk(KC, A + ir * KC, 1, isa.mr, B + jr * KC, C + ir * NC + jr, NC, isa.mr, isa.nr, 1);
        double t = now_us() - t0, r = 20.0 * 2 * (MC / isa.mr * isa.mr) * NC * KC / t;
        if (r > best) best = r;
    }
    sink = C[7];
    free(A), free(B), free(C);
    return best;
}
AF_CLONES static double exp_rate(void) {
    enum { N = 4096 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -4.0f + 8e-3f * (i % 1000);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        for (int it = 0; it < 20; it++) {
            for (int i = 0; i < N; i++) y[i] = af_expf(x[i] + (float)it * 1e-9f);
            sink = y[it & (N - 1)];
        }
        double t = now_us() - t0, r = 20.0 * N / t;
        if (r > best) best = r;
    }
    sink = y[9];
    return best;
}
/* Packing as the matmul and flash templates do it: a 256 x 256 block walked along memory
 * into slivers of NR columns (one contiguous read, one strided store per element). */
AF_CLONES static double pack_rate(void) {
    enum { N = 256 };
    const af_isa_info isa = af_isa();
    static float src[N * N], dst[N * (N + AF_NR_MAX)];
    for (int i = 0; i < N * N; i++) src[i] = 1e-3f * (i % 97);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        for (int it = 0; it < 10; it++)
            for (int64_t j = 0; j < N; ++j) {
                float *d = dst + (j / isa.nr) * isa.nr * N + j % isa.nr;
                for (int64_t c = 0; c < N; ++c) d[c * isa.nr] = src[j * N + c] + (float)it;
            }
        double t = now_us() - t0, r = 10.0 * N * N / t;
        if (r > best) best = r;
        sink = dst[rep];
    }
    return best;
}
AF_CLONES static double vector_rate(void) {
    enum { N = 4096 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = 1e-3f * i;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        for (int it = 0; it < 200; it++)
            for (int i = 0; i < N; i++) y[i] = (x[i] * 1.0001f + y[i]) * 0.999f - 0.5f;
        double t = now_us() - t0, r = 200.0 * N * 4 / t;
        if (r > best) best = r;
    }
    sink = y[5];
    return best;
}

/* ---- triad bandwidth and fork/join cost with pthreads ---- */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int epoch, finished, nthreads, quit;
    float *a, *b, *c;
    size_t n;
    int reps;
} pool_t;
static pool_t P;
typedef struct { int id; } arg_t;

static void triad_part(int id) {
    if (!P.a) return;
    size_t lo = P.n * id / P.nthreads, hi = P.n * (id + 1) / P.nthreads;
    for (int r = 0; r < P.reps; r++)
        for (size_t i = lo; i < hi; i++) P.a[i] = P.b[i] + 0.5f * P.c[i] + (float)r;
}
static volatile int epoch_mirror;
static volatile int finished_mirror;
static void *worker(void *p) {
    int id = ((arg_t *)p)->id, seen = 0;
    for (;;) {
        /* as the runtime's pool: spin a little before sleeping */
        for (int s = 0; s < (1 << 18) && epoch_mirror == seen; s++) __asm__ __volatile__("" ::: "memory");
        pthread_mutex_lock(&P.mu);
        while (P.epoch == seen && !P.quit) pthread_cond_wait(&P.go, &P.mu);
        if (P.quit) { pthread_mutex_unlock(&P.mu); return 0; }
        seen = P.epoch;
        pthread_mutex_unlock(&P.mu);
        triad_part(id);
        pthread_mutex_lock(&P.mu);
        finished_mirror = ++P.finished;
        if (P.finished == P.nthreads - 1) pthread_cond_signal(&P.done);
        pthread_mutex_unlock(&P.mu);
    }
}
static void launch(void) {
    pthread_mutex_lock(&P.mu);
    P.finished = 0;
    finished_mirror = 0;
    P.epoch++;
    epoch_mirror = P.epoch;
    pthread_cond_broadcast(&P.go);
    pthread_mutex_unlock(&P.mu);
    triad_part(0);
    for (int s = 0; s < (1 << 18) && finished_mirror < P.nthreads - 1; s++) __asm__ __volatile__("" ::: "memory");
    pthread_mutex_lock(&P.mu);
    while (P.finished < P.nthreads - 1) pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1) threads = 1;
    long iters = 2000000;
    double fma = fma_sse(iters / 4);
    const char *isa = "sse";
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fma = fma_avx2(iters);
        isa = "avx2+fma";
    }
    if (__builtin_cpu_supports("avx512f")) {
        fma = fma_avx512(iters);
        isa = "avx512f";
    }
#endif
    double gemm = gemm_rate(), vec = vector_rate(), ex = exp_rate(), pack = pack_rate();
    pthread_mutex_init(&P.mu, 0);
    pthread_cond_init(&P.go, 0);
    pthread_cond_init(&P.done, 0);
    P.nthreads = threads;
    pthread_t th[256];
    arg_t args[256];
    for (int i = 1; i < threads && i < 256; i++) {
        args[i].id = i;
        pthread_create(&th[i], 0, worker, &args[i]);
    }
    /* fork/join with no work */
    double best_launch = 1e9;
    for (int rep = 0; rep < 200; rep++) {
        double t0 = now_us();
        launch();
        double t = now_us() - t0;
        if (t < best_launch) best_launch = t;
    }
    /* triad over 3 x 32 MiB */
    P.n = 8u << 20;
    float *a = malloc(P.n * 4), *b = malloc(P.n * 4), *c = malloc(P.n * 4);
    for (size_t i = 0; i < P.n; i++) a[i] = 0, b[i] = 1, c[i] = 2;
    P.a = a, P.b = b, P.c = c;
    P.reps = 1;
    launch();
    double best_bw = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        launch();
        double t = now_us() - t0, bw = 3.0 * P.n * 4 / t;
        if (bw > best_bw) best_bw = bw;
    }
    sink = a[12345];
    /* the same triad on 3 x 512 KiB, which stays in the shared cache */
    P.n = 128u << 10;
    P.reps = 50;
    launch();
    double best_llc = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_us();
        launch();
        double t = now_us() - t0, bw = P.reps * 3.0 * P.n * 4 / t;
        if (bw > best_llc) best_llc = bw;
    }
    pthread_mutex_lock(&P.mu);
    P.quit = 1;
    pthread_cond_broadcast(&P.go);
    pthread_mutex_unlock(&P.mu);
    for (int i = 1; i < threads && i < 256; i++) pthread_join(th[i], 0);
    printf("{\"threads\": %d, \"isa\": \"%s\", \"fma_flops_per_us_per_core\": %.1f, \"gemm_flops_per_us_per_core\": %.1f, "
           "\"vector_flops_per_us_per_core\": %.1f, \"exp_per_us_per_core\": %.1f, \"pack_elems_per_us_per_core\": %.1f, \"bandwidth_bytes_per_us\": %.1f, \"llc_bandwidth_bytes_per_us\": %.1f, \"launch_us\": %.3f}\n",
           threads, isa, fma, gemm, vec, ex, pack, best_bw, best_llc, best_launch);
    free(a), free(b), free(c);
    return 0;
}
