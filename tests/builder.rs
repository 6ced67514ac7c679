//! Graphs made without the DSL: `GraphBuilder` -> `Unit::from_graph` -> the host backend, run
//! against the reference interpreter, as an importer will drive the compiler.

mod common;

use autofusion::Tensor;
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, DType, Op, UnaryOp};
use autofusion_compiler::{GraphBuilder, Options, Unit, Variant};

/// A post-norm MLP block: `layer_norm(x + gelu(x w1 + b1) w2, g, b)`, dynamic S, in `dtype`.
fn mlp_block(dtype: DType) -> autofusion_compiler::ir::Graph {
    let (s, d, f) = (DimExpr::sym("S"), DimExpr::constant(16), DimExpr::constant(48));
    let mut b = GraphBuilder::new("mlp_block");
    b.static_dim("D", 16).static_dim("F", 48);
    let x = b.param("x", dtype, vec![s.clone(), d.clone()]);
    let w1 = b.param("w1", dtype, vec![d.clone(), f.clone()]);
    let b1 = b.param("b1", dtype, vec![f.clone()]);
    let w2 = b.param("w2", dtype, vec![f, d.clone()]);
    let g = b.param("ln_g", dtype, vec![d.clone()]);
    let beta = b.param("ln_b", dtype, vec![d]);
    let h = b.matmul(x, w1, "h").unwrap();
    let h = b.binary(BinaryOp::Add, h, b1, "h").unwrap();
    let a = b.unary(UnaryOp::Gelu, h, "a").unwrap();
    let y = b.matmul(a, w2, "y").unwrap();
    let r = b.binary(BinaryOp::Add, x, y, "r").unwrap();
    let out = b.op(Op::LayerNorm { eps: 1e-5 }, &[r, g, beta], "out").unwrap();
    b.output(out);
    b.finish().unwrap()
}

#[test]
fn built_graphs_run_fused_and_unfused_against_the_reference() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("builder");
    let target = autofusion_compiler::target::Target::host();
    for dtype in [DType::F32, DType::BF16] {
        for level in [0u8, 2, 3] {
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(mlp_block(dtype), opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
            for s in [1i64, 5, 64] {
                let ins = common::inputs(m.graph(), &[s], s as u64 + level as u64);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = m.reference(&refs).unwrap();
                let got = m.run(&refs).unwrap();
                common::assert_close(&format!("{dtype} opt {level} S = {s}"), &got, &want);
            }
        }
    }
}

#[test]
fn a_graph_that_does_not_verify_is_an_error() {
    let mut g = mlp_block(DType::F32);
    // Retype the residual as f16: its inputs no longer give its type.
    let r = g.nodes.iter().position(|n| n.name == "r").unwrap();
    g.nodes[r].dtype = DType::F16;
    let e = Unit::from_graph(g, Options::default()).unwrap_err();
    assert!(e.contains("is typed f16") && e.contains("f32"), "{e}");
}

