//! Canonicalisation: CSE on the user graph, expansion of sugar into primitives (norms into row
//! statistics + apply, softmax, linear, attention, rope), reductions moved to the last axis,
//! copies where a reshape cannot be a view, materialised outputs, dead-code removal.

use crate::dim::DimExpr;
use crate::ir::{self, BinaryOp, DType, Graph, Node, NodeId, Op, ReduceKind, UnaryOp};
use std::collections::HashMap;

struct B {
    nodes: Vec<Node>,
    name: String,
    line: u32,
    consts: HashMap<(u64, DType), NodeId>,
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
        if let Some(id) = self.consts.get(&(v.to_bits(), d)) {
            return *id;
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
        self.consts.insert((v.to_bits(), d), id);
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
    let mut b = B { nodes: Vec::new(), name: String::new(), line: 0, consts: HashMap::new() };
    let mut map: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        b.name = n.name.clone();
        b.line = n.line;
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.idx()]).collect();
        let id = match &n.op {
            Op::Const { value } => b.konst(*value, n.dtype),
            Op::LayerNorm { eps } => {
                let (x, gm, bt) = (ins[0], ins[1], ins[2]);
                let r = b.rank(x);
                let mean = b.add(
                    Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 },
                    vec![x],
                    None,
                    "mean",
                );
                let xc = b.bin(BinaryOp::Sub, x, mean, "center");
                let sq = b.bin(BinaryOp::Mul, xc, xc, "sq");
                let var = b.add(
                    Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 },
                    vec![sq],
                    None,
                    "var",
                );
                let e = b.konst(*eps, n.dtype);
                let ve = b.bin(BinaryOp::Add, var, e, "var_eps");
                let rstd = b.un(UnaryOp::Rsqrt, ve, "rstd");
                // The apply re-centres x on its own, so it can move into a matmul prologue
                // without keeping the centred tensor alive.
                let xc2 = b.bin(BinaryOp::Sub, x, mean, "apply_center");
                let xn = b.bin(BinaryOp::Mul, xc2, rstd, "normed");
                let sc = b.bin(BinaryOp::Mul, xn, gm, "scaled");
                b.bin(BinaryOp::Add, sc, bt, "")
            }
            Op::RmsNorm { eps } => {
                let (x, gm) = (ins[0], ins[1]);
                let r = b.rank(x);
                let sq = b.bin(BinaryOp::Mul, x, x, "sq");
                let ms =
                    b.add(Op::Reduce { kind: ReduceKind::Mean, axis: r - 1 }, vec![sq], None, "ms");
                let e = b.konst(*eps, n.dtype);
                let me = b.bin(BinaryOp::Add, ms, e, "ms_eps");
                let rr = b.un(UnaryOp::Rsqrt, me, "rrms");
                let xn = b.bin(BinaryOp::Mul, x, rr, "normed");
                b.bin(BinaryOp::Mul, xn, gm, "")
            }
            Op::Softmax { axis } => {
                let r = b.rank(ins[0]);
                if axis + 1 == r {
                    b.softmax_last(ins[0], "")
                } else {
                    let t = b.swap_last(ins[0], *axis, "t");
                    let t = b.materialize_if_view(t);
                    let s = b.softmax_last(t, "");
                    b.swap_last(s, *axis, "back")
                }
            }
            Op::Reduce { kind, axis } => b.reduce(*kind, ins[0], *axis, ""),
            Op::Linear => {
                let mm = b.add(Op::MatMul, vec![ins[0], ins[1]], None, "mm");
                b.bin(BinaryOp::Add, mm, ins[2], "")
            }
            Op::Attention { scale, causal, mask } => {
                let (q, k, v) = (ins[0], ins[1], ins[2]);
                let r = b.rank(k);
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 2, r - 1);
                let kt = b.add(Op::Transpose { perm }, vec![k], None, "k_t");
                let s = b.add(Op::MatMul, vec![q, kt], None, "scores");
                let sc = b.konst(*scale, n.dtype);
                let mut s = b.bin(BinaryOp::Mul, s, sc, "scaled");
                if *mask {
                    s = b.bin(BinaryOp::Add, s, ins[3], "masked");
                }
                if *causal {
                    s = b.add(Op::CausalMask, vec![s], None, "causal");
                }
                let p = b.softmax_last(s, "probs.");
                b.add(Op::MatMul, vec![p, v], None, "")
            }
            Op::Rope => {
                let (x, cos, sin) = (ins[0], ins[1], ins[2]);
                let r = b.rank(x);
                let d = b.nodes[x.idx()].shape[r - 1].clone();
                let h = d.div_const(2).unwrap();
                let x1 = b.add(
                    Op::Slice { axis: r - 1, start: DimExpr::constant(0), end: h.clone() },
                    vec![x],
                    None,
                    "x1",
                );
                let x2 = b.add(Op::Slice { axis: r - 1, start: h, end: d }, vec![x], None, "x2");
                let nx2 = b.un(UnaryOp::Neg, x2, "neg_x2");
                let rot = b.add(Op::Concat { axis: r - 1 }, vec![nx2, x1], None, "rotated");
                let a = b.bin(BinaryOp::Mul, x, cos, "cos");
                let c = b.bin(BinaryOp::Mul, rot, sin, "sin");
                b.bin(BinaryOp::Add, a, c, "")
            }
            Op::Reshape if !contiguous(&b.nodes, ins[0]) => {
                let c = b.add(Op::Copy, vec![ins[0]], None, "contig");
                let target = n.shape.clone();
                b.add(Op::Reshape, vec![c], Some((n.dtype, &target)), "")
            }
            op => {
                let tgt = (n.dtype, &n.shape);
                b.add(op.clone(), ins, Some(tgt), "")
            }
        };
        map.push(id);
    }
    // Outputs are written by kernels: materialise views, parameters, constants and repeats.
    let mut outputs = Vec::new();
    for o in &g.outputs {
        let mut id = map[o.idx()];
        let n = &b.nodes[id.idx()];
        if n.op.is_view()
            || matches!(n.op, Op::Param { .. } | Op::Const { .. })
            || outputs.contains(&id)
        {
            b.name = format!("{}.out", n.name);
            id = b.add(Op::Copy, vec![id], None, "");
        }
        outputs.push(id);
    }
    let out = checked("expand", Graph { nodes: b.nodes, outputs, ..g.clone() });
    let out = checked("cse", cse(&out));
    checked("dce", dce(&out))
}

/// Common-subexpression elimination over structurally equal nodes (params never merge).
pub fn cse(g: &Graph) -> Graph {
    let mut seen: HashMap<String, NodeId> = HashMap::new();
    let mut map: Vec<NodeId> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for n in &g.nodes {
        let ins: Vec<NodeId> = n.inputs.iter().map(|i| map[i.idx()]).collect();
        let key = format!("{:?}|{:?}|{:?}|{:?}", n.op, ins, n.dtype, n.shape);
        // The two centrings of a norm are kept apart on purpose (see canonicalize).
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

/// Remove nodes that no output depends on (parameters stay: they are the signature).
pub fn dce(g: &Graph) -> Graph {
    let mut live = vec![false; g.nodes.len()];
    for o in &g.outputs {
        live[o.idx()] = true;
    }
    for id in g.ids().rev() {
        if live[id.idx()] || matches!(g.node(id).op, Op::Param { .. }) {
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
