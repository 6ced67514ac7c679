//! Host C code generation: one C file per graph variant, one static function per fused group,
//! and an exported module descriptor the runtime loads.
//!
//! Elementwise groups are row loops: each block takes a range of rows of the group's iteration
//! space; within a row, ops run in phases separated by reductions, values crossing a phase
//! boundary live in per-row scratch buffers, everything else stays in registers. Matmul groups
//! use one cache-blocked template on per-ISA micro-kernels (`af_isa` in the prelude) with the prologue applied
//! while packing A and the epilogue applied while storing C.

use super::emit::{c_float, c_string, ident, Emitter, Space};
use super::{file_header, Backend, Source, Toolchain};
use crate::abi::{self, KernelMeta, PackMeta, Work};
use crate::dim::{numel, DimExpr, Shape};
use crate::group::{iter_shape, space_of, GroupKind};
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
        let a = sp.accesses[&v];
        let rank = sp.shape.len();
        self.read(sp, v, col).replace(
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
        let a = sp.accesses[&v];
        let rank = sp.shape.len();
        let b = self.buf[&resolve(self.g, v).base];
        let d = self.g.node(v).dtype;
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

/// Partial sums per row reduction. Sixteen, not eight: with the row length known at compile
/// time GCC 12 turns an 8-lane partial loop into scalar adds under AVX-512 (x86-64-v4), 5x
/// slower than the baseline build; 16 lanes vectorise as one zmm (or two ymm) chain on every ISA.
const RED_LANES: usize = 16;

fn gen_rows(em: &mut Emitter, grp: &Group, body: &mut String) -> Work {
    let g = em.g;
    let space = space_of(g, &grp.nodes).expect("planner checked the space");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let row_shape = {
        let mut r = space.clone();
        *r.last_mut().unwrap() = DimExpr::constant(1);
        r
    };
    let full = |id: NodeId| {
        space == row_shape
            || iter_shape(g, id) == space && !matches!(g.node(id).op, Op::Reduce { .. })
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
    // Full-width values read in a later loop live in row buffers.
    let users = g.users();
    let mut rowbuf: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (&m, &p) in &phase {
        let later = users[m.idx()].iter().any(|u| {
            members.contains(u) && phase.get(u).or(reduce_loop.get(u)).is_some_and(|q| *q > p)
        });
        if later {
            let k = rowbuf.len();
            rowbuf.insert(m, k);
        }
    }
    let mut sp = Space { tag: "x", shape: space.clone(), accesses: BTreeMap::new() };
    for &m in &grp.nodes {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access(&mut sp, i);
            }
        }
    }
    let r_expr = em.dim(&numel(&space[..space.len() - 1]));
    let n_expr = em.dim(space.last().unwrap());
    let _ = writeln!(body, "    const int64_t R = {r_expr}, N = {n_expr};");
    let _ = writeln!(body, "    const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);");
    for (m, k) in &rowbuf {
        let _ = writeln!(
            body,
            "    float *rb{} = scratch + (int64_t){k} * N; /* {} */",
            m.0,
            g.node(*m).name
        );
    }
    let _ = writeln!(body, "    for (int64_t r = r0; r < r1; ++r) {{");
    body.push_str(&em.row_prologue(&sp, "r", "        "));
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    let store_out = |em: &Emitter, m: NodeId, idx: &str| -> String {
        let b = em.buf[&m];
        store(g.node(m).dtype, &format!("out{b}"), idx, &em.var(m))
    };
    // Row values.
    let row_vals = |lvl: usize, body: &mut String| {
        for &m in &grp.nodes {
            if level.get(&m) != Some(&lvl) {
                continue;
            }
            let n = g.node(m);
            if let Op::Reduce { kind, .. } = n.op {
                let v = em.var(m);
                let e = round_to(
                    n.dtype,
                    match kind {
                        ReduceKind::Mean => format!("acc{} / (float)N", m.0),
                        _ => format!("acc{}", m.0),
                    },
                );
                let _ = writeln!(body, "        const float {v} = {e}; /* {} */", n.name);
            } else {
                let ops: Vec<String> = n
                    .inputs
                    .iter()
                    .map(|i| operand(em, &sp, &members, &|x| Some(em.var(x)), *i, "0"))
                    .collect();
                let _ = writeln!(
                    body,
                    "        const float {} = {}; /* {} */",
                    em.var(m),
                    member_expr(g, &sp, m, &ops, "0"),
                    n.name
                );
            }
            if outputs.contains(&m) {
                let _ = writeln!(body, "        {}", store_out(em, m, "r"));
            }
        }
    };
    for p in 0..n_loops {
        row_vals(p, body);
        let reds: Vec<NodeId> =
            reduce_loop.iter().filter(|(_, lp)| **lp == p).map(|(m, _)| *m).collect();
        let is_max = |m: NodeId| matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. });
        for &m in &reds {
            let init = if is_max(m) { "(-INFINITY)" } else { "0.0f" };
            let _ = writeln!(
                body,
                "        float accv{0}[{RED_LANES}] = {{{1}}};",
                m.0,
                vec![init; RED_LANES].join(", ")
            );
        }
        // The loop body for column `c`; reductions accumulate into lane `l` of RED_LANES
        // partials, so the sums run as independent chains the compiler can vectorise.
        let (mut lb, mut lt) = (String::new(), String::new()); // main loop body, tail body
        for &m in &grp.nodes {
            let n = g.node(m);
            let local = |x: NodeId| -> Option<String> {
                if let Some(k) = phase.get(&x) {
                    if *k < p {
                        return Some(format!("rb{}[c]", x.0));
                    }
                }
                Some(em.var(x))
            };
            if reduce_loop.get(&m) == Some(&p) {
                let x = operand(em, &sp, &members, &local, n.inputs[0], "c");
                if is_max(m) {
                    // Maxima go through a lane buffer and a separate max loop: GCC 12 does not
                    // vectorise a conditional update of scalarised partials (~3x slower).
                    let _ = writeln!(lb, "                tv{}[l] = {x}; /* {} */", m.0, n.name);
                    let _ = writeln!(lt, "                {{ const float xv = {x}; accv{0}[l] = xv > accv{0}[l] ? xv : accv{0}[l]; }} /* {1} */", m.0, n.name);
                } else {
                    let _ = writeln!(lb, "                accv{}[l] += {x}; /* {} */", m.0, n.name);
                    let _ = writeln!(lt, "                accv{}[l] += {x}; /* {} */", m.0, n.name);
                }
            } else if phase.get(&m) == Some(&p) {
                let ops: Vec<String> =
                    n.inputs.iter().map(|i| operand(em, &sp, &members, &local, *i, "c")).collect();
                let mut line = format!(
                    "                const float {} = {}; /* {} */\n",
                    em.var(m),
                    member_expr(g, &sp, m, &ops, "c"),
                    n.name
                );
                if rowbuf.contains_key(&m) {
                    let _ = writeln!(line, "                rb{}[c] = {};", m.0, em.var(m));
                }
                if outputs.contains(&m) {
                    let _ = writeln!(line, "                {}", store_out(em, m, "r * N + c"));
                }
                lb.push_str(&line);
                lt.push_str(&line);
            }
        }
        if reds.is_empty() {
            let _ = writeln!(body, "        for (int64_t c = 0; c < N; ++c) {{\n            const int64_t l = 0; (void)l;\n{lt}        }}");
        } else {
            let _ = writeln!(body, "        int64_t cb{p} = 0;");
            let maxes: Vec<NodeId> = reds.iter().copied().filter(|m| is_max(*m)).collect();
            let tvs: String = maxes
                .iter()
                .map(|m| format!("            float tv{}[{RED_LANES}];\n", m.0))
                .collect();
            let joins: String = maxes.iter().map(|m| format!("            for (int64_t l = 0; l < {RED_LANES}; ++l) accv{0}[l] = tv{0}[l] > accv{0}[l] ? tv{0}[l] : accv{0}[l];\n", m.0)).collect();
            let _ = writeln!(body, "        for (; cb{p} + {RED_LANES} <= N; cb{p} += {RED_LANES}) {{\n{tvs}            for (int64_t l = 0; l < {RED_LANES}; ++l) {{\n                const int64_t c = cb{p} + l;\n{lb}            }}\n{joins}        }}");
            let _ = writeln!(body, "        for (int64_t l = 0; cb{p} + l < N; ++l) {{ /* tail */\n            {{\n                const int64_t c = cb{p} + l;\n{lt}            }}\n        }}");
            for &m in &reds {
                let v = |k: usize| format!("accv{}[{k}]", m.0);
                // Partial maxima are never NaN (they start at -inf and skip NaN), so a plain max joins them.
                let comb = |x: String, y: String| {
                    if is_max(m) {
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
                let tree = level.pop().unwrap();
                let _ = writeln!(body, "        const float acc{} = {tree};", m.0);
            }
        }
    }
    row_vals(n_loops, body);
    let _ = writeln!(body, "    }}");
    Work::Rows {
        rows: numel(&space[..space.len() - 1]),
        n: space.last().unwrap().clone(),
        row_buffers: rowbuf.len() as u32,
    }
}

