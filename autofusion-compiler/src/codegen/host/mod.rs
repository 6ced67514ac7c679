//! Host C code generation: one C file per graph variant, one static function per fused group,
//! and an exported module descriptor the runtime loads.
//!
//! Elementwise groups are row loops: each block takes a range of rows of the group's iteration
//! space; within a row, ops run in phases separated by reductions, values crossing a phase
//! boundary live in per-row scratch buffers, everything else stays in registers. Matmul groups
//! use one cache-blocked template on per-ISA micro-kernels (`af_isa` in the prelude) with the prologue applied
//! while packing A and the epilogue applied while storing C.

use super::emit::{c_float, c_string, Code, Emitter, RowStore, Space};
use super::{file_header, Backend, Source, Toolchain};
use crate::abi::{self, KernelMeta, PackMeta, Work};
use crate::dim::{numel, DimExpr, Shape};
use crate::group::{iter_shape, space_of, FlashParts, GroupKind};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use crate::layout::resolve;
use crate::plan::{describe, Group, Plan};
use crate::target::Target;
use crate::{report, ModuleMeta, Unit, Variant};
use autofusion_ir::ops::fill;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Flags every compile of generated C uses (build script, JIT, calibration): C11; no errno
/// from libm; and no trapping math, so that the branch-free selects of `af_expf`, `af_fmax`
/// and the clamps if-convert and vectorise (the kernels never read the FP exception flags).
pub const CFLAGS: &[&str] = &["-std=c11", "-fno-math-errno", "-fno-trapping-math"];

/// The host CPU backend: C compiled by the system compiler, kernels on the runtime's pool.
pub struct Host {
    target: Target,
}

impl Host {
    /// Plans with `target` (normally the calibrated host profile).
    pub fn new(target: Target) -> Host {
        Host { target }
    }
}

impl Backend for Host {
    fn name(&self) -> &'static str {
        "host"
    }
    fn profile(&self) -> &Target {
        &self.target
    }
    fn generate(
        &self,
        unit: &Unit,
        v: Variant,
        plan: &Plan,
        symbol: &str,
    ) -> Result<Source, String> {
        let mut summary = report::summary(&unit.graph, plan, &[]);
        summary.pop();
        let meta = |kernels: &[KernelMeta]| {
            autofusion_ir::json::write(&ModuleMeta {
                abi: abi::ABI_VERSION,
                hash: unit.hash.clone(),
                variant: v.name().into(),
                graph: unit.graph.clone(),
                kernels: kernels.to_vec(),
                summary: summary.clone(),
                pipeline: plan.pipeline,
            })
        };
        let c = generate(&unit.graph, plan, symbol, &file_header(unit, v, plan), &meta);
        let meta_json = meta(&c.kernels);
        Ok(Source { code: c.code, extension: "c", entries: vec![c.entry], meta_json })
    }
    fn toolchain(&self) -> Toolchain {
        Toolchain::Cc { flags: CFLAGS }
    }
}

/// Generated C for one graph variant, with the metadata the runtime needs.
pub struct CSource {
    pub code: String,
    pub kernels: Vec<KernelMeta>,
    /// The exported function returning the module descriptor.
    pub entry: String,
}

fn unary_c(u: UnaryOp, x: &str) -> String {
    fill(u.spec().c, &[("x", x)])
}

fn binary_c(b: BinaryOp, x: &str, y: &str) -> String {
    fill(b.spec().c, &[("x", x), ("y", y)])
}

fn load(d: DType, ptr: &str, idx: &str) -> String {
    match d {
        DType::F32 => format!("{ptr}[{idx}]"),
        DType::F16 => format!("af_h2f({ptr}[{idx}])"),
        DType::BF16 => format!("af_bf2f({ptr}[{idx}])"),
    }
}

fn store(d: DType, ptr: &str, idx: &str, v: &str) -> String {
    match d {
        DType::F32 => format!("{ptr}[{idx}] = {v};"),
        DType::F16 => format!("{ptr}[{idx}] = af_f2h({v});"),
        DType::BF16 => format!("{ptr}[{idx}] = af_f2bf({v});"),
    }
}

fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "uint16_t",
    }
}

