//! Emission helpers both generators share: C identifiers and literals, and the `Emitter` of a
//! kernel (its buffers, the accesses it declares with their offsets and strides, the row
//! decomposition of an iteration space), whose C-like declarations are valid in C and Ascend C.

use crate::abi::PackMeta;
use crate::dim::{DimExpr, Shape};
use crate::ir::{Graph, NodeId, Op};
use crate::layout::{contiguous_strides, resolve, space_strides};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

pub(crate) fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .collect();
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out.trim_matches('_').chars().take(32).collect()
}

pub(crate) fn c_float(v: f64) -> String {
    let f = v as f32;
    if f.is_nan() {
        "NAN".into()
    } else if f.is_infinite() {
        if f > 0.0 {
            "INFINITY".into()
        } else {
            "(-INFINITY)".into()
        }
    } else {
        let s = format!("{f:?}");
        let s = if s.contains('.') || s.contains('e') { s } else { format!("{s}.0") };
        format!("{s}f")
    }
}

/// Generated source that knows its block structure: every line is indented by the depth of the
/// blocks around it, so generators say what nests (`open`/`close`, `block`, `indented`) and never
/// count spaces. `fmt::Write` goes through the same indentation, so `writeln!(code, ...)` works;
/// a string of several lines is indented line by line, and an empty line gets no indent.
#[derive(Clone, Debug, Default)]
pub(crate) struct Code {
    text: String,
    depth: usize,
    at_line_start: bool,
}

/// One level of indentation in generated C and Ascend C.
const INDENT: &str = "    ";

impl Code {
    pub(crate) fn new() -> Code {
        Code { text: String::new(), depth: 0, at_line_start: true }
    }
    /// A writer whose lines start `depth` levels in (for code spliced into an enclosing block).
    pub(crate) fn at_depth(depth: usize) -> Code {
        Code { depth, ..Code::new() }
    }
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }
    /// One line (or several, each indented) at the current depth.
    pub(crate) fn line(&mut self, s: impl AsRef<str>) -> &mut Code {
        self.put(s.as_ref());
        self.put("\n");
        self
    }
    /// `head {` and one level deeper.
    pub(crate) fn open(&mut self, head: impl AsRef<str>) -> &mut Code {
        let head = head.as_ref();
        if head.is_empty() {
            self.line("{");
        } else {
            self.line(format!("{head} {{"));
        }
        self.depth += 1;
        self
    }
    /// One level out and `}`.
    pub(crate) fn close(&mut self) -> &mut Code {
        self.close_with("")
    }
    /// One level out and `}` followed by `tail` (`;`, ` /* loop */`, ` else {` ...).
    pub(crate) fn close_with(&mut self, tail: &str) -> &mut Code {
        self.depth = self.depth.checked_sub(1).expect("close without open in generated code");
        self.line(format!("}}{tail}"))
    }
    /// `head { ... }` with `body` one level deeper.
    pub(crate) fn block(
        &mut self,
        head: impl AsRef<str>,
        body: impl FnOnce(&mut Code),
    ) -> &mut Code {
        self.open(head);
        body(self);
        self.close()
    }
    /// `head { /* note */`, `body` one level deeper, `}`: `block` with a comment after the
    /// brace (a bare `{ /* note */` when `head` is empty).
    pub(crate) fn block_noted(
        &mut self,
        head: &str,
        note: &str,
        body: impl FnOnce(&mut Code),
    ) -> &mut Code {
        let brace = if head.is_empty() { "{".to_string() } else { format!("{head} {{") };
        self.line(format!("{brace} /* {note} */"));
        self.indented(body);
        self.line("}")
    }
    /// `if (cond) { /* note */ then } else { otherwise }`.
    pub(crate) fn if_else(
        &mut self,
        cond: &str,
        note: &str,
        then: impl FnOnce(&mut Code),
        otherwise: impl FnOnce(&mut Code),
    ) -> &mut Code {
        self.line(format!("if ({cond}) {{ /* {note} */"));
        self.indented(then);
        self.line("} else {");
        self.indented(otherwise);
        self.line("}")
    }
    /// `body` one level deeper, without braces.
    pub(crate) fn indented(&mut self, body: impl FnOnce(&mut Code)) -> &mut Code {
        self.depth += 1;
        body(self);
        self.depth -= 1;
        self
    }
    /// Another writer's lines, re-indented to the current depth.
    pub(crate) fn append(&mut self, other: &Code) -> &mut Code {
        self.put(&other.text);
        self
    }
    pub(crate) fn finish(self) -> String {
        self.text
    }
    fn put(&mut self, s: &str) {
        for piece in s.split_inclusive('\n') {
            if self.at_line_start && piece != "\n" {
                for _ in 0..self.depth {
                    self.text.push_str(INDENT);
                }
            }
            self.text.push_str(piece);
            self.at_line_start = piece.ends_with('\n');
        }
    }
}

