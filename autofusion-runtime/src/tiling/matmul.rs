//! DynamicTiling of matmul kernels: output tiles of `mc x nc`, K in `kc` slices.

use super::*;

/// The blocking on the host's worker threads, and the scratch floats one block needs.
pub(super) fn host(
    cx: &HostCx,
    [batch, m, n, k]: [&DimExpr; 4],
    products: u32,
    nc_step: i64,
) -> (Tiling, usize) {
    let HostCx { eval, threads: t } = *cx;
    let (b, m, n, k) = (eval(batch).max(0), eval(m).max(0), eval(n).max(0), eval(k).max(0));
    let (mc, kc) = (m.clamp(1, MC_MAX), k.clamp(1, KC_MAX));
    let mut nc = n.clamp(1, NC_MAX);
    let units_for = |nc: i64| b * ((m + mc - 1) / mc) * ((n + nc - 1) / nc);
    // Small M (decode): split N finer so every thread has work.
    while units_for(nc) < 2 * t && nc > NR_MAX {
        nc = (nc / 2 + NR_MAX - 1) / NR_MAX * NR_MAX;
    }
    let nc = whole_heads(nc, nc_step, NR_MAX, n);
    let units = units_for(nc);
    let flops = flops(&[2, b, m, n, k]);
    let (block_num, upb) = split(units, flops >= 4 * MIN_PARALLEL_ELEMS, 8 * t);
    let tiling = Tiling { block_num, rows_per_block: upb, mc, nc, kc, units, ..Default::default() };
    // Each product beyond the first keeps its own C block.
    let more_c = (products.max(1) as i64 - 1) * mc * (nc + 16);
    (tiling, gemm_scratch(mc, nc, kc) + more_c as usize)
}

/// The launch on an Ascend device, and the user-workspace bytes the kernel needs.
pub(super) fn ascend(
    cx: &AscendCx,
    [batch, m, n, kk]: [&DimExpr; 4],
    products: u32,
    nc_step: i64,
) -> Result<(AscendLaunch, usize), String> {
    let e = |d: &DimExpr| (cx.eval)(d).max(0);
    ascend_parts(cx, &[[e(batch), e(m), e(n), e(kk)]], products, nc_step)
}

/// `nc` for an epilogue walking heads of `step` columns (`Work::MatMul::nc_step`): every C
/// block holds whole heads, so NC is rounded down to a multiple of `step` that is also one
/// of `align` (the blocks must start where the blocking starts them: packed B slivers of
/// NR_MAX on the host, 16-column fractals on Ascend), or covers all `n` columns.
pub(super) fn whole_heads(nc: i64, step: i64, align: i64, n: i64) -> i64 {
    if step <= 1 || nc >= n {
        return nc;
    }
    let l = step / gcd(step, align) * align;
    match nc / l * l {
        0 => l.min(n),
        r => r,
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The launch of a kernel computing the products `parts` (`[batch, m, n, k]` each, one after
/// the other: a horizontal kernel's) in one blocking, each with `products` C tiles per AIV.
pub(super) fn ascend_parts(
    cx: &AscendCx,
    parts: &[[i64; 4]],
    products: u32,
    nc_step: i64,
) -> Result<(AscendLaunch, usize), String> {
    let AscendCx { kernel: k, fit, cores, pipeline_aivs, .. } = *cx;
    let mut t = AscendTiling::default();
    let widest = |i: usize| parts.iter().map(|p| p[i]).max().unwrap_or(0);
    let (m, n, kd) = (widest(1), widest(2), widest(3));
    let (mut mc, mut nc) = (m.clamp(1, ASCEND_TILE_MAX), n.clamp(1, ASCEND_TILE_MAX));
    let units = |mc: i64, nc: i64| {
        parts.iter().map(|[b, m, n, _]| b * ((m + mc - 1) / mc) * ((n + nc - 1) / nc)).sum::<i64>()
    };
    // Enough tiles for every AIV before tiles shrink below 32 x 32.
    while units(mc, nc) < 2 * cores.groups() && (nc > 32 || mc > 32) {
        if nc >= mc {
            nc = round_up(nc / 2, 16).max(16).min(n.max(1));
        } else {
            mc = round_up(mc / 2, 16).max(16).min(m.max(1));
        }
    }
    let nc = whole_heads(nc, nc_step, 16, n);
    let groups = pipeline_aivs
        .map(|a| a / 2)
        .unwrap_or_else(|| ((units(mc, nc) + 1) / 2).clamp(1, cores.groups()));
    let aivs = 2 * groups;
    t.chunk = fit.min(round_up(kd.max(n).max(1), 16));
    t.mc = mc;
    t.nc = nc;
    t.block_num = groups;
    // Bytes as the cube reads the operands (a staged copy is in the same type); the widest
    // of the kernel's Matmul objects bounds the L1 use of the one tiling they share.
    let mut esz = cube_bytes(k, 0)?;
    for i in 1..k.cube_bytes.len() {
        esz = esz.max(cube_bytes(k, i)?);
    }
    let part_bytes = |i: usize, j: usize| {
        parts.iter().map(|p| (p[0] * p[i] * p[j] * esz as i64) as f64).fold(0.0, f64::max)
    };
    let (mt, nt) = ((m + mc - 1) / mc, (n + nc - 1) / nc);
    t.n_major = i64::from(autofusion_ir::abi::ascend_n_major(
        part_bytes(1, 3),
        part_bytes(3, 2),
        mt as f64,
        nt as f64,
    ));
    t.cube[0] = cube_tiling(m.max(1), n.max(1), kd.max(1), mc, nc, groups);
    check_cube_tiling(&t.cube[0], cores.aic, esz)
        .map_err(|e| format!("kernel `{}`: {e}", k.name))?;
    // Staged copies in floats of the workspace (a 16-bit copy takes fewer: this bounds it).
    let stage: i64 = parts
        .iter()
        .map(|[b, m, n, kd]| i64::from(k.stage_a) * b * m * kd + i64::from(k.stage_b) * b * kd * n)
        .sum();
    // A C tile per AIV and product.
    let ws = (stage + products.max(1) as i64 * aivs * mc * nc) as usize * 4;
    t.ws_floats = ws as i64 / 4;
    let launch = AscendLaunch { tiling: t, block_dim: groups as u32, empty: units(mc, nc) == 0 };
    Ok((launch, ws))
}
