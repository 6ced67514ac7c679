//! The Ascend vector engine every kernel kind shares: a rows job (`Job`) streams the rows of
//! an iteration space through UB in chunks (CopyIn -> Compute -> CopyOut, double-buffered
//! queues), computing elementwise members with the vector APIs and reductions in phases; the
//! kernel being written (`K`) with its setup, body and UB queues.

use crate::codegen::emit::{c_float, gather_offsets, position, Code, Emitter, Space};
use crate::dim::Shape;
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use crate::kernels::rows::RowPhases;
use crate::layout::resolve;
use autofusion_ir::ops::{fill, Domain};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// A float constant in device code. No libc header is included in Ascend C kernels (the devkit's
/// basic API headers pull in none of `<cmath>`), so infinities and NaN come from `ascend.h`'s
/// compiler-builtin macros instead of `INFINITY` / `NAN`.
pub(crate) fn float_literal(v: f64) -> String {
    let f = v as f32;
    match (f.is_nan(), f.is_infinite(), f > 0.0) {
        (true, ..) => "AF_NAN".into(),
        (_, true, true) => "AF_INF".into(),
        (_, true, false) => "AF_NEG_INF".into(),
        _ => c_float(v),
    }
}

/// A value inside a rows job for one chunk: a UB float tensor (slot) or a scalar expression.
#[derive(Clone, Debug)]
pub(crate) enum V {
    T(String),
    S(String),
}

/// Where the value of an external input comes from inside a rows job.
#[derive(Clone, Debug)]
pub(crate) enum Src {
    /// Contiguous along the row: `DataCopyPad` from `gm[off + c]`, dtype `d` (`off` includes
    /// the window's first column).
    Row { gm: String, off: String, d: DType },
    /// Constant along the row (column stride 0): one scalar read per row.
    Scalar { gm: String, off: String, d: DType },
    /// Any other stride: gathered element by element (scalar reads) into a slot; `off` is the
    /// row's offset, `col0` the first column of the window. With `rotate: Some(h)` (a rows
    /// kernel's `rotate_half` member, rows of `2 h`) column `c` reads the partner column half
    /// a row away, negated below `h`.
    Gather {
        gm: String,
        off: String,
        col0: String,
        stride: String,
        d: DType,
        rotate: Option<String>,
    },
}

impl Src {
    /// This source read as a `rotate_half` of rows of `2 h` (each element from the partner
    /// column, through the scalar unit): the source of a rotate member.
    pub(crate) fn rotated(self, h: &str) -> Src {
        let rotate = Some(h.to_string());
        match self {
            Src::Row { gm, off, d } => {
                Src::Gather { gm, off, col0: "0".into(), stride: "1".into(), d, rotate }
            }
            Src::Scalar { gm, off, d } => {
                Src::Gather { gm, off, col0: "0".into(), stride: "0".into(), d, rotate }
            }
            Src::Gather { gm, off, col0, stride, d, .. } => {
                Src::Gather { gm, off, col0, stride, d, rotate }
            }
        }
    }
}

pub(crate) fn ascend_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "half",
        DType::BF16 => "bfloat16_t",
        DType::I64 => "int64_t",
        DType::I32 => "int32_t",
        DType::Bool => "uint8_t",
    }
}

/// Whether values of `d` sit in the vector lanes as stored (f32). Every other type is converted
/// into f32 lanes when read and back when written: the vector unit of A2 has no 64-bit integer
/// arithmetic (and no integer division), so integers and truth values are carried as f32,
/// exact for magnitudes below 2^24 (ids, positions, lengths; `docs/ascend-decode.md`).
pub(crate) fn in_f32_lanes(d: DType) -> bool {
    d == DType::F32
}

/// Whether rows of `d` go between GM and UB through the scalar unit rather than `DataCopyPad`.
/// One-byte `DataCopyPad` (`copy_gm_to_ubuf_align_b8`) exists on A2, but the official-header
/// check cannot compile it yet (its intrinsic stubs lack the b8 forms), so `bool` rows are
/// read and written element by element; masks are small.
pub(crate) fn by_scalar_unit(d: DType) -> bool {
    d == DType::Bool
}

/// The statements converting `cn` elements of UB tensor `x` (type `d`, not f32) into f32 slot
/// `sl` (`hb`: the half scratch, for the two-step conversions).
pub(crate) fn widen_to_f32(d: DType, sl: &str, x: &str) -> Vec<String> {
    let ty = ascend_type(d);
    let cast = |to: &str, from: &str, dst: &str, src: &str, mode: &str| {
        format!("AscendC::Cast<{to}, {from}>({dst}, {src}, AscendC::RoundMode::{mode}, cn);")
    };
    match d {
        DType::F32 => vec![],
        DType::F16 | DType::BF16 | DType::I32 => vec![cast("float", ty, sl, x, "CAST_NONE")],
        // int64 -> float allows no CAST_NONE on A2; the values are exact below 2^24.
        DType::I64 => vec![cast("float", ty, sl, x, "CAST_RINT")],
        DType::Bool => vec![
            cast("half", ty, "hb", x, "CAST_NONE"),
            cast("float", "half", sl, "hb", "CAST_NONE"),
        ],
    }
}

