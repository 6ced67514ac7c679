//! Target profiles: what the planner needs to know about the machine.
//!
//! This first version carries fixed, documented estimates; the calibrated host profile and the
//! `ascend910b` profile replace them (issue 3). Every figure is in bytes or microseconds.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    /// Off-chip bandwidth in bytes per microsecond (1 GB/s = 1,000 B/us).
    pub bandwidth_bytes_per_us: f64,
    /// Cost of one kernel launch (thread-pool fork/join on the host), microseconds.
    pub launch_us: f64,
    /// On-chip capacity one block may use (L2 per core on the host), bytes.
    pub onchip_bytes: u64,
    /// Fraction of `onchip_bytes` a fused kernel may plan to use.
    pub onchip_fraction: f64,
}

impl Target {
    /// The host: L2 per core from sysfs when readable (else 1 MiB); bandwidth 10 GB/s and a
    /// 5 us launch are conservative estimates for a small shared server until calibration lands.
    pub fn host() -> Target {
        Target {
            name: "host".into(),
            bandwidth_bytes_per_us: 10_000.0,
            launch_us: 5.0,
            onchip_bytes: read_l2().unwrap_or(1 << 20),
            onchip_fraction: 0.8,
        }
    }
}

fn read_l2() -> Option<u64> {
    for idx in 0..8 {
        let base = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}");
        let level = std::fs::read_to_string(format!("{base}/level")).ok()?;
        if level.trim() != "2" {
            continue;
        }
        let size = std::fs::read_to_string(format!("{base}/size")).ok()?;
        let s = size.trim();
        let (num, mul) = if let Some(k) = s.strip_suffix('K') {
            (k, 1024)
        } else if let Some(m) = s.strip_suffix('M') {
            (m, 1 << 20)
        } else {
            (s, 1)
        };
        return num.parse::<u64>().ok().map(|v| v * mul);
    }
    None
}
