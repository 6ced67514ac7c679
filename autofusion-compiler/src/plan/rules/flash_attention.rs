//! `flash_attention`: QK^T, its scale and mask, the softmax and the product with V become one
//! online-softmax kernel that never forms the S x S scores. A structural rewrite run before
//! greedy merging, taken when the rule is on and the model says it pays.

use super::{FusionRule, Rule};
use crate::group::{match_flash, GroupKind};
use crate::ir::NodeId;
use crate::plan::planner::{Planner, WGroup};
use crate::plan::{Candidate, Decision};
use std::collections::BTreeSet;

pub(in crate::plan) struct FlashAttention;

impl FusionRule for FlashAttention {
    fn rule(&self) -> Rule {
        Rule::FlashAttention
    }
    fn rewrite(&self, p: &mut Planner, log: &mut Vec<Candidate>) {
        let g = p.g;
        for id in g.ids() {
            let Some(f) = match_flash(g, &p.users, id) else { continue };
            let mut members: BTreeSet<NodeId> = f.chain.iter().copied().collect();
            members.extend([f.qk, f.max, f.shift, f.exp, f.sum, f.div, f.pv]);
            let gs: Vec<usize> = members
                .iter()
                .flat_map(|m| p.owners(*m))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if gs.iter().any(|i| p.w(*i).members.iter().any(|m| !members.contains(m))) {
                continue; // already fused otherwise (seeded plans)
            }
            let (a, bs) = (gs[0], gs[1..].to_vec());
            let mut c = match p.rule_on(Rule::FlashAttention) {
                Err((reason, detail)) => {
                    p.rejected(Some(Rule::FlashAttention), a, &bs, reason, detail)
                }
                Ok(()) => p.score(
                    Rule::FlashAttention,
                    a,
                    &bs,
                    &[(members.clone(), GroupKind::FlashAttention, Some(f.pv))],
                ),
            };
            if let Decision::Accepted { .. } = c.decision {
                c.decision = Decision::Accepted { step: Planner::next_step(log) };
                let mut rules = BTreeSet::new();
                rules.insert(Rule::FlashAttention);
                for i in &gs {
                    p.groups[*i] = None;
                }
                p.groups[a] = Some(WGroup {
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
}
