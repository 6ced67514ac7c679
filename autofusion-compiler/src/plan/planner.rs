//! One planning run: the current grouping of the graph, the queries rules ask of it (who reads
//! what, paths between groups, on-chip backstops), scoring a move with the cost model, and
//! the greedy merge loop's bookkeeping (moves, lazy re-scoring, applying).

use super::rules::{self, Rule, RuleSet};
use super::{Candidate, Decision, Reason};
use crate::cost::KernelCost;
use crate::dim::DimExpr;
use crate::group::{base_of, space_of, GroupKind};
use crate::ir::{Graph, NodeId, Op};
use crate::target::Target;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

const MAX_GROUP_NODES: usize = 48;
const MAX_KERNEL_BUFFERS: usize = 24;

/// A group while planning: its members, what kind of kernel it is, and the rules that formed it.
#[derive(Clone)]
pub(super) struct WGroup {
    pub(super) kind: GroupKind,
    pub(super) members: BTreeSet<NodeId>,
    pub(super) anchor: Option<NodeId>,
    pub(super) rules: BTreeSet<Rule>,
    /// Bumped on every change (lazy re-scoring).
    pub(super) version: u32,
}

pub(super) type CostResult = Result<KernelCost, String>;

/// A pair's classification: its rule and the merged kernel's kind and anchor, or the rule (if
/// one claimed it), the reason code and the detail of why not.
type PairCheck = Result<(Rule, GroupKind, Option<NodeId>), (Option<Rule>, Reason, String)>;

/// The state of one planning run: the graph, the current grouping and the memoised costs. The
/// rules (`rules/`) read it through the queries below and change it through `apply`.
pub(super) struct Planner<'a> {
    pub(super) g: &'a Graph,
    pub(super) target: &'a Target,
    pub(super) opt_level: u8,
    pub(super) rules: RuleSet,
    pub(super) hints: Vec<(String, i64)>,
    pub(super) users: Vec<Vec<NodeId>>,
    pub(super) groups: Vec<Option<WGroup>>,
    pub(super) is_output: Vec<bool>,
    pub(super) cache: RefCell<HashMap<(Vec<NodeId>, GroupKind), CostResult>>,
}

/// How the error of a group that fails its kind's `check` starts.
const NOT_GENERATABLE: &str = "not generatable";

/// The reason code of a group that could not be priced: its kind's check failed, or no tiling
/// fits on chip.
fn cost_reason(e: &str) -> Reason {
    if e.starts_with(NOT_GENERATABLE) {
        Reason::NotGeneratable
    } else {
        Reason::Capacity
    }
}

pub(super) fn is_member_op(op: &Op) -> bool {
    !matches!(op, Op::Param { .. } | Op::Const { .. }) && !op.is_view()
}

/// What a candidate changes: the producer group and the consumer groups, with their versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Move {
    pub(super) a: usize,
    pub(super) bs: Vec<usize>,
    pub(super) versions: Vec<u32>,
    /// The rule that proposed a move other than a producer-consumer pair (duplication,
    /// siblings); it re-scores and applies it. Pairs are classified anew each time.
    pub(super) by: Option<Rule>,
}

pub(super) struct HeapEntry {
    pub(super) benefit: f64,
    pub(super) key: (Vec<NodeId>, Vec<Vec<NodeId>>),
    pub(super) mv: Move,
}

impl PartialEq for HeapEntry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for HeapEntry {}
impl PartialOrd for HeapEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for HeapEntry {
    /// Larger benefit first; ties go to the candidate with the smaller node ids.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.benefit.total_cmp(&o.benefit).then_with(|| o.key.cmp(&self.key))
    }
}

