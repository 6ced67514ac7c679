//! Ascend C code generation (Atlas A2 / Ascend 910B, arch 2201): one `.asc` translation unit
//! per graph variant, holding one `extern "C" __global__ __aicore__` kernel per fused group,
//! an `extern "C"` launcher (bisheng compiles the `<<<>>>` launch; Rust cannot) and a module
//! descriptor for the runtime. API facts come from the asc-devkit headers and docs
//! (`mirror-cann/asc-devkit`, `docs/zh/api/SIMD-API/...`) and its samples, cited by path.
//!
//! Every kernel has the same signature, `k(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace)`:
//! `args` is a device table of `ASCEND_MAX_DIMS` dynamic dims (int64) followed by one device
//! address per module buffer (uint64); `tilings` is one `AfTiling` per kernel, filled by the
//! runtime's DynamicTiling from the actual shapes (the kernel direct-launch dynamic flow of
//! CATLASS's `examples/102_dynamic_optimized_matmul`: a device copy of the struct; the kernel
//! copies its struct from GM once); `workspace` is the system workspace of the Matmul API
//! followed by the user workspace. One signature lets the opt_level-3 pipeline call every
//! kernel body from one launch (as hicann/graph-autofusion's SuperKernel calls compiled kernel
//! bodies from one `__global__` entry) with nothing but the same three pointers.
//!
//! Kernel kinds:
//! - rows (elementwise chains, reductions with their epilogues, add + norm, concat): vector
//!   only (`KERNEL_TYPE_AIV_ONLY`). Rows are spread over the AIVs; each row is streamed in
//!   chunks of `chunk` columns through the TPipe/TQue CopyIn -> Compute -> CopyOut pipeline
//!   (double-buffered queues, `DataCopyPad` so any row length works, the count form of the
//!   vector APIs, 32-byte aligned UB slots: `basic_api/kernel_tpipe.h`,
//!   `kernel_operator_data_copy_intf.h`). Reductions split a row into
//!   phases: a phase that needs a value computed before a reduction recomputes it from the
//!   inputs rather than keeping a whole row on chip, so UB use does not grow with the row.
//! - matmul with prologue/epilogue: mix 1:2 (`KERNEL_TYPE_MIX_AIC_1_2`). The Matmul high-level
//!   API runs on the cube (the AIVs issue the calls: `lib/matmul_intf.h`); each AIV owns output tiles of
//!   `mc x nc`, has the cube write its tile into the AIV's slice of the user workspace, then
//!   applies the epilogue in UB and writes the output (the explicit cube -> GM -> vector split
//!   of the devkit's `matmul_leakyrelu_advanced_api` sample). A norm prologue (or an operand view the Matmul API cannot address) is
//!   applied by the AIVs first, writing the operand once to the workspace, then `SyncAll`: the
//!   split the devkit's fusion-operator guide recommends for LayerNorm + Linear (A = normalised rows written by
//!   the AIVs to a GM workspace), because the cube cannot apply elementwise ops while loading
//!   A and recomputing the statistics per N tile would repeat the vector work.
//! - flash attention: mix 1:2 with two Matmul objects: S = Q K^T on the cube into the AIV's
//!   BR x BC score tile, the chain (scale, mask) and the online softmax on the AIV (row max,
//!   P = exp(S - max) in place, running max and sum in UB), O += P V on the cube with atomic
//!   accumulation into the AIV's output tile after the AIV rescaled it; no S x S buffer.
//! - horizontal matmul groups: not generated (`generate` returns an error naming the kernel;
//!   `Ascend::unsupported_rules` leaves out the opt-in rule that forms them).
//! - the opt_level-3 pipeline: one mix launch calling every body in order, with `SyncAll`
//!   between dependent kernels, AIV-only when neither side uses the cube (SuperKernel syncs only
//!   the core types that need it).

use super::emit::{c_float, c_string, ident, Emitter, Space};
use super::{file_header, Backend, Source, Toolchain};
use crate::abi::{Work, ASCEND_CUBE_FIELDS, ASCEND_MAX_DIMS, ASCEND_TILING_FIELDS};
use crate::dim::{numel, DimExpr, Shape};
use crate::group::{iter_shape, space_of, GroupKind};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use crate::layout::resolve;
use crate::plan::{describe, Group, Plan, Rule, RuleSet};
use crate::target::Target;
use crate::{Unit, Variant};
pub use autofusion_ir::meta::AscendKernel;
use autofusion_ir::meta::AscendMeta;
use autofusion_ir::ops::fill;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The Ascend backend (Atlas A2 / 910B): Ascend C compiled by the CANN toolkit's bisheng,
/// launched through AscendCL.
pub struct Ascend {
    target: Target,
}

impl Ascend {
    /// Plans with `target` (normally `Target::ascend910b()`).
    pub fn new(target: Target) -> Ascend {
        Ascend { target }
    }
}

impl Default for Ascend {
    fn default() -> Ascend {
        Ascend::new(Target::ascend910b())
    }
}

impl Backend for Ascend {
    fn name(&self) -> &'static str {
        "ascend"
    }
    fn profile(&self) -> &Target {
        &self.target
    }
    /// No horizontal Ascend kernel: on the NPU the projections run as separate mix launches,
    /// or as bodies of the one pipeline launch at opt_level 3.
    fn unsupported_rules(&self) -> RuleSet {
        let mut r = RuleSet::none();
        r.insert(Rule::QkvHorizontal);
        r
    }
    fn generate(
        &self,
        unit: &Unit,
        v: Variant,
        plan: &Plan,
        symbol: &str,
    ) -> Result<Source, String> {
        let g = &unit.graph;
        if g.dyn_dims.len() > ASCEND_MAX_DIMS {
            return Err(format!(
                "graph `{}` has {} dynamic dims; the Ascend kernels take at most {ASCEND_MAX_DIMS}",
                g.name,
                g.dyn_dims.len(),
            ));
        }
        let src = generate(g, plan, symbol, &file_header(unit, v, plan))?;
        Ok(Source {
            code: src.code,
            extension: "asc",
            entries: vec![src.launch, src.entry],
            meta_json: src.meta_json,
        })
    }
    fn toolchain(&self) -> Toolchain {
        Toolchain::Bisheng
    }
}

/// Generated Ascend C for one graph variant.
pub struct AscendSource {
    pub code: String,
    pub kernels: Vec<AscendKernel>,
    /// Module buffers in args-table order (after the dims).
    pub buffers: Vec<NodeId>,
    /// `extern "C" int32_t <launch>(uint32_t kernel, uint32_t block_dim, void *stream,
    /// uint8_t *args, uint8_t *tilings, uint8_t *workspace)`; kernel = n_kernels launches the
    /// pipeline kernel.
    pub launch: String,
    /// `extern "C" const char *<entry>(void)`: the module JSON.
    pub entry: String,
    /// That JSON (`AscendMeta`).
    pub meta_json: String,
}

/// A value inside a rows job for one chunk: a UB float tensor (slot) or a scalar expression.
#[derive(Clone, Debug)]
enum V {
    T(String),
    S(String),
}

/// Where the value of an external input comes from inside a rows job.
#[derive(Clone, Debug)]
enum Src {
    /// Contiguous along the row: `DataCopyPad` from `gm[off + c]`, dtype `d` (`off` includes
    /// the window's first column).
    Row { gm: String, off: String, d: DType },
    /// Constant along the row (column stride 0): one scalar read per row.
    Scalar { gm: String, off: String, d: DType },
    /// Any other stride: gathered element by element (scalar reads) into a slot; `off` is the
    /// row's offset, `col0` the first column of the window.
    Gather { gm: String, off: String, col0: String, stride: String, d: DType },
}

fn ascend_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "half",
        DType::BF16 => "bfloat16_t",
    }
}

fn dsize(d: DType) -> u32 {
    match d {
        DType::F32 => 4,
        _ => 2,
    }
}

/// The files' common part: includes, the tiling struct (mirrored in Rust, offsets asserted
/// there), and small helpers.
fn prelude() -> String {
    let mut s = String::new();
    s.push_str(
        "#include \"kernel_operator.h\"\n#include \"lib/matmul_intf.h\"\n#include <stdint.h>\n\n",
    );
    let _ = writeln!(s, "#define AF_MAX_DIMS {ASCEND_MAX_DIMS}");
    let _ = writeln!(s, "#define AF_TF {}", ASCEND_TILING_FIELDS.len());
    let _ = writeln!(s, "#define AF_CF {}", ASCEND_CUBE_FIELDS.len());
    s.push_str("/* DynamicTiling's per-kernel struct (int64 fields, then two TCubeTiling field sets as int32). */\n");
    s.push_str("struct AfTiling {\n");
    for f in ASCEND_TILING_FIELDS {
        let _ = writeln!(s, "    int64_t {f};");
    }
    s.push_str("    int32_t cube[2][AF_CF];\n};\n");
    let _ = writeln!(
        s,
        "static_assert(sizeof(AfTiling) == {}, \"AfTiling layout\");",
        crate::abi::ascend_tiling_bytes()
    );
    let _ = writeln!(s, "#include \"{}\"", super::ASCEND_HEADER);
    s
}

/// UB layout of one rows job: named queues and float slots, all `chunk` columns wide.
#[derive(Default)]
struct Ub {
    /// (name, dtype, in or out)
    queues: Vec<(String, DType, bool)>,
    slots: usize,
    /// Fixed bytes of buffers a kernel declares itself (flash: running max and sum).
    extra_fixed: u32,
}

