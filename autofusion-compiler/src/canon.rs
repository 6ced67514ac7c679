//! Canonicalisation: CSE on the user graph, expansion of sugar into primitives (norms into row
//! statistics + apply, softmax, linear, attention, rope), reductions and running sums moved to
//! the last axis, copies where a reshape cannot be a view, materialised outputs, dead-code removal.

use crate::builder::ConstPool;
use crate::dim::DimExpr;
use crate::ir::{self, BinaryOp, DType, Graph, Node, NodeId, Op, ReduceKind, UnaryOp};
use std::collections::HashMap;

struct B {
    nodes: Vec<Node>,
    name: String,
    line: u32,
    consts: ConstPool,
}

impl B {
    fn add(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        target: Option<(DType, &Vec<DimExpr>)>,
        part: &str,
    ) -> NodeId {
        let ins: Vec<(&Vec<DimExpr>, DType)> = inputs
            .iter()
            .map(|i| (&self.nodes[i.idx()].shape, self.nodes[i.idx()].dtype))
            .collect();
        let (shape, dtype) = ir::infer(&op, &ins, target)
            .unwrap_or_else(|e| panic!("canon built an ill-typed {}: {}", op.name(), e.msg));
        let name =
            if part.is_empty() { self.name.clone() } else { format!("{}.{part}", self.name) };
        self.nodes.push(Node { op, inputs, dtype, shape, name, line: self.line });
        NodeId(self.nodes.len() as u32 - 1)
    }
    fn konst(&mut self, v: f64, d: DType) -> NodeId {
        if let Some(id) = self.consts.get(v, d) {
            return id;
        }
        self.nodes.push(Node {
            op: Op::Const { value: v },
            inputs: vec![],
            dtype: d,
            shape: vec![],
            name: format!("{v:?}"),
            line: 0,
        });
        let id = NodeId(self.nodes.len() as u32 - 1);
        self.consts.insert(v, d, id);
        id
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId, part: &str) -> NodeId {
        self.add(Op::Binary(op), vec![a, b], None, part)
    }
    fn un(&mut self, op: UnaryOp, a: NodeId, part: &str) -> NodeId {
        self.add(Op::Unary(op), vec![a], None, part)
    }
    fn rank(&self, a: NodeId) -> usize {
        self.nodes[a.idx()].shape.len()
    }
    fn swap_last(&mut self, a: NodeId, axis: usize, part: &str) -> NodeId {
        let r = self.rank(a);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(axis, r - 1);
        self.add(Op::Transpose { perm }, vec![a], None, part)
    }
    /// Reduction over any axis, as a last-axis reduction between transposes.
    fn reduce(&mut self, kind: ReduceKind, a: NodeId, axis: usize, part: &str) -> NodeId {
        let r = self.rank(a);
        if self.nodes[a.idx()].shape[axis] == DimExpr::constant(1) {
            // Reducing one element is the identity.
            return self.add(Op::Copy, vec![a], None, part);
        }
        if axis + 1 == r {
            return self.add(Op::Reduce { kind, axis }, vec![a], None, part);
        }
        let t = self.swap_last(a, axis, &format!("{part}.t"));
        let t = self.materialize_if_view(t);
        let red = self.add(Op::Reduce { kind, axis: r - 1 }, vec![t], None, part);
        self.swap_last(red, axis, &format!("{part}.back"))
    }
    fn materialize_if_view(&mut self, a: NodeId) -> NodeId {
        if self.nodes[a.idx()].op.is_view() {
            self.add(Op::Copy, vec![a], None, "contig")
        } else {
            a
        }
    }
    fn softmax_last(&mut self, x: NodeId, part: &str) -> NodeId {
        let r = self.rank(x);
        let m = self.add(
            Op::Reduce { kind: ReduceKind::Max, axis: r - 1 },
            vec![x],
            None,
            &format!("{part}max"),
        );
        let xc = self.bin(BinaryOp::Sub, x, m, &format!("{part}shift"));
        let e = self.un(UnaryOp::Exp, xc, &format!("{part}exp"));
        let s = self.add(
            Op::Reduce { kind: ReduceKind::Sum, axis: r - 1 },
            vec![e],
            None,
            &format!("{part}sum"),
        );
        self.bin(BinaryOp::Div, e, s, part.trim_end_matches('.'))
    }
}

