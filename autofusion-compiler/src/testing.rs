//! Random graphs for property and differential tests (not a stable API).

use crate::builder::{BuildError, GraphBuilder};
use crate::dim::DimExpr;
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};

/// A small deterministic generator (xorshift).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// A random layer-like graph over `x, y: [S, D]`, `g: [D]`, `w: [D, D]`, `we: [D, E]`,
/// `wb: [E, D]` (D = 16, E = 24) of `n` steps: activations, broadcasts, row reductions, norms,
/// softmax, matmuls, attention-like blocks; one or two outputs. Built through `GraphBuilder`,
/// so a failure prints `Graph::dump`.
pub fn random_graph(seed: u64, n: usize) -> Graph {
    let mut r = Rng::new(seed);
    let mut b = GraphBuilder::new(&format!("random_{seed}"));
    b.static_dim("D", 16).static_dim("E", 24);
    let (s, d, e) = (DimExpr::sym("S"), DimExpr::constant(16), DimExpr::constant(24));
    let x = b.param("x", DType::F32, vec![s.clone(), d.clone()]);
    let y = b.param("y", DType::F32, vec![s, d.clone()]);
    let w = Weights {
        g: b.param("g", DType::F32, vec![d.clone()]),
        w: b.param("w", DType::F32, vec![d.clone(), d.clone()]),
        we: b.param("we", DType::F32, vec![d.clone(), e.clone()]),
        wb: b.param("wb", DType::F32, vec![e, d]),
    };
    let mut full = vec![x, y];
    for i in 0..n {
        let (a, c) = (*r.pick(&full), *r.pick(&full));
        let t = random_step(&mut b, &mut r, &w, a, c, &format!("t{i}"))
            .expect("random steps are well-typed over [S, D]");
        full.push(t);
    }
    let last = *full.last().unwrap();
    b.output(last);
    if r.below(2) == 1 {
        let one = b.constant(1.0, DType::F32);
        let other = b.binary(BinaryOp::Add, full[full.len() / 2], one, "other").unwrap();
        b.output(other);
    }
    b.finish().expect("a random graph verifies")
}

/// The weights every random step may read.
struct Weights {
    g: NodeId,
    w: NodeId,
    we: NodeId,
    wb: NodeId,
}

/// One random step on `[S, D]` values `a` and `c`, giving a `[S, D]` value named `name`.
fn random_step(
    b: &mut GraphBuilder,
    r: &mut Rng,
    w: &Weights,
    a: NodeId,
    c: NodeId,
    name: &str,
) -> Result<NodeId, BuildError> {
    use BinaryOp::{Add, Div, Mul, Sub};
    let f32c = |b: &mut GraphBuilder, v: f64| b.constant(v, DType::F32);
    match r.below(12) {
        0 => {
            use UnaryOp::*;
            b.unary(*r.pick(&[Silu, Tanh, Sigmoid, Relu, Gelu, Neg, GeluTanh]), a, name)
        }
        1 => b.binary(*r.pick(&[Add, Sub, Mul]), a, c, name),
        2 => {
            let shift = match r.below(3) {
                0 => f32c(b, 0.5),
                1 => w.g,
                _ => f32c(b, 1.0),
            };
            let scaled = b.binary(Mul, a, w.g, &format!("{name}_scaled"))?;
            b.binary(Add, scaled, shift, name)
        }
        3 => {
            let kind = *r.pick(&[ReduceKind::Mean, ReduceKind::Max, ReduceKind::Sum]);
            let red = b.op(Op::Reduce { kind, axis: 1 }, &[c], &format!("{name}_red"))?;
            b.binary(Sub, a, red, name)
        }
        4 => b.matmul(a, w.w, name),
        5 => b.op(Op::LayerNorm { eps: 1e-5 }, &[a, w.g, w.g], name),
        6 => {
            let sum = b.binary(Add, a, c, &format!("{name}_sum"))?;
            b.op(Op::RmsNorm { eps: 1e-6 }, &[sum, w.g], name)
        }
        7 => b.op(Op::Softmax { axis: 1 }, &[a], name),
        8 => {
            let up = b.matmul(a, w.we, &format!("{name}_up"))?;
            let act = b.unary(UnaryOp::Silu, up, &format!("{name}_act"))?;
            b.op(Op::Linear, &[act, w.wb, w.g], name)
        }
        9 => {
            let sq = b.binary(Mul, a, a, &format!("{name}_sq"))?;
            let neg = b.unary(UnaryOp::Neg, sq, &format!("{name}_neg"))?;
            b.unary(UnaryOp::Exp, neg, name)
        }
        10 => {
            let ct = b.op(Op::Transpose { perm: vec![1, 0] }, &[c], &format!("{name}_kt"))?;
            let scores = b.matmul(a, ct, &format!("{name}_scores"))?;
            let quarter = f32c(b, 0.25);
            let scaled = b.binary(Mul, scores, quarter, &format!("{name}_scaled"))?;
            let probs = b.op(Op::Softmax { axis: 1 }, &[scaled], &format!("{name}_probs"))?;
            b.matmul(probs, a, name)
        }
        _ => {
            let sq = b.binary(Mul, c, c, &format!("{name}_sq"))?;
            let one = f32c(b, 1.0);
            let den = b.binary(Add, one, sq, &format!("{name}_den"))?;
            b.binary(Div, a, den, name)
        }
    }
}
