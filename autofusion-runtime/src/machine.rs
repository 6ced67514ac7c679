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

/// One x86 feature of the matrix and vector family the kernels may use (issue 35's levels):
/// its name as `/proc/cpuinfo` spells it, and whether this CPU and OS let a program use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuFeature {
    pub name: &'static str,
    pub usable: bool,
}

/// The family this CPU has and the OS enables, widest last: AVX2 + FMA + F16C, AVX-512
/// F/BW/VL, VNNI (AVX-512 and VEX), AVX512-BF16, AVX512-FP16, and AMX (tile, BF16, INT8).
/// AMX counts only when the OS saves tile state (XCR0 bits 17 and 18) and grants this
/// process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, which this
/// call requests: Linux requires it once per process before any tile instruction).
/// Which of them the micro-kernels use is `isa_level`.
pub fn cpu_features() -> Vec<CpuFeature> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::features()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// The names of the usable features, space-separated, for a bench's header line.
pub fn cpu_features_line() -> String {
    let names: Vec<&str> = cpu_features().iter().filter(|f| f.usable).map(|f| f.name).collect();
    if names.is_empty() {
        "none of the x86 vector family".into()
    } else {
        names.join(" ")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CpuFeature;
    use std::arch::x86_64::__cpuid_count;

    /// A register of CPUID leaf 7.
    #[derive(Clone, Copy)]
    enum Reg {
        Eax,
        Ecx,
        Edx,
    }

    /// Bit `bit` of `reg` in CPUID leaf 7, subleaf `subleaf` (Intel SDM vol. 2A, CPUID,
    /// "Structured Extended Feature Flags").
    fn leaf7_bit(subleaf: u32, reg: Reg, bit: u32) -> bool {
        // Leaf 7 is read only when the CPU reports it (leaf 0's EAX is the highest standard
        // leaf), and subleaf 1 only when leaf 7 subleaf 0's EAX says it exists.
        if __cpuid_count(0, 0).eax < 7 || (subleaf > 0 && __cpuid_count(7, 0).eax < subleaf) {
            return false;
        }
        let r = __cpuid_count(7, subleaf);
        let v = match reg {
            Reg::Eax => r.eax,
            Reg::Ecx => r.ecx,
            Reg::Edx => r.edx,
        };
        (v >> bit) & 1 == 1
    }

    /// XCR0 (which register state the OS saves), or 0 when the OS has not enabled XSAVE.
    fn xcr0() -> u64 {
        if (__cpuid_count(1, 0).ecx >> 27) & 1 == 0 {
            return 0;
        }
        // SAFETY: XGETBV runs only when CPUID.1:ECX.OSXSAVE[bit 27] says the OS enabled it.
        unsafe { xgetbv0() }
    }

    #[target_feature(enable = "xsave")]
    unsafe fn xgetbv0() -> u64 {
        std::arch::x86_64::_xgetbv(0)
    }

    /// Linux's per-process permission for AMX tile data (kernel 5.16+): requested, then read
    /// back. 0x1023 is ARCH_REQ_XCOMP_PERM, 0x1022 ARCH_GET_XCOMP_PERM, 18 XFEATURE_XTILEDATA
    /// (arch/x86/include/uapi/asm/prctl.h).
    #[cfg(target_os = "linux")]
    fn amx_permitted() -> bool {
        extern "C" {
            fn syscall(number: i64, ...) -> i64;
        }
        const SYS_ARCH_PRCTL: i64 = 158;
        const XTILEDATA: u64 = 18;
        let mut granted: u64 = 0;
        // SAFETY: arch_prctl with these codes only reads or widens this process's permitted
        // xstate set; the GET form writes one u64 through the pointer given.
        unsafe {
            let _ = syscall(SYS_ARCH_PRCTL, 0x1023i64, XTILEDATA);
            if syscall(SYS_ARCH_PRCTL, 0x1022i64, &mut granted as *mut u64) != 0 {
                return false;
            }
        }
        (granted >> XTILEDATA) & 1 == 1
    }
    #[cfg(not(target_os = "linux"))]
    fn amx_permitted() -> bool {
        false
    }

    pub(super) fn features() -> Vec<CpuFeature> {
        let f = |name, usable| CpuFeature { name, usable };
        // The AVX-512 extensions need the AVX-512 state the OS enables, which
        // is_x86_feature_detected checks for avx512f.
        let avx512 = is_x86_feature_detected!("avx512f");
        // AMX needs the tile state in XCR0 (bits 17 and 18) and this process's permission.
        let tiles =
            leaf7_bit(0, Reg::Edx, 24) && xcr0() & (0b11 << 17) == 0b11 << 17 && amx_permitted();
        vec![
            f("avx2", is_x86_feature_detected!("avx2")),
            f("fma", is_x86_feature_detected!("fma")),
            f("f16c", is_x86_feature_detected!("f16c")),
            f("avx512f", avx512),
            f("avx512bw", is_x86_feature_detected!("avx512bw")),
            f("avx512vl", is_x86_feature_detected!("avx512vl")),
            f("avx_vnni", leaf7_bit(1, Reg::Eax, 4) && is_x86_feature_detected!("avx2")),
            f("avx512_vnni", leaf7_bit(0, Reg::Ecx, 11) && avx512),
            f("avx512_bf16", leaf7_bit(1, Reg::Eax, 5) && avx512),
            f("avx512_fp16", leaf7_bit(0, Reg::Edx, 23) && avx512),
            f("amx_tile", tiles),
            f("amx_bf16", tiles && leaf7_bit(0, Reg::Edx, 22)),
            f("amx_int8", tiles && leaf7_bit(0, Reg::Edx, 25)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our reading of CPUID and XCR0 agrees with the kernel's: every feature we call usable is
    /// a flag of /proc/cpuinfo (which Linux clears for what it does not support), and every
    /// flag there that the OS enables for us is one we find.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn features_agree_with_proc_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags: Vec<&str> = info
            .lines()
            .find_map(|l| l.strip_prefix("flags").and_then(|r| r.split_once(':')))
            .map(|(_, f)| f.split_whitespace().collect())
            .unwrap();
        for f in cpu_features() {
            let listed = flags.contains(&f.name);
            if f.usable {
                assert!(listed, "{} found usable but not in /proc/cpuinfo", f.name);
            } else {
                // Listed but unusable only when the OS leaves the state off for us; for the
                // AVX and AVX-512 families the kernel already hides such flags.
                assert!(
                    !listed || f.name.starts_with("amx"),
                    "{} is in /proc/cpuinfo but not found usable",
                    f.name
                );
            }
        }
        println!("cpu features: {}", cpu_features_line());
    }
}
