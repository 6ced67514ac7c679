//! The C prelude's numeric building blocks, compiled and run on this machine: every matmul
//! micro-kernel the CPU supports (portable, AVX2+FMA, AVX-512F), with B as f32 and as f16 and
//! bf16 bits, against a naive product for all tile tails, both A layouts (packed sliver,
//! matrix rows) and both store modes, and
//! `af_expf` against double-precision `exp`. Built once plainly and once with AddressSanitizer + UBSan, so an out-of-bounds store of a tail
//! or an undefined shift fails the test.

use autofusion_compiler::codegen::host::CFLAGS;
use autofusion_compiler::codegen::{write_headers, HOST_HEADER};
use std::path::PathBuf;
use std::process::Command;

const HARNESS: &str = r#"
#include <stdio.h>
static const char *const B_TYPE[3] = {"f32", "f16", "bf16"};
/* Every entry point of one ISA's micro-kernel: B as f32, and as f16 and bf16 bits (the values
 * are small integers, exact in every type, so all three must give the same products). */
static int check_uk(const char *name, af_uk_fn uk, af_uk16_fn uk_f16, af_uk16_fn uk_bf16, int64_t MR, int64_t NR) {
    int bad = 0;
    for (int bt = 0; bt < 3; ++bt)
    for (int rows = 0; rows < 2; ++rows) /* A as a packed sliver (rs 1, cs MR), then as matrix rows (rs lda, cs 1) */
    for (int64_t kc = 1; kc <= 37; kc += 9)
    for (int64_t mr = 1; mr <= MR; ++mr)
    for (int64_t nr = 1; nr <= NR; ++nr)
    for (int acc = 0; acc < 2; ++acc) {
        /* exact-size buffers (A holds only the mr valid rows), so ASan sees any access past the tile */
        const int64_t lda = kc + 3, rs = rows ? lda : 1, cs = rows ? 1 : MR;
        const int64_t na = rows ? (mr - 1) * lda + kc : (kc - 1) * MR + mr;
        float *A = malloc(sizeof(float) * (size_t)na), *B = malloc(sizeof(float) * (size_t)(kc * NR));
        const int64_t ldc = nr + 3;
        float *C = malloc(sizeof(float) * (size_t)((mr - 1) * ldc + nr)), *R = malloc(sizeof(float) * (size_t)(mr * nr));
        for (int64_t i = 0; i < na; ++i) A[i] = (float)((i * 7) % 11) - 5.0f;
        for (int64_t i = 0; i < kc * NR; ++i) B[i] = (i % NR < nr) ? (float)((i * 5) % 13) - 6.0f : 0.0f;
        for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j) {
                C[i * ldc + j] = (float)(i + j);
                double s = acc ? (double)(i + j) : 0.0;
                for (int64_t k = 0; k < kc; ++k) s += (double)A[i * rs + k * cs] * B[k * NR + j];
                R[i * nr + j] = (float)s;
            }
        uint16_t *B16 = malloc(sizeof(uint16_t) * (size_t)(kc * NR));
        for (int64_t i = 0; i < kc * NR; ++i) B16[i] = bt == 1 ? af_f2h(B[i]) : af_f2bf(B[i]);
        if (bt == 0) uk(kc, A, rs, cs, B, C, ldc, mr, nr, acc);
        else (bt == 1 ? uk_f16 : uk_bf16)(kc, A, rs, cs, B16, C, ldc, mr, nr, acc);
        free(B16);
        for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j)
                if (C[i * ldc + j] != R[i * nr + j] && bad++ < 5)
                    printf("%s B %s, A %s kc=%ld mr=%ld nr=%ld acc=%d: C[%ld][%ld] = %g, want %g\n", name, B_TYPE[bt], rows ? "rows" : "sliver", (long)kc, (long)mr,
                           (long)nr, acc, (long)i, (long)j, C[i * ldc + j], R[i * nr + j]);
        free(A), free(B), free(C), free(R);
    }
    printf("%s %ldx%ld (B f32, f16, bf16): %s\n", name, (long)MR, (long)NR, bad ? "FAILED" : "ok");
    return bad;
}
/* An ISA's widening of f16 and bf16 bits against af_h2f / af_bf2f on all 65536 values, bit
 * for bit, at every length tail (a run of n values starting at 0..n). */