/// Is the value laid out contiguously in row-major order (so a reshape of it is a view)?
fn contiguous(nodes: &[Node], id: NodeId) -> bool {
    let n = &nodes[id.idx()];
    match &n.op {
        Op::Reshape => contiguous(nodes, n.inputs[0]),
        Op::Transpose { perm } => {
            let src = &nodes[n.inputs[0].idx()].shape;
            // Only axes of extent 1 move.
            let moved: Vec<usize> =
                perm.iter().copied().filter(|&a| src[a] != DimExpr::constant(1)).collect();
            moved.windows(2).all(|w| w[0] < w[1]) && contiguous(nodes, n.inputs[0])
        }
        Op::Slice { axis, .. } => {
            let src = &nodes[n.inputs[0].idx()].shape;
            src[..*axis].iter().all(|d| *d == DimExpr::constant(1))
                && contiguous(nodes, n.inputs[0])
        }
        _ => true,
    }
}

/// Check a pass's result in debug builds and tests (the verifier after every pass).
fn checked(pass: &str, g: Graph) -> Graph {
    if cfg!(debug_assertions) {
        if let Err(e) = ir::verify(&g) {
            panic!("IR verifier failed after `{pass}`: {e}\n{}", g.dump());
        }
    }
    g
}

pub fn canonicalize(g: &Graph) -> Graph {
    let g = checked("cse", cse(g));
    let mut b = B { nodes: Vec::new(), name: String::new(), line: 0, consts: ConstPool::default() };
    let mut map: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        b.name = n.name.clone();
        b.line = n.line;
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.idx()]).collect();
        let id = b.expand(n, ins);
        map.push(id);
    }
    let outputs = b.materialize_outputs(&g.outputs, &map);
    let out = checked("expand", Graph { nodes: b.nodes, outputs, ..g.clone() });
    let out = checked("cse", cse(&out));
    checked("dce", dce(&out))
}

impl B {
    /// Add node `n` (its inputs already mapped to `ins`), expanding sugar into primitives.
    fn expand(&mut self, n: &Node, ins: Vec<NodeId>) -> NodeId {
        if let Op::Concat { axis } = n.op {
            if let Some(x) = self.rotated_half(axis, &ins) {
                return self.add(Op::RotateHalf, vec![x], None, "");
            }
        }
        match &n.op {
            Op::Const { value } => self.konst(*value, n.dtype),
            Op::LayerNorm { eps } => self.layer_norm(ins[0], ins[1], ins[2], *eps, n.dtype),
            Op::RmsNorm { eps } => self.rms_norm(ins[0], ins[1], *eps, n.dtype),
            Op::Softmax { axis } => {
                let r = self.rank(ins[0]);
                if axis + 1 == r {
                    self.softmax_last(ins[0], "")
                } else {
                    let t = self.swap_last(ins[0], *axis, "t");
                    let t = self.materialize_if_view(t);
                    let s = self.softmax_last(t, "");
                    self.swap_last(s, *axis, "back")
                }
            }
            Op::Reduce { kind, axis } => self.reduce(*kind, ins[0], *axis, ""),
            Op::CumSum { axis, exclusive } if axis + 1 != self.rank(ins[0]) => {
                // A running sum along the rows of a rows kernel: other axes are moved last.
                let r = self.rank(ins[0]);
                let t = self.swap_last(ins[0], *axis, "t");
                let t = self.materialize_if_view(t);
                let s =
                    self.add(Op::CumSum { axis: r - 1, exclusive: *exclusive }, vec![t], None, "");
                self.swap_last(s, *axis, "back")
            }
            Op::Linear => {
                let mm = self.add(Op::MatMul, vec![ins[0], ins[1]], None, "mm");
                self.bin(BinaryOp::Add, mm, ins[2], "")
            }
            Op::Attention { scale, causal, mask } => {
                self.attention(&ins, *scale, *causal, *mask, n.dtype)
            }
            Op::Rope => self.rope(ins[0], ins[1], ins[2]),
            Op::Transpose { perm } => self.transpose(ins[0], perm, n),
            Op::Reshape if !contiguous(&self.nodes, ins[0]) => {
                let c = self.add(Op::Copy, vec![ins[0]], None, "contig");
                let target = n.shape.clone();
                self.add(Op::Reshape, vec![c], Some((n.dtype, &target)), "")
            }
            op => {
                let tgt = (n.dtype, &n.shape);
                self.add(op.clone(), ins, Some(tgt), "")
            }
        }
    }

