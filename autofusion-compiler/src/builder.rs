//! Graphs without the DSL: a builder that types every node as it is added (the same inference
//! the front end uses), for importers, tools and tests. `Unit::from_graph` takes its result.
//!
//! ```
//! use autofusion_compiler::dim::DimExpr;
//! use autofusion_compiler::ir::{DType, UnaryOp};
//! use autofusion_compiler::{GraphBuilder, Options, Unit};
//!
//! let (s, d) = (DimExpr::sym("S"), DimExpr::constant(8));
//! let mut b = GraphBuilder::new("ffn");
//! let x = b.param("x", DType::F32, vec![s.clone(), d.clone()]);
//! let w = b.param("w", DType::F32, vec![d.clone(), d.clone()]);
//! let h = b.matmul(x, w, "h").unwrap();
//! let y = b.unary(UnaryOp::Silu, h, "y").unwrap();
//! b.output(y);
//! let unit = Unit::from_graph(b.finish().unwrap(), Options::default()).unwrap();
//! assert_eq!(unit.graph.dyn_dims, ["S"]);
//! ```

use crate::dim::{shape_str, DimExpr, Shape};
use crate::ir::{self, BinaryOp, DType, Graph, Node, NodeId, Op, UnaryOp};
use std::fmt;

/// A node the builder could not add, or a graph it could not finish.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildError {
    /// The graph being built.
    pub graph: String,
    /// The name given to the node (empty for errors of the whole graph).
    pub node: String,
    /// What is wrong, with the shapes involved.
    pub msg: String,
    pub help: Option<String>,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph `{}`", self.graph)?;
        if !self.node.is_empty() {
            write!(f, ", node `{}`", self.node)?;
        }
        write!(f, ": {}", self.msg)?;
        if let Some(h) = &self.help {
            write!(f, " (help: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for BuildError {}

/// Builds a `Graph` node by node. Dynamic dims are the symbols of the parameters' shapes, in
/// order of first appearance; a later node may use no other symbol.
pub struct GraphBuilder {
    name: String,
    params: Vec<String>,
    nodes: Vec<Node>,
    outputs: Vec<NodeId>,
    dyn_dims: Vec<String>,
    state: Vec<usize>,
    static_dims: Vec<(String, i64)>,
    consts: ConstPool,
    line: u32,
}

impl GraphBuilder {
    pub fn new(name: &str) -> GraphBuilder {
        GraphBuilder {
            name: name.to_string(),
            params: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            dyn_dims: Vec::new(),
            state: Vec::new(),
            static_dims: Vec::new(),
            consts: ConstPool::default(),
            line: 0,
        }
    }

    /// Record a static dim for reports (shapes carry its value, not its name).
    pub fn static_dim(&mut self, name: &str, value: i64) -> &mut GraphBuilder {
        self.static_dims.push((name.to_string(), value));
        self
    }

    /// The source line (or model node number) recorded on the nodes added from now on; an
    /// importer sets it so reports and generated code point back at the model.
    pub fn set_line(&mut self, line: u32) -> &mut GraphBuilder {
        self.line = line;
        self
    }

    /// A node added so far (its inferred dtype and shape).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.idx()]
    }

    fn error(&self, node: &str, msg: String, help: Option<String>) -> BuildError {
        BuildError { graph: self.name.clone(), node: node.to_string(), msg, help }
    }

    fn push(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        dtype: DType,
        shape: Shape,
        name: &str,
    ) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        let line = self.line;
        self.nodes.push(Node { op, inputs, dtype, shape, name: name.to_string(), line });
        id
    }

    /// The next graph input; the symbols of its shape become dynamic dims.
    pub fn param(&mut self, name: &str, dtype: DType, shape: Shape) -> NodeId {
        for s in shape.iter().flat_map(|d| d.symbols()) {
            if !self.dyn_dims.contains(&s) {
                self.dyn_dims.push(s);
            }
        }
        let index = self.params.len();
        self.params.push(name.to_string());
        self.push(Op::Param { index }, vec![], dtype, shape, name)
    }

    /// The next graph input, as state kept between calls: a cache the graph updates in place
    /// with `cache_write` (see `Graph::state`); the caller passes it mutable.
    pub fn state(&mut self, name: &str, dtype: DType, shape: Shape) -> NodeId {
        let id = self.param(name, dtype, shape);
        self.state.push(self.params.len() - 1);
        id
    }

    /// A dynamic dim that no parameter's shape carries, given by the caller at each call (the
    /// position `P` at which a call writes its keys and values into a KV cache).
    pub fn call_dim(&mut self, name: &str) -> DimExpr {
        if !self.dyn_dims.iter().any(|d| d == name) {
            self.dyn_dims.push(name.to_string());
        }
        DimExpr::sym(name)
    }

    /// `new` written into the state `cache` at `start` along `axis` (`Op::CacheWrite`): the
    /// cache after the write.
    pub fn cache_write(
        &mut self,
        cache: NodeId,
        new: NodeId,
        axis: usize,
        start: DimExpr,
        name: &str,
    ) -> Result<NodeId, BuildError> {
        self.check_symbols(&vec![start.clone()], name)?;
        self.add(Op::CacheWrite { axis, start }, &[cache, new], None, name)
    }

    /// A scalar constant (shape `[]`, broadcast by its users); equal constants are one node.
    pub fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        if let Some(id) = self.consts.get(value, dtype) {
            return id;
        }
        let id = self.push(Op::Const { value }, vec![], dtype, vec![], &format!("{value:?}"));
        self.consts.insert(value, dtype, id);
        id
    }

    fn check_inputs(&self, inputs: &[NodeId], name: &str) -> Result<(), BuildError> {
        match inputs.iter().find(|i| i.idx() >= self.nodes.len()) {
            Some(i) => {
                Err(self.error(name, format!("input {i} is not a node of this graph"), None))
            }
            None => Ok(()),
        }
    }

    fn check_symbols(&self, shape: &Shape, name: &str) -> Result<(), BuildError> {
        match shape.iter().flat_map(|d| d.symbols()).find(|s| !self.dyn_dims.contains(s)) {
            Some(s) => Err(self.error(
                name,
                format!("shape {} uses dim `{s}`, which no parameter has", shape_str(shape)),
                Some("dynamic dims are bound from the parameters' shapes, or declared with `call_dim`".into()),
            )),
            None => Ok(()),
        }
    }

    /// Add `op` on `inputs`, typed by inference; `target` is the dtype of a cast or the shape
    /// of a reshape.
    fn add(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        target: Option<(DType, &Shape)>,
        name: &str,
    ) -> Result<NodeId, BuildError> {
        self.check_inputs(inputs, name)?;
        let arity = ir::arity(&op);
        if !arity.accepts(inputs.len()) {
            return Err(self.error(
                name,
                format!("`{}` takes {arity} inputs, got {}", op.name(), inputs.len()),
                None,
            ));
        }
        let ins: Vec<(&Shape, DType)> = inputs
            .iter()
            .map(|i| (&self.nodes[i.idx()].shape, self.nodes[i.idx()].dtype))
            .collect();
        let (shape, dtype) = ir::infer(&op, &ins, target).map_err(|e| {
            let at = e.operand.map(|k| format!(" (input {k})")).unwrap_or_default();
            self.error(name, format!("{}{at}", e.msg), e.help)
        })?;
        self.check_symbols(&shape, name)?;
        Ok(self.push(op, inputs.to_vec(), dtype, shape, name))
    }

    /// Any op whose result type follows from its inputs (everything but parameters,
    /// constants, `Cast` and `Reshape`, which have their own methods).
    pub fn op(&mut self, op: Op, inputs: &[NodeId], name: &str) -> Result<NodeId, BuildError> {
        if matches!(op, Op::Param { .. } | Op::Const { .. } | Op::Cast | Op::Reshape) {
            return Err(self.error(
                name,
                format!("`{}` is added with its own builder method", op.name()),
                Some("use param, constant, cast or reshape".into()),
            ));
        }
        self.add(op, inputs, None, name)
    }

    pub fn unary(&mut self, u: UnaryOp, x: NodeId, name: &str) -> Result<NodeId, BuildError> {
        self.add(Op::Unary(u), &[x], None, name)
    }

    pub fn binary(
        &mut self,
        b: BinaryOp,
        x: NodeId,
        y: NodeId,
        name: &str,
    ) -> Result<NodeId, BuildError> {
        self.add(Op::Binary(b), &[x, y], None, name)
    }

    pub fn matmul(&mut self, a: NodeId, b: NodeId, name: &str) -> Result<NodeId, BuildError> {
        self.add(Op::MatMul, &[a, b], None, name)
    }

    pub fn cast(&mut self, x: NodeId, to: DType, name: &str) -> Result<NodeId, BuildError> {
        self.add(Op::Cast, &[x], Some((to, &Vec::new())), name)
    }

    pub fn reshape(&mut self, x: NodeId, to: Shape, name: &str) -> Result<NodeId, BuildError> {
        let dtype = self.nodes.get(x.idx()).map_or(DType::F32, |n| n.dtype);
        self.add(Op::Reshape, &[x], Some((dtype, &to)), name)
    }

    /// Mark a value as the next graph output.
    pub fn output(&mut self, id: NodeId) -> &mut GraphBuilder {
        self.outputs.push(id);
        self
    }

    /// The finished graph, verified.
    pub fn finish(self) -> Result<Graph, BuildError> {
        if self.outputs.is_empty() {
            return Err(self.error("", "the graph has no output".into(), None));
        }
        let graph = Graph {
            name: self.name.clone(),
            params: self.params,
            nodes: self.nodes,
            outputs: self.outputs,
            dyn_dims: self.dyn_dims,
            static_dims: self.static_dims,
            state: self.state,
        };
        ir::verify(&graph).map_err(|msg| BuildError {
            graph: graph.name.clone(),
            node: String::new(),
            msg,
            help: None,
        })?;
        Ok(graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> DimExpr {
        DimExpr::sym("S")
    }

    #[test]
    fn types_nodes_and_collects_dynamic_dims() {
        let mut b = GraphBuilder::new("g");
        let x = b.param("x", DType::F16, vec![s(), 4.into()]);
        let y = b.param("y", DType::F16, vec![4.into()]);
        let z = b.binary(BinaryOp::Add, x, y, "z").unwrap();
        let c = b.cast(z, DType::F32, "c").unwrap();
        let r = b.reshape(c, vec![s().mul(&2.into()), 2.into()], "r").unwrap();
        b.output(r);
        let g = b.finish().unwrap();
        assert_eq!(g.dyn_dims, ["S"]);
        assert_eq!(g.node(z).dtype, DType::F16);
        assert_eq!(g.node(c).dtype, DType::F32);
        assert_eq!(g.node(r).shape, vec![s().mul(&2.into()), 2.into()]);
    }

    #[test]
    fn errors_name_the_node_and_the_shapes() {
        let mut b = GraphBuilder::new("g");
        let x = b.param("x", DType::F32, vec![s(), 4.into()]);
        let w = b.param("w", DType::F32, vec![5.into(), 3.into()]);
        let e = b.matmul(x, w, "h").unwrap_err();
        assert_eq!(e.node, "h");
        assert!(e.msg.contains("[S, 4] x [5, 3]"), "{e}");
        let t = DimExpr::sym("T");
        let e = b.op(Op::Slice { axis: 0, start: 0.into(), end: t }, &[x], "r").unwrap_err();
        assert!(e.msg.contains("`T`"), "{e}");
        let e = b.op(Op::MatMul, &[x], "m").unwrap_err();
        assert!(e.msg.contains("takes 2 inputs, got 1"), "{e}");
        let e = b.unary(UnaryOp::Exp, NodeId(99), "u").unwrap_err();
        assert!(e.msg.contains("%99"), "{e}");
        assert!(GraphBuilder::new("empty").finish().unwrap_err().msg.contains("no output"));
    }
}

/// Scalar constants by value (bit pattern) and dtype: how every producer of graphs (the DSL
/// front end, this builder, canonicalisation) makes equal constants one node.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConstPool(std::collections::HashMap<(u64, DType), NodeId>);

impl ConstPool {
    /// The node of an equal constant made before, if any.
    pub(crate) fn get(&self, value: f64, dtype: DType) -> Option<NodeId> {
        self.0.get(&(value.to_bits(), dtype)).copied()
    }
    pub(crate) fn insert(&mut self, value: f64, dtype: DType, id: NodeId) {
        self.0.insert((value.to_bits(), dtype), id);
    }
}
