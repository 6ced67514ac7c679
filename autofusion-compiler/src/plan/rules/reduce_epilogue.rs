//! `reduce_epilogue`: a row reduction joins its elementwise producers and consumers (softmax, a
//! norm's statistics and apply) in one row loop, phases split at the reductions.

use super::{elementwise_pair, one_space, FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::NodeId;
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct ReduceEpilogue;

impl FusionRule for ReduceEpilogue {
    fn rule(&self) -> Rule {
        Rule::ReduceEpilogue
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        matches!(elementwise_pair(p, a, b), Some((ra, rb)) if ra || rb)
            && !super::add_norm::AddNorm.claims(p, a, b)
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
