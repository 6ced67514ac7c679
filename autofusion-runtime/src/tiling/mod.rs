//! DynamicTiling: the blocking of every kernel chosen from the bound shape at run time, and
//! cached per (module, dims) by the executor. One module per kind of work (`abi::Work`):
//! `rows`, `matmul`, `horizontal`, `flash`, each with its host and its Ascend choice. The blocking limits are the ABI's
//! (`autofusion_ir::abi::MC_MAX` ...), which the host profile also reads, so the cost model
//! prices these tilings.

mod flash;
mod horizontal;
mod matmul;
mod rows;

use autofusion_ir::abi::{Work, ASCEND_CUBE_FIELDS, MR_MAX, NR_MAX, TILING_FIELDS};
use autofusion_ir::dim::DimExpr;
use autofusion_ir::AscendKernel;

/// The bound dims as a function of a dim expression.
type Eval<'a> = &'a dyn Fn(&DimExpr) -> i64;

/// What every kind's host DynamicTiling reads: the bound dims and the worker count.
#[derive(Clone, Copy)]
struct HostCx<'a> {
    eval: Eval<'a>,
    threads: i64,
}

/// What every kind's Ascend DynamicTiling reads: the kernel, the bound dims, the UB columns a
/// chunk may take (`fit`), the device's cores and the pipeline launch's AIVs, if any.
#[derive(Clone, Copy)]
struct AscendCx<'a> {
    kernel: &'a AscendKernel,
    eval: Eval<'a>,
    fit: i64,
    cores: AscendCores,
    pipeline_aivs: Option<i64>,
}

/// `af_tiling` of the kernel ABI (`autofusion_ir::abi`), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiling {
    pub block_num: i64,
    pub rows_per_block: i64,
    pub mc: i64,
    pub nc: i64,
    pub kc: i64,
    pub units: i64,
    /// Key ranges per KV group of a flash kernel's few-queries path (0: the tiled path).
    pub splits: i64,
    pub reserved1: i64,
}

const _: () = assert!(std::mem::size_of::<Tiling>() == TILING_FIELDS.len() * 8);

/// Work below this many elements runs as a single block: a launch across threads costs more.
const MIN_PARALLEL_ELEMS: i64 = 1 << 14;

pub use autofusion_ir::abi::{BC_MAX, BR_MAX, KC_MAX, MC_MAX, NC_MAX};

/// Scratch floats of the matmul template: the packed A block (padded to whole slivers), one
/// prologue row, one packed B sliver and the C block (rows padded by 16 floats).
fn gemm_scratch(mc: i64, nc: i64, kc: i64) -> usize {
    ((mc + MR_MAX) * kc + kc + kc * NR_MAX + mc * (nc + 16)) as usize
}

/// A product of extents, saturating: the flop count of a shape whose tensors fit in memory
/// can still pass `i64::MAX`, and only its comparison with a threshold matters here.
fn flops(factors: &[i64]) -> i64 {
    factors.iter().fold(1i64, |acc, &f| acc.saturating_mul(f))
}

/// `units` work units in at most `max_blocks` blocks (one block when the work is too small to
/// be worth a launch across threads): (block_num, units per block).
fn split(units: i64, parallel: bool, max_blocks: i64) -> (i64, i64) {
    let blocks = if parallel { units.min(max_blocks) } else { 1 }.max(1);
    let upb = ((units + blocks - 1) / blocks).max(1);
    (if units <= 0 { 0 } else { (units + upb - 1) / upb }, upb)
}

/// Choose a tiling for `work` evaluated at the bound dims, for `threads` workers. Returns the
/// tiling and the scratch floats one block needs.
pub fn choose(
    work: &Work,
    eval: &dyn Fn(&autofusion_ir::dim::DimExpr) -> i64,
    threads: usize,
) -> (Tiling, usize) {
    let cx = HostCx { eval, threads: threads.max(1) as i64 };
    match work {
        Work::Rows { rows, n, row_buffers } => rows::host(&cx, rows, n, *row_buffers),
        Work::MatMul { batch, m, n, k, products, nc_step } => {
            matmul::host(&cx, [batch, m, n, k], *products, eval(nc_step))
        }
        Work::Horizontal { parts, nc_step } => horizontal::host(&cx, parts, eval(nc_step)),
        Work::Flash { batch, sq, sk, d, dv, group } => {
            flash::host(&cx, batch, sq, sk, d, dv, group)
        }
    }
}