/// UB layout of one rows job: named queues and float slots, all `chunk` columns wide.
#[derive(Default)]
pub(crate) struct Ub {
    /// (name, dtype, in or out)
    pub(crate) queues: Vec<(String, DType, bool)>,
    pub(crate) slots: usize,
    /// Fixed bytes of buffers a kernel declares itself (flash: running max and sum).
    pub(crate) extra_fixed: u32,
}

impl Ub {
    pub(crate) fn queue(&mut self, name: String, d: DType, input: bool) -> String {
        if !self.queues.iter().any(|q| q.0 == name) {
            self.queues.push((name.clone(), d, input));
        }
        name
    }
    pub(crate) fn slot(&mut self) -> String {
        self.slots += 1;
        format!("sl[{}]", self.slots - 1)
    }
    /// UB bytes per column: queues double-buffered, slots, three temporaries, a half temp,
    /// and the reduction scratch (2 floats per 64 columns, rounded up to one byte).
    pub(crate) fn per_col(&self) -> u32 {
        self.queues.iter().map(|q| 2 * q.1.size() as u32).sum::<u32>()
            + 4 * (self.slots as u32 + 3)
            + 2
            + 1
    }
    /// UB bytes not proportional to the chunk (as `decls` sizes them): the half temp's 32-byte
    /// tail, the scalar area and the scratch's rounding, and up to 32 bytes of alignment per
    /// buffer.
    pub(crate) fn fixed(&self) -> u32 {
        32 + 64 + 32 + 32 * (2 * self.queues.len() as u32 + 3) + self.extra_fixed
    }
    /// Declarations at kernel scope (after any REGIST_MATMUL_OBJ, which
    /// initialises the pipe in split mode).
    pub(crate) fn decls(&self, c: &mut Code) {
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
pub(crate) fn aligned_group(c: &mut Code, stmts: &[String]) {
    let open = "{ ";
    let align = " ".repeat(open.len());
    for (i, s) in stmts.iter().enumerate() {
        let lead = if i == 0 { open } else { align.as_str() };
        let tail = if i + 1 == stmts.len() { " }" } else { "" };
        c.line(format!("{lead}{s}{tail}"));
    }
}

/// `DataCopyPad` of the chunk's `cn` elements of type `ty` from GM `src` into UB tensor `x`.
pub(crate) fn pad_in(x: &str, src: &str, ty: &str) -> String {
    format!("AscendC::DataCopyPad({x}, {src}, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}}, AscendC::DataCopyPadExtParams<{ty}>{{false, 0, 0, 0}});")
}

/// `DataCopyPad` of the chunk's `cn` elements of type `ty` from UB tensor `y` to GM `dst`.
pub(crate) fn pad_out(dst: &str, y: &str, ty: &str) -> String {
    format!("AscendC::DataCopyPad({dst}, {y}, AscendC::DataCopyExtParams{{1, (uint32_t)(cn * sizeof({ty})), 0, 0, 0}});")
}

/// UB tensor `t` of queue `q` handed through the queue to the copy out, written to GM `dst`
/// (the chunk's `cn` elements of type `ty`), and freed.
pub(crate) fn enque_store(c: &mut Code, q: &str, t: &str, ty: &str, dst: &str) {
    let _ = writeln!(c, "{q}.EnQue({t});");
    let _ = writeln!(c, "{t} = {q}.DeQue<{ty}>();");
    c.line(pad_out(dst, t, ty));
    let _ = writeln!(c, "{q}.FreeTensor({t});");
}

/// A gather member's operands in GM: (tensor, dtype) of its table and of its indices.
pub(crate) struct Gathered {
    pub(crate) table: (String, DType),
    pub(crate) index: (String, DType),
}

/// One rows job: compute `nodes` over the columns `[col0, col0 + ncols)` of one row of
/// `space`, reading external values per `srcs` (or pre-set f32 rows), storing `outs`.
pub(crate) struct Job<'a> {
    pub(crate) g: &'a Graph,
    /// The GM tensors of each gather member's table and indices.
    pub(crate) gathers: BTreeMap<NodeId, Gathered>,
    pub(crate) space: Shape,
    pub(crate) nodes: Vec<NodeId>,
    pub(crate) srcs: BTreeMap<NodeId, Src>,
    /// Stored values: (node, GM tensor, offset of column `col0` of this row, GM dtype).
    pub(crate) outs: Vec<(NodeId, String, String, DType)>,
    /// Row index of the second-to-last axis (for the causal mask), a C expression.
    pub(crate) row_i: String,
    /// Expression of `cols - rows` of the causal mask's last two axes.
    pub(crate) causal_shift: String,
    pub(crate) col0: String,
    pub(crate) ncols: String,
    pub(crate) tag: String,
}

pub(crate) fn unary_seq(out: &mut Code, u: UnaryOp, dst: &str, x: &str, n: &str) {
    for line in u.spec().ascend_vector {
        out.line(fill(line, &[("dst", dst), ("x", x), ("n", n)]));
    }
}

pub(crate) fn unary_scalar(u: UnaryOp, x: &str) -> String {
    fill(u.spec().ascend_scalar, &[("x", x)])
}

pub(crate) fn binary_scalar(b: BinaryOp, x: &str, y: &str) -> String {
    fill(b.spec().ascend_scalar, &[("x", x), ("y", y)])
}

/// A binary op into `dst` with tensor and/or scalar operands (count form).
pub(crate) fn binary_seq(out: &mut Code, b: BinaryOp, dst: &str, x: &V, y: &V, n: &str) {
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

/// A comparison of `x` and `y` into `dst` as 0.0 / 1.0 lanes, by arithmetic: the vector
/// `Compare` writes a bit mask and handles only whole 256-byte repeats. `x < y` is
/// min((y - x)^+ * 1e60, 1): 1 for any positive difference (integers: >= 1; floats: the
/// smallest subnormal times 1e60 is still > 1), 0 otherwise. Operands are taken to be
/// neither NaN nor equal infinities (documented in ARCHITECTURE.md).
pub(crate) fn compare_seq(out: &mut Code, b: BinaryOp, dst: &str, x: &V, y: &V) {
    let x = materialise(out, x, "ta", "cn");
    let y = materialise(out, y, "tb", "cn");
    let negate = match b {
        BinaryOp::Lt | BinaryOp::Gt => false,
        BinaryOp::Le | BinaryOp::Ge | BinaryOp::Eq => true,
        b => unreachable!("{} is not a comparison", b.name()),
    };
    if b == BinaryOp::Eq {
        // 1 - [x != y]
        let _ = writeln!(out, "AscendC::Sub(tc, {x}, {y}, cn);");
        out.line("AscendC::Abs(tc, tc, cn);");
    } else {
        // [p < q] = [(q - p)^+ > 0]: lt is (x, y), gt (y, x); le = 1 - gt, ge = 1 - lt.
        let (p, q) = if matches!(b, BinaryOp::Lt | BinaryOp::Ge) { (&x, &y) } else { (&y, &x) };
        let _ = writeln!(out, "AscendC::Sub(tc, {q}, {p}, cn);");
        out.line("AscendC::Maxs(tc, tc, 0.0f, cn);");
    }
    nonzero_to_one(out, dst);
    if negate {
        let _ = writeln!(out, "AscendC::Muls({dst}, {dst}, -1.0f, cn);");
        let _ = writeln!(out, "AscendC::Adds({dst}, {dst}, 1.0f, cn);");
    }
}

/// `dst` = 1 where the non-negative lanes of `tc` are nonzero, else 0: `min(tc * 1e60, 1)`.
fn nonzero_to_one(out: &mut Code, dst: &str) {
    out.line("AscendC::Muls(tc, tc, 1e30f, cn);");
    out.line("AscendC::Muls(tc, tc, 1e30f, cn);");
    let _ = writeln!(out, "AscendC::Mins({dst}, tc, 1.0f, cn);");
}

/// Integer division of integral f32 lanes into `dst`: truncated toward zero, 0 where the
/// divisor is 0 (the host's `af_idiv`). The divisor is made 1 where it is 0 (|y| >= 1
/// elsewhere), the quotient truncated and multiplied by `min(|y|, 1)`.
pub(crate) fn integer_div(out: &mut Code, dst: &str, x: &V, y: &V) {
    let x = materialise(out, x, "ta", "cn");
    let y = materialise(out, y, "tb", "cn");
    let _ = writeln!(out, "AscendC::Abs(tc, {y}, cn);");
    out.line("AscendC::Mins(tc, tc, 1.0f, cn); /* 1 where y != 0 */");
    let _ = writeln!(out, "AscendC::Adds({dst}, tc, -1.0f, cn);");
    let _ = writeln!(out, "AscendC::Sub({dst}, {y}, {dst}, cn); /* y, or 1 where y = 0 */");
    let _ = writeln!(out, "AscendC::Div({dst}, {x}, {dst}, cn);");
    let _ = writeln!(
        out,
        "AscendC::Cast<float, float>(ta, {dst}, AscendC::RoundMode::CAST_TRUNC, cn);"
    );
    let _ = writeln!(out, "AscendC::Mul({dst}, ta, tc, cn);");
}

/// `cast` of `x` (type `from`) to `to` into `dst`, where either is not a float type: floats
/// to integers truncate; anything to `bool` is `x != 0` (as `compare_seq`); the rest keep the
/// value (integers and truth values are already integral f32 lanes).
pub(crate) fn cast_seq(out: &mut Code, from: DType, to: DType, dst: &str, x: &V) {
    let x = materialise(out, x, "ta", "cn");
    if to == DType::Bool && from != DType::Bool {
        let _ = writeln!(out, "AscendC::Abs(tc, {x}, cn);");
        nonzero_to_one(out, dst);
    } else if from.is_float() {
        let _ = writeln!(
            out,
            "AscendC::Cast<float, float>({dst}, {x}, AscendC::RoundMode::CAST_TRUNC, cn);"
        );
    } else {
        let _ = writeln!(out, "AscendC::Adds({dst}, {x}, 0.0f, cn);");
    }
}

/// `cast_seq` of a scalar.
pub(crate) fn cast_scalar(from: DType, to: DType, x: &str) -> String {
    if to == DType::Bool && from != DType::Bool {
        format!("({x} != 0.0f ? 1.0f : 0.0f)")
    } else if from.is_float() && !to.is_float() {
        format!("(float)(int64_t)({x})")
    } else {
        x.to_string()
    }
}

/// `where(c, a, b)` into `dst`. A row-constant condition picks one operand for the chunk; a
/// full-width one selects bit patterns (so infinities and NaN pass unchanged, which
/// `c a + (1 - c) b` would not): the mask 0 / -1 as int32 words from the 0.0 / 1.0 lanes,
/// then `(a & m) | (b & ~m)` on the 16-bit halves (the vector unit's bitwise ops are 16-bit).
pub(crate) fn where_seq(out: &mut Code, dst: &str, c: &V, a: &V, b: &V) {
    let copy = |out: &mut Code, v: &V| match v {
        V::T(t) => {
            let _ = writeln!(out, "AscendC::Adds({dst}, {t}, 0.0f, cn);");
        }
        V::S(s) => {
            let _ = writeln!(out, "AscendC::Duplicate({dst}, (float)({s}), cn);");
        }
    };
    let c = match c {
        V::S(s) => {
            out.open(format!("if ({s} != 0.0f)"));
            copy(out, a);
            out.close();
            out.open("else");
            copy(out, b);
            out.close();
            return;
        }
        V::T(t) => t,
    };
    let a = materialise(out, a, "ta", "cn");
    let b = materialise(out, b, "tb", "cn");
    let u16 = |t: &str| format!("{t}.ReinterpretCast<uint16_t>()");
    let (du, au, bu, mu, tu) = (u16(dst), u16(&a), u16(&b), u16("tc"), u16("ta"));
    out.block("", |o| {
        o.line("AscendC::LocalTensor<int32_t> m = tc.ReinterpretCast<int32_t>();");
        let _ = writeln!(
            o,
            "AscendC::Cast<int32_t, float>(m, {c}, AscendC::RoundMode::CAST_RINT, cn);"
        );
        o.line("AscendC::Muls(m, m, (int32_t)-1, cn); /* 0 or all ones */");
        let _ = writeln!(o, "AscendC::And({du}, {au}, {mu}, 2 * cn);");
        let _ = writeln!(o, "AscendC::Not({mu}, {mu}, 2 * cn);");
        let _ = writeln!(o, "AscendC::And({tu}, {bu}, {mu}, 2 * cn);");
        let _ = writeln!(o, "AscendC::Or({du}, {du}, {tu}, 2 * cn);");
    });
}

/// A running sum along the row into `dst` by the scalar unit, carried across chunks in `acc`.
pub(crate) fn cumsum_seq(out: &mut Code, dst: &str, x: &V, acc: &str, exclusive: bool) {
    let x = materialise(out, x, "ta", "cn");
    out.line(
        "AscendC::PipeBarrier<PIPE_ALL>(); /* the scalar unit reads what the vector unit wrote */",
    );
    let step = if exclusive {
        format!("{dst}.SetValue((uint32_t)j, {acc}); {acc} += v;")
    } else {
        format!("{acc} += v; {dst}.SetValue((uint32_t)j, {acc});")
    };
    let _ = writeln!(
        out,
        "for (int32_t j = 0; j < cn; ++j) {{ const float v = {x}.GetValue((uint32_t)j); {step} }}"
    );
    out.line(
        "AscendC::PipeBarrier<PIPE_ALL>(); /* the vector unit reads what the scalar unit wrote */",
    );
}

pub(crate) fn materialise(out: &mut Code, v: &V, tmp: &str, n: &str) -> String {
    match v {
        V::T(t) => t.clone(),
        V::S(s) => {
            let _ = writeln!(out, "AscendC::Duplicate({tmp}, (float)({s}), {n});");
            tmp.to_string()
        }
    }
}

/// `cn` f32 lanes of UB tensor `v` written to GM tensor `dst` (type `d`) by the scalar unit,
/// each element's cache line written back as it is stored.
pub(crate) fn scalar_store(c: &mut Code, d: DType, dst: &str, v: &str) {
    let ty = ascend_type(d);
    c.line(
        "AscendC::PipeBarrier<PIPE_ALL>(); /* the scalar unit reads what the vector unit wrote */",
    );
    c.block("for (int32_t j = 0; j < cn; ++j)", |c| {
        let _ = writeln!(c, "{dst}.SetValue((uint32_t)j, static_cast<{ty}>({v}.GetValue((uint32_t)j)));");
        let _ = writeln!(c, "AscendC::DataCacheCleanAndInvalid<{ty}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({dst}[(uint32_t)j]);");
    });
}

/// Round a float slot to `d` and back, as the reference rounds f16/bf16 values where they are
/// computed. Integer and truth values are integral in their f32 lanes by construction (each op
/// that could leave the integers truncates: `integer_div`, `cast_seq`).
pub(crate) fn round_seq(out: &mut Code, d: DType, dst: &str, n: &str) {
    let (ty, scratch) = match d {
        DType::F32 | DType::I64 | DType::I32 | DType::Bool => return,
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

pub(crate) fn round_scalar(d: DType, e: String) -> String {
    match d {
        DType::F32 | DType::I64 | DType::I32 | DType::Bool => e,
        DType::F16 => format!("af_s_round(sc, hb, {e})"),
        DType::BF16 => format!("af_s_round_bf(sc, bb, {e})"),
    }
}

pub(crate) fn is_max(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. })
}

/// One chunk of a rows loop as it is written: the UB tensor holding each value read or
/// computed so far, and the CopyIn queue tensors (value, queue, tensor, GM dtype), freed at
/// the end of the chunk.
pub(crate) struct Chunk {
    pub(crate) slots: BTreeMap<NodeId, String>,
    pub(crate) dequeued: Vec<(NodeId, String, String, DType)>,
}

impl Job<'_> {
    /// Emit the code of one row (accesses' `<tag>_row<a>` offsets already computed).
    pub(crate) fn emit(&self, ub: &mut Ub, out: &mut Code) {
        let ph = self.phases();
        self.scalar_sources(out);
        self.row_values(&ph, 0, out);
        for p in 0..ph.n_loops {
            self.chunk_loop(ub, &ph, p, out);
            self.row_values(&ph, p + 1, out);
        }
        self.store_row_values(&ph, out);
    }

    /// Which chunk loop computes each member, and after which loop each row value is ready
    /// (the rows kind's schedule, with the row sources streamed in loop 0).
    pub(crate) fn phases(&self) -> RowPhases {
        let streamed = self.srcs.iter().filter(|(_, s)| !matches!(s, Src::Scalar { .. }));
        RowPhases::of(self.g, &self.nodes, &self.space, streamed.map(|(id, _)| *id))
    }

    /// The C name of row value `id` (a scalar source or a value computed once per row).
    pub(crate) fn scal(&self, id: NodeId) -> String {
        format!("{}s{}", self.tag, id.0)
    }

    /// Value `id` inside a chunk: a constant, its UB tensor in `slots`, or its row scalar.
    pub(crate) fn value_of(&self, id: NodeId, slots: &BTreeMap<NodeId, String>) -> V {
        if let Op::Const { value } = self.g.node(id).op {
            return V::S(float_literal(value));
        }
        if let Some(sl) = slots.get(&id) {
            return V::T(sl.clone());
        }
        V::S(self.scal(id))
    }

    /// Row value `id` as a scalar expression.
    pub(crate) fn row_value(&self, id: NodeId) -> String {
        match self.value_of(id, &BTreeMap::new()) {
            V::S(s) => s,
            V::T(_) => unreachable!("a row value reads a full-width value"),
        }
    }

    /// Scalar sources: one read per row.
    pub(crate) fn scalar_sources(&self, out: &mut Code) {
        for (id, s) in &self.srcs {
            if let Src::Scalar { gm, off, d } = s {
                let v = if in_f32_lanes(*d) {
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
    pub(crate) fn row_values(&self, ph: &RowPhases, lvl: usize, out: &mut Code) {
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
                    let from = self.g.node(n.inputs[0]).dtype;
                    match op {
                        Op::Unary(u) => unary_scalar(*u, &ops[0]),
                        Op::Binary(BinaryOp::Div) if !n.dtype.is_float() => {
                            let (x, y) = (&ops[0], &ops[1]);
                            format!("({y} == 0.0f ? 0.0f : (float)(int64_t)({x} / {y}))")
                        }
                        Op::Binary(b) => binary_scalar(*b, &ops[0], &ops[1]),
                        Op::Where => format!("({} != 0.0f ? {} : {})", ops[0], ops[1], ops[2]),
                        Op::Cast => cast_scalar(from, n.dtype, &ops[0]),
                        Op::Copy | Op::Expand { .. } => ops[0].clone(),
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
    pub(crate) fn loop_needs(&self, ph: &RowPhases, p: usize) -> BTreeSet<NodeId> {
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
    pub(crate) fn chunk_loop(&self, ub: &mut Ub, ph: &RowPhases, p: usize, out: &mut Code) {
        let t = &self.tag;
        let need = self.loop_needs(ph, p);
        let reds = ph.reductions_in(p);
        for &m in &reds {
            let init = if is_max(self.g, m) { "AF_NEG_INF" } else { "0.0f" };
            let _ = writeln!(out, "float {t}acc{} = {init};", m.0);
        }
        for &m in self.nodes.iter().filter(|m| need.contains(m)) {
            if matches!(self.g.node(m).op, Op::CumSum { .. }) {
                let _ = writeln!(out, "float {} = 0.0f;", self.running_sum(m, p));
            }
        }
        out.open(format!("for (int64_t c0 = 0; c0 < {}; c0 += CH)", self.ncols));
        let _ = writeln!(out, "const int32_t cn = (int32_t)af_min(CH, {} - c0);", self.ncols);
        let mut chunk = self.copy_in(ub, &need, out);
        self.dequeue(ub, &mut chunk, out);
        for &m in &self.nodes {
            if reds.contains(&m) {
                self.reduce_step(m, &chunk.slots, out);
            } else if need.contains(&m) && !chunk.slots.contains_key(&m) {
                // (A member with a slot already was read in: a rotate-half member's source.)
                self.compute(ub, m, p, &mut chunk.slots, out);
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
    pub(crate) fn copy_in(&self, ub: &mut Ub, need: &BTreeSet<NodeId>, out: &mut Code) -> Chunk {
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
                Src::Gather { gm, off, col0, stride, d, rotate } => {
                    let sl = ub.slot();
                    let col = format!("({col0} + c0 + j)");
                    let at = match rotate {
                        Some(h) => format!("({col} < {h} ? {col} + {h} : {col} - {h})"),
                        None => col.clone(),
                    };
                    let mut cv = if in_f32_lanes(*d) {
                        format!("{gm}.GetValue({off} + {at} * ({stride}))")
                    } else {
                        format!("static_cast<float>({gm}.GetValue({off} + {at} * ({stride})))")
                    };
                    let mut what = "strided view";
                    if let Some(h) = rotate {
                        cv = format!("({col} < {h} ? -({cv}) : ({cv}))");
                        what = "rotated half";
                    }
                    let _ = writeln!(out, "for (int32_t j = 0; j < cn; ++j) {sl}.SetValue(j, {cv}); /* gather {} ({what}) */", g.node(id).name);
                    chunk.slots.insert(id, sl);
                }
                Src::Scalar { .. } => {}
            }
        }
        chunk
    }

    /// The start of Compute: every CopyIn queue dequeued, f16/bf16 rows cast to f32 slots.
    pub(crate) fn dequeue(&self, ub: &mut Ub, chunk: &mut Chunk, out: &mut Code) {
        for (id, q, x, d) in &chunk.dequeued {
            let ty = ascend_type(*d);
            let _ = writeln!(out, "AscendC::LocalTensor<{ty}> {x} = {q}.DeQue<{ty}>();");
            if in_f32_lanes(*d) {
                chunk.slots.insert(*id, x.clone());
            } else {
                let sl = ub.slot();
                for line in widen_to_f32(*d, &sl, x) {
                    out.line(line);
                }
                chunk.slots.insert(*id, sl);
            }
        }
    }

    /// The chunk's contribution to reduction `m` (its accumulator `<tag>acc<m>`).
    pub(crate) fn reduce_step(&self, m: NodeId, slots: &BTreeMap<NodeId, String>, out: &mut Code) {
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
    /// The running sum of cumsum member `m` in chunk loop `p` (a member of an earlier phase
    /// is recomputed in a later loop, from the start of the row).
    pub(crate) fn running_sum(&self, m: NodeId, p: usize) -> String {
        format!("{}cs{}_{p}", self.tag, m.0)
    }

    /// Full-width member `m` of chunk loop `p` over the chunk into a new slot, rounded to its
    /// dtype.
    pub(crate) fn compute(
        &self,
        ub: &mut Ub,
        m: NodeId,
        p: usize,
        slots: &mut BTreeMap<NodeId, String>,
        out: &mut Code,
    ) {
        let n = self.g.node(m);
        let dst = ub.slot();
        let ops: Vec<V> = n.inputs.iter().map(|i| self.value_of(*i, slots)).collect();
        let from = self.g.node(n.inputs.first().copied().unwrap_or(m)).dtype;
        let _ = writeln!(out, "/* {} = {} */", n.name, n.op.name());
        match &n.op {
            Op::Unary(u) => {
                let x = materialise(out, &ops[0], "ta", "cn");
                unary_seq(out, *u, &dst, &x, "cn");
            }
            Op::Binary(b) if b.spec().domain == Domain::Compare => {
                compare_seq(out, *b, &dst, &ops[0], &ops[1]);
            }
            Op::Binary(BinaryOp::Div) if !n.dtype.is_float() => {
                integer_div(out, &dst, &ops[0], &ops[1]);
            }
            Op::Binary(b) => binary_seq(out, *b, &dst, &ops[0], &ops[1], "cn"),
            Op::Where => where_seq(out, &dst, &ops[0], &ops[1], &ops[2]),
            Op::Gather { .. } => self.gather(ub, m, &dst, out),
            Op::CumSum { exclusive, .. } => {
                cumsum_seq(out, &dst, &ops[0], &self.running_sum(m, p), *exclusive);
            }
            Op::Cast if !(from.is_float() && n.dtype.is_float()) => {
                cast_seq(out, from, n.dtype, &dst, &ops[0]);
            }
            Op::Cast | Op::Copy | Op::Expand { .. } => match &ops[0] {
                V::T(x) => {
                    let _ = writeln!(out, "AscendC::Adds({dst}, {x}, 0.0f, cn);");
                }
                V::S(s) => {
                    let _ = writeln!(out, "AscendC::Duplicate({dst}, (float)({s}), cn);");
                }
            },
            Op::CausalMask => self.causal_mask(&dst, &ops[0], out),
            // The new row (input 1), stored at its cache row (the job's `outs`).
            Op::CacheWrite { .. } => match &ops[1] {
                V::T(x) => {
                    let _ = writeln!(out, "AscendC::Adds({dst}, {x}, 0.0f, cn);");
                }
                V::S(s) => {
                    let _ = writeln!(out, "AscendC::Duplicate({dst}, (float)({s}), cn);");
                }
            },
            op => unreachable!("{} in a rows job", op.name()),
        }
        round_seq(out, n.dtype, &dst, "cn");
        slots.insert(m, dst);
    }

    /// Gather member `m` over the chunk into slot `dst`. Each index is read from GM by the
    /// scalar unit, moved into the table (negative from the end, then clamped: no read is out
    /// of bounds, whatever the index) and the element read. When the index is constant along
    /// the row and the table's row is contiguous (an embedding lookup), the chunk is one
    /// `DataCopyPad` of the table row; otherwise the scalar unit reads element by element.
    pub(crate) fn gather(&self, ub: &mut Ub, m: NodeId, dst: &str, out: &mut Code) {
        let g = self.g;
        let n = g.node(m);
        let Op::Gather { axis } = n.op else { unreachable!("a gather") };
        let Gathered { table: (gd, dd), index: (gi, _) } = &self.gathers[&m];
        let p = format!("gt{}", m.0);
        let rank = n.shape.len();
        let index_rank = g.node(n.inputs[1]).shape.len();
        let col = format!("{} + c0", self.col0);
        let row_index = axis + index_rank < rank;
        let (dview, dshape) = (resolve(g, n.inputs[0]), &g.node(n.inputs[0]).shape);
        let contiguous_row = crate::layout::space_strides(&dview, dshape, dshape.len())
            .last()
            .and_then(|s| s.as_const())
            == Some(1);
        let moved = |idx: &str| {
            format!("int64_t id = (int64_t){gi}.GetValue((uint64_t)({idx})); if (id < 0) id += {p}_n; id = id < 0 ? 0 : (id >= {p}_n ? {p}_n - 1 : id);")
        };
        // An empty table has no row to read: the slot is zeros.
        let empty = format!("else AscendC::Duplicate({dst}, 0.0f, cn);");
        if row_index && contiguous_row && !by_scalar_unit(*dd) {
            let (table, index) = gather_offsets(g, m, &position(&self.tag, rank, &col));
            let ty = ascend_type(*dd);
            let q = ub.queue(format!("{}g{}", self.tag, m.0), *dd, true);
            out.block_noted(&format!("if ({p}_n > 0)"), "one table row", |c| {
                c.line(moved(&index));
                let _ = writeln!(c, "AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
                c.line(pad_in("x", &format!("{gd}[{table} + id * {p}_da]"), ty));
                let _ = writeln!(c, "{q}.EnQue(x);");
                let _ = writeln!(c, "x = {q}.DeQue<{ty}>();");
                if in_f32_lanes(*dd) {
                    let _ = writeln!(c, "AscendC::Adds({dst}, x, 0.0f, cn);");
                } else {
                    for line in widen_to_f32(*dd, dst, "x") {
                        c.line(line);
                    }
                }
                let _ = writeln!(c, "{q}.FreeTensor(x);");
            });
            out.line(empty);
            return;
        }
        let (table, index) =
            gather_offsets(g, m, &position(&self.tag, rank, &format!("{col} + j")));
        out.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the scalar unit writes the slot */");
        out.block_noted(&format!("if ({p}_n > 0) for (int32_t j = 0; j < cn; ++j)"), "element by element", |c| {
            c.line(moved(&index));
            let _ = writeln!(c, "{dst}.SetValue((uint32_t)j, static_cast<float>({gd}.GetValue((uint64_t)({table} + id * {p}_da))));");
        });
        out.line(empty);
        out.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the vector unit reads the slot */");
    }

    /// The causal mask of the chunk's keys into `dst`.
    pub(crate) fn causal_mask(&self, dst: &str, x: &V, out: &mut Code) {
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
    pub(crate) fn copy_out(
        &self,
        ub: &mut Ub,
        ph: &RowPhases,
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
            let v = materialise(out, &self.value_of(*id, slots), "ta", "cn");
            if by_scalar_unit(d) {
                let name = &self.g.node(*id).name;
                out.block_noted("", &format!("CopyOut {name} (by the scalar unit)"), |c| {
                    scalar_store(c, d, &format!("{gm}[{off} + c0]"), &v);
                });
                continue;
            }
            let q = ub.queue(format!("{}o{}", self.tag, id.0), d, false);
            out.block_noted("", &format!("CopyOut {}", self.g.node(*id).name), |c| {
                let _ = writeln!(c, "AscendC::LocalTensor<{ty}> y = {q}.AllocTensor<{ty}>();");
                if in_f32_lanes(d) {
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
    pub(crate) fn store_row_values(&self, ph: &RowPhases, out: &mut Code) {
        for (id, gm, off, d) in &self.outs {
            if ph.phase.contains_key(id) {
                continue;
            }
            let v = self.row_value(*id);
            let ty = ascend_type(*d);
            let conv = if in_f32_lanes(*d) { v } else { format!("static_cast<{ty}>({v})") };
            let _ = writeln!(out, "{gm}.SetValue({off}, {conv}); /* {} */", self.g.node(*id).name);
            let _ = writeln!(out, "AscendC::DataCacheCleanAndInvalid<{ty}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({gm}[{off}]);");
        }
    }
}

/// Per-kernel generation state.
pub(crate) struct K<'g> {
    pub(crate) em: Emitter<'g>,
    /// Module table index of each kernel-local buffer.
    pub(crate) table: Vec<usize>,
    pub(crate) ub: Ub,
    /// Kernel-scope code before the UB buffers: shapes, and any Matmul objects (their
    /// REGIST_MATMUL_OBJ initialises the pipe in split mode, so it comes first).
    pub(crate) setup: Code,
    /// The rest of the kernel, after the UB buffers (declared once this is written and the
    /// queues and slots it uses are known).
    pub(crate) body: Code,
}

impl K<'_> {
    pub(crate) fn gm(&self, b: usize) -> String {
        format!("g{b}")
    }
    /// The source of external value `v` read in `sp` (access declared), over the column
    /// window starting at `col0`.
    pub(crate) fn src(&mut self, sp: &mut Space, v: NodeId, col0: &str) -> Src {
        let a = self.em.access(sp, v);
        self.src_of(sp, v, a, col0)
    }
    /// `src` for a value read in a permuted view of `sp` (`Emitter::access_permuted`).
    pub(crate) fn src_permuted(
        &mut self,
        sp: &mut Space,
        v: NodeId,
        col0: &str,
        perm: &[usize],
    ) -> Src {
        let a = self.em.access_permuted(sp, v, perm);
        self.src_of(sp, v, a, col0)
    }
    fn src_of(&self, sp: &Space, v: NodeId, a: usize, col0: &str) -> Src {
        let base = resolve(self.em.g, v).base;
        let gm = self.gm(self.em.buf[&base]);
        let d = self.em.g.node(v).dtype;
        let off = format!("{}_row{a}", sp.tag);
        let stride = self.em.col_stride.get(&a).copied();
        match stride {
            Some(1) if !by_scalar_unit(d) => Src::Row { gm, off: format!("{off} + {col0}"), d },
            Some(0) => Src::Scalar { gm, off, d },
            _ => Src::Gather {
                gm,
                off,
                col0: col0.to_string(),
                stride: match stride {
                    Some(1) => "1".into(),
                    _ => format!("ac{a}_s{}", sp.shape.len() - 1),
                },
                d,
                rotate: None,
            },
        }
    }
}

/// The sources of the `rotate_half` members of `nodes` (rows of `2 h` along `sp`'s last
/// axis), keyed by the member: each is read in like a source, its operand at the partner
/// columns (`Src::rotated`).
pub(crate) fn rotated_sources(
    k: &mut K,
    sp: &mut Space,
    nodes: &[NodeId],
    h: &str,
    srcs: &mut BTreeMap<NodeId, Src>,
) {
    for &m in nodes {
        if let Op::RotateHalf = k.em.g.node(m).op {
            let s = k.src(sp, k.em.g.node(m).inputs[0], "0");
            srcs.insert(m, s.rotated(h));
        }
    }
}

/// One chunk of a row copied through UB: columns `c0 .. min(c0 + CH, c_hi)` of `src` (its
/// offsets corrected by `fix`) to `dst[row + c0 ..]` of `(dst, row)`, through queue `q`. The
/// copy kernels (concat, cache writes) are this in a row loop.
pub(crate) fn copy_chunk(
    c: &mut Code,
    q: &str,
    d: DType,
    src: &Src,
    fix: &str,
    (dst, row): (&str, &str),
    c_hi: &str,
) {
    let ty = ascend_type(d);
    let _ = writeln!(c, "const int32_t cn = (int32_t)af_min(CH, ({c_hi}) - c0);");
    let _ = writeln!(c, "AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
    match src {
        Src::Row { gm, off, .. } => {
            c.line(pad_in("x", &format!("{gm}[{off} {fix} + c0]"), ty));
        }
        Src::Scalar { gm, off, .. } => {
            let _ = writeln!(
                c,
                "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix}));"
            );
        }
        Src::Gather { gm, off, stride, .. } => {
            let _ = writeln!(c, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix} + (c0 + j) * ({stride})));");
        }
    }
    let _ = writeln!(c, "{q}.EnQue(x);");
    let _ = writeln!(c, "x = {q}.DeQue<{ty}>();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the copy out reads what MTE2 / the scalar unit wrote */");
    if by_scalar_unit(d) {
        c.block("for (int32_t j = 0; j < cn; ++j)", |c| {
            let _ = writeln!(c, "{dst}.SetValue((uint64_t)({row} + c0 + j), x.GetValue((uint32_t)j));");
            let _ = writeln!(c, "AscendC::DataCacheCleanAndInvalid<{ty}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({dst}[(uint64_t)({row} + c0 + j)]);");
        });
    } else {
        c.line(pad_out(&format!("{dst}[{row} + c0]"), "x", ty));
    }
    let _ = writeln!(c, "{q}.FreeTensor(x);");
}

/// The row offsets of every access of `sp` for row `row` (named `<tag>_row<a>`).
pub(crate) fn row_offsets(em: &Emitter, sp: &Space, row: &str, out: &mut Code) {
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

pub(crate) fn ext_inputs(g: &Graph, nodes: &[NodeId], members: &BTreeSet<NodeId>) -> Vec<NodeId> {
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
pub(crate) fn space(tag: &'static str, shape: Shape) -> Space {
    Space { tag, shape, accesses: BTreeMap::new() }
}

pub(crate) fn causal_shift(em: &Emitter, nodes: &[NodeId]) -> String {
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

/// One row copied from its source to the job's single output (staging).
pub(crate) fn copy_row(ub: &mut Ub, job: &Job, v: NodeId, out: &mut Code) {
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
