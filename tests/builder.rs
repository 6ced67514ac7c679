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
