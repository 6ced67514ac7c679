//! `add_norm`: a residual add whose sum is also needed elsewhere (a graph output, or read by
//! another kernel) joins the norm that reads it: one kernel writes both the sum and the
//! normalised rows.

use super::{elementwise_pair, one_space, FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::{BinaryOp, NodeId, Op};
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct AddNorm;

impl FusionRule for AddNorm {
    fn rule(&self) -> Rule {
        Rule::AddNorm
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        elementwise_pair(p, a, b) == Some((false, true))
            && p.w(a).members.iter().any(|m| {
                matches!(p.g.node(*m).op, Op::Binary(BinaryOp::Add))
                    && (p.is_output[m.idx()] || !p.readers(*m).0.iter().all(|r| *r == b))
            })
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        one_space(p, a, b)
    }
}
