//! `#[fused_graph]`: a thin proc macro over `autofusion-compiler`. It parses and checks the
//! graph (reporting every error of a phase at once, spanned on the offending tokens) and emits
//! the Rust glue (`autofusion_compiler::glue`, shared with `Builder::onnx`): input validation
//! and launch through the runtime, `reference` and `unfused` entry points, and a compile-time
//! check that build.rs compiled this exact graph.

use autofusion_compiler::glue::{Arg, Entries};
use autofusion_compiler::{env_var, Unit, Variant};
use proc_macro::TokenStream;
use quote::{format_ident, quote};

/// Compile a Transformer layer written in the autofusion DSL into fused kernels.
///
/// See the `autofusion` crate for the DSL and options.
#[proc_macro_attribute]
pub fn fused_graph(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    match Unit::parse(attr.into(), &item_fn) {
        Ok(unit) => expand(&unit, &item_fn).into(),
        Err(d) => d.to_syn().to_compile_error().into(),
    }
}

fn expand(unit: &Unit, f: &syn::ItemFn) -> proc_macro2::TokenStream {
    let sig = &unit.lowered.sig;
    let ident = |n: &str| format_ident!("{}", n);
    let (mut inputs, mut state) = (Vec::new(), Vec::new());
    for (i, (n, _, _)) in sig.params.iter().enumerate() {
        if sig.state.contains(&i) {
            state.push(ident(n))
        } else {
            inputs.push(ident(n))
        }
    }
    let entries = Entries {
        fused: unit.symbol(Variant::Fused),
        unfused: unit.symbol(Variant::Unfused),
        args: inputs.iter().cloned().map(Arg::Input).collect(),
        inputs,
        n_outputs: sig.outputs.len(),
        tuple_return: sig.tuple_return,
        ascend: cfg!(feature = "ascend"),
        state,
        call_dims: sig.call_dims.iter().map(|d| ident(d)).collect(),
    };
    let top = top_level_fn(&entries, unit, f);
    let module = entry_module(&entries, unit, f);
    quote! {
        #top

        #module
    }
}

/// The function as written, now running the fused kernels (with its docs and input shapes).
fn top_level_fn(entries: &Entries, unit: &Unit, f: &syn::ItemFn) -> proc_macro2::TokenStream {
    let name = &f.sig.ident;
    let attrs: Vec<&syn::Attribute> = f.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let shapes: Vec<String> = unit
        .lowered
        .sig
        .params
        .iter()
        .map(|(n, d, s)| format!("`{n}`: {d}{}", autofusion_compiler::dim::shape_str(s)))
        .collect();
    let doc = format!("Fused graph `{name}` (plan {}). Inputs: {}.", unit.hash, shapes.join(", "));
    let vis = &f.vis;
    entries.entry(
        quote! {
            #(#attrs)*
            #[doc = #doc]
        },
        quote!(#vis),
        name,
        quote!(),
        entries.call(quote!(#name::module()?), "run"),
    )
}

/// The module named after the graph: its hash, the checks that build.rs compiled it, and the
/// shared entry points (`module`, `unfused`, `reference`, `run_on`, `ascend_module`).
fn entry_module(entries: &Entries, unit: &Unit, f: &syn::ItemFn) -> proc_macro2::TokenStream {
    let (vis, name, hash) = (&f.vis, &f.sig.ident, &unit.hash);
    let env = env_var(&name.to_string());
    let stale = format!(
        "graph `{name}` changed since build.rs compiled it: build.rs must list the file that defines it (`Builder::file`), and no two graphs of the crate may share the name `{name}`"
    );
    let missing = format!(
        "graph `{name}` has no build output: add `autofusion_build::Builder::new().file(\"FILE\").compile(\"fused\");` to build.rs (and `autofusion-build` to [build-dependencies])"
    );
    let (pre, post) = missing.split_once("FILE").unwrap();
    let ascend_check =
        if entries.ascend { ascend_check(name, hash, &env, &stale) } else { quote!() };
    let items = entries.module_items();
    quote! {
        #[doc = concat!("Build output and alternative entry points of the fused graph `", stringify!(#name), "`.")]
        #[allow(non_snake_case)]
        #vis mod #name {
            /// Content hash of the graph and its options (keys the build output).
            pub const HASH: &str = #hash;

            const _: () = match ::core::option_env!(#env) {
                ::core::option::Option::None => ::core::panic!(::core::concat!(#pre, ::core::file!(), #post)),
                ::core::option::Option::Some(__h) => {
                    if !::autofusion::__private::str_eq(__h, #hash) {
                        ::core::panic!(#stale)
                    }
                }
            };

            #ascend_check

            #items
        }
    }
}

/// With the `ascend` feature: the check that build.rs built the graph's Ascend C too.
fn ascend_check(name: &syn::Ident, hash: &str, env: &str, stale: &str) -> proc_macro2::TokenStream {
    let env_a = format!("{env}_ASCEND");
    let no_ascend = format!(
        "graph `{name}` has no Ascend build output: the `ascend` feature of autofusion is on, but build.rs did not build Ascend kernels; give the package an `ascend` feature that enables `autofusion/ascend` (build.rs sees CARGO_FEATURE_ASCEND), or call `Builder::ascend(true)`"
    );
    quote! {
        // Checked only once the host output is there and current: otherwise the host check
        // has already said what is wrong, and one error is enough.
        const _: () = {
            let __host = match ::core::option_env!(#env) {
                ::core::option::Option::Some(__h) => ::autofusion::__private::str_eq(__h, #hash),
                ::core::option::Option::None => false,
            };
            if __host {
                match ::core::option_env!(#env_a) {
                    ::core::option::Option::None => ::core::panic!(#no_ascend),
                    ::core::option::Option::Some(__h) => {
                        if !::autofusion::__private::str_eq(__h, #hash) {
                            ::core::panic!(#stale)
                        }
                    }
                }
            }
        };
    }
}
