//! The graph IR: typed values with dim-expression shapes, one value per node, topological order.

use crate::dim::{shape_str, DimExpr, Shape};
use crate::ops::Domain;
use std::fmt;

/// The storage type of a value: what its elements are in memory (graph inputs and outputs,
/// intermediates between kernels, weights). What kernels compute a value in is its
/// `ComputeType` (`DType::compute`): a 16-bit value is loaded, widened, computed on in f32 and
/// rounded back where the reference rounds it.
///
/// Every match on a `DType` is exhaustive (no default arm that picks a size, a C type or an
/// Ascend type), so a new storage type is found everywhere it needs a decision by the compiler.
/// A format that only some kernels read (a quantised weight block, say) is not a `DType`: it is
/// a property of the operand of the kernel that reads it, so no elementwise kernel can meet it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Signed integers (token ids, positions, lengths): computed in i64, wrapping on overflow.
    I64,
    I32,
    /// A truth value, one byte holding 0 or 1 (masks, comparison results).
    Bool,
}

/// What kernels compute a value in: the type of registers and accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComputeType {
    F32,
    /// Integers and truth values: `int64_t` on the host (an `i32` value is wrapped to 32 bits
    /// where it is computed, a `bool` is 0 or 1). The Ascend vector unit has no 64-bit integer
    /// arithmetic: its kernels carry these values in f32, exact below 2^24 (ARCHITECTURE.md).
    I64,
}

impl ComputeType {
    pub fn name(self) -> &'static str {
        match self {
            ComputeType::F32 => "f32",
            ComputeType::I64 => "i64",
        }
    }
    /// The storage type that holds a computed value unchanged (a kernel's f32 scratch).
    pub fn storage(self) -> DType {
        match self {
            ComputeType::F32 => DType::F32,
            ComputeType::I64 => DType::I64,
        }
    }
}

impl DType {
    pub const ALL: [DType; 6] =
        [DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool];
    /// The floating-point types: what matmuls, reductions and transcendental functions take.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    /// Bytes per element in memory.
    pub fn size(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }
    /// What kernels compute values of this storage type in.
    pub fn compute(self) -> ComputeType {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => ComputeType::F32,
            DType::I64 | DType::I32 | DType::Bool => ComputeType::I64,
        }
    }
    pub fn is_float(self) -> bool {
        self.compute() == ComputeType::F32
    }
    /// A signed integer type (not `bool`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }
    /// Whether values are stored as they are computed: read and written without a conversion
    /// (and so addressable in place by kernels that read their operands directly).
    pub fn is_compute(self) -> bool {
        self == self.compute().storage()
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
    /// Every type's name, for messages: `f32, f16, bf16, i64, i32 or bool`.
    pub fn names() -> String {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        format!("{} or {}", names[..names.len() - 1].join(", "), names[names.len() - 1])
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A node (and the value it defines). `Display` matches the IR dump: `%7`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Erf,
    Sin,
    Cos,
    /// Logical not of a `bool`.
    Not,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 15] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Not,
    ];
    pub fn name(self) -> &'static str {
        self.spec().name
    }
    /// Scalar semantics in f64 (constant folding; the reference interpreter uses the f32 row).
    pub fn eval(self, x: f64) -> f64 {
        (self.spec().f64)(x)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    /// Logical and / or of two `bool`s.
    And,
    Or,
    /// Comparisons of two values of one type, giving a `bool`.
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 14] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Eq,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
    ];
    pub fn name(self) -> &'static str {
        self.spec().name
    }
    pub fn eval(self, a: f64, b: f64) -> f64 {
        (self.spec().f64)(a, b)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 3] = [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max];
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Mean => "mean",
            ReduceKind::Max => "max",
        }
    }
}

