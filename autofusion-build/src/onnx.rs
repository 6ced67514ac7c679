//! `Builder::onnx`: an ONNX model as a fused module of the user's crate. The model is imported
//! (`autofusion-onnx`), planned, generated and compiled like a `#[fused_graph]`, and a Rust
//! module is written to `$OUT_DIR/autofusion/<name>.rs` for the crate to `include!`: entry
//! points taking the model's inputs by name (`run`, `unfused`, `reference`, `run_on`), with
//! the weights read from the model file at run time (memory-mapped; each recorded by byte
//! range and hash, so a model changed after the build is an error, not wrong results).
//! The generated module needs only the runtime: no ONNX parser is linked into the binary.

use autofusion_compiler::dim::shape_str;
use autofusion_compiler::glue::{Arg, Entries};
use autofusion_compiler::ir::Graph;
use autofusion_compiler::{Options, Unit, Variant};
use autofusion_onnx::load::Location;
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};
use std::path::{Path, PathBuf};

/// A model listed with `Builder::onnx`.
#[derive(Clone, Debug)]
pub(crate) struct OnnxModel {
    pub(crate) path: PathBuf,
    pub(crate) name: String,
    pub(crate) options: Options,
}

/// The model imported as a unit, with what the glue needs of it.
pub(crate) struct Imported {
    pub(crate) unit: Unit,
    imported: autofusion_onnx::Imported,
    model: autofusion_onnx::load::Model,
}

fn err(m: &OnnxModel, msg: impl std::fmt::Display) -> String {
    format!("error: ONNX model `{}` ({}): {msg}\n\n", m.name, m.path.display())
}

/// Load and import `m` (every node must be one the compiler takes).
pub(crate) fn import(m: &OnnxModel) -> Result<Imported, String> {
    println!("cargo:rerun-if-changed={}", m.path.display());
    let model = autofusion_onnx::load(&m.path).map_err(|e| err(m, e))?;
    let imported = autofusion_onnx::import(&model, &m.name).map_err(|e| err(m, e))?;
    let unit =
        Unit::from_graph(imported.graph.clone(), m.options.clone()).map_err(|e| err(m, e))?;
    Ok(Imported { unit, imported, model })
}