fn gen_matmul(em: &mut Emitter, grp: &Group, body: &mut String) -> Work {
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    let _ = writeln!(body, "    const int64_t hoff = 0;");
    let (batch, m, n, k) = gen_matmul_part(em, grp.anchor.unwrap(), &members, &outputs, body);
    Work::MatMul { batch, m, n, k }
}

/// Several matmuls sharing their A operand in one launch (`qkv_horizontal`): the blocks walk
/// the concatenation of the parts' work units.
fn gen_horizontal(em: &mut Emitter, grp: &Group, body: &mut String) -> Work {
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    let _ = writeln!(body, "    int64_t hoff = 0;");
    let mut parts = Vec::new();
    for (anchor, members) in crate::group::horizontal_parts(em.g, &grp.nodes) {
        let _ = writeln!(body, "    {{ /* part: {} */", em.g.node(anchor).name);
        parts.push(gen_matmul_part(em, anchor, &members, &outputs, body));
        let _ = writeln!(body, "    hoff += units;\n    }}");
    }
    Work::Horizontal { parts }
}

/// One matmul with its prologue and epilogue; its work units start at `hoff` in the block
/// numbering. Returns (batch, m, n, k).
fn gen_matmul_part(
    em: &mut Emitter,
    anchor: NodeId,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    body: &mut String,
) -> (DimExpr, DimExpr, DimExpr, DimExpr) {
    let g = em.g;
    let grp_nodes: Vec<NodeId> = members.iter().copied().collect();
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
    let mut prologue = BTreeSet::new();
    let mut stack = vec![anchor];
    while let Some(x) = stack.pop() {
        for i in &g.node(x).inputs {
            if members.contains(i) && prologue.insert(*i) {
                stack.push(*i);
            }
        }
    }
    let epilogue: Vec<NodeId> =
        grp_nodes.iter().copied().filter(|m| *m != anchor && !prologue.contains(m)).collect();
    let mut spa = Space { tag: "a", shape: a_shape, accesses: BTreeMap::new() };
    let mut spb = Space { tag: "b", shape: b_shape.clone(), accesses: BTreeMap::new() };
    let mut spo = Space { tag: "o", shape: out_shape.clone(), accesses: BTreeMap::new() };
    for &m in &prologue {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access(&mut spa, i);
            }
        }
    }
    if !members.contains(&a_in) {
        em.access(&mut spa, a_in);
    }
    // B read from a parameter (a weight) is packed once per tensor by a pack function the
    // runtime runs (see `abi::PackMeta`); any other B is packed here, one sliver at a time.
    let packed = matches!(g.node(resolve(g, b_in).base).op, Op::Param { .. })
        .then(|| pack_b(em, &b_shape, b_in));
    if packed.is_none() {
        em.access(&mut spb, b_in);
    }
    for &m in &epilogue {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access(&mut spo, i);
            }
        }
    }
    let bt = em.dim(&numel(&batch));
    let (m_e, n_e, k_e) = (em.dim(&out_shape[r - 2]), em.dim(&out_shape[r - 1]), em.dim(&k_dim));
    let _ = writeln!(body, "    const int64_t BATCH = {bt}, M = {m_e}, N = {n_e}, K = {k_e};");
    let _ = writeln!(body, "    const int64_t MC = t->mc, NC = t->nc, KC = t->kc;");
    let _ = writeln!(body, "    const af_isa_info isa = af_isa();");
    let _ = writeln!(body, "    const int64_t MR = isa.mr, NR = isa.nr;");
    if let Some(slot) = packed {
        let _ = writeln!(body, "    const float *restrict Bpk = (const float *)bufs[{slot}]; /* B, packed once per weight tensor */");
        let _ = writeln!(body, "    const int64_t nsl = (N + NR - 1) / NR;");
    }
    let _ = writeln!(body, "    float *Ap = scratch, *Ar = Ap + (MC + AF_MR_MAX) * KC, *Bs = Ar + KC, *Cc = Bs + KC * AF_NR_MAX;");
    let _ = writeln!(body, "    const int64_t LDC = NC + 16; /* C block rows padded by a cache line: no 4 KiB aliasing between rows */");
    let _ = writeln!(body, "    (void)Ar;");
    let _ = writeln!(body, "    const int64_t mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;");
    let _ = writeln!(body, "    const int64_t ub = block * t->rows_per_block - hoff, u0 = ub < 0 ? 0 : ub, u1 = af_min64(units, ub + t->rows_per_block);");
    let _ = writeln!(body, "    for (int64_t u = u0; u < u1; ++u) {{");
    let _ = writeln!(
        body,
        "        const int64_t bi = u / (mt * nt), mi = (u / nt) % mt, ni = u % nt;"
    );
    let _ = writeln!(body, "        const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min64(MC, M - m0), nlen = af_min64(NC, N - n0);");
    let _ =
        writeln!(body, "        if (K <= 0) memset(Cc, 0, sizeof(float) * (size_t)(mlen * LDC));");
    // A of f32 with contiguous rows and no prologue is read in place by the micro-kernel.
    let a_direct =
        prologue.is_empty() && g.node(a_in).dtype == DType::F32 && !em.strided_cols(&spa, a_in);
    if a_direct {
        let a = spa.accesses[&a_in];
        let _ = writeln!(body, "        /* A read in place (f32, contiguous rows): no packing */");
        body.push_str(&em.row_prologue(&spa, "bi * M + m0", "        "));
        let _ = writeln!(
            body,
            "        const float *Ab = in{} + ac{a}_row;\n        const int64_t lda = ac{a}_s{};",
            em.buf[&resolve(g, a_in).base],
            r - 2
        );
    }
    let _ = writeln!(body, "        for (int64_t k0 = 0; k0 < K; k0 += KC) {{");
    let _ = writeln!(body, "            const int64_t klen = af_min64(KC, K - k0);");
    if !a_direct {
        // Pack A in slivers of MR rows, applying the prologue once per row of the block.
        let _ = writeln!(
            body,
            "            for (int64_t m = 0; m < mlen; ++m) {{ /* pack A{} */",
            if prologue.is_empty() { "" } else { " with the prologue" }
        );
        body.push_str(&em.row_prologue(&spa, "bi * M + m0 + m", "                "));
        let _ = writeln!(body, "                float *ap = Ap + (m / MR) * MR * klen + m % MR;");
        let a_val = operand(em, &spa, members, &|x| Some(em.var(x)), a_in, "c");
        if prologue.is_empty() {
            let _ = writeln!(body, "                for (int64_t k = 0; k < klen; ++k) {{");
            let _ = writeln!(body, "                    const int64_t c = k0 + k;");
            let _ = writeln!(body, "                    ap[k * MR] = {a_val};");
            let _ = writeln!(body, "                }}");
        } else {
            // Compute the row contiguously (so it vectorises), then scatter it into the sliver.
            let _ = writeln!(body, "                for (int64_t k = 0; k < klen; ++k) {{");
            let _ = writeln!(body, "                    const int64_t c = k0 + k;");
            for &m in grp_nodes.iter().filter(|m| prologue.contains(m)) {
                let n = g.node(m);
                let ops: Vec<String> = n
                    .inputs
                    .iter()
                    .map(|i| operand(em, &spa, members, &|x| Some(em.var(x)), *i, "c"))
                    .collect();
                let _ = writeln!(
                    body,
                    "                    const float {} = {}; /* {} */",
                    em.var(m),
                    member_expr(g, &spa, m, &ops, "c"),
                    n.name
                );
            }
            let _ = writeln!(body, "                    Ar[k] = {a_val};");
            let _ = writeln!(body, "                }}");
            let _ = writeln!(
                body,
                "                for (int64_t k = 0; k < klen; ++k) ap[k * MR] = Ar[k];"
            );
        }
        let _ = writeln!(body, "            }}");
    }
    let _ = writeln!(body, "            for (int64_t jr = 0; jr < nlen; jr += NR) {{");
    let _ = writeln!(body, "                const int64_t nr = af_min64(NR, nlen - jr);");
    if packed.is_some() {
        // NC is a multiple of NR_MAX (or N has one tile), so n0 + jr starts a sliver.
        let _ = writeln!(body, "                const float *restrict bsl = Bpk + ((bi * nsl + (n0 + jr) / NR) * K + k0) * NR;");
    } else {
        let _ = writeln!(body, "                /* pack one sliver of B */");
        body.push_str(&b_sliver(
            em,
            &spb,
            b_in,
            ("k0", "klen"),
            "n0 + jr",
            "Bs",
            "                ",
        ));
    }
    let bsrc = if packed.is_some() { "bsl" } else { "Bs" };
    let asrc = if a_direct { "Ab + ir * lda + k0, lda, 1" } else { "Ap + ir * klen, 1, MR" };
    let _ = writeln!(body, "                for (int64_t ir = 0; ir < mlen; ir += MR)");
    let _ = writeln!(body, "                    isa.uk(klen, {asrc}, {bsrc}, Cc + ir * LDC + jr, LDC, af_min64(MR, mlen - ir), nr, k0 > 0);");
    let _ = writeln!(body, "            }}");
    let _ = writeln!(body, "        }}");
    // Epilogue while storing C.
    let _ = writeln!(
        body,
        "        for (int64_t m = 0; m < mlen; ++m) {{ /* store C{} */",
        if epilogue.is_empty() { "" } else { " with the epilogue" }
    );
    body.push_str(&em.row_prologue(&spo, "bi * M + m0 + m", "            "));
    let _ = writeln!(body, "            const int64_t orow = (bi * M + m0 + m) * N;");
    let _ = writeln!(body, "            for (int64_t n = 0; n < nlen; ++n) {{");
    let _ = writeln!(body, "                const int64_t c = n0 + n;");
    let acc = round_to(g.node(anchor).dtype, "Cc[m * LDC + n]".into());
    let _ = writeln!(
        body,
        "                const float {} = {acc}; /* {} */",
        em.var(anchor),
        g.node(anchor).name
    );
    let store_all = |m: NodeId, body: &mut String| {
        if outputs.contains(&m) {
            let b = em.buf[&m];
            let _ = writeln!(
                body,
                "                {}",
                store(g.node(m).dtype, &format!("out{b}"), "orow + c", &em.var(m))
            );
        }
    };
    store_all(anchor, body);
    for &m in &epilogue {
        let n = g.node(m);
        let ops: Vec<String> = n
            .inputs
            .iter()
            .map(|i| operand(em, &spo, members, &|x| Some(em.var(x)), *i, "c"))
            .collect();
        let _ = writeln!(
            body,
            "                const float {} = {}; /* {} */",
            em.var(m),
            member_expr(g, &spo, m, &ops, "c"),
            n.name
        );
        store_all(m, body);
    }
    let _ = writeln!(body, "            }}\n        }}\n    }}");
    (numel(&batch), out_shape[r - 2].clone(), out_shape[r - 1].clone(), k_dim)
}