impl Emitter<'_> {
    /// `read` at row `r0 + inner` of the space, where the row prologue was emitted for row
    /// `r0` and `inner` only moves the second-to-last index (the row within one matrix).
    fn read_inner(&self, sp: &Space, v: NodeId, inner: &str, col: &str) -> String {
        self.move_row(sp, v, inner, self.read(sp, v, col))
    }
    /// `read_inner` of a 16-bit value as its bits.
    fn read_inner_bits(&self, sp: &Space, v: NodeId, inner: &str, col: &str) -> String {
        self.move_row(sp, v, inner, self.read_bits(sp, v, col))
    }
    /// A read of `v` at row `r0`, moved to row `r0 + inner`.
    fn move_row(&self, sp: &Space, v: NodeId, inner: &str, read: String) -> String {
        let a = sp.accesses[&v];
        let rank = sp.shape.len();
        read.replace(
            &format!("ac{a}_row"),
            &format!("(ac{a}_row + ({inner}) * ac{a}_s{})", rank - 2),
        )
    }
    /// Whether reading `v` along a row is not unit-stride (a transposed view): packing then
    /// walks the columns in the outer loop so the reads run along memory.
    fn strided_cols(&self, sp: &Space, v: NodeId) -> bool {
        self.col_stride.get(&sp.accesses[&v]) != Some(&1)
    }
    fn read(&self, sp: &Space, v: NodeId, col: &str) -> String {
        self.read_as(sp, v, col, self.g.node(v).dtype)
    }
    /// `read` of a 16-bit value as its bits (`uint16_t`), not widened.
    fn read_bits(&self, sp: &Space, v: NodeId, col: &str) -> String {
        self.read_as(sp, v, col, DType::F32)
    }
    /// `read` with the value loaded as `d` (F32: the element as stored).
    fn read_as(&self, sp: &Space, v: NodeId, col: &str, d: DType) -> String {
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
fn operand(
    em: &Emitter,
    sp: &Space,
    members: &BTreeSet<NodeId>,
    local: &dyn Fn(NodeId) -> Option<String>,
    i: NodeId,
    col: &str,
) -> String {
    let n = em.g.node(i);
    if let Op::Const { value } = n.op {
        return c_float(value);
    }
    if members.contains(&i) {
        return local(i).expect("member computed before use");
    }
    em.read(sp, i, col)
}

/// The C expression of an elementwise member given its operand expressions.
/// Values of f16/bf16 type are rounded where they are computed, as the reference does, so a
/// later `cast` to f32 sees the same value; arithmetic itself is f32.
fn round_to(d: DType, e: String) -> String {
    match d {
        DType::F32 => e,
        DType::F16 => format!("af_round_f16({e})"),
        DType::BF16 => format!("af_round_bf16({e})"),
    }
}

fn member_expr(g: &Graph, sp: &Space, id: NodeId, ops: &[String], col: &str) -> String {
    round_to(g.node(id).dtype, member_expr_raw(g, sp, id, ops, col))
}

fn member_expr_raw(g: &Graph, sp: &Space, id: NodeId, ops: &[String], col: &str) -> String {
    let n = g.node(id);
    match &n.op {
        Op::Unary(u) => unary_c(*u, &ops[0]),
        Op::Binary(b) => binary_c(*b, &ops[0], &ops[1]),
        Op::Copy => ops[0].clone(),
        Op::Cast => ops[0].clone(),
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
fn member_def(
    em: &Emitter,
    sp: &Space,
    members: &BTreeSet<NodeId>,
    local: &dyn Fn(NodeId) -> Option<String>,
    m: NodeId,
    col: &str,
) -> String {
    let n = em.g.node(m);
    let ops: Vec<String> =
        n.inputs.iter().map(|i| operand(em, sp, members, local, *i, col)).collect();
    format!("const float {} = {}; /* {} */", em.var(m), member_expr(em.g, sp, m, &ops, col), n.name)
}

/// The store of member `m` (an output of its kernel) at element `idx` of its output buffer.
fn store_out(em: &Emitter, m: NodeId, idx: &str) -> String {
    store(em.g.node(m).dtype, &format!("out{}", em.buf[&m]), idx, &em.var(m))
}

/// Declares in `sp` an access for every operand of `ms` read from memory (neither a member
/// nor a constant).
fn access_operands(
    em: &mut Emitter,
    sp: &mut Space,
    ms: impl IntoIterator<Item = NodeId>,
    members: &BTreeSet<NodeId>,
) {
    let g = em.g;
    for m in ms {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access(sp, i);
            }
        }
    }
}

/// `stmt` under the brace-less loops `heads`, each one level deeper than the one before.
fn nested_loops(c: &mut Code, heads: &[&str], stmt: &str) {
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
fn c_function(code: &mut Code, head: &str, parts: &[&Code]) {
    debug_assert_eq!(code.depth(), 0, "C functions are top-level");
    code.line(format!("{head} {{"));
    for p in parts {
        code.append(p);
    }
    code.line("}");
}

/// The parameter list of every kernel and pack function.
const KERNEL_PARAMS: &str =
    "(void *const *bufs, const int64_t *dims, const af_tiling *t, int64_t block, float *scratch)";

/// Partial sums per row reduction. Sixteen, not eight: with the row length known at compile
/// time GCC 12 turns an 8-lane partial loop into scalar adds under AVX-512 (x86-64-v4), 5x
/// slower than the baseline build; 16 lanes vectorise as one zmm (or two ymm) chain on every ISA.
const RED_LANES: usize = 16;

/// Where the members of an elementwise group run within a row.
struct RowSchedule {
    /// The column loop a full-width op runs in.
    phase: BTreeMap<NodeId, usize>,
    /// The level a row value is ready at: computed before column loop `level` (after the last
    /// loop for `n_loops`).
    level: BTreeMap<NodeId, usize>,
    /// The column loop a reduction accumulates in (it is ready after it).
    reduce_loop: BTreeMap<NodeId, usize>,
    n_loops: usize,
    /// Row buffer index of every full-width value read in a later loop.
    rowbuf: BTreeMap<NodeId, usize>,
}

/// Assigns the members of an elementwise group over `space` to column loops and row levels.
fn schedule_rows(g: &Graph, grp: &Group, space: &Shape, members: &BTreeSet<NodeId>) -> RowSchedule {
    let row_shape = {
        let mut r = space.clone();
        *r.last_mut().unwrap() = DimExpr::constant(1);
        r
    };
    let full = |id: NodeId| {
        *space == row_shape
            || iter_shape(g, id) == *space && !matches!(g.node(id).op, Op::Reduce { .. })
    };
    // Phases: a full-width op runs in the loop of its phase; a row value is ready at its level.
    let mut phase: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut level: BTreeMap<NodeId, usize> = BTreeMap::new();
    let avail = |phase: &BTreeMap<NodeId, usize>,
                 level: &BTreeMap<NodeId, usize>,
                 i: NodeId|
     -> usize { phase.get(&i).or(level.get(&i)).copied().unwrap_or(0) };
    let mut reduce_loop: BTreeMap<NodeId, usize> = BTreeMap::new();
    for &m in &grp.nodes {
        let n = g.node(m);
        let a = n.inputs.iter().map(|i| avail(&phase, &level, *i)).max().unwrap_or(0);
        if matches!(n.op, Op::Reduce { .. }) {
            reduce_loop.insert(m, a); // accumulates in loop `a`, ready after it
            level.insert(m, a + 1);
        } else if full(m) {
            phase.insert(m, a);
        } else {
            level.insert(m, a);
        }
    }
    let n_loops = phase.values().chain(reduce_loop.values()).map(|p| p + 1).max().unwrap_or(0);
    let rowbuf = row_buffers(g, members, &phase, &reduce_loop);
    RowSchedule { phase, level, reduce_loop, n_loops, rowbuf }
}

/// Numbers the full-width values read in a later column loop than their own.
fn row_buffers(
    g: &Graph,
    members: &BTreeSet<NodeId>,
    phase: &BTreeMap<NodeId, usize>,
    reduce_loop: &BTreeMap<NodeId, usize>,
) -> BTreeMap<NodeId, usize> {
    // Full-width values read in a later loop live in row buffers.
    let users = g.users();
    let mut rowbuf: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (&m, &p) in phase {
        let later = users[m.idx()].iter().any(|u| {
            members.contains(u) && phase.get(u).or(reduce_loop.get(u)).is_some_and(|q| *q > p)
        });
        if later {
            let k = rowbuf.len();
            rowbuf.insert(m, k);
        }
    }
    rowbuf
}

/// An elementwise group being emitted as a row loop.
struct RowLoop<'a> {
    nodes: &'a [NodeId],
    members: BTreeSet<NodeId>,
    outputs: BTreeSet<NodeId>,
    sp: Space,
    s: RowSchedule,
}

/// Whether member `m` is a max reduction.
fn is_max_reduce(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. })
}

/// The row loop of an elementwise group: each block takes a range of rows of its space.
fn gen_rows(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let g = em.g;
    let space = space_of(g, &grp.nodes).expect("planner checked the space");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let s = schedule_rows(g, grp, &space, &members);
    let mut sp = Space { tag: "x", shape: space.clone(), accesses: BTreeMap::new() };
    access_operands(em, &mut sp, grp.nodes.iter().copied(), &members);
    let em: &Emitter = em;
    let outputs = grp.outputs.iter().copied().collect();
    let rl = RowLoop { nodes: &grp.nodes, members, outputs, sp, s };
    let r_expr = em.dim(&numel(&space[..space.len() - 1]));
    let n_expr = em.dim(space.last().unwrap());
    body.line(format!("const int64_t R = {r_expr}, N = {n_expr};"));
    body.line(
        "const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);",
    );
    for (m, k) in &rl.s.rowbuf {
        body.line(format!(
            "float *rb{} = scratch + (int64_t){k} * N; /* {} */",
            m.0,
            g.node(*m).name
        ));
    }
    body.block("for (int64_t r = r0; r < r1; ++r)", |c| {
        em.row_prologue(&rl.sp, "r", c);
        for p in 0..rl.s.n_loops {
            row_values(em, &rl, p, c);
            column_loop(em, &rl, p, c);
        }
        row_values(em, &rl, rl.s.n_loops, c);
    });
    Work::Rows {
        rows: numel(&space[..space.len() - 1]),
        n: space.last().unwrap().clone(),
        row_buffers: rl.s.rowbuf.len() as u32,
    }
}

/// The row values ready at `lvl` (reduction results and what is computed from them), stored
/// when they are outputs.
fn row_values(em: &Emitter, rl: &RowLoop, lvl: usize, c: &mut Code) {
    let g = em.g;
    for &m in rl.nodes {
        if rl.s.level.get(&m) != Some(&lvl) {
            continue;
        }
        let n = g.node(m);
        if let Op::Reduce { kind, .. } = n.op {
            let e = round_to(
                n.dtype,
                match kind {
                    ReduceKind::Mean => format!("acc{} / (float)N", m.0),
                    _ => format!("acc{}", m.0),
                },
            );
            c.line(format!("const float {} = {e}; /* {} */", em.var(m), n.name));
        } else {
            c.line(member_def(em, &rl.sp, &rl.members, &|x| Some(em.var(x)), m, "0"));
        }
        if rl.outputs.contains(&m) {
            c.line(store_out(em, m, "r"));
        }
    }
}