/// Operations. The first block is what the planner and code generators see; the sugar block is
/// produced by the front end and expanded by `canon`.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Graph input number `index`.
    Param {
        index: usize,
    },
    /// A scalar constant (shape `[]`), broadcast by its users.
    Const {
        value: f64,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Cast,
    /// Reduction over `axis`, keeping it with extent 1.
    Reduce {
        kind: ReduceKind,
        axis: usize,
    },
    /// Batched matrix product over the last two axes; batch axes broadcast.
    MatMul,
    /// Same elements, new shape (a view of a contiguous input).
    Reshape,
    /// Axis permutation (a view): output axis i is input axis `perm[i]`.
    Transpose {
        perm: Vec<usize>,
    },
    /// `[start, end)` along `axis` (a view).
    Slice {
        axis: usize,
        start: DimExpr,
        end: DimExpr,
    },
    Concat {
        axis: usize,
    },
    /// Materialise a view into a contiguous tensor.
    Copy,
    /// `-inf` where the column index exceeds the row index (last two axes).
    CausalMask,
    /// `a` where `cond` (a `bool`, input 0) holds, else `b` (inputs 1 and 2, one type); the
    /// three broadcast together.
    Where,
    /// Running sum along `axis`: element i is the sum of elements 0..=i (0..i when
    /// `exclusive`). Canonical graphs have it on the last axis only.
    CumSum {
        axis: usize,
        exclusive: bool,
    },
    /// `data` (input 0) indexed along `axis` by the integers `indices` (input 1; negative
    /// counts from the end): the output's shape is `data[..axis] ++ indices ++ data[axis + 1..]`
    /// (ONNX `Gather`; an embedding lookup is axis 0 of a `[vocab, hidden]` table).
    Gather {
        axis: usize,
    },
    /// The input broadcast to `shape` (with it: ONNX `Expand`), materialised.
    Expand {
        shape: Shape,
    },
    /// A write into a cache kept between calls: `new` (input 1) goes to indices
    /// `start .. start + new.shape[axis]` along `axis` of the state parameter `cache`
    /// (input 0, see `Graph::state`), in place; the rest of the cache is left as it is. The
    /// result is the cache after the write (same shape), so attention over the first
    /// `start + S` positions reads a slice of it. A KV cache: `[KVH, T, DH]` along axis 1 at
    /// the call's position `P`.
    CacheWrite {
        axis: usize,
        start: DimExpr,
    },
    /// The two halves of the last axis swapped, the new first half negated: element `j` of a
    /// row of `n` is `-x[j + n/2]` below `n/2`, `x[j - n/2]` from it (Hugging Face's
    /// `rotate_half`, the partner of every element in RoPE). A row op: it reads its operand
    /// at another column, so a kernel reads that operand from memory.
    RotateHalf,
    // ---- sugar, expanded by canon ----
    LayerNorm {
        eps: f64,
    },
    RmsNorm {
        eps: f64,
    },
    Softmax {
        axis: usize,
    },
    Linear,
    Attention {
        scale: f64,
        causal: bool,
        mask: bool,
    },
    Rope,
}

/// What an op is, without its attributes: the one table of op names (in dumps, reports, the
/// metadata JSON's `kind` tag and the front end's messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Param,
    Const,
    Unary,
    Binary,
    Cast,
    Reduce,
    MatMul,
    Reshape,
    Transpose,
    Slice,
    Concat,
    Copy,
    CausalMask,
    Where,
    CumSum,
    Gather,
    Expand,
    CacheWrite,
    RotateHalf,
    LayerNorm,
    RmsNorm,
    Softmax,
    Linear,
    Attention,
    Rope,
}

