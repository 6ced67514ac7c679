//! DynamicTiling: the blocking of every kernel chosen from the bound shape at run time, and
//! cached per (module, dims) by the executor. The limits here are the host profile's
//! `runtime_blocking` (`autofusion_compiler::target`), so the cost model prices these tilings.

use autofusion_compiler::abi::{Work, MR_MAX, NR_MAX, TILING_FIELDS};

/// `af_tiling` of the kernel ABI (`autofusion_compiler::abi`), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiling {
    pub block_num: i64,
    pub rows_per_block: i64,
    pub mc: i64,
    pub nc: i64,
    pub kc: i64,
    pub units: i64,
    pub reserved0: i64,
    pub reserved1: i64,
}

const _: () = assert!(std::mem::size_of::<Tiling>() == TILING_FIELDS.len() * 8);

/// Work below this many elements runs as a single block: a launch across threads costs more.
const MIN_PARALLEL_ELEMS: i64 = 1 << 14;

/// Matmul blocking limits: rows and columns of C per work unit, depth per packed block. Kept
/// equal to the host profile's `runtime_blocking` (checked by a test).
pub const MC_MAX: i64 = 64;
pub const NC_MAX: i64 = 512;
pub const KC_MAX: i64 = 256;
/// Flash attention query and key block limits.
pub const BR_MAX: i64 = 64;
pub const BC_MAX: i64 = 128;

/// Scratch floats of the matmul template: the packed A block (padded to whole slivers), one
/// prologue row, one packed B sliver and the C block.
fn gemm_scratch(mc: i64, nc: i64, kc: i64) -> usize {
    ((mc + MR_MAX) * kc + kc + kc * NR_MAX + mc * nc) as usize
}

