//! Every rule at every opt level, fused against the reference interpreter on random inputs
//! and several dynamic shapes (1, 7, 100, 513: tails, a single row, a prime-ish size).
//! Each plan is generated, compiled with the system C compiler and loaded at test time.

mod common;

use autofusion::Tensor;
use autofusion_compiler::front::Options;
use autofusion_compiler::group::GroupKind;
use autofusion_compiler::ir::Op;
use autofusion_compiler::plan::{Rule, RuleSet};
use autofusion_compiler::{target::Target, Unit, Variant};
use std::path::PathBuf;

const SHAPES: [i64; 4] = [1, 7, 100, 513];

fn configs() -> Vec<(String, u8, RuleSet)> {
    let mut v: Vec<(String, u8, RuleSet)> =
        (0..=3).map(|o| (format!("opt_level {o}"), o, RuleSet::all())).collect();
    for r in Rule::ALL.iter() {
        let (s, level) = r.alone();
        v.push((format!("opt_level {level}, rules = [{}]", s.names().join(", ")), level, s));
    }
    let mut every = RuleSet::all();
    every.insert(Rule::QkvHorizontal);
    v.push(("opt_level 3, every rule and qkv_horizontal".into(), 3, every));
    v.push(("opt_level 3, rules = none".into(), 3, RuleSet::none()));
    v
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("differential")
}

#[test]
fn every_rule_at_every_opt_level_matches_the_reference() {
    let target = Target::host();
    common::each_layer_graph_in_parallel(|name, item, base| {
        // One reference per shape, shared by all plans of the graph.
        let unit0 = Unit::with_options(base.clone(), &item).unwrap();
        let m0 = common::load(&unit0, Variant::Unfused, &target, &dir(), &[]).unwrap();
        let g = m0.graph().clone();
        let cases: Vec<(i64, Vec<Tensor>, Vec<Tensor>)> = SHAPES
            .iter()
            .map(|&s| {
                let dims = common::dims_for(&g, s);
                let ins = common::inputs(&g, &dims, s as u64 + 17);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = m0.reference(&refs).unwrap();
                (s, ins, want)
            })
            .collect();
        let mut kernel_counts = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (label, level, rules) in configs() {
            let opts = Options { opt_level: level, rules, ..base.clone() };
            let unit = Unit::with_options(opts, &item).unwrap();
            let plan = &unit.variant(Variant::Fused, &target).plan;
            kernel_counts.push((label.clone(), plan.groups.len()));
            let of_kind = |kind| plan.groups.iter().filter(|g| g.kind == kind).count();
            // Attention becomes one flash kernel at opt_level 3 (and only there).
            let flash = of_kind(GroupKind::FlashAttention);
            let attention_layers =
                ["seed_layer", "bert_layer", "llama_block", "attention_f16", "encoder_batched"];
            let horizontal = of_kind(GroupKind::Horizontal);
            if rules.contains(Rule::QkvHorizontal)
                && level == 3
                && attention_layers.contains(&name.as_str())
            {
                assert!(
                    horizontal >= 1,
                    "{name}: q, k and v projections launched together at {label}"
                );
            } else {
                assert_eq!(horizontal, 0, "{name}: qkv_horizontal is opt-in ({label})");
            }
            // With the default host figures (5 us launches) one launch per layer always pays,
            // unless a gather reads ids a kernel computes: they are checked between launches.
            assert_eq!(
                plan.pipeline,
                level == 3 && rules.contains(Rule::Pipeline) && !gathers_computed_ids(&g),
                "{name}: pipeline at {label}"
            );
            if level == 3
                && rules.contains(Rule::FlashAttention)
                && rules.contains(Rule::LinearEpilogue)
                && attention_layers.contains(&name.as_str())
            {
                assert_eq!(flash, 1, "{name}: one flash-attention kernel at {label}");
            } else if level < 3 || !rules.contains(Rule::FlashAttention) {
                assert_eq!(flash, 0, "{name}: no flash attention at {label}");
            }
            // Plans that generate the same kernels are compiled and run once.
            if !seen.insert(common::plan_key(plan)) {
                continue;
            }
            let m = common::load(&unit, Variant::Fused, &target, &dir(), &[]).unwrap();
            assert_eq!(m.kernel_names().len(), plan.groups.len(), "{name}: kernels at {label}");
            assert_eq!(m.meta().pipeline, plan.pipeline, "{name}: pipeline launch at {label}");
            for (s, ins, want) in &cases {
                let refs: Vec<&Tensor> = ins.iter().collect();
                let got = m.run(&refs).unwrap();
                common::assert_close(&format!("{name}, {label}, S = {s}"), &got, want);
            }
        }
        // Fusion must actually happen at opt_level >= 1 and never at 0.
        let ops = g.kernel_op_count();
        assert_eq!(kernel_counts[0].1, ops, "{name}: opt_level 0 runs one kernel per op");
        assert!(kernel_counts[1].1 < ops, "{name}: opt_level 1 fuses something: {kernel_counts:?}");
        assert!(
            kernel_counts[2].1 <= kernel_counts[1].1,
            "{name}: opt_level 2 fuses at least as much as 1: {kernel_counts:?}"
        );
        let none = kernel_counts.iter().find(|k| k.0.ends_with("rules = none")).unwrap();
        assert_eq!(none.1, ops, "{name}: rules = none fuses nothing");
    });
}