/// Code writing rows `k0 .. k0 + klen` of B's NR columns from `col0` into the sliver `dst`
/// (`dst[k * NR + j]`, columns past `nr` zero), in the space `sp` of B (batch + [K, N], row
/// index `bi * K + k`). A transposed view is walked column by column, K inside (along memory).
fn b_sliver(
    em: &Emitter,
    sp: &Space,
    b: NodeId,
    (k0, klen): (&str, &str),
    col0: &str,
    dst: &str,
    ind: &str,
) -> String {
    let mut c = String::new();
    let k = if k0 == "0" { "k".to_string() } else { format!("{k0} + k") };
    if em.strided_cols(sp, b) {
        c.push_str(&em.row_prologue(sp, "bi * K", ind));
        let _ = writeln!(c, "{ind}for (int64_t j = 0; j < NR; ++j) {{");
        let _ = writeln!(c, "{ind}    if (j >= nr) {{ for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = 0.0f; continue; }}");
        let _ = writeln!(
            c,
            "{ind}    for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = {};",
            em.read_inner(sp, b, &k, &format!("{col0} + j"))
        );
        let _ = writeln!(c, "{ind}}}");
    } else {
        let _ = writeln!(c, "{ind}for (int64_t k = 0; k < {klen}; ++k) {{");
        c.push_str(&em.row_prologue(sp, &format!("bi * K + {k}"), &format!("{ind}    ")));
        let _ = writeln!(c, "{ind}    float *restrict row = {dst} + k * NR;");
        let _ = writeln!(
            c,
            "{ind}    for (int64_t j = 0; j < nr; ++j) row[j] = {};",
            em.read(sp, b, &format!("{col0} + j"))
        );
        let _ = writeln!(c, "{ind}    for (int64_t j = nr; j < NR; ++j) row[j] = 0.0f;");
        let _ = writeln!(c, "{ind}}}");
    }
    c
}

