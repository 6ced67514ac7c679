//! The fusion planner: named rules (`rules/`) propose merges of groups of ops, legality
//! rejects what cannot be one kernel (each with a reason code), the cost model prices every
//! kernel in microseconds for a target profile, and merges are taken greedily, best first,
//! deterministically (`planner.rs`); a local repair pass follows, then the plan-level rules.

pub mod l2;
mod planner;
pub mod rules;

use crate::cost::KernelCost;
use crate::group::{base_of, GroupKind};
use crate::ir::{Graph, NodeId, Op};
use crate::target::Target;
use planner::{is_member_op, HeapEntry, Move, Planner, WGroup};
pub use rules::{Rule, RuleSet};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

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
    /// The merged group is not one its kernel kind's generators can emit (`KernelKind::check`).
    NotGeneratable,
    /// The runtime checks ids a kernel computed before a gather reads them: between launches.
    IndexCheck,
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
            Reason::NotGeneratable => "not_generatable",
            Reason::IndexCheck => "index_check",
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
    /// The same traffic in launch order with the shared cache serving what is still in it
    /// from an earlier kernel (`l2::offchip`).
    pub offchip: l2::Offchip,
    pub unfused_offchip: l2::Offchip,
    pub launches_saved: i64,
    /// Run every kernel in one launch, each waiting only for the kernels it depends on.
    pub pipeline: bool,
}

impl Plan {
    pub fn benefit_us(&self) -> f64 {
        self.unfused_us - self.total_us
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
            Op::CacheWrite { .. } => GroupKind::CacheWrite,
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
    let (unfused_ids, unfused): (Vec<NodeId>, Vec<KernelCost>) = g
        .ids()
        .filter(|id| is_member_op(&g.node(*id).op))
        .filter_map(|id| {
            let s = singleton(id);
            Some((id, p.cost(&s.members, s.kind, s.anchor).ok()?))
        })
        .unzip();
    let mut log: Vec<Candidate> = Vec::new();
    if opt_level > 0 {
        for r in rules::PIPELINE {
            r.rewrite(&mut p, &mut log);
        }
        greedy(&mut p, &mut log);
        p.repair(&mut log);
    }
    // Every candidate left, with why it was not taken.
    let mut candidates: Vec<Candidate> = log;
    for (c, _) in p.moves() {
        candidates.push(c);
    }
    let groups = finalize(&p);
    let mut totals = rules::Totals {
        total_us: groups.iter().filter_map(|g| g.cost.as_ref()).map(|c| c.time_us).sum(),
        launches_saved: unfused.len() as i64 - groups.len() as i64,
        pipeline: false,
    };
    for r in rules::PIPELINE {
        r.finish(&p, &groups, &mut totals, &mut candidates);
    }
    let bytes = groups.iter().filter_map(|g| g.cost.as_ref()).map(|c| c.bytes).sum();
    let est = |d: &crate::dim::DimExpr| p.est(d);
    let fused_io: Vec<l2::KernelIo> = groups
        .iter()
        .map(|gr| {
            let b = gr.cost.as_ref().map_or(0.0, |c| c.bytes);
            let mut io = l2::KernelIo::of(g, &gr.nodes, gr.outputs.clone(), b);
            let n_major = matches!(
                gr.cost.as_ref().map(|c| &c.tiling),
                Some(crate::cost::Tiling::MatMul { n_major: true, .. })
            );
            if let (true, Some(a)) = (n_major, gr.anchor) {
                let a_in = crate::layout::resolve(g, g.node(a).inputs[0]).base;
                if !gr.nodes.contains(&a_in) {
                    io.early.push(a_in);
                }
            }
            io
        })
        .collect();
    let unfused_io: Vec<l2::KernelIo> = unfused_ids
        .iter()
        .zip(&unfused)
        .map(|(id, c)| l2::KernelIo::of(g, &[*id], vec![*id], c.bytes))
        .collect();
    Plan {
        offchip: l2::offchip(g, &fused_io, target, &est),
        unfused_offchip: l2::offchip(g, &unfused_io, target, &est),
        opt_level,
        rules: rules.names().into_iter().map(String::from).collect(),
        target: target.clone(),
        hints: hints.to_vec(),
        launches_saved: totals.launches_saved,
        pipeline: totals.pipeline,
        groups,
        candidates,
        total_us: totals.total_us,
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
                let stored_permuted =
                    crate::group::layout_store(g, &p.users, *m, &w.members).is_some();
                let split = crate::group::read_in_natural_split(g, &p.users, *m, &w.members);
                p.is_output[m.idx()] || (view && !stored_permuted && !split) || !rd.is_empty()
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
        // A copy is named by what it materialises (copies of several views in one statement
        // would otherwise all read `x: copy`).
        let what = match node.op {
            Op::Copy => {
                let base = crate::layout::resolve(g, node.inputs[0]).base;
                format!("copy({})", g.node(base).name)
            }
            _ => node.op.name(),
        };
        by_name.entry(key).or_default().push(what);
    }
    order.iter().map(|k| format!("{k}: {}", by_name[k].join(" "))).collect::<Vec<_>>().join("; ")
}

/// Greedy merging: every move scored, the best taken first from a max-heap; a move whose
/// groups changed since it was scored is scored again and put back (lazy re-scoring), and the
/// moves around each merged group are added.
fn greedy(p: &mut Planner, log: &mut Vec<Candidate>) {
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
            let mv = p.mv(top.mv.a, &top.mv.bs, top.mv.by);
            push(&mut heap, &c, mv);
            continue;
        }
        let Decision::Accepted { .. } = c.decision else { continue };
        let mut c = c;
        c.decision = Decision::Accepted { step: Planner::next_step(log) };
        p.apply(c.rule.unwrap(), &top.mv);
        log.push(c);
        // New candidates around the changed groups.
        for (c, mv) in p.moves() {
            if mv.bs.iter().chain(std::iter::once(&mv.a)).any(|g| top.mv.bs.contains(g)) {
                push(&mut heap, &c, mv);
            }
        }
    }
}