/// Bytes of memory shared by the blocks of one launch of a kernel with `tiling` (zeroed by
/// the runtime before the launch): the partial results of a flash kernel whose keys are
/// split, and their counters. 0 for every other kernel.
pub fn workspace_bytes(
    work: &Work,
    tiling: &Tiling,
    eval: &dyn Fn(&autofusion_ir::dim::DimExpr) -> i64,
) -> usize {
    match work {
        Work::Flash { batch, sq, dv, group, .. } if tiling.splits > 1 => {
            flash::workspace_floats(eval(batch), eval(sq), eval(dv), eval(group), tiling.splits) * 4
        }
        _ => 0,
    }
}

/// The tiling of a pack function (`abi::PackMeta`) for a `batch x k x n` operand: column
/// groups of `NR_MAX` spread over the threads when the operand is large enough.
pub fn choose_pack(batch: i64, k: i64, n: i64, threads: usize) -> (Tiling, usize) {
    let units = batch.max(0) * ((n.max(0) + NR_MAX - 1) / NR_MAX);
    let (block_num, upb) =
        split(units, batch * k * n >= MIN_PARALLEL_ELEMS, 4 * threads.max(1) as i64);
    (Tiling { block_num, rows_per_block: upb, units, ..Default::default() }, 0)
}

/// `AfTiling` of the generated Ascend C (`autofusion_ir::abi::ASCEND_TILING_FIELDS`,
/// then two `TCubeTiling` field sets as int32, `ASCEND_CUBE_FIELDS` order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AscendTiling {
    pub block_num: i64,
    pub chunk: i64,
    pub mc: i64,
    pub nc: i64,
    pub br: i64,
    pub bc: i64,
    pub ws_floats: i64,
    /// 1: output tiles in column-panel order (`autofusion_ir::abi::ascend_n_major`).
    pub n_major: i64,
    /// Key ranges per query block of a flash kernel (flash-decoding; 0 or 1: not split).
    pub splits: i64,
    pub cube: [[i32; ASCEND_CUBE_FIELDS.len()]; 2],
}

const _: () =
    assert!(std::mem::size_of::<AscendTiling>() == autofusion_ir::abi::ascend_tiling_bytes());

/// The cores of one Ascend device: cube cores (AICs, one per mix 1:2 group) and vector cores
/// (AIVs). A launch must not ask for more blocks than the chip has: `SyncAll` over blocks
/// that never run waits forever. The runtime reads them from the device
/// (`aclGetDeviceCapability`); `A2_24` is the Ascend910B2 (24 cube, 48 vector cores), the
/// figures of the CANN platform file examples and of the emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AscendCores {
    pub aic: i64,
    pub aiv: i64,
}

impl AscendCores {
    pub const A2_24: AscendCores = AscendCores { aic: 24, aiv: 48 };
    /// Mix 1:2 groups a launch can have: one AIC and two AIVs each.
    pub fn groups(self) -> i64 {
        self.aic.min(self.aiv / 2).max(1)
    }
}

/// Ascend 910B figures DynamicTiling works with (asc-devkit arch-2201 pages and platform
/// stubs): the UB an `InitBuffer` may take (192 KB less the 8 KB Ascend C reserve), and the
/// Matmul API's system workspace (`GetLibApiWorkSpaceSize()` for arch 2201).
pub const ASCEND_UB_BYTES: i64 = 188_160;
pub const ASCEND_SYS_WORKSPACE: usize = 16 << 20;
/// Share of the UB a kernel's buffers may take (the planner's capacity rule).
const ASCEND_UB_SHARE: f64 = 0.8;
/// Largest output tile of one AIV (rows, columns of C); L0 bases are at most 128 x 128.
const ASCEND_TILE_MAX: i64 = 128;
const ASCEND_BASE_K: i32 = 32;