impl OpKind {
    pub const ALL: [OpKind; 25] = [
        OpKind::Param,
        OpKind::Const,
        OpKind::Unary,
        OpKind::Binary,
        OpKind::Cast,
        OpKind::Reduce,
        OpKind::MatMul,
        OpKind::Reshape,
        OpKind::Transpose,
        OpKind::Slice,
        OpKind::Concat,
        OpKind::Copy,
        OpKind::CausalMask,
        OpKind::Where,
        OpKind::CumSum,
        OpKind::Gather,
        OpKind::Expand,
        OpKind::CacheWrite,
        OpKind::RotateHalf,
        OpKind::LayerNorm,
        OpKind::RmsNorm,
        OpKind::Softmax,
        OpKind::Linear,
        OpKind::Attention,
        OpKind::Rope,
    ];
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Param => "param",
            OpKind::Const => "const",
            OpKind::Unary => "unary",
            OpKind::Binary => "binary",
            OpKind::Cast => "cast",
            OpKind::Reduce => "reduce",
            OpKind::MatMul => "matmul",
            OpKind::Reshape => "reshape",
            OpKind::Transpose => "transpose",
            OpKind::Slice => "slice",
            OpKind::Concat => "concat",
            OpKind::Copy => "copy",
            OpKind::CausalMask => "causal_mask",
            OpKind::Where => "where",
            OpKind::CumSum => "cumsum",
            OpKind::Gather => "gather",
            OpKind::Expand => "expand",
            OpKind::CacheWrite => "cache_write",
            OpKind::RotateHalf => "rotate_half",
            OpKind::LayerNorm => "layer_norm",
            OpKind::RmsNorm => "rms_norm",
            OpKind::Softmax => "softmax",
            OpKind::Linear => "linear",
            OpKind::Attention => "attention",
            OpKind::Rope => "rope",
        }
    }
    pub fn parse(s: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Param { .. } => OpKind::Param,
            Op::Const { .. } => OpKind::Const,
            Op::Unary(_) => OpKind::Unary,
            Op::Binary(_) => OpKind::Binary,
            Op::Cast => OpKind::Cast,
            Op::Reduce { .. } => OpKind::Reduce,
            Op::MatMul => OpKind::MatMul,
            Op::Reshape => OpKind::Reshape,
            Op::Transpose { .. } => OpKind::Transpose,
            Op::Slice { .. } => OpKind::Slice,
            Op::Concat { .. } => OpKind::Concat,
            Op::Copy => OpKind::Copy,
            Op::CausalMask => OpKind::CausalMask,
            Op::Where => OpKind::Where,
            Op::CumSum { .. } => OpKind::CumSum,
            Op::Gather { .. } => OpKind::Gather,
            Op::Expand { .. } => OpKind::Expand,
            Op::CacheWrite { .. } => OpKind::CacheWrite,
            Op::RotateHalf => OpKind::RotateHalf,
            Op::LayerNorm { .. } => OpKind::LayerNorm,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Softmax { .. } => OpKind::Softmax,
            Op::Linear => OpKind::Linear,
            Op::Attention { .. } => OpKind::Attention,
            Op::Rope => OpKind::Rope,
        }
    }
    /// The op's name: its kind's, but for elementwise functions and reductions, which are named
    /// by their function (`exp`, `add`, `reduce_max`).
    pub fn name(&self) -> String {
        match self {
            Op::Unary(u) => u.name().into(),
            Op::Binary(b) => b.name().into(),
            Op::Reduce { kind, .. } => format!("reduce_{}", kind.name()),
            op => op.kind().name().into(),
        }
    }
    pub fn is_sugar(&self) -> bool {
        matches!(
            self,
            Op::LayerNorm { .. }
                | Op::RmsNorm { .. }
                | Op::Softmax { .. }
                | Op::Linear
                | Op::Attention { .. }
                | Op::Rope
        )
    }
    /// Elementwise in the planner's sense: output element i depends on input elements at i
    /// (after broadcasting). `CausalMask` also reads its own indices.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Cast
                | Op::Copy
                | Op::CausalMask
                | Op::Where
                | Op::Expand { .. }
        )
    }
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape | Op::Transpose { .. } | Op::Slice { .. })
    }
    fn attrs(&self) -> String {
        match self {
            Op::Param { index } => format!("#{index}"),
            Op::Const { value } => format!("{value:?}"),
            Op::Reduce { axis, .. }
            | Op::Softmax { axis }
            | Op::Concat { axis }
            | Op::Gather { axis } => {
                format!("axis={axis}")
            }
            Op::CumSum { axis, exclusive } => format!("axis={axis} exclusive={exclusive}"),
            Op::Expand { shape } => format!("to {}", shape_str(shape)),
            Op::Transpose { perm } => format!("perm={perm:?}"),
            Op::Slice { axis, start, end } => format!("axis={axis} [{start}, {end})"),
            Op::CacheWrite { axis, start } => format!("axis={axis} at {start}"),
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => format!("eps={eps:e}"),
            Op::Attention { scale, causal, mask } => {
                format!("scale={scale:?} causal={causal} mask={mask}")
            }
            _ => String::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<NodeId>,
    pub dtype: DType,
    pub shape: Shape,
    /// User-facing name: the `let` binding, or binding.part for pieces of expanded sugar.
    pub name: String,
    /// Source line of the expression that produced the node (0 when unknown).
    pub line: u32,
}

/// A lowered `#[fused_graph]` function.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub name: String,
    /// Parameter names, in signature order (the `Param` nodes carry the same index).
    pub params: Vec<String>,
    pub nodes: Vec<Node>,
    pub outputs: Vec<NodeId>,
    /// Dynamic dims in the order of the runtime `dims[]` array.
    pub dyn_dims: Vec<String>,
    /// Static dims as declared, for reports.
    pub static_dims: Vec<(String, i64)>,
    /// The parameters that are state kept between calls (caches a `CacheWrite` updates in
    /// place), by parameter index, ascending. The caller passes them mutable; nothing keyed
    /// on a tensor's contents (packed weights, device copies) is ever made from them.
    pub state: Vec<usize>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.idx()]
    }
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }
    /// Whether node `id` is a state parameter (see `state`).
    pub fn is_state(&self, id: NodeId) -> bool {
        matches!(self.node(id).op, Op::Param { index } if self.state.contains(&index))
    }
    /// The dynamic dims no parameter's shape carries as a whole axis: the caller gives them at
    /// each call (the position `P` of a KV cache's first new row).
    pub fn caller_dims(&self) -> Vec<String> {
        let pnodes = self.param_nodes();
        let carried = |d: &str| {
            pnodes.iter().any(|p| self.node(*p).shape.iter().any(|e| e.as_sym() == Some(d)))
        };
        self.dyn_dims.iter().filter(|d| !carried(d)).cloned().collect()
    }
    /// The `CacheWrite` of each state parameter, in `state` order (`verify` checks there is
    /// exactly one).
    pub fn state_writes(&self) -> Vec<NodeId> {
        let pnodes = self.param_nodes();
        self.state
            .iter()
            .filter_map(|&i| {
                self.ids().find(|&w| {
                    matches!(self.node(w).op, Op::CacheWrite { .. })
                        && self.node(w).inputs[0] == pnodes[i]
                })
            })
            .collect()
    }
    pub fn param_nodes(&self) -> Vec<NodeId> {
        let mut v = vec![NodeId(0); self.params.len()];
        for id in self.ids() {
            if let Op::Param { index } = self.node(id).op {
                v[index] = id;
            }
        }
        v
    }
    /// Users of every node, in node order.
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut u = vec![Vec::new(); self.nodes.len()];
        for id in self.ids() {
            for &i in &self.node(id).inputs {
                if !u[i.idx()].contains(&id) {
                    u[i.idx()].push(id);
                }
            }
        }
        u
    }
    pub fn dim_index(&self, s: &str) -> usize {
        self.dyn_dims.iter().position(|d| d == s).expect("dynamic dim listed")
    }

    /// Ops that run as kernels (views, parameters and constants do not): the "operators" of
    /// the plan summary.
    pub fn kernel_op_count(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Param { .. } | Op::Const { .. }) && !n.op.is_view())
            .count()
    }

    /// The stable text dump used by snapshot tests.
    pub fn dump(&self) -> String {
        let mut out = format!("graph {}(", self.name);
        out += &self.params.join(", ");
        out += ")";
        if !self.dyn_dims.is_empty() {
            out += &format!(" dyn[{}]", self.dyn_dims.join(", "));
        }
        out += "\n";
        for id in self.ids() {
            let n = self.node(id);
            let ins: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
            let attrs = n.op.attrs();
            out += &format!(
                "  {id} = {}{}({}) : {}{}  // {}\n",
                n.op.name(),
                if attrs.is_empty() { String::new() } else { format!("[{attrs}]") },
                ins.join(", "),
                n.dtype,
                shape_str(&n.shape),
                n.name
            );
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        out += &format!("  return {}\n", outs.join(", "));
        out
    }
}