/// Choose a tiling for `work` evaluated at the bound dims, for `threads` workers. Returns the
/// tiling and the scratch floats one block needs.
pub fn choose(work: &Work, eval: &dyn Fn(&autofusion_compiler::dim::DimExpr) -> i64, threads: usize) -> (Tiling, usize) {
    let t = threads.max(1) as i64;
    match work {
        Work::Rows { rows, n, row_buffers } => {
            let (r, n) = (eval(rows).max(0), eval(n).max(1));
            let blocks = if r * n < MIN_PARALLEL_ELEMS { 1 } else { r.min(4 * t) }.max(1);
            let rpb = ((r + blocks - 1) / blocks).max(1);
            let block_num = if r == 0 { 0 } else { (r + rpb - 1) / rpb };
            let tiling = Tiling { block_num, rows_per_block: rpb, units: r, ..Default::default() };
            (tiling, *row_buffers as usize * n as usize)
        }
        Work::MatMul { batch, m, n, k } => {
            let (b, m, n, k) = (eval(batch).max(0), eval(m).max(0), eval(n).max(0), eval(k).max(0));
            let (mc, kc) = (m.clamp(1, MC_MAX), k.clamp(1, KC_MAX));
            let mut nc = n.clamp(1, NC_MAX);
            let units_for = |nc: i64| b * ((m + mc - 1) / mc) * ((n + nc - 1) / nc);
            // Small M (decode): split N finer so every thread has work.
            while units_for(nc) < 2 * t && nc > NR_MAX {
                nc = (nc / 2 + NR_MAX - 1) / NR_MAX * NR_MAX;
            }
            let units = units_for(nc);
            let flops = 2 * b * m * n * k;
            let blocks = if flops < 4 * MIN_PARALLEL_ELEMS { 1 } else { units.min(8 * t) }.max(1);
            let upb = ((units + blocks - 1) / blocks).max(1);
            let block_num = if units == 0 { 0 } else { (units + upb - 1) / upb };
            let tiling = Tiling { block_num, rows_per_block: upb, mc, nc, kc, units, ..Default::default() };
            (tiling, gemm_scratch(mc, nc, kc))
        }
        Work::Horizontal { parts } => {
            let ps: Vec<(i64, i64, i64, i64)> =
                parts.iter().map(|(b, m, n, k)| (eval(b).max(0), eval(m).max(0), eval(n).max(0), eval(k).max(0))).collect();
            let mc = ps.iter().map(|p| p.1).max().unwrap_or(1).clamp(1, MC_MAX);
            let kc = ps.iter().map(|p| p.3).max().unwrap_or(1).clamp(1, KC_MAX);
            let mut nc = ps.iter().map(|p| p.2).max().unwrap_or(1).clamp(1, NC_MAX);
            let units_for = |nc: i64| ps.iter().map(|(b, m, n, _)| b * ((m + mc - 1) / mc) * ((n + nc - 1) / nc)).sum::<i64>();
            while units_for(nc) < 2 * t && nc > NR_MAX {
                nc = (nc / 2 + NR_MAX - 1) / NR_MAX * NR_MAX;
            }
            let units = units_for(nc);
            let flops: i64 = ps.iter().map(|(b, m, n, k)| 2 * b * m * n * k).sum();
            let blocks = if flops < 4 * MIN_PARALLEL_ELEMS { 1 } else { units.min(8 * t) }.max(1);
            let upb = ((units + blocks - 1) / blocks).max(1);
            let block_num = if units == 0 { 0 } else { (units + upb - 1) / upb };
            let tiling = Tiling { block_num, rows_per_block: upb, mc, nc, kc, units, ..Default::default() };
            (tiling, gemm_scratch(mc, nc, kc))
        }
        Work::Flash { batch, sq, sk, d, dv } => {
            let (b, sq, sk, d, dv) = (eval(batch).max(0), eval(sq).max(0), eval(sk).max(1), eval(d).max(1), eval(dv).max(1));
            let mut br = sq.clamp(1, BR_MAX);
            let bc = sk.clamp(1, BC_MAX);
            // Enough query blocks to keep every thread busy.
            while b * ((sq + br - 1) / br) < 2 * t && br > 4 {
                br /= 2;
            }
            let units = b * ((sq + br - 1) / br);
            let flops = 4 * b * sq * sk * d;
            let blocks = if flops < 4 * MIN_PARALLEL_ELEMS { 1 } else { units.min(8 * t) }.max(1);
            let upb = ((units + blocks - 1) / blocks).max(1);
            let block_num = if units == 0 { 0 } else { (units + upb - 1) / upb };
            let tiling = Tiling { block_num, rows_per_block: upb, mc: br, nc: bc, units, ..Default::default() };
            let (mr, nr) = (MR_MAX, NR_MAX);
            (tiling, ((br + mr) * d + d * (bc + nr) + bc * (dv + nr) + br * bc + (br + mr) * bc + br * dv + 2 * br) as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autofusion_compiler::dim::DimExpr;

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
            &t.reserved0 as *const i64 as usize,
            &t.reserved1 as *const i64 as usize,
        ];
        for (i, o) in offs.iter().enumerate() {
            assert_eq!(o - base, i * 8, "field {}", TILING_FIELDS[i]);
        }
    }

    #[test]
    fn limits_match_the_host_profile() {
        let t = autofusion_compiler::target::Target::host();
        assert_eq!(t.runtime_blocking, Some([MC_MAX, NC_MAX, KC_MAX, BR_MAX, BC_MAX]));
    }

    #[test]
    fn blocks_cover_all_work() {
        let c = |v: i64| DimExpr::constant(v);
        for (rows, n) in [(1, 1), (7, 513), (100, 64), (513, 4096), (4096, 1)] {
            let w = Work::Rows { rows: c(rows), n: c(n), row_buffers: 2 };
            let (t, scratch) = choose(&w, &|d| d.as_const().unwrap(), 2);
            assert!(t.block_num * t.rows_per_block >= rows && (t.block_num - 1) * t.rows_per_block < rows);
            assert_eq!(scratch, 2 * n as usize);
        }
        for (m, n, k) in [(1, 512, 512), (7, 3, 5), (128, 2048, 512), (513, 100, 1)] {
            let w = Work::MatMul { batch: c(2), m: c(m), n: c(n), k: c(k) };
            let (t, _) = choose(&w, &|d| d.as_const().unwrap(), 2);
            let units = 2 * ((m + t.mc - 1) / t.mc) * ((n + t.nc - 1) / t.nc);
            assert_eq!(t.units, units);
            assert!(t.block_num * t.rows_per_block >= units && (t.block_num - 1) * t.rows_per_block < units);
        }
        // Decode shape: one row of output still spreads over both threads.
        let w = Work::MatMul { batch: c(1), m: c(1), n: c(2048), k: c(512) };
        let (t, _) = choose(&w, &|d| d.as_const().unwrap(), 2);
        assert!(t.block_num >= 2, "{t:?}");
    }
}
