//! The fusion planner (first version): named rules propose producer-consumer merges, legality
//! rejects what cannot be one kernel (each with a reason code), a simple benefit estimate in
//! microseconds ranks the rest, and merges are applied greedily, best first, deterministically.

use crate::dim::{numel, DimExpr, Shape};
use crate::ir::{Graph, NodeId, Op};
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    ElementwiseChain,
    ReduceEpilogue,
    AddNorm,
    LinearEpilogue,
    NormLinearPrologue,
    FlashAttention,
    QkvHorizontal,
    Pipeline,
}

impl Rule {
    pub const ALL: [Rule; 8] = [
        Rule::ElementwiseChain,
        Rule::ReduceEpilogue,
        Rule::AddNorm,
        Rule::LinearEpilogue,
        Rule::NormLinearPrologue,
        Rule::FlashAttention,
        Rule::QkvHorizontal,
        Rule::Pipeline,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Rule::ElementwiseChain => "elementwise_chain",
            Rule::ReduceEpilogue => "reduce_epilogue",
            Rule::AddNorm => "add_norm",
            Rule::LinearEpilogue => "linear_epilogue",
            Rule::NormLinearPrologue => "norm_linear_prologue",
            Rule::FlashAttention => "flash_attention",
            Rule::QkvHorizontal => "qkv_horizontal",
            Rule::Pipeline => "pipeline",
        }
    }
    pub fn parse(s: &str) -> Option<Rule> {
        Rule::ALL.iter().copied().find(|r| r.name() == s)
    }
    /// The lowest `opt_level` at which the rule runs.
    pub fn min_opt_level(self) -> u8 {
        match self {
            Rule::ElementwiseChain | Rule::ReduceEpilogue | Rule::AddNorm => 1,
            Rule::LinearEpilogue | Rule::NormLinearPrologue => 2,
            Rule::FlashAttention | Rule::QkvHorizontal | Rule::Pipeline => 3,
        }
    }
    /// Rules this version of the planner forms groups for. The others are accepted by name (so
    /// option lists stay valid) and reported as not implemented yet.
    pub fn implemented(self) -> bool {
        self.min_opt_level() <= 2
    }
}

/// A set of rules. `all` holds every rule that is on by default (`qkv_horizontal` is opt-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSet(pub u32);

impl RuleSet {
    pub fn all() -> RuleSet {
        let mut s = RuleSet::none();
        for r in Rule::ALL {
            if r != Rule::QkvHorizontal {
                s.insert(r);
            }
        }
        s
    }
    pub fn none() -> RuleSet {
        RuleSet(0)
    }
    pub fn insert(&mut self, r: Rule) {
        self.0 |= 1 << r as u32;
    }
    pub fn contains(self, r: Rule) -> bool {
        self.0 & (1 << r as u32) != 0
    }
    pub fn names(self) -> Vec<&'static str> {
        Rule::ALL.iter().filter(|r| self.contains(**r)).map(|r| r.name()).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// Row-wise loop over an iteration space: elementwise ops and last-axis reductions.
    Elementwise,
    /// One matmul with an elementwise prologue on its A operand and an elementwise epilogue.
    MatMul,
    /// A concatenation (copy kernel).
    Concat,
}

/// A kernel of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub kind: GroupKind,
    /// Members in topological order.
    pub nodes: Vec<NodeId>,
    pub anchor: Option<NodeId>,
    /// Rules whose merges formed the group.
    pub rules: Vec<Rule>,
    /// Members whose values leave the kernel (written to memory).
    pub outputs: Vec<NodeId>,
    /// Materialised values the kernel reads (parameters or other kernels' outputs).
    pub inputs: Vec<NodeId>,
}

/// Why a candidate merge was not taken. `code()` is the stable reason code of reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    RuleDisabled,
    OptLevel,
    Cycle,
    TwoAnchors,
    SpaceMismatch,
    ViewBoundary,
    ReductionNotAllowed,
    OtherUsers,
    NotAnOperand,
    Capacity,
    GroupTooLarge,
    NotProfitable,
    Opaque,
}

