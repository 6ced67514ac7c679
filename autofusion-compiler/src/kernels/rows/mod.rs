//! Rows kernels: elementwise chains and last-axis reductions over one iteration space, row by row.

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::group::GroupKind;

use crate::dim::{DimExpr, Shape};
use crate::group::iter_shape;
use crate::ir::{Graph, NodeId, Op};
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};

/// Where the members of a rows kernel run within a row: the one schedule both generators
/// emit and the cost model prices. A row is swept by `n_loops` column (host) or chunk (Ascend)
/// loops; a full-width op runs in the loop of its phase; a reduction accumulates in a loop and
/// is ready after it; a row value (one scalar per row) is computed between loops, at its level.
pub(crate) struct RowPhases {
    /// The loop computing each full-width value (sources streamed from memory: loop 0).
    pub(crate) phase: BTreeMap<NodeId, usize>,
    /// The level a row value is ready at: computed before loop `level` (after the last loop
    /// for `n_loops`).
    pub(crate) level: BTreeMap<NodeId, usize>,
    /// The loop a reduction accumulates in (it is ready after it).
    pub(crate) reduce_loop: BTreeMap<NodeId, usize>,
    pub(crate) n_loops: usize,
}

impl RowPhases {
    /// The schedule of `nodes` (in topological order) over `space`; `streamed`: values read at
    /// full width from memory, placed in loop 0.
    pub(crate) fn of(
        g: &Graph,
        nodes: &[NodeId],
        space: &Shape,
        streamed: impl IntoIterator<Item = NodeId>,
    ) -> RowPhases {
        let mut phase: BTreeMap<NodeId, usize> = streamed.into_iter().map(|s| (s, 0)).collect();
        let mut level: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut reduce_loop: BTreeMap<NodeId, usize> = BTreeMap::new();
        for &m in nodes {
            let n = g.node(m);
            let a = n
                .inputs
                .iter()
                .map(|i| phase.get(i).or(level.get(i)).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            if matches!(n.op, Op::Reduce { .. }) {
                reduce_loop.insert(m, a); // accumulates in loop `a`, ready after it
                level.insert(m, a + 1);
            } else if is_full_width(g, space, m) {
                phase.insert(m, a);
            } else {
                level.insert(m, a);
            }
        }
        let n_loops = phase.values().chain(reduce_loop.values()).map(|p| p + 1).max().unwrap_or(0);
        RowPhases { phase, level, reduce_loop, n_loops }
    }

    /// The reductions accumulated in loop `p`.
    pub(crate) fn reductions_in(&self, p: usize) -> Vec<NodeId> {
        self.reduce_loop.iter().filter(|(_, q)| **q == p).map(|(m, _)| *m).collect()
    }
}

/// Whether member `id` runs at full width over `space` (every column), not once per row.
pub(crate) fn is_full_width(g: &Graph, space: &Shape, id: NodeId) -> bool {
    let mut row = space.clone();
    *row.last_mut().unwrap() = DimExpr::constant(1);
    *space == row || iter_shape(g, id) == *space && !matches!(g.node(id).op, Op::Reduce { .. })
}

/// The host's rows schedule: the phases, and the row buffers of full-width values read in a
/// later column loop than their own.
pub(crate) struct RowSchedule {
    pub(crate) phase: BTreeMap<NodeId, usize>,
    pub(crate) level: BTreeMap<NodeId, usize>,
    pub(crate) reduce_loop: BTreeMap<NodeId, usize>,
    pub(crate) n_loops: usize,
    /// Row buffer index of every full-width value read in a later loop.
    pub(crate) rowbuf: BTreeMap<NodeId, usize>,
}

/// Assigns the members of a rows group over `space` to column loops and row levels.
pub(crate) fn schedule_rows(
    g: &Graph,
    grp: &Group,
    space: &Shape,
    members: &BTreeSet<NodeId>,
) -> RowSchedule {
    let RowPhases { phase, level, reduce_loop, n_loops } = RowPhases::of(g, &grp.nodes, space, []);
    let rowbuf = row_buffers(g, members, &phase, &reduce_loop);
    RowSchedule { phase, level, reduce_loop, n_loops, rowbuf }
}

/// Numbers the full-width values read in a later column loop than their own.
pub(crate) fn row_buffers(
    g: &Graph,
    members: &BTreeSet<NodeId>,
    phase: &BTreeMap<NodeId, usize>,
    reduce_loop: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, usize> {
    // Full-width values read in a later loop live in row buffers.
    let users = g.users();
    let mut rowbuf: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (&m, &p) in phase {
        let later = users[m.idx()].iter().any(|u| {
            members.contains(u) && phase.get(u).or(reduce_loop.get(u)).is_some_and(|q| *q > p)
        });
        if later {
            let k = rowbuf.len();
            rowbuf.insert(m, k);
        }
    }
    rowbuf
}

/// Elementwise chains and last-axis reductions over one iteration space.
pub(crate) struct Rows;

impl KernelKind for Rows {
    fn group_kind(&self) -> GroupKind {
        GroupKind::Elementwise
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        _anchor: Option<NodeId>,
    ) -> Result<(), String> {
        row_ops_only(g, members)?;
        let nodes: Vec<NodeId> = members.iter().copied().collect();
        let space = crate::group::space_of(g, &nodes).ok_or_else(|| {
            "members iterate over different shapes (a rows kernel has one space)".to_string()
        })?;
        scans_span_the_row(g, &nodes, &space)?;
        cache_rows_are_contiguous(g, &nodes)?;
        rotations_read_memory(g, &nodes, &space, members)?;
        gathers_read_memory(g, &nodes, members)?;
        integers_stay_in_their_loop(g, &nodes, &space, members)
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        cost::rows_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_rows(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, _name: &str) -> Result<Emitted, String> {
        Ok(Emitted::vector(ascend::gen_rows(k, grp)))
    }
}

/// A gather reads its table and its indices from memory (it addresses them by the index, not
/// as values of the kernel's space).
fn gathers_read_memory(
    g: &Graph,
    nodes: &[NodeId],
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    for &m in nodes {
        let n = g.node(m);
        if matches!(n.op, Op::Gather { .. }) {
            if let Some(i) = n.inputs.iter().find(|i| members.contains(i)) {
                return Err(format!(
                    "gather `{}` reads `{}`, computed in the same kernel",
                    n.name,
                    g.node(*i).name
                ));
            }
        }
    }
    Ok(())
}

/// A half rotation reads its operand at the partner column, half a row away: both generators
/// address that column in memory (a value computed in the same kernel exists only at the
/// column being computed), and the rotated axis is the whole row of the space.
pub(crate) fn rotations_read_memory(
    g: &Graph,
    nodes: &[NodeId],
    space: &Shape,
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    for &m in nodes {
        let n = g.node(m);
        if !matches!(n.op, Op::RotateHalf) {
            continue;
        }
        if iter_shape(g, m) != *space {
            return Err(format!(
                "rotate_half `{}` does not run along the rows of the kernel's space",
                n.name
            ));
        }
        if members.contains(&n.inputs[0]) {
            return Err(format!(
                "rotate_half `{}` reads `{}`, computed in the same kernel",
                n.name,
                g.node(n.inputs[0]).name
            ));
        }
    }
    Ok(())
}

/// A cache write stores each row of the space as one run of the cache: along its last axis,
/// the cache row is as long as the new one.
fn cache_rows_are_contiguous(g: &Graph, nodes: &[NodeId]) -> Result<(), String> {
    for &m in nodes {
        let n = g.node(m);
        if let Op::CacheWrite { axis, .. } = n.op {
            let r = n.shape.len();
            if axis + 1 == r && r > 0 && g.node(n.inputs[1]).shape[r - 1] != n.shape[r - 1] {
                return Err(format!("cache_write `{}` writes part of each cache row", n.name));
            }
        }
    }
    Ok(())
}

/// A running sum runs along the whole row of the space (one accumulator per row).
fn scans_span_the_row(g: &Graph, nodes: &[NodeId], space: &Shape) -> Result<(), String> {
    for &m in nodes {
        let n = g.node(m);
        if matches!(n.op, Op::CumSum { .. }) && iter_shape(g, m) != *space {
            return Err(format!(
                "cumsum `{}` does not run along the rows of the kernel's space",
                n.name
            ));
        }
    }
    Ok(())
}

/// Row buffers hold f32: an integer or `bool` value read in a later column loop than its own
/// would be rounded there, so such a group is not one rows kernel.
fn integers_stay_in_their_loop(
    g: &Graph,
    nodes: &[NodeId],
    space: &Shape,
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    let ph = RowPhases::of(g, nodes, space, []);
    for m in row_buffers(g, members, &ph.phase, &ph.reduce_loop).keys() {
        let n = g.node(*m);
        if !n.dtype.is_float() {
            return Err(format!(
                "`{}` ({}) would be kept in an f32 row buffer between column loops",
                n.name, n.dtype
            ));
        }
    }
    Ok(())
}

/// Whether every member is elementwise, a reduction over its input's last axis or a running
/// sum along it: what a row loop computes.
pub(crate) fn row_ops_only(g: &Graph, members: &BTreeSet<NodeId>) -> Result<(), String> {
    for m in members {
        let n = g.node(*m);
        let ok = match n.op {
            Op::Reduce { axis, .. } | Op::CumSum { axis, .. } => {
                axis + 1 == g.node(n.inputs[0]).shape.len()
            }
            Op::Gather { .. } | Op::RotateHalf => true,
            // Stores its row (`new`, input 1) into its cache at the call's position.
            Op::CacheWrite { .. } => !members.contains(&n.inputs[0]),
            ref op => op.is_elementwise(),
        };
        if !ok {
            return Err(format!("`{}` ({}) is not computed row by row", n.name, n.op.name()));
        }
    }
    Ok(())
}
