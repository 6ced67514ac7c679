//! `linear_epilogue`: elementwise consumers of a matmul's output (bias, activation, residual
//! add, scale, cast) run on each C tile as it is stored, in the matmul's kernel.

use super::{FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::NodeId;
use crate::plan::planner::{Planner, WGroup};
use crate::plan::Reason;
use std::collections::BTreeSet;

pub(in crate::plan) struct LinearEpilogue;

impl FusionRule for LinearEpilogue {
    fn rule(&self) -> Rule {
        Rule::LinearEpilogue
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        matches!(p.w(a).kind, GroupKind::MatMul | GroupKind::Horizontal)
            && p.w(b).kind == GroupKind::Elementwise
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        let (wa, wb) = (p.w(a), p.w(b));
        if p.has_reduce(wb) {
            return Err((Reason::ReductionNotAllowed, "an epilogue holds no reduction".into()));
        }
        let anchor = match wa.anchor {
            Some(anchor) => anchor,
            None => part_extended(p, wa, wb)?,
        };
        let out = &p.g.node(anchor).shape;
        if wb.members.iter().any(|m| p.g.node(*m).shape != *out) {
            Err((Reason::SpaceMismatch, "epilogue ops must have the matmul's output shape".into()))
        } else {
            Ok((wa.kind, wa.anchor))
        }
    }
}

/// The matmul of horizontal kernel `wa` whose part the epilogue `wb` extends: it reads one
/// part only (an op reading two parts' products is a sibling product's epilogue).
fn part_extended(p: &Planner, wa: &WGroup, wb: &WGroup) -> Result<NodeId, (Reason, String)> {
    let nodes: Vec<NodeId> = wa.members.iter().copied().collect();
    let parts = crate::group::horizontal_parts(p.g, &nodes);
    let read = |part: &BTreeSet<NodeId>| {
        wb.members.iter().any(|m| p.g.node(*m).inputs.iter().any(|i| part.contains(i)))
    };
    let mut reading = parts.iter().filter(|(_, part)| read(part)).map(|(anchor, _)| *anchor);
    match (reading.next(), reading.next()) {
        (Some(anchor), None) => Ok(anchor),
        (Some(_), Some(_)) => Err((
            Reason::SpaceMismatch,
            "the ops read the products of two parts of a horizontal kernel".into(),
        )),
        (None, _) => Err((Reason::NotAnOperand, "the ops read no part's product".into())),
    }
}
