//! Target profiles: what the cost model knows about a machine. Every rate is per microsecond
//! (1 GB/s = 1,000 B/us; 1 GFLOP/s = 1,000 FLOP/us), every time in microseconds, every size in
//! bytes, so no cost term mixes units.

use crate::abi;
use serde::{Deserialize, Serialize};

/// One on-chip memory a kernel's tiles must fit in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// `l2` on the host; `ub`, `l1`, `l0a`, `l0b`, `l0c` on Ascend.
    pub name: String,
    /// Capacity per core, bytes.
    pub bytes: u64,
}

/// How a target's cores hold what a kernel works on: which on-chip budgets the cost model
/// checks a kernel's tiles against, as the target's generator lays them out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnChip {
    /// Hardware caches (the host): a rows kernel's row, a matmul block and an attention tile
    /// live in the `l2` budget; later passes over a row hit L1 and are not charged.
    #[default]
    Caches,
    /// Software-managed buffers (Ascend): vector work streams rows through `ub` in chunks
    /// (later passes re-read them from L2); the cube stages operands in `l1`, `l0a`, `l0b`
    /// and accumulates in `l0c`.
    Scratchpads,
}

impl OnChip {
    fn is_caches(&self) -> bool {
        *self == OnChip::Caches
    }
}

/// Where `autofusion-build` caches the calibrated host profile, relative to cargo's target
/// directory (versioned with the profile's fields).
pub const HOST_PROFILE_CACHE: &str = "autofusion/host-profile-v8.json";

/// The calibrated host profile cached under cargo's `target_dir`, if there is a readable one.
pub fn cached_host_profile(target_dir: &std::path::Path) -> Option<Target> {
    let text = std::fs::read_to_string(target_dir.join(HOST_PROFILE_CACHE)).ok()?;
    serde_json::from_str(&text).ok()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    /// Blocks that run at once for vector work (host threads; Ascend AIV cores).
    pub cores: u32,
    /// Blocks that run at once for matmul work (host threads; Ascend AIC cores).
    pub matrix_cores: u32,
    /// Off-chip bandwidth of the whole device, B/us.
    pub bandwidth_bytes_per_us: f64,
    /// Shared last-level cache (L3 on the host, L2 on Ascend): bytes, and the bandwidth of
    /// re-reads that hit it, B/us. Re-fetched tiles of a tensor that fits are charged here.
    #[serde(default)]
    pub llc_bytes: u64,
    #[serde(default)]
    pub llc_bandwidth_bytes_per_us: f64,
    /// Matmul peak of the whole device, FLOP/us (host: measured GEMM-tile rate x cores).
    pub matmul_flops_per_us: f64,
    /// Elementwise peak of the whole device, FLOP/us.
    pub vector_flops_per_us: f64,
    /// Transcendental evaluations (exp, tanh, erf...) per us, whole device.
    #[serde(default)]
    pub transcendental_per_us: f64,
    /// Elements per us, whole device, that the matmul and flash templates move while packing
    /// operands into micro-kernel slivers (host; 0 = packing is free, as on Ascend where the
    /// MTE engines move data beside the cube).
    #[serde(default)]
    pub pack_elems_per_us: f64,
    /// Work below this many elements runs on the calling thread without a launch (host runtime).
    #[serde(default)]
    pub inline_below_elems: u64,
    /// The host runtime's blocking limits (matmul mc, nc, kc; flash query and key blocks): the
    /// model prices the tilings DynamicTiling will really use. `None`: search freely.
    #[serde(default)]
    pub runtime_blocking: Option<[i64; 5]>,
    /// The FMA peak of the whole device, FLOP/us (for reports: achieved vs peak).
    #[serde(default)]
    pub fma_peak_flops_per_us: f64,
    /// Cost of one kernel launch, us.
    pub launch_us: f64,
    /// Share of min(memory, compute) hidden by overlap (double buffering), 0..1.
    pub overlap: f64,
    /// On-chip buffers are rounded up to this many bytes.
    pub align_bytes: u64,
    /// Vector pipelines keep two copies of every streamed buffer.
    pub double_buffer: bool,
    /// Bytes per element of matmul operands on the matrix unit (4 on the host: f32 math;
    /// 2 on Ascend: the cube takes f16/bf16).
    pub matmul_operand_bytes: u64,
    pub memories: Vec<Memory>,
    /// How the cores hold a kernel's working data (which of `memories` each kind's tiles use).
    #[serde(default, skip_serializing_if = "OnChip::is_caches")]
    pub on_chip: OnChip,
    /// A plan may use at most this fraction of each memory.
    pub onchip_fraction: f64,
    /// Where each number comes from (measured, documented, or assumed).
    pub sources: Vec<String>,
}

impl Target {
    pub fn memory(&self, name: &str) -> Option<u64> {
        self.memories.iter().find(|m| m.name == name).map(|m| m.bytes)
    }