/// The pack function of matmul operand `b_in` (shape `b_shape` = batch + [K, N]), read from a
/// parameter: appended to `em.packs`; returns the `bufs` slot the kernel finds it in.
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
    let d = g.node(param).dtype;
    let mut c = String::new();
    let _ = writeln!(c, "/* {func}: B of {} (`{}`), packed once per weight tensor as f32 slivers of NR columns (the\n * micro-kernel's B layout); the runtime reruns it only when another tensor is passed. */", em.kname, g.node(param).name);
    let _ = writeln!(c, "AF_CLONES static void {func}(void *const *bufs, const int64_t *dims, const af_tiling *t, int64_t block, float *scratch) {{");
    let _ = writeln!(c, "    (void)dims; (void)scratch;");
    let _ = writeln!(
        c,
        "    const {} *restrict in{b} = (const {} *)bufs[{b}]; /* {} */",
        ctype(d),
        ctype(d),
        g.node(param).name
    );
    let _ = writeln!(c, "    float *restrict dst = (float *)bufs[{slot}];");
    c.push_str(&pe.decls);
    let _ = writeln!(
        c,
        "    const int64_t BATCH = {}, K = {}, N = {};",
        pe.dim(&batch),
        pe.dim(&b_shape[r - 2]),
        pe.dim(&b_shape[r - 1])
    );
    let _ = writeln!(c, "    const int64_t NR = af_isa().nr, nsl = (N + NR - 1) / NR, ng = (N + AF_NR_MAX - 1) / AF_NR_MAX;");
    let _ = writeln!(c, "    const int64_t g0 = block * t->rows_per_block, g1 = af_min64(t->units, g0 + t->rows_per_block);");
    let _ = writeln!(c, "    (void)BATCH;");
    let _ = writeln!(
        c,
        "    for (int64_t gi = g0; gi < g1; ++gi) {{ /* a group of NR_MAX columns of one matrix */"
    );
    let _ = writeln!(c, "        const int64_t bi = gi / ng, c0 = (gi % ng) * AF_NR_MAX, c1 = af_min64(N, c0 + AF_NR_MAX);");
    let _ = writeln!(c, "        for (int64_t j0 = c0; j0 < c1; j0 += NR) {{");
    let _ = writeln!(c, "            const int64_t nr = af_min64(NR, N - j0);");
    let _ = writeln!(c, "            float *restrict ds = dst + (bi * nsl + j0 / NR) * K * NR;");
    c.push_str(&b_sliver(&pe, &sp, b_in, ("0", "K"), "j0", "ds", "            "));
    let _ = writeln!(c, "        }}\n    }}\n}}\n");
    em.packs.push((
        PackMeta { func, param, batch, k: b_shape[r - 2].clone(), n: b_shape[r - 1].clone() },
        c,
    ));
    slot
}