impl std::fmt::Write for Code {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.put(s);
        Ok(())
    }
}

/// One iteration space inside a kernel: its row decomposition and the accesses made in it.
pub(crate) struct Space {
    /// Prefix of its C variables (`x` for the main space, `a`/`b` for matmul operands).
    pub(crate) tag: &'static str,
    pub(crate) shape: Shape,
    /// Accesses by the value read (a view or a materialised node): (access index, buffer).
    pub(crate) accesses: BTreeMap<NodeId, usize>,
}

pub(crate) struct Emitter<'g> {
    pub(crate) g: &'g Graph,
    /// Buffer index of every materialised value the kernel reads or writes.
    pub(crate) buf: BTreeMap<NodeId, usize>,
    /// Per-call declarations (access offsets and strides), one level into the kernel body.
    pub(crate) decls: Code,
    pub(crate) n_access: usize,
    /// The column stride of each access when it is a constant (0 broadcast, 1 contiguous):
    /// emitted as a literal so the compiler sees unit-stride loops and vectorises them.
    pub(crate) col_stride: BTreeMap<usize, i64>,
    /// The kernel's C name.
    pub(crate) kname: String,
    /// Pack functions of B operands read from parameters (see `abi::PackMeta`), with their code.
    pub(crate) packs: Vec<(PackMeta, String)>,
}

