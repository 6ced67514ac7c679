//! Attention over a dynamic batch `B` and heads, with key-padding masks computed in the graph
//! from an `attention_mask` (`[B, S]` int64) the way Hugging Face models compute them (the
//! extended additive mask `(1 - mask) * finfo(f32).min`, viewed as `[B, 1, 1, S]`), alone
//! (encoders) and with the causal mask (decoders); batch elements of different lengths and one
//! fully padded. Fused at every opt level against the reference.

mod common;

#[path = "batched_graphs/mod.rs"]
mod batched_graphs;

use autofusion::{DType, Tensor};
use autofusion_compiler::{target::Target, Options, Unit, Variant};
use batched_graphs::{attention, encoder_layer, inputs};
use std::path::PathBuf;

#[test]
fn padded_attention_over_batch_and_heads_matches_the_reference() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("batched_attention");
    for (causal, expand) in [(false, false), (true, false), (true, true)] {
        let graph = attention(causal, expand);
        for level in 0..=3u8 {
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
            for (b, s) in [(1usize, 1usize), (1, 7), (3, 7), (4, 33)] {
                let ins = inputs(b, s, (b * 100 + s) as u64);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = m.reference(&refs).unwrap();
                let got = m.run(&refs).unwrap();
                assert!(got[0].to_f32_vec().iter().all(|x| x.is_finite()), "no NaN");
                let what = format!("{}, opt_level {level}, B = {b}, S = {s}", graph.name);
                common::assert_close(&what, &got, &want);
            }
            let plan = unit.variant(Variant::Fused, &Target::host()).plan;
            let kinds: Vec<String> = plan.groups.iter().map(|g| format!("{:?}", g.kind)).collect();
            eprintln!("{} at opt_level {level}: {kinds:?}", graph.name);
        }
    }
}

#[test]
fn a_batched_encoder_layer_runs_through_every_kernel_kind() {
    use autofusion_compiler::plan::{Rule, RuleSet};
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("batched_encoder");
    let graph = encoder_layer();
    let mut every = RuleSet::all();
    every.insert(Rule::QkvHorizontal);
    let configs = (0..=3u8).map(|l| (l, RuleSet::all())).chain([(3, every)]);
    let mut kinds_seen = std::collections::BTreeSet::new();
    for (level, rules) in configs {
        let opts = Options { opt_level: level, rules, ..Options::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
        for (b, s) in [(1usize, 5usize), (3, 7), (2, 33)] {
            let mut ins = common::inputs(m.graph(), &[b as i64, s as i64], (b * 10 + s) as u64);
            // Batch element i keeps its first s - i positions.
            let mask: Vec<i64> =
                (0..b).flat_map(|i| (0..s).map(move |j| (j + i < s) as i64)).collect();
            ins[1] = Tensor::from_i64(&[b, s], mask).unwrap();
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(&refs).unwrap();
            common::assert_close(&format!("opt_level {level}, B = {b}, S = {s}"), &got, &want);
        }
        let plan = unit.variant(Variant::Fused, &Target::host()).plan;
        kinds_seen.extend(plan.groups.iter().map(|g| format!("{:?}", g.kind)));
        eprintln!("opt_level {level}: {} kernels", plan.groups.len());
    }
    for kind in ["Elementwise", "MatMul", "FlashAttention", "Horizontal"] {
        assert!(kinds_seen.contains(kind), "a {kind} kernel over the batch: {kinds_seen:?}");
    }
}

/// Weights read by batched matmuls: `x: [B, S, D] @ w: [D, N]` (broadcast over B), a per-head
/// weight `[H, D, N]` under `[B, H, S, D]` (broadcast over B, not over H) and a per-batch one
/// `[B, 1, D, N]` (broadcast over H). Each is packed once per distinct matrix, not once per
/// batch index, and every batch index reads the right one.
#[test]
fn weights_broadcast_over_the_batch_are_packed_once() {
    use autofusion_compiler::abi::packed_elems;
    use autofusion_compiler::dim::DimExpr;
    use autofusion_compiler::ir::BinaryOp;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("broadcast_packs");
    let (b, s) = (DimExpr::sym("B"), DimExpr::sym("S"));
    let c = DimExpr::constant;
    let (h, d, n) = (3i64, 16i64, 40i64);
    let mut g = autofusion_compiler::GraphBuilder::new("broadcast_weights");
    let x = g.param("x", DType::F32, vec![b.clone(), s.clone(), c(d)]);
    let w = g.param("w", DType::F32, vec![c(d), c(n)]);
    let xh = g.param("xh", DType::F32, vec![b.clone(), c(h), s.clone(), c(d)]);
    let wh = g.param("w_heads", DType::F32, vec![c(h), c(d), c(n)]);
    let wb = g.param("w_batch", DType::F32, vec![b.clone(), c(1), c(d), c(n)]);
    let y = g.matmul(x, w, "y").unwrap();
    let yh = g.matmul(xh, wh, "yh").unwrap();
    let yb = g.matmul(xh, wb, "yb").unwrap();
    let sum = g.binary(BinaryOp::Add, yh, yb, "sum").unwrap();
    g.output(y).output(sum);
    let graph = g.finish().unwrap();
    for level in [0u8, 3] {
        let opts = Options { opt_level: level, ..Options::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
        for (bs, ss) in [(1usize, 5usize), (4, 3), (7, 9)] {
            let ins = common::inputs(m.graph(), &[bs as i64, ss as i64], (bs * 10 + ss) as u64);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(&refs).unwrap();
            let what = format!("opt_level {level}, B = {bs}, S = {ss}");
            common::assert_close(&what, &got, &want);
            // One copy of w, h of w_heads, B of w_batch (the micro-kernel rounds N up).
            let matrices = 1 + h + bs as i64;
            let one = packed_elems(1, d, n) as usize * 4;
            assert_eq!(m.packed_bytes(), matrices as usize * one, "{what}: packed bytes");
        }
    }
}
