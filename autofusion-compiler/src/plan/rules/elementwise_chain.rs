//! `elementwise_chain`: producer-consumer chains of elementwise ops (no reduction on either side) become one row
//! loop; values between them stay in registers.

use super::{elementwise_pair, one_space, FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::NodeId;
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct ElementwiseChain;

impl FusionRule for ElementwiseChain {
    fn rule(&self) -> Rule {
        Rule::ElementwiseChain
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        elementwise_pair(p, a, b) == Some((false, false))
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
