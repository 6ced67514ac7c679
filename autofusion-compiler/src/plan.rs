//! The fusion planner (first version): named rules propose producer-consumer merges, legality
//! rejects what cannot be one kernel (each with a reason code), a simple benefit estimate in
//! microseconds ranks the rest, and merges are applied greedily, best first, deterministically.

use crate::cost::KernelCost;
use crate::dim::{DimExpr, Shape};
use crate::ir::{Graph, NodeId, Op};
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

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
        true
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
    pub fn remove(&mut self, r: Rule) {
        self.0 &= !(1 << r as u32);
    }
    pub fn names(self) -> Vec<&'static str> {
        Rule::ALL.iter().filter(|r| self.contains(**r)).map(|r| r.name()).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// Row-wise loop over an iteration space: elementwise ops and last-axis reductions.
    Elementwise,
    /// One matmul with an elementwise prologue on its A operand and an elementwise epilogue.
    MatMul,
    /// A concatenation (copy kernel).
    Concat,
    /// QK^T, scale, mask, softmax and PV as one online-softmax kernel (no S x S tensor).
    FlashAttention,
    /// Sibling matmuls reading the same A operand, launched as one kernel (`qkv_horizontal`).
    Horizontal,
}

/// A kernel of the plan.
#[derive(Clone, Debug, PartialEq)]
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
    /// The modelled cost at the kernel's best feasible tiling (for the planning hints).
    pub cost: Option<crate::cost::KernelCost>,
}

/// Why a candidate merge was not taken. `code()` is the stable reason code of reports.
#[derive(Clone, Debug, PartialEq)]
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

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Accepted { step: usize },
    Rejected { reason: Reason, detail: String },
}

/// One scored merge: the producer group into the consumer group(s). Every time is in us.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub rule: Option<Rule>,
    pub producer: Vec<NodeId>,
    /// Consumer groups (more than one when the producer is duplicated into each).
    pub consumers: Vec<Vec<NodeId>>,
    /// Sum of the parts' modelled times.
    pub parts_us: f64,
    /// The fused kernel's modelled time (0 when it could not be costed).
    pub fused_us: f64,
    /// `parts_us - fused_us`.
    pub benefit_us: f64,
    /// The benefit a merge must beat: max(floor, 3 % of the time the merge changes).
    pub margin_us: f64,
    /// Off-chip bytes no longer moved (net of re-reads and recomputed inputs) and their time.
    pub bytes_saved: i64,
    pub bytes_saved_us: f64,
    pub launches_saved: i64,
    pub launches_saved_us: f64,
    /// Fused execution at its best feasible tiling minus at its best tiling ignoring capacity.
    pub tiling_loss_us: f64,
    /// Extra compute time from work the fused kernel repeats.
    pub recompute_us: f64,
    /// On-chip bytes per core of the fused kernel, per memory.
    pub onchip: Vec<(String, u64)>,
    pub tiling: Option<crate::cost::Tiling>,
    pub decision: Decision,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub opt_level: u8,
    pub rules: Vec<String>,
    pub target: Target,
    /// Values assumed for dynamic dims when estimating (the runtime re-tiles for real shapes).
    pub hints: Vec<(String, i64)>,
    pub groups: Vec<Group>,
    pub candidates: Vec<Candidate>,
    /// Modelled time of the plan and of one kernel per op, us.
    pub total_us: f64,
    pub unfused_us: f64,
    /// Off-chip bytes of the plan and of one kernel per op.
    pub bytes: f64,
    pub unfused_bytes: f64,
    pub launches_saved: i64,
    /// Run every kernel in one launch, each waiting only for the kernels it depends on.
    pub pipeline: bool,
}

impl Plan {
    pub fn benefit_us(&self) -> f64 {
        self.unfused_us - self.total_us
    }
}

/// The matmuls of a horizontal group, each with the members it needs (its prologue and
/// epilogue; a duplicated prologue belongs to every matmul that reads it).
pub fn horizontal_parts(g: &Graph, nodes: &[NodeId]) -> Vec<(NodeId, BTreeSet<NodeId>)> {
    let members: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let users = g.users();
    nodes
        .iter()
        .copied()
        .filter(|n| g.node(*n).op == Op::MatMul)
        .map(|a| {
            let mut part: BTreeSet<NodeId> = [a].into_iter().collect();
            let mut up = vec![a];
            while let Some(x) = up.pop() {
                for i in &g.node(x).inputs {
                    if members.contains(i) && part.insert(*i) {
                        up.push(*i);
                    }
                }
            }
            let mut down = vec![a];
            while let Some(x) = down.pop() {
                for u in &users[x.idx()] {
                    if members.contains(u) && part.insert(*u) {
                        down.push(*u);
                    }
                }
            }
            (a, part)
        })
        .collect()
}