/// A shape or dtype error from inference; `operand` says which input is at fault (for spans).
#[derive(Clone, Debug, PartialEq)]
pub struct InferError {
    pub operand: Option<usize>,
    pub msg: String,
    pub help: Option<String>,
}

fn err(operand: Option<usize>, msg: String) -> InferError {
    InferError { operand, msg, help: None }
}

/// Numpy-style broadcast of two shapes (aligned from the right).
pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
    let r = a.len().max(b.len());
    let one = DimExpr::constant(1);
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = if i + a.len() >= r { &a[i + a.len() - r] } else { &one };
        let db = if i + b.len() >= r { &b[i + b.len() - r] } else { &one };
        out.push(if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return None;
        });
    }
    Some(out)
}

fn same_dtype(ins: &[(&Shape, DType)], what: &str) -> Result<DType, InferError> {
    let d0 = ins[0].1;
    for (i, (_, d)) in ins.iter().enumerate().skip(1) {
        if *d != d0 {
            return Err(InferError {
                operand: Some(i),
                msg: format!("dtype mismatch in {what}: {d0} and {d}"),
                help: Some(format!("insert `cast(x, {d0})` to convert one operand")),
            });
        }
    }
    Ok(d0)
}

/// Infer the output of `op` on inputs of the given shapes and dtypes. `cast_to` is the target
/// dtype of `Cast`, and the output shape of `Reshape` is passed in `reshape_to`.
pub fn infer(
    op: &Op,
    ins: &[(&Shape, DType)],
    target: Option<(DType, &Shape)>,
) -> Result<(Shape, DType), InferError> {
    let rank = |i: usize| ins[i].0.len();
    let shape = |i: usize| ins[i].0.clone();
    floats_only(op, ins)?;
    match op {
        Op::Param { .. } | Op::Const { .. } => {
            let (d, s) = target.expect("param/const carry their type");
            Ok((s.clone(), d))
        }
        Op::Unary(u) => {
            let d = in_domain(u.spec().domain, u.name(), ins)?;
            Ok((shape(0), d))
        }
        Op::Copy | Op::CausalMask => {
            if matches!(op, Op::CausalMask) && rank(0) < 2 {
                return Err(err(
                    Some(0),
                    format!("causal_mask needs rank >= 2, got {}", shape_str(ins[0].0)),
                ));
            }
            Ok((shape(0), ins[0].1))
        }
        Op::Cast => Ok((shape(0), target.expect("cast target").0)),
        Op::Binary(b) => infer_binary(*b, ins),
        Op::Where => infer_where(ins),
        Op::Expand { shape } => {
            let s = broadcast(ins[0].0, shape).ok_or_else(|| InferError {
                operand: Some(0),
                msg: format!("{} cannot be expanded to {}", shape_str(ins[0].0), shape_str(shape)),
                help: Some("axes are aligned from the right; each pair must be equal or 1".into()),
            })?;
            Ok((s, ins[0].1))
        }
        Op::Gather { axis } => infer_gather(*axis, ins),
        Op::CumSum { axis, .. } => {
            in_domain(Domain::Numeric, "cumsum", ins)?;
            infer_axis(op, axis, ins)
        }
        Op::Reduce { axis, .. } | Op::Softmax { axis } => infer_axis(op, axis, ins),
        Op::MatMul | Op::Linear => infer_matmul(op, ins),
        Op::Reshape => infer_reshape(ins, target),
        Op::Transpose { perm } => infer_transpose(perm, ins),
        Op::Slice { axis, start, end } => infer_slice(axis, start, end, ins),
        Op::Concat { axis } => infer_concat(axis, ins),
        Op::CacheWrite { axis, .. } => infer_cache_write(*axis, ins),
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => infer_norm(op, ins),
        Op::Attention { mask, .. } => infer_attention(mask, ins),
        Op::Rope => infer_rope(ins),
        Op::RotateHalf => infer_rotate_half(ins),
    }
}