/// How one Ascend kernel runs at a bound shape.
#[derive(Clone, Debug, PartialEq)]
pub struct AscendLaunch {
    pub tiling: AscendTiling,
    /// `numBlocks` of its own launch: AIVs for a vector kernel, AIC:AIV 1:2 groups for a mix one.
    pub block_dim: u32,
    /// No work at this shape (a zero extent): not launched.
    pub empty: bool,
}

fn round_up(x: i64, m: i64) -> i64 {
    (x + m - 1) / m * m
}

/// The `TCubeTiling` fields (`ASCEND_CUBE_FIELDS` order) of an `m x n` by `k` product done
/// in `mc x nc` tiles by `cores` cores: bases at most 128 x 128 x 32 (multiples of 16; 32 is
/// a whole 32-byte fractal of K for f32 and two for half operands), L1 depth 2 (stepM/N/Ka/Kb = 1, double-buffered), L0A/L0B double-buffered. The
/// L0/L1 budgets this meets are checked by the emulator at `REGIST_MATMUL_OBJ`.
pub fn cube_tiling(
    m: i64,
    n: i64,
    k: i64,
    mc: i64,
    nc: i64,
    cores: i64,
) -> [i32; ASCEND_CUBE_FIELDS.len()] {
    let base_m = round_up(mc.max(1), 16).min(ASCEND_TILE_MAX) as i32;
    let base_n = round_up(nc.max(1), 16).min(ASCEND_TILE_MAX) as i32;
    let mut f = [0i32; ASCEND_CUBE_FIELDS.len()];
    let mut set = |name: &str, v: i64| {
        let i = ASCEND_CUBE_FIELDS.iter().position(|x| *x == name).expect("cube field");
        f[i] = v.clamp(0, i32::MAX as i64) as i32;
    };
    set("usedCoreNum", cores.max(1));
    set("M", m);
    set("N", n);
    set("Ka", k);
    set("Kb", k);
    set("singleCoreM", mc);
    set("singleCoreN", nc);
    set("singleCoreK", k);
    set("baseM", base_m as i64);
    set("baseN", base_n as i64);
    set("baseK", ASCEND_BASE_K as i64);
    set("depthA1", 2);
    set("depthB1", 2);
    set("stepM", 1);
    set("stepN", 1);
    set("isBias", 0);
    set("transLength", 0);
    set("iterateOrder", 0);
    set("stepKa", 1);
    set("stepKb", 1);
    set("dbL0A", 2);
    set("dbL0B", 2);
    set("dbL0C", 1);
    f
}

