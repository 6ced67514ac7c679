//! `pipeline`: the whole layer as one launch (SuperKernel style), each kernel waiting only for
//! the kernels it reads from. A plan-level decision once the kernels are settled: taken when the
//! launches it saves beat the waits it adds (each wait modelled as a quarter of a launch).

use super::{FusionRule, Rule, Totals};
use crate::ir::{NodeId, Op};
use crate::plan::planner::Planner;
use crate::plan::{Candidate, Decision, Group, Reason};

pub(in crate::plan) struct Pipeline;

impl FusionRule for Pipeline {
    fn rule(&self) -> Rule {
        Rule::Pipeline
    }
    fn finish(
        &self,
        p: &Planner,
        groups: &[Group],
        totals: &mut Totals,
        candidates: &mut Vec<Candidate>,
    ) {
        if p.opt_level == 0 || groups.len() < 2 {
            return;
        }
        let edges: usize = (0..groups.len())
            .map(|k| {
                groups[..k]
                    .iter()
                    .filter(|e| e.outputs.iter().any(|o| groups[k].inputs.contains(o)))
                    .count()
            })
            .sum();
        let n = groups.len() as f64;
        let launch = p.target.launch_us;
        let parts_us = totals.total_us;
        let fused_us = parts_us - (n - 1.0) * launch + edges as f64 * 0.25 * launch;
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
        let computed = computed_ids(p);
        c.decision = match p.rule_on(Rule::Pipeline) {
            Err((reason, detail)) => Decision::Rejected { reason, detail },
            Ok(()) if computed.is_some() => Decision::Rejected {
                reason: Reason::IndexCheck,
                detail: format!(
                    "gather `{}` reads ids a kernel computes; the runtime checks them between launches",
                    computed.unwrap_or_default()
                ),
            },
            Ok(()) if benefit_us > margin_us => {
                totals.pipeline = true;
                totals.total_us = fused_us;
                totals.launches_saved += groups.len() as i64 - 1;
                Decision::Accepted { step: Planner::next_step(candidates) }
            }
            Ok(()) => Decision::Rejected {
                reason: Reason::NotProfitable,
                detail: format!("benefit {benefit_us:.2} us <= margin {margin_us:.2} us"),
            },
        };
        candidates.push(c);
    }
}

/// The name of a gather whose ids are computed (not a parameter), if any.
fn computed_ids(p: &Planner) -> Option<String> {
    p.g.nodes
        .iter()
        .find(|n| {
            matches!(n.op, Op::Gather { .. })
                && !matches!(p.g.node(n.inputs[1]).op, Op::Param { .. })
        })
        .map(|n| n.name.clone())
}
