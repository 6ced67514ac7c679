//! Graphs on integer and bool tensors, built with `GraphBuilder` (shared by the host test
//! `tests/integers.rs` and the Ascend test `tests/ascend.rs`): every integer op, comparison,
//! logical op, `where`, `cumsum` and cast pair, and the way Hugging Face models compute
//! position ids and extended attention masks from an `attention_mask`.
#![allow(dead_code)]

use autofusion::Tensor;
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, DType, Graph, NodeId, Op, UnaryOp};
use autofusion_compiler::testing::Rng;
use autofusion_compiler::GraphBuilder;

/// Columns of every graph: prime, more than the host's 16 reduction lanes.
pub const W: usize = 37;

struct B(GraphBuilder);

impl B {
    fn bin(&mut self, op: BinaryOp, x: NodeId, y: NodeId, name: &str) -> NodeId {
        self.0.binary(op, x, y, name).unwrap()
    }
    fn un(&mut self, op: UnaryOp, x: NodeId, name: &str) -> NodeId {
        self.0.unary(op, x, name).unwrap()
    }
    fn cast(&mut self, x: NodeId, to: DType, name: &str) -> NodeId {
        self.0.cast(x, to, name).unwrap()
    }
    fn op(&mut self, op: Op, ins: &[NodeId], name: &str) -> NodeId {
        self.0.op(op, ins, name).unwrap()
    }
    fn out(&mut self, ids: &[NodeId]) {
        for id in ids {
            self.0.output(*id);
        }
    }
}

/// Integer arithmetic, comparisons, logic, `where`, running sums along both axes and casts
/// between every pair of storage types, with outputs of every type.
pub fn int_ops() -> Graph {
    let (s, w) = (DimExpr::sym("S"), DimExpr::constant(W as i64));
    let mut b = B(GraphBuilder::new("int_ops"));
    b.0.static_dim("W", W as i64);
    let ids = b.0.param("ids", DType::I64, vec![s.clone(), w.clone()]);
    let other = b.0.param("other", DType::I64, vec![w.clone()]);
    let small = b.0.param("small", DType::I32, vec![s.clone(), w.clone()]);
    let mask = b.0.param("mask", DType::Bool, vec![s.clone(), w.clone()]);
    let x = b.0.param("x", DType::F32, vec![s, w]);

    let sum = b.bin(BinaryOp::Add, ids, other, "sum");
    let diff = b.bin(BinaryOp::Sub, ids, other, "diff");
    let prod = b.bin(BinaryOp::Mul, sum, diff, "prod");
    let quot = b.bin(BinaryOp::Div, ids, other, "quot");
    let no = b.un(UnaryOp::Neg, other, "no");
    let mx = b.bin(BinaryOp::Max, ids, no, "mx");
    let mn = b.bin(BinaryOp::Min, ids, no, "mn");
    let r = b.un(UnaryOp::Relu, diff, "r");
    let arith = b.bin(BinaryOp::Add, prod, quot, "arith");
    let arith = b.bin(BinaryOp::Sub, arith, mx, "arith2");
    let arith = b.bin(BinaryOp::Add, arith, mn, "arith3");
    let arith = b.bin(BinaryOp::Add, arith, r, "arith4");

    // i32 arithmetic wraps at 32 bits; i64 -> i32 wraps, i32 -> i64 widens.
    let narrow = b.cast(ids, DType::I32, "narrow");
    let s32 = b.bin(BinaryOp::Mul, small, narrow, "s32");
    let k3 = b.0.constant(3.0, DType::I32);
    let s32 = b.bin(BinaryOp::Add, s32, k3, "s32b");
    let wide = b.cast(s32, DType::I64, "wide");

    let lt = b.bin(BinaryOp::Lt, ids, other, "lt");
    let le = b.bin(BinaryOp::Le, ids, other, "le");
    let gt = b.bin(BinaryOp::Gt, small, narrow, "gt");
    let ge = b.bin(BinaryOp::Ge, x, x, "ge");
    let eq = b.bin(BinaryOp::Eq, ids, other, "eq");
    let ne = b.un(UnaryOp::Not, eq, "ne");
    let a = b.bin(BinaryOp::And, lt, mask, "a");
    let o = b.bin(BinaryOp::Or, a, gt, "o");
    let logic = b.bin(BinaryOp::And, o, ne, "logic");
    let nle = b.un(UnaryOp::Not, le, "nle");
    let logic = b.bin(BinaryOp::Or, logic, nle, "logic2");
    let logic = b.bin(BinaryOp::And, logic, ge, "logic3");

    let k7 = b.0.constant(7.0, DType::I64);
    let picked = b.op(Op::Where, &[logic, ids, k7], "picked");
    let ninf = b.0.constant(f64::NEG_INFINITY, DType::F32);
    let masked = b.op(Op::Where, &[mask, x, ninf], "masked");

    let mi = b.cast(mask, DType::I64, "mi");
    let pos = b.op(Op::CumSum { axis: 1, exclusive: false }, &[mi], "pos");
    let down = b.op(Op::CumSum { axis: 0, exclusive: true }, &[small], "down");
    let k10 = b.0.constant(10.0, DType::F32);
    let x10 = b.bin(BinaryOp::Mul, x, k10, "x10");
    let trunc = b.cast(x10, DType::I64, "trunc");
    let trunc32 = b.cast(x10, DType::I32, "trunc32");
    let nz = b.cast(x, DType::Bool, "nz");
    let nz_i = b.cast(ids, DType::Bool, "nz_i");
    let both = b.bin(BinaryOp::And, nz, nz_i, "both");
    let half = b.cast(pos, DType::F16, "half");
    let bf = b.cast(both, DType::BF16, "bf");
    let fsum = b.op(Op::CumSum { axis: 1, exclusive: false }, &[x], "fsum");
    b.out(&[arith, wide, picked, masked, pos, down, trunc, trunc32, both, half, bf, fsum, logic]);
    b.0.finish().unwrap()
}