impl<'a> Planner<'a> {
    pub(super) fn est(&self, d: &DimExpr) -> i64 {
        d.estimate(&|s| self.hints.iter().find(|(n, _)| n == s).map(|(_, v)| *v).unwrap_or(128))
    }
    pub(super) fn w(&self, i: usize) -> &WGroup {
        self.groups[i].as_ref().expect("live group")
    }
    pub(super) fn owners(&self, id: NodeId) -> Vec<usize> {
        (0..self.groups.len())
            .filter(|&i| self.groups[i].as_ref().is_some_and(|w| w.members.contains(&id)))
            .collect()
    }
    /// Groups that read `m` from memory (they hold a user of `m` but not `m` itself), and
    /// whether some user reads it through a view.
    pub(super) fn readers(&self, m: NodeId) -> (BTreeSet<usize>, bool) {
        let mut gs = BTreeSet::new();
        let mut view = false;
        for u in &self.users[m.idx()] {
            if self.g.node(*u).op.is_view() {
                view = true;
            }
            for o in self.owners(*u) {
                if !self.w(o).members.contains(&m) {
                    gs.insert(o);
                }
            }
        }
        (gs, view)
    }
    /// Groups that group `gi` reads from (through views too).
    pub(super) fn preds(&self, gi: usize) -> BTreeSet<usize> {
        let w = self.w(gi);
        let mut out = BTreeSet::new();
        for m in &w.members {
            for i in &self.g.node(*m).inputs {
                let b = base_of(self.g, *i);
                if w.members.contains(&b) {
                    continue;
                }
                out.extend(self.owners(b));
            }
        }
        out.remove(&gi);
        out
    }
    /// Is there a path from group `a` to group `b` through a group outside `a`, `b`, `skip`?
    pub(super) fn indirect_path(&self, a: usize, b: usize, skip: &[usize]) -> bool {
        let mut stack: Vec<usize> =
            self.preds(b).into_iter().filter(|p| *p != a && !skip.contains(p)).collect();
        let mut seen = BTreeSet::new();
        while let Some(x) = stack.pop() {
            if x == a {
                return true;
            }
            if !seen.insert(x) {
                continue;
            }
            stack.extend(self.preds(x));
        }
        false
    }
    pub(super) fn has_reduce(&self, w: &WGroup) -> bool {
        w.members.iter().any(|m| matches!(self.g.node(*m).op, Op::Reduce { .. }))
    }
    pub(super) fn ancestors_in(&self, w: &WGroup, of: NodeId) -> BTreeSet<NodeId> {
        let mut out = BTreeSet::new();
        let mut stack = vec![of];
        while let Some(x) = stack.pop() {
            for i in &self.g.node(x).inputs {
                if w.members.contains(i) && out.insert(*i) {
                    stack.push(*i);
                }
            }
        }
        out
    }
    /// The smallest benefit worth a merge: 0.5 us (the anchors' typical merge threshold), less on targets whose
    /// launches cost less than 5 us.
    pub(super) fn margin_floor(&self) -> f64 {
        f64::min(0.5, 0.1 * self.target.launch_us)
    }
    pub(super) fn rule_on(&self, r: Rule) -> Result<(), (Reason, String)> {
        if r.min_opt_level() > self.opt_level {
            return Err((
                Reason::OptLevel,
                format!("{} needs opt_level >= {}", r.name(), r.min_opt_level()),
            ));
        }
        if !self.rules.contains(r) {
            return Err((Reason::RuleDisabled, format!("rule {} is not enabled", r.name())));
        }
        Ok(())
    }
    /// Modelled cost of a kernel holding `members` (memoised by members and kind).
    pub(super) fn cost(
        &self,
        members: &BTreeSet<NodeId>,
        kind: GroupKind,
        anchor: Option<NodeId>,
    ) -> CostResult {
        let key = (members.iter().copied().collect::<Vec<_>>(), kind);
        if let Some(c) = self.cache.borrow().get(&key) {
            return c.clone();
        }
        let est = |d: &DimExpr| self.est(d);
        // A group the generators cannot emit is never priced, so never planned.
        let c = crate::kernels::of(kind)
            .check(self.g, members, anchor)
            .map_err(|e| format!("{NOT_GENERATABLE}: {e}"))
            .and_then(|()| {
                crate::cost::kernel_cost(
                    self.g,
                    &self.users,
                    members,
                    kind,
                    anchor,
                    self.target,
                    &est,
                )
            });
        self.cache.borrow_mut().insert(key, c.clone());
        c
    }
    pub(super) fn group_cost(&self, i: usize) -> CostResult {
        let w = self.w(i);
        self.cost(&w.members, w.kind, w.anchor)
    }
    /// Classify and check a merge of producer group `a` into consumer group `b`: the generic
    /// checks, then the rule whose kind of merge it is (`FusionRule::claims`) and its legality,
    /// then whether the rule is on, cycles and the size backstops. On success the rule and the
    /// merged group's kind and anchor.
    fn check_pair(&self, a: usize, b: usize) -> PairCheck {
        let (wa, wb) = (self.w(a), self.w(b));
        let claimed = rules::PIPELINE.iter().find(|r| r.claims(self, a, b));
        // A layout store reads the producer through a view, and an epilogue may read a
        // product through a natural split of it (its rule checks which views).
        let through_views =
            claimed.is_some_and(|r| matches!(r.rule(), Rule::LayoutStore | Rule::LinearEpilogue));
        for m in wb.members.iter().filter(|_| !through_views) {
            for i in &self.g.node(*m).inputs {
                if self.g.node(*i).op.is_view() && wa.members.contains(&base_of(self.g, *i)) {
                    return Err((
                        None,
                        Reason::ViewBoundary,
                        format!("{m} reads {} through a view", base_of(self.g, *i)),
                    ));
                }
            }
        }
        let Some(r) = claimed else {
            return Err(self.unclaimed(a, b));
        };
        let rule = r.rule();
        let (kind, anchor) = r.check_pair(self, a, b).map_err(|(re, d)| (Some(rule), re, d))?;
        self.rule_on(rule).map_err(|(re, d)| (Some(rule), re, d))?;
        if self.indirect_path(a, b, &[]) {
            return Err((
                Some(rule),
                Reason::Cycle,
                "another kernel lies on a path between them".into(),
            ));
        }
        let both: BTreeSet<NodeId> = wa.members.union(&wb.members).copied().collect();
        self.backstops(&both).map_err(|(re, d)| (Some(rule), re, d))?;
        Ok((rule, kind, anchor))
    }

