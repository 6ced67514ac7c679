//! Rows kernels: elementwise chains and last-axis reductions over one iteration space, row by row.

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;

use crate::dim::{DimExpr, Shape};
use crate::group::iter_shape;
use crate::ir::{Graph, NodeId, Op};
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};

/// Where the members of an elementwise group run within a row.
pub(crate) struct RowSchedule {
    /// The column loop a full-width op runs in.
    pub(crate) phase: BTreeMap<NodeId, usize>,
    /// The level a row value is ready at: computed before column loop `level` (after the last
    /// loop for `n_loops`).
    pub(crate) level: BTreeMap<NodeId, usize>,
    /// The column loop a reduction accumulates in (it is ready after it).
    pub(crate) reduce_loop: BTreeMap<NodeId, usize>,
    pub(crate) n_loops: usize,
    /// Row buffer index of every full-width value read in a later loop.
    pub(crate) rowbuf: BTreeMap<NodeId, usize>,
}

/// Assigns the members of an elementwise group over `space` to column loops and row levels.
pub(crate) fn schedule_rows(
    g: &Graph,
    grp: &Group,
    space: &Shape,
    members: &BTreeSet<NodeId>,
) -> RowSchedule {
    let row_shape = {
        let mut r = space.clone();
        *r.last_mut().unwrap() = DimExpr::constant(1);
        r
    };
    let full = |id: NodeId| {
        *space == row_shape
            || iter_shape(g, id) == *space && !matches!(g.node(id).op, Op::Reduce { .. })
    };
    // Phases: a full-width op runs in the loop of its phase; a row value is ready at its level.
    let mut phase: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut level: BTreeMap<NodeId, usize> = BTreeMap::new();
    let avail = |phase: &BTreeMap<NodeId, usize>,
                 level: &BTreeMap<NodeId, usize>,
                 i: NodeId|
     -> usize { phase.get(&i).or(level.get(&i)).copied().unwrap_or(0) };
    let mut reduce_loop: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &m in &grp.nodes {
        let n = g.node(m);
        let a = n.inputs.iter().map(|i| avail(&phase, &level, *i)).max().unwrap_or(0);
        if matches!(n.op, Op::Reduce { .. }) {
            reduce_loop.insert(m, a); // accumulates in loop `a`, ready after it
            level.insert(m, a + 1);
        } else if full(m) {
            phase.insert(m, a);
        } else {
            level.insert(m, a);
        }
    }
    let n_loops = phase.values().chain(reduce_loop.values()).map(|p| p + 1).max().unwrap_or(0);
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