static int check_widen(const char *name, af_widen_fn f16, af_widen_fn bf16) {
    uint16_t *h = malloc(sizeof(uint16_t) * 65536u);
    float *out = malloc(sizeof(float) * 65536u);
    int bad = 0;
    for (uint32_t i = 0; i < 65536u; ++i) h[i] = (uint16_t)i;
    for (int bt = 1; bt < 3; ++bt) {
        (bt == 1 ? f16 : bf16)(h, out, 65536);
        for (uint32_t i = 0; i < 65536u; ++i) {
            const float want = bt == 1 ? af_h2f(h[i]) : af_bf2f(h[i]);
            if (af_f32_bits(out[i]) != af_f32_bits(want) && bad++ < 5) printf("%s widen %s(%04x) differs\n", name, B_TYPE[bt], i);
        }
        for (int64_t n = 0; n < 40; ++n) { /* tails: exact-size buffers, so ASan sees a store past n */
            float *d = malloc(sizeof(float) * (size_t)(n + 1));
            (bt == 1 ? f16 : bf16)(h + 15360, d, n);
            for (int64_t i = 0; i < n; ++i)
                if (af_f32_bits(d[i]) != af_f32_bits(bt == 1 ? af_h2f(h[15360 + i]) : af_bf2f(h[15360 + i])) && bad++ < 5)
                    printf("%s widen %s n=%ld differs at %ld\n", name, B_TYPE[bt], (long)n, (long)i);
            free(d);
        }
    }
    free(h), free(out);
    printf("%s widen f16, bf16: %s\n", name, bad ? "FAILED" : "ok");
    return bad;
}
static int check_exp(void) {
    double worst = 0;
    int bad = 0;
    for (float x = -87.0f; x < 88.7f; x += 7.3e-4f) {
        const double e = exp((double)x), r = fabs((double)af_expf(x) - e) / e;
        if (r > worst) worst = r;
    }
    if (worst > 3e-7) bad++;
    if (af_expf(-INFINITY) != 0.0f || af_expf(-100.0f) != 0.0f) bad++;
    if (!isinf(af_expf(INFINITY)) || !isinf(af_expf(89.0f))) bad++;
    if (!isnan(af_expf(NAN))) bad++;
    if (af_expf(0.0f) != 1.0f) bad++;
    printf("af_expf: worst relative error %.3g: %s\n", worst, bad ? "FAILED" : "ok");
    double werf = 0, wtanh = 0;
    for (float x = -9.0f; x < 9.0f; x += 3.1e-4f) {
        const double de = fabs((double)af_erff(x) - erf((double)x)), dt = fabs((double)af_tanhf(x) - tanh((double)x));
        if (de > werf) werf = de;
        if (dt > wtanh) wtanh = dt;
    }
    const int bad2 = werf > 3e-7 || wtanh > 3e-7 || !isnan(af_erff(NAN)) || af_tanhf(1e4f) != 1.0f || af_erff(-1e4f) != -1.0f;
    printf("af_erff, af_tanhf: worst absolute error %.3g, %.3g: %s\n", werf, wtanh, bad2 ? "FAILED" : "ok");
    return bad + bad2;
}
/* The float sample of the conversion checks: every sign, exponent and top mantissa bits, with
 * low bits on and around the f16 rounding boundaries (0x1000 is a tie) and one hashed value. */