impl Ub {
    fn queue(&mut self, name: String, d: DType, input: bool) -> String {
        if !self.queues.iter().any(|q| q.0 == name) {
            self.queues.push((name.clone(), d, input));
        }
        name
    }
    fn slot(&mut self) -> String {
        self.slots += 1;
        format!("sl[{}]", self.slots - 1)
    }
    /// UB bytes per column: queues double-buffered, slots, three temporaries, a half temp,
    /// and the reduction scratch (2 floats per 64 columns, rounded up to one byte).
    fn per_col(&self) -> u32 {
        self.queues.iter().map(|q| 2 * dsize(q.1)).sum::<u32>()
            + 4 * (self.slots as u32 + 3)
            + 2
            + 1
    }
    /// UB bytes not proportional to the chunk (as `decls` sizes them): the half temp's 32-byte
    /// tail, the scalar area and the scratch's rounding, and up to 32 bytes of alignment per
    /// buffer.
    fn fixed(&self) -> u32 {
        32 + 64 + 32 + 32 * (2 * self.queues.len() as u32 + 3) + self.extra_fixed
    }
    /// Declarations at kernel scope (after any REGIST_MATMUL_OBJ, which
    /// initialises the pipe in split mode).
    fn decls(&self, ind: &str) -> String {
        let mut s = String::new();
        for (name, d, input) in &self.queues {
            let pos = if *input { "VECIN" } else { "VECOUT" };
            let _ = writeln!(s, "{ind}AscendC::TQue<AscendC::TPosition::{pos}, 1> {name};");
            let _ = writeln!(
                s,
                "{ind}pipe.InitBuffer({name}, 2, (uint32_t)(CH * sizeof({})));",
                ascend_type(*d)
            );
        }
        let _ = writeln!(s, "{ind}AscendC::TBuf<AscendC::TPosition::VECCALC> work, halfb, scal;");
        let _ = writeln!(
            s,
            "{ind}pipe.InitBuffer(work, (uint32_t)(CH * sizeof(float) * {}));",
            self.slots + 3
        );
        let _ = writeln!(s, "{ind}pipe.InitBuffer(halfb, (uint32_t)(CH * sizeof(half) + 32));");
        let _ = writeln!(
            s,
            "{ind}pipe.InitBuffer(scal, (uint32_t)(64 + ((2 * ((CH + 63) / 64) + 7) / 8) * 32));"
        );
        let _ = writeln!(s, "{ind}AscendC::LocalTensor<float> wk = work.Get<float>(), sc = scal.Get<float>(), rd = sc, rt = sc[8];");
        let _ = writeln!(s, "{ind}AscendC::LocalTensor<half> hb = halfb.Get<half>();");
        let _ = writeln!(s, "{ind}AscendC::LocalTensor<bfloat16_t> bb = halfb.Get<bfloat16_t>();");
        let _ = writeln!(s, "{ind}AscendC::LocalTensor<float> sl[{}];", self.slots.max(1));
        let _ = writeln!(
            s,
            "{ind}for (int i = 0; i < {}; ++i) sl[i] = wk[(uint32_t)(i * CH)];",
            self.slots
        );
        let _ = writeln!(s, "{ind}AscendC::LocalTensor<float> ta = wk[(uint32_t)({} * CH)], tb = wk[(uint32_t)({} * CH)], tc = wk[(uint32_t)({} * CH)];", self.slots, self.slots + 1, self.slots + 2);
        let _ = writeln!(
            s,
            "{ind}(void)hb; (void)bb; (void)ta; (void)tb; (void)tc; (void)rd; (void)rt;"
        );
        s
    }
}

/// One rows job: compute `nodes` over the columns `[col0, col0 + ncols)` of one row of
/// `space`, reading external values per `srcs` (or pre-set f32 rows), storing `outs`.
struct Job<'a> {
    g: &'a Graph,
    space: Shape,
    nodes: Vec<NodeId>,
    srcs: BTreeMap<NodeId, Src>,
    /// Stored values: (node, GM tensor, offset of column `col0` of this row, GM dtype).
    outs: Vec<(NodeId, String, String, DType)>,
    /// Row index of the second-to-last axis (for the causal mask), a C expression.
    row_i: String,
    /// Expression of `cols - rows` of the causal mask's last two axes.
    causal_shift: String,
    col0: String,
    ncols: String,
    tag: String,
}

fn unary_seq(out: &mut String, ind: &str, u: UnaryOp, dst: &str, x: &str, n: &str) {
    for line in u.spec().ascend_vector {
        let _ = writeln!(out, "{ind}{}", fill(line, &[("dst", dst), ("x", x), ("n", n)]));
    }
}

fn unary_scalar(u: UnaryOp, x: &str) -> String {
    fill(u.spec().ascend_scalar, &[("x", x)])
}

fn binary_scalar(b: BinaryOp, x: &str, y: &str) -> String {
    fill(b.spec().ascend_scalar, &[("x", x), ("y", y)])
}

/// A binary op into `dst` with tensor and/or scalar operands (count form).
fn binary_seq(out: &mut String, ind: &str, b: BinaryOp, dst: &str, x: &V, y: &V, n: &str) {
    let w = |out: &mut String, l: String| {
        let _ = writeln!(out, "{ind}{l}");
    };
    let api = |b: BinaryOp| b.spec().ascend_vv.expect("a vector API (pow is handled apart)");
    match (b, x, y) {
        // a^b = exp(b ln a) (a > 0, as the vector unit has no pow); squares exactly.
        (BinaryOp::Pow, V::T(a), V::S(e)) if e == "2.0f" => {
            w(out, format!("AscendC::Mul({dst}, {a}, {a}, {n});"))
        }
        (BinaryOp::Pow, V::T(a), V::S(e)) if e == "0.5f" => {
            w(out, format!("AscendC::Sqrt({dst}, {a}, {n});"))
        }
        (BinaryOp::Pow, V::T(a), V::S(e)) => {
            w(out, format!("AscendC::Ln({dst}, {a}, {n});"));
            w(out, format!("AscendC::Muls({dst}, {dst}, {e}, {n});"));
            w(out, format!("AscendC::Exp({dst}, {dst}, {n});"));
        }
        (BinaryOp::Pow, a, e) => {
            let a = materialise(out, ind, a, "ta", n);
            let e = materialise(out, ind, e, "tb", n);
            w(out, format!("AscendC::Ln({dst}, {a}, {n});"));
            w(out, format!("AscendC::Mul({dst}, {dst}, {e}, {n});"));
            w(out, format!("AscendC::Exp({dst}, {dst}, {n});"));
        }
        (_, V::T(a), V::T(c)) => w(out, format!("AscendC::{}({dst}, {a}, {c}, {n});", api(b))),
        (BinaryOp::Sub, V::T(a), V::S(s)) => {
            w(out, format!("AscendC::Adds({dst}, {a}, -(float)({s}), {n});"))
        }
        (BinaryOp::Div, V::T(a), V::S(s)) => {
            w(out, format!("AscendC::Duplicate(tc, (float)({s}), {n});"));
            w(out, format!("AscendC::Div({dst}, {a}, tc, {n});"));
        }
        (BinaryOp::Sub, V::S(s), V::T(a)) => {
            w(out, format!("AscendC::Muls({dst}, {a}, -1.0f, {n});"));
            w(out, format!("AscendC::Adds({dst}, {dst}, (float)({s}), {n});"));
        }
        (BinaryOp::Div, V::S(s), V::T(a)) => {
            w(out, format!("AscendC::Duplicate(tc, (float)({s}), {n});"));
            w(out, format!("AscendC::Div({dst}, tc, {a}, {n});"));
        }
        // The rest are commutative with a tensor-scalar API (Adds, Muls, Maxs, Mins).
        (_, V::T(a), V::S(s)) | (_, V::S(s), V::T(a)) => {
            let api = b.spec().ascend_vs.expect("sub, div and pow are matched above");
            w(out, format!("AscendC::{api}({dst}, {a}, (float)({s}), {n});"))
        }
        (_, V::S(a), V::S(c)) => {
            w(out, format!("AscendC::Duplicate({dst}, (float)({}), {n});", binary_scalar(b, a, c)))
        }
    }
}

fn materialise(out: &mut String, ind: &str, v: &V, tmp: &str, n: &str) -> String {
    match v {
        V::T(t) => t.clone(),
        V::S(s) => {
            let _ = writeln!(out, "{ind}AscendC::Duplicate({tmp}, (float)({s}), {n});");
            tmp.to_string()
        }
    }
}

/// Round a float slot to `d` and back, as the reference rounds f16/bf16 values where they are
/// computed.
fn round_seq(out: &mut String, ind: &str, d: DType, dst: &str, n: &str) {
    match d {
        DType::F32 => {}
        DType::F16 => {
            let _ = writeln!(
                out,
                "{ind}AscendC::Cast<half, float>(hb, {dst}, AscendC::RoundMode::CAST_RINT, {n});"
            );
            let _ = writeln!(
                out,
                "{ind}AscendC::Cast<float, half>({dst}, hb, AscendC::RoundMode::CAST_NONE, {n});"
            );
        }
        DType::BF16 => {
            let _ = writeln!(out, "{ind}AscendC::Cast<bfloat16_t, float>(bb, {dst}, AscendC::RoundMode::CAST_RINT, {n});");
            let _ = writeln!(out, "{ind}AscendC::Cast<float, bfloat16_t>({dst}, bb, AscendC::RoundMode::CAST_NONE, {n});");
        }
    }
}

fn round_scalar(d: DType, e: String) -> String {
    match d {
        DType::F32 => e,
        DType::F16 => format!("af_s_round(sc, hb, {e})"),
        DType::BF16 => format!("af_s_round_bf(sc, bb, {e})"),
    }
}