    /// Why no rule merges `a` into `b`: an opaque kernel on either side, or two matmuls.
    fn unclaimed(&self, a: usize, b: usize) -> (Option<Rule>, Reason, String) {
        let opaque = |i: usize| {
            matches!(
                self.w(i).kind,
                GroupKind::Concat
                    | GroupKind::FlashAttention
                    | GroupKind::Horizontal
                    | GroupKind::CacheWrite
            )
        };
        if opaque(a) || opaque(b) {
            (
                None,
                Reason::Opaque,
                "concat, flash-attention and horizontal kernels take no further ops".into(),
            )
        } else {
            (None, Reason::TwoAnchors, "a kernel holds one matmul".into())
        }
    }

    pub(super) fn backstops(&self, members: &BTreeSet<NodeId>) -> Result<(), (Reason, String)> {
        if members.len() > MAX_GROUP_NODES {
            return Err((
                Reason::GroupTooLarge,
                format!("{} ops > {MAX_GROUP_NODES}", members.len()),
            ));
        }
        let mut ins = BTreeSet::new();
        for m in members {
            for i in &self.g.node(*m).inputs {
                let b = base_of(self.g, *i);
                if !members.contains(&b) && !matches!(self.g.node(b).op, Op::Const { .. }) {
                    ins.insert(b);
                }
            }
        }
        let outs = members
            .iter()
            .filter(|m| {
                self.is_output[m.idx()]
                    || (self.users[m.idx()].iter().any(|u| !members.contains(u))
                        && crate::group::layout_store(self.g, &self.users, **m, members).is_none())
            })
            .count();
        if ins.len() + outs > MAX_KERNEL_BUFFERS {
            return Err((
                Reason::GroupTooLarge,
                format!("{} kernel buffers > {MAX_KERNEL_BUFFERS}", ins.len() + outs),
            ));
        }
        Ok(())
    }
    pub(super) fn members(&self, i: usize) -> Vec<NodeId> {
        self.w(i).members.iter().copied().collect()
    }
    pub(super) fn rejected(
        &self,
        rule: Option<Rule>,
        a: usize,
        bs: &[usize],
        reason: Reason,
        detail: String,
    ) -> Candidate {
        Candidate {
            rule,
            producer: self.members(a),
            consumers: bs.iter().map(|b| self.members(*b)).collect(),
            parts_us: 0.0,
            fused_us: 0.0,
            benefit_us: 0.0,
            margin_us: 0.0,
            bytes_saved: 0,
            bytes_saved_us: 0.0,
            launches_saved: 0,
            launches_saved_us: 0.0,
            tiling_loss_us: 0.0,
            recompute_us: 0.0,
            onchip: Vec::new(),
            tiling: None,
            decision: Decision::Rejected { reason, detail },
        }
    }
    /// Score a move of group `a` into the groups `bs` (one for a plain merge; several when `a`
    /// is duplicated into each), the fused groups having `kind`/`anchor` per consumer.
    pub(super) fn score(
        &self,
        rule: Rule,
        a: usize,
        bs: &[usize],
        fused: &[(BTreeSet<NodeId>, GroupKind, Option<NodeId>)],
    ) -> Candidate {
        let mut parts = vec![self.group_cost(a)];
        parts.extend(bs.iter().map(|b| self.group_cost(*b)));
        let parts: Vec<KernelCost> = match parts.into_iter().collect::<Result<_, _>>() {
            Ok(p) => p,
            Err(e) => {
                return self.rejected(
                    Some(rule),
                    a,
                    bs,
                    cost_reason(&e),
                    format!("a part has no feasible tiling: {e}"),
                )
            }
        };
        let mut fk = Vec::new();
        for (m, k, an) in fused {
            match self.cost(m, *k, *an) {
                Ok(c) => fk.push(c),
                Err(e) => {
                    return self.rejected(Some(rule), a, bs, cost_reason(&e), format!("fused: {e}"))
                }
            }
        }
        let parts_us: f64 = parts.iter().map(|c| c.time_us).sum();
        let fused_us: f64 = fk.iter().map(|c| c.time_us).sum();
        let bytes_saved =
            parts.iter().map(|c| c.bytes).sum::<f64>() - fk.iter().map(|c| c.bytes).sum::<f64>();
        let launches_saved = (parts.len() - fk.len()) as i64;
        let comp_parts: f64 = parts.iter().map(|c| c.compute_us).sum();
        let comp_fused: f64 = fk.iter().map(|c| c.compute_us).sum();
        let tiling_loss_us: f64 =
            fk.iter().map(|c| c.time_us - c.launch_us - c.unconstrained_exec_us).sum();
        let benefit_us = parts_us - fused_us;
        // Model error scales with the time the merge changes, not with compute both sides keep.
        // The floor shrinks for parts that launch cheaply (inline calls on the host).
        let cheapest = parts.iter().map(|c| c.launch_us).fold(f64::INFINITY, f64::min);
        let floor = self.margin_floor().min(0.5 * cheapest);
        let recompute_us = (comp_fused - comp_parts).max(0.0);
        // No risk to hedge when the fused kernel repeats no work and loses nothing to tiling:
        // then the benefit is the saved traffic and launches, and the floor suffices.
        let safe = recompute_us < 1e-9 && tiling_loss_us < 1e-9;
        let margin_us = if safe {
            floor
        } else {
            f64::max(floor, 0.03 * (parts_us - comp_parts.min(comp_fused)))
        };
        let onchip = fk.first().map(|c| c.onchip.clone()).unwrap_or_default();
        let decision = if benefit_us > margin_us {
            Decision::Accepted { step: 0 }
        } else {
            Decision::Rejected {
                reason: Reason::NotProfitable,
                detail: format!("benefit {benefit_us:.2} us <= margin {margin_us:.2} us"),
            }
        };
        Candidate {
            rule: Some(rule),
            producer: self.members(a),
            consumers: bs.iter().map(|b| self.members(*b)).collect(),
            parts_us,
            fused_us,
            benefit_us,
            margin_us,
            bytes_saved: bytes_saved.round() as i64,
            bytes_saved_us: bytes_saved / self.target.bandwidth_bytes_per_us,
            launches_saved,
            launches_saved_us: parts.iter().map(|c| c.launch_us).sum::<f64>()
                - fk.iter().map(|c| c.launch_us).sum::<f64>(),
            tiling_loss_us,
            recompute_us,
            onchip,
            tiling: fk.first().map(|c| c.tiling.clone()),
            decision,
        }
    }
    pub(super) fn eval_pair(&self, a: usize, b: usize) -> Candidate {
        match self.check_pair(a, b) {
            Err((rule, reason, detail)) => self.rejected(rule, a, &[b], reason, detail),
            Ok((rule, kind, anchor)) => {
                let m: BTreeSet<NodeId> =
                    self.w(a).members.union(&self.w(b).members).copied().collect();
                self.score(rule, a, &[b], &[(m, kind, anchor)])
            }
        }
    }
    /// Every move on the current grouping, evaluated: producer-consumer pairs, then the moves
    /// each rule proposes, in pipeline order.
    pub(super) fn moves(&self) -> Vec<(Candidate, Move)> {
        let live: Vec<usize> =
            (0..self.groups.len()).filter(|i| self.groups[*i].is_some()).collect();
        let mut out = Vec::new();
        for &b in &live {
            for a in self.preds(b) {
                out.push((self.eval_pair(a, b), self.mv(a, &[b], None)));
            }
        }
        for r in rules::PIPELINE {
            out.extend(r.moves(self));
        }
        out
    }
    pub(super) fn mv(&self, a: usize, bs: &[usize], by: Option<Rule>) -> Move {
        let mut versions = vec![self.w(a).version];
        versions.extend(bs.iter().map(|b| self.w(*b).version));
        Move { a, bs: bs.to_vec(), versions, by }
    }
    pub(super) fn current(&self, m: &Move) -> bool {
        std::iter::once(m.a)
            .chain(m.bs.iter().copied())
            .zip(&m.versions)
            .all(|(i, v)| self.groups[i].as_ref().is_some_and(|w| w.version == *v))
    }
    pub(super) fn rescore(&self, m: &Move) -> Option<Candidate> {
        if self.groups[m.a].is_none() || m.bs.iter().any(|b| self.groups[*b].is_none()) {
            return None;
        }
        match m.by {
            Some(r) => rules::get(r).rescore(self, m),
            None => self.preds(m.bs[0]).contains(&m.a).then(|| self.eval_pair(m.a, m.bs[0])),
        }
    }

