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
//!   A and recomputing the statistics per N tile would repeat the vector work. The cube reads
//!   A and B in their own type when they share one: half and bfloat16_t products accumulate
//!   in f32 in L0C (as the cube computes, and as the cost model's 16-bit operand bytes and
//!   fp16 cube rate assume); operands of different types are staged as f32.
//! - flash attention: mix 1:2 with two Matmul objects: S = Q K^T on the cube into the AIV's
//!   BR x BC score tile, the chain (scale, mask) and the online softmax on the AIV (row max,
//!   P = exp(S - max) in place, running max and sum in UB), O += P V on the cube with atomic
//!   accumulation into the AIV's output tile after the AIV rescaled it; no S x S buffer.
//! - horizontal matmul groups: not generated (`generate` returns an error naming the kernel;
//!   `Ascend::unsupported_rules` leaves out the opt-in rule that forms them).
//! - the opt_level-3 pipeline: one mix launch calling every body in order, with `SyncAll`
//!   between dependent kernels, AIV-only when neither side uses the cube (SuperKernel syncs only
//!   the core types that need it).

use super::emit::{c_float, c_string, Code, Emitter, RowStore, Space};
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

/// A float constant in device code. No libc header is included in Ascend C kernels (the devkit's
/// basic API headers pull in none of `<cmath>`), so infinities and NaN come from `ascend.h`'s
/// compiler-builtin macros instead of `INFINITY` / `NAN`.
fn float_literal(v: f64) -> String {
    let f = v as f32;
    match (f.is_nan(), f.is_infinite(), f > 0.0) {
        (true, ..) => "AF_NAN".into(),
        (_, true, true) => "AF_INF".into(),
        (_, true, false) => "AF_NEG_INF".into(),
        _ => c_float(v),
    }
}

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

/// The files' common part: includes, the tiling struct (mirrored in Rust, offsets asserted
/// there), and small helpers.
fn prelude(c: &mut Code) {
    c.line("#include \"kernel_operator.h\"");
    c.line("#include \"lib/matmul_intf.h\"");
    c.line("#include <stdint.h>");
    c.line("");
    let _ = writeln!(c, "#define AF_MAX_DIMS {ASCEND_MAX_DIMS}");
    let _ = writeln!(c, "#define AF_TF {}", ASCEND_TILING_FIELDS.len());
    let _ = writeln!(c, "#define AF_CF {}", ASCEND_CUBE_FIELDS.len());
    c.line("/* DynamicTiling's per-kernel struct (int64 fields, then two TCubeTiling field sets as int32). */");
    c.open("struct AfTiling");
    for f in ASCEND_TILING_FIELDS {
        let _ = writeln!(c, "int64_t {f};");
    }
    c.line("int32_t cube[2][AF_CF];");
    c.close_with(";");
    let _ = writeln!(
        c,
        "static_assert(sizeof(AfTiling) == {}, \"AfTiling layout\");",
        crate::abi::ascend_tiling_bytes()
    );
    let _ = writeln!(c, "#include \"{}\"", super::ASCEND_HEADER);
}

/// Fill a TCubeTiling from our int32 field set (named fields, so the toolkit's own struct
/// layout may differ between CANN versions).
fn cube_fill(c: &mut Code) {
    c.open("__aicore__ inline void af_cube_tiling(const AfTiling &t, int i, AscendC::tiling::TCubeTiling &c)");
    for (j, f) in ASCEND_CUBE_FIELDS.iter().enumerate() {
        let _ = writeln!(c, "c.{f} = t.cube[i][{j}];");
    }
    c.close();
    c.line("");
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
        self.queues.iter().map(|q| 2 * q.1.size() as u32).sum::<u32>()
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
    fn decls(&self, c: &mut Code) {
        for (name, d, input) in &self.queues {
            let pos = if *input { "VECIN" } else { "VECOUT" };
            let _ = writeln!(c, "AscendC::TQue<AscendC::TPosition::{pos}, 1> {name};");
            let _ = writeln!(
                c,
                "pipe.InitBuffer({name}, 2, (uint32_t)(CH * sizeof({})));",
                ascend_type(*d)
            );
        }
        c.line("AscendC::TBuf<AscendC::TPosition::VECCALC> work, halfb, scal;");
        let _ = writeln!(
            c,
            "pipe.InitBuffer(work, (uint32_t)(CH * sizeof(float) * {}));",
            self.slots + 3
        );
        c.line("pipe.InitBuffer(halfb, (uint32_t)(CH * sizeof(half) + 32));");
        c.line("pipe.InitBuffer(scal, (uint32_t)(64 + ((2 * ((CH + 63) / 64) + 7) / 8) * 32));");
        c.line("AscendC::LocalTensor<float> wk = work.Get<float>(), sc = scal.Get<float>(), rd = sc, rt = sc[8];");
        c.line("AscendC::LocalTensor<half> hb = halfb.Get<half>();");
        c.line("AscendC::LocalTensor<bfloat16_t> bb = halfb.Get<bfloat16_t>();");
        let _ = writeln!(c, "AscendC::LocalTensor<float> sl[{}];", self.slots.max(1));
        let _ =
            writeln!(c, "for (int i = 0; i < {}; ++i) sl[i] = wk[(uint32_t)(i * CH)];", self.slots);
        let s = self.slots;
        let _ = writeln!(c, "AscendC::LocalTensor<float> ta = wk[(uint32_t)({s} * CH)], tb = wk[(uint32_t)({} * CH)], tc = wk[(uint32_t)({} * CH)];", s + 1, s + 2);
        c.line("(void)hb; (void)bb; (void)ta; (void)tb; (void)tc; (void)rd; (void)rt;");
    }
}

/// A braced group of statements on successive lines, `{ s0` ... `s2 }`, the later lines
/// aligned with the first statement (past the `{ `).
fn aligned_group(c: &mut Code, stmts: &[String]) {
    let open = "{ ";
    let align = " ".repeat(open.len());
    for (i, s) in stmts.iter().enumerate() {
        let lead = if i == 0 { open } else { align.as_str() };
        let tail = if i + 1 == stmts.len() { " }" } else { "" };
        c.line(format!("{lead}{s}{tail}"));
    }
}

/// `DataCopyPad` of the chunk's `cn` elements of type `ty` from GM `src` into UB tensor `x`.
fn pad_in(x: &str, src: &str, ty: &str) -> String {
    format!("AscendC::DataCopyPad({x}, {src}, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}}, AscendC::DataCopyPadExtParams<{ty}>{{false, 0, 0, 0}});")
}

/// `DataCopyPad` of the chunk's `cn` elements of type `ty` from UB tensor `y` to GM `dst`.
fn pad_out(dst: &str, y: &str, ty: &str) -> String {
    format!("AscendC::DataCopyPad({dst}, {y}, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}});")
}

/// UB tensor `t` of queue `q` handed through the queue to the copy out, written to GM `dst`
/// (the chunk's `cn` elements of type `ty`), and freed.
fn enque_store(c: &mut Code, q: &str, t: &str, ty: &str, dst: &str) {
    let _ = writeln!(c, "{q}.EnQue({t});");
    let _ = writeln!(c, "{t} = {q}.DeQue<{ty}>();");
    c.line(pad_out(dst, t, ty));
    let _ = writeln!(c, "{q}.FreeTensor({t});");
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

fn unary_seq(out: &mut Code, u: UnaryOp, dst: &str, x: &str, n: &str) {
    for line in u.spec().ascend_vector {
        out.line(fill(line, &[("dst", dst), ("x", x), ("n", n)]));
    }
}

fn unary_scalar(u: UnaryOp, x: &str) -> String {
    fill(u.spec().ascend_scalar, &[("x", x)])
}

fn binary_scalar(b: BinaryOp, x: &str, y: &str) -> String {
    fill(b.spec().ascend_scalar, &[("x", x), ("y", y)])
}

/// A binary op into `dst` with tensor and/or scalar operands (count form).
fn binary_seq(out: &mut Code, b: BinaryOp, dst: &str, x: &V, y: &V, n: &str) {
    let api = |b: BinaryOp| b.spec().ascend_vv.expect("a vector API (pow is handled apart)");
    match (b, x, y) {
        // a^b = exp(b ln a) (a > 0, as the vector unit has no pow); squares exactly.
        (BinaryOp::Pow, V::T(a), V::S(e)) if e == "2.0f" => {
            out.line(format!("AscendC::Mul({dst}, {a}, {a}, {n});"));
        }
        (BinaryOp::Pow, V::T(a), V::S(e)) if e == "0.5f" => {
            out.line(format!("AscendC::Sqrt({dst}, {a}, {n});"));
        }
        (BinaryOp::Pow, V::T(a), V::S(e)) => {
            out.line(format!("AscendC::Ln({dst}, {a}, {n});"));
            out.line(format!("AscendC::Muls({dst}, {dst}, {e}, {n});"));
            out.line(format!("AscendC::Exp({dst}, {dst}, {n});"));
        }
        (BinaryOp::Pow, a, e) => {
            let a = materialise(out, a, "ta", n);
            let e = materialise(out, e, "tb", n);
            out.line(format!("AscendC::Ln({dst}, {a}, {n});"));
            out.line(format!("AscendC::Mul({dst}, {dst}, {e}, {n});"));
            out.line(format!("AscendC::Exp({dst}, {dst}, {n});"));
        }
        (_, V::T(a), V::T(c)) => {
            out.line(format!("AscendC::{}({dst}, {a}, {c}, {n});", api(b)));
        }
        (BinaryOp::Sub, V::T(a), V::S(s)) => {
            out.line(format!("AscendC::Adds({dst}, {a}, -(float)({s}), {n});"));
        }
        (BinaryOp::Div, V::T(a), V::S(s)) => {
            out.line(format!("AscendC::Duplicate(tc, (float)({s}), {n});"));
            out.line(format!("AscendC::Div({dst}, {a}, tc, {n});"));
        }
        (BinaryOp::Sub, V::S(s), V::T(a)) => {
            out.line(format!("AscendC::Muls({dst}, {a}, -1.0f, {n});"));
            out.line(format!("AscendC::Adds({dst}, {dst}, (float)({s}), {n});"));
        }
        (BinaryOp::Div, V::S(s), V::T(a)) => {
            out.line(format!("AscendC::Duplicate(tc, (float)({s}), {n});"));
            out.line(format!("AscendC::Div({dst}, tc, {a}, {n});"));
        }
        // The rest are commutative with a tensor-scalar API (Adds, Muls, Maxs, Mins).
        (_, V::T(a), V::S(s)) | (_, V::S(s), V::T(a)) => {
            let api = b.spec().ascend_vs.expect("sub, div and pow are matched above");
            out.line(format!("AscendC::{api}({dst}, {a}, (float)({s}), {n});"));
        }
        (_, V::S(a), V::S(c)) => {
            let v = binary_scalar(b, a, c);
            out.line(format!("AscendC::Duplicate({dst}, (float)({v}), {n});"));
        }
    }
}

fn materialise(out: &mut Code, v: &V, tmp: &str, n: &str) -> String {
    match v {
        V::T(t) => t.clone(),
        V::S(s) => {
            let _ = writeln!(out, "AscendC::Duplicate({tmp}, (float)({s}), {n});");
            tmp.to_string()
        }
    }
}

/// Round a float slot to `d` and back, as the reference rounds f16/bf16 values where they are
/// computed.
fn round_seq(out: &mut Code, d: DType, dst: &str, n: &str) {
    let (ty, scratch) = match d {
        DType::F32 => return,
        DType::F16 => ("half", "hb"),
        DType::BF16 => ("bfloat16_t", "bb"),
    };
    let _ = writeln!(
        out,
        "AscendC::Cast<{ty}, float>({scratch}, {dst}, AscendC::RoundMode::CAST_RINT, {n});"
    );
    let _ = writeln!(
        out,
        "AscendC::Cast<float, {ty}>({dst}, {scratch}, AscendC::RoundMode::CAST_NONE, {n});"
    );
}

fn round_scalar(d: DType, e: String) -> String {
    match d {
        DType::F32 => e,
        DType::F16 => format!("af_s_round(sc, hb, {e})"),
        DType::BF16 => format!("af_s_round_bf(sc, bb, {e})"),
    }
}

fn is_max(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. })
}