impl Reason {
    pub fn code(&self) -> &'static str {
        match self {
            Reason::RuleDisabled => "rule_disabled",
            Reason::OptLevel => "opt_level",
            Reason::Cycle => "cycle",
            Reason::TwoAnchors => "two_anchors",
            Reason::SpaceMismatch => "space_mismatch",
            Reason::ViewBoundary => "view_boundary",
            Reason::ReductionNotAllowed => "reduction_not_allowed",
            Reason::OtherUsers => "other_users",
            Reason::NotAnOperand => "not_a_operand",
            Reason::Capacity => "capacity",
            Reason::GroupTooLarge => "group_too_large",
            Reason::NotProfitable => "not_profitable",
            Reason::Opaque => "opaque",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Accepted { step: usize },
    Rejected { reason: Reason, detail: String },
}

/// One scored merge: the producer group(s) into the consumer group(s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub rule: Option<Rule>,
    pub producer: Vec<NodeId>,
    /// Consumer groups (more than one when the producer is duplicated into each).
    pub consumers: Vec<Vec<NodeId>>,
    pub bytes_saved: i64,
    pub launches_saved: i64,
    /// Extra bytes read because a producer is recomputed in several consumers.
    pub recompute_bytes: i64,
    pub benefit_us: f64,
    /// Planned on-chip bytes of the fused kernel per block.
    pub onchip_bytes: u64,
    pub decision: Decision,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub opt_level: u8,
    pub rules: Vec<String>,
    pub target: Target,
    /// Values assumed for dynamic dims when estimating (the runtime re-tiles for real shapes).
    pub hints: Vec<(String, i64)>,
    pub groups: Vec<Group>,
    pub candidates: Vec<Candidate>,
    /// Sum of the benefits of accepted merges (estimate).
    pub benefit_us: f64,
    pub bytes_saved: i64,
    pub launches_saved: i64,
}

/// The first node that is not a view, following reshape/transpose/slice inputs.
pub fn base_of(g: &Graph, mut id: NodeId) -> NodeId {
    while g.node(id).op.is_view() {
        id = g.node(id).inputs[0];
    }
    id
}

/// The shape a member iterates over (a reduction iterates over its input).
pub fn iter_shape(g: &Graph, id: NodeId) -> Shape {
    let n = g.node(id);
    let s = match n.op {
        Op::Reduce { .. } => g.node(n.inputs[0]).shape.clone(),
        _ => n.shape.clone(),
    };
    if s.is_empty() {
        vec![DimExpr::constant(1)]
    } else {
        s
    }
}

fn row_of(s: &Shape) -> Shape {
    let mut r = s.clone();
    *r.last_mut().unwrap() = DimExpr::constant(1);
    r
}

/// The iteration space of an elementwise group, if all members agree on one.
pub fn space_of(g: &Graph, members: &[NodeId]) -> Option<Shape> {
    let shapes: Vec<Shape> = members.iter().map(|m| iter_shape(g, *m)).collect();
    let full = shapes.iter().find(|s| *s != &row_of(s)).cloned().unwrap_or_else(|| shapes[0].clone());
    shapes.iter().all(|s| *s == full || *s == row_of(&full)).then_some(full)
}

const MAX_GROUP_NODES: usize = 32;
const MAX_KERNEL_BUFFERS: usize = 24;
const MARGIN_US: f64 = 0.5;

struct WGroup {
    kind: GroupKind,
    members: BTreeSet<NodeId>,
    anchor: Option<NodeId>,
    rules: BTreeSet<Rule>,
}

struct Planner<'a> {
    g: &'a Graph,
    target: &'a Target,
    opt_level: u8,
    rules: RuleSet,
    hints: Vec<(String, i64)>,
    users: Vec<Vec<NodeId>>,
    groups: Vec<Option<WGroup>>,
    is_output: Vec<bool>,
}

fn is_member_op(op: &Op) -> bool {
    !matches!(op, Op::Param { .. } | Op::Const { .. }) && !op.is_view()
}

