//! DynamicTiling of flash attention kernels: query blocks of `br` rows, key blocks of `bc`.

use super::*;

/// At most this many queries per head take the few-queries path (a decode step): half the
/// widest micro-kernel tile, whose rows would otherwise be mostly empty.
pub const FEW_QUERIES: i64 = MR_MAX / 2;

/// The blocking on the host's worker threads, and the scratch floats one block needs.
pub(super) fn host(
    cx: &HostCx,
    batch: &DimExpr,
    sq: &DimExpr,
    sk: &DimExpr,
    d: &DimExpr,
    dv: &DimExpr,
    group: &DimExpr,
) -> (Tiling, usize) {
    let HostCx { eval, threads: t } = *cx;
    let (b, sq, sk, d, dv) =
        (eval(batch).max(0), eval(sq).max(0), eval(sk).max(1), eval(d).max(1), eval(dv).max(1));
    let group = eval(group).clamp(1, b.max(1));
    if sq <= FEW_QUERIES && b % group == 0 {
        return few_queries(cx, [b, sq, sk, d, dv], group);
    }
    let mut br = sq.clamp(1, BR_MAX);
    let bc = sk.clamp(1, BC_MAX);
    // Enough query blocks to keep every thread busy.
    while b * ((sq + br - 1) / br) < 2 * t && br > 4 {
        br /= 2;
    }
    // A unit is `qpu` query blocks of one head and packs that head's K and V once:
    // as many blocks per unit as still leaves two units per thread.
    let qt = (sq + br - 1) / br;
    let groups = ((2 * t + b.max(1) - 1) / b.max(1)).clamp(1, qt.max(1));
    let qpu = ((qt + groups - 1) / groups).max(1);
    let units = b * ((qt + qpu - 1) / qpu);
    let flops = flops(&[4, b, sq, sk, d]);
    let (block_num, upb) = split(units, flops >= 4 * MIN_PARALLEL_ELEMS, 8 * t);
    let tiling = Tiling {
        block_num,
        rows_per_block: upb,
        mc: br,
        nc: bc,
        kc: qpu,
        units,
        ..Default::default()
    };
    let skp = (sk + NR_MAX - 1) / NR_MAX * NR_MAX;
    (
        tiling,
        (d * skp + (dv + NR_MAX) * sk + (br + MR_MAX) * d + br * bc + br * dv + 4 * br) as usize,
    )
}

/// The few-queries path (flash-decoding): a unit is one KV group (its `group` query heads
/// read K and V once) and one of `splits` ranges of its keys, so that a few groups still
/// keep every thread busy; the last range of a group to finish merges the partial results
/// (`workspace_floats`). Ranges hold at least one key block.
fn few_queries(cx: &HostCx, [b, sq, sk, d, dv]: [i64; 5], group: i64) -> (Tiling, usize) {
    let t = cx.threads;
    let groups = b / group;
    let bc = sk.clamp(1, BC_MAX);
    let key_blocks = (sk + bc - 1) / bc;
    let splits = if groups == 0 { 1 } else { ((2 * t + groups - 1) / groups).clamp(1, key_blocks) };
    let units = groups * splits;
    let flops = flops(&[4, b, sq, sk, d]);
    let (block_num, upb) = split(units, flops >= 4 * MIN_PARALLEL_ELEMS, 8 * t);
    let br = sq.max(1);
    let tiling = Tiling {
        block_num,
        rows_per_block: upb,
        mc: br,
        nc: bc,
        kc: 1,
        units,
        splits,
        ..Default::default()
    };
    // One key block and one value block, and the row state of the group's heads.
    (tiling, (bc * (d + dv) + group * br * (d + bc + dv + 2)) as usize)
}

/// Workspace of a split few-queries launch: a counter per group (two floats' room, read as
/// an `int64_t`), then per (group, range, head, query row) the range's row max, row sum and
/// `dv` unnormalised outputs.
pub(super) fn workspace_floats(b: i64, sq: i64, dv: i64, group: i64, splits: i64) -> usize {
    let groups = b.max(0) / group.max(1);
    (2 * groups + b.max(0) * splits * sq.max(1) * (dv.max(1) + 2)) as usize
}

/// The launch on an Ascend device, and the user-workspace bytes the kernel needs.
pub(super) fn ascend(
    cx: &AscendCx,
    batch: &DimExpr,
    sq: &DimExpr,
    sk: &DimExpr,
    d: &DimExpr,
    dv: &DimExpr,
) -> Result<(AscendLaunch, usize), String> {
    let AscendCx { kernel: k, eval, fit, cores, pipeline_aivs } = *cx;
    let mut t = AscendTiling::default();
    let (b, sq, sk, d, dv) =
        (eval(batch).max(0), eval(sq).max(0), eval(sk).max(0), eval(d).max(1), eval(dv).max(1));
    let mut br = sq.clamp(1, 64);
    let bc = sk.clamp(1, ASCEND_TILE_MAX);
    while b * ((sq + br - 1) / br) < 2 * cores.groups() && br > 16 {
        br = round_up(br / 2, 16).max(16);
    }
    let units = b * ((sq + br - 1) / br);
    let splits = autofusion_ir::abi::ascend_flash_splits(
        units,
        sk,
        bc,
        pipeline_aivs.unwrap_or(2 * cores.groups()),
    );
    let groups = pipeline_aivs
        .map(|a| a / 2)
        .unwrap_or_else(|| ((units * splits + 1) / 2).clamp(1, cores.groups()));
    let aivs = 2 * groups;
    t.chunk = fit.min(round_up(bc.max(dv).max(d), 16));
    t.br = br;
    t.bc = bc;
    t.block_num = groups;
    // QK^T: br x bc by d; PV: br x dv by bc.
    t.cube[0] = cube_tiling(sq.max(1), sk.max(1), d, br, bc, groups);
    t.cube[1] = cube_tiling(sq.max(1), dv, sk.max(1), br, dv, groups);
    for (i, ct) in t.cube.iter().enumerate() {
        check_cube_tiling(ct, cores.aic, cube_bytes(k, i)?)
            .map_err(|e| format!("kernel `{}`: {e}", k.name))?;
    }
    let stage =
        if k.stage_a { b * sq * d } else { 0 } + if k.stage_b { b * (d * sk + sk * dv) } else { 0 };
    // Per AIV: the score tile (S, then P in place) and the output accumulator, and P
    // in V's type when the second product is 16-bit (as the generated `PER`).
    let p16 = if cube_bytes(k, 1)? == 2 { (br * bc + 1) / 2 } else { 0 };
    // A split launch keeps each unit's row statistics (16 floats a row) and partial output.
    let partials = if splits > 1 { units * splits * br * (16 + dv) } else { 0 };
    let ws = (stage + aivs * (br * bc + br * dv + p16) + partials) as usize * 4;
    t.splits = splits;
    t.ws_floats = ws as i64 / 4;
    let launch = AscendLaunch { tiling: t, block_dim: groups as u32, empty: b == 0 || sq == 0 };
    Ok((launch, ws))
}
