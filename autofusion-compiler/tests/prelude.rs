//! The C prelude's numeric building blocks, compiled and run on this machine: every matmul
//! micro-kernel the CPU supports (portable, AVX2+FMA, AVX-512F) against a naive product for
//! all tile tails, both A layouts (packed sliver, matrix rows) and both store modes, and
//! `af_expf` against double-precision `exp`. Built once plainly and once with AddressSanitizer + UBSan, so an out-of-bounds store of a tail
//! or an undefined shift fails the test.

use autofusion_compiler::codegen::host::CFLAGS;
use autofusion_compiler::codegen::{write_headers, HOST_HEADER};
use std::path::PathBuf;
use std::process::Command;

const HARNESS: &str = r#"
#include <stdio.h>
static int check_uk(const char *name, af_uk_fn uk, int64_t MR, int64_t NR) {
    int bad = 0;
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
        uk(kc, A, rs, cs, B, C, ldc, mr, nr, acc);
        for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j)
                if (C[i * ldc + j] != R[i * nr + j] && bad++ < 5)
                    printf("%s %s kc=%ld mr=%ld nr=%ld acc=%d: C[%ld][%ld] = %g, want %g\n", name, rows ? "rows" : "sliver", (long)kc, (long)mr,
                           (long)nr, acc, (long)i, (long)j, C[i * ldc + j], R[i * nr + j]);
        free(A), free(B), free(C), free(R);
    }
    printf("%s %ldx%ld: %s\n", name, (long)MR, (long)NR, bad ? "FAILED" : "ok");
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
int main(void) {
    int bad = check_exp();
    bad += check_uk("portable", af_uk_portable, 4, 16);
#ifdef AF_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) bad += check_uk("avx2", af_uk_avx2, 6, 16);
    else printf("avx2: not on this CPU\n");
    if (__builtin_cpu_supports("avx512f")) bad += check_uk("avx512", af_uk_avx512, 8, 32);
    else printf("avx512: not on this CPU\n");
#endif
    af_isa_info isa = af_isa();
    printf("selected: %s\n", isa.name);
    return bad != 0;
}
"#;

fn run(tag: &str, extra: &[&str]) -> Option<String> {
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
        if !extra.is_empty() && err.contains("sanitize") {
            return None; // this compiler has no sanitizer runtime
        }
        panic!("compiling the prelude harness ({tag}) failed:\n{err}");
    }
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
    assert!(text.contains("portable 4x16: ok"), "{text}");
    assert!(text.contains("af_expf: worst relative error"), "{text}");
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
        Some(text) => assert!(text.contains("portable 4x16: ok"), "{text}"),
        None => eprintln!("skipped: the C compiler has no sanitizer runtime"),
    }
}