/// Whether a gather of `g` reads ids that a kernel computes (not a parameter).
fn gathers_computed_ids(g: &autofusion_compiler::ir::Graph) -> bool {
    g.nodes.iter().any(|n| {
        matches!(n.op, Op::Gather { .. }) && !matches!(g.node(n.inputs[1]).op, Op::Param { .. })
    })
}

/// Random layer-like graphs (the compiler's property-test generator), planned at opt_level 2
/// and 3, compiled and checked against the reference.
#[test]
fn random_graphs_match_the_reference() {
    let target = Target::host();
    for (seed, level, src, unit) in common::random_units() {
        let m = common::load(&unit, Variant::Fused, &target, &dir(), &[]).unwrap();
        for s in [1i64, 13] {
            let ins = common::inputs(m.graph(), &[s], seed + 5);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(&refs).unwrap();
            common::assert_close(
                &format!("random graph {seed} at opt_level {level}, S = {s}:\n{src}"),
                &got,
                &want,
            );
        }
    }
}

/// Weight operands are packed once per tensor: a call with the same weights at another
/// sequence length packs nothing, a call with other weights (same shapes) packs again and
/// computes with the new ones, and a clone of a weight is the same tensor.
#[test]
fn packed_weights_follow_the_tensors_passed() {
    // A module of its own (the counters would see other tests' calls on a shared one).
    let (_, item, opts) =
        common::layer_graphs().into_iter().find(|(n, ..)| n == "ffn_f16").unwrap();
    let unit = Unit::with_options(opts, &item).unwrap();
    let m = common::load(&unit, Variant::Fused, &Target::host(), &dir(), &[]).unwrap();
    let p = m.packed_operands();
    assert!(p >= 2, "w1 and w2 are packed ahead ({p} packed operands)");
    let g = m.graph().clone();
    let a = common::inputs(&g, &[7], 1);
    let refs: Vec<&Tensor> = a.iter().collect();
    let before = m.packs_done();
    common::assert_close("first weights", &m.run(&refs).unwrap(), &m.reference(&refs).unwrap());
    assert_eq!(m.packs_done() - before, p);
    // Same weights, another S: nothing repacked.
    let x13 = common::inputs(&g, &[13], 2).swap_remove(0);
    let mut same: Vec<&Tensor> = a.iter().collect();
    same[0] = &x13;
    common::assert_close(
        "same weights, S = 13",
        &m.run(&same).unwrap(),
        &m.reference(&same).unwrap(),
    );
    let clones: Vec<Tensor> = a.to_vec();
    let cl: Vec<&Tensor> = clones.iter().collect();
    common::assert_close("cloned weights", &m.run(&cl).unwrap(), &m.reference(&cl).unwrap());
    assert_eq!(m.packs_done() - before, p, "same tensors are not packed again");
    // New weights of the same shapes: packed again, and the result follows them.
    let b = common::inputs(&g, &[7], 3);
    let refs_b: Vec<&Tensor> = b.iter().collect();
    common::assert_close(
        "second weights",
        &m.run(&refs_b).unwrap(),
        &m.reference(&refs_b).unwrap(),
    );
    assert_eq!(m.packs_done() - before, 2 * p);
    assert!(m.packed_bytes() > 0);
}