impl<'g> Emitter<'g> {
    pub(crate) fn new(g: &'g Graph, buf: BTreeMap<NodeId, usize>, kname: &str) -> Emitter<'g> {
        Emitter {
            g,
            buf,
            decls: Code::at_depth(1),
            n_access: 0,
            col_stride: BTreeMap::new(),
            kname: kname.to_string(),
            packs: Vec::new(),
        }
    }
    pub(crate) fn dim(&self, d: &DimExpr) -> String {
        d.to_c(&|s| self.g.dim_index(s))
    }
    pub(crate) fn var(&self, id: NodeId) -> String {
        format!("v{}_{}", id.0, ident(&self.g.node(id).name))
    }
    /// Declare an access of value `v` in `space` (offset and strides evaluated once per call).
    pub(crate) fn access(&mut self, sp: &mut Space, v: NodeId) -> usize {
        let view = resolve(self.g, v);
        let strides = space_strides(&view, &self.g.node(v).shape, sp.shape.len());
        self.access_strided(sp, v, &view, strides)
    }
    /// Declare an access of value `v`, read in a permuted view of `sp` (a natural split:
    /// `group::NaturalSplit`): `v` is aligned to the view's rank, and the view's axis `i` is
    /// axis `perm[i]` of `sp`.
    pub(crate) fn access_permuted(&mut self, sp: &mut Space, v: NodeId, perm: &[usize]) -> usize {
        let view = resolve(self.g, v);
        let in_view = space_strides(&view, &self.g.node(v).shape, perm.len());
        let mut strides = vec![DimExpr::constant(0); sp.shape.len()];
        for (i, s) in in_view.into_iter().enumerate() {
            strides[perm[i]] = s;
        }
        self.access_strided(sp, v, &view, strides)
    }
    fn access_strided(
        &mut self,
        sp: &mut Space,
        v: NodeId,
        view: &crate::layout::View,
        strides: Vec<DimExpr>,
    ) -> usize {
        if let Some(a) = sp.accesses.get(&v) {
            return *a;
        }
        let rank = sp.shape.len();
        let a = self.n_access;
        self.n_access += 1;
        let name = &self.g.node(view.base).name;
        let _ = writeln!(self.decls, "/* access {a}: {} ({name}) in space {} */", v, sp.tag);
        let _ = writeln!(self.decls, "const int64_t ac{a}_off = {};", self.dim(&view.offset));
        for (d, s) in strides.iter().enumerate() {
            let _ = writeln!(self.decls, "const int64_t ac{a}_s{d} = {};", self.dim(s));
        }
        if let Some(k) = strides[rank - 1].as_const() {
            self.col_stride.insert(a, k);
            let _ = writeln!(
                self.decls,
                "(void)ac{a}_s{}; /* the column stride is written as the literal {k} */",
                rank - 1
            );
        }
        sp.accesses.insert(v, a);
        a
    }
    /// Declares how gather member `m` addresses its operands, both read from memory, per axis
    /// of its output: the table element at output position `o` is
    /// `gt<m>_do + sum_k o_k gt<m>_ds<k> + id * gt<m>_da` and its index is
    /// `gt<m>_io + sum_k o_k gt<m>_is<k>` (only the axes each operand has get a stride);
    /// `gt<m>_n` is the extent of the indexed axis.
    pub(crate) fn gather_decls(&mut self, m: NodeId) {
        let g = self.g;
        let n = g.node(m);
        let Op::Gather { axis } = n.op else { return };
        let (dv, iv) = (n.inputs[0], n.inputs[1]);
        let (dshape, ishape) = (&g.node(dv).shape, &g.node(iv).shape);
        let (dview, iview) = (resolve(g, dv), resolve(g, iv));
        let ds = space_strides(&dview, dshape, dshape.len());
        let is = space_strides(&iview, ishape, ishape.len());
        let p = format!("gt{}", m.0);
        let _ = writeln!(
            self.decls,
            "/* gather {}: `{}` indexed by `{}` along axis {axis} */",
            m,
            g.node(dv).name,
            g.node(iv).name
        );
        let _ = writeln!(
            self.decls,
            "const int64_t {p}_do = {}, {p}_io = {};",
            self.dim(&dview.offset),
            self.dim(&iview.offset)
        );
        let _ = writeln!(
            self.decls,
            "const int64_t {p}_n = {}, {p}_da = {};",
            self.dim(&dshape[axis]),
            self.dim(&ds[axis])
        );
        for (k, axis_of) in gather_axes(axis, ishape.len(), n.shape.len()).into_iter().enumerate() {
            let (name, stride) = match axis_of {
                GatherAxis::Table(a) => ("ds", &ds[a]),
                GatherAxis::Index(a) => ("is", &is[a]),
            };
            let _ = writeln!(self.decls, "const int64_t {p}_{name}{k} = {};", self.dim(stride));
        }
    }
    /// Code computing `ac<a>_row` for every access of the space from the row index `row`.
    pub(crate) fn row_prologue(&self, sp: &Space, row: &str, out: &mut Code) {
        let (rank, t) = (sp.shape.len(), sp.tag);
        let _ = writeln!(out, "int64_t {t}_rem = {row};");
        for d in (0..rank - 1).rev() {
            if d == 0 {
                let _ = writeln!(out, "const int64_t {t}_i0 = {t}_rem;");
            } else {
                // An extent of 0 leaves no rows to decompose: divide by 1 instead, so the
                // C compiler sees no constant division by zero.
                let ext = match sp.shape[d].as_const() {
                    Some(0) => "1 /* extent 0: no rows */".to_string(),
                    _ => self.dim(&sp.shape[d]),
                };
                let _ =
                    writeln!(out, "const int64_t {t}_i{d} = {t}_rem % {ext}; {t}_rem /= {ext};");
            }
        }
        let _ = writeln!(out, "(void){t}_rem;");
        for d in 0..rank - 1 {
            let _ = writeln!(out, "(void){t}_i{d};");
        }
        for a in sp.accesses.values() {
            let mut terms = vec![format!("ac{a}_off")];
            for d in 0..rank - 1 {
                terms.push(format!("{t}_i{d} * ac{a}_s{d}"));
            }
            let _ = writeln!(out, "const int64_t ac{a}_row = {};", terms.join(" + "));
        }
    }
}

/// Where an output axis of a gather comes from: an axis of the table or of the indices.
#[derive(Clone, Copy)]
pub(crate) enum GatherAxis {
    Table(usize),
    Index(usize),
}

/// The source of each output axis of a gather along `axis` with indices of rank `index_rank`
/// (output rank `rank`): the table's axes before `axis`, the indices' axes, the table's rest.
pub(crate) fn gather_axes(axis: usize, index_rank: usize, rank: usize) -> Vec<GatherAxis> {
    (0..rank)
        .map(|k| {
            if k < axis {
                GatherAxis::Table(k)
            } else if k < axis + index_rank {
                GatherAxis::Index(k - axis)
            } else {
                GatherAxis::Table(k - index_rank + 1)
            }
        })
        .collect()
}

/// The element offsets of gather member `m` (declared by `Emitter::gather_decls`) at the
/// output position `pos` (a C expression per axis): the table's without the index term, and
/// the index's.
pub(crate) fn gather_offsets(g: &Graph, m: NodeId, pos: &[String]) -> (String, String) {
    let n = g.node(m);
    let Op::Gather { axis } = n.op else { unreachable!("gather_offsets of a gather") };
    let p = format!("gt{}", m.0);
    let (mut table, mut index) = (format!("{p}_do"), format!("{p}_io"));
    let index_rank = g.node(n.inputs[1]).shape.len();
    for (k, axis_of) in gather_axes(axis, index_rank, pos.len()).into_iter().enumerate() {
        match axis_of {
            GatherAxis::Table(_) => table += &format!(" + {} * {p}_ds{k}", pos[k]),
            GatherAxis::Index(_) => index += &format!(" + {} * {p}_is{k}", pos[k]),
        }
    }
    (table, index)
}

/// The output position of row `<tag>_i..` (row prologue) and column `col` of a space of
/// rank `rank`, one C expression per axis.
pub(crate) fn position(tag: &str, rank: usize, col: &str) -> Vec<String> {
    let mut pos: Vec<String> = (0..rank - 1).map(|k| format!("{tag}_i{k}")).collect();
    pos.push(format!("({col})"));
    pos
}

/// Where a kernel stores the rows of value `v` (all axes but the last flattened into the row
/// index): its own buffer, row `r` at `r * N`; or, when the kernel holds a layout store of
/// `v` (`group::layout_store`), the copy's buffer, row `r` at the place the permutation puts
/// it (the last axis stays last, so a row stays contiguous).
pub(crate) struct RowStore {
    /// The node whose buffer is written.
    pub(crate) buf: NodeId,
    /// Per row axis of `v` (outermost first): its extent and its stride in the copy, as C.
    permuted: Option<Vec<(String, String)>>,
}

impl RowStore {
    pub(crate) fn new(em: &Emitter, v: NodeId, members: &BTreeSet<NodeId>) -> RowStore {
        let g = em.g;
        let Some((copy, perm)) = crate::group::layout_store(g, &g.users(), v, members) else {
            return RowStore { buf: v, permuted: None };
        };
        // Copy axis j is v's axis perm[j]: v's axis perm[j] moves by the copy's stride j.
        let copy_strides = contiguous_strides(&g.node(copy).shape);
        let mut stride = vec![String::new(); perm.len()];
        for (j, p) in perm.iter().enumerate() {
            stride[*p] = em.dim(&copy_strides[j]);
        }
        let shape = &g.node(v).shape;
        // (an extent of 0 leaves no rows: 1 keeps the C free of a constant division by zero)
        let ext = |d: &DimExpr| if d.as_const() == Some(0) { "1".into() } else { em.dim(d) };
        let rows = (0..shape.len() - 1).map(|d| (ext(&shape[d]), stride[d].clone())).collect();
        RowStore { buf: copy, permuted: Some(rows) }
    }
    /// The element offset of row `row` (a C expression) of a value `n` elements wide.
    pub(crate) fn offset(&self, row: &str, n: &str) -> String {
        let Some(axes) = &self.permuted else { return format!("({row}) * {n}") };
        // The row's index on each axis: (row / rows below) % extent, outermost unreduced.
        let mut terms = Vec::new();
        let mut below = String::from("1");
        for (d, (ext, stride)) in axes.iter().enumerate().rev() {
            let q =
                if below == "1" { format!("({row})") } else { format!("(({row}) / ({below}))") };
            let idx = if d == 0 { q } else { format!("({q} % ({ext}))") };
            terms.push(format!("{idx} * ({stride})"));
            below = if below == "1" { format!("({ext})") } else { format!("{below} * ({ext})") };
        }
        format!("({})", terms.join(" + "))
    }
}

/// A C string literal, split into lines of moderate length.
pub(crate) fn c_string(s: &str) -> String {
    let mut out = String::from("\n    \"");
    let mut col = 0;
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut b = [0u8; 4];
                for byte in c.encode_utf8(&mut b).bytes() {
                    out.push_str(&format!("\\{byte:03o}"));
                }
            }
        }
        col += 1;
        if col >= 100 {
            out.push_str("\"\n    \"");
            col = 0;
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::Code;
    use std::fmt::Write;

    #[test]
    fn code_indents_by_block_depth() {
        let mut c = Code::new();
        c.line("int f(void)");
        c.block("", |c| {
            c.open("for (;;)");
            let _ = writeln!(c, "x += {};\ny = 0;", 1);
            c.line("");
            c.close_with(" /* loop */");
            c.line("return x;");
        });
        let mut inner = Code::new();
        inner.line("a;").open("if (b)").line("c;").close();
        c.indented(|c| {
            c.append(&inner);
        });
        assert_eq!(
            c.finish(),
            "int f(void)\n{\n    for (;;) {\n        x += 1;\n        y = 0;\n\n    } /* loop */\n    return x;\n}\n    a;\n    if (b) {\n        c;\n    }\n"
        );
    }

    #[test]
    fn code_at_depth_starts_indented() {
        let mut c = Code::at_depth(2);
        c.line("z;");
        assert_eq!(c.depth(), 2);
        assert_eq!(c.finish(), "        z;\n");
    }
}