/// Column loop `p` of a row: the lane partials of its reductions, the loop over the columns,
/// and the joined reduction results.
fn column_loop(em: &Emitter, rl: &RowLoop, p: usize, c: &mut Code) {
    let g = em.g;
    let reds: Vec<NodeId> =
        rl.s.reduce_loop.iter().filter(|(_, lp)| **lp == p).map(|(m, _)| *m).collect();
    for &m in &reds {
        let init = if is_max_reduce(g, m) { "(-INFINITY)" } else { "0.0f" };
        c.line(format!(
            "float accv{0}[{RED_LANES}] = {{{1}}};",
            m.0,
            vec![init; RED_LANES].join(", ")
        ));
    }
    let (lb, lt) = column_bodies(em, rl, p);
    if reds.is_empty() {
        c.block("for (int64_t c = 0; c < N; ++c)", |c| {
            c.line("const int64_t l = 0; (void)l;");
            // The body sits one level deeper than this loop needs, as deep as in the lane
            // loops (the generated code has always been indented so).
            c.indented(|c| {
                c.append(&lt);
            });
        });
    } else {
        lane_loops(g, p, &reds, &lb, &lt, c);
        for &m in &reds {
            c.line(format!("const float acc{} = {};", m.0, lane_tree(m, is_max_reduce(g, m))));
        }
    }
}

/// The body of column loop `p` for column `c`, as the lane loop runs it and as the tail runs it.
fn column_bodies(em: &Emitter, rl: &RowLoop, p: usize) -> (Code, Code) {
    let g = em.g;
    // The loop body for column `c`; reductions accumulate into lane `l` of RED_LANES
    // partials, so the sums run as independent chains the compiler can vectorise.
    let (mut lb, mut lt) = (Code::new(), Code::new()); // main loop body, tail body
    for &m in rl.nodes {
        let n = g.node(m);
        let local = |x: NodeId| -> Option<String> {
            if let Some(k) = rl.s.phase.get(&x) {
                if *k < p {
                    return Some(format!("rb{}[c]", x.0));
                }
            }
            Some(em.var(x))
        };
        if rl.s.reduce_loop.get(&m) == Some(&p) {
            let x = operand(em, &rl.sp, &rl.members, &local, n.inputs[0], "c");
            if is_max_reduce(g, m) {
                // Maxima go through a lane buffer and a separate max loop: GCC 12 does not
                // vectorise a conditional update of scalarised partials (~3x slower).
                lb.line(format!("tv{}[l] = {x}; /* {} */", m.0, n.name));
                lt.line(format!("{{ const float xv = {x}; accv{0}[l] = xv > accv{0}[l] ? xv : accv{0}[l]; }} /* {1} */", m.0, n.name));
            } else {
                lb.line(format!("accv{}[l] += {x}; /* {} */", m.0, n.name));
                lt.line(format!("accv{}[l] += {x}; /* {} */", m.0, n.name));
            }
        } else if rl.s.phase.get(&m) == Some(&p) {
            let mut op = Code::new();
            op.line(member_def(em, &rl.sp, &rl.members, &local, m, "c"));
            if rl.s.rowbuf.contains_key(&m) {
                op.line(format!("rb{}[c] = {};", m.0, em.var(m)));
            }
            if rl.outputs.contains(&m) {
                op.line(store_out(em, m, "r * N + c"));
            }
            lb.append(&op);
            lt.append(&op);
        }
    }
    (lb, lt)
}

/// The lane loop over whole groups of RED_LANES columns (body `lb`), then the remaining
/// columns one by one (body `lt`).
fn lane_loops(g: &Graph, p: usize, reds: &[NodeId], lb: &Code, lt: &Code, c: &mut Code) {
    c.line(format!("int64_t cb{p} = 0;"));
    let maxes: Vec<NodeId> = reds.iter().copied().filter(|m| is_max_reduce(g, *m)).collect();
    c.block(format!("for (; cb{p} + {RED_LANES} <= N; cb{p} += {RED_LANES})"), |c| {
        for m in &maxes {
            c.line(format!("float tv{}[{RED_LANES}];", m.0));
        }
        c.block(format!("for (int64_t l = 0; l < {RED_LANES}; ++l)"), |c| {
            c.line(format!("const int64_t c = cb{p} + l;"));
            c.append(lb);
        });
        for m in &maxes {
            c.line(format!("for (int64_t l = 0; l < {RED_LANES}; ++l) accv{0}[l] = tv{0}[l] > accv{0}[l] ? tv{0}[l] : accv{0}[l];", m.0));
        }
    });
    c.block_noted(&format!("for (int64_t l = 0; cb{p} + l < N; ++l)"), "tail", |c| {
        c.block("", |c| {
            c.line(format!("const int64_t c = cb{p} + l;"));
            c.append(lt);
        });
    });
}

/// The expression joining the RED_LANES partials of reduction `m`.
fn lane_tree(m: NodeId, max: bool) -> String {
    let v = |k: usize| format!("accv{}[{k}]", m.0);
    // Partial maxima are never NaN (they start at -inf and skip NaN), so a plain max joins them.
    let comb = |x: String, y: String| {
        if max {
            format!("(({x}) > ({y}) ? ({x}) : ({y}))")
        } else {
            format!("({x} + {y})")
        }
    };
    // Pairwise tree over the partials (fixed order: the result does not depend on the ISA).
    let mut level: Vec<String> = (0..RED_LANES).map(v).collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| comb(p[0].clone(), p[1].clone())).collect();
    }
    level.pop().unwrap()
}

fn gen_matmul(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    body.line("const int64_t hoff = 0;");
    let (batch, m, n, k) = gen_matmul_part(em, grp.anchor.unwrap(), &members, &outputs, body);
    Work::MatMul { batch, m, n, k }
}

/// Several matmuls sharing their A operand in one launch (`qkv_horizontal`): the blocks walk
/// the concatenation of the parts' work units.
fn gen_horizontal(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    body.line("int64_t hoff = 0;");
    let mut parts = Vec::new();
    for (anchor, members) in crate::group::horizontal_parts(em.g, &grp.nodes) {
        // The braces scope the part's constants; its code is not indented inside them.
        body.line(format!("{{ /* part: {} */", em.g.node(anchor).name));
        parts.push(gen_matmul_part(em, anchor, &members, &outputs, body));
        body.line("hoff += units;");
        body.line("}");
    }
    Work::Horizontal { parts }
}

/// One matmul of a kernel with its prologue and epilogue, and how its operands are read.
struct MatmulPart {
    anchor: NodeId,
    a_in: NodeId,
    b_in: NodeId,
    out_shape: Shape,
    k_dim: DimExpr,
    batch: Shape,
    /// Members upstream of the anchor, applied while packing A.
    prologue: BTreeSet<NodeId>,
    /// The other members, applied while storing C.
    epilogue: Vec<NodeId>,
    spa: Space,
    spb: Space,
    spo: Space,
    /// The `bufs` slot of B and its element type when it is packed once per weight tensor.
    packed: Option<(usize, DType)>,
    /// A is read in place by the micro-kernel (no packing).
    a_direct: bool,
}