impl Job<'_> {
    fn full(&self, id: NodeId) -> bool {
        let g = self.g;
        let mut row = self.space.clone();
        *row.last_mut().unwrap() = DimExpr::constant(1);
        self.space == row
            || iter_shape(g, id) == self.space && !matches!(g.node(id).op, Op::Reduce { .. })
    }

    /// Emit the code of one row (accesses' `acN_row` offsets already computed).
    fn emit(&self, ub: &mut Ub, ind: &str) -> String {
        let g = self.g;
        let members: BTreeSet<NodeId> = self.nodes.iter().copied().collect();
        let mut out = String::new();
        // Phases as in the host generator: a full-width op runs in the chunk loop of its
        // phase; a reduction accumulates in loop `a` and is ready after it.
        let mut phase: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut level: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut reduce_loop: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (&s, _) in self.srcs.iter().filter(|(_, s)| !matches!(s, Src::Scalar { .. })) {
            phase.insert(s, 0);
        }
        for &m in &self.nodes {
            let n = g.node(m);
            let a = n
                .inputs
                .iter()
                .map(|i| phase.get(i).or(level.get(i)).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            if matches!(n.op, Op::Reduce { .. }) {
                reduce_loop.insert(m, a);
                level.insert(m, a + 1);
            } else if self.full(m) {
                phase.insert(m, a);
            } else {
                level.insert(m, a);
            }
        }
        let n_loops = phase.values().chain(reduce_loop.values()).map(|p| p + 1).max().unwrap_or(0);
        let t = &self.tag;
        // Scalar sources: one read per row.
        for (id, s) in &self.srcs {
            if let Src::Scalar { gm, off, d } = s {
                let v = if *d == DType::F32 {
                    format!("{gm}.GetValue({off})")
                } else {
                    format!("static_cast<float>({gm}.GetValue({off}))")
                };
                let _ = writeln!(
                    out,
                    "{ind}const float {t}s{} = {v}; /* {} */",
                    id.0,
                    g.node(*id).name
                );
            }
        }
        let scal = |id: NodeId| format!("{t}s{}", id.0);
        let value_of = |id: NodeId, slots: &BTreeMap<NodeId, String>| -> V {
            let n = g.node(id);
            if let Op::Const { value } = n.op {
                return V::S(c_float(value));
            }
            if let Some(sl) = slots.get(&id) {
                return V::T(sl.clone());
            }
            V::S(scal(id))
        };
        // Row values of a level (scalars).
        let row_vals = |lvl: usize, out: &mut String| {
            for &m in &self.nodes {
                if level.get(&m) != Some(&lvl) {
                    continue;
                }
                let n = g.node(m);
                let e = match &n.op {
                    Op::Reduce { kind: ReduceKind::Mean, .. } => {
                        format!("{t}acc{} / (float)({})", m.0, self.ncols)
                    }
                    Op::Reduce { .. } => format!("{t}acc{}", m.0),
                    op => {
                        let ops: Vec<String> = n
                            .inputs
                            .iter()
                            .map(|i| match value_of(*i, &BTreeMap::new()) {
                                V::S(s) => s,
                                V::T(_) => unreachable!("a row value reads a full-width value"),
                            })
                            .collect();
                        match op {
                            Op::Unary(u) => unary_scalar(*u, &ops[0]),
                            Op::Binary(b) => binary_scalar(*b, &ops[0], &ops[1]),
                            Op::Cast | Op::Copy => ops[0].clone(),
                            op => unreachable!("{} as a row value", op.name()),
                        }
                    }
                };
                let _ = writeln!(
                    out,
                    "{ind}const float {} = {}; /* {} */",
                    scal(m),
                    round_scalar(n.dtype, e),
                    n.name
                );
            }
        };
        row_vals(0, &mut out);
        for p in 0..n_loops {
            // What this loop computes: its own full-width members, the inputs of its
            // reductions, and (recomputed) everything of earlier phases they need.
            let mut need: BTreeSet<NodeId> = BTreeSet::new();
            let mut stack: Vec<NodeId> = phase
                .iter()
                .filter(|(_, q)| **q == p)
                .map(|(m, _)| *m)
                .filter(|m| members.contains(m))
                .collect();
            stack.extend(
                reduce_loop.iter().filter(|(_, q)| **q == p).map(|(m, _)| g.node(*m).inputs[0]),
            );
            stack.extend(self.outs.iter().map(|o| o.0).filter(|o| phase.get(o) == Some(&p)));
            while let Some(x) = stack.pop() {
                if phase.contains_key(&x) && need.insert(x) && members.contains(&x) {
                    stack.extend(g.node(x).inputs.iter().copied());
                }
            }
            let reds: Vec<NodeId> =
                reduce_loop.iter().filter(|(_, q)| **q == p).map(|(m, _)| *m).collect();
            let is_max =
                |m: NodeId| matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. });
            for &m in &reds {
                let init = if is_max(m) { "-INFINITY" } else { "0.0f" };
                let _ = writeln!(out, "{ind}float {t}acc{} = {init};", m.0);
            }
            let _ = writeln!(out, "{ind}for (int64_t c0 = 0; c0 < {}; c0 += CH) {{", self.ncols);
            let i2 = format!("{ind}    ");
            let _ =
                writeln!(out, "{i2}const int32_t cn = (int32_t)af_min(CH, {} - c0);", self.ncols);
            // CopyIn.
            let mut slots: BTreeMap<NodeId, String> = BTreeMap::new();
            let mut deq: Vec<(String, String, DType)> = Vec::new();
            for (&id, s) in &self.srcs {
                if !need.contains(&id) {
                    continue;
                }
                match s {
                    Src::Row { gm, off, d } => {
                        let q = ub.queue(format!("{t}q{}", id.0), *d, true);
                        let ty = ascend_type(*d);
                        let _ = writeln!(out, "{i2}{{ /* CopyIn {} */", g.node(id).name);
                        let _ = writeln!(
                            out,
                            "{i2}    AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();"
                        );
                        let _ = writeln!(out, "{i2}    AscendC::DataCopyPad(x, {gm}[{off} + c0], AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}}, AscendC::DataCopyPadExtParams<{ty}>{{false, 0, 0, 0}});");
                        let _ = writeln!(out, "{i2}    {q}.EnQue(x);\n{i2}}}");
                        deq.push((q, format!("{t}x{}", id.0), *d));
                    }
                    Src::Gather { gm, off, col0, stride, d } => {
                        let sl = ub.slot();
                        let cv = if *d == DType::F32 {
                            format!("{gm}.GetValue({off} + ({col0} + c0 + j) * ({stride}))")
                        } else {
                            format!("static_cast<float>({gm}.GetValue({off} + ({col0} + c0 + j) * ({stride})))")
                        };
                        let _ = writeln!(out, "{i2}for (int32_t j = 0; j < cn; ++j) {sl}.SetValue(j, {cv}); /* gather {} (strided view) */", g.node(id).name);
                        slots.insert(id, sl);
                    }
                    Src::Scalar { .. } => {}
                }
            }
            // Compute.
            let mut frees = Vec::new();
            for (q, x, d) in &deq {
                let ty = ascend_type(*d);
                let _ = writeln!(out, "{i2}AscendC::LocalTensor<{ty}> {x} = {q}.DeQue<{ty}>();");
                let id = NodeId(x[t.len() + 1..].parse().unwrap());
                if *d == DType::F32 {
                    slots.insert(id, x.clone());
                } else {
                    let sl = ub.slot();
                    let _ = writeln!(out, "{i2}AscendC::Cast<float, {ty}>({sl}, {x}, AscendC::RoundMode::CAST_NONE, cn);");
                    slots.insert(id, sl);
                }
                frees.push(format!("{q}.FreeTensor({x});"));
            }
            for &m in &self.nodes {
                if !need.contains(&m) && !reds.contains(&m) {
                    continue;
                }
                let n = g.node(m);
                if reds.contains(&m) {
                    let x = value_of(n.inputs[0], &slots);
                    match (x, is_max(m)) {
                        (V::T(x), false) => {
                            let _ =
                                writeln!(out, "{i2}AscendC::ReduceSum<float>(rd, {x}, rt, cn);");
                            let _ = writeln!(
                                out,
                                "{i2}{t}acc{} += rd.GetValue(0); /* {} */",
                                m.0, n.name
                            );
                        }
                        (V::T(x), true) => {
                            let _ =
                                writeln!(out, "{i2}AscendC::ReduceMax<float>(rd, {x}, rt, cn);");
                            let _ = writeln!(out, "{i2}{{ const float v = rd.GetValue(0); {t}acc{0} = v > {t}acc{0} ? v : {t}acc{0}; }} /* {1} */", m.0, n.name);
                        }
                        (V::S(s), false) => {
                            let _ = writeln!(
                                out,
                                "{i2}{t}acc{} += (float)cn * ({s}); /* {} */",
                                m.0, n.name
                            );
                        }
                        (V::S(s), true) => {
                            let _ = writeln!(
                                out,
                                "{i2}{t}acc{0} = ({s}) > {t}acc{0} ? ({s}) : {t}acc{0}; /* {1} */",
                                m.0, n.name
                            );
                        }
                    }
                    continue;
                }
                let dst = ub.slot();
                let ops: Vec<V> = n.inputs.iter().map(|i| value_of(*i, &slots)).collect();
                let _ = writeln!(out, "{i2}/* {} = {} */", n.name, n.op.name());
                match &n.op {
                    Op::Unary(u) => {
                        let x = materialise(&mut out, &i2, &ops[0], "ta", "cn");
                        unary_seq(&mut out, &i2, *u, &dst, &x, "cn");
                    }
                    Op::Binary(b) => binary_seq(&mut out, &i2, *b, &dst, &ops[0], &ops[1], "cn"),
                    Op::Cast | Op::Copy => match &ops[0] {
                        V::T(x) => {
                            let _ = writeln!(out, "{i2}AscendC::Adds({dst}, {x}, 0.0f, cn);");
                        }
                        V::S(s) => {
                            let _ =
                                writeln!(out, "{i2}AscendC::Duplicate({dst}, (float)({s}), cn);");
                        }
                    },
                    Op::CausalMask => {
                        // Keys j <= i + (cols - rows) stay; the rest become -inf. The boundary
                        // is rarely 32-byte aligned: the unaligned head is written by the
                        // scalar unit, the aligned rest by Duplicate.
                        let x = materialise(&mut out, &i2, &ops[0], "ta", "cn");
                        let _ = writeln!(out, "{i2}AscendC::Adds({dst}, {x}, 0.0f, cn);");
                        let _ = writeln!(out, "{i2}{{\n{i2}    const int64_t keep = af_max(0, af_min(cn, {} + ({}) + 1 - ({} + c0)));", self.row_i, self.causal_shift, self.col0);
                        let _ = writeln!(
                            out,
                            "{i2}    const int64_t al = af_min(cn, (keep + 7) / 8 * 8);"
                        );
                        let _ = writeln!(out, "{i2}    for (int64_t j = keep; j < al; ++j) {dst}.SetValue((uint32_t)j, -INFINITY);");
                        let _ = writeln!(out, "{i2}    if (al < cn) AscendC::Duplicate({dst}[(uint32_t)al], -INFINITY, (int32_t)(cn - al));\n{i2}}}");
                    }
                    op => unreachable!("{} in a rows job", op.name()),
                }
                round_seq(&mut out, &i2, n.dtype, &dst, "cn");
                slots.insert(m, dst);
            }
            // CopyOut of the values this phase owns.
            for (id, gm, off, d) in &self.outs {
                if phase.get(id) != Some(&p) {
                    continue;
                }
                let d = *d;
                let ty = ascend_type(d);
                let q = ub.queue(format!("{t}o{}", id.0), d, false);
                let v = materialise(&mut out, &i2, &value_of(*id, &slots), "ta", "cn");
                let _ = writeln!(out, "{i2}{{ /* CopyOut {} */", g.node(*id).name);
                let _ = writeln!(
                    out,
                    "{i2}    AscendC::LocalTensor<{ty}> y = {q}.AllocTensor<{ty}>();"
                );
                if d == DType::F32 {
                    let _ = writeln!(out, "{i2}    AscendC::Adds(y, {v}, 0.0f, cn);");
                } else {
                    let _ = writeln!(out, "{i2}    AscendC::Cast<{ty}, float>(y, {v}, AscendC::RoundMode::CAST_RINT, cn);");
                }
                let _ = writeln!(out, "{i2}    {q}.EnQue(y);\n{i2}    y = {q}.DeQue<{ty}>();");
                let _ = writeln!(out, "{i2}    AscendC::DataCopyPad({gm}[{off} + c0], y, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}});");
                let _ = writeln!(out, "{i2}    {q}.FreeTensor(y);\n{i2}}}");
            }
            for f in frees {
                let _ = writeln!(out, "{i2}{f}");
            }
            let _ = writeln!(out, "{ind}}}");
            row_vals(p + 1, &mut out);
        }
        // Row values that are outputs (a reduction's result, a statistic).
        for (id, gm, off, d) in &self.outs {
            if phase.contains_key(id) {
                continue;
            }
            let d = *d;
            let v = match value_of(*id, &BTreeMap::new()) {
                V::S(s) => s,
                V::T(_) => unreachable!(),
            };
            let conv = match d {
                DType::F32 => v,
                _ => format!("static_cast<{}>({v})", ascend_type(d)),
            };
            let _ = writeln!(out, "{ind}{gm}.SetValue({off}, {conv}); /* {} */", g.node(*id).name);
            let _ = writeln!(out, "{ind}AscendC::DataCacheCleanAndInvalid<{}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({gm}[{off}]);", ascend_type(d));
        }
        out
    }
}

