//! `sibling_matmul`: a matmul read only by the epilogue of another matmul of the same A
//! operand joins that kernel as a second product: SwiGLU's `silu(x Wg) * (x Wu)` computes
//! both products per output tile, A packed once, and the gate's product never reaches memory.

use super::{FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::NodeId;
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct SiblingMatmul;

impl FusionRule for SiblingMatmul {
    fn rule(&self) -> Rule {
        Rule::SiblingMatmul
    }
    /// A matmul kernel with no prologue (a lone matmul, or one whose epilogue feeds the other
    /// kernel's: SwiGLU's gate with its SiLU when the mul went to up's kernel first) into a
    /// matmul kernel whose anchor reads the same A: the pairs of two matmuls no other rule
    /// takes. Its epilogue comes along, reading the sibling's product.
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        let (wa, wb) = (p.w(a), p.w(b));
        let a_of = |anchor: Option<NodeId>| anchor.map(|x| p.g.node(x).inputs[0]);
        let no_prologue = wa.anchor.is_some_and(|x| {
            crate::group::prologue_of(p.g, x, |m| wa.members.contains(m)).is_empty()
        });
        wa.kind == GroupKind::MatMul
            && wb.kind == GroupKind::MatMul
            && no_prologue
            && a_of(wa.anchor).is_some()
            && a_of(wa.anchor) == a_of(wb.anchor)
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        let (sa, sb) = (p.w(a).anchor.unwrap(), p.w(b).anchor.unwrap());
        let (na, nb) = (p.g.node(sa), p.g.node(sb));
        if na.shape != nb.shape {
            return Err((
                Reason::SpaceMismatch,
                format!("`{}` and `{}` have different output shapes", na.name, nb.name),
            ));
        }
        if !crate::group::matmul_siblings(p.g, sb, &p.w(b).members).is_empty() {
            return Err((Reason::TwoAnchors, format!("`{}` already has a sibling", nb.name)));
        }
        Ok((GroupKind::MatMul, Some(sb)))
    }
}
