//! `linear_epilogue`: elementwise consumers of a matmul's output (bias, activation, residual
//! add, scale, cast) run on each C tile as it is stored, in the matmul's kernel.

use super::{FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::NodeId;
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct LinearEpilogue;

impl FusionRule for LinearEpilogue {
    fn rule(&self) -> Rule {
        Rule::LinearEpilogue
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        p.w(a).kind == GroupKind::MatMul && p.w(b).kind == GroupKind::Elementwise
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        let (wa, wb) = (p.w(a), p.w(b));
        let anchor = wa.anchor.unwrap();
        let out = &p.g.node(anchor).shape;
        if p.has_reduce(wb) {
            Err((Reason::ReductionNotAllowed, "an epilogue holds no reduction".into()))
        } else if wb.members.iter().any(|m| p.g.node(*m).shape != *out) {
            Err((Reason::SpaceMismatch, "epilogue ops must have the matmul's output shape".into()))
        } else {
            Ok((GroupKind::MatMul, Some(anchor)))
        }
    }
}
