//! The measured peak of each matrix and vector instruction family this CPU and OS let us use
//! (issue 35): register-resident loops of independent accumulators, run on every pool thread
//! at once, best of many short tries. One line each, `peak <isa>: X GFLOP/s` (`GOP/s` for the
//! integer families), so a GEMM's rate can be read as a share of the level it ran on. Families
//! the machine lacks are named as absent, never timed.
//!
//! Operations counted per instruction (each multiply and each add):
//! - `avx512f` / `avx2`: `vfmadd` on 16 / 8 f32 lanes: 32 / 16;
//! - `avx512_bf16`: `vdpbf16ps`, 16 lanes of two bf16 products each: 64;
//! - `avx512_vnni` / `avx_vnni`: `vpdpbusd`, 16 / 8 lanes of four u8 x s8 products: 128 / 64;
//! - `amx_bf16`: `tdpbf16ps` on 16 x 16 f32 C, 16 x 32 bf16 A: 16 * 16 * 32 * 2 = 16384;
//! - `amx_int8`: `tdpbusd` on 16 x 16 i32 C, 16 x 64 u8 A: 32768.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One family: its name, unit, whether this machine may run it, and one thread's loop of
/// `iters` rounds returning the operations it did.
pub struct Family {
    pub name: &'static str,
    pub unit: &'static str,
    pub usable: bool,
    run: fn(u64) -> f64,
}

/// The families in the order the bench prints them, each marked usable from
/// `machine::cpu_features` (which also asks Linux for the AMX tile data before any tile
/// instruction runs).
pub fn families() -> Vec<Family> {
    let has =
        |name: &str| autofusion::machine::cpu_features().iter().any(|f| f.name == name && f.usable);
    let fam = |name, unit, usable, run| Family { name, unit, usable, run };
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            fam("avx2", "GFLOP/s", has("avx2") && has("fma"), run_fma256),
            fam("avx512f", "GFLOP/s", has("avx512f"), run_fma512),
            fam("avx512_bf16", "GFLOP/s", has("avx512_bf16"), run_dpbf16),
            fam("avx_vnni", "GOP/s", has("avx_vnni"), run_vnni256),
            fam("avx512_vnni", "GOP/s", has("avx512_vnni"), run_vnni512),
            fam("amx_bf16", "GFLOP/s", has("amx_bf16"), run_amx_bf16),
            fam("amx_int8", "GOP/s", has("amx_int8"), run_amx_int8),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (has, fam);
        Vec::new()
    }
}

/// Scalar f32 `mul_add` chains: the FMA peak's stand-in on a CPU without AVX2 (not a family
/// of its own: the portable kernels are whatever the C compiler makes of them).
pub fn scalar() -> Family {
    Family { name: "scalar", unit: "GFLOP/s", usable: true, run: run_scalar }
}

fn run_scalar(iters: u64) -> f64 {
    let mut acc = [1.0f32; 32];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(acc);
    iters as f64 * 64.0
}

/// Giga-operations per second of every pool thread running `f`'s loop at once: the best of
/// `tries`, since a try in which another process takes a core measures that process.
pub fn peak(f: &Family, threads: usize, tries: usize) -> f64 {
    assert!(f.usable, "{} is not usable here: never timed", f.name);
    let iters = 200_000;
    let mut best = 0.0f64;
    for _ in 0..tries {
        let barrier = std::sync::Barrier::new(threads);
        let res: Vec<(f64, f64)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let t0 = std::time::Instant::now();
                        let ops = (f.run)(iters);
                        (ops, t0.elapsed().as_secs_f64())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ops: f64 = res.iter().map(|r| r.0).sum();
        let secs = res.iter().map(|r| r.1).fold(0.0, f64::max);
        best = best.max(ops / secs / 1e9);
    }
    best
}

/// Sixteen (twelve for 256-bit) independent accumulators: enough to cover each family's
/// latency on its ports, so the loop is bound by throughput.
macro_rules! chains {
    ($iters:expr, $n:expr, $zero:expr, $step:expr, $reduce:expr) => {{
        let mut c = [$zero; $n];
        for _ in 0..$iters {
            for x in c.iter_mut() {
                *x = $step(*x);
            }
        }
        $reduce(c)
    }};
}

#[cfg(target_arch = "x86_64")]
fn run_fma256(iters: u64) -> f64 {
    // SAFETY: `families` marks this usable only where AVX2 and FMA are.
    std::hint::black_box(unsafe { fma256(iters) });
    iters as f64 * 12.0 * 16.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma256(iters: u64) -> bool {
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    chains!(iters, 12, _mm256_set1_ps(1.0), |x| _mm256_fmadd_ps(x, a, b), |c: [__m256; 12]| {
        let s = c.iter().fold(_mm256_setzero_ps(), |s, x| _mm256_add_ps(s, *x));
        _mm256_cvtss_f32(s) != 0.5
    })
}

#[cfg(target_arch = "x86_64")]
fn run_fma512(iters: u64) -> f64 {
    // SAFETY: usable only where AVX-512F is.
    std::hint::black_box(unsafe { fma512(iters) });
    iters as f64 * 16.0 * 32.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma512(iters: u64) -> bool {
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    chains!(iters, 16, _mm512_set1_ps(1.0), |x| _mm512_fmadd_ps(x, a, b), |c: [__m512; 16]| {
        _mm512_reduce_add_ps(c.iter().fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x))) != 0.5
    })
}