/// The phases of a rows job, as in the host generator: a full-width op runs in the chunk loop
/// of its phase; a reduction accumulates in loop `a` and is ready after it.
struct Phases {
    /// The chunk loop computing each full-width value (row sources are read in loop 0).
    phase: BTreeMap<NodeId, usize>,
    /// The loop after which each row value (one scalar per row) is ready.
    level: BTreeMap<NodeId, usize>,
    /// The chunk loop accumulating each reduction.
    reduce_loop: BTreeMap<NodeId, usize>,
    n_loops: usize,
}

impl Phases {
    /// The reductions accumulated in loop `p`.
    fn reductions_in(&self, p: usize) -> Vec<NodeId> {
        self.reduce_loop.iter().filter(|(_, q)| **q == p).map(|(m, _)| *m).collect()
    }
}

/// One chunk of a rows loop as it is written: the UB tensor holding each value read or
/// computed so far, and the CopyIn queue tensors (value, queue, tensor, GM dtype), freed at
/// the end of the chunk.
struct Chunk {
    slots: BTreeMap<NodeId, String>,
    dequeued: Vec<(NodeId, String, String, DType)>,
}

impl Job<'_> {
    fn full(&self, id: NodeId) -> bool {
        let g = self.g;
        let mut row = self.space.clone();
        *row.last_mut().unwrap() = DimExpr::constant(1);
        self.space == row
            || iter_shape(g, id) == self.space && !matches!(g.node(id).op, Op::Reduce { .. })
    }

    /// Emit the code of one row (accesses' `<tag>_row<a>` offsets already computed).
    fn emit(&self, ub: &mut Ub, out: &mut Code) {
        let ph = self.phases();
        self.scalar_sources(out);
        self.row_values(&ph, 0, out);
        for p in 0..ph.n_loops {
            self.chunk_loop(ub, &ph, p, out);
            self.row_values(&ph, p + 1, out);
        }
        self.store_row_values(&ph, out);
    }

    /// Which chunk loop computes each member, and after which loop each row value is ready.
    fn phases(&self) -> Phases {
        let g = self.g;
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
        Phases { phase, level, reduce_loop, n_loops }
    }

    /// The C name of row value `id` (a scalar source or a value computed once per row).
    fn scal(&self, id: NodeId) -> String {
        format!("{}s{}", self.tag, id.0)
    }

    /// Value `id` inside a chunk: a constant, its UB tensor in `slots`, or its row scalar.
    fn value_of(&self, id: NodeId, slots: &BTreeMap<NodeId, String>) -> V {
        if let Op::Const { value } = self.g.node(id).op {
            return V::S(float_literal(value));
        }
        if let Some(sl) = slots.get(&id) {
            return V::T(sl.clone());
        }
        V::S(self.scal(id))
    }

    /// Row value `id` as a scalar expression.
    fn row_value(&self, id: NodeId) -> String {
        match self.value_of(id, &BTreeMap::new()) {
            V::S(s) => s,
            V::T(_) => unreachable!("a row value reads a full-width value"),
        }
    }

    /// Scalar sources: one read per row.
    fn scalar_sources(&self, out: &mut Code) {
        for (id, s) in &self.srcs {
            if let Src::Scalar { gm, off, d } = s {
                let v = if d.is_compute() {
                    format!("{gm}.GetValue({off})")
                } else {
                    format!("static_cast<float>({gm}.GetValue({off}))")
                };
                let name = &self.g.node(*id).name;
                let _ = writeln!(out, "const float {} = {v}; /* {name} */", self.scal(*id));
            }
        }
    }

    /// The row values of level `lvl` (scalars: reductions' results and what is computed from
    /// them).
    fn row_values(&self, ph: &Phases, lvl: usize, out: &mut Code) {
        let t = &self.tag;
        for &m in &self.nodes {
            if ph.level.get(&m) != Some(&lvl) {
                continue;
            }
            let n = self.g.node(m);
            let e = match &n.op {
                Op::Reduce { kind: ReduceKind::Mean, .. } => {
                    format!("{t}acc{} / (float)({})", m.0, self.ncols)
                }
                Op::Reduce { .. } => format!("{t}acc{}", m.0),
                op => {
                    let ops: Vec<String> = n.inputs.iter().map(|i| self.row_value(*i)).collect();
                    match op {
                        Op::Unary(u) => unary_scalar(*u, &ops[0]),
                        Op::Binary(b) => binary_scalar(*b, &ops[0], &ops[1]),
                        Op::Cast | Op::Copy => ops[0].clone(),
                        op => unreachable!("{} as a row value", op.name()),
                    }
                }
            };
            let e = round_scalar(n.dtype, e);
            let _ = writeln!(out, "const float {} = {e}; /* {} */", self.scal(m), n.name);
        }
    }

    /// What loop `p` computes: its own full-width members, the inputs of its reductions, and
    /// (recomputed) everything of earlier phases they need.
    fn loop_needs(&self, ph: &Phases, p: usize) -> BTreeSet<NodeId> {
        let g = self.g;
        let members: BTreeSet<NodeId> = self.nodes.iter().copied().collect();
        let mut need: BTreeSet<NodeId> = BTreeSet::new();
        let mut stack: Vec<NodeId> = ph
            .phase
            .iter()
            .filter(|(_, q)| **q == p)
            .map(|(m, _)| *m)
            .filter(|m| members.contains(m))
            .collect();
        stack.extend(ph.reductions_in(p).iter().map(|m| g.node(*m).inputs[0]));
        stack.extend(self.outs.iter().map(|o| o.0).filter(|o| ph.phase.get(o) == Some(&p)));
        while let Some(x) = stack.pop() {
            if ph.phase.contains_key(&x) && need.insert(x) && members.contains(&x) {
                stack.extend(g.node(x).inputs.iter().copied());
            }
        }
        need
    }

    /// Chunk loop `p`: its reductions' accumulators, then per chunk of `CH` columns CopyIn,
    /// Compute (the reductions accumulate) and CopyOut.
    fn chunk_loop(&self, ub: &mut Ub, ph: &Phases, p: usize, out: &mut Code) {
        let t = &self.tag;
        let need = self.loop_needs(ph, p);
        let reds = ph.reductions_in(p);
        for &m in &reds {
            let init = if is_max(self.g, m) { "AF_NEG_INF" } else { "0.0f" };
            let _ = writeln!(out, "float {t}acc{} = {init};", m.0);
        }
        out.open(format!("for (int64_t c0 = 0; c0 < {}; c0 += CH)", self.ncols));
        let _ = writeln!(out, "const int32_t cn = (int32_t)af_min(CH, {} - c0);", self.ncols);
        let mut chunk = self.copy_in(ub, &need, out);
        self.dequeue(ub, &mut chunk, out);
        for &m in &self.nodes {
            if reds.contains(&m) {
                self.reduce_step(m, &chunk.slots, out);
            } else if need.contains(&m) {
                self.compute(ub, m, &mut chunk.slots, out);
            }
        }
        self.copy_out(ub, ph, p, &chunk.slots, out);
        for (_, q, x, _) in &chunk.dequeued {
            let _ = writeln!(out, "{q}.FreeTensor({x});");
        }
        out.close();
    }

    /// CopyIn of the sources the loop needs: rows through their queue, strided views gathered
    /// by the scalar unit into a slot.
    fn copy_in(&self, ub: &mut Ub, need: &BTreeSet<NodeId>, out: &mut Code) -> Chunk {
        let (g, t) = (self.g, &self.tag);
        let mut chunk = Chunk { slots: BTreeMap::new(), dequeued: Vec::new() };
        for (&id, s) in &self.srcs {
            if !need.contains(&id) {
                continue;
            }
            match s {
                Src::Row { gm, off, d } => {
                    let q = ub.queue(format!("{t}q{}", id.0), *d, true);
                    let ty = ascend_type(*d);
                    out.block_noted("", &format!("CopyIn {}", g.node(id).name), |c| {
                        let _ =
                            writeln!(c, "AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
                        c.line(pad_in("x", &format!("{gm}[{off} + c0]"), ty));
                        let _ = writeln!(c, "{q}.EnQue(x);");
                    });
                    chunk.dequeued.push((id, q, format!("{t}x{}", id.0), *d));
                }
                Src::Gather { gm, off, col0, stride, d } => {
                    let sl = ub.slot();
                    let cv = if d.is_compute() {
                        format!("{gm}.GetValue({off} + ({col0} + c0 + j) * ({stride}))")
                    } else {
                        format!("static_cast<float>({gm}.GetValue({off} + ({col0} + c0 + j) * ({stride})))")
                    };
                    let _ = writeln!(out, "for (int32_t j = 0; j < cn; ++j) {sl}.SetValue(j, {cv}); /* gather {} (strided view) */", g.node(id).name);
                    chunk.slots.insert(id, sl);
                }
                Src::Scalar { .. } => {}
            }
        }
        chunk
    }

    /// The start of Compute: every CopyIn queue dequeued, f16/bf16 rows cast to f32 slots.
    fn dequeue(&self, ub: &mut Ub, chunk: &mut Chunk, out: &mut Code) {
        for (id, q, x, d) in &chunk.dequeued {
            let ty = ascend_type(*d);
            let _ = writeln!(out, "AscendC::LocalTensor<{ty}> {x} = {q}.DeQue<{ty}>();");
            if d.is_compute() {
                chunk.slots.insert(*id, x.clone());
            } else {
                let sl = ub.slot();
                let _ = writeln!(
                    out,
                    "AscendC::Cast<float, {ty}>({sl}, {x}, AscendC::RoundMode::CAST_NONE, cn);"
                );
                chunk.slots.insert(*id, sl);
            }
        }
    }

    /// The chunk's contribution to reduction `m` (its accumulator `<tag>acc<m>`).
    fn reduce_step(&self, m: NodeId, slots: &BTreeMap<NodeId, String>, out: &mut Code) {
        let (n, t) = (self.g.node(m), &self.tag);
        match (self.value_of(n.inputs[0], slots), is_max(self.g, m)) {
            (V::T(x), false) => {
                let _ = writeln!(out, "AscendC::ReduceSum<float>(rd, {x}, rt, cn);");
                let _ = writeln!(out, "{t}acc{} += rd.GetValue(0); /* {} */", m.0, n.name);
            }
            (V::T(x), true) => {
                let _ = writeln!(out, "AscendC::ReduceMax<float>(rd, {x}, rt, cn);");
                let _ = writeln!(out, "{{ const float v = rd.GetValue(0); {t}acc{0} = v > {t}acc{0} ? v : {t}acc{0}; }} /* {1} */", m.0, n.name);
            }
            (V::S(s), false) => {
                let _ = writeln!(out, "{t}acc{} += (float)cn * ({s}); /* {} */", m.0, n.name);
            }
            (V::S(s), true) => {
                let _ = writeln!(
                    out,
                    "{t}acc{0} = ({s}) > {t}acc{0} ? ({s}) : {t}acc{0}; /* {1} */",
                    m.0, n.name
                );
            }
        }
    }

    /// Full-width member `m` over the chunk into a new slot, rounded to its dtype.
    fn compute(
        &self,
        ub: &mut Ub,
        m: NodeId,
        slots: &mut BTreeMap<NodeId, String>,
        out: &mut Code,
    ) {
        let n = self.g.node(m);
        let dst = ub.slot();
        let ops: Vec<V> = n.inputs.iter().map(|i| self.value_of(*i, slots)).collect();
        let _ = writeln!(out, "/* {} = {} */", n.name, n.op.name());
        match &n.op {
            Op::Unary(u) => {
                let x = materialise(out, &ops[0], "ta", "cn");
                unary_seq(out, *u, &dst, &x, "cn");
            }
            Op::Binary(b) => binary_seq(out, *b, &dst, &ops[0], &ops[1], "cn"),
            Op::Cast | Op::Copy => match &ops[0] {
                V::T(x) => {
                    let _ = writeln!(out, "AscendC::Adds({dst}, {x}, 0.0f, cn);");
                }
                V::S(s) => {
                    let _ = writeln!(out, "AscendC::Duplicate({dst}, (float)({s}), cn);");
                }
            },
            Op::CausalMask => self.causal_mask(&dst, &ops[0], out),
            op => unreachable!("{} in a rows job", op.name()),
        }
        round_seq(out, n.dtype, &dst, "cn");
        slots.insert(m, dst);
    }

    /// The causal mask of the chunk's keys into `dst`.
    fn causal_mask(&self, dst: &str, x: &V, out: &mut Code) {
        // Keys j <= i + (cols - rows) stay; the rest become -inf. The boundary
        // is rarely 32-byte aligned: the unaligned head is written by the
        // scalar unit, the aligned rest by Duplicate.
        let x = materialise(out, x, "ta", "cn");
        let _ = writeln!(out, "AscendC::Adds({dst}, {x}, 0.0f, cn);");
        out.block("", |c| {
            let _ = writeln!(c, "const int64_t keep = af_max(0, af_min(cn, {} + ({}) + 1 - ({} + c0)));", self.row_i, self.causal_shift, self.col0);
            c.line("const int64_t al = af_min(cn, (keep + 7) / 8 * 8);");
            let _ = writeln!(
                c,
                "for (int64_t j = keep; j < al; ++j) {dst}.SetValue((uint32_t)j, AF_NEG_INF);"
            );
            let _ = writeln!(c, "if (al < cn) AscendC::Duplicate({dst}[(uint32_t)al], AF_NEG_INF, (int32_t)(cn - al));");
        });
    }

    /// CopyOut of the full-width outputs loop `p` computes, cast to their GM dtype.
    fn copy_out(
        &self,
        ub: &mut Ub,
        ph: &Phases,
        p: usize,
        slots: &BTreeMap<NodeId, String>,
        out: &mut Code,
    ) {
        for (id, gm, off, d) in &self.outs {
            if ph.phase.get(id) != Some(&p) {
                continue;
            }
            let d = *d;
            let ty = ascend_type(d);
            let q = ub.queue(format!("{}o{}", self.tag, id.0), d, false);
            let v = materialise(out, &self.value_of(*id, slots), "ta", "cn");
            out.block_noted("", &format!("CopyOut {}", self.g.node(*id).name), |c| {
                let _ = writeln!(c, "AscendC::LocalTensor<{ty}> y = {q}.AllocTensor<{ty}>();");
                if d.is_compute() {
                    let _ = writeln!(c, "AscendC::Adds(y, {v}, 0.0f, cn);");
                } else {
                    let _ = writeln!(
                        c,
                        "AscendC::Cast<{ty}, float>(y, {v}, AscendC::RoundMode::CAST_RINT, cn);"
                    );
                }
                enque_store(c, &q, "y", ty, &format!("{gm}[{off} + c0]"));
            });
        }
    }

    /// Row values that are outputs (a reduction's result, a statistic): one scalar store per
    /// row, written back from the data cache.
    fn store_row_values(&self, ph: &Phases, out: &mut Code) {
        for (id, gm, off, d) in &self.outs {
            if ph.phase.contains_key(id) {
                continue;
            }
            let v = self.row_value(*id);
            let ty = ascend_type(*d);
            let conv = if d.is_compute() { v } else { format!("static_cast<{ty}>({v})") };
            let _ = writeln!(out, "{gm}.SetValue({off}, {conv}); /* {} */", self.g.node(*id).name);
            let _ = writeln!(out, "AscendC::DataCacheCleanAndInvalid<{ty}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({gm}[{off}]);");
        }
    }
}

