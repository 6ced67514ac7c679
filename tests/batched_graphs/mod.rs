//! Graphs over a dynamic batch `B` with key-padding masks computed from an `attention_mask`
//! (shared by `tests/batched_attention.rs` and `tests/ascend.rs`).
#![allow(dead_code)]

use autofusion::{DType, Tensor};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, Graph, Op};
use autofusion_compiler::GraphBuilder;

pub const H: i64 = 4;
pub const DH: i64 = 8;

/// `causal`: with the causal mask; `expand`: the mask expanded to `[B, 1, S, S]` first, as
/// Hugging Face's `_prepare_4d_attention_mask` does.
pub fn attention(causal: bool, expand: bool) -> Graph {
    let (b, s) = (DimExpr::sym("B"), DimExpr::sym("S"));
    let (h, dh) = (DimExpr::constant(H), DimExpr::constant(DH));
    let name = match (causal, expand) {
        (false, false) => "padded_attention",
        (true, false) => "padded_causal_attention",
        (_, true) => "expanded_mask_attention",
    };
    let mut g = GraphBuilder::new(name);
    let qkv = vec![b.clone(), h, s.clone(), dh];
    let q = g.param("q", DType::F32, qkv.clone());
    let k = g.param("k", DType::F32, qkv.clone());
    let v = g.param("v", DType::F32, qkv);
    let mask = g.param("attention_mask", DType::I64, vec![b.clone(), s.clone()]);
    let mf = g.cast(mask, DType::F32, "mask_f").unwrap();
    let one = g.constant(1.0, DType::F32);
    let inv = g.binary(BinaryOp::Sub, one, mf, "inv").unwrap();
    let min = g.constant(f32::MIN as f64, DType::F32);
    let ext = g.binary(BinaryOp::Mul, inv, min, "ext").unwrap();
    let one_d = DimExpr::constant(1);
    let mut ext =
        g.reshape(ext, vec![b.clone(), one_d.clone(), one_d.clone(), s.clone()], "ext4").unwrap();
    if expand {
        let to = vec![b, one_d, s.clone(), s];
        ext = g.op(Op::Expand { shape: to }, &[ext], "ext_expanded").unwrap();
    }
    let kt = g.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k], "kt").unwrap();
    let qk = g.matmul(q, kt, "qk").unwrap();
    let scale = g.constant(1.0 / (DH as f64).sqrt(), DType::F32);
    let mut scores = g.binary(BinaryOp::Mul, qk, scale, "scaled").unwrap();
    scores = g.binary(BinaryOp::Add, scores, ext, "masked").unwrap();
    if causal {
        scores = g.op(Op::CausalMask, &[scores], "causal").unwrap();
    }
    let p = g.op(Op::Softmax { axis: 3 }, &[scores], "p").unwrap();
    let out = g.matmul(p, v, "out").unwrap();
    g.output(out);
    g.finish().unwrap()
}

/// Inputs at `B = b`, `S = s`: batch element i keeps its first `s - i` positions (at least
/// one), the last one (when b > 2) none at all.
pub fn inputs(b: usize, s: usize, seed: u64) -> Vec<Tensor> {
    let shape = [b, H as usize, s, DH as usize];
    let mut mask = Vec::with_capacity(b * s);
    for i in 0..b {
        let keep = if b > 2 && i == b - 1 { 0 } else { s.saturating_sub(i).max(1) };
        mask.extend((0..s).map(|j| (j < keep) as i64));
    }
    vec![
        Tensor::randn(&shape, 1.0, seed),
        Tensor::randn(&shape, 1.0, seed + 1),
        Tensor::randn(&shape, 1.0, seed + 2),
        Tensor::from_i64(&[b, s], mask).unwrap(),
    ]
}

pub const D: i64 = H * DH;