/// The nodes of an attention pattern inside `members`.
#[derive(Clone, Debug)]
pub struct FlashParts {
    pub qk: NodeId,
    /// Elementwise ops on the scores between QK^T and softmax (scale, mask, causal), in order.
    pub chain: Vec<NodeId>,
    /// The last value of the chain (what softmax reads).
    pub scores: NodeId,
    pub max: NodeId,
    pub shift: NodeId,
    pub exp: NodeId,
    pub sum: NodeId,
    pub div: NodeId,
    pub pv: NodeId,
}

fn single_user(users: &[Vec<NodeId>], g: &Graph, id: NodeId) -> Option<NodeId> {
    (users[id.idx()].len() == 1 && !g.outputs.contains(&id)).then(|| users[id.idx()][0])
}

/// Match QK^T -> (scale | mask | causal)* -> softmax -> .V starting at the matmul `qk`.
pub fn match_flash(g: &Graph, users: &[Vec<NodeId>], qk: NodeId) -> Option<FlashParts> {
    use crate::ir::{BinaryOp, ReduceKind, UnaryOp};
    if g.node(qk).op != Op::MatMul || g.node(qk).shape.len() < 2 {
        return None;
    }
    let mut chain = Vec::new();
    let mut cur = qk;
    loop {
        let Some(u) = single_user(users, g, cur) else { break };
        let n = g.node(u);
        let scalar = |i: usize| matches!(g.node(n.inputs[i]).op, Op::Const { .. });
        let ok = match &n.op {
            Op::Binary(BinaryOp::Mul | BinaryOp::Div) => {
                n.inputs[0] == cur && scalar(1)
                    || n.inputs[1] == cur && scalar(0) && n.op == Op::Binary(BinaryOp::Mul)
            }
            Op::Binary(BinaryOp::Add) => {
                n.shape == g.node(cur).shape && (n.inputs[0] != n.inputs[1])
            }
            Op::CausalMask => true,
            _ => false,
        };
        if !ok {
            break;
        }
        chain.push(u);
        cur = u;
    }
    let scores = cur;
    let su = &users[scores.idx()];
    if su.len() != 2 || g.outputs.contains(&scores) {
        return None;
    }
    let r = g.node(scores).shape.len();
    let max =
        *su.iter().find(|u| g.node(**u).op == Op::Reduce { kind: ReduceKind::Max, axis: r - 1 })?;
    let shift = *su.iter().find(|u| {
        g.node(**u).op == Op::Binary(BinaryOp::Sub) && g.node(**u).inputs == vec![scores, max]
    })?;
    let exp = single_user(users, g, shift).filter(|e| g.node(*e).op == Op::Unary(UnaryOp::Exp))?;
    let eu = &users[exp.idx()];
    if eu.len() != 2 || g.outputs.contains(&exp) {
        return None;
    }
    let sum =
        *eu.iter().find(|u| g.node(**u).op == Op::Reduce { kind: ReduceKind::Sum, axis: r - 1 })?;
    let div = *eu.iter().find(|u| {
        g.node(**u).op == Op::Binary(BinaryOp::Div) && g.node(**u).inputs == vec![exp, sum]
    })?;
    if single_user(users, g, max) != Some(shift) || single_user(users, g, sum) != Some(div) {
        return None;
    }
    let pv = single_user(users, g, div)
        .filter(|p| g.node(*p).op == Op::MatMul && g.node(*p).inputs[0] == div)?;
    Some(FlashParts { qk, chain, scores, max, shift, exp, sum, div, pv })
}

/// The attention pattern a FlashAttention group holds.
pub fn flash_parts(g: &Graph, members: &BTreeSet<NodeId>) -> Option<FlashParts> {
    let users = g.users();
    members.iter().find_map(|m| match_flash(g, &users, *m)).filter(|f| {
        let mut all: BTreeSet<NodeId> = f.chain.iter().copied().collect();
        all.extend([f.qk, f.max, f.shift, f.exp, f.sum, f.div, f.pv]);
        all == *members
    })
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
    let full =
        shapes.iter().find(|s| *s != &row_of(s)).cloned().unwrap_or_else(|| shapes[0].clone());
    shapes.iter().all(|s| *s == full || *s == row_of(&full)).then_some(full)
}