    /// Carry out an accepted move: the rule that proposed it applies it, a pair merges the
    /// producer into its consumer.
    pub(super) fn apply(&mut self, rule: Rule, m: &Move) {
        match m.by {
            Some(r) => rules::get(r).apply(self, rule, m),
            None => {
                // The merged group is the kernel the rule checked and the cost model priced.
                let checked = self.check_pair(m.a, m.bs[0]).ok();
                self.merge_into(rule, m);
                if let Some((_, kind, anchor)) = checked {
                    let wb = self.groups[m.bs[0]].as_mut().unwrap();
                    wb.kind = kind;
                    wb.anchor = anchor;
                }
            }
        }
    }

    /// Merge producer group `m.a` into each consumer group of `m.bs` (duplicated when several);
    /// a matmul producer makes the consumer a matmul kernel with its anchor.
    pub(super) fn merge_into(&mut self, rule: Rule, m: &Move) {
        let wa = self.groups[m.a].take().unwrap();
        for &b in &m.bs {
            let wb = self.groups[b].as_mut().unwrap();
            wb.members.extend(wa.members.iter().copied());
            wb.rules.extend(wa.rules.iter().copied());
            wb.rules.insert(rule);
            // The producer's kind wins over an elementwise consumer (an epilogue, a layout
            // store's copy).
            if matches!(wa.kind, GroupKind::MatMul | GroupKind::FlashAttention) {
                wb.kind = wa.kind;
                wb.anchor = wa.anchor;
            }
            wb.version += 1;
        }
    }

