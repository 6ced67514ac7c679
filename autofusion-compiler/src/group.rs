//! What a kernel of a plan is, structurally: the kinds of fused groups and the shape queries
//! every layer above needs (the cost model, the planner and its rules, the code generators).
//! It imports none of them, so they can all import it.

use crate::dim::{DimExpr, Shape};
use crate::ir::{Graph, NodeId, Op};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// Row-wise loop over an iteration space: elementwise ops and last-axis reductions.
    Elementwise,
    /// One matmul with an elementwise prologue on its A operand and an elementwise epilogue.
    MatMul,
    /// A concatenation (copy kernel).
    Concat,
    /// QK^T, scale, mask, softmax and PV as one online-softmax kernel (no S x S tensor).
    FlashAttention,
    /// Sibling matmuls reading the same A operand, launched as one kernel (`qkv_horizontal`).
    Horizontal,
    /// New rows written into a KV cache in place (`Op::CacheWrite`).
    CacheWrite,
}

impl GroupKind {
    pub const ALL: [GroupKind; 6] = [
        GroupKind::Elementwise,
        GroupKind::MatMul,
        GroupKind::Concat,
        GroupKind::FlashAttention,
        GroupKind::Horizontal,
        GroupKind::CacheWrite,
    ];
}

/// The matmuls of a horizontal group, each with the members it needs (its prologue and
/// epilogue; a duplicated prologue belongs to every matmul that reads it).
pub fn horizontal_parts(g: &Graph, nodes: &[NodeId]) -> Vec<(NodeId, BTreeSet<NodeId>)> {
    let members: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let users = g.users();
    nodes
        .iter()
        .copied()
        .filter(|n| g.node(*n).op == Op::MatMul)
        .map(|a| {
            let mut part: BTreeSet<NodeId> = [a].into_iter().collect();
            let mut up = vec![a];
            while let Some(x) = up.pop() {
                for i in &g.node(x).inputs {
                    if members.contains(i) && part.insert(*i) {
                        up.push(*i);
                    }
                }
            }
            let mut down = vec![a];
            while let Some(x) = down.pop() {
                for u in &users[x.idx()] {
                    if members.contains(u) && part.insert(*u) {
                        down.push(*u);
                    }
                }
            }
            (a, part)
        })
        .collect()
}

/// A layout store (the `layout_store` rule): `members` holds the copy that materialises a
/// permutation of `v` (`copy(transpose(v))`, the transpose `v`'s only reader, the copy the
/// transpose's, the last axis kept last), so `v`'s kernel writes `v` straight in the copy's
/// layout. Returns the copy and the permutation.
pub fn layout_store(
    g: &Graph,
    users: &[Vec<NodeId>],
    v: NodeId,
    members: &BTreeSet<NodeId>,
) -> Option<(NodeId, Vec<usize>)> {
    let [t] = users[v.idx()][..] else { return None };
    let Op::Transpose { perm } = &g.node(t).op else { return None };
    let [c] = users[t.idx()][..] else { return None };
    let keeps_rows = perm.last() == Some(&(perm.len() - 1));
    let ok = keeps_rows
        && members.contains(&c)
        && g.node(c).op == Op::Copy
        && !g.outputs.contains(&v)
        && !g.outputs.contains(&t);
    ok.then(|| (c, perm.clone()))
}

/// The nodes of an attention pattern inside `members`.
#[derive(Clone, Debug)]
pub struct FlashParts {
    pub qk: NodeId,
    /// Elementwise ops on the scores between QK^T and softmax (scale, mask, causal), in order.
    pub chain: Vec<NodeId>,
    /// The last value of the chain (what softmax reads).
    pub scores: NodeId,
    pub max: NodeId,
    pub shift: NodeId,
    pub exp: NodeId,
    pub sum: NodeId,
    pub div: NodeId,
    pub pv: NodeId,
}

fn single_user(users: &[Vec<NodeId>], g: &Graph, id: NodeId) -> Option<NodeId> {
    (users[id.idx()].len() == 1 && !g.outputs.contains(&id)).then(|| users[id.idx()][0])
}