/// Per-kernel generation state.
struct K<'g> {
    em: Emitter<'g>,
    /// Module table index of each kernel-local buffer.
    table: Vec<usize>,
    ub: Ub,
    /// Kernel-scope code before the UB buffers: shapes, and any Matmul objects (their
    /// REGIST_MATMUL_OBJ initialises the pipe in split mode, so it comes first).
    setup: Code,
    /// The rest of the kernel, after the UB buffers (declared once this is written and the
    /// queues and slots it uses are known).
    body: Code,
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
fn row_offsets(em: &Emitter, sp: &Space, row: &str, out: &mut Code) {
    let mut pro = Code::new();
    em.row_prologue(sp, row, &mut pro);
    // row_prologue names them acN_row; rename per space so several spaces can coexist.
    let mut s = pro.finish();
    for a in sp.accesses.values() {
        s = s.replace(
            &format!("const int64_t ac{a}_row ="),
            &format!("const int64_t {}_row{a} =", sp.tag),
        );
    }
    let _ = out.write_str(&s);
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

/// An iteration space of `shape` with no access declared yet.
fn space(tag: &'static str, shape: Shape) -> Space {
    Space { tag, shape, accesses: BTreeMap::new() }
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
    let _ = writeln!(
        k.setup,
        "const int64_t R = {}, N = {};",
        k.em.dim(&numel(&space[..r - 1])),
        k.em.dim(&space[r - 1])
    );
    k.body.open("for (int64_t r = aiv; r < R; r += naiv)");
    row_offsets(&k.em, &sp, "r", &mut k.body);
    job.emit(&mut k.ub, &mut k.body);
    k.body.close();
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
        k.setup,
        "const int64_t R = {}, N = {};",
        k.em.dim(&numel(&shape[..rank - 1])),
        k.em.dim(&shape[rank - 1])
    );
    let q = k.ub.queue("cq".into(), n.dtype, true);
    let c = &mut k.body;
    c.open("for (int64_t r = aiv; r < R; r += naiv)");
    row_offsets(&k.em, &sp, "r", c);
    let mut start = DimExpr::constant(0);
    for (i, s) in &srcs {
        let end = start.add(&g.node(*i).shape[axis]);
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
        let head = format!("if ({cond}) for (int64_t c0 = {c_lo}; c0 < {c_hi}; c0 += CH)");
        c.block_noted(&head, &format!("from {}", g.node(*i).name), |c| {
            let _ = writeln!(c, "const int32_t cn = (int32_t)af_min(CH, ({c_hi}) - c0);");
            let _ = writeln!(c, "AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
            match s {
                Src::Row { gm, off, .. } => {
                    c.line(pad_in("x", &format!("{gm}[{off} {fix} + c0]"), ty));
                }
                Src::Scalar { gm, off, .. } => {
                    let _ = writeln!(c, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix}));");
                }
                Src::Gather { gm, off, stride, .. } => {
                    let _ = writeln!(c, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix} + (c0 + j) * ({stride})));");
                }
            }
            let _ = writeln!(c, "{q}.EnQue(x);");
            let _ = writeln!(c, "x = {q}.DeQue<{ty}>();");
            c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the copy out reads what MTE2 / the scalar unit wrote */");
            c.line(pad_out(&format!("{ob}[r * N + c0]"), "x", ty));
            let _ = writeln!(c, "{q}.FreeTensor(x);");
        });
        start = end;
    }
    c.close();
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}