    /// `transpose(x, perm)`, composed with `x`'s own permutation when `x` is a transpose:
    /// models move heads with chained swaps (`transpose(transpose(a, 1, 2), 0, 1)`), and one
    /// permutation is a view `layout_store` can match, so the kernel computing `a` writes the
    /// permuted copy itself.
    fn transpose(&mut self, x: NodeId, perm: &[usize], n: &Node) -> NodeId {
        let target = (n.dtype, &n.shape);
        match &self.nodes[x.idx()].op {
            Op::Transpose { perm: inner } => {
                let src = self.nodes[x.idx()].inputs[0];
                // Axis i of the result is axis perm[i] of x, which is axis inner[perm[i]] of src.
                let composed: Vec<usize> = perm.iter().map(|&i| inner[i]).collect();
                self.add(Op::Transpose { perm: composed }, vec![src], Some(target), "")
            }
            _ => self.add(Op::Transpose { perm: perm.to_vec() }, vec![x], Some(target), ""),
        }
    }

    /// `layer_norm(x, gm, bt, eps)` as mean and variance rows, then the apply.
    fn layer_norm(&mut self, x: NodeId, gm: NodeId, bt: NodeId, eps: f64, dtype: DType) -> NodeId {
        let r = self.rank(x);
        let mean =
            self.add(Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 }, vec![x], None, "mean");
        let xc = self.bin(BinaryOp::Sub, x, mean, "center");
        let sq = self.bin(BinaryOp::Mul, xc, xc, "sq");
        let var =
            self.add(Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 }, vec![sq], None, "var");
        let e = self.konst(eps, dtype);
        let ve = self.bin(BinaryOp::Add, var, e, "var_eps");
        let rstd = self.un(UnaryOp::Rsqrt, ve, "rstd");
        // The apply re-centres x on its own, so it can move into a matmul prologue
        // without keeping the centred tensor alive.
        let xc2 = self.bin(BinaryOp::Sub, x, mean, "apply_center");
        let xn = self.bin(BinaryOp::Mul, xc2, rstd, "normed");
        let sc = self.bin(BinaryOp::Mul, xn, gm, "scaled");
        self.bin(BinaryOp::Add, sc, bt, "")
    }

    /// `rms_norm(x, gm, eps)` as a mean-square row, then the apply.
    fn rms_norm(&mut self, x: NodeId, gm: NodeId, eps: f64, dtype: DType) -> NodeId {
        let r = self.rank(x);
        let sq = self.bin(BinaryOp::Mul, x, x, "sq");
        let ms = self.add(Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 }, vec![sq], None, "ms");
        let e = self.konst(eps, dtype);
        let me = self.bin(BinaryOp::Add, ms, e, "ms_eps");
        let rr = self.un(UnaryOp::Rsqrt, me, "rrms");
        let xn = self.bin(BinaryOp::Mul, x, rr, "normed");
        self.bin(BinaryOp::Mul, xn, gm, "")
    }

    /// `attention(q, k, v, scale, causal | mask)` as scores, mask, softmax and the product with v.
    fn attention(
        &mut self,
        ins: &[NodeId],
        scale: f64,
        causal: bool,
        mask: bool,
        dtype: DType,
    ) -> NodeId {
        let (q, k, v) = (ins[0], ins[1], ins[2]);
        let r = self.rank(k);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let kt = self.add(Op::Transpose { perm }, vec![k], None, "k_t");
        let s = self.add(Op::MatMul, vec![q, kt], None, "scores");
        let sc = self.konst(scale, dtype);
        let mut s = self.bin(BinaryOp::Mul, s, sc, "scaled");
        if mask {
            s = self.bin(BinaryOp::Add, s, ins[3], "masked");
        }
        if causal {
            s = self.add(Op::CausalMask, vec![s], None, "causal");
        }
        let p = self.softmax_last(s, "probs.");
        self.add(Op::MatMul, vec![p, v], None, "")
    }

    /// `x` when `concat(ins, axis)` is `rotate_half(x)` spelled out, as exporters write it:
    /// `concat([-x[..., h:], x[..., :h]], -1)` with `2 h` the length of `x`'s last axis.
    fn rotated_half(&self, axis: usize, ins: &[NodeId]) -> Option<NodeId> {
        let node = |i: NodeId| &self.nodes[i.idx()];
        let [neg, first] = ins else { return None };
        let Op::Unary(UnaryOp::Neg) = node(*neg).op else { return None };
        let second = node(*neg).inputs[0];
        let (x, n) = (node(*first).inputs.first().copied()?, self.rank(*first));
        let len = node(x).shape.get(axis)?.clone();
        let h = len.div_const(2)?;
        let is_slice = |s: NodeId, from: &DimExpr, to: &DimExpr| {
            node(s).op == Op::Slice { axis, start: from.clone(), end: to.clone() }
                && node(s).inputs == [x]
        };
        let zero = DimExpr::constant(0);
        (axis + 1 == n
            && h.mul(&DimExpr::constant(2)) == len
            && is_slice(*first, &zero, &h)
            && is_slice(second, &h, &len))
        .then_some(x)
    }

    /// `rope(x, cos, sin)` as `x * cos + rotate_half(x) * sin` (`Op::RotateHalf`).
    fn rope(&mut self, x: NodeId, cos: NodeId, sin: NodeId) -> NodeId {
        // x * cos + rotate_half(x) * sin: one rows kernel reads x twice (the second time at
        // the partner column), where slices, a negation and a concat took three kernels.
        let rot = self.add(Op::RotateHalf, vec![x], None, "rotated");
        let a = self.bin(BinaryOp::Mul, x, cos, "cos");
        let c = self.bin(BinaryOp::Mul, rot, sin, "sin");
        self.bin(BinaryOp::Add, a, c, "")
    }

    /// The new ids of `outputs` (old ids, through `map`), each written by a kernel.
    fn materialize_outputs(&mut self, outputs: &[NodeId], map: &[NodeId]) -> Vec<NodeId> {
        // Outputs are written by kernels: materialise views, parameters, constants and repeats.
        let mut out = Vec::new();
        for o in outputs {
            let mut id = map[o.idx()];
            let n = &self.nodes[id.idx()];
            if n.op.is_view()
                || matches!(n.op, Op::Param { .. } | Op::Const { .. })
                || out.contains(&id)
            {
                self.name = format!("{}.out", n.name);
                id = self.add(Op::Copy, vec![id], None, "");
            }
            out.push(id);
        }
        out
    }
}