/// What Hugging Face encoders and decoders compute from an `attention_mask` (`[S, W]` of 0 / 1
/// integers): RoBERTa's position ids `cumsum(mask) * mask + padding_idx`, Llama's
/// `cumsum(mask) - 1` with padded positions set to 1, the extended additive mask
/// `(1 - mask) * finfo(f32).min`, and a masked mean of hidden states over the sequence.
pub fn hf_masks() -> Graph {
    let (s, w) = (DimExpr::sym("S"), DimExpr::constant(W as i64));
    let mut b = B(GraphBuilder::new("hf_masks"));
    b.0.static_dim("W", W as i64);
    let mask = b.0.param("attention_mask", DType::I64, vec![s.clone(), w.clone()]);
    let h = b.0.param("hidden", DType::F32, vec![s, w]);
    let c = b.op(Op::CumSum { axis: 1, exclusive: false }, &[mask], "c");
    let inc = b.bin(BinaryOp::Mul, c, mask, "inc");
    let pad = b.0.constant(1.0, DType::I64);
    let roberta = b.bin(BinaryOp::Add, inc, pad, "roberta_pos");
    let llama = b.bin(BinaryOp::Sub, c, pad, "llama_pos");
    let zero = b.0.constant(0.0, DType::I64);
    let is_pad = b.bin(BinaryOp::Eq, mask, zero, "is_pad");
    let llama = b.op(Op::Where, &[is_pad, pad, llama], "llama_pos_fill");
    let mf = b.cast(mask, DType::F32, "mf");
    let one = b.0.constant(1.0, DType::F32);
    let inv = b.bin(BinaryOp::Sub, one, mf, "inv");
    let min = b.0.constant(f32::MIN as f64, DType::F32);
    let ext = b.bin(BinaryOp::Mul, inv, min, "ext");
    let hm = b.bin(BinaryOp::Mul, h, mf, "hm");
    let num =
        b.op(Op::Reduce { kind: autofusion_compiler::ir::ReduceKind::Sum, axis: 1 }, &[hm], "num");
    let den =
        b.op(Op::Reduce { kind: autofusion_compiler::ir::ReduceKind::Sum, axis: 1 }, &[mf], "den");
    let den = b.bin(BinaryOp::Max, den, one, "den1");
    let mean = b.bin(BinaryOp::Div, num, den, "mean");
    b.out(&[roberta, llama, ext, mean]);
    b.0.finish().unwrap()
}

