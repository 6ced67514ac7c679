//! `Builder::onnx`: an ONNX model as a fused module of the user's crate. The model is imported
//! (`autofusion-onnx`), planned, generated and compiled like a `#[fused_graph]`, and a Rust
//! module is written to `$OUT_DIR/autofusion/<name>.rs` for the crate to `include!`: entry
//! points taking the model's inputs by name (`run`, `unfused`, `reference`, `run_on`), with
//! the weights read from the model file at run time (memory-mapped; each recorded by byte
//! range and hash, so a model changed after the build is an error, not wrong results).
//! The generated module needs only the runtime: no ONNX parser is linked into the binary.

use autofusion_compiler::dim::shape_str;
use autofusion_compiler::{Options, Unit, Variant};
use autofusion_onnx::load::Location;
use std::fmt::Write;
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

fn rust_str(s: &str) -> String {
    format!("{s:?}")
}

/// The weight table entry of parameter `p`, embedding bytes that are in no file.
fn weight_entry(
    im: &Imported,
    m: &OnnxModel,
    p: usize,
    name: &str,
    dir: &Path,
) -> Result<String, String> {
    let g = &im.imported.graph;
    let node = g.node(g.param_nodes()[p]);
    let shape: Vec<String> =
        node.shape.iter().map(|d| d.as_const().unwrap_or(0).max(0).to_string()).collect();
    let bytes = im.imported.weight_bytes(&im.model, p).map_err(|e| err(m, e))?;
    let hash = autofusion_compiler::hash::fnv1a(&bytes);
    let model_dir = m.path.parent().unwrap_or(Path::new("."));
    let (file, offset, len, inline) =
        match im.imported.weight_location(&im.model, p).map_err(|e| err(m, e))? {
            Location::File { path, offset, len } => {
                let rel = if path == m.path {
                    String::new()
                } else {
                    path.strip_prefix(model_dir).unwrap_or(&path).display().to_string()
                };
                (rel, offset, len, "None".to_string())
            }
            Location::Inline(b) => {
                let f = dir.join(format!("weight{p}.bin"));
                std::fs::write(&f, &b)
                    .map_err(|e| err(m, format!("cannot write {}: {e}", f.display())))?;
                (
                    String::new(),
                    0,
                    b.len() as u64,
                    format!("Some(include_bytes!({}))", rust_str(&f.display().to_string())),
                )
            }
        };
    Ok(format!(
        "        ::autofusion::__private::WeightRef {{ name: {}, dtype: ::autofusion::__private::DType::{:?}, shape: &[{}], file: {}, offset: {offset}, len: {len}, hash: {hash:#018x}, inline: {inline} }},\n",
        rust_str(name),
        node.dtype,
        shape.join(", "),
        rust_str(&file),
    ))
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
    let name = ident(&m.name);
    let (fused, unfused) = (unit.symbol(Variant::Fused), unit.symbol(Variant::Unfused));
    let model_path = std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone());
    let weights: Vec<(usize, String)> = im.imported.weights.clone();
    let is_weight = |p: usize| weights.iter().position(|(q, _)| *q == p);
    let mut inputs: Vec<(usize, String)> = Vec::new();
    for p in (0..g.params.len()).filter(|p| is_weight(*p).is_none()) {
        // Names that become the same identifier (`x.1`, `x_1`) get the input's index.
        let mut n = ident(&g.params[p]);
        if inputs.iter().any(|(_, m)| *m == n) {
            n = format!("{n}_{p}");
        }
        inputs.push((p, n));
    }
    let mut table = String::new();
    for (p, wname) in &weights {
        table += &weight_entry(im, m, *p, wname, dir)?;
    }
    let params_ty: Vec<String> =
        inputs.iter().map(|(_, n)| format!("{n}: &::autofusion::Tensor")).collect();
    let args: Vec<String> = (0..g.params.len())
        .map(|p| match is_weight(p) {
            Some(k) => format!("&__w[{k}]"),
            None => inputs.iter().find(|(q, _)| *q == p).unwrap().1.clone(),
        })
        .collect();
    let n_out = g.outputs.len();
    let ret = if n_out == 1 {
        "::autofusion::Tensor".to_string()
    } else {
        format!("({})", vec!["::autofusion::Tensor"; n_out].join(", "))
    };
    let outs: Vec<String> = (0..n_out).map(|i| format!("__o{i}")).collect();
    let result = if n_out == 1 { outs[0].clone() } else { format!("({})", outs.join(", ")) };
    let convert = format!(
        "let [{}]: [::autofusion::Tensor; {n_out}] = ::autofusion::__private::outputs(__v, {})?;",
        outs.join(", "),
        rust_str(&fused)
    );
    let input_doc: Vec<String> = inputs
        .iter()
        .map(|(p, n)| {
            let node = g.node(g.param_nodes()[*p]);
            format!("`{n}`: {}{}", node.dtype.name(), shape_str(&node.shape))
        })
        .collect();
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "// Generated by autofusion-build from {} (graph `{}`, plan {}). Do not edit.",
        model_path.display(),
        m.name,
        unit.hash
    );
    let _ = writeln!(
        w,
        "/// The ONNX model `{}`, fused. Inputs: {}.",
        m.path.display(),
        input_doc.join(", ")
    );
    let _ = writeln!(w, "#[allow(non_snake_case, dead_code, clippy::too_many_arguments)]");
    let _ = writeln!(w, "pub mod {name} {{");
    let _ = writeln!(
        w,
        "    /// Content hash of the imported graph and its options (keys the build output)."
    );
    let _ = writeln!(w, "    pub const HASH: &str = {};", rust_str(&unit.hash));
    let _ = writeln!(w, "    /// The model file the weights are read from at run time.");
    let _ =
        writeln!(w, "    pub const MODEL: &str = {};", rust_str(&model_path.display().to_string()));
    let _ = writeln!(w, "    extern \"C\" {{\n        fn {fused}() -> *const ::autofusion::__private::AfModule;\n        fn {unfused}() -> *const ::autofusion::__private::AfModule;\n    }}");
    for (f, sym, doc) in [
        ("module", &fused, "The fused kernels."),
        ("unfused_module", &unfused, "The opt_level 0 build: one kernel per op."),
    ] {
        let _ = writeln!(w, "    /// {doc}\n    pub fn {f}() -> ::autofusion::Result<&'static ::autofusion::__private::Module> {{\n        static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::Module> = ::autofusion::__private::OnceCell::new();\n        // SAFETY: the descriptor function of this model's build, named by its hash.\n        unsafe {{ ::autofusion::__private::load(&CELL, {sym}(), {}) }}\n    }}", rust_str(sym));
    }
    let _ = writeln!(w, "    /// Where each weight is in the model's files, with a hash of its bytes.\n    pub const WEIGHTS: &[::autofusion::__private::WeightRef] = &[\n{table}    ];");
    let _ = writeln!(w, "    /// The weights, read from `MODEL` once per process.\n    pub fn weights() -> ::autofusion::Result<&'static [::autofusion::Tensor]> {{\n        static CELL: ::autofusion::__private::OnceCell<Vec<::autofusion::Tensor>> = ::autofusion::__private::OnceCell::new();\n        CELL.get_or_try_init(|| ::autofusion::__private::load_weights(::std::path::Path::new(MODEL), WEIGHTS)).map(|v| v.as_slice())\n    }}");
    let _ = writeln!(w, "    /// The weights read from a copy of the model at `path` (its bytes must be the ones built).\n    pub fn weights_from(path: &::std::path::Path) -> ::autofusion::Result<Vec<::autofusion::Tensor>> {{\n        ::autofusion::__private::load_weights(path, WEIGHTS)\n    }}");
    let entry = |w: &mut String, fname: &str, doc: &str, extra: &str, call: &str| {
        let mut ps = vec![];
        if !extra.is_empty() {
            ps.push(extra.to_string());
        }
        ps.extend(params_ty.iter().cloned());
        // `call` names the inputs slice `{args}`.
        let call = call.replace("{args}", &format!("&[{}]", args.join(", ")));
        let _ = writeln!(w, "    /// {doc}\n    pub fn {fname}({}) -> ::autofusion::Result<{ret}> {{\n        let __w = weights()?;\n        let __v = {call}?;\n        {convert}\n        Ok({result})\n    }}", ps.join(", "));
    };
    entry(w, "run", "Run the fused model on the CPU.", "", "module()?.run({args})");
    entry(
        w,
        "unfused",
        "Run with one kernel per op (opt_level 0).",
        "",
        "unfused_module()?.run({args})",
    );
    entry(
        w,
        "reference",
        "Run op by op in the reference interpreter (the test oracle).",
        "",
        "module()?.reference({args})",
    );
    let ascend_arg = if ascend {
        let launch = format!("{fused}_launch");
        let json = format!("{fused}_ascend_json");
        let _ = writeln!(w, "    extern \"C\" {{\n        fn {launch}(kernel: u32, block_dim: u32, stream: *mut ::core::ffi::c_void, args: *mut u8, tilings: *mut u8, workspace: *mut u8) -> i32;\n        fn {json}() -> *const ::core::ffi::c_char;\n    }}");
        let _ = writeln!(w, "    /// The fused kernels in Ascend C (the build made them: feature `ascend`).\n    pub fn ascend_module() -> ::autofusion::Result<&'static ::autofusion::__private::AscendModule> {{\n        static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::AscendModule> = ::autofusion::__private::OnceCell::new();\n        ::autofusion::__private::load_ascend(&CELL, module()?, {launch}, {json}, {})\n    }}", rust_str(&fused));
        "&ascend_module, "
    } else {
        ""
    };
    let call = format!("::autofusion::__private::run_on(device, &module, {ascend_arg}{{args}})");
    entry(
        w,
        "run_on",
        "Run on `device` (`Device::Ascend(n)` needs a build with the `ascend` feature).",
        "device: ::autofusion::Device",
        &call,
    );
    let _ = writeln!(w, "}}");
    Ok(s)
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