/// Check a `TCubeTiling` (fields in `ASCEND_CUBE_FIELDS` order, A and B elements of
/// `in_bytes`: 4 for f32, 2 for half / bfloat16_t; L0C accumulates in f32) against what
/// the official host tiling API enforces for arch 2201 (asc-devkit `impl/adv_api/tiling/
/// matmul/`: `MatmulApiTilingBase::SetFixSplit` and `CheckSetParam` in
/// `matmul_tiling_base.cpp`, `CheckFinalParams` in `matmul_tiling_algorithm.cpp`) and the
/// kernel-side `ShapeValidCheck` / `DepthCheck` of `impl/adv_api/detail/matmul/param/
/// matmul_shape_tiling.h`, with the arch-2201 sizes of `matmul_config_utils.h` (L1 512 KiB,
/// L0A / L0B 64 KiB, L0C 128 KiB). `aic` is the device's cube-core count.
pub fn check_cube_tiling(
    t: &[i32; ASCEND_CUBE_FIELDS.len()],
    aic: i64,
    in_bytes: u32,
) -> Result<(), String> {
    let f = |name: &str| -> i64 {
        t[ASCEND_CUBE_FIELDS.iter().position(|x| *x == name).expect("cube field")] as i64
    };
    if in_bytes != 2 && in_bytes != 4 {
        return Err(format!("TCubeTiling rejected: A / B elements of {in_bytes} bytes"));
    }
    let (sa, sb, sc) = (in_bytes as i64, in_bytes as i64, 4i64); // A, B; f32 L0C accumulators
    let (bm, bn, bk) = (f("baseM"), f("baseN"), f("baseK"));
    let mut bad = Vec::new();
    let mut need = |ok: bool, what: String| {
        if !ok {
            bad.push(what);
        }
    };
    for (n, v) in [("M", f("M")), ("N", f("N")), ("Ka", f("Ka")), ("Kb", f("Kb"))] {
        need(v > 0, format!("{n} = {v} must be > 0"));
    }
    for (n, whole) in [("singleCoreM", "M"), ("singleCoreN", "N"), ("singleCoreK", "Ka")] {
        need(
            (1..=f(whole)).contains(&f(n)),
            format!("{n} = {} must be in 1..={whole} = {}", f(n), f(whole)),
        );
    }
    need(f("Ka") == f("Kb"), format!("Ka = {} != Kb = {}", f("Ka"), f("Kb")));
    need(bm > 0 && bm % 16 == 0, format!("baseM = {bm} must be a positive multiple of 16"));
    need(bn > 0 && bn % 16 == 0, format!("baseN = {bn} must be a positive multiple of 16"));
    let k0 = 32 / sa; // 32 bytes of A along K
    need(bk > 0 && bk % k0 == 0, format!("baseK = {bk} must be a positive multiple of {k0}"));
    let db_ab = if f("dbL0A") == 2 && f("dbL0B") == 2 { 2 } else { 1 };
    let db_c = if f("dbL0C") == 2 { 2 } else { 1 };
    need(bm * bk * sa * db_ab <= 64 << 10, format!("baseM * baseK * {sa} * {db_ab} > L0A 64 KiB"));
    need(bn * bk * sb * db_ab <= 64 << 10, format!("baseN * baseK * {sb} * {db_ab} > L0B 64 KiB"));
    need(bm * bn * sc * db_c <= 128 << 10, format!("baseM * baseN * 4 * {db_c} > L0C 128 KiB"));
    let (sm, sn, ska, skb) = (f("stepM"), f("stepN"), f("stepKa"), f("stepKb"));
    let (da, db) = (f("depthA1"), f("depthB1"));
    for (n, v) in [("stepM", sm), ("stepN", sn), ("stepKa", ska), ("stepKb", skb)] {
        need(v > 0, format!("{n} = {v} must be > 0"));
    }
    need(sm <= da && sn <= db, format!("stepM {sm} <= depthA1 {da}, stepN {sn} <= depthB1 {db}"));
    for (d, step, n) in [(da, sm * ska, "A"), (db, sn * skb, "B")] {
        need(
            step > 0 && d % step == 0 && d / step <= 2,
            format!("depth{n}1 = {d} must be 1 or 2 times step = {step}"),
        );
    }
    let l1 = da * bm * bk * sa + db * bn * bk * sb;
    need(l1 <= 512 << 10, format!("L1 use {l1} B > 512 KiB"));
    need(
        (1..=aic).contains(&f("usedCoreNum")),
        format!("usedCoreNum = {} must be in 1..={aic} (cube cores)", f("usedCoreNum")),
    );
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("TCubeTiling rejected: {}", bad.join("; ")))
    }
}

/// The bytes of the A / B elements Matmul object `i` of kernel `k` reads.
fn cube_bytes(k: &autofusion_ir::AscendKernel, i: usize) -> std::result::Result<u32, String> {
    k.cube_bytes.get(i).copied().ok_or_else(|| {
        format!("kernel `{}`: the module names no element size for Matmul object {i}", k.name)
    })
}