/// Splits the members around the anchor, declares the accesses of the spaces of A, B and the
/// output, and makes the pack function of a B read from a parameter.
fn matmul_part(em: &mut Emitter, anchor: NodeId, members: &BTreeSet<NodeId>) -> MatmulPart {
    let g = em.g;
    let out_shape = g.node(anchor).shape.clone();
    let r = out_shape.len();
    let (a_in, b_in) = (g.node(anchor).inputs[0], g.node(anchor).inputs[1]);
    let k_dim = g.node(a_in).shape.last().unwrap().clone();
    let batch: Shape = out_shape[..r - 2].to_vec();
    let mut a_shape = batch.clone();
    a_shape.push(out_shape[r - 2].clone());
    a_shape.push(k_dim.clone());
    let mut b_shape = batch.clone();
    b_shape.push(k_dim.clone());
    b_shape.push(out_shape[r - 1].clone());
    // Prologue = members upstream of the anchor; epilogue = the rest.
    let prologue = crate::group::prologue_of(g, anchor, |i| members.contains(i));
    let epilogue: Vec<NodeId> =
        members.iter().copied().filter(|m| *m != anchor && !prologue.contains(m)).collect();
    let mut spa = Space { tag: "a", shape: a_shape, accesses: BTreeMap::new() };
    let mut spb = Space { tag: "b", shape: b_shape.clone(), accesses: BTreeMap::new() };
    let mut spo = Space { tag: "o", shape: out_shape.clone(), accesses: BTreeMap::new() };
    access_operands(em, &mut spa, prologue.iter().copied(), members);
    if !members.contains(&a_in) {
        em.access(&mut spa, a_in);
    }
    // B read from a parameter (a weight) is packed once per tensor by a pack function the
    // runtime runs (see `abi::PackMeta`); any other B is packed here, one sliver at a time.
    let packed = matches!(g.node(resolve(g, b_in).base).op, Op::Param { .. })
        .then(|| (pack_b(em, &b_shape, b_in), g.node(b_in).dtype));
    if packed.is_none() {
        em.access(&mut spb, b_in);
    }
    access_operands(em, &mut spo, epilogue.iter().copied(), members);
    // A of f32 with contiguous rows and no prologue is read in place by the micro-kernel.
    let a_direct =
        prologue.is_empty() && g.node(a_in).dtype.is_compute() && !em.strided_cols(&spa, a_in);
    MatmulPart {
        anchor,
        a_in,
        b_in,
        out_shape,
        k_dim,
        batch,
        prologue,
        epilogue,
        spa,
        spb,
        spo,
        packed,
        a_direct,
    }
}

/// One matmul with its prologue and epilogue; its work units start at `hoff` in the block
/// numbering. Returns (batch, m, n, k).
fn gen_matmul_part(
    em: &mut Emitter,
    anchor: NodeId,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    body: &mut Code,
) -> (DimExpr, DimExpr, DimExpr, DimExpr) {
    let mp = matmul_part(em, anchor, members);
    let em: &Emitter = em;
    matmul_setup(em, &mp, body);
    body.block("for (int64_t u = u0; u < u1; ++u)", |c| {
        c.line("const int64_t bi = u / (mt * nt), mi = (u / nt) % mt, ni = u % nt;");
        c.line("const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min64(MC, M - m0), nlen = af_min64(NC, N - n0);");
        c.line("if (K <= 0) memset(Cc, 0, sizeof(float) * (size_t)(mlen * LDC));");
        k_blocks(em, &mp, members, c);
        // Epilogue while storing C.
        store_c(em, &mp, members, outputs, c);
    });
    let r = mp.out_shape.len();
    (numel(&mp.batch), mp.out_shape[r - 2].clone(), mp.out_shape[r - 1].clone(), mp.k_dim)
}

/// The sizes, tiling, micro-kernel, scratch layout and work units of a matmul part.
fn matmul_setup(em: &Emitter, mp: &MatmulPart, c: &mut Code) {
    let r = mp.out_shape.len();
    let bt = em.dim(&numel(&mp.batch));
    let (m_e, n_e, k_e) =
        (em.dim(&mp.out_shape[r - 2]), em.dim(&mp.out_shape[r - 1]), em.dim(&mp.k_dim));
    c.line(format!("const int64_t BATCH = {bt}, M = {m_e}, N = {n_e}, K = {k_e};"));
    c.line("const int64_t MC = t->mc, NC = t->nc, KC = t->kc;");
    c.line("const af_isa_info isa = af_isa();");
    c.line("const int64_t MR = isa.mr, NR = isa.nr;");
    if let Some((slot, dt)) = mp.packed {
        let (t, what) = match dt {
            DType::F32 => ("float", "B"),
            DType::F16 => ("uint16_t", "B (f16 bits)"),
            DType::BF16 => ("uint16_t", "B (bf16 bits)"),
        };
        c.line(format!("const {t} *restrict Bpk = (const {t} *)bufs[{slot}]; /* {what}, packed once per weight tensor */"));
        c.line("const int64_t nsl = (N + NR - 1) / NR;");
    }
    c.line("float *Ap = scratch, *Ar = Ap + (MC + AF_MR_MAX) * KC, *Bs = Ar + KC, *Cc = Bs + KC * AF_NR_MAX;");
    c.line("const int64_t LDC = NC + 16; /* C block rows padded by a cache line: no 4 KiB aliasing between rows */");
    c.line("(void)Ar;");
    c.line(
        "const int64_t mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;",
    );
    c.line("const int64_t ub = block * t->rows_per_block - hoff, u0 = ub < 0 ? 0 : ub, u1 = af_min64(units, ub + t->rows_per_block);");
}

/// The K blocks of one tile of C: A read in place or packed, B's slivers, the micro-kernel.
fn k_blocks(em: &Emitter, mp: &MatmulPart, members: &BTreeSet<NodeId>, c: &mut Code) {
    if mp.a_direct {
        let a = mp.spa.accesses[&mp.a_in];
        c.line("/* A read in place (f32, contiguous rows): no packing */");
        em.row_prologue(&mp.spa, "bi * M + m0", c);
        c.line(format!(
            "const float *Ab = in{} + ac{a}_row;",
            em.buf[&resolve(em.g, mp.a_in).base]
        ));
        c.line(format!("const int64_t lda = ac{a}_s{};", mp.out_shape.len() - 2));
    }
    c.block("for (int64_t k0 = 0; k0 < K; k0 += KC)", |c| {
        c.line("const int64_t klen = af_min64(KC, K - k0);");
        if !mp.a_direct {
            // Pack A in slivers of MR rows, applying the prologue once per row of the block.
            pack_a(em, mp, members, c);
        }
        c.block("for (int64_t jr = 0; jr < nlen; jr += NR)", |c| {
            c.line("const int64_t nr = af_min64(NR, nlen - jr);");
            if mp.packed.is_some() {
                // NC is a multiple of NR_MAX (or N has one tile), so n0 + jr starts a sliver.
                let t = ctype(mp.packed.map_or(DType::F32, |p| p.1));
                c.line(format!("const {t} *restrict bsl = Bpk + ((bi * nsl + (n0 + jr) / NR) * K + k0) * NR;"));
            } else {
                c.line("/* pack one sliver of B */");
                b_sliver(em, &mp.spb, mp.b_in, ("k0", "klen"), "n0 + jr", "Bs", false, c);
            }
            let asrc =
                if mp.a_direct { "Ab + ir * lda + k0, lda, 1" } else { "Ap + ir * klen, 1, MR" };
            let tiles = "for (int64_t ir = 0; ir < mlen; ir += MR)";
            let call = |uk: &str, b: &str| format!("isa.{uk}(klen, {asrc}, {b}, Cc + ir * LDC + jr, LDC, af_min64(MR, mlen - ir), nr, k0 > 0);");
            match mp.packed {
                None => nested_loops(c, &[tiles], &call("uk", "Bs")),
                Some((_, dt)) => widen_or_direct(dt, tiles, &call, c),
            }
        });
    });
}

