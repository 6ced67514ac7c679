//! How host C spells values: loads and stores of each storage type, elementwise expressions
//! from the op table, a member's value at a column, nested loops, a C function. Every kernel
//! kind's host emission writes through these.

use crate::codegen::emit::{c_float, gather_offsets, position, Code, Emitter, Space};
use crate::ir::{BinaryOp, ComputeType, DType, Graph, NodeId, Op, UnaryOp};
use crate::layout::resolve;
use autofusion_ir::ops::fill;
use std::collections::BTreeSet;

/// `u` on an operand computed in `on`.
pub(crate) fn unary_c(u: UnaryOp, on: ComputeType, x: &str) -> String {
    let s = u.spec();
    fill(if on == ComputeType::F32 { s.c } else { s.c_int }, &[("x", x)])
}

/// `b` on operands computed in `on`.
pub(crate) fn binary_c(b: BinaryOp, on: ComputeType, x: &str, y: &str) -> String {
    let s = b.spec();
    fill(if on == ComputeType::F32 { s.c } else { s.c_int }, &[("x", x), ("y", y)])
}

pub(crate) fn load(d: DType, ptr: &str, idx: &str) -> String {
    match d {
        DType::F32 | DType::I64 => format!("{ptr}[{idx}]"),
        DType::F16 => format!("af_h2f({ptr}[{idx}])"),
        DType::BF16 => format!("af_bf2f({ptr}[{idx}])"),
        DType::I32 | DType::Bool => format!("(int64_t){ptr}[{idx}]"),
    }
}

pub(crate) fn store(d: DType, ptr: &str, idx: &str, v: &str) -> String {
    match d {
        DType::F32 | DType::I64 => format!("{ptr}[{idx}] = {v};"),
        DType::F16 => format!("{ptr}[{idx}] = af_f2h({v});"),
        DType::BF16 => format!("{ptr}[{idx}] = af_f2bf({v});"),
        DType::I32 => format!("{ptr}[{idx}] = (int32_t){v};"),
        DType::Bool => format!("{ptr}[{idx}] = (uint8_t){v};"),
    }
}

/// The C type of an element in memory.
pub(crate) fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "uint16_t",
        DType::I64 => "int64_t",
        DType::I32 => "int32_t",
        DType::Bool => "uint8_t",
    }
}

/// The C type values are computed in.
pub(crate) fn compute_ctype(c: ComputeType) -> &'static str {
    match c {
        ComputeType::F32 => "float",
        ComputeType::I64 => "int64_t",
    }
}

/// A constant of type `d` as a C literal.
pub(crate) fn c_const(value: f64, d: DType) -> String {
    match d.compute() {
        ComputeType::F32 => c_float(value),
        ComputeType::I64 => c_int(value as i64),
    }
}

pub(crate) fn c_int(v: i64) -> String {
    if v == i64::MIN {
        "INT64_MIN".into()
    } else {
        format!("INT64_C({v})")
    }
}

/// `x`, a value of type `from`, converted to `to` (before `round_to`'s wrapping to 32 bits):
/// floats to integers truncate and saturate, anything to `bool` is `x != 0`.
pub(crate) fn cast_c(from: DType, to: DType, x: &str) -> String {
    match (from.compute(), to) {
        (_, DType::Bool) if from != DType::Bool => format!("({x} != 0)"),
        (ComputeType::F32, DType::I64) => format!("af_f2i64({x})"),
        (ComputeType::F32, DType::I32) => format!("af_f2i32({x})"),
        (ComputeType::I64, DType::F32 | DType::F16 | DType::BF16) => format!("(float){x}"),
        _ => x.to_string(),
    }
}

impl Emitter<'_> {
    /// `read` at row `r0 + inner` of the space, where the row prologue was emitted for row
    /// `r0` and `inner` only moves the second-to-last index (the row within one matrix).
    pub(crate) fn read_inner(&self, sp: &Space, v: NodeId, inner: &str, col: &str) -> String {
        self.move_row(sp, v, inner, self.read(sp, v, col))
    }
    /// `read_inner` of a 16-bit value as its bits.
    pub(crate) fn read_inner_bits(&self, sp: &Space, v: NodeId, inner: &str, col: &str) -> String {
        self.move_row(sp, v, inner, self.read_bits(sp, v, col))
    }
    /// A read of `v` at row `r0`, moved to row `r0 + inner`.
    pub(crate) fn move_row(&self, sp: &Space, v: NodeId, inner: &str, read: String) -> String {
        let a = sp.accesses[&v];
        let rank = sp.shape.len();
        read.replace(
            &format!("ac{a}_row"),
            &format!("(ac{a}_row + ({inner}) * ac{a}_s{})", rank - 2),
        )
    }
    /// Whether reading `v` along a row is not unit-stride (a transposed view): packing then
    /// walks the columns in the outer loop so the reads run along memory.
    pub(crate) fn strided_cols(&self, sp: &Space, v: NodeId) -> bool {
        self.col_stride.get(&sp.accesses[&v]) != Some(&1)
    }
    pub(crate) fn read(&self, sp: &Space, v: NodeId, col: &str) -> String {
        self.read_as(sp, v, col, self.g.node(v).dtype)
    }
    /// `read` of a 16-bit value as its bits (`uint16_t`), not widened.
    pub(crate) fn read_bits(&self, sp: &Space, v: NodeId, col: &str) -> String {
        self.read_as(sp, v, col, DType::F32)
    }
    /// `read` with the value loaded as `d` (F32: the element as stored).
    pub(crate) fn read_as(&self, sp: &Space, v: NodeId, col: &str, d: DType) -> String {
        let a = sp.accesses[&v];
        let rank = sp.shape.len();
        let b = self.buf[&resolve(self.g, v).base];
        let idx = match self.col_stride.get(&a) {
            Some(0) => format!("ac{a}_row"),
            Some(1) => format!("ac{a}_row + ({col})"),
            Some(k) => format!("ac{a}_row + ({col}) * {k}"),
            None => format!("ac{a}_row + ({col}) * ac{a}_s{}", rank - 1),
        };
        load(d, &format!("in{b}"), &idx)
    }
}