/// Uniform in `[-m, m]`.
fn int(rng: &mut Rng, m: i64) -> i64 {
    rng.below(2 * m as usize + 1) as i64 - m
}

/// Inputs for `g` at `S = s`: integers in `[-m, m]` (with zeros among them, so division by
/// zero is exercised), 0 / 1 masks with a padded tail per row, N(0, 1) floats with some
/// exact zeros.
pub fn inputs(g: &Graph, s: usize, m: i64, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    g.param_nodes()
        .iter()
        .map(|id| {
            let n = g.node(*id);
            let shape: Vec<usize> = if n.shape.len() == 1 { vec![W] } else { vec![s, W] };
            let len: usize = shape.iter().product();
            let name = &n.name;
            let padded = |rng: &mut Rng| -> Vec<i64> {
                (0..len / W)
                    .flat_map(|_| {
                        let valid = 1 + (rng.next_u64() % W as u64) as usize;
                        (0..W).map(move |j| (j < valid) as i64)
                    })
                    .collect()
            };
            match n.dtype {
                DType::I64 if name == "attention_mask" => {
                    Tensor::from_i64(&shape, padded(&mut rng))
                }
                DType::I64 => {
                    Tensor::from_i64(&shape, (0..len).map(|_| int(&mut rng, m)).collect())
                }
                DType::I32 => Tensor::from_i32(
                    &shape,
                    (0..len).map(|_| int(&mut rng, m.min(1 << 20)) as i32).collect(),
                ),
                DType::Bool => {
                    let v: Vec<bool> =
                        (0..len).map(|_| !rng.next_u64().is_multiple_of(3)).collect();
                    Tensor::from_bool(&shape, &v)
                }
                d => {
                    let t = Tensor::randn(&shape, 1.0, rng.next_u64());
                    let v = t
                        .to_f32_vec()
                        .into_iter()
                        .enumerate()
                        .map(|(i, x)| if i % 11 == 0 { 0.0 } else { x })
                        .collect();
                    Tensor::from_f32(&shape, v).unwrap().to_dtype(d)
                }
            }
            .unwrap()
        })
        .collect()
}

/// Vocabulary and position-table sizes of `embeddings`.
pub const VOCAB: i64 = 50;
pub const POSITIONS: i64 = 120;