#[cfg(target_arch = "x86_64")]
fn run_dpbf16(iters: u64) -> f64 {
    // SAFETY: usable only where AVX512-BF16 is.
    std::hint::black_box(unsafe { dpbf16(iters) });
    iters as f64 * 16.0 * 64.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16(iters: u64) -> bool {
    // bf16 pairs (1.0, 1.0) times (2^-20, 2^-20): small steps, no overflow in any run.
    // SAFETY: __m512bh and __m512i are both 64 bytes of lanes.
    let a: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80)) };
    let b: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3580_3580)) };
    chains!(iters, 16, _mm512_setzero_ps(), |x| _mm512_dpbf16_ps(x, a, b), |c: [__m512; 16]| {
        _mm512_reduce_add_ps(c.iter().fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x))) != 0.5
    })
}

#[cfg(target_arch = "x86_64")]
fn run_vnni512(iters: u64) -> f64 {
    // SAFETY: usable only where AVX512-VNNI is.
    std::hint::black_box(unsafe { vnni512(iters) });
    iters as f64 * 16.0 * 128.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn vnni512(iters: u64) -> bool {
    let a = _mm512_set1_epi32(0x0101_0101);
    chains!(
        iters,
        16,
        _mm512_setzero_si512(),
        |x| _mm512_dpbusd_epi32(x, a, a),
        |c: [__m512i; 16]| {
            _mm512_reduce_add_epi32(
                c.iter().fold(_mm512_setzero_si512(), |s, x| _mm512_add_epi32(s, *x)),
            ) != 7
        }
    )
}

#[cfg(target_arch = "x86_64")]
fn run_vnni256(iters: u64) -> f64 {
    // SAFETY: usable only where AVX-VNNI is.
    std::hint::black_box(unsafe { vnni256(iters) });
    iters as f64 * 12.0 * 64.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn vnni256(iters: u64) -> bool {
    let a = _mm256_set1_epi32(0x0101_0101);
    chains!(
        iters,
        12,
        _mm256_setzero_si256(),
        |x| _mm256_dpbusd_avx_epi32(x, a, a),
        |c: [__m256i; 12]| {
            _mm256_extract_epi32::<0>(
                c.iter().fold(_mm256_setzero_si256(), |s, x| _mm256_add_epi32(s, *x)),
            ) != 7
        }
    )
}

/// The tile configuration `ldtilecfg` reads (Intel SDM vol. 1, 18.2: palette 1): tiles 0-3
/// the C blocks, 4-5 A, 6-7 B, each 16 rows of 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Four C tiles from two A and two B tiles per round (the 2 x 2 blocking of
/// `docs/cpu-matrix-engines.md`), `op` the dot-product instruction; the operands are loaded
/// once and stay in the tiles.
#[cfg(target_arch = "x86_64")]
macro_rules! amx_loop {
    ($iters:expr, $op:literal) => {{
        let mut cfg = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        // Small values (bf16 2^-20 or int8 1): the rate does not depend on them.
        let src = [0x3580_3580u32; 256];
        let mut out = [0u32; 256];
        // SAFETY: `families` marks the AMX loops usable only when CPUID reports the tiles, the
        // OS saves their state and Linux granted this process the tile data; every tile is
        // configured before use and released after; `src` and `out` are 16 rows of 64 bytes.
        unsafe {
            std::arch::asm!(
                "ldtilecfg [{cfg}]",
                "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
                "tileloadd tmm4, [{src} + {stride}*1]",
                "tileloadd tmm5, [{src} + {stride}*1]",
                "tileloadd tmm6, [{src} + {stride}*1]",
                "tileloadd tmm7, [{src} + {stride}*1]",
                "2:",
                concat!($op, " tmm0, tmm4, tmm6"),
                concat!($op, " tmm1, tmm4, tmm7"),
                concat!($op, " tmm2, tmm5, tmm6"),
                concat!($op, " tmm3, tmm5, tmm7"),
                "dec {n}",
                "jnz 2b",
                "tilestored [{out} + {stride}*1], tmm0",
                "tilerelease",
                cfg = in(reg) &cfg,
                src = in(reg) src.as_ptr(),
                out = in(reg) out.as_mut_ptr(),
                stride = in(reg) 64usize,
                n = inout(reg) $iters.max(1) => _,
                options(nostack),
            );
        }
        std::hint::black_box(out);
    }};
}

#[cfg(target_arch = "x86_64")]
fn run_amx_bf16(iters: u64) -> f64 {
    let n = iters / 16; // a tile instruction does 256x a vector one's work
    amx_loop!(n, "tdpbf16ps");
    n.max(1) as f64 * 4.0 * 16384.0
}

#[cfg(target_arch = "x86_64")]
fn run_amx_int8(iters: u64) -> f64 {
    let n = iters / 16;
    amx_loop!(n, "tdpbusd");
    n.max(1) as f64 * 4.0 * 32768.0
}