static uint32_t sample_float(uint32_t i) {
    static const uint32_t low[8] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu, 0x0800u, 0u};
    const uint32_t hi = i >> 3, k = i & 7u;
    return (hi << 13) | (k == 7 ? (hi * 2654435761u) & 0x1fffu : low[k]);
}
#define N_SAMPLE (1u << 22)
/* af_round_f16 against the round trip through the encoding, bit for bit (NaN: a NaN). */
static int check_round_f16(void) {
    long bad = 0;
    for (uint32_t i = 0; i < N_SAMPLE; ++i) {
        const float x = af_bits_f32(sample_float(i)), r = af_round_f16(x), t = af_h2f(af_f2h(x));
        if ((x != x) ? (r == r) : (af_f32_bits(r) != af_f32_bits(t))) {
            if (bad++ < 10) printf("round_f16(%08x) = %08x, round trip %08x\n", sample_float(i), af_f32_bits(r), af_f32_bits(t));
        }
    }
    printf("af_round_f16 against the round trip: %s\n", bad ? "FAILED" : "ok");
    return bad != 0;
}
#ifdef AF_HAVE_X86
__attribute__((target("f16c"))) static uint32_t hw_h2f(uint16_t h) { return af_f32_bits(_cvtsh_ss(h)); }
__attribute__((target("f16c"))) static uint16_t hw_f2h(float x) { return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }
/* The branch-free conversions bit for bit against the CPU's F16C instructions. */
static int check_f16c(void) {
    if (!__builtin_cpu_supports("f16c")) { printf("f16c: not on this CPU\n"); return 0; }
    long bad = 0;
    for (uint32_t h = 0; h < 65536u; ++h)
        if (af_f32_bits(af_h2f((uint16_t)h)) != hw_h2f((uint16_t)h) && bad++ < 5) printf("h2f(%04x) differs from F16C\n", h);
    for (uint32_t i = 0; i < N_SAMPLE; ++i) {
        const float x = af_bits_f32(sample_float(i));
        if (af_f2h(x) != hw_f2h(x) && bad++ < 10) printf("f2h(%08x) = %04x, F16C %04x\n", sample_float(i), af_f2h(x), hw_f2h(x));
    }
    printf("f16 conversions against F16C: %s\n", bad ? "FAILED" : "ok");
    return bad != 0;
}
#endif
/* `t dump FILE`: every conversion of the sample, for the Rust side to compare with `half`. */
static int dump_conversions(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    for (uint32_t h = 0; h < 65536u; ++h) {
        const uint32_t a = af_f32_bits(af_h2f((uint16_t)h)), b = af_f32_bits(af_bf2f((uint16_t)h));
        fwrite(&a, 4, 1, f), fwrite(&b, 4, 1, f);
    }
    for (uint32_t i = 0; i < N_SAMPLE; ++i) {
        const float x = af_bits_f32(sample_float(i));
        const uint16_t a = af_f2h(x), b = af_f2bf(x);
        fwrite(&a, 2, 1, f), fwrite(&b, 2, 1, f);
    }
    return fclose(f) != 0;
}
int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "dump")) return dump_conversions(argv[2]);
    int bad = check_exp();
    bad += check_round_f16();
    bad += check_uk("portable", af_uk_portable, af_uk_portable_f16, af_uk_portable_bf16, 4, 16);
    bad += check_widen("portable", af_widen_portable_f16, af_widen_portable_bf16);
#ifdef AF_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        bad += check_uk("avx2", af_uk_avx2, af_uk_avx2_f16, af_uk_avx2_bf16, 6, 16) +
               check_widen("avx2", af_widen_avx2_f16, af_widen_avx2_bf16);
    else printf("avx2: not on this CPU\n");
    if (__builtin_cpu_supports("avx512f"))
        bad += check_uk("avx512", af_uk_avx512, af_uk_avx512_f16, af_uk_avx512_bf16, 8, 32) +
               check_widen("avx512", af_widen_avx512_f16, af_widen_avx512_bf16);
    else printf("avx512: not on this CPU\n");
    bad += check_f16c();
#endif
    af_isa_info isa = af_isa();
    printf("selected: %s\n", isa.name);
    return bad != 0;
}
"#;