/// How an operand of a member is obtained inside a kernel.
pub(crate) fn operand(
    em: &Emitter,
    sp: &Space,
    members: &BTreeSet<NodeId>,
    local: &dyn Fn(NodeId) -> Option<String>,
    i: NodeId,
    col: &str,
) -> String {
    let n = em.g.node(i);
    if let Op::Const { value } = n.op {
        return c_const(value, n.dtype);
    }
    if members.contains(&i) {
        return local(i).expect("member computed before use");
    }
    em.read(sp, i, col)
}

/// The C expression of an elementwise member given its operand expressions.
/// Values of f16/bf16 type are rounded where they are computed, as the reference does, so a
/// later `cast` to f32 sees the same value; arithmetic itself is f32. An i32 value, computed in
/// 64 bits, wraps to 32 there; a `bool` is 0 or 1 as computed.
pub(crate) fn round_to(d: DType, e: String) -> String {
    match d {
        DType::F32 | DType::I64 | DType::Bool => e,
        DType::F16 => format!("af_round_f16({e})"),
        DType::BF16 => format!("af_round_bf16({e})"),
        DType::I32 => format!("af_wrap32({e})"),
    }
}

pub(crate) fn member_expr(g: &Graph, sp: &Space, id: NodeId, ops: &[String], col: &str) -> String {
    round_to(g.node(id).dtype, member_expr_raw(g, sp, id, ops, col))
}

pub(crate) fn member_expr_raw(
    g: &Graph,
    sp: &Space,
    id: NodeId,
    ops: &[String],
    col: &str,
) -> String {
    let n = g.node(id);
    let on = || g.node(n.inputs[0]).dtype.compute();
    match &n.op {
        Op::Unary(u) => unary_c(*u, on(), &ops[0]),
        Op::Binary(b) => binary_c(*b, on(), &ops[0], &ops[1]),
        Op::Copy | Op::Expand { .. } => ops[0].clone(),
        Op::Cast => cast_c(g.node(n.inputs[0]).dtype, n.dtype, &ops[0]),
        Op::Where => format!("({} ? {} : {})", ops[0], ops[1], ops[2]),
        Op::CausalMask => {
            let r = sp.shape.len();
            let row = if r >= 2 { format!("{}_i{}", sp.tag, r - 2) } else { "0".into() };
            // Aligned to the bottom-right corner: query i sees keys j <= i + (cols - rows).
            let s = &n.shape;
            let shift = s[s.len() - 1].sub(&s[s.len() - 2]);
            let shift = shift.to_c(&|x| g.dim_index(x));
            format!("(({col}) > {row} + {shift} ? (-INFINITY) : {})", ops[0])
        }
        op => unreachable!("{} is not elementwise", op.name()),
    }
}

/// `const float v = ...;` computing member `m` at column `col` of `sp`, its member operands
/// taken from `local`.
pub(crate) fn member_def(
    em: &Emitter,
    sp: &Space,
    members: &BTreeSet<NodeId>,
    local: &dyn Fn(NodeId) -> Option<String>,
    m: NodeId,
    col: &str,
) -> String {
    let n = em.g.node(m);
    let ty = compute_ctype(n.dtype.compute());
    if let Op::Gather { .. } = n.op {
        let e = gather_c(em, sp, m, col);
        return format!("const {ty} {} = {e}; /* {} */", em.var(m), n.name);
    }
    if let Op::CacheWrite { .. } = n.op {
        // The new row's value, stored at the cache row (`rows::host::store_at`).
        let v = operand(em, sp, members, local, n.inputs[1], col);
        return format!("const {ty} {} = {v}; /* {} */", em.var(m), n.name);
    }
    if let Op::RotateHalf = n.op {
        return format!(
            "const {ty} {} = {}; /* {} */",
            em.var(m),
            rotate_half_c(em, sp, m, col),
            n.name
        );
    }
    let ops: Vec<String> =
        n.inputs.iter().map(|i| operand(em, sp, members, local, *i, col)).collect();
    let v = em.var(m);
    if let Op::CumSum { exclusive, .. } = n.op {
        // The running sum `cs<m>` is declared before the column loop (`cumsum_init`).
        let acc = format!("cs{}", m.0);
        let step =
            format!("{acc} = {};", binary_c(BinaryOp::Add, n.dtype.compute(), &acc, &ops[0]));
        let def = format!("const {ty} {v} = {}; /* {} */", round_to(n.dtype, acc.clone()), n.name);
        return if exclusive { format!("{def} {step}") } else { format!("{step} {def}") };
    }
    format!("const {ty} {v} = {}; /* {} */", member_expr(em.g, sp, m, &ops, col), n.name)
}