/// Per-kernel generation state.
struct K<'g> {
    em: Emitter<'g>,
    /// Module table index of each kernel-local buffer.
    table: Vec<usize>,
    ub: Ub,
    body: String,
}

impl K<'_> {
    fn gm(&self, b: usize) -> String {
        format!("g{b}")
    }
    /// The source of external value `v` read in `sp` (access declared), over the column
    /// window starting at `col0`.
    fn src(&mut self, sp: &mut Space, v: NodeId, col0: &str) -> Src {
        let a = self.em.access(sp, v);
        let base = resolve(self.em.g, v).base;
        let gm = self.gm(self.em.buf[&base]);
        let d = self.em.g.node(v).dtype;
        let off = format!("{}_row{a}", sp.tag);
        match self.em.col_stride.get(&a) {
            Some(1) => Src::Row { gm, off: format!("{off} + {col0}"), d },
            Some(0) => Src::Scalar { gm, off, d },
            _ => Src::Gather {
                gm,
                off,
                col0: col0.to_string(),
                stride: format!("ac{a}_s{}", sp.shape.len() - 1),
                d,
            },
        }
    }
}

/// The row offsets of every access of `sp` for row `row` (named `<tag>_row<a>`).
fn row_offsets(em: &Emitter, sp: &Space, row: &str, ind: &str) -> String {
    let pro = em.row_prologue(sp, row, ind);
    // row_prologue names them acN_row; rename per space so several spaces can coexist.
    let mut s = pro;
    for a in sp.accesses.values() {
        s = s.replace(
            &format!("const int64_t ac{a}_row ="),
            &format!("const int64_t {}_row{a} =", sp.tag),
        );
    }
    s
}

fn ext_inputs(g: &Graph, nodes: &[NodeId], members: &BTreeSet<NodeId>) -> Vec<NodeId> {
    let mut v = Vec::new();
    for &m in nodes {
        for &i in &g.node(m).inputs {
            if !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) && !v.contains(&i)
            {
                v.push(i);
            }
        }
    }
    v
}

fn gen_rows(k: &mut K, grp: &Group) -> Work {
    let g = k.em.g;
    let space = space_of(g, &grp.nodes).expect("planner checked the space");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let mut sp = Space { tag: "x", shape: space.clone(), accesses: BTreeMap::new() };
    let mut srcs = BTreeMap::new();
    for i in ext_inputs(g, &grp.nodes, &members) {
        let s = k.src(&mut sp, i, "0");
        srcs.insert(i, s);
    }
    let r = space.len();
    let outs = grp
        .outputs
        .iter()
        .map(|o| {
            (
                *o,
                k.gm(k.em.buf[o]),
                if space_is_row(g, *o, &space) { "r".to_string() } else { "r * N".to_string() },
                g.node(*o).dtype,
            )
        })
        .collect();
    let row_i = if r >= 2 { format!("x_i{}", r - 2) } else { "0".into() };
    let job = Job {
        g,
        space: space.clone(),
        nodes: grp.nodes.clone(),
        srcs,
        outs,
        row_i,
        causal_shift: causal_shift(&k.em, &grp.nodes),
        col0: "0".into(),
        ncols: "N".into(),
        tag: "x".into(),
    };
    let b = &mut k.body;
    let _ = writeln!(
        b,
        "    const int64_t R = {}, N = {};",
        k.em.dim(&numel(&space[..r - 1])),
        k.em.dim(&space[r - 1])
    );
    let row = job.emit(&mut k.ub, "        ");
    let b = &mut k.body;
    b.push_str("    /*UB*/\n");
    let _ = writeln!(b, "    for (int64_t r = aiv; r < R; r += naiv) {{");
    b.push_str(&row_offsets(&k.em, &sp, "r", "        "));
    b.push_str(&row);
    let _ = writeln!(b, "    }}");
    Work::Rows { rows: numel(&space[..r - 1]), n: space[r - 1].clone(), row_buffers: 0 }
}

/// Whether output `o` is a per-row value (its last extent is 1 while the space's is not).
fn space_is_row(g: &Graph, o: NodeId, space: &Shape) -> bool {
    let s = &g.node(o).shape;
    s.last().and_then(|d| d.as_const()) == Some(1)
        && space.last().and_then(|d| d.as_const()) != Some(1)
}

fn causal_shift(em: &Emitter, nodes: &[NodeId]) -> String {
    let g = em.g;
    nodes
        .iter()
        .find(|m| g.node(**m).op == Op::CausalMask)
        .map(|m| {
            let s = &g.node(*m).shape;
            em.dim(&s[s.len() - 1].sub(&s[s.len() - 2]))
        })
        .unwrap_or_else(|| "0".into())
}