/// Online-softmax attention: for each block of queries, loop over blocks of keys keeping the
/// running row max, row sum and output accumulator; the S x S scores never reach memory.
fn gen_flash(em: &mut Emitter, grp: &Group, body: &mut String) -> Work {
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
    let mut sps = Space { tag: "s", shape: ss.clone(), accesses: BTreeMap::new() };
    em.access(&mut spq, q);
    em.access(&mut spk, kt);
    em.access(&mut spv, v);
    for &m in &f.chain {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access(&mut sps, i);
            }
        }
    }
    let causal = f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask);
    let _ = writeln!(
        body,
        "    const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&batch)),
        em.dim(&sq),
        em.dim(&sk),
        em.dim(&d),
        em.dim(&dv)
    );
    let _ = writeln!(body, "    /* units: QPU query blocks of BR rows of one head; K and V are packed once per unit */");
    let _ = writeln!(body, "    const int64_t BR = t->mc, BC = t->nc, QPU = t->kc, qt = (SQ + BR - 1) / BR, ug = (qt + QPU - 1) / QPU, units = BATCH * ug;");
    let _ = writeln!(body, "    const af_isa_info isa = af_isa();");
    let _ = writeln!(body, "    const int64_t MR = isa.mr, NR = isa.nr, SKP = (SK + AF_NR_MAX - 1) / AF_NR_MAX * AF_NR_MAX, DVP = (DV + NR - 1) / NR * NR;");
    let _ = writeln!(body, "    /* K^T of the head (slivers of NR keys x D), V of the head (slivers of NR columns x SK keys),");
    let _ = writeln!(body, "     * the packed query block, scores / probabilities, output accumulator, row max and row sum */");
    let _ = writeln!(body, "    float *Kp = scratch, *Vp = Kp + D * SKP, *Qp = Vp + (DV + AF_NR_MAX) * SK, *St = Qp + (BR + AF_MR_MAX) * D;");
    let _ = writeln!(body, "    float *Ot = St + BR * BC, *Mr = Ot + BR * DV, *Lr = Mr + BR;");
    let _ = writeln!(body, "    const int64_t u0 = block * t->rows_per_block, u1 = af_min64(units, u0 + t->rows_per_block);");
    let _ = writeln!(body, "    for (int64_t u = u0; u < u1; ++u) {{");
    let _ = writeln!(
        body,
        "        const int64_t bi = u / ug, qb0 = (u % ug) * QPU, qb1 = af_min64(qt, qb0 + QPU);"
    );
    if causal {
        let shift = sk.sub(&sq);
        let _ = writeln!(body, "        /* keys any query of the unit sees, rounded up to whole key blocks (later ones are masked) */");
        let _ = writeln!(
            body,
            "        const int64_t need = af_min64(SQ, qb1 * BR) + {};",
            em.dim(&shift)
        );
        let _ =
            writeln!(body, "        const int64_t kend = af_min64(SK, (need + BC - 1) / BC * BC);");
    } else {
        let _ = writeln!(body, "        const int64_t kend = SK;");
    }
    let _ = writeln!(body, "        const int64_t kendp = (kend + NR - 1) / NR * NR;");
    if em.strided_cols(&spk, kt) {
        // K^T is a transposed view of K: walk the keys outside, the head dim inside (along memory).
        let _ = writeln!(body, "        {{ /* pack K^T in slivers of NR keys, key by key */");
        body.push_str(&em.row_prologue(&spk, "bi * D", "            "));
        let _ = writeln!(body, "            for (int64_t j = 0; j < kendp; ++j) {{");
        let _ = writeln!(body, "                float *kp = Kp + (j / NR) * NR * D + j % NR;");
        let _ = writeln!(body, "                if (j >= kend) {{ for (int64_t c = 0; c < D; ++c) kp[c * NR] = 0.0f; continue; }}");
        let _ = writeln!(
            body,
            "                for (int64_t c = 0; c < D; ++c) kp[c * NR] = {};",
            em.read_inner(&spk, kt, "c", "j")
        );
        let _ = writeln!(body, "            }}\n        }}");
    } else {
        let _ = writeln!(
            body,
            "        for (int64_t c = 0; c < D; ++c) {{ /* pack K^T in slivers of NR keys */"
        );
        body.push_str(&em.row_prologue(&spk, "bi * D + c", "            "));
        let _ = writeln!(body, "            for (int64_t js = 0; js < kendp; js += NR) {{");
        let _ = writeln!(body, "                float *kp = Kp + js * D + c * NR;");
        let _ = writeln!(body, "                const int64_t nj = af_min64(NR, kend - js);");
        let _ = writeln!(
            body,
            "                for (int64_t j = 0; j < nj; ++j) kp[j] = {};",
            em.read(&spk, kt, "js + j")
        );
        let _ = writeln!(body, "                for (int64_t j = nj; j < NR; ++j) kp[j] = 0.0f;\n            }}\n        }}");
    }
    let _ = writeln!(
        body,
        "        for (int64_t j = 0; j < kend; ++j) {{ /* pack V in slivers of NR columns */"
    );
    body.push_str(&em.row_prologue(&spv, "bi * SK + j", "            "));
    let _ = writeln!(body, "            for (int64_t cs = 0; cs < DVP; cs += NR) {{");
    let _ = writeln!(body, "                float *vp = Vp + cs * SK + j * NR;");
    let _ = writeln!(body, "                const int64_t nc = af_min64(NR, DV - cs);");
    let _ = writeln!(
        body,
        "                for (int64_t c = 0; c < nc; ++c) vp[c] = {};",
        em.read(&spv, v, "cs + c")
    );
    let _ = writeln!(body, "                for (int64_t c = nc; c < NR; ++c) vp[c] = 0.0f;\n            }}\n        }}");
    let _ = writeln!(body, "        for (int64_t qb = qb0; qb < qb1; ++qb) {{");
    let _ = writeln!(body, "        const int64_t q0 = qb * BR, br = af_min64(BR, SQ - q0);");
    // Q of f32 with contiguous rows is read in place by the micro-kernel, else packed.
    let q_direct = g.node(q).dtype == DType::F32 && !em.strided_cols(&spq, q);
    if q_direct {
        let a = spq.accesses[&q];
        let _ =
            writeln!(body, "        /* the query block, read in place (f32, contiguous rows) */");
        body.push_str(&em.row_prologue(&spq, "bi * SQ + q0", "        "));
        let _ = writeln!(
            body,
            "        const float *Qb = in{} + ac{a}_row;\n        const int64_t ldq = ac{a}_s{};",
            em.buf[&resolve(g, q).base],
            r - 2
        );
        let _ = writeln!(body, "        (void)Qp;");
        let _ = writeln!(body, "        for (int64_t i = 0; i < br; ++i) {{");
    } else {
        let _ = writeln!(body, "        for (int64_t i = 0; i < br; ++i) {{ /* pack the query block as MR-row slivers */");
        let _ = writeln!(body, "            float *qp = Qp + (i / MR) * MR * D + i % MR;");
        body.push_str(&em.row_prologue(&spq, "bi * SQ + q0 + i", "            "));
        let _ = writeln!(
            body,
            "            for (int64_t c = 0; c < D; ++c) qp[c * MR] = {};",
            em.read(&spq, q, "c")
        );
    }
    let _ = writeln!(body, "            Mr[i] = -INFINITY; Lr[i] = 0.0f;\n            for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] = 0.0f;\n        }}");
    let _ = writeln!(body, "        for (int64_t k0 = 0; k0 < kend; k0 += BC) {{");
    if causal {
        let shift = sk.sub(&sq);
        let _ = writeln!(body, "            if (k0 > q0 + br - 1 + {}) break; /* every later key is masked for this block */", em.dim(&shift));
    }
    let _ = writeln!(body, "            const int64_t bc = af_min64(BC, SK - k0);");
    let _ = writeln!(body, "            /* S = Q K^T on the micro-kernel (BC is a multiple of NR_MAX, so k0 + jr starts a sliver) */");
    let _ = writeln!(body, "            for (int64_t jr = 0; jr < bc; jr += NR)");
    let _ = writeln!(body, "                for (int64_t ir = 0; ir < br; ir += MR)");
    let qsrc = if q_direct { "Qb + ir * ldq, ldq, 1" } else { "Qp + ir * D, 1, MR" };
    let _ = writeln!(body, "                    isa.uk(D, {qsrc}, Kp + (k0 + jr) * D, St + ir * BC + jr, BC, af_min64(MR, br - ir), af_min64(NR, bc - jr), 0);");
    let _ = writeln!(body, "            for (int64_t i = 0; i < br; ++i) {{");
    body.push_str(&em.row_prologue(&sps, "bi * SQ + q0 + i", "                "));
    let _ = writeln!(body, "                float *restrict srow = St + i * BC;");
    let _ = writeln!(body, "                for (int64_t j = 0; j < bc; ++j) {{");
    let _ = writeln!(
        body,
        "                    const float {} = {}; /* {} */",
        em.var(f.qk),
        round_to(g.node(f.qk).dtype, "srow[j]".into()),
        g.node(f.qk).name
    );
    for &m in &f.chain {
        let n = g.node(m);
        let ops: Vec<String> = n
            .inputs
            .iter()
            .map(|i| operand(em, &sps, &members, &|x| Some(em.var(x)), *i, "k0 + j"))
            .collect();
        let _ = writeln!(
            body,
            "                    const float {} = {}; /* {} */",
            em.var(m),
            member_expr(g, &sps, m, &ops, "k0 + j"),
            n.name
        );
    }
    let _ =
        writeln!(body, "                    srow[j] = {};\n                }}", em.var(f.scores));
    let _ = writeln!(
        body,
        "                /* online softmax: rescale what was accumulated under the old max */"
    );
    let _ = writeln!(
        body,
        "                const float mx = af_vmax(srow, bc, Mr[i]), corr = af_expf(Mr[i] - mx);"
    );
    let _ =
        writeln!(body, "                for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] *= corr;");
    let _ = writeln!(body, "                Lr[i] = Lr[i] * corr + af_vexp_sum(srow, bc, mx);");
    let _ = writeln!(body, "                Mr[i] = mx;\n            }}");
    let _ = writeln!(
        body,
        "            /* O += P V on the micro-kernel, P read in place from the score rows */"
    );
    let _ = writeln!(body, "            for (int64_t jr = 0; jr < DV; jr += NR)");
    let _ = writeln!(body, "                for (int64_t ir = 0; ir < br; ir += MR)");
    let _ = writeln!(body, "                    isa.uk(bc, St + ir * BC, BC, 1, Vp + jr * SK + k0 * NR, Ot + ir * DV + jr, DV, af_min64(MR, br - ir), af_min64(NR, DV - jr), 1);");
    let _ = writeln!(body, "        }}");
    let ob = em.buf[&f.pv];
    let _ = writeln!(body, "        for (int64_t i = 0; i < br; ++i) {{ /* normalise and store */");
    let _ = writeln!(body, "            const float inv = 1.0f / Lr[i];");
    let val = round_to(g.node(f.pv).dtype, "Ot[i * DV + c] * inv".into());
    let _ = writeln!(
        body,
        "            for (int64_t c = 0; c < DV; ++c) {{ const float o = {val}; {} }}",
        store(g.node(f.pv).dtype, &format!("out{ob}"), "(bi * SQ + q0 + i) * DV + c", "o")
    );
    let _ = writeln!(body, "        }}\n        }} /* query blocks */\n    }}");
    Work::Flash { batch: numel(&batch), sq, sk, d, dv }
}