/// Gather member `m` at column `col` of `sp`: its index read and moved into the table (negative
/// counts from the end; clamped into the table, so no read is out of bounds even for an index
/// the runtime could not check beforehand), then the table element.
pub(crate) fn gather_c(em: &Emitter, sp: &Space, m: NodeId, col: &str) -> String {
    let g = em.g;
    let n = g.node(m);
    let (dv, iv) = (n.inputs[0], n.inputs[1]);
    let pos = position(sp.tag, sp.shape.len(), col);
    let (table, index) = gather_offsets(g, m, &pos);
    let buf = |v: NodeId| format!("in{}", em.buf[&resolve(g, v).base]);
    let id = load(g.node(iv).dtype, &buf(iv), &index);
    let p = format!("gt{}", m.0);
    let elem =
        load(g.node(dv).dtype, &buf(dv), &format!("{table} + af_gidx({id}, {p}_n) * {p}_da"));
    let zero = c_const(0.0, n.dtype);
    format!("({p}_n > 0 ? {elem} : {zero})")
}

/// Rotate-half member `m` at column `col` of `sp` (whose rows are the rotated axis): its
/// operand, read from memory (`rows::rotations_read_memory`), at the partner column half a
/// row away, negated in the first half.
pub(crate) fn rotate_half_c(em: &Emitter, sp: &Space, m: NodeId, col: &str) -> String {
    let h = format!("(({}) / 2)", em.dim(sp.shape.last().expect("a rows space has an axis")));
    let partner = format!("({col} < {h} ? {col} + {h} : {col} - {h})");
    let x = em.read(sp, em.g.node(m).inputs[0], &partner);
    format!("({col} < {h} ? -({x}) : ({x}))")
}

/// The declaration of the running sum of cumsum member `m`, before its column loop.
pub(crate) fn cumsum_init(g: &Graph, m: NodeId) -> Option<String> {
    let n = g.node(m);
    matches!(n.op, Op::CumSum { .. }).then(|| {
        let ty = compute_ctype(n.dtype.compute());
        format!("{ty} cs{} = 0; /* {} */", m.0, n.name)
    })
}

/// The store of member `m` (an output of its kernel) at element `idx` of its output buffer.
pub(crate) fn store_out(em: &Emitter, m: NodeId, idx: &str) -> String {
    store(em.g.node(m).dtype, &format!("out{}", em.buf[&m]), idx, &em.var(m))
}

/// Declares in `sp` an access for every operand of `ms` read from memory (neither a member
/// nor a constant).
pub(crate) fn access_operands(
    em: &mut Emitter,
    sp: &mut Space,
    ms: impl IntoIterator<Item = NodeId>,
    members: &BTreeSet<NodeId>,
) {
    let g = em.g;
    for m in ms {
        if let Op::Gather { .. } = g.node(m).op {
            // Addressed through the index it reads (`gather_c`), not as a broadcast operand.
            em.gather_decls(m);
            continue;
        }
        for &i in &g.node(m).inputs {
            let cache = crate::kernels::cache_write::only_written(g, members, i);
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) && !cache {
                em.access(sp, i);
            }
        }
    }
}

/// `stmt` under the brace-less loops `heads`, each one level deeper than the one before.
pub(crate) fn nested_loops(c: &mut Code, heads: &[&str], stmt: &str) {
    match heads.split_first() {
        None => {
            c.line(stmt);
        }
        Some((head, rest)) => {
            c.line(*head);
            c.indented(|c| nested_loops(c, rest, stmt));
        }
    }
}

/// A top-level C function `head { ... }` whose body is `parts`, each written one level in
/// (`Code::at_depth(1)`, as `Emitter::decls` is).
pub(crate) fn c_function(code: &mut Code, head: &str, parts: &[&Code]) {
    debug_assert_eq!(code.depth(), 0, "C functions are top-level");
    code.line(format!("{head} {{"));
    for p in parts {
        code.append(p);
    }
    code.line("}");
}

/// The parameter list of every kernel and pack function.
pub(crate) const KERNEL_PARAMS: &str =
    "(void *const *bufs, const int64_t *dims, const af_tiling *t, int64_t block, float *scratch)";