/// The micro-kernel calls on a sliver of a 16-bit weight: several row tiles reuse the sliver,
/// so it is widened once into `Bs` for the f32 kernel; a single tile (decode) lets the kernel
/// widen B as it loads it, reading half the bytes.
fn widen_or_direct(dt: DType, tiles: &str, call: &dyn Fn(&str, &str) -> String, c: &mut Code) {
    let (uk16, widen) = match dt {
        // Packed as the kernel reads it: nothing to widen.
        DType::F32 => return nested_loops(c, &[tiles], &call("uk", "bsl")),
        DType::F16 => ("uk_f16", "widen_f16"),
        DType::BF16 => ("uk_bf16", "widen_bf16"),
    };
    let note = "widen the sliver once for the row tiles that share it";
    c.if_else(
        "mlen > MR",
        note,
        |c| {
            c.line(format!("isa.{widen}(bsl, Bs, klen * NR);"));
            nested_loops(c, &[tiles], &call("uk", "Bs"));
        },
        |c| {
            c.line("const int64_t ir = 0; /* one row tile */");
            c.line(call(uk16, "bsl"));
        },
    );
}

/// The loop packing the block of A in slivers of MR rows, with the prologue applied per row.
fn pack_a(em: &Emitter, mp: &MatmulPart, members: &BTreeSet<NodeId>, c: &mut Code) {
    let note = format!("pack A{}", if mp.prologue.is_empty() { "" } else { " with the prologue" });
    c.block_noted("for (int64_t m = 0; m < mlen; ++m)", &note, |c| {
        em.row_prologue(&mp.spa, "bi * M + m0 + m", c);
        c.line("float *ap = Ap + (m / MR) * MR * klen + m % MR;");
        let a_val = operand(em, &mp.spa, members, &|x| Some(em.var(x)), mp.a_in, "c");
        if mp.prologue.is_empty() {
            c.block("for (int64_t k = 0; k < klen; ++k)", |c| {
                c.line("const int64_t c = k0 + k;");
                c.line(format!("ap[k * MR] = {a_val};"));
            });
        } else {
            // Compute the row contiguously (so it vectorises), then scatter it into the sliver.
            c.block("for (int64_t k = 0; k < klen; ++k)", |c| {
                c.line("const int64_t c = k0 + k;");
                for &m in members.iter().filter(|m| mp.prologue.contains(m)) {
                    c.line(member_def(em, &mp.spa, members, &|x| Some(em.var(x)), m, "c"));
                }
                c.line(format!("Ar[k] = {a_val};"));
            });
            c.line("for (int64_t k = 0; k < klen; ++k) ap[k * MR] = Ar[k];");
        }
    });
}

/// The loop storing the tile of C, with the epilogue applied on the way.
fn store_c(
    em: &Emitter,
    mp: &MatmulPart,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    c: &mut Code,
) {
    let g = em.g;
    let note = format!("store C{}", if mp.epilogue.is_empty() { "" } else { " with the epilogue" });
    c.block_noted("for (int64_t m = 0; m < mlen; ++m)", &note, |c| {
        em.row_prologue(&mp.spo, "bi * M + m0 + m", c);
        c.line("const int64_t orow = (bi * M + m0 + m) * N;");
        c.block("for (int64_t n = 0; n < nlen; ++n)", |c| {
            c.line("const int64_t c = n0 + n;");
            let acc = round_to(g.node(mp.anchor).dtype, "Cc[m * LDC + n]".into());
            c.line(format!(
                "const float {} = {acc}; /* {} */",
                em.var(mp.anchor),
                g.node(mp.anchor).name
            ));
            if outputs.contains(&mp.anchor) {
                c.line(store_out(em, mp.anchor, "orow + c"));
            }
            for &m in &mp.epilogue {
                c.line(member_def(em, &mp.spo, members, &|x| Some(em.var(x)), m, "c"));
                if outputs.contains(&m) {
                    c.line(store_out(em, m, "orow + c"));
                }
            }
        });
    });
}

/// Code writing rows `k0 .. k0 + klen` of B's NR columns from `col0` into the sliver `dst`
/// (`dst[k * NR + j]`, columns past `nr` zero), in the space `sp` of B (batch + [K, N], row
/// index `bi * K + k`). A transposed view is walked column by column, K inside (along memory).
/// With `bits`, a 16-bit B is copied as its bits into a `uint16_t` sliver (zero is +0 there
/// too); otherwise the sliver is f32.
#[allow(clippy::too_many_arguments)]
fn b_sliver(
    em: &Emitter,
    sp: &Space,
    b: NodeId,
    (k0, klen): (&str, &str),
    col0: &str,
    dst: &str,
    bits: bool,
    c: &mut Code,
) {
    let k = if k0 == "0" { "k".to_string() } else { format!("{k0} + k") };
    let (t, zero) = if bits { ("uint16_t", "0") } else { ("float", "0.0f") };
    if em.strided_cols(sp, b) {
        em.row_prologue(sp, "bi * K", c);
        let (kk, col) = (k.as_str(), format!("{col0} + j"));
        let value =
            if bits { em.read_inner_bits(sp, b, kk, &col) } else { em.read_inner(sp, b, kk, &col) };
        c.block("for (int64_t j = 0; j < NR; ++j)", |c| {
            c.line(format!("if (j >= nr) {{ for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = {zero}; continue; }}"));
            c.line(format!("for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = {value};"));
        });
    } else {
        let col = format!("{col0} + j");
        let value = if bits { em.read_bits(sp, b, &col) } else { em.read(sp, b, &col) };
        c.block(format!("for (int64_t k = 0; k < {klen}; ++k)"), |c| {
            em.row_prologue(sp, &format!("bi * K + {k}"), c);
            c.line(format!("{t} *restrict row = {dst} + k * NR;"));
            c.line(format!("for (int64_t j = 0; j < nr; ++j) row[j] = {value};"));
            c.line(format!("for (int64_t j = nr; j < NR; ++j) row[j] = {zero};"));
        });
    }
}

/// The pack function of matmul operand `b_in` (shape `b_shape` = batch + [K, N]), read from a
/// parameter: appended to `em.packs`; returns the `bufs` slot the kernel finds it in. The
/// packed elements keep the parameter's dtype (a 16-bit weight is copied as its bits).
fn pack_b(em: &mut Emitter, b_shape: &Shape, b_in: NodeId) -> usize {
    let g = em.g;
    let j = em.packs.len();
    let slot = em.buf.len() + j;
    let func = format!("{}_pack{j}", em.kname);
    let param = resolve(g, b_in).base;
    let r = b_shape.len();
    let batch = numel(&b_shape[..r - 2]);
    let mut pe = Emitter::new(g, em.buf.clone(), &func);
    let mut sp = Space { tag: "b", shape: b_shape.clone(), accesses: BTreeMap::new() };
    pe.access(&mut sp, b_in);
    let b = em.buf[&param];
    let dtype = g.node(param).dtype;
    let (t, bits) = (ctype(dtype), !dtype.is_compute());
    let mut head = Code::at_depth(1);
    head.line("(void)dims; (void)scratch;");
    head.line(format!(
        "const {t} *restrict in{b} = (const {t} *)bufs[{b}]; /* {} */",
        g.node(param).name
    ));
    head.line(format!("{t} *restrict dst = ({t} *)bufs[{slot}];"));
    let mut body = Code::at_depth(1);
    body.line(format!(
        "const int64_t BATCH = {}, K = {}, N = {};",
        pe.dim(&batch),
        pe.dim(&b_shape[r - 2]),
        pe.dim(&b_shape[r - 1])
    ));
    body.line("const int64_t NR = af_isa().nr, nsl = (N + NR - 1) / NR, ng = (N + AF_NR_MAX - 1) / AF_NR_MAX;");
    body.line("const int64_t g0 = block * t->rows_per_block, g1 = af_min64(t->units, g0 + t->rows_per_block);");
    body.line("(void)BATCH;");
    let group = "a group of NR_MAX columns of one matrix";
    body.block_noted("for (int64_t gi = g0; gi < g1; ++gi)", group, |c| {
        c.line("const int64_t bi = gi / ng, c0 = (gi % ng) * AF_NR_MAX, c1 = af_min64(N, c0 + AF_NR_MAX);");
        c.block("for (int64_t j0 = c0; j0 < c1; j0 += NR)", |c| {
            c.line("const int64_t nr = af_min64(NR, N - j0);");
            c.line(format!("{t} *restrict ds = dst + (bi * nsl + j0 / NR) * K * NR;"));
            b_sliver(&pe, &sp, b_in, ("0", "K"), "j0", "ds", bits, c);
        });
    });
    let mut c = Code::new();
    let elems = if bits { format!("{} bits", dtype.name()) } else { "f32".into() };
    c.line(format!("/* {func}: B of {} (`{}`), packed once per weight tensor as {elems} in slivers of NR columns", em.kname, g.node(param).name));
    c.line(
        " * (the micro-kernel's B layout); the runtime reruns it only when another tensor is passed. */",
    );
    c_function(
        &mut c,
        &format!("AF_CLONES static void {func}{KERNEL_PARAMS}"),
        &[&head, &pe.decls, &body],
    );
    c.line("");
    // What the packed copy holds, so the runtime can share it between kernels and modules.
    let view = resolve(g, b_in);
    let strides = crate::layout::space_strides(&view, &g.node(b_in).shape, r);
    let meta = PackMeta {
        func,
        param,
        dtype,
        batch,
        k: b_shape[r - 2].clone(),
        n: b_shape[r - 1].clone(),
        batch_dims: b_shape[..r - 2].to_vec(),
        offset: view.offset,
        strides,
    };
    em.packs.push((meta, c.finish()));
    slot
}