/// RoPE as exporters spell it: `x * cos + concat([-x[..., h:], x[..., :h]], -1) * sin`, on a
/// value computed in the graph (`x = 2 u`), with the head dim dynamic. Canonicalisation turns
/// the slices, negation and concat into one `rotate_half`, which a kernel reads from memory;
/// every opt level matches the reference, and the reference matches RoPE computed here.
#[test]
fn rope_spelled_with_slices_becomes_one_rotate_half() {
    let (s, dh) = (DimExpr::sym("S"), DimExpr::sym("DH"));
    let h = dh.div_const(2).unwrap();
    let mut b = GraphBuilder::new("rope_spelled");
    let u = b.param("u", DType::F32, vec![s.clone(), dh.clone()]);
    let cos = b.param("cos", DType::F32, vec![s.clone(), dh.clone()]);
    let sin = b.param("sin", DType::F32, vec![s, dh.clone()]);
    let two = b.constant(2.0, DType::F32);
    let x = b.binary(BinaryOp::Mul, u, two, "x").unwrap();
    let hi = b.op(Op::Slice { axis: 1, start: h.clone(), end: dh }, &[x], "x2").unwrap();
    let lo = b.op(Op::Slice { axis: 1, start: DimExpr::constant(0), end: h }, &[x], "x1").unwrap();
    let neg = b.unary(UnaryOp::Neg, hi, "neg_x2").unwrap();
    let rot = b.op(Op::Concat { axis: 1 }, &[neg, lo], "rotated").unwrap();
    let a = b.binary(BinaryOp::Mul, x, cos, "a").unwrap();
    let c = b.binary(BinaryOp::Mul, rot, sin, "c").unwrap();
    let y = b.binary(BinaryOp::Add, a, c, "y").unwrap();
    b.output(y);
    let graph = b.finish().unwrap();

    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("builder");
    let target = autofusion_compiler::target::Target::host();
    for level in 0u8..=3 {
        let opts = Options { opt_level: level, ..Options::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let ops: Vec<&Op> = unit.graph.nodes.iter().map(|n| &n.op).collect();
        assert!(ops.contains(&&Op::RotateHalf), "opt {level}: {ops:?}");
        assert!(!ops.iter().any(|o| matches!(o, Op::Concat { .. })), "opt {level}: {ops:?}");
        let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
        let g = m.graph().clone();
        for (sv, dhv) in [(1i64, 2i64), (3, 64), (5, 6)] {
            let dims: Vec<i64> =
                g.dyn_dims.iter().map(|d| if d == "S" { sv } else { dhv }).collect();
            let ins = common::inputs(&g, &dims, (sv * dhv) as u64 + level as u64);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(&refs).unwrap();
            common::assert_close(&format!("opt {level} S {sv} DH {dhv}"), &got, &want);
            // RoPE by hand: the reference computes what the graph means.
            let [u, cos, sin] = [0, 1, 2].map(|i| ins[i].to_f32_vec());
            let (n, hh) = (dhv as usize, dhv as usize / 2);
            let mut by_hand = Vec::new();
            for r in 0..sv as usize {
                for j in 0..n {
                    let x = |c: usize| 2.0 * u[r * n + c];
                    let partner = if j < hh { -x(j + hh) } else { x(j - hh) };
                    by_hand.push(x(j) * cos[r * n + j] + partner * sin[r * n + j]);
                }
            }
            let want_f32 = want[0].to_f32_vec();
            for (k, (a, e)) in want_f32.iter().zip(&by_hand).enumerate() {
                assert!((a - e).abs() <= 1e-5 * (1.0 + e.abs()), "element {k}: {a} vs {e}");
            }
        }
    }
}

/// Attention whose output heads move back with chained swaps, as the DSL layers and
/// exporters write it (`transpose(transpose(a, 1, 2), 0, 1)`): canon composes them into one
/// permutation, so at opt_level 3 the flash kernel stores its output straight in the permuted
/// layout (`layout_store`, no copy kernel), and the result equals the same graph written with
/// the single permutation.
#[test]
fn chained_transposes_become_one_and_attention_stores_in_place() {
    let (s, c) = (DimExpr::sym("S"), DimExpr::constant);
    let graph = |chained: bool| {
        let mut b = GraphBuilder::new(if chained { "heads_chained" } else { "heads_single" });
        let q = b.param("q", DType::F32, vec![c(2), c(3), s.clone(), c(8)]);
        let k = b.param("k", DType::F32, vec![c(2), c(1), s.clone(), c(8)]);
        let v = b.param("v", DType::F32, vec![c(2), c(1), s.clone(), c(8)]);
        let att = Op::Attention { scale: 0.35, causal: true, mask: false };
        let a = b.op(att, &[q, k, v], "a").unwrap();
        let t = if chained {
            let t = b.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[a], "a_t1").unwrap();
            b.op(Op::Transpose { perm: vec![1, 0, 2, 3] }, &[t], "a_t2").unwrap()
        } else {
            b.op(Op::Transpose { perm: vec![2, 0, 1, 3] }, &[a], "a_t").unwrap()
        };
        let r = b.reshape(t, vec![s.clone(), c(48)], "a_r").unwrap();
        let y = b.binary(BinaryOp::Add, r, r, "y").unwrap();
        b.output(y);
        b.finish().unwrap()
    };
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("builder");
    let target = autofusion_compiler::target::Target::host();
    let opts = Options { opt_level: 3, ..Options::default() };
    let unit = Unit::from_graph(graph(true), opts.clone()).unwrap();
    let g = &unit.graph;
    let is_transpose = |n: &autofusion_compiler::ir::Node| matches!(n.op, Op::Transpose { .. });
    let chained = g.nodes.iter().filter(|n| is_transpose(n) && is_transpose(g.node(n.inputs[0])));
    assert_eq!(chained.count(), 0, "no transpose of a transpose is left");
    let composed = Op::Transpose { perm: vec![2, 0, 1, 3] };
    assert!(g.nodes.iter().any(|n| n.op == composed), "the heads' permutation composed");
    let plan = &unit.variant(Variant::Fused, &target).plan;
    let copy_only = plan
        .groups
        .iter()
        .filter(|grp| grp.nodes.iter().all(|m| matches!(g.node(*m).op, Op::Copy | Op::Reshape)));
    assert_eq!(copy_only.count(), 0, "no copy kernel for the permuted heads");
    let single = Unit::from_graph(graph(false), opts).unwrap();
    let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
    let want_m = common::load(&single, Variant::Unfused, &target, &dir, &[]).unwrap();
    for sv in [1i64, 5, 33] {
        let ins = common::inputs(m.graph(), &[sv], sv as u64);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let got = m.run(&refs).unwrap();
        common::assert_close(&format!("S = {sv}, reference"), &got, &m.reference(&refs).unwrap());
        let want = want_m.reference(&refs).unwrap();
        common::assert_close(&format!("S = {sv}, single permutation"), &got, &want);
    }
}