    /// The number the next accepted step gets in the log.
    pub(super) fn next_step(log: &[Candidate]) -> usize {
        log.iter().filter(|c| matches!(c.decision, Decision::Accepted { .. })).count() + 1
    }

    /// Local repair: drop a boundary op out of a fused elementwise group when the model says
    /// the group is faster without it (undoes order effects of greedy merging).
    pub(super) fn repair(&mut self, log: &mut Vec<Candidate>) {
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..self.groups.len() {
                let Some(w) = self.groups[i].clone() else { continue };
                if w.kind != GroupKind::Elementwise || w.members.len() < 2 {
                    continue;
                }
                let Ok(whole) = self.group_cost(i) else { continue };
                for &m in &w.members {
                    let internal_users = self.users[m.idx()].iter().any(|u| w.members.contains(u));
                    let internal_inputs =
                        self.g.node(m).inputs.iter().any(|x| w.members.contains(x));
                    if internal_users && internal_inputs {
                        continue; // not on the boundary: removing it could form a cycle
                    }
                    let rest: BTreeSet<NodeId> =
                        w.members.iter().copied().filter(|x| *x != m).collect();
                    if space_of(self.g, &rest.iter().copied().collect::<Vec<_>>()).is_none() {
                        continue;
                    }
                    let single: BTreeSet<NodeId> = [m].into_iter().collect();
                    let (Ok(cr), Ok(cs)) = (
                        self.cost(&rest, GroupKind::Elementwise, None),
                        self.cost(&single, GroupKind::Elementwise, None),
                    ) else {
                        continue;
                    };
                    let split = cr.time_us + cs.time_us;
                    let margin = f64::max(self.margin_floor(), 0.03 * split);
                    if whole.time_us - split > margin {
                        let step = log
                            .iter()
                            .filter(|c| matches!(c.decision, Decision::Accepted { .. }))
                            .count()
                            + 1;
                        let mut c =
                            self.rejected(None, i, &[], Reason::NotProfitable, String::new());
                        c.producer = vec![m];
                        c.consumers = vec![rest.iter().copied().collect()];
                        c.parts_us = whole.time_us;
                        c.fused_us = split;
                        c.benefit_us = whole.time_us - split;
                        c.margin_us = margin;
                        c.decision = Decision::Accepted { step };
                        log.push(c);
                        let wr = self.groups[i].as_mut().unwrap();
                        wr.members = rest;
                        wr.version += 1;
                        self.groups.push(Some(WGroup {
                            kind: GroupKind::Elementwise,
                            members: single,
                            anchor: None,
                            rules: BTreeSet::new(),
                            version: 0,
                        }));
                        changed = true;
                        break;
                    }
                }
            }
        }
    }
}