/// An attention group as the flash kernel computes it: the pattern, its operands and sizes,
/// and the spaces of Q, K^T, V and the scores.
struct Flash {
    f: FlashParts,
    members: BTreeSet<NodeId>,
    q: NodeId,
    kt: NodeId,
    v: NodeId,
    batch: Shape,
    sq: DimExpr,
    sk: DimExpr,
    d: DimExpr,
    dv: DimExpr,
    spq: Space,
    spk: Space,
    spv: Space,
    sps: Space,
    /// The score chain holds a causal mask.
    causal: bool,
}

/// Finds the attention pattern of a flash group and declares the accesses of its spaces.
fn flash_group(em: &mut Emitter, grp: &Group) -> Flash {
    let g = em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let f = crate::group::flash_parts(g, &members).expect("planner formed a flash group");
    let (q, kt, v) = (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let ss = g.node(f.scores).shape.clone();
    let r = ss.len();
    let batch: Shape = ss[..r - 2].to_vec();
    let (sq, sk) = (ss[r - 2].clone(), ss[r - 1].clone());
    let d = g.node(q).shape.last().unwrap().clone();
    let dv = g.node(f.pv).shape.last().unwrap().clone();
    let with = |last2: [DimExpr; 2]| {
        let mut s = batch.clone();
        s.extend(last2);
        s
    };
    let mut spq =
        Space { tag: "q", shape: with([sq.clone(), d.clone()]), accesses: BTreeMap::new() };
    let mut spk =
        Space { tag: "k", shape: with([d.clone(), sk.clone()]), accesses: BTreeMap::new() };
    let mut spv =
        Space { tag: "v", shape: with([sk.clone(), dv.clone()]), accesses: BTreeMap::new() };
    let mut sps = Space { tag: "s", shape: ss, accesses: BTreeMap::new() };
    em.access(&mut spq, q);
    em.access(&mut spk, kt);
    em.access(&mut spv, v);
    access_operands(em, &mut sps, f.chain.iter().copied(), &members);
    let causal = f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask);
    Flash { f, members, q, kt, v, batch, sq, sk, d, dv, spq, spk, spv, sps, causal }
}

/// Online-softmax attention: for each block of queries, loop over blocks of keys keeping the
/// running row max, row sum and output accumulator; the S x S scores never reach memory.
fn gen_flash(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let fl = flash_group(em, grp);
    let em: &Emitter = em;
    flash_setup(em, &fl, body);
    body.block("for (int64_t u = u0; u < u1; ++u)", |c| {
        c.line("const int64_t bi = u / ug, qb0 = (u % ug) * QPU, qb1 = af_min64(qt, qb0 + QPU);");
        key_range(em, &fl, c);
        pack_kt(em, &fl, c);
        pack_v(em, &fl, c);
        query_blocks(em, &fl, c);
    });
    let Flash { batch, sq, sk, d, dv, .. } = fl;
    Work::Flash { batch: numel(&batch), sq, sk, d, dv }
}

/// The sizes, tiling, micro-kernel, scratch layout and work units of a flash kernel.
fn flash_setup(em: &Emitter, fl: &Flash, c: &mut Code) {
    c.line(format!(
        "const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&fl.batch)),
        em.dim(&fl.sq),
        em.dim(&fl.sk),
        em.dim(&fl.d),
        em.dim(&fl.dv)
    ));
    c.line(
        "/* units: QPU query blocks of BR rows of one head; K and V are packed once per unit */",
    );
    c.line("const int64_t BR = t->mc, BC = t->nc, QPU = t->kc, qt = (SQ + BR - 1) / BR, ug = (qt + QPU - 1) / QPU, units = BATCH * ug;");
    c.line("const af_isa_info isa = af_isa();");
    c.line("const int64_t MR = isa.mr, NR = isa.nr, SKP = (SK + AF_NR_MAX - 1) / AF_NR_MAX * AF_NR_MAX, DVP = (DV + NR - 1) / NR * NR;");
    c.line("/* K^T of the head (slivers of NR keys x D), V of the head (slivers of NR columns x SK keys),");
    c.line(" * the packed query block, scores / probabilities, output accumulator, row max and row sum */");
    c.line("float *Kp = scratch, *Vp = Kp + D * SKP, *Qp = Vp + (DV + AF_NR_MAX) * SK, *St = Qp + (BR + AF_MR_MAX) * D;");
    c.line("float *Ot = St + BR * BC, *Mr = Ot + BR * DV, *Lr = Mr + BR;");
    c.line("const int64_t u0 = block * t->rows_per_block, u1 = af_min64(units, u0 + t->rows_per_block);");
}

/// The keys the unit's queries see (`kend`), and that rounded up to whole slivers (`kendp`).
fn key_range(em: &Emitter, fl: &Flash, c: &mut Code) {
    if fl.causal {
        let shift = fl.sk.sub(&fl.sq);
        c.line("/* keys any query of the unit sees, rounded up to whole key blocks (later ones are masked) */");
        c.line(format!("const int64_t need = af_min64(SQ, qb1 * BR) + {};", em.dim(&shift)));
        c.line("const int64_t kend = af_min64(SK, (need + BC - 1) / BC * BC);");
    } else {
        c.line("const int64_t kend = SK;");
    }
    c.line("const int64_t kendp = (kend + NR - 1) / NR * NR;");
}

