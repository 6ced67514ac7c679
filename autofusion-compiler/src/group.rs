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
            // Downstream through views too: an epilogue may read the product as heads.
            let mut down = vec![a];
            while let Some(x) = down.pop() {
                for u in &users[x.idx()] {
                    let through_view = !members.contains(u) && g.node(*u).op.is_view();
                    if through_view || members.contains(u) && part.insert(*u) {
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

/// A view of a matmul's product `[.., M, N]` that is a permutation of a row-major split of
/// it: `reshape(product, [.., M, N1, .., Nk])`, then at most one transpose keeping the last
/// axis last (canon composes chained transposes). An epilogue can compute such a view's
/// elementwise consumers (RoPE on heads) in the product's own order, its *natural space*
/// `[.., M, N1, .., Nk]`, with C blocks holding whole rows of the last axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NaturalSplit {
    /// The natural space: the product's axes before N, then N's split.
    pub space: Shape,
    /// Axis `i` of the view is axis `perm[i]` of the natural space.
    pub perm: Vec<usize>,
}

/// The natural split of `view` over matmul `product`, if `view` is one (see `NaturalSplit`).
pub fn natural_split(g: &Graph, product: NodeId, view: NodeId) -> Option<NaturalSplit> {
    let (reshape, perm) = match &g.node(view).op {
        Op::Transpose { perm } => (g.node(view).inputs[0], perm.clone()),
        Op::Reshape => (view, (0..g.node(view).shape.len()).collect()),
        _ => return None,
    };
    let r = g.node(reshape);
    if r.op != Op::Reshape || r.inputs[0] != product {
        return None;
    }
    let out = &g.node(product).shape;
    let lead = out.len().checked_sub(1)?;
    let space = r.shape.clone();
    // The axes before N are kept, and the rest multiply out to N.
    if space.len() <= lead || space[..lead] != out[..lead] {
        return None;
    }
    if crate::dim::numel(&space[lead..]) != out[lead] {
        return None;
    }
    // The split's last axis stays last: its rows are contiguous in the product.
    (perm.last() == Some(&(space.len() - 1))).then_some(NaturalSplit { space, perm })
}

/// Whether product `m` is read only by `members`, through natural splits of it (an epilogue
/// computing in the split reads it from C, so it need not be written).
pub fn read_in_natural_split(
    g: &Graph,
    users: &[Vec<NodeId>],
    m: NodeId,
    members: &BTreeSet<NodeId>,
) -> bool {
    if g.node(m).op != Op::MatMul || users[m.idx()].is_empty() {
        return false;
    }
    let read_by_members = |v: NodeId| {
        natural_split(g, m, v).is_some()
            && !users[v.idx()].is_empty()
            && users[v.idx()].iter().all(|u| members.contains(u))
    };
    users[m.idx()].iter().all(|&r| {
        g.node(r).op == Op::Reshape
            && users[r.idx()].iter().all(|&u| {
                members.contains(&u) && read_by_members(r)
                    || matches!(g.node(u).op, Op::Transpose { .. }) && read_by_members(u)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::GraphBuilder;
    use crate::ir::DType;

    fn heads(perm: &[usize], split: &[i64]) -> (Graph, NodeId, NodeId) {
        let (s, c) = (DimExpr::sym("S"), DimExpr::constant);
        let mut b = GraphBuilder::new("heads");
        let x = b.param("x", DType::F32, vec![s.clone(), c(16)]);
        let w = b.param("w", DType::F32, vec![c(16), c(split.iter().product())]);
        let q = b.matmul(x, w, "q").unwrap();
        let mut shape = vec![s];
        shape.extend(split.iter().map(|e| c(*e)));
        let r = b.reshape(q, shape, "q_heads").unwrap();
        let v = b.op(Op::Transpose { perm: perm.to_vec() }, &[r], "q_t").unwrap();
        b.output(v);
        (b.finish().unwrap(), q, v)
    }

    #[test]
    fn heads_moved_before_the_rows_are_a_natural_split() {
        // [S, KVH, G, DH] -> [KVH, G, S, DH], as the Llama layer reads Q.
        let (g, q, v) = heads(&[1, 2, 0, 3], &[3, 2, 8]);
        let ns = natural_split(&g, q, v).unwrap();
        assert_eq!(ns.perm, vec![1, 2, 0, 3]);
        assert_eq!(ns.space.len(), 4);
        assert_eq!(ns.space[3], DimExpr::constant(8));
    }

    #[test]
    fn a_view_moving_the_last_axis_is_not() {
        let (g, q, v) = heads(&[1, 0, 2], &[4, 8]);
        assert!(natural_split(&g, q, v).is_some());
        let (g, q, v) = heads(&[0, 2, 1], &[4, 8]);
        assert_eq!(natural_split(&g, q, v), None, "the head dim leaves the last axis");
        let (g, q, v) = heads(&[0, 2, 1, 3], &[2, 2, 8]);
        assert!(natural_split(&g, q, v).is_some());
        let (g, q, v) = heads(&[2, 0, 1], &[4, 8]);
        assert_eq!(natural_split(&g, q, v), None);
        // Not a view of the product at all.
        let x = g.param_nodes()[0];
        assert_eq!(natural_split(&g, q, x), None);
    }
}
