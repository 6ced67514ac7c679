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
        for m in &wb.members {
            for &i in &p.g.node(*m).inputs {
                let base = crate::group::base_of(p.g, i);
                let split = base == anchor && crate::group::natural_split(p.g, anchor, i).is_some();
                if p.g.node(i).op.is_view() && wa.members.contains(&base) && !split {
                    return Err((Reason::ViewBoundary, format!("{m} reads {base} through a view")));
                }
            }
        }
        // The ops compute in the product's shape, or in a natural split of it that the
        // part's epilogue (its members so far and these) reads the product through (RoPE on
        // heads).
        let part = part_of(p, wa, anchor);
        let both: BTreeSet<NodeId> = part.union(&wb.members).copied().collect();
        let prologue = crate::group::prologue_of(p.g, anchor, |m| both.contains(m));
        let epilogue: Vec<NodeId> =
            both.iter().copied().filter(|m| *m != anchor && !prologue.contains(m)).collect();
        let split = crate::kernels::matmul::natural_epilogue(p.g, anchor, &epilogue, &both)
            .map_err(|e| (Reason::SpaceMismatch, e))?;
        let out = match &split {
            Some((view, _)) => &p.g.node(*view).shape,
            None => &p.g.node(anchor).shape,
        };
        // A cache write is shaped by the rows it writes (stored at their cache rows).
        if wb.members.iter().any(|m| crate::group::iter_shape(p.g, *m) != *out) {
            Err((Reason::SpaceMismatch, "epilogue ops must have the matmul's output shape".into()))
        } else {
            Ok((wa.kind, wa.anchor))
        }
    }
}

/// The members of `wa` that make the part of the matmul at `anchor`: all of them, or one
/// part of a horizontal kernel.
fn part_of(p: &Planner, wa: &WGroup, anchor: NodeId) -> BTreeSet<NodeId> {
    if wa.kind != GroupKind::Horizontal {
        return wa.members.clone();
    }
    let nodes: Vec<NodeId> = wa.members.iter().copied().collect();
    crate::group::horizontal_parts(p.g, &nodes)
        .into_iter()
        .find(|(a, _)| *a == anchor)
        .map(|(_, part)| part)
        .unwrap_or_default()
}

/// The matmul of horizontal kernel `wa` whose part the epilogue `wb` extends: it reads one
/// part only (an op reading two parts' products is a sibling product's epilogue).
fn part_extended(p: &Planner, wa: &WGroup, wb: &WGroup) -> Result<NodeId, (Reason, String)> {
    let nodes: Vec<NodeId> = wa.members.iter().copied().collect();
    let parts = crate::group::horizontal_parts(p.g, &nodes);
    let read = |part: &BTreeSet<NodeId>| {
        // Through views too: RoPE reads its projection's product as heads.
        wb.members.iter().any(|m| {
            p.g.node(*m).inputs.iter().any(|i| part.contains(&crate::group::base_of(p.g, *i)))
        })
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
