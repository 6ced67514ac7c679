//! The fusion rules, one module each behind `FusionRule`, run in the order of `PIPELINE`.
//!
//! A rule says which merges are its kind (`claims` for a producer-consumer pair of groups,
//! `moves` for other shapes of move such as duplicating a prologue or joining siblings), when
//! such a merge is legal (`check_pair`, or inside its own moves' evaluation), and what kernel
//! the merge makes: the group kind it returns, which `cost::kernel_cost` prices and the code
//! generators emit. Structural rewrites run before greedy merging (`rewrite`) and plan-level
//! decisions after it (`finish`). Adding a rule: a `Rule` variant with its name and minimum
//! opt level, a module here implementing `FusionRule`, and its place in `PIPELINE`.

mod add_norm;
mod elementwise_chain;
mod flash_attention;
mod layout_store;
mod linear_epilogue;
mod norm_linear_prologue;
mod pipeline;
mod qkv_horizontal;
mod reduce_epilogue;
mod sibling_matmul;

use super::planner::{Move, Planner};
use super::{Candidate, Group, Reason};
use crate::group::{space_of, GroupKind};
use crate::ir::NodeId;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    ElementwiseChain,
    ReduceEpilogue,
    AddNorm,
    LinearEpilogue,
    NormLinearPrologue,
    FlashAttention,
    LayoutStore,
    QkvHorizontal,
    Pipeline,
    SiblingMatmul,
}