fn gen_concat(em: &mut Emitter, grp: &Group, body: &mut String) -> Work {
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
    let r_expr = em.dim(&numel(&shape[..rank - 1]));
    let _ = writeln!(body, "    const int64_t R = {r_expr}, N = {};", em.dim(&shape[rank - 1]));
    let _ = writeln!(body, "    const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);");
    let _ = writeln!(body, "    for (int64_t r = r0; r < r1; ++r) {{");
    body.push_str(&em.row_prologue(&sp, "r", "        "));
    let ob = em.buf[&id];
    // Each input covers [start, start + extent) of the concatenated axis; its own index along
    // the axis is shifted back by start (so its access offset is corrected by -start*stride).
    let mut start = DimExpr::constant(0);
    let pos = if axis + 1 == rank { "c".to_string() } else { format!("x_i{axis}") };
    let _ = writeln!(body, "        for (int64_t c = 0; c < N; ++c) {{");
    let mut first = true;
    for &i in &n.inputs {
        let ext = g.node(i).shape[axis].clone();
        let end = start.add(&ext);
        let a = sp.accesses[&i];
        let s = em.dim(&start);
        let idx = format!("ac{a}_row + c * ac{a}_s{} - ({s}) * ac{a}_s{axis}", rank - 1);
        let v = load(g.node(i).dtype, &format!("in{}", em.buf[&resolve(g, i).base]), &idx);
        let _ = writeln!(
            body,
            "            {}if ({pos} < {}) {{ {} }}",
            if first { "" } else { "else " },
            em.dim(&end),
            store(n.dtype, &format!("out{ob}"), "r * N + c", &v)
        );
        first = false;
        start = end;
    }
    let _ = writeln!(body, "        }}\n    }}");
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
    let mut code = String::new();
    let _ = writeln!(
        code,
        "/* {header}\n * Generated by autofusion-compiler {}. Do not edit. */",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(code, "#include \"{}\"", super::HOST_HEADER);
    code.push_str(&abi::c_decls());
    code.push('\n');
    let mut kernels = Vec::new();
    for (k, grp) in plan.groups.iter().enumerate() {
        let mut buf = BTreeMap::new();
        let mut buffers = Vec::new();
        for &i in &grp.inputs {
            buf.insert(i, buffers.len());
            buffers.push(i);
        }
        for &o in &grp.outputs {
            buf.insert(o, buffers.len());
            buffers.push(o);
        }
        let first = grp.outputs.first().map(|o| ident(&g.node(*o).name)).unwrap_or_default();
        let name = format!("k{k}_{first}");
        let mut em = Emitter::new(g, buf, &name);
        let mut body = String::new();
        let work = match grp.kind {
            GroupKind::Elementwise => gen_rows(&mut em, grp, &mut body),
            GroupKind::MatMul => gen_matmul(&mut em, grp, &mut body),
            GroupKind::Concat => gen_concat(&mut em, grp, &mut body),
            GroupKind::FlashAttention => gen_flash(&mut em, grp, &mut body),
            GroupKind::Horizontal => gen_horizontal(&mut em, grp, &mut body),
        };
        let ops = describe(g, grp);
        let why = if grp.rules.is_empty() {
            "one op: nothing fused".to_string()
        } else {
            format!(
                "fused by {}",
                grp.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ")
            )
        };
        let lines: BTreeSet<u32> =
            grp.nodes.iter().map(|n| g.node(*n).line).filter(|l| *l > 0).collect();
        let _ = writeln!(
            code,
            "/* {name}: {ops}\n * {why}; writes {}.",
            grp.outputs.iter().map(|o| g.node(*o).name.clone()).collect::<Vec<_>>().join(", ")
        );
        if !lines.is_empty() {
            let _ = writeln!(
                code,
                " * source lines: {}",
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        let _ = writeln!(code, " */");
        let _ = writeln!(code, "AF_CLONES static void {name}(void *const *bufs, const int64_t *dims, const af_tiling *t, int64_t block, float *scratch) {{");
        let _ = writeln!(code, "    (void)dims; (void)scratch;");
        for (i, v) in buffers.iter().enumerate() {
            let d = g.node(*v).dtype;
            if i < grp.inputs.len() {
                let _ = writeln!(
                    code,
                    "    const {} *restrict in{i} = (const {} *)bufs[{i}]; /* {} */",
                    ctype(d),
                    ctype(d),
                    g.node(*v).name
                );
            } else {
                let _ = writeln!(
                    code,
                    "    {} *restrict out{i} = ({} *)bufs[{i}]; /* {} */",
                    ctype(d),
                    ctype(d),
                    g.node(*v).name
                );
            }
        }
        for (p, _) in &em.packs {
            let _ = writeln!(code, "    (void)in{}; /* read by {} */", em.buf[&p.param], p.func);
        }
        code.push_str(&em.decls);
        code.push_str(&body);
        code.push_str("}\n\n");
        for (_, pc) in &em.packs {
            code.push_str(pc);
        }
        let packs = em.packs.into_iter().map(|p| p.0).collect();
        kernels.push(KernelMeta { name, buffers, n_inputs: grp.inputs.len(), work, ops, packs });
    }
    let j = json(&kernels);
    let _ = writeln!(code, "static const af_kernel_fn af_kernels[] = {{");
    for k in &kernels {
        let _ = writeln!(code, "    {},", k.name);
    }
    for p in kernels.iter().flat_map(|k| &k.packs) {
        let _ = writeln!(code, "    {},", p.func);
    }
    if kernels.is_empty() {
        let _ = writeln!(code, "    0,");
    }
    let _ = writeln!(code, "}};");
    let _ = writeln!(code, "static const char af_json[] = {};", c_string(&j));
    let entry = symbol.to_string();
    let _ = writeln!(
        code,
        "const af_module *{entry}(void) {{\n    static const af_module m = {{{}, (uint32_t)sizeof(af_tiling), af_json, sizeof(af_json) - 1, af_kernels, {}}};\n    return &m;\n}}",
        abi::ABI_VERSION,
        kernels.len() + kernels.iter().map(|k| k.packs.len()).sum::<usize>()
    );
    CSource { code, kernels, entry }
}