/// A Rust identifier for an ONNX value name.
fn ident(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "in_");
    }
    const KEYWORDS: &[&str] = &[
        "as",
        "break",
        "const",
        "continue",
        "crate",
        "else",
        "enum",
        "extern",
        "false",
        "fn",
        "for",
        "if",
        "impl",
        "in",
        "let",
        "loop",
        "match",
        "mod",
        "move",
        "mut",
        "pub",
        "ref",
        "return",
        "self",
        "static",
        "struct",
        "super",
        "trait",
        "true",
        "type",
        "unsafe",
        "use",
        "where",
        "while",
        "async",
        "await",
        "dyn",
        "abstract",
        "become",
        "box",
        "do",
        "final",
        "macro",
        "override",
        "priv",
        "typeof",
        "unsized",
        "virtual",
        "yield",
        "try",
        // names the generated entries use in their bodies
        "device",
        "weights",
        "module",
        "unfused_module",
        "ascend_module",
    ];
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// The weight table entry of parameter `p`, embedding bytes that are in no file.
fn weight_entry(
    im: &Imported,
    m: &OnnxModel,
    p: usize,
    name: &str,
    dir: &Path,
) -> Result<TokenStream, String> {
    let g = &im.imported.graph;
    let node = g.node(g.param_nodes()[p]);
    let shape =
        node.shape.iter().map(|d| Literal::u64_unsuffixed(d.as_const().unwrap_or(0).max(0) as u64));
    let bytes = im.imported.weight_bytes(&im.model, p).map_err(|e| err(m, e))?;
    let hash = syn::LitInt::new(
        &format!("{:#018x}", autofusion_compiler::hash::fnv1a(&bytes)),
        proc_macro2::Span::call_site(),
    );
    let model_dir = m.path.parent().unwrap_or(Path::new("."));
    let (file, offset, len, inline) =
        match im.imported.weight_location(&im.model, p).map_err(|e| err(m, e))? {
            Location::File { path, offset, len } => {
                let rel = if path == m.path {
                    String::new()
                } else {
                    path.strip_prefix(model_dir).unwrap_or(&path).display().to_string()
                };
                (rel, Literal::u64_unsuffixed(offset), Literal::u64_unsuffixed(len), quote!(None))
            }
            Location::Inline(b) => {
                let f = dir.join(format!("weight{p}.bin"));
                std::fs::write(&f, &b)
                    .map_err(|e| err(m, format!("cannot write {}: {e}", f.display())))?;
                let f = f.display().to_string();
                let len = Literal::u64_unsuffixed(b.len() as u64);
                (String::new(), Literal::u64_unsuffixed(0), len, quote!(Some(include_bytes!(#f))))
            }
        };
    let dtype = format_ident!("{}", format!("{:?}", node.dtype));
    Ok(quote! {
        ::autofusion::__private::WeightRef {
            name: #name,
            dtype: ::autofusion::__private::DType::#dtype,
            shape: &[#(#shape),*],
            file: #file,
            offset: #offset,
            len: #len,
            hash: #hash,
            inline: #inline,
        }
    })
}

/// The model's inputs (the parameters that are not weights) as Rust identifiers: names that
/// become the same identifier (`x.1`, `x_1`) get the input's index.
fn input_idents(g: &Graph, is_weight: impl Fn(usize) -> bool) -> Vec<(usize, String)> {
    let mut inputs: Vec<(usize, String)> = Vec::new();
    for p in (0..g.params.len()).filter(|p| !is_weight(*p)) {
        let mut n = ident(&g.params[p]);
        if inputs.iter().any(|(_, m)| *m == n) {
            n = format!("{n}_{p}");
        }
        inputs.push((p, n));
    }
    inputs
}

/// The Rust module of the model: see the module docs. `ascend`: the build also made the
/// Ascend kernels, so `run_on` can take `Device::Ascend`.
pub(crate) fn glue(
    im: &Imported,
    m: &OnnxModel,
    dir: &Path,
    ascend: bool,
) -> Result<String, String> {
    let unit = &im.unit;
    let g = &unit.graph;
    let weights = &im.imported.weights;
    let weight_of = |p: usize| weights.iter().position(|(q, _)| *q == p);
    let inputs = input_idents(g, |p| weight_of(p).is_some());
    let args = (0..g.params.len())
        .map(|p| match weight_of(p) {
            Some(k) => Arg::Weight(k),
            None => {
                Arg::Input(format_ident!("{}", inputs.iter().find(|(q, _)| *q == p).unwrap().1))
            }
        })
        .collect();
    let entries = Entries {
        fused: unit.symbol(Variant::Fused),
        unfused: unit.symbol(Variant::Unfused),
        inputs: inputs.iter().map(|(_, n)| format_ident!("{}", n)).collect(),
        args,
        n_outputs: g.outputs.len(),
        tuple_return: g.outputs.len() != 1,
        ascend,
        // ONNX decoders pass their caches as inputs and outputs (past / present).
        state: Vec::new(),
        call_dims: Vec::new(),
    };
    let table = weights
        .iter()
        .map(|(p, wname)| weight_entry(im, m, *p, wname, dir))
        .collect::<Result<Vec<_>, _>>()?;
    let model_path = std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone());
    let model_str = model_path.display().to_string();
    let input_doc: Vec<String> = inputs
        .iter()
        .map(|(p, n)| {
            let node = g.node(g.param_nodes()[*p]);
            format!("`{n}`: {}{}", node.dtype.name(), shape_str(&node.shape))
        })
        .collect();
    let doc =
        format!(" The ONNX model `{}`, fused. Inputs: {}.", m.path.display(), input_doc.join(", "));
    let name = format_ident!("{}", ident(&m.name));
    let hash = &unit.hash;
    let run = entries.entry(
        quote!(#[doc = " Run the fused model on the CPU."]),
        quote!(pub),
        &format_ident!("run"),
        quote!(),
        quote!(module()?.run(__args)),
    );
    let items = entries.module_items();
    let tokens = quote! {
        #[doc = #doc]
        #[allow(non_snake_case, dead_code, clippy::too_many_arguments)]
        pub mod #name {
            /// Content hash of the imported graph and its options (keys the build output).
            pub const HASH: &str = #hash;
            /// The model file the weights are read from at run time.
            pub const MODEL: &str = #model_str;
            /// Where each weight is in the model's files, with a hash of its bytes.
            pub const WEIGHTS: &[::autofusion::__private::WeightRef] = &[#(#table),*];

            /// The weights, read from `MODEL` once per process.
            pub fn weights() -> ::autofusion::Result<&'static [::autofusion::Tensor]> {
                static CELL: ::autofusion::__private::OnceCell<Vec<::autofusion::Tensor>> = ::autofusion::__private::OnceCell::new();
                CELL.get_or_try_init(|| ::autofusion::__private::load_weights(::std::path::Path::new(MODEL), WEIGHTS)).map(|v| v.as_slice())
            }

            /// The weights read from a copy of the model at `path` (its bytes must be the ones built).
            pub fn weights_from(path: &::std::path::Path) -> ::autofusion::Result<Vec<::autofusion::Tensor>> {
                ::autofusion::__private::load_weights(path, WEIGHTS)
            }

            #run

            #items
        }
    };
    let file: syn::File = syn::parse2(tokens)
        .map_err(|e| err(m, format!("internal error: generated module does not parse: {e}")))?;
    Ok(format!(
        "// Generated by autofusion-build from {} (graph `{}`, plan {hash}). Do not edit.\n{}",
        model_path.display(),
        m.name,
        prettyplease::unparse(&file)
    ))
}

#[cfg(test)]
mod tests {
    use super::ident;

    #[test]
    fn onnx_names_become_rust_identifiers() {
        assert_eq!(ident("input_ids"), "input_ids");
        assert_eq!(ident("x.1"), "x_1");
        assert_eq!(ident("0"), "in_0");
        assert_eq!(ident("type"), "type_");
        assert_eq!(ident("module"), "module_", "an input must not shadow the entry's calls");
        assert_eq!(ident("onnx::MatMul_12"), "onnx__MatMul_12");
    }
}
