//! The autofusion compiler, shared by the `#[fused_graph]` macro, `autofusion-build` and the
//! runtime: DSL front end (`front`), IR (`ir`, `dim`), canonicalisation (`canon`), the fusion
//! planner (`plan`, `target`), code generators (`codegen`) and reports (`report`).
//!
//! ```
//! let attr: proc_macro2::TokenStream = "dims(D = 8), opt_level = 2".parse().unwrap();
//! let item: syn::ItemFn = syn::parse_str(
//!     "fn ffn(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[D, D]}>, b: Tensor<f32, {[D]}>) -> Tensor<f32, {[S, D]}> {
//!          silu(linear(x, w, b))
//!      }",
//! ).unwrap();
//! let unit = autofusion_compiler::Unit::parse(attr, &item).unwrap();
//! let fused = unit.variant(autofusion_compiler::Variant::Fused, &autofusion_compiler::target::Target::host());
//! assert_eq!(fused.plan.groups.len(), 1); // matmul + bias + silu in one kernel
//! ```

pub mod builder;
pub mod canon;
pub mod codegen;
pub mod cost;
pub mod diag;
pub mod front;
pub mod glue;
pub mod group;
mod kernels;
pub mod layout;
pub mod plan;
pub mod report;
pub mod target;
#[doc(hidden)]
pub mod testing;
mod unit;

pub use autofusion_ir::meta::{ModuleMeta, Variant};
pub use autofusion_ir::{abi, dim, hash, ir, json, meta};
pub use builder::{BuildError, GraphBuilder};
pub use unit::{fingerprint, symbol, Built, Lowered, Options, Signature, Unit};

impl Unit {
    /// Parse options and function, lower, check, canonicalise. All errors of the front end
    /// come back at once.
    pub fn parse(attr: proc_macro2::TokenStream, item: &syn::ItemFn) -> Result<Unit, diag::Diags> {
        match front::parse_options(attr) {
            Ok(o) => Unit::with_options(o, item),
            Err(mut d) => {
                // Still report body errors, checked with default options.
                if let Err(more) = front::lower(Options::default(), item) {
                    d.0.extend(more.0);
                }
                Err(d)
            }
        }
    }

    /// Like `parse`, with options given directly (tools re-planning a graph at other settings).
    pub fn with_options(opts: Options, item: &syn::ItemFn) -> Result<Unit, diag::Diags> {
        let lowered = front::lower(opts, item)?;
        Unit::from_lowered(lowered).map_err(|e| {
            diag::Diag::new(item.sig.ident.span(), format!("internal error: {e}")).into()
        })
    }
}

/// The `#[fused_graph(...)]` functions of a file (also inside inline modules), each with the
/// tokens of its attribute's arguments.
pub fn find_graphs(items: &[syn::Item]) -> Vec<(&syn::ItemFn, proc_macro2::TokenStream)> {
    let mut out = Vec::new();
    for item in items {
        match item {
            syn::Item::Fn(f) => {
                for a in &f.attrs {
                    if a.path().segments.last().is_some_and(|s| s.ident == "fused_graph") {
                        let tokens = match &a.meta {
                            syn::Meta::List(l) => l.tokens.clone(),
                            _ => proc_macro2::TokenStream::new(),
                        };
                        out.push((f, tokens));
                    }
                }
            }
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    out.extend(find_graphs(items));
                }
            }
            _ => {}
        }
    }
    out
}

/// The rustc env var through which build.rs tells the macro expansion which hash it built.
pub fn env_var(name: &str) -> String {
    format!("AUTOFUSION_GRAPH_{}", name.to_ascii_uppercase())
}