/// The ops that compute on floating-point values only (matrix products, reductions, norms,
/// attention, rope, the causal mask's -inf): an integer or `bool` operand is an error that
/// says to cast it.
fn floats_only(op: &Op, ins: &[(&Shape, DType)]) -> Result<(), InferError> {
    let floats = matches!(
        op,
        Op::MatMul
            | Op::Linear
            | Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Attention { .. }
            | Op::Rope
            | Op::RotateHalf
            | Op::CausalMask
    );
    match ins.iter().position(|(_, d)| !d.is_float()) {
        Some(i) if floats => Err(InferError {
            operand: Some(i),
            msg: format!(
                "`{}` computes on floating-point values; operand {i} is {}",
                op.name(),
                ins[i].1
            ),
            help: Domain::Float.hint().map(str::to_string),
        }),
        _ => Ok(()),
    }
}

/// The operands' common dtype if `domain` admits it, and the result's dtype.
fn in_domain(domain: Domain, what: &str, ins: &[(&Shape, DType)]) -> Result<DType, InferError> {
    let d = same_dtype(ins, what)?;
    if !domain.admits(d) {
        return Err(InferError {
            operand: Some(0),
            msg: format!("`{what}` takes {}; its operands are {d}", domain.describe()),
            help: domain.hint().map(str::to_string),
        });
    }
    Ok(domain.result(d))
}

fn broadcast_all(ins: &[(&Shape, DType)], what: &str) -> Result<Shape, InferError> {
    let mut s = ins[0].0.clone();
    for (i, (si, _)) in ins.iter().enumerate().skip(1) {
        s = broadcast(&s, si).ok_or_else(|| InferError {
            operand: Some(i),
            msg: format!(
                "shapes {} and {} cannot be broadcast together in `{what}`",
                shape_str(&s),
                shape_str(si),
            ),
            help: Some("axes are aligned from the right; each pair must be equal or 1".into()),
        })?;
    }
    Ok(s)
}

fn infer_binary(b: BinaryOp, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = in_domain(b.spec().domain, b.name(), ins)?;
    Ok((broadcast_all(ins, b.name())?, d))
}

fn infer_gather(axis: usize, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let (data, idx) = (ins[0].0, ins[1].0);
    if axis >= data.len() {
        return Err(err(
            Some(0),
            format!("gather axis {axis} out of range for data {}", shape_str(data)),
        ));
    }
    if !ins[1].1.is_int() {
        return Err(InferError {
            operand: Some(1),
            msg: format!("the indices of `gather` are {}, not integers", ins[1].1),
            help: Some("token ids are i64 or i32: `cast(ids, i64)`".into()),
        });
    }
    let mut s = data[..axis].to_vec();
    s.extend(idx.iter().cloned());
    s.extend(data[axis + 1..].iter().cloned());
    Ok((s, ins[0].1))
}

fn infer_where(ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    if ins[0].1 != DType::Bool {
        return Err(InferError {
            operand: Some(0),
            msg: format!("the condition of `where` is {}, not bool", ins[0].1),
            help: Some("compare first (`eq`, `lt`, ...) or `cast(x, bool)`".into()),
        });
    }
    let d = same_dtype(&ins[1..], "where")
        .map_err(|e| InferError { operand: e.operand.map(|i| i + 1), ..e })?;
    Ok((broadcast_all(ins, "where")?, d))
}