/// Packs K^T of the unit's keys in slivers of NR keys (keys past `kend` zero).
fn pack_kt(em: &Emitter, fl: &Flash, c: &mut Code) {
    if em.strided_cols(&fl.spk, fl.kt) {
        // K^T is a transposed view of K: walk the keys outside, the head dim inside (along memory).
        c.block_noted("", "pack K^T in slivers of NR keys, key by key", |c| {
            em.row_prologue(&fl.spk, "bi * D", c);
            c.block("for (int64_t j = 0; j < kendp; ++j)", |c| {
                c.line("float *kp = Kp + (j / NR) * NR * D + j % NR;");
                c.line("if (j >= kend) { for (int64_t c = 0; c < D; ++c) kp[c * NR] = 0.0f; continue; }");
                c.line(format!(
                    "for (int64_t c = 0; c < D; ++c) kp[c * NR] = {};",
                    em.read_inner(&fl.spk, fl.kt, "c", "j")
                ));
            });
        });
    } else {
        let note = "pack K^T in slivers of NR keys";
        c.block_noted("for (int64_t c = 0; c < D; ++c)", note, |c| {
            em.row_prologue(&fl.spk, "bi * D + c", c);
            c.block("for (int64_t js = 0; js < kendp; js += NR)", |c| {
                c.line("float *kp = Kp + js * D + c * NR;");
                c.line("const int64_t nj = af_min64(NR, kend - js);");
                c.line(format!(
                    "for (int64_t j = 0; j < nj; ++j) kp[j] = {};",
                    em.read(&fl.spk, fl.kt, "js + j")
                ));
                c.line("for (int64_t j = nj; j < NR; ++j) kp[j] = 0.0f;");
            });
        });
    }
}

/// Packs V of the unit's keys in slivers of NR columns (columns past DV zero).
fn pack_v(em: &Emitter, fl: &Flash, c: &mut Code) {
    let note = "pack V in slivers of NR columns";
    c.block_noted("for (int64_t j = 0; j < kend; ++j)", note, |c| {
        em.row_prologue(&fl.spv, "bi * SK + j", c);
        c.block("for (int64_t cs = 0; cs < DVP; cs += NR)", |c| {
            c.line("float *vp = Vp + cs * SK + j * NR;");
            c.line("const int64_t nc = af_min64(NR, DV - cs);");
            c.line(format!(
                "for (int64_t c = 0; c < nc; ++c) vp[c] = {};",
                em.read(&fl.spv, fl.v, "cs + c")
            ));
            c.line("for (int64_t c = nc; c < NR; ++c) vp[c] = 0.0f;");
        });
    });
}

/// The loop over the unit's query blocks: the block of Q, the key blocks, the normalised store.
fn query_blocks(em: &Emitter, fl: &Flash, c: &mut Code) {
    // The loop's body is not indented in the output, so its braces are plain lines.
    c.line("for (int64_t qb = qb0; qb < qb1; ++qb) {");
    c.line("const int64_t q0 = qb * BR, br = af_min64(BR, SQ - q0);");
    let q_direct = query_block(em, fl, c);
    key_blocks(em, fl, q_direct, c);
    let g = em.g;
    let rs = RowStore::new(em, fl.f.pv, &fl.members);
    let ob = em.buf[&rs.buf];
    let note = if rs.buf == fl.f.pv {
        "normalise and store".to_string()
    } else {
        format!(
            "normalise and store, each row at its place in {} (layout_store)",
            g.node(rs.buf).name
        )
    };
    c.block_noted("for (int64_t i = 0; i < br; ++i)", &note, |c| {
        c.line("const float inv = 1.0f / Lr[i];");
        let _ = writeln!(c, "const int64_t orow = {};", rs.offset("bi * SQ + q0 + i", "DV"));
        let val = round_to(g.node(fl.f.pv).dtype, "Ot[i * DV + c] * inv".into());
        c.line(format!(
            "for (int64_t c = 0; c < DV; ++c) {{ const float o = {val}; {} }}",
            store(g.node(fl.f.pv).dtype, &format!("out{ob}"), "orow + c", "o")
        ));
    });
    c.line("} /* query blocks */");
}

/// The query block, read in place or packed as MR-row slivers, and the reset of its rows'
/// softmax state. Returns whether Q is read in place.
fn query_block(em: &Emitter, fl: &Flash, c: &mut Code) -> bool {
    let reset = |c: &mut Code| {
        c.line("Mr[i] = -INFINITY; Lr[i] = 0.0f;");
        c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] = 0.0f;");
    };
    // Q of f32 with contiguous rows is read in place by the micro-kernel, else packed.
    let q_direct = em.g.node(fl.q).dtype.is_compute() && !em.strided_cols(&fl.spq, fl.q);
    if q_direct {
        let a = fl.spq.accesses[&fl.q];
        c.line("/* the query block, read in place (f32, contiguous rows) */");
        em.row_prologue(&fl.spq, "bi * SQ + q0", c);
        c.line(format!("const float *Qb = in{} + ac{a}_row;", em.buf[&resolve(em.g, fl.q).base]));
        c.line(format!("const int64_t ldq = ac{a}_s{};", fl.batch.len()));
        c.line("(void)Qp;");
        c.block("for (int64_t i = 0; i < br; ++i)", reset);
    } else {
        let note = "pack the query block as MR-row slivers";
        c.block_noted("for (int64_t i = 0; i < br; ++i)", note, |c| {
            c.line("float *qp = Qp + (i / MR) * MR * D + i % MR;");
            em.row_prologue(&fl.spq, "bi * SQ + q0 + i", c);
            c.line(format!(
                "for (int64_t c = 0; c < D; ++c) qp[c * MR] = {};",
                em.read(&fl.spq, fl.q, "c")
            ));
            reset(c);
        });
    }
    q_direct
}

/// The loop over key blocks: S = Q K^T, each score row through the chain and the online
/// softmax, then O += P V.
fn key_blocks(em: &Emitter, fl: &Flash, q_direct: bool, c: &mut Code) {
    c.block("for (int64_t k0 = 0; k0 < kend; k0 += BC)", |c| {
        if fl.causal {
            let shift = fl.sk.sub(&fl.sq);
            c.line(format!("if (k0 > q0 + br - 1 + {}) break; /* every later key is masked for this block */", em.dim(&shift)));
        }
        c.line("const int64_t bc = af_min64(BC, SK - k0);");
        c.line("/* S = Q K^T on the micro-kernel (BC is a multiple of NR_MAX, so k0 + jr starts a sliver) */");
        let qsrc = if q_direct { "Qb + ir * ldq, ldq, 1" } else { "Qp + ir * D, 1, MR" };
        nested_loops(
            c,
            &["for (int64_t jr = 0; jr < bc; jr += NR)", "for (int64_t ir = 0; ir < br; ir += MR)"],
            &format!("isa.uk(D, {qsrc}, Kp + (k0 + jr) * D, St + ir * BC + jr, BC, af_min64(MR, br - ir), af_min64(NR, bc - jr), 0);"),
        );
        c.block("for (int64_t i = 0; i < br; ++i)", |c| score_row(em, fl, c));
        c.line("/* O += P V on the micro-kernel, P read in place from the score rows */");
        nested_loops(
            c,
            &["for (int64_t jr = 0; jr < DV; jr += NR)", "for (int64_t ir = 0; ir < br; ir += MR)"],
            "isa.uk(bc, St + ir * BC, BC, 1, Vp + jr * SK + k0 * NR, Ot + ir * DV + jr, DV, af_min64(MR, br - ir), af_min64(NR, DV - jr), 1);",
        );
    });
}

/// Score row `i` of a key block: the chain applied in place, then the online softmax update.
fn score_row(em: &Emitter, fl: &Flash, c: &mut Code) {
    let g = em.g;
    em.row_prologue(&fl.sps, "bi * SQ + q0 + i", c);
    c.line("float *restrict srow = St + i * BC;");
    c.block("for (int64_t j = 0; j < bc; ++j)", |c| {
        let qk = fl.f.qk;
        let s = round_to(g.node(qk).dtype, "srow[j]".into());
        c.line(format!("const float {} = {s}; /* {} */", em.var(qk), g.node(qk).name));
        for &m in &fl.f.chain {
            c.line(member_def(em, &fl.sps, &fl.members, &|x| Some(em.var(x)), m, "k0 + j"));
        }
        c.line(format!("srow[j] = {};", em.var(fl.f.scores)));
    });
    c.line("/* online softmax: rescale what was accumulated under the old max */");
    c.line("const float mx = af_vmax(srow, bc, Mr[i]), corr = af_expf(Mr[i] - mx);");
    c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] *= corr;");
    c.line("Lr[i] = Lr[i] * corr + af_vexp_sum(srow, bc, mx);");
    c.line("Mr[i] = mx;");
}

