//! DynamicTiling of rows kernels: blocks of whole rows.

use super::*;

/// The blocking on the host's worker threads, and the scratch floats one block needs.
pub(super) fn host(cx: &HostCx, rows: &DimExpr, n: &DimExpr, row_buffers: u32) -> (Tiling, usize) {
    let HostCx { eval, threads: t } = *cx;
    let (r, n) = (eval(rows).max(0), eval(n).max(1));
    let (block_num, rpb) = split(r, r * n >= MIN_PARALLEL_ELEMS, 4 * t);
    let tiling = Tiling { block_num, rows_per_block: rpb, units: r, ..Default::default() };
    (tiling, row_buffers as usize * n as usize)
}

/// The launch on an Ascend device, and the user-workspace bytes the kernel needs.
pub(super) fn ascend(
    cx: &AscendCx,
    rows: &DimExpr,
    n: &DimExpr,
) -> Result<(AscendLaunch, usize), String> {
    let AscendCx { eval, fit, cores, pipeline_aivs, .. } = *cx;
    let mut t = AscendTiling::default();
    let (r, n) = (eval(rows).max(0), eval(n).max(0));
    t.chunk = fit.min(round_up(n.max(1), 16));
    let aivs = pipeline_aivs.unwrap_or_else(|| r.clamp(1, cores.aiv));
    t.block_num = aivs;
    let launch = AscendLaunch { tiling: t, block_dim: aivs as u32, empty: r == 0 || n == 0 };
    Ok((launch, 0))
}
