//! Matmul kernels: one matmul with an elementwise prologue on its A operand (applied while A is packed) and an elementwise epilogue (applied while C is stored).

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::dim::DimExpr;
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId, Op};
use crate::plan::Group;
use std::collections::BTreeSet;

/// One matmul with an elementwise prologue on A and an elementwise epilogue on C.
pub(crate) struct MatMul;

impl KernelKind for MatMul {
    fn group_kind(&self) -> GroupKind {
        GroupKind::MatMul
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        anchor: Option<NodeId>,
    ) -> Result<(), String> {
        let anchor = anchor.filter(|a| members.contains(a) && g.node(*a).op == Op::MatMul);
        let anchor = anchor.ok_or("a matmul kernel is anchored at one of its matmuls")?;
        check_part(g, anchor, members)
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        cost::matmul_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_matmul(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, _name: &str) -> Result<Emitted, String> {
        let (work, stage_a, stage_b, ty) = ascend::gen_matmul(k, grp);
        let cube_bytes = vec![ty.size() as u32];
        Ok(Emitted { work, mix: true, cube: 1, stage_a, stage_b, cube_bytes })
    }
}

/// What the matmul at `anchor` may have around it in `members` (its part of the kernel): a
/// prologue upstream of it (elementwise ops and row reductions, applied while A is packed) and
/// an epilogue of elementwise ops with the matmul's output shape (applied as C is stored).
pub(crate) fn check_part(
    g: &Graph,
    anchor: NodeId,
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    crate::kernels::in_float_registers(g, members)?;
    let prologue = crate::group::prologue_of(g, anchor, |m| members.contains(m));
    crate::kernels::rows::row_ops_only(g, &prologue)?;
    let pro: Vec<NodeId> = prologue.iter().copied().collect();
    let a_shape = &g.node(g.node(anchor).inputs[0]).shape;
    crate::kernels::rows::rotations_read_memory(g, &pro, a_shape, &prologue)?;
    let siblings = crate::group::matmul_siblings(g, anchor, members);
    check_siblings(g, anchor, &siblings, members)?;
    let epilogue: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|m| *m != anchor && !prologue.contains(m) && !siblings.contains(m))
        .collect();
    // The epilogue's space: the product's shape, or a permuted split of it (RoPE on heads).
    let split = natural_epilogue(g, anchor, &epilogue, members)?;
    let out = match &split {
        Some((view, _)) => &g.node(*view).shape,
        None => &g.node(anchor).shape,
    };
    if split.is_some() && !siblings.is_empty() {
        return Err(format!(
            "the epilogue of `{}` reads its product through a view and a sibling product",
            g.node(anchor).name
        ));
    }
    for m in &epilogue {
        let n = g.node(*m);
        let rotation_of_view =
            n.op == Op::RotateHalf && split.as_ref().is_some_and(|(view, _)| n.inputs[0] == *view);
        if let (Op::CacheWrite { .. }, Some((view, _))) = (&n.op, &split) {
            split_cache_write(g, *m, *view, members)?;
            continue;
        }
        if !n.op.is_elementwise() && !rotation_of_view {
            return Err(format!(
                "`{}` ({}) in the epilogue of `{}`: an epilogue is elementwise",
                n.name,
                n.op.name(),
                g.node(anchor).name
            ));
        }
        if n.shape != *out {
            return Err(format!(
                "`{}` in the epilogue of `{}` does not have the matmul's output shape",
                n.name,
                g.node(anchor).name
            ));
        }
    }
    Ok(())
}

/// One step serving several parts (a horizontal kernel's): the product of their distinct
/// steps (Q and K share the head width, so it is usually that width).
pub(crate) fn common_step(steps: impl IntoIterator<Item = DimExpr>) -> DimExpr {
    let mut distinct: Vec<DimExpr> = Vec::new();
    for s in steps {
        if s != DimExpr::constant(1) && !distinct.contains(&s) {
            distinct.push(s);
        }
    }
    distinct.iter().fold(DimExpr::constant(1), |a, s| a.mul(s))
}

/// A cache write in an epilogue computed in a natural split: it stores the new rows (the
/// split's view of the product, or a member in that view's shape) at their cache rows, each
/// head's `W` columns one contiguous run of the cache.
fn split_cache_write(
    g: &Graph,
    m: NodeId,
    view: NodeId,
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    let n = g.node(m);
    let Op::CacheWrite { axis, .. } = n.op else { return Ok(()) };
    let (cache, new) = (n.inputs[0], n.inputs[1]);
    let shape = &g.node(view).shape;
    let r = shape.len();
    let fits = (new == view || members.contains(&new))
        && !members.contains(&cache)
        && g.node(new).shape == *shape
        && axis + 1 < r
        && n.shape.len() == r
        && n.shape[r - 1] == shape[r - 1];
    if fits {
        Ok(())
    } else {
        Err(format!(
            "cache_write `{}` does not store whole rows of the epilogue's view `{}`",
            n.name,
            g.node(view).name
        ))
    }
}

/// The view of the product an epilogue computes in, when it reads the product through a
/// natural split (`group::NaturalSplit`: heads moved before the rows, as RoPE reads Q and K)
/// rather than as it is: that view and its split. Every read of the product goes through the
/// same view.
pub(crate) fn natural_epilogue(
    g: &Graph,
    anchor: NodeId,
    epilogue: &[NodeId],
    members: &BTreeSet<NodeId>,
) -> Result<Option<(NodeId, crate::group::NaturalSplit)>, String> {
    let mut found: Option<(NodeId, crate::group::NaturalSplit)> = None;
    let mut direct = false;
    for m in epilogue {
        for &i in &g.node(*m).inputs {
            if i == anchor {
                direct = true;
            } else if !members.contains(&i) && crate::layout::resolve(g, i).base == anchor {
                let split = crate::group::natural_split(g, anchor, i).ok_or_else(|| {
                    format!(
                        "`{}` reads the product of `{}` through a view that is not a split of its rows",
                        g.node(*m).name,
                        g.node(anchor).name
                    )
                })?;
                if found.as_ref().is_some_and(|(v, _)| *v != i) {
                    return Err(format!(
                        "the epilogue of `{}` reads its product through two views",
                        g.node(anchor).name
                    ));
                }
                found = Some((i, split));
            }
        }
    }
    if direct && found.is_some() {
        return Err(format!(
            "the epilogue of `{}` reads its product both as it is and through a view",
            g.node(anchor).name
        ));
    }
    Ok(found)
}

/// A matmul kernel computes at most one sibling product beside its anchor: a matmul of the
/// anchor's A operand (the same node, so one packing serves both) with the anchor's output
/// shape and a B read from memory, whose product the epilogue reads from its own C block.
fn check_siblings(
    g: &Graph,
    anchor: NodeId,
    siblings: &[NodeId],
    members: &BTreeSet<NodeId>,
) -> Result<(), String> {
    let an = g.node(anchor);
    if siblings.len() > 1 {
        return Err(format!("`{}` has more than one sibling matmul in its kernel", an.name));
    }
    for s in siblings {
        let sn = g.node(*s);
        if sn.inputs[0] != an.inputs[0] {
            return Err(format!(
                "a second matmul `{}` in the kernel of `{}` reads another A operand",
                sn.name, an.name
            ));
        }
        if sn.shape != an.shape {
            return Err(format!(
                "the sibling matmul `{}` does not have the shape of `{}`",
                sn.name, an.name
            ));
        }
        if members.contains(&sn.inputs[1]) {
            return Err(format!(
                "the sibling matmul `{}` reads a B computed in the kernel",
                sn.name
            ));
        }
    }
    Ok(())
}