/// The row loop of a concatenation: each column is read from the input covering it.
fn gen_concat(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let g = em.g;
    let id = grp.nodes[0];
    let n = g.node(id);
    let Op::Concat { axis } = n.op else { unreachable!() };
    let shape = n.shape.clone();
    let rank = shape.len();
    let mut sp = Space { tag: "x", shape: shape.clone(), accesses: BTreeMap::new() };
    for &i in &n.inputs {
        em.access(&mut sp, i);
    }
    let em: &Emitter = em;
    let r_expr = em.dim(&numel(&shape[..rank - 1]));
    body.line(format!("const int64_t R = {r_expr}, N = {};", em.dim(&shape[rank - 1])));
    body.line(
        "const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);",
    );
    body.block("for (int64_t r = r0; r < r1; ++r)", |c| {
        em.row_prologue(&sp, "r", c);
        let ob = em.buf[&id];
        // Each input covers [start, start + extent) of the concatenated axis; its own index along
        // the axis is shifted back by start (so its access offset is corrected by -start*stride).
        let mut start = DimExpr::constant(0);
        let pos = if axis + 1 == rank { "c".to_string() } else { format!("x_i{axis}") };
        c.block("for (int64_t c = 0; c < N; ++c)", |c| {
            for (j, &i) in n.inputs.iter().enumerate() {
                let ext = g.node(i).shape[axis].clone();
                let end = start.add(&ext);
                let a = sp.accesses[&i];
                let s = em.dim(&start);
                let idx = format!("ac{a}_row + c * ac{a}_s{} - ({s}) * ac{a}_s{axis}", rank - 1);
                let v = load(g.node(i).dtype, &format!("in{}", em.buf[&resolve(g, i).base]), &idx);
                c.line(format!(
                    "{}if ({pos} < {}) {{ {} }}",
                    if j == 0 { "" } else { "else " },
                    em.dim(&end),
                    store(n.dtype, &format!("out{ob}"), "r * N + c", &v)
                ));
                start = end;
            }
        });
    });
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}

/// Generate the C file of one plan. `symbol` prefixes exported names (graph, hash, variant).
pub fn generate(
    g: &Graph,
    plan: &Plan,
    symbol: &str,
    header: &str,
    json: &dyn Fn(&[KernelMeta]) -> String,
) -> CSource {
    let mut code = Code::new();
    code.line(format!("/* {header}"));
    code.line(format!(
        " * Generated by autofusion-compiler {}. Do not edit. */",
        env!("CARGO_PKG_VERSION")
    ));
    code.line(format!("#include \"{}\"", super::HOST_HEADER));
    let _ = code.write_str(&abi::c_decls());
    code.line("");
    let kernels: Vec<KernelMeta> =
        plan.groups.iter().enumerate().map(|(k, grp)| gen_kernel(&mut code, g, k, grp)).collect();
    let entry = symbol.to_string();
    module_descriptor(&mut code, &kernels, &json(&kernels), &entry);
    CSource { code: code.finish(), kernels, entry }
}

/// The kernel of group `k`: its comment, its C function, then the pack functions it uses.
fn gen_kernel(code: &mut Code, g: &Graph, k: usize, grp: &Group) -> KernelMeta {
    let mut buf = BTreeMap::new();
    let mut buffers = Vec::new();
    for &i in grp.inputs.iter().chain(&grp.outputs) {
        buf.insert(i, buffers.len());
        buffers.push(i);
    }
    let name = super::kernel_name(g, k, grp);
    let mut em = Emitter::new(g, buf, &name);
    let mut body = Code::at_depth(1);
    let work = match grp.kind {
        GroupKind::Elementwise => gen_rows(&mut em, grp, &mut body),
        GroupKind::MatMul => gen_matmul(&mut em, grp, &mut body),
        GroupKind::Concat => gen_concat(&mut em, grp, &mut body),
        GroupKind::FlashAttention => gen_flash(&mut em, grp, &mut body),
        GroupKind::Horizontal => gen_horizontal(&mut em, grp, &mut body),
    };
    let ops = describe(g, grp);
    kernel_comment(code, g, grp, &name, &ops);
    let head = buffer_pointers(&em, grp, &buffers);
    let sig = format!("AF_CLONES static void {name}{KERNEL_PARAMS}");
    c_function(code, &sig, &[&head, &em.decls, &body]);
    code.line("");
    for (_, pc) in &em.packs {
        let _ = code.write_str(pc);
    }
    let packs = em.packs.into_iter().map(|p| p.0).collect();
    KernelMeta { name, buffers, n_inputs: grp.inputs.len(), work, ops, packs }
}

/// The comment above a kernel: its ops, why they share it, what it writes, the source lines.
fn kernel_comment(code: &mut Code, g: &Graph, grp: &Group, name: &str, ops: &str) {
    let why = if grp.rules.is_empty() {
        "one op: nothing fused".to_string()
    } else {
        format!("fused by {}", grp.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "))
    };
    let lines: BTreeSet<u32> =
        grp.nodes.iter().map(|n| g.node(*n).line).filter(|l| *l > 0).collect();
    let outputs: Vec<&str> = grp.outputs.iter().map(|o| g.node(*o).name.as_str()).collect();
    code.line(format!("/* {name}: {ops}"));
    code.line(format!(" * {why}; writes {}.", outputs.join(", ")));
    if !lines.is_empty() {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        code.line(format!(" * source lines: {}", lines.join(", ")));
    }
    code.line(" */");
}

/// The first lines of a kernel's body: its buffers as typed pointers.
fn buffer_pointers(em: &Emitter, grp: &Group, buffers: &[NodeId]) -> Code {
    let g = em.g;
    let mut c = Code::at_depth(1);
    c.line("(void)dims; (void)scratch;");
    for (i, v) in buffers.iter().enumerate() {
        let (t, name) = (ctype(g.node(*v).dtype), &g.node(*v).name);
        if i < grp.inputs.len() {
            c.line(format!("const {t} *restrict in{i} = (const {t} *)bufs[{i}]; /* {name} */"));
        } else {
            c.line(format!("{t} *restrict out{i} = ({t} *)bufs[{i}]; /* {name} */"));
        }
    }
    for (p, _) in &em.packs {
        c.line(format!("(void)in{}; /* read by {} */", em.buf[&p.param], p.func));
    }
    c
}

/// The kernel table, the module's JSON and the exported function returning its descriptor.
fn module_descriptor(code: &mut Code, kernels: &[KernelMeta], json: &str, entry: &str) {
    code.open("static const af_kernel_fn af_kernels[] =");
    for k in kernels {
        code.line(format!("{},", k.name));
    }
    for p in kernels.iter().flat_map(|k| &k.packs) {
        code.line(format!("{},", p.func));
    }
    if kernels.is_empty() {
        code.line("0,");
    }
    code.close_with(";");
    code.line(format!("static const char af_json[] = {};", c_string(json)));
    let n = kernels.len() + kernels.iter().map(|k| k.packs.len()).sum::<usize>();
    code.block(format!("const af_module *{entry}(void)"), |c| {
        c.line(format!(
            "static const af_module m = {{{}, (uint32_t)sizeof(af_tiling), af_json, sizeof(af_json) - 1, af_kernels, {n}}};",
            abi::ABI_VERSION
        ));
        c.line("return &m;");
    });
}