const MAX_GROUP_NODES: usize = 48;
const MAX_KERNEL_BUFFERS: usize = 24;

#[derive(Clone)]
struct WGroup {
    kind: GroupKind,
    members: BTreeSet<NodeId>,
    anchor: Option<NodeId>,
    rules: BTreeSet<Rule>,
    /// Bumped on every change (lazy re-scoring).
    version: u32,
}

type CostResult = Result<KernelCost, String>;

struct Planner<'a> {
    g: &'a Graph,
    target: &'a Target,
    opt_level: u8,
    rules: RuleSet,
    hints: Vec<(String, i64)>,
    users: Vec<Vec<NodeId>>,
    groups: Vec<Option<WGroup>>,
    is_output: Vec<bool>,
    cache: RefCell<HashMap<(Vec<NodeId>, GroupKind), CostResult>>,
}

fn is_member_op(op: &Op) -> bool {
    !matches!(op, Op::Param { .. } | Op::Const { .. }) && !op.is_view()
}

/// What a candidate changes: the producer group and the consumer groups, with their versions.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Move {
    a: usize,
    bs: Vec<usize>,
    versions: Vec<u32>,
    /// A horizontal merge of siblings rather than producer into consumer.
    sibling: bool,
}

struct HeapEntry {
    benefit: f64,
    key: (Vec<NodeId>, Vec<Vec<NodeId>>),
    mv: Move,
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
    fn est(&self, d: &DimExpr) -> i64 {
        d.estimate(&|s| self.hints.iter().find(|(n, _)| n == s).map(|(_, v)| *v).unwrap_or(128))
    }
    fn w(&self, i: usize) -> &WGroup {
        self.groups[i].as_ref().expect("live group")
    }
    fn owners(&self, id: NodeId) -> Vec<usize> {
        (0..self.groups.len())
            .filter(|&i| self.groups[i].as_ref().is_some_and(|w| w.members.contains(&id)))
            .collect()
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
                if !self.w(o).members.contains(&m) {
                    gs.insert(o);
                }
            }
        }
        (gs, view)
    }
    /// Groups that group `gi` reads from (through views too).
    fn preds(&self, gi: usize) -> BTreeSet<usize> {
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
    fn indirect_path(&self, a: usize, b: usize, skip: &[usize]) -> bool {
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
    fn has_reduce(&self, w: &WGroup) -> bool {
        w.members.iter().any(|m| matches!(self.g.node(*m).op, Op::Reduce { .. }))
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
    /// The smallest benefit worth a merge: 0.5 us (docs/planner.md), less on targets whose
    /// launches cost less than 5 us.
    fn margin_floor(&self) -> f64 {
        f64::min(0.5, 0.1 * self.target.launch_us)
    }
    fn rule_on(&self, r: Rule) -> Result<(), (Reason, String)> {
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
    fn cost(
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
        let c =
            crate::cost::kernel_cost(self.g, &self.users, members, kind, anchor, self.target, &est);
        self.cache.borrow_mut().insert(key, c.clone());
        c
    }
    fn group_cost(&self, i: usize) -> CostResult {
        let w = self.w(i);
        self.cost(&w.members, w.kind, w.anchor)
    }

    /// Classify and check a merge of producer group `a` into consumer group `b`; on success the
    /// merged group's kind and anchor.
    fn check_pair(
        &self,
        a: usize,
        b: usize,
    ) -> Result<(Rule, GroupKind, Option<NodeId>), (Option<Rule>, Reason, String)> {
        let (wa, wb) = (self.w(a), self.w(b));
        for m in &wb.members {
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
        let (rule, kind, anchor, res): (
            Rule,
            GroupKind,
            Option<NodeId>,
            Result<(), (Reason, String)>,
        ) = match (wa.kind, wb.kind) {
            (GroupKind::Concat | GroupKind::FlashAttention | GroupKind::Horizontal, _)
            | (_, GroupKind::Concat | GroupKind::FlashAttention | GroupKind::Horizontal) => {
                return Err((
                    None,
                    Reason::Opaque,
                    "concat, flash-attention and horizontal kernels take no further ops".into(),
                ));
            }
            (GroupKind::MatMul, GroupKind::MatMul) => {
                return Err((None, Reason::TwoAnchors, "a kernel holds one matmul".into()));
            }
            (GroupKind::Elementwise, GroupKind::Elementwise) => {
                let (ra, rb) = (self.has_reduce(wa), self.has_reduce(wb));
                let rule = if !ra && !rb {
                    Rule::ElementwiseChain
                } else if !ra
                    && rb
                    && wa.members.iter().any(|m| {
                        matches!(self.g.node(*m).op, Op::Binary(crate::ir::BinaryOp::Add))
                            && (self.is_output[m.idx()]
                                || !self.readers(*m).0.iter().all(|r| *r == b))
                    })
                {
                    Rule::AddNorm
                } else {
                    Rule::ReduceEpilogue
                };
                let members: Vec<NodeId> = wa.members.union(&wb.members).copied().collect();
                let res = match space_of(self.g, &members) {
                    None => {
                        Err((Reason::SpaceMismatch, "members iterate over different shapes".into()))
                    }
                    Some(_) => Ok(()),
                };
                (rule, GroupKind::Elementwise, None, res)
            }
            (GroupKind::MatMul, GroupKind::Elementwise) => {
                let anchor = wa.anchor.unwrap();
                let out = &self.g.node(anchor).shape;
                let res = if self.has_reduce(wb) {
                    Err((Reason::ReductionNotAllowed, "an epilogue holds no reduction".into()))
                } else if wb.members.iter().any(|m| self.g.node(*m).shape != *out) {
                    Err((
                        Reason::SpaceMismatch,
                        "epilogue ops must have the matmul's output shape".into(),
                    ))
                } else {
                    Ok(())
                };
                (Rule::LinearEpilogue, GroupKind::MatMul, Some(anchor), res)
            }
            (GroupKind::Elementwise, GroupKind::MatMul) => (
                Rule::NormLinearPrologue,
                GroupKind::MatMul,
                wb.anchor,
                self.check_prologue(a, b, &[b]),
            ),
        };
        res.map_err(|(r, d)| (Some(rule), r, d))?;
        self.rule_on(rule).map_err(|(r, d)| (Some(rule), r, d))?;
        if self.indirect_path(a, b, &[]) {
            return Err((
                Some(rule),
                Reason::Cycle,
                "another kernel lies on a path between them".into(),
            ));
        }
        let both: BTreeSet<NodeId> = wa.members.union(&wb.members).copied().collect();
        self.backstops(&both).map_err(|(r, d)| (Some(rule), r, d))?;
        Ok((rule, kind, anchor))
    }

    /// Can elementwise group `a` be the A-operand prologue of matmul group `c`, where `all` are
    /// the consumers it would be duplicated into?
    fn check_prologue(&self, a: usize, c: usize, all: &[usize]) -> Result<(), (Reason, String)> {
        let (wa, wc) = (self.w(a), self.w(c));
        if self.has_reduce(wa) {
            return Err((
                Reason::ReductionNotAllowed,
                "a prologue holds no reduction (statistics stay upstream)".into(),
            ));
        }
        let anchor = wc.anchor.unwrap();
        let a_shape = &self.g.node(self.g.node(anchor).inputs[0]).shape;
        if wa.members.iter().any(|m| self.g.node(*m).shape != *a_shape) {
            return Err((
                Reason::SpaceMismatch,
                "prologue ops must have the A operand's shape".into(),
            ));
        }
        let prologue = self.ancestors_in(wc, anchor);
        let others: BTreeSet<NodeId> = all
            .iter()
            .filter(|x| **x != c)
            .flat_map(|x| self.w(*x).members.iter().copied())
            .collect();
        for m in &wa.members {
            if self.is_output[m.idx()] {
                return Err((Reason::OtherUsers, format!("{m} is a graph output")));
            }
            let (rd, view) = self.readers(*m);
            if view || rd.iter().any(|g| !all.contains(g)) {
                return Err((Reason::OtherUsers, format!("{m} is also read by another kernel")));
            }
            for u in &self.users[m.idx()] {
                let ok = wa.members.contains(u)
                    || others.contains(u)
                    || prologue.contains(u)
                    || (*u == anchor && self.g.node(anchor).inputs[1] != *m);
                if !ok {
                    return Err((
                        Reason::NotAnOperand,
                        format!("{m} is also used by {u}, not through the A operand"),
                    ));
                }
            }
        }
        for mm in &wc.members {
            for i in &self.g.node(*mm).inputs {
                if self.g.node(*i).op.is_view() && wa.members.contains(&base_of(self.g, *i)) {
                    return Err((
                        Reason::ViewBoundary,
                        format!("{mm} reads {} through a view", base_of(self.g, *i)),
                    ));
                }
            }
        }
        Ok(())
    }

    fn backstops(&self, members: &BTreeSet<NodeId>) -> Result<(), (Reason, String)> {
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
                self.is_output[m.idx()] || self.users[m.idx()].iter().any(|u| !members.contains(u))
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

    fn members(&self, i: usize) -> Vec<NodeId> {
        self.w(i).members.iter().copied().collect()
    }

    fn rejected(
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
    fn score(
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
                    Reason::Capacity,
                    format!("a part has no feasible tiling: {e}"),
                )
            }
        };
        let mut fk = Vec::new();
        for (m, k, an) in fused {
            match self.cost(m, *k, *an) {
                Ok(c) => fk.push(c),
                Err(e) => {
                    return self.rejected(
                        Some(rule),
                        a,
                        bs,
                        Reason::Capacity,
                        format!("fused: {e}"),
                    )
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

    fn eval_pair(&self, a: usize, b: usize) -> Candidate {
        match self.check_pair(a, b) {
            Err((rule, reason, detail)) => self.rejected(rule, a, &[b], reason, detail),
            Ok((rule, kind, anchor)) => {
                let m: BTreeSet<NodeId> =
                    self.w(a).members.union(&self.w(b).members).copied().collect();
                self.score(rule, a, &[b], &[(m, kind, anchor)])
            }
        }
    }

    /// Elementwise group `a` duplicated into every matmul that reads it as its A operand.
    fn dup_targets(&self, a: usize) -> Option<Vec<usize>> {
        let wa = self.w(a);
        if wa.kind != GroupKind::Elementwise || self.has_reduce(wa) {
            return None;
        }
        let mut cs = BTreeSet::new();
        for m in &wa.members {
            for u in &self.users[m.idx()] {
                if !wa.members.contains(u) {
                    cs.extend(self.owners(*u));
                }
            }
        }
        let cs: Vec<usize> = cs.into_iter().collect();
        (cs.len() >= 2 && cs.iter().all(|c| self.w(*c).kind == GroupKind::MatMul)).then_some(cs)
    }

    fn eval_dup(&self, a: usize, cs: &[usize]) -> Candidate {
        let rule = Rule::NormLinearPrologue;
        let mut checks = self.rule_on(rule);
        for &c in cs {
            if checks.is_ok() {
                checks = self.check_prologue(a, c, cs);
            }
            if checks.is_ok() && self.indirect_path(a, c, cs) {
                checks = Err((Reason::Cycle, "another kernel lies on a path between them".into()));
            }
        }
        if let Err((reason, detail)) = checks {
            return self.rejected(Some(rule), a, cs, reason, detail);
        }
        let fused: Vec<_> = cs
            .iter()
            .map(|c| {
                let m: BTreeSet<NodeId> =
                    self.w(a).members.union(&self.w(*c).members).copied().collect();
                (m, GroupKind::MatMul, self.w(*c).anchor)
            })
            .collect();
        for (m, _, _) in &fused {
            if let Err((reason, detail)) = self.backstops(m) {
                return self.rejected(Some(rule), a, cs, reason, detail);
            }
        }
        self.score(rule, a, cs, &fused)
    }

    fn moves(&self) -> Vec<(Candidate, Move)> {
        let live: Vec<usize> =
            (0..self.groups.len()).filter(|i| self.groups[*i].is_some()).collect();
        let mut out = Vec::new();
        for &b in &live {
            for a in self.preds(b) {
                out.push((self.eval_pair(a, b), self.mv(a, &[b])));
            }
        }
        for &a in &live {
            if let Some(cs) = self.dup_targets(a) {
                out.push((self.eval_dup(a, &cs), self.mv(a, &cs)));
            }
        }
        if self.rules.contains(Rule::QkvHorizontal) {
            for (x, &a) in live.iter().enumerate() {
                for &b in &live[x + 1..] {
                    if self.siblings(a, b) {
                        let mut mv = self.mv(a, &[b]);
                        mv.sibling = true;
                        out.push((self.eval_sibling(a, b), mv));
                    }
                }
            }
        }
        out
    }

    fn a_operands(&self, i: usize) -> BTreeSet<NodeId> {
        let w = self.w(i);
        w.members
            .iter()
            .filter(|m| self.g.node(**m).op == Op::MatMul)
            .map(|m| self.g.node(*m).inputs[0])
            .collect()
    }

    /// Matmul groups whose matmuls read the same A operand.
    fn siblings(&self, a: usize, b: usize) -> bool {
        let kinds = |i: usize| matches!(self.w(i).kind, GroupKind::MatMul | GroupKind::Horizontal);
        kinds(a) && kinds(b) && !self.a_operands(a).is_disjoint(&self.a_operands(b))
    }

    fn eval_sibling(&self, a: usize, b: usize) -> Candidate {
        let rule = Rule::QkvHorizontal;
        if let Err((reason, detail)) = self.rule_on(rule) {
            return self.rejected(Some(rule), a, &[b], reason, detail);
        }
        if self.preds(b).contains(&a)
            || self.preds(a).contains(&b)
            || self.indirect_path(a, b, &[])
            || self.indirect_path(b, a, &[])
        {
            return self.rejected(
                Some(rule),
                a,
                &[b],
                Reason::Cycle,
                "one sibling depends on the other".into(),
            );
        }
        let m: BTreeSet<NodeId> = self.w(a).members.union(&self.w(b).members).copied().collect();
        if let Err((reason, detail)) = self.backstops(&m) {
            return self.rejected(Some(rule), a, &[b], reason, detail);
        }
        self.score(rule, a, &[b], &[(m, GroupKind::Horizontal, None)])
    }
    fn mv(&self, a: usize, bs: &[usize]) -> Move {
        let mut versions = vec![self.w(a).version];
        versions.extend(bs.iter().map(|b| self.w(*b).version));
        Move { a, bs: bs.to_vec(), versions, sibling: false }
    }
    fn current(&self, m: &Move) -> bool {
        std::iter::once(m.a)
            .chain(m.bs.iter().copied())
            .zip(&m.versions)
            .all(|(i, v)| self.groups[i].as_ref().is_some_and(|w| w.version == *v))
    }
    fn rescore(&self, m: &Move) -> Option<Candidate> {
        if self.groups[m.a].is_none() || m.bs.iter().any(|b| self.groups[*b].is_none()) {
            return None;
        }
        if m.sibling {
            return Some(self.eval_sibling(m.a, m.bs[0]));
        }
        if m.bs.len() == 1 {
            if !self.preds(m.bs[0]).contains(&m.a) {
                return None;
            }
            Some(self.eval_pair(m.a, m.bs[0]))
        } else {
            (self.dup_targets(m.a).as_deref() == Some(&m.bs[..])).then(|| self.eval_dup(m.a, &m.bs))
        }
    }

    fn apply(&mut self, rule: Rule, m: &Move) {
        let wa = self.groups[m.a].take().unwrap();
        if m.sibling {
            let wb = self.groups[m.bs[0]].as_mut().unwrap();
            wb.members.extend(wa.members.iter().copied());
            wb.rules.extend(wa.rules.iter().copied());
            wb.rules.insert(rule);
            wb.kind = GroupKind::Horizontal;
            wb.anchor = None;
            wb.version += 1;
            return;
        }
        for &b in &m.bs {
            let wb = self.groups[b].as_mut().unwrap();
            wb.members.extend(wa.members.iter().copied());
            wb.rules.extend(wa.rules.iter().copied());
            wb.rules.insert(rule);
            if wa.kind == GroupKind::MatMul {
                wb.kind = GroupKind::MatMul;
                wb.anchor = wa.anchor;
            }
            wb.version += 1;
        }
    }

    /// Attention patterns become flash-attention kernels first (a structural rewrite, like the
    /// anchors' pattern passes), when the rule is on and the model says it pays.
    fn flash(&mut self, log: &mut Vec<Candidate>) {
        let g = self.g;
        for id in g.ids() {
            let Some(f) = match_flash(g, &self.users, id) else { continue };
            let mut members: BTreeSet<NodeId> = f.chain.iter().copied().collect();
            members.extend([f.qk, f.max, f.shift, f.exp, f.sum, f.div, f.pv]);
            let gs: Vec<usize> = members
                .iter()
                .flat_map(|m| self.owners(*m))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if gs.iter().any(|i| self.w(*i).members.iter().any(|m| !members.contains(m))) {
                continue; // already fused otherwise (seeded plans)
            }
            let (a, bs) = (gs[0], gs[1..].to_vec());
            let mut c = match self.rule_on(Rule::FlashAttention) {
                Err((reason, detail)) => {
                    self.rejected(Some(Rule::FlashAttention), a, &bs, reason, detail)
                }
                Ok(()) => self.score(
                    Rule::FlashAttention,
                    a,
                    &bs,
                    &[(members.clone(), GroupKind::FlashAttention, Some(f.pv))],
                ),
            };
            if let Decision::Accepted { .. } = c.decision {
                c.decision = Decision::Accepted {
                    step: log
                        .iter()
                        .filter(|c| matches!(c.decision, Decision::Accepted { .. }))
                        .count()
                        + 1,
                };
                let mut rules = BTreeSet::new();
                rules.insert(Rule::FlashAttention);
                for i in &gs {
                    self.groups[*i] = None;
                }
                self.groups[a] = Some(WGroup {
                    kind: GroupKind::FlashAttention,
                    members,
                    anchor: Some(f.pv),
                    rules,
                    version: 1,
                });
            }
            log.push(c);
        }
    }

    /// Local repair: drop a boundary op out of a fused elementwise group when the model says
    /// the group is faster without it (undoes order effects of greedy merging).
    fn repair(&mut self, log: &mut Vec<Candidate>) {
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

/// Plan one canonical graph.
pub fn plan(
    g: &Graph,
    opt_level: u8,
    rules: RuleSet,
    hints: &[(String, i64)],
    target: &Target,
) -> Plan {
    plan_from(g, opt_level, rules, hints, target, None)
}

/// Plan starting from the groups of an earlier plan (`None`: one group per op). Planning the
/// result of a plan again changes nothing.
pub fn plan_from(
    g: &Graph,
    opt_level: u8,
    rules: RuleSet,
    hints: &[(String, i64)],
    target: &Target,
    seed: Option<&[Group]>,
) -> Plan {
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
        cache: RefCell::new(HashMap::new()),
    };
    let singleton = |id: NodeId| {
        let kind = match g.node(id).op {
            Op::MatMul => GroupKind::MatMul,
            Op::Concat { .. } => GroupKind::Concat,
            _ => GroupKind::Elementwise,
        };
        WGroup {
            kind,
            members: [id].into_iter().collect(),
            anchor: (kind == GroupKind::MatMul).then_some(id),
            rules: BTreeSet::new(),
            version: 0,
        }
    };
    match seed {
        None => {
            p.groups = g
                .ids()
                .filter(|id| is_member_op(&g.node(*id).op))
                .map(|id| Some(singleton(id)))
                .collect()
        }
        Some(groups) => {
            p.groups = groups
                .iter()
                .map(|gr| {
                    Some(WGroup {
                        kind: gr.kind,
                        members: gr.nodes.iter().copied().collect(),
                        anchor: gr.anchor,
                        rules: gr.rules.iter().copied().collect(),
                        version: 0,
                    })
                })
                .collect()
        }
    }
    let unfused: Vec<KernelCost> = g
        .ids()
        .filter(|id| is_member_op(&g.node(*id).op))
        .filter_map(|id| {
            let s = singleton(id);
            p.cost(&s.members, s.kind, s.anchor).ok()
        })
        .collect();
    let mut log: Vec<Candidate> = Vec::new();
    if opt_level > 0 {
        p.flash(&mut log);
        let mut heap: BinaryHeap<HeapEntry> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<HeapEntry>, c: &Candidate, mv: Move| {
            if let Decision::Accepted { .. } = c.decision {
                heap.push(HeapEntry {
                    benefit: c.benefit_us,
                    key: (c.producer.clone(), c.consumers.clone()),
                    mv,
                });
            }
        };
        for (c, mv) in p.moves() {
            push(&mut heap, &c, mv);
        }
        while let Some(top) = heap.pop() {
            let stale = !p.current(&top.mv);
            let Some(c) = p.rescore(&top.mv) else { continue };
            let same = !stale && (c.benefit_us - top.benefit).abs() < 1e-9;
            if !same {
                // Lazy re-scoring: put it back with its current score.
                let mut mv = p.mv(top.mv.a, &top.mv.bs);
                mv.sibling = top.mv.sibling;
                push(&mut heap, &c, mv);
                continue;
            }
            let Decision::Accepted { .. } = c.decision else { continue };
            let mut c = c;
            c.decision = Decision::Accepted {
                step: log
                    .iter()
                    .filter(|c| matches!(c.decision, Decision::Accepted { .. }))
                    .count()
                    + 1,
            };
            p.apply(c.rule.unwrap(), &top.mv);
            log.push(c);
            // New candidates around the changed groups.
            for (c, mv) in p.moves() {
                if mv.bs.iter().chain(std::iter::once(&mv.a)).any(|g| top.mv.bs.contains(g)) {
                    push(&mut heap, &c, mv);
                }
            }
        }
        p.repair(&mut log);
    }
    // Every candidate left, with why it was not taken.
    let mut candidates: Vec<Candidate> = log;
    for (c, _) in p.moves() {
        candidates.push(c);
    }
    let groups = finalize(&p);
    let mut total_us: f64 = groups.iter().filter_map(|g| g.cost.as_ref()).map(|c| c.time_us).sum();
    let mut launches_saved = unfused.len() as i64 - groups.len() as i64;
    // The pipeline: one launch for the whole graph (SuperKernel style). A kernel waits only for
    // the kernels it reads from; each wait is modelled as a quarter of a launch.
    let mut pipeline = false;
    if opt_level > 0 && groups.len() > 1 {
        let edges: usize = (0..groups.len())
            .map(|k| {
                groups[..k]
                    .iter()
                    .filter(|e| e.outputs.iter().any(|o| groups[k].inputs.contains(o)))
                    .count()
            })
            .sum();
        let n = groups.len() as f64;
        let launch = target.launch_us;
        let parts_us = total_us;
        let fused_us = total_us - (n - 1.0) * launch + edges as f64 * 0.25 * launch;
        let benefit_us = parts_us - fused_us;
        let margin_us = p.margin_floor().max(0.03 * n * launch);
        let first = groups[0].nodes.clone();
        let rest: Vec<Vec<NodeId>> = groups[1..].iter().map(|g| g.nodes.clone()).collect();
        let mut c = Candidate {
            rule: Some(Rule::Pipeline),
            producer: first,
            consumers: rest,
            parts_us,
            fused_us,
            benefit_us,
            margin_us,
            bytes_saved: 0,
            bytes_saved_us: 0.0,
            launches_saved: groups.len() as i64 - 1,
            launches_saved_us: (n - 1.0) * launch,
            tiling_loss_us: 0.0,
            recompute_us: 0.0,
            onchip: Vec::new(),
            tiling: None,
            decision: Decision::Accepted { step: 0 },
        };
        c.decision = match p.rule_on(Rule::Pipeline) {
            Err((reason, detail)) => Decision::Rejected { reason, detail },
            Ok(()) if benefit_us > margin_us => {
                pipeline = true;
                total_us = fused_us;
                launches_saved += groups.len() as i64 - 1;
                Decision::Accepted {
                    step: candidates
                        .iter()
                        .filter(|c| matches!(c.decision, Decision::Accepted { .. }))
                        .count()
                        + 1,
                }
            }
            Ok(()) => Decision::Rejected {
                reason: Reason::NotProfitable,
                detail: format!("benefit {benefit_us:.2} us <= margin {margin_us:.2} us"),
            },
        };
        candidates.push(c);
    }
    let bytes = groups.iter().filter_map(|g| g.cost.as_ref()).map(|c| c.bytes).sum();
    Plan {
        opt_level,
        rules: rules.names().into_iter().map(String::from).collect(),
        target: target.clone(),
        hints: hints.to_vec(),
        launches_saved,
        pipeline,
        groups,
        candidates,
        total_us,
        unfused_us: unfused.iter().map(|c| c.time_us).sum(),
        bytes,
        unfused_bytes: unfused.iter().map(|c| c.bytes).sum(),
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
            .min_by_key(|i| *p.w(*i).members.iter().next().unwrap())
            .expect("the group graph is acyclic");
        done.insert(next);
        order.push(next);
    }
    let mut out = Vec::new();
    for gi in order {
        let w = p.w(gi);
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
            cost: p.group_cost(gi).ok(),
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
