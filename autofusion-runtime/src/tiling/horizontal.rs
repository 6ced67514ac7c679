//! DynamicTiling of horizontal matmul kernels: the parts' output tiles, one blocking for all.

use super::*;

/// The blocking on the host's worker threads, and the scratch floats one block needs.
pub(super) fn host(
    cx: &HostCx,
    parts: &[(DimExpr, DimExpr, DimExpr, DimExpr)],
    nc_step: i64,
) -> (Tiling, usize) {
    let HostCx { eval, threads: t } = *cx;
    let ps: Vec<(i64, i64, i64, i64)> = parts
        .iter()
        .map(|(b, m, n, k)| (eval(b).max(0), eval(m).max(0), eval(n).max(0), eval(k).max(0)))
        .collect();
    let mc = ps.iter().map(|p| p.1).max().unwrap_or(1).clamp(1, MC_MAX);
    let kc = ps.iter().map(|p| p.3).max().unwrap_or(1).clamp(1, KC_MAX);
    let mut nc = ps.iter().map(|p| p.2).max().unwrap_or(1).clamp(1, NC_MAX);
    let units_for = |nc: i64| {
        ps.iter().map(|(b, m, n, _)| b * ((m + mc - 1) / mc) * ((n + nc - 1) / nc)).sum::<i64>()
    };
    while units_for(nc) < 2 * t && nc > NR_MAX {
        nc = (nc / 2 + NR_MAX - 1) / NR_MAX * NR_MAX;
    }
    let widest = ps.iter().map(|p| p.2).max().unwrap_or(1);
    let nc = super::matmul::whole_heads(nc, nc_step, NR_MAX, widest);
    let units = units_for(nc);
    let flops: i64 =
        ps.iter().map(|(b, m, n, k)| flops(&[2, *b, *m, *n, *k])).fold(0, i64::saturating_add);
    let (block_num, upb) = split(units, flops >= 4 * MIN_PARALLEL_ELEMS, 8 * t);
    let tiling = Tiling { block_num, rows_per_block: upb, mc, nc, kc, units, ..Default::default() };
    (tiling, gemm_scratch(mc, nc, kc))
}

/// The launch on an Ascend device, and the user-workspace bytes the kernel needs: the parts
/// run one after the other in one blocking, as the matmul kernel's (`matmul::ascend_parts`).
pub(super) fn ascend(
    cx: &AscendCx,
    parts: &[(DimExpr, DimExpr, DimExpr, DimExpr)],
    nc_step: i64,
) -> Result<(AscendLaunch, usize), String> {
    let e = |d: &DimExpr| (cx.eval)(d).max(0);
    let dims: Vec<[i64; 4]> = parts.iter().map(|(b, m, n, k)| [e(b), e(m), e(n), e(k)]).collect();
    super::matmul::ascend_parts(cx, &dims, 1, nc_step)
}