    /// The memory vector work (rows kernels, epilogues, softmax tiles) holds its data in.
    pub fn vector_memory(&self) -> &'static str {
        match self.on_chip {
            OnChip::Caches => "l2",
            OnChip::Scratchpads => "ub",
        }
    }

    /// Capacity a plan may use in memory `name`.
    pub fn budget(&self, name: &str) -> Option<u64> {
        self.memory(name).map(|b| (b as f64 * self.onchip_fraction) as u64)
    }

    /// The host with fixed, conservative figures for what is not read from the OS: cores and
    /// cache sizes come from the OS; bandwidth 10 GB/s, 8 GFLOP/s matmul and 2 GFLOP/s
    /// elementwise per core and a 5 us launch are placeholders that `autofusion-build`
    /// replaces with its calibration (or a pinned profile file).
    pub fn host() -> Target {
        let cores = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        let l2 = read_cache(2).unwrap_or(1 << 20);
        let l1 = read_cache(1).unwrap_or(32 << 10);
        Target {
            name: "host".into(),
            cores,
            matrix_cores: cores,
            bandwidth_bytes_per_us: 10_000.0,
            // Tensors that fit the cores' private L2s together stay in cache between kernels.
            llc_bytes: l2 * cores as u64,
            llc_bandwidth_bytes_per_us: 50_000.0,
            matmul_flops_per_us: 8_000.0 * cores as f64,
            vector_flops_per_us: 2_000.0 * cores as f64,
            transcendental_per_us: 200.0 * cores as f64,
            pack_elems_per_us: 1000.0 * cores as f64,
            inline_below_elems: 1 << 14,
            runtime_blocking: Some([
                abi::MC_MAX,
                abi::NC_MAX,
                abi::KC_MAX,
                abi::BR_MAX,
                abi::BC_MAX,
            ]),
            fma_peak_flops_per_us: 0.0,
            launch_us: 5.0,
            overlap: 0.5,
            align_bytes: 64,
            double_buffer: false,
            matmul_operand_bytes: 4,
            memories: vec![Memory { name: "l1".into(), bytes: l1 }, Memory { name: "l2".into(), bytes: l2 }],
            on_chip: OnChip::Caches,
            onchip_fraction: 0.8,
            sources: vec![
                format!("cores: available_parallelism = {cores}"),
                format!("l1/l2 per core: sysfs cache index = {l1} / {l2} B; in-cache tensors up to {} B (the cores' L2s)", l2 * cores as u64),
                "bandwidth, flops, launch: uncalibrated defaults".into(),
            ],
        }
    }

    /// Atlas A2 (Ascend 910B2): 24 AIC + 48 AIV, UB 192 KB, L1 512 KB, L0A/L0B 64 KB,
    /// L0C 128 KB, 32-byte alignment, double buffering (asc-devkit
    /// `docs/zh/guide/.../硬件约束/NPU架构版本2201.md`: UB 192 KB per AIV less 256 B and the 8 KB
    /// Ascend C reserve = 188160 B; L1 512 KB; L0A/L0B 64 KB; L0C 128 KB).
    /// HBM bandwidth, clock and launch cost are not in the devkit: the figures below are
    /// assumptions, stated as such in `sources`, to be replaced by measurements on hardware.
    pub fn ascend910b() -> Target {
        Target {
            name: "ascend910b".into(),
            cores: 48,
            matrix_cores: 24,
            // Assumed 1.6 TB/s: the upper end of public 910B claims, not measured here.
            bandwidth_bytes_per_us: 1.6e6,
            // 192 MB L2 (public 910B figure, not in the devkit); re-reads that hit it at 2.5x
            // HBM bandwidth (the factor XLA's GPU cost model uses for L2 hits).
            llc_bytes: 192 << 20,
            llc_bandwidth_bytes_per_us: 4.0e6,
            // 8192 FLOP/cycle/AIC x 24 AIC x an assumed 1.65 GHz ~ 324 TFLOP/s fp16.
            matmul_flops_per_us: 8192.0 * 24.0 * 1650.0,
            // 128 fp32 lanes x 2 (FMA) per AIV x 48 AIV x 1.65 GHz.
            vector_flops_per_us: 256.0 * 48.0 * 1650.0,
            // Assumed: exp/ln on the vector unit at 1/8 of the FMA rate.
            transcendental_per_us: 64.0 * 48.0 * 1650.0 / 8.0,
            pack_elems_per_us: 0.0,
            inline_below_elems: 0,
            runtime_blocking: None,
            fma_peak_flops_per_us: 8192.0 * 24.0 * 1650.0,
            launch_us: 5.0,
            overlap: 0.9,
            align_bytes: 32,
            double_buffer: true,
            matmul_operand_bytes: 2,
            memories: vec![
                // UB: 192 KB - 256 B usable, minus the 8 KB Ascend C reserve.
                Memory { name: "ub".into(), bytes: 188_160 },
                Memory { name: "l1".into(), bytes: 524_032 },
                Memory { name: "l0a".into(), bytes: 65_536 },
                Memory { name: "l0b".into(), bytes: 65_536 },
                Memory { name: "l0c".into(), bytes: 131_072 },
            ],
            on_chip: OnChip::Scratchpads,
            onchip_fraction: 0.8,
            sources: vec![
                "cores, UB/L1/L0 sizes, 32 B alignment, cube 8192 FLOP/cycle: asc-devkit NPU arch 2201 constraint pages".into(),
                "HBM 1.6 TB/s, L2 192 MB at 4 TB/s, clock 1.65 GHz, launch 5 us: assumptions (not in the devkit; measure on hardware)".into(),
            ],
        }
    }

    /// A profile by name (`host`, `ascend910b`).
    pub fn named(name: &str) -> Option<Target> {
        match name {
            "host" => Some(Target::host()),
            "ascend910b" => Some(Target::ascend910b()),
            _ => None,
        }
    }
}

/// Data cache size of `level` for cpu0 from sysfs.
fn read_cache(level: u32) -> Option<u64> {
    for idx in 0..8 {
        let base = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}");
        let lv = std::fs::read_to_string(format!("{base}/level")).ok()?;
        let ty = std::fs::read_to_string(format!("{base}/type")).unwrap_or_default();
        if lv.trim() != level.to_string() || ty.trim() == "Instruction" {
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
