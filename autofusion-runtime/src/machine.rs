//! What benchmarks print about the machine they ran on: the CPU model and the micro-kernel
//! level the generated code picks on it, and the read bandwidth they compare against.

/// The CPU's model name (`/proc/cpuinfo`), or "unknown CPU".
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The matmul micro-kernel the generated code picks (`af_isa()` in the host prelude: the widest
/// of avx512f, avx2 + fma + f16c, portable; `AUTOFUSION_ISA` narrows it).
pub fn isa_level() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        let has2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let has512 = is_x86_feature_detected!("avx512f");
        match std::env::var("AUTOFUSION_ISA").as_deref() {
            Ok("portable") => "portable",
            Ok("avx2") if has2 => "avx2",
            _ if has512 => "avx512",
            _ if has2 => "avx2",
            _ => "portable",
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    "portable"
}

/// Read bandwidth in GB/s: every pool thread sums its share of a 1 GiB buffer; the best of 5
/// runs. What a decode step that streams its weights can approach.
pub fn read_bandwidth() -> f64 {
    let n = (1usize << 30) / 4;
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let threads = crate::pool::pool().threads();
    let chunk = n.div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(chunk)
                .map(|c| {
                    s.spawn(move || {
                        // Sixteen independent sums: the loop vectorises and is bound by memory.
                        let mut acc = [0.0f32; 16];
                        for v in c.chunks_exact(16) {
                            for i in 0..16 {
                                acc[i] += v[i];
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                })
                .collect();
            parts.into_iter().map(|p| p.join().unwrap_or(0.0)).sum()
        });
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(total);
        best = best.max((n * 4) as f64 / secs / 1e9);
    }
    best
}
