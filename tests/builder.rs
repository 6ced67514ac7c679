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
