//! `norm_linear_prologue`: the ops producing a matmul's A operand (a whole RMSNorm or
//! LayerNorm: its row statistics over A's last axis, then the apply `(x - mean) * rstd * g + b`)
//! run in the matmul's kernel, the statistics of each row computed before the row is packed
//! and the apply while it is packed. When several matmuls read the same normalised rows (Q, K
//! and V; gate and up), the prologue is duplicated into each of them (one move over all the
//! consumers); the cost model prices the statistics recomputed per kernel and per tile.

use super::{FusionRule, Rule};
use crate::group::{base_of, GroupKind};
use crate::ir::{NodeId, Op};
use crate::plan::planner::{Move, Planner, WGroup};
use crate::plan::{Candidate, Reason};
use std::collections::BTreeSet;

pub(in crate::plan) struct NormLinearPrologue;

impl FusionRule for NormLinearPrologue {
    fn rule(&self) -> Rule {
        Rule::NormLinearPrologue
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        p.w(a).kind == GroupKind::Elementwise && takes_prologue(p.w(b).kind)
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        check_prologue(p, a, b, &[b])?;
        Ok((p.w(b).kind, p.w(b).anchor))
    }
    fn moves(&self, p: &Planner) -> Vec<(Candidate, Move)> {
        let live = (0..p.groups.len()).filter(|i| p.groups[*i].is_some());
        live.filter_map(|a| {
            let cs = dup_targets(p, a)?;
            Some((eval_dup(p, a, &cs), p.mv(a, &cs, Some(Rule::NormLinearPrologue))))
        })
        .collect()
    }
    fn rescore(&self, p: &Planner, m: &Move) -> Option<Candidate> {
        (dup_targets(p, m.a).as_deref() == Some(&m.bs[..])).then(|| eval_dup(p, m.a, &m.bs))
    }
}

/// A matmul kernel, or a horizontal one: its parts share the A operand, so each part gets the
/// prologue (`horizontal_parts` walks up from every matmul).
fn takes_prologue(kind: GroupKind) -> bool {
    matches!(kind, GroupKind::MatMul | GroupKind::Horizontal)
}

/// Can elementwise group `a` be the A-operand prologue of matmul group `c`, where `all` are
/// the consumers it would be duplicated into?
fn check_prologue(p: &Planner, a: usize, c: usize, all: &[usize]) -> Result<(), (Reason, String)> {
    let (wa, wc) = (p.w(a), p.w(c));
    // A horizontal kernel has no anchor: its matmuls all read the same A.
    let first_matmul = wc.members.iter().copied().find(|m| p.g.node(*m).op == Op::MatMul);
    let Some(anchor) = wc.anchor.or(first_matmul) else {
        return Err((Reason::NotAnOperand, "the kernel holds no matmul".into()));
    };
    let a_shape = &p.g.node(p.g.node(anchor).inputs[0]).shape;
    let mut row = a_shape.clone();
    if let Some(last) = row.last_mut() {
        *last = crate::dim::DimExpr::constant(1);
    }
    for m in &wa.members {
        let n = p.g.node(*m);
        if let Op::Reduce { axis, .. } = n.op {
            if axis + 1 != a_shape.len() || crate::group::iter_shape(p.g, *m) != *a_shape {
                return Err((
                    Reason::ReductionNotAllowed,
                    format!("{m} does not reduce the rows of the A operand"),
                ));
            }
        } else if n.shape != *a_shape && n.shape != row {
            return Err((
                Reason::SpaceMismatch,
                "prologue ops have the A operand's shape or one value per row of it".into(),
            ));
        }
    }
    let prologue = p.ancestors_in(wc, anchor);
    let others: BTreeSet<NodeId> =
        all.iter().filter(|x| **x != c).flat_map(|x| p.w(*x).members.iter().copied()).collect();
    for m in &wa.members {
        if p.is_output[m.idx()] {
            return Err((Reason::OtherUsers, format!("{m} is a graph output")));
        }
        let (rd, view) = p.readers(*m);
        if view || rd.iter().any(|g| !all.contains(g)) {
            return Err((Reason::OtherUsers, format!("{m} is also read by another kernel")));
        }
        for u in &p.users[m.idx()] {
            let ok = wa.members.contains(u)
                || others.contains(u)
                || prologue.contains(u)
                || reads_as_a(p, wc, *u, *m);
            if !ok {
                return Err((
                    Reason::NotAnOperand,
                    format!("{m} is also used by {u}, not through the A operand"),
                ));
            }
        }
    }
    for mm in &wc.members {
        for i in &p.g.node(*mm).inputs {
            if p.g.node(*i).op.is_view() && wa.members.contains(&base_of(p.g, *i)) {
                return Err((
                    Reason::ViewBoundary,
                    format!("{mm} reads {} through a view", base_of(p.g, *i)),
                ));
            }
        }
    }
    Ok(())
}

/// Is `u` a matmul of group `wc` reading `m` as its A operand only?
fn reads_as_a(p: &Planner, wc: &WGroup, u: NodeId, m: NodeId) -> bool {
    let n = p.g.node(u);
    wc.members.contains(&u) && n.op == Op::MatMul && n.inputs[0] == m && n.inputs[1] != m
}

/// Elementwise group `a` duplicated into every matmul that reads it as its A operand.
fn dup_targets(p: &Planner, a: usize) -> Option<Vec<usize>> {
    let wa = p.w(a);
    if wa.kind != GroupKind::Elementwise {
        return None;
    }
    let mut cs = BTreeSet::new();
    for m in &wa.members {
        for u in &p.users[m.idx()] {
            if !wa.members.contains(u) {
                cs.extend(p.owners(*u));
            }
        }
    }
    let cs: Vec<usize> = cs.into_iter().collect();
    (cs.len() >= 2 && cs.iter().all(|c| takes_prologue(p.w(*c).kind))).then_some(cs)
}

fn eval_dup(p: &Planner, a: usize, cs: &[usize]) -> Candidate {
    let rule = Rule::NormLinearPrologue;
    let mut checks = p.rule_on(rule);
    for &c in cs {
        if checks.is_ok() {
            checks = check_prologue(p, a, c, cs);
        }
        if checks.is_ok() && p.indirect_path(a, c, cs) {
            checks = Err((Reason::Cycle, "another kernel lies on a path between them".into()));
        }
    }
    if let Err((reason, detail)) = checks {
        return p.rejected(Some(rule), a, cs, reason, detail);
    }
    let fused: Vec<_> = cs
        .iter()
        .map(|c| {
            let m: BTreeSet<NodeId> = p.w(a).members.union(&p.w(*c).members).copied().collect();
            (m, p.w(*c).kind, p.w(*c).anchor)
        })
        .collect();
    for (m, _, _) in &fused {
        if let Err((reason, detail)) = p.backstops(m) {
            return p.rejected(Some(rule), a, cs, reason, detail);
        }
    }
    p.score(rule, a, cs, &fused)
}
