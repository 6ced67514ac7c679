//! What benchmarks print about the machine they ran on: the CPU model and the micro-kernel
//! level the generated code picks on it.

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