/// Compile the harness (`tag` names its folder); `None` when `extra` asks for a sanitizer the
/// compiler does not have.
fn build(tag: &str, extra: &[&str]) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prelude-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("t.c");
    write_headers(&dir.join("include")).unwrap();
    std::fs::write(
        &src,
        format!("#define _POSIX_C_SOURCE 200809L\n#include \"{HOST_HEADER}\"\n{HARNESS}"),
    )
    .unwrap();
    let exe = dir.join("t");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(CFLAGS)
        .arg(format!("-I{}", dir.join("include").display()))
        .args(["-O2", "-Wall", "-Werror"])
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-lm")
        .output()
        .unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // A compiler without the sanitizer runtimes cannot link them (libasan / libubsan);
        // CI asks for them, so there that is a failure.
        let no_runtime = err.contains("cannot find -lasan")
            || err.contains("cannot find -lubsan")
            || err.contains("cannot find libasan")
            || err.contains("unrecognized argument to '-fsanitize");
        if !extra.is_empty()
            && no_runtime
            && std::env::var("AUTOFUSION_REQUIRE_SANITIZERS").is_err()
        {
            return None;
        }
        panic!("compiling the prelude harness ({tag}) failed:\n{err}");
    }
    Some(exe)
}

fn run(tag: &str, extra: &[&str]) -> Option<String> {
    let exe = build(tag, extra)?;
    let res = Command::new(&exe)
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr));
    assert!(res.status.success(), "prelude harness ({tag}) failed:\n{text}");
    Some(text)
}

#[test]
fn micro_kernels_and_exp_are_exact_on_every_tail() {
    let text = run("plain", &[]).unwrap();
    assert!(text.contains("portable 4x16 (B f32, f16, bf16): ok"), "{text}");
    assert!(text.contains("portable widen f16, bf16: ok"), "{text}");
    assert!(text.contains("af_expf: worst relative error"), "{text}");
    assert!(text.contains("af_round_f16 against the round trip: ok"), "{text}");
    assert!(
        text.contains("f16 conversions against F16C: ok") || text.contains("f16c: not on this CPU"),
        "{text}"
    );
}

#[test]
fn micro_kernels_under_address_and_undefined_sanitizers() {
    match run(
        "asan",
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
            "-g",
        ],
    ) {
        Some(text) => assert!(text.contains("portable 4x16 (B f32, f16, bf16): ok"), "{text}"),
        None => eprintln!("skipped: the C compiler has no sanitizer runtime"),
    }
}

/// The kernels' f16 and bf16 conversions bit for bit against the `half` crate (the runtime's
/// conversions) on all 65536 halves and a 4M-float sample around every rounding boundary;
/// on a CPU with F16C the harness also compares them with the instructions.
#[test]
fn half_conversions_match_the_half_crate_bit_for_bit() {
    use half::{bf16, f16};
    let exe = build("dump", &[]).unwrap(); // a folder of its own: tests run in parallel
    let file = exe.with_file_name("conversions.bin");
    let st = Command::new(&exe).arg("dump").arg(&file).status().unwrap();
    assert!(st.success());
    let data = std::fs::read(&file).unwrap();
    let u32_at = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().unwrap());
    let u16_at = |i: usize| u16::from_le_bytes(data[i..i + 2].try_into().unwrap());
    let mut bad = Vec::new();
    for h in 0..65536usize {
        let (a, b) = (u32_at(h * 8), u32_at(h * 8 + 4));
        let (wa, wb) = (
            f16::from_bits(h as u16).to_f32().to_bits(),
            bf16::from_bits(h as u16).to_f32().to_bits(),
        );
        if a != wa || b != wb {
            bad.push(format!(
                "half {h:04x}: h2f {a:08x} (half {wa:08x}), bf2f {b:08x} (half {wb:08x})"
            ));
        }
    }
    let base = 65536 * 8;
    let low = [0x0000u32, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800];
    for i in 0..(1u32 << 22) {
        let (hi, k) = (i >> 3, i & 7);
        let lo = if k == 7 { hi.wrapping_mul(2654435761) & 0x1fff } else { low[k as usize] };
        let x = f32::from_bits((hi << 13) | lo);
        let at = base + i as usize * 4;
        let (a, b) = (u16_at(at), u16_at(at + 2));
        let (wa, wb) = (f16::from_f32(x).to_bits(), bf16::from_f32(x).to_bits());
        if a != wa || b != wb {
            bad.push(format!(
                "float {:08x}: f2h {a:04x} (half {wa:04x}), f2bf {b:04x} (half {wb:04x})",
                x.to_bits()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} conversions differ, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}