/// Match QK^T -> (scale | mask | causal)* -> softmax -> .V starting at the matmul `qk`.
pub fn match_flash(g: &Graph, users: &[Vec<NodeId>], qk: NodeId) -> Option<FlashParts> {
    use crate::ir::{BinaryOp, ReduceKind, UnaryOp};
    if g.node(qk).op != Op::MatMul || g.node(qk).shape.len() < 2 {
        return None;
    }
    let mut chain = Vec::new();
    let mut cur = qk;
    while let Some(u) = single_user(users, g, cur) {
        let n = g.node(u);
        let scalar = |i: usize| matches!(g.node(n.inputs[i]).op, Op::Const { .. });
        let ok = match &n.op {
            Op::Binary(BinaryOp::Mul | BinaryOp::Div) => {
                n.inputs[0] == cur && scalar(1)
                    || n.inputs[1] == cur && scalar(0) && n.op == Op::Binary(BinaryOp::Mul)
            }
            Op::Binary(BinaryOp::Add) => {
                n.shape == g.node(cur).shape && (n.inputs[0] != n.inputs[1])
            }
            Op::CausalMask => true,
            _ => false,
        };
        if !ok {
            break;
        }
        chain.push(u);
        cur = u;
    }
    let scores = cur;
    let su = &users[scores.idx()];
    if su.len() != 2 || g.outputs.contains(&scores) {
        return None;
    }
    let r = g.node(scores).shape.len();
    let max =
        *su.iter().find(|u| g.node(**u).op == Op::Reduce { kind: ReduceKind::Max, axis: r - 1 })?;
    let shift = *su.iter().find(|u| {
        g.node(**u).op == Op::Binary(BinaryOp::Sub) && g.node(**u).inputs == vec![scores, max]
    })?;
    let exp = single_user(users, g, shift).filter(|e| g.node(*e).op == Op::Unary(UnaryOp::Exp))?;
    let eu = &users[exp.idx()];
    if eu.len() != 2 || g.outputs.contains(&exp) {
        return None;
    }
    let sum =
        *eu.iter().find(|u| g.node(**u).op == Op::Reduce { kind: ReduceKind::Sum, axis: r - 1 })?;
    let div = *eu.iter().find(|u| {
        g.node(**u).op == Op::Binary(BinaryOp::Div) && g.node(**u).inputs == vec![exp, sum]
    })?;
    if single_user(users, g, max) != Some(shift) || single_user(users, g, sum) != Some(div) {
        return None;
    }
    let pv = single_user(users, g, div)
        .filter(|p| g.node(*p).op == Op::MatMul && g.node(*p).inputs[0] == div)?;
    Some(FlashParts { qk, chain, scores, max, shift, exp, sum, div, pv })
}

/// The attention pattern a FlashAttention group holds.
pub fn flash_parts(g: &Graph, members: &BTreeSet<NodeId>) -> Option<FlashParts> {
    let users = g.users();
    members.iter().find_map(|m| match_flash(g, &users, *m)).filter(|f| {
        let mut all: BTreeSet<NodeId> = f.chain.iter().copied().collect();
        all.extend([f.qk, f.max, f.shift, f.exp, f.sum, f.div, f.pv]);
        // and the copy of a layout store of the output, if the kernel writes one
        if let Some((copy, _)) = layout_store(g, &users, f.pv, members) {
            all.insert(copy);
        }
        all == *members
    })
}

/// The members of a matmul group upstream of its `anchor`: its prologue, computed while the
/// A operand is read (the rest of the group is the epilogue, applied as C is stored).
pub fn prologue_of(
    g: &Graph,
    anchor: NodeId,
    is_member: impl Fn(&NodeId) -> bool,
) -> BTreeSet<NodeId> {
    let mut prologue = BTreeSet::new();
    let mut stack = vec![anchor];
    while let Some(x) = stack.pop() {
        for i in &g.node(x).inputs {
            if is_member(i) && prologue.insert(*i) {
                stack.push(*i);
            }
        }
    }
    prologue
}

/// The matmuls a matmul kernel computes beside its `anchor`: members that are matmuls outside
/// the anchor's prologue. `kernels::matmul::check_part` admits one, reading the anchor's A
/// with the anchor's output shape: the kernel computes both products per output tile and
/// the epilogue reads the sibling's from its own C block (SwiGLU's `silu(x Wg) * (x Wu)`).
pub fn matmul_siblings(g: &Graph, anchor: NodeId, members: &BTreeSet<NodeId>) -> Vec<NodeId> {
    let prologue = prologue_of(g, anchor, |m| members.contains(m));
    members
        .iter()
        .copied()
        .filter(|m| *m != anchor && !prologue.contains(m) && g.node(*m).op == Op::MatMul)
        .collect()
}

/// The first node that is not a view, following reshape/transpose/slice inputs.
pub fn base_of(g: &Graph, mut id: NodeId) -> NodeId {
    while g.node(id).op.is_view() {
        id = g.node(id).inputs[0];
    }
    id
}

/// The shape a member iterates over (a reduction iterates over its input).
pub fn iter_shape(g: &Graph, id: NodeId) -> Shape {
    let n = g.node(id);
    let s = match n.op {
        Op::Reduce { .. } => g.node(n.inputs[0]).shape.clone(),
        // A cache write walks its new rows, not the whole cache.
        Op::CacheWrite { .. } => g.node(n.inputs[1]).shape.clone(),
        _ => n.shape.clone(),
    };
    if s.is_empty() {
        vec![DimExpr::constant(1)]
    } else {
        s
    }
}

fn row_of(s: &Shape) -> Shape {
    let mut r = s.clone();
    *r.last_mut().unwrap() = DimExpr::constant(1);
    r
}

/// The iteration space of an elementwise group, if all members agree on one.
pub fn space_of(g: &Graph, members: &[NodeId]) -> Option<Shape> {
    let shapes: Vec<Shape> = members.iter().map(|m| iter_shape(g, *m)).collect();
    let full =
        shapes.iter().find(|s| *s != &row_of(s)).cloned().unwrap_or_else(|| shapes[0].clone());
    shapes.iter().all(|s| *s == full || *s == row_of(&full)).then_some(full)
}