fn infer_axis(
    op: &Op,
    axis: &usize,
    ins: &[(&Shape, DType)],
) -> Result<(Shape, DType), InferError> {
    let rank = |i: usize| ins[i].0.len();
    let shape = |i: usize| ins[i].0.clone();
    if *axis >= rank(0) {
        return Err(err(None, format!("axis {axis} out of range for {}", shape_str(ins[0].0))));
    }
    let mut s = shape(0);
    if matches!(op, Op::Reduce { .. }) {
        s[*axis] = DimExpr::constant(1);
    }
    Ok((s, ins[0].1))
}

fn infer_matmul(op: &Op, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = same_dtype(ins, "matmul")?;
    let (a, b) = (ins[0].0, ins[1].0);
    if a.len() < 2 {
        return Err(err(
            Some(0),
            format!("matmul needs operands of rank >= 2, left is {}", shape_str(a)),
        ));
    }
    if b.len() < 2 {
        return Err(err(
            Some(1),
            format!("matmul needs operands of rank >= 2, right is {}", shape_str(b)),
        ));
    }
    let k1 = &a[a.len() - 1];
    let k2 = &b[b.len() - 2];
    if k1 != k2 {
        return Err(InferError {
            operand: Some(1),
            msg: format!(
                "matmul inner dimensions differ: {} x {} ({k1} != {k2})",
                shape_str(a),
                shape_str(b)
            ),
            help: Some(
                "the last axis of the left operand must equal the second-to-last of the right"
                    .into(),
            ),
        });
    }
    let ba = a[..a.len() - 2].to_vec();
    let bb = b[..b.len() - 2].to_vec();
    let mut out = broadcast(&ba, &bb).ok_or_else(|| {
        err(
            Some(1),
            format!(
                "matmul batch axes {} and {} cannot be broadcast",
                shape_str(&ba),
                shape_str(&bb)
            ),
        )
    })?;
    out.push(a[a.len() - 2].clone());
    out.push(b[b.len() - 1].clone());
    if matches!(op, Op::Linear) {
        let n = out.last().unwrap().clone();
        if ins[2].0.len() != 1 || ins[2].0[0] != n {
            return Err(InferError {
                operand: Some(2),
                msg: format!("linear bias has shape {}, expected [{n}]", shape_str(ins[2].0)),
                help: None,
            });
        }
        if ins[2].1 != d {
            return Err(err(Some(2), format!("dtype mismatch in linear: {d} and {}", ins[2].1)));
        }
    }
    Ok((out, d))
}

fn infer_reshape(
    ins: &[(&Shape, DType)],
    target: Option<(DType, &Shape)>,
) -> Result<(Shape, DType), InferError> {
    let to = target.expect("reshape target").1;
    let (n0, n1) = (crate::dim::numel(ins[0].0), crate::dim::numel(to));
    if n0 != n1 {
        return Err(err(
            None,
            format!(
                "cannot reshape {} ({n0} elements) to {} ({n1} elements)",
                shape_str(ins[0].0),
                shape_str(to)
            ),
        ));
    }
    Ok((to.clone(), ins[0].1))
}

fn infer_transpose(perm: &[usize], ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let rank = |i: usize| ins[i].0.len();
    let mut p = perm.to_vec();
    p.sort();
    if perm.len() != rank(0) || p != (0..rank(0)).collect::<Vec<_>>() {
        return Err(err(
            None,
            format!("permutation {perm:?} does not fit {}", shape_str(ins[0].0)),
        ));
    }
    Ok((perm.iter().map(|&i| ins[0].0[i].clone()).collect(), ins[0].1))
}

fn infer_slice(
    axis: &usize,
    start: &DimExpr,
    end: &DimExpr,
    ins: &[(&Shape, DType)],
) -> Result<(Shape, DType), InferError> {
    let rank = |i: usize| ins[i].0.len();
    let shape = |i: usize| ins[i].0.clone();
    if *axis >= rank(0) {
        return Err(err(None, format!("axis {axis} out of range for {}", shape_str(ins[0].0))));
    }
    let mut s = shape(0);
    s[*axis] = end.sub(start);
    Ok((s, ins[0].1))
}

fn infer_cache_write(axis: usize, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = same_dtype(ins, "cache_write")?;
    let (cache, new) = (ins[0].0, ins[1].0);
    if axis >= cache.len() {
        return Err(err(None, format!("axis {axis} out of range for {}", shape_str(cache))));
    }
    let differs = (0..cache.len()).any(|a| a != axis && cache.get(a) != new.get(a));
    if new.len() != cache.len() || differs {
        return Err(InferError {
            operand: Some(1),
            msg: format!(
                "cache_write of {} into a cache of {}: they must agree off axis {axis}",
                shape_str(new),
                shape_str(cache)
            ),
            help: Some("the new rows have the cache's shape with S positions on the axis".into()),
        });
    }
    Ok((cache.clone(), d))
}