impl<'a> Planner<'a> {
    fn est(&self, d: &DimExpr) -> i64 {
        d.estimate(&|s| self.hints.iter().find(|(n, _)| n == s).map(|(_, v)| *v).unwrap_or(128))
    }
    fn bytes(&self, id: NodeId) -> i64 {
        let n = self.g.node(id);
        self.est(&numel(&n.shape)) * n.dtype.size() as i64
    }
    fn owners(&self, id: NodeId) -> Vec<usize> {
        (0..self.groups.len()).filter(|&i| self.groups[i].as_ref().is_some_and(|w| w.members.contains(&id))).collect()
    }
    /// Groups that read `m` from memory (they hold a user of `m` but not `m` itself), and
    /// whether some user reads it through a view.
    fn readers(&self, m: NodeId) -> (BTreeSet<usize>, bool) {
        let mut gs = BTreeSet::new();
        let mut view = false;
        for u in &self.users[m.idx()] {
            if self.g.node(*u).op.is_view() {
                view = true;
            }
            for o in self.owners(*u) {
                if !self.groups[o].as_ref().unwrap().members.contains(&m) {
                    gs.insert(o);
                }
            }
        }
        (gs, view)
    }
    /// Groups that group `gi` reads from (through views too).
    fn preds(&self, gi: usize) -> BTreeSet<usize> {
        let w = self.groups[gi].as_ref().unwrap();
        let mut out = BTreeSet::new();
        for m in &w.members {
            for i in &self.g.node(*m).inputs {
                let b = base_of(self.g, *i);
                if w.members.contains(&b) {
                    continue;
                }
                for o in self.owners(b) {
                    out.insert(o);
                }
            }
        }
        out
    }
    /// Is there a path from group `a` to group `b` through some other group?
    fn indirect_path(&self, a: usize, b: usize, skip: &[usize]) -> bool {
        // DFS backwards from b over predecessors, not stepping through a directly.
        let mut stack: Vec<usize> = self.preds(b).into_iter().filter(|p| *p != a && !skip.contains(p)).collect();
        let mut seen = BTreeSet::new();
        while let Some(x) = stack.pop() {
            if x == a {
                return true;
            }
            if !seen.insert(x) {
                continue;
            }
            for p in self.preds(x) {
                if !skip.contains(&p) || p == a {
                    stack.push(p);
                }
            }
        }
        false
    }
    fn has_reduce(&self, w: &WGroup) -> bool {
        w.members.iter().any(|m| matches!(self.g.node(*m).op, Op::Reduce { .. }))
    }
    /// Members of `w` used outside `inside` (or graph outputs, or read through a view).
    fn escapes(&self, w: &WGroup, inside: &BTreeSet<NodeId>) -> Vec<NodeId> {
        w.members
            .iter()
            .copied()
            .filter(|m| self.is_output[m.idx()] || self.users[m.idx()].iter().any(|u| !inside.contains(u) || self.g.node(*u).op.is_view()))
            .collect()
    }
    fn ancestors_in(&self, w: &WGroup, of: NodeId) -> BTreeSet<NodeId> {
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
    fn rule_on(&self, r: Rule) -> Result<(), (Reason, String)> {
        if r.min_opt_level() > self.opt_level {
            return Err((Reason::OptLevel, format!("{} needs opt_level >= {}", r.name(), r.min_opt_level())));
        }
        if !self.rules.contains(r) {
            return Err((Reason::RuleDisabled, format!("rule {} is not enabled", r.name())));
        }
        Ok(())
    }
    fn full_width_members(&self, members: &BTreeSet<NodeId>, space: &Shape) -> usize {
        members.iter().filter(|m| self.g.node(**m).shape == *space).count()
    }

    /// Classify and check a merge of producer group `a` into consumer group `b`.
    fn check_pair(&self, a: usize, b: usize) -> Result<(Rule, u64), (Option<Rule>, Reason, String)> {
        let (wa, wb) = (self.groups[a].as_ref().unwrap(), self.groups[b].as_ref().unwrap());
        let both: BTreeSet<NodeId> = wa.members.union(&wb.members).copied().collect();
        // Reads of a producer member through a view cannot be fused (different index space).
        for m in &wb.members {
            for i in &self.g.node(*m).inputs {
                if self.g.node(*i).op.is_view() && wa.members.contains(&base_of(self.g, *i)) {
                    return Err((None, Reason::ViewBoundary, format!("{m} reads {} through a view", base_of(self.g, *i))));
                }
            }
        }
        let (rule, kind_ok): (Rule, Result<u64, (Reason, String)>) = match (wa.kind, wb.kind) {
            (GroupKind::Concat, _) | (_, GroupKind::Concat) => {
                return Err((None, Reason::Opaque, "concat kernels are not fused".into()));
            }
            (GroupKind::MatMul, GroupKind::MatMul) => {
                return Err((None, Reason::TwoAnchors, "a kernel holds one matmul".into()));
            }
            (GroupKind::Elementwise, GroupKind::Elementwise) => {
                let ra = self.has_reduce(wa);
                let rb = self.has_reduce(wb);
                let rule = if !ra && !rb {
                    Rule::ElementwiseChain
                } else if !ra
                    && rb
                    && wa.members.iter().any(|m| {
                        matches!(self.g.node(*m).op, Op::Binary(crate::ir::BinaryOp::Add))
                            && self.escapes(wa, &wb.members).contains(m)
                    })
                {
                    Rule::AddNorm
                } else {
                    Rule::ReduceEpilogue
                };
                let members: Vec<NodeId> = both.iter().copied().collect();
                let res = match space_of(self.g, &members) {
                    None => Err((Reason::SpaceMismatch, "members iterate over different shapes".into())),
                    Some(space) => {
                        let n = self.est(space.last().unwrap()).max(1) as u64;
                        let bufs = self.full_width_members(&both, &space) as u64 + 2;
                        Ok(bufs * n * 4)
                    }
                };
                (rule, res)
            }
            (GroupKind::MatMul, GroupKind::Elementwise) => {
                let anchor = wa.anchor.unwrap();
                let out = &self.g.node(anchor).shape;
                let res = if self.has_reduce(wb) {
                    Err((Reason::ReductionNotAllowed, "an epilogue holds no reduction".into()))
                } else if wb.members.iter().any(|m| self.g.node(*m).shape != *out) {
                    Err((Reason::SpaceMismatch, "epilogue ops must have the matmul's output shape".into()))
                } else {
                    Ok(self.matmul_onchip())
                };
                (Rule::LinearEpilogue, res)
            }
            (GroupKind::Elementwise, GroupKind::MatMul) => {
                let res = self.check_prologue(wa, wb);
                (Rule::NormLinearPrologue, res)
            }
        };
        let onchip = kind_ok.map_err(|(r, d)| (Some(rule), r, d))?;
        self.rule_on(rule).map_err(|(r, d)| (Some(rule), r, d))?;
        if self.indirect_path(a, b, &[]) {
            return Err((Some(rule), Reason::Cycle, "another kernel lies on a path between them".into()));
        }
        self.common_checks(&both, onchip).map_err(|(r, d)| (Some(rule), r, d))?;
        Ok((rule, onchip))
    }

    fn matmul_onchip(&self) -> u64 {
        // The matmul template's blocking (64 x 256 x 256 floats) stays the same when fused.
        (64 * 256 + 256 * 256 + 64 * 256) * 4
    }

    fn check_prologue(&self, wa: &WGroup, wb: &WGroup) -> Result<u64, (Reason, String)> {
        let anchor = wb.anchor.unwrap();
        if self.has_reduce(wa) {
            return Err((Reason::ReductionNotAllowed, "a prologue holds no reduction (statistics stay upstream)".into()));
        }
        let a_op = self.g.node(anchor).inputs[0];
        let a_shape = &self.g.node(a_op).shape;
        if wa.members.iter().any(|m| self.g.node(*m).shape != *a_shape) {
            return Err((Reason::SpaceMismatch, "prologue ops must have the A operand's shape".into()));
        }
        let prologue = self.ancestors_in(wb, anchor);
        let b_idx = self.groups.iter().position(|w| w.as_ref().is_some_and(|w| std::ptr::eq(w, wb))).unwrap();
        let a_idx = self.groups.iter().position(|w| w.as_ref().is_some_and(|w| std::ptr::eq(w, wa))).unwrap();
        for m in &wa.members {
            if self.is_output[m.idx()] {
                return Err((Reason::OtherUsers, format!("{m} is a graph output")));
            }
            let (rd, view) = self.readers(*m);
            if view || rd.iter().any(|g| *g != b_idx && *g != a_idx) {
                return Err((Reason::OtherUsers, format!("{m} is also read by another kernel")));
            }
            for u in &self.users[m.idx()] {
                let ok = wa.members.contains(u) || prologue.contains(u) || (*u == anchor && self.g.node(anchor).inputs[1] != *m);
                if !ok {
                    let reason = if wb.members.contains(u) { Reason::NotAnOperand } else { Reason::OtherUsers };
                    return Err((reason, format!("{m} is also used by {u}")));
                }
            }
        }
        Ok(self.matmul_onchip())
    }

    fn common_checks(&self, members: &BTreeSet<NodeId>, onchip: u64) -> Result<(), (Reason, String)> {
        if members.len() > MAX_GROUP_NODES {
            return Err((Reason::GroupTooLarge, format!("{} ops > {MAX_GROUP_NODES}", members.len())));
        }
        let bufs = self.buffers(members);
        if bufs > MAX_KERNEL_BUFFERS {
            return Err((Reason::GroupTooLarge, format!("{bufs} kernel buffers > {MAX_KERNEL_BUFFERS}")));
        }
        let cap = (self.target.onchip_bytes as f64 * self.target.onchip_fraction) as u64;
        if onchip > cap {
            return Err((Reason::Capacity, format!("{onchip} B on chip > {cap} B (0.8 x capacity)")));
        }
        Ok(())
    }

    /// Kernel buffer arguments of a would-be group: external inputs plus written members.
    fn buffers(&self, members: &BTreeSet<NodeId>) -> usize {
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
            .filter(|m| self.is_output[m.idx()] || self.users[m.idx()].iter().any(|u| !members.contains(u) || self.g.node(*u).op.is_view()))
            .count();
        ins.len() + outs
    }

    /// Bytes no longer moved when `a` fuses into `b`.
    fn bytes_saved(&self, a: &WGroup, b: &WGroup) -> i64 {
        let both: BTreeSet<NodeId> = a.members.union(&b.members).copied().collect();
        let mut saved = 0;
        for m in &a.members {
            let read_by_b = self.users[m.idx()].iter().any(|u| b.members.contains(u));
            if !read_by_b {
                continue;
            }
            saved += self.bytes(*m); // b no longer reads it
            let stays = self.is_output[m.idx()]
                || self.users[m.idx()].iter().any(|u| !both.contains(u) || self.g.node(*u).op.is_view());
            if !stays {
                saved += self.bytes(*m); // and a no longer writes it
            }
        }
        // Inputs both read are read once.
        let ext = |w: &WGroup| -> BTreeSet<NodeId> {
            w.members
                .iter()
                .flat_map(|m| self.g.node(*m).inputs.iter().map(|i| base_of(self.g, *i)))
                .filter(|i| !a.members.contains(i) && !b.members.contains(i) && !matches!(self.g.node(*i).op, Op::Const { .. }))
                .collect()
        };
        for s in ext(a).intersection(&ext(b)) {
            saved += self.bytes(*s);
        }
        saved
    }

    fn score(&self, bytes: i64, launches: i64) -> f64 {
        bytes as f64 / self.target.bandwidth_bytes_per_us + launches as f64 * self.target.launch_us
    }

    fn evaluate(&self) -> Vec<(Candidate, Vec<usize>, Vec<usize>)> {
        let mut out = Vec::new();
        let live: Vec<usize> = (0..self.groups.len()).filter(|i| self.groups[*i].is_some()).collect();
        let members = |i: usize| self.groups[i].as_ref().unwrap().members.iter().copied().collect::<Vec<_>>();
        for &b in &live {
            for a in self.preds(b) {
                let cand = |rule, bytes, launches, onchip, decision| Candidate {
                    rule,
                    producer: members(a),
                    consumers: vec![members(b)],
                    bytes_saved: bytes,
                    launches_saved: launches,
                    recompute_bytes: 0,
                    benefit_us: self.score(bytes, launches),
                    onchip_bytes: onchip,
                    decision,
                };
                let (wa, wb) = (self.groups[a].as_ref().unwrap(), self.groups[b].as_ref().unwrap());
                let bytes = self.bytes_saved(wa, wb);
                match self.check_pair(a, b) {
                    Ok((rule, onchip)) => {
                        let c = cand(Some(rule), bytes, 1, onchip, Decision::Accepted { step: 0 });
                        let c = if c.benefit_us > MARGIN_US {
                            c
                        } else {
                            let d = format!("{:.2} us <= margin {MARGIN_US} us", c.benefit_us);
                            Candidate { decision: Decision::Rejected { reason: Reason::NotProfitable, detail: d }, ..c }
                        };
                        out.push((c, vec![a], vec![b]));
                    }
                    Err((rule, reason, detail)) => {
                        out.push((cand(rule, bytes, 1, 0, Decision::Rejected { reason, detail }), vec![a], vec![b]));
                    }
                }
            }
        }
        // A prologue used by several matmuls is duplicated into each (it is cheap to recompute).
        for &a in &live {
            let wa = self.groups[a].as_ref().unwrap();
            if wa.kind != GroupKind::Elementwise || self.has_reduce(wa) {
                continue;
            }
            let mut consumers = BTreeSet::new();
            for m in &wa.members {
                for u in &self.users[m.idx()] {
                    if !wa.members.contains(u) {
                        consumers.extend(self.owners(*u));
                    }
                }
            }
            if consumers.len() < 2 {
                continue;
            }
            let cs: Vec<usize> = consumers.iter().copied().collect();
            let all_mm = cs.iter().all(|c| self.groups[*c].as_ref().unwrap().kind == GroupKind::MatMul);
            if !all_mm {
                continue;
            }
            let mut bad = None;
            for &c in &cs {
                if let Err(e) = self.check_prologue_dup(a, c, &cs) {
                    bad = Some(e);
                    break;
                }
            }
            let ext_in: i64 = self.buffers_in(wa).iter().map(|i| self.bytes(*i)).sum();
            let out_bytes: i64 = self.escapes(wa, &wa.members).iter().map(|m| self.bytes(*m)).sum();
            let n = cs.len() as i64;
            let saved = out_bytes * (1 + n);
            let recompute = ext_in * (n - 1);
            let launches = 1;
            let benefit = self.score(saved - recompute, launches);
            let mut c = Candidate {
                rule: Some(Rule::NormLinearPrologue),
                producer: members(a),
                consumers: cs.iter().map(|c| members(*c)).collect(),
                bytes_saved: saved,
                launches_saved: launches,
                recompute_bytes: recompute,
                benefit_us: benefit,
                onchip_bytes: self.matmul_onchip(),
                decision: Decision::Accepted { step: 0 },
            };
            if let Some((reason, detail)) = bad {
                c.decision = Decision::Rejected { reason, detail };
            } else if benefit <= MARGIN_US {
                c.decision = Decision::Rejected { reason: Reason::NotProfitable, detail: format!("{benefit:.2} us <= margin {MARGIN_US} us") };
            }
            out.push((c, vec![a], cs));
        }
        out
    }

    fn buffers_in(&self, w: &WGroup) -> Vec<NodeId> {
        let mut ins = BTreeSet::new();
        for m in &w.members {
            for i in &self.g.node(*m).inputs {
                let b = base_of(self.g, *i);
                if !w.members.contains(&b) && !matches!(self.g.node(b).op, Op::Const { .. }) {
                    ins.insert(b);
                }
            }
        }
        ins.into_iter().collect()
    }

    fn check_prologue_dup(&self, a: usize, c: usize, all: &[usize]) -> Result<(), (Reason, String)> {
        let (wa, wc) = (self.groups[a].as_ref().unwrap(), self.groups[c].as_ref().unwrap());
        self.rule_on(Rule::NormLinearPrologue)?;
        for m in &wc.members {
            for i in &self.g.node(*m).inputs {
                if self.g.node(*i).op.is_view() && wa.members.contains(&base_of(self.g, *i)) {
                    return Err((Reason::ViewBoundary, format!("{m} reads {} through a view", base_of(self.g, *i))));
                }
            }
        }
        // Users in the other consumers are fine: each gets its own copy.
        let others: BTreeSet<NodeId> = all
            .iter()
            .filter(|x| **x != c)
            .flat_map(|x| self.groups[*x].as_ref().unwrap().members.iter().copied())
            .collect();
        let anchor = wc.anchor.unwrap();
        let prologue = self.ancestors_in(wc, anchor);
        let a_shape = &self.g.node(self.g.node(anchor).inputs[0]).shape;
        for m in &wa.members {
            if self.g.node(*m).shape != *a_shape {
                return Err((Reason::SpaceMismatch, "prologue ops must have the A operand's shape".into()));
            }
            if self.is_output[m.idx()] {
                return Err((Reason::OtherUsers, format!("{m} is a graph output")));
            }
            let (rd, view) = self.readers(*m);
            if view || rd.iter().any(|g| *g != a && !all.contains(g)) {
                return Err((Reason::OtherUsers, format!("{m} is also read by another kernel")));
            }
            for u in &self.users[m.idx()] {
                let ok = wa.members.contains(u)
                    || others.contains(u)
                    || prologue.contains(u)
                    || (*u == anchor && self.g.node(anchor).inputs[1] != *m);
                if !ok {
                    return Err((Reason::OtherUsers, format!("{m} is also used by {u}")));
                }
            }
        }
        if self.indirect_path(a, c, all) {
            return Err((Reason::Cycle, "another kernel lies on a path between them".into()));
        }
        let both: BTreeSet<NodeId> = wa.members.union(&wc.members).copied().collect();
        self.common_checks(&both, self.matmul_onchip())
    }

    fn apply(&mut self, rule: Rule, a: &[usize], bs: &[usize]) {
        let wa = self.groups[a[0]].take().unwrap();
        for &b in bs {
            let wb = self.groups[b].as_mut().unwrap();
            wb.members.extend(wa.members.iter().copied());
            wb.rules.extend(wa.rules.iter().copied());
            wb.rules.insert(rule);
            if wa.kind == GroupKind::MatMul {
                wb.kind = GroupKind::MatMul;
                wb.anchor = wa.anchor;
            }
        }
    }
}

/// Plan one canonical graph.
pub fn plan(g: &Graph, opt_level: u8, rules: RuleSet, hints: &[(String, i64)], target: &Target) -> Plan {
    let mut is_output = vec![false; g.nodes.len()];
    for o in &g.outputs {
        is_output[o.idx()] = true;
    }
    let mut p = Planner {
        g,
        target,
        opt_level,
        rules,
        hints: hints.to_vec(),
        users: g.users(),
        groups: Vec::new(),
        is_output,
    };
    for id in g.ids() {
        let op = &g.node(id).op;
        if !is_member_op(op) {
            continue;
        }
        let kind = match op {
            Op::MatMul => GroupKind::MatMul,
            Op::Concat { .. } => GroupKind::Concat,
            _ => GroupKind::Elementwise,
        };
        p.groups.push(Some(WGroup {
            kind,
            members: [id].into_iter().collect(),
            anchor: (kind == GroupKind::MatMul).then_some(id),
            rules: BTreeSet::new(),
        }));
    }
    let mut accepted: Vec<Candidate> = Vec::new();
    let mut last_round = Vec::new();
    if opt_level > 0 {
        loop {
            let cands = p.evaluate();
            let best = cands
                .iter()
                .filter(|(c, _, _)| matches!(c.decision, Decision::Accepted { .. }))
                .max_by(|x, y| {
                    x.0.benefit_us
                        .partial_cmp(&y.0.benefit_us)
                        .unwrap()
                        .then_with(|| y.0.producer.cmp(&x.0.producer))
                        .then_with(|| y.0.consumers.cmp(&x.0.consumers))
                })
                .cloned();
            match best {
                Some((mut c, a, bs)) => {
                    c.decision = Decision::Accepted { step: accepted.len() + 1 };
                    p.apply(c.rule.unwrap(), &a, &bs);
                    accepted.push(c);
                }
                None => {
                    last_round = cands.into_iter().map(|x| x.0).collect();
                    break;
                }
            }
        }
    }
    let groups = finalize(&p);
    let benefit_us = accepted.iter().map(|c| c.benefit_us).sum();
    let bytes_saved = accepted.iter().map(|c| c.bytes_saved - c.recompute_bytes).sum();
    let launches_saved = accepted.iter().map(|c| c.launches_saved).sum();
    let mut candidates = accepted;
    candidates.extend(last_round);
    Plan {
        opt_level,
        rules: rules.names().into_iter().map(String::from).collect(),
        target: target.clone(),
        hints: hints.to_vec(),
        groups,
        candidates,
        benefit_us,
        bytes_saved,
        launches_saved,
    }
}

/// Live groups in a deterministic topological order, with their inputs and outputs.
fn finalize(p: &Planner) -> Vec<Group> {
    let g = p.g;
    let live: Vec<usize> = (0..p.groups.len()).filter(|i| p.groups[*i].is_some()).collect();
    let mut done: BTreeSet<usize> = BTreeSet::new();
    let mut order = Vec::new();
    while order.len() < live.len() {
        // Among ready groups, the one with the smallest first member.
        let next = live
            .iter()
            .copied()
            .filter(|i| !done.contains(i) && p.preds(*i).iter().all(|q| done.contains(q)))
            .min_by_key(|i| *p.groups[*i].as_ref().unwrap().members.iter().next().unwrap())
            .expect("the group graph is acyclic");
        done.insert(next);
        order.push(next);
    }
    let mut out = Vec::new();
    for gi in order {
        let w = p.groups[gi].as_ref().unwrap();
        let nodes: Vec<NodeId> = w.members.iter().copied().collect();
        let mut inputs = BTreeSet::new();
        for m in &nodes {
            for i in &g.node(*m).inputs {
                let b = base_of(g, *i);
                if !w.members.contains(&b) && !matches!(g.node(b).op, Op::Const { .. }) {
                    inputs.insert(b);
                }
            }
        }
        // Written: graph outputs, values read through views, and values other kernels read
        // (a prologue op duplicated into each consumer is recomputed there, not read).
        let outputs: Vec<NodeId> = nodes
            .iter()
            .copied()
            .filter(|m| {
                let (rd, view) = p.readers(*m);
                p.is_output[m.idx()] || view || !rd.is_empty()
            })
            .collect();
        out.push(Group {
            kind: w.kind,
            nodes,
            anchor: w.anchor,
            rules: w.rules.iter().copied().collect(),
            outputs,
            inputs: inputs.into_iter().collect(),
        });
    }
    out
}

/// A one-line description of the ops in a group, for comments and reports.
pub fn describe(g: &Graph, grp: &Group) -> String {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut order = Vec::new();
    for n in &grp.nodes {
        let node = g.node(*n);
        let key = node.name.split('.').next().unwrap_or("").to_string();
        if !by_name.contains_key(&key) {
            order.push(key.clone());
        }
        by_name.entry(key).or_default().push(node.op.name());
    }
    order.iter().map(|k| format!("{k}: {}", by_name[k].join(" "))).collect::<Vec<_>>().join("; ")
}