/// How the Matmul API addresses an operand of `space` (`[batch.., rows, cols]`): `Some((trans,
/// ld))` when one of the last two strides is 1 (ld = the other), `None` otherwise.
fn mm_layout(em: &Emitter, sp: &Space, v: NodeId, cube: DType) -> Option<(bool, String)> {
    let a = sp.accesses[&v];
    let r = sp.shape.len();
    let view = resolve(em.g, v);
    let strides = crate::layout::space_strides(&view, &em.g.node(v).shape, r);
    if em.g.node(v).dtype != cube {
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

/// How the Matmul API reads an operand: `trans` and leading dimension `ld` as in `mm_layout`,
/// from the operand's own buffer or (`staged`) from the contiguous f32 copy the AIVs wrote to
/// the user workspace.
struct Operand {
    /// The operand and the space it is read in (its access declared).
    v: NodeId,
    sp: Space,
    trans: bool,
    ld: String,
    staged: bool,
    /// The element type the cube reads it in (its own, or its staged copy's).
    ty: DType,
}

/// The element type a Matmul object reads A and B in: their own when both are the same
/// (half and bfloat16_t products accumulate in f32 in L0C, which is how the cube computes:
/// the devkit's `matmul` samples take half A / B into a float C), else f32, the operands
/// staged as f32 copies.
fn cube_type(g: &Graph, a: NodeId, b: NodeId) -> DType {
    let (da, db) = (g.node(a).dtype, g.node(b).dtype);
    if da == db {
        da
    } else {
        DType::F32
    }
}

/// A `matmul::MatmulType` of a GM matrix of `ty` in ND format (`trans` for A and B; C is a
/// float matrix, `None`).
fn gm_matrix(trans: Option<bool>, ty: DType) -> String {
    let t = ascend_type(ty);
    match trans {
        Some(tr) => {
            format!("matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, {t}, {tr}>")
        }
        None => format!("matmul::MatmulType<AscendC::TPosition::GM, CubeFormat::ND, {t}>"),
    }
}

/// The Matmul object `name` of an A (`ta`) by B (`tb`) product of `ty` elements into a GM
/// float C.
fn matmul_object(name: &str, ta: bool, tb: bool, ty: DType) -> String {
    format!(
        "matmul::Matmul<{}, {}, {}> {name};",
        gm_matrix(Some(ta), ty),
        gm_matrix(Some(tb), ty),
        gm_matrix(None, DType::F32)
    )
}

/// A staged operand `name`: `elems` elements of `ty` at the current end of the staged part
/// of the user workspace (counted in floats; a 16-bit copy takes half as many, rounded up).
fn stage_decl(c: &mut Code, name: &str, ty: DType, elems: &str) {
    let t = ascend_type(ty);
    let _ = writeln!(
        c,
        "AscendC::GlobalTensor<{t}> {name}; {name}.SetGlobalBuffer((__gm__ {t} *)(uws + stage), {elems});"
    );
}

/// Move the staged end past `elems` elements of `ty` (floats of the user workspace).
fn stage_advance(c: &mut Code, ty: DType, elems: &str) {
    if ty.size() == 4 {
        let _ = writeln!(c, "stage += {elems};");
    } else {
        let _ = writeln!(c, "stage += (({elems}) + 1) / 2;");
    }
}

/// The user workspace (after the Matmul API's system workspace) and the running size of what
/// is staged at its start.
fn user_workspace(c: &mut Code) {
    c.line("__gm__ float *uws = (__gm__ float *)AscendC::GetUserWorkspace(workspace);");
    c.line("int64_t stage = 0; /* floats of staged operands at the start of the user workspace */");
}

/// The barrier after staging operands.
fn sync_staged(c: &mut Code) {
    c.line(
        "AscendC::SyncAll(); /* every AIV's staged rows are in GM before any tile reads them */",
    );
}

/// The parts of a matmul group: `A [batch.., M, K]` by `B [batch.., K, N]`, the prologue
/// (the members A depends on) and the epilogue (the members after the product).
struct MatmulParts {
    anchor: NodeId,
    a_in: NodeId,
    b_in: NodeId,
    out_shape: Shape,
    batch: Shape,
    k_dim: DimExpr,
    pro_nodes: Vec<NodeId>,
    epi_nodes: Vec<NodeId>,
}

impl MatmulParts {
    fn new(g: &Graph, grp: &Group) -> MatmulParts {
        let anchor = grp.anchor.expect("matmul group has an anchor");
        let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
        let out_shape = g.node(anchor).shape.clone();
        let r = out_shape.len();
        let (a_in, b_in) = (g.node(anchor).inputs[0], g.node(anchor).inputs[1]);
        let k_dim = g.node(a_in).shape.last().unwrap().clone();
        let batch: Shape = out_shape[..r - 2].to_vec();
        let prologue = crate::group::prologue_of(g, anchor, |i| members.contains(i));
        let pro_nodes: Vec<NodeId> =
            grp.nodes.iter().copied().filter(|m| prologue.contains(m)).collect();
        let epi_nodes: Vec<NodeId> =
            grp.nodes.iter().copied().filter(|m| *m != anchor && !prologue.contains(m)).collect();
        MatmulParts { anchor, a_in, b_in, out_shape, batch, k_dim, pro_nodes, epi_nodes }
    }
    /// `[batch.., x, y]`.
    fn with(&self, x: DimExpr, y: DimExpr) -> Shape {
        let mut s = self.batch.clone();
        s.push(x);
        s.push(y);
        s
    }
    fn m(&self) -> DimExpr {
        self.out_shape[self.out_shape.len() - 2].clone()
    }
    fn n(&self) -> DimExpr {
        self.out_shape[self.out_shape.len() - 1].clone()
    }
}

/// Returns the work, whether A and B are staged in the user workspace, and the element type
/// the cube reads them in.
fn gen_matmul(k: &mut K, grp: &Group) -> (Work, bool, bool, DType) {
    let mp = MatmulParts::new(k.em.g, grp);
    let em = &k.em;
    let _ = writeln!(
        k.setup,
        "const int64_t BATCH = {}, M = {}, N = {}, K = {};",
        em.dim(&numel(&mp.batch)),
        em.dim(&mp.m()),
        em.dim(&mp.n()),
        em.dim(&mp.k_dim)
    );
    k.setup.line("const int64_t MC = t.mc, NC = t.nc, mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;");
    user_workspace(&mut k.setup);
    let cube = cube_type(k.em.g, mp.a_in, mp.b_in);
    let a = matmul_operand_a(k, &mp, cube);
    let b = matmul_operand_b(k, &mp, cube);
    let (epi, spo) = matmul_epilogue(k, grp, &mp);
    let c = &mut k.setup;
    c.line("AscendC::tiling::TCubeTiling ct;");
    c.line("af_cube_tiling(t, 0, ct);");
    c.line(matmul_object("mm", a.trans, b.trans, cube));
    c.line("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &ct); /* the AIC serves the AIVs' calls, then returns */");
    if a.staged || b.staged {
        sync_staged(&mut k.body);
    }
    matmul_tiles(k, &a, &b, &epi, &spo);
    let work = Work::MatMul { batch: numel(&mp.batch), m: mp.m(), n: mp.n(), k: mp.k_dim };
    (work, a.staged, b.staged, cube)
}

/// Operand A: read in place when the Matmul API can address it, else staged by the AIVs as
/// contiguous rows `wa` of the cube's element type (the norm prologue applied once per row,
/// or the operand copied).
fn matmul_operand_a(k: &mut K, mp: &MatmulParts, cube: DType) -> Operand {
    let g = k.em.g;
    let a_in = mp.a_in;
    let mut spa = space("a", mp.with(mp.m(), mp.k_dim.clone()));
    if mp.pro_nodes.is_empty() {
        k.em.access(&mut spa, a_in);
        if let Some((trans, ld)) = mm_layout(&k.em, &spa, a_in, cube) {
            return Operand { v: a_in, sp: spa, trans, ld, staged: false, ty: cube };
        }
    }
    // Stage A = the prologue's output (or the operand itself) as contiguous f32 rows.
    let mut srcs = BTreeMap::new();
    let pro_members: BTreeSet<NodeId> = mp.pro_nodes.iter().copied().collect();
    for i in ext_inputs(g, &mp.pro_nodes, &pro_members) {
        let s = k.src(&mut spa, i, "0");
        srcs.insert(i, s);
    }
    if mp.pro_nodes.is_empty() {
        let s = k.src(&mut spa, a_in, "0");
        srcs.insert(a_in, s);
    }
    // The staged value: the prologue's last member (= a_in) or the operand through a copy.
    let job = Job {
        g,
        space: spa.shape.clone(),
        nodes: mp.pro_nodes.clone(),
        srcs,
        outs: vec![(a_in, "wa".into(), "ra * K".into(), cube)],
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: "K".into(),
        tag: "a".into(),
    };
    let c = &mut k.body;
    let what = if mp.pro_nodes.is_empty() {
        "a view the Matmul API cannot address"
    } else {
        "the norm prologue applied once per row"
    };
    let _ = writeln!(
        c,
        "/* stage A ({what}) as contiguous {} rows in the user workspace */",
        ascend_type(cube)
    );
    stage_decl(c, "wa", cube, "BATCH * M * K");
    c.open("for (int64_t ra = aiv; ra < BATCH * M; ra += naiv)");
    row_offsets(&k.em, &spa, "ra", c);
    if mp.pro_nodes.is_empty() {
        copy_row(&mut k.ub, &job, a_in, c);
    } else {
        job.emit(&mut k.ub, c);
    }
    c.close();
    stage_advance(c, cube, "BATCH * M * K");
    Operand { v: a_in, sp: spa, trans: false, ld: "K".into(), staged: true, ty: cube }
}

/// Operand B: read in place when the Matmul API can address it, else copied by the AIVs as
/// contiguous rows `wb` of the cube's element type.
fn matmul_operand_b(k: &mut K, mp: &MatmulParts, cube: DType) -> Operand {
    let b_in = mp.b_in;
    let mut spb = space("b", mp.with(mp.k_dim.clone(), mp.n()));
    k.em.access(&mut spb, b_in);
    if let Some((trans, ld)) = mm_layout(&k.em, &spb, b_in, cube) {
        return Operand { v: b_in, sp: spb, trans, ld, staged: false, ty: cube };
    }
    let mut srcs = BTreeMap::new();
    let s = k.src(&mut spb, b_in, "0");
    srcs.insert(b_in, s);
    let job = Job {
        g: k.em.g,
        space: spb.shape.clone(),
        nodes: vec![],
        srcs,
        outs: vec![(b_in, "wb".into(), "rb * N".into(), cube)],
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: "N".into(),
        tag: "b".into(),
    };
    let c = &mut k.body;
    let _ = writeln!(
        c,
        "/* stage B (a view the Matmul API cannot address) as contiguous {} rows */",
        ascend_type(cube)
    );
    stage_decl(c, "wb", cube, "BATCH * K * N");
    c.open("for (int64_t rb = aiv; rb < BATCH * K; rb += naiv)");
    row_offsets(&k.em, &spb, "rb", c);
    copy_row(&mut k.ub, &job, b_in, c);
    c.close();
    stage_advance(c, cube, "BATCH * K * N");
    Operand { v: b_in, sp: spb, trans: false, ld: "N".into(), staged: true, ty: cube }
}

/// The epilogue job over the output rows of one tile, and the output space it reads in.
fn matmul_epilogue<'g>(k: &mut K<'g>, grp: &Group, mp: &MatmulParts) -> (Job<'g>, Space) {
    let g = k.em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let mut spo = space("o", mp.out_shape.clone());
    let mut srcs = BTreeMap::new();
    for i in ext_inputs(g, &mp.epi_nodes, &members) {
        if i == mp.anchor {
            continue;
        }
        let s = k.src(&mut spo, i, "n0");
        srcs.insert(i, s);
    }
    srcs.insert(mp.anchor, Src::Row { gm: "wc".into(), off: "ti * NC".into(), d: DType::F32 });
    let outs: Vec<(NodeId, String, String, DType)> = grp
        .outputs
        .iter()
        .map(|o| (*o, k.gm(k.em.buf[o]), "orow * N + n0".to_string(), g.node(*o).dtype))
        .collect();
    let mut nodes = mp.epi_nodes.clone();
    // The anchor is a phase-0 source; when it is itself an output it is copied out.
    if grp.outputs.contains(&mp.anchor) {
        nodes.retain(|n| *n != mp.anchor);
    }
    let job = Job {
        g,
        space: mp.out_shape.clone(),
        nodes,
        srcs,
        outs,
        row_i: format!("o_i{}", mp.out_shape.len() - 2),
        causal_shift: causal_shift(&k.em, &mp.epi_nodes),
        col0: "n0".into(),
        ncols: "nlen".into(),
        tag: "o".into(),
    };
    (job, spo)
}

/// This AIV's output tiles: the cube writes each `mlen x nlen` tile into the AIV's slice `wc`
/// of the user workspace, then the AIV applies the epilogue row by row.
fn matmul_tiles(k: &mut K, a: &Operand, b: &Operand, epi: &Job, spo: &Space) {
    let g = k.em.g;
    let c = &mut k.body;
    c.line("AscendC::GlobalTensor<float> wc; wc.SetGlobalBuffer(uws + stage + aiv * MC * NC, MC * NC); /* this AIV's C tile */");
    c.open("for (int64_t u = aiv; u < units; u += naiv)");
    // Consecutive units run at once on the cores: in column-panel order they share a B panel
    // (B leaves memory once, A is re-read from L2), in row-panel order an A panel.
    c.line("const int64_t bi = u / (mt * nt), tile = u % (mt * nt);");
    c.line("const int64_t mi = t.n_major ? tile % mt : tile / nt, ni = t.n_major ? tile / mt : tile % nt;");
    c.line("const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min(MC, M - m0), nlen = af_min(NC, N - n0);");
    let (ta, tb) = (ascend_type(a.ty), ascend_type(b.ty));
    if a.staged {
        let _ = writeln!(c, "AscendC::GlobalTensor<{ta}> ga = wa[(bi * M + m0) * K];");
    } else {
        row_offsets(&k.em, &a.sp, "bi * M + m0", c);
        let ac = a.sp.accesses[&a.v];
        let gb = format!("g{}", k.em.buf[&resolve(g, a.v).base]);
        let _ = writeln!(c, "AscendC::GlobalTensor<{ta}> ga = {gb}[a_row{ac}];");
    }
    if b.staged {
        let _ = writeln!(c, "AscendC::GlobalTensor<{tb}> gbm = wb[bi * K * N + n0];");
    } else {
        row_offsets(&k.em, &b.sp, "bi * K", c);
        let ac = b.sp.accesses[&b.v];
        let gb = format!("g{}", k.em.buf[&resolve(g, b.v).base]);
        let col = if b.trans { format!("n0 * ({})", b.ld) } else { "n0".into() };
        let _ = writeln!(c, "AscendC::GlobalTensor<{tb}> gbm = {gb}[b_row{ac} + {col}];");
    }
    // SetOrgShape comes before SetTensorA/B and SetSingleShape (SetOrgShape.md, constraints);
    // its fifth argument is C's row stride (the tile is NC wide, B's rows N).
    let org = org_shape("M", "N", "K", (a.trans, &a.ld), (b.trans, &b.ld), "NC");
    let _ = writeln!(c, "mm.SetOrgShape({org});");
    let _ = writeln!(c, "mm.SetTensorA(ga, {});", a.trans);
    let _ = writeln!(c, "mm.SetTensorB(gbm, {});", b.trans);
    c.line("mm.SetSingleShape((int)mlen, (int)nlen, (int)K);");
    c.line("mm.IterateAll(wc);");
    c.block_noted("for (int64_t ti = 0; ti < mlen; ++ti)", "epilogue, row by row", |c| {
        c.line("const int64_t orow = bi * M + m0 + ti;");
        row_offsets(&k.em, spo, "orow", c);
        epi.emit(&mut k.ub, c);
    });
    c.close();
    c.line("mm.End();");
}

/// How the Matmul API reads operand `v` of space `sp` (rows `rows` = the space's row count,
/// `ncols` columns): directly, or from an f32 copy `w<tag>` the AIVs stage in the user
/// workspace (the staging written here, advancing `stage`).
fn operand(k: &mut K, mut sp: Space, v: NodeId, rows: &str, ncols: &str, cube: DType) -> Operand {
    let g = k.em.g;
    k.em.access(&mut sp, v);
    if let Some((trans, ld)) = mm_layout(&k.em, &sp, v, cube) {
        return Operand { v, sp, trans, ld, staged: false, ty: cube };
    }
    let tag = sp.tag;
    let mut srcs = BTreeMap::new();
    let s = k.src(&mut sp, v, "0");
    srcs.insert(v, s);
    let job = Job {
        g,
        space: sp.shape.clone(),
        nodes: vec![],
        srcs,
        outs: vec![(v, format!("w{tag}"), format!("r{tag} * ({ncols})"), cube)],
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: ncols.into(),
        tag: tag.into(),
    };
    let what = if g.node(v).dtype == cube {
        "a view the Matmul API cannot address"
    } else {
        "converted to the type its product is computed in"
    };
    let c = &mut k.body;
    let _ = writeln!(
        c,
        "/* stage {} ({what}) as contiguous {} rows in the user workspace */",
        g.node(v).name,
        ascend_type(cube)
    );
    stage_decl(c, &format!("w{tag}"), cube, &format!("({rows}) * ({ncols})"));
    c.open(format!("for (int64_t r{tag} = aiv; r{tag} < {rows}; r{tag} += naiv)"));
    row_offsets(&k.em, &sp, &format!("r{tag}"), c);
    copy_row(&mut k.ub, &job, v, c);
    c.close();
    stage_advance(c, cube, &format!("({rows}) * ({ncols})"));
    Operand { v, sp, trans: false, ld: ncols.to_string(), staged: true, ty: cube }
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

/// The UB of the softmax over score and output rows: the in and out queues of a row streamed
/// through UB, a float slot, the output's queue and type, the output buffer and the offset of
/// query row `bi * SQ + q0 + i` in it.
struct FlashUb {
    fq: String,
    fo: String,
    ex: String,
    /// The queue P leaves UB through when O += P V is computed in a 16-bit type (P is
    /// written to its own tile `wp` in V's type, as the cube reads it).
    fp: Option<String>,
    oq: String,
    out_d: DType,
    ob: String,
    orow: String,
}

impl FlashUb {
    /// A row of `n` floats of a GM f32 tile (from `src`) streamed through UB in chunks:
    /// `body` sees the chunk as `x` and leaves what it computes in `y`, which `store`
    /// (queue, type, GM destination), if any, writes back. `body` is spliced as written,
    /// relative to the loop's `for` line: the bodies of the block max and of P sit one level
    /// into the loop, the rescale's at the `for`'s own level and the final store's two levels
    /// in (an indentation quirk of the output, kept).
    fn stream(
        &self,
        c: &mut Code,
        src: &str,
        n: &str,
        body: &Code,
        store: Option<(&str, &str, &str)>,
    ) {
        let fq = &self.fq;
        c.line(format!("for (int64_t c0 = 0; c0 < {n}; c0 += CH) {{"));
        c.indented(|c| {
            let _ = writeln!(c, "const int32_t cn = (int32_t)af_min(CH, {n} - c0);");
            aligned_group(
                c,
                &[
                    format!("AscendC::LocalTensor<float> x = {fq}.AllocTensor<float>();"),
                    pad_in("x", src, "float"),
                    format!("{fq}.EnQue(x);"),
                ],
            );
            let _ = writeln!(c, "AscendC::LocalTensor<float> x = {fq}.DeQue<float>();");
        });
        c.append(body);
        c.indented(|c| {
            if let Some((q, ty, dst)) = store {
                enque_store(c, q, "y", ty, dst);
            }
            let _ = writeln!(c, "{fq}.FreeTensor(x);");
        });
        c.line("}");
    }
}

/// The shapes of a flash group: scores `[batch.., SQ, SK]` = Q `[.., SQ, D]` by K^T
/// `[.., D, SK]`, output P V `[.., SQ, DV]`.
struct FlashShape {
    batch: Shape,
    scores: Shape,
    sq: DimExpr,
    sk: DimExpr,
    d: DimExpr,
    dv: DimExpr,
}

impl FlashShape {
    /// `[batch.., a, b]`.
    fn with(&self, a: DimExpr, b: DimExpr) -> Shape {
        let mut s = self.batch.clone();
        s.extend([a, b]);
        s
    }
}

/// What the loops of a flash kernel read: the three operands, the chain on the score tile
/// (one row's code over the space of the scores, with its op names), whether it holds a
/// causal mask, and the softmax's UB.
struct Flash {
    q: Operand,
    k: Operand,
    v: Operand,
    chain: Option<(Code, String)>,
    sps: Space,
    causal: bool,
    ub: FlashUb,
}

/// Flash attention: per AIV a block of `BR` queries of one batch entry, key blocks of `BC`.
/// The cube computes S = Q K^T into the AIV's score tile; the AIV applies the chain (scale,
/// mask) in place, takes the block's row maxima, writes P = exp(S - max) over the tile and
/// keeps the running max and sum per row (online softmax) in UB; the cube then adds P V into
/// the AIV's output accumulator in GM (atomic add; the first block overwrites it), which the
/// AIV has rescaled by exp(old max - new max). No S x S buffer: the tiles are BR x BC.
/// Q K^T is computed in Q's and K's type when they share one (half / bfloat16_t in, f32 in
/// L0C), P V in V's: P is rounded to it into its own tile. Operands the Matmul API cannot
/// address (strided views, or a type other than the product's) are staged first.
fn gen_flash(k: &mut K, grp: &Group) -> (Work, bool, bool, DType, DType) {
    let g = k.em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let f = crate::group::flash_parts(g, &members).expect("planner formed a flash group");
    let (q, kt, v) = (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let ss = g.node(f.scores).shape.clone();
    let r = ss.len();
    let fs = FlashShape {
        batch: ss[..r - 2].to_vec(),
        sq: ss[r - 2].clone(),
        sk: ss[r - 1].clone(),
        d: g.node(q).shape.last().unwrap().clone(),
        dv: g.node(f.pv).shape.last().unwrap().clone(),
        scores: ss,
    };
    let em = &k.em;
    let _ = writeln!(
        k.setup,
        "const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&fs.batch)),
        em.dim(&fs.sq),
        em.dim(&fs.sk),
        em.dim(&fs.d),
        em.dim(&fs.dv)
    );
    k.setup
        .line("const int64_t BR = t.br, BC = t.bc, qt = (SQ + BR - 1) / BR, units = BATCH * qt;");
    user_workspace(&mut k.setup);
    // The running max and sum per query row, in UB beside the queues and slots; declared
    // first in the body, before the operands' staging.
    k.ub.extra_fixed += 2 * 64 * 4 + 64;
    k.body.line("AscendC::TBuf<AscendC::TPosition::VECCALC> statb;");
    k.body.line("pipe.InitBuffer(statb, 2 * 64 * sizeof(float));");
    k.body.line("AscendC::LocalTensor<float> mr = statb.Get<float>(), lr = mr[64]; /* running max and sum per query row */");
    // S = Q K^T in Q's and K's own type; O += P V in V's (P rounded to it, as the cube takes
    // it: hicann/ops-transformer's flash-attention kernels cast P to the input type for the
    // second product).
    let qk_t = cube_type(g, q, kt);
    let pv_t = g.node(v).dtype;
    let sp_q = space("q", fs.with(fs.sq.clone(), fs.d.clone()));
    let oq = operand(k, sp_q, q, "BATCH * SQ", "D", qk_t);
    let sp_k = space("k", fs.with(fs.d.clone(), fs.sk.clone()));
    let ok = operand(k, sp_k, kt, "BATCH * D", "SK", qk_t);
    let sp_v = space("v", fs.with(fs.sk.clone(), fs.dv.clone()));
    let ov = operand(k, sp_v, v, "BATCH * SK", "DV", pv_t);
    let (stage_a, stage_b) = (oq.staged, ok.staged || ov.staged);
    let (chain, sps) = flash_chain(k, &f, &members, &fs);
    let fl = Flash {
        q: oq,
        k: ok,
        v: ov,
        chain,
        sps,
        causal: f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask),
        ub: flash_ub(k, g.node(f.pv).dtype, f.pv, &members, pv_t),
    };
    flash_objects(&mut k.setup, &fl);
    if stage_a || stage_b {
        sync_staged(&mut k.body);
    }
    flash_blocks(k, &fl, &fs);
    let FlashShape { batch, sq, sk, d, dv, .. } = fs;
    (Work::Flash { batch: numel(&batch), sq, sk, d, dv }, stage_a, stage_b, qk_t, pv_t)
}

/// The chain on the score tile, in place: a rows job over the columns `[k0, k0 + bc)` of
/// one score row (`None` without a chain), and the space of the scores it reads in.
fn flash_chain(
    k: &mut K,
    f: &crate::group::FlashParts,
    members: &BTreeSet<NodeId>,
    fs: &FlashShape,
) -> (Option<(Code, String)>, Space) {
    let g = k.em.g;
    let mut sps = space("s", fs.scores.clone());
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
    if f.chain.is_empty() {
        return (None, sps);
    }
    let job = Job {
        g,
        space: fs.scores.clone(),
        nodes: f.chain.clone(),
        srcs,
        outs: vec![(f.scores, "ws".into(), "i * BC".into(), DType::F32)],
        row_i: format!("s_i{}", fs.scores.len() - 2),
        causal_shift: causal_shift(&k.em, &f.chain),
        col0: "k0".into(),
        ncols: "bc".into(),
        tag: "s".into(),
    };
    let mut code = Code::new();
    job.emit(&mut k.ub, &mut code);
    let ops = f.chain.iter().map(|m| g.node(*m).op.name()).collect::<Vec<_>>().join(" ");
    (Some((code, ops)), sps)
}

/// The softmax's queues and slot, and the output `pv` (dtype `out_d`) it stores: in its own
/// buffer, or at its place in a layout store's copy.
fn flash_ub(
    k: &mut K,
    out_d: DType,
    pv: NodeId,
    members: &BTreeSet<NodeId>,
    pv_t: DType,
) -> FlashUb {
    let rs = RowStore::new(&k.em, pv, members);
    FlashUb {
        fq: k.ub.queue("fq".into(), DType::F32, true),
        fo: k.ub.queue("fo".into(), DType::F32, false),
        ex: k.ub.slot(),
        fp: (!pv_t.is_compute()).then(|| k.ub.queue("fp".into(), pv_t, false)),
        oq: k.ub.queue("fy".into(), out_d, false),
        out_d,
        ob: k.gm(k.em.buf[&rs.buf]),
        orow: rs.offset("bi * SQ + q0 + i", "DV"),
    }
}

/// The two Matmul objects, S = Q K^T and O += P V, and their tilings, registered with the AIC.
fn flash_objects(c: &mut Code, fl: &Flash) {
    c.line("AscendC::tiling::TCubeTiling ct0, ct1;");
    c.line("af_cube_tiling(t, 0, ct0);");
    c.line("af_cube_tiling(t, 1, ct1);");
    let (mqk, mpv) = (
        matmul_object("mqk", fl.q.trans, fl.k.trans, fl.q.ty),
        matmul_object("mpv", false, fl.v.trans, fl.v.ty),
    );
    let _ = writeln!(c, "{mqk} /* S = Q K^T */");
    let _ = writeln!(c, "{mpv} /* O += P V */");
    c.line("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mqk, &ct0, mpv, &ct1); /* the AIC serves both, then returns */");
}

/// This AIV's query blocks: per block, the key blocks (scores, softmax, P V), then the
/// normalised rows stored.
fn flash_blocks(k: &mut K, fl: &Flash, fs: &FlashShape) {
    let c = &mut k.body;
    let vt = ascend_type(fl.v.ty);
    if fl.ub.fp.is_some() {
        c.line("const int64_t PER = BR * BC + BR * DV + (BR * BC + 1) / 2; /* floats per AIV: S, O, P */");
        c.line("AscendC::GlobalTensor<float> ws, wo; /* this AIV's score tile and output accumulator */");
        let _ = writeln!(
            c,
            "AscendC::GlobalTensor<{vt}> wp; /* P in V's type, as the cube reads it */"
        );
        let _ = writeln!(
            c,
            "wp.SetGlobalBuffer((__gm__ {vt} *)(uws + stage + aiv * PER + BR * BC + BR * DV), BR * BC);"
        );
    } else {
        c.line(
            "const int64_t PER = BR * BC + BR * DV; /* floats per AIV: S (then P in place), O */",
        );
        c.line("AscendC::GlobalTensor<float> ws, wo; /* this AIV's score tile (S, then P) and output accumulator */");
    }
    c.line("ws.SetGlobalBuffer(uws + stage + aiv * PER, BR * BC);");
    c.line("wo.SetGlobalBuffer(uws + stage + aiv * PER + BR * BC, BR * DV);");
    c.open("for (int64_t u = aiv; u < units; u += naiv)");
    c.line("const int64_t bi = u / qt, q0 = (u % qt) * BR, br = af_min(BR, SQ - q0);");
    c.line("for (int64_t i = 0; i < br; ++i) { mr.SetValue((uint32_t)i, AF_NEG_INF); lr.SetValue((uint32_t)i, 0.0f); }");
    c.open("for (int64_t k0 = 0; k0 < SK; k0 += BC)");
    if fl.causal {
        let _ = writeln!(
            c,
            "if (k0 > q0 + br - 1 + ({})) break; /* every later key is masked for this block */",
            k.em.dim(&fs.sk.sub(&fs.sq))
        );
    }
    c.line("const int64_t bc = af_min(BC, SK - k0);");
    flash_key_block(c, &k.em, fl);
    c.close();
    flash_store(c, &fl.ub);
    c.close();
}

/// `GlobalTensor<float> <name>` at row `row`, column `col` of operand `op` (its staged copy or
/// its buffer).
fn operand_at(c: &mut Code, em: &Emitter, op: &Operand, row: &str, col: &str, name: &str) {
    let tag = op.sp.tag;
    let ld = &op.ld;
    let ty = ascend_type(op.ty);
    if op.staged {
        let _ =
            writeln!(c, "AscendC::GlobalTensor<{ty}> {name} = w{tag}[({row}) * ({ld}) + {col}];");
    } else {
        row_offsets(em, &op.sp, row, c);
        let a = op.sp.accesses[&op.v];
        let gb = format!("g{}", em.buf[&resolve(em.g, op.v).base]);
        let c2 = if op.trans { format!("({col}) * ({ld})") } else { col.to_string() };
        let _ = writeln!(c, "AscendC::GlobalTensor<{ty}> {name} = {gb}[{tag}_row{a} + {c2}];");
    }
}

/// One key block: S = Q K^T on the cube, the softmax update row by row on the AIV, then
/// O += P V on the cube.
fn flash_key_block(c: &mut Code, em: &Emitter, fl: &Flash) {
    let (q, k, v) = (&fl.q, &fl.k, &fl.v);
    operand_at(c, em, q, "bi * SQ + q0", "0", "gq");
    operand_at(c, em, k, "bi * D", "k0", "gk");
    operand_at(c, em, v, "bi * SK + k0", "0", "gv");
    let org = org_shape("SQ", "SK", "D", (q.trans, &q.ld), (k.trans, &k.ld), "BC");
    let _ = writeln!(c, "mqk.SetOrgShape({org});");
    let _ = writeln!(c, "mqk.SetTensorA(gq, {});", q.trans);
    let _ = writeln!(c, "mqk.SetTensorB(gk, {});", k.trans);
    c.line("mqk.SetSingleShape((int)br, (int)bc, (int)D);");
    // The two objects share the cube's L1 / L0C start address: each releases them with End()
    // before the other runs (asc-devkit `docs/zh/api/SIMD-API/高阶API/矩阵计算/Matmul-Kernel侧接口/
    // End.md`; hicann/ops-transformer's flash_attention_score kernels end bmm1 and bmm2 so).
    c.line("mqk.IterateAll(ws);");
    c.line("mqk.End();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
    c.open("for (int64_t i = 0; i < br; ++i)");
    flash_softmax_row(c, em, fl);
    c.close();
    c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* P and the rescaled O are in GM before the cube reads them */");
    let org = org_shape("BR", "DV", "BC", (false, "BC"), (v.trans, &v.ld), "DV");
    let _ = writeln!(c, "mpv.SetOrgShape({org});");
    let p = if fl.ub.fp.is_some() { "wp" } else { "ws" };
    let _ = writeln!(c, "mpv.SetTensorA({p}, false);");
    let _ = writeln!(c, "mpv.SetTensorB(gv, {});", v.trans);
    c.line("mpv.SetSingleShape((int)br, (int)DV, (int)bc);");
    c.line("mpv.IterateAll(wo, k0 > 0 ? 1 : 0); /* the first block writes, later ones add */");
    c.line("mpv.End();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
}

/// Score row `i` of the key block: the chain in place, the block max, P = exp(S - max) with
/// its row sum, the running max and sum updated, and the accumulated output rescaled.
fn flash_softmax_row(c: &mut Code, em: &Emitter, fl: &Flash) {
    let (fo, ex) = (fl.ub.fo.as_str(), &fl.ub.ex);
    if let Some((chain, ops)) = &fl.chain {
        let _ = writeln!(c, "/* the chain on the scores: {ops} */");
        row_offsets(em, &fl.sps, "bi * SQ + q0 + i", c);
        c.append(chain);
        c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the block max reads what the chain wrote */");
    }
    c.line("float bm = AF_NEG_INF;");
    let mut max_body = Code::at_depth(1);
    max_body.line("AscendC::ReduceMax<float>(rd, x, rt, cn);");
    max_body.line("{ const float v = rd.GetValue(0); bm = v > bm ? v : bm; }");
    fl.ub.stream(c, "ws[i * BC + c0]", "bc", &max_body, None);
    c.line("const float mo = mr.GetValue((uint32_t)i), mx = mo > bm ? mo : bm;");
    c.line("const float mxe = mx == AF_NEG_INF ? 0.0f : mx; /* every key so far masked: P = 0 */");
    c.line("const float corr = mo == AF_NEG_INF ? 0.0f : af_s_exp(sc, mo - mx);");
    c.line("float ps = 0.0f;");
    let mut exp_body = Code::at_depth(1);
    let _ = writeln!(exp_body, "AscendC::Adds({ex}, x, -mxe, cn);");
    match &fl.ub.fp {
        None => {
            let _ =
                writeln!(exp_body, "AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();");
            let _ = writeln!(exp_body, "AscendC::Exp(y, {ex}, cn);");
            exp_body.line("AscendC::ReduceSum<float>(rd, y, rt, cn);");
            exp_body.line("ps += rd.GetValue(0);");
            let p_row = "ws[i * BC + c0]";
            fl.ub.stream(c, "ws[i * BC + c0]", "bc", &exp_body, Some((fo, "float", p_row)));
        }
        Some(fp) => {
            // The sum is of P in f32; P goes to the cube in V's type.
            let vt = ascend_type(fl.v.ty);
            let _ = writeln!(exp_body, "AscendC::LocalTensor<{vt}> y = {fp}.AllocTensor<{vt}>();");
            let _ = writeln!(exp_body, "AscendC::Exp({ex}, {ex}, cn);");
            let _ = writeln!(exp_body, "AscendC::ReduceSum<float>(rd, {ex}, rt, cn);");
            exp_body.line("ps += rd.GetValue(0);");
            let _ = writeln!(
                exp_body,
                "AscendC::Cast<{vt}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);"
            );
            fl.ub.stream(c, "ws[i * BC + c0]", "bc", &exp_body, Some((fp, vt, "wp[i * BC + c0]")));
        }
    }
    c.line("lr.SetValue((uint32_t)i, lr.GetValue((uint32_t)i) * corr + ps);");
    c.line("mr.SetValue((uint32_t)i, mx);");
    c.block_noted("if (k0 > 0)", "rescale what was accumulated under the old max", |c| {
        let mut scale_body = Code::new();
        let _ = writeln!(scale_body, "AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();");
        scale_body.line("AscendC::Muls(y, x, corr, cn);");
        let o_row = "wo[i * DV + c0]";
        fl.ub.stream(c, o_row, "DV", &scale_body, Some((fo, "float", o_row)));
    });
}

/// The query block's output rows: divided by their softmax sums and stored in the output's
/// dtype.
fn flash_store(c: &mut Code, ub: &FlashUb) {
    let (oq, oty, ex) = (&ub.oq, ascend_type(ub.out_d), &ub.ex);
    c.block_noted("for (int64_t i = 0; i < br; ++i)", "normalise and store", |c| {
        c.line("const float l = lr.GetValue((uint32_t)i), inv = l > 0.0f ? 1.0f / l : 0.0f;");
        let mut fin_body = Code::at_depth(2);
        let _ = writeln!(fin_body, "AscendC::LocalTensor<{oty}> y = {oq}.AllocTensor<{oty}>();");
        if ub.out_d.is_compute() {
            fin_body.line("AscendC::Muls(y, x, inv, cn);");
        } else {
            let _ = writeln!(fin_body, "AscendC::Muls({ex}, x, inv, cn);");
            let _ = writeln!(
                fin_body,
                "AscendC::Cast<{oty}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);"
            );
        }
        // The final store goes to the output (its own queue and dtype).
        let dst = format!("{}[{} + c0]", ub.ob, ub.orow);
        ub.stream(c, "wo[i * DV + c0]", "DV", &fin_body, Some((oq, oty, &dst)));
    });
}

/// One row copied from its source to the job's single output (staging).
fn copy_row(ub: &mut Ub, job: &Job, v: NodeId, out: &mut Code) {
    let (_, gm_out, off_out, _) = &job.outs[0];
    let q = ub.queue(format!("{}c", job.tag), DType::F32, true);
    out.open(format!("for (int64_t c0 = 0; c0 < {}; c0 += CH)", job.ncols));
    let _ = writeln!(out, "const int32_t cn = (int32_t)af_min(CH, {} - c0);", job.ncols);
    let _ = writeln!(out, "AscendC::LocalTensor<float> x = {q}.AllocTensor<float>();");
    match &job.srcs[&v] {
        Src::Row { gm, off, d } | Src::Gather { gm, off, d, .. } | Src::Scalar { gm, off, d } => {
            // Staging copies go element by element through the scalar unit: they exist for
            // views the DMA cannot walk, and for f16/bf16 operands (converted here).
            let stride = match &job.srcs[&v] {
                Src::Row { .. } => "1".to_string(),
                Src::Scalar { .. } => "0".to_string(),
                Src::Gather { stride, .. } => stride.clone(),
            };
            let cv = if d.is_compute() {
                format!("{gm}.GetValue({off} + (c0 + j) * ({stride}))")
            } else {
                format!("static_cast<float>({gm}.GetValue({off} + (c0 + j) * ({stride})))")
            };
            let _ = writeln!(out, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {cv});");
        }
    }
    let dst = format!("{gm_out}[{off_out} + c0]");
    match job.outs[0].3 {
        d if d.is_compute() => enque_store(out, &q, "x", "float", &dst),
        d => {
            // A 16-bit staged copy (a view of a half / bfloat16_t operand the DMA cannot walk).
            let ty = ascend_type(d);
            let qh = ub.queue(format!("{}h", job.tag), d, false);
            let _ = writeln!(out, "AscendC::LocalTensor<{ty}> xh = {qh}.AllocTensor<{ty}>();");
            out.line(
                "AscendC::PipeBarrier<PIPE_ALL>(); /* the cast reads what the scalar unit wrote */",
            );
            let _ = writeln!(
                out,
                "AscendC::Cast<{ty}, float>(xh, x, AscendC::RoundMode::CAST_RINT, cn);"
            );
            let _ = writeln!(out, "{q}.FreeTensor(x);");
            enque_store(out, &qh, "xh", ty, &dst);
        }
    }
    out.close();
}

/// Generate the Ascend C file of one plan.
pub fn generate(
    g: &Graph,
    plan: &Plan,
    symbol: &str,
    header: &str,
) -> Result<AscendSource, String> {
    let mut code = Code::new();
    let _ = writeln!(code, "/* {header}");
    let _ = writeln!(
        code,
        " * Ascend C for Atlas A2 (dav-2201). Generated by autofusion-compiler {}. Do not edit. */",
        env!("CARGO_PKG_VERSION")
    );
    prelude(&mut code);
    cube_fill(&mut code);
    let table = module_table(plan);
    let mut kernels = Vec::new();
    let mut bodies = Vec::new();
    for (ki, grp) in plan.groups.iter().enumerate() {
        let (kernel, fname) = gen_kernel(&mut code, g, &table, symbol, ki, grp)?;
        bodies.push((fname, kernel.mix));
        kernels.push(kernel);
    }
    pipeline(&mut code, symbol, &bodies);
    let launch = launcher(&mut code, symbol, &bodies);
    let json = autofusion_ir::json::write(&AscendMeta {
        kernels: kernels.clone(),
        buffers: table.clone(),
        pipeline: plan.pipeline,
    });
    let entry = format!("{symbol}_ascend_json");
    let _ = writeln!(code, "static const char af_ascend_json[] = {};", c_string(&json));
    let _ = writeln!(code, "extern \"C\" const char *{entry}(void) {{ return af_ascend_json; }}");
    Ok(AscendSource {
        code: code.finish(),
        kernels,
        buffers: table,
        launch,
        entry,
        meta_json: json,
    })
}

/// Module buffers: every value a kernel reads or writes, in first-use order.
fn module_table(plan: &Plan) -> Vec<NodeId> {
    let mut table: Vec<NodeId> = Vec::new();
    for grp in &plan.groups {
        for v in grp.inputs.iter().chain(&grp.outputs) {
            if !table.contains(v) {
                table.push(*v);
            }
        }
    }
    table
}

/// What a kernel generator made besides code: the work DynamicTiling splits, whether the
/// kernel uses the cube (mix 1:2) and with how many Matmul objects, and which operands it
/// stages.
struct Built {
    work: Work,
    mix: bool,
    cube: u32,
    stage_a: bool,
    stage_b: bool,
    /// Per Matmul object, the bytes of the A / B elements the cube reads.
    cube_bytes: Vec<u32>,
}

/// The code of group `grp` written into `k` by the generator of its kind.
fn gen_group(k: &mut K, grp: &Group, name: &str) -> Result<Built, String> {
    let vector = |work| Built {
        work,
        mix: false,
        cube: 0,
        stage_a: false,
        stage_b: false,
        cube_bytes: vec![],
    };
    Ok(match grp.kind {
        GroupKind::Elementwise => vector(gen_rows(k, grp)),
        GroupKind::Concat => vector(gen_concat(k, grp)),
        GroupKind::MatMul => {
            let (work, stage_a, stage_b, ty) = gen_matmul(k, grp);
            let cube_bytes = vec![ty.size() as u32];
            Built { work, mix: true, cube: 1, stage_a, stage_b, cube_bytes }
        }
        GroupKind::FlashAttention => {
            let (work, stage_a, stage_b, qk, pv) = gen_flash(k, grp);
            let cube_bytes = vec![qk.size() as u32, pv.size() as u32];
            Built { work, mix: true, cube: 2, stage_a, stage_b, cube_bytes }
        }
        GroupKind::Horizontal => return Err(format!("{name}: horizontal matmul groups have no Ascend generator (plan without qkv_horizontal)")),
    })
}

/// Kernel `ki` (group `grp`): its comment, its body as a device function and its `__global__`
/// entry. Returns its metadata and its C name.
fn gen_kernel(
    code: &mut Code,
    g: &Graph,
    table: &[NodeId],
    symbol: &str,
    ki: usize,
    grp: &Group,
) -> Result<(AscendKernel, String), String> {
    let mut buf = BTreeMap::new();
    let mut buffers = Vec::new();
    for &v in grp.inputs.iter().chain(&grp.outputs) {
        buf.insert(v, buffers.len());
        buffers.push(v);
    }
    let name = super::kernel_name(g, ki, grp);
    let mut k = K {
        em: Emitter::new(g, buf, &name),
        table: buffers.iter().map(|b| table.iter().position(|x| x == b).unwrap()).collect(),
        ub: Ub::default(),
        setup: Code::new(),
        body: Code::new(),
    };
    let built = gen_group(&mut k, grp, &name)?;
    let ops = describe(g, grp);
    kernel_comment(code, g, grp, &name, &ops, built.mix);
    // Global names carry the module symbol: several modules link into one binary.
    let fname = format!("{symbol}_{name}");
    kernel_body_fn(code, &k, ki, &fname, &buffers, built.mix);
    kernel_entry(code, &fname, built.mix);
    let kernel = AscendKernel {
        name,
        buffers,
        n_inputs: grp.inputs.len(),
        work: built.work,
        ops,
        mix: built.mix,
        ub_per_col: k.ub.per_col(),
        ub_fixed: k.ub.fixed(),
        cube: built.cube,
        stage_a: built.stage_a,
        stage_b: built.stage_b,
        cube_bytes: built.cube_bytes,
    };
    Ok((kernel, fname))
}

/// The comment above a kernel: what it computes, why it is fused, what it writes, on which
/// cores, and its source lines.
fn kernel_comment(c: &mut Code, g: &Graph, grp: &Group, name: &str, ops: &str, mix: bool) {
    let why = if grp.rules.is_empty() {
        "one op: nothing fused".to_string()
    } else {
        format!("fused by {}", grp.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "))
    };
    let writes = grp.outputs.iter().map(|o| g.node(*o).name.clone()).collect::<Vec<_>>();
    let cores = if mix { "cube + vector (mix 1:2)" } else { "vector only" };
    let lines: BTreeSet<u32> =
        grp.nodes.iter().map(|n| g.node(*n).line).filter(|l| *l > 0).collect();
    let _ = writeln!(c, "/* {name}: {ops}");
    let _ = writeln!(c, " * {why}; writes {}; {cores}.", writes.join(", "));
    if !lines.is_empty() {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        let _ = writeln!(c, " * source lines: {}", lines.join(", "));
    }
    c.line(" */");
}

/// The kernel as a device function `<fname>_body` (its entry and the pipeline call it): the
/// tiling, dims and buffers bound, the access declarations, the pipe, then the generator's
/// setup, the UB buffers and the body.
fn kernel_body_fn(c: &mut Code, k: &K, ki: usize, fname: &str, buffers: &[NodeId], mix: bool) {
    c.line(format!(
        "__aicore__ inline void {fname}_body(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace) {{"
    ));
    c.indented(|c| kernel_prologue(c, k, ki, buffers, mix));
    // The access declarations are written one level in already.
    c.append(&k.em.decls);
    c.indented(|c| {
        c.line("AscendC::TPipe pipe;");
        c.append(&k.setup);
        k.ub.decls(c);
        c.append(&k.body);
    });
    c.line("}");
}

/// The start of every kernel body: the tiling and dims loaded, the chunk width, this AIV and
/// the AIV count, and the kernel's buffers as `g<i>`.
fn kernel_prologue(c: &mut Code, k: &K, ki: usize, buffers: &[NodeId], mix: bool) {
    let g = k.em.g;
    if !mix {
        c.line("if ASCEND_IS_AIC { return; } /* vector work: in a mix launch (the pipeline) the cube idles */");
    }
    c.line("AfTiling t;");
    let _ = writeln!(c, "af_load_tiling(tilings, {ki}, t);");
    c.line("int64_t dims[AF_MAX_DIMS];");
    c.line("af_load_dims(args, dims);");
    c.line("(void)dims;");
    c.line("const int64_t CH = t.chunk; /* columns per UB chunk (DynamicTiling, multiple of 8) */");
    c.line("const int64_t aiv = AscendC::GetBlockIdx(), naiv = AscendC::GetBlockNum() * AscendC::GetTaskRatio();");
    for (i, v) in buffers.iter().enumerate() {
        let n = g.node(*v);
        let ty = ascend_type(n.dtype);
        let _ = writeln!(c, "AscendC::GlobalTensor<{ty}> g{i}; /* {} */", n.name);
        let _ = writeln!(
            c,
            "g{i}.SetGlobalBuffer((__gm__ {ty} *)af_buf(args, {}), (uint64_t)({}));",
            k.table[i],
            k.em.dim(&numel(&n.shape))
        );
    }
}

/// The `__global__` head of kernel `fname`. Its kernel type is written on the function: with
/// several kernels in one file bisheng cannot infer it, and `KERNEL_TASK_TYPE_DEFAULT` is
/// read only by the op-project precompile step (asc-devkit `docs/zh/guide/编程指南/编译与运行/
/// 算子编译/约束说明.md`; `impl/basic_api/utils/kernel_utils_macros.h` `ENABLE_FEATURE_FOR_COMPILE`).
/// A mix kernel marks its workspace `__kfc_workspace__`: on arch 2201 `GetSysWorkSpacePtr()`
/// and `GetUserWorkspace()` read the kfc workspace register the launch sets from that parameter
/// (`include/basic_api/kernel_operator_swap_mem_intf.h`, `impl/basic_api/dav_c220/
/// kernel_operator_common_impl.h`), as in the devkit's `matmul_leakyrelu_advanced_api.asc`.
fn global_head(fname: &str, mix: bool) -> String {
    if mix {
        format!("extern \"C\" __global__ __mix__(1, 2) void {fname}(GM_ADDR args, GM_ADDR tilings, __kfc_workspace__ GM_ADDR workspace)")
    } else {
        format!("extern \"C\" __global__ __vector__ void {fname}(GM_ADDR args, GM_ADDR tilings, GM_ADDR workspace)")
    }
}

/// The kernel's `__global__` entry: a call of its body.
fn kernel_entry(c: &mut Code, fname: &str, mix: bool) {
    c.open(global_head(fname, mix));
    let _ = writeln!(c, "{fname}_body(args, tilings, workspace);");
    c.close();
    c.line("");
}

/// The pipeline: every body (named, with whether it is mix) in one mix launch, synchronised
/// by kernel type.
fn pipeline(c: &mut Code, symbol: &str, bodies: &[(String, bool)]) {
    c.line(
        "/* The opt_level-3 pipeline: all kernels in one launch (SuperKernel style). Between two",
    );
    c.line(" * vector kernels only the AIVs synchronise; around a cube kernel every core does. */");
    c.open(global_head(&format!("{symbol}_pipeline"), true));
    for (i, (name, mix)) in bodies.iter().enumerate() {
        if i > 0 {
            let prev_mix = bodies[i - 1].1;
            if *mix || prev_mix {
                c.line("AscendC::SyncAll<false>();");
            } else {
                c.line("if ASCEND_IS_AIV { AscendC::SyncAll(); }");
            }
        }
        let _ = writeln!(c, "{name}_body(args, tilings, workspace);");
    }
    c.close();
    c.line("");
}

/// The host-side launcher of every kernel and of the pipeline (kernel == the kernel count);
/// returns its name.
fn launcher(c: &mut Code, symbol: &str, bodies: &[(String, bool)]) -> String {
    let launch = format!("{symbol}_launch");
    let n = bodies.len();
    let _ = writeln!(
        c,
        "/* Host side: one launcher for every kernel (kernel == {n} launches the pipeline). */"
    );
    c.open(format!("extern \"C\" int32_t {launch}(uint32_t kernel, uint32_t block_dim, void *stream, uint8_t *args, uint8_t *tilings, uint8_t *workspace)"));
    // The case labels sit at the level of the switch.
    c.line("switch (kernel) {");
    for (i, (fname, _)) in bodies.iter().enumerate() {
        let _ = writeln!(c, "case {i}: {fname}<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;");
    }
    let _ = writeln!(c, "case {n}: {symbol}_pipeline<<<block_dim, nullptr, stream>>>(args, tilings, workspace); return 0;");
    c.line("default: return -1;");
    c.line("}");
    c.close();
    launch
}