fn infer_concat(axis: &usize, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let rank = |i: usize| ins[i].0.len();
    let shape = |i: usize| ins[i].0.clone();
    let d = same_dtype(ins, "concat")?;
    let r = rank(0);
    if *axis >= r {
        return Err(err(None, format!("axis {axis} out of range for {}", shape_str(ins[0].0))));
    }
    let mut s = shape(0);
    for (i, (sh, _)) in ins.iter().enumerate().skip(1) {
        if sh.len() != r {
            return Err(err(
                Some(i),
                format!("concat rank mismatch: {} and {}", shape_str(ins[0].0), shape_str(sh)),
            ));
        }
        for ax in 0..r {
            if ax != *axis && sh[ax] != ins[0].0[ax] {
                return Err(err(
                    Some(i),
                    format!(
                        "concat shapes {} and {} differ off axis {axis}",
                        shape_str(ins[0].0),
                        shape_str(sh)
                    ),
                ));
            }
        }
        s[*axis] = s[*axis].add(&sh[*axis]);
    }
    Ok((s, d))
}

fn infer_norm(op: &Op, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = same_dtype(ins, &op.name())?;
    let x = ins[0].0;
    if x.is_empty() {
        return Err(err(Some(0), format!("{} needs rank >= 1", op.name())));
    }
    let last = x.last().unwrap();
    for (i, (s, _)) in ins.iter().enumerate().skip(1) {
        if s.len() != 1 {
            return Err(InferError {
                operand: Some(i),
                msg: format!(
                    "rank mismatch: {} parameter has shape {}, expected [{last}]",
                    op.name(),
                    shape_str(s)
                ),
                help: Some("norm weights are vectors over the last axis".into()),
            });
        }
        if &s[0] != last {
            return Err(err(
                Some(i),
                format!(
                    "{} parameter has shape {}, expected [{last}] to match {}",
                    op.name(),
                    shape_str(s),
                    shape_str(x)
                ),
            ));
        }
    }
    Ok((x.clone(), d))
}

fn infer_attention(mask: &bool, ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = same_dtype(ins, "attention")?;
    let (q, k, v) = (ins[0].0, ins[1].0, ins[2].0);
    if q.len() < 2 || k.len() != q.len() || v.len() != q.len() {
        return Err(err(
            None,
            format!(
                "attention needs q, k, v of one rank >= 2, got {}, {}, {}",
                shape_str(q),
                shape_str(k),
                shape_str(v)
            ),
        ));
    }
    let r = q.len();
    if q[r - 1] != k[r - 1] {
        return Err(err(
            Some(1),
            format!("attention head dims differ: q {} and k {}", shape_str(q), shape_str(k)),
        ));
    }
    if k[r - 2] != v[r - 2] {
        return Err(err(
            Some(2),
            format!("attention key lengths differ: k {} and v {}", shape_str(k), shape_str(v)),
        ));
    }
    let mut out = q.clone();
    out[r - 1] = v[r - 1].clone();
    if *mask {
        let mut sc = q.clone();
        sc[r - 1] = k[r - 2].clone();
        if broadcast(&sc, ins[3].0).as_ref() != Some(&sc) {
            return Err(err(
                Some(3),
                format!(
                    "attention mask {} does not broadcast to the scores {}",
                    shape_str(ins[3].0),
                    shape_str(&sc)
                ),
            ));
        }
    }
    Ok((out, d))
}

fn infer_rope(ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    let d = same_dtype(ins, "rope")?;
    let x = ins[0].0;
    even_last_axis("rope", x)?;
    for (i, (table, _)) in ins.iter().enumerate().skip(1) {
        if broadcast(x, table).as_ref() != Some(x) {
            return Err(err(
                Some(i),
                format!("rope table {} does not broadcast to {}", shape_str(table), shape_str(x)),
            ));
        }
    }
    Ok((x.clone(), d))
}

/// `rotate_half` keeps its operand's shape and type; its last axis splits in two halves.
fn infer_rotate_half(ins: &[(&Shape, DType)]) -> Result<(Shape, DType), InferError> {
    even_last_axis("rotate_half", ins[0].0)?;
    Ok((ins[0].0.clone(), ins[0].1))
}

