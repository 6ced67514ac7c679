//! Property tests on random graphs: plans are valid (every op computed, groups in a
//! dependency order, on-chip use within budget) and deterministic (byte-identical plan.json).

use autofusion_compiler::group::GroupKind;
use autofusion_compiler::plan::{plan, Rule, RuleSet};
use autofusion_compiler::target::Target;
use autofusion_compiler::testing::{random_graph, Rng};
use autofusion_compiler::{ir::Op, report, Options, Unit};
use std::collections::BTreeSet;

#[test]
fn random_plans_are_valid_and_deterministic() {
    let targets = [Target::host(), Target::ascend910b()];
    for seed in 0..60u64 {
        let graph = random_graph(seed, 4 + (seed as usize % 9));
        let src = graph.dump();
        let u = Unit::from_graph(graph, Options::default()).unwrap();
        let g = &u.graph;
        let mut r = Rng::new(seed + 1000);
        for level in 0..=3u8 {
            let mut rules = RuleSet::none();
            for rule in Rule::ALL {
                if r.below(3) > 0 {
                    rules.insert(rule);
                }
            }
            let target = &targets[r.below(2)];
            let hints = vec![("S".to_string(), [1i64, 7, 128, 2048][r.below(4)])];
            let p = plan(g, level, rules, &hints, target);
            let ctx = format!(
                "seed {seed}, opt_level {level}, rules {:?}, target {}\n{src}",
                rules.names(),
                target.name
            );
            // Every op that runs as a kernel is computed by some group; ops in several groups
            // are duplicated prologue ops, never written.
            let mut seen: Vec<usize> = vec![0; g.nodes.len()];
            for gr in &p.groups {
                for n in &gr.nodes {
                    seen[n.idx()] += 1;
                }
            }
            for id in g.ids() {
                let op = &g.node(id).op;
                let kernel_op = !matches!(op, Op::Param { .. } | Op::Const { .. }) && !op.is_view();
                assert_eq!(seen[id.idx()] > 0, kernel_op, "{id} coverage: {ctx}");
                if seen[id.idx()] > 1 {
                    assert!(op.is_elementwise(), "{id} duplicated but not elementwise: {ctx}");
                    assert!(
                        p.groups.iter().all(|gr| !gr.outputs.contains(&id)),
                        "{id} duplicated and written: {ctx}"
                    );
                }
            }
            // Dependency order: a group reads only parameters and values written earlier.
            let mut written: BTreeSet<_> = g.param_nodes().into_iter().collect();
            for gr in &p.groups {
                for i in &gr.inputs {
                    assert!(written.contains(i), "{i} read before it is written: {ctx}");
                }
                written.extend(gr.outputs.iter().copied());
                if level == 0 {
                    assert_eq!(gr.nodes.len(), 1, "{ctx}");
                }
                let matmuls = gr.nodes.iter().filter(|n| g.node(**n).op == Op::MatMul).count();
                match gr.kind {
                    GroupKind::MatMul => assert_eq!(matmuls, 1, "one anchor per group: {ctx}"),
                    GroupKind::FlashAttention => assert_eq!(matmuls, 2, "{ctx}"),
                    GroupKind::Horizontal => assert!(matmuls >= 2, "{ctx}"),
                    _ => assert_eq!(matmuls, 0, "{ctx}"),
                }
                // Capacity at the chosen tiling.
                let c = gr
                    .cost
                    .as_ref()
                    .unwrap_or_else(|| panic!("every kernel has a feasible tiling: {ctx}"));
                for (m, b) in &c.onchip {
                    assert!(*b <= target.budget(m).unwrap(), "{m}: {b} B over budget: {ctx}");
                }
            }
            for o in &g.outputs {
                assert!(written.contains(o), "output {o} never written: {ctx}");
            }
            // The cache only takes bytes off the boundary traffic, and never more than it.
            let oc = p.offchip;
            assert!(oc.bytes >= 0.0 && oc.cached_reads >= 0.0 && oc.cached_writes >= 0.0, "{ctx}");
            assert!(oc.writes_reach_memory() <= p.bytes * (1.0 + 1e-9) + 1.0, "{ctx}");
            // Determinism.
            let again = plan(g, level, rules, &hints, target);
            assert_eq!(report::plan_json(g, &p), report::plan_json(g, &again), "{ctx}");
            // Every rejected candidate says why in words (its reason code is a fixed name).
            for c in &p.candidates {
                if let autofusion_compiler::plan::Decision::Rejected { reason, detail } =
                    &c.decision
                {
                    assert!(
                        !detail.trim().is_empty(),
                        "{ctx}: a {} rejection with no detail",
                        reason.code()
                    );
                }
            }
        }
    }
}
