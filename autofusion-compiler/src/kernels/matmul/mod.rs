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
    let out = &g.node(anchor).shape;
    let siblings = crate::group::matmul_siblings(g, anchor, members);
    check_siblings(g, anchor, &siblings, members)?;
    for m in members.iter().filter(|m| **m != anchor && !prologue.contains(m)) {
        let n = g.node(*m);
        if siblings.contains(m) {
            continue;
        }
        if !n.op.is_elementwise() {
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