/// `x`'s last axis has an even length (a dynamic one that halves exactly: `2 * (n / 2)`).
fn even_last_axis(op: &str, x: &Shape) -> Result<(), InferError> {
    let last = x.last().cloned().unwrap_or(DimExpr::constant(0));
    if last.div_const(2).map(|h| h.mul(&DimExpr::constant(2))) != Some(last.clone())
        || last.as_const().is_some_and(|v| v % 2 != 0)
    {
        return Err(err(Some(0), format!("{op} needs an even last axis, got {}", shape_str(x))));
    }
    Ok(())
}

/// How many inputs an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    AtLeast(usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exactly(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

/// The inputs `op` takes.
pub fn arity(op: &Op) -> Arity {
    match op {
        Op::Param { .. } | Op::Const { .. } => Arity::Exactly(0),
        Op::Unary(_)
        | Op::Cast
        | Op::Copy
        | Op::CausalMask
        | Op::CumSum { .. }
        | Op::RotateHalf
        | Op::Expand { .. } => Arity::Exactly(1),
        Op::Where => Arity::Exactly(3),
        Op::Reduce { .. } | Op::Softmax { .. } => Arity::Exactly(1),
        Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } => Arity::Exactly(1),
        Op::Binary(_)
        | Op::MatMul
        | Op::RmsNorm { .. }
        | Op::Gather { .. }
        | Op::CacheWrite { .. } => Arity::Exactly(2),
        Op::Concat { .. } => Arity::AtLeast(1),
        Op::LayerNorm { .. } | Op::Linear | Op::Rope => Arity::Exactly(3),
        Op::Attention { mask, .. } => Arity::Exactly(3 + *mask as usize),
    }
}

/// Check the invariants every pass must keep: topological order, arity, and that each node's
/// type is what inference gives for its inputs.
pub fn verify(g: &Graph) -> Result<(), String> {
    for id in g.ids() {
        let n = g.node(id);
        for i in &n.inputs {
            if i.idx() >= id.idx() {
                return Err(format!("{id} uses {i}, which is not defined before it"));
            }
        }
        let ins: Vec<(&Shape, DType)> =
            n.inputs.iter().map(|i| (&g.node(*i).shape, g.node(*i).dtype)).collect();
        let arity_ok = arity(&n.op).accepts(ins.len());
        if !arity_ok {
            return Err(format!("{id} ({}) has {} inputs", n.op.name(), ins.len()));
        }
        let (s, d) = infer(&n.op, &ins, Some((n.dtype, &n.shape)))
            .map_err(|e| format!("{id}: {}", e.msg))?;
        if s != n.shape || d != n.dtype {
            return Err(format!(
                "{id} ({}) is typed {}{} but its inputs give {}{}",
                n.op.name(),
                n.dtype,
                shape_str(&n.shape),
                d,
                shape_str(&s)
            ));
        }
        if let Op::Param { index } = n.op {
            if index >= g.params.len() {
                return Err(format!("{id} is parameter #{index} of {}", g.params.len()));
            }
        }
    }
    for o in &g.outputs {
        if o.idx() >= g.nodes.len() {
            return Err(format!("output {o} is not a node"));
        }
    }
    verify_state(g)
}

/// State parameters are written once, by a `CacheWrite`, and read only through it (a direct
/// read would see the cache before or after the write depending on the schedule); every
/// `CacheWrite` writes a state parameter; a state is not a graph output (the caller holds it).
fn verify_state(g: &Graph) -> Result<(), String> {
    if g.state.windows(2).any(|w| w[0] >= w[1]) || g.state.iter().any(|&i| i >= g.params.len()) {
        return Err(format!("state parameters {:?} of {} parameters", g.state, g.params.len()));
    }
    let users = g.users();
    let pnodes = g.param_nodes();
    for &i in &g.state {
        let (p, name) = (pnodes[i], &g.params[i]);
        match &users[p.idx()][..] {
            [w] if matches!(g.node(*w).op, Op::CacheWrite { .. }) && g.node(*w).inputs[0] == p => {}
            _ => {
                return Err(format!(
                    "state parameter `{name}` must be read by exactly one cache_write (as its cache) and nothing else"
                ))
            }
        }
        if g.outputs.contains(&p) {
            return Err(format!("state parameter `{name}` is a graph output"));
        }
    }
    for id in g.ids() {
        if matches!(g.node(id).op, Op::CacheWrite { .. }) {
            if !g.is_state(g.node(id).inputs[0]) {
                return Err(format!(
                    "{id} (cache_write `{}`) writes `{}`, which is not a state parameter",
                    g.node(id).name,
                    g.node(g.node(id).inputs[0]).name
                ));
            }
            if g.outputs.contains(&id) {
                return Err(format!(
                    "{id} (cache_write `{}`) is a graph output: the caller holds the cache",
                    g.node(id).name
                ));
            }
        }
    }
    Ok(())
}