/// A BERT encoder layer over `[B, S, D]` with its padding mask from `attention_mask`: the Q, K,
/// V projections (sibling matmuls over a batch), heads by reshape and transpose, masked
/// attention, the output projection, residuals, LayerNorms and a GELU FFN.
pub fn encoder_layer() -> Graph {
    let (b, s) = (DimExpr::sym("B"), DimExpr::sym("S"));
    let c = DimExpr::constant;
    let mut g = GraphBuilder::new("batched_encoder");
    let x = g.param("x", DType::F32, vec![b.clone(), s.clone(), c(D)]);
    let mask = g.param("attention_mask", DType::I64, vec![b.clone(), s.clone()]);
    let w =
        |g: &mut GraphBuilder, name: &str, shape: Vec<DimExpr>| g.param(name, DType::F32, shape);
    let (wq, bq) = (w(&mut g, "wq", vec![c(D), c(D)]), w(&mut g, "bq", vec![c(D)]));
    let (wk, bk) = (w(&mut g, "wk", vec![c(D), c(D)]), w(&mut g, "bk", vec![c(D)]));
    let (wv, bv) = (w(&mut g, "wv", vec![c(D), c(D)]), w(&mut g, "bv", vec![c(D)]));
    let (wo, bo) = (w(&mut g, "wo", vec![c(D), c(D)]), w(&mut g, "bo", vec![c(D)]));
    let (g1, b1n) = (w(&mut g, "ln1_g", vec![c(D)]), w(&mut g, "ln1_b", vec![c(D)]));
    let (w1, b1) = (w(&mut g, "w1", vec![c(D), c(4 * D)]), w(&mut g, "b1", vec![c(4 * D)]));
    let (w2, b2) = (w(&mut g, "w2", vec![c(4 * D), c(D)]), w(&mut g, "b2", vec![c(D)]));
    let (g2, b2n) = (w(&mut g, "ln2_g", vec![c(D)]), w(&mut g, "ln2_b", vec![c(D)]));
    let heads = |g: &mut GraphBuilder, wt, bias, name: &str| {
        let y = g.op(Op::Linear, &[x, wt, bias], name).unwrap();
        let y = g.reshape(y, vec![b.clone(), s.clone(), c(H), c(DH)], &format!("{name}4")).unwrap();
        g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y], &format!("{name}h")).unwrap()
    };
    let q = heads(&mut g, wq, bq, "q");
    let k = heads(&mut g, wk, bk, "k");
    let v = heads(&mut g, wv, bv, "v");
    let mf = g.cast(mask, DType::F32, "mask_f").unwrap();
    let one = g.constant(1.0, DType::F32);
    let inv = g.binary(BinaryOp::Sub, one, mf, "inv").unwrap();
    let min = g.constant(f32::MIN as f64, DType::F32);
    let ext = g.binary(BinaryOp::Mul, inv, min, "ext").unwrap();
    let ext = g.reshape(ext, vec![b.clone(), c(1), c(1), s.clone()], "ext4").unwrap();
    let kt = g.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k], "kt").unwrap();
    let qk = g.matmul(q, kt, "qk").unwrap();
    let scale = g.constant(1.0 / (DH as f64).sqrt(), DType::F32);
    let sc = g.binary(BinaryOp::Mul, qk, scale, "scaled").unwrap();
    let sc = g.binary(BinaryOp::Add, sc, ext, "masked").unwrap();
    let p = g.op(Op::Softmax { axis: 3 }, &[sc], "p").unwrap();
    let a = g.matmul(p, v, "a").unwrap();
    let a = g.op(Op::Transpose { perm: vec![0, 2, 1, 3] }, &[a], "at").unwrap();
    let a = g.reshape(a, vec![b, s, c(D)], "a3").unwrap();
    let o = g.op(Op::Linear, &[a, wo, bo], "o").unwrap();
    let r = g.binary(BinaryOp::Add, x, o, "r").unwrap();
    let h = g.op(Op::LayerNorm { eps: 1e-12 }, &[r, g1, b1n], "h").unwrap();
    let f = g.op(Op::Linear, &[h, w1, b1], "f").unwrap();
    let f = g.unary(autofusion_compiler::ir::UnaryOp::Gelu, f, "gelu").unwrap();
    let f = g.op(Op::Linear, &[f, w2, b2], "f2").unwrap();
    let r2 = g.binary(BinaryOp::Add, h, f, "r2").unwrap();
    let out = g.op(Op::LayerNorm { eps: 1e-12 }, &[r2, g2, b2n], "out").unwrap();
    g.output(out);
    g.finish().unwrap()
}