fn gen_concat(k: &mut K, grp: &Group) -> Work {
    let g = k.em.g;
    let id = grp.nodes[0];
    let n = g.node(id);
    let Op::Concat { axis } = n.op else { unreachable!() };
    let shape = n.shape.clone();
    let rank = shape.len();
    let mut sp = Space { tag: "x", shape: shape.clone(), accesses: BTreeMap::new() };
    let srcs: Vec<(NodeId, Src)> = n.inputs.iter().map(|i| (*i, k.src(&mut sp, *i, "0"))).collect();
    let ob = k.gm(k.em.buf[&id]);
    let ty = ascend_type(n.dtype);
    let _ = writeln!(
        k.body,
        "    const int64_t R = {}, N = {};",
        k.em.dim(&numel(&shape[..rank - 1])),
        k.em.dim(&shape[rank - 1])
    );
    let mut code = String::new();
    let mut start = DimExpr::constant(0);
    let q = k.ub.queue("cq".into(), n.dtype, true);
    for (i, s) in &srcs {
        let ext = g.node(*i).shape[axis].clone();
        let end = start.add(&ext);
        let (st, en) = (k.em.dim(&start), k.em.dim(&end));
        let a = sp.accesses[i];
        // Along the last axis each input fills a column window; along another axis, a row
        // comes from exactly one input. Offsets are corrected by -start along the axis.
        let (cond, c_lo, c_hi) = if axis + 1 == rank {
            ("true".to_string(), st.clone(), en.clone())
        } else {
            (format!("x_i{axis} >= ({st}) && x_i{axis} < ({en})"), "0".into(), "N".into())
        };
        let fix = format!("- ({st}) * ac{a}_s{axis}");
        let _ = writeln!(
            code,
            "        if ({cond}) for (int64_t c0 = {c_lo}; c0 < {c_hi}; c0 += CH) {{ /* from {} */",
            g.node(*i).name
        );
        let _ =
            writeln!(code, "            const int32_t cn = (int32_t)af_min(CH, ({c_hi}) - c0);");
        let _ =
            writeln!(code, "            AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
        match s {
            Src::Row { gm, off, .. } => {
                let _ = writeln!(code, "            AscendC::DataCopyPad(x, {gm}[{off} {fix} + c0], AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}}, AscendC::DataCopyPadExtParams<{ty}>{{false, 0, 0, 0}});");
            }
            Src::Scalar { gm, off, .. } => {
                let _ = writeln!(code, "            for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix}));");
            }
            Src::Gather { gm, off, stride, .. } => {
                let _ = writeln!(code, "            for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix} + (c0 + j) * ({stride})));");
            }
        }
        let _ = writeln!(code, "            {q}.EnQue(x);\n            x = {q}.DeQue<{ty}>();");
        let _ = writeln!(code, "            AscendC::PipeBarrier<PIPE_ALL>(); /* the copy out reads what MTE2 / the scalar unit wrote */");
        let _ = writeln!(code, "            AscendC::DataCopyPad({ob}[r * N + c0], x, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}});");
        let _ = writeln!(code, "            {q}.FreeTensor(x);\n        }}");
        start = end;
    }
    let b = &mut k.body;
    b.push_str("    /*UB*/\n");
    let _ = writeln!(b, "    for (int64_t r = aiv; r < R; r += naiv) {{");
    b.push_str(&row_offsets(&k.em, &sp, "r", "        "));
    b.push_str(&code);
    let _ = writeln!(b, "    }}");
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}

/// How the Matmul API addresses an operand of `space` (`[batch.., rows, cols]`): `Some((trans,
/// ld))` when one of the last two strides is 1 (ld = the other), `None` otherwise.
fn mm_layout(em: &Emitter, sp: &Space, v: NodeId) -> Option<(bool, String)> {
    let a = sp.accesses[&v];
    let r = sp.shape.len();
    let view = resolve(em.g, v);
    let strides = crate::layout::space_strides(&view, &em.g.node(v).shape, r);
    if em.g.node(v).dtype != DType::F32 {
        return None;
    }
    if strides[r - 1].as_const() == Some(1) {
        Some((false, format!("ac{a}_s{}", r - 2)))
    } else if strides[r - 2].as_const() == Some(1) {
        Some((true, format!("ac{a}_s{}", r - 1)))
    } else {
        None
    }
}

/// Returns the work and whether A and B are staged in the user workspace.
fn gen_matmul(k: &mut K, grp: &Group) -> (Work, bool, bool) {
    let g = k.em.g;
    let anchor = grp.anchor.expect("matmul group has an anchor");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let out_shape = g.node(anchor).shape.clone();
    let r = out_shape.len();
    let (a_in, b_in) = (g.node(anchor).inputs[0], g.node(anchor).inputs[1]);
    let k_dim = g.node(a_in).shape.last().unwrap().clone();
    let batch: Shape = out_shape[..r - 2].to_vec();
    let with = |x: DimExpr, y: DimExpr| {
        let mut s = batch.clone();
        s.push(x);
        s.push(y);
        s
    };
    let mut prologue = BTreeSet::new();
    let mut stack = vec![anchor];
    while let Some(x) = stack.pop() {
        for i in &g.node(x).inputs {
            if members.contains(i) && prologue.insert(*i) {
                stack.push(*i);
            }
        }
    }
    let pro_nodes: Vec<NodeId> =
        grp.nodes.iter().copied().filter(|m| prologue.contains(m)).collect();
    let epi_nodes: Vec<NodeId> =
        grp.nodes.iter().copied().filter(|m| *m != anchor && !prologue.contains(m)).collect();
    let mut spa = Space {
        tag: "a",
        shape: with(out_shape[r - 2].clone(), k_dim.clone()),
        accesses: BTreeMap::new(),
    };
    let mut spb = Space {
        tag: "b",
        shape: with(k_dim.clone(), out_shape[r - 1].clone()),
        accesses: BTreeMap::new(),
    };
    let mut spo = Space { tag: "o", shape: out_shape.clone(), accesses: BTreeMap::new() };
    let em = &mut k.em;
    let _ = writeln!(
        k.body,
        "    const int64_t BATCH = {}, M = {}, N = {}, K = {};",
        em.dim(&numel(&batch)),
        em.dim(&out_shape[r - 2]),
        em.dim(&out_shape[r - 1]),
        em.dim(&k_dim)
    );
    let _ = writeln!(k.body, "    const int64_t MC = t.mc, NC = t.nc, mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;");
    let _ = writeln!(
        k.body,
        "    __gm__ float *uws = (__gm__ float *)AscendC::GetUserWorkspace(workspace);"
    );
    let _ = writeln!(
        k.body,
        "    int64_t stage = 0; /* floats of staged operands at the start of the user workspace */"
    );
    // Operand A: direct (the Matmul API reads the view) or staged by the AIVs.
    let a_direct = if pro_nodes.is_empty() {
        k.em.access(&mut spa, a_in);
        mm_layout(&k.em, &spa, a_in)
    } else {
        None
    };
    let stage_a = a_direct.is_none();
    let mut staged = String::new();
    if stage_a {
        // Stage A = the prologue's output (or the operand itself) as contiguous f32 rows.
        let mut srcs = BTreeMap::new();
        let pro_members: BTreeSet<NodeId> = pro_nodes.iter().copied().collect();
        let nodes = pro_nodes.clone();
        for i in ext_inputs(g, &pro_nodes, &pro_members) {
            let s = k.src(&mut spa, i, "0");
            srcs.insert(i, s);
        }
        if pro_nodes.is_empty() {
            let s = k.src(&mut spa, a_in, "0");
            srcs.insert(a_in, s);
        }
        // The staged value: the prologue's last member (= a_in) or the operand through a copy.
        let job = Job {
            g,
            space: spa.shape.clone(),
            nodes: nodes.clone(),
            srcs,
            outs: vec![(a_in, "wa".into(), "ra * K".into(), DType::F32)],
            row_i: "0".into(),
            causal_shift: "0".into(),
            col0: "0".into(),
            ncols: "K".into(),
            tag: "a".into(),
        };
        let row = if nodes.is_empty() {
            copy_row(&mut k.ub, &job, a_in)
        } else {
            job.emit(&mut k.ub, "        ")
        };
        let _ = writeln!(
            staged,
            "    /* stage A ({}) as contiguous f32 rows in the user workspace */",
            if pro_nodes.is_empty() {
                "a view the Matmul API cannot address"
            } else {
                "the norm prologue applied once per row"
            }
        );
        let _ = writeln!(
            staged,
            "    AscendC::GlobalTensor<float> wa; wa.SetGlobalBuffer(uws + stage, BATCH * M * K);"
        );
        let _ = writeln!(staged, "    for (int64_t ra = aiv; ra < BATCH * M; ra += naiv) {{");
        staged.push_str(&row_offsets(&k.em, &spa, "ra", "        "));
        staged.push_str(&row);
        let _ = writeln!(staged, "    }}\n    stage += BATCH * M * K;");
    }
    k.em.access(&mut spb, b_in);
    let b_direct = mm_layout(&k.em, &spb, b_in);
    let stage_b = b_direct.is_none();
    if stage_b {
        let mut srcs = BTreeMap::new();
        let s = k.src(&mut spb, b_in, "0");
        srcs.insert(b_in, s);
        let outs = vec![(b_in, "wb".into(), "rb * N".into(), DType::F32)];
        let job = Job {
            g,
            space: spb.shape.clone(),
            nodes: vec![],
            srcs,
            outs,
            row_i: "0".into(),
            causal_shift: "0".into(),
            col0: "0".into(),
            ncols: "N".into(),
            tag: "b".into(),
        };
        let row = copy_row(&mut k.ub, &job, b_in);
        let _ = writeln!(
            staged,
            "    /* stage B (a view the Matmul API cannot address) as contiguous f32 rows */"
        );
        let _ = writeln!(
            staged,
            "    AscendC::GlobalTensor<float> wb; wb.SetGlobalBuffer(uws + stage, BATCH * K * N);"
        );
        let _ = writeln!(staged, "    for (int64_t rb = aiv; rb < BATCH * K; rb += naiv) {{");
        staged.push_str(&row_offsets(&k.em, &spb, "rb", "        "));
        staged.push_str(&row);
        let _ = writeln!(staged, "    }}\n    stage += BATCH * K * N;");
    }
    // Epilogue job over the output rows of one tile.
    let mut srcs = BTreeMap::new();
    for i in ext_inputs(g, &epi_nodes, &members) {
        if i == anchor {
            continue;
        }
        let s = k.src(&mut spo, i, "n0");
        srcs.insert(i, s);
    }
    srcs.insert(anchor, Src::Row { gm: "wc".into(), off: "ti * NC".into(), d: DType::F32 });
    let outs: Vec<(NodeId, String, String, DType)> = grp
        .outputs
        .iter()
        .map(|o| (*o, k.gm(k.em.buf[o]), "orow * N + n0".to_string(), g.node(*o).dtype))
        .collect();
    let mut nodes = epi_nodes.clone();
    let anchor_out = grp.outputs.contains(&anchor);
    if anchor_out {
        nodes.retain(|n| *n != anchor);
    }
    let job = Job {
        g,
        space: out_shape.clone(),
        nodes,
        srcs,
        outs,
        row_i: format!("o_i{}", r - 2),
        causal_shift: causal_shift(&k.em, &epi_nodes),
        col0: "n0".into(),
        ncols: "nlen".into(),
        tag: "o".into(),
    };
    // The anchor is a phase-0 source; when it is itself an output it is copied out.
    let epi = job.emit(&mut k.ub, "            ");
    let (ta, lda) = a_direct.clone().unwrap_or((false, "K".into()));
    let (tb, ldb) = b_direct.clone().unwrap_or((false, "N".into()));
    let b = &mut k.body;
    let _ = writeln!(b, "    AscendC::tiling::TCubeTiling ct;\n    af_cube_tiling(t, 0, ct);");
    let _ = writeln!(b, "    matmul::Matmul<matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float, {ta}>, matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float, {tb}>, matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float>> mm;");
    let _ = writeln!(b, "    REGIST_MATMUL_OBJ(&pipe, AscendC::GetSysWorkSpacePtr(), mm, &ct); /* the AIC serves the AIVs' calls, then returns */");
    b.push_str("    /*UB*/\n");
    b.push_str(&staged);
    if stage_a || stage_b {
        let _ = writeln!(b, "    AscendC::SyncAll(); /* every AIV's staged rows are in GM before any tile reads them */");
    }
    let _ = writeln!(b, "    AscendC::GlobalTensor<float> wc; wc.SetGlobalBuffer(uws + stage + aiv * MC * NC, MC * NC); /* this AIV's C tile */");
    let _ = writeln!(b, "    for (int64_t u = aiv; u < units; u += naiv) {{");
    let _ =
        writeln!(b, "        const int64_t bi = u / (mt * nt), mi = (u / nt) % mt, ni = u % nt;");
    let _ = writeln!(b, "        const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min(MC, M - m0), nlen = af_min(NC, N - n0);");
    if stage_a {
        let _ = writeln!(b, "        AscendC::GlobalTensor<float> ga = wa[(bi * M + m0) * K];");
    } else {
        b.push_str(&row_offsets(&k.em, &spa, "bi * M + m0", "        "));
        let a = spa.accesses[&a_in];
        let gb = format!("g{}", k.em.buf[&resolve(g, a_in).base]);
        let _ = writeln!(b, "        AscendC::GlobalTensor<float> ga = {gb}[a_row{a}];");
    }
    if stage_b {
        let _ = writeln!(b, "        AscendC::GlobalTensor<float> gbm = wb[bi * K * N + n0];");
    } else {
        b.push_str(&row_offsets(&k.em, &spb, "bi * K", "        "));
        let a = spb.accesses[&b_in];
        let gb = format!("g{}", k.em.buf[&resolve(g, b_in).base]);
        let col = if tb { format!("n0 * ({ldb})") } else { "n0".into() };
        let _ = writeln!(b, "        AscendC::GlobalTensor<float> gbm = {gb}[b_row{a} + {col}];");
    }
    // SetOrgShape comes before SetTensorA/B and SetSingleShape (SetOrgShape.md, constraints);
    // its fifth argument is C's row stride (the tile is NC wide, B's rows N).
    let _ = writeln!(
        b,
        "        mm.SetOrgShape({});",
        org_shape("M", "N", "K", (ta, &lda), (tb, &ldb), "NC")
    );
    let _ = writeln!(b, "        mm.SetTensorA(ga, {ta});\n        mm.SetTensorB(gbm, {tb});");
    let _ = writeln!(b, "        mm.SetSingleShape((int)mlen, (int)nlen, (int)K);");
    let _ = writeln!(b, "        mm.IterateAll(wc);");
    let _ =
        writeln!(b, "        for (int64_t ti = 0; ti < mlen; ++ti) {{ /* epilogue, row by row */");
    let _ = writeln!(b, "            const int64_t orow = bi * M + m0 + ti;");
    b.push_str(&row_offsets(&k.em, &spo, "orow", "            "));
    b.push_str(&epi);
    let _ = writeln!(b, "        }}\n    }}\n    mm.End();");
    (
        Work::MatMul {
            batch: numel(&batch),
            m: out_shape[r - 2].clone(),
            n: out_shape[r - 1].clone(),
            k: k_dim,
        },
        stage_a,
        stage_b,
    )
}

/// How the Matmul API reads operand `v` of space `sp` (tag `tag`, rows `rows` = the
/// space's row count, `ncols` columns): directly (`(trans, ld, None)`) or from an f32 copy
/// the AIVs stage in the user workspace (`(false, ncols, Some(code))`, the code advancing
/// `stage`; the copy is named `w<tag>`).
fn operand(
    k: &mut K,
    sp: &mut Space,
    v: NodeId,
    rows: &str,
    ncols: &str,
) -> (bool, String, Option<String>) {
    let g = k.em.g;
    k.em.access(sp, v);
    if let Some((t, ld)) = mm_layout(&k.em, sp, v) {
        return (t, ld, None);
    }
    let tag = sp.tag;
    let mut srcs = BTreeMap::new();
    let s = k.src(sp, v, "0");
    srcs.insert(v, s);
    let outs = vec![(v, format!("w{tag}"), format!("r{tag} * ({ncols})"), DType::F32)];
    let job = Job {
        g,
        space: sp.shape.clone(),
        nodes: vec![],
        srcs,
        outs,
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: ncols.into(),
        tag: tag.into(),
    };
    let row = copy_row(&mut k.ub, &job, v);
    let mut st = String::new();
    let _ = writeln!(
        st,
        "    /* stage {} ({}) as contiguous f32 rows in the user workspace */",
        g.node(v).name,
        if g.node(v).dtype == DType::F32 {
            "a view the Matmul API cannot address"
        } else {
            "converted to f32 for the cube"
        }
    );
    let _ = writeln!(st, "    AscendC::GlobalTensor<float> w{tag}; w{tag}.SetGlobalBuffer(uws + stage, ({rows}) * ({ncols}));");
    let _ = writeln!(st, "    for (int64_t r{tag} = aiv; r{tag} < {rows}; r{tag} += naiv) {{");
    st.push_str(&row_offsets(&k.em, sp, &format!("r{tag}"), "        "));
    st.push_str(&row);
    let _ = writeln!(st, "    }}\n    stage += ({rows}) * ({ncols});");
    (false, ncols.to_string(), Some(st))
}

/// `SetOrgShape` arguments of an `m x n` by `kk` product with operand layouts `(ta, lda)`,
/// `(tb, ldb)` (see `mm_layout`) and C rows `ldc` apart.
fn org_shape(
    m: &str,
    n: &str,
    kk: &str,
    (ta, lda): (bool, &str),
    (tb, ldb): (bool, &str),
    ldc: &str,
) -> String {
    format!(
        "(int)({}), (int)({}), (int)({}), (int)({}), (int)({ldc})",
        if ta { lda } else { m },
        if tb { n } else { ldb },
        if ta { kk } else { lda },
        if tb { ldb } else { kk }
    )
}

/// Flash attention: per AIV a block of `BR` queries of one batch entry, key blocks of `BC`.
/// The cube computes S = Q K^T into the AIV's score tile; the AIV applies the chain (scale,
/// mask) in place, takes the block's row maxima, writes P = exp(S - max) over the tile and
/// keeps the running max and sum per row (online softmax) in UB; the cube then adds P V into
/// the AIV's output accumulator in GM (atomic add; the first block overwrites it), which the
/// AIV has rescaled by exp(old max - new max). No S x S buffer: the tiles are BR x BC.
/// Operands the Matmul API cannot address (strided views, f16/bf16) are staged as f32 first.
fn gen_flash(k: &mut K, grp: &Group) -> (Work, bool, bool) {
    let g = k.em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let f = crate::group::flash_parts(g, &members).expect("planner formed a flash group");
    let (q, kt, v) = (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let ss = g.node(f.scores).shape.clone();
    let r = ss.len();
    let batch: Shape = ss[..r - 2].to_vec();
    let (sq, sk) = (ss[r - 2].clone(), ss[r - 1].clone());
    let d = g.node(q).shape.last().unwrap().clone();
    let dv = g.node(f.pv).shape.last().unwrap().clone();
    let with = |a: DimExpr, b: DimExpr| {
        let mut s = batch.clone();
        s.extend([a, b]);
        s
    };
    let mut spq = Space { tag: "q", shape: with(sq.clone(), d.clone()), accesses: BTreeMap::new() };
    let mut spk = Space { tag: "k", shape: with(d.clone(), sk.clone()), accesses: BTreeMap::new() };
    let mut spv =
        Space { tag: "v", shape: with(sk.clone(), dv.clone()), accesses: BTreeMap::new() };
    let mut sps = Space { tag: "s", shape: ss.clone(), accesses: BTreeMap::new() };
    let em = &mut k.em;
    let _ = writeln!(
        k.body,
        "    const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&batch)),
        em.dim(&sq),
        em.dim(&sk),
        em.dim(&d),
        em.dim(&dv)
    );
    let _ = writeln!(
        k.body,
        "    const int64_t BR = t.br, BC = t.bc, qt = (SQ + BR - 1) / BR, units = BATCH * qt;"
    );
    let _ = writeln!(
        k.body,
        "    __gm__ float *uws = (__gm__ float *)AscendC::GetUserWorkspace(workspace);"
    );
    let _ = writeln!(
        k.body,
        "    int64_t stage = 0; /* floats of staged operands at the start of the user workspace */"
    );
    let (tq, ldq, stq) = operand(k, &mut spq, q, "BATCH * SQ", "D");
    let (tk, ldk, stk) = operand(k, &mut spk, kt, "BATCH * D", "SK");
    let (tv, ldv, stv) = operand(k, &mut spv, v, "BATCH * SK", "DV");
    let (stage_a, stage_b) = (stq.is_some(), stk.is_some() || stv.is_some());
    // The chain on the score tile, in place (a rows job over the columns [k0, k0 + bc)).
    let mut srcs = BTreeMap::new();
    for &m in &f.chain {
        for &i in &g.node(m).inputs {
            if !members.contains(&i)
                && !matches!(g.node(i).op, Op::Const { .. })
                && !srcs.contains_key(&i)
            {
                let s = k.src(&mut sps, i, "k0");
                srcs.insert(i, s);
            }
        }
    }
    srcs.insert(f.qk, Src::Row { gm: "ws".into(), off: "i * BC".into(), d: DType::F32 });
    let chain_code = if f.chain.is_empty() {
        String::new()
    } else {
        let job = Job {
            g,
            space: ss.clone(),
            nodes: f.chain.clone(),
            srcs,
            outs: vec![(f.scores, "ws".into(), "i * BC".into(), DType::F32)],
            row_i: format!("s_i{}", r - 2),
            causal_shift: causal_shift(&k.em, &f.chain),
            col0: "k0".into(),
            ncols: "bc".into(),
            tag: "s".into(),
        };
        job.emit(&mut k.ub, "                ")
    };
    let causal = f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask);
    let fq = k.ub.queue("fq".into(), DType::F32, true);
    let fo = k.ub.queue("fo".into(), DType::F32, false);
    let ex = k.ub.slot();
    let out_d = g.node(f.pv).dtype;
    let oq = k.ub.queue("fy".into(), out_d, false);
    k.ub.extra_fixed += 2 * 64 * 4 + 64;
    let ob = k.gm(k.em.buf[&f.pv]);
    // A row of a GM f32 tile through UB: `body` sees the chunk as `x` (in) and `y` (out).
    let stream = |src: &str, dst: &str, n: &str, body: &str, ind: &str| -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{ind}for (int64_t c0 = 0; c0 < {n}; c0 += CH) {{");
        let _ = writeln!(s, "{ind}    const int32_t cn = (int32_t)af_min(CH, {n} - c0);");
        let _ =
            writeln!(s, "{ind}    {{ AscendC::LocalTensor<float> x = {fq}.AllocTensor<float>();");
        let _ = writeln!(s, "{ind}      AscendC::DataCopyPad(x, {src}, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof(float)), 0, 0, 0}}, AscendC::DataCopyPadExtParams<float>{{false, 0, 0, 0}});");
        let _ = writeln!(s, "{ind}      {fq}.EnQue(x); }}");
        let _ = writeln!(s, "{ind}    AscendC::LocalTensor<float> x = {fq}.DeQue<float>();");
        s.push_str(body);
        if !dst.is_empty() {
            let _ = writeln!(s, "{ind}    {fo}.EnQue(y);\n{ind}    y = {fo}.DeQue<float>();");
            let _ = writeln!(s, "{ind}    AscendC::DataCopyPad({dst}, y, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof(float)), 0, 0, 0}});");
            let _ = writeln!(s, "{ind}    {fo}.FreeTensor(y);");
        }
        let _ = writeln!(s, "{ind}    {fq}.FreeTensor(x);\n{ind}}}");
        s
    };
    let i5 = "                    ";
    let max_body = format!("{i5}AscendC::ReduceMax<float>(rd, x, rt, cn);\n{i5}{{ const float v = rd.GetValue(0); bm = v > bm ? v : bm; }}\n");
    let exp_body = format!(
        "{i5}AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();\n{i5}AscendC::Adds({ex}, x, -mxe, cn);\n{i5}AscendC::Exp(y, {ex}, cn);\n{i5}AscendC::ReduceSum<float>(rd, y, rt, cn);\n{i5}ps += rd.GetValue(0);\n"
    );
    let scale_body = format!("{i5}AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();\n{i5}AscendC::Muls(y, x, corr, cn);\n");
    let oty = ascend_type(out_d);
    let fin_body = if out_d == DType::F32 {
        format!("{i5}AscendC::LocalTensor<float> y = {oq}.AllocTensor<float>();\n{i5}AscendC::Muls(y, x, inv, cn);\n")
    } else {
        format!("{i5}AscendC::LocalTensor<{oty}> y = {oq}.AllocTensor<{oty}>();\n{i5}AscendC::Muls({ex}, x, inv, cn);\n{i5}AscendC::Cast<{oty}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);\n")
    };
    // The final store goes to the output (its own queue and dtype).
    let fin = stream("wo[i * DV + c0]", "", "DV", &fin_body, "            ").replace(
        &format!("                {fq}.FreeTensor(x);"),
        &format!("                {oq}.EnQue(y);\n                y = {oq}.DeQue<{oty}>();\n                AscendC::DataCopyPad({ob}[(bi * SQ + q0 + i) * DV + c0], y, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({oty})), 0, 0, 0}});\n                {oq}.FreeTensor(y);\n                {fq}.FreeTensor(x);"),
    );
    let b = &mut k.body;
    let _ = writeln!(b, "    AscendC::tiling::TCubeTiling ct0, ct1;\n    af_cube_tiling(t, 0, ct0);\n    af_cube_tiling(t, 1, ct1);");
    let mt = |tr: bool| {
        format!("matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float, {tr}>")
    };
    let _ = writeln!(b, "    matmul::Matmul<{}, {}, matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float>> mqk; /* S = Q K^T */", mt(tq), mt(tk));
    let _ = writeln!(b, "    matmul::Matmul<{}, {}, matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, float>> mpv; /* O += P V */", mt(false), mt(tv));
    let _ = writeln!(b, "    REGIST_MATMUL_OBJ(&pipe, AscendC::GetSysWorkSpacePtr(), mqk, &ct0, mpv, &ct1); /* the AIC serves both, then returns */");
    b.push_str("    /*UB*/\n");
    let _ = writeln!(b, "    AscendC::TBuf<AscendC::TPosition::VECCALC> statb;\n    pipe.InitBuffer(statb, 2 * 64 * sizeof(float));");
    let _ = writeln!(b, "    AscendC::LocalTensor<float> mr = statb.Get<float>(), lr = mr[64]; /* running max and sum per query row */");
    for st in [&stq, &stk, &stv].into_iter().flatten() {
        b.push_str(st);
    }
    if stage_a || stage_b {
        let _ = writeln!(b, "    AscendC::SyncAll(); /* every AIV's staged rows are in GM before any tile reads them */");
    }
    let _ = writeln!(b, "    AscendC::GlobalTensor<float> ws, wo; /* this AIV's score tile (S, then P) and output accumulator */");
    let _ = writeln!(b, "    ws.SetGlobalBuffer(uws + stage + aiv * (BR * BC + BR * DV), BR * BC);\n    wo.SetGlobalBuffer(uws + stage + aiv * (BR * BC + BR * DV) + BR * BC, BR * DV);");
    let _ = writeln!(b, "    for (int64_t u = aiv; u < units; u += naiv) {{");
    let _ = writeln!(
        b,
        "        const int64_t bi = u / qt, q0 = (u % qt) * BR, br = af_min(BR, SQ - q0);"
    );
    let _ = writeln!(b, "        for (int64_t i = 0; i < br; ++i) {{ mr.SetValue((uint32_t)i, -INFINITY); lr.SetValue((uint32_t)i, 0.0f); }}");
    let operand_at = |b: &mut String,
                      em: &Emitter,
                      sp: &Space,
                      v: NodeId,
                      staged: bool,
                      row: &str,
                      col: &str,
                      t: bool,
                      ld: &str,
                      name: &str| {
        let tag = sp.tag;
        if staged {
            let _ = writeln!(b, "            AscendC::GlobalTensor<float> {name} = w{tag}[({row}) * ({ld}) + {col}];");
        } else {
            b.push_str(&row_offsets(em, sp, row, "            "));
            let a = sp.accesses[&v];
            let gb = format!("g{}", em.buf[&resolve(em.g, v).base]);
            let c = if t { format!("({col}) * ({ld})") } else { col.to_string() };
            let _ = writeln!(
                b,
                "            AscendC::GlobalTensor<float> {name} = {gb}[{tag}_row{a} + {c}];"
            );
        }
    };
    let _ = writeln!(b, "        for (int64_t k0 = 0; k0 < SK; k0 += BC) {{");
    if causal {
        let _ = writeln!(b, "            if (k0 > q0 + br - 1 + ({})) break; /* every later key is masked for this block */", k.em.dim(&sk.sub(&sq)));
    }
    let _ = writeln!(b, "            const int64_t bc = af_min(BC, SK - k0);");
    operand_at(b, &k.em, &spq, q, stage_a, "bi * SQ + q0", "0", tq, &ldq, "gq");
    operand_at(b, &k.em, &spk, kt, stk.is_some(), "bi * D", "k0", tk, &ldk, "gk");
    operand_at(b, &k.em, &spv, v, stv.is_some(), "bi * SK + k0", "0", tv, &ldv, "gv");
    let _ = writeln!(
        b,
        "            mqk.SetOrgShape({});",
        org_shape("SQ", "SK", "D", (tq, &ldq), (tk, &ldk), "BC")
    );
    let _ =
        writeln!(b, "            mqk.SetTensorA(gq, {tq});\n            mqk.SetTensorB(gk, {tk});");
    let _ = writeln!(b, "            mqk.SetSingleShape((int)br, (int)bc, (int)D);\n            mqk.IterateAll(ws);");
    let _ = writeln!(b, "            AscendC::PipeBarrier<PIPE_ALL>();");
    let _ = writeln!(b, "            for (int64_t i = 0; i < br; ++i) {{");
    if !chain_code.is_empty() {
        let _ = writeln!(
            b,
            "                /* the chain on the scores: {} */",
            f.chain.iter().map(|m| g.node(*m).op.name()).collect::<Vec<_>>().join(" ")
        );
        b.push_str(&row_offsets(&k.em, &sps, "bi * SQ + q0 + i", "                "));
        b.push_str(&chain_code);
        let _ = writeln!(b, "                AscendC::PipeBarrier<PIPE_ALL>(); /* the block max reads what the chain wrote */");
    }
    let _ = writeln!(b, "                float bm = -INFINITY;");
    b.push_str(&stream("ws[i * BC + c0]", "", "bc", &max_body, "                "));
    let _ = writeln!(
        b,
        "                const float mo = mr.GetValue((uint32_t)i), mx = mo > bm ? mo : bm;"
    );
    let _ = writeln!(b, "                const float mxe = mx == -INFINITY ? 0.0f : mx; /* every key so far masked: P = 0 */");
    let _ = writeln!(
        b,
        "                const float corr = mo == -INFINITY ? 0.0f : af_s_exp(sc, mo - mx);"
    );
    let _ = writeln!(b, "                float ps = 0.0f;");
    b.push_str(&stream("ws[i * BC + c0]", "ws[i * BC + c0]", "bc", &exp_body, "                "));
    let _ = writeln!(b, "                lr.SetValue((uint32_t)i, lr.GetValue((uint32_t)i) * corr + ps);\n                mr.SetValue((uint32_t)i, mx);");
    let _ = writeln!(
        b,
        "                if (k0 > 0) {{ /* rescale what was accumulated under the old max */"
    );
    b.push_str(&stream(
        "wo[i * DV + c0]",
        "wo[i * DV + c0]",
        "DV",
        &scale_body,
        "                    ",
    ));
    let _ = writeln!(b, "                }}\n            }}");
    let _ = writeln!(b, "            AscendC::PipeBarrier<PIPE_ALL>(); /* P and the rescaled O are in GM before the cube reads them */");
    let _ = writeln!(
        b,
        "            mpv.SetOrgShape({});",
        org_shape("BR", "DV", "BC", (false, "BC"), (tv, &ldv), "DV")
    );
    let _ = writeln!(
        b,
        "            mpv.SetTensorA(ws, false);\n            mpv.SetTensorB(gv, {tv});"
    );
    let _ = writeln!(b, "            mpv.SetSingleShape((int)br, (int)DV, (int)bc);\n            mpv.IterateAll(wo, k0 > 0 ? 1 : 0); /* the first block writes, later ones add */");
    let _ = writeln!(b, "            AscendC::PipeBarrier<PIPE_ALL>();\n        }}");
    let _ = writeln!(b, "        for (int64_t i = 0; i < br; ++i) {{ /* normalise and store */");
    let _ = writeln!(
        b,
        "            const float l = lr.GetValue((uint32_t)i), inv = l > 0.0f ? 1.0f / l : 0.0f;"
    );
    b.push_str(&fin);
    let _ = writeln!(b, "        }}\n    }}\n    mqk.End();\n    mpv.End();");
    (Work::Flash { batch: numel(&batch), sq, sk, d, dv }, stage_a, stage_b)
}

/// One row copied from its source to the job's single output (staging).
fn copy_row(ub: &mut Ub, job: &Job, v: NodeId) -> String {
    let (_, gm_out, off_out, _) = &job.outs[0];
    let mut s = String::new();
    let ind = "        ";
    let q = ub.queue(format!("{}c", job.tag), DType::F32, true);
    let _ = writeln!(s, "{ind}for (int64_t c0 = 0; c0 < {}; c0 += CH) {{", job.ncols);
    let _ = writeln!(s, "{ind}    const int32_t cn = (int32_t)af_min(CH, {} - c0);", job.ncols);
    let _ = writeln!(s, "{ind}    AscendC::LocalTensor<float> x = {q}.AllocTensor<float>();");
    match &job.srcs[&v] {
        Src::Row { gm, off, d } | Src::Gather { gm, off, d, .. } | Src::Scalar { gm, off, d } => {
            // Staging copies go element by element through the scalar unit: they exist for
            // views the DMA cannot walk, and for f16/bf16 operands (converted here).
            let stride = match &job.srcs[&v] {
                Src::Row { .. } => "1".to_string(),
                Src::Scalar { .. } => "0".to_string(),
                Src::Gather { stride, .. } => stride.clone(),
            };
            let cv = if *d == DType::F32 {
                format!("{gm}.GetValue({off} + (c0 + j) * ({stride}))")
            } else {
                format!("static_cast<float>({gm}.GetValue({off} + (c0 + j) * ({stride})))")
            };
            let _ = writeln!(s, "{ind}    for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {cv});");
        }
    }
    let _ = writeln!(s, "{ind}    {q}.EnQue(x);\n{ind}    x = {q}.DeQue<float>();");
    let _ = writeln!(s, "{ind}    AscendC::DataCopyPad({gm_out}[{off_out} + c0], x, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof(float)), 0, 0, 0}});");
    let _ = writeln!(s, "{ind}    {q}.FreeTensor(x);\n{ind}}}");
    s
}

/// Generate the Ascend C file of one plan.
pub fn generate(
    g: &Graph,
    plan: &Plan,
    symbol: &str,
    header: &str,
) -> Result<AscendSource, String> {
    let mut code = String::new();
    let _ = writeln!(code, "/* {header}\n * Ascend C for Atlas A2 (dav-2201). Generated by autofusion-compiler {}. Do not edit. */", env!("CARGO_PKG_VERSION"));
    code.push_str(&prelude());
    code.push_str(&cube_fill());
    // Module buffers: every value a kernel reads or writes, in first-use order.
    let mut table: Vec<NodeId> = Vec::new();
    for grp in &plan.groups {
        for v in grp.inputs.iter().chain(&grp.outputs) {
            if !table.contains(v) {
                table.push(*v);
            }
        }
    }
    let mut kernels = Vec::new();
    let mut bodies = Vec::new();
    for (ki, grp) in plan.groups.iter().enumerate() {
        let mut buf = BTreeMap::new();
        let mut buffers = Vec::new();
        for &v in grp.inputs.iter().chain(&grp.outputs) {
            buf.insert(v, buffers.len());
            buffers.push(v);
        }
        let first = grp.outputs.first().map(|o| ident(&g.node(*o).name)).unwrap_or_default();
        let name = format!("k{ki}_{first}");
        let em = Emitter::new(g, buf, &name);
        let mut k = K {
            em,
            table: buffers.iter().map(|b| table.iter().position(|x| x == b).unwrap()).collect(),
            ub: Ub::default(),
            body: String::new(),
        };
        let (work, mix, cube, sa, sb) = match grp.kind {
            GroupKind::Elementwise => (gen_rows(&mut k, grp), false, 0, false, false),
            GroupKind::Concat => (gen_concat(&mut k, grp), false, 0, false, false),
            GroupKind::MatMul => {
                let (w, sa, sb) = gen_matmul(&mut k, grp);
                (w, true, 1, sa, sb)
            }
            GroupKind::FlashAttention => {
                let (w, sa, sb) = gen_flash(&mut k, grp);
                (w, true, 2, sa, sb)
            }
            GroupKind::Horizontal => return Err(format!("{name}: horizontal matmul groups have no Ascend generator (plan without qkv_horizontal)")),
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
        let mut f = String::new();
        let _ = writeln!(
            f,
            "/* {name}: {ops}\n * {why}; writes {}; {}.",
            grp.outputs.iter().map(|o| g.node(*o).name.clone()).collect::<Vec<_>>().join(", "),
            if mix { "cube + vector (mix 1:2)" } else { "vector only" }
        );
        if !lines.is_empty() {
            let _ = writeln!(
                f,
                " * source lines: {}",
                lines.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        let _ = writeln!(f, " */");
        // Global names carry the module symbol: several modules link into one binary.
        let fname = format!("{symbol}_{name}");
        let _ = writeln!(f, "__aicore__ inline void {fname}_body(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace) {{");
        if !mix {
            let _ = writeln!(f, "    if ASCEND_IS_AIC {{ return; }} /* vector work: in a mix launch (the pipeline) the cube idles */");
        }
        let _ = writeln!(f, "    AfTiling t;\n    af_load_tiling(tilings, {ki}, t);");
        let _ = writeln!(
            f,
            "    int64_t dims[AF_MAX_DIMS];\n    af_load_dims(args, dims);\n    (void)dims;"
        );
        let _ = writeln!(f, "    const int64_t CH = t.chunk; /* columns per UB chunk (DynamicTiling, multiple of 8) */");
        let _ = writeln!(f, "    const int64_t aiv = AscendC::GetBlockIdx(), naiv = AscendC::GetBlockNum() * AscendC::GetTaskRatio();");
        for (i, v) in buffers.iter().enumerate() {
            let n = g.node(*v);
            let ty = ascend_type(n.dtype);
            let _ = writeln!(f, "    AscendC::GlobalTensor<{ty}> g{i}; /* {} */", n.name);
            let _ = writeln!(
                f,
                "    g{i}.SetGlobalBuffer((__gm__ {ty} *)af_buf(args, {}), (uint64_t)({}));",
                k.table[i],
                k.em.dim(&numel(&n.shape))
            );
        }
        f.push_str(&k.em.decls);
        let _ = writeln!(f, "    AscendC::TPipe pipe;");
        let ubdecl = k.ub.decls("    ");
        f.push_str(&k.body.replacen("    /*UB*/\n", &ubdecl, 1));
        let _ = writeln!(f, "}}");
        let _ = writeln!(f, "extern \"C\" __global__ __aicore__ void {fname}(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace) {{");
        let _ = writeln!(
            f,
            "    KERNEL_TASK_TYPE_DEFAULT({});",
            if mix { "KERNEL_TYPE_MIX_AIC_1_2" } else { "KERNEL_TYPE_AIV_ONLY" }
        );
        if mix {
            let _ = writeln!(f, "    AscendC::SetSysWorkspace(workspace);");
        }
        let _ = writeln!(f, "    {fname}_body(args, tilings, workspace);\n}}\n");
        code.push_str(&f);
        kernels.push(AscendKernel {
            name: name.clone(),
            buffers,
            n_inputs: grp.inputs.len(),
            work,
            ops,
            mix,
            ub_per_col: k.ub.per_col(),
            ub_fixed: k.ub.fixed(),
            cube,
            stage_a: sa,
            stage_b: sb,
        });
        bodies.push((fname, mix));
    }
    // The pipeline: every body in one mix launch, synchronised by kernel type.
    let _ = writeln!(
        code,
        "/* The opt_level-3 pipeline: all kernels in one launch (SuperKernel style). Between two"
    );
    let _ = writeln!(
        code,
        " * vector kernels only the AIVs synchronise; around a cube kernel every core does. */"
    );
    let _ = writeln!(code, "extern \"C\" __global__ __aicore__ void {symbol}_pipeline(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace) {{");
    let _ = writeln!(code, "    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);\n    AscendC::SetSysWorkspace(workspace);");
    for (i, (name, mix)) in bodies.iter().enumerate() {
        if i > 0 {
            let prev_mix = bodies[i - 1].1;
            if *mix || prev_mix {
                let _ = writeln!(code, "    AscendC::SyncAll<false>();");
            } else {
                let _ = writeln!(code, "    if ASCEND_IS_AIV {{ AscendC::SyncAll(); }}");
            }
        }
        let _ = writeln!(code, "    {name}_body(args, tilings, workspace);");
    }
    let _ = writeln!(code, "}}\n");
    let launch = format!("{symbol}_launch");
    let _ = writeln!(
        code,
        "/* Host side: one launcher for every kernel (kernel == {} launches the pipeline). */",
        kernels.len()
    );
    let _ = writeln!(code, "extern \"C\" int32_t {launch}(uint32_t kernel, uint32_t block_dim, void *stream, uint8_t *args, uint8_t *tilings, uint8_t *workspace) {{");
    let _ = writeln!(code, "    switch (kernel) {{");
    for (i, (fname, _)) in bodies.iter().enumerate() {
        let _ = writeln!(code, "    case {i}: {fname}<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;");
    }
    let _ = writeln!(code, "    case {}: {symbol}_pipeline<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;", kernels.len());
    let _ = writeln!(code, "    default: return -1;\n    }}\n}}");
    let json = autofusion_ir::json::write(&AscendMeta {
        kernels: kernels.clone(),
        buffers: table.clone(),
        pipeline: plan.pipeline,
    });
    let entry = format!("{symbol}_ascend_json");
    let _ = writeln!(code, "static const char af_ascend_json[] = {};", c_string(&json));
    let _ = writeln!(code, "extern \"C\" const char *{entry}(void) {{ return af_ascend_json; }}");
    Ok(AscendSource { code, kernels, buffers: table, launch, entry, meta_json: json })
}

/// Fill a TCubeTiling from our int32 field set (named fields, so the toolkit's own struct
/// layout may differ between CANN versions).
fn cube_fill() -> String {
    let mut s = String::from("__aicore__ inline void af_cube_tiling(const AfTiling &t, int i, AscendC::tiling::TCubeTiling &c) {\n");
    for (j, f) in ASCEND_CUBE_FIELDS.iter().enumerate() {
        let _ = writeln!(s, "    c.{f} = t.cube[i][{j}];");
    }
    s.push_str("}\n\n");
    s
}
