//! Emission helpers both generators share: C identifiers and literals, and the `Emitter` of a
//! kernel (its buffers, the accesses it declares with their offsets and strides, the row
//! decomposition of an iteration space), whose C-like declarations are valid in C and Ascend C.

use crate::abi::PackMeta;
use crate::dim::{DimExpr, Shape};
use crate::ir::{Graph, NodeId};
use crate::layout::{resolve, space_strides};
use std::collections::BTreeMap;
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
    pub(crate) decls: String,
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
            decls: String::new(),
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
        if let Some(a) = sp.accesses.get(&v) {
            return *a;
        }
        let view = resolve(self.g, v);
        let rank = sp.shape.len();
        let strides = space_strides(&view, &self.g.node(v).shape, rank);
        let a = self.n_access;
        self.n_access += 1;
        let name = &self.g.node(view.base).name;
        let _ = writeln!(self.decls, "    /* access {a}: {} ({name}) in space {} */", v, sp.tag);
        let _ = writeln!(self.decls, "    const int64_t ac{a}_off = {};", self.dim(&view.offset));
        for (d, s) in strides.iter().enumerate() {
            let _ = writeln!(self.decls, "    const int64_t ac{a}_s{d} = {};", self.dim(s));
        }
        if let Some(k) = strides[rank - 1].as_const() {
            self.col_stride.insert(a, k);
            let _ = writeln!(
                self.decls,
                "    (void)ac{a}_s{}; /* the column stride is written as the literal {k} */",
                rank - 1
            );
        }
        sp.accesses.insert(v, a);
        a
    }
    /// Code computing `<tag>_row_off<a>` for every access of the space from the row index `row`.
    pub(crate) fn row_prologue(&self, sp: &Space, row: &str, indent: &str) -> String {
        let rank = sp.shape.len();
        let mut s = String::new();
        let _ = writeln!(s, "{indent}int64_t {t}_rem = {row};", t = sp.tag);
        for d in (0..rank - 1).rev() {
            if d == 0 {
                let _ = writeln!(s, "{indent}const int64_t {t}_i0 = {t}_rem;", t = sp.tag);
            } else {
                let ext = self.dim(&sp.shape[d]);
                let _ = writeln!(
                    s,
                    "{indent}const int64_t {t}_i{d} = {t}_rem % {ext}; {t}_rem /= {ext};",
                    t = sp.tag
                );
            }
        }
        let _ = writeln!(s, "{indent}(void){t}_rem;", t = sp.tag);
        for d in 0..rank - 1 {
            let _ = writeln!(s, "{indent}(void){t}_i{d};", t = sp.tag);
        }
        for a in sp.accesses.values() {
            let mut terms = vec![format!("ac{a}_off")];
            for d in 0..rank - 1 {
                terms.push(format!("{t}_i{d} * ac{a}_s{d}", t = sp.tag));
            }
            let _ = writeln!(s, "{indent}const int64_t ac{a}_row = {};", terms.join(" + "));
        }
        s
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
