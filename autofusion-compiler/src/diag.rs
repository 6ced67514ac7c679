//! One diagnostic type for the macro (spans -> `syn::Error`) and build.rs (file:line:col).

use proc_macro2::Span;

#[derive(Clone, Debug)]
pub struct Diag {
    pub span: Span,
    pub msg: String,
    pub help: Option<String>,
}

impl Diag {
    pub fn new(span: Span, msg: impl Into<String>) -> Diag {
        Diag { span, msg: msg.into(), help: None }
    }
    pub fn help(mut self, h: impl Into<String>) -> Diag {
        self.help = Some(h.into());
        self
    }
    fn text(&self) -> String {
        match &self.help {
            Some(h) => format!("{}\n\nhelp: {h}", self.msg),
            None => self.msg.clone(),
        }
    }
}

/// All the errors of a phase. Never empty when returned as an error.
#[derive(Clone, Debug, Default)]
pub struct Diags(pub Vec<Diag>);

impl Diags {
    pub fn push(&mut self, d: Diag) {
        self.0.push(d);
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Combined into one `syn::Error` (the macro's `to_compile_error()`).
    pub fn to_syn(&self) -> syn::Error {
        let mut it = self.0.iter();
        let first = it.next().expect("at least one diagnostic");
        let mut e = syn::Error::new(first.span, first.text());
        for d in it {
            e.combine(syn::Error::new(d.span, d.text()));
        }
        e
    }
    /// rustc-like rendering with file, line, column and the source line (build.rs, CLI).
    pub fn render(&self, file: &str, source: &str) -> String {
        let lines: Vec<&str> = source.lines().collect();
        let mut out = String::new();
        for d in &self.0 {
            let start = d.span.start();
            let end = d.span.end();
            out +=
                &format!("error: {}\n  --> {}:{}:{}\n", d.msg, file, start.line, start.column + 1);
            if let Some(l) = lines.get(start.line.wrapping_sub(1)) {
                let width = if end.line == start.line {
                    end.column.saturating_sub(start.column).max(1)
                } else {
                    1
                };
                let gutter = start.line.to_string().len();
                out += &format!(
                    "{:gutter$} |\n{} | {}\n{:gutter$} | {}{}\n",
                    "",
                    start.line,
                    l,
                    "",
                    " ".repeat(start.column),
                    "^".repeat(width)
                );
            }
            if let Some(h) = &d.help {
                out += &format!("  = help: {h}\n");
            }
            out += "\n";
        }
        out
    }
}

impl From<Diag> for Diags {
    fn from(d: Diag) -> Diags {
        Diags(vec![d])
    }
}

impl From<syn::Error> for Diags {
    fn from(e: syn::Error) -> Diags {
        Diags(e.into_iter().map(|e| Diag::new(e.span(), e.to_string())).collect())
    }
}