impl Rule {
    pub const ALL: [Rule; 10] = [
        Rule::ElementwiseChain,
        Rule::ReduceEpilogue,
        Rule::AddNorm,
        Rule::LinearEpilogue,
        Rule::NormLinearPrologue,
        Rule::FlashAttention,
        Rule::LayoutStore,
        Rule::QkvHorizontal,
        Rule::Pipeline,
        Rule::SiblingMatmul,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Rule::ElementwiseChain => "elementwise_chain",
            Rule::ReduceEpilogue => "reduce_epilogue",
            Rule::AddNorm => "add_norm",
            Rule::LinearEpilogue => "linear_epilogue",
            Rule::NormLinearPrologue => "norm_linear_prologue",
            Rule::FlashAttention => "flash_attention",
            Rule::LayoutStore => "layout_store",
            Rule::QkvHorizontal => "qkv_horizontal",
            Rule::Pipeline => "pipeline",
            Rule::SiblingMatmul => "sibling_matmul",
        }
    }
    pub fn parse(s: &str) -> Option<Rule> {
        Rule::ALL.iter().copied().find(|r| r.name() == s)
    }
    /// The lowest `opt_level` at which the rule runs.
    pub fn min_opt_level(self) -> u8 {
        match self {
            Rule::ElementwiseChain | Rule::ReduceEpilogue | Rule::AddNorm => 1,
            Rule::LinearEpilogue | Rule::NormLinearPrologue | Rule::LayoutStore => 2,
            Rule::FlashAttention | Rule::QkvHorizontal | Rule::Pipeline | Rule::SiblingMatmul => 3,
        }
    }
    /// Rules this one extends: alone it would form nothing (a layout store extends a flash
    /// kernel, a sibling product a matmul's epilogue). "Each rule alone" in the tests turns these on with it.
    pub fn builds_on(self) -> &'static [Rule] {
        match self {
            Rule::LayoutStore => &[Rule::FlashAttention],
            // The sibling joins a matmul whose epilogue reads it.
            Rule::SiblingMatmul => &[Rule::LinearEpilogue],
            _ => &[],
        }
    }
    /// The rule with the rules it builds on, and the opt level (at least 2) they all run at:
    /// "each rule alone" for the tests.
    pub fn alone(self) -> (RuleSet, u8) {
        let mut s = RuleSet::none();
        s.insert(self);
        let mut level = self.min_opt_level().max(2);
        for r in self.builds_on() {
            s.insert(*r);
            level = level.max(r.min_opt_level());
        }
        (s, level)
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

/// What planning has settled after greedy merging, for the plan-level rules (`finish`).
pub(in crate::plan) struct Totals {
    pub(in crate::plan) total_us: f64,
    pub(in crate::plan) launches_saved: i64,
    pub(in crate::plan) pipeline: bool,
}

/// A fusion rule: which merges it proposes, when they are legal, and what kernel they make.
pub(in crate::plan) trait FusionRule: Sync {
    fn rule(&self) -> Rule;

    /// A structural rewrite run once before greedy merging (flash attention).
    fn rewrite(&self, _p: &mut Planner, _log: &mut Vec<Candidate>) {}

    /// Whether merging producer group `a` into consumer group `b` is this rule's kind of merge.
    /// At most one rule claims a pair.
    fn claims(&self, _p: &Planner, _a: usize, _b: usize) -> bool {
        false
    }

    /// The legality of a claimed pair: the merged kernel's kind and anchor, or why not. The
    /// planner then checks that the rule is on, cycles and the size backstops.
    fn check_pair(
        &self,
        _p: &Planner,
        _a: usize,
        _b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        Err((Reason::Opaque, format!("{} merges no pairs", self.rule().name())))
    }

    /// Moves other than producer-consumer pairs, each evaluated (legality and cost).
    fn moves(&self, _p: &Planner) -> Vec<(Candidate, Move)> {
        Vec::new()
    }

    /// One of this rule's own moves evaluated again on the current grouping (`None`: the move
    /// no longer exists).
    fn rescore(&self, _p: &Planner, _mv: &Move) -> Option<Candidate> {
        None
    }

    /// Carry out one of this rule's accepted moves (default: merge the producer into each
    /// consumer).
    fn apply(&self, p: &mut Planner, rule: Rule, mv: &Move) {
        p.merge_into(rule, mv);
    }

    /// A plan-level decision once the kernels are settled (the pipeline).
    fn finish(
        &self,
        _p: &Planner,
        _groups: &[Group],
        _totals: &mut Totals,
        _candidates: &mut Vec<Candidate>,
    ) {
    }
}

/// Every rule, in the order the planner consults them (and reports their moves).
pub(in crate::plan) static PIPELINE: [&dyn FusionRule; 10] = [
    &flash_attention::FlashAttention,
    &layout_store::LayoutStore,
    &elementwise_chain::ElementwiseChain,
    &reduce_epilogue::ReduceEpilogue,
    &add_norm::AddNorm,
    &linear_epilogue::LinearEpilogue,
    &norm_linear_prologue::NormLinearPrologue,
    &sibling_matmul::SiblingMatmul,
    &qkv_horizontal::QkvHorizontal,
    &pipeline::Pipeline,
];

/// The implementation of `rule`.
pub(in crate::plan) fn get(rule: Rule) -> &'static dyn FusionRule {
    *PIPELINE.iter().find(|r| r.rule() == rule).expect("every rule is in the pipeline")
}

/// Both groups elementwise (row loops); the producer's and the consumer's reductions.
fn elementwise_pair(p: &Planner, a: usize, b: usize) -> Option<(bool, bool)> {
    let (wa, wb) = (p.w(a), p.w(b));
    (wa.kind == GroupKind::Elementwise && wb.kind == GroupKind::Elementwise)
        .then(|| (p.has_reduce(wa), p.has_reduce(wb)))
}

/// The legality shared by the elementwise rules: one iteration space for all members.
fn one_space(
    p: &Planner,
    a: usize,
    b: usize,
) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
    let members: Vec<NodeId> = p.w(a).members.union(&p.w(b).members).copied().collect();
    match space_of(p.g, &members) {
        None => Err((Reason::SpaceMismatch, "members iterate over different shapes".into())),
        Some(_) => Ok((GroupKind::Elementwise, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_holds_every_rule_once() {
        let mut order: Vec<Rule> = PIPELINE.iter().map(|r| r.rule()).collect();
        order.sort();
        assert_eq!(order, Rule::ALL);
        for r in Rule::ALL {
            assert_eq!(get(r).rule(), r);
        }
    }
}
