//! `qkv_horizontal` (opt-in): sibling matmuls reading the same A operand (the Q, K and V
//! projections) are launched as one kernel walking the concatenated work units.

use super::{FusionRule, Rule};
use crate::group::GroupKind;
use crate::ir::{NodeId, Op};
use crate::plan::planner::{Move, Planner};
use crate::plan::{Candidate, Reason};
use std::collections::BTreeSet;

pub(in crate::plan) struct QkvHorizontal;

impl FusionRule for QkvHorizontal {
    fn rule(&self) -> Rule {
        Rule::QkvHorizontal
    }
    fn moves(&self, p: &Planner) -> Vec<(Candidate, Move)> {
        let mut out = Vec::new();
        if !p.rules.contains(Rule::QkvHorizontal) {
            return out;
        }
        let live: Vec<usize> = (0..p.groups.len()).filter(|i| p.groups[*i].is_some()).collect();
        for (x, &a) in live.iter().enumerate() {
            for &b in &live[x + 1..] {
                if siblings(p, a, b) {
                    out.push((eval_sibling(p, a, b), p.mv(a, &[b], Some(Rule::QkvHorizontal))));
                }
            }
        }
        out
    }
    fn rescore(&self, p: &Planner, m: &Move) -> Option<Candidate> {
        Some(eval_sibling(p, m.a, m.bs[0]))
    }
    /// Siblings side by side: the second group takes the first's matmuls as one horizontal
    /// kernel.
    fn apply(&self, p: &mut Planner, rule: Rule, m: &Move) {
        let wa = p.groups[m.a].take().unwrap();
        let wb = p.groups[m.bs[0]].as_mut().unwrap();
        wb.members.extend(wa.members.iter().copied());
        wb.rules.extend(wa.rules.iter().copied());
        wb.rules.insert(rule);
        wb.kind = GroupKind::Horizontal;
        wb.anchor = None;
        wb.version += 1;
    }
}

fn a_operands(p: &Planner, i: usize) -> BTreeSet<NodeId> {
    let w = p.w(i);
    w.members
        .iter()
        .filter(|m| p.g.node(**m).op == Op::MatMul)
        .map(|m| p.g.node(*m).inputs[0])
        .collect()
}

/// Matmul groups whose matmuls read the same A operand.
fn siblings(p: &Planner, a: usize, b: usize) -> bool {
    let kinds = |i: usize| matches!(p.w(i).kind, GroupKind::MatMul | GroupKind::Horizontal);
    kinds(a) && kinds(b) && !a_operands(p, a).is_disjoint(&a_operands(p, b))
}

fn eval_sibling(p: &Planner, a: usize, b: usize) -> Candidate {
    let rule = Rule::QkvHorizontal;
    if let Err((reason, detail)) = p.rule_on(rule) {
        return p.rejected(Some(rule), a, &[b], reason, detail);
    }
    if p.preds(b).contains(&a)
        || p.preds(a).contains(&b)
        || p.indirect_path(a, b, &[])
        || p.indirect_path(b, a, &[])
    {
        return p.rejected(
            Some(rule),
            a,
            &[b],
            Reason::Cycle,
            "one sibling depends on the other".into(),
        );
    }
    let m: BTreeSet<NodeId> = p.w(a).members.union(&p.w(b).members).copied().collect();
    if let Err((reason, detail)) = p.backstops(&m) {
        return p.rejected(Some(rule), a, &[b], reason, detail);
    }
    p.score(rule, a, &[b], &[(m, GroupKind::Horizontal, None)])
}
