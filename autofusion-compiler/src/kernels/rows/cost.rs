//! Rows kernels: the cost model's price.

use super::RowPhases;
use crate::cost::*;
use crate::dim::{numel, DimExpr, Shape};
use crate::group::{space_of, GroupKind};
use crate::ir::{Graph, NodeId};
use crate::target::OnChip;
use std::collections::BTreeSet;

/// Rows kernels (elementwise chains, reductions, concat): blocks of rows over the cores, row
/// buffers on chip.
pub(crate) fn rows_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let members = k.members;
    let kind = k.kind;
    let target = k.target;
    let out_bytes = k.out_bytes;
    let vec_flops = k.vec_flops;
    let trans = k.trans;
    let cached = k.cached;
    let launch = k.launch;
    let cx = &k.cx;
    let ins = &k.ins;
    let outs = &k.outs;
    let one_block = |tiles: f64, flops: Option<f64>| k.one_block(tiles, flops);
    let first = *members.iter().next().ok_or("an empty group")?;
    let space = if kind == GroupKind::Concat {
        g.node(first).shape.clone()
    } else if kind == GroupKind::CacheWrite {
        // The new rows (input 1), not the whole cache.
        g.node(g.node(first).inputs[1]).shape.clone()
    } else {
        space_of(g, &members.iter().copied().collect::<Vec<_>>())
            .ok_or("members iterate over different shapes")?
    };
    let n = cx.n(space.last().unwrap()).max(1.0);
    let rows = cx.n(&numel(&space[..space.len() - 1])).max(1.0);
    let in_bytes: f64 = ins.iter().map(|i| cx.bytes(*i)).sum();
    let bytes = if kind == GroupKind::CacheWrite {
        // Reads the new rows, writes as many into the cache; the rest of the cache is untouched.
        2.0 * cx.bytes(g.node(first).inputs[1])
    } else {
        in_bytes + out_bytes
    };
    // Streams per row (inputs and outputs at full width) and values kept across phases.
    let full =
        |id: NodeId| cx.n(g.node(id).shape.last().unwrap_or(&DimExpr::constant(1))) >= n && n > 1.0;
    let streams =
        ins.iter().filter(|i| full(**i)).count() + outs.iter().filter(|o| full(**o)).count();
    let kept = members.iter().filter(|m| full(**m) && g.node(**m).shape == space).count();
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    let per_col = (streams as f64 * db + kept as f64) * 4.0;
    let memory = target.vector_memory();
    let (llc, use_, ok) = if target.on_chip == OnChip::Scratchpads {
        let ub = target.budget(memory).unwrap_or(0);
        // Ascend: each AIV streams one row at a time through UB in chunks of up to `chunk`
        // columns (the generator's `Ub::per_col` x `CH`), so any row length fits once 16
        // columns do. Every chunk loop after the first re-reads the row's sources: from L2,
        // the row having just been read.
        let chunk = (((ub as f64 / per_col) / 16.0).floor() * 16.0).min(n.max(16.0));
        let use_ = vec![(memory.to_string(), cx.align(per_col * chunk.max(16.0)))];
        (in_bytes * (row_passes(g, kind, members, &space) - 1) as f64, use_, chunk >= 16.0)
    } else {
        // The host: a block streams one row at a time; later passes over a row (after a
        // reduction) re-read it from L1, not charged (measured: charging them at the in-cache
        // bandwidth made fused norms look slower than their parts, which they are not).
        let use_ = vec![(memory.to_string(), cx.align(per_col * n))];
        let ok = cx.fits(&use_);
        (0.0, use_, ok)
    };
    let (exec, mem, comp, wave) = cx.exec_us(
        (bytes, llc),
        cached,
        0.0,
        vec_flops,
        trans,
        0.0,
        1.0,
        one_block(rows, None),
        target.cores,
    );
    let tiling = Tiling::Rows { rows_per_tile: 1 };
    best(vec![(exec, mem, comp, wave, (bytes, llc), tiling, use_, ok)], launch, vec_flops)
}

/// The loops a rows kernel makes over each row: the generators' schedule (`RowPhases`), at
/// least one; a concat copies each row once.
fn row_passes(g: &Graph, kind: GroupKind, members: &BTreeSet<NodeId>, space: &Shape) -> usize {
    if matches!(kind, GroupKind::Concat | GroupKind::CacheWrite) {
        return 1;
    }
    let nodes: Vec<NodeId> = members.iter().copied().collect();
    RowPhases::of(g, &nodes, space, []).n_loops.max(1)
}