/// A BERT-style embedding layer: token, position and token-type rows summed and normalised
/// (`layer_norm(tok[ids] + pos[positions] + types[token_types])`), ids `[S]`; and gathers of a
/// computed tensor along its other axes (ids of rank 2, negative ids), from tables of f16, i64
/// and bool.
pub fn embeddings() -> Graph {
    let (s, h) = (DimExpr::sym("S"), DimExpr::constant(W as i64));
    let mut b = B(GraphBuilder::new("embeddings"));
    b.0.static_dim("H", W as i64);
    let ids = b.0.param("input_ids", DType::I64, vec![s.clone()]);
    let pos = b.0.param("position_ids", DType::I64, vec![s.clone()]);
    let types = b.0.param("token_type_ids", DType::I32, vec![s.clone()]);
    let tok_t = b.0.param("word_embeddings", DType::F32, vec![DimExpr::constant(VOCAB), h.clone()]);
    let pos_t =
        b.0.param("position_embeddings", DType::F32, vec![DimExpr::constant(POSITIONS), h.clone()]);
    let type_t =
        b.0.param("token_type_embeddings", DType::F32, vec![DimExpr::constant(2), h.clone()]);
    let ln_g = b.0.param("ln_g", DType::F32, vec![h.clone()]);
    let ln_b = b.0.param("ln_b", DType::F32, vec![h.clone()]);
    let sel = b.0.param("sel", DType::I64, vec![DimExpr::constant(2), DimExpr::constant(3)]);
    let grid =
        b.0.param("grid", DType::F16, vec![DimExpr::constant(4), s.clone(), DimExpr::constant(5)]);
    let codes = b.0.param("codes", DType::I64, vec![DimExpr::constant(6), s]);
    let e = b.op(Op::Gather { axis: 0 }, &[tok_t, ids], "tok");
    let p = b.op(Op::Gather { axis: 0 }, &[pos_t, pos], "pos");
    let t = b.op(Op::Gather { axis: 0 }, &[type_t, types], "type");
    let e = b.bin(BinaryOp::Add, e, p, "sum");
    let e = b.bin(BinaryOp::Add, e, t, "sum2");
    let emb = b.op(Op::LayerNorm { eps: 1e-12 }, &[e, ln_g, ln_b], "embeddings");
    // A computed table, gathered along its middle and last axes.
    let two = b.0.constant(2.0, DType::F16);
    let gx = b.bin(BinaryOp::Mul, grid, two, "grid2");
    let mid = b.op(Op::Gather { axis: 2 }, &[gx, sel], "last_axis");
    let rows = b.op(Op::Gather { axis: 0 }, &[codes, sel], "int_rows");
    let zero = b.0.constant(0.0, DType::I64);
    let flags = b.bin(BinaryOp::Gt, codes, zero, "flags");
    let first = b.op(Op::Gather { axis: 1 }, &[flags, pos], "bool_rows");
    b.out(&[emb, mid, rows, first]);
    b.0.finish().unwrap()
}

/// Inputs of `embeddings` at `S = s`: ids in range (some negative: counted from the end).
pub fn embedding_inputs(g: &Graph, s: usize, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    g.param_nodes()
        .iter()
        .map(|id| {
            let n = g.node(*id);
            let shape: Vec<usize> =
                n.shape.iter().map(|d| d.as_const().map_or(s, |c| c as usize)).collect();
            let len: usize = shape.iter().product();
            let ids = |rng: &mut Rng, size: i64| -> Vec<i64> {
                (0..len).map(|_| int(rng, size - 1)).collect()
            };
            match n.name.as_str() {
                "input_ids" => Tensor::from_i64(&shape, ids(&mut rng, VOCAB)),
                "position_ids" => Tensor::from_i64(&shape, (0..len as i64).collect()),
                "token_type_ids" => {
                    Tensor::from_i32(&shape, (0..len).map(|i| (i % 2) as i32).collect())
                }
                "sel" => Tensor::from_i64(&shape, vec![0, 4, -1, 2, -5, 3]),
                "codes" => Tensor::from_i64(&shape, (0..len).map(|_| int(&mut rng, 9)).collect()),
                _ => Tensor::randn(&shape, 1.0, rng.next_u64()).to_dtype(n.dtype),
            }
            .unwrap()
        })
        .collect()
}

/// A lookup of ids a kernel computes: `table[input_ids + shift] * 2`, table `[10, 8]`.
pub fn shifted_lookup() -> Graph {
    let s = DimExpr::sym("S");
    let mut b = B(GraphBuilder::new("shifted_lookup"));
    let ids = b.0.param("input_ids", DType::I64, vec![s.clone()]);
    let shift = b.0.param("shift", DType::I64, vec![s]);
    let table = b.0.param("table", DType::F32, vec![DimExpr::constant(10), DimExpr::constant(8)]);
    let shifted = b.bin(BinaryOp::Add, ids, shift, "shifted");
    let rows = b.op(Op::Gather { axis: 0 }, &[table, shifted], "rows");
    let two = b.0.constant(2.0, DType::F32);
    let y = b.bin(BinaryOp::Mul, rows, two, "y");
    b.out(&[y]);
    b.0.finish().unwrap()
}
