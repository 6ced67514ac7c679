//! How a kernel reads a value: the materialised buffer it lives in, an offset and per-axis
//! strides (views fold into these), broadcast into the kernel's iteration space.

use crate::dim::{DimExpr, Shape};
use crate::ir::{Graph, NodeId, Op};

/// Row-major strides of a contiguous tensor.
pub fn contiguous_strides(shape: &Shape) -> Vec<DimExpr> {
    let mut s = vec![DimExpr::constant(1); shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].mul(&shape[i + 1]);
    }
    s
}

/// A strided view of a materialised value.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub base: NodeId,
    pub offset: DimExpr,
    pub strides: Vec<DimExpr>,
}

/// Follow reshape/transpose/slice back to the buffer (canon guarantees reshapes are of
/// contiguous data).
pub fn resolve(g: &Graph, id: NodeId) -> View {
    let n = g.node(id);
    match &n.op {
        Op::Transpose { perm } => {
            let v = resolve(g, n.inputs[0]);
            View { strides: perm.iter().map(|&p| v.strides[p].clone()).collect(), ..v }
        }
        Op::Slice { axis, start, .. } => {
            let v = resolve(g, n.inputs[0]);
            let offset = v.offset.add(&start.mul(&v.strides[*axis]));
            View { offset, ..v }
        }
        Op::Reshape => {
            let v = resolve(g, n.inputs[0]);
            View { base: v.base, offset: v.offset, strides: contiguous_strides(&n.shape) }
        }
        _ => View { base: id, offset: DimExpr::constant(0), strides: contiguous_strides(&n.shape) },
    }
}

/// Strides of `view` (of a value shaped `shape`) over an iteration space of rank `rank`,
/// aligned from the right; broadcast axes get stride 0.
pub fn space_strides(view: &View, shape: &Shape, rank: usize) -> Vec<DimExpr> {
    let one = DimExpr::constant(1);
    let mut out = vec![DimExpr::constant(0); rank];
    let k = shape.len();
    for a in 0..k {
        if shape[a] != one {
            out[rank - k + a] = view.strides[a].clone();
        }
    }
    out
}