/// Common-subexpression elimination over structurally equal nodes (params never merge).
pub fn cse(g: &Graph) -> Graph {
    let mut seen: HashMap<String, NodeId> = HashMap::new();
    let mut map: Vec<NodeId> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for n in &g.nodes {
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.idx()]).collect();
        let key = format!("{:?}|{:?}|{:?}|{:?}", n.op, ins, n.dtype, n.shape);
        // The two centrings of a norm are kept apart on purpose (see `B::layer_norm`).
        let keep_apart = n.name.ends_with(".apply_center");
        if !matches!(n.op, Op::Param { .. }) && !keep_apart {
            if let Some(&id) = seen.get(&key) {
                map.push(id);
                continue;
            }
        }
        nodes.push(Node { inputs: ins, ..n.clone() });
        let id = NodeId(nodes.len() as u32 - 1);
        seen.insert(key, id);
        map.push(id);
    }
    let outputs = g.outputs.iter().map(|o| map[o.idx()]).collect();
    Graph { nodes, outputs, ..g.clone() }
}

/// Remove nodes that no output depends on (parameters stay: they are the signature; so do
/// cache writes: the state they leave is a result of the call).
pub fn dce(g: &Graph) -> Graph {
    let mut live = vec![false; g.nodes.len()];
    for o in &g.outputs {
        live[o.idx()] = true;
    }
    for id in g.ids().rev() {
        if live[id.idx()] || matches!(g.node(id).op, Op::Param { .. } | Op::CacheWrite { .. }) {
            live[id.idx()] = true;
            for i in &g.node(id).inputs {
                live[i.idx()] = true;
            }
        }
    }
    let mut map = vec![NodeId(u32::MAX); g.nodes.len()];
    let mut nodes = Vec::new();
    for id in g.ids() {
        if live[id.idx()] {
            let n = g.node(id);
            nodes.push(Node {
                inputs: n.inputs.iter().map(|i| map[i.idx()]).collect(),
                ..n.clone()
            });
            map[id.idx()] = NodeId(nodes.len() as u32 - 1);
        }
    }
    let outputs = g.outputs.iter().map(|o| map[o.idx()]).collect();
    Graph { nodes, outputs, ..g.clone() }
}