/// DynamicTiling for one generated Ascend kernel at the bound dims on a device with `cores`.
/// `pipeline_aivs` is the number of AIVs of the pipeline launch it runs in (`None`: its own
/// launch). Returns the launch and the user-workspace bytes the kernel needs.
pub fn choose_ascend(
    k: &autofusion_ir::AscendKernel,
    eval: &dyn Fn(&autofusion_ir::dim::DimExpr) -> i64,
    cores: AscendCores,
    pipeline_aivs: Option<i64>,
) -> std::result::Result<(AscendLaunch, usize), String> {
    let budget = (ASCEND_UB_BYTES as f64 * ASCEND_UB_SHARE) as i64 - k.ub_fixed as i64;
    let per_col = (k.ub_per_col as i64).max(1);
    let fit = budget / per_col / 16 * 16;
    if fit < 16 {
        return Err(format!(
            "kernel `{}` needs {} B of UB per column and {} B fixed: not even 16 columns fit in {} B",
            k.name, k.ub_per_col, k.ub_fixed, (ASCEND_UB_BYTES as f64 * ASCEND_UB_SHARE) as i64
        ));
    }
    let cx = AscendCx { kernel: k, eval, fit, cores, pipeline_aivs };
    match &k.work {
        Work::Rows { rows, n, .. } => rows::ascend(&cx, rows, n),
        Work::MatMul { batch, m, n, k: kk, products, nc_step } => {
            matmul::ascend(&cx, [batch, m, n, kk], *products, eval(nc_step))
        }
        Work::Flash { batch, sq, sk, d, dv, .. } => flash::ascend(&cx, batch, sq, sk, d, dv),
        Work::Horizontal { parts, nc_step } => horizontal::ascend(&cx, parts, eval(nc_step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autofusion_ir::dim::DimExpr;

    #[test]
    fn field_offsets_match_the_c_struct() {
        let t = Tiling::default();
        let base = &t as *const Tiling as usize;
        let offs = [
            &t.block_num as *const i64 as usize,
            &t.rows_per_block as *const i64 as usize,
            &t.mc as *const i64 as usize,
            &t.nc as *const i64 as usize,
            &t.kc as *const i64 as usize,
            &t.units as *const i64 as usize,
            &t.splits as *const i64 as usize,
            &t.reserved1 as *const i64 as usize,
        ];
        for (i, o) in offs.iter().enumerate() {
            assert_eq!(o - base, i * 8, "field {}", TILING_FIELDS[i]);
        }
    }

    #[test]
    fn pack_blocks_cover_every_column_group() {
        for (b, k, n, threads) in
            [(1, 512, 2048, 2), (1, 3, 5, 2), (4, 64, 33, 8), (0, 8, 8, 2), (1, 4096, 16384, 2)]
        {
            let (t, _) = choose_pack(b, k, n, threads);
            let groups = b * ((n + NR_MAX - 1) / NR_MAX);
            assert_eq!(t.units, groups);
            assert!(
                t.block_num * t.rows_per_block >= groups
                    && (t.block_num.max(1) - 1) * t.rows_per_block < groups.max(1)
            );
        }
    }

    #[test]
    fn blocks_cover_all_work() {
        let c = |v: i64| DimExpr::constant(v);
        for (rows, n) in [(1, 1), (7, 513), (100, 64), (513, 4096), (4096, 1)] {
            let w = Work::Rows { rows: c(rows), n: c(n), row_buffers: 2 };
            let (t, scratch) = choose(&w, &|d| d.as_const().unwrap(), 2);
            assert!(
                t.block_num * t.rows_per_block >= rows
                    && (t.block_num - 1) * t.rows_per_block < rows
            );
            assert_eq!(scratch, 2 * n as usize);
        }
        for (m, n, k) in [(1, 512, 512), (7, 3, 5), (128, 2048, 512), (513, 100, 1)] {
            let w =
                Work::MatMul { batch: c(2), m: c(m), n: c(n), k: c(k), products: 1, nc_step: c(1) };
            let (t, _) = choose(&w, &|d| d.as_const().unwrap(), 2);
            let units = 2 * ((m + t.mc - 1) / t.mc) * ((n + t.nc - 1) / t.nc);
            assert_eq!(t.units, units);
            // Packed B is addressed by sliver: every N tile must start on an NR_MAX boundary.
            assert!(t.nc % NR_MAX == 0 || t.nc >= n, "nc {} for n {n}", t.nc);
            assert!(
                t.block_num * t.rows_per_block >= units
                    && (t.block_num - 1) * t.rows_per_block < units
            );
        }
        // Decode shape: one row of output still spreads over both threads.
        let w = Work::MatMul {
            batch: c(1),
            m: c(1),
            n: c(2048),
            k: c(512),
            products: 1,
            nc_step: c(1),
        };
        let (t, _) = choose(&w, &|d| d.as_const().unwrap(), 2);
        assert!(t.block_num >= 2, "{t:?}");
    }

    /// An epilogue walking heads (`nc_step`) gets C blocks of whole heads that still start on
    /// packed-B sliver boundaries, or one block over all of N.
    #[test]
    fn matmul_blocks_hold_whole_heads_when_the_epilogue_walks_heads() {
        let c = |v: i64| DimExpr::constant(v);
        for (n, step) in [(18, 6), (24, 2), (576, 64), (192, 6), (1536, 96), (4096, 128), (64, 64)]
        {
            for threads in [1, 2, 8] {
                let w = Work::MatMul {
                    batch: c(1),
                    m: c(1),
                    n: c(n),
                    k: c(64),
                    products: 1,
                    nc_step: c(step),
                };
                let (t, _) = choose(&w, &|d| d.as_const().unwrap(), threads);
                assert_eq!(t.nc % step, 0, "n {n} step {step}: nc {}", t.nc);
                assert!(t.nc % NR_MAX == 0 || t.nc >= n, "n {n} step {step}: nc {}", t.nc);
                assert_eq!(t.units, (n + t.nc - 1) / t.nc);
            }
        }
    }

    #[test]
    fn ascend_tilings_respect_the_hardware_limits() {
        use autofusion_ir::AscendKernel;
        let c = |v: i64| DimExpr::constant(v);
        let field = |t: &[i32; ASCEND_CUBE_FIELDS.len()], n: &str| {
            t[ASCEND_CUBE_FIELDS.iter().position(|x| *x == n).unwrap()] as i64
        };
        let kernel = |work: Work, per_col: u32| AscendKernel {
            name: "k".into(),
            buffers: vec![],
            n_inputs: 0,
            work,
            ops: String::new(),
            mix: true,
            ub_per_col: per_col,
            ub_fixed: 1024,
            cube: 1,
            stage_a: true,
            stage_b: false,
            cube_bytes: vec![4, 4],
        };
        for (m, n, kk) in [(1, 4096, 512), (7, 33, 5), (513, 100, 1), (2048, 4096, 4096)] {
            let k = kernel(
                Work::MatMul {
                    batch: c(1),
                    m: c(m),
                    n: c(n),
                    k: c(kk),
                    products: 1,
                    nc_step: c(1),
                },
                99,
            );
            let (l, ws) =
                choose_ascend(&k, &|d| d.as_const().unwrap(), AscendCores::A2_24, None).unwrap();
            let t = l.tiling;
            assert!(
                t.chunk % 16 == 0
                    && t.chunk >= 16
                    && 1024 + t.chunk * 99 <= ASCEND_UB_BYTES * 8 / 10,
                "{t:?}"
            );
            assert!((1..=AscendCores::A2_24.groups() as u32).contains(&l.block_dim));
            let ct = &t.cube[0];
            assert!(
                field(ct, "singleCoreM") <= field(ct, "M")
                    && field(ct, "singleCoreN") <= field(ct, "N"),
                "{ct:?}"
            );
            let (bm, bn, bk) = (field(ct, "baseM"), field(ct, "baseN"), field(ct, "baseK"));
            assert!(bm % 16 == 0 && bn % 16 == 0 && bk % 8 == 0);
            assert!(
                bm * bk * 4 * field(ct, "dbL0A") <= 64 << 10
                    && bn * bk * 4 * field(ct, "dbL0B") <= 64 << 10
            );
            assert!(bm * bn * 4 * field(ct, "dbL0C") <= 128 << 10);
            // The staged A and every AIV's C tile fit the user workspace.
            assert!(ws >= ((m * kk) + 2 * l.block_dim as i64 * t.mc * t.nc) as usize * 4);
            // Every A here stays in L2: column panels, so B leaves memory once.
            assert_eq!(t.n_major, 1, "{m} x {n} x {kk}");
        }
        // An A too big for L2 with a B that fits: row panels (A read once, B from L2).
        let k = kernel(
            Work::MatMul {
                batch: c(1),
                m: c(65536),
                n: c(1024),
                k: c(4096),
                products: 1,
                nc_step: c(1),
            },
            99,
        );
        let (l, _) =
            choose_ascend(&k, &|d| d.as_const().unwrap(), AscendCores::A2_24, None).unwrap();
        assert_eq!(l.tiling.n_major, 0);
        // Every tiling DynamicTiling makes passes the official API's constraints, on chips
        // of 24 and of 20 cube cores; a broken one is rejected with the field named.
        let flash = |sq: i64, sk: i64, d: i64| Work::Flash {
            batch: c(8),
            sq: c(sq),
            sk: c(sk),
            d: c(d),
            dv: c(d),
            group: c(1),
        };
        let small = AscendCores { aic: 20, aiv: 40 };
        for cores in [AscendCores::A2_24, small] {
            for &(m, n, kk) in &[(1, 1, 1), (3, 4096, 11008), (4096, 1, 64), (100, 300, 7)] {
                let k = kernel(
                    Work::MatMul {
                        batch: c(2),
                        m: c(m),
                        n: c(n),
                        k: c(kk),
                        products: 1,
                        nc_step: c(1),
                    },
                    8,
                );
                let (l, _) = choose_ascend(&k, &|d| d.as_const().unwrap(), cores, None).unwrap();
                assert!(l.block_dim as i64 <= cores.groups());
                check_cube_tiling(&l.tiling.cube[0], cores.aic, 4).unwrap();
                check_cube_tiling(&l.tiling.cube[0], cores.aic, 2).unwrap();
            }
            for &(sq, sk, d) in &[(1, 1, 16), (7, 300, 64), (2048, 2048, 128)] {
                let k = kernel(flash(sq, sk, d), 8);
                let (l, _) = choose_ascend(&k, &|d| d.as_const().unwrap(), cores, None).unwrap();
                assert!(l.block_dim as i64 <= cores.groups());
            }
            // Decode (8 heads, one query): the keys split over the idle AIVs, each range at
            // least 512 keys, and the partial results fit the workspace; short caches and
            // prefill do not split.
            /* want 0: as many ranges as AIVs per head */
            for (sq, sk, want) in [(1, 2048, 4), (1, 100_000, 0), (1, 1000, 1), (64, 4096, 1)] {
                let k = kernel(flash(sq, sk, 64), 8);
                let (l, ws) = choose_ascend(&k, &|d| d.as_const().unwrap(), cores, None).unwrap();
                let t = l.tiling;
                let want = if want == 0 { cores.aiv / 8 } else { want };
                assert_eq!(t.splits, want, "sq {sq} sk {sk}");
                assert!(l.block_dim as i64 <= cores.groups());
                let per = t.br * t.bc + t.br * 64;
                let parts = if want > 1 { 8 * want * t.br * (16 + 64) } else { 0 };
                assert!(ws as i64 >= 4 * (2 * l.block_dim as i64 * per + parts), "{t:?}");
            }
        }
        assert_eq!(autofusion_ir::abi::ascend_flash_splits(8, 2048, 128, 24), 3, "fills the AIVs");
        assert_eq!(autofusion_ir::abi::ascend_flash_splits(8, 2048, 128, 8), 1, "no idle AIVs");
        let mut bad = cube_tiling(64, 64, 64, 64, 64, 4);
        bad[ASCEND_CUBE_FIELDS.iter().position(|x| *x == "baseK").unwrap()] = 12;
        let e = check_cube_tiling(&bad, 24, 4).unwrap_err();
        assert!(e.contains("baseK = 12 must be a positive multiple of 8"), "{e}");
        // A K fractal of half operands is 16 elements (32 bytes).
        let e = check_cube_tiling(&bad, 24, 2).unwrap_err();
        assert!(e.contains("baseK = 12 must be a positive multiple of 16"), "{e}");
        assert!(check_cube_tiling(&cube_tiling(64, 64, 64, 64, 64, 25), 24, 4).is_err());
        assert!(check_cube_tiling(&cube_tiling(64, 64, 64, 64, 64, 4), 24, 3).is_err());
        // A rows kernel too wide for the UB even at 16 columns is an error, not a bad launch.
        let k = kernel(Work::Rows { rows: c(4), n: c(64), row_buffers: 0 }, 20_000);
        assert!(choose_ascend(&k, &|d| d.as_const().unwrap(), AscendCores::A2_24, None)
            .unwrap_err()
            .contains("UB"));
        // Zero rows: nothing to launch.
        let k = kernel(Work::Rows { rows: c(0), n: c(64), row_buffers: 0 }, 40);
        assert!(
            choose_ascend(&k, &|d| d.as_const().unwrap(), AscendCores::A2_24, None)
                .unwrap()
                .0
                .empty
        );
    }
}
